"""NumPy views of CPU tensors that cost no dispatcher operation (docs/auditor.md, "Cost").

``Tensor.numpy()`` runs four dispatcher operations (``detach``, ``to``, ``resolve_conj``,
``resolve_neg``) for every tensor it views. The auditor reads every parameter tensor's summed
and released gradient on the CPU at every step, so those four operations per tensor were most
of its per-step dispatcher work on a model of many tensors (about 1,300 of 1,700 operations
per step on a 162-tensor model). A view needs only the tensor's address, length and dtype,
which are plain attribute reads (``data_ptr()``, ``numel()``, ``dtype``): :func:`host_views`
builds the view from them through NumPy's array interface, and keeps the views it built in a
small cache keyed by (address, length, dtype), so that a step whose gradients landed where the
previous step's did (the usual case: the allocator hands the freed blocks back) builds none.

A view made so does not keep its tensor alive: it is valid while the caller holds the tensor
(every caller holds the list of tensors it passed for as long as it uses the views). A cached
view is only ever handed out for a live tensor that occupies exactly that memory, so it reads
and writes that tensor.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["host_views", "ViewCache"]

#: the array-interface type string of each torch dtype a compiled pass reads (NumPy has no
#: bfloat16)
_TYPESTR: dict[torch.dtype, str] = {torch.float16: "<f2", torch.float32: "<f4",
                                    torch.float64: "<f8"}


class _Interface:
    """An object exposing one flat block of memory through NumPy's array interface."""

    __slots__ = ("__array_interface__",)

    def __init__(self, ptr: int, n: int, typestr: str) -> None:
        self.__array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": typestr,
                                    "version": 3}


class ViewCache:
    """Flat NumPy views by (address, length, dtype), at most ``size`` of them (the oldest
    dropped first: dicts keep their insertion order)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = int(size)
        self._views: dict[tuple[int, int, str], np.ndarray] = {}
        self.built = 0  # views built (a miss), for tests and benchmarks

    def view(self, ptr: int, n: int, typestr: str) -> np.ndarray:
        key = (ptr, n, typestr)
        v = self._views.get(key)
        if v is None:
            v = np.asarray(_Interface(ptr, n, typestr)) if n else np.empty(0, typestr)
            if len(self._views) >= self.size:
                del self._views[next(iter(self._views))]
            self._views[key] = v
            self.built += 1
        return v


_CACHE = ViewCache()


def host_views(tensors: list[torch.Tensor | None], cache: ViewCache | None = None
               ) -> tuple[np.ndarray, ...] | None:
    """The flat, writable NumPy views of ``tensors`` if a compiled pass can use them (every one
    present, on the CPU, strided, contiguous, of one NumPy float dtype), else None; no
    dispatcher operation. Valid while the caller holds the tensors (module docstring). (The
    loop is written for speed: it runs over every parameter tensor a few times per step.)"""
    if not tensors:
        return ()
    first = tensors[0]
    if first is None:
        return None
    dt = first.dtype
    typestr = _TYPESTR.get(dt)
    if typestr is None:
        return None
    views = _CACHE if cache is None else cache
    get = views._views.get
    out: list[np.ndarray] = []
    add = out.append
    try:
        for t in tensors:
            # (a missing tensor fails at .dtype, a sparse or opaque one at is_contiguous)
            if (t.dtype is not dt or not t.is_cpu  # type: ignore[union-attr]
                    or not t.is_contiguous() or t.is_neg()):  # type: ignore[union-attr]
                return None
            ptr, n = t.data_ptr(), t.numel()  # type: ignore[union-attr]
            v = get((ptr, n, typestr))
            add(views.view(ptr, n, typestr) if v is None else v)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return tuple(out)
