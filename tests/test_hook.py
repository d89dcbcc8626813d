"""dpaudit_torch/hook.py, the compatibility import path: the names it has always offered are the
very objects of dpaudit_torch.audit, and it defines nothing of its own."""

from __future__ import annotations

import dpaudit_torch.audit as audit
import dpaudit_torch.hook as hook

#: what ``from dpaudit_torch.hook import ...`` has offered since before the engine was split
NAMES = ("PrivacyAuditor", "PrivacyViolationError", "per_step_null_grid", "DEFAULT_NULL_GRID",
         "DEFAULT_TEST_OPTIONS", "STATE_VERSION")


def test_the_names_are_those_of_the_engine() -> None:
    assert sorted(hook.__all__) == sorted(NAMES)
    for name in NAMES:
        assert getattr(hook, name) is getattr(audit, name), name


def test_the_old_import_path_works() -> None:
    import dpaudit_torch
    from dpaudit_torch.hook import PrivacyAuditor, PrivacyViolationError

    assert PrivacyAuditor is dpaudit_torch.PrivacyAuditor
    assert issubclass(PrivacyViolationError, Exception)


def test_nothing_is_defined_here() -> None:
    public = [n for n in vars(hook) if not n.startswith("_")]
    assert set(public) - {"annotations"} == set(NAMES)
    for name in NAMES:
        obj = getattr(hook, name)
        assert getattr(obj, "__module__", audit.__name__) != hook.__name__, name
