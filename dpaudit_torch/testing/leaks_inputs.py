"""Contract bugs of the inputs clause (setup coherence), and wrong inputs to the auditor
(:mod:`dpaudit_torch.testing.training`).

The clause: the releases cover a Poisson sample at rate q, and the accountant counts exactly
those releases at (sigma, q). Each bug below leaves every step a correct Gaussian step and the
accountant's epsilon that of a correct run; only what the accountant is told, or what training
iterates, is wrong. Each is flagged at ``finalize()`` (``per_step=False``).

* ``"step-hook-missing"``: the optimizer's step hook is gone (a DP optimizer built by hand
  without ``attach_step_hook``, or the hook cleared by code that re-wraps the optimizer), so the
  accountant counts nothing: the epsilon a user reads covers none of the training.
* ``"accountant-told-double-sigma"``: accounting done by the user's own hook, which tells the
  accountant twice the noise multiplier the optimizer uses (the variable of another
  configuration): ``optimizer.attach_step_hook(lambda o: acc.step(noise_multiplier=2 * sigma,
  sample_rate=q))``.
* ``"accountant-stepped-per-epoch"``: the user's hook steps the accountant once per epoch (at
  the rate of one batch), not once per release.
* ``"trains-on-original-loader"``: ``make_private`` is called, but the loop iterates the
  original, non-private loader at batch size 256 (shuffled fixed-size batches); the auditor and
  the accountant are handed the private loader's rate 1/23.

**Wrong inputs** (:data:`WRONG_INPUTS`): training is *correct*; the auditor is handed something
other than what training uses. None may end in "violation proven" or "claim refuted"; each gets
a refusal at attach or a finding that names the wrong input.

* ``"validation-loader"``: the held-out set's plain loader at batch 256.
* ``"original-loader"``: the training set's own non-private loader at batch 512.
* ``"list"``: a plain list of the training set's batches of 256.
* ``"another-engine"``: a fresh ``PrivacyEngine()`` instead of the one that made the optimizer
  private (refused).
* ``"engine-never-stepped"``: a ``PrivacyEngine`` that made another optimizer private, whose
  accountant never steps in this training (refused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from .training import ContractBug, Training

__all__ = ["CLASSES", "WRONG_INPUTS"]


def _digits() -> tuple[Any, Any]:
    from ..demo import load_digits_tensors

    return load_digits_tensors(0)


def _hook_rate(tr: Training) -> float:
    return 1.0 / len(tr.data_loader)


def _step_hook_missing(tr: Training) -> Training:
    tr.optimizer.step_hook = None
    return tr


def _double_sigma(tr: Training) -> Training:
    acc, q = tr.engine.accountant, _hook_rate(tr)
    sigma = float(tr.optimizer.noise_multiplier)
    tr.optimizer.attach_step_hook(
        lambda opt: acc.step(noise_multiplier=2.0 * sigma, sample_rate=q))
    return tr


def _per_epoch(tr: Training) -> Training:
    acc, q = tr.engine.accountant, _hook_rate(tr)
    per_epoch = len(tr.data_loader)
    count = [0]

    def hook(opt: Any) -> None:
        count[0] += 1
        if count[0] % per_epoch == 1:
            acc.step(noise_multiplier=opt.noise_multiplier, sample_rate=q)

    tr.optimizer.attach_step_hook(hook)
    return tr


def _original_loader(tr: Training) -> Training:
    ds = tr.data_loader.dataset
    g = torch.Generator().manual_seed(int(torch.initial_seed()) % (2 ** 31))
    tr.auditor_loader = tr.data_loader
    tr.data_loader = DataLoader(ds, batch_size=256, shuffle=True, generator=g)
    return tr


CLASSES: dict[str, ContractBug] = {b.name: b for b in (
    ContractBug("step-hook-missing", "inputs",
                "the optimizer has no step hook: the accountant counts no release",
                _step_hook_missing, per_step=False),
    ContractBug("accountant-told-double-sigma", "inputs",
                "the user's accounting hook tells the accountant twice the noise multiplier "
                "the optimizer uses", _double_sigma, per_step=False),
    ContractBug("accountant-stepped-per-epoch", "inputs",
                "the user's accounting hook steps the accountant once per epoch instead of "
                "once per release", _per_epoch, per_step=False),
    ContractBug("trains-on-original-loader", "inputs",
                "the loop iterates the original non-private loader (fixed batches of 256) "
                "while the accountant and the auditor see the private loader's rate",
                _original_loader, per_step=False),
)}


def _validation_loader(tr: Training) -> Training:
    tr.auditor_loader = DataLoader(_digits()[1], batch_size=256)
    return tr


def _plain_loader(tr: Training) -> Training:
    tr.auditor_loader = DataLoader(tr.data_loader.dataset, batch_size=512)
    return tr


def _as_list(tr: Training) -> Training:
    tr.auditor_loader = list(DataLoader(tr.data_loader.dataset, batch_size=256))
    return tr


def _fresh_engine(tr: Training) -> Training:
    from opacus import PrivacyEngine

    tr.auditor_engine = PrivacyEngine()
    return tr


def _engine_never_stepped(tr: Training) -> Training:
    import warnings

    from opacus import PrivacyEngine

    other = PrivacyEngine()
    net = torch.nn.Linear(64, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other.make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                           data_loader=DataLoader(tr.data_loader.dataset, batch_size=64),
                           noise_multiplier=1.0, max_grad_norm=1.0)
    tr.auditor_engine = other
    return tr


#: name -> edit of a correct training that hands the auditor a wrong input
WRONG_INPUTS: dict[str, Callable[[Training], Training]] = {
    "validation-loader": _validation_loader,
    "original-loader": _plain_loader,
    "list": _as_list,
    "another-engine": _fresh_engine,
    "engine-never-stepped": _engine_never_stepped,
}
