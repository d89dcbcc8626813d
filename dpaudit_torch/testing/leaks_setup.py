"""Contract bugs of the setup clause (:mod:`dpaudit_torch.testing.training`)."""

from __future__ import annotations

from .training import ContractBug

__all__ = ["CLASSES"]

#: name -> bug, in the order the detection benchmark runs them
CLASSES: dict[str, ContractBug] = {}
