"""The monitor protocol and the monitor registry.

A monitor watches the stream of :class:`~dpaudit_torch.audit.record.StepRecord` and contributes
evidence, findings and a report section. The engine calls, in this order:

* :meth:`Monitor.observe` at every audited step (cheap: buffer or add on the device, no host
  synchronisation);
* :meth:`Monitor.advance` at every check (every ``check_every`` steps, and at finalize): process
  what was buffered; a monitor that bets returns an :class:`Evidence` with the log of its
  e-process after each step it processed, which the decision
  (:class:`~dpaudit_torch.audit.decision.Decision`) averages with the other monitors' (an
  average of e-processes on the same filtration is an e-process, docs/design.md section 1);
* :meth:`Monitor.finalize` once at the end (whole-run statistics, e.g. the one-run bounds);
* :meth:`Monitor.report_section` to fill the report, :meth:`Monitor.state_dict` /
  :meth:`Monitor.load_state_dict` for checkpoints.

A new check is one module in this package: a class implementing the protocol, registered with
:func:`register_monitor` under a name; see CONTRIBUTING.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..config import AuditConfig
from ..record import StepRecord

__all__ = ["Monitor", "MonitorContext", "Evidence", "Finding", "MONITORS", "register_monitor",
           "build_monitors", "plain_state"]


@dataclass(frozen=True)
class Finding:
    """Something a monitor established: ``level`` is ``"violation"`` (proven at level alpha),
    ``"refuted"`` (a valid whole-run bound above the claim) or ``"note"``."""

    monitor: str
    level: str
    message: str
    where: str | None = None


@dataclass
class Evidence:
    """A monitor's betting evidence for the steps it processed at one check.

    ``log_e[s]`` is the log of its e-process after ``steps[s]``; ``extra`` holds per-step
    diagnostics of the same length that the wealth history records (e.g. each tester's
    log-wealth, the sequential lower bound)."""

    steps: list[int]
    log_e: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class MonitorContext:
    """What a monitor is built with besides the configuration."""

    config: AuditConfig
    k_pairs: int
    m_canaries: int
    device: Any
    #: records a warning in the report (and logs it); repeated messages are kept once
    warn: Callable[[str], None]
    #: the secret IN/OUT coins of the one-run canaries (revealed at finalize)
    coins: Any = None
    #: the Poisson rate at which an IN one-run canary is included at each step (the loader's)
    sample_rate: float = 1.0
    #: epsilon(sigma, steps) of the accountant class the claim comes from, at the run's sample
    #: rate and delta (for the power statement); None where unknown
    epsilon_of_sigma: Callable[[float, int], float] | None = None
    #: N, the number of records the loader samples from (None where unknown)
    n_records: int | None = None
    #: per noise-audit coordinate: its tensor index, and its parameter group index
    noise_tensor: Any = None
    noise_group: Any = None
    #: a name per parameter tensor and per parameter group, for findings
    tensor_names: list[str] = field(default_factory=list)
    group_names: list[str] = field(default_factory=list)
    #: what the accountant was told (its history since attach, as (sigma, q, steps) entries),
    #: read at finalize; None where the accountant keeps no history
    accountant_history: Callable[[], list[tuple[float, float, int]] | None] | None = None
    #: epsilon of a history of (sigma, q, steps) entries by the claim's accountant class
    epsilon_of_history: Callable[[list[tuple[float, float, int]]], float] | None = None


@runtime_checkable
class Monitor(Protocol):
    """The protocol every monitor implements (see the module docstring)."""

    name: str

    def observe(self, record: StepRecord) -> None: ...

    def advance(self) -> Evidence | None: ...

    def log_evidence(self) -> float | None: ...

    def finalize(self, claimed_epsilon: float | None) -> None: ...

    def findings(self) -> list[Finding]: ...

    def report_section(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, sd: dict[str, Any]) -> None: ...


def plain_state(obj: Any) -> Any:
    """Numpy scalars -> Python numbers, numpy arrays -> tensors (lossless), recursively, so that
    a state loads with ``torch.load(weights_only=True)``."""
    if isinstance(obj, dict):
        return {k: plain_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain_state(v) for v in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


#: name -> factory(context) of every monitor the engine knows, in the order they run
MONITORS: dict[str, Callable[[MonitorContext], Monitor]] = {}


def register_monitor(name: str) -> Callable[[type], type]:
    """Class decorator: register a monitor class (built as ``cls(context)``) under ``name``."""

    def deco(cls: type) -> type:
        if name in MONITORS:
            raise ValueError(f"a monitor named {name!r} is already registered")
        cls.name = name
        MONITORS[name] = cls
        return cls

    return deco


def build_monitors(ctx: MonitorContext, names: tuple[str, ...] | None = None
                   ) -> dict[str, Monitor]:
    """Instances of the registered monitors (all, or ``names``), in registry order."""
    chosen = tuple(MONITORS) if names is None else names
    unknown = [n for n in chosen if n not in MONITORS]
    if unknown:
        raise ValueError(f"unknown monitor(s) {unknown}; registered: {sorted(MONITORS)}")
    return {n: MONITORS[n](ctx) for n in chosen}
