"""Noise reuse found by near-equality (docs/design.md section 11, "Reuse by near-equality").

DP-SGD's analysis needs a fresh Gaussian draw on every coordinate of every step (Abadi et al.,
"Deep learning with differential privacy", CCS 2016). A reused draw, whatever its pattern (a
cache, a generator re-seeded each epoch, one flat draw sliced per tensor at overlapping
offsets, a rolled or shifted copy, reuse on a subset of tensors), makes two noise values the
auditor reads -- released value minus the clipped sum it read, in the release's units -- equal
up to the rounding of the release. Fresh draws make such a coincidence rare, with a probability
computable from the noise law: the count of near-equal pairs is a test that no reuse pattern
escapes once both copies of a reused value are sampled.

:class:`NoiseReuseTest` processes the values of each step in a fixed order j = 1 .. U. Value j
is *matched* (d_j = 1) when it lies within the rounding tolerance of an earlier value: one of
this step's values before it, or a value of a past step's *signature* (the K values of largest
magnitude among a step's sampled noise, kept for every past step: a few hundred bytes per step,
so that a repeat is found at any lag). Given everything before it, value j is a fresh draw, so
P(d_j = 1 | past) <= pi_j, the sum over the earlier values y of the probability that a fresh
draw falls within the tolerance of y (:func:`near_probability`). For every rho > 1,

    e_t(rho) = prod_j rho^(d_j) / (1 + pi_j (rho - 1))

then has conditional mean at most 1 (a product of conditional binomial e-values), whatever the
dependence between the events. Matches are found by one sort and adjacent differences (this
step) and by binary search in the sorted signatures (past steps): O(U log(U + T K)). A
grid of rho is averaged and the products are mixed over start times (weights 1 / (s (s + 1))),
as in the other noise tests, so reuse that starts late is found as fast as reuse from the start.

The tolerance is derived, not tuned: Opacus releases fl(fl(s + n) / B) in the gradient's dtype
(unit roundoff u), and the auditor recovers n as (release x B) - s, so the recovered value is
within 2 u |s + n| (1 + u) of the drawn one; two copies of one draw are within
tau_a + tau_b of each other with tau = KAPPA u (|release| + |s|), KAPPA = 2. Noise cast to a
low-precision format (bfloat16, float16, float32 in a float64 model) lies on that format's grid,
where fresh draws collide exactly with probability sum_k p_k^2: the bound pi_j takes, for each
earlier value on a grid, the larger of the continuous probability and the grid cell's mass.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import numpy as np
from scipy import special

from .._validation import check_alpha, check_positive_int
from ._noise_precision import _grid_distance
from .betting import log_mean_exp
from .noise import _advance_mixed, _component_log_wealth
from .sampling import _Decision, _host

logger = logging.getLogger(__name__)

__all__ = ["NoiseReuseTest", "near_probability", "rounding_tolerance", "unit_roundoff",
           "KAPPA", "SIGNATURE_SIZE", "DEFAULT_RHOS"]

#: roundings of |release| (or |clipped sum|) that a recovered noise value carries at most
KAPPA = 2.0
#: values kept per step for the search across steps (8 + 4 + 4 bytes each)
SIGNATURE_SIZE = 24
#: the search within a step takes the values whose clipped sum is at most this many noise stds
#: (or the lower quartile of the clipped sums, if larger: at least a quarter of the values)
SMALL_SUM = 4.0
#: the rate ratios bet on (an excess of matches of about rho over the null bound)
DEFAULT_RHOS: tuple[float, ...] = (2.0, 8.0, 32.0, 128.0, 512.0, 2048.0, 8192.0, 32768.0)
#: the low-precision grids a cast noise may lie on: (fraction bits, smallest normal exponent,
#: largest finite value)
_GRIDS: tuple[tuple[int, int, float], ...] = (
    (7, -126, 3.3895313892515355e38),  # bfloat16
    (10, -14, 65504.0),  # float16
    (23, -126, 3.4028234663852886e38),  # float32
)
_UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8,
                  "float16": 2.0 ** -11}
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def unit_roundoff(dtype: object) -> float:
    """The unit roundoff (half the spacing at 1) of a floating dtype (torch or NumPy, or its
    name); float32's for an unknown one."""
    name = str(dtype).replace("torch.", "")
    return _UNIT_ROUNDOFF.get(name, 2.0 ** -24)


