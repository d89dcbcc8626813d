"""testing.contract_bugs: every clause's classes, by name, each documented."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.contract_bugs import contract_bugs
from dpaudit_torch.testing.training import CLAUSES


def test_registry_by_clause():
    every = contract_bugs()
    assert list(every) == [n for c in CLAUSES for n in contract_bugs(c)]
    for name, bug in every.items():
        assert bug.name == name and len(bug.description) > 20
        assert name in contract_bugs(bug.clause)
    with pytest.raises(ValueError, match="'other'"):
        contract_bugs("other")
