"""Gathering fixed coordinates from many tensors with few device operations.

The auditor reads the same coordinates of every parameter tensor at every step (the canary and
noise-audit coordinates of the summed and the released gradient, the coverage watch's sampled
coordinates of every parameter and buffer). One ``torch.take`` per tensor is one kernel launch
per tensor: on a GPU, where a training step of a convolutional network is already bound by the
host's launches, a few hundred launches per step were most of the auditor's cost (a profile of
ResNet-18 at batch 256 on an H200: the auditor added 546 kernel launches to a step, 372 of them
these gathers). :class:`PackedGather` packs consecutive small tensors into chunks of at most
``budget`` elements, flattens each chunk into one temporary (PyTorch's ``flatten_dense_tensors``,
one launch) and gathers from it with one ``take``; a tensor of more than ``small`` elements is
gathered from directly, so the copies never cost more device time than the launches they save.
The values and their order are exactly those of one ``take`` per tensor (a gather copies, it
computes nothing), so every statistic downstream is bit for bit the same; the temporaries cost
at most ``budget`` elements of device memory at a time.

On the CPU, where a launch is a function call and the flattening a real copy of the model, the
per-tensor takes are kept (``pack=False``); tests pack on the CPU to compare the two. There
:class:`HostGather` reads every tensor's coordinates with no dispatcher operation at all:
NumPy views of the tensors (:func:`~dpaudit_torch._host_view.host_views`) and one compiled pass
(:func:`take_columns`), so that the per-step work does not grow with the number of tensors
(docs/auditor.md, "Cost").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._compiled import compiled, kernel
from ._host_view import host_views

__all__ = ["PackedGather", "HostGather", "DEFAULT_BUDGET", "take_columns", "sum_squares",
           "count_changes", "fit_averages", "average_tolerance"]

#: elements per packed chunk (16 MiB of float32): a bound on the temporaries' memory
DEFAULT_BUDGET = 1 << 22
#: tensors of more elements are read with a take of their own: copying one into a chunk would
#: cost more device time than the launch it saves (2^18 float32 elements, read and written once,
#: are 2 MiB of traffic: under a microsecond at an H200's 4.8 TB/s, against several
#: microseconds of host time for a launch)
DEFAULT_SMALL = 1 << 18


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened and concatenated: PyTorch's C++ ``flatten_dense_tensors`` (what
    its DDP uses: one call, where a Python loop makes one flattening call per tensor; on the
    CPU 52 against 130 microseconds for 60 small tensors), else the same in Python."""
    flatten = getattr(torch._C._nn, "flatten_dense_tensors", None)
    if flatten is not None:
        return flatten(tensors)
    return torch.cat([t.reshape(-1) for t in tensors])


