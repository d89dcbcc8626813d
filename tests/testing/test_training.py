"""testing.training: a Training hands the auditor what training uses unless told otherwise."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.training import CLAUSES, ContractBug, Training


def test_training_defaults_to_what_training_uses():
    tr = Training(engine="e", model="m", optimizer="o", data_loader="dl")
    assert tr.auditor_loader == "dl" and tr.auditor_engine == "e" and tr.between == []
    other = Training(engine="e", model="m", optimizer="o", data_loader="dl",
                     auditor_loader=[1], auditor_engine="e2")
    assert other.auditor_loader == [1] and other.auditor_engine == "e2"


def test_contract_bug_names_its_clause():
    assert CLAUSES == ("inputs", "release", "gaussian", "clipping")
    bug = ContractBug("x", "gaussian", "does x", lambda tr: tr)
    assert bug.per_step and bug.ghost_ok
    with pytest.raises(ValueError, match="'privacy'"):
        ContractBug("x", "privacy", "does x", lambda tr: tr)
