"""The white-box release bound under a noise or clipping schedule (docs/design.md section 13,
"Schedules").

With Opacus's schedulers the noise multiplier sigma_t changes during the run (the accountant's
history holds it) and so may the clipping bound C_t (the optimizer's ``max_grad_norm``, read at
every step). The one-run monitor reads every canary value in units of that step's C_t, so canary
i's value at step t is

    Z_{t,i} = c S_i B_{t,i} + s b_t N_{t,i},     b_t = sigma_t / sigma_0,

with sigma_0 the first step's multiplier, c the canary's contribution (1 when clipping is right,
whatever C_t is) and s the noise scale (sigma_0 on a correct run). The family is
{c, s : rho = c / s}, with the schedule's shape b_t known. Each step is weighted by the
likelihood-ratio weight w_t = 1 / b_t^2 (= (c / b_t) / b_t^2 up to the constant c): the weighted
sum X_i = sum_t w_t Z_{t,i} has signal c sum_t w_t B_{t,i} and noise variance s^2 sum_t w_t^2
b_t^2 = s^2 V with V = sum_t w_t. The statistic L = D / S of the weighted sums then has the law of
the constant case with T replaced by V and the IN count by the weighted count
K = sum_{IN i} sum_t w_t B_{t,i}, a sum of scaled binomials (:class:`ScheduledReleaseLaw`, its law
on a lattice: exact when the weights are multiples of the smallest, else rounded up, which makes
K stochastically larger and the test conservative). The family member at rho is DP-SGD with the
per-step multipliers b_t / rho, whose epsilon is the PRV accountant's heterogeneous composition
(:func:`scheduled_epsilon`; a multiplier below the smallest the PRV grid resolves is raised
to it, so the ceiling, every step at that multiplier, is the constant case's); on a correct
run rho = 1 / sigma_0 and the multipliers are sigma_t, the claim's own composition. A constant
schedule is the constant case exactly (w_t = 1, V = T).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import fft, stats

from .._validation import check_delta
from ._whitebox_law import _LEVELS, ReleaseLaw

__all__ = ["NoiseSchedule", "ScheduledReleaseLaw", "scheduled_epsilon", "scheduled_terms",
           "simulate_scheduled_sums", "weighted_count_law",
           "K_GROUPS", "EPS_GROUPS"]

#: at most this many distinct weights in the law of the weighted IN count (more are rounded up
#: onto a geometric grid: a stochastically larger count, a conservative test)
K_GROUPS = 48
#: at most this many distinct noise multipliers in the epsilon map (more are rounded up: more
#: noise, a smaller epsilon, still a lower bound)
EPS_GROUPS = 12
#: probability left out at each end of a group's binomial (its upper tail goes to +inf)
_TAIL = 1e-15
#: mass put at +inf for the rounding of the FFT product (above its total error, about
#: 1e-16 log2(N) per factor and point, summed over N <= 10^6 points and <= 48 factors)
_FFT_SLACK = 1e-7


@dataclass(frozen=True)
class NoiseSchedule:
    """The noise multipliers of the audited steps as (distinct value, steps) pairs, and the
    first step's multiplier ``ref`` (the reference of the weights)."""

    ref: float
    values: tuple[float, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(self.counts) or not self.values:
            raise ValueError(f"a schedule needs as many counts as values, got {self.values!r} "
                             f"and {self.counts!r}")
        for v in (self.ref, *self.values):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"a schedule's noise multipliers must be finite and > 0, "
                                 f"got {v!r}")
        if any(int(c) < 1 for c in self.counts):
            raise ValueError(f"a schedule's step counts must be >= 1, got {self.counts!r}")

    @classmethod
    def from_steps(cls, sigmas: Sequence[float] | np.ndarray) -> NoiseSchedule:
        """The schedule of per-step multipliers ``sigmas`` (in step order)."""
        s = np.asarray(sigmas, dtype=np.float64).ravel()
        if s.size == 0:
            raise ValueError("a schedule needs at least one step")
        vals, counts = np.unique(s, return_counts=True)
        return cls(float(s[0]), tuple(map(float, vals)), tuple(map(int, counts)))

    @property
    def constant(self) -> bool:
        return len(self.values) == 1

    @property
    def steps(self) -> int:
        return int(sum(self.counts))

    def shape(self) -> np.ndarray:
        """b_j = sigma_j / sigma_0 of the distinct values."""
        return np.asarray(self.values) / self.ref

    def weights(self) -> np.ndarray:
        """w_j = 1 / b_j^2 of the distinct values."""
        return 1.0 / self.shape() ** 2

    def weight_of(self, sigma: float) -> float:
        """w_t of a step with multiplier ``sigma``."""
        return (self.ref / float(sigma)) ** 2

    @property
    def weight_sum(self) -> float:
        """V = sum_t w_t (also the noise variance of a weighted sum, in units of s^2)."""
        return float(np.dot(self.weights(), self.counts))

    def to_dict(self) -> dict[str, Any]:
        return {"reference_sigma": self.ref, "sigmas": list(self.values),
                "steps": list(self.counts), "weight_sum": self.weight_sum}


