"""The noise samples' input checks and the low-precision check of the noise monitor
(docs/design.md section 11, "Low-precision noise"), re-exported by :mod:`.noise` (kept apart for
the package's module size limit).

:func:`low_precision_grid` -- is the noise on the bfloat16 or float16 grid? Low-precision noise is
not Gaussian noise: its least significant bits can reveal the value it was added to (Mironov, "On
significance of the least significant bits for differential privacy", CCS 2012). A finding with
an explanation, not a statistical rejection.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .._validation import as_real

logger = logging.getLogger(__name__)

__all__ = ["low_precision_grid"]


def _finite_floats(x: object, name: str, rows: bool) -> np.ndarray:
    """A float64 array of finite values (a cheap check first: one sum): one-dimensional
    (samples), or two-dimensional (steps x samples) when ``rows``."""
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if rows and arr.ndim != 2:
        raise ValueError(f"{name} must be [steps, samples], got shape {arr.shape}")
    if not rows and arr.ndim > 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not rows:
        arr = arr.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        cheap = math.isfinite(float(arr.sum()))
    if not cheap and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (e.g. "
                         f"{arr[~np.isfinite(arr)][:3].tolist()})")
    return arr


def _as_samples(xi: object, name: str = "xi") -> np.ndarray:
    """The samples of one step: a one-dimensional float64 array of finite values."""
    return _finite_floats(xi, name, rows=False)



# ---------------------------------------------------------------------- low-precision noise
#: (fraction bits, smallest normal exponent, largest finite value) of each format
_FORMATS: dict[str, tuple[int, int, float]] = {
    "bfloat16": (7, -126, 3.3895313892515355e38),
    "float16": (10, -14, 65504.0),
}


def _grid_distance(ax: np.ndarray, frac_bits: int, min_exp: int,
                   max_val: float) -> tuple[np.ndarray, np.ndarray]:
    """Distance of |x| to the nearest value of a binary format, and the format's spacing there."""
    _, p = np.frexp(ax)  # ax = m 2^p, m in [0.5, 1)
    e = np.maximum(p.astype(np.int64) - 1, min_exp)  # subnormals share the smallest spacing
    spacing = np.ldexp(1.0, (e - frac_bits).astype(np.int32))
    dist = np.abs(ax - np.rint(ax / spacing) * spacing)
    dist = np.where(ax > max_val, np.inf, dist)  # not representable at all
    return dist, spacing


def low_precision_grid(xi_raw: np.ndarray, reference: np.ndarray | float, *,
                       noise_std: np.ndarray | float | None = None,
                       min_std_fraction: float = 0.1, rel_tol: float = 2.0 ** -21,
                       min_values: int = 200, min_fraction: float = 0.99) -> dict[str, Any]:
    """Does the released noise lie on the bfloat16 or float16 grid?

    ``xi_raw`` are noise values in the gradient's own units (before any division by C or the
    batch size: a scaling moves values off the grid), reconstructed from released float32
    values ``reference`` (broadcastable to ``xi_raw``). The reconstruction error is at most
    ``rel_tol`` x max(|reference|, |xi|) (default 2^-21, four float32 roundings). A value counts
    for a format when it is non-zero, at least ``min_std_fraction`` x ``noise_std`` in absolute
    value, and the format's spacing at it exceeds 100 times that error (otherwise landing on
    the grid by chance is not unlikely); the fraction of counted values within the error of the
    grid is reported. Gaussian float32 noise gives a fraction of about 2 / 100 or less; noise
    drawn in the format gives 1.

    ``noise_std`` is the standard deviation the noise is claimed to have, in the same raw units
    (broadcastable to ``xi_raw``; > 0 where given). Give it whenever it is known: where no noise
    (or far less than claimed) was added, the reconstructed "noise" is only float32 rounding
    leftovers of the gradient, tiny values that sit on any grid near zero (they would read as a
    float16 finding); the magnitude floor excludes them, so the check speaks only about noise at
    the claimed scale (about 92 % of N(0, s^2) values exceed 0.1 s). ``None``: no floor.

    Returns:
        ``{"bfloat16": fraction | None, "float16": fraction | None, "n": number of values,
        "n_eligible_bfloat16": int, "n_eligible_float16": int, "n_below_std_floor": int,
        "finding": "bfloat16" | "float16" | None, "explanation": str | None}``. A finding needs
        at least ``min_values`` counted values with a fraction >= ``min_fraction``; bfloat16
        (the coarser grid, whose values are also float16 values) takes precedence. This is a
        finding, not a statistical rejection: noise with few significant bits is not the
        Gaussian noise the accountant analyses and can leak the value it was added to (Mironov,
        CCS 2012).
    """
    x = _as_samples(np.asarray(xi_raw).reshape(-1), "xi_raw")
    ref = np.abs(np.broadcast_to(np.asarray(reference, dtype=np.float64),
                                 np.shape(xi_raw)).reshape(-1))
    if not np.all(np.isfinite(ref)):
        raise ValueError("reference contains non-finite values")
    tol_r = as_real("rel_tol", rel_tol)
    if not (0.0 <= tol_r < 1.0):
        raise ValueError(f"rel_tol must lie in [0, 1), got {rel_tol!r}")
    frac_std = as_real("min_std_fraction", min_std_fraction)
    if not (0.0 <= frac_std < 10.0):
        raise ValueError(f"min_std_fraction must lie in [0, 10), got {min_std_fraction!r}")
    ax = np.abs(x)
    floor = np.zeros_like(ax)
    if noise_std is not None:
        std = np.broadcast_to(np.asarray(noise_std, dtype=np.float64),
                              np.shape(xi_raw)).reshape(-1)
        bad = ~(np.isfinite(std) & (std > 0))
        if bad.any():
            raise ValueError(f"noise_std must be finite and > 0, got {float(std[bad][0])!r}")
        floor = frac_std * std
    big = ax >= floor
    tol = tol_r * np.maximum(ref, ax)
    out: dict[str, Any] = {"n": int(x.size), "n_below_std_floor": int((~big).sum())}
    for name, (bits, min_exp, max_val) in _FORMATS.items():
        dist, spacing = _grid_distance(ax, bits, min_exp, max_val)
        ok = (ax > 0) & big & (spacing > 100.0 * tol)
        k = int(ok.sum())
        out[name] = float(np.mean(dist[ok] <= tol[ok])) if k else None
        out[f"n_eligible_{name}"] = k
    out["finding"] = None
    out["explanation"] = None
    for name in ("bfloat16", "float16"):
        frac = out[name]
        if out[f"n_eligible_{name}"] >= min_values and frac is not None and frac >= min_fraction:
            out["finding"] = name
            out["explanation"] = (
                f"{100 * frac:.1f}% of {out[f'n_eligible_{name}']} noise values lie on the "
                f"{name} grid: the noise appears to be drawn or stored in {name}, so it has few "
                f"significant bits and is not the Gaussian noise the accountant assumes; its "
                f"low-order bits can reveal the gradient it was added to (Mironov, CCS 2012)"
            )
            logger.info("low-precision noise: %s", out["explanation"])
            break
    return out
