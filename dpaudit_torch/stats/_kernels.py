"""Compiled inner loops of the sequential tests (Numba, float64, host).

The betting recursions are sequential by nature: the bet (and, for the MMD test, the witness)
used on pair t depends on every earlier pair. Written as NumPy expressions they cost a few
microseconds of interpreter overhead per pair, which in the training hook (16 pairs per step)
is a visible share of a small model's step. Here they are plain loops compiled once by Numba
(cached on disk where :mod:`dpaudit_torch._numba` says; ``error_model="numpy"``: IEEE inf and
NaN, never a Python ZeroDivisionError), with the same floating-point operations in the same order as
the formulas in docs/design.md sections 1-2; no ``fastmath``, so IEEE semantics are kept.

Errors are not raised inside compiled code: each kernel returns a status (0 = fine) and the
Python caller raises with the offending values, leaving its own state untouched.
"""

from __future__ import annotations

import math

import numpy as np

from .._compiled import kernel

__all__ = ["ons_run", "mmd_recursion_capped", "mmd_args_1d", "mmd_blocks_1d", "mmd_fwd_update",
           "hockey_stick_cells_1d", "hockey_stick_gaps", "hockey_stick_finish",
           "log_mean_exp_rows", "fresh_start_rows", "fresh_start_mixed", "record_chunk"]


@kernel(nogil=True, error_model="numpy")
def ons_run(payoffs: np.ndarray, lam: np.ndarray, a_sum: np.ndarray, log_wealth: np.ndarray,
            lambda_max: np.ndarray, c: float, out: np.ndarray) -> bool:
    """Online Newton Step over payoffs [n, K], updating lam, a_sum, log_wealth in place.

    ``out[t, k]`` receives the log-wealth of component k after pair t. Returns True when every
    final log-wealth is finite (a payoff outside its range makes it -inf or NaN for good).
    """
    n, K = payoffs.shape
    for t in range(n):
        for k in range(K):
            p = payoffs[t, k]
            lp = lam[k] * p
            log_wealth[k] = log_wealth[k] + np.log1p(lp)  # NaN/-inf below -1, also as Python
            z = -p / (1.0 + lp)
            a_sum[k] = a_sum[k] + z * z
            new = lam[k] - c * z / a_sum[k]
            # clip(new, 0, lambda_max) with NumPy's NaN propagation (maximum/minimum)
            if not (new >= 0.0):
                new = new if new != new else 0.0
            if new > lambda_max[k]:
                new = lambda_max[k]
            lam[k] = new
            out[t, k] = log_wealth[k]
    ok = True
    for k in range(K):
        if not math.isfinite(log_wealth[k]):
            ok = False
    return ok


