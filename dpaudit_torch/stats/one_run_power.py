"""Power of the one-run audit: what bound a correct implementation would get, and what it refutes.

The one-run bound of Steinke, Nasr & Jagielski ("Privacy Auditing with One (1) Training Run",
NeurIPS 2023; docs/design.md section 6) is a lower bound: a small bound on a correct run says
nothing until one knows how large a bound the audit *could* have produced.  This module answers
by simulating the idealized game of the white-box audit (docs/design.md sections 5-6):

* m canaries, each IN with probability 1/2 (the secret coin);
* at each of T steps an IN canary is present with probability q (Poisson sampling), an OUT canary
  never is;
* the observation of a canary at a step is Z = c * 1{present} + N(0, sigma^2) (units of the
  clipping norm C) -- exactly what the white-box auditor sees for a correct implementation once
  the real data's clipped sum is subtracted;
* a canary's score is the sum over steps of a per-step score
  (:mod:`~dpaudit_torch.stats.one_run_scores`), and the bound is computed by the same
  :class:`~dpaudit_torch.stats.one_run.OneRunAudit` call as the auditor's (two arrays, IN and OUT
  scores, default guesses and strategy unless told otherwise).

:func:`simulate_one_run_bounds` returns the simulated bounds; :func:`one_run_power` summarises
them (median and 10-90 % range) and searches the smallest true epsilon the audit refutes with a
target probability.

Simulation.  The ``"sum"`` score is simulated exactly and cheaply: an IN canary's sum is
c * Binomial(T, q) + N(0, T sigma^2), an OUT canary's N(0, T sigma^2).  The ``"llr"`` score is
simulated step by step when m * T * replicates is small enough (``mode="exact"``, or ``"auto"``
under :data:`EXACT_BUDGET` per-step draws); otherwise (``mode="approx"``) by an approximation.
Given its number n of presences (Binomial(T, q) for an IN canary, 0 for an OUT one), a canary's
score is the sum of n i.i.d. "present" terms f(c + sigma U) and T - n i.i.d. "absent" terms
f(sigma U), U ~ N(0, 1), f the per-step log-likelihood ratio.  A sum of fewer than
:data:`NORMAL_MIN_COUNT` (50) terms is simulated term by term.  A longer sum of K terms is split
at an upper quantile u0 of U: the terms with U > u0 (Binomial(K, p) of them, p = P[U > u0] about
:data:`TAIL_TERMS` / K) are simulated exactly, and the others, whose values are bounded, are
replaced by one normal variable with their exact mean and variance (numerical integration),
corrected to their exact skewness (first Cornish-Fisher term); p is doubled until that correction
is small (:data:`MAX_BULK_SKEW`), and every term is simulated if it never is.  A plain normal
approximation of the whole sum is not good enough: the log-likelihood ratio of an absent step is
right-skewed (mostly near log(1 - q), occasionally large), and a normal sum underestimates the
upper tail of the OUT scores, which is where the audit's guesses are made (it overstated the
bound by about 15 %).  The approximation only affects a power estimate, never a bound on real
data; ``tests/stats/test_one_run_power.py`` and ``benchmarks/one_run_scores.py`` compare it with the
exact simulation.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import special

from .._validation import as_real
from ._one_run_checks import check_bound_request, check_int
from .one_run import Bonferroni, FixedK, OneRunAudit, RandomSplit, default_candidates
from .one_run_bounds import CanaryGame, all_right_bound, best_bound
from .one_run_scores import DEFAULT_SCORE, check_score, llr_step_score

logger = logging.getLogger(__name__)

__all__ = [
    "EXACT_BUDGET",
    "NORMAL_MIN_COUNT",
    "TAIL_TERMS",
    "MAX_BULK_SKEW",
    "MODES",
    "PowerResult",
    "simulate_scores",
    "bounds_from_scores",
    "simulate_one_run_bounds",
    "one_run_power",
    "few_inclusions_warning",
    "stopped_wording",
]

#: ``mode="auto"`` simulates the llr score step by step up to this many per-step draws
EXACT_BUDGET = 2e7
#: in ``mode="approx"``, a sum of fewer i.i.d. per-step terms is simulated term by term
NORMAL_MIN_COUNT = 50
#: in ``mode="approx"``, about this many terms of a longer sum (its upper tail) stay exact
TAIL_TERMS = 16
#: in ``mode="approx"``, the largest skewness x sd of the normal part of a longer sum, relative
#: to the sd of the whole sum
MAX_BULK_SKEW = 0.05
#: simulation modes of :func:`simulate_scores`
MODES = ("auto", "exact", "approx")
#: elements per simulated block (bounds the memory of every array to a few tens of MB)
_BLOCK = 1 << 21
#: the "no power" warning threshold on the mean number of inclusions q T of an IN canary
_FEW_INCLUSIONS = 5.0
#: how far below sigma the search for the smallest refutable epsilon goes
_SIGMA_FLOOR = 1e-3

_Strategy = FixedK | Bonferroni | RandomSplit


# ------------------------------------------------------------------------------------------------
# argument checks
# ------------------------------------------------------------------------------------------------
def few_inclusions_warning(q: float, steps: int, stopped: bool = False) -> str | None:
    """The warning for an audit whose IN canaries are included fewer than
    :data:`_FEW_INCLUSIONS` times on average (q T), or None. ``stopped``: the audit itself
    stopped training on a proven violation, so there is no advice to train longer."""
    if q * steps >= _FEW_INCLUSIONS:
        return None
    if stopped:
        return (f"IN canaries were included only {q * steps:.3g} times on average (q T): the "
                f"audit stopped training after {steps} step(s) on a proven violation, so the "
                "one-run bound had almost no power; the violation does not depend on it")
    return (f"IN canaries were included only {q * steps:.3g} times on average (q T); the "
            "one-run bound has almost no power: raise the number of steps or the sample rate")


def stopped_wording(warnings: list[str], q: float, steps: int) -> list[str]:
    """``warnings`` with the few-inclusions warning worded for an audit that itself stopped
    training on a proven violation (no advice to train longer)."""
    usual, stopped = few_inclusions_warning(q, steps), few_inclusions_warning(q, steps, True)
    return [stopped if w == usual else w for w in warnings]


def _check_game(sigma: object, q: object, steps: object, m: object, c: object
                ) -> tuple[float, float, int, int, float]:
    s_ = as_real("sigma", sigma)
    if not (s_ > 0.0 and math.isfinite(s_)):
        raise ValueError(f"sigma (noise multiplier) must be a finite number > 0, got {sigma!r}")
    q_ = as_real("q", q)
    if not (0.0 <= q_ <= 1.0):
        raise ValueError(f"q (sampling probability) must lie in [0, 1], got {q!r}")
    t_ = check_int("steps", steps, 0)
    m_ = check_int("m", m, 0)
    c_ = as_real("c", c)
    if not (c_ > 0.0 and math.isfinite(c_)):
        raise ValueError(f"c (canary norm) must be a finite number > 0, got {c!r}")
    return s_, q_, t_, m_, c_


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def _check_strategy(strategy: object) -> _Strategy | None:
    if strategy is not None and not isinstance(strategy, (FixedK, Bonferroni, RandomSplit)):
        raise ValueError(f"strategy must be FixedK, Bonferroni, RandomSplit or None, "
                         f"got {strategy!r}")
    return strategy


def _no_power_reason(q: float, steps: int, m: int) -> str | None:
    if steps == 0:
        return "no training steps were audited (steps = 0)"
    if m < 2:
        return f"the one-run game needs at least 2 canaries, got m = {m}"
    if q == 0.0:
        return "canaries are never included (sample rate q = 0)"
    return None


# ------------------------------------------------------------------------------------------------
# simulation of the scores
# ------------------------------------------------------------------------------------------------
def _bulk_moments(shift: float, q: float, sigma: float, c: float, u0: float
                  ) -> tuple[float, float, float]:
    """Mean, variance and skewness of f(shift + sigma U) given U <= u0, U ~ N(0, 1), f the
    per-step log-LR (numerical integration on a fine grid from -12 to min(u0, 12), weights
    renormalised)."""
    u = np.linspace(-12.0, min(u0, 12.0), 24001)
    w = np.exp(-0.5 * u * u)
    w /= w.sum()
    f = llr_step_score(shift + sigma * u, q, sigma, c)
    mean = float(np.dot(w, f))
    d = f - mean
    var = float(np.dot(w, d * d))
    skew = float(np.dot(w, d * d * d)) / var**1.5 if var > 0.0 else 0.0
    return mean, var, skew


def _split_plan(k_min: int, shift: float, q: float, sigma: float, c: float
                ) -> tuple[float, float, float, float] | None:
    """(p, mean, var, skew): the tail probability p of the split and the moments of one bulk term,
    for sums of at least ``k_min`` terms; None when no split keeps the bulk's skewness small
    (then every term is simulated).

    Small means: the skewness of the bulk sum times its standard deviation (the size of the
    Cornish-Fisher correction, in score units) is at most :data:`MAX_BULK_SKEW` times the
    standard deviation of the whole sum.  For a sum of K bulk terms that product is
    m3 / var of one bulk term, whatever K.
    """
    sd_total = math.sqrt(k_min * _bulk_moments(shift, q, sigma, c, 12.0)[1])
    p = min(1.0, TAIL_TERMS / k_min)
    while p < 0.5:
        mean, var, skew = _bulk_moments(shift, q, sigma, c, -float(special.ndtri(p)))
        if var == 0.0 or abs(skew) * math.sqrt(var) <= MAX_BULK_SKEW * sd_total:
            return p, mean, var, skew
        p *= 2.0
    return None


def _term_sums(k: np.ndarray, shift: float, q: float, sigma: float, c: float,
               rng: np.random.Generator, tail: float | None = None) -> np.ndarray:
    """Sums of ``k[i]`` i.i.d. terms f(shift + sigma U), every term simulated: U ~ N(0, 1), or
    U given U > -Phi^-1(tail) when ``tail`` is given.  Flat draws in blocks of about
    :data:`_BLOCK` terms, summed per canary.

    The tail draw is U = -Phi^-1(tail e^-W), W ~ Exp(1) (inverse-CDF sampling, V = e^-W uniform),
    read off a table of 4097 points of W in [0, 60] by linear interpolation (the function is
    smooth: interpolation error below 3e-5 in U; P[W > 60] = 1e-26), which is ten times
    faster than calling Phi^-1 on every draw."""
    if tail is not None:  # uniform grid: the cell of a draw is found by one division
        step = 60.0 / 4096
        u_grid = -special.ndtri(tail * np.exp(-step * np.arange(4098)))
        slope = np.diff(u_grid)
    out = np.zeros(k.size)
    ends = np.cumsum(k)
    i0 = 0
    while i0 < k.size:
        start = ends[i0] - k[i0]
        i1 = max(i0 + 1, int(np.searchsorted(ends, start + _BLOCK, side="right")))
        n = int(ends[i1 - 1] - start)
        if n:
            if tail is None:
                u = rng.standard_normal(n)
            else:
                x = np.minimum(rng.standard_exponential(n), 60.0) / step
                cell = x.astype(np.int64)
                u = u_grid[cell] + slope[cell] * (x - cell)
            terms = llr_step_score(shift + sigma * u, q, sigma, c)
            owner = np.repeat(np.arange(i1 - i0), k[i0:i1])
            out[i0:i1] = np.bincount(owner, weights=terms, minlength=i1 - i0)
        i0 = i1
    return out


def _iid_sums(counts: np.ndarray, shift: float, q: float, sigma: float, c: float,
              rng: np.random.Generator) -> np.ndarray:
    """Sum of ``counts[i]`` i.i.d. terms f(shift + sigma U), U ~ N(0, 1).

    Counts below :data:`NORMAL_MIN_COUNT`: every term simulated.  Larger counts K: each term is
    in the upper tail U > u0 with probability p (about :data:`TAIL_TERMS` / K); the number of tail
    terms is Binomial(K, p) and each is simulated exactly (U given U > u0); the other
    ("bulk") terms, bounded by f(shift + sigma u0), are summed as a normal variable with their
    exact mean and variance, corrected to their exact skewness (first Cornish-Fisher term), which
    the choice of p keeps small (:func:`_split_plan`).
    """
    out = np.zeros(counts.shape)
    flat = counts.reshape(-1).astype(np.int64)
    res = out.reshape(-1)
    big = np.flatnonzero(flat >= NORMAL_MIN_COUNT)
    plan = _split_plan(int(flat[big].min()), shift, q, sigma, c) if big.size else None
    exact = flat > 0
    if plan is not None:
        exact[big] = False
        p, mean, var, skew = plan
        k = flat[big]
        n_tail = rng.binomial(k, p)
        k_bulk = (k - n_tail).astype(np.float64)
        z = rng.standard_normal(big.size)
        g = skew / np.sqrt(np.maximum(k_bulk, 1.0))
        res[big] = k_bulk * mean + np.sqrt(k_bulk * var) * (z + g * (z * z - 1.0) / 6.0)
        res[big] += _term_sums(n_tail, shift, q, sigma, c, rng, tail=p)
    idx = np.flatnonzero(exact)
    if idx.size:
        res[idx] = _term_sums(flat[idx], shift, q, sigma, c, rng)
    return out


def _choose_mode(mode: str, score: str, steps: int, m: int, replicates: int) -> str:
    if mode != "auto":
        return mode
    if score == "sum":
        return "approx"  # the sum shortcut is exact in distribution
    return "exact" if float(m) * steps * replicates <= EXACT_BUDGET else "approx"


def simulate_scores(sigma: float, q: float, steps: int, m: int, *, score: str = DEFAULT_SCORE,
                    c: float = 1.0, replicates: int = 1, seed: int = 0, mode: str = "auto"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Secret bits and scores of ``replicates`` idealized one-run games (module docstring).

    Returns ``(labels, scores)``, both of shape (replicates, m): True = IN.  ``mode``:
    ``"exact"`` simulates every step (in blocks of steps, never an m x T x replicates array);
    ``"approx"`` uses the exact Binomial shortcut for ``"sum"`` and the tail-exact approximation
    of the module docstring for ``"llr"``; ``"auto"`` picks the shortcut for ``"sum"``, and for
    ``"llr"`` the exact simulation up to :data:`EXACT_BUDGET` per-step draws.  In ``"exact"``
    mode the two scores consume the random stream identically, so equal seeds give paired
    games.
    """
    s_, q_, t_, m_, c_ = _check_game(sigma, q, steps, m, c)
    score = check_score(score)
    r_ = check_int("replicates", replicates, 1)
    seed_ = check_int("seed", seed, 0)
    mode = _choose_mode(_check_mode(mode), score, t_, m_, r_)
    return _simulate(np.random.default_rng(seed_), s_, q_, t_, m_, c_, score, r_, mode)


