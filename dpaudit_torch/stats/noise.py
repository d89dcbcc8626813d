"""Is the released noise what DP-SGD claims? Tests on noise samples (docs/design.md section 11).

DP-SGD's guarantee rests on fresh Gaussian noise N(0, sigma^2 C^2) on every coordinate of every
step (Abadi et al., "Deep learning with differential privacy", CCS 2016). The auditor can
reconstruct that noise at a fixed random subset of coordinates (the released gradient minus the
clipped sum it read before the noise, docs/design.md section 8). The *noise samples* passed to
this module are those values divided by C, the clipping bound: under H0 they are N(0, sigma^2)
with sigma the noise multiplier, independent across coordinates and steps. They must be pure
noise: no canary contribution and no real-data sum left in them.

* :class:`NoiseVarianceTest` -- anytime-valid test of H0: xi ~ N(0, sigma^2) against a smaller
  variance, per group of coordinates (a tensor, a parameter group), from likelihood ratios of
  N(0, r sigma^2) averaged over a grid of r < 1. Too much noise is not a violation; the test
  also gives chi-square confidence intervals for Var / sigma^2 and the measured sigma.
* :class:`NoiseIndependenceTest` -- anytime-valid test that the noise is fresh at every step:
  the signs of xi_t * xi_{t-k} are fair coins under H0; re-used noise makes them all +1.
* :func:`low_precision_grid` -- is the noise on the bfloat16 or float16 grid? Low-precision
  noise is not Gaussian noise: its least significant bits can reveal the value it was added to
  (Mironov, "On significance of the least significant bits for differential privacy", CCS 2012).
  A finding with an explanation, not a statistical rejection.

Both tests multiply per-step e-values and average the products over start times (every step
starts a new product with weight 1 / (s (s + 1)); :func:`~dpaudit_torch.stats.sampling.
fresh_start_log_mass`), so that noise that goes wrong late in training is found as fast as noise
that is wrong from the start, up to a 2 log s penalty (docs/design.md sections 10 and 11).
Everything is vectorised over coordinates; the state is O(groups x grid) and, for the
independence test, the signs of the last max(lag) steps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from .._buffers import host_zeros
from .._compiled import compiled
from .._validation import as_real, check_alpha, check_positive_int
from ._kernels import fresh_start_mixed
from ._noise_precision import _as_samples, _finite_floats, low_precision_grid
from .betting import log_mean_exp
from .sampling import _Decision, _host, fresh_start_log_mass

logger = logging.getLogger(__name__)

__all__ = ["NoiseVarianceTest", "NoiseIndependenceTest", "low_precision_grid"]

DEFAULT_RATIOS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
DEFAULT_LAGS: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 10, 16)
DEFAULT_STAKES: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 0.6, 0.9)


def _check_grid(values: Sequence[float], name: str, lo: float, hi: float) -> np.ndarray:
    arr = np.asarray([as_real(f"{name}[{i}]", v) for i, v in enumerate(values)], np.float64)
    if arr.size == 0 or not np.all((arr > lo) & (arr < hi)):
        raise ValueError(f"{name} must be a non-empty sequence of numbers in ({lo}, {hi}), "
                         f"got {values!r}")
    return arr


def _as_step_rows(xs: object, name: str = "xi") -> np.ndarray:
    """The samples of several steps: a [steps, samples] float64 array of finite values."""
    return _finite_floats(xs, name, rows=True)


def _bit_count(packed: np.ndarray) -> np.ndarray:
    """Set bits along the last axis of a uint8 array (int64)."""
    if hasattr(np, "bitwise_count"):  # NumPy >= 2
        return np.bitwise_count(packed).sum(axis=-1, dtype=np.int64)
    return _POPCOUNT[packed].sum(axis=-1, dtype=np.int64)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _component_log_wealth(log_s: np.ndarray, t: int) -> np.ndarray:
    """Per component (a group, a lag): log of the stake-grid average of its fresh-start
    wealths after step t, from the started masses ``log_s`` [K, grid]."""
    return np.logaddexp(log_mean_exp(log_s, axis=-1), -math.log(t + 1.0))


def _advance_mixed(log_s0: np.ndarray, log_e: np.ndarray, t0: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The started masses after a block of steps ``log_e`` [S, K, R] from ``log_s0`` [K, R], and
    the decision's log-wealth after each step (:func:`_mixed_log_wealth`): (log_s [K, R] after
    the block, trajectory [S]). One compiled pass where the kernels are compiled."""
    S, K, R = log_e.shape
    if compiled():
        log_s = np.array(log_s0, dtype=np.float64, order="C").reshape(K, R)
        traj = np.empty(S)
        fresh_start_mixed(log_s, np.ascontiguousarray(log_e, dtype=np.float64), int(t0), traj)
        return log_s, traj
    all_s = fresh_start_log_mass(log_s0.reshape(-1), log_e.reshape(S, -1), t0).reshape(S, K, R)
    return all_s[-1].copy(), _mixed_log_wealth(all_s, t0)


