"""Argument checks shared by every public entry point.

Each check raises ``ValueError`` (bad value) or ``TypeError`` (bad type) with a message that
echoes the offending value, so that a mistake never turns into a silently wrong statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np
import torch

__all__ = [
    "as_real",
    "check_alpha",
    "check_delta",
    "check_epsilon",
    "check_epsilons",
    "check_deltas",
    "check_positive_int",
    "check_finite_tensor",
]


def as_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_alpha(alpha: object, name: str = "alpha") -> float:
    """Significance level: a real number in the open interval (0, 1)."""
    a = as_real(name, alpha)
    if not (0.0 < a < 1.0) or math.isnan(a):
        raise ValueError(f"{name} must lie in (0, 1), got {alpha!r}")
    return a


def check_delta(delta: object, name: str = "delta") -> float:
    """DP delta: a real number in [0, 1)."""
    d = as_real(name, delta)
    if not (0.0 <= d < 1.0) or math.isnan(d):
        raise ValueError(f"{name} must lie in [0, 1), got {delta!r}")
    return d


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """DP epsilon: a finite real number > 0."""
    e = as_real(name, epsilon)
    if not (e > 0.0) or not math.isfinite(e):
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return e


def _as_list(value: object) -> list[object] | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().reshape(-1).tolist() if value.ndim > 0 else None
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist() if value.ndim > 0 else None
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    return None


def check_epsilons(epsilons: object, name: str = "epsilons") -> np.ndarray:
    """A float or a non-empty sequence of epsilons, each finite and > 0 -> float64 array [G]."""
    items = _as_list(epsilons)
    if items is None:
        return np.array([check_epsilon(epsilons, name)], dtype=np.float64)
    if len(items) == 0:
        raise ValueError(f"{name} must not be empty, got {epsilons!r}")
    return np.array(
        [check_epsilon(e, f"{name}[{i}]") for i, e in enumerate(items)], dtype=np.float64
    )


def check_deltas(delta: object, size: int, name: str = "delta") -> np.ndarray:
    """A scalar delta (broadcast to ``size``) or a sequence of ``size`` deltas in [0, 1)."""
    items = _as_list(delta)
    if items is None:
        return np.full(size, check_delta(delta, name), dtype=np.float64)
    if len(items) != size:
        raise ValueError(
            f"{name} has {len(items)} entries but there are {size} epsilons; "
            f"give one delta or one per epsilon (got {delta!r})"
        )
    return np.array([check_delta(d, f"{name}[{i}]") for i, d in enumerate(items)], np.float64)


def check_positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return v


def check_finite_tensor(t: torch.Tensor, name: str) -> None:
    """Raise ValueError if ``t`` holds NaN or +-inf (one host synchronisation; a CPU tensor of
    a NumPy dtype is checked in NumPy, cheaper per call)."""
    host = t.device.type == "cpu" and t.dtype in (torch.float64, torch.float32) and \
        not t.requires_grad
    if bool(np.isfinite(t.numpy()).all()) if host else bool(torch.isfinite(t).all()):
        return
    bad = t[~torch.isfinite(t)].reshape(-1)[:3].tolist()
    raise ValueError(f"{name} contains non-finite values (e.g. {bad}); refusing to test them")
