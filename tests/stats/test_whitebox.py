"""The white-box release bound (dpaudit_torch.stats.whitebox; docs/design.md section 13).

Randomised checks use fixed seeds; their tolerances are binomial standard errors (3 SE, or
Clopper-Pearson intervals) of the simulated frequencies.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit_torch.stats import whitebox as wb

Q, T, M = 0.1, 60, 600


def _mc_statistic(rho: float, n1: int, n0: int, steps: int, q: float, n: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Draws of L from its definition (K, N, W independent)."""
    k = rng.binomial(n1 * steps, q, size=n)
    z = rng.standard_normal(n)
    w = rng.chisquare(n0 - 1, size=n)
    num = rho * k / n1 + math.sqrt(steps * (1 / n1 + 1 / n0)) * z
    return num / np.sqrt(steps * w / (n0 - 1))


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.5])
def test_the_law_matches_monte_carlo_and_the_conservative_tail_is_above_it(rho: float) -> None:
    rng = np.random.default_rng(1)
    n1, n0 = 290, 310
    law = wb.ReleaseLaw(n1, n0, T, Q)
    draws = _mc_statistic(rho, n1, n0, T, Q, 200_000, rng)
    for p in (0.5, 0.1, 0.01):
        stat = float(np.quantile(draws, 1 - p))
        se = math.sqrt(p * (1 - p) / draws.size)
        exact = law.tail(stat, rho, conservative=False)
        assert abs(exact - p) < 4 * se + 1e-4
        assert law.tail(stat, rho) >= exact - 1e-12
        assert law.tail(stat, rho) <= exact * 1.10 + 1e-4  # conservative, not wasteful


def test_the_tail_increases_with_rho_and_the_bound_with_the_statistic() -> None:
    law = wb.ReleaseLaw(300, 300, T, Q)
    tails = [law.tail(2.0, r) for r in np.linspace(0, 3, 13)]
    assert all(b >= a for a, b in zip(tails, tails[1:]))
    lbs = [law.rho_lower_bound(s, 0.05) for s in np.linspace(-1, 8, 19)]
    assert all(b >= a for a, b in zip(lbs, lbs[1:]))
    assert lbs[0] == 0.0 and lbs[-1] > 0
    s = 6.0
    r = law.rho_lower_bound(s, 0.05)
    assert law.tail(s, r) == pytest.approx(0.05, abs=1e-9)
    assert law.rho_lower_bound(math.inf, 0.05) == math.inf


def test_coverage_at_the_true_rho() -> None:
    """The lower confidence bound exceeds the true rho at most alpha of the time: 400 simulated
    releases, step by step, at alpha = 0.1."""
    rng = np.random.default_rng(7)
    sigma, alpha, runs = 1.5, 0.1, 400
    over = 0
    for _ in range(runs):
        lab, sums, sq, q4 = wb.simulate_release(sigma, Q, T, 200, rng)
        mom = wb.release_moments(sums, lab, T, sq, q4)
        over += wb.rho_lower_bound(mom, Q, alpha) > 1.0 / sigma
    ci = stats.binomtest(over, runs).proportion_ci(0.95, method="exact")
    assert ci.low <= alpha, (over, runs)
    assert over / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)


def test_coverage_of_the_epsilon_bound_exactly_at_the_claim() -> None:
    """Mechanisms exactly at their epsilon: a correct release with sigma from the PRV accountant
    (its upper end): the bound exceeds the true epsilon (the accountant's lower end) at most
    alpha of the time; 300 exact-sum releases at alpha = 0.1, with the monotone map from L."""
    rng = np.random.default_rng(3)
    sigma, q, steps, m, alpha, runs = 2.0, 0.05, 200, 1000, 0.1, 300
    true_eps = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "upper")
    over = 0
    for i in range(runs):
        lab, sums = wb.simulate_sums(sigma, q, steps, m, rng)
        mom = wb.release_moments(sums, lab, steps)
        if i < 20:  # the whole bound on some, to tie the shortcut to it
            res = wb.whitebox_bound(mom, q, 1e-5, alpha=alpha, check=False)
            assert (res.bound > true_eps) == (res.rho_lower > 1.0 / sigma) or math.isclose(
                res.rho_lower, 1 / sigma, rel_tol=1e-3)
        over += wb.rho_lower_bound(mom, q, alpha) > 1.0 / sigma
    assert over / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)