def rounding_tolerance(release: np.ndarray, clipped_sum: np.ndarray, u: np.ndarray | float
                       ) -> np.ndarray:
    """tau = KAPPA u (|release| + |clipped sum|) (same units as the arguments): a recovered
    noise value is within tau of the drawn one (module docstring)."""
    return KAPPA * np.asarray(u) * (np.abs(release) + np.abs(clipped_sum))


def near_probability(y: np.ndarray, tau_y: np.ndarray, a_max: float, u: float, std: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Upper bound, for each earlier value y (raw units, with its tolerance ``tau_y``), on the
    probability that a fresh draw X is near-equal to it: |X - y| <= tau_y + tau_X, where
    tau_X <= a + b |X| (a: the tolerance term of X's coordinate that does not depend on its
    noise, at most ``a_max``; b = KAPPA u, u the largest unit roundoff of the release). Returns
    (A, B): the bound is A + a B for a value whose term is a.

    X is N(0, std^2) drawn in any format at least as fine as the release's, or cast to a
    coarser grid (bfloat16, float16, float32 in a float64 model). |X - y| <= tau_y + a + b |X|
    implies |X - y| <= w = (tau_y + a + b |y|) / (1 - b). A draw on a grid of spacing h lands in
    the window with probability at most the Gaussian mass of the window widened by h on each
    side (every grid value in it owns a cell of width h); the release's own grid has
    h <= 2 u |y|, so the continuous bound is 2 (w + 2 u |y|) phi(max(|y| - w_max - 2 u |y|, 0)
    / std) / std, linear in a. Under the null of a coarser grid every recovered value, y
    included, lies within its tolerance of a grid value, and a grid-valued X (which carries its
    own rounding) near y lies in [|y| - 2 w - h, |y| + 2 w + h]: where y is that close to the
    grid, the bound is that interval's mass (at a = a_max); elsewhere that null puts no y. The
    largest of these bounds is taken, so that it holds under every one of these nulls
    (docs/design.md section 11)."""
    ay = np.abs(y)
    b = KAPPA * u
    w0 = (tau_y + b * ay) / (1.0 - b)
    wmax = w0 + a_max / (1.0 - b)
    z = np.maximum(ay - wmax - 2.0 * u * ay, 0.0) / std
    dens = 2.0 * _INV_SQRT_2PI * np.exp(-0.5 * z * z) / std
    A = (w0 + 2.0 * u * ay) * dens
    B = dens / (1.0 - b)
    for bits, min_exp, max_val in _GRIDS:
        if 2.0 ** -(bits + 1) <= u:  # not coarser than the release's own grid
            continue
        dist, spacing = _grid_distance(ay, bits, min_exp, max_val)
        on = dist <= tau_y  # (under that grid's null, every value is within tau of it)
        if on.any():
            half = spacing[on] + 2.0 * wmax[on]
            lo = (ay[on] - half) / std
            hi = (ay[on] + half) / std
            mass = special.ndtr(-lo) - special.ndtr(-hi)  # P(lo < Z < hi), lo may be < 0
            A[on] = np.maximum(A[on], mass)  # (A + a B >= mass for every a >= 0)
    return A, B


#: above this many stored values the keys are sorted before the binary searches (NumPy's
#: search is about 3x faster on sorted keys; the result does not depend on it)
_SORT_KEYS_ABOVE = 512


def _sorted_matches(x: np.ndarray, tau: np.ndarray, sv: np.ndarray, st: np.ndarray,
                    st_max: float, key: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """For each x: whether some sorted stored value v is within tau_x + tau_v of it, and the
    index (in the sorted store) of one such v (the largest such index; -1 if none). ``key``:
    an order that sorts x, if the caller has one."""
    hit = np.zeros(x.size, dtype=bool)
    which = np.full(x.size, -1, dtype=np.int64)
    if not sv.size or not x.size:
        return hit, which
    if sv.size <= _SORT_KEYS_ABOVE:
        key = None
    elif key is None:
        key = np.argsort(x)
    xk, tk = (x, tau) if key is None else (x[key], tau[key])
    w_lo, w_hi = xk - tk - st_max, xk + tk + st_max
    # one search for every key: a stored value lies in [w_lo, w_hi] iff the first one at or
    # above x is at most w_hi or the last one below x is at least w_lo; the window's ends are
    # searched for those keys only
    p = np.searchsorted(sv, xk, side="left")
    n_sv = sv.size
    cand = np.flatnonzero(((p < n_sv) & (sv[np.minimum(p, n_sv - 1)] <= w_hi))
                          | ((p > 0) & (sv[np.maximum(p - 1, 0)] >= w_lo)))
    if not cand.size:
        return hit, which
    lo = np.searchsorted(sv, w_lo[cand], side="left")
    hi = np.searchsorted(sv, w_hi[cand], side="right")
    counts = hi - lo
    rows = np.repeat(cand, counts)
    starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
    idx = starts + np.arange(rows.size)
    ok = np.abs(xk[rows] - sv[idx]) <= tk[rows] + st[idx]
    if ok.any():
        at = rows[ok] if key is None else key[rows[ok]]
        hit[at] = True
        which[at] = idx[ok]  # (a row's candidates in increasing index: the largest is kept)
    return hit, which


def _stable_order(v: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """``np.argsort(v, kind="stable")``: ``order`` (any order that sorts v; computed if None)
    where v has no equal values, which is then the stable order itself, else the stable sort."""
    if order is None:
        order = np.argsort(v)
    vs = v[order]
    if vs.size > 1 and bool(np.any(vs[1:] == vs[:-1])):
        return np.argsort(v, kind="stable")
    return order


def _lower_quartile(a: np.ndarray) -> float:
    """``np.quantile(a, 0.25)`` (its default linear interpolation, to the last bit) by a
    partition instead of a sort."""
    n = a.size
    vi = (n - 1) * 0.25
    i = int(vi)
    g = vi - i
    j = min(i + 1, n - 1)
    p = np.partition(a, (i, j)) if j != i else np.partition(a, i)
    lo, hi = float(p[i]), float(p[j])
    d = hi - lo
    return hi - d * (1.0 - g) if g >= 0.5 else lo + d * g


class NoiseReuseTest(_Decision):
    """Anytime-valid test that no noise value is reused, by counting near-equal values (module
    docstring). Feed each step's noise values with :meth:`update_steps`.

    Args:
        alpha: level of the test.
        signature_size: values kept per step for the search across steps (K).
        rhos: the rate ratios rho > 1 bet on (the grid is averaged).
        strata: optional boundaries [0, ..., U] of contiguous strata of the positions (the
            tensors, where the coordinates are tensor-major): a signature's slots are dealt
            over them, so that reuse confined to a few tensors is seen; None: one stratum.
    """

    kind: str = "noise_reuse"

    def __init__(self, alpha: float = 0.05, signature_size: int = SIGNATURE_SIZE,
                 rhos: tuple[float, ...] = DEFAULT_RHOS,
                 strata: np.ndarray | None = None) -> None:
        self.alpha = check_alpha(alpha)
        self.signature_size = check_positive_int(signature_size, "signature_size")
        r = np.asarray(rhos, dtype=np.float64)
        if r.ndim != 1 or not r.size or not np.all(np.isfinite(r) & (r > 1.0)):
            raise ValueError(f"rhos must be a non-empty sequence of finite numbers > 1, "
                             f"got {rhos!r}")
        self.rhos = r
        self._log_rho = np.log(r)
        self._strata = None if strata is None else np.asarray(strata, dtype=np.int64)
        if self._strata is not None and (self._strata.ndim != 1 or self._strata.size < 2
                                         or self._strata[0] != 0
                                         or np.any(np.diff(self._strata) <= 0)):
            raise ValueError(f"strata must be increasing boundaries from 0, got {strata!r}")
        self.reset()

    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._log_s = np.full((2, self.rhos.size), -np.inf)
        # the signatures of every past step, sorted by value: raw value, tolerance, step
        self._sv = np.zeros(0)
        self._st = np.zeros(0, dtype=np.float32)
        self._ss = np.zeros(0, dtype=np.int32)
        self._st_max = 0.0
        #: (cap, roundoff, std, sum A, sum B) of the store's null bound (_store_bound)
        self._cache: tuple[float, float, float, float, float] | None = None
        self._across = 0  # matched values against a past step's signature
        self._within = 0  # matched values against an earlier value of the same step
        self._expected = 0.0  # sum of pi_j: the null bound on the number of matches
        self._lags: Counter[int] = Counter()
        self._first_match: int | None = None

    def update_steps(self, noise: np.ndarray, release: np.ndarray, u: np.ndarray,
                     stds: np.ndarray | list[float], steps: list[int] | None = None
                     ) -> np.ndarray:
        """Several steps in row order: ``noise`` [S, U] the recovered noise in raw units,
        ``release`` [S, U] the raw released values it came from (clipped sum = release -
        noise), ``u`` [U] the unit roundoff of each coordinate's release dtype, ``stds`` [S] the
        claimed noise standard deviation of each step (raw units, > 0), ``steps`` the training
        steps (for the lags reported; default 1, 2, ...). Returns the log-wealth after each."""
        x = np.asarray(noise, dtype=np.float64)
        rel = np.asarray(release, dtype=np.float64)
        if x.ndim != 2 or rel.shape != x.shape:
            raise ValueError(f"noise and release must be [steps, U] of one shape, got "
                             f"{x.shape} and {rel.shape}")
        S = x.shape[0]
        sd = np.asarray(stds, dtype=np.float64).reshape(-1)
        if sd.size != S or not np.all(np.isfinite(sd) & (sd > 0)):
            raise ValueError(f"stds must hold {S} finite numbers > 0, got {stds!r}")
        uu = np.broadcast_to(np.asarray(u, dtype=np.float64), (x.shape[1],))
        if steps is None:
            steps = list(range(self._t + 1, self._t + S + 1))
        if S == 0:
            return np.zeros(0)
        log_e = np.empty((S, 2, self.rhos.size))
        block_v: list[np.ndarray] = []
        block_t: list[np.ndarray] = []
        block_s: list[np.ndarray] = []
        for i in range(S):
            log_e[i] = self._one_step(x[i], rel[i], uu, float(sd[i]), int(steps[i]),
                                         block_v, block_t, block_s)
        self._log_s, traj = _advance_mixed(self._log_s, log_e, self._t)
        self._t += S
        self._record(traj)
        if block_v:
            self._insert(np.concatenate(block_v), np.concatenate(block_t),
                         np.concatenate(block_s))
        return traj

    def _one_step(self, x: np.ndarray, rel: np.ndarray, u: np.ndarray, std: float, step: int,
                  block_v: list[np.ndarray], block_t: list[np.ndarray],
                  block_s: list[np.ndarray]) -> np.ndarray:
        n = x.size
        s_abs = np.abs(rel - x)
        tau = rounding_tolerance(rel, rel - x, u)
        umax = float(u.max()) if n else 0.0
        a_max = float((2.0 * KAPPA * u * s_abs).max()) if n else 0.0
        a = 2.0 * KAPPA * u * s_abs  # each value's tolerance term known before its noise
        # the earlier steps' signatures: the sorted store (its bound's sums cached) and this
        # block's earlier steps (a few values, sorted here)
        A_sum, B_sum = self._store_bound(a_max, umax, std)
        st_main = self._st.astype(np.float64)
        key = np.argsort(x) if self._sv.size > _SORT_KEYS_ABOVE else None
        across, which = _sorted_matches(x, tau, self._sv, st_main, self._st_max, key)
        lag_of = np.zeros(n, dtype=np.int64)
        lag_of[across] = step - self._ss[which[across]]
        if block_v:
            bv, bt = np.concatenate(block_v), np.concatenate(block_t)
            bs = np.concatenate(block_s)
            order = np.argsort(bv, kind="stable")
            bv, bt, bs = bv[order], bt[order], bs[order]
            A_b, B_b = near_probability(bv, bt, a_max, umax, std)
            A_sum, B_sum = A_sum + float(A_b.sum()), B_sum + float(B_b.sum())
            hit_b, which_b = _sorted_matches(x, tau, bv, bt, float(bt.max()))
            new = hit_b & ~across
            lag_of[new] = step - bs[which_b[new]]
            across |= hit_b
        pi_across = np.minimum(A_sum + a * B_sum, 1.0) if (A_sum or B_sum) else np.zeros(n)
        # this step, among the values whose clipped sum is small (a choice made from the sums
        # alone, before the noise: a large sum makes a wide tolerance, which fresh values fall
        # into by chance): one sort, adjacent differences; a match counts for the later value
        small = np.flatnonzero(s_abs <= max(SMALL_SUM * std, _lower_quartile(s_abs)))
        xj, tj, aj = x[small], tau[small], a[small]
        order = _stable_order(xj, key if key is not None and small.size == n else None)
        xs = xj[order]
        near = np.abs(np.diff(xs)) <= tj[order][1:] + tj[order][:-1]
        within = np.zeros(n, dtype=bool)
        if near.any():
            k = np.flatnonzero(near)
            within[small[np.maximum(order[k], order[k + 1])]] = True
        A_h, B_h = near_probability(xj, tj, float(aj.max()) if aj.size else 0.0, umax, std)
        cum_a = np.concatenate(([0.0], np.cumsum(A_h)[:-1]))
        cum_b = np.concatenate(([0.0], np.cumsum(B_h)[:-1]))
        pi_within = np.zeros(n)
        pi_within[small] = np.minimum(cum_a + aj * cum_b, 1.0)
        r1 = self.rhos - 1.0
        log_e = np.stack([
            int(across.sum()) * self._log_rho - np.log1p(np.outer(pi_across, r1)).sum(axis=0),
            int(within.sum()) * self._log_rho - np.log1p(np.outer(pi_within, r1)).sum(axis=0)])
        pi = pi_across + pi_within
        d = across | within
        n_d = int(d.sum())
        # book-keeping for the report
        n_across, n_within = int(across.sum()), int((within & ~across).sum())
        self._across += n_across
        self._within += n_within
        self._expected += float(pi.sum())
        if n_across:
            self._lags.update(lag_of[across].tolist())
        if n_d and self._first_match is None:
            self._first_match = step
        # this step's signature: the largest values in magnitude, spread over the strata
        top = self._signature(x, step, small)
        if top.size:
            block_v.append(x[top].copy())
            block_t.append(tau[top].astype(np.float32).astype(np.float64))
            block_s.append(np.full(top.size, step, dtype=np.int32))
        return log_e

    def _signature(self, x: np.ndarray, step: int, small: np.ndarray) -> np.ndarray:
        """Positions of this step's signature: K slots dealt over the strata (tensors), every
        stratum at least one slot per step where there are at most K, else K strata in turn
        (each stratum every ceil(strata / K) steps); in each stratum its values of largest
        magnitude (the least likely to coincide by chance), among the positions ``small`` (a
        small clipped sum: a narrow tolerance) where the stratum has enough of them."""
        K = self.signature_size
        strata = self._strata if self._strata is not None and self._strata[-1] == x.size \
            else np.array([0, x.size])
        m = strata.size - 1
        if m <= K:
            chosen = np.arange(m)
            slots = np.full(m, K // m)
            slots[:K % m] += 1
        else:
            chosen = (step * K + np.arange(K)) % m
            slots = np.ones(K, dtype=np.int64)
        out = []
        for g, k in zip(chosen, slots):
            lo, hi = int(strata[g]), int(strata[g + 1])
            k = min(int(k), hi - lo)
            if k > 0:
                inside = small[(small >= lo) & (small < hi)]
                at = inside if inside.size >= k else np.arange(lo, hi)
                out.append(at[np.argpartition(-np.abs(x[at]), k - 1)[:k]])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _store_bound(self, a_max: float, u: float, std: float) -> tuple[float, float]:
        """(sum of A, sum of B) of :func:`near_probability` over the sorted store, computed at a
        cap a_cap >= a_max (a larger a only widens the windows: still a bound) and kept, so that
        a step costs O(1) here; recomputed when a_max exceeds the cap (then 2 a_max) or the
        release's roundoff or the noise std changes (a noise schedule)."""
        c = self._cache
        if c is not None and a_max <= c[0] and c[1] == u and c[2] == std:
            return c[3], c[4]
        cap = 2.0 * a_max
        if self._sv.size:
            A, B = near_probability(self._sv, self._st.astype(np.float64), cap, u, std)
            sums = (float(A.sum()), float(B.sum()))
        else:
            sums = (0.0, 0.0)
        self._cache = (cap, u, std, *sums)
        return sums

    def _insert(self, v: np.ndarray, t: np.ndarray, s: np.ndarray) -> None:
        c = self._cache
        if c is not None:  # the new values' bounds at the cached cap, added to the sums
            A, B = near_probability(v, t.astype(np.float32).astype(np.float64), c[0], c[1], c[2])
            self._cache = (c[0], c[1], c[2], c[3] + float(A.sum()), c[4] + float(B.sum()))
        self._st_max = max(self._st_max, float(t.max())) if t.size else self._st_max
        order = np.argsort(v, kind="stable")
        v, t, s = v[order], t[order], s[order]
        at = np.searchsorted(self._sv, v)
        self._sv = np.insert(self._sv, at, v)
        self._st = np.insert(self._st, at, t.astype(np.float32))
        self._ss = np.insert(self._ss, at, s.astype(np.int32))

    @property
    def log_wealth(self) -> float:
        if self._t == 0:
            return 0.0
        return float(log_mean_exp(_component_log_wealth(self._log_s, self._t)))

    @property
    def signature_bytes(self) -> int:
        """Memory of the kept signatures."""
        return int(self._sv.nbytes + self._st.nbytes + self._ss.nbytes)

    def common_lags(self, k: int = 3) -> list[int]:
        """The most frequent lags (steps) between a matched value and its earlier copy."""
        return [lag for lag, _ in self._lags.most_common(k)]

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        return {"test": self.kind, "alpha": self.alpha, "n_steps": self._t,
                "log_wealth": self.log_wealth, "max_log_wealth": self._max_lw,
                "rejected": self.rejected, "rejected_at": self._rejected_at,
                "matched_across_steps": self._across, "matched_within_step": self._within,
                "null_bound_matches": self._expected, "first_match_step": self._first_match,
                "common_lags": self.common_lags(), "signature_size": self.signature_size,
                "signature_bytes": self.signature_bytes}

    def _config(self) -> dict[str, Any]:
        return {"kind": self.kind, "alpha": self.alpha, "signature_size": self.signature_size,
                "rhos": self.rhos.tolist()}

    def state_dict(self) -> dict[str, Any]:
        return {"config": self._config(), "t": self._t, "rejected_at": self._rejected_at,
                "max_lw": self._max_lw, "log_s": self._log_s.copy(), "sv": self._sv.copy(),
                "st": self._st.copy(), "ss": self._ss.copy(), "across": self._across,
                "within": self._within, "expected": self._expected,
                "lags": dict(self._lags), "first_match": self._first_match,
                "cache": None if self._cache is None else list(self._cache)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if not isinstance(sd, dict) or sd.get("config") != self._config():
            raise ValueError(f"not a state_dict of this {type(self).__name__} configuration")
        self.reset()
        self._t, self._rejected_at = int(sd["t"]), sd["rejected_at"]
        self._max_lw = float(sd["max_lw"])
        self._log_s = np.array(_host(sd["log_s"]), dtype=np.float64).reshape(2, self.rhos.size)
        self._sv = np.array(_host(sd["sv"]), dtype=np.float64)
        self._st = np.array(_host(sd["st"]), dtype=np.float32)
        self._ss = np.array(_host(sd["ss"]), dtype=np.int32)
        self._st_max = float(self._st.max()) if self._st.size else 0.0
        c = sd.get("cache")
        self._cache = None if c is None else (float(c[0]), float(c[1]), float(c[2]),
                                              float(c[3]), float(c[4]))
        self._across, self._within = int(sd["across"]), int(sd["within"])
        self._expected = float(sd["expected"])
        self._lags = Counter({int(k): int(v) for k, v in sd["lags"].items()})
        self._first_match = sd["first_match"]
