"""The true epsilon of a subsampled additive-noise release, by numerical composition of its
privacy-loss distribution: an independent check of the white-box bound outside the Gaussian
DP-SGD family (docs/design.md section 13, "What the bound proves").

A release of one canary coordinate per step is Z = c B + N with B ~ Bernoulli(q) (the canary's
inclusion) and N noise of a given law. One step compares P = (1 - q) f + q f(. - c) (the
canary present) with Q = f (absent). The privacy-loss distribution (PLD) of the pair is the law
of L = log(dP / dQ) under P; the T-fold composition is the law of the sum of T independent
copies, and

    delta(eps) = E_P[(1 - exp(eps - L))_+] + P(L = +inf)

(Meiser & Mohammadi, CCS 2018; Koskela, Jalko & Honkela, AISTATS 2020; Gopi, Lee & Wutschitz,
NeurIPS 2021). Both neighbouring directions are composed (P against Q, and Q against P) and the
larger epsilon is the release's.

The output is cut into cells whose exact masses come from the noise's CDF. A cut release is a
post-processing of the release, so its PLD is dominated by the release's: with the losses
rounded *down* onto the composition grid and the mass outside the cells dropped, the computed
epsilon is a lower bound on the true epsilon (``lower``); rounding up and putting the mass
outside the cells at +inf gives the matching upper estimate for the same cells (``upper``; at a
fine cut the two differ by the grid's rounding, T h at most). The benchmark counts a bound above
``lower`` as an exceedance, so the count can only be too high.

Steps correlated in pairs (Gaussian noise of correlation r between steps 2k and 2k + 1) are one
two-dimensional release per pair of steps: (Z1, Z2) = c (B1, B2) + sigma (N1, r N1 +
sqrt(1 - r^2) N3), with N1, N3 independent; cells are products of cells of N1 and N3, whose
masses are exact under every (B1, B2). At q = 1 it is the Gaussian mechanism with
mu^2 = (T / 2) c^2 1' Sigma^-1 1 / sigma^2 = T c^2 / (sigma^2 (1 + r)) (Balle & Wang, ICML
2018), which the tests check it against.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from ..stats.whitebox import flat_laplace_shape

logger = logging.getLogger(__name__)

__all__ = ["PLDEpsilon", "noise_cdf", "release_epsilon", "pair_correlated_epsilon",
           "gaussian_mechanism_epsilon"]

#: the composition grid of the privacy loss
LOSS_GRID = 2e-4


@dataclass(frozen=True)
class PLDEpsilon:
    """eps(delta) of a composed release: ``lower`` (a lower bound), ``upper`` (the same cells'
    upper estimate)."""

    lower: float
    upper: float


def noise_cdf(noise: str) -> Callable[[np.ndarray], np.ndarray]:
    """The CDF of unit-variance noise: "gaussian", "laplace" or "flat_laplace"
    (:func:`~dpaudit_torch.stats.whitebox.flat_laplace_shape`)."""
    if noise == "gaussian":
        return special.ndtr
    if noise == "laplace":
        b = 1.0 / math.sqrt(2.0)
        return lambda x: stats.laplace.cdf(x, scale=b)
    if noise == "flat_laplace":
        a, b = flat_laplace_shape()
        h = 1.0 / (2.0 * (a + b))

        def cdf(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x, dtype=np.float64)
            ax = np.abs(x)
            upper = np.where(ax <= a, 0.5 + h * ax, 1.0 - h * b * np.exp(-(ax - a) / b))
            return np.where(x >= 0, upper, 1.0 - upper)

        return cdf
    raise ValueError(f"unknown noise {noise!r}; one of 'gaussian', 'laplace', 'flat_laplace'")


def _losses(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cells with mass under both laws: (loss log(p / q), p, q)."""
    keep = (p > 0) & (q > 0)
    return np.log(p[keep]) - np.log(q[keep]), p[keep], q[keep]


def _composed_delta(loss: np.ndarray, mass: np.ndarray, lost: float, steps: int,
                    up: bool) -> Callable[[float], float]:
    """delta(eps) of ``steps`` copies of the PLD (losses ``loss`` with masses ``mass``; ``lost``
    mass at +inf when ``up``, dropped otherwise) on the grid LOSS_GRID, rounded up or down."""
    k = np.ceil(loss / LOSS_GRID) if up else np.floor(loss / LOSS_GRID)
    k = k.astype(np.int64)
    k0 = int(k.min())
    pmf = np.bincount(k - k0, weights=mass)
    size = steps * (pmf.size - 1) + 1
    n_fft = 1 << int(math.ceil(math.log2(size)))
    spec = np.fft.rfft(pmf, n_fft)
    comp = np.fft.irfft(spec ** steps, n_fft)[:size]
    np.clip(comp, 0.0, None, out=comp)
    grid = (np.arange(size) + steps * k0) * LOSS_GRID
    inf_mass = (1.0 - (1.0 - lost) ** steps) if up else 0.0
    keep = comp > 0
    grid, comp = grid[keep], comp[keep]

    def delta(eps: float) -> float:
        j = int(np.searchsorted(grid, eps, side="right"))  # cells with loss > eps
        return float(np.sum(comp[j:] * -np.expm1(eps - grid[j:]))) + inf_mass

    return delta