@kernel(nogil=True, error_model="numpy")
def mmd_recursion_capped(old: np.ndarray, g2: np.ndarray, u: np.ndarray, g2e: np.ndarray,
                         a_ev: np.ndarray, H: np.ndarray, n: int, E: int, R: float, S: float,
                         m: float, s: float, renorm_below: float, norm_tol: float,
                         v_out: np.ndarray, a_c: np.ndarray, bad: np.ndarray
                         ) -> tuple[float, float, float, float, int]:
    """OGA witness recursion of the MMD test over a chunk that drops the E oldest stored pairs
    (FIFO); E = 0 is the uncapped witness (nothing dropped: ``u``, ``g2e``, ``a_ev`` empty and
    ``H`` the chunk's own n x n block).

    ``old``, ``u``, ``a_ev`` are modified (renormalisation). ``H`` is the Gram block of
    [new pairs, dropped pairs]; pair e is dropped right after new pair ``n - E + e`` is added,
    before that step's projection. Returns (S, m, s, pending, status); status 1 means a squared
    norm went negative beyond rounding after a drop (``bad`` then holds its three terms).
    """
    pending = 1.0
    first_drop = n - E
    for j in range(n):
        ne = j - first_drop
        if ne < 0:
            ne = 0
        inner = old[j]
        if j:
            acc = 0.0
            for i in range(j):
                acc += a_c[i] * H[j, i]
            inner += acc
        if ne:
            acc = 0.0
            for e in range(ne):
                acc += a_ev[e] * H[n + e, j]
            inner -= acc
        v = S * inner
        gj = g2[j]
        m += gj
        eta = 0.5 / math.sqrt(m) if m > 0.0 else 0.0
        n2 = s + 2.0 * eta * v + eta * eta * gj
        if n2 < 0.0:
            n2 = 0.0
        a_c[j] = eta / S
        if j >= first_drop:
            e = j - first_drop
            acc = 0.0
            for i in range(j + 1):
                acc += a_c[i] * H[n + e, i]
            w = u[e] + acc
            if e:
                acc = 0.0
                for i in range(e):
                    acc += a_ev[i] * H[n + i, n + e]
                w -= acc
            ce = S * a_ev[e]
            fg = S * w
            cross = 2.0 * ce * fg
            sq = ce * ce * g2e[e]
            dropped = n2 - cross + sq
            if dropped < 0.0:
                if dropped < -norm_tol * (n2 + abs(cross) + sq):
                    bad[0] = n2
                    bad[1] = cross
                    bad[2] = sq
                    return S, m, s, pending, 1
                dropped = 0.0
            n2 = dropped
        gamma = R / math.sqrt(n2) if n2 > R * R else 1.0
        S *= gamma
        s = gamma * gamma * n2
        v_out[j] = v
        if S < renorm_below:
            for i in range(j + 1):
                a_c[i] *= S
            for i in range(j + 1, n):
                old[i] *= S
            for i in range(E):
                u[i] *= S
                a_ev[i] *= S
            pending *= S
            S = 1.0
    return S, m, s, pending, 0


@kernel(nogil=True, error_model="numpy")
def mmd_args_1d(x: np.ndarray, y: np.ndarray, center: float, inv_bw: float, X: np.ndarray,
                Y: np.ndarray, T: int, ev: np.ndarray, zx: np.ndarray, zy: np.ndarray,
                D: np.ndarray) -> int:
    """The exponents ``-|p - q|^2 / 2`` of every kernel value a capped MMD witness chunk of
    one-dimensional pairs needs, into ``D`` (one NumPy exponential then makes them kernels; see
    :func:`mmd_blocks_1d` for the layout); also the chunk's standardised points ``zx``, ``zy``.

    ``X``, ``Y``: the stored standardised points (their first ``T`` slots are used); ``ev``:
    the slots of the pairs the chunk drops. The same operations, in the same order, as the
    NumPy kernel blocks (difference, square, times -1/2). Returns the number of exponents."""
    n = x.shape[0]
    E = ev.shape[0]
    n2 = 2 * n
    for j in range(n):
        zx[j] = (x[j] - center) * inv_bw
        zy[j] = (y[j] - center) * inv_bw
    o = 0
    for part in range(2):  # stored x parts, then stored y parts, against [zx; zy]
        P = X if part == 0 else Y
        for i in range(T):
            p = P[i]
            for q in range(n2):
                d = p - (zx[q] if q < n else zy[q - n])
                D[o] = d * d * -0.5
                o += 1
    for blk in range(6):  # new: xx, xy, yy; dropped: xx, xy, yy
        m = n if blk < 3 else E
        for i in range(m):
            a = ((zx[i] if blk % 3 < 2 else zy[i]) if blk < 3
                 else (X[ev[i]] if blk % 3 < 2 else Y[ev[i]]))
            for j in range(m):
                b = ((zx[j] if blk % 3 == 0 else zy[j]) if blk < 3
                     else (X[ev[j]] if blk % 3 == 0 else Y[ev[j]]))
                d = a - b
                D[o] = d * d * -0.5
                o += 1
    for j in range(n):
        d = zx[j] - zy[j]
        D[o] = -0.5 * (d * d)
        o += 1
    for e in range(E):
        d = X[ev[e]] - Y[ev[e]]
        D[o] = -0.5 * (d * d)
        o += 1
    return o


