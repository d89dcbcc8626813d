"""The released noise against the whole null: iid N(0, 1) (docs/design.md section 11,
"The whole null").

Under a correct DP-SGD release the standardised noise xi = (released - real clipped sum) /
(sigma C) at the observed coordinates is iid N(0, 1): across the coordinates of a tensor, across
tensors and parameter groups, across steps (Abadi et al., CCS 2016). The tests of
:mod:`dpaudit_torch.stats.noise` bet against a list of alternatives (a smaller variance, re-used
noise); :class:`NoiseNullTest` bets against any departure that changes the probabilities of a
fixed set of cells of the probability integral transform u = Phi(xi), of single values and of
structured pairs of values:

* ``shape``: u of every value in 16 cells of mass 1/16 (heavy or light tails, bimodality,
  discreteness, a skew: Laplace, uniform or Rademacher noise of the claimed variance);
* ``tails``: u of every value in 8 cells at tail masses 1e-4, 1e-3, 1e-2 on each side;
* pairs taken within a step, each pair's (u_a, u_b) in the 4 x 4 cells of mass 1/16 of the unit
  square: ``adjacent`` (flat indices f, f + 1 of one tensor), ``column`` (f and f + row length:
  the same position of the next output row), ``aligned_even`` / ``aligned_odd`` (the same flat
  index in tensors 2i and 2i + 1, or 2i + 1 and 2i + 2), ``same_shape`` (the same flat index in
  consecutive tensors of one shape); within a family no value is in two pairs;
* ``lag1``: the same coordinate at consecutive steps: the cell of u_t given the cell of u_{t-1}
  (4 x 4 conditional cells of mass 1/4).

Each family bets with the Krichevsky-Trofimov mixture (Dirichlet(1/2) over the cells' masses;
Krichevsky & Trofimov, IEEE Trans. IT 1981): its wealth after N values with cell counts n_k is the
mixture likelihood ratio DM(n; 1/2) / prod_k p0_k^(n_k), which is the product over the values, in
any order, of the predictable bets KT_t(k) / p0_k (the KT estimate from the values before). Under
the null each factor has conditional mean 1, so the wealth is a test martingale (Shafer & Vovk,
"Game-theoretic foundations for probability and finance", 2019; Ville 1939; Ramdas, Gruenwald,
Vovk & Shafer, Statistical Science 2023). Its log grows like N KL(q || p0) - (K - 1)/2 log N
against any fixed cell masses q != p0. The families are averaged (an average of e-processes on
one filtration is one). Cells are assigned by comparing xi with float64 quantiles of N(0, 1), so
no PIT is computed in float32 (whose values near 1 have a spacing of 6e-8 and saturate at
xi ~ 5.4).

Work per step: one ``searchsorted`` of the U values into 19 edges and one ``bincount``; the state
is the families' cell counts and the last step's quartile of each coordinate (one byte each).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special
from scipy import stats as sps

from .._validation import check_alpha
from .betting import log_mean_exp
from .noise import _as_step_rows
from .sampling import _Decision

logger = logging.getLogger(__name__)

__all__ = ["NoiseNullTest", "noise_pairs", "SHAPE_CELLS", "TAIL_MASSES", "PAIR_CELLS"]

#: the single values' equal-mass cells of u
SHAPE_CELLS = 16
#: the tail cells' masses on each side
TAIL_MASSES: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
#: cells of each coordinate of a pair (PAIR_CELLS^2 cells of the square)
PAIR_CELLS = 4
#: the Krichevsky-Trofimov prior (Dirichlet parameter of each cell)
KT_PRIOR = 0.5
#: the uniform grid of xi that locates a value's edges (bins of 1/64 from -4 - 1/128: no edge,
#: 0 included, lies on a grid line; every bin holds at most one edge)
_GRID_LO = -4.0 - 1.0 / 128.0
_GRID_INV = 64.0
_GRID_BINS = 8 * 64 + 2


def _greedy_disjoint(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs (a[i], b[i]) in order, kept when neither value is in a pair kept before
    (every value in at most one pair: the pairs of one step are independent under the null)."""
    used: set[int] = set()
    ka, kb = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        if x != y and x not in used and y not in used:
            used.add(x)
            used.add(y)
            ka.append(x)
            kb.append(y)
    return np.asarray(ka, dtype=np.int64), np.asarray(kb, dtype=np.int64)