def _epsilon(delta_fn: Callable[[float], float], delta: float, top: float) -> float:
    if delta_fn(0.0) <= delta:
        return 0.0
    hi = max(top, 1.0)
    while delta_fn(hi) > delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(optimize.brentq(lambda e: delta_fn(e) - delta, 0.0, hi, xtol=1e-6))


def _pld_epsilon(p: np.ndarray, q: np.ndarray, steps: int, delta: float) -> PLDEpsilon:
    """eps(delta) of ``steps`` compositions of the pair (cells with masses ``p`` and ``q``),
    both directions."""
    out = []
    for up in (False, True):
        eps = 0.0
        for a, b in ((p, q), (q, p)):
            loss, pa, _ = _losses(a, b)
            lost = max(0.0, 1.0 - float(pa.sum()))
            fn = _composed_delta(loss, pa, lost, steps, up)
            eps = max(eps, _epsilon(fn, delta, float(steps * max(loss.max(), 0.0))))
        out.append(eps)
    return PLDEpsilon(out[0], out[1])


def release_epsilon(noise: str, sigma: float, q: float, steps: int, delta: float, *,
                    c: float = 1.0, cell: float = 1e-3, width: float = 40.0) -> PLDEpsilon:
    """eps(delta) of the Poisson-subsampled release c B + sigma N over ``steps`` steps, N of
    unit variance and law ``noise`` (:func:`noise_cdf`); cells of ``cell`` sigma over
    [-width sigma, c + width sigma]."""
    if not (sigma > 0 and 0 < q <= 1 and steps >= 1 and 0 < delta < 1):
        raise ValueError(f"no release for sigma={sigma!r}, q={q!r}, steps={steps!r}, "
                         f"delta={delta!r}")
    cdf = noise_cdf(noise)
    edges = np.arange(-width * sigma, c + width * sigma + cell * sigma, cell * sigma)
    f0 = np.diff(cdf(edges / sigma))
    f1 = np.diff(cdf((edges - c) / sigma))
    p = (1.0 - q) * f0 + q * f1
    res = _pld_epsilon(p, f0, steps, delta)
    logger.debug("release_epsilon(%s, sigma=%g, q=%g, T=%d): %s", noise, sigma, q, steps, res)
    return res


def pair_correlated_epsilon(sigma: float, r: float, q: float, steps: int, delta: float, *,
                            c: float = 1.0, cell: float = 0.02, width: float = 9.0
                            ) -> PLDEpsilon:
    """eps(delta) of the subsampled Gaussian release whose steps 2k and 2k + 1 have noise
    correlation ``r`` (``steps`` even: steps / 2 independent pairs); product cells of ``cell``
    in the independent coordinates N1, N3 (module docstring)."""
    if steps % 2 or not (-1 < r < 1) or not sigma > 0 or not (0 < q <= 1):
        raise ValueError(f"no paired release for sigma={sigma!r}, r={r!r}, q={q!r}, "
                         f"steps={steps!r} (steps must be even, |r| < 1)")
    s = math.sqrt(1.0 - r * r)
    shifts = {(b1, b2): (c * b1 / sigma, c * (b2 - r * b1) / (sigma * s))
              for b1 in (0, 1) for b2 in (0, 1)}
    lo1 = -width + min(v[0] for v in shifts.values())
    hi1 = width + max(v[0] for v in shifts.values())
    lo3 = -width + min(v[1] for v in shifts.values())
    hi3 = width + max(v[1] for v in shifts.values())
    e1 = np.arange(lo1, hi1 + cell, cell)
    e3 = np.arange(lo3, hi3 + cell, cell)
    q0 = np.outer(np.diff(special.ndtr(e1)), np.diff(special.ndtr(e3)))
    p = np.zeros_like(q0)
    for (b1, b2), (s1, s3) in shifts.items():
        w = (q if b1 else 1.0 - q) * (q if b2 else 1.0 - q)
        p += w * np.outer(np.diff(special.ndtr(e1 - s1)), np.diff(special.ndtr(e3 - s3)))
    return _pld_epsilon(p.ravel(), q0.ravel(), steps // 2, delta)


def gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """eps(delta) of the Gaussian mechanism with sensitivity / sigma = mu (Balle & Wang, ICML
    2018): delta(eps) = Phi(-eps / mu + mu / 2) - exp(eps) Phi(-eps / mu - mu / 2)."""
    def d(eps: float) -> float:
        return float(special.ndtr(-eps / mu + mu / 2)
                     - math.exp(eps) * special.ndtr(-eps / mu - mu / 2)) - delta

    if d(0.0) <= 0:
        return 0.0
    hi = 1.0
    while d(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(d, 0.0, hi, xtol=1e-10))
