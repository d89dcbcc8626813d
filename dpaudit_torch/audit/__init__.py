"""The framework-free audit engine.

* :class:`AuditConfig` (:mod:`.config`): every setting, validated once, frozen;
* :class:`StepRecord` and the facts (:mod:`dpaudit_torch.contract`): what an adapter hands the
  engine, and what a monitor may ask of it;
* monitors (:mod:`.monitors`): one module each behind one base class, in a registry;
* :class:`AuditEngine` (:mod:`.engine`): the step loop, the checks, and the
  :class:`Decision` (:mod:`.decision`), one anytime-valid verdict from the monitors' evidence;
* :mod:`.assemble`: the report of a finalized audit; :mod:`.checkpoint`: the checkpoint layout;
* :class:`PrivacyAuditor` (:mod:`.auditor`): the facade that wires them to Opacus through
  :mod:`dpaudit_torch.opacus_tap`.

Importing this package imports neither Opacus nor any trainer: the engine can be driven by
hand-made step records (see tests/audit/test_engine.py).
"""

from ..contract import StepRecord
from .auditor import STATE_VERSION, PrivacyAuditor, PrivacyViolationError
from .config import DEFAULT_NULL_GRID, DEFAULT_TEST_OPTIONS, AuditConfig
from .decision import Decision
from .engine import AuditEngine
from .monitors import (
    MONITORS,
    Contribution,
    Evidence,
    Finding,
    Monitor,
    MonitorConfig,
    MonitorContext,
    OneRunMonitor,
    SequentialPairsMonitor,
    build_monitors,
    monitor_names,
    per_step_null_grid,
    register_monitor,
)

__all__ = ["AuditConfig", "AuditEngine", "Contribution", "DEFAULT_NULL_GRID",
           "DEFAULT_TEST_OPTIONS", "Decision", "Evidence", "Finding", "MONITORS", "Monitor",
           "MonitorConfig", "MonitorContext", "OneRunMonitor", "PrivacyAuditor",
           "PrivacyViolationError", "STATE_VERSION", "SequentialPairsMonitor", "StepRecord",
           "build_monitors", "monitor_names", "per_step_null_grid", "register_monitor"]
