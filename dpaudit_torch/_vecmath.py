"""Element-wise exp / log1p of float64 host arrays, in place, by the faster library.

The auditor's host arithmetic (the one-run likelihood-ratio scores, the kernel matrices of the
MMD witness, the log-mean-exp of the betting wealth) spends most of its time in exponentials and
logarithms of a few thousand float64 numbers. Which library evaluates them fastest depends on
the CPU: NumPy vectorises float64 ``exp`` / ``log`` with AVX-512 only, and evaluates them one
number at a time elsewhere; PyTorch's CPU kernels (SLEEF) vectorise them with AVX2 as well
(measured on an AVX2-only machine, 5,000 numbers: ``exp`` 12 us against NumPy's 50 us,
``log1p`` 30 us against 61 us; docs/benchmarks.md, "Overhead of the auditor").

These functions write into the array they are given (a NumPy array, float64, any layout) and
return it. They pick PyTorch when NumPy has no AVX-512 float64 loops on this CPU and the array is
large enough for the call's fixed cost to pay; both libraries are accurate to about one unit in
the last place, so the choice changes results only in their last bits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["exp_", "log1p_", "uses_torch"]

#: below this many elements NumPy wins: its first call after a training step costs about 35 us
#: with cold caches, PyTorch's about 100 us (measured), which only large arrays pay back
_TORCH_FROM = 1 << 14


def _numpy_has_avx512() -> bool:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # pragma: no cover - NumPy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as feats
        except ImportError:
            return False
    return bool(feats.get("AVX512F", False)) and bool(feats.get("AVX512_SKX", False))


#: whether large float64 arrays go to PyTorch's kernels on this CPU
uses_torch: bool = not _numpy_has_avx512()


def _torch_view(a: np.ndarray) -> torch.Tensor | None:
    if not uses_torch or a.size < _TORCH_FROM or a.dtype != np.float64 or not (
            a.flags.writeable and a.flags.c_contiguous):
        return None
    return torch.from_numpy(a)


def _in_place(a: np.ndarray, numpy_fn: Callable[..., np.ndarray], torch_name: str
              ) -> np.ndarray:
    t = _torch_view(a)
    if t is None:
        return numpy_fn(a, out=a)
    getattr(t, torch_name)()
    return a


def exp_(a: np.ndarray) -> np.ndarray:
    """``a = exp(a)`` in place; returns ``a``."""
    return _in_place(a, np.exp, "exp_")


def log1p_(a: np.ndarray) -> np.ndarray:
    """``a = log1p(a)`` in place; returns ``a``."""
    return _in_place(a, np.log1p, "log1p_")
