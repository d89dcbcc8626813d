"""Is the data loader Poisson-subsampling? Tests on the batch sizes (docs/design.md section 10).

The privacy accountant of DP-SGD assumes that every record joins every step's batch
independently with probability q (Poisson subsampling; Abadi et al., "Deep learning with
differential privacy", CCS 2016; Mironov, Talwar & Zhang, "Renyi differential privacy of the
sampled Gaussian mechanism", arXiv 1908.10530, 2019). Its amplification is lost with fixed-size
batches of a shuffled loader. The batch sizes are the one trace of the sampling the auditor sees
for free: under Poisson sampling of N records at rate q they are independent Binomial(N, q).

* :class:`PoissonBatchTest` -- an anytime-valid test (testing by betting, docs/design.md
  section 1) of "n_t ~ Binomial(N, q) independently". It bets on the capped standardized squared
  deviation Y_t = min((n_t - N q)^2 / (N q (1 - q)), c), whose exact null mean m_c is computed from
  the Binomial pmf, in both directions: Y_t below m_c (under-dispersion: fixed-size batches, a
  shuffled loader with ``drop_last``) and above it (over-dispersion: a wrong rate, a wrong N, a
  drifting batch size). The e-process is a fixed-weight average of four test martingales: two
  bet by Online Newton Step from the first step, and two with a fixed stake started afresh at
  every step (a mixture over start times), so that a loader that goes wrong late in training is
  still found quickly.
* :func:`rate_interval` -- the exact Clopper-Pearson interval for q from the total of the batch
  sizes (Clopper & Pearson, Biometrika 1934), a measured sampling rate to compare with the claim.
"""

from __future__ import annotations

import logging
import math
from numbers import Integral
from typing import Any

import numpy as np
from scipy import stats as sps

from .._compiled import compiled
from .._validation import as_real, check_alpha, check_positive_int
from ._kernels import fresh_start_rows
from .betting import OnlineNewtonStep

logger = logging.getLogger(__name__)

__all__ = ["PoissonBatchTest", "rate_interval", "binomial_capped_chi2_mean"]

#: fraction of the largest stake that keeps 1 + lambda g >= 0 (the worst factor is 1 - KAPPA)
KAPPA: float = 0.9
#: weights of the four components [ONS under, ONS over, fresh-start under, fresh-start over]
_WEIGHTS = np.array([0.5, 0.25, 0.125, 0.125])
_LOG_WEIGHTS = np.log(_WEIGHTS)


def fresh_start_log_mass(log_s0: np.ndarray, log_e: np.ndarray, t0: int) -> np.ndarray:
    """Mixture over start times of products of per-step e-values (docs/design.md section 10).

    With weights w_s = 1 / (s (s + 1)) (they sum to 1) the started mass
    S_t = sum_{s <= t} w_s prod_{u = s}^{t} e_u obeys S_t = e_t (S_{t-1} + w_t), and
    W_t = S_t + 1 / (t + 1) (the weight of the starts still to come) is a test martingale when
    every e_u has conditional mean <= 1. Vectorised over a chunk of n steps:
    log S_t = L_t + logcumsumexp(log S_0, log w_s - L_{s-1}), L the cumulative sum of log e.

    Args:
        log_s0: log S before the chunk, array [K] (-inf when nothing has started).
        log_e: log of the per-step e-values, array [n, K], finite.
        t0: steps before the chunk.

    Returns:
        log S after each step of the chunk, array [n, K].
    """
    log_e = np.asarray(log_e, dtype=np.float64)
    n = log_e.shape[0]
    if compiled() and log_e.ndim == 2:  # the recursion itself, one compiled pass
        out = np.empty(log_e.shape)
        fresh_start_rows(np.ascontiguousarray(log_s0, dtype=np.float64).reshape(-1),
                         np.ascontiguousarray(log_e), int(t0), out)
        return out
    steps = np.arange(t0 + 1, t0 + n + 1, dtype=np.float64)
    log_w = -np.log(steps) - np.log1p(steps)  # the vectorised _log_w
    cum = np.cumsum(log_e, axis=0)
    prev = np.vstack([np.zeros((1,) + log_e.shape[1:]), cum[:-1]])
    terms = np.concatenate([np.asarray(log_s0, dtype=np.float64)[None], log_w[:, None] - prev])
    acc = np.logaddexp.accumulate(terms, axis=0)[1:]
    return cum + acc


def fresh_start_log_wealth(log_s: np.ndarray, t: int) -> np.ndarray:
    """log W_t = log(S_t + 1 / (t + 1)): the started mass plus the starts still to come."""
    return np.logaddexp(log_s, -math.log(t + 1.0))


