"""A compatibility import path: ``from dpaudit_torch.hook import PrivacyAuditor`` keeps working.

Before the engine was split into parts, ``PrivacyAuditor`` and the names below were defined in
this module, and user code imports them from here. They now live in :mod:`dpaudit_torch.audit`
(the framework-free engine; its Opacus adapter is :mod:`dpaudit_torch.opacus_tap`); this module
only re-exports them, the same objects, and holds no code of its own. New code imports from
:mod:`dpaudit_torch` or :mod:`dpaudit_torch.audit`. ``tests/test_hook.py`` checks the names.
"""

from __future__ import annotations

from .audit import (
    DEFAULT_NULL_GRID,
    DEFAULT_TEST_OPTIONS,
    STATE_VERSION,
    PrivacyAuditor,
    PrivacyViolationError,
    per_step_null_grid,
)

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "per_step_null_grid", "DEFAULT_NULL_GRID",
           "DEFAULT_TEST_OPTIONS", "STATE_VERSION"]