def noise_pairs(tensor_of: np.ndarray, flat: np.ndarray,
                shapes: Sequence[Sequence[int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The structured pairs of observed coordinates, by family: positions (a, b) into the
    observed coordinates (``tensor_of``, ``flat``: each coordinate's tensor and flat index;
    ``shapes``: every tensor's shape). Fixed before any noise is seen; families without a pair
    are left out."""
    t = np.asarray(tensor_of, dtype=np.int64).reshape(-1)
    f = np.asarray(flat, dtype=np.int64).reshape(-1)
    if t.shape != f.shape:
        raise ValueError(f"tensor_of and flat differ in length ({t.size} vs {f.size})")
    shp = [tuple(int(d) for d in s) for s in shapes]
    n_t = len(shp)
    if t.size and (t.min() < 0 or t.max() >= n_t):
        raise ValueError(f"tensor ids must lie in [0, {n_t})")
    numel = np.array([int(np.prod(s)) if s else 1 for s in shp], dtype=np.int64)
    width = int(numel.max()) + 1 if n_t else 1
    key = t * width + f
    order = np.argsort(key, kind="stable")
    skey = key[order]

    def find(want: np.ndarray) -> np.ndarray:
        """Position of each wanted key among the observed, -1 where not observed."""
        i = np.clip(np.searchsorted(skey, want), 0, max(skey.size - 1, 0))
        hit = skey[i] == want if skey.size else np.zeros(want.shape, bool)
        return np.where(hit, order[i], -1)

    def family(src: np.ndarray, dst_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = find(dst_key)
        ok = j >= 0
        return _greedy_disjoint(src[ok], j[ok])

    idx = order  # candidates in (tensor, flat) order
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    ti, fi = t[idx], f[idx]
    nxt = fi + 1
    ok = nxt < numel[ti]
    out["adjacent"] = family(idx[ok], (ti * width + nxt)[ok])
    rows = np.array([s[0] if len(s) >= 2 else 0 for s in shp], dtype=np.int64)
    stride = np.where(rows >= 2, numel // np.maximum(rows, 1), 0)
    ok = (stride[ti] > 0) & (fi + stride[ti] < numel[ti])
    out["column"] = family(idx[ok], (ti * width + fi + stride[ti])[ok])
    for name, start in (("aligned_even", 0), ("aligned_odd", 1)):
        partner = np.full(n_t, -1, dtype=np.int64)
        for a in range(start, n_t - 1, 2):
            partner[a] = a + 1
        p = partner[ti]
        ok = (p >= 0) & (fi < numel[np.maximum(p, 0)])
        out[name] = family(idx[ok], (p * width + fi)[ok])
    partner = np.full(n_t, -1, dtype=np.int64)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(shp):
        by_shape.setdefault(s, []).append(i)
    for members in by_shape.values():
        for a, b in zip(members[0::2], members[1::2]):
            if b != a + 1:  # (consecutive tensors are paired by the aligned families)
                partner[a] = b
    p = partner[ti]
    ok = p >= 0
    out["same_shape"] = family(idx[ok], (p * width + fi)[ok])
    return {k: v for k, v in out.items() if v[0].size}


def _cell_edges() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(edges, shape map, tail map, quartile map, tail cell masses): the fine cells of xi are
    cut at the union of the 16-quantiles and the tail quantiles of N(0, 1) (float64); each family
    maps a fine cell to its own cell."""
    probs = sorted({k / SHAPE_CELLS for k in range(1, SHAPE_CELLS)}
                   | set(TAIL_MASSES) | {1.0 - m for m in TAIL_MASSES})
    edges = sps.norm.ppf(np.asarray(probs))
    upper = np.append(probs, 1.0)  # the upper probability of each fine cell
    shape_map = np.searchsorted(np.arange(1, SHAPE_CELLS) / SHAPE_CELLS, upper, side="left")
    tail_p = np.array(sorted(set(TAIL_MASSES) | {0.5} | {1.0 - m for m in TAIL_MASSES}))
    tail_map = np.searchsorted(tail_p, upper, side="left")
    tail_mass = np.diff(np.r_[0.0, tail_p, 1.0])
    quart_map = np.searchsorted(np.arange(1, PAIR_CELLS) / PAIR_CELLS, upper, side="left")
    return edges, shape_map, tail_map, quart_map, tail_mass


def _kt_log_e(counts: np.ndarray, log_p0: np.ndarray) -> np.ndarray:
    """log of the KT mixture likelihood ratio of cell counts ``counts`` [..., K] against the
    null masses exp(log_p0) [K]: log DM(n; 1/2) - sum_k n_k log p0_k."""
    n = counts.astype(np.float64)
    k = n.shape[-1]
    a = KT_PRIOR
    dm = (special.gammaln(k * a) - special.gammaln(n.sum(axis=-1) + k * a)
          + (special.gammaln(n + a) - special.gammaln(a)).sum(axis=-1))
    return dm - (n * log_p0).sum(axis=-1)


class NoiseNullTest(_Decision):
    """Anytime-valid test of H0: the standardised noise is iid N(0, 1) at the observed
    coordinates, within and across steps (see the module docstring and docs/design.md).

    Args:
        tensor_of, flat: per observed coordinate (the columns of the rows passed to
            :meth:`update_steps`), its tensor and its flat index in that tensor.
        shapes: every tensor's shape (for rows and columns). ``flat`` or ``shapes`` None: the
            structure is not known, and only single values and lag-1 pairs are bet on.
        alpha: level of the test, in (0, 1).
    """

    kind: str = "noise_whole_null"
    _STATE = ("_counts", "_prev")

    def __init__(self, tensor_of: np.ndarray, flat: np.ndarray | None,
                 shapes: Sequence[Sequence[int]] | None, alpha: float = 0.05) -> None:
        self.alpha = check_alpha(alpha)
        self.n = int(np.asarray(tensor_of).size)
        self.pairs = ({} if flat is None or shapes is None
                      else noise_pairs(tensor_of, flat, shapes))
        self._edges, self._shape_map, self._tail_map, self._quart_map, tail_mass = _cell_edges()
        q = PAIR_CELLS
        # families: (name, cells, log null mass per cell, rows of the conditional table)
        fams: list[tuple[str, int, np.ndarray, int]] = [
            ("shape", SHAPE_CELLS, np.full(SHAPE_CELLS, -math.log(SHAPE_CELLS)), 1),
            ("tails", tail_mass.size, np.log(tail_mass), 1)]
        fams += [(name, q * q, np.full(q * q, -2.0 * math.log(q)), 1) for name in self.pairs]
        fams.append(("lag1", q * q, np.full(q * q, -math.log(q)), q))
        self.families = [name for name, _, _, _ in fams]
        self._cells = np.array([c for _, c, _, _ in fams], dtype=np.int64)
        self._offsets = np.r_[0, np.cumsum(self._cells)[:-1]].astype(np.int64)
        self._log_p0 = [lp for _, _, lp, _ in fams]
        self._rows = [r for _, _, _, r in fams]
        pa = [self.pairs[k][0] for k in self.pairs]
        self._all_a = np.concatenate([np.zeros(0, np.int64), *pa])
        self._all_b = np.concatenate([np.zeros(0, np.int64), *[self.pairs[k][1]
                                                                for k in self.pairs]])
        self._all_off = np.concatenate([np.zeros(0, np.int16), *[
            np.full(a.size, self._offsets[2 + i], np.int32) for i, a in enumerate(pa)]]
        ).astype(np.int32)
        self._lag_off = int(self._offsets[-1])
        self._shape_map = self._shape_map.astype(np.intp)
        self._tail_map = self._tail_map.astype(np.intp)
        self._quart_map = self._quart_map.astype(np.int32)
        # the grid of _fine_cells: per grid bin, the edges at or below its left end
        left = _GRID_LO + np.arange(_GRID_BINS) / _GRID_INV
        self._grid_lo = np.searchsorted(self._edges, left, side="right").astype(np.intp)
        self._next_edge = np.r_[self._edges, np.inf]
        gap = np.abs(self._edges[:, None] - left[None, 1:]).min()
        assert gap > 1e-9 and np.diff(self._edges).min() > 1.0 / _GRID_INV
        self.reset()

    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._counts = np.zeros(int(self._cells.sum()), dtype=np.int64)
        #: the last step's quartile cell of each coordinate (-1: no step yet)
        self._prev = np.full(self.n, -1, dtype=np.int32)

    def _family_log_e(self, counts: np.ndarray) -> np.ndarray:
        """Per family, the log e-value of cumulative counts [S, total cells]: [S, families]."""
        out = np.empty((counts.shape[0], len(self.families)))
        for i, (off, c, lp, r) in enumerate(zip(self._offsets, self._cells, self._log_p0,
                                                 self._rows)):
            block = counts[:, off:off + c]
            if r == 1:
                out[:, i] = _kt_log_e(block, lp)
            else:  # a conditional table: one KT mixture per row, each against its row's masses
                per = block.reshape(block.shape[0], r, c // r)
                out[:, i] = _kt_log_e(per, lp[:c // r]).sum(axis=1)
        return out

    def _fine_cells(self, x: np.ndarray) -> np.ndarray:
        """The fine cell of every value (the number of edges <= x), as ``searchsorted`` gives
        it, in a few passes: a uniform grid of xi finds the edges below the value's grid bin,
        and one exact float64 comparison with the next edge settles the bin's edge, if any."""
        g = (x - _GRID_LO) * _GRID_INV
        np.clip(g, 0.0, _GRID_BINS - 1.0, out=g)
        lo = self._grid_lo[g.astype(np.intp)]
        lo += x >= self._next_edge[lo]
        return lo

    def update_steps(self, xs: np.ndarray) -> np.ndarray:
        """Several steps at once: ``xs`` [S, n] of standardised noise (N(0, 1) under H0), the
        same coordinates in the same order at every step. Returns the log-wealth after each
        step ([S])."""
        x = _as_step_rows(xs)
        S, n = x.shape
        if n != self.n:
            raise ValueError(f"expected {self.n} coordinates per step, got {n}")
        if S == 0:
            return np.zeros(0)
        fine = self._fine_cells(x)  # [S, n]
        n_fine = self._edges.size + 1
        fine_counts = np.bincount((fine + (np.arange(S) * n_fine)[:, None]).reshape(-1),
                                  minlength=S * n_fine).reshape(S, n_fine)
        total = int(self._cells.sum())
        per_step = np.zeros((S, total), dtype=np.int64)
        np.add.at(per_step, (slice(None), self._shape_map + self._offsets[0]), fine_counts)
        np.add.at(per_step, (slice(None), self._tail_map + self._offsets[1]), fine_counts)
        quart = self._quart_map[fine]  # [S, n], int16
        prev = np.empty_like(quart)
        prev[0] = self._prev
        prev[1:] = quart[:-1]
        lag = prev * PAIR_CELLS + quart + self._lag_off
        first = self._t == 0  # the first step has no predecessor
        if first:
            lag[0] = -1
        cells = np.concatenate([quart[:, self._all_a] * PAIR_CELLS + quart[:, self._all_b]
                                + self._all_off, lag], axis=1)
        cells += (np.arange(S, dtype=cells.dtype) * total)[:, None]
        cells = cells.reshape(-1)
        if first:
            cells = cells[cells >= 0]
        per_step += np.bincount(cells, minlength=S * total).reshape(S, total)
        cum = self._counts[None] + np.cumsum(per_step, axis=0)
        log_e = self._family_log_e(cum)  # [S, families]
        traj = np.atleast_1d(np.asarray(log_mean_exp(log_e, axis=-1), dtype=np.float64))
        self._counts = cum[-1].copy()
        self._prev = quart[-1].copy()
        self._t += S
        self._record(traj)
        return traj

    @property
    def family_log_wealth(self) -> np.ndarray:
        """log-wealth of each family's e-process, float64 array [families]."""
        return self._family_log_e(self._counts[None])[0]

    @property
    def log_wealth(self) -> float:
        """log of the average of the families' wealths (this test's e-process)."""
        if self._t == 0:
            return 0.0
        return float(log_mean_exp(self.family_log_wealth))

    def worst_family(self) -> str:
        """The family with the largest log-wealth."""
        return self.families[int(np.argmax(self.family_log_wealth))]

    def family_counts(self, name: str) -> np.ndarray:
        """The cumulative cell counts of family ``name`` (a copy)."""
        i = self.families.index(name)
        return self._counts[self._offsets[i]:self._offsets[i] + self._cells[i]].copy()

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        lw = self.family_log_wealth if self._t else np.zeros(len(self.families))
        return {
            "test": self.kind,
            "alpha": self.alpha,
            "n_steps": self._t,
            "n_samples": self.n,
            "families": list(self.families),
            "per_step": [int(self.pairs[k][0].size) if k in self.pairs else self.n
                         for k in self.families],
            "log_wealth": self.log_wealth,
            "max_log_wealth": self._max_lw,
            "family_log_wealth": lw.tolist(),
            "worst_family": self.worst_family(),
            "rejected": self.rejected,
            "rejected_at": self._rejected_at,
        }

    def _config(self) -> dict[str, Any]:
        return {"kind": self.kind, "alpha": self.alpha, "n": self.n,
                "families": list(self.families),
                "pairs": {k: int(v[0].size) for k, v in self.pairs.items()}}
