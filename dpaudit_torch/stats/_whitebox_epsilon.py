"""The DP-SGD privacy profile the white-box bound converts with (docs/design.md section 13):
the PRV accountant's epsilon of the Poisson-subsampled Gaussian mechanism at a noise
multiplier, with its error bounds, and the smallest multiplier its grid can resolve; an RDP
epsilon sizes the grid. Imported by :mod:`dpaudit_torch.stats.whitebox`, which re-exports
:func:`dpsgd_epsilon` and :func:`smallest_sigma`."""

from __future__ import annotations

import functools
import math
import warnings

from .._validation import check_delta

__all__ = ["dpsgd_epsilon", "smallest_sigma", "PRV_EPS_ERROR", "PRV_MAX_POINTS"]

#: PRV discretisation: eps error, and the largest mesh (points) computed at finalize
PRV_EPS_ERROR = 0.01
PRV_MAX_POINTS = 1_000_000


_INT_ORDERS = [float(a) for a in (*range(2, 33), 40, 48, 64, 96, 128, 256)]


def _rdp_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    from opacus.accountants.analysis import rdp as rdp_analysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rdp = rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps,
                                       orders=_INT_ORDERS)
        eps, _ = rdp_analysis.get_privacy_spent(orders=_INT_ORDERS, rdp=rdp, delta=delta)
    return float(eps)


def _prv_domain(sigma: float, q: float, steps: int, delta: float) -> tuple[float, float]:
    """(L, mesh) of the PRV discretisation of Gopi, Lee & Wutschitz (NeurIPS 2021, remark 5.6),
    as Opacus's PRV accountant computes it, with the tail bound over integer RDP orders."""
    d_err = delta / 1000
    big = max(_rdp_epsilon(sigma, q, steps, d_err / 4),
              _rdp_epsilon(sigma, q, 1, d_err / (8 * steps)))
    length = max(big, PRV_EPS_ERROR) + 3
    mesh = PRV_EPS_ERROR / math.sqrt(steps * math.log(12 / d_err) / 2)
    return length, mesh


def _prv_points(sigma: float, q: float, steps: int, delta: float) -> int:
    length, mesh = _prv_domain(sigma, q, steps, delta)
    return int(2 * length / mesh) + 1


@functools.lru_cache(maxsize=256)
def smallest_sigma(q: float, steps: int, delta: float) -> float:
    """The smallest noise multiplier whose PRV epsilon the bound computes (its mesh at most
    :data:`PRV_MAX_POINTS` points): below it the bound uses this one (a smaller epsilon, so still a
    lower bound), and the white-box ceiling is its epsilon."""
    # doubling from 1, then bisection in log sigma to a factor 2^(1/8): a few mesh sizes
    lo, hi = 0.5, 1.0
    if _prv_points(hi, q, steps, delta) > PRV_MAX_POINTS:
        while _prv_points(hi, q, steps, delta) > PRV_MAX_POINTS:
            lo, hi = hi, hi * 2.0
    else:
        while _prv_points(lo, q, steps, delta) <= PRV_MAX_POINTS:
            if lo < 1e-3:
                return lo
            lo, hi = lo / 2.0, lo
    for _ in range(3):
        mid = math.sqrt(lo * hi)
        if _prv_points(mid, q, steps, delta) > PRV_MAX_POINTS:
            lo = mid
        else:
            hi = mid
    return hi


@functools.lru_cache(maxsize=512)
def dpsgd_epsilon(sigma: float, q: float, steps: int, delta: float, which: str = "lower"
                  ) -> float:
    """epsilon(delta) of DP-SGD (Poisson-subsampled Gaussian, rate q, ``steps`` steps, noise
    multiplier ``sigma``) by Opacus's PRV accountant: ``which`` = "lower" / "estimate" / "upper"
    end of its error interval (eps error 0.01, delta error delta / 1000).  A noise multiplier
    below :func:`smallest_sigma` is raised to it ("lower" stays a lower bound).  inf for
    sigma = 0."""
    check_delta(delta)
    if not (sigma >= 0) or not math.isfinite(sigma):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    if which not in ("lower", "estimate", "upper"):
        raise ValueError(f"which must be 'lower', 'estimate' or 'upper', got {which!r}")
    if steps < 1 or q <= 0:
        return 0.0
    s_min = smallest_sigma(float(q), int(steps), float(delta))
    if sigma < s_min:
        if which != "lower":
            return math.inf
        sigma = s_min
    from opacus.accountants.analysis.prv import (
        Domain,
        PoissonSubsampledGaussianPRV,
        TruncatedPrivacyRandomVariable,
        compose_heterogeneous,
        discretize,
    )

    length, mesh = _prv_domain(float(sigma), float(q), int(steps), float(delta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        domain = Domain.create_aligned(-length, length, mesh)
        prv = PoissonSubsampledGaussianPRV(float(q), float(sigma))
        tprv = TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max)
        dprv = compose_heterogeneous(dprvs=[discretize(tprv, domain)],
                                     num_self_compositions=[int(steps)])
        lo, est, up = dprv.compute_epsilon(delta, delta / 1000, PRV_EPS_ERROR)
    val = {"lower": lo, "estimate": est, "upper": up}[which]
    return max(0.0, float(val))