def _host(v: Any) -> Any:
    """A CPU tensor (what a checkpoint may hold) as a numpy array; anything else unchanged."""
    return v.detach().cpu().numpy() if hasattr(v, "detach") else v


def _log_w(t: int) -> float:
    """log of the fresh-start weight w_t = 1 / (t (t + 1))."""
    return -math.log(t) - math.log1p(t)


class _Decision:
    """Sticky level-alpha decision on a log-wealth trajectory (Ville's inequality holds for the
    running supremum, so "has ever reached 1/alpha" is a valid decision at any stopping time)."""

    alpha: float

    def _reset_decision(self) -> None:
        self._t = 0
        self._rejected_at: int | None = None
        self._max_lw = 0.0

    def _record(self, traj: np.ndarray | float) -> None:
        """Book-keep the log-wealth after each of the last len(traj) steps (``_t`` advanced)."""
        traj = np.atleast_1d(np.asarray(traj, dtype=np.float64))
        self._max_lw = max(self._max_lw, float(traj.max()))
        if self._rejected_at is None:
            hits = np.flatnonzero(traj >= math.log(1.0 / self.alpha))
            if hits.size:
                self._rejected_at = self._t - traj.size + int(hits[0]) + 1
                logger.info("%s rejected at step %d", type(self).__name__, self._rejected_at)

    @property
    def n_steps(self) -> int:
        return self._t

    @property
    def rejected(self) -> bool:
        """Has the log-wealth ever reached log(1/alpha)?"""
        return self._rejected_at is not None

    @property
    def rejected_at(self) -> int | None:
        """Step (1-based) at which the test first rejected, or None."""
        return self._rejected_at

    @property
    def max_log_wealth(self) -> float:
        return self._max_lw

    #: attributes saved by ``state_dict`` besides the decision's (names without "_" are keys)
    _STATE: tuple[str, ...] = ()

    def reset(self) -> None:
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: plain types, and numpy arrays for large buffers."""
        out: dict[str, Any] = {"config": self._config()}
        for name in ("_t", "_rejected_at", "_max_lw", *self._STATE):
            v = getattr(self, name)
            if isinstance(v, np.ndarray):
                v = v.tolist() if v.dtype != np.bool_ else v.copy()
            out[name[1:]] = v
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore a state made by ``state_dict`` of a test with the same configuration (arrays
        may come back as lists, numpy arrays or CPU tensors)."""
        if not isinstance(sd, dict) or "config" not in sd:
            raise ValueError(f"not a state_dict of {type(self).__name__}")
        if sd["config"] != self._config():
            raise ValueError(f"state_dict was made by a different configuration "
                             f"({sd['config']} vs {self._config()})")
        self.reset()
        for name in ("_t", "_rejected_at", "_max_lw", *self._STATE):
            cur, v = getattr(self, name), sd[name[1:]]
            if isinstance(cur, np.ndarray):
                v = np.array(_host(v), dtype=cur.dtype).reshape(cur.shape)
            elif v is not None and isinstance(cur, (int, float)):
                v = type(cur)(v)
            setattr(self, name, v)


def _check_rate(rate: object) -> float:
    q = as_real("rate", rate)
    if not (0.0 < q <= 1.0) or math.isnan(q):
        raise ValueError(f"rate must lie in (0, 1], got {rate!r}")
    return q


def _check_n_records(n_records: object) -> int:
    if isinstance(n_records, bool) or not isinstance(n_records, (Integral, np.integer)):
        raise TypeError(f"n_records must be an integer, got {n_records!r}")
    if int(n_records) < 1:
        raise ValueError(f"n_records must be >= 1, got {n_records!r}")
    return int(n_records)


def binomial_capped_chi2_mean(n_records: int, rate: float, cap: float) -> float:
    """Exact m_c = E[min((n - N q)^2 / (N q (1 - q)), c)] for n ~ Binomial(N, q), 0 < q < 1.

    Only the k with Z_k < c contribute below the cap, so m_c = c - sum_k pmf(k) (c - Z_k)^+ over
    the window |k - N q| <= sqrt(c N q (1 - q)) (a few sqrt(c) standard deviations), which is
    exact for every N, however large.
    """
    N, q, c = int(n_records), float(rate), float(cap)
    mean, var = N * q, N * q * (1.0 - q)
    half = math.sqrt(c * var)
    lo = max(0, math.floor(mean - half) - 1)
    hi = min(N, math.ceil(mean + half) + 1)
    k = np.arange(lo, hi + 1, dtype=np.float64)
    z = (k - mean) ** 2 / var
    below = np.maximum(c - z, 0.0)
    return float(c - np.sum(sps.binom.pmf(k, N, q) * below))


