"""testing.leaks_release: each class breaks the coverage clause and the audit sees it."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.harness import run_bug
from dpaudit_torch.testing.leaks_release import CLASSES


def _changed(report) -> set[str]:
    return {c["name"] for c in report.audits["coverage"]["changed_outside_release"]}


def test_classes_name_their_clause():
    assert len(CLASSES) >= 4
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "release" and not bug.per_step


@pytest.mark.parametrize("name,names", [
    ("second-optimizer", {"head.weight", "head.bias"}),
    ("manual-update", {"head.bias"}),
    ("running-stats-buffer", {"input_stats.running_mean", "input_stats.running_var"}),
    ("group-misses-tensor", {"head.bias"}),
])
def test_each_class_is_flagged_naming_its_tensors(name, names):
    rep = run_bug(CLASSES[name], 0, 6)
    assert _changed(rep) == names
    assert rep.verdict in ("finding (not a proof)", "claim inconsistent")
    found = [f for f in rep.findings if f["monitor"] == "coverage" and f["level"] == "finding"
             and "changed outside the DP release" in f["message"]]
    assert len(found) == 1
    firsts = {c["first_step"] for c in rep.audits["coverage"]["changed_outside_release"]}
    assert firsts == {1}


def test_the_correct_run_is_not_flagged():
    rep = run_bug(None, 0, 6)
    assert _changed(rep) == set() and not rep.claim_inconsistent
