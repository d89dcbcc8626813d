"""Tests of dpaudit_torch/registry.py: the tables naming the sequential testers and the
epsilon lower-bound methods, and the rule deciding which bounds may refute a privacy claim.

Every entry is consistent (its module imports, its class exists and is a sequential test, names
and labels unique, a bound's monitor registered); ``may_refute`` holds exactly for whole-run
family-free methods (docs/design.md section 6: the f-DP test is marked ``family_free=False``, so it
never refutes a claim on its own); ``refuting_methods``, ``methods_of``, ``bound_method`` and
``tester_class`` on known and unknown names; the module imports neither torch nor Opacus.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re

import pytest
from conftest import loads_in_fresh_process

# TesterSpec, tester_class and tester_names are used through the module: pytest would collect
# names starting with "test"
from dpaudit_torch import registry
from dpaudit_torch.registry import (
    BOUND_METHODS,
    ONE_STEP,
    TESTERS,
    WHOLE_RUN,
    BoundMethod,
    bound_method,
    methods_of,
    refuting_methods,
)


def test_public_names() -> None:
    for name in registry.__all__:
        assert getattr(registry, name) is not None
    assert WHOLE_RUN != ONE_STEP


# ------------------------------------------------------------------------------------------------
# sequential testers
# ------------------------------------------------------------------------------------------------
def test_every_tester_entry_is_consistent() -> None:
    from dpaudit_torch.stats.base import SequentialTest

    # registration order
    assert registry.tester_names() == tuple(TESTERS) == ("mmd", "hockey_stick")
    labels = [spec.label for spec in TESTERS.values()]
    colors = [spec.color for spec in TESTERS.values()]
    assert len(set(labels)) == len(labels) and len(set(colors)) == len(colors)
    for name, spec in TESTERS.items():
        assert isinstance(spec, registry.TesterSpec) and spec.name == name
        cls = getattr(importlib.import_module(spec.module), spec.attr)
        assert isinstance(cls, type) and issubclass(cls, SequentialTest)
        assert spec.load() is cls and registry.tester_class(name) is cls
        assert re.fullmatch(r"#[0-9a-f]{6}", spec.color) and spec.label and spec.citation


def test_tester_class_of_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown sequential tester 'nope'; choose from "
                                         r"\['hockey_stick', 'mmd'\]"):
        registry.tester_class("nope")


# ------------------------------------------------------------------------------------------------
# bound methods
# ------------------------------------------------------------------------------------------------
def test_every_bound_method_entry_is_consistent() -> None:
    from dpaudit_torch.audit.monitors import MONITORS
    from dpaudit_torch.stats._one_run_checks import METHODS as ONE_RUN_METHODS

    labels = [b.label for b in BOUND_METHODS.values()]
    assert len(set(labels)) == len(labels)
    for name, b in BOUND_METHODS.items():
        assert isinstance(b, BoundMethod) and b.name == name
        assert b.scope in (WHOLE_RUN, ONE_STEP) and b.label and b.citation
        assert bool(b.family) == (not b.family_free)  # an assumed family is named
        assert b.monitor in MONITORS and name in methods_of(b.monitor)
        assert bound_method(name) is b
    # every method belongs to exactly one monitor; the one-run monitor computes the stats' tests
    covered = [n for m in {b.monitor for b in BOUND_METHODS.values()} for n in methods_of(m)]
    assert sorted(covered) == sorted(BOUND_METHODS)
    # the one-run monitor computes the white-box release bound and the canary game's tests
    assert methods_of("one_run") == ("whitebox", *ONE_RUN_METHODS)
    assert ONE_RUN_METHODS == ("steinke", "fdp")
    assert methods_of("sequential_pairs") == ("sequential",)


def test_the_documented_entries() -> None:
    steinke, fdp, seq = BOUND_METHODS["steinke"], BOUND_METHODS["fdp"], BOUND_METHODS["sequential"]
    assert (steinke.scope, steinke.family_free) == (WHOLE_RUN, True)
    assert (fdp.scope, fdp.family_free, fdp.family) == (WHOLE_RUN, False, "Gaussian")
    assert (seq.scope, seq.family_free) == (ONE_STEP, True)
    wb = BOUND_METHODS["whitebox"]
    assert (wb.scope, wb.family_free, wb.refutes_if_verified) == (WHOLE_RUN, False, True)
    assert wb.family == "DP-SGD white-box release"
    assert not fdp.refutes_if_verified


def test_may_refute_only_for_whole_run_family_free_or_verified_methods() -> None:
    for b in BOUND_METHODS.values():
        assert b.may_refute == (b.scope == WHOLE_RUN and (b.family_free or b.refutes_if_verified))
    assert [n for n, b in BOUND_METHODS.items() if b.may_refute] == ["whitebox", "steinke"]
    # the rule itself, on every combination, with and without a verified family
    for scope in (WHOLE_RUN, ONE_STEP):
        for free in (True, False):
            for verifiable in (True, False):
                b = BoundMethod("x", "x", scope, free, "c", family="" if free else "Gaussian",
                                refutes_if_verified=verifiable)
                assert b.may_refute == (scope == WHOLE_RUN and (free or verifiable))
                for det in (None, {}, {"family_verified": False}, {"family_verified": "yes"}):
                    assert b.refutes_with(det) == (scope == WHOLE_RUN and free)
                assert b.refutes_with({"family_verified": True}) == (
                    scope == WHOLE_RUN and (free or verifiable))


def test_entries_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BOUND_METHODS["fdp"].family_free = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TESTERS["mmd"].module = "os"  # type: ignore[misc]


def test_refuting_methods() -> None:
    high = {"steinke": 2.0, "fdp": 9.0, "sequential": 9.0}
    assert refuting_methods(high, 1.0) == ["steinke"]
    assert refuting_methods(high, 1) == ["steinke"]  # an int claim
    assert refuting_methods({"steinke": 1.0}, 1.0) == []  # strictly above the claim
    assert refuting_methods({"steinke": math.nextafter(1.0, 2.0)}, 1.0) == ["steinke"]
    assert refuting_methods({"steinke": 0.5, "fdp": 9.0, "sequential": 9.0}, 1.0) == []
    assert refuting_methods({"fdp": 9.0, "sequential": 9.0}, 1.0) == []  # never refute
    assert refuting_methods({}, 1.0) == []
    # what cannot be compared refutes nothing
    for claimed in (None, math.inf, -math.inf, math.nan, "1.0"):
        assert refuting_methods(high, claimed) == []  # type: ignore[arg-type]
    for bound in (None, "9.0", [9.0], math.nan):
        assert refuting_methods({"steinke": bound}, 1.0) == []
    # an unknown method (a newer report's) is ignored; a float bound of inf refutes
    assert refuting_methods({"newer": 9.0, "steinke": math.inf}, 1.0) == ["steinke"]
    # the white-box bound refutes only with its family verified in its recorded detail
    wb = {"whitebox": 9.0, "steinke": 0.5}
    assert refuting_methods(wb, 1.0) == []
    assert refuting_methods(wb, 1.0, {"whitebox": {"family_verified": False}}) == []
    assert refuting_methods(wb, 1.0, {"whitebox": {"family_verified": True}}) == ["whitebox"]
    assert refuting_methods({"whitebox": 0.9}, 1.0, {"whitebox": {"family_verified": True}}) == []


def test_lookups_of_unknown_names() -> None:
    assert bound_method("newer_method") is None
    assert methods_of("no_such_monitor") == ()
    assert methods_of("noise") == ()  # a monitor that computes no bound


def test_registry_imports_neither_torch_nor_opacus() -> None:
    assert not loads_in_fresh_process("import dpaudit_torch.registry", "torch")
    assert not loads_in_fresh_process("import dpaudit_torch.registry", "opacus")
