"""Are the batches fresh at every step? A test of repeats in the batch sizes (docs/design.md
section 10, "Fresh batches").

Poisson subsampling draws a fresh batch at every step: the accountant's amplification by
subsampling needs the inclusion coins of step t to be independent of every earlier step (Abadi et
al., "Deep learning with differential privacy", CCS 2016; Mironov, Talwar & Zhang, "Renyi
differential privacy of the sampled Gaussian mechanism", arXiv 1908.10530, 2019). A loader whose
generator is re-seeded at every epoch (``torch.manual_seed`` at the top of the epoch loop, or the
sampler's own generator reset) draws the same batches every epoch; every step still looks like a
correct Poisson step, and the batch-size test of :mod:`.sampling`, which looks at each step's
law alone, passes. The auditor sees the batch sizes n_t; under such a loader their sequence
repeats with the epoch's period P, which independent batches make vanishingly unlikely.

:class:`BatchRepeatTest` bets, for every candidate lag P, on the event n_t = n_{t-P}. The e-value
of one step is

    e_t = 1{n_t = n_{t-P}} / b(n_{t-P}),   b(k) = max_q Binomial(N, q)(k) = Binomial(N, k/N)(k),

and the stake is a fixed fraction lambda of the wealth: the factor is 1 - lambda + lambda e_t.
Given the past, E[e_t] = p(n_{t-P}) / b(n_{t-P}) <= 1 for Binomial(N, q) batches at *any* rate q
(even a rate that changes from step to step, fixed in advance), so the factor has mean at most 1
whatever q is: the test is valid without trusting the claimed rate (testing by betting, docs/
design.md section 1; Shafer, "Testing by betting", JRSS A 2021). Each lag's bets are mixed over
start times (the lag's own clock, weights 1 / (j (j + 1))), so a repeat that begins late is
found as if the test had begun there (the fresh-start device of :mod:`.sampling`; Shin, Ramdas
& Rinaldo, "E-detectors", arXiv 2203.03532), and the lags are mixed with fixed weights summing
to 1: half on the epoch length the rate implies (floor and round of 1/q, which is
``len(loader)`` for Opacus's Poisson loader) and its first multiples, half on every lag
1..``max_lag`` in proportion to 1/P. A mixture of test supermartingales with fixed weights is
one (Vovk & Wang, "E-values: calibration, combination and applications", Ann. Statist. 2021),
so "the log-wealth reached log(1/alpha)" has probability at most alpha (Ville's inequality).

What it detects: a batch-size sequence that repeats at any lag up to ``max_lag`` (or at a multiple
of the epoch length up to ``epoch_multiples`` epochs): a loader re-seeded every epoch, every k
epochs, with an epoch of another length than 1/q, a resumed run that replays its first epoch;
fixed-size batches (they repeat at every lag). What it cannot: a repeat of the *records* with
fresh sizes (impossible under a re-seeded Poisson sampler, whose sizes are a function of its
coins), a re-seeded loader on some DDP ranks only (the auditor sees the sum over ranks, which then
does not repeat exactly), and lags beyond ``max_lag`` that are not a multiple of the epoch length.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from scipy import stats as sps

from .._validation import as_real, check_alpha, check_positive_int
from .sampling import _as_batch_sizes, _check_n_records, _check_rate, _Decision, _host

logger = logging.getLogger(__name__)

__all__ = ["BatchRepeatTest", "LOG_B_MARGIN", "candidate_lags", "max_binomial_log_pmf",
           "match_probability", "no_match_mass", "simulate_log_wealth"]

#: every lag 1..MAX_LAG is a candidate (besides the epoch length's multiples)
MAX_LAG: int = 2048
#: multiples of the epoch length given their own weight (re-seeded every k epochs, k <= this)
EPOCH_MULTIPLES: int = 4
#: the betting fraction lambda (a mismatch keeps 1 - lambda of a started product)
STAKE: float = 0.5
#: rows of a chunk processed at once (bounds the [rows, lags] work arrays)
_ROWS = 64


#: log b is raised by this much: SciPy's binomial pmf and log-pmf agree to about 1e-10
#: (relative), and b must not fall below any Binomial(N, q)(k) that is computed
LOG_B_MARGIN: float = 1e-8


def max_binomial_log_pmf(k: np.ndarray, n_records: int) -> np.ndarray:
    """log b(k), b(k) = max over q of Binomial(N, q)(k) = Binomial(N, k / N)(k) (the maximum
    likelihood rate), for integers 0 <= k <= N, raised by :data:`LOG_B_MARGIN` (a relative
    1e-8, far above the rounding of the pmf); b(0) = b(N) = 1 before it."""
    k = np.asarray(k, dtype=np.float64)
    return np.asarray(sps.binom.logpmf(k, n_records, k / n_records), dtype=np.float64) \
        + LOG_B_MARGIN


def match_probability(n_records: int, rate: float) -> float:
    """sum_k p(k)^2 for p = Binomial(N, q): the chance that two independent batch sizes are
    equal (summed over a window of 12 standard deviations, exact to double precision)."""
    N, q = int(n_records), float(rate)
    if q >= 1.0:
        return 1.0
    sd = math.sqrt(N * q * (1.0 - q))
    lo, hi = max(0, math.floor(N * q - 12 * sd - 2)), min(N, math.ceil(N * q + 12 * sd + 2))
    p = sps.binom.pmf(np.arange(lo, hi + 1), N, q)
    return float(np.sum(p * p))


def candidate_lags(rate: float, max_lag: int = MAX_LAG, epoch_multiples: int = EPOCH_MULTIPLES
                   ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The lags bet on and the log of their mixture weights (summing to 1), and the epoch
    lengths the rate implies.

    Half the weight goes to the epoch lengths P0 in {floor(1/q), round(1/q)} (Opacus's Poisson
    loader has ``int(1 / q)`` steps per epoch; a loader of fixed-size batches has 1/q =
    ``len(loader)``), split equally among them, each spread over its multiples k P0,
    k = 1..``epoch_multiples``, in proportion to 1 / (k (k + 1)); the other half over every lag
    1..``max_lag`` in proportion to 1/P. Without an epoch length of at least 2 (q > 1/2) every lag
    gets the whole weight in proportion to 1/P.
    """
    q = _check_rate(rate)
    max_lag = check_positive_int(max_lag, "max_lag")
    epoch_multiples = check_positive_int(epoch_multiples, "epoch_multiples")
    inv = 1.0 / q
    epochs = sorted({p for p in (math.floor(inv), round(inv)) if p >= 2})  # int(1/q): Opacus
    weights: dict[int, float] = {}
    share = 0.5 if epochs else 0.0
    all_lags = np.arange(1, max_lag + 1, dtype=np.float64)
    harmonic = float(np.sum(1.0 / all_lags))
    for p in range(1, max_lag + 1):
        weights[p] = (1.0 - share) / (p * harmonic)
    k = np.arange(1, epoch_multiples + 1, dtype=np.float64)
    wk = 1.0 / (k * (k + 1.0))
    wk /= wk.sum()
    for p0 in epochs:
        for kk, w in zip(range(1, epoch_multiples + 1), wk):
            lag = kk * p0
            weights[lag] = weights.get(lag, 0.0) + share / len(epochs) * float(w)
    lags = np.array(sorted(weights), dtype=np.int64)
    log_v = np.log(np.array([weights[int(p)] for p in lags]))
    return lags, log_v, epochs


