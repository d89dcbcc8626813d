"""Tests of dpaudit_torch/stats/steinke.py: the one-run p-value and bound of Steinke et al.

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, Theorem 3.1
with the delta term of Proposition 5.2 (docs/design.md section 6): with q = e^eps / (1 + e^eps) and
B ~ Binomial(r, q),

    p = min(1, P[B >= v] + 2 m delta max_{i=1..v} (1/i) P[v - i <= B < v]).

Every number asserted here is checked against the docs or an independent computation (a direct
scipy sum, an exact sum in Python integers, a closed form), never against the module itself:
reference values, closed forms at delta = 0, monotonicity, exact and simulated rejection rates,
the search's starting point, and argument checks.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpaudit_torch.stats.steinke import (
    steinke_epsilon_lower_bound,
    steinke_p_value,
    steinke_search,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 0.05


# ------------------------------------------------------------------------------------------------
# reference values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("m", "r", "v", "delta", "expected"),
    [(1000, 100, 75, 1e-4, 0.673), (100_000, 1510, 1439, 1e-5, 2.675)],
)
def test_steinke_reference_values(m: int, r: int, v: int, delta: float, expected: float) -> None:
    # The formula gives 0.67298 and 2.67585 (the direct O(v) sum below agrees to 1e-10); the
    # published numbers are these to 3 decimals (the second one truncated), hence |diff| < 1e-3.
    eps = steinke_epsilon_lower_bound(m, r, v, delta, ALPHA)
    assert abs(eps - expected) < 1e-3
    # the bound is where the p-value crosses alpha
    assert steinke_p_value(m, r, v, eps, delta) == pytest.approx(ALPHA, rel=1e-6)
    assert steinke_p_value(m, r, v, eps * 0.99, delta) < ALPHA


def _naive_p(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Steinke et al.'s formula written directly: an O(v) sum of binomial pmfs."""
    q = special.expit(eps)
    beta = stats.binom.sf(v - 1, r, q)
    i = np.arange(1, v + 1)
    window = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v - i <= B < v]
    return min(1.0, beta + 2 * m * delta * float(np.max(window / i, initial=0.0)))


def test_p_value_matches_direct_sum() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 3000))
        r = int(rng.integers(0, m + 1))
        v = int(rng.integers(0, r + 1))
        eps = float(rng.choice([0.0, rng.uniform(0, 6)]))
        delta = float(rng.choice([0.0, 1e-6, 1e-4, 1e-2]))
        assert steinke_p_value(m, r, v, eps, delta) == pytest.approx(
            _naive_p(m, r, v, eps, delta), rel=1e-9, abs=1e-300
        )


def test_p_value_stable_at_scale() -> None:
    # m = 1e7, r = 1e6: compare with the full O(v) computation done in log space
    m, r, v, delta = 10**7, 10**6, 560_000, 1e-6
    for eps in (0.1, 0.24, 0.3, 2.0):
        q = special.expit(eps)
        j = np.arange(0, v)
        lp = stats.binom.logpmf(j, r, q)
        mx = lp.max()
        tail = np.cumsum(np.exp(lp - mx)[::-1])[::-1]
        term = math.exp(mx) * float(np.max(tail / (v - j)))
        expected = min(1.0, stats.binom.sf(v - 1, r, q) + 2 * m * delta * term)
        got = steinke_p_value(m, r, v, eps, delta)
        assert math.isfinite(got) and 0.0 <= got <= 1.0
        assert got == pytest.approx(expected, rel=1e-8)
    lb = steinke_epsilon_lower_bound(m, r, v, delta)
    assert 0.1 < lb < 0.3
    assert steinke_p_value(m, r, v, lb, delta) == pytest.approx(ALPHA, rel=1e-6)


def test_p_value_vectorised() -> None:
    r = np.array([[100], [200]])
    eps = np.array([0.0, 0.5, 1.0])
    p = steinke_p_value(1000, r, 80, eps, 1e-4)
    assert p.shape == (2, 3)
    for a in range(2):
        for b in range(3):
            assert p[a, b] == steinke_p_value(1000, int(r[a, 0]), 80, float(eps[b]), 1e-4)
    assert np.all(np.diff(p, axis=1) > 0)  # p grows with the claimed epsilon
    assert isinstance(steinke_p_value(10, 5, 5, 1.0, 0.0), float)


@pytest.mark.parametrize(("r", "eps", "delta"), [(200, 1.0, 0.0), (200, 1.0, 1e-5),
                                                  (1000, 3.0, 0.0), (50, 0.5, 1e-3)])