def _check(rng: np.random.Generator, sigma: float, q: float, steps: int, m: int,
           alpha: float = wb.WHITEBOX_ALPHA, scale: float = 1.0, **kw: object
           ) -> wb.FamilyCheck:
    """The family check of one simulated release, every value multiplied by ``scale``."""
    lab, sums, sq, q4, vals = wb.simulate_release(sigma, q, steps, m, rng, keep_values=True,
                                                  **kw)
    mom = wb.release_moments(sums * scale, lab, steps, sq * scale ** 2, q4 * scale ** 4)
    return wb.family_check(mom, alpha, q=q, out_values=vals[:, ~lab] * np.float32(scale))


def test_power_less_noise_than_claimed_is_refuted() -> None:
    rng = np.random.default_rng(11)
    q, steps, m = 0.05, 300, 2000
    claim = wb.dpsgd_epsilon(2.0, q, steps, 1e-5, "upper")
    for sigma, refuted in ((1.0, True), (2.0, False)):  # half the noise; correct
        lab, sums, sq, q4, v = wb.simulate_release(sigma, q, steps, m, rng, keep_values=True)
        res = wb.whitebox_bound(wb.release_moments(sums, lab, steps, sq, q4), q, 1e-5,
                                out_values=v[:, ~lab])
        assert res.family_verified and res.bound is not None, res.note
        assert (res.bound > claim) == refuted and res.bound > 0.5 * claim
        assert res.family_check["value_steps"] == steps


def test_the_family_check() -> None:
    rng = np.random.default_rng(5)
    for noise, ok in (("gaussian", True), ("laplace", False), ("uniform", False),
                      ("antithetic", False), ("flat_laplace", False),
                      ("pair_correlated", False)):
        fc = _check(rng, 1.0, Q, 40, 1000, noise=noise)
        assert fc.passed == ok, (noise, fc)
        if noise == "antithetic":
            assert "not independent" in fc.reason
        if noise == "flat_laplace":  # kurtosis 3: only the whole-null cells see it
            assert abs(fc.kurtosis - 3.0) <= fc.kurtosis_tolerance
            assert "whole-null" in fc.reason and fc.whole_null_worst == "shape"
    lab, sums, sq, q4, v = wb.simulate_release(1.0, Q, 40, 1000, rng, noise="laplace",
                                               keep_values=True)
    res = wb.whitebox_bound(wb.release_moments(sums, lab, 40, sq, q4), Q, 1e-5,
                            out_values=v[:, ~lab])
    assert res.bound is None and "not Gaussian" in res.note and not res.family_verified
    # no per-step moments (an older checkpoint), or no per-step values: no verified family
    assert not wb.family_check(wb.release_moments(sums, lab, 40)).passed
    fc = wb.family_check(wb.release_moments(sums, lab, 40, sq, q4))
    assert not fc.passed
    with pytest.raises(ValueError, match="out_values"):
        wb.family_check(wb.release_moments(sums, lab, 40, sq, q4), out_values=v)


def test_the_flat_laplace_noise_has_kurtosis_three() -> None:
    """Unit variance and kurtosis 3 in closed form, and in 10^6 draws (3 standard errors:
    Var(x^2) = 2 + ... estimated from the draws)."""
    a, b = wb.flat_laplace_shape()
    h = 1 / (2 * (a + b))
    m2 = 2 * h * (a ** 3 / 3 + b * (a * a + 2 * a * b + 2 * b * b))
    m4 = 2 * h * (a ** 5 / 5 + b * (a ** 4 + 4 * a ** 3 * b + 12 * a * a * b * b
                                    + 24 * a * b ** 3 + 24 * b ** 4))
    assert m2 == pytest.approx(1.0, rel=1e-12) and m4 == pytest.approx(3.0, rel=1e-10)
    x = wb._flat_laplace_draw(np.random.default_rng(0), (1_000_000,))
    for k, want in ((2, 1.0), (4, 3.0)):
        v = x ** k
        assert abs(v.mean() - want) <= 3 * v.std() / math.sqrt(x.size)


