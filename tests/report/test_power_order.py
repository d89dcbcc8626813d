"""The power aspects of the strength order (dpaudit_torch/report/power_order.py): what they read
from a report (the white-box law of a report of this release, the simulated statement of the
1.3 fixture, no power, no statement), each aspect's relation at the edges of its tolerance, and
(slow) that the stated tolerance covers what the coins move between two runs of the same
settings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpaudit_torch.report.power_order import (
    EXPECTED_ATOL,
    REFUTABLE_RTOL,
    SE_FACTOR,
    power_fields,
    power_relation,
    power_sentence,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def test_fields_of_a_white_box_law_statement() -> None:
    d = _load("gate_300_steps.json")
    p = d["power"]
    f = power_fields(d)
    assert p["mode"] == "law" and f["expected_ratio_se"] == 0.0
    assert f["mean_inclusions"] == p["mean_inclusions"] == 37.5
    assert f["expected_ratio"] == p["expected_bound"] / d["claimed_epsilon"]
    assert f["refutable_ratio"] == p["min_refutable_epsilon"] / d["claimed_epsilon"]


def test_fields_of_a_simulated_statement_that_cannot_refute() -> None:
    """The 1.3 fixture: 100 simulated games (expected bound 0, quantiles [0, 0.1766]) and no
    refutable epsilon ("cannot refute the claim at this m and T"): ratio infinity; the median's
    standard error 1.2533 x 0.1766 / 2.5631 / sqrt(100), over the claim 5.882."""
    d = _load("report_v1_3.json")
    f = power_fields(d)
    assert f["expected_ratio"] == 0.0 and f["refutable_ratio"] == math.inf
    lo, hi = d["power"]["expected_bound_quantiles"]
    se = 1.2533 * (hi - lo) / 2.5631 / 10.0 / d["claimed_epsilon"]
    assert f["expected_ratio_se"] == pytest.approx(se, rel=1e-12)


def test_fields_without_a_statement_or_without_power() -> None:
    d = _load("gate_30_steps.json")
    d["power"] = {}
    assert power_fields(d) == {"mean_inclusions": pytest.approx(3.75, rel=1e-12),
                               "expected_ratio": None, "expected_ratio_se": None,
                               "refutable_ratio": None}  # q T from training: 0.125 x 30
    d["power"] = {"no_power": True, "expected_bound": None, "min_refutable_epsilon": None,
                  "claimed_epsilon": d["claimed_epsilon"]}
    f = power_fields(d)
    assert (f["expected_ratio"], f["refutable_ratio"]) == (0.0, math.inf)
    d["claimed_epsilon"] = None  # no claim: no ratio
    d["power"] = {"expected_bound": 1.0}
    assert power_fields(d)["expected_ratio"] is None


@pytest.mark.parametrize("aspect,base,same,stronger,weaker", [
    ("steps_observed", 300, 300, 301, 299),
    ("mean_inclusions", 3.0, 3.0 * (1 + 1e-12), 3.0001, 2.9999),
    ("expected_ratio", 0.5, 0.5 + 0.999 * EXPECTED_ATOL, 0.5 + 1.001 * EXPECTED_ATOL,
     0.5 - 1.001 * EXPECTED_ATOL),
    ("refutable_ratio", 2.0, 2.0 * (1 + 0.999 * REFUTABLE_RTOL),
     2.0 / (1 + 1.001 * REFUTABLE_RTOL), 2.0 * (1 + 1.001 * REFUTABLE_RTOL)),
    ("refutable_ratio", math.inf, math.inf, 1e6, None),
])
def test_each_power_aspect_at_the_edges_of_its_tolerance(aspect: str, base: float, same: float,
                                                         stronger: float,
                                                         weaker: float | None) -> None:
    assert power_relation(aspect, base, base) == "same"
    assert power_relation(aspect, same, base) == power_relation(aspect, base, same) == "same"
    assert power_relation(aspect, stronger, base) == "stronger"
    assert power_relation(aspect, base, stronger) == "weaker"
    if weaker is not None:
        assert power_relation(aspect, weaker, base) == "weaker"


def test_the_simulation_error_widens_the_expected_bounds_tolerance() -> None:
    se = 0.02  # each; 3 x sqrt(2) x 0.02 = 0.085 on top of 0.05
    tol = EXPECTED_ATOL + SE_FACTOR * math.hypot(se, se)
    assert power_relation("expected_ratio", 0.5 - 0.99 * tol, 0.5, se, se) == "same"
    assert power_relation("expected_ratio", 0.5 - 1.01 * tol, 0.5, se, se) == "weaker"
    assert power_relation("expected_ratio", 0.5 - 0.99 * tol, 0.5) == "weaker"  # exact: no
    with pytest.raises(ValueError, match="not a power aspect"):
        power_relation("alpha", 1.0, 1.0)


def test_the_sentences_name_both_numbers_and_the_tolerance() -> None:
    assert power_sentence("refutable_ratio", math.inf, 1.528) == (
        "smallest refutable epsilon (power): 1.53 x the claim -> cannot refute the claim "
        "(tolerance 10 %)")
    assert power_sentence("steps_observed", 30, 300) == "steps observed: 300 -> 30"
    assert power_sentence("expected_ratio", 0.456, 0.705).startswith(
        "expected bound (power): 0.705 x the claim -> 0.456 x the claim (tolerance 0.05")


@pytest.mark.slow
@pytest.mark.parametrize("m,steps,q", [(200, 100, 0.05), (1000, 30, 0.125), (1000, 300, 0.125)])
def test_the_tolerance_covers_the_coin_count_between_runs(m: int, steps: int, q: float) -> None:
    """The white-box statement depends on the number of IN canaries, Binomial(m, 1/2): over
    +-3 standard deviations of it, the expected bound moves by less than EXPECTED_ATOL x the
    claim and the smallest refutable epsilon by less than REFUTABLE_RTOL (so two runs of the
    same settings compare as the same power but in 3 of 1000 draws at most)."""
    from dpaudit_torch.stats._whitebox_epsilon import dpsgd_epsilon
    from dpaudit_torch.stats.whitebox import whitebox_power

    claim = dpsgd_epsilon(1.0, q, steps, 1e-5, "estimate")
    sd = math.sqrt(m) / 2
    out = {}
    for n_in in (round(m / 2 - 3 * sd), m // 2, round(m / 2 + 3 * sd)):
        p = whitebox_power(1.0, q, steps, m, delta=1e-5, claimed_epsilon=claim, n_in=n_in)
        out[n_in] = (p["expected_bound"] / claim, p["min_refutable_epsilon"] / claim)
    eb = [v[0] for v in out.values()]
    mre = [v[1] for v in out.values()]
    assert max(eb) - min(eb) < EXPECTED_ATOL, out
    assert max(mre) / min(mre) - 1 < REFUTABLE_RTOL, out
