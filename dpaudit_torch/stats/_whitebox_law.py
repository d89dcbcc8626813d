"""The exact finite-sample law of the white-box statistic L = D / S (docs/design.md section
13): :class:`ReleaseLaw`, its tail by a conservative quadrature over cells of W ~ chi^2(n0 - 1)
and of the IN count K ~ Binomial(n1 T, q). Imported (and re-exported) by
:mod:`dpaudit_torch.stats.whitebox`; :mod:`._whitebox_schedule` extends it to schedules."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

__all__ = ["ReleaseLaw"]

# CDF levels of the quadrature cells: fine in both tails, where a cell's worst corner is far
# from its mass, and even in the bulk
_LEVELS = np.unique(np.concatenate((
    [0.0], np.logspace(-15, -1.3, 70), np.linspace(0.05, 0.95, 121),
    1.0 - np.logspace(-1.3, -15, 70), [1.0])))


class ReleaseLaw:
    """The law of L = D / S for n1 IN and n0 OUT canaries, T steps and inclusion rate q.

    :meth:`tail` gives P_rho(L >= l) on a quadrature over the CDF levels of W ~ chi^2(n0 - 1) and
    K ~ Binomial(n1 T, q).  ``conservative=True`` evaluates each cell at its corner where the
    integrand is largest (the lower W edge for l >= 0, the upper for l < 0; the upper K edge), so
    the result is an upper bound on the exact tail; ``False`` evaluates at the cells' median
    levels (an accurate value for power statements).
    """

    def _chi2_cells(self) -> None:
        """The cells of the OUT canaries' chi-square (n_out - 1 degrees of freedom) between
        the quantile levels ``_LEVELS``: their ends, midpoints and masses."""
        nu = self.n0 - 1
        w_edges = stats.chi2.ppf(_LEVELS, nu)
        self._w_lo, self._w_hi = w_edges[:-1], w_edges[1:]
        self._w_mid = stats.chi2.ppf(0.5 * (_LEVELS[:-1] + _LEVELS[1:]), nu)
        self._w_mass = np.diff(_LEVELS)

    def __init__(self, n_in: int, n_out: int, steps: int, q: float) -> None:
        if n_in < 1 or n_out < 2 or steps < 1 or not (0.0 < q <= 1.0):
            raise ValueError(f"no law for n_in={n_in}, n_out={n_out}, steps={steps}, q={q}")
        self.n1, self.n0, self.T, self.q = int(n_in), int(n_out), int(steps), float(q)
        self._chi2_cells()
        n_trials = self.n1 * self.T
        if q >= 1.0:
            k_hi = np.array([float(n_trials)])
            k_mass = np.array([1.0])
            k_mid = k_hi
        else:
            k_edges = np.unique(stats.binom.ppf(_LEVELS[1:-1], n_trials, q))
            k_edges = np.concatenate((k_edges, [float(n_trials)]))
            cdf = stats.binom.cdf(k_edges, n_trials, q)
            cdf[-1] = 1.0
            k_mass = np.diff(np.concatenate(([0.0], cdf)))
            keep = k_mass > 0
            k_hi, k_mass = k_edges[keep], k_mass[keep]
            lo = np.concatenate(([-1.0], k_hi[:-1])) + 1.0
            k_mid = np.floor(0.5 * (lo + k_hi))
        self._k_hi, self._k_mid, self._k_mass = k_hi, k_mid, k_mass
        self._scale = math.sqrt(self.T * (1.0 / self.n1 + 1.0 / self.n0))
        self._sqrt_t_nu = math.sqrt(self.T / (self.n0 - 1))
        self._center_per_rho = self.q * self.T / math.sqrt(self.T)  # brackets only
        self._bracket_den = self.q * math.sqrt(self.T)

    def tail(self, stat: float, rho: float, conservative: bool = True) -> float:
        """P_rho(L >= stat)."""
        if stat == math.inf:
            return 0.0
        if stat == -math.inf:
            return 1.0
        if conservative:
            w = self._w_lo if stat >= 0 else self._w_hi
            k = self._k_hi
        else:
            w, k = self._w_mid, self._k_mid
        with np.errstate(invalid="ignore"):  # 0 x inf: a +inf cell of the count at rho 0
            a = (stat * self._sqrt_t_nu * np.sqrt(w))[:, None] - (rho / self.n1) * k[None, :]
            vals = special.ndtr(a / self._scale * -1.0)
        vals = np.where(np.isnan(vals), 1.0, vals)
        p = float(self._w_mass @ vals @ self._k_mass)
        return min(1.0, max(0.0, p))

    def quantile(self, prob: float, rho: float, conservative: bool = False) -> float:
        """The level-``prob`` quantile of L under rho: accurate, or with ``conservative`` the
        point whose conservative tail is 1 - prob (the test's critical value at level
        1 - prob: a statistic above it is rejected)."""
        center = rho * self._center_per_rho
        spread = 1.0 + abs(center)
        lo, hi = center - 10 * spread, center + 10 * spread

        def f(x: float) -> float:
            return (1.0 - self.tail(x, rho, conservative=conservative)) - prob

        while f(lo) > 0:
            lo -= 10 * spread
        while f(hi) < 0:
            hi += 10 * spread
        return float(optimize.brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))

    def rho_lower_bound(self, stat: float, alpha: float) -> float:
        """The largest rho the test rejects at level alpha: P_rho(L >= stat) = alpha (0 when
        rho = 0 is not rejected, inf when stat is inf)."""
        if stat == math.inf:
            return math.inf
        if self.tail(stat, 0.0) >= alpha:
            return 0.0
        hi = max(1e-6, 2.0 * stat / self._bracket_den)
        while self.tail(stat, hi) < alpha:
            hi *= 2.0
            if hi > 1e12:
                return math.inf
        return float(optimize.brentq(lambda r: self.tail(stat, r) - alpha, 0.0, hi,
                                     xtol=1e-12, rtol=1e-10))