def test_steinke_rejection_probability_exact(r: int, eps: float, delta: float) -> None:
    # r guesses on eps-randomized-response canaries, each right with probability q = e^eps/(1+e^eps)
    # independently: v ~ Binomial(r, q) exactly.  P[bound > eps] = P[p(eps; v) < alpha] summed over
    # the binomial pmf -- an exact probability, so it is compared with alpha directly.
    m = r
    q = special.expit(eps)
    v = np.arange(r + 1)
    p = steinke_p_value(m, r, v, eps, delta)
    reject_prob = float(stats.binom.pmf(v, r, q)[p < ALPHA].sum())
    assert reject_prob <= ALPHA
    if delta == 0.0 and r >= 200:  # sharp: only binomial discreteness separates it from alpha
        assert reject_prob > 0.6 * ALPHA


@pytest.mark.parametrize(("m", "r", "v", "delta", "doc"),
                         [(1000, 100, 75, 1e-4, 0.67298), (100_000, 1510, 1439, 1e-5, 2.67585)])
def test_reference_bounds_are_the_roots_of_the_direct_formula(m: int, r: int, v: int,
                                                              delta: float, doc: float) -> None:
    # docs/design.md section 6: "the formula gives 0.67298 and 2.67585"; here the root of the
    # direct O(v) scipy sum, found by scipy's own root finder, against the module's search
    root = optimize.brentq(lambda e: _naive_p(m, r, v, e, delta) - ALPHA, 0.0, 10.0,
                           xtol=1e-14, rtol=1e-14)
    assert root == pytest.approx(doc, abs=5e-6)
    assert steinke_epsilon_lower_bound(m, r, v, delta, ALPHA) == pytest.approx(root, rel=1e-9)


def _exact_p(m: int, r: int, v: int, eps: Fraction, delta: Fraction) -> float:
    """The formula in exact rational arithmetic (q rational: eps is given through e^eps)."""
    q = eps / (1 + eps)  # here ``eps`` holds e^eps
    pmf = [math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(r + 1)]
    beta = sum(pmf[v:], Fraction(0))
    window = max((sum(pmf[v - i:v], Fraction(0)) / i for i in range(1, v + 1)),
                 default=Fraction(0))
    return float(min(Fraction(1), beta + 2 * m * delta * window))


def test_p_value_matches_an_exact_rational_sum() -> None:
    # every game with m <= 9 canaries, at e^eps in {1, 3/2, 4, 20} and four deltas
    for m in range(1, 10):
        for r in range(m + 1):
            for v in range(r + 1):
                for e_eps in (Fraction(1), Fraction(3, 2), Fraction(4), Fraction(20)):
                    for delta in (Fraction(0), Fraction(1, 10**6), Fraction(1, 100),
                                  Fraction(1, 10)):
                        want = _exact_p(m, r, v, e_eps, delta)
                        got = steinke_p_value(m, r, v, math.log(e_eps), float(delta))
                        assert got == pytest.approx(want, rel=1e-12, abs=1e-300), (m, r, v)


@pytest.mark.parametrize("r", [1, 10, 100, 1000])
def test_delta_zero_closed_forms(r: int) -> None:
    # all r right: p = q^r, and the bound is -ln(alpha^(-1/r) - 1) (docs/design.md, "Ceilings")
    for eps in (0.0, 0.3, 2.0, 7.0):
        q = math.exp(eps) / (1.0 + math.exp(eps))
        assert steinke_p_value(r, r, r, eps, 0.0) == pytest.approx(q**r, rel=1e-12)
    closed = -math.log(ALPHA ** (-1.0 / r) - 1.0)
    assert steinke_epsilon_lower_bound(r, r, r, 0.0, ALPHA) == pytest.approx(
        max(closed, 0.0), rel=1e-10, abs=1e-12)
    if r == 1000:
        assert closed == pytest.approx(5.81, abs=5e-3)  # the value the docs quote
    # eps = 0: B ~ Binomial(r, 1/2), so p is a sum of binomial coefficients over 2^r
    v = (3 * r) // 4
    tail = Fraction(sum(math.comb(r, j) for j in range(v, r + 1)), 2**r)
    assert steinke_p_value(r, r, v, 0.0, 0.0) == pytest.approx(float(tail), rel=1e-12)


