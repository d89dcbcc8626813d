"""testing.leaks_clipping: each class breaks the clipping clause and the audit sees it."""

from __future__ import annotations

from dpaudit_torch.testing.leaks_clipping import CLASSES


def test_classes_name_their_clause():
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "clipping"
