"""testing.leaks_coverage: each class breaks the coverage clause and the audit sees it."""

from __future__ import annotations

from dpaudit_torch.testing.leaks_coverage import CLASSES


def test_classes_name_their_clause():
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "coverage"