def _mixed_log_wealth(log_s: np.ndarray, t0: int) -> np.ndarray:
    """The decision's log-wealth after each step of a block: the started masses ``log_s``
    [S, K, grid] after steps t0 + 1 .. t0 + S, averaged over the grid (with the weight of the
    starts to come) and then over the K components."""
    t = np.arange(t0 + 1, t0 + log_s.shape[0] + 1, dtype=np.float64)
    comp = np.logaddexp(log_mean_exp(log_s, axis=-1), -np.log1p(t)[:, None])  # [S, K]
    return log_mean_exp(comp, axis=-1)


class NoiseVarianceTest(_Decision):
    """Anytime-valid test, per group, of xi ~ N(0, sigma^2) iid against a smaller variance.

    Per step and group g with n_g sampled coordinates, V_g = sum xi^2 / sigma^2 and, for each r in
    the grid, the likelihood ratio of N(0, r sigma^2) against N(0, sigma^2),

        LR_r = r^(-n_g / 2) exp(-(1/r - 1) V_g / 2),

    has conditional mean 1 under H0 (fresh noise). The per-step e-value of a grid point r is LR_r;
    products over steps from every start time are mixed with weights 1 / (s (s + 1)) and the grid
    is averaged uniformly (docs/design.md section 11). ``log_wealth`` is the log of the average
    over the ``n_groups`` groups (one decision at level alpha, no Bonferroni split). Everything is
    in log space: n = 10^5 coordinates at r = 0.5 or exact zeros (V = 0) are fine.

    Args:
        n_groups: number of groups; group ids are 0 .. n_groups - 1, fixed in advance (a group
            that never appears keeps wealth 1 and still counts in the average).
        alpha: level of the test, in (0, 1).
        ratios: the grid of variance ratios r in (0, 1).
    """

    kind: str = "noise_variance"
    _STATE = ("_log_s", "_count", "_sumsq", "_sigma")

    def __init__(self, n_groups: int = 1, alpha: float = 0.05,
                 ratios: Sequence[float] = DEFAULT_RATIOS) -> None:
        self.n_groups = check_positive_int(n_groups, "n_groups")
        self.alpha = check_alpha(alpha)
        self.ratios = _check_grid(ratios, "ratios", 0.0, 1.0)
        self._half_log_r = -0.5 * np.log(self.ratios)  # -log(r) / 2
        self._half_inv = 0.5 * (1.0 / self.ratios - 1.0)  # (1/r - 1) / 2
        self.reset()

    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._log_s = np.full((self.n_groups, self.ratios.size), -np.inf)
        self._count = np.zeros(self.n_groups, dtype=np.int64)
        self._sumsq = np.zeros(self.n_groups)  # sum of xi^2 / sigma^2 over the steps
        self._sigma: float | None = None
        self._rejected_group: int | None = None  # see rejected_group, rejected_ratio
        self._rejected_ratio: float | None = None
        self._groups_cache: np.ndarray | None = None
        self._counts_cache = np.zeros(self.n_groups)
        self._single_group: int | None = None

    def update(self, xi: np.ndarray, groups: np.ndarray | int, sigma: float) -> NoiseVarianceTest:
        """One step: noise samples ``xi`` [n] (units of C), their group ids [n], the claimed
        noise multiplier ``sigma`` (xi ~ N(0, sigma^2) under H0). An int ``groups`` puts every
        sample in that group."""
        self.update_steps(_as_samples(xi)[None], groups, sigma)
        return self

    def update_steps(self, xs: np.ndarray, groups: np.ndarray | int, sigma: float
                     ) -> np.ndarray:
        """Several steps at once: ``xs`` [S, n], step by step in row order, the same group ids
        [n] and claimed noise multiplier for every row. Returns the log-wealth after each step
        ([S]); the same as S calls of :meth:`update`, in a few vectorised operations."""
        x = _as_step_rows(xs)
        s = as_real("sigma", sigma)
        if not (s > 0.0) or not math.isfinite(s):
            raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
        S, n_x = x.shape
        if S == 0:
            return np.zeros(0)
        if n_x == 0:
            self._as_groups(groups, 0)
            return np.full(S, self.log_wealth)
        G = self.n_groups
        with np.errstate(over="ignore"):
            sq = x * x
        if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
            gid = int(groups)
            if not 0 <= gid < G:
                raise ValueError(f"group ids must lie in [0, {G}), got [{gid}]")
            n = np.zeros(G)
            n[gid] = n_x
            single: int | None = gid
        else:
            n = self._group_counts(groups, n_x)
            single = self._single_group
        with np.errstate(over="ignore"):
            if single is not None:  # bincount into one bin is slow
                v = np.zeros((S, G))
                v[:, single] = sq.sum(axis=1)
            else:
                assert self._groups_cache is not None
                v = np.empty((S, G))
                for i in range(S):  # one bincount per step: no [S, n] index array
                    v[i] = np.bincount(self._groups_cache, weights=sq[i], minlength=G)
        return self.update_group_sums(v, n, s)

    def update_group_sums(self, sums: np.ndarray, counts: np.ndarray, sigma: float
                          ) -> np.ndarray:
        """:meth:`update_steps` from each step's per-group sums of ``xi ** 2`` (``sums``
        [S, G], units of C) and the samples per group (``counts`` [G], the same every step):
        all the test uses of the samples. Lets a caller that sums the samples per finer
        partition (per tensor, with tensors inside groups) feed several tests from one pass."""
        s = float(sigma)
        if not (s > 0.0) or not math.isfinite(s):
            raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
        n = np.asarray(counts, dtype=np.float64)
        S = int(sums.shape[0])
        if sums.ndim != 2 or sums.shape[1] != self.n_groups or n.shape != (self.n_groups,):
            raise ValueError(f"sums must be [steps, {self.n_groups}] and counts "
                             f"[{self.n_groups}], got {sums.shape} and {n.shape}")
        if S == 0:
            return np.zeros(0)
        with np.errstate(over="ignore"):
            v = sums / (s * s)
        log_e = n[None, :, None] * self._half_log_r - v[:, :, None] * self._half_inv  # [S,G,R]
        t0 = self._t
        log_s0 = self._log_s
        self._log_s, traj = _advance_mixed(log_s0, log_e, t0)
        if self._rejected_at is None and traj.max() >= math.log(1.0 / self.alpha):
            self._note_crossing(log_s0, log_e, v, n, traj, t0)
        self._t = t0 + S
        self._count += (S * n).astype(np.int64)
        self._sumsq += v.sum(axis=0)
        self._sigma = s
        self._record(traj)
        return traj

    def _note_crossing(self, log_s0: np.ndarray, log_e: np.ndarray, v: np.ndarray,
                       n: np.ndarray, traj: np.ndarray, t0: int) -> None:
        """Keep the group that drove the first crossing of log(1/alpha) in this block (the
        largest log-wealth then, among groups with samples) and its variance ratio up to then
        (the block replayed up to the crossing: once per test)."""
        j = int(np.flatnonzero(traj >= math.log(1.0 / self.alpha))[0]) + 1
        lw = _component_log_wealth(_advance_mixed(log_s0, log_e[:j], t0)[0], t0 + j)
        count = self._count + (j * n).astype(np.int64)
        g = self._rejected_group = _argmax_seen(lw, count)
        self._rejected_ratio = (float((self._sumsq[g] + v[:j, g].sum()) / count[g])
                                if count[g] else None)

    @property
    def group_log_wealth(self) -> np.ndarray:
        """log-wealth of each group's e-process, float64 array [n_groups]."""
        if self._t == 0:
            return np.zeros(self.n_groups)
        return _component_log_wealth(self._log_s, self._t)

    @property
    def log_wealth(self) -> float:
        """log of the average of the groups' wealths (the decision's e-process)."""
        return float(log_mean_exp(self.group_log_wealth))

    def worst_group(self) -> int:
        """The group with the largest log-wealth now, among those with samples (an unseen
        group's wealth 1 is no evidence). :attr:`rejected_group` is the one that made it cross."""
        return _argmax_seen(self.group_log_wealth, self._count)

    @property
    def rejected_group(self) -> int | None:
        """The group with the largest log-wealth (among those with samples) at the first
        rejection, or None (none, or a state saved before it was kept)."""
        return self._rejected_group

    @property
    def rejected_ratio(self) -> float | None:
        """Variance ratio estimate of :attr:`rejected_group` up to the rejection, or None."""
        return self._rejected_ratio

    @property
    def counts(self) -> np.ndarray:
        """Samples seen per group, int64 array [n_groups]."""
        return self._count.copy()

    def variance_ratio_estimate(self, alpha: float | None = None) -> np.ndarray:
        """Per group: [estimate, lo, hi] of Var(xi) / sigma^2 over all steps seen, [G, 3].

        The estimate is sum(xi^2 / sigma^2) / n; the two-sided level-alpha interval (default:
        the test's alpha) divides the sum by the chi-square quantiles with n degrees of freedom
        (exact for Gaussian noise with a constant ratio). NaN for groups not seen yet. A ratio
        above 1 is too much noise (a waste of utility, not a privacy violation).
        """
        a = self.alpha if alpha is None else check_alpha(alpha)
        return _ratio_interval(self._sumsq, self._count, a)

    def sigma_interval(self, alpha: float | None = None) -> tuple[float, float] | None:
        """Interval for the actual noise multiplier, all groups pooled (None before any step).

        sqrt of the pooled chi-square interval of Var / sigma^2, times the last claimed sigma
        (with a constant sigma: the exact interval for the noise standard deviation, units of C).
        """
        if self._sigma is None or self._count.sum() == 0:
            return None
        a = self.alpha if alpha is None else check_alpha(alpha)
        row = _ratio_interval(np.array([self._sumsq.sum()]), np.array([self._count.sum()]), a)[0]
        return float(self._sigma * math.sqrt(row[1])), float(self._sigma * math.sqrt(row[2]))

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        est = self.variance_ratio_estimate()
        si = self.sigma_interval()
        return {
            "test": self.kind,
            "alpha": self.alpha,
            "n_groups": self.n_groups,
            "ratios": self.ratios.tolist(),
            "n_steps": self._t,
            "log_wealth": self.log_wealth,
            "max_log_wealth": self._max_lw,
            "group_log_wealth": self.group_log_wealth.tolist(),
            "worst_group": self.worst_group(),
            "rejected": self.rejected,
            "rejected_at": self._rejected_at,
            "rejected_group": self._rejected_group,
            "rejected_ratio": self._rejected_ratio,
            "counts": self._count.tolist(),
            "variance_ratio": [None if math.isnan(r[0]) else r.tolist() for r in est],
            "sigma_claimed": self._sigma,
            "sigma_interval": list(si) if si is not None else None,
        }

    def _config(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_groups": self.n_groups, "alpha": self.alpha,
                "ratios": self.ratios.tolist()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rejected_group": self._rejected_group,
                "rejected_ratio": self._rejected_ratio}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        g, r = sd.get("rejected_group"), sd.get("rejected_ratio")  # absent from older states
        self._rejected_group = None if g is None else int(g)
        self._rejected_ratio = None if r is None else float(r)

    def _as_groups(self, groups: object, n: int) -> np.ndarray:
        if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool):
            g = np.full(n, int(groups), dtype=np.int64)
        else:
            arr = np.asarray(groups)
            if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
                raise TypeError(f"groups must hold integer ids, got dtype {arr.dtype}")
            g = arr.reshape(-1).astype(np.int64, copy=False)
            if g.size != n:
                raise ValueError(f"groups has {g.size} entries but xi has {n}")
        if g.size and (g.min() < 0 or g.max() >= self.n_groups):
            bad = g[(g < 0) | (g >= self.n_groups)][:3].tolist()
            raise ValueError(f"group ids must lie in [0, {self.n_groups}), got {bad}")
        return g

    def _group_counts(self, groups: object, n: int) -> np.ndarray:
        """Samples per group (float64 [G]); validated group ids are cached in
        ``_groups_cache``, and reused while the caller passes equal ids (the usual case)."""
        cache = self._groups_cache
        if cache is not None and isinstance(groups, np.ndarray) and groups.shape == cache.shape \
                and groups.dtype.kind in "iu" and np.array_equal(groups, cache):
            return self._counts_cache
        g = self._as_groups(groups, n)
        self._groups_cache = g.copy()
        self._counts_cache = np.bincount(g, minlength=self.n_groups).astype(np.float64)
        seen = np.flatnonzero(self._counts_cache)
        self._single_group = int(seen[0]) if seen.size == 1 else None
        return self._counts_cache


