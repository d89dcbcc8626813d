"""Run a :class:`~dpaudit_torch.testing.training.Training`, broken by a contract bug or not,
under the auditor: the loop of the detection benchmark and of the tests of every clause.

``digits_training(seed)`` builds the detection benchmark's setting (the demo's DigitsCNN on
scikit-learn's bundled 8x8 digits, Opacus, Poisson sampling with expected batch 64, sigma 1,
C 1, lr 0.5, RDP accountant, seeded noise generator); ``run_audited(tr, steps)`` trains it with
the auditor attached and returns the report.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .training import ContractBug, Training

__all__ = ["digits_training", "run_audited", "run_bug"]

_DIGITS: Any = None


def _digits() -> Any:
    global _DIGITS
    if _DIGITS is None:
        from ..demo import load_digits_tensors

        _DIGITS = load_digits_tensors(0)
    return _DIGITS


def digits_training(seed: int, *, batch: int = 64, lr: float = 0.5, sigma: float = 1.0,
                    grad_sample_mode: str = "hooks", accountant: str = "rdp",
                    model: nn.Module | None = None) -> Training:
    """The detection benchmark's training (seed fixes the model, data order and noise)."""
    from opacus import PrivacyEngine

    from ..demo import DigitsCNN

    train, _ = _digits()
    torch.manual_seed(seed)
    net = model if model is not None else DigitsCNN()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    dl = DataLoader(train, batch_size=batch, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant=accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(
            module=net, optimizer=opt, data_loader=dl, noise_multiplier=sigma,
            max_grad_norm=1.0, grad_sample_mode=grad_sample_mode,
            noise_generator=torch.Generator().manual_seed(10_000 + seed))
    net, opt, dl = out[0], out[1], out[2]
    return Training(engine=engine, model=net, optimizer=opt, data_loader=dl)


def run_audited(tr: Training, steps: int, *, stop: bool = True, seed: int = 0,
                batch: float = 64.0, auditor_kw: dict[str, Any] | None = None) -> Any:
    """Train ``tr`` for at most ``steps`` optimizer steps with a PrivacyAuditor attached
    (stopping at ``should_stop`` when ``stop``), then ``finalize()``; returns the report. The
    auditor is handed ``tr.auditor_engine``, ``tr.optimizer``, ``tr.auditor_loader`` and
    ``tr.model``."""
    from ..audit import PrivacyAuditor

    aud = PrivacyAuditor(tr.auditor_engine, tr.optimizer, tr.auditor_loader, delta=1e-5,
                         seed=seed, model=tr.model, **(auditor_kw or {}))
    crit = nn.CrossEntropyLoss(reduction="sum")  # an empty Poisson batch gives a zero loss
    done = 0
    while done < steps and not (stop and aud.should_stop):
        for x, y in tr.data_loader:
            tr.optimizer.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (crit(tr.model(x), y) / batch).backward()
            for f in tr.between:
                f()
            tr.optimizer.step()
            done += 1
            if (stop and aud.should_stop) or done >= steps:
                break
    return aud.finalize()


def run_bug(bug: ContractBug | None, seed: int, steps: int, *, stop: bool | None = None,
            auditor_kw: dict[str, Any] | None = None, **training_kw: Any) -> Any:
    """``digits_training(seed)`` broken by ``bug`` (None: correct), audited for ``steps``
    steps (stopped early only for per-step bugs unless ``stop`` says otherwise)."""
    tr = digits_training(seed, **training_kw)
    if bug is not None:
        tr = bug.apply(tr)
    if stop is None:
        stop = bug is not None and bug.per_step
    return run_audited(tr, steps, stop=stop, seed=seed,
                       batch=float(training_kw.get("batch", 64)), auditor_kw=auditor_kw)