@kernel(nogil=True, error_model="numpy")
def mmd_blocks_1d(K: np.ndarray, T: int, n: int, ev: np.ndarray, A: np.ndarray,
                  fwd: np.ndarray, old: np.ndarray, G: np.ndarray, H: np.ndarray,
                  g2: np.ndarray, g2e: np.ndarray, a_ev: np.ndarray, u: np.ndarray) -> None:
    """From the kernel values ``K`` (:func:`mmd_args_1d`'s exponents, exponentiated): the
    inputs of :func:`mmd_recursion_capped` for a capped chunk of one-dimensional pairs, as the
    NumPy path of the MMD witness computes them.

    ``K`` holds, in order: the stored x parts [T, 2n] and y parts [T, 2n] against the new
    points [zx; zy]; the new pairs' xx, xy, yy blocks [n, n] and the dropped pairs' [E, E]; the
    new and the dropped pairs' own k(x, y). Out: ``old`` [n] (the stored witness at each new
    pair), ``G`` [T, n] (``<g_i, g_j>`` of stored pair i and new pair j), ``H`` [n + E, n + E]
    (the Gram block of [new, dropped]; its cross blocks are rows ``ev`` of ``G``), ``g2``,
    ``g2e`` (``||g||^2``), ``a_ev`` (the dropped pairs' coefficients) and ``u`` (the witness
    at each dropped pair from the pairs that outlive it: its ``fwd`` plus the younger dropped
    pairs' terms)."""
    E = ev.shape[0]
    n2 = 2 * n
    oy = T * n2
    for q in range(n):
        sx = 0.0
        sy = 0.0
        tx = 0.0
        ty = 0.0
        for i in range(T):
            a = A[i]
            sx += a * K[i * n2 + q]
            sy += a * K[oy + i * n2 + q]
            tx += a * K[i * n2 + n + q]
            ty += a * K[oy + i * n2 + n + q]
        old[q] = (sx - sy) - (tx - ty)
    for i in range(T):
        for j in range(n):
            G[i, j] = (K[i * n2 + j] - K[oy + i * n2 + j]) - (
                K[i * n2 + n + j] - K[oy + i * n2 + n + j])
    o = 2 * oy
    for blk in range(2):  # the new-new block, then the dropped-dropped block
        m = n if blk == 0 else E
        at = 0 if blk == 0 else n
        xx, xy, yy = o, o + m * m, o + 2 * m * m
        for i in range(m):
            for j in range(m):
                H[at + i, at + j] = ((K[xx + i * m + j] - K[xy + i * m + j])
                                     - K[xy + j * m + i]) + K[yy + i * m + j]
        o += 3 * m * m
    for j in range(n):
        g2[j] = 2.0 - 2.0 * K[o + j]
    o += n
    for e in range(E):
        g2e[e] = 2.0 - 2.0 * K[o + e]
        s = ev[e]
        for j in range(n):
            H[n + e, j] = G[s, j]
            H[j, n + e] = G[s, j]
        a_ev[e] = A[s]
    for e in range(E):
        acc = 0.0
        for i in range(e):
            acc += H[n + i, n + e] * a_ev[i]
        u[e] = fwd[ev[e]] + acc


@kernel(nogil=True, error_model="numpy")
def mmd_fwd_update(fwd: np.ndarray, T: int, G: np.ndarray, pending: float, pos: np.ndarray,
                   H: np.ndarray, a_new: np.ndarray) -> None:
    """The capped MMD witness's ``fwd`` after a chunk of n new pairs, in one pass: the stored
    pairs' entries (slots < T) rescaled by ``pending`` and increased by ``G @ a_new`` (``G``
    [T, n]: their Gram rows against the new pairs; no rows: no increase), and each new pair
    j's entry, at slot ``pos[j]``, ``sum over i >= j of H[j, i] a_new[i]`` (``H``: the new
    pairs' Gram block, its first n rows and columns)."""
    n = a_new.shape[0]
    rows = G.shape[0]
    for i in range(T):
        f = fwd[i]
        if pending != 1.0:
            f *= pending
        if rows:
            acc = 0.0
            for j in range(n):
                acc += G[i, j] * a_new[j]
            f += acc
        fwd[i] = f
    for j in range(n):
        acc = 0.0
        for i in range(j, n):
            acc += H[j, i] * a_new[i]
        fwd[pos[j]] = acc


