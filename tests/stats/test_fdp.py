"""Tests of dpaudit_torch/stats/fdp.py: the one-run f-DP test against the Gaussian family.

Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025 (arXiv
2410.22235), as written in docs/design.md section 6: to test "the run is mu-GDP" with c' guesses,
c of them correct, m canaries and level alpha, with Finv(x) = Phi(Phi^-1(x) - mu),

    r = alpha c / m,   h = alpha (c' - c) / m
    for i = c - 1 down to 0:
        h_new = max(h, Finv(r));  stop if h_new == h
        r = min(r + i / (c' - i) (h_new - h), 1);  h = h_new
    reject iff r + h > c' / m,

and the bound is eps(delta) of the largest rejected mu (Dong, Roth & Su 2019).  Checked here
against that recursion transcribed with scipy, a root found by scipy, the GDP profile's closed
form, exact and simulated rejection rates of true claims, monotonicity and argument checks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpaudit_torch.stats.fdp import (
    FDP_FAMILY_NOTE,
    check_fdp_delta,
    fdp_epsilon_lower_bound,
    fdp_mu_lower_bound,
    fdp_rejects,
    fdp_search,
    fdp_test_statistic,
    mu_to_eps,
)
from dpaudit_torch.stats.thresholds import gaussian_epsilon

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 0.05


def _doc_margin(m: int, c_guess: int, c: int, mu: float, alpha: float) -> float:
    """r + h - c'/m of the recursion above, line by line, with scipy's normal distribution."""
    r = alpha * c / m
    h = alpha * (c_guess - c) / m
    for i in range(c - 1, -1, -1):
        h_new = max(h, float(stats.norm.cdf(stats.norm.ppf(r) - mu)))
        if h_new == h:
            break
        r = min(r + i / (c_guess - i) * (h_new - h), 1.0)
        h = h_new
    return r + h - c_guess / m


def _gdp_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong et al.)."""
    phi = stats.norm.cdf
    return float(phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2))


def test_statistic_is_the_documented_recursion() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        m = int(rng.integers(1, 2000))
        c_guess = int(rng.integers(1, m + 1))
        c = int(rng.integers(0, c_guess + 1))
        mu = float(rng.choice([0.0, rng.uniform(0.0, 6.0)]))
        alpha = float(rng.choice([0.01, 0.05, 0.2]))
        want = _doc_margin(m, c_guess, c, mu, alpha)
        got = fdp_test_statistic(m, c_guess, c, mu, alpha)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (m, c_guess, c, mu, alpha)
        assert fdp_rejects(m, c_guess, c, mu, alpha) == (got > 0.0)


@pytest.mark.parametrize(("m", "c_guess", "c"), [(1000, 300, 260), (5000, 200, 200),
                                                 (100, 50, 45), (20_000, 1000, 800)])
def test_mu_bound_is_the_root_of_the_documented_margin(m: int, c_guess: int, c: int) -> None:
    # the margin is continuous and decreasing in mu: its root (scipy's brentq on the transcribed
    # recursion) is the largest rejected mu
    root = optimize.brentq(lambda mu: _doc_margin(m, c_guess, c, mu, ALPHA), 0.0, 50.0,
                           xtol=1e-13, rtol=1e-13)
    mu_star = fdp_mu_lower_bound(m, c_guess, c, ALPHA)
    assert mu_star == pytest.approx(root, rel=1e-8)
    # eps(delta) of mu*-GDP: the profile's closed form equals delta there
    for delta in (1e-6, 1e-5, 1e-3):
        eps = fdp_epsilon_lower_bound(m, c_guess, c, delta, ALPHA)
        assert eps > 0.0
        assert _gdp_delta(eps, mu_star) == pytest.approx(delta, rel=1e-7)


