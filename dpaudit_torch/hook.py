"""Where ``PrivacyAuditor`` was defined before the engine was split into parts; the names stay
importable from here. The auditor lives in :mod:`dpaudit_torch.audit`, its Opacus adapter in
:mod:`dpaudit_torch.opacus_tap`."""

from .audit.auditor import STATE_VERSION, PrivacyAuditor, PrivacyViolationError
from .audit.config import DEFAULT_NULL_GRID, DEFAULT_TEST_OPTIONS
from .audit.monitors.sequential_pairs import per_step_null_grid

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "per_step_null_grid", "DEFAULT_NULL_GRID",
           "DEFAULT_TEST_OPTIONS", "STATE_VERSION"]