def _simulate(rng: np.random.Generator, sigma: float, q: float, steps: int, m: int, c: float,
              score: str, replicates: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`simulate_scores` on checked arguments and a given generator."""
    labels = rng.random((replicates, m)) < 0.5
    if steps == 0 or m == 0 or (q == 0.0 and score == "llr"):  # no step, or log LR = 0
        return labels, np.zeros((replicates, m))
    if mode == "exact":
        scores = np.zeros((replicates, m))
        chunk = max(1, _BLOCK // max(1, replicates * m))
        for t0 in range(0, steps, chunk):
            k = min(chunk, steps - t0)
            present = rng.random((replicates, m, k)) < q
            present &= labels[:, :, None]
            z = rng.standard_normal((replicates, m, k))
            z *= sigma
            z += c * present
            if score == "llr":
                z = llr_step_score(z, q, sigma, c)
            scores += z.sum(axis=2)
        return labels, scores
    n = rng.binomial(steps, q, size=(replicates, m)) * labels
    if score == "sum" or q == 1.0:
        total = c * n + sigma * math.sqrt(steps) * rng.standard_normal((replicates, m))
        if score == "sum":
            return labels, total
        # q = 1: the log-LR c (z - c/2) / sigma^2 is affine, so the score is exact from the sum
        return labels, (c / sigma**2) * total - steps * c**2 / (2.0 * sigma**2)
    present = _iid_sums(n, c, q, sigma, c, rng)
    absent = _iid_sums(steps - n, 0.0, q, sigma, c, rng)
    return labels, present + absent


# ------------------------------------------------------------------------------------------------
# bounds
# ------------------------------------------------------------------------------------------------
def _default_bound(scores: np.ndarray, labels: np.ndarray, method: str, delta: float,
                   alpha: float) -> float:
    """``OneRunAudit(ins, outs).epsilon_lower_bound(delta, alpha, method).bound`` (default
    one-sided guesses, ``Bonferroni("grid")``) without the uncorrected diagnostic, which the
    power estimate does not need: the same pooled order [in..., out...], the same tie-break
    seed 0, the same candidates and the same search (checked equal in the tests)."""
    pooled = np.concatenate([scores[labels], scores[~labels]])
    lab = np.concatenate([np.ones(int(labels.sum()), bool), np.zeros(int((~labels).sum()), bool)])
    game = CanaryGame(pooled, lab, np.random.default_rng(0))
    rr = np.asarray(default_candidates(game.m), dtype=np.int64)
    r, v = game.counts(rr, np.zeros_like(rr))
    return float(best_bound(method, game.m, r, v, alpha / rr.size, delta)[0])


def bounds_from_scores(labels: np.ndarray, scores: np.ndarray, *, delta: float,
                       alpha: float = 0.05, method: str = "steinke",
                       strategy: _Strategy | None = None) -> np.ndarray:
    """One-run bound of every row of ``scores`` (shape (replicates, m), labels True = IN),
    computed as the auditor does: ``OneRunAudit(ins, outs).epsilon_lower_bound(delta, alpha,
    method, strategy=strategy)``.  A row with an empty IN or OUT group gets 0.0, as in the
    auditor."""
    method, delta, alpha = check_bound_request(method, delta, alpha)
    strategy = _check_strategy(strategy)
    lab = np.atleast_2d(np.asarray(labels, dtype=bool))
    sc = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    if lab.shape != sc.shape:
        raise ValueError(f"labels {lab.shape} and scores {sc.shape} must have the same shape")
    out = np.zeros(sc.shape[0])
    for i in range(sc.shape[0]):
        li, si = lab[i], sc[i]
        if li.all() or not li.any():
            continue
        if strategy is None or strategy == Bonferroni():
            out[i] = _default_bound(si, li, method, delta, alpha)
        else:
            out[i] = OneRunAudit(si[li], si[~li]).epsilon_lower_bound(
                delta, alpha, method, strategy=strategy).bound
    return out


def _check_request(sigma: float, q: float, steps: int, m: int, c: float, score: str,
                   method: str, delta: float, alpha: float, replicates: int, seed: int,
                   strategy: Any) -> tuple[Any, ...]:
    """Every argument of a simulation request, validated (ValueError naming the value)."""
    s_, q_, t_, m_, c_ = _check_game(sigma, q, steps, m, c)
    score = check_score(score)
    method, delta, alpha = check_bound_request(method, delta, alpha)
    r_ = check_int("replicates", replicates, 1)
    seed_ = check_int("seed", seed, 0)
    return (s_, q_, t_, m_, c_, score, method, delta, alpha, r_, seed_,
            _check_strategy(strategy))


def simulate_one_run_bounds(sigma: float, q: float, steps: int, m: int, *,
                            score: str = DEFAULT_SCORE, delta: float, alpha: float = 0.05,
                            c: float = 1.0, method: str = "steinke", replicates: int = 200,
                            seed: int = 0, strategy: _Strategy | None = None,
                            mode: str = "auto") -> np.ndarray:
    """Bounds of ``replicates`` idealized one-run games of a correct implementation.

    The game of the module docstring with noise multiplier ``sigma``, sample rate ``q``,
    ``steps`` steps, ``m`` canaries of norm ``c``; each game's bound is
    ``OneRunAudit(ins, outs).epsilon_lower_bound(delta, alpha, method, strategy=strategy)``
    (the auditor's call; default one-sided guesses and ``Bonferroni("grid")``).  Simulated in
    blocks of replicates (memory O(block x m), never m x T x replicates).  ``mode``: see
    :func:`simulate_scores`.  Deterministic given ``seed``.  Returns an array of
    ``replicates`` bounds (all 0.0 when ``steps == 0`` or ``m < 2``).
    """
    (s_, q_, t_, m_, c_, score, method, delta, alpha, r_, seed_,
     strategy) = _check_request(sigma, q, steps, m, c, score, method, delta, alpha, replicates,
                                seed, strategy)
    mode = _choose_mode(_check_mode(mode), score, t_, m_, r_)
    if _no_power_reason(q_, t_, m_) is not None:
        return np.zeros(r_)
    rng = np.random.default_rng(seed_)
    block = max(1, min(r_, (_BLOCK // 8) // m_))
    out = []
    for r0 in range(0, r_, block):
        k = min(block, r_ - r0)
        labels, scores = _simulate(rng, s_, q_, t_, m_, c_, score, k, mode)
        out.append(bounds_from_scores(labels, scores, delta=delta, alpha=alpha, method=method,
                                      strategy=strategy))
    return np.concatenate(out)


# ------------------------------------------------------------------------------------------------
# power
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PowerResult:
    """What a one-run audit with these settings could find (:func:`one_run_power`).

    Attributes:
        expected_bound: median simulated bound of a correct implementation with this run's
            sigma, q, T and m (None without power).
        expected_bound_quantiles: (10 %, 90 %) quantiles of the simulated bounds.
        min_refutable_epsilon: the smallest true epsilon (``epsilon_of_sigma(sigma')``) whose
            idealized run gives a bound above ``claimed_epsilon`` with probability at least
            ``target_power``; None (with ``note``) when it was not asked for or cannot be reached.
        min_refutable_sigma: the noise multiplier sigma' found for it.
        claimed_epsilon: the claim the refutation is measured against.
        target_power: the probability asked for.
        mean_inclusions: q T, how often an IN canary is included on average.
        replicates: simulated games behind ``expected_bound``.
        score, method: the per-canary score and the bound method simulated.
        mode: ``"exact"`` (step by step or the exact Binomial shortcut) or ``"approx"`` (the
            tail-exact approximation of the llr score, module docstring).
        seconds: wall time of the computation.
        warnings: plain-language warnings (e.g. too few inclusions).
        no_power: True when the audit cannot say anything (no steps, fewer than 2 canaries,
            q = 0); every simulated number is then None.
        note: why a number is None, or how to read it.
        sigma, q, steps, m, c, delta, alpha: the settings simulated.
    """

    expected_bound: float | None
    expected_bound_quantiles: tuple[float, float] | None
    min_refutable_epsilon: float | None
    min_refutable_sigma: float | None
    claimed_epsilon: float | None
    target_power: float
    mean_inclusions: float
    replicates: int
    score: str
    method: str
    mode: str | None
    seconds: float
    warnings: tuple[str, ...]
    no_power: bool
    note: str | None
    sigma: float
    q: float
    steps: int
    m: int
    c: float
    delta: float
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (the report's ``power`` object, docs/report.md)."""
        d = dataclasses.asdict(self)
        q = self.expected_bound_quantiles
        d["expected_bound_quantiles"] = None if q is None else [float(q[0]), float(q[1])]
        d["warnings"] = list(self.warnings)
        return d


def _ceiling_of_default(m: int, method: str, delta: float, alpha: float) -> float:
    """Largest bound of the default strategy (every guess right, best candidate)."""
    rr = default_candidates(m)
    return max(all_right_bound(method, m, int(r), delta, alpha / len(rr)) for r in rr)


def one_run_power(sigma: float, q: float, steps: int, m: int, *, score: str = DEFAULT_SCORE,
                  delta: float, alpha: float = 0.05, claimed_epsilon: float | None = None,
                  epsilon_of_sigma: Callable[[float], float] | None = None, c: float = 1.0,
                  method: str = "steinke", replicates: int = 200, seed: int = 0,
                  target_power: float = 0.8, search_replicates: int | None = None,
                  search_iterations: int = 8, strategy: _Strategy | None = None,
                  mode: str = "auto") -> PowerResult:
    """Expected one-run bound of a correct run, and the smallest true epsilon it would refute.

    1. ``expected_bound``: the median (and 10 %, 90 % quantiles) of ``replicates`` simulated
       bounds at this run's sigma, q, ``steps`` and ``m`` (:func:`simulate_one_run_bounds`).
    2. ``min_refutable_epsilon``: lower the noise to sigma' < sigma until the simulated bound
       exceeds ``claimed_epsilon`` in at least ``target_power`` of ``search_replicates`` games
       (default a quarter of ``replicates``, at least 50; the same seed at every sigma', so the
       search is deterministic): bisection on log sigma' over [1e-3 sigma, sigma] for
       ``search_iterations`` steps, keeping the largest sigma' known to reach the target, and
       report ``epsilon_of_sigma(sigma')`` -- a callable the caller provides, the run's own
       accountant at its q, steps and delta.  If the run's own sigma already reaches the target
       (the claim is below what a correct run certifies), sigma' = sigma.  None with a ``note``
       when ``claimed_epsilon`` or ``epsilon_of_sigma`` is missing, when the claim is at or above
       the audit's ceiling, or when even sigma' = 1e-3 sigma misses the target ("this audit
       cannot refute the claim at this m and T").

    Returns a :class:`PowerResult`.  Without power (``steps == 0``, ``m < 2``, ``q == 0``) every
    simulated number is None and ``no_power`` is True; never an exception for these.

    Raises:
        ValueError: a negative or otherwise invalid input (the message names it).
    """
    t_start = time.perf_counter()
    (s_, q_, t_, m_, c_, score, method, delta, alpha, r_, seed_,
     strategy) = _check_request(sigma, q, steps, m, c, score, method, delta, alpha, replicates,
                                seed, strategy)
    mode = _check_mode(mode)
    tp = as_real("target_power", target_power)
    if not 0.0 < tp < 1.0:
        raise ValueError(f"target_power must lie in (0, 1), got {target_power!r}")
    claim: float | None = None
    if claimed_epsilon is not None:
        claim = as_real("claimed_epsilon", claimed_epsilon)
        if not claim >= 0.0:
            raise ValueError(f"claimed_epsilon must be a number >= 0, got {claimed_epsilon!r}")
    if epsilon_of_sigma is not None and not callable(epsilon_of_sigma):
        raise ValueError(f"epsilon_of_sigma must be callable, got {epsilon_of_sigma!r}")
    n_search = max(50, r_ // 4) if search_replicates is None else check_int(
        "search_replicates", search_replicates, 1)
    n_iter = check_int("search_iterations", search_iterations, 1)

    base = {"claimed_epsilon": claim, "target_power": tp, "mean_inclusions": q_ * t_,
            "replicates": r_, "score": score, "method": method, "sigma": s_, "q": q_,
            "steps": t_, "m": m_, "c": c_, "delta": delta, "alpha": alpha}
    reason = _no_power_reason(q_, t_, m_)
    if reason is not None:
        return PowerResult(expected_bound=None, expected_bound_quantiles=None,
                           min_refutable_epsilon=None, min_refutable_sigma=None, mode=None,
                           seconds=time.perf_counter() - t_start,
                           warnings=(f"the one-run audit has no power: {reason}",),
                           no_power=True, note=reason, **base)
    warns: list[str] = []
    few = few_inclusions_warning(q_, t_)
    if few:
        warns.append(few)
    mode = _choose_mode(mode, score, t_, m_, max(r_, n_search))

    def bounds(sig: float, n: int) -> np.ndarray:
        return simulate_one_run_bounds(sig, q_, t_, m_, score=score, delta=delta, alpha=alpha,
                                       c=c_, method=method, replicates=n, seed=seed_,
                                       strategy=strategy, mode=mode)

    b = bounds(s_, r_)
    expected = float(np.median(b))
    lo_q, hi_q = (float(x) for x in np.quantile(b, [0.1, 0.9]))
    min_eps: float | None = None
    min_sig: float | None = None
    note: str | None = None
    if claim is None or epsilon_of_sigma is None:
        note = ("no claimed epsilon or no epsilon_of_sigma given: the smallest refutable "
                "epsilon was not searched")
    elif math.isinf(claim) or (strategy is None and claim >= _ceiling_of_default(
            m_, method, delta, alpha)):
        note = (f"this audit cannot refute the claim at this m and T: the claimed epsilon "
                f"{claim:.4g} is at or above the largest bound {m_} canaries can certify")
    else:
        def power(sig: float) -> float:
            return float(np.mean(bounds(sig, n_search) > claim))

        if power(s_) >= tp:
            min_sig = s_
            note = (f"a correct implementation with this run's sigma already gives a bound above "
                    f"the claimed epsilon in at least {tp:.0%} of simulated runs: the claim is "
                    "below what the accountant's own sigma allows")
        elif power(_SIGMA_FLOOR * s_) < tp:
            note = ("this audit cannot refute the claim at this m and T: even with 1/1000 of "
                    f"the noise the bound exceeds it in fewer than {tp:.0%} of simulated runs")
        else:
            lo, hi = math.log(_SIGMA_FLOOR * s_), math.log(s_)  # power(lo) >= tp > power(hi)
            for _ in range(n_iter):
                mid = 0.5 * (lo + hi)
                if power(math.exp(mid)) >= tp:
                    lo = mid
                else:
                    hi = mid
            min_sig = math.exp(lo)
        if min_sig is not None:
            try:
                min_eps = float(epsilon_of_sigma(min_sig))
            except Exception as e:  # noqa: BLE001 - a power estimate never breaks the audit
                msg = f"epsilon_of_sigma({min_sig:.4g}) failed: {e!r}"
                logger.warning(msg)
                warns.append(msg)
                min_sig = None
    exactness = "approx" if (score == "llr" and mode == "approx" and q_ < 1.0) else "exact"
    res = PowerResult(expected_bound=expected, expected_bound_quantiles=(lo_q, hi_q),
                      min_refutable_epsilon=min_eps, min_refutable_sigma=min_sig, mode=exactness,
                      seconds=time.perf_counter() - t_start, warnings=tuple(warns),
                      no_power=False, note=note, **base)
    logger.info("one-run power: expected bound %.4g, min refutable epsilon %s (%.1f s)",
                expected, min_eps, res.seconds)
    return res