def _as_batch_sizes(n: object, n_records: int) -> np.ndarray:
    """Batch sizes as a float64 array [n] of integers in [0, N] (ValueError names the value)."""
    if isinstance(n, bool):
        raise TypeError(f"batch sizes must be integers, got {n!r}")
    arr = np.asarray(n)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"batch sizes must be integers, got {n!r} (dtype {arr.dtype})")
    arr = arr.reshape(-1).astype(np.float64)
    bad = ~np.isfinite(arr) | (arr != np.round(arr))
    if bad.any():
        raise ValueError(f"batch sizes must be integers, got {arr[bad][:3].tolist()}")
    if (arr < 0).any():
        raise ValueError(f"batch sizes must be >= 0, got {arr[arr < 0][:3].tolist()}")
    if (arr > n_records).any():
        big = arr[arr > n_records][:3].tolist()
        raise ValueError(f"batch sizes must be <= n_records = {n_records}, got {big}")
    return arr


def rate_interval(total: int, n_records: int, steps: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval (level 1 - alpha) for the sampling rate q.

    Under Poisson sampling the sum of the batch sizes over ``steps`` steps is
    Binomial(N * steps, q); the interval inverts two one-sided binomial tests (Clopper & Pearson,
    "The use of confidence or fiducial limits illustrated in the case of the binomial",
    Biometrika 1934): lo = Beta(alpha/2; x, M - x + 1), hi = Beta(1 - alpha/2; x + 1, M - x),
    with lo = 0 at x = 0 and hi = 1 at x = M. Coverage is at least 1 - alpha for every q.
    """
    N = _check_n_records(n_records)
    T = check_positive_int(steps, "steps")
    a = check_alpha(alpha)
    if isinstance(total, bool) or not isinstance(total, (Integral, np.integer)):
        raise TypeError(f"total must be an integer, got {total!r}")
    x, m = int(total), N * T
    if not 0 <= x <= m:
        raise ValueError(f"total must lie in [0, n_records * steps] = [0, {m}], got {total!r}")
    lo = 0.0 if x == 0 else float(sps.beta.ppf(a / 2.0, x, m - x + 1))
    hi = 1.0 if x == m else float(sps.beta.ppf(1.0 - a / 2.0, x + 1, m - x))
    return lo, hi


class PoissonBatchTest(_Decision):
    """Anytime-valid test that the batch sizes are independent Binomial(N, q) draws.

    Statistic Y_t = min(Z_t, c), Z_t = (n_t - N q)^2 / (N q (1 - q)), exact null mean m_c
    (:func:`binomial_capped_chi2_mean`). Payoffs: g = m_c - Y_t in [m_c - c, m_c] (under-dispersion)
    and -g (over-dispersion); each has conditional mean 0 under H0. Four test martingales on
    these payoffs, averaged with fixed weights (1/2, 1/4, 1/8, 1/8): ONS bets (stats/betting.py)
    on g and -g from the first step, with stake caps 0.9 / (c - m_c) and 0.9 / m_c, and the same
    fixed stakes in a mixture over start times (docs/design.md section 10). A constant batch size
    n_t = N q makes the first grow by about log(1 + 0.9 m_c / (c - m_c)) ~ 0.24 per step (c = 4).

    What it can detect: batch sizes less spread than the binomial (fixed-size batches, shuffling
    with or without ``drop_last``), more spread or centred elsewhere (a wrong q or N, drift).
    What it cannot: dependence between steps or a wrong choice of records with binomial sizes
    (a sampler that draws binomial sizes but takes consecutive slices of a permutation passes),
    and a rate error well below one standard deviation sqrt(N q (1 - q)) of n_t shows only
    slowly (``rate_interval`` measures q directly).

    With q = 1 the null is deterministic (n_t = N): a step with n_t != N multiplies the wealth by
    1/alpha (an e-value with mean 1 under H0), so one such step rejects.

    Args:
        n_records: N, the number of records sampled from (>= 1).
        rate: q, the claimed sampling rate, in (0, 1].
        alpha: level of the test, in (0, 1).
        cap: c > 1, the cap on the standardized squared deviation.
    """

    kind: str = "poisson_batch"
    _STATE = ("_total", "_log_s", "_det_lw")

    def __init__(self, n_records: int, rate: float, alpha: float, cap: float = 4.0) -> None:
        self.n_records = _check_n_records(n_records)
        self.rate = _check_rate(rate)
        self.alpha = check_alpha(alpha)
        c = as_real("cap", cap)
        if not (c > 1.0) or not math.isfinite(c):
            raise ValueError(f"cap must be a finite number > 1, got {cap!r}")
        self.cap = c
        self._deterministic = self.rate == 1.0
        if self._deterministic:
            self.null_mean = 0.0
            self._lam = np.array([1.0, 1.0])
        else:
            self.null_mean = binomial_capped_chi2_mean(self.n_records, self.rate, c)
            m = self.null_mean
            self._lam = np.array([KAPPA / (c - m), KAPPA / max(m, 1e-300)])
        self._bets = OnlineNewtonStep(self._lam)
        self.reset()

    # ------------------------------------------------------------------ public API
    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._bets.reset()
        self._total = 0
        self._log_s = np.full(2, -np.inf)  # fresh-start started mass, [under, over]
        self._det_lw = 0.0

    def update(self, n: int | np.ndarray | list[int]) -> PoissonBatchTest:
        """Consume the batch sizes of one step (an int) or of several steps (in order)."""
        self.update_with_trajectory(n)
        return self

    def update_with_trajectory(self, n: int | np.ndarray | list[int]) -> np.ndarray:
        """Like :meth:`update`; returns the log-wealth after each of the steps ([n])."""
        sizes = _as_batch_sizes(n, self.n_records)
        if sizes.size == 0:
            return np.zeros(0)
        t0 = self._t
        if self._deterministic:
            bad = sizes != self.n_records
            traj = self._det_lw + np.cumsum(bad) * math.log(1.0 / self.alpha)
            self._det_lw = float(traj[-1])
        else:
            N, q, c, m = self.n_records, self.rate, self.cap, self.null_mean
            y = np.minimum((sizes - N * q) ** 2 / (N * q * (1.0 - q)), c)
            g = np.stack([m - y, y - m], axis=1)  # [n, 2]
            ons = self._bets.run(g)
            log_s = fresh_start_log_mass(self._log_s, np.log1p(self._lam * g), t0)
            self._log_s = log_s[-1].copy()
            steps = np.arange(t0 + 1, t0 + sizes.size + 1, dtype=np.float64)
            fs = np.logaddexp(log_s, -np.log1p(steps)[:, None])
            comp = np.concatenate([ons, fs], axis=1)
            traj = _logsumexp_rows(comp + _LOG_WEIGHTS)
        self._t += int(sizes.size)
        self._total += int(sizes.sum())
        self._record(traj)
        return np.asarray(traj, dtype=np.float64)

    @property
    def total(self) -> int:
        """Sum of the batch sizes seen."""
        return self._total

    @property
    def component_log_wealth(self) -> dict[str, float]:
        """log-wealth of each of the four components (before weighting)."""
        if self._deterministic:
            return {k: self._det_lw for k in ("ons_under", "ons_over", "fresh_under",
                                              "fresh_over")}
        fs = fresh_start_log_wealth(self._log_s, self._t)
        ons = self._bets.log_wealth
        return {"ons_under": float(ons[0]), "ons_over": float(ons[1]),
                "fresh_under": float(fs[0]), "fresh_over": float(fs[1])}

    @property
    def log_wealth(self) -> float:
        """log of the weighted average of the components' wealths (the decision's e-process)."""
        if self._deterministic:
            return self._det_lw
        comp = np.array(list(self.component_log_wealth.values()))
        return float(_logsumexp_rows((comp + _LOG_WEIGHTS)[None])[0])

    def rate_interval(self, alpha: float | None = None) -> tuple[float, float] | None:
        """Clopper-Pearson interval for q from the steps seen (None before the first step)."""
        if self._t == 0:
            return None
        a = self.alpha if alpha is None else alpha
        return rate_interval(self._total, self.n_records, self._t, a)

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        ci = self.rate_interval()
        return {
            "test": self.kind,
            "n_records": self.n_records,
            "rate": self.rate,
            "alpha": self.alpha,
            "cap": self.cap,
            "null_mean": self.null_mean,
            "n_steps": self._t,
            "mean_batch_size": self._total / self._t if self._t else None,
            "expected_batch_size": self.n_records * self.rate,
            "rate_interval": list(ci) if ci is not None else None,
            "log_wealth": self.log_wealth,
            "max_log_wealth": self._max_lw,
            "component_log_wealth": self.component_log_wealth,
            "rejected": self.rejected,
            "rejected_at": self._rejected_at,
        }

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["bets"] = self._bets.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        self._bets.load_state_dict(sd["bets"])

    # ------------------------------------------------------------------ internals
    def _config(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_records": self.n_records, "rate": self.rate,
                "alpha": self.alpha, "cap": self.cap}


def _logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """log(sum(exp(a), axis=1)), stable, for an [n, K] array of finite or -inf entries."""
    m = a.max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.log(np.exp(a - m).sum(axis=1)) + m[:, 0]