class PackedGather:
    """Gathers ``flat[j]`` from the ``j``-th of a fixed list of tensors, concatenated.

    Args:
        flat: per tensor, the flat (row-major) indices to read (int64, on the tensors' device).
        numels: per tensor, its number of elements (what the packed indices are laid out for).
        pack: pack small tensors into chunks (the accelerator); else one take per tensor.
        budget: the largest chunk, in elements.
        small: the largest tensor that is packed, in elements (a larger one is read alone).
    """

    def __init__(self, flat: list[torch.Tensor], numels: list[int], pack: bool,
                 budget: int = DEFAULT_BUDGET, small: int = DEFAULT_SMALL) -> None:
        if len(flat) != len(numels):
            raise ValueError(f"{len(flat)} index tensors for {len(numels)} tensors")
        self.flat = flat
        self.numels = [int(n) for n in numels]
        #: chunks: (the tensors' positions, the indices into their concatenation), or a single
        #: tensor's position with its own indices
        self.chunks: list[tuple[list[int], torch.Tensor]] = []
        if not pack:
            self.chunks = [([j], f) for j, f in enumerate(flat)]
            return
        members: list[int] = []
        size = 0
        for j, n in enumerate(self.numels):
            if n > small:  # alone, in its place (the output keeps the tensors' order)
                if members:
                    self._close(members)
                    members, size = [], 0
                self._close([j])
                continue
            if members and size + n > budget:
                self._close(members)
                members, size = [], 0
            members.append(j)
            size += n
        if members:
            self._close(members)

    def _close(self, members: list[int]) -> None:
        if len(members) == 1:
            self.chunks.append((members, self.flat[members[0]]))
            return
        offsets, at = [], 0
        for j in members:
            offsets.append(at)
            at += self.numels[j]
        idx = torch.cat([self.flat[j] + off for j, off in zip(members, offsets)])
        self.chunks.append((members, idx))

    @property
    def operations(self) -> int:
        """Device operations per call (takes and concatenations, before the final one)."""
        return sum(1 if len(m) == 1 else 2 for m, _ in self.chunks)

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The gathered values of ``tensors`` (aligned with ``flat``), tensor after tensor; a
        chunk whose tensors do not have the planned sizes, or lie on another device than its
        indices, is read one take per tensor."""
        parts = []
        for members, idx in self.chunks:
            if len(members) == 1:
                t = tensors[members[0]]
                parts.append(torch.take(t, idx if idx.device == t.device else idx.to(t.device)))
                continue
            got = [tensors[j] for j in members]
            if all(t.numel() == self.numels[j] for j, t in zip(members, got)):
                try:
                    parts.append(torch.take(_flatten(got), idx))
                    continue
                except RuntimeError:  # tensors on several devices, or not the indices' one
                    pass
            parts.extend(torch.take(t, self.flat[j].to(t.device)) for j, t in zip(members, got))
        return torch.cat(parts) if len(parts) > 1 else parts[0]


@kernel(nogil=True)
def take_columns(dst: tuple, counts: np.ndarray, col_flat: np.ndarray, out: np.ndarray) -> None:
    """``out[o] = dst[p][col_flat[o]]`` for the columns o of every tensor p (tensor p's
    ``counts[p]`` columns follow those of the tensors before it), in float64 (exact for every
    float dtype): one pass over many tensors' coordinates. The injector keeps so the values the
    canaries' additions are about to change (to put them back bit for bit); the coverage watch
    reads its sampled coordinates so."""
    off = 0
    for p in range(counts.shape[0]):
        d = dst[p]
        for j in range(counts[p]):
            out[off + j] = float(d[col_flat[off + j]])
        off += counts[p]


class HostGather:
    """Gathers ``flat[j]`` from the ``j``-th of a fixed list of CPU tensors, concatenated, in
    float64 (a NumPy array), without a dispatcher operation: :func:`host_views` of the
    tensors and one
    :func:`take_columns` pass (compiled mode), or one NumPy gather per tensor (Python mode,
    where the kernel's loop would run in the interpreter). The values are those of one
    ``take`` per tensor converted to float64 (exact). Returns None where the tensors have no
    NumPy views (not all on the CPU, one float dtype, contiguous): the caller then gathers
    with torch.

    Args:
        flat: per tensor, the flat (row-major) indices to read (int64, any device).
    """

    def __init__(self, flat: list[torch.Tensor]) -> None:
        idx = [f.detach().to("cpu", torch.int64).numpy() for f in flat]
        self.counts = np.asarray([a.shape[0] for a in idx], dtype=np.int64)
        self.flat = (np.ascontiguousarray(np.concatenate(idx)) if idx
                     else np.empty(0, dtype=np.int64))
        self._bounds = np.concatenate([[0], np.cumsum(self.counts)]).tolist()
        self._idx = idx

    def __call__(self, tensors: list[torch.Tensor]) -> np.ndarray | None:
        views = host_views(tensors)
        return None if views is None else self.read(views)

    def read(self, views: tuple[np.ndarray, ...]) -> np.ndarray:
        """The gathered values from the tensors' flat NumPy ``views``."""
        out = np.empty(self.flat.shape[0], dtype=np.float64)
        if compiled():
            take_columns(views, self.counts, self.flat, out)
        else:
            b = self._bounds
            for j, (v, ix) in enumerate(zip(views, self._idx)):
                out[b[j]:b[j + 1]] = v[ix]
        return out


@kernel(nogil=True)
def sum_squares(src: tuple, out: np.ndarray) -> None:
    """``out[p]`` = the sum of squares of every element of ``src[p]``, accumulated in float64
    in element order: a fingerprint of the whole tensor (the coverage watch's; two calls on
    equal tensors give equal bits)."""
    for p in range(len(src)):
        s = src[p]
        acc = 0.0
        for j in range(s.shape[0]):
            v = float(s[j])
            acc += v * v
        out[p] = acc


@kernel(nogil=True)
def count_changes(now: np.ndarray, before: np.ndarray, seg: np.ndarray,
                  outside_held: np.ndarray, held_too: bool, step: int, steps: np.ndarray,
                  first: np.ndarray, last: np.ndarray, excused: np.ndarray) -> None:
    """The coverage watch's comparison of two fingerprints (int64 views of their float64
    values, compared bit for bit) in one pass: tensor ``seg[e]`` changed if any entry e of it
    differs (only the tensors ``outside_held`` count unless ``held_too``, and none that
    ``excused`` marks: a weight average whose change :func:`fit_averages` found to be
    post-processing); for each changed tensor, ``steps`` counts ``step`` once, ``first`` keeps
    the first such step and ``last`` the latest."""
    n = steps.shape[0]
    changed = np.zeros(n, dtype=np.bool_)
    for e in range(now.shape[0]):
        if now[e] != before[e]:
            changed[seg[e]] = True
    for t in range(n):
        if changed[t] and not excused[t] and (held_too or outside_held[t]):
            if last[t] != step:
                steps[t] += 1
            if first[t] < 0:
                first[t] = step
            last[t] = step


#: the unit roundoff of float64, in which the fit's own differences are taken
U64 = 2.0 ** -53


def average_tolerance(u: Any, b_old: Any, b_new: Any, p: Any, tiny: Any) -> Any:
    """How far ``b_new - b_old`` may lie from ``beta (p - b_old)`` when ``b_new`` is one
    weight-average update of ``b_old`` towards ``p`` computed in a dtype of unit roundoff
    ``u`` (smallest normal number ``tiny``), docs/monitors/coverage.md "Weight averages":
    ``gamma_3 (|b_old| + |p|)`` with ``gamma_3 = 3u / (1 - 3u)`` (three roundings of
    ``(1 - beta) b + beta p``, ``b + beta (p - b)`` or ``b + (p - b) / n``, whose coefficients
    are rounded themselves), ``3 u tiny`` (those roundings below the normal range), and
    ``2 u64 (|b_new| + |b_old| + |p|)`` (the fit's own float64 differences and quotients).
    Numbers or tensors (the watch's torch path); :func:`fit_averages` spells it out."""
    g3 = 3.0 * u / (1.0 - 3.0 * u)
    return (g3 * (abs(b_old) + abs(p)) + 3.0 * u * tiny
            + 2.0 * U64 * (abs(b_new) + abs(b_old) + abs(p)))


@kernel(nogil=True)
def fit_averages(now: np.ndarray, before: np.ndarray, post: np.ndarray, now_bits: np.ndarray,
                 before_bits: np.ndarray, buf: np.ndarray, off: np.ndarray, pos_b: np.ndarray,
                 pos_p: np.ndarray, unit: np.ndarray, tiny: np.ndarray,
                 step: int, excused: np.ndarray, av_steps: np.ndarray, av_first: np.ndarray,
                 av_last: np.ndarray, beta_min: np.ndarray, beta_max: np.ndarray) -> None:
    """The coverage watch's check of its paired buffers between two fingerprints (float64
    values ``now``, ``before``, and their int64 views for the bitwise comparison): pair k's
    buffer (tensor ``buf[k]``) changed as a weight average of its parameter if its sampled
    coordinates (entries ``pos_b[off[k]:off[k + 1]]``; the parameter's same coordinates at
    ``pos_p``, read from ``post``, the fingerprint after the release) moved and one beta in
    [0, 1] puts every one of them within :func:`average_tolerance` of
    ``b_old + beta (p - b_old)``: the feasible betas of the coordinates are intersected. A
    buffer that changed while no sampled coordinate moved (bit for bit) does not fit: its
    change lies outside the sample. ``excused[buf[k]]`` says whether
    it fits; each fit counts the step (``av_steps`` once per step, ``av_first``, ``av_last``)
    and the fitted beta (the middle of the feasible interval) into ``beta_min`` /
    ``beta_max``, where a coordinate constrains it (``p != b_old`` somewhere: else the
    buffer moved by rounding only and every beta fits)."""
    for k in range(buf.shape[0]):
        j = buf[k]
        excused[j] = False
        moved = False
        for i in range(off[k], off[k + 1]):
            if now_bits[pos_b[i]] != before_bits[pos_b[i]]:
                moved = True
        if not moved:
            continue
        u = unit[k]
        lo = 0.0
        hi = 1.0
        ok = True
        tied = False  # some coordinate constrains beta (else every beta in [0, 1] fits)
        for i in range(off[k], off[k + 1]):
            bo = before[pos_b[i]]
            bn = now[pos_b[i]]
            p = post[pos_p[i]]
            if not (np.isfinite(bo) and np.isfinite(bn) and np.isfinite(p)):
                ok = False
                break
            d = bn - bo
            e = p - bo
            # average_tolerance, spelled out (a kernel calls no Python function)
            t = (3.0 * u / (1.0 - 3.0 * u) * (abs(bo) + abs(p)) + 3.0 * u * tiny[k]
                 + 2.0 * U64 * (abs(bn) + abs(bo) + abs(p)))
            if e == 0.0:
                if abs(d) > t:
                    ok = False
                    break
                continue
            tied = True
            a = (d - t) / e
            c = (d + t) / e
            if e < 0.0:
                a, c = c, a
            lo = max(lo, a)
            hi = min(hi, c)
        if not ok or lo > hi:
            continue
        excused[j] = True
        if av_last[k] != step:
            av_steps[k] += 1
        if av_first[k] < 0:
            av_first[k] = step
        av_last[k] = step
        if tied:
            beta = 0.5 * (lo + hi)
            beta_min[k] = min(beta_min[k], beta)
            beta_max[k] = max(beta_max[k], beta)


def signatures() -> list[tuple[object, tuple[object, ...]]]:
    """(kernel, argument types) of :func:`count_changes` as the coverage watch calls it, for
    :func:`dpaudit_torch._warmup.warm_up` (its other kernels take one tuple per model, and
    are compiled at the watch's first fingerprint, when the audit attaches; :func:`fit_averages`
    only where the model has paired buffers, at their first check)."""
    from numba import types as nt

    i1, b1 = nt.int64[::1], nt.boolean[::1]
    return [(count_changes, (i1, i1, i1, b1, nt.boolean, nt.int64, nt.int32[::1], i1, i1, b1))]