def _argmax_seen(log_wealth: np.ndarray, count: np.ndarray) -> int:
    """argmax of the log-wealth among groups with samples (an unseen one sits at 0, above
    the seen ones under H0, and has no estimate); the plain argmax if none has any."""
    seen = np.asarray(count) > 0
    return int(np.argmax(np.where(seen, log_wealth, -np.inf) if seen.any() else log_wealth))


def _ratio_interval(sumsq: np.ndarray, count: np.ndarray, alpha: float) -> np.ndarray:
    out = np.full((sumsq.size, 3), np.nan)
    seen = count > 0
    if seen.any():
        v, n = sumsq[seen], count[seen].astype(np.float64)
        out[seen, 0] = v / n
        out[seen, 1] = v / sps.chi2.ppf(1.0 - alpha / 2.0, n)
        out[seen, 2] = v / sps.chi2.ppf(alpha / 2.0, n)
    return out


class NoiseIndependenceTest(_Decision):
    """Anytime-valid test that the noise is fresh at every step (no re-use across steps).

    For each lag k and sampled coordinate u, s_u = sign(xi_{t,u} xi_{t-k,u}). Under H0 (fresh
    noise, continuous and symmetric, independent of the past) the s_u of one step are independent
    fair +-1 coins given the past, so for every stake lambda in [0, 1)

        e_t(k, lambda) = prod_u (1 + lambda s_u) = (1 + lambda)^P (1 - lambda)^M

    (P, M the numbers of +1 and -1) has conditional mean 1. Re-used noise (s_u = +1 for every u)
    makes it grow by n log(1 + lambda) per step. Per lag, the products over steps from every start
    time are mixed with weights 1 / (s (s + 1)) and a fixed grid of stakes is averaged; the
    decision averages the lags (docs/design.md section 11). An exact zero in xi gives s_u = 0
    (factor 1, no evidence either way): zeros never help to reject, and under continuous noise
    they have probability zero.

    Only the signs of the last max(lag) steps are kept (ring buffers of sign bits and zero
    masks, 2 max(lag) n bytes; the work per step is an XOR and a count per lag). The same n
    coordinates must be passed at every step, in the same order.

    With ``two_sided`` the grid also holds the negated stakes -lambda: e_t(k, -lambda) =
    (1 - lambda)^P (1 + lambda)^M has conditional mean 1 as well and grows when the signs
    disagree (noise negatively correlated across steps, which the white-box release bound's
    family check must see: docs/design.md section 13).

    Args:
        lags: the lags k >= 1 to test.
        alpha: level of the test, in (0, 1).
        stakes: the grid of stakes lambda in (0, 1).
        two_sided: bet on negative dependence too (the grid and its negation, averaged).
    """

    kind: str = "noise_independence"
    _STATE = ("_n", "_neg", "_zero", "_has_zero", "_log_s", "_plus", "_minus")

    def __init__(self, lags: Sequence[int] = DEFAULT_LAGS, alpha: float = 0.05,
                 stakes: Sequence[float] = DEFAULT_STAKES, two_sided: bool = False) -> None:
        ks = [check_positive_int(k, f"lags[{i}]") for i, k in enumerate(lags)]
        if not ks or len(set(ks)) != len(ks):
            raise ValueError(f"lags must be a non-empty sequence of distinct integers >= 1, "
                             f"got {lags!r}")
        self.lags = tuple(ks)
        self.alpha = check_alpha(alpha)
        grid = _check_grid(stakes, "stakes", 0.0, 1.0)
        if not isinstance(two_sided, bool):
            raise ValueError(f"two_sided must be a bool, got {two_sided!r}")
        self.two_sided = two_sided
        self.stakes = np.concatenate((grid, -grid)) if two_sided else grid
        self._lag_arr = np.asarray(self.lags, dtype=np.int64)
        self._depth = max(self.lags)
        self._log_up = np.log1p(self.stakes)
        self._log_down = np.log1p(-self.stakes)
        self.reset()

    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._n: int | None = None
        # the last `depth` steps: sign bits (1 = negative) and a mask of the exact zeros
        # (set only for rows holding one), packed 8 to a byte: uint8 arrays [depth, n / 8]
        self._neg: np.ndarray | None = None
        self._zero: np.ndarray | None = None
        self._has_zero = np.zeros(self._depth, dtype=bool)
        self._log_s = np.full((len(self.lags), self.stakes.size), -np.inf)
        self._plus = np.zeros(len(self.lags), dtype=np.int64)
        self._minus = np.zeros(len(self.lags), dtype=np.int64)

    def update(self, xi: np.ndarray) -> NoiseIndependenceTest:
        """One step: the noise samples ``xi`` [n] at the same coordinates as every step."""
        self.update_steps(_as_samples(xi)[None])
        return self

    def update_steps(self, xs: np.ndarray) -> np.ndarray:
        """Several steps at once: ``xs`` [S, n], step by step in row order, the same coordinates
        in every row. Returns the log-wealth after each step ([S]); the same as S calls of
        :meth:`update`. The signs are kept as packed bits: one XOR and one bit count per lag
        and step."""
        x = _as_step_rows(xs)
        S, n_x = x.shape
        if S == 0:
            return np.zeros(0)
        if self._n is None:
            if n_x == 0:
                raise ValueError("xi must hold at least one sample")
            self._n = int(n_x)
            width = -(-self._n // 8)
            self._neg = host_zeros((self._depth, width), np.uint8)
            self._zero = host_zeros((self._depth, width), np.uint8)
        elif n_x != self._n:
            raise ValueError(f"xi has {n_x} samples, but earlier steps had {self._n} "
                             f"(pass the same coordinates at every step)")
        assert self._neg is not None and self._zero is not None
        neg = np.packbits(x < 0, axis=1)  # [S, width]; padding bits are 0
        is_zero = x == 0
        row_zero = is_zero.any(axis=1)
        zero = np.packbits(is_zero, axis=1) if row_zero.any() else None
        t0, depth = self._t, self._depth
        # partner of new step s (t = t0 + s + 1) at lag k: step t - k, a row of this block
        # (index depth + s - k in [ring; block]) or of the ring (slot (t - k) % depth); a step
        # t - k < 1 does not exist (no evidence: P = M = 0)
        s_idx = np.arange(S)[None, :]
        k_idx = self._lag_arr[:, None]
        exists = t0 + s_idx + 1 - k_idx >= 1  # [L, S]
        partner = np.where(s_idx >= k_idx, depth + s_idx - k_idx,
                           (t0 + s_idx + 1 - k_idx) % depth)
        both_neg = np.concatenate([self._neg, neg])[partner]  # [L, S, width]
        differ = np.bitwise_xor(both_neg, neg[None])
        has_zero = np.concatenate([self._has_zero, row_zero])[partner] | row_zero[None]
        if has_zero.any():
            zeros_new = zero if zero is not None else np.zeros_like(neg)
            dead = np.concatenate([self._zero, zeros_new])[partner] | zeros_new[None]
            M = _bit_count(differ & ~dead)
            P = self._n - _bit_count(dead) - M
        else:
            M = _bit_count(differ)
            P = self._n - M
        M = np.where(exists, M, 0).T.astype(np.float64)  # [S, L]
        P = np.where(exists, P, 0).T.astype(np.float64)
        for s in range(max(0, S - depth), S):  # the ring keeps the last `depth` steps
            slot = (t0 + s + 1) % depth
            self._neg[slot] = neg[s]
            self._zero[slot] = zero[s] if zero is not None else 0
            self._has_zero[slot] = row_zero[s]
        log_e = P[:, :, None] * self._log_up + M[:, :, None] * self._log_down  # [S, L, stakes]
        self._log_s, traj = _advance_mixed(self._log_s, log_e, t0)
        self._t = t0 + S
        self._plus += P.sum(axis=0).astype(np.int64)
        self._minus += M.sum(axis=0).astype(np.int64)
        self._record(traj)
        return traj

    @property
    def lag_log_wealth(self) -> np.ndarray:
        """log-wealth of each lag's e-process, float64 array [len(lags)]."""
        if self._t == 0:
            return np.zeros(len(self.lags))
        return _component_log_wealth(self._log_s, self._t)

    @property
    def log_wealth(self) -> float:
        """log of the average of the lags' wealths (the decision's e-process)."""
        return float(log_mean_exp(self.lag_log_wealth))

    def worst_lag(self) -> int:
        """The lag with the largest log-wealth."""
        return int(self.lags[int(np.argmax(self.lag_log_wealth))])

    @property
    def mean_sign(self) -> np.ndarray:
        """Per lag, the mean of the signs s_u seen so far (0 expected; 1 for re-used noise)."""
        n = self._plus + self._minus
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, (self._plus - self._minus) / np.maximum(n, 1), np.nan)

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        return {
            "test": self.kind,
            "alpha": self.alpha,
            "lags": list(self.lags),
            "stakes": self.stakes.tolist(),
            "n_steps": self._t,
            "n_samples": self._n,
            "log_wealth": self.log_wealth,
            "max_log_wealth": self._max_lw,
            "lag_log_wealth": self.lag_log_wealth.tolist(),
            "worst_lag": self.worst_lag(),
            "mean_sign": [None if math.isnan(v) else float(v) for v in self.mean_sign],
            "rejected": self.rejected,
            "rejected_at": self._rejected_at,
        }

    def state_dict(self) -> dict[str, Any]:
        """As the base class's, with the sign and zero rings as bool arrays [depth, n] (the
        layout checkpoints have always had; they are packed bits in memory)."""
        sd = super().state_dict()
        for key, packed in (("neg", self._neg), ("zero", self._zero)):
            sd[key] = (None if packed is None or self._n is None
                       else np.unpackbits(packed, axis=1, count=self._n).astype(bool))
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        if self._n is not None:  # the buffers are None until the first step
            shape = (self._depth, self._n)
            width = -(-self._n // 8)
            self._neg = host_zeros((self._depth, width), np.uint8)
            self._zero = host_zeros((self._depth, width), np.uint8)
            self._neg[...] = np.packbits(np.array(_host(sd["neg"]), dtype=bool).reshape(shape),
                                         axis=1)
            self._zero[...] = np.packbits(np.array(_host(sd["zero"]), dtype=bool).reshape(shape),
                                          axis=1)

    def _config(self) -> dict[str, Any]:
        cfg = {"kind": self.kind, "lags": list(self.lags), "alpha": self.alpha,
               "stakes": self.stakes.tolist()}
        if self.two_sided:  # (one-sided configurations keep the keys they always had)
            cfg["two_sided"] = True
        return cfg