@kernel(nogil=True, error_model="numpy")
def hockey_stick_cells_1d(x: np.ndarray, y: np.ndarray, edges: np.ndarray, center: float,
                          cx: np.ndarray, cy: np.ndarray) -> None:
    """The cells [n, 2] of one-dimensional pairs under the automatic scores (the value, and its
    distance to ``center``) in the sorted grids ``edges`` [2, W] (padded with +inf): with
    ``left`` the number of edges below the score and ``right`` the number not above it, the
    cell is ``2 * left + (right > left)``, as two binary searches (NumPy's ``searchsorted``
    sides "left" and "right") give it."""
    W = edges.shape[1]
    for side in range(2):
        v = x if side == 0 else y
        out = cx if side == 0 else cy
        for j in range(v.shape[0]):
            for sc in range(2):
                s = v[j] if sc == 0 else abs(v[j] - center)
                lo, hi = 0, W  # first edge >= s
                while lo < hi:
                    mid = (lo + hi) // 2
                    if edges[sc, mid] < s:
                        lo = mid + 1
                    else:
                        hi = mid
                left = lo
                hi = W  # first edge > s (from left on)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if edges[sc, mid] <= s:
                        lo = mid + 1
                    else:
                        hi = mid
                out[j, sc] = 2 * left + (1 if lo > left else 0)


@kernel(nogil=True, error_model="numpy")
def hockey_stick_gaps(cx: np.ndarray, cy: np.ndarray, cnt_x: np.ndarray, cnt_y: np.ndarray,
                      n_cells: int, cand_kind: np.ndarray, cand_score: np.ndarray,
                      cand_k: np.ndarray, coef: np.ndarray, t0: int, gaps: np.ndarray,
                      top: np.ndarray) -> None:
    """First half of the hockey-stick payoffs of a chunk: the (set, stake) experts' log-weights.

    ``cx``, ``cy``: [n, S] cells of x_i and y_i in each score's grid; ``cnt_x``, ``cnt_y``:
    [S * C] counts of the past x / y per cell, updated in place pair by pair, so that pair i sees
    exactly the pairs before it. Candidates: kind 0 {cell < k}, 1 {cell >= k}, 2 {cell == k} on
    score ``cand_score``; ``coef`` [5, L * 2G]: per stake j and component col (column
    j * 2G + col; columns col < G direction 1, G <= col < 2G direction 2) the coefficients of the
    features (n_a, n_b, n_a n_b / t, t, 1) of the expert's log-weight (eta times its plug-in Kelly
    log-wealth, plus its log prior weight).

    Writes ``top[i, col] = max(0, max over sets and stakes of the logit)`` and
    ``gaps[i, E, j * 2G + col] = max(logit - top, -60)``: the log-weights relative to the leader
    (or to the empty set), clamped as in ``EventSetLearner._soft_sets`` (weights below e^-60 of
    the leader's change nothing). The exponential is taken by the caller, vectorised.
    """
    n, S = cx.shape
    C = n_cells
    V = cand_kind.shape[0]
    LG2 = coef.shape[1]
    G2 = top.shape[1]
    L = LG2 // G2
    pre_x = np.empty((S, C + 1), dtype=np.int64)
    pre_y = np.empty((S, C + 1), dtype=np.int64)
    base = np.empty(LG2)
    for i in range(n):
        t = float(t0 + i)
        for s in range(S):
            pre_x[s, 0] = 0
            pre_y[s, 0] = 0
            for c in range(C):
                pre_x[s, c + 1] = pre_x[s, c] + cnt_x[s * C + c]
                pre_y[s, c + 1] = pre_y[s, c] + cnt_y[s * C + c]
        for jc in range(LG2):
            base[jc] = t * coef[3, jc] + coef[4, jc]
        for col in range(G2):
            top[i, col] = 0.0  # the empty set (abstain) has log-weight 0
        for v in range(V):
            kd, s, k = cand_kind[v], cand_score[v], cand_k[v]
            if kd == 0:
                nx = float(pre_x[s, k])
                ny = float(pre_y[s, k])
            elif kd == 1:
                nx = float(pre_x[s, C] - pre_x[s, k])
                ny = float(pre_y[s, C] - pre_y[s, k])
            else:
                nx = float(cnt_x[s * C + k])
                ny = float(cnt_y[s * C + k])
            nxy = nx * ny / t
            for j in range(L):
                for col in range(G2):
                    jc = j * G2 + col
                    lg = nx * coef[0, jc] + ny * coef[1, jc] + nxy * coef[2, jc] + base[jc]
                    gaps[i, v, jc] = lg
                    if lg > top[i, col]:
                        top[i, col] = lg
        for v in range(V):
            for j in range(L):
                for col in range(G2):
                    jc = j * G2 + col
                    g = gaps[i, v, jc] - top[i, col]
                    gaps[i, v, jc] = g if g > -60.0 else -60.0
        for s in range(S):
            cnt_x[s * C + cx[i, s]] += 1
            cnt_y[s * C + cy[i, s]] += 1