def _grouped(values: np.ndarray, counts: np.ndarray, groups: int, up: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """At most ``groups`` distinct values: contiguous groups of equal width in log scale, each
    given its largest (``up``) or smallest member, counts summed. Unchanged when few."""
    order = np.argsort(values)
    v, c = values[order], counts[order]
    if v.size <= groups:
        return v, c
    lv = np.log(v)
    edges = np.linspace(lv[0], lv[-1], groups + 1)
    idx = np.clip(np.searchsorted(edges, lv, side="right") - 1, 0, groups - 1)
    out_v, out_c = [], []
    for g in np.unique(idx):
        sel = idx == g
        out_v.append(v[sel].max() if up else v[sel].min())
        out_c.append(c[sel].sum())
    return np.asarray(out_v), np.asarray(out_c)


def _lattice_index(x: np.ndarray) -> np.ndarray:
    """ceil(x), with values within 1e-9 of an integer taken as that integer (float rounding of
    an exact multiple)."""
    r = np.rint(x)
    return np.where(np.abs(x - r) <= 1e-9 * np.maximum(1.0, np.abs(x)), r,
                    np.ceil(x)).astype(np.int64)


def weighted_count_law(n_in: int, q: float, weights: np.ndarray, counts: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, float]:
    """The law of K' >= K = sum_j w_j Binomial(n_in T_j, q) (independent) on a lattice:
    (values, probabilities, mass at +inf). Each group's binomial is cut at probability 1e-15 at
    both ends (the lower tail moved up to the cut, the upper to +inf) and its values w_j k
    rounded up to the lattice h = w_min / m, so K' >= K pointwise: exact when every w_j is a
    multiple of h (a constant schedule: the binomial itself)."""
    w = np.asarray(weights, dtype=np.float64)
    cnt = np.asarray(counts, dtype=np.int64)
    n_tr = n_in * cnt
    sd = math.sqrt(float(np.sum(w * w * n_tr)) * q * (1.0 - q)) if q < 1.0 else 0.0
    target = sd / max(256, 16 * w.size) if sd > 0 else float(w.min())
    m = max(1, math.ceil(float(w.min()) / target - 1e-9))
    h = float(w.min()) / m
    arrays: list[np.ndarray] = []
    lo_total = 0
    inf_mass = 0.0
    for wj, nj in zip(w, n_tr):
        nj = int(nj)
        if q >= 1.0:
            ks = np.array([nj])
            pk = np.array([1.0])
        else:
            lo = int(max(0, stats.binom.ppf(_TAIL, nj, q) - 1))
            hi = int(min(nj, stats.binom.isf(_TAIL, nj, q) + 1))
            ks = np.arange(lo, hi + 1)
            pk = stats.binom.pmf(ks, nj, q)
            pk[0] += float(stats.binom.cdf(lo - 1, nj, q)) if lo > 0 else 0.0
            inf_mass += float(stats.binom.sf(hi, nj, q))
        idx = _lattice_index(wj * ks / h)
        arrays.append(np.bincount(idx - idx[0], weights=pk))
        lo_total += int(idx[0])
    size = sum(a.size for a in arrays) - len(arrays) + 1
    if len(arrays) == 1:
        pmf_total = arrays[0]
    elif size * min(a.size for a in arrays) * len(arrays) <= 20_000_000:
        pmf_total = arrays[0]
        for a in arrays[1:]:
            pmf_total = np.convolve(pmf_total, a)
    else:  # one product in the frequency domain; its rounding goes to +inf
        n_fft = fft.next_fast_len(size, real=True)
        spec = np.ones(n_fft // 2 + 1, dtype=np.complex128)
        for a in arrays:
            spec *= fft.rfft(a, n_fft)
        pmf_total = fft.irfft(spec, n_fft)[:size]
        inf_mass += _FFT_SLACK
    pmf_total = np.clip(pmf_total, 0.0, None)
    values = (lo_total + np.arange(pmf_total.size)) * h
    return values, pmf_total, inf_mass


class ScheduledReleaseLaw(ReleaseLaw):
    """The law of L = D / S of the weighted sums (module docstring) for n1 IN and n0 OUT
    canaries under ``schedule`` at inclusion rate q; the methods of
    :class:`~dpaudit_torch.stats.whitebox.ReleaseLaw` (``tail``, ``quantile``,
    ``rho_lower_bound``), on cells of W ~ chi^2(n0 - 1) and of the lattice law of the weighted
    count (:func:`weighted_count_law`, its +inf mass a cell of its own)."""

    def __init__(self, n_in: int, n_out: int, schedule: NoiseSchedule, q: float) -> None:
        if n_in < 1 or n_out < 2 or not (0.0 < q <= 1.0):
            raise ValueError(f"no law for n_in={n_in}, n_out={n_out}, q={q}")
        self.n1, self.n0, self.q = int(n_in), int(n_out), float(q)
        self.T = schedule.steps
        self._chi2_cells()
        wts, cnts = _grouped(schedule.weights(), np.asarray(schedule.counts), K_GROUPS,
                             up=True)
        vals, pmf, inf_mass = weighted_count_law(self.n1, self.q, wts, cnts)
        cdf = np.cumsum(pmf)
        total = float(cdf[-1])
        at = np.unique(np.concatenate((
            np.searchsorted(cdf, _LEVELS[1:-1] * total, side="left"), [pmf.size - 1])))
        at = at[at < pmf.size]
        c_at = cdf[at]
        k_mass = np.diff(np.concatenate(([0.0], c_at)))
        prev = np.concatenate(([-1], at[:-1])) + 1
        k_hi, k_mid = vals[at], vals[(prev + at) // 2]
        keep = k_mass > 0
        k_hi, k_mid, k_mass = k_hi[keep], k_mid[keep], k_mass[keep]
        if inf_mass > 0 or total < 1.0:
            extra = max(inf_mass, 1.0 - total)
            k_hi = np.append(k_hi, math.inf)
            k_mid = np.append(k_mid, math.inf)
            k_mass = np.append(k_mass, extra)
        self._k_hi, self._k_mid, self._k_mass = k_hi, k_mid, k_mass
        v = schedule.weight_sum
        self._scale = math.sqrt(v * (1.0 / self.n1 + 1.0 / self.n0))
        self._sqrt_t_nu = math.sqrt(v / (self.n0 - 1))
        # the mean of L per unit of rho, for brackets
        self._center_per_rho = self.q * v / math.sqrt(v)
        self._bracket_den = self._center_per_rho


def _multipliers(schedule: NoiseSchedule, rho: float, q: float, delta: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The per-step multipliers b_j / rho of the family member at rho, grouped
    (:data:`EPS_GROUPS`, rounded up), each raised to at least the smallest multiplier the PRV
    grid resolves (more noise, a smaller epsilon), equal ones merged."""
    from ._whitebox_epsilon import smallest_sigma

    b, c = _grouped(schedule.shape(), np.asarray(schedule.counts), EPS_GROUPS, up=True)
    s_min = smallest_sigma(float(q), schedule.steps, float(delta))
    mult = np.maximum(b / rho, s_min)  # rho = inf: every step at s_min
    vals, inv = np.unique(mult, return_inverse=True)
    return vals, np.bincount(inv, weights=c).astype(np.int64)


@functools.lru_cache(maxsize=64)
def scheduled_epsilon(schedule: NoiseSchedule, rho: float, q: float, delta: float,
                      which: str = "lower") -> float:
    """epsilon(delta) of DP-SGD with the per-step multipliers sigma_t / (sigma_0 rho) at rate
    q: the PRV accountant's heterogeneous composition (Gopi, Lee & Wutschitz, NeurIPS 2021, in
    Opacus's implementation), the ``which`` end of its error interval; multipliers below the
    grid's smallest are raised (``"lower"`` stays a lower bound). 0 at rho = 0."""
    from ._whitebox_epsilon import PRV_EPS_ERROR, _prv_domain

    check_delta(delta)
    if which not in ("lower", "estimate", "upper"):
        raise ValueError(f"which must be 'lower', 'estimate' or 'upper', got {which!r}")
    if not (rho >= 0):
        raise ValueError(f"rho must be >= 0, got {rho!r}")
    if rho == 0:
        return 0.0
    mult, cnt = _multipliers(schedule, rho, q, delta)
    if mult.size == 1:  # one multiplier: the constant case's computation (and its cache)
        from ._whitebox_epsilon import dpsgd_epsilon

        return dpsgd_epsilon(float(mult[0]), float(q), schedule.steps, float(delta), which)
    from opacus.accountants.analysis.prv import (
        Domain,
        PoissonSubsampledGaussianPRV,
        TruncatedPrivacyRandomVariable,
        compose_heterogeneous,
        discretize,
    )

    steps = schedule.steps
    # the domain of the least private multiplier over every step: at least as wide as the
    # heterogeneous history's own (a wider domain only truncates less)
    length, mesh = _prv_domain(float(mult.min()), float(q), steps, float(delta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        domain = Domain.create_aligned(-length, length, mesh)
        dprvs = [discretize(TruncatedPrivacyRandomVariable(
            PoissonSubsampledGaussianPRV(float(q), float(s)), domain.t_min, domain.t_max),
            domain) for s in mult]
        dprv = compose_heterogeneous(dprvs=dprvs, num_self_compositions=[int(n) for n in cnt])
        lo, est, up = dprv.compute_epsilon(delta, delta / 1000, PRV_EPS_ERROR)
    return max(0.0, float({"lower": lo, "estimate": est, "upper": up}[which]))


def scheduled_terms(n_in: int, n_out: int, statistic: float, q: float, delta: float,
                    alpha: float, schedule: NoiseSchedule
                    ) -> tuple[float, float, Callable[[float], float]]:
    """(ceiling, rho_lb, epsilon of rho) of the bound under ``schedule``."""
    law = ScheduledReleaseLaw(n_in, n_out, schedule, q)
    rho = law.rho_lower_bound(statistic, alpha)

    def eps_of(r: float) -> float:
        return scheduled_epsilon(schedule, r if math.isfinite(r) else math.inf, q, delta)

    ceiling = scheduled_epsilon(schedule, math.inf, q, delta)
    return ceiling, rho, eps_of


def simulate_scheduled_sums(sigmas: Sequence[float] | np.ndarray, q: float, m: int,
                            rng: np.random.Generator, c: float = 1.0
                            ) -> tuple[np.ndarray, np.ndarray, NoiseSchedule]:
    """The weighted sums of a Gaussian release under per-step multipliers ``sigmas``, exactly
    and without per-step values: c sum_j w_j Binomial(T_j, q) S + N(0, sigma_0^2 V):
    (is_in, weighted sums, schedule)."""
    sched = NoiseSchedule.from_steps(sigmas)
    is_in = rng.random(m) < 0.5
    k = np.zeros(m)
    for wj, tj in zip(sched.weights(), sched.counts):
        k += wj * rng.binomial(tj, q, size=m)
    sums = c * k * is_in + rng.standard_normal(m) * sched.ref * math.sqrt(sched.weight_sum)
    return is_in, sums, sched