def test_mu_to_eps() -> None:
    assert mu_to_eps(0.0, 1e-5) == 0.0 and mu_to_eps(-1.0, 1e-5) == 0.0
    assert mu_to_eps(math.inf, 1e-5) == math.inf
    # mu = 1, delta = 1e-5: the closed-form profile, inverted by scipy
    want = optimize.brentq(lambda e: _gdp_delta(e, 1.0) - 1e-5, 0.0, 20.0, xtol=1e-14)
    assert mu_to_eps(1.0, 1e-5) == pytest.approx(want, rel=1e-9)
    # eps(delta) grows with mu and falls with delta
    e = [mu_to_eps(mu, 1e-5) for mu in (0.5, 1.0, 2.0, 4.0)]
    assert e == sorted(e) and len(set(e)) == 4
    d = [mu_to_eps(1.0, delta) for delta in (1e-8, 1e-5, 1e-2)]
    assert d == sorted(d, reverse=True)


def test_fdp_rejection_is_monotone_in_mu() -> None:
    m, c_guess, c_correct = 1000, 300, 260
    mu_star = fdp_mu_lower_bound(m, c_guess, c_correct, ALPHA)
    assert mu_star > 0
    grid = np.linspace(0, 2 * mu_star, 41)
    rejected = [fdp_rejects(m, c_guess, c_correct, float(mu), ALPHA) for mu in grid]
    assert rejected == [bool(mu < mu_star) for mu in grid]
    assert fdp_epsilon_lower_bound(m, c_guess, c_correct, 1e-5, ALPHA) == pytest.approx(
        gaussian_epsilon(1e-5, mu_star))
    # more correct guesses, same number of guesses: a stronger rejection
    assert fdp_mu_lower_bound(m, c_guess, c_correct + 10, ALPHA) > mu_star
    # nothing correct: nothing rejected
    assert fdp_mu_lower_bound(m, c_guess, 0, ALPHA) == 0.0


@pytest.mark.parametrize(("m", "mu"), [(100, 1.0), (400, 0.5)])
def test_fdp_rejection_probability_exact(m: int, mu: float) -> None:
    # Thresholded Gaussian canaries (output 1{mu S + Z > mu/2}: post-processing of mu-GDP, so
    # mu-GDP), every canary guessed by its output: each guess is right with probability Phi(mu/2)
    # independently, v ~ Binomial(m, Phi(mu/2)), and P[reject the true mu] is an exact sum.  It is
    # far below alpha (1e-9 at m = 100, mu = 1): guessing every canary is a weak use of this test,
    # whose power comes from few, confident guesses.
    v = np.arange(m + 1)
    rejected = np.array([fdp_rejects(m, m, int(x), mu, ALPHA) for x in v])
    assert rejected[-1] and not rejected[0]
    assert float(stats.binom.pmf(v, m, special.ndtr(mu / 2))[rejected].sum()) <= ALPHA


def _gaussian_game_counts(n_runs: int, m: int, mu: float, k: int, seed: int) -> np.ndarray:
    """Correct guesses in n_runs games: m canaries scored mu S + N(0, 1) (each score mu-GDP in
    its secret bit S), IN guessed for the k highest scores and OUT for the k lowest."""
    rng = np.random.default_rng(seed)
    out = np.empty(n_runs, dtype=np.int64)
    for run in range(n_runs):
        bits = rng.random(m) < 0.5
        order = np.argsort(-(mu * bits + rng.standard_normal(m)))
        out[run] = bits[order[:k]].sum() + (~bits[order[-k:]]).sum()
    return out


def test_rejection_rate_of_a_true_claim_by_simulation() -> None:
    # confident guesses (the k = 50 most extreme scores on each side of 1000) on mu = 1 canaries:
    # the claim "mu = 1" is true, so at most n alpha + 3 sqrt(n alpha (1 - alpha)) rejections in n
    # runs; the false claim "mu = 0.5" is rejected in most runs (the test has power here)
    n, m, k = 1000, 1000, 50
    v = _gaussian_game_counts(n, m, 1.0, k, seed=21)
    rejected = sum(fdp_rejects(m, 2 * k, int(x), 1.0, ALPHA) for x in v)
    assert rejected <= n * ALPHA + 3.0 * math.sqrt(n * ALPHA * (1 - ALPHA))
    assert sum(fdp_rejects(m, 2 * k, int(x), 0.5, ALPHA) for x in v[:100]) > 50


