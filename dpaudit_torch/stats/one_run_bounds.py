"""Bounds of the one-run guessing game (docs/design.md section 6).

The canary game's guess counts (r, v) for every choice of k+ top and k- bottom guesses
(:class:`CanaryGame`), the best bound over a set of candidate guesses (:func:`best_bound`) and the
largest bound an audit can report (:func:`ceiling`), for both one-run tests: Steinke, Nasr &
Jagielski (NeurIPS 2023, :mod:`~dpaudit_torch.stats.steinke`) and Mahloujifar, Melis & Chaudhuri
(ICML 2025, :mod:`~dpaudit_torch.stats.fdp`).  :func:`ceiling` is re-exported by
:mod:`dpaudit_torch.stats.one_run`.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special

from ._one_run_checks import check_bound_request, check_int
from .fdp import fdp_search, mu_to_eps
from .steinke import steinke_search

__all__ = ["CanaryGame", "best_bound", "bound_for", "all_right_bound", "ceiling",
           "reachable_ceiling"]


def bound_for(method: str, m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """Level-alpha bound of one candidate (r, v) on m canaries (arguments already checked)."""
    if method == "steinke":
        return steinke_search(m, r, v, delta, alpha, 0.0)
    return mu_to_eps(fdp_search(m, r, v, alpha, 0.0), delta)


@functools.lru_cache(maxsize=4096)
def all_right_bound(method: str, m: int, r: int, delta: float, alpha: float) -> float:
    """Bound when all r guesses are right (cached: it depends on the game size only)."""
    return bound_for(method, m, r, r, delta, alpha)


def ceiling(m: int, alpha: float, delta: float, method: str = "steinke",
            r: int | None = None, r_max: int | None = None) -> float:
    """The largest bound the audit can report: every one of r guesses right (v = r).

    With ``r=None`` the maximum over r = 1..``r_max`` (default m; coarse-to-fine search over r;
    the all-right bound is unimodal in r).  Closed form for Steinke at delta = 0:
    -ln(alpha^(-1/r) - 1) (r = 1000 -> 5.81 at alpha 0.05).  At delta = 1e-5 and m = 5000:
    Steinke 7.28, f-DP about 15.0.
    """
    m_ = check_int("m", m, 1)
    method, delta, alpha = check_bound_request(method, delta, alpha)
    if r is not None:
        r_ = check_int("r", r, 1)
        if r_ > m_:
            raise ValueError(f"r ({r!r}) must be <= m ({m!r})")
        return all_right_bound(method, m_, r_, delta, alpha)
    top = m_ if r_max is None else min(check_int("r_max", r_max, 0), m_)
    if top < 1:
        return 0.0

    def f(k: int) -> float:
        return all_right_bound(method, m_, k, delta, alpha)

    lo, hi = 1, top
    while hi - lo > 64:
        grid = np.unique(np.round(np.geomspace(lo, hi, 33)).astype(np.int64))
        vals = [f(int(k)) for k in grid]
        b = int(np.argmax(vals))
        lo, hi = int(grid[max(b - 1, 0)]), int(grid[min(b + 1, grid.size - 1)])
    return max(f(k) for k in range(lo, hi + 1))


class CanaryGame:
    """Scores and labels in canary order, with the guess counts (r, v) of every (k+, k-)."""

    def __init__(self, scores: np.ndarray, labels: np.ndarray, tie_rng: np.random.Generator
                 ) -> None:
        self.m = int(scores.size)
        self.scores = scores
        self.labels = labels
        # descending order; ties broken by a random permutation independent of the labels
        perm = tie_rng.permutation(self.m)
        order = perm[np.argsort(-scores[perm], kind="stable")]
        lab = labels[order].astype(np.int64)
        self.top_correct = np.concatenate(([0], np.cumsum(lab)))  # IN among the k highest
        self.bottom_correct = np.concatenate(([0], np.cumsum(1 - lab[::-1])))  # OUT among k lowest

    def counts(self, kp: np.ndarray, kn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(r, v): guesses and correct guesses for k+ = ``kp`` top and k- = ``kn`` bottom."""
        return kp + kn, self.top_correct[kp] + self.bottom_correct[kn]

    def roc_hull(self) -> tuple[np.ndarray, np.ndarray]:
        """(r, v) at the thresholds on the upper hull of the (FN, TN) staircase (jax_privacy)."""
        s_in = np.sort(self.scores[self.labels])
        s_out = np.sort(self.scores[~self.labels])
        thr = np.concatenate((np.union1d(s_in, s_out), [np.inf]))
        fn = np.searchsorted(s_in, thr, side="left")
        tn = np.searchsorted(s_out, thr, side="left")
        pts = np.stack([fn, tn], axis=1).astype(np.int64)
        # a point reached by an x-step and left by a y-step is a lower corner, never on the upper
        # hull; drop those and the interior of straight runs before the exact hull pass
        d_in = np.diff(pts, axis=0)
        keep = np.ones(len(pts), dtype=bool)
        if len(pts) > 2:
            a, b = d_in[:-1], d_in[1:]
            cross = a[:, 1] * b[:, 0] - b[:, 1] * a[:, 0]
            keep[1:-1] = cross > 0
        idx = np.flatnonzero(keep)
        hull: list[int] = []
        for i in idx:  # monotone chain, upper hull, collinear points removed
            while len(hull) >= 2:
                o, a_ = pts[hull[-2]], pts[hull[-1]]
                p = pts[i]
                cr = (a_[1] - o[1]) * (p[0] - a_[0]) - (p[1] - a_[1]) * (a_[0] - o[0])
                if cr <= 0:
                    hull.pop()
                else:
                    break
            hull.append(int(i))
        h = np.asarray(hull)
        n_in, n_out = int(self.labels.sum()), int((~self.labels).sum())
        tp = n_in - fn[h]
        fp = n_out - tn[h]
        return tp + fp, tp

    def subset(self, idx: np.ndarray, tie_rng: np.random.Generator) -> CanaryGame:
        """The game on the canaries ``idx`` (in that order), ties broken by ``tie_rng``."""
        return CanaryGame(self.scores[idx], self.labels[idx], tie_rng)


