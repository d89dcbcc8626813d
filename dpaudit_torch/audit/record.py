"""``StepRecord``, re-exported from the package's ground floor (:mod:`dpaudit_torch.contract`),
where the adapters and the engine both read it; kept importable from here."""

from ..contract import StepRecord

__all__ = ["StepRecord"]
