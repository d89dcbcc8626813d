"""The set learner of the sequential hockey-stick test (docs/design.md section 3).

:class:`~dpaudit_torch.stats.hockey_stick.HockeyStickTest` bets on soft sets f_t learned from the
past pairs; this module holds that learner (the construction and its validity argument are in
the module docstring of :mod:`dpaudit_torch.stats.hockey_stick`):

* *scores*: every output v is mapped to S real scores (the value and its distance to the pooled
  median for d = 1; after robust standardisation, the projection on the difference of the past
  means and the distance to the pooled centre for d > 1; or the user's score callables);
* *grids*: per score, midpoints at the pooled empirical quantiles plus every repeated value (an
  atom, a cell of its own), and the cell of a score in that grid;
* *candidate sets*: the proper half-lines of each grid, every atom cell alone (and the empty set);
* *soft sets*: the Gibbs mixture of the experts (E, lambda_j) -- a candidate set and a stake
  of a fixed grid -- weighted by pi_j exp(eta t J(E, lambda_j)), J the plug-in Kelly log-growth
  of betting lambda_j on E (exponential weights; Cesa-Bianchi & Lugosi, "Prediction, Learning,
  and Games", 2006, ch. 2); each expert enters the soft set with its stake ratio.

Every quantity is computed from pairs before the current one only (predictable).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["EventSetLearner", "ScoreFn"]

ScoreFn = Callable[[torch.Tensor], torch.Tensor]

#: robust-standardisation clip for the automatic vector scores
_CLIP = 10.0
#: the normal-consistency factor of the median absolute deviation
_MAD_TO_SD = 1.482602218505602


class EventSetLearner:
    """Mixin of :class:`~dpaudit_torch.stats.hockey_stick.HockeyStickTest`: scores, grids,
    candidate sets and the soft sets bet on.

    It reads the test's configuration (``grid_cells``, ``max_atoms``, the user scores
    ``_score_fns`` and the Kelly coefficients ``_kelly_coef``) and the grid state the test keeps
    (``_score_params``, ``_edges``, ``_atom_cell``, ``_n_cells_s``); :meth:`_build_candidates`
    sets the candidate tables ``_cand_*``.
    """

    # supplied by HockeyStickTest
    grid_cells: int
    max_atoms: int
    _score_fns: list[ScoreFn] | None
    _score_params: dict[str, torch.Tensor]
    _kelly_coef: torch.Tensor
    _stake_ratio_t: torch.Tensor
    _edges: torch.Tensor | None
    _atom_cell: torch.Tensor | None
    _n_cells_s: torch.Tensor | None

    # ------------------------------------------------------------------ scores
    def _fit_auto_score(self, hx: torch.Tensor, hy: torch.Tensor) -> None:
        hx, hy = hx.to(torch.float64), hy.to(torch.float64)
        pooled = torch.cat((hx, hy))
        center = pooled.median(dim=0).values
        if hx.shape[1] == 1:
            self._score_params = {"center": center}
            return
        scale = (pooled - center).abs().median(dim=0).values * _MAD_TO_SD
        scale = torch.where(scale > 0, scale, pooled.std(dim=0, correction=0))
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zx = ((hx - center) / scale).clamp(-_CLIP, _CLIP)
        zy = ((hy - center) / scale).clamp(-_CLIP, _CLIP)
        w = zx.mean(0) - zy.mean(0)
        norm = torch.linalg.vector_norm(w)
        w = w / norm if bool(norm > 0) else torch.full_like(w, 1.0 / math.sqrt(w.numel()))
        self._score_params = {"center": center, "scale": scale, "direction": w}

    def _scores(self, v: torch.Tensor) -> torch.Tensor:
        """Scores [n, S] of outputs v [n, d] (fixed between refreshes)."""
        if self._score_fns is not None:
            cols = []
            for i, f in enumerate(self._score_fns):
                s = f(v)
                if not isinstance(s, torch.Tensor):
                    s = torch.as_tensor(np.asarray(s, dtype=np.float64))
                s = s.to(device=v.device, dtype=torch.float64).reshape(-1)
                if s.shape[0] != v.shape[0]:
                    raise ValueError(f"score[{i}] returned {s.shape[0]} values for "
                                     f"{v.shape[0]} inputs; it must map [n, d] to [n]")
                if not bool(torch.isfinite(s).all()):
                    raise ValueError(f"score[{i}] returned non-finite values")
                cols.append(s)
            return torch.stack(cols, dim=1)
        v = v.to(torch.float64)
        p = self._score_params
        if v.shape[1] == 1:
            return torch.cat((v, (v - p["center"]).abs()), dim=1)
        z = ((v - p["center"]) / p["scale"]).clamp(-_CLIP, _CLIP)
        return torch.stack((z @ p["direction"], torch.linalg.vector_norm(z, dim=1)), dim=1)

    # ------------------------------------------------------------------ grids and candidate sets
    def _grid(self, pooled_sorted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted unique edges of one score's grid and, per edge, whether it is an atom."""
        N = int(pooled_sorted.shape[0])
        B = min(self.grid_cells, N)
        j = torch.arange(1, B, dtype=torch.float64, device=pooled_sorted.device)
        k = torch.round(j * N / B).to(torch.int64).clamp(1, N - 1)  # half to even, as round()
        lo, hi = pooled_sorted[k - 1], pooled_sorted[k]
        mids = torch.maximum(torch.minimum(lo / 2 + hi / 2, hi), lo)  # no overflow
        vals, counts = torch.unique_consecutive(pooled_sorted, return_counts=True)
        rep = counts >= 2
        atoms, a_counts = vals[rep], counts[rep]
        if atoms.numel() > self.max_atoms:
            keep = torch.sort(-a_counts, stable=True).indices[: self.max_atoms]
            atoms = atoms[keep]
        edges = torch.unique(torch.cat((mids, atoms)))
        mult = (torch.searchsorted(pooled_sorted, edges, right=True)
                - torch.searchsorted(pooled_sorted, edges))
        return edges, mult >= 2

    def _cells(self, s: torch.Tensor) -> torch.Tensor:
        """Cells [n, S] of scores s [n, S]: 2i in the gap above i edges, 2i - 1 at edge e_i."""
        vals = s.T.contiguous()  # [S, n]
        left = torch.searchsorted(self._edges, vals)  # edges < s
        right = torch.searchsorted(self._edges, vals, right=True)  # edges <= s
        return (2 * left + (right > left).to(left.dtype)).T

    def _build_candidates(self) -> None:
        """The candidate sets of every score's grid, as (kind, score, k) and flat indices.

        kind 0: {cell < k}, 1: {cell >= k} (proper: 1 <= k <= C_s - 1), 2: {cell == k} (an
        atom's own cell). For an edge that is not an atom the sets {v <= e} and {v < e} differ
        only on a value that carries no mass, so only {v <= e} (k even) is kept.
        """
        S, C = self._atom_cell.shape
        dev = self._atom_cell.device
        pos = torch.arange(C + 1, device=dev)
        atom = torch.cat((self._atom_cell, torch.zeros(S, 1, dtype=torch.bool, device=dev)), 1)
        in_grid = pos.view(1, -1) < self._n_cells_s.view(-1, 1)  # [S, C + 1]
        thresh = in_grid & (pos >= 1) & ((pos % 2 == 0) | atom)  # proper half-lines kept
        single = in_grid & atom
        parts = []  # per score: lower half-lines, upper half-lines, atom cells (in this order)
        for s in range(S):
            for kd, mask in ((0, thresh[s]), (1, thresh[s]), (2, single[s])):
                kk = torch.nonzero(mask).flatten()
                parts.append(torch.stack((torch.full_like(kk, kd), torch.full_like(kk, s), kk)))
        kind, score, k = torch.cat(parts, dim=1)
        width = 3 * C + 2  # per score: C + 1 lower, C + 1 upper, C single-cell entries
        offset = torch.where(kind == 0, k, torch.where(kind == 1, C + 1 + k, 2 * C + 2 + k))
        self._cand_kind, self._cand_score, self._cand_k = kind, score, k
        self._cand_flat = score * width + offset
        self._cand_np = tuple(np.ascontiguousarray(v.cpu().numpy(), dtype=np.int64)
                              for v in (kind, score, k))

    # ------------------------------------------------------------------ soft sets
    def _soft_sets(self, tab_x: torch.Tensor, tab_y: torch.Tensor, cx: torch.Tensor,
                   cy: torch.Tensor, t: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stake-weighted soft sets of both directions for every grid point, at x_i and y_i.

        tab_x, tab_y: [n, S, C] per-cell counts of past x and y (pairs < i); cx, cy: [n, S]
        cells of x_i and y_i; t: [n] pairs before i. Returns f_x, f_y and the mass m, each
        [n, 2G]: columns 0..G-1 the x-heavy sets of direction 1, G..2G-1 the y-heavy sets of
        direction 2. With the experts (E, j) (candidate set E, stake ratio r_j) weighted by
        w(E, j) proportional to pi_j exp(eta t J(E, lambda_j)) (the empty set: weight 1),
        f(v) = sum_{E contains v} w(E, j) r_j / Z and m = sum w(E, j) r_j / Z.
        """
        kind, flat, k, sc = self._cand_kind, self._cand_flat, self._cand_k, self._cand_score
        nx = self._cand_counts(tab_x, flat).to(torch.float64)  # [n, V]
        ny = self._cand_counts(tab_y, flat).to(torch.float64)
        n, V = nx.shape
        # eta t J(E, lambda_j) + log pi_j is linear in (n_a, n_b, n_a n_b / t, t, 1), with
        # (a, b) = (x, y) for direction 1 and (y, x) for direction 2; the empty set has logit 0
        tt = t.view(-1, 1).expand(n, V)
        feats = torch.stack((nx, ny, nx * ny / t.view(-1, 1), tt, torch.ones_like(nx)),
                            dim=2)  # [n, V, 5]
        ratio = self._stake_ratio_t.to(feats.device)
        L = int(ratio.shape[0])
        logit = (feats @ self._kelly_coef.to(feats.device)).view(n, V, L, -1)  # [n, V, L, 2G]
        top = logit.amax(dim=(1, 2)).clamp(min=0.0)  # [n, 2G]
        # weights below e^-60 of the leader's change nothing; clamping avoids slow subnormals
        w = torch.exp((logit - top.view(n, 1, 1, -1)).clamp(min=-60.0))
        z = w.sum(dim=(1, 2)) + torch.exp(-top)  # [n, 2G], with the empty set's weight
        wr = (w * ratio.view(1, 1, L, 1)).sum(dim=2)  # [n, V, 2G]
        cells = torch.stack((cx[:, sc], cy[:, sc]), dim=1)  # [n, 2, V]
        below = cells < k
        mem = torch.where(kind == 2, cells == k, below ^ (kind == 1))  # [n, 2, V]
        f = (mem.to(torch.float64) @ wr) / z.unsqueeze(1)  # [n, 2, 2G]
        f = f.clamp(0.0, 1.0)
        mass = (wr.sum(dim=1) / z).clamp(0.0, 1.0)
        return f[:, 0], f[:, 1], mass

    @staticmethod
    def _cand_counts(tab: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """Past counts [n, V] in each candidate set, from per-cell counts [n, S, C]."""
        n, S, C = tab.shape
        zero = torch.zeros(n, S, 1, dtype=tab.dtype, device=tab.device)
        pre = torch.cat((zero, torch.cumsum(tab, 2)), 2)  # [n, S, C + 1]: count in cells < k
        total = pre[:, :, -1:]
        full = torch.cat((pre, total - pre, tab), 2).reshape(n, -1)  # [n, S * (3C + 2)]
        return full.index_select(1, flat)