@kernel(nogil=True, error_model="numpy")
def hockey_stick_finish(cx: np.ndarray, cy: np.ndarray, cand_kind: np.ndarray,
                        cand_score: np.ndarray, cand_k: np.ndarray, weights: np.ndarray,
                        top: np.ndarray, ratio: np.ndarray, exp_eps: np.ndarray,
                        deltas: np.ndarray, charge_mass: float, out: np.ndarray) -> None:
    """Second half: soft sets at x_i and y_i from the weights ``exp(gaps)`` [n, V, L * 2G], and
    the payoffs ``out`` [n, 2G] (component 2g + d: grid point g, direction d). With Z = all
    weights + e^-top (the empty set's), f(v) = sum over the experts (E, j) with v in E of
    w(E, j) ratio[j] / Z and m = sum over all experts of w(E, j) ratio[j] / Z (both clamped to
    [0, 1]); direction 1 pays f(x) - e^eps f(y) - delta m with its x-heavy sets, direction 2
    pays f'(y) - e^eps f'(x) - delta m' with its y-heavy sets. ``charge_mass`` 0 charges delta
    in full instead of delta m (``bet="ons"``, as before the stake mixture; 1 or 0 exactly)."""
    n, V, LG2 = weights.shape
    G2 = top.shape[1]
    L = LG2 // G2
    G = G2 // 2
    z = np.empty(G2)
    fx = np.empty(G2)
    fy = np.empty(G2)
    mass = np.empty(G2)
    for i in range(n):
        for col in range(G2):
            z[col] = 0.0
            fx[col] = 0.0
            fy[col] = 0.0
            mass[col] = 0.0
        for v in range(V):
            kd, s, k = cand_kind[v], cand_score[v], cand_k[v]
            ax, ay = cx[i, s], cy[i, s]
            if kd == 0:
                in_x, in_y = ax < k, ay < k
            elif kd == 1:
                in_x, in_y = ax >= k, ay >= k
            else:
                in_x, in_y = ax == k, ay == k
            for col in range(G2):
                wz = 0.0
                wr = 0.0
                for j in range(L):
                    w = weights[i, v, j * G2 + col]
                    wz += w
                    wr += w * ratio[j]
                z[col] += wz
                mass[col] += wr
                if in_x:
                    fx[col] += wr
                if in_y:
                    fy[col] += wr
        for col in range(G2):
            zc = z[col] + math.exp(-top[i, col])
            fx[col] = min(max(fx[col] / zc, 0.0), 1.0)
            fy[col] = min(max(fy[col] / zc, 0.0), 1.0)
            mass[col] = charge_mass * min(max(mass[col] / zc, 0.0), 1.0) + (1.0 - charge_mass)
        for g in range(G):
            out[i, 2 * g] = fx[g] - exp_eps[g] * fy[g] - deltas[g] * mass[g]
            out[i, 2 * g + 1] = fy[G + g] - exp_eps[g] * fx[G + g] - deltas[g] * mass[G + g]


