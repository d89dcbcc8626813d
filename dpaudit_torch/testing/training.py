"""A DP-SGD training run that a *contract bug* can break, for tests and benchmarks.

DP-SGD's guarantee rests on one contract (docs/design.md, "The DP-SGD contract"): every value of
the model that training changes changes only through the DP release; the release is the sum of
per-example contributions clipped to C plus fresh noise iid N(0, sigma^2 C^2) on every
coordinate; it covers a Poisson sample at rate q; the accountant counts exactly those releases.
A :class:`ContractBug` breaks one clause of it the way real code does, by editing a
:class:`Training` before the audit starts: it may replace the optimizer's methods, wrap the model,
add code that runs in the training loop between ``backward()`` and ``optimizer.step()``, or hand
the auditor something other than what training uses.

The training loop that runs a :class:`Training` (``benchmarks/detection.py``, the tests)::

    aud = PrivacyAuditor(tr.auditor_engine, tr.optimizer, tr.auditor_loader, model=tr.model)
    for x, y in tr.data_loader:
        tr.optimizer.zero_grad()
        loss(tr.model(x), y).backward()
        for f in tr.between:
            f()
        tr.optimizer.step()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Training", "ContractBug", "CLAUSES"]

#: the clauses of the DP-SGD contract a bug can break: "inputs" (the accountant counts exactly
#: the releases at (sigma, q), and the auditor is handed what training uses), "release" (every
#: change of the model comes through the DP release), "gaussian" (fresh iid N(0, sigma^2 C^2)
#: noise on every coordinate), "clipping" (each example's contribution clipped to C)
CLAUSES = ("inputs", "release", "gaussian", "clipping")


@dataclass
class Training:
    """The objects of one DP-SGD training run, as ``PrivacyEngine.make_private`` returned them.

    Attributes:
        engine: the ``PrivacyEngine`` that made the optimizer private.
        model: the model being trained (as ``make_private`` returned it).
        optimizer: the DP optimizer training steps.
        data_loader: the loader training iterates.
        auditor_loader / auditor_engine: what is handed to the auditor (None: the same as
            ``data_loader`` / ``engine``); a setup bug hands over something else.
        between: callables run in the training loop after ``backward()`` and before
            ``optimizer.step()`` (a second optimizer's step, a manual update).
    """

    engine: Any
    model: Any
    optimizer: Any
    data_loader: Any
    auditor_loader: Any = None
    auditor_engine: Any = None
    between: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.auditor_loader is None:
            self.auditor_loader = self.data_loader
        if self.auditor_engine is None:
            self.auditor_engine = self.engine


@dataclass(frozen=True)
class ContractBug:
    """A named way to break one clause of the DP-SGD contract.

    Attributes:
        name: the class's name (``"second-optimizer"``).
        clause: which clause of :data:`CLAUSES` it breaks.
        description: what the broken code does, in one or two sentences.
        apply: edits a :class:`Training` (in place or by returning a new one) before the audit
            is attached; returns the training to run.
        per_step: True where every step leaks (the audit must *decide* a violation within tens
            of steps); False where only the whole run shows it (a finding at ``finalize()``).
        ghost_ok: whether it applies under ghost clipping.
    """

    name: str
    clause: str
    description: str
    apply: Callable[[Training], Training]
    per_step: bool = True
    ghost_ok: bool = True

    def __post_init__(self) -> None:
        if self.clause not in CLAUSES:
            raise ValueError(f"clause must be one of {CLAUSES}, got {self.clause!r}")
