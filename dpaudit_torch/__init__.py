"""dpaudit_torch: anytime-valid auditing of differential privacy while a PyTorch model trains.

Public API (README.md; layout in CONTRIBUTING.md):

    from dpaudit_torch import SequentialMMDTest, HockeyStickTest, PrivacyAuditor, AuditReport
    from dpaudit_torch import mechanisms, one_run

Names are imported lazily so that the statistics layer never imports Opacus.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "SequentialMMDTest": ("dpaudit_torch.stats.mmd", "SequentialMMDTest"),
    "HockeyStickTest": ("dpaudit_torch.stats.hockey_stick", "HockeyStickTest"),
    "PrivacyAuditor": ("dpaudit_torch.audit.auditor", "PrivacyAuditor"),
    "AuditConfig": ("dpaudit_torch.audit.config", "AuditConfig"),
    "PrivacyViolationError": ("dpaudit_torch.audit.auditor", "PrivacyViolationError"),
    "AuditReport": ("dpaudit_torch.report", "AuditReport"),
    "mechanisms": ("dpaudit_torch.mechanisms", None),
    "one_run": ("dpaudit_torch.stats.one_run", None),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpaudit_torch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
