"""Thresholds and privacy profiles used as null hypotheses.

* :func:`mmd_tau` -- the MMD bound of Gonzalez, Dulce-Rubio, Ramdas & Ribero (NeurIPS 2025,
  arXiv 2509.07055, Theorem 3.1): an (eps, delta)-DP mechanism has, in any Gaussian-kernel RKHS,
  MMD(P, Q) <= sqrt(2) (1 - 2 (1 - delta) / (1 + e^eps)).  (The authors' notebook multiplies this by
  a further sqrt(2); we implement the paper's value, see docs/design.md section 2.)
* :func:`gaussian_delta` / :func:`gaussian_epsilon` -- the exact privacy profile of the Gaussian
  mechanism with sensitivity 1 and noise sigma (mu-GDP with mu = 1 / sigma; Balle & Wang, ICML 2018;
  Dong, Roth & Su 2019):  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from .._validation import as_real, check_delta, check_deltas

__all__ = ["mmd_tau", "gaussian_delta", "gaussian_epsilon", "gaussian_profile_grid"]


def _check_mu(mu: object) -> float:
    m = as_real("mu", mu)
    if not (m > 0) or not math.isfinite(m):
        raise ValueError(f"mu must be a finite number > 0, got {mu!r}")
    return m


def _check_profile_epsilons(epsilon: object) -> np.ndarray:
    """eps >= 0 and finite (eps = 0 is allowed here: delta(0) is the total variation)."""
    e = np.asarray(epsilon, dtype=np.float64)
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return e


def mmd_tau(epsilon: np.ndarray | float, delta: np.ndarray | float) -> np.ndarray:
    """Theorem 3.1 of Gonzalez et al. (2025): the largest MMD an (eps, delta)-DP pair can have.

    ``epsilon`` (each finite, >= 0) and ``delta`` (each in [0, 1)) broadcast against each other.
    """
    e = _check_profile_epsilons(epsilon)
    d = np.asarray(delta, dtype=np.float64)
    check_deltas(d.reshape(-1) if d.ndim else float(d), d.size, "delta")
    # 2 / (1 + e^eps) written with expit for stability at large eps
    return math.sqrt(2.0) * (1.0 - 2.0 * (1.0 - d) * special.expit(-e))


def gaussian_delta(epsilon: np.ndarray | float, mu: float) -> np.ndarray:
    """delta(eps) of mu-GDP (the Gaussian mechanism with sensitivity/noise ratio mu).

    Computed as Phi(a) - exp(eps + log Phi(b)) with log_ndtr, stable for eps up to ~700.
    """
    mu = _check_mu(mu)
    e = _check_profile_epsilons(epsilon)
    a = -e / mu + mu / 2.0
    b = -e / mu - mu / 2.0
    val = special.ndtr(a) - np.exp(e + special.log_ndtr(b))
    return np.clip(val, 0.0, 1.0)


def gaussian_epsilon(delta: float, mu: float) -> float:
    """The smallest eps >= 0 with delta_mu(eps) <= delta (mu-GDP converted to (eps, delta))."""
    delta = check_delta(delta)
    mu = _check_mu(mu)
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    if delta == 0.0:
        return math.inf
    hi = 1.0
    while gaussian_delta(hi, mu) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    return float(optimize.brentq(lambda e: float(gaussian_delta(e, mu)) - delta, 0.0, hi,
                                 xtol=1e-12, rtol=1e-12, maxiter=500))


def gaussian_profile_grid(sigma: float, epsilons: np.ndarray | list[float]) -> np.ndarray:
    """deltas of the per-step Gaussian null (noise multiplier ``sigma``) at the given epsilons."""
    s = as_real("sigma", sigma)
    if not (s > 0) or not math.isfinite(s):
        raise ValueError(f"noise multiplier must be a finite number > 0, got {sigma!r}")
    return gaussian_delta(np.asarray(epsilons, dtype=np.float64), 1.0 / s)
