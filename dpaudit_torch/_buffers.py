"""Host buffers that stay out of the training loop's heap.

The auditor keeps a few arrays for the whole run whose size grows with the model (the
noise-audit coordinates and the per-step values read there: about 2,000 per parameter tensor).
Allocated with ``malloc`` they would sit inside the heap that the training loop's own tensors
are carved from and freed to every step: glibc's allocator raises its mmap threshold up to
32 MiB after large frees, so most of a big model's per-step tensors live in that heap, and a
long-lived block placed among them stops it from shrinking and fragments it (the process's
resident memory then grows by far more than the block). Buffers of 64 KiB or more are therefore
mapped pages of their own (an anonymous ``mmap``), which the heap never sees; smaller ones are
ordinary arrays. See docs/auditor.md, "Memory".
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

__all__ = ["host_empty", "host_zeros", "host_copy", "MAPPED_FROM", "NUMPY_FLOAT_OF"]

#: the NumPy dtype of a host copy of each floating-point torch dtype NumPy has (not bfloat16)
NUMPY_FLOAT_OF: dict[torch.dtype, np.dtype] = {
    torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64)}

#: buffers of at least this many bytes get their own mapping
MAPPED_FROM = 64 * 1024


def host_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """A zero-filled, writable, C-contiguous array; mapped pages of its own when it is large."""
    dt = np.dtype(dtype)
    shp = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    n = int(np.prod(shp, dtype=np.int64)) if shp else 1
    nbytes = n * dt.itemsize
    if nbytes < MAPPED_FROM:
        return np.zeros(shp, dtype=dt)
    buf = mmap.mmap(-1, nbytes)  # anonymous, zero-filled, freed with the last reference
    return np.frombuffer(buf, dtype=dt, count=n).reshape(shp)


def host_empty(shape: int | tuple[int, ...], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """Like :func:`host_zeros` (mapped pages are zero-filled anyway)."""
    return host_zeros(shape, dtype)


def host_copy(a: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """A copy of ``a`` (optionally converted) in a buffer from :func:`host_zeros`."""
    src = np.asarray(a)
    out = host_zeros(src.shape, src.dtype if dtype is None else dtype)
    out[...] = src
    return out
