"""Tests of the one-run power simulation (docs/one_run.md, "How many canaries and steps";
docs/design.md section 6); the per-step scores themselves are tested in test_one_run_scores.py.

The simulations (the Binomial shortcut of the sum score and the conditional-normal approximation of
the llr score) against step-by-step simulations, with tolerances from standard errors; the bound
of the simulated game equal to the auditor's OneRunAudit call; monotonicity, the search for the
smallest refutable epsilon, the cases without power, argument checks, determinism, and coverage
against the true epsilon of the simulated mechanism (Opacus's accountants).
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from dpaudit_torch.stats.one_run import OneRunAudit
from dpaudit_torch.stats.one_run_power import (
    PowerResult,
    bounds_from_scores,
    one_run_power,
    simulate_one_run_bounds,
    simulate_scores,
)

DELTA, ALPHA = 1e-5, 0.05


# ------------------------------------------------------------------------------------------------
# simulations against step-by-step simulations
# ------------------------------------------------------------------------------------------------
def _moments_agree(a: np.ndarray, b: np.ndarray, z: float = 5.0) -> None:
    """Means and variances of two independent samples agree within z standard errors."""
    se_mean = math.sqrt(a.var() / a.size + b.var() / b.size)
    assert abs(a.mean() - b.mean()) < z * se_mean, (a.mean(), b.mean(), se_mean)
    # SE of a sample variance: sqrt((mu4 - s^4) / n)
    def se_var(x: np.ndarray) -> float:
        d = x - x.mean()
        return math.sqrt(max(np.mean(d**4) - np.mean(d**2) ** 2, 0.0) / x.size)
    assert abs(a.var() - b.var()) < z * math.hypot(se_var(a), se_var(b)), (a.var(), b.var())


def test_sum_shortcut_equals_step_by_step_in_distribution() -> None:
    sigma, q, steps, m, c = 1.3, 0.1, 40, 4000, 1.5
    lab_s, s_short = simulate_scores(sigma, q, steps, m, score="sum", c=c, replicates=2, seed=1,
                                     mode="approx")
    lab_e, s_exact = simulate_scores(sigma, q, steps, m, score="sum", c=c, replicates=2, seed=2,
                                     mode="exact")
    for want in (True, False):
        _moments_agree(s_short[lab_s == want], s_exact[lab_e == want])
    # and both have the exact moments: IN mean c q T, variance T s^2 + c^2 T q (1 - q)
    ins = s_short[lab_s]
    assert abs(ins.mean() - c * q * steps) < 5 * math.sqrt(ins.var() / ins.size)
    var_in = steps * sigma**2 + c**2 * steps * q * (1 - q)
    assert ins.var() == pytest.approx(var_in, rel=0.1)


@pytest.mark.parametrize(("sigma", "q", "steps"), [(0.8, 0.1, 120), (2.0, 0.02, 400),
                                                    (0.6, 0.4, 60)])
def test_llr_approximation_matches_step_by_step_moments(sigma: float, q: float, steps: int
                                                        ) -> None:
    m = 3000
    lab_a, s_a = simulate_scores(sigma, q, steps, m, score="llr", replicates=2, seed=3,
                                 mode="approx")
    lab_e, s_e = simulate_scores(sigma, q, steps, m, score="llr", replicates=2, seed=4,
                                 mode="exact")
    for want in (True, False):
        _moments_agree(s_a[lab_a == want], s_e[lab_e == want])


def test_q_one_llr_is_affine_in_the_sum() -> None:
    lab, s_sum = simulate_scores(0.9, 1.0, 30, 50, score="sum", seed=5, mode="exact")
    lab2, s_llr = simulate_scores(0.9, 1.0, 30, 50, score="llr", seed=5, mode="exact")
    np.testing.assert_array_equal(lab, lab2)  # exact mode: paired games
    np.testing.assert_allclose(s_llr, s_sum / 0.81 - 30 / (2 * 0.81), rtol=1e-9, atol=1e-9)


def test_simulated_bound_is_the_auditors_bound() -> None:
    rng = np.random.default_rng(6)
    for i in range(6):
        m = int(rng.integers(20, 600))
        lab = rng.random((1, m)) < 0.5
        s = rng.normal(size=(1, m)) + 1.2 * lab
        if i == 5:
            s = np.round(s)  # ties: the same tie-break as the auditor's call
        for method in ("steinke", "fdp"):
            got = bounds_from_scores(lab, s, delta=DELTA, alpha=ALPHA, method=method)[0]
            ins, outs = s[0][lab[0]], s[0][~lab[0]]
            want = OneRunAudit(ins, outs).epsilon_lower_bound(delta=DELTA, alpha=ALPHA,
                                                              method=method).bound
            assert got == want
    # an empty group gets 0.0, as in the auditor
    assert bounds_from_scores(np.ones((1, 5), bool), np.zeros((1, 5)), delta=DELTA)[0] == 0.0


# ------------------------------------------------------------------------------------------------
# power
# ------------------------------------------------------------------------------------------------
def test_expected_bound_grows_as_sigma_falls() -> None:
    kw = {"q": 0.2, "steps": 60, "m": 400, "delta": DELTA, "alpha": ALPHA, "replicates": 30}
    weak = one_run_power(2.0, **kw)
    strong = one_run_power(0.7, **kw)
    assert weak.expected_bound is not None and strong.expected_bound is not None
    assert strong.expected_bound > weak.expected_bound + 0.3
    lo, hi = strong.expected_bound_quantiles
    assert lo <= strong.expected_bound <= hi
    assert strong.mean_inclusions == pytest.approx(12.0) and not strong.warnings


def test_min_refutable_epsilon_search() -> None:
    calls: list[float] = []

    def eps_of(s: float) -> float:
        calls.append(s)
        return 3.0 / s

    kw = {"q": 0.2, "steps": 60, "m": 400, "delta": DELTA, "alpha": ALPHA, "replicates": 40,
          "search_replicates": 30, "epsilon_of_sigma": eps_of}
    # a claim far below what a correct run certifies: epsilon_of_sigma at sigma itself
    far = one_run_power(0.7, claimed_epsilon=0.01, **kw)
    assert calls == [0.7] and far.min_refutable_sigma == 0.7
    assert far.min_refutable_epsilon == pytest.approx(3.0 / 0.7)
    # a claim above the run's expected bound: sigma' < sigma, where the target is reached
    calls.clear()
    res = one_run_power(1.5, claimed_epsilon=1.0, **kw)
    assert res.min_refutable_sigma is not None and res.min_refutable_sigma < 1.5
    assert calls == [res.min_refutable_sigma]
    assert res.min_refutable_epsilon == pytest.approx(3.0 / res.min_refutable_sigma)
    hit = simulate_one_run_bounds(res.min_refutable_sigma, 0.2, 60, 400, delta=DELTA,
                                  replicates=30, seed=0, mode=res.mode)
    # the same 30 games (seed 0) as the search's last accepted step: the search's own criterion
    # (power >= target_power = 0.8) re-checked exactly, not a statistical statement
    assert np.mean(hit > 1.0) >= 0.8
    # above the ceiling of 400 canaries: cannot refute, no epsilon
    calls.clear()
    none = one_run_power(1.5, claimed_epsilon=50.0, **kw)
    assert none.min_refutable_epsilon is None and "cannot refute" in none.note and not calls
    missing = one_run_power(1.5, **(kw | {"epsilon_of_sigma": None}), claimed_epsilon=1.0)
    assert missing.min_refutable_epsilon is None and "not searched" in missing.note


def test_failing_accountant_is_a_warning_not_an_exception() -> None:
    def broken(s: float) -> float:
        raise RuntimeError("accountant exploded")

    res = one_run_power(0.7, 0.2, 60, 400, delta=DELTA, replicates=20, claimed_epsilon=0.01,
                        epsilon_of_sigma=broken)
    assert res.min_refutable_epsilon is None and "exploded" in " ".join(res.warnings)


@pytest.mark.parametrize(("q", "steps", "m"), [(0.1, 0, 100), (0.1, 50, 1), (0.1, 50, 0),
                                               (0.0, 50, 100)])
def test_no_power_cases(q: float, steps: int, m: int) -> None:
    res = one_run_power(1.0, q, steps, m, delta=DELTA, claimed_epsilon=1.0,
                        epsilon_of_sigma=lambda s: 1.0)
    assert res.no_power and res.note
    assert res.expected_bound is None and res.expected_bound_quantiles is None
    assert res.min_refutable_epsilon is None and res.mode is None
    json.dumps(res.to_dict())
    assert (simulate_one_run_bounds(1.0, q, steps, m, delta=DELTA, replicates=3) == 0).all()


def test_few_inclusions_warn() -> None:
    res = one_run_power(1.0, 0.003, 300, 200, delta=DELTA, replicates=10)
    assert res.mean_inclusions == pytest.approx(0.9)
    assert any("included only 0.9 times" in w for w in res.warnings)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"sigma": -1.0}, "-1.0"), ({"sigma": 0.0}, "sigma"), ({"q": 1.5}, "1.5"),
     ({"steps": -3}, "-3"), ({"m": -2}, "-2"), ({"replicates": 0}, "replicates"),
     ({"target_power": 1.5}, "1.5"), ({"claimed_epsilon": -1.0}, "-1.0"),
     ({"delta": 2.0}, "2.0"), ({"alpha": 0.0}, "alpha"), ({"score": "max"}, "'max'"),
     ({"mode": "fast"}, "'fast'"), ({"epsilon_of_sigma": 3.0}, "3.0"),
     ({"method": "fdp", "delta": 0.0}, "delta=0.0"), ({"strategy": "grid"}, "'grid'"),
     ({"c": 0.0}, "0.0")],
)
def test_bad_inputs_raise_naming_the_value(kwargs: dict, message: str) -> None:
    args = {"sigma": 1.0, "q": 0.1, "steps": 10, "m": 20, "delta": DELTA} | kwargs
    with pytest.raises(ValueError, match=message):
        one_run_power(args.pop("sigma"), args.pop("q"), args.pop("steps"), args.pop("m"), **args)


def test_deterministic_given_the_seed() -> None:
    kw = {"delta": DELTA, "replicates": 12, "claimed_epsilon": 0.8,
          "epsilon_of_sigma": lambda s: 2.0 / s, "search_replicates": 10,
          "search_iterations": 3}

    def strip(r: PowerResult) -> dict:
        d = r.to_dict()
        d.pop("seconds")
        return d

    a = one_run_power(1.2, 0.1, 80, 300, seed=4, **kw)
    b = one_run_power(1.2, 0.1, 80, 300, seed=4, **kw)
    c = one_run_power(1.2, 0.1, 80, 300, seed=5, **kw)
    assert strip(a) == strip(b) and strip(a) != strip(c)
    np.testing.assert_array_equal(
        simulate_one_run_bounds(1.0, 0.1, 3000, 300, score="llr", delta=DELTA, replicates=5,
                                seed=9, mode="approx"),
        simulate_one_run_bounds(1.0, 0.1, 3000, 300, score="llr", delta=DELTA, replicates=5,
                                seed=9, mode="approx"))
    d = a.to_dict()
    assert isinstance(d["expected_bound_quantiles"], list) and isinstance(d["warnings"], list)
    json.dumps(d)


# ------------------------------------------------------------------------------------------------
# coverage: the bound of a correct run stays below the true epsilon
# ------------------------------------------------------------------------------------------------
def _true_epsilon(sigma: float, q: float, steps: int) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = PRVAccountant()
        prv.history = [(sigma, q, steps)]
        rdp = RDPAccountant()
        rdp.history = [(sigma, q, steps)]
        # PRV is the near-exact one; RDP an upper bound. The smaller is the stricter truth.
        return min(float(prv.get_epsilon(DELTA)), float(rdp.get_epsilon(DELTA)))


def _coverage(replicates: int, seed: int) -> tuple[int, int, float]:
    sigma, q, steps, m = 0.55, 0.5, 4, 2000
    truth = _true_epsilon(sigma, q, steps)
    b = simulate_one_run_bounds(sigma, q, steps, m, score="llr", delta=DELTA, alpha=ALPHA,
                                replicates=replicates, seed=seed, mode="exact")
    fails = int((b > truth).sum())
    allowed = replicates * ALPHA + 3.0 * math.sqrt(replicates * ALPHA * (1 - ALPHA))
    return fails, int(allowed), float(np.median(b))


def test_coverage_small() -> None:
    fails, allowed, median = _coverage(40, seed=11)
    assert median > 0.5  # the game has power, so the check means something
    assert fails <= allowed


@pytest.mark.slow
def test_coverage_honest() -> None:
    fails, allowed, median = _coverage(1000, seed=12)
    assert median > 0.5
    assert fails <= allowed


@pytest.mark.parametrize(("sigma", "q", "steps"), [(0.857, 0.05, 300), (0.6, 0.02, 600)])
def test_llr_approximation_matches_step_by_step_bounds(sigma: float, q: float, steps: int
                                                       ) -> None:
    # the bound depends on the upper tail of the OUT scores, where a plain normal sum fails
    kw = {"delta": DELTA, "alpha": ALPHA, "replicates": 40}
    a = simulate_one_run_bounds(sigma, q, steps, 1000, seed=1, mode="approx", **kw)
    e = simulate_one_run_bounds(sigma, q, steps, 1000, seed=2, mode="exact", **kw)
    se = math.sqrt(a.var(ddof=1) / a.size + e.var(ddof=1) / e.size)
    assert abs(a.mean() - e.mean()) < 4 * se, (a.mean(), e.mean(), se)
