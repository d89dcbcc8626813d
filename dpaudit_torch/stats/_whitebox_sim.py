"""Simulated white-box releases of DP-SGD and of mechanisms outside its family, for the tests,
the benchmarks and the power checks of :mod:`dpaudit_torch.stats.whitebox` (importable from
there; docs/design.md section 13, docs/benchmarks.md "one_run_whitebox")."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize

__all__ = ["simulate_release", "simulate_sums", "flat_laplace_shape", "NOISES"]


def flat_laplace_shape() -> tuple[float, float]:
    """(a, b) of the unit-variance noise with kurtosis exactly 3 made of a flat centre and
    Laplace tails: density h on [-a, a] and h exp(-(|x| - a) / b) beyond, h = 1 / (2 (a + b)).
    Its variance and fourth moment equal the standard normal's, so a kurtosis test cannot tell
    them apart; it is more private than the Gaussian at a large signal (its tails are
    exponential).  Solved once: the kurtosis is 1.8 at b = 0 (uniform) and 6 at a = 0
    (Laplace)."""
    return _flat_laplace()


@functools.lru_cache(maxsize=1)
def _flat_laplace() -> tuple[float, float]:
    def moments(a: float, b: float) -> tuple[float, float]:
        h = 1.0 / (2.0 * (a + b))
        m2 = 2 * h * (a ** 3 / 3 + b * (a * a + 2 * a * b + 2 * b * b))
        m4 = 2 * h * (a ** 5 / 5 + b * (a ** 4 + 4 * a ** 3 * b + 12 * a * a * b * b
                                        + 24 * a * b ** 3 + 24 * b ** 4))
        return m2, m4

    def excess(t: float) -> float:  # a / b = t, b = 1
        m2, m4 = moments(t, 1.0)
        return m4 / (m2 * m2) - 3.0

    t = float(optimize.brentq(excess, 1e-6, 1e3, xtol=1e-14, rtol=1e-15))
    m2, _ = moments(t, 1.0)
    b = 1.0 / math.sqrt(m2)
    return t * b, b


def _flat_laplace_draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    a, b = _flat_laplace()
    centre = rng.random(shape) < a / (a + b)
    mag = np.where(centre, rng.random(shape) * a, a + rng.exponential(b, shape))
    return np.where(rng.random(shape) < 0.5, -mag, mag)


#: the noises :func:`simulate_release` draws
NOISES = ("gaussian", "laplace", "uniform", "antithetic", "flat_laplace", "pair_correlated")


def simulate_release(sigma: float, q: float, steps: int, m: int, rng: np.random.Generator, *,
                     noise: str = "gaussian", c: float | np.ndarray = 1.0,
                     chunk: int = 64, pair_r: float = -0.2, keep_values: bool = False
                     ) -> tuple[np.ndarray, ...]:
    """One white-box release of m canaries over ``steps`` steps, step by step: (is_in, sums,
    sums of Z^2, sums of Z^4), and with ``keep_values`` the per-step values [steps, m]
    (float32, as the one-run monitor keeps them).  ``noise`` (standard deviation ``sigma``):
    "gaussian", "laplace", "uniform", "flat_laplace" (:func:`flat_laplace_shape`: kurtosis 3),
    "antithetic" (Gaussian noise whose consecutive steps cancel: step 2k+1 repeats step 2k's
    noise negated) or "pair_correlated" (Gaussian, steps 2k and 2k+1 with correlation
    ``pair_r``); ``c``: the canary's contribution, a number or one per step."""
    if noise not in NOISES:
        raise ValueError(f"unknown noise {noise!r}; one of {NOISES}")
    if chunk % 2:
        raise ValueError(f"chunk must be even (steps are paired), got {chunk!r}")
    is_in = rng.random(m) < 0.5
    sums, sq, q4 = np.zeros(m), np.zeros(m), np.zeros(m)
    vals = np.empty((steps, m), dtype=np.float32) if keep_values else None
    cs = np.broadcast_to(np.asarray(c, dtype=np.float64), (steps,))
    for t0 in range(0, steps, chunk):
        n = min(chunk, steps - t0)
        if noise in ("gaussian", "antithetic", "pair_correlated"):
            e = rng.standard_normal((n, m)) * sigma
        elif noise == "laplace":
            e = rng.laplace(0.0, sigma / math.sqrt(2.0), (n, m))
        elif noise == "uniform":
            e = rng.uniform(-math.sqrt(3.0) * sigma, math.sqrt(3.0) * sigma, (n, m))
        else:
            e = _flat_laplace_draw(rng, (n, m)) * sigma
        if noise == "antithetic":
            e[1::2] = -e[0:n - n % 2:2]
        elif noise == "pair_correlated":
            e[1::2] = pair_r * e[0:n - n % 2:2] + math.sqrt(1.0 - pair_r ** 2) * e[1::2]
        present = (rng.random((n, m)) < q) & is_in[None, :]
        z = present * cs[t0:t0 + n, None] + e
        if vals is not None:
            vals[t0:t0 + n] = z
        sums += z.sum(0)
        z2 = z * z
        sq += z2.sum(0)
        q4 += (z2 * z2).sum(0)
    if vals is not None:
        return is_in, sums, sq, q4, vals
    return is_in, sums, sq, q4


def simulate_sums(sigma: float, q: float, steps: int, m: int, rng: np.random.Generator,
                  c: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The canaries' sums of a Gaussian release, exactly and without per-step values:
    c Binomial(T, q) S + N(0, T sigma^2): (is_in, sums)."""
    is_in = rng.random(m) < 0.5
    k = rng.binomial(steps, q, size=m) * is_in
    return is_in, c * k + rng.standard_normal(m) * sigma * math.sqrt(steps)
