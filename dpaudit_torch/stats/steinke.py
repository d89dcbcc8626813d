"""One-run p-value and epsilon lower bound of Steinke, Nasr & Jagielski (docs/design.md section 6).

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023
(arXiv 2305.08846), Theorem 3.1 / Proposition 5.2.  m canaries each carry a uniform secret bit;
the auditor makes r guesses, v of them right.  With q = e^eps / (1 + e^eps), B ~ Binomial(r, q):
p = min(1, P[B >= v] + 2 m delta max_{i=1..v} (1/i) P[v-i <= B < v]).  The bound is the largest
eps whose p-value is below alpha.  Family-free: it holds for every (eps, delta)-DP mechanism.

The names are re-exported by :mod:`dpaudit_torch.stats.one_run`, where users import them.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from .._validation import check_alpha, check_delta
from ._one_run_checks import check_counts

__all__ = ["steinke_p_value", "steinke_epsilon_lower_bound", "steinke_search"]

_EPS_CAP = 1.0e4  # bracket doubling never needs more (p -> 1 as eps grows whenever v <= r)


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
    Proposition 5.2 (docs/design.md section 6)::

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
        m_, r_, v_ = check_counts(arrs[0][idx].item(), arrs[1][idx].item(), arrs[2][idx].item())
        e = float(arrs[3][idx])
        if not (e >= 0.0) or not math.isfinite(e):
            raise ValueError(f"epsilon must be finite and >= 0, got {e!r}")
        out[idx] = _steinke_p(m_, r_, v_, e, delta)
    return float(out) if out.ndim == 0 else out


def steinke_search(m: int, r: int, v: int, delta: float, alpha: float, eps_lo: float) -> float:
    """Largest eps >= eps_lo with p(eps) < alpha; eps_lo itself if p(eps_lo) >= alpha.

    Arguments are not checked (callers pass checked counts); the search starts at ``eps_lo`` so
    that a best-over-candidates search can skip everything below the best bound found so far.
    """
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

    Bracket doubling from [0, 1] until p(eps_hi) >= alpha, then Brent's method (docs/design.md
    section 6).
    Reference values: (m, r, v, delta) = (1000, 100, 75, 1e-4) -> 0.673 and
    (1e5, 1510, 1439, 1e-5) -> 2.675 at alpha = 0.05.
    """
    m_, r_, v_ = check_counts(m, r, v)
    return steinke_search(m_, r_, v_, check_delta(delta), check_alpha(alpha), 0.0)

