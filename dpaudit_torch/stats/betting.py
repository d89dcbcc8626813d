"""Testing by betting: the Online Newton Step bet and the wealth process.

A sequential test is a betting game (Shafer 2021; Waudby-Smith & Ramdas 2024). Before pair t the
test fixes a payoff g_t with conditional mean <= 0 under H0 and a bet lambda_t >= 0 with
1 + lambda_t g_t > 0. The wealth K_t = prod_i (1 + lambda_i g_i) is then a nonnegative
supermartingale under H0, and Ville's inequality gives P(sup_t K_t >= 1/alpha) <= alpha.

The bet is chosen by Online Newton Step (ONS) with the constants of Shekhar & Ramdas
("Nonparametric two-sample testing by betting", IEEE Trans. IT 2023), as in docs/design.md
section 1: lambda_1 = 0, A_0 = 1, and after payoff p_t

    z_t = -p_t / (1 + lambda_t p_t),   A_t = A_{t-1} + z_t^2,
    lambda_{t+1} = clip(lambda_t - c z_t / A_t, 0, lambda_max),   c = 2 / (2 - ln 3).

A test whose payoffs already carry a predictable stake (the hockey-stick test's default mixture of
fixed-stake experts, docs/design.md section 3) bets a fixed stake instead (:class:`FixedStake`).

Wealth is kept in log space (a sum of log1p terms), so 10^6 steps neither overflow nor underflow.

The recursion is O(1) per pair but inherently sequential. It runs on the host in float64 over a
whole chunk of pairs at once (one device-to-host copy per chunk, never one per pair), as a loop
compiled by Numba (``stats/_kernels.py``, about 0.1 microseconds per pair and component); the
heavy per-pair work of each test (kernel rows, set membership) is batched on the device before it.
"""

from __future__ import annotations

import math

import numpy as np

from .._compiled import compiled
from .._vecmath import exp_
from ._kernels import log_mean_exp_rows, ons_run

__all__ = ["ONS_C", "FixedStake", "OnlineNewtonStep", "log_mean_exp"]

#: the ONS step constant c = 2 / (2 - ln 3) ~= 2.2188
ONS_C: float = 2.0 / (2.0 - math.log(3.0))


#: log_mean_exp's compiled pass up to this many numbers; beyond, NumPy's vectorised exponential
#: (several times faster per number than the compiled loop's scalar one) wins over its call cost
_COMPILED_UP_TO = 1 << 12


