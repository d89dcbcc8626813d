"""tests/float_tolerance.py: the comparison of stored numbers with numbers computed here."""

from __future__ import annotations

import math

import pytest
from float_tolerance import (
    U32,
    U64,
    Tol,
    assert_tree_close,
    mismatches,
    random_walk_rel,
    solver_tol,
    sum_rel,
)

TOL = Tol(rel=sum_rel(1024), why="float64")
STORED = {"log_wealth": 2164.1111489506657, "interval": [0.030783776904104616, 0.0320418],
          "n": 12, "rejected": True, "name": "noise", "none": None,
          "rows": [{"x": 1.0, "y": -3.5}]}


def _copy_with(path_value: dict[str, float]) -> dict:
    import copy

    d = copy.deepcopy(STORED)
    for path, v in path_value.items():
        if path == "log_wealth":
            d["log_wealth"] = v
        elif path == "interval[0]":
            d["interval"][0] = v
        elif path == "rows[0].y":
            d["rows"][0]["y"] = v
    return d


def test_the_constants_and_derivations():
    assert U64 == 2.0 ** -53 and U32 == 2.0 ** -24
    assert sum_rel(1024) == 1028 * 2.0 ** -53
    assert sum_rel(10, u=U32, condition=3.0, ulps=0.0) == 30 * 2.0 ** -24
    assert random_walk_rel(384, U32) == math.sqrt(384) * 2.0 ** -24
    t = solver_tol(1e-12, 1e-10)
    assert (t.rel, t.abs) == (2e-10, 2e-12)
    assert Tol(1e-9, 1e-12).scaled(2.0) == Tol(2e-9, 2e-12)


def test_equal_tree_passes_and_rounding_within_the_tolerance_passes():
    assert mismatches(STORED, STORED, TOL) == []
    lw = STORED["log_wealth"]
    # another CPU's value (6e-13 relative): beyond the float64 tolerance (1.1e-13), within the
    # float32 run's that this field has in tests/audit/test_checkpoint.py
    other_cpu = _copy_with({"log_wealth": 2164.111148951922})
    assert mismatches(other_cpu, STORED, TOL) != []
    assert_tree_close(other_cpu, STORED, TOL, {"log_wealth": Tol(rel=random_walk_rel(384, U32))})
    # within the float64 tolerance: a few hundred ulp
    assert_tree_close(_copy_with({"log_wealth": lw * (1 + 0.9 * TOL.rel)}), STORED, TOL)


def test_a_perturbation_beyond_the_tolerance_is_named_by_its_path():
    lw = STORED["log_wealth"]
    bad = _copy_with({"log_wealth": lw * (1 + 1.1 * TOL.rel), "rows[0].y": -3.5 * (1 + 1e-9)})
    out = mismatches(bad, STORED, TOL)
    assert len(out) == 2
    assert out[0].startswith("log_wealth: got ") and repr(lw) in out[0]
    assert out[1].startswith("rows[0].y: got -3.5000000035") and "expected -3.5" in out[1]
    with pytest.raises(AssertionError, match=r"2 mismatch\(es\):\nlog_wealth: got "):
        assert_tree_close(bad, STORED, TOL)
    # a field's own tolerance: the first matching pattern wins
    fields = {"rows*": Tol(rel=1e-8), "*": Tol(rel=0.0, why="exact")}
    (only,) = mismatches(bad, STORED, TOL, fields)
    assert only.startswith("log_wealth: got ") and only.endswith("allowed rel 0, abs 0: exact)")


def test_absolute_tolerance_for_values_near_zero():
    tol = Tol(rel=1e-6, abs=1e-9)
    assert tol.allows(0.0, 5e-10) and not tol.allows(0.0, 2e-9)
    assert tol.allows(math.nan, math.nan) and not tol.allows(math.nan, 0.0)
    assert tol.allows(math.inf, math.inf) and not tol.allows(math.inf, 1e308)


@pytest.mark.parametrize("path,value", [
    ("n", 13), ("n", 12.0), ("rejected", False), ("rejected", 1), ("name", "noisy"),
    ("none", 0.0), ("interval", [0.03, 0.03, 0.03]),
])
def test_strings_booleans_integers_none_and_shapes_are_exact(path, value):
    got = dict(STORED, **{path: value})
    out = mismatches(got, STORED, Tol(rel=1.0, abs=1.0))  # any float would pass
    assert len(out) == 1 and out[0].startswith(f"{path}: ")


def test_missing_and_unexpected_keys_are_named():
    got = {k: v for k, v in STORED.items() if k != "n"}
    got["extra"] = 1
    assert mismatches(got, STORED, TOL) == ["n: missing (expected 12)",
                                            "extra: unexpected (got 1)"]
