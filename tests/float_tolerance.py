"""Comparing numbers that another machine computes: tolerances derived from the arithmetic.

A stored report (tests/data/*.json) or a stored reference number was computed on one CPU; the
suite runs on others. Floats computed by BLAS, by torch's CPU kernels (AVX512 / AVX2 / scalar
builds, chosen at run time), by libm or NumPy's SIMD transcendentals, or by Numba (LLVM code
generated for the host CPU) differ between machines in their last digits, so the suite never
compares such floats for exact equality. Strings, booleans, integers and None stay exact;
a float ``b`` expected where ``a`` was stored passes when

    |a - b| <= max(rel * max(|a|, |b|), abs)

with ``rel`` and ``abs`` derived from how the number was computed (none tuned to pass):

* unit roundoff ``u``: :data:`U64` = 2^-53 for float64, :data:`U32` = 2^-24 for float32;
* an elementary function (exp, log, erf, a quantile) is within a few ulp of the true value in
  every implementation (glibc, SVML, NumPy's SIMD loops, Sleef: at most 4 ulp);
* a sum of ``n`` terms, each carrying at most ``k`` ulp of error, in any order, is within
  ``(k + n) u kappa`` relative, ``kappa = sum |t_i| / |sum t_i|`` its condition number
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 4.4):
  :func:`sum_rel`;
* where the rounding errors of different summation orders are independent (a kernel's
  blocking of a dot product, a training run's steps), their sum grows like ``sqrt(n) u``, not
  ``n u`` (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J.
  Sci. Comput. 41, 2019): :func:`random_walk_rel`;
* a root found by a solver (``scipy.optimize.brentq(xtol, rtol)``) is within ``xtol + rtol |x|``
  of the true root on every machine, so two machines' roots are within twice that:
  :func:`solver_tol`.

:func:`assert_tree_close` compares nested JSON-like trees (dicts, lists, scalars) under a
default tolerance and per-field ones (shell patterns over the key path, e.g.
``"audits.noise.*log_wealth"``; the first pattern that matches wins); a failure names every
differing key path with both values, their difference and the tolerance that was exceeded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

#: unit roundoff of float64 (half an ulp of 1)
U64 = 2.0 ** -53
#: unit roundoff of float32
U32 = 2.0 ** -24
#: the most ulp an elementary function is off in the implementations the suite meets
LIBM_ULPS = 4.0


def sum_rel(n: int, u: float = U64, condition: float = 1.0, ulps: float = LIBM_ULPS) -> float:
    """Worst-case relative error of a sum of ``n`` terms each computed to ``ulps`` ulp:
    ``(ulps + n) * u * condition`` (Higham, eq. 4.4)."""
    return (ulps + n) * u * condition


def random_walk_rel(n: int, u: float = U64, condition: float = 1.0) -> float:
    """Relative difference of two summation orders of ``n`` rounding errors that are
    independent: ``sqrt(n) * u * condition`` (Higham and Mary, 2019)."""
    return math.sqrt(n) * u * condition


@dataclass(frozen=True)
class Tol:
    """``|a - b| <= max(rel * max(|a|, |b|), abs)``; ``why`` says where the numbers come from."""

    rel: float
    abs: float = 0.0
    why: str = ""

    def allows(self, a: float, b: float) -> bool:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= max(self.rel * max(abs(a), abs(b)), self.abs)

    def scaled(self, factor: float, why: str = "") -> Tol:
        """The tolerance of a quantity ``factor`` times as sensitive (its condition number)."""
        return Tol(self.rel * factor, self.abs * factor, why or self.why)


def solver_tol(xtol: float, rtol: float, why: str = "") -> Tol:
    """Two machines' roots of the same equation by a solver run to (``xtol``, ``rtol``)."""
    return Tol(rel=2.0 * rtol, abs=2.0 * xtol, why=why or f"root solver xtol={xtol} rtol={rtol}")


def _pick(path: str, default: Tol, fields: Mapping[str, Tol]) -> Tol:
    for pattern, tol in fields.items():
        if fnmatchcase(path, pattern):
            return tol
    return default


def _is_float(x: Any) -> bool:
    return isinstance(x, float)


def mismatches(got: Any, expected: Any, default: Tol, fields: Mapping[str, Tol] | None = None,
               path: str = "") -> list[str]:
    """Every place where ``got`` differs from ``expected`` beyond the tolerances, one line each
    naming the key path (``a.b[3].c``; ``<root>`` for the top) and both values."""
    fields = fields or {}
    where = path or "<root>"
    if isinstance(expected, Mapping) and isinstance(got, Mapping):
        out = []
        for k in sorted(set(expected) - set(got), key=str):
            out.append(f"{path}.{k}".lstrip(".") + f": missing (expected {expected[k]!r})")
        for k in sorted(set(got) - set(expected), key=str):
            out.append(f"{path}.{k}".lstrip(".") + f": unexpected (got {got[k]!r})")
        for k in sorted(set(got) & set(expected), key=str):
            out += mismatches(got[k], expected[k], default, fields, f"{path}.{k}".lstrip("."))
        return out
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        if len(got) != len(expected):
            return [f"{where}: length {len(got)} != expected {len(expected)}"]
        out = []
        for i, (g, e) in enumerate(zip(got, expected)):
            out += mismatches(g, e, default, fields, f"{path}[{i}]")
        return out
    if _is_float(expected) and _is_float(got):
        tol = _pick(path, default, fields)
        if tol.allows(got, expected):
            return []
        return [f"{where}: got {got!r}, expected {expected!r} (difference {abs(got - expected):.3g}"
                f", relative {abs(got - expected) / max(abs(got), abs(expected)):.3g}; allowed "
                f"rel {tol.rel:.3g}, abs {tol.abs:.3g}{': ' + tol.why if tol.why else ''})"]
    # strings, booleans, integers, None, and type changes (1 vs 1.0, True vs 1): exact
    if type(got) is not type(expected) or got != expected:
        return [f"{where}: got {got!r}, expected {expected!r}"]
    return []


def assert_tree_close(got: Any, expected: Any, default: Tol,
                      fields: Mapping[str, Tol] | None = None) -> None:
    """Assert ``got`` equals ``expected`` (strings, booleans, integers, None exactly; floats
    within the tolerance of their field); the message lists every mismatch by key path."""
    bad = mismatches(got, expected, default, fields)
    assert not bad, f"{len(bad)} mismatch(es):\n" + "\n".join(bad[:40])