def reachable_ceiling(method: str, m: int, k_pos: np.ndarray, k_neg: np.ndarray,
                      n_in: int, n_out: int, alpha: float, delta: float) -> float:
    """The largest bound the candidates (k_pos, k_neg) can give on m canaries of which n_in are
    IN: each candidate at its most correct guesses, min(k+, n_in) + min(k-, n_out) (what a
    perfect separation of IN from OUT scores gives).  For more than 64 candidates, the maximum
    all-right bound over r up to the largest candidate that can be all right (every other
    candidate's bound is below the all-right bound of its correct count)."""
    kp = np.asarray(k_pos, dtype=np.int64)
    kn = np.asarray(k_neg, dtype=np.int64)
    r = kp + kn
    v = np.minimum(kp, n_in) + np.minimum(kn, n_out)
    if r.size <= 64:
        vals = [all_right_bound(method, m, int(ri), delta, alpha) if ri == vi
                else bound_for(method, m, int(ri), int(vi), delta, alpha)
                for ri, vi in zip(r, v) if vi > 0]
        return float(max(vals, default=0.0))
    full = r[(v == r) & (r > 0)]
    return ceiling(m, alpha, delta, method, r_max=int(full.max()) if full.size else 0)


def best_bound(method: str, m: int, r: np.ndarray, v: np.ndarray, alpha: float, delta: float
               ) -> tuple[float, int, float | None]:
    """Best bound over candidates (r_j, v_j) at level alpha each: (bound, index, mu).

    Candidates are visited in decreasing precision v/r; one that cannot reject the best value
    found so far is skipped after a single test (its bound would not be larger, p-values growing
    with eps and f-DP rejection shrinking with mu).  Exact: tested against the brute-force max.
    """
    order = np.lexsort((-r, -(v / np.maximum(r, 1))))
    best, best_idx = 0.0, -1
    if method == "steinke":
        # p >= P[B >= v]: a candidate whose binomial tail alone reaches alpha at the best eps so
        # far cannot beat it; that filter is applied to all candidates at once after each gain
        alive = np.ones(r.size, dtype=bool)
        for j in order:
            if not alive[j]:
                continue
            rj, vj = int(r[j]), int(v[j])
            if vj == 0:
                continue
            e = steinke_search(m, rj, vj, delta, alpha, best)
            if e > best:
                best, best_idx = e, int(j)
                with np.errstate(all="ignore"):
                    tail = special.bdtr(r - v, r, special.expit(-best))
                alive &= (v > 0) & (tail < alpha)
        return best, best_idx, None
    mu_best = 0.0
    for j in order:
        rj, vj = int(r[j]), int(v[j])
        if vj == 0:
            continue
        mu = fdp_search(m, rj, vj, alpha, mu_best)
        if mu > mu_best:
            mu_best, best_idx = mu, int(j)
    return mu_to_eps(mu_best, delta), best_idx, mu_best

