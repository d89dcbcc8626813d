"""Shared fixtures: a tiny model made private with Opacus, and a training loop helper.

Other test files may add fixtures here; keep the ones below backwards compatible.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests with one torch thread: the statistics tests use small tensors, for
    which threads only add contention on shared CI cores. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _compiled_kernels_restored():
    """An auditor built in Python-kernel mode switches the process's mode
    (dpaudit_torch/_compiled.py): every test starts and ends in the default, compiled."""
    from dpaudit_torch._compiled import set_compiled

    set_compiled(True)
    yield
    set_compiled(True)


@dataclass
class PrivateSetup:
    engine: Any
    model: Any
    optimizer: Any
    loader: Any
    criterion: Any
    X: torch.Tensor
    Y: torch.Tensor
    mode: str

    def batches(self, n_steps: int, batch: int = 32, seed: int = 0):
        """Deterministic fixed-size batches (bypassing the Poisson loader), for exact tests."""
        g = torch.Generator().manual_seed(seed)
        for _ in range(n_steps):
            idx = torch.randint(0, self.X.shape[0], (batch,), generator=g)
            yield self.X[idx], self.Y[idx]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(x), y)
        loss.backward()
        self.optimizer.step()

    def train(self, steps: int, auditor: Any = None, stop: bool = True) -> int:
        """Poisson-loader training for ``steps`` logical steps; returns steps done."""
        done = 0
        while done < steps:
            for x, y in self.loader:
                self.step(x, y)
                done += 1
                if done >= steps or (stop and auditor is not None and auditor.should_stop):
                    return done
        return done


def make_private_setup(
    *,
    mode: str = "hooks",
    clipping: str = "flat",
    sigma: float = 1.0,
    max_grad_norm: float | list[float] = 1.0,
    seed: int = 0,
    n: int = 256,
    batch_size: int = 32,
    d_in: int = 16,
    hidden: int = 32,
    lr: float = 0.1,
    accountant: str = "rdp",
    poisson: bool = True,
    noise_seed: int | None = 1,
    data_seed: int = 1234,
    **kwargs: Any,
) -> PrivateSetup:
    """A 16-32-2 MLP (610 parameters) on a linearly separable synthetic task, made private."""
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(data_seed)
    X = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, generator=g)
    Y = (X @ w > 0).long()
    model = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    dl = DataLoader(TensorDataset(X, Y), batch_size=batch_size,
                    generator=torch.Generator().manual_seed(seed + 17))
    engine = PrivacyEngine(accountant=accountant)
    crit = nn.CrossEntropyLoss()
    ng = torch.Generator().manual_seed(noise_seed) if noise_seed is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(module=model, optimizer=opt, data_loader=dl,
                                  noise_multiplier=sigma, max_grad_norm=max_grad_norm,
                                  grad_sample_mode=mode, criterion=crit, noise_generator=ng,
                                  clipping=clipping, poisson_sampling=poisson, **kwargs)
    if mode == "ghost":
        model, opt, crit, dl = out
    else:
        model, opt, dl = out
    return PrivateSetup(engine, model, opt, dl, crit, X, Y, mode)


@pytest.fixture
def private_setup():
    """Factory fixture: ``private_setup(mode=..., sigma=..., ...)`` -> PrivateSetup."""
    return make_private_setup


def devices() -> list[str]:
    """Devices the device-parametrised tests run on: the CPU, and CUDA when present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def expected_presence(rec: Any, design: Any) -> torch.Tensor:
    """What a correctly clipped canary contributes at every canary coordinate (design order, in
    units of C) for the step planned in ``rec``: 1 at a Dirac canary's coordinate, 1 / sqrt(L)
    on each of a spread canary's L coordinates (its side chosen by the pair's coin), 0
    elsewhere."""
    k, m = design.k_pairs, design.m_canaries
    e = torch.zeros(2 * k + m + design.n_extra, dtype=torch.float64)
    c = rec.coins_cpu
    e[:k] = c.double()
    e[k:2 * k] = (~c).double()
    e[2 * k + rec.included] = 1.0
    side_a, side_b = design.spread_sides()
    w = design.spread_width ** -0.5
    for q, j in enumerate(design.spread_pair.tolist()):
        side = side_a[q] if bool(c[j]) else side_b[q]
        e[torch.as_tensor(side)] = w
    return e


def loads_in_fresh_process(statement: str, module: str) -> bool:
    """Whether running ``statement`` in a fresh interpreter puts ``module`` in sys.modules."""
    code = f"import sys; {statement}; print({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return {"True": True, "False": False}[out.stdout.strip()]
