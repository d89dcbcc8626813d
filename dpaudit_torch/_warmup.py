"""Compiling the audit's kernels before training (docs/auditor.md, "Costs"): every kernel of
the statistics (:mod:`dpaudit_torch.stats._kernels`), of the step
(:mod:`dpaudit_torch.opacus_tap._step_kernels`) and of the coverage watch
(:mod:`dpaudit_torch._gather`), for the argument types the audit passes, compiled
or loaded from Numba's cache by :func:`dpaudit_torch._numba.compile_all`.

Kept apart from :mod:`dpaudit_torch._numba`, which the kernel modules reach through
:mod:`dpaudit_torch._compiled`: listing the kernels there would close an import circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _gather, _numba
from .opacus_tap import _step_kernels
from .stats import _kernels

__all__ = ["warm_up"]


def warm_up(params: Sequence[Any] = (), host: bool = True) -> int:
    """Compile (or load from the cache) every kernel for the argument types the audit passes.

    ``params``: the audited parameter tensors; when ``host`` is true and they are CPU tensors of
    one NumPy float dtype, the one-pass observation kernel is also prepared for their number
    and dtype. Returns how many kernels were compiled (0: all loaded from the cache, or ready)."""
    jobs = (list(_kernels.signatures()) + list(_step_kernels.signatures())
            + list(_gather.signatures()))
    grads = _numba.host_grads_type(params) if host else None
    if grads is not None:
        jobs += _step_kernels.observe_signatures(grads, len(params))
    return _numba.compile_all(jobs)
