"""One-run test against the Gaussian f-DP family (docs/design.md section 6).

Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025
(arXiv 2410.22235): the recursion of their Algorithm (``audit_rh_with_cap``) for the Gaussian
trade-off curves f_mu(x) = Phi(Phi^-1(1-x) - mu).  It rejects "the run is mu-GDP" and reports
eps(delta) of the largest rejected mu (the GDP-to-(eps, delta) conversion of Dong, Roth & Su 2019,
:func:`~dpaudit_torch.stats.thresholds.gaussian_epsilon`).  It is a test against the Gaussian
(mu-GDP) curve family, NOT a family-free bound: a mechanism that is (eps, delta)-DP but not
Gaussian-shaped (e.g. randomized response) can be reported above its eps
(:data:`FDP_FAMILY_NOTE`).

The names are re-exported by :mod:`dpaudit_torch.stats.one_run`, where users import them.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from scipy import optimize

from .._validation import check_alpha, check_delta
from ._one_run_checks import check_counts, check_fdp_delta
from .thresholds import gaussian_epsilon

__all__ = [
    "FDP_FAMILY_NOTE",
    "check_fdp_delta",
    "fdp_test_statistic",
    "fdp_rejects",
    "fdp_search",
    "fdp_mu_lower_bound",
    "fdp_epsilon_lower_bound",
    "mu_to_eps",
]

#: stated in every f-DP result
FDP_FAMILY_NOTE = "test against the Gaussian (mu-GDP) curve family, not a family-free bound"

_MU_CAP = 1.0e4
_SQRT2 = math.sqrt(2.0)
try:  # CPython's C implementation of Wichura's AS241 (~1e-16 relative), without the wrapper
    from statistics import _normal_dist_inv_cdf as _inv_cdf_raw

    def _INV_CDF(p: float) -> float:
        return _inv_cdf_raw(p, 0.0, 1.0)
except ImportError:  # pragma: no cover - other interpreters
    _INV_CDF = NormalDist().inv_cdf


def _fdp_margin(m: int, n_guess: int, n_correct: int, mu: float, alpha: float,
                early_exit: bool = False) -> float:
    """(r + h) - c'/m at the end of the recursion (docs/design.md section 6); > 0: reject mu.

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
    m_, r_, v_ = check_counts(m, n_guess, n_correct)
    if not (mu >= 0.0) or not math.isfinite(mu):
        raise ValueError(f"mu must be finite and >= 0, got {mu!r}")
    return _fdp_margin(m_, r_, v_, float(mu), check_alpha(alpha))


def fdp_rejects(m: int, n_guess: int, n_correct: int, mu: float, alpha: float = 0.05) -> bool:
    """True iff the one-run f-DP test (Mahloujifar et al. 2025) rejects "the run is mu-GDP"."""
    return fdp_test_statistic(m, n_guess, n_correct, mu, alpha) > 0.0


def fdp_search(m: int, r: int, v: int, alpha: float, mu_lo: float) -> float:
    """Largest mu >= mu_lo the test rejects (mu_lo if it does not reject mu_lo).

    Arguments are not checked (callers pass checked counts); see :func:`fdp_mu_lower_bound`.
    """
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
    m_, r_, v_ = check_counts(m, n_guess, n_correct)
    return fdp_search(m_, r_, v_, check_alpha(alpha), 0.0)


def fdp_epsilon_lower_bound(m: int, n_guess: int, n_correct: int, delta: float,
                            alpha: float = 0.05) -> float:
    """eps(delta) of mu*-GDP, mu* = :func:`fdp_mu_lower_bound` (0.0 if nothing is rejected).

    A lower bound on eps only for mechanisms whose trade-off curve is Gaussian (the test is
    against the mu-GDP family, Mahloujifar et al. 2025), see :data:`FDP_FAMILY_NOTE`.
    """
    delta = check_delta(delta)
    check_fdp_delta(delta)
    return mu_to_eps(fdp_mu_lower_bound(m, n_guess, n_correct, alpha), delta)


def mu_to_eps(mu: float, delta: float) -> float:
    """eps(delta) of mu-GDP (0.0 for mu <= 0, inf for mu = inf; Dong, Roth & Su 2019)."""
    if mu <= 0.0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    return gaussian_epsilon(delta, mu)