@pytest.mark.parametrize(("m", "c_guess", "c"), [(1000, 300, 260), (500, 100, 90)])
def test_monotonicity(m: int, c_guess: int, c: int) -> None:
    # the margin falls as mu grows (a larger mu is a weaker claim)
    mus = np.linspace(0.0, 6.0, 61)
    margin = [fdp_test_statistic(m, c_guess, c, float(mu), ALPHA) for mu in mus]
    assert np.all(np.diff(margin) <= 1e-15)
    # the bound grows with alpha and with the number of correct guesses, falls with delta
    b_alpha = [fdp_mu_lower_bound(m, c_guess, c, a) for a in (0.01, 0.05, 0.2)]
    assert b_alpha == sorted(b_alpha) and b_alpha[0] > 0.0
    b_c = [fdp_mu_lower_bound(m, c_guess, x, ALPHA) for x in range(c - 10, c_guess + 1, 5)]
    assert b_c == sorted(b_c)
    b_delta = [fdp_epsilon_lower_bound(m, c_guess, c, d, ALPHA) for d in (1e-8, 1e-5, 1e-2)]
    assert b_delta == sorted(b_delta, reverse=True)


def test_search_starts_where_it_is_told() -> None:
    m, c_guess, c = 1000, 300, 260
    best = fdp_mu_lower_bound(m, c_guess, c, ALPHA)
    for lo in (0.0, 0.5 * best, 0.999 * best):
        assert fdp_search(m, c_guess, c, ALPHA, lo) == pytest.approx(best, rel=1e-9)
    for lo in (1.001 * best, 3.0 * best):
        assert fdp_search(m, c_guess, c, ALPHA, lo) == lo
    assert fdp_search(m, c_guess, 0, ALPHA, 0.4) == 0.4  # nothing right: no search


def test_family_note_and_delta_check() -> None:
    assert "Gaussian" in FDP_FAMILY_NOTE and "not a family-free" in FDP_FAMILY_NOTE
    check_fdp_delta(1e-5)  # accepted
    with pytest.raises(ValueError, match="delta=0.0"):
        check_fdp_delta(0.0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fdp_test_statistic(100, 10, 5, -1.0, ALPHA), ValueError, "mu.*-1.0"),
        (lambda: fdp_test_statistic(100, 10, 5, math.nan, ALPHA), ValueError, "mu.*nan"),
        (lambda: fdp_rejects(100, 10, 5, math.inf, ALPHA), ValueError, "mu.*inf"),
        (lambda: fdp_rejects(100, 10, 5, 1.0, 0.0), ValueError, "alpha.*0.0"),
        (lambda: fdp_rejects(100, 10, 5, 1.0, 1.0), ValueError, "alpha.*1.0"),
        (lambda: fdp_rejects(100, 101, 5, 1.0), ValueError, r"r \(number of guesses, 101\)"),
        (lambda: fdp_rejects(100, 10, 11, 1.0), ValueError, r"v \(correct guesses, 11\)"),
        (lambda: fdp_mu_lower_bound(0, 0, 0), ValueError, "m must be >= 1, got 0"),
        (lambda: fdp_mu_lower_bound(100, 10, -1), ValueError, "v must be >= 0, got -1"),
        (lambda: fdp_mu_lower_bound(100, 10, 2.5), TypeError, "2.5"),
        (lambda: fdp_mu_lower_bound(100, 10, 5, "0.05"), TypeError, "alpha"),
        (lambda: fdp_epsilon_lower_bound(100, 10, 10, 0.0), ValueError, "delta=0.0"),
        (lambda: fdp_epsilon_lower_bound(100, 10, 10, -1e-5), ValueError, "delta.*-1e-05"),
        (lambda: fdp_epsilon_lower_bound(100, 10, 10, 1.0), ValueError, "delta.*1.0"),
    ],
)
def test_bad_input_names_the_value(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
