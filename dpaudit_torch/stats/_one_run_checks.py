"""Argument checks shared by the one-run audit modules (docs/design.md section 6).

:mod:`~dpaudit_torch.stats.steinke`, :mod:`~dpaudit_torch.stats.fdp`,
:mod:`~dpaudit_torch.stats.one_run_bounds` and :mod:`~dpaudit_torch.stats.one_run` all take guess
counts (m canaries, r guesses, v correct) and a method name; the checks live here once.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_alpha, check_delta

__all__ = ["METHODS", "GUESSES", "check_int", "check_counts", "check_method"]

#: the one-run tests: Steinke, Nasr & Jagielski (2023) and Mahloujifar, Melis & Chaudhuri (2025)
METHODS = ("steinke", "fdp")
#: one-sided (top scores guessed IN) or two-sided (also bottom scores guessed OUT) guesses
GUESSES = ("one_sided", "two_sided")


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (integral floats such as 1e5 accepted, bools refused)."""
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


def check_counts(m: object, r: object, v: object) -> tuple[int, int, int]:
    """(m, r, v) as ints with m >= 1 and 0 <= v <= r <= m."""
    m_ = check_int("m", m, 1)
    r_ = check_int("r", r, 0)
    v_ = check_int("v", v, 0)
    if r_ > m_:
        raise ValueError(f"r (number of guesses, {r!r}) must be <= m (number of canaries, {m!r})")
    if v_ > r_:
        raise ValueError(f"v (correct guesses, {v!r}) must be <= r (number of guesses, {r!r})")
    return m_, r_, v_


def check_method(method: object) -> str:
    """``method`` if it is one of :data:`METHODS`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return str(method)


def check_fdp_delta(delta: float) -> None:
    """Refuse delta = 0: every mu-GDP mechanism with mu > 0 has eps(0) = inf."""
    if delta <= 0.0:
        raise ValueError(
            f"method='fdp' needs delta > 0 (every mu-GDP mechanism with mu > 0 has eps(0) = inf), "
            f"got delta={delta!r}"
        )


def check_bound_request(method: object, delta: object, alpha: object) -> tuple[str, float, float]:
    """(method, delta, alpha) of a bound request, validated; ``method="fdp"`` needs delta > 0."""
    delta_ = check_delta(delta)
    alpha_ = check_alpha(alpha)
    method_ = check_method(method)
    if method_ == "fdp":
        check_fdp_delta(delta_)
    return method_, delta_, alpha_
