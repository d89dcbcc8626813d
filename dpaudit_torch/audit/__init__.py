"""The framework-free audit engine.

* :class:`AuditConfig` (:mod:`.config`): every setting, validated once, frozen;
* :class:`StepRecord` (:mod:`.record`): what the monitors see of one audited step;
* monitors (:mod:`.monitors`): the sequential canary pairs and the one-run game, each one
  module behind one protocol, in a registry;
* :class:`Decision` (:mod:`.decision`): one anytime-valid verdict from the monitors' evidence;
* :class:`PrivacyAuditor` (:mod:`.auditor`): the facade that wires them to Opacus through
  :mod:`dpaudit_torch.opacus_tap`.

Importing this package imports neither Opacus nor any trainer: the engine can be driven by
hand-made step records (see tests/test_engine.py).
"""

from .auditor import STATE_VERSION, PrivacyAuditor, PrivacyViolationError
from .config import DEFAULT_NULL_GRID, DEFAULT_TEST_OPTIONS, AuditConfig
from .decision import Decision
from .monitors import (
    MONITORS,
    Evidence,
    Finding,
    Monitor,
    MonitorContext,
    OneRunMonitor,
    SequentialPairsMonitor,
    build_monitors,
    per_step_null_grid,
    register_monitor,
)
from .record import StepRecord

__all__ = ["AuditConfig", "DEFAULT_NULL_GRID", "DEFAULT_TEST_OPTIONS", "Decision", "Evidence",
           "Finding", "MONITORS", "Monitor", "MonitorContext", "OneRunMonitor",
           "PrivacyAuditor", "PrivacyViolationError", "STATE_VERSION", "SequentialPairsMonitor",
           "StepRecord", "build_monitors", "per_step_null_grid", "register_monitor"]
