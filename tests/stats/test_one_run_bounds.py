"""Tests of dpaudit_torch/stats/one_run_bounds.py: the canary game's guess counts, the best
bound over candidate guesses and the ceiling of an audit (docs/design.md section 6).

Checked against brute force (counts from a direct sort, the ROC hull against every threshold, the
best bound against the maximum of the individual bounds, the ceiling against the maximum over
every r), against closed forms (the Steinke ceiling at delta = 0) and against the reference
values in the docs (the ceilings; jax_privacy's regression case reproduced from the game's ROC
hull and the best bound at alpha divided by the hull size).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit_torch.stats.fdp import fdp_epsilon_lower_bound, mu_to_eps
from dpaudit_torch.stats.one_run import _split_counts
from dpaudit_torch.stats.one_run_bounds import (
    CanaryGame,
    all_right_bound,
    best_bound,
    bound_for,
    ceiling,
)
from dpaudit_torch.stats.steinke import steinke_epsilon_lower_bound

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 0.05
DELTA = 1e-5


# ------------------------------------------------------------------------------------------------
# ceilings
# ------------------------------------------------------------------------------------------------
def test_ceilings() -> None:
    # Steinke, delta = 0: all r right gives p = q^r, so eps_max = -ln(alpha^(-1/r) - 1)
    closed = -math.log(ALPHA ** (-1 / 1000) - 1)
    assert closed == pytest.approx(5.81, abs=5e-3)
    assert ceiling(10**6, ALPHA, 0.0, "steinke", r=1000) == pytest.approx(closed, rel=1e-9)
    assert ceiling(5000, ALPHA, 1e-5, "steinke") == pytest.approx(7.28, abs=5e-3)
    assert ceiling(5000, ALPHA, 1e-5, "fdp") == pytest.approx(15.0, abs=0.05)
    # "Steinke at delta 1e-5 never certifies more than about 8.2 whatever m" (peak near m = 3e4)
    peaks = [ceiling(m, ALPHA, 1e-5, "steinke") for m in (10**4, 3 * 10**4, 10**5)]
    assert max(peaks) == pytest.approx(8.2, abs=0.05)
    # with r given, the ceiling is the all-right bound
    assert ceiling(1000, ALPHA, 1e-5, "fdp", r=300) == pytest.approx(
        fdp_epsilon_lower_bound(1000, 300, 300, 1e-5, ALPHA), rel=1e-12)


@pytest.mark.parametrize("m", [1, 4, 5, 60, 500, 10_000])
def test_steinke_ceiling_at_delta_zero_is_the_closed_form(m: int) -> None:
    # all r right at delta = 0: p = q^r < alpha iff eps < -ln(alpha^(-1/r) - 1), which grows
    # with r, so the ceiling over r = 1..m is the closed form at r = m (0 while it is negative:
    # 2^-r >= alpha for r <= 4)
    closed = max(0.0, -math.log(ALPHA ** (-1.0 / m) - 1.0))
    assert ceiling(m, ALPHA, 0.0) == pytest.approx(closed, rel=1e-9, abs=1e-12)
    assert (closed == 0.0) == (m <= 4)


@pytest.mark.parametrize(("method", "m", "delta"), [("steinke", 400, 1e-3), ("steinke", 300, 1e-5),
                                                    ("fdp", 150, 1e-3)])
def test_ceiling_is_the_best_all_right_bound(method: str, m: int, delta: float) -> None:
    # the coarse-to-fine search over r (from a geometric grid inwards) against every r = 1..m,
    # each bound from the public functions
    one = steinke_epsilon_lower_bound if method == "steinke" else fdp_epsilon_lower_bound
    brute = [one(m, r, r, delta, ALPHA) for r in range(1, m + 1)]
    assert ceiling(m, ALPHA, delta, method) == pytest.approx(max(brute), rel=1e-12)
    for r in (1, m // 2, m):
        assert ceiling(m, ALPHA, delta, method, r=r) == pytest.approx(brute[r - 1], rel=1e-12)
        assert all_right_bound(method, m, r, delta, ALPHA) == pytest.approx(brute[r - 1],
                                                                            rel=1e-12)


def test_ceiling_grows_with_alpha_and_falls_with_delta() -> None:
    for method in ("steinke", "fdp"):
        by_alpha = [ceiling(1000, a, 1e-5, method) for a in (0.01, 0.05, 0.2)]
        assert by_alpha == sorted(by_alpha) and len(set(by_alpha)) == 3
        by_delta = [ceiling(1000, ALPHA, d, method) for d in (1e-8, 1e-5, 1e-2)]
        assert by_delta == sorted(by_delta, reverse=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"m": 0}, ValueError, "m must be >= 1, got 0"),
        ({"m": True}, TypeError, "m must be an integer"),
        ({"m": 10.5}, TypeError, "10.5"),
        ({"r": 0}, ValueError, "r must be >= 1, got 0"),
        ({"r": 11}, ValueError, r"r \(11\) must be <= m \(10\)"),
        ({"method": "exact"}, ValueError, "'exact'"),
        ({"method": "fdp", "delta": 0.0}, ValueError, "delta=0.0"),
        ({"alpha": 1.5}, ValueError, "alpha.*1.5"),
        ({"delta": -0.5}, ValueError, "delta.*-0.5"),
    ],
)
def test_ceiling_bad_input_names_the_value(kwargs: dict, error: type[Exception], match: str
                                           ) -> None:
    args = {"m": 10, "alpha": ALPHA, "delta": DELTA, "method": "steinke", "r": None} | kwargs
    with pytest.raises(error, match=match):
        ceiling(**args)


# ------------------------------------------------------------------------------------------------
# the canary game
# ------------------------------------------------------------------------------------------------
def test_counts_match_a_direct_sort() -> None:
    rng = np.random.default_rng(1)
    m = 60
    labels = rng.random(m) < 0.5
    scores = 1.5 * labels + rng.standard_normal(m)  # continuous: no ties
    game = CanaryGame(scores, labels, np.random.default_rng(0))
    assert game.m == m
    desc = labels[np.argsort(-scores)]
    for kp in range(m + 1):
        for kn in range(m + 1 - kp):
            r, v = game.counts(np.array([kp]), np.array([kn]))
            want = int(desc[:kp].sum()) + int((~desc[m - kn:]).sum())
            assert (int(r[0]), int(v[0])) == (kp + kn, want)
    # vectorised over candidates
    kp, kn = np.array([0, 5, 10, 30]), np.array([0, 5, 0, 30])
    r, v = game.counts(kp, kn)
    assert r.tolist() == (kp + kn).tolist()
    assert v.tolist() == [int(game.counts(np.array([a]), np.array([b]))[1][0])
                          for a, b in zip(kp, kn)]


def test_ties_are_broken_by_a_permutation_independent_of_the_labels() -> None:
    # 100 equal scores, the 50 IN canaries listed first: a positional tie-break would make the 50
    # top guesses all right.  With a random permutation the count among the top 50 is
    # hypergeometric: mean 25, variance 50 (1/2)(1/2)(50/99) = 6.31, so the mean over 200 seeds
    # lies within 4 standard errors (4 sqrt(6.31 / 200) = 0.71) of 25
    m, k, n = 100, 50, 200
    labels = np.arange(m) < 50
    tops = [int(CanaryGame(np.zeros(m), labels, np.random.default_rng(s)).top_correct[k])
            for s in range(n)]
    assert abs(np.mean(tops) - 25.0) <= 4.0 * math.sqrt(50 * 0.25 * 50 / 99 / n)
    # the same tie generator gives the same game
    a = CanaryGame(np.zeros(m), labels, np.random.default_rng(7))
    b = CanaryGame(np.zeros(m), labels, np.random.default_rng(7))
    np.testing.assert_array_equal(a.top_correct, b.top_correct)
    np.testing.assert_array_equal(a.bottom_correct, b.bottom_correct)


@pytest.mark.parametrize("ties", [False, True])
def test_roc_hull_against_every_threshold(ties: bool) -> None:
    rng = np.random.default_rng(2)
    m = 300
    labels = rng.random(m) < 0.5
    scores = 1.2 * labels + rng.standard_normal(m)
    if ties:
        scores = np.round(scores * 2.0)
    game = CanaryGame(scores, labels, np.random.default_rng(0))
    n_in, n_out = int(labels.sum()), int((~labels).sum())

    def fn_tn(r: int, v: int) -> tuple[int, int]:
        return n_in - v, n_out - (r - v)

    # one-sided guesses "IN iff score >= t" at every threshold t (and t = +inf: no guess)
    brute = set()
    for t in [*np.unique(scores).tolist(), math.inf]:
        guess = scores >= t
        brute.add(fn_tn(int(guess.sum()), int((guess & labels).sum())))
    r, v = game.roc_hull()
    hull = [fn_tn(int(a), int(b)) for a, b in zip(r, v)]
    assert set(hull) <= brute and len(hull) >= 2
    assert hull[0] == (0, 0) and hull[-1] == (n_in, n_out)  # every guess IN .. no guess
    # the upper hull: every threshold's point lies on or below each hull edge's line, and the
    # hull turns strictly at every vertex (no collinear points)
    h = np.array(hull, dtype=np.int64)
    d = np.diff(h, axis=0)
    for p in brute:
        w = np.array(p) - h[:-1]
        assert np.all(d[:, 0] * w[:, 1] - d[:, 1] * w[:, 0] <= 0)
    assert np.all(d[:-1, 0] * d[1:, 1] - d[:-1, 1] * d[1:, 0] < 0)


def test_subset_is_the_game_on_those_canaries() -> None:
    rng = np.random.default_rng(3)
    labels = rng.random(40) < 0.5
    scores = np.round(rng.standard_normal(40))
    game = CanaryGame(scores, labels, np.random.default_rng(0))
    idx = rng.permutation(40)[:25]
    sub = game.subset(idx, np.random.default_rng(5))
    ref = CanaryGame(scores[idx], labels[idx], np.random.default_rng(5))
    assert sub.m == 25
    np.testing.assert_array_equal(sub.top_correct, ref.top_correct)
    np.testing.assert_array_equal(sub.bottom_correct, ref.bottom_correct)


# ------------------------------------------------------------------------------------------------
# bounds over candidates
# ------------------------------------------------------------------------------------------------
def test_pruned_search_equals_brute_force() -> None:
    # the best-over-candidates search skips candidates that cannot beat the best so far; it must
    # return exactly the maximum of the individual bounds
    rng = np.random.default_rng(3)
    for m, mu in ((80, 2.5), (150, 0.7)):
        lab = rng.random(m) < 0.5
        game = CanaryGame(mu * lab + rng.standard_normal(m), lab, np.random.default_rng(0))
        kp, kn = _split_counts(np.arange(1, m + 1), "two_sided")
        r, v = game.counts(kp, kn)
        for method in ("steinke", "fdp"):
            best, j, _ = best_bound(method, m, r, v, ALPHA, DELTA)
            brute = [bound_for(method, m, int(a), int(b), DELTA, ALPHA) for a, b in zip(r, v)]
            assert best == pytest.approx(max(brute), rel=1e-9)
            assert brute[j] == pytest.approx(best, rel=1e-9)


def test_bound_for_is_the_public_bound() -> None:
    for m, r, v in ((1000, 100, 75), (500, 200, 150), (50, 10, 0)):
        assert bound_for("steinke", m, r, v, DELTA, ALPHA) == \
            steinke_epsilon_lower_bound(m, r, v, DELTA, ALPHA)
        assert bound_for("fdp", m, r, v, DELTA, ALPHA) == \
            fdp_epsilon_lower_bound(m, r, v, DELTA, ALPHA)


def test_best_bound_without_a_correct_guess_and_its_mu() -> None:
    r, v = np.array([10, 20, 50]), np.zeros(3, dtype=np.int64)
    assert best_bound("steinke", 100, r, v, ALPHA, DELTA) == (0.0, -1, None)
    assert best_bound("fdp", 100, r, v, ALPHA, DELTA) == (0.0, -1, 0.0)
    r, v = np.array([10, 20, 50]), np.array([10, 19, 40])
    bound, j, mu = best_bound("fdp", 100, r, v, ALPHA, DELTA)
    assert mu is not None and mu > 0.0 and bound == mu_to_eps(mu, DELTA)
    assert bound == pytest.approx(fdp_epsilon_lower_bound(100, int(r[j]), int(v[j]), DELTA,
                                                          ALPHA), rel=1e-9)


def _deterministic_normal(mu: float, n: int) -> np.ndarray:
    """n scores at the normal quantiles (i + 1/2) / n, shifted by mu (jax_privacy's test)."""
    return stats.norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


@pytest.mark.parametrize(("mu", "steinke", "fdp"), [(1, 1.13346, 2.164749),
                                                    (2, 2.311945, 4.7218075),
                                                    (4, 4.395568, 9.133752)])
def test_jax_privacy_values_from_the_roc_hull(mu: int, steinke: float, fdp: float) -> None:
    # docs/design.md section 6: 10,000 IN scores at the normal quantiles of N(mu, 1), 10,000 OUT
    # at those of N(0, 1), delta 1e-6, alpha 0.05 divided by the number of ROC-hull thresholds
    n = 10_000
    scores = np.concatenate([_deterministic_normal(mu, n), _deterministic_normal(0.0, n)])
    game = CanaryGame(scores, np.arange(2 * n) < n, np.random.default_rng(0))
    r, v = game.roc_hull()
    for method, want in (("steinke", steinke), ("fdp", fdp)):
        got, _, _ = best_bound(method, 2 * n, r, v, ALPHA / r.size, 1e-6)
        assert got == pytest.approx(want, rel=4e-7)


@pytest.mark.parametrize("method", ["steinke", "fdp"])
@pytest.mark.parametrize("guesses", ["one_sided", "two_sided"])
def test_every_guess_right_gives_the_ceiling(method: str, guesses: str) -> None:
    """The reported ceiling is what the audit as configured reaches: scores that separate IN
    from OUT perfectly give a bound equal to the ceiling, for every strategy (one-sided guesses
    can be right only for the IN canaries, so candidates beyond n_in do not count)."""
    from dpaudit_torch.stats.one_run import Bonferroni, FixedK, OneRunAudit, RandomSplit

    rng = np.random.default_rng(12)
    m = 1000
    lab = rng.random(m) < 0.5
    scores = np.where(lab, 10.0 + rng.random(m), rng.random(m))
    audit = OneRunAudit.from_labels(scores, lab)
    n_in = int(lab.sum())
    for strategy in (None, FixedK(100), FixedK(n_in + 50, 0), RandomSplit(),
                     Bonferroni([10, 100, 900]), Bonferroni("all")):
        res = audit.epsilon_lower_bound(1e-5, method=method, guesses=guesses, strategy=strategy)
        assert res.bound == pytest.approx(res.ceiling, rel=1e-9, abs=1e-12), strategy
    # the ceiling never counts guesses that cannot be right: one-sided, k+ above n_in
    res = audit.epsilon_lower_bound(1e-5, method=method, guesses="one_sided",
                                    strategy=FixedK(n_in + 50))
    assert res.v == n_in and res.r == n_in + 50