def no_match_mass(stake: float, size: int) -> np.ndarray:
    """D(j), j = 0..size-1: the started mass of one lag after j bets that all lost,
    D(j) = (1 - lambda) (D(j - 1) + w_j), D(0) = 0, w_j = 1 / (j (j + 1)) (a linear recursion,
    run by ``scipy.signal.lfilter``)."""
    from scipy.signal import lfilter

    r = 1.0 - float(stake)
    j = np.arange(1, size, dtype=np.float64)
    return np.concatenate([[0.0], lfilter([r], [1.0, -r], 1.0 / (j * (j + 1.0)))])


#: the clock up to which D(j) is tabulated; beyond it D is taken as 0 (a lower bound: the
#: wealth computed is then at most the exact one, which keeps the level)
_D_SIZE = 1 << 16
#: the excess is kept relative to exp(scale); rescaled when it passes this
_RESCALE_ABOVE = 1e200


class BatchRepeatTest(_Decision):
    """Anytime-valid test that the batch sizes do not repeat at any lag more often than
    independent Binomial(N, q) batches allow (see the module docstring for the e-values).

    Every lag P has its mixture over start times W = S + 1 / (j + 1), j = t - P its own clock
    and S_j = f_j (S_{j-1} + w_j) its started mass (f the factor of step t). A bet that loses
    multiplies by r = 1 - lambda whatever the lag, so S splits into the mass D(j) that every
    lag without a win has (:func:`no_match_mass`, the same for every lag) and an excess
    X = S - D, which decays as r^age between wins and at a win becomes
    f X + (f - r) (D(j - 1) + w_j) (docs/design.md section 10, "Fresh batches"). Per step the
    cost is a few passes over the lags without a transcendental function, except at the lags
    whose sizes matched.

    Args:
        n_records: N, the number of records sampled from (>= 1).
        rate: q, the sampling rate (in (0, 1]); it only sets the epoch lengths given extra weight
            (the e-values hold for every rate).
        alpha: level of the test, in (0, 1).
        max_lag: every lag 1..max_lag is bet on.
        epoch_multiples: multiples of the epoch length bet on with their own weight.
        stake: the betting fraction lambda in (0, 1).
    """

    kind: str = "batch_repeat"
    _STATE = ("_matches", "_scale")

    def __init__(self, n_records: int, rate: float, alpha: float, max_lag: int = MAX_LAG,
                 epoch_multiples: int = EPOCH_MULTIPLES, stake: float = STAKE) -> None:
        self.n_records = _check_n_records(n_records)
        self.rate = _check_rate(rate)
        self.alpha = check_alpha(alpha)
        lam = as_real("stake", stake)
        if not 0.0 < lam < 1.0:
            raise ValueError(f"stake must lie in (0, 1), got {stake!r}")
        self.stake = lam
        self.max_lag = check_positive_int(max_lag, "max_lag")
        self.epoch_multiples = check_positive_int(epoch_multiples, "epoch_multiples")
        self.lags, self.log_v, self.epoch_lengths = candidate_lags(
            self.rate, self.max_lag, self.epoch_multiples)
        self.v = np.exp(self.log_v)
        self.horizon = int(self.lags.max())
        N, q = self.n_records, self.rate
        sd = math.sqrt(N * q * (1.0 - q))
        lo, hi = max(0, math.floor(N * q - 12 * sd) - 2), min(N, math.ceil(N * q + 12 * sd) + 2)
        self._table = (lo, max_binomial_log_pmf(np.arange(lo, hi + 1), N))
        self._r = 1.0 - lam
        self._log_lam = math.log(lam)
        d = no_match_mass(lam, _D_SIZE)
        j = np.arange(_D_SIZE, dtype=np.float64)
        #: g(j) = D(j) + 1 / (j + 1): a lag's wealth without a win after j bets
        self._g = d + 1.0 / (j + 1.0)
        #: D(j - 1) + w_j, the mass a win at clock j multiplies (index j; 0 unused)
        self._dw = np.concatenate([[0.0], d[:-1] + 1.0 / (j[1:] * (j[1:] + 1.0))])
        self.reset()

    # ------------------------------------------------------------------ public API
    def reset(self) -> None:
        """Forget every step (the configuration is kept)."""
        self._reset_decision()
        self._x = np.zeros(self.lags.size)  # excess over D per lag, relative to exp(_scale)
        self._scale = 0.0
        self._matches = np.zeros(self.lags.size, dtype=np.int64)  # n_t = n_{t-P} so far
        self._hist = np.zeros(0, dtype=np.int64)  # the last `horizon` sizes, oldest first

    def update(self, n: int | np.ndarray | list[int]) -> BatchRepeatTest:
        """Consume the batch sizes of one step (an int) or of several steps (in order)."""
        self.update_with_trajectory(n)
        return self

    def update_with_trajectory(self, n: int | np.ndarray | list[int]) -> np.ndarray:
        """Like :meth:`update`; returns the log-wealth after each of the steps ([n])."""
        sizes = _as_batch_sizes(n, self.n_records).astype(np.int64)
        if sizes.size == 0:
            return np.zeros(0)
        out = [self._chunk(sizes[i:i + _ROWS]) for i in range(0, sizes.size, _ROWS)]
        traj = np.concatenate(out)
        self._record(traj)
        return traj

    def lag_log_wealth(self) -> np.ndarray:
        """log W of every lag's mixture over start times now ([lags])."""
        with np.errstate(divide="ignore"):
            return np.logaddexp(np.log(self._g_of(self._t - self.lags)),
                                np.log(self._x) + self._scale)

    @property
    def log_wealth(self) -> float:
        """log of the mixture over lags (the test's e-process) now."""
        return self._mixture(self._t)

    def best_lag(self) -> dict[str, Any] | None:
        """The lag whose wealth is largest now, with its matches and bets (None before any
        bet)."""
        bets = np.maximum(self._t - self.lags, 0)
        if not bets.any():
            return None
        lw = self.lag_log_wealth()
        i = int(np.argmax(np.where(bets > 0, lw, -np.inf)))
        p_match = match_probability(self.n_records, self.rate)
        return {"lag": int(self.lags[i]), "log_wealth": float(lw[i]),
                "matches": int(self._matches[i]), "bets": int(bets[i]),
                "expected_matches": float(bets[i] * p_match)}

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports."""
        return {"test": self.kind, "n_records": self.n_records, "rate": self.rate,
                "alpha": self.alpha, "stake": self.stake, "max_lag": self.max_lag,
                "epoch_lengths": list(self.epoch_lengths), "lags_tested": int(self.lags.size),
                "n_steps": self._t, "log_wealth": self.log_wealth,
                "max_log_wealth": self._max_lw, "rejected": self.rejected,
                "rejected_at": self._rejected_at, "best_lag": self.best_lag()}

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["hist"] = self._hist.tolist()
        sd["x"] = self._x.tolist()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        hist = np.array(_host(sd["hist"]), dtype=np.int64).reshape(-1)
        x = np.array(_host(sd["x"]), dtype=np.float64).reshape(-1)
        if hist.size > self.horizon or x.size != self.lags.size or not (x >= 0).all():
            raise ValueError(f"state_dict of {type(self).__name__} does not fit this test "
                             f"({hist.size} past sizes, {x.size} excess values)")
        self._hist, self._x = hist, x

    # ------------------------------------------------------------------ internals
    def _config(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_records": self.n_records, "rate": self.rate,
                "alpha": self.alpha, "max_lag": self.max_lag,
                "epoch_multiples": self.epoch_multiples, "stake": self.stake}

    def _g_of(self, j: np.ndarray) -> np.ndarray:
        """g(j) = D(j) + 1 / (j + 1) for clocks j >= 1 (D taken as 0 beyond its table), 1 for
        j <= 0 (a lag that has not bet yet)."""
        jc = np.maximum(j, 0)
        if int(jc.max()) < _D_SIZE:
            return self._g[jc]
        return np.where(jc < _D_SIZE, self._g[np.minimum(jc, _D_SIZE - 1)], 1.0 / (jc + 1.0))

    def _dw_of(self, j: np.ndarray) -> np.ndarray:
        """D(j - 1) + w_j for clocks j >= 1 (D as 0 beyond its table)."""
        jf = j.astype(np.float64)
        return np.where(j < _D_SIZE, self._dw[np.minimum(j, _D_SIZE - 1)], 1.0 / (jf * (jf + 1.0)))

    def _mixture(self, t: int) -> float:
        """log sum_P v_P (g(t - P) + X_P) after step t."""
        return self._combine(float(self.v @ self._g_of(t - self.lags)))

    def _combine(self, base: float) -> float:
        """log(base + exp(scale) v . X)."""
        extra = float(self.v @ self._x)
        if extra <= 0.0:
            return math.log(base)
        return float(np.logaddexp(math.log(base), math.log(extra) + self._scale))

    def _log_b(self, k: np.ndarray) -> np.ndarray:
        """log b(k) from a table over the likely sizes (N q +- 12 sd), else computed."""
        lo, table = self._table
        pos = k - lo
        inside = (pos >= 0) & (pos < table.size)
        out = np.empty(k.shape, dtype=np.float64)
        out[inside] = table[pos[inside]]
        if not inside.all():
            out[~inside] = max_binomial_log_pmf(k[~inside], self.n_records)
        return out

    def _chunk(self, x: np.ndarray) -> np.ndarray:
        """Bet on the sizes ``x`` (at most ``_ROWS``) of the next steps; log-wealth after each."""
        n, t0, h = x.size, self._t, self._hist.size
        seq = np.concatenate([self._hist, x])
        idx = h + np.arange(n)[:, None] - self.lags[None, :]  # position of n_{t-P} in seq
        match = (idx >= 0) & (seq[np.maximum(idx, 0)] == x[:, None])  # t > P and equal sizes
        rows, cols = np.nonzero(match)
        gain = np.empty(0)
        if rows.size:
            self._matches += match.sum(axis=0)
            # f - r = lambda / b(n_{t-P}), in log
            gain = self._log_lam - self._log_b(x[rows])
        # every row's wealth without wins, sum_P v_P g(t - P), in one product
        base = self._g_of(t0 + 1 + np.arange(n)[:, None] - self.lags[None, :]) @ self.v
        bounds = np.searchsorted(rows, np.arange(n + 1))  # nonzero() lists rows in order
        r, out = self._r, np.empty(n)
        for i in range(n):
            self._x *= r
            a, b = bounds[i], bounds[i + 1]
            if b > a:
                c = cols[a:b]
                j = t0 + 1 + i - self.lags[c]
                # X_j = f X_{j-1} + (f - r) (D(j-1) + w_j), with r X_{j-1} already applied
                self._x[c] += np.exp(gain[a:b]) * (self._x[c] / r + self._dw_of(j) * math.exp(
                    -self._scale))
                top = float(self._x[c].max())  # only the lags that won can have grown
                if top > _RESCALE_ABOVE:
                    self._x /= top
                    self._scale += math.log(top)
            out[i] = self._combine(float(base[i]))
        self._t += n
        self._hist = seq[-self.horizon:].copy()
        return out


def _logsumexp(a: np.ndarray, axis: int | None = None) -> Any:
    """log(sum(exp(a))) along ``axis`` (all entries finite or -inf, at least one finite)."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out.reshape(()) if axis is None else np.squeeze(out, axis=axis)


