"""Shared fixtures and helpers: a tiny model made private with Opacus, a training loop helper,
what the optimizer released at the canary coordinates, and a synthetic report.

Other test files may add fixtures here; keep the ones below backwards compatible.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.opacus_tap import OWNER_ATTR
from dpaudit_torch.report import AuditReport


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


def optimizer_untouched(opt: Any) -> bool:
    """No auditor attribute, no wrapped method, no step pre-hook left on the optimizer."""
    return ("clip_and_accumulate" not in vars(opt) and "accumulate" not in vars(opt)
            and not hasattr(opt, OWNER_ATTR)
            and len(opt.original_optimizer._optimizer_step_pre_hooks) == 0)


def capture_released(setup: Any, design: Any) -> list[torch.Tensor]:
    """Record, at every real optimizer step, p.grad at the design's coordinates times
    expected_batch_size (i.e. the clipped sum + noise, in raw units), in design order."""
    out: list[torch.Tensor] = []
    params = list(setup.optimizer.params)
    pidx, flat = design.coordinates()

    def hook(_o, _a, _k):
        vals = torch.stack([params[int(i)].grad.reshape(-1)[int(f)] for i, f in zip(pidx, flat)])
        out.append(vals.double() * float(setup.optimizer.expected_batch_size))

    setup.optimizer.original_optimizer.register_step_pre_hook(hook)
    return out


#: how a report written by the engine names its monitors (``AuditReport.monitor_labels``)
MONITOR_LABELS = {
    "sequential_pairs": "sequential pairs (per-step guarantee violated)",
    "noise": "noise",
    "sampling": "sampling (batch sizes not Poisson)",
    "accounting": "accounting",
    "one_run": "one-run",
    "decision": "combined decision (no single monitor on its own)",
}


def make_report(kind: str = "violation", n_steps: int = 120, m: int = 400) -> AuditReport:
    """A report shaped like PrivacyAuditor.finalize() output (synthetic numbers, fixed seed),
    with the engine's ``monitor_labels`` (:data:`MONITOR_LABELS`) and no findings."""
    rng = np.random.default_rng(7)
    steps = list(range(0, n_steps, 2))
    drift = 0.08 if kind == "violation" else -0.01
    mmd = np.cumsum(rng.normal(drift, 0.2, len(steps)))
    hs = np.cumsum(rng.normal(drift * 0.7, 0.2, len(steps)))
    comb = np.logaddexp(mmd, hs) - math.log(2.0)
    grid = [0.05, 0.1, 0.2, 0.5, 1.0]
    lb = np.zeros(len(steps))
    if kind == "violation":
        lb[len(steps) // 2:] = 0.2
        lb[3 * len(steps) // 4:] = 0.5
    seq_lb = float(lb[-1])
    in_scores = rng.normal(1.0 if kind != "nothing" else 0.1, 1.0, m // 2)
    out_scores = rng.normal(0.0, 1.0, m // 2)
    # the keys of dpaudit_torch.stats.one_run's result .to_dict()
    steinke = {"bound": 0.7312, "method": "steinke", "strategy": "bonferroni",
               "guesses": "two_sided", "m": m, "r": 60, "v": 52, "k_pos": 30, "k_neg": 30,
               "alpha": 0.05, "alpha_per_test": 0.00625, "delta": 1e-5, "ceiling": 3.914,
               "family": None, "mu": None, "n_candidates": 8, "m_total": m,
               "uncorrected_best": 1.02, "uncorrected_best_r": 40,
               "uncorrected_best_note": "diagnostic only: not a valid lower bound"}
    fdp = dict(steinke, bound=0.9876543, method="fdp", ceiling=6.5, mu=0.4,
               family="test against the Gaussian (mu-GDP) curve family, not a family-free bound")
    claimed = 0.6 if kind == "refuted" else 2.345678
    summary = {"test": "mmd", "epsilons": grid, "deltas": [1e-6] * 5, "alpha": 0.05,
               "burn_in": 20, "simultaneous": False, "n_pairs": 4 * len(steps),
               "rejected": kind == "violation", "rejected_at": 150 if kind == "violation" else None,
               "combined_log_wealth": float(mmd[-1]), "epsilon_lower_bound": seq_lb}
    return AuditReport(
        claimed_epsilon=claimed, delta=1e-5, alpha=0.05, accountant="prv",
        epsilon_lower_bounds={"steinke": 0.7312, "fdp": 0.9876543, "sequential": seq_lb},
        lower_bound_details={
            "steinke": steinke, "fdp": fdp,
            "sequential": {"level": 0.05, "simultaneous": False, "grid_epsilons": grid,
                           "grid_deltas": [1e-6] * 5, "null": "Gaussian profile, sigma = 1.1",
                           "note": "per-step bound, not the whole-run epsilon"},
        },
        claim_refuted=kind == "refuted",
        violation=kind == "violation",
        violation_step=steps[len(steps) // 2] if kind == "violation" else None,
        stopped_early=kind == "violation",
        sequential={"tests": {"mmd": summary,
                              "hockey_stick": dict(summary, test="hockey_stick",
                                                   combined_log_wealth=float(hs[-1]))},
                    "combined_log_wealth": float(comb[-1]),
                    "decision_threshold_log": math.log(20.0),
                    "per_step_null": {"type": "gaussian_profile", "noise_multiplier": 1.1,
                                      "epsilons": grid, "deltas": [1e-6] * 5}},
        wealth_history={"step": steps, "mmd": mmd.tolist(), "hockey_stick": hs.tolist(),
                        "combined": comb.tolist(), "epsilon_lower_bound": lb.tolist()},
        one_run_scores={"in": in_scores.tolist(), "out": out_scores.tolist()},
        canaries={"k_pairs": 4, "m_one_run": m, "norm_multiplier": 1.0, "design": "dirac",
                  "coordinates": {"conv1.weight": 12, "fc.weight": 396}, "insertions": 3000,
                  "seed_policy": "secret"},
        training={"noise_multiplier": 1.1, "max_grad_norm": 1.0, "sample_rate": 0.01,
                  "expected_batch_size": 64, "steps": n_steps, "optimizer": "DPOptimizer",
                  "grad_sample_mode": "hooks", "clipping": "flat"},
        threat_model={"white_box": True, "every_step_observed": True,
                      "clipping_exercised": kind != "nothing",
                      "notes": ["canaries are inserted before clipping"]},
        interference={"median_spread_C": 0.12, "max_spread_C": 0.8},
        config={"alpha": 0.05, "burn_in": 20, "tests": ["mmd", "hockey_stick"]},
        seed_policy="secret: canary coins drawn from os.urandom",
        warnings=["clipping was active on 3% of real examples"],
        monitor_labels=dict(MONITOR_LABELS),
    )


def power_dict(**changes: Any) -> dict[str, Any]:
    """A report's ``power`` object shaped like one_run_power(...).to_dict(), with ``changes``."""
    d = {"expected_bound": 0.4123, "expected_bound_quantiles": [0.3, 0.52],
         "min_refutable_epsilon": 4.567, "min_refutable_sigma": 0.61, "claimed_epsilon": 2.0,
         "target_power": 0.8, "mean_inclusions": 15.0, "replicates": 200, "score": "llr",
         "method": "steinke", "mode": "exact", "seconds": 1.5, "warnings": [],
         "no_power": False, "note": None, "sigma": 1.1, "q": 0.05, "steps": 300, "m": 1000,
         "c": 1.0, "delta": 1e-5, "alpha": 0.05}
    d.update(changes)
    return d


def gaussian_step_records(n: int, k: int, m: int, sigma: float, noise: float, seed: int,
                          start: int = 1, real: bool = False) -> list[Any]:
    """n step records of a per-step Gaussian mechanism with k pairs and m one-run canaries: the
    canary adds 1 (units of C) at the chosen coordinate of each pair, the noise has std
    ``noise`` (``noise = sigma``: a correct implementation). ``real``: also the real data's
    sums that were removed (all 0.5)."""
    from dpaudit_torch.contract import StepRecord

    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(n):
        coins = torch.rand(k, generator=g) < 0.5
        vals = noise * torch.randn(2 * k + m, generator=g, dtype=torch.float64)
        vals[:k] += coins.double()
        vals[k:2 * k] += (~coins).double()
        x = torch.where(coins, vals[:k], vals[k:2 * k])
        y = torch.where(coins, vals[k:2 * k], vals[:k])
        out.append(StepRecord(
            step=start + t, values=vals, x=x, y=y, coins=coins, sigma=sigma,
            sigma_claimed=sigma,
            real_sums=torch.full((2 * k + m,), 0.5, dtype=torch.float64) if real else None))
    return out