def test_games_without_correct_guesses() -> None:
    # no guess, or no correct guess: nothing is surprising, nothing is certified
    for m, r, v, delta in ((10, 0, 0, 0.0), (10, 0, 0, 1e-3), (500, 200, 0, 1e-5)):
        assert steinke_p_value(m, r, v, 3.0, delta) == 1.0
        assert steinke_epsilon_lower_bound(m, r, v, delta, ALPHA) == 0.0
    # a p-value never exceeds 1, even when 2 m delta is large
    assert steinke_p_value(10_000, 50, 40, 0.5, 0.5) == 1.0
    # 30 of 30 right against eps = 0 (a fair coin per guess): p = 2^-30
    assert steinke_p_value(100, 30, 30, 0.0, 0.0) == pytest.approx(0.5**30, rel=1e-12)


GAMES = [(1000, 100, 75), (5000, 400, 330), (200, 200, 150), (10**5, 1510, 1439), (50, 20, 20)]


@pytest.mark.parametrize(("m", "r", "v"), GAMES)
def test_monotonicity(m: int, r: int, v: int) -> None:
    eps = np.linspace(0.0, 8.0, 81)
    # p grows with the claimed eps.  With c = 2 m delta, dp/dq is r times
    # (1 - c/i*) pmf_{r-1}(v-1) + (c/i*) pmf_{r-1}(v-i*-1) (i* the maximising window), both
    # coefficients >= 0 when c <= 1: the deltas below keep 2 m delta <= 1
    for delta in (0.0, 0.1 / m, 0.5 / m):
        p = steinke_p_value(m, r, v, eps, delta)
        assert np.all(np.diff(p) >= -1e-15) and np.all((0.0 <= p) & (p <= 1.0))
    # p grows with delta and with m (the delta term is 2 m delta times a non-negative window)
    deltas = np.array([0.0, 1e-7, 1e-6, 1e-5, 1e-4])
    p_d = np.array([steinke_p_value(m, r, v, 1.0, d) for d in deltas])
    assert np.all(np.diff(p_d) >= 0.0)
    p_m = steinke_p_value(np.array([m, 2 * m, 10 * m]), r, v, 1.0, 1e-6)
    assert np.all(np.diff(p_m) >= 0.0)
    # the bound: larger for a larger alpha, smaller for a larger delta or more canaries
    b_alpha = [steinke_epsilon_lower_bound(m, r, v, 1e-6, a) for a in (0.01, 0.05, 0.2)]
    assert b_alpha == sorted(b_alpha)
    b_delta = [steinke_epsilon_lower_bound(m, r, v, d, ALPHA) for d in deltas]
    assert b_delta == sorted(b_delta, reverse=True)
    b_m = [steinke_epsilon_lower_bound(mm, r, v, 1e-6, ALPHA) for mm in (m, 2 * m, 10 * m)]
    assert b_m == sorted(b_m, reverse=True)
    # at delta = 0, one more correct guess (same r) can only raise the bound
    if v < r:
        assert steinke_epsilon_lower_bound(m, r, v + 1, 0.0, ALPHA) >= \
            steinke_epsilon_lower_bound(m, r, v, 0.0, ALPHA)
        p_v = steinke_p_value(m, r, np.arange(v, r + 1), 1.0, 0.0)
        assert np.all(np.diff(p_v) <= 0.0)


def test_search_starts_where_it_is_told() -> None:
    m, r, v, delta = 1000, 100, 75, 1e-4
    best = steinke_epsilon_lower_bound(m, r, v, delta, ALPHA)
    # from below: the same bound; from above (already beaten): the starting point itself
    for lo in (0.0, 0.3, best * 0.999):
        assert steinke_search(m, r, v, delta, ALPHA, lo) == pytest.approx(best, rel=1e-9)
    for lo in (best * 1.001, 2.0, 50.0):
        assert steinke_search(m, r, v, delta, ALPHA, lo) == lo
    assert steinke_search(m, r, 0, delta, ALPHA, 0.7) == 0.7  # nothing right: no search


def _rr_correct_counts(n_runs: int, m: int, eps: float, delta: float, seed: int) -> np.ndarray:
    """Correct guesses in n_runs games of m canaries, every canary guessed by its output.

    Each canary's output is its secret bit with probability delta (flagged as revealed), and
    otherwise the bit through eps-randomized response (flipped with probability 1 / (1 + e^eps)):
    an (eps, delta)-DP release of each bit, so the claim (eps, delta) is true.
    """
    rng = np.random.default_rng(seed)
    bits = rng.random((n_runs, m)) < 0.5
    revealed = rng.random((n_runs, m)) < delta
    flipped = rng.random((n_runs, m)) < 1.0 / (1.0 + math.exp(eps))
    out = np.where(revealed, bits, bits ^ flipped)
    return (out == bits).sum(axis=1)