def log_mean_exp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(mean(exp(a))) along ``axis``, stable (the wealth of an average of e-processes).

    Along the last axis of a small array with compiled kernels: one compiled pass
    (:func:`~dpaudit_torch.stats._kernels.log_mean_exp_rows`; the arrays here are small, a few
    pairs by a few components, so NumPy's dozen calls would cost more than the arithmetic)."""
    a = np.asarray(a, dtype=np.float64)
    if compiled() and a.ndim >= 1 and axis in (-1, a.ndim - 1) and a.shape[-1] > 0 \
            and a.size <= _COMPILED_UP_TO:
        rows = np.ascontiguousarray(a.reshape(-1, a.shape[-1]))
        res = np.empty(rows.shape[0])
        log_mean_exp_rows(rows, res)
        return res.reshape(a.shape[:-1]) if a.ndim > 1 else res[0]
    m = a.max(axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    total = exp_(a - m).sum(axis=axis, keepdims=True)
    out = np.log(total / a.shape[axis]) + m
    return np.squeeze(out, axis=axis)


#: the error of a payoff outside the range its bet cap was derived for (both bettors)
_BOUND_VIOLATED = (
    "betting bound violated (1 + lambda * payoff <= 0, or a non-finite payoff): a payoff lies "
    "outside the range its lambda_max was derived for; this is a bug, please report it (the "
    "bettor's state was left unchanged)")


class _Bettor:
    """What both bettors share: the caps ``lambda_max`` [K] (finite, > 0), the state ``lam``,
    ``a_sum``, ``log_wealth`` [K] and its ``state_dict`` / ``load_state_dict``."""

    def __init__(self, lambda_max: np.ndarray) -> None:
        lm = np.asarray(lambda_max, dtype=np.float64).reshape(-1)
        if lm.size == 0 or not np.all(np.isfinite(lm)) or np.any(lm <= 0):
            raise ValueError(f"lambda_max must be finite and > 0, got {lambda_max!r}")
        self.lambda_max = lm
        self.reset()

    @property
    def size(self) -> int:
        return int(self.lambda_max.size)

    def reset(self) -> None:
        raise NotImplementedError

    def _payoffs(self, payoffs: np.ndarray) -> np.ndarray:
        p_all = np.asarray(payoffs, dtype=np.float64)
        if p_all.ndim != 2 or p_all.shape[1] != self.size:
            raise ValueError(f"payoffs must have shape [n, {self.size}], got {p_all.shape}")
        return p_all

    def state_dict(self) -> dict[str, list[float]]:
        return {
            "lam": self.lam.tolist(),
            "a_sum": self.a_sum.tolist(),
            "log_wealth": self.log_wealth.tolist(),
        }

    def load_state_dict(self, sd: dict[str, list[float]]) -> None:
        arrays = {}
        for key in ("lam", "a_sum", "log_wealth"):
            arr = np.asarray(sd[key], dtype=np.float64)
            if arr.shape != (self.size,):
                raise ValueError(
                    f"bettor state {key!r} has shape {arr.shape}, expected ({self.size},)"
                )
            arrays[key] = arr.copy()
        self.lam, self.a_sum, self.log_wealth = (arrays["lam"], arrays["a_sum"],
                                                 arrays["log_wealth"])


class OnlineNewtonStep(_Bettor):
    """K independent ONS bettors, advanced together over a chunk of payoffs.

    Args:
        lambda_max: array [K]; each must guarantee ``1 + lambda * g > 0`` for every payoff ``g``
            the corresponding game can produce (the caller's responsibility; violated bounds are
            detected and raise ``RuntimeError`` instead of producing a NaN wealth).
    """

    def reset(self) -> None:
        k = self.size
        self.lam = np.zeros(k)
        self.a_sum = np.ones(k)
        self.log_wealth = np.zeros(k)

    def run(self, payoffs: np.ndarray) -> np.ndarray:
        """Bet on ``payoffs`` [n, K] in order; return the log-wealth after each pair, [n, K]."""
        p_all = np.ascontiguousarray(self._payoffs(payoffs))
        out = np.empty_like(p_all)
        # the compiled loop (stats/_kernels.py) works on copies: the bettor's state changes only
        # when the whole chunk was valid
        lam, a_sum, lw = self.lam.copy(), self.a_sum.copy(), self.log_wealth.copy()
        ok = ons_run(p_all, lam, a_sum, lw, self.lambda_max, ONS_C, out)
        if not ok:
            raise RuntimeError(_BOUND_VIOLATED)
        self.lam, self.a_sum, self.log_wealth = lam, a_sum, lw
        return out


class FixedStake(_Bettor):
    """K wealth processes that bet the same fixed stake ``lambda_max`` on every payoff.

    The interface of :class:`OnlineNewtonStep` (``lambda_max``, ``lam``, ``a_sum``,
    ``log_wealth``, :meth:`run`, ``state_dict``). For a test whose payoffs already carry their
    own predictable stake: the hockey-stick test's stake-weighted soft sets, for which
    1 + lambda_max g_t is the wealth factor of its mixture of (set, stake) experts
    (docs/design.md section 3). The stake is fixed in advance, so the wealth is a nonnegative
    supermartingale under H0 whenever the payoffs are predictable with conditional mean <= 0 and
    1 + lambda_max g > 0 for every possible payoff g (the caller's bound; a violation raises
    ``RuntimeError`` and leaves the state unchanged).
    """

    def reset(self) -> None:
        self.lam = self.lambda_max.copy()
        self.a_sum = np.ones(self.size)  # unused; kept for the common state layout
        self.log_wealth = np.zeros(self.size)

    def run(self, payoffs: np.ndarray) -> np.ndarray:
        """Bet on ``payoffs`` [n, K] in order; return the log-wealth after each pair, [n, K]."""
        p_all = self._payoffs(payoffs)
        factor = 1.0 + p_all * self.lambda_max
        if not (np.all(np.isfinite(factor)) and np.all(factor > 0.0)):
            raise RuntimeError(_BOUND_VIOLATED)
        out = np.cumsum(np.log(factor), axis=0) + self.log_wealth
        if out.shape[0]:
            self.log_wealth = out[-1].copy()
        return out