def simulate_log_wealth(sizes: np.ndarray, n_records: int, rate: float,
                        max_lag: int = MAX_LAG, epoch_multiples: int = EPOCH_MULTIPLES,
                        stake: float = STAKE) -> np.ndarray:
    """The log-wealth of :class:`BatchRepeatTest` after every step of many sequences at once,
    for simulations of its level and power: ``sizes`` [runs, T] -> [runs, T].

    A second implementation, straight from the definition (every lag's started mass in log
    space, S_j = f_j (S_{j-1} + w_j); the lags not yet betting count at 1), vectorised over the
    runs instead of the lags; the tests check that both agree.
    """
    x = np.asarray(sizes)
    if x.ndim != 2:
        raise ValueError(f"sizes must be an array [runs, steps], got shape {x.shape}")
    x = _as_batch_sizes(x, _check_n_records(n_records)).reshape(x.shape).astype(np.int64)
    lags, log_v, _ = candidate_lags(rate, max_lag, epoch_multiples)
    lam = float(stake)
    runs, T = x.shape
    active = lags[lags < T]  # a lag P bets from step P + 1 on
    lv_act = log_v[: active.size]
    v_idle = np.exp(log_v[active.size:]).sum()  # the lags that never bet in T steps
    log_s = np.full((runs, active.size), -np.inf)
    out = np.empty((runs, T))
    lo = int(x.min())
    table = max_binomial_log_pmf(np.arange(lo, int(x.max()) + 1), int(n_records))
    log_keep, log_lam = math.log1p(-lam), math.log(lam)
    for t in range(1, T + 1):
        on = active < t  # lags with a past value n_{t-P}
        k = int(on.sum())
        if k:
            P = active[:k]
            prev = x[:, t - 1 - P]  # [runs, k]
            match = prev == x[:, t - 1][:, None]
            log_f = np.full(prev.shape, log_keep)
            if match.any():
                log_f[match] = np.logaddexp(log_keep, log_lam - table[prev[match] - lo])
            j = (t - P).astype(np.float64)
            log_s[:, :k] = log_f + np.logaddexp(log_s[:, :k], -np.log(j) - np.log1p(j))
        j_all = np.maximum(t - active, 0).astype(np.float64)
        log_w = np.logaddexp(log_s, -np.log1p(j_all)[None, :])
        terms = lv_act[None, :] + log_w
        if v_idle > 0:
            terms = np.concatenate([terms, np.full((runs, 1), math.log(v_idle))], axis=1)
        out[:, t - 1] = _logsumexp(terms, axis=1)
    return out
