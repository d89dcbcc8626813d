"""Which implementation the host kernels run: Numba's compiled code, or their Python source.

The package's host kernels (``stats/_kernels.py``, ``opacus_tap/_step_kernels.py``) are written
once, in the subset of Python that Numba compiles. :func:`kernel` wraps each in a
:class:`Kernel`, which compiles it with Numba at its first compiled call (or when
:func:`dpaudit_torch._warmup.warm_up` prepares it) and, while the process is in Python mode
(:func:`set_compiled`), runs the Python source itself. In Python mode Numba is never imported:
its LLVM libraries and the loaded machine code (about 100 MB of resident memory, measured in
docs/benchmarks.md, "The auditor at scale") stay out of the process. This module imports
nothing heavy; importing it does not load Numba.

The same source runs either way, so both give the same numbers up to the last bits of
transcendental functions. The auditor picks the mode from the model's size
(:data:`COMPILED_BELOW`, ``AuditConfig.compiled_kernels``): compiled code is what keeps a small
model's per-step overhead small, and a large model's steps are long enough that the slower
paths cost a fraction of a percent while the fixed memory is better spent on training. The
choice is process-wide (it only selects an implementation, never a result); an auditor sets it
while attached and puts the previous mode back at ``detach()`` / ``finalize()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Kernel", "kernel", "compiled", "set_compiled", "COMPILED_BELOW"]

#: the auditor compiles its kernels (Numba) for models with fewer trainable coordinates than
#: this, and runs them as Python (Numba never imported) from this size on, unless
#: ``AuditConfig.compiled_kernels`` says otherwise
COMPILED_BELOW = 1 << 25

_STATE = {"compiled": True}


def compiled() -> bool:
    """Whether the kernels run as Numba-compiled code in this process (the default)."""
    return _STATE["compiled"]


def set_compiled(flag: bool) -> None:
    """Run the kernels compiled by Numba (True) or as their Python source (False)."""
    if not isinstance(flag, bool):
        raise TypeError(f"compiled must be a bool, got {flag!r}")
    _STATE["compiled"] = flag


class Kernel:
    """One host kernel: its Python source (:attr:`py_func`) and, made at the first compiled
    use, its Numba dispatcher (:meth:`dispatcher`)."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func = fn
        self.options = options
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._disp: Any = None

    def dispatcher(self) -> Any:
        """The Numba dispatcher (imports Numba and sets up its cache on the first call)."""
        if self._disp is None:
            from ._numba import njit_kernel

            self._disp = njit_kernel(self.py_func, self.options)
        return self._disp

    def compile(self, signature: Any) -> Any:
        """Compile (or load from the cache) for one signature."""
        return self.dispatcher().compile(signature)

    def __call__(self, *args: Any) -> Any:
        if _STATE["compiled"]:
            disp = self._disp
            return (disp if disp is not None else self.dispatcher())(*args)
        with np.errstate(all="ignore"):  # IEEE results, as Numba's error_model="numpy" gives
            return self.py_func(*args)

    def __repr__(self) -> str:
        return f"Kernel({self.__name__})"


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Kernel]:
    """Decorator: the function as a :class:`Kernel` (``options`` go to ``numba.njit``)."""

    def wrap(fn: Callable[..., Any]) -> Kernel:
        return Kernel(fn, dict(options))

    return wrap