@kernel(nogil=True, error_model="numpy")
def log_mean_exp_rows(a: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = log(mean_j exp(a[i, j]))`` for a [n, K] array (K >= 1), stable: the row's
    maximum is taken out first (0 when it is not finite, as :func:`..betting.log_mean_exp`
    does; NaN propagates)."""
    n, K = a.shape
    for i in range(n):
        m = -np.inf
        nan = False
        for j in range(K):
            v = a[i, j]
            if v != v:
                nan = True
            elif v > m:
                m = v
        if nan:
            out[i] = np.nan
            continue
        if not math.isfinite(m):
            m = 0.0
        s = 0.0
        for j in range(K):
            s += math.exp(a[i, j] - m)
        out[i] = math.log(s / K) + m


@kernel(nogil=True, error_model="numpy")
def fresh_start_rows(log_s0: np.ndarray, log_e: np.ndarray, t0: int, out: np.ndarray) -> None:
    """The fresh-start mixture's started mass over a chunk, by its recursion
    ``S_t = e_t (S_{t-1} + w_t)`` with ``w_t = 1 / (t (t + 1))`` in log space (docs/design.md
    section 10): ``out[t, k] = log S`` after step ``t0 + t + 1`` for component k, from
    ``log_s0[k]`` (-inf: nothing started) and ``log_e`` [n, K]."""
    n, K = log_e.shape
    for k in range(K):
        ls = log_s0[k]
        for t in range(n):
            step = float(t0 + t + 1)
            lw = -math.log(step) - math.log1p(step)
            hi = ls if ls > lw else lw
            lo = lw if ls > lw else ls
            if hi == -np.inf:
                both = -np.inf
            else:
                both = hi + math.log1p(math.exp(lo - hi))
            ls = log_e[t, k] + both
            out[t, k] = ls


@kernel(nogil=True, error_model="numpy")
def fresh_start_mixed(log_s: np.ndarray, log_e: np.ndarray, t0: int, traj: np.ndarray) -> None:
    """:func:`fresh_start_rows` for components [K, R] (K groups or lags, R stakes), updating
    ``log_s`` [K, R] in place over the steps of ``log_e`` [S, K, R], and after each step the
    mixed log-wealth ``traj[t]``: per component the stake average of its fresh-start wealths
    (with the weight 1 / (t + 1) of the starts to come), then the average over components
    (docs/design.md section 11)."""
    S, K, R = log_e.shape
    comp = np.empty(K)
    for t in range(S):
        step = float(t0 + t + 1)
        lw = -math.log(step) - math.log1p(step)
        lt = -math.log1p(step)
        for k in range(K):
            m = -np.inf
            for r in range(R):
                ls = log_s[k, r]
                hi = ls if ls > lw else lw
                lo = lw if ls > lw else ls
                both = -np.inf if hi == -np.inf else hi + math.log1p(math.exp(lo - hi))
                ls = log_e[t, k, r] + both
                log_s[k, r] = ls
                if ls > m:
                    m = ls
            if not math.isfinite(m):
                m = 0.0
            acc = 0.0
            for r in range(R):
                acc += math.exp(log_s[k, r] - m)
            a = math.log(acc / R) + m  # the stake average
            hi = a if a > lt else lt
            lo = lt if a > lt else a
            comp[k] = hi + math.log1p(math.exp(lo - hi))
        m = -np.inf
        for k in range(K):
            if comp[k] > m:
                m = comp[k]
        if not math.isfinite(m):
            m = 0.0
        acc = 0.0
        for k in range(K):
            acc += math.exp(comp[k] - m)
        traj[t] = math.log(acc / K) + m


@kernel(nogil=True, error_model="numpy")
def record_chunk(traj: np.ndarray, c: int, thr: float, thr_g: float, start: int,
                 grid_rejected_at: np.ndarray, max_grid_lw: np.ndarray,
                 combined: np.ndarray) -> tuple[int, float]:
    """The book-keeping of a chunk's log-wealth trajectory ``traj`` [n, G * c] (grid point g
    owns components g * c .. g * c + c - 1): ``combined[i]``, the log of the average wealth
    after pair i; per grid point its average, whose running maximum ``max_grid_lw`` and first
    crossing of ``thr_g`` (pairs consumed, from ``start``; only where ``grid_rejected_at`` is
    still -1) are updated in place. Returns (the first i with ``combined[i] >= thr``, or -1;
    the chunk's largest ``combined``)."""
    n, K = traj.shape
    G = K // c
    first = -1
    top = -np.inf
    for i in range(n):
        m = -np.inf
        for j in range(K):
            if traj[i, j] > m:
                m = traj[i, j]
        if not math.isfinite(m):
            m = 0.0
        acc = 0.0
        for j in range(K):
            acc += math.exp(traj[i, j] - m)
        v = math.log(acc / K) + m
        combined[i] = v
        if v > top or v != v:
            top = v
        if first < 0 and v >= thr:
            first = i
        for g in range(G):
            if c == 1:
                w = traj[i, g]
            else:
                m = -np.inf
                for j in range(g * c, g * c + c):
                    if traj[i, j] > m:
                        m = traj[i, j]
                if not math.isfinite(m):
                    m = 0.0
                acc = 0.0
                for j in range(g * c, g * c + c):
                    acc += math.exp(traj[i, j] - m)
                w = math.log(acc / c) + m
            if w > max_grid_lw[g] or w != w:
                max_grid_lw[g] = w
            if grid_rejected_at[g] < 0 and w >= thr_g:
                grid_rejected_at[g] = start + i + 1
    return first, top


def signatures() -> list[tuple[object, tuple[object, ...]]]:
    """(kernel, argument types) of every call the sequential tests make (C-contiguous float64
    and int64 arrays, Python ints and floats), for :func:`dpaudit_torch._warmup.warm_up`."""
    from numba import types as nt

    f1, f2, f3 = nt.float64[::1], nt.float64[:, ::1], nt.float64[:, :, ::1]
    i1, i2 = nt.int64[::1], nt.int64[:, ::1]
    i, f = nt.int64, nt.float64
    return [
        (ons_run, (f2, f1, f1, f1, f1, f, f2)),
        (mmd_recursion_capped, (f1, f1, f1, f1, f1, f2, i, i, f, f, f, f, f, f, f1, f1, f1)),
        (mmd_args_1d, (f1, f1, f, f, f1, f1, i, i1, f1, f1, f1)),
        (mmd_blocks_1d, (f1, i, i, i1, f1, f1, f1, f2, f2, f1, f1, f1, f1)),
        (mmd_fwd_update, (f1, i, f2, f, i1, f2, f1)),
        (hockey_stick_cells_1d, (f1, f1, f2, f, i2, i2)),
        (hockey_stick_gaps, (i2, i2, i1, i1, i, i1, i1, i1, f2, i, f3, f2)),
        (hockey_stick_finish, (i2, i2, i1, i1, i1, f3, f2, f1, f1, f1, f, f2)),
        (log_mean_exp_rows, (f2, f1)),
        (fresh_start_rows, (f1, f2, i, f2)),
        (fresh_start_mixed, (f2, f3, i, f1)),
        (record_chunk, (f2, i, f, f, i, i1, f1, f1)),
    ]
