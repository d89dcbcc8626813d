"""One-run privacy audit: epsilon lower bounds from ONE training run (ALGORITHMS.md section 6).

The game.  m canaries each carry a secret bit S_i, uniform in {IN, OUT} and drawn independently of
everything else; IN canaries are trained on.  After training every canary has a score (higher =
"looks more IN").  The auditor guesses IN for the k+ highest scores, OUT for the k- lowest and
abstains on the rest: r = k+ + k- guesses, v of them correct.  An (eps, delta)-DP training run
cannot make v large, which turns (r, v) into a lower bound on eps.

Two tests turn (m, r, v) into a bound:

* ``method="steinke"`` -- Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
  NeurIPS 2023 (arXiv 2305.08846), Theorem 3.1 / Proposition 5.2.  With q = e^eps / (1 + e^eps),
  B ~ Binomial(r, q):  p = min(1, P[B >= v] + 2 m delta max_{i=1..v} (1/i) P[v-i <= B < v]).
  The bound is the largest eps whose p-value is below alpha.  Family-free: it holds for every
  (eps, delta)-DP mechanism.
* ``method="fdp"`` -- Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run",
  ICML 2025 (arXiv 2410.22235), the recursion of their Algorithm (``audit_rh_with_cap``) for the
  Gaussian trade-off curves f_mu(x) = Phi(Phi^-1(1-x) - mu).  It rejects "the run is mu-GDP" and
  reports eps(delta) of the largest rejected mu.  It is a test against the Gaussian (mu-GDP) curve
  family, NOT a family-free bound: a mechanism that is (eps, delta)-DP but not Gaussian-shaped (e.g.
  randomized response) can be reported above its eps.  Every result says so.

Choosing the number of guesses after looking at which guesses were right is selection on the
secret, so the guesses are chosen by a *strategy*, each valid at level alpha:

* :class:`FixedK` -- k+ and k- fixed before the audit;
* :class:`Bonferroni` -- the best of a candidate set fixed before the audit, each candidate tested
  at alpha / (number of candidates) (default; the default candidate set is the 1-2-5 sequence of
  guess counts, see :func:`default_candidates`);
* :class:`RandomSplit` -- a seeded random subset of the canaries chooses the guess fraction, the
  other canaries certify it (so m of the certificate is the held-out count).

The reference implementation compared with (not copied) is ``jax_privacy/auditing.py``
(google-deepmind/jax_privacy); ``Bonferroni(candidates="roc_hull")`` reproduces its guess semantics
(one-sided, thresholds on the ROC hull, alpha divided by the hull size).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import torch
from scipy import optimize, special

from .._validation import check_alpha, check_delta
from .thresholds import gaussian_epsilon

logger = logging.getLogger(__name__)

__all__ = [
    "FDP_FAMILY_NOTE",
    "FixedK",
    "Bonferroni",
    "RandomSplit",
    "OneRunResult",
    "OneRunAudit",
    "steinke_p_value",
    "steinke_epsilon_lower_bound",
    "fdp_test_statistic",
    "fdp_rejects",
    "fdp_mu_lower_bound",
    "fdp_epsilon_lower_bound",
    "ceiling",
    "default_candidates",
]

#: stated in every f-DP result
FDP_FAMILY_NOTE = "test against the Gaussian (mu-GDP) curve family, not a family-free bound"

_METHODS = ("steinke", "fdp")
_GUESSES = ("one_sided", "two_sided")
_EPS_CAP = 1.0e4  # bracket doubling never needs more (p -> 1 as eps grows whenever v <= r)
_MU_CAP = 1.0e4
_SQRT2 = math.sqrt(2.0)
try:  # CPython's C implementation of Wichura's AS241 (~1e-16 relative), without the wrapper
    from statistics import _normal_dist_inv_cdf as _inv_cdf_raw

    def _INV_CDF(p: float) -> float:
        return _inv_cdf_raw(p, 0.0, 1.0)
except ImportError:  # pragma: no cover - other interpreters
    _INV_CDF = NormalDist().inv_cdf


# ------------------------------------------------------------------------------------------------
# argument checks
# ------------------------------------------------------------------------------------------------
def _int(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)  # 1e5 written as a float is a count
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return v


def _check_counts(m: object, r: object, v: object) -> tuple[int, int, int]:
    m_ = _int("m", m, 1)
    r_ = _int("r", r, 0)
    v_ = _int("v", v, 0)
    if r_ > m_:
        raise ValueError(f"r (number of guesses, {r!r}) must be <= m (number of canaries, {m!r})")
    if v_ > r_:
        raise ValueError(f"v (correct guesses, {v!r}) must be <= r (number of guesses, {r!r})")
    return m_, r_, v_


def _check_method(method: object) -> str:
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    return str(method)


def _check_fdp_delta(delta: float) -> None:
    if delta <= 0.0:
        raise ValueError(
            f"method='fdp' needs delta > 0 (every mu-GDP mechanism with mu > 0 has eps(0) = inf), "
            f"got delta={delta!r}"
        )


# ------------------------------------------------------------------------------------------------
# Steinke, Nasr & Jagielski (2023)
# ------------------------------------------------------------------------------------------------
def _steinke_beta(r: int, v: int, eps: float) -> float:
    """P[Binomial(r, q) >= v], q = e^eps / (1 + e^eps), as P[Binomial(r, 1 - q) <= r - v].

    1 - q = expit(-eps) is exact for large eps, where 1 - expit(eps) would round to 0.
    """
    if v <= 0:
        return 1.0
    return float(special.bdtr(r - v, r, special.expit(-eps)))


def _steinke_window_term(r: int, v: int, eps: float) -> float:
    """max_{i=1..v} (1/i) P[v-i <= B < v] for B ~ Binomial(r, q), in log space, O(sd) work.

    Only pmf values within L = 15 sd + 50 of the mode (or of v-1 when v-1 is below the mode) are
    computed.  The binomial pmf is log-concave, so the log-pmf drops by at least ~L^2 / (2 sd^2)
    (> 100 nats) outside that window; a window average made of such terms cannot beat the average
    of any window that contains the mode (>= max pmf / v >= max pmf * e^-14 for v <= 10^6), and
    adding them to a window changes its sum by a relative 1e-40.  Windows starting below the
    computed range only add negligible mass while their length grows, so their average is smaller.
    Tested against the direct O(v) sum.
    """
    if v <= 0:
        return 0.0
    q = float(special.expit(eps))
    log_q = float(special.log_expit(eps))
    log_1mq = float(special.log_expit(-eps))
    mode = min(max(int(math.floor((r + 1) * q)), 0), r)
    sd = math.sqrt(r * q * (1.0 - q))
    L = int(math.ceil(15.0 * sd)) + 50
    top = v - 1
    if top <= mode:
        lo, hi = max(0, top - L), top
    else:
        lo, hi = max(0, mode - L), min(top, mode + L)
    j = np.arange(lo, hi + 1, dtype=np.float64)
    lp = (
        special.gammaln(r + 1.0)
        - special.gammaln(j + 1.0)
        - special.gammaln(r - j + 1.0)
        + j * log_q
        + (r - j) * log_1mq
    )
    mx = float(lp.max())
    w = np.exp(lp - mx)
    tail = np.cumsum(w[::-1])[::-1]  # tail[t] = sum_{j >= lo + t}^{hi} pmf / e^mx
    ratio = tail / (v - j)  # window [j, v-1] has i = v - j terms
    return math.exp(mx) * float(ratio.max())


def _steinke_p(m: int, r: int, v: int, eps: float, delta: float) -> float:
    beta = _steinke_beta(r, v, eps)
    if delta == 0.0 or v <= 0 or beta >= 1.0:
        return min(1.0, beta)
    return min(1.0, beta + 2.0 * m * delta * _steinke_window_term(r, v, eps))


def steinke_p_value(
    m: int | np.ndarray,
    r: int | np.ndarray,
    v: int | np.ndarray,
    epsilon: float | np.ndarray,
    delta: float,
) -> float | np.ndarray:
    """p-value of the claim "(epsilon, delta)-DP" after v correct out of r guesses on m canaries.

    Steinke, Nasr & Jagielski (NeurIPS 2023), Theorem 3.1 with the delta term of their
    Proposition 5.2 (ALGORITHMS.md section 6)::

        q = e^eps / (1 + e^eps),  B ~ Binomial(r, q)
        p = min(1, P[B >= v] + 2 m delta max_{i=1..v} (1/i) P[v - i <= B < v])

    ``m``, ``r``, ``v`` and ``epsilon`` broadcast against each other (numpy rules); scalars give a
    float.  Binomial tails come from scipy's incomplete beta (``bdtr``) and a log-space pmf window,
    so the cost per element is O(sqrt(r)) and the result is stable for m up to 1e7 and r up to
    1e6 (and beyond).
    """
    delta = check_delta(delta)
    arrs = np.broadcast_arrays(
        np.asarray(m), np.asarray(r), np.asarray(v), np.asarray(epsilon, dtype=np.float64)
    )
    out = np.empty(arrs[0].shape, dtype=np.float64)
    for idx in np.ndindex(out.shape):
        m_, r_, v_ = _check_counts(arrs[0][idx].item(), arrs[1][idx].item(), arrs[2][idx].item())
        e = float(arrs[3][idx])
        if not (e >= 0.0) or not math.isfinite(e):
            raise ValueError(f"epsilon must be finite and >= 0, got {e!r}")
        out[idx] = _steinke_p(m_, r_, v_, e, delta)
    return float(out) if out.ndim == 0 else out


def _steinke_search(m: int, r: int, v: int, delta: float, alpha: float, eps_lo: float) -> float:
    """Largest eps >= eps_lo with p(eps) < alpha; eps_lo itself if p(eps_lo) >= alpha."""
    if v <= 0:
        return eps_lo

    def objective(e: float) -> float:  # > 0 while the claim is rejected
        return alpha - _steinke_p(m, r, v, e, delta)

    if objective(eps_lo) <= 0.0:
        return eps_lo
    lo, hi = eps_lo, max(1.0, 2.0 * eps_lo)
    while objective(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_CAP:  # unreachable when v <= r; kept as a guard
            return math.inf
    return float(optimize.brentq(objective, lo, hi, xtol=1e-12, rtol=1e-12, maxiter=500))


def steinke_epsilon_lower_bound(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> float:
    """Largest eps whose Steinke p-value is below alpha (0.0 if none): a level-alpha lower bound.

    Bracket doubling from [0, 1] until p(eps_hi) >= alpha, then Brent's method (ALGORITHMS.md s.6).
    Reference values: (m, r, v, delta) = (1000, 100, 75, 1e-4) -> 0.673 and
    (1e5, 1510, 1439, 1e-5) -> 2.675 at alpha = 0.05.
    """
    m_, r_, v_ = _check_counts(m, r, v)
    return _steinke_search(m_, r_, v_, check_delta(delta), check_alpha(alpha), 0.0)


# ------------------------------------------------------------------------------------------------
# Mahloujifar, Melis & Chaudhuri (2025): Gaussian-family f-DP test
# ------------------------------------------------------------------------------------------------
def _fdp_margin(m: int, n_guess: int, n_correct: int, mu: float, alpha: float,
                early_exit: bool = False) -> float:
    """(r + h) - c'/m at the end of the recursion of ALGORITHMS.md s.6 (> 0 means: reject mu).

    r = alpha c / m, h = alpha (c' - c) / m; for i = c-1 .. 0: h_new = max(h, Finv(r)), stop if
    h_new == h, r = min(r + i / (c' - i) (h_new - h), 1), h = h_new, with Finv(x) =
    Phi(Phi^-1(x) - mu).  r and h never decrease, so with ``early_exit`` the loop returns as soon
    as the rejection is certain (the returned margin is then positive but not final).
    """
    c, cg = n_correct, n_guess
    tp = alpha * c / m
    fp = alpha * (cg - c) / m
    target = cg / m
    for i in range(c - 1, -1, -1):
        if tp >= 1.0:
            f = 1.0
        else:
            z = _INV_CDF(tp) - mu
            f = 0.5 * math.erfc(-z / _SQRT2)
        if f <= fp:
            break
        tp = tp + i / (cg - i) * (f - fp)
        if tp > 1.0:
            tp = 1.0
        fp = f
        if early_exit and tp + fp > target:
            break
    return tp + fp - target


def fdp_test_statistic(m: int, n_guess: int, n_correct: int, mu: float, alpha: float) -> float:
    """The margin (r + h) - c'/m of the f-DP recursion; the claim "mu-GDP" is rejected iff > 0."""
    m_, r_, v_ = _check_counts(m, n_guess, n_correct)
    if not (mu >= 0.0) or not math.isfinite(mu):
        raise ValueError(f"mu must be finite and >= 0, got {mu!r}")
    return _fdp_margin(m_, r_, v_, float(mu), check_alpha(alpha))


def fdp_rejects(m: int, n_guess: int, n_correct: int, mu: float, alpha: float = 0.05) -> bool:
    """True iff the one-run f-DP test (Mahloujifar et al. 2025) rejects "the run is mu-GDP"."""
    return fdp_test_statistic(m, n_guess, n_correct, mu, alpha) > 0.0


def _fdp_search(m: int, r: int, v: int, alpha: float, mu_lo: float) -> float:
    """Largest mu >= mu_lo the test rejects (mu_lo if it does not reject mu_lo)."""
    if v <= 0:
        return mu_lo

    def objective(mu: float) -> float:
        return _fdp_margin(m, r, v, mu, alpha)

    if _fdp_margin(m, r, v, mu_lo, alpha, early_exit=True) <= 0.0:
        return mu_lo
    lo, hi = mu_lo, max(1.0, 2.0 * mu_lo)
    while objective(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > _MU_CAP:
            return math.inf
    return float(optimize.brentq(objective, lo, hi, xtol=1e-12, rtol=1e-12, maxiter=500))


def fdp_mu_lower_bound(m: int, n_guess: int, n_correct: int, alpha: float = 0.05) -> float:
    """Largest mu whose mu-GDP claim the f-DP one-run test rejects at level alpha (0.0 if none).

    Rejection is monotone in mu (a larger mu is a weaker claim), so the rejected set is an
    interval [0, mu*); mu* is found by bracket doubling and Brent's method on the (continuous)
    margin of the recursion.
    """
    m_, r_, v_ = _check_counts(m, n_guess, n_correct)
    return _fdp_search(m_, r_, v_, check_alpha(alpha), 0.0)


def fdp_epsilon_lower_bound(m: int, n_guess: int, n_correct: int, delta: float,
                            alpha: float = 0.05) -> float:
    """eps(delta) of mu*-GDP, mu* = :func:`fdp_mu_lower_bound` (0.0 if nothing is rejected).

    A lower bound on eps only for mechanisms whose trade-off curve is Gaussian (the test is
    against the mu-GDP family, Mahloujifar et al. 2025), see :data:`FDP_FAMILY_NOTE`.
    """
    delta = check_delta(delta)
    _check_fdp_delta(delta)
    return _mu_to_eps(fdp_mu_lower_bound(m, n_guess, n_correct, alpha), delta)


def _mu_to_eps(mu: float, delta: float) -> float:
    if mu <= 0.0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    return gaussian_epsilon(delta, mu)


# ------------------------------------------------------------------------------------------------
# ceilings
# ------------------------------------------------------------------------------------------------
def _bound_for(method: str, m: int, r: int, v: int, delta: float, alpha: float) -> float:
    if method == "steinke":
        return _steinke_search(m, r, v, delta, alpha, 0.0)
    return _mu_to_eps(_fdp_search(m, r, v, alpha, 0.0), delta)


@functools.lru_cache(maxsize=4096)
def _all_right(method: str, m: int, r: int, delta: float, alpha: float) -> float:
    """Bound when all r guesses are right (cached: it depends on the game size only)."""
    return _bound_for(method, m, r, r, delta, alpha)


def ceiling(m: int, alpha: float, delta: float, method: str = "steinke",
            r: int | None = None) -> float:
    """The largest bound the audit can report: every one of r guesses right (v = r).

    With ``r=None`` the maximum over r = 1..m (coarse-to-fine search over r; the all-right bound is
    unimodal in r).  Closed form for Steinke at delta = 0: -ln(alpha^(-1/r) - 1) (r = 1000 -> 5.81
    at alpha 0.05).  At delta = 1e-5 and m = 5000: Steinke 7.28, f-DP about 15.0.
    """
    m_ = _int("m", m, 1)
    alpha = check_alpha(alpha)
    delta = check_delta(delta)
    method = _check_method(method)
    if method == "fdp":
        _check_fdp_delta(delta)
    if r is not None:
        r_ = _int("r", r, 1)
        if r_ > m_:
            raise ValueError(f"r ({r!r}) must be <= m ({m!r})")
        return _all_right(method, m_, r_, delta, alpha)

    def f(k: int) -> float:
        return _all_right(method, m_, k, delta, alpha)

    lo, hi = 1, m_
    while hi - lo > 64:
        grid = np.unique(np.round(np.geomspace(lo, hi, 33)).astype(np.int64))
        vals = [f(int(k)) for k in grid]
        b = int(np.argmax(vals))
        lo, hi = int(grid[max(b - 1, 0)]), int(grid[min(b + 1, grid.size - 1)])
    return max(f(k) for k in range(lo, hi + 1))


# ------------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FixedK:
    """Guess IN for the ``k_pos`` highest scores and OUT for the ``k_neg`` lowest, fixed in advance.

    ``k_neg=None`` means 0 for one-sided guesses and ``k_pos`` for two-sided guesses.
    """

    k_pos: int
    k_neg: int | None = None

    def __post_init__(self) -> None:
        _int("k_pos", self.k_pos, 0)
        if self.k_neg is not None:
            _int("k_neg", self.k_neg, 0)

    def describe(self, guesses: str) -> str:
        kp, kn = self.resolve(guesses)
        return f"FixedK(k_pos={kp}, k_neg={kn}) fixed in advance"

    def resolve(self, guesses: str) -> tuple[int, int]:
        kp = int(self.k_pos)
        if self.k_neg is None:
            kn = kp if guesses == "two_sided" else 0
        else:
            kn = int(self.k_neg)
        if guesses == "one_sided" and kn > 0:
            raise ValueError(f"guesses='one_sided' makes no OUT guesses, but k_neg={kn}")
        if kp + kn < 1:
            raise ValueError(f"FixedK needs at least one guess, got k_pos={kp}, k_neg={kn}")
        return kp, kn


@dataclasses.dataclass(frozen=True)
class Bonferroni:
    """Best of a candidate set stated before the audit, each tested at alpha / len(candidates).

    ``candidates``:

    * ``"grid"`` (default) -- guess counts r in the 1-2-5 sequence 10, 20, 50, 100, ... that are
      <= m, plus r = m (see :func:`default_candidates`); two-sided guesses split r as
      k+ = ceil(r/2), k- = floor(r/2);
    * ``"all"`` -- every r = 1..m (same split);
    * a sequence of ints (guess counts r, split as above) or of (k_pos, k_neg) pairs;
    * ``"roc_hull"`` -- jax_privacy compatibility (one-sided only): guess IN for scores >= t for
      every threshold t on the upper hull of the ROC staircase, alpha divided by the hull size.
      The hull (hence the correction) depends on the labels, so the Bonferroni argument does not
      cover it strictly; it is offered to reproduce jax_privacy's numbers and its coverage is
      checked by simulation only.
    """

    candidates: str | tuple[Any, ...] = "grid"

    def __post_init__(self) -> None:
        c = self.candidates
        if isinstance(c, str):
            if c not in ("grid", "all", "roc_hull"):
                raise ValueError(
                    f"Bonferroni candidates must be 'grid', 'all', 'roc_hull' or a sequence, "
                    f"got {c!r}"
                )
            return
        if not isinstance(c, Sequence) or len(c) == 0:
            raise ValueError(f"Bonferroni candidates must be a non-empty sequence, got {c!r}")
        object.__setattr__(self, "candidates", tuple(
            tuple(x) if isinstance(x, (tuple, list)) else x for x in c))
        for x in self.candidates:
            if isinstance(x, tuple):
                if len(x) != 2:
                    raise ValueError(f"a candidate pair must be (k_pos, k_neg), got {x!r}")
                _int("k_pos", x[0], 0)
                _int("k_neg", x[1], 0)
                if int(x[0]) + int(x[1]) < 1:
                    raise ValueError(f"a candidate must make at least one guess, got {x!r}")
            else:
                _int("candidate guess count", x, 1)


@dataclasses.dataclass(frozen=True)
class RandomSplit:
    """Choose the guesses on a seeded random subset of canaries, certify on the others.

    A uniformly random ``fraction`` of the canaries (permutation from ``seed``, drawn over canary
    positions, never over labels or scores) picks the best guess fractions k+/m1, k-/m1 with no
    correction (every r = 1..m1, or a 4000-point geometric grid above 20,000); the held-out m2
    canaries are then audited with k+ = round(k+/m1 * m2), k- likewise, at level alpha, and
    m = m2 in the certificate.  Valid because, conditionally on the selection half (its labels
    become part of the fixed dataset), the held-out bits are still i.i.d. uniform and the guess
    counts are fixed.
    """

    fraction: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating)) or not (0 < f < 1):
            raise ValueError(f"RandomSplit fraction must lie in (0, 1), got {f!r}")
        _int("RandomSplit seed", self.seed, 0)


_Strategy = FixedK | Bonferroni | RandomSplit


def default_candidates(m: int) -> list[int]:
    """The default Bonferroni candidate guess counts: 1-2-5 sequence from 10, capped at m, plus m.

    m = 5000 -> [10, 20, 50, 100, 200, 500, 1000, 2000, 5000] (9 candidates, alpha / 9 each).
    Chosen so that the Bonferroni price stays small (about 3 log10(m) candidates) while any r is
    within a factor 2.5 of a candidate.
    """
    m_ = _int("m", m, 1)
    out: list[int] = []
    base = 10
    while base <= m_:
        for f in (1, 2, 5):
            if f * base <= m_:
                out.append(f * base)
        base *= 10
    if not out or out[-1] != m_:
        out.append(m_)
    return out


def _diagnostic_candidates(m: int) -> np.ndarray:
    """Guess counts searched for the uncorrected diagnostic and by RandomSplit's selection half."""
    if m <= 20000:
        return np.arange(1, m + 1, dtype=np.int64)
    return np.unique(np.round(np.geomspace(1, m, 4000)).astype(np.int64))


def _split_counts(r: np.ndarray, guesses: str) -> tuple[np.ndarray, np.ndarray]:
    if guesses == "one_sided":
        return r.copy(), np.zeros_like(r)
    kp = (r + 1) // 2
    return kp, r - kp


# ------------------------------------------------------------------------------------------------
# result
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """A one-run epsilon lower bound with everything needed to read it.

    Attributes:
        bound: the epsilon lower bound, valid at level ``alpha`` under ``strategy``.
        method: ``"steinke"`` or ``"fdp"``.
        strategy: how the guesses were chosen, in words (with the candidate count).
        guesses: ``"one_sided"`` or ``"two_sided"``.
        m: canaries in the certificate (held-out count for RandomSplit).
        r, v: guesses made and correct guesses of the certified candidate.
        k_pos, k_neg: IN and OUT guesses of the certified candidate.
        alpha: overall level; ``alpha_per_test`` the level each candidate was tested at.
        delta: the delta of the (eps, delta) statement.
        ceiling: the largest bound this audit could have reported (all guesses right, over the
            candidates the strategy allowed, at ``alpha_per_test``).
        family: for ``fdp`` the family note (:data:`FDP_FAMILY_NOTE`), else None.
        mu: for ``fdp`` the largest rejected mu of mu-GDP, else None.
        n_candidates: candidates the correction paid for (1 for FixedK and RandomSplit).
        m_total: canaries in the game.
        uncorrected_best: DIAGNOSTIC ONLY, NOT A VALID BOUND -- the best bound over every guess
            count r (two-sided: even split; above m = 20,000 a 4000-point geometric grid of r) on
            all m_total canaries at level alpha with no correction for the selection;
            ``uncorrected_best_r`` its r.
    """

    bound: float
    method: str
    strategy: str
    guesses: str
    m: int
    r: int
    v: int
    k_pos: int
    k_neg: int
    alpha: float
    alpha_per_test: float
    delta: float
    ceiling: float
    family: str | None
    mu: float | None
    n_candidates: int
    m_total: int
    uncorrected_best: float
    uncorrected_best_r: int

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["uncorrected_best_note"] = (
            "diagnostic only: best over all guess counts with no correction for choosing it; "
            "not a valid lower bound"
        )
        return d

    def __str__(self) -> str:
        fam = f" [{self.family}]" if self.family else ""
        return (
            f"eps >= {self.bound:.4g} (delta={self.delta:g}, alpha={self.alpha:g}, "
            f"method={self.method}{fam}, {self.guesses}, {self.strategy}; "
            f"v={self.v}/r={self.r} on m={self.m}; ceiling {self.ceiling:.4g}; "
            f"diagnostic uncorrected best {self.uncorrected_best:.4g})"
        )


# ------------------------------------------------------------------------------------------------
# the audit
# ------------------------------------------------------------------------------------------------
def _to_numpy(x: object, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        a = x.detach().to("cpu", torch.float64).numpy()
    else:
        try:
            a = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a tensor or array of numbers, got {x!r}") from err
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {tuple(a.shape)}")
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty, got {x!r}")
    if not np.isfinite(a).all():
        bad = a[~np.isfinite(a)][:3].tolist()
        raise ValueError(f"{name} contains non-finite values (e.g. {bad})")
    return a


class _Game:
    """Scores and labels in canary order, with the guess counts (r, v) of every (k+, k-)."""

    def __init__(self, scores: np.ndarray, labels: np.ndarray, tie_rng: np.random.Generator
                 ) -> None:
        self.m = int(scores.size)
        self.scores = scores
        self.labels = labels
        # descending order; ties broken by a random permutation independent of the labels
        perm = tie_rng.permutation(self.m)
        order = perm[np.argsort(-scores[perm], kind="stable")]
        lab = labels[order].astype(np.int64)
        self.top_correct = np.concatenate(([0], np.cumsum(lab)))  # IN among the k highest
        self.bottom_correct = np.concatenate(([0], np.cumsum(1 - lab[::-1])))  # OUT among k lowest

    def counts(self, kp: np.ndarray, kn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return kp + kn, self.top_correct[kp] + self.bottom_correct[kn]

    def roc_hull(self) -> tuple[np.ndarray, np.ndarray]:
        """(r, v) at the thresholds on the upper hull of the (FN, TN) staircase (jax_privacy)."""
        s_in = np.sort(self.scores[self.labels])
        s_out = np.sort(self.scores[~self.labels])
        thr = np.concatenate((np.union1d(s_in, s_out), [np.inf]))
        fn = np.searchsorted(s_in, thr, side="left")
        tn = np.searchsorted(s_out, thr, side="left")
        pts = np.stack([fn, tn], axis=1).astype(np.int64)
        # a point reached by an x-step and left by a y-step is a lower corner, never on the upper
        # hull; drop those and the interior of straight runs before the exact hull pass
        d_in = np.diff(pts, axis=0)
        keep = np.ones(len(pts), dtype=bool)
        if len(pts) > 2:
            a, b = d_in[:-1], d_in[1:]
            cross = a[:, 1] * b[:, 0] - b[:, 1] * a[:, 0]
            keep[1:-1] = cross > 0
        idx = np.flatnonzero(keep)
        hull: list[int] = []
        for i in idx:  # monotone chain, upper hull, collinear points removed
            while len(hull) >= 2:
                o, a_ = pts[hull[-2]], pts[hull[-1]]
                p = pts[i]
                cr = (a_[1] - o[1]) * (p[0] - a_[0]) - (p[1] - a_[1]) * (a_[0] - o[0])
                if cr <= 0:
                    hull.pop()
                else:
                    break
            hull.append(int(i))
        h = np.asarray(hull)
        n_in, n_out = int(self.labels.sum()), int((~self.labels).sum())
        tp = n_in - fn[h]
        fp = n_out - tn[h]
        return tp + fp, tp

    def subset(self, idx: np.ndarray, tie_rng: np.random.Generator) -> _Game:
        return _Game(self.scores[idx], self.labels[idx], tie_rng)


def _best(method: str, m: int, r: np.ndarray, v: np.ndarray, alpha: float, delta: float
          ) -> tuple[float, int, float | None]:
    """Best bound over candidates (r_j, v_j) at level alpha each: (bound, index, mu).

    Candidates are visited in decreasing precision v/r; one that cannot reject the best value
    found so far is skipped after a single test (its bound would not be larger, p-values growing
    with eps and f-DP rejection shrinking with mu).  Exact: tested against the brute-force max.
    """
    order = np.lexsort((-r, -(v / np.maximum(r, 1))))
    best, best_idx = 0.0, -1
    if method == "steinke":
        # p >= P[B >= v]: a candidate whose binomial tail alone reaches alpha at the best eps so
        # far cannot beat it; that filter is applied to all candidates at once after each gain
        alive = np.ones(r.size, dtype=bool)
        for j in order:
            if not alive[j]:
                continue
            rj, vj = int(r[j]), int(v[j])
            if vj == 0:
                continue
            e = _steinke_search(m, rj, vj, delta, alpha, best)
            if e > best:
                best, best_idx = e, int(j)
                with np.errstate(all="ignore"):
                    tail = special.bdtr(r - v, r, special.expit(-best))
                alive &= (v > 0) & (tail < alpha)
        return best, best_idx, None
    mu_best = 0.0
    for j in order:
        rj, vj = int(r[j]), int(v[j])
        if vj == 0:
            continue
        mu = _fdp_search(m, rj, vj, alpha, mu_best)
        if mu > mu_best:
            mu_best, best_idx = mu, int(j)
    return _mu_to_eps(mu_best, delta), best_idx, mu_best


class OneRunAudit:
    """The end-of-training guessing game on canary scores (ALGORITHMS.md section 6).

    Args:
        in_scores: scores of the canaries that were IN (trained on); tensor or array, 1-D.
        out_scores: scores of the canaries that were OUT.
        tie_break_seed: seed of the random permutation that breaks ties among equal scores
            (ties are broken independently of the labels).

    Higher score = "more likely IN".  With two arrays the canaries' own order is lost, so the
    tie-break and :class:`RandomSplit` permutations act on the pooled list [in..., out...]; their
    validity then rests on the seed being chosen independently of the data (as in jax_privacy).
    :meth:`from_labels` keeps the canaries in their own order (fixed before the secret bits were
    drawn), where any fixed seed is valid -- prefer it when canary order is known.

    Example::

        audit = OneRunAudit(in_scores, out_scores)
        res = audit.epsilon_lower_bound(delta=1e-5, alpha=0.05, method="steinke")
        print(res.bound, res.strategy, res.to_dict())
    """

    def __init__(self, in_scores: object, out_scores: object, *, tie_break_seed: int = 0) -> None:
        a = _to_numpy(in_scores, "in_scores")
        b = _to_numpy(out_scores, "out_scores")
        self._init(np.concatenate([a, b]),
                   np.concatenate([np.ones(a.size, bool), np.zeros(b.size, bool)]),
                   tie_break_seed)

    @classmethod
    def from_labels(cls, scores: object, is_in: object, *, tie_break_seed: int = 0
                    ) -> OneRunAudit:
        """Scores and IN/OUT labels in canary order (the order fixed before the bits were drawn)."""
        s = _to_numpy(scores, "scores")
        lab = is_in.detach().cpu().numpy() if isinstance(is_in, torch.Tensor) else np.asarray(is_in)
        if lab.shape != s.shape:
            raise ValueError(f"is_in must have the shape of scores {s.shape}, got {lab.shape}")
        if lab.dtype != bool:
            if not np.isin(lab, (0, 1)).all():
                vals = np.unique(lab)[:5]
                raise ValueError(f"is_in must hold booleans or 0/1, got values {vals}")
            lab = lab.astype(bool)
        if lab.all() or not lab.any():
            raise ValueError("is_in must contain both IN and OUT canaries")
        obj = cls.__new__(cls)
        obj._init(s, lab, tie_break_seed)
        return obj

    def _init(self, scores: np.ndarray, labels: np.ndarray, tie_break_seed: int) -> None:
        self._tie_seed = _int("tie_break_seed", tie_break_seed, 0)
        self._game = _Game(scores, labels, np.random.default_rng(self._tie_seed))
        n_ties = scores.size - np.unique(scores).size
        if n_ties:
            logger.info("%d tied scores; ties broken at random (seed %d), independently of labels",
                        n_ties, self._tie_seed)

    @property
    def m(self) -> int:
        """Number of canaries."""
        return self._game.m

    @property
    def n_in(self) -> int:
        return int(self._game.labels.sum())

    @property
    def n_out(self) -> int:
        return self.m - self.n_in

    def epsilon_lower_bound(
        self,
        delta: float,
        alpha: float = 0.05,
        method: str = "steinke",
        guesses: str = "one_sided",
        strategy: _Strategy | None = None,
    ) -> OneRunResult:
        """Level-alpha lower bound on eps of (eps, delta)-DP, with its method and strategy.

        Args:
            delta: the delta of the claim, in [0, 1) (``fdp`` needs delta > 0).
            alpha: level in (0, 1); the bound exceeds the truth with probability <= alpha.
            method: ``"steinke"`` (family-free) or ``"fdp"`` (Gaussian-family test).
            guesses: ``"one_sided"`` (top scores guessed IN) or ``"two_sided"`` (also the bottom
                scores guessed OUT, Steinke et al. Algorithm 1).
            strategy: :class:`FixedK`, :class:`Bonferroni` (default ``Bonferroni("grid")``) or
                :class:`RandomSplit`.
        """
        delta = check_delta(delta)
        alpha = check_alpha(alpha)
        method = _check_method(method)
        if method == "fdp":
            _check_fdp_delta(delta)
        if guesses not in _GUESSES:
            raise ValueError(f"guesses must be one of {_GUESSES}, got {guesses!r}")
        if strategy is None:
            strategy = Bonferroni()
        if not isinstance(strategy, (FixedK, Bonferroni, RandomSplit)):
            raise ValueError(
                f"strategy must be FixedK, Bonferroni or RandomSplit, got {strategy!r}"
            )
        g, m = self._game, self._game.m

        if isinstance(strategy, FixedK):
            kp, kn = strategy.resolve(guesses)
            if kp + kn > m:
                raise ValueError(
                    f"FixedK asks for k_pos + k_neg = {kp + kn} guesses but there are m = {m} "
                    f"canaries (k_pos={kp}, k_neg={kn})"
                )
            kpa, kna = np.array([kp]), np.array([kn])
            r, v = g.counts(kpa, kna)
            bound, _, mu = _best(method, m, r, v, alpha, delta)
            cert_m, a_test, n_cand, desc = m, alpha, 1, strategy.describe(guesses)
            sel, ceil_r = 0, [int(r[0])]
        elif isinstance(strategy, Bonferroni):
            kpa, kna, r, v, desc = self._bonferroni_candidates(strategy, guesses)
            n_cand = int(r.size)
            a_test = alpha / n_cand
            bound, sel, mu = _best(method, m, r, v, a_test, delta)
            sel = max(sel, 0)
            cert_m = m
            ceil_r = sorted({int(x) for x in r if x > 0})
        else:
            bound, mu, cert_m, kpa, kna, r, v, desc = self._random_split(
                strategy, method, guesses, alpha, delta)
            sel, a_test, n_cand, ceil_r = 0, alpha, 1, [int(r[0])]

        if len(ceil_r) <= 64:
            ceil_val = max(_all_right(method, cert_m, k, delta, a_test) for k in ceil_r)
        else:  # large candidate sets: the maximum over every r (an upper bound over the set)
            ceil_val = ceiling(cert_m, a_test, delta, method)
        diag, diag_r = self._uncorrected(method, guesses, alpha, delta)
        res = OneRunResult(
            bound=float(bound),
            method=method,
            strategy=desc,
            guesses=guesses,
            m=int(cert_m),
            r=int(r[sel]),
            v=int(v[sel]),
            k_pos=int(kpa[sel]),
            k_neg=int(kna[sel]),
            alpha=alpha,
            alpha_per_test=float(a_test),
            delta=delta,
            ceiling=float(ceil_val),
            family=FDP_FAMILY_NOTE if method == "fdp" else None,
            mu=None if mu is None else float(mu),
            n_candidates=n_cand,
            m_total=m,
            uncorrected_best=float(diag),
            uncorrected_best_r=int(diag_r),
        )
        logger.info("one-run audit: %s", res)
        return res

    # -- strategies ------------------------------------------------------------------------------
    def _bonferroni_candidates(self, s: Bonferroni, guesses: str
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
        g, m = self._game, self._game.m
        c = s.candidates
        if c == "roc_hull":
            if guesses != "one_sided":
                raise ValueError("Bonferroni(candidates='roc_hull') supports guesses='one_sided' "
                                 f"only, got guesses={guesses!r}")
            r, v = g.roc_hull()
            desc = (f"Bonferroni over the {r.size} ROC-hull thresholds (jax_privacy semantics; "
                    "data-dependent count)")
            return r.copy(), np.zeros_like(r), r, v, desc
        if c in ("grid", "all"):
            rr = np.asarray(default_candidates(m) if c == "grid" else np.arange(1, m + 1),
                            dtype=np.int64)
            kp, kn = _split_counts(rr, guesses)
            shown = rr.tolist() if rr.size <= 12 else f"1..{m}"
            desc = f"Bonferroni over {rr.size} guess counts r in {shown}"
        else:
            kp_l, kn_l = [], []
            for x in c:
                if isinstance(x, tuple):
                    a, b = int(x[0]), int(x[1])
                    if guesses == "one_sided" and b > 0:
                        raise ValueError(f"guesses='one_sided' but candidate {x!r} has k_neg > 0")
                else:
                    (a,), (b,) = _split_counts(np.array([int(x)]), guesses)
                kp_l.append(int(a))
                kn_l.append(int(b))
                if a + b > m:
                    raise ValueError(f"candidate {x!r} asks for {a + b} guesses but m = {m}")
            kp, kn = np.array(kp_l, np.int64), np.array(kn_l, np.int64)
            desc = f"Bonferroni over {kp.size} stated candidates {list(c)}"
        r, v = g.counts(kp, kn)
        return kp, kn, r, v, desc

    def _random_split(self, s: RandomSplit, method: str, guesses: str, alpha: float, delta: float
                      ) -> tuple[float, float | None, int, np.ndarray, np.ndarray, np.ndarray,
                                 np.ndarray, str]:
        g, m = self._game, self._game.m
        m1 = int(math.floor(s.fraction * m))
        m2 = m - m1
        if m1 < 1 or m2 < 1:
            raise ValueError(f"RandomSplit(fraction={s.fraction}) leaves an empty half of m={m}")
        rng = np.random.default_rng(s.seed)
        perm = rng.permutation(m)
        g1 = g.subset(perm[:m1], rng)
        g2 = g.subset(perm[m1:], rng)
        rr = _diagnostic_candidates(m1)
        kp1, kn1 = _split_counts(rr, guesses)
        r1, v1 = g1.counts(kp1, kn1)
        _, j, _ = _best(method, m1, r1, v1, alpha, delta)
        if j < 0:  # nothing rejected on the selection half: certify the largest guess count
            j = int(rr.size - 1)
        kp2 = int(round(kp1[j] / m1 * m2))
        kn2 = int(round(kn1[j] / m1 * m2))
        if kp2 + kn2 < 1:
            kp2 = 1
        if kp2 + kn2 > m2:
            kp2 = m2 - kn2
        kpa, kna = np.array([kp2]), np.array([kn2])
        r2, v2 = g2.counts(kpa, kna)
        bound, _, mu = _best(method, m2, r2, v2, alpha, delta)
        desc = (f"RandomSplit(fraction={s.fraction}, seed={s.seed}): k chosen on {m1} canaries "
                f"(k_pos={int(kp1[j])}, k_neg={int(kn1[j])}), certified on the other {m2}")
        return bound, mu, m2, kpa, kna, r2, v2, desc

    def _uncorrected(self, method: str, guesses: str, alpha: float, delta: float
                     ) -> tuple[float, int]:
        rr = _diagnostic_candidates(self.m)
        kp, kn = _split_counts(rr, guesses)
        r, v = self._game.counts(kp, kn)
        b, j, _ = _best(method, self.m, r, v, alpha, delta)
        return b, (int(r[j]) if j >= 0 else 0)
