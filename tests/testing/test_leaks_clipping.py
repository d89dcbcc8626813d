"""testing.leaks_clipping: each class breaks the clipping clause and the audit sees it."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.harness import run_bug
from dpaudit_torch.testing.leaks_clipping import CLASSES


def test_classes_name_their_clause():
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "clipping"
        assert bug.per_step and not bug.ghost_ok


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_is_decided_within_50_steps(name):
    """One seed per class (the detection benchmark runs 20): a violation decided by step 50,
    with the canaries through the user's clipping code at every step (no fallback)."""
    rep = run_bug(CLASSES[name], 0, 50)
    assert rep.violation and rep.violation_step is not None and rep.violation_step <= 50
    assert rep.threat_model["clipping_exercised"]