def test_the_verdict_is_scale_invariant() -> None:
    """A release multiplied by a positive constant gets the same verdict: at 1e-6 (the
    contribution and the noise both ~1e-6) as at unit scale, for Gaussian and Laplace noise;
    a noise-free release stays noise-free at any scale."""
    for noise in ("gaussian", "laplace", "flat_laplace"):
        for seed in range(3):
            ref = _check(np.random.default_rng([seed, 1]), 1.0, Q, 30, 400, noise=noise)
            for scale in (1e-6, 1e3):
                fc = _check(np.random.default_rng([seed, 1]), 1.0, Q, 30, 400, noise=noise,
                            scale=scale)
                assert fc.passed == ref.passed and fc.reason.split(":")[0] == \
                    ref.reason.split(":")[0], (noise, scale, fc.reason, ref.reason)
            if noise != "gaussian":
                assert not ref.passed
    for scale in (1e-6, 1.0, 1e6):
        fc = _check(np.random.default_rng(3), 0.0, Q, 30, 400, scale=scale)
        assert fc.passed and fc.noise_free, scale
    # the old absolute threshold: RMS 1e-6 C with a contribution of 1e-6 C is not noise-free
    fc = _check(np.random.default_rng(4), 1e-6, Q, 30, 400, noise="laplace", c=1e-6)
    assert not fc.passed and not fc.noise_free


def test_a_non_finite_statistic_withholds_the_bound() -> None:
    rng = np.random.default_rng(9)
    lab, sums, sq, q4, v = wb.simulate_release(1.0, Q, 30, 400, rng, keep_values=True)
    mom = wb.release_moments(sums, lab, 30, sq, q4)
    for field in ("kurtosis", "step_var"):
        for bad in (math.nan, math.inf):
            broken = wb.ReleaseMoments(**{**mom.__dict__, field: bad})
            fc = wb.family_check(broken, q=Q, out_values=v[:, ~lab])
            assert not fc.passed and "not finite" in fc.reason, (field, bad, fc.reason)
            res = wb.whitebox_bound(broken, Q, 1e-5, out_values=v[:, ~lab])
            assert res.bound is None and "not finite" in res.note
    assert wb.family_check(mom, q=Q, out_values=v[:, ~lab]).passed


def test_correct_releases_are_withheld_at_most_at_the_level() -> None:
    """The family check's false withholding on correct Gaussian releases: at most alpha (its
    four parts at alpha / 4 each); 200 releases at alpha = 0.1, within 3 binomial SE."""
    rng = np.random.default_rng(8)
    alpha, runs = 0.1, 200
    fails = sum(not _check(rng, 1.0, Q, 30, 300, alpha=alpha).passed for _ in range(runs))
    assert fails / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), fails


def test_a_noise_free_release_gives_the_ceiling() -> None:
    rng = np.random.default_rng(2)
    lab, sums, sq, q4, v = wb.simulate_release(0.0, Q, T, M, rng, keep_values=True)
    res = wb.whitebox_bound(wb.release_moments(sums, lab, T, sq, q4), Q, 1e-5,
                            out_values=v[:, ~lab])
    assert res.family_verified and "noise-free" in res.family_check["reason"]
    assert res.bound == pytest.approx(res.ceiling) and res.ceiling > 20
    pw = wb.whitebox_power(1.0, Q, T, M, delta=1e-5, claimed_epsilon=2.0)
    assert pw["ceiling"] == pytest.approx(res.ceiling)