@pytest.mark.parametrize(("m", "eps", "delta"), [(200, 1.0, 0.0), (200, 1.0, 2e-3),
                                                  (400, 0.5, 1e-3)])
def test_rejection_rate_by_simulation(m: int, eps: float, delta: float) -> None:
    # n simulated runs of a true (eps, delta) claim: a valid level-alpha test rejects at most
    # n alpha + 3 sqrt(n alpha (1 - alpha)) times (binomial standard error)
    n = 2000
    v = _rr_correct_counts(n, m, eps, delta, seed=11)
    p = steinke_p_value(m, m, v, eps, delta)
    rejections = int((p < ALPHA).sum())
    assert rejections <= n * ALPHA + 3.0 * math.sqrt(n * ALPHA * (1 - ALPHA))
    # the bound is where the p-value crosses alpha: rejecting eps <=> bound > eps
    for x in np.unique(v).tolist():
        assert (steinke_p_value(m, m, x, eps, delta) < ALPHA) == \
            (steinke_epsilon_lower_bound(m, m, x, delta, ALPHA) > eps)
    if delta == 0.0:
        # sharp at delta = 0: the exact rejection probability (v ~ Binomial(m, q)) is 0.048, and
        # the simulated count agrees with it within 3 standard errors both ways
        q = special.expit(eps)
        k = np.arange(m + 1)
        pi = float(stats.binom.pmf(k, m, q)[steinke_p_value(m, m, k, eps, 0.0) < ALPHA].sum())
        assert pi == pytest.approx(0.048, abs=1e-3)
        assert abs(rejections - n * pi) <= 3.0 * math.sqrt(n * pi * (1 - pi))


def test_counts_given_as_floats_and_numpy_integers() -> None:
    want = steinke_epsilon_lower_bound(100_000, 1510, 1439, 1e-5)
    assert steinke_epsilon_lower_bound(1e5, 1510.0, np.int64(1439), 1e-5) == want
    assert steinke_p_value(np.int32(1000), 100, 75, 0.5, 1e-4) == \
        steinke_p_value(1000, 100, 75, 0.5, 1e-4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: steinke_p_value(10, 11, 5, 1.0, 0.0), ValueError, r"r \(number of guesses, 11\)"),
        (lambda: steinke_p_value(10, 5, 6, 1.0, 0.0), ValueError, r"v \(correct guesses, 6\)"),
        (lambda: steinke_p_value(0, 0, 0, 1.0, 0.0), ValueError, "m must be >= 1, got 0"),
        (lambda: steinke_p_value(10, -1, 0, 1.0, 0.0), ValueError, "r must be >= 0, got -1"),
        (lambda: steinke_p_value(True, 1, 1, 1.0, 0.0), TypeError, "m must be an integer"),
        (lambda: steinke_p_value(10, 2.5, 1, 1.0, 0.0), TypeError, "2.5"),
        (lambda: steinke_p_value(10, 5, 5, -1.0, 0.0), ValueError, "-1.0"),
        (lambda: steinke_p_value(10, 5, 5, math.nan, 0.0), ValueError, "nan"),
        (lambda: steinke_p_value(10, 5, 5, math.inf, 0.0), ValueError, "epsilon.*inf"),
        (lambda: steinke_p_value(10, 5, 5, [0.5, -2.0], 0.0), ValueError, "-2.0"),
        (lambda: steinke_p_value(10, 5, 5, 1.0, 1.0), ValueError, "delta.*1.0"),
        (lambda: steinke_p_value(10, 5, 5, 1.0, -1e-9), ValueError, "delta.*-1e-09"),
        (lambda: steinke_p_value(10, 5, 5, 1.0, "0"), TypeError, "delta"),
        (lambda: steinke_epsilon_lower_bound(100, 10, 11, 1e-5), ValueError, "11"),
        (lambda: steinke_epsilon_lower_bound(100, 10, 5, 1e-5, 0.0), ValueError, "alpha.*0.0"),
        (lambda: steinke_epsilon_lower_bound(100, 10, 5, 1e-5, 1.5), ValueError, "alpha.*1.5"),
        (lambda: steinke_epsilon_lower_bound(100, 10, 5, math.nan), ValueError, "delta.*nan"),
    ],
)
def test_bad_input_names_the_value(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
