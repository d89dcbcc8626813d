"""Compiled host code of the auditor's per-step bookkeeping (Numba).

The auditor's work between Opacus's backward pass and its update is a few dozen tiny array
operations (drawing the step's coins, choosing the canary coordinates, computing where their
entries go). Right after a backward pass the caches are cold, and each separate NumPy or torch
call then costs several microseconds of cache misses; one compiled call does the same work in
one pass (measured: 57 us for the NumPy version of ``plan_step`` with cold caches, 9 us hot).
"""

from __future__ import annotations

import math

import numpy as np

from .._compiled import kernel
from .._gather import take_columns

__all__ = ["plan_step", "snapshot_step", "release_step", "add_columns", "add_joint", "take_columns",
           "write_rows", "clip_joint"]


@kernel(nogil=True)
def plan_step(draws: np.ndarray, at: int, in_index: np.ndarray, log1m_q: float,
              consts: np.ndarray, k: int, m: int, n_params: int, spread_rows: np.ndarray,
              spread_param: np.ndarray, spread_flat: np.ndarray, spread_w: float,
              scratch: np.ndarray, group: int
              ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                         np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One logical step's canary plan from the auditor's own uniforms ``draws[at:]``.

    ``consts`` holds, in order, pair_param, pair_a, pair_b (k each), one_param, one_flat (m
    each): one array, so that the call passes few arguments. Pair j's canary goes to
    ``pair_a[j]`` when ``draws[at + j] < 1/2`` (the role coin), else to ``pair_b[j]``. Each IN
    one-run canary (``in_index``: their indices, ascending) is included with the data loader's
    Poisson rate q, independently: the gaps between included canaries in ``in_index`` are
    geometric, ``floor(log(1 - u) / log(1 - q))`` for a uniform u (``log1m_q`` = log(1 - q)),
    so that a step uses k + 1 + (canaries included) uniforms, not one per canary
    (docs/design.md section 5). ``scratch``: int64 work space of at least ``len(in_index)``.
    ``group``: the one-run canaries are layered (:mod:`dpaudit_torch.canary_layers`), each of
    ``group`` members stored tensor-major (member l of canary j is ``l (m / group) + j``);
    ``in_index`` then lists IN canaries (``j < m / group``) and an included canary includes all
    its members, ascending (1: Dirac canaries, one member each).
    Rows are the k pairs, then the included one-run canaries in index order. A spread pair (row
    ``spread_rows[s]``) also has an entry at each coordinate of ``spread_param[s, side]`` /
    ``spread_flat[s, side]`` (side 0: a, 1: b, the one its coin chose), and each entry of a
    spread row weighs ``spread_w``; every other entry weighs 1.

    Returns (the position after the uniforms used, or -1 when ``draws`` ran out first: the
    caller appends more and calls again from ``at``; coins [k] bool, included [n] int64, then
    per entry, E = R + spread extras with R = k + n rows: param, flat (its flat index in the
    real tensor), weight, index; then counts [n_params] (entries per tensor), col_flat [E],
    pair_order [2k]).

    ``index`` places the entry in the step's *rows buffer*, one row-major ``[R, E]`` matrix
    whose columns are grouped by tensor: tensor p's ``counts[p]`` entries are the columns
    ``o_p .. o_p + counts[p] - 1`` (``o_p``: the entries of the tensors before p; an entry's
    column within its tensor is its rank among that tensor's entries), so that one ``split``
    of the matrix gives every tensor's ``[R, counts[p]]`` rows. ``col_flat[o_p + column]`` is
    that column's flat index in tensor p, so the clipped column sums go back to the real tensor
    through it. ``pair_order`` picks, from the
    projections at [a_1..a_k, b_1..b_k], the canary's coordinate of each pair (x, first k) and
    the other one (y, last k).
    """
    pair_param = consts[0:k]
    pair_a = consts[k:2 * k]
    pair_b = consts[2 * k:3 * k]
    one_param = consts[3 * k:3 * k + m]
    one_flat = consts[3 * k + m:3 * k + 2 * m]
    total = draws.shape[0]
    n_in = in_index.shape[0]
    pos = at + k
    n = 0
    last = -1  # position in in_index of the last canary included
    while True:
        if pos >= total:  # out of uniforms: nothing was changed, the caller draws more
            return (-1, np.empty(0, dtype=np.bool_), np.empty(0, dtype=np.int64),
                    np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.ones(0),
                    np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                    np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        g = np.log(1.0 - draws[pos]) / log1m_q  # >= 0; +inf or NaN-free for q in (0, 1]
        pos += 1
        if not g < n_in - 1 - last:  # past the last IN canary (also g = +inf)
            break
        last += int(g) + 1
        scratch[n] = in_index[last]
        n += 1
    if group == 1:
        included = scratch[:n].copy()
    else:
        m_g = m // group
        included = np.empty(n * group, dtype=np.int64)
        for g in range(group):
            for r in range(n):
                included[g * n + r] = scratch[r] + g * m_g
        n = n * group
    R = k + n
    n_sp = spread_rows.shape[0]
    L1 = spread_param.shape[2]
    E = R + n_sp * L1
    coins = np.empty(k, dtype=np.bool_)
    param = np.empty(E, dtype=np.int64)
    flat = np.empty(E, dtype=np.int64)
    row = np.empty(E, dtype=np.int64)
    weight = np.ones(E)
    for j in range(k):
        c = draws[at + j] < 0.5
        coins[j] = c
        param[j] = pair_param[j]
        flat[j] = pair_a[j] if c else pair_b[j]
        row[j] = j
    for r in range(k, R):
        i = included[r - k]
        param[r] = one_param[i]
        flat[r] = one_flat[i]
        row[r] = r
    e = R
    for s in range(n_sp):
        j = spread_rows[s]
        side = 0 if coins[j] else 1
        weight[j] = spread_w
        for c in range(L1):
            param[e] = spread_param[s, side, c]
            flat[e] = spread_flat[s, side, c]
            row[e] = j
            weight[e] = spread_w
            e += 1
    counts = np.zeros(n_params, dtype=np.int64)
    col = np.empty(E, dtype=np.int64)
    for e in range(E):
        col[e] = counts[param[e]]
        counts[param[e]] += 1
    start = np.zeros(n_params, dtype=np.int64)
    for p in range(1, n_params):
        start[p] = start[p - 1] + counts[p - 1]
    index = np.empty(E, dtype=np.int64)
    col_flat = np.empty(E, dtype=np.int64)
    for e in range(E):
        p = param[e]
        index[e] = row[e] * E + start[p] + col[e]
        col_flat[start[p] + col[e]] = flat[e]
    pair_order = np.empty(2 * k, dtype=np.int64)
    for j in range(k):
        pair_order[j] = j if coins[j] else k + j
        pair_order[k + j] = k + j if coins[j] else j
    return (pos, coins, included, param, flat, weight, index, counts, col_flat, pair_order)


@kernel(nogil=True)
def snapshot_step(grads: tuple, coord_param: np.ndarray, coord_flat: np.ndarray,
                  scale: np.ndarray, n_scaled: int, out: np.ndarray) -> None:
    """The real examples' clipped sum at every audited coordinate, in one pass (CPU, one dtype).

    ``grads``: the flat summed gradient of each parameter tensor. Coordinate j is
    ``grads[coord_param[j]][coord_flat[j]]``, times ``scale[coord_param[j]]`` for the first
    ``n_scaled`` coordinates (the canaries', in units of C) and raw for the others (the
    noise-audit coordinates), written to ``out`` in float64.
    """
    n = coord_param.shape[0]
    for j in range(n):
        p = coord_param[j]
        v = float(grads[p][coord_flat[j]])
        out[j] = v * scale[p] if j < n_scaled else v


@kernel(nogil=True)
def release_step(grads: tuple, coord_param: np.ndarray, coord_flat: np.ndarray,
                 unit_scale: np.ndarray, denom: np.ndarray, n_canary: int, real: np.ndarray,
                 noise_real: np.ndarray, inv_std: float, pair_order: np.ndarray, k: int,
                 spread_pair: np.ndarray, side_a: np.ndarray, side_b: np.ndarray,
                 spread_w: float, coins: np.ndarray, vals: np.ndarray, xy: np.ndarray,
                 rel: np.ndarray, noise_raw: np.ndarray, noise: np.ndarray
                 ) -> tuple[bool, float]:
    """One step's release at every audited coordinate, in one pass (CPU, one dtype).

    ``grads``: the flat released gradient of each parameter tensor. The first ``n_canary``
    coordinates are the canaries' (design order: pair a, pair b, one-run, spread extras):
    ``vals[j] = grads[..] * unit_scale[p] - real[j]`` (units of C, the real examples' sum
    subtracted), and ``xy`` the pairs' (x, y) through ``pair_order``; spread pair
    ``spread_pair[s]`` reads the sum over its side's coordinates (``side_a[s]`` when its coin
    is True, else ``side_b[s]``) times ``spread_w``. The other coordinates are the noise
    audit's: the released value in raw units ``rel = grads[..] * denom[p]``, the noise
    ``noise_raw = rel - noise_real`` and ``noise = noise_raw * inv_std``. Returns (every canary
    value finite, sum of ``noise**2``).
    """
    n = coord_param.shape[0]
    finite = True
    sumsq = 0.0
    for j in range(n_canary):
        p = coord_param[j]
        v = float(grads[p][coord_flat[j]]) * unit_scale[p] - real[j]
        vals[j] = v
        if not np.isfinite(v):
            finite = False
    for j in range(n_canary, n):
        p = coord_param[j]
        r = float(grads[p][coord_flat[j]]) * denom[p]
        i = j - n_canary
        rel[i] = r
        d = r - noise_real[i]
        noise_raw[i] = d
        z = d * inv_std
        noise[i] = z
        sumsq += z * z
    for j in range(2 * k):
        xy[j] = vals[pair_order[j]]
    for s in range(spread_pair.shape[0]):
        sa = 0.0
        sb = 0.0
        for c in range(side_a.shape[1]):
            sa += vals[side_a[s, c]]
            sb += vals[side_b[s, c]]
        j = spread_pair[s]
        if coins[j]:
            xy[j] = sa * spread_w
            xy[k + j] = sb * spread_w
        else:
            xy[j] = sb * spread_w
            xy[k + j] = sa * spread_w
    return finite, sumsq


@kernel(nogil=True)
def add_columns(dst: tuple, src: tuple, counts: np.ndarray, col_flat: np.ndarray) -> None:
    """``dst[p][col_flat[o_p + j]] += src[p][j]`` for every tensor p and column j < counts[p]
    (``o_p``: the columns of the tensors before p): the canaries' clipped column sums added to
    the real tensors' flat ``summed_grad`` in one pass (CPU, one dtype; the same additions, in
    the same dtype, as one ``index_add_`` per tensor)."""
    off = 0
    for p in range(counts.shape[0]):
        c = counts[p]
        if c:
            d = dst[p]
            s = src[p]
            for j in range(c):
                d[col_flat[off + j]] += s[j]
        off += c


@kernel(nogil=True)
def add_joint(dst: tuple, src: np.ndarray, counts: np.ndarray, col_flat: np.ndarray) -> None:
    """:func:`add_columns` with every tensor's column sums in one array, tensor after tensor
    (the canaries clipped as one concatenated shadow tensor): ``dst[p][col_flat[o]] += src[o]``
    for the columns o of tensor p."""
    off = 0
    for p in range(counts.shape[0]):
        d = dst[p]
        for j in range(counts[p]):
            d[col_flat[off + j]] += src[off + j]
        off += counts[p]


@kernel(nogil=True)
def write_rows(buf: np.ndarray, index: np.ndarray, E: int, W: int, which: np.ndarray,
               clip: np.ndarray, weight: np.ndarray, scale: float) -> None:
    """The canary entries of a step into the flat rows buffer, in one pass: entry e (position
    ``index[e]`` of the ``[R, E]`` rows, moved to row width ``W >= E``) gets
    ``scale * clip[which[e]] * weight[e]`` (no weight when ``weight`` is empty), computed in
    float64 and stored in the buffer's dtype; ``scale = 0`` sets the entries back to zero."""
    pad = W - E
    has_w = weight.shape[0] > 0
    for e in range(index.shape[0]):
        i = index[e]
        if pad:
            i += (i // E) * pad
        if scale == 0.0:
            buf[i] = 0.0
        else:
            v = scale * clip[which[e]]
            if has_w:
                v = v * weight[e]
            buf[i] = v


@kernel(nogil=True)
def clip_joint(index: np.ndarray, E: int, which: np.ndarray, clip: np.ndarray,
               weight: np.ndarray, scale: float, max_norm: float, norm_eps: float,
               out: np.ndarray, norm2: np.ndarray, tmp: np.ndarray) -> None:
    """Opacus's own joint-norm clipping (``DPOptimizer.clip_and_accumulate``) of the step's
    canary rows, from their entries, in one pass: the column sums it would leave in
    ``summed_grad`` for the ``[R, E]`` rows that :func:`write_rows` writes (entry e at
    ``index[e]``, value ``scale * clip[which[e]] * weight[e]`` stored in the rows' dtype).

    Opacus computes, in the rows' dtype: each row's norm, the factor
    ``min(1, reciprocal(norm + 1e-6) * max_grad_norm)`` and the contraction of the factors with
    the rows; every column holds one entry, so its sum is the factor of the entry's row times
    the entry. Each of those operations is done here in float64 and rounded to the dtype of
    ``out`` (by storing into ``out`` or ``tmp``, both of the rows' dtype): for one operation on
    float32 numbers that is the float32 result itself. The row norms accumulate in float64 (a
    row of one entry gives its absolute value exactly, as Opacus does; a spread row of a few
    entries may differ in the last bit). ``norm2``: float64 work space of at least R numbers;
    ``out``: at least E numbers, column c of the rows at ``out[c]``."""
    R = norm2.shape[0]
    for r in range(R):
        norm2[r] = 0.0
    has_w = weight.shape[0] > 0
    for e in range(index.shape[0]):
        i = index[e]
        v = scale * clip[which[e]]
        if has_w:
            v = v * weight[e]
        c = i % E
        out[c] = v  # rounded to the rows' dtype, as write_rows stores it
        q = float(out[c])
        norm2[i // E] += q * q
    tmp[0] = norm_eps
    eps_q = float(tmp[0])
    tmp[0] = max_norm
    bound_q = float(tmp[0])
    for r in range(R):
        tmp[0] = math.sqrt(norm2[r])  # the row's norm in the rows' dtype
        tmp[0] = float(tmp[0]) + eps_q
        tmp[0] = 1.0 / float(tmp[0])
        tmp[0] = float(tmp[0]) * bound_q
        f = float(tmp[0])
        norm2[r] = 1.0 if f > 1.0 else f  # clamp(max=1.0), NaN kept; the factor, stored here
    for e in range(index.shape[0]):
        i = index[e]
        c = i % E
        out[c] = norm2[i // E] * float(out[c])


def signatures() -> list[tuple[object, tuple[object, ...]]]:
    """(kernel, argument types) of :func:`plan_step` as the injector calls it, for
    :func:`dpaudit_torch._warmup.warm_up`."""
    from numba import types as nt

    i, i1, f = nt.int64, nt.int64[::1], nt.float64
    i3 = nt.int64[:, :, ::1]
    return [(plan_step, (nt.float64[::1], i, i1, f, i1, i, i, i, i1, i3, i3, f, i1, i))]


def observe_signatures(grad_dtype: object, n_tensors: int
                       ) -> list[tuple[object, tuple[object, ...]]]:
    """(kernel, argument types) of :func:`snapshot_step`, :func:`release_step`,
    :func:`add_columns`, :func:`add_joint`, :func:`take_columns` and :func:`write_rows` for
    ``n_tensors`` flat gradients of the Numba dtype ``grad_dtype``."""
    from numba import types as nt

    f1, i1, i2 = nt.float64[::1], nt.int64[::1], nt.int64[:, ::1]
    i, f = nt.int64, nt.float64
    grads = nt.UniTuple(nt.Array(grad_dtype, 1, "C"), n_tensors)
    return [(snapshot_step, (grads, i1, i1, f1, i, f1)),
            (release_step, (grads, i1, i1, f1, f1, i, f1, f1, f, i1, i, i1, i2, i2, f,
                            nt.boolean[::1], f1, f1, f1, f1, f1)),
            (add_columns, (grads, grads, i1, i1)),
            (add_joint, (grads, nt.Array(grad_dtype, 1, "C"), i1, i1)),
            (take_columns, (grads, i1, i1, f1)),
            (write_rows, (nt.Array(grad_dtype, 1, "C"), i1, i, i, i1, f1, f1, f)),
            (clip_joint, (i1, i, i1, f1, f1, f, f, f, nt.Array(grad_dtype, 1, "C"), f1,
                          nt.Array(grad_dtype, 1, "C")))]
