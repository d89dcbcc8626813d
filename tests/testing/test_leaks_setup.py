"""testing.leaks_setup: each class breaks the setup clause and the audit sees it."""

from __future__ import annotations

from dpaudit_torch.testing.leaks_setup import CLASSES


def test_classes_name_their_clause():
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "setup"