def test_power_statement_agrees_with_simulated_releases() -> None:
    """The exact power statement: the bound is increasing in L, so its median and 10/90 %
    quantiles are the bound at L's quantiles; those quantiles against 300 simulated releases
    (3 binomial SE), and the stated bounds are the bound at them."""
    rng = np.random.default_rng(4)
    sigma, q, steps, m, alpha = 2.0, 0.05, 200, 1000, 0.05
    pw = wb.whitebox_power(sigma, q, steps, m, delta=1e-5, alpha=alpha, n_in=m // 2)
    law = wb.ReleaseLaw(m // 2, m - m // 2, steps, q)
    lab = np.zeros(m, dtype=bool)
    lab[: m // 2] = True
    sims = []
    for _ in range(300):
        k = rng.binomial(steps, q, size=m) * lab
        sums = k + rng.standard_normal(m) * sigma * math.sqrt(steps)
        sims.append(wb.release_moments(sums, lab, steps).statistic)
    stated = (pw["expected_bound_quantiles"][0], pw["expected_bound"],
              pw["expected_bound_quantiles"][1])
    for p, eps in zip((0.1, 0.5, 0.9), stated):
        stat = law.quantile(p, 1.0 / sigma)
        frac = float(np.mean(np.asarray(sims) <= stat))
        assert abs(frac - p) <= 3 * math.sqrt(p * (1 - p) / 300), (p, frac)
        rho = law.rho_lower_bound(stat, alpha)
        assert eps == pytest.approx(wb.dpsgd_epsilon(1.0 / rho, q, steps, 1e-5, "lower"))


def test_min_refutable_epsilon_is_refuted_with_the_target_power() -> None:
    """At the stated smallest refutable noise, the bound exceeds the claim in 80 % of releases
    (200 exact-sum releases, 3 binomial SE); the refutation is decided in rho (the bound is
    above the claim iff rho_lb is above the rho whose lower PRV epsilon is the claim)."""
    from scipy import optimize

    rng = np.random.default_rng(6)
    q, steps, m = 0.05, 200, 1000
    claim = wb.dpsgd_epsilon(2.0, q, steps, 1e-5, "upper")
    pw = wb.whitebox_power(2.0, q, steps, m, delta=1e-5, claimed_epsilon=claim, n_in=m // 2)
    s_star = pw["min_refutable_sigma"]
    assert s_star < 2.0 and pw["min_refutable_epsilon"] > claim
    log_sc = optimize.brentq(
        lambda ls: wb.dpsgd_epsilon(math.exp(ls), q, steps, 1e-5, "lower") - claim,
        math.log(1.0), math.log(4.0), xtol=1e-9)
    rho_c = math.exp(-log_sc)
    law = wb.ReleaseLaw(m // 2, m - m // 2, steps, q)
    lab = np.zeros(m, dtype=bool)
    lab[: m // 2] = True
    refuted = 0
    for _ in range(200):
        k = rng.binomial(steps, q, size=m) * lab
        sums = k + rng.standard_normal(m) * s_star * math.sqrt(steps)
        stat = wb.release_moments(sums, lab, steps).statistic
        refuted += law.rho_lower_bound(stat, wb.WHITEBOX_ALPHA) > rho_c
    assert abs(refuted / 200 - 0.8) <= 3 * math.sqrt(0.8 * 0.2 / 200), refuted


def test_bad_input() -> None:
    lab = np.array([True, False, False])
    with pytest.raises(ValueError, match="finite"):
        wb.release_moments(np.array([1.0, np.nan, 0.0]), lab, 3)
    with pytest.raises(ValueError, match="differ in shape"):
        wb.release_moments(np.zeros(2), lab, 3)
    with pytest.raises(ValueError, match="at least 1 IN and 2 OUT"):
        wb.release_moments(np.zeros(2), np.array([True, False]), 3)
    mom = wb.release_moments(np.array([1.0, 0.1, -0.2]), lab, 3)
    with pytest.raises(ValueError, match="alpha"):
        wb.whitebox_bound(mom, 0.1, 1e-5, alpha=1.5)
    with pytest.raises(ValueError, match="delta"):
        wb.whitebox_bound(mom, 0.1, 0.0)
    with pytest.raises(ValueError, match="q must be"):
        wb.whitebox_bound(mom, 0.0, 1e-5)
    with pytest.raises(ValueError, match="sigma"):
        wb.dpsgd_epsilon(-1.0, 0.1, 3, 1e-5)
    with pytest.raises(ValueError, match="which"):
        wb.dpsgd_epsilon(1.0, 0.1, 3, 1e-5, which="middle")
    with pytest.raises(ValueError, match="noise"):
        wb.simulate_release(1.0, 0.1, 3, 4, np.random.default_rng(0), noise="cauchy")


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 0.05, 300), (2.58, 0.08192, 2500),
                                                    (8.0, 0.01, 1000)])
def test_the_epsilon_map_is_the_prv_accountants(sigma: float, q: float, steps: int) -> None:
    """dpsgd_epsilon is Opacus's PRV accountant with a domain at least as wide: its error
    interval [lower, upper] contains Opacus's estimate, and its upper end is Opacus's
    get_epsilon within the accountant's eps error (0.01)."""
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    opacus_upper = acc.get_epsilon(1e-5)
    lo = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "lower")
    est = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "estimate")
    up = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "upper")
    # the interval: 2 eps errors plus the effect of delta +- delta / 1000
    assert lo < est < up and up - lo <= 0.03
    assert lo < opacus_upper and abs(up - opacus_upper) <= 0.01
    # larger noise, smaller epsilon: the map the bound inverts is monotone
    assert wb.dpsgd_epsilon(1.1 * sigma, q, steps, 1e-5, "lower") < lo
