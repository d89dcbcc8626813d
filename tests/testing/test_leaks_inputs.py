"""testing.leaks_inputs: each setup bug is flagged at finalize; each wrong input with correct
training gets a refusal or a finding naming it, never a proof (one seed each; 20 in
benchmarks/detection.py)."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.harness import digits_training, run_audited, run_bug
from dpaudit_torch.testing.leaks_inputs import CLASSES, WRONG_INPUTS

#: what flags each class (monitor, level) in the report
EXPECTED = {
    "step-hook-missing": ("setup", "inconsistent"),
    "accountant-told-double-sigma": ("accounting", "inconsistent"),
    "accountant-stepped-per-epoch": ("setup", "inconsistent"),
    "trains-on-original-loader": ("sampling", "violation"),
}


def test_classes_name_their_clause():
    assert list(CLASSES) == list(EXPECTED)
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "inputs" and not bug.per_step


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_class_is_flagged(name):
    rep = run_bug(CLASSES[name], seed=0, steps=30)
    assert EXPECTED[name] in [(f["monitor"], f["level"]) for f in rep.findings]
    assert rep.claim_inconsistent or rep.violation


@pytest.mark.parametrize("name", list(WRONG_INPUTS))
def test_wrong_inputs_never_give_a_proof(name):
    tr = WRONG_INPUTS[name](digits_training(0))
    if name in ("another-engine", "engine-never-stepped"):
        with pytest.raises(ValueError, match="privacy_engine is not the engine that made this "
                                             "optimizer private"):
            run_audited(tr, 25, stop=False)
        return
    rep = run_audited(tr, 25, stop=False)
    assert not rep.violation and not rep.claim_refuted and not rep.claim_inconsistent
    [f] = [f for f in rep.findings if f["level"] != "note"]
    assert (f["monitor"], f["where"]) == ("setup", "data loader")
    assert "is not the one whose batches training releases" in f["message"]
