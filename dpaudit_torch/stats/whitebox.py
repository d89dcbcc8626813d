"""The white-box release bound: the one-run canaries' whole traces, within the DP-SGD family
(docs/design.md section 13).

In a white-box audit of DP-SGD every step releases, for each one-run canary i, the value

    Z_{t,i} = c S_i B_{t,i} + sigma N_{t,i}       (units of the clipping norm C)

where S_i is the canary's secret coin (IN = 1), B_{t,i} ~ Bernoulli(q) is drawn by the auditor
itself (Poisson inclusion at the accountant's rate), c is what the implementation lets a clipped
canary contribute (1 when clipping is right) and N is the step's noise.  The privacy of that
release is the accountant's DP-SGD with noise multiplier 1 / rho, rho = c / sigma, at rate q for
T steps: the *DP-SGD family*, one parameter rho.

Instead of thresholding scores into guesses (Steinke et al. 2023; Mahloujifar, Melis &
Chaudhuri 2025) this test uses every observation's value, the known inclusion probability and the
noise measured on the OUT canaries themselves, as Agrawal et al. ("Let's Ask Gauss: Improved
One-Run Privacy Auditing", arXiv 2606.12733) propose; but where they rely on a central limit
theorem, the statistic here has an exact finite-sample law:

    D   = mean of the IN canaries' sums  -  mean of the OUT canaries' sums
    S^2 = sample variance of the OUT canaries' sums            (n0 - 1 degrees of freedom)
    L   = D / S
    L  ~  [rho K / n1 + sqrt(T (1/n1 + 1/n0)) N] / sqrt(T W / (n0 - 1)),
          K ~ Binomial(n1 T, q),  N ~ N(0, 1),  W ~ chi^2(n0 - 1),  independent,

which depends on (c, sigma) only through rho and is stochastically increasing in it.  So
P_rho(L >= l) is a valid p-value for "rho <= rho0" for every rho0, and the largest rho0 it rejects
at level alpha is a lower confidence bound rho_lb.  The bound on epsilon is the *lower* end of the
PRV accountant's error interval (Gopi, Lee & Wutschitz, NeurIPS 2021) at noise multiplier
1 / rho_lb: a lower bound on the true epsilon of every release in the family whose rho is at least
rho_lb.  P_rho(L >= l) is computed by a two-dimensional quadrature whose every cell takes the
value of its worst corner, so the computed p-value is never below the true one (conservative).

It is a test *within* the family (:data:`WHITEBOX_FAMILY_NOTE`): a lower bound on epsilon for
releases in the Gaussian DP-SGD family, the claim's own model, so above the claim it refutes the
claim as stated (its model or its parameters); not a lower bound on the true epsilon of an
arbitrary mechanism.  The family's assumptions that the data can check are checked on the OUT
canaries' per-step values (:func:`family_check`, at the bound's own alpha split over four
parts): independent steps (the variance of the sums against T times the per-step variance, and
the noise monitor's two-sided sign test across steps) and a Gaussian shape (kurtosis, and the
noise monitor's whole-null cells, Krichevsky & Trofimov mixtures).  A release that fails the
check gets no bound: the number would not be a bound for it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from .._validation import check_alpha, check_delta
from ._whitebox_epsilon import dpsgd_epsilon, smallest_sigma
from ._whitebox_law import _LEVELS, ReleaseLaw  # noqa: F401 - re-exported
from .one_run_power import few_inclusions_warning

logger = logging.getLogger(__name__)

__all__ = ["WHITEBOX_FAMILY_NOTE", "WHITEBOX_ALPHA", "ReleaseMoments", "FamilyCheck",
           "WhiteboxResult", "ReleaseLaw", "release_moments", "family_check", "rho_lower_bound",
           "whitebox_bound", "whitebox_power", "dpsgd_epsilon", "smallest_sigma",
           "whole_null_tests", "schedule_moments", "FAMILY_PARTS", "NOISE_FREE_RATIO"]

#: stated with every white-box result: what it proves
WHITEBOX_FAMILY_NOTE = (
    "a lower bound on epsilon for releases in the Gaussian DP-SGD family (the canary's white-box "
    "release is c B + N(0, sigma^2) per step, independent steps, B ~ Bernoulli(q) drawn by the "
    "auditor), which is the accountant's own model of the run: above the claim it refutes the "
    "claim as stated (its model or its parameters); it is not a lower bound on the true epsilon "
    "of an arbitrary mechanism. Reported only when the OUT canaries' per-step values pass the "
    "family check (variance ratio, kurtosis, whole-null cells, lag signs) at the bound's level")

#: default level of the white-box bound.  The bound comes within a few percent of a correct
#: run's claim, so its level is how often a correct run's bound can exceed its claim; the
#: guess-based bounds stay far below the claim and keep the audit's alpha (docs/design.md
#: section 13)
WHITEBOX_ALPHA = 1e-3

#: a release whose OUT values' per-step RMS is at most this fraction of the canary's measured
#: contribution c_hat = D / (q T) is noise-free: float rounding of a run without noise, where a
#: canary's presence is seen outright.  Relative, so that a release multiplied by any positive
#: constant gets the same verdict (an absolute threshold let a release whose contribution and
#: noise are both ~1e-6 skip the shape and independence checks)
NOISE_FREE_RATIO = 1e-6
#: the family check's parts; its level (the bound's alpha) is split evenly among them
FAMILY_PARTS = ("variance ratio", "kurtosis", "whole-null shape", "lag signs")
#: lags of the family check's sign test (the noise monitor's defaults)
FAMILY_LAGS: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 10, 16)
#: steps of OUT values fed to the whole-null tests at a time (bounds their scratch memory)
_FEED_ROWS = 256

# ------------------------------------------------------------------------------------------------
# sufficient statistics and the family check
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseMoments:
    """What the bound needs from the canaries' traces, split by the revealed coins.

    ``d``: mean IN sum minus mean OUT sum; ``s2``: sample variance of the OUT sums;
    ``step_var``: mean of Z^2 over every OUT value (the per-step noise variance);
    ``kurtosis``: mean of Z^4 over mean of Z^2 squared, OUT values (None when not tracked);
    units of C.  Under a schedule (``weight_sum`` V = sum_t w_t, :mod:`._whitebox_schedule`)
    the sums are weighted and Z^2, Z^4 are of the values divided by b_t.
    """

    n_in: int
    n_out: int
    steps: int
    d: float
    s2: float
    step_var: float | None = None
    kurtosis: float | None = None
    weight_sum: float | None = None

    @property
    def signal_steps(self) -> float:
        """The noise variance of a sum in per-step units: T, or V under a schedule."""
        return float(self.steps if self.weight_sum is None else self.weight_sum)

    @property
    def statistic(self) -> float:
        """L = D / S (inf when the OUT sums do not vary and D > 0)."""
        if self.s2 > 0:
            return self.d / math.sqrt(self.s2)
        return math.inf if self.d > 0 else (0.0 if self.d == 0 else -math.inf)


def release_moments(sums: np.ndarray, is_in: np.ndarray, steps: int,
                    sum_sq: np.ndarray | None = None, sum_4: np.ndarray | None = None,
                    weight_sum: float | None = None) -> ReleaseMoments:
    """The moments of the canaries' traces: per-canary sums of Z (and optionally of Z^2 and Z^4)
    over ``steps`` steps, with the revealed coins ``is_in``."""
    sums = np.asarray(sums, dtype=np.float64).ravel()
    is_in = np.asarray(is_in, dtype=bool).ravel()
    if sums.shape != is_in.shape:
        raise ValueError(f"sums {sums.shape} and coins {is_in.shape} differ in shape")
    if not np.all(np.isfinite(sums)):
        raise ValueError("canary sums must be finite")
    ins, outs = sums[is_in], sums[~is_in]
    n1, n0 = int(ins.size), int(outs.size)
    if n1 < 1 or n0 < 2:
        raise ValueError(f"need at least 1 IN and 2 OUT canaries, got {n1} and {n0}")
    d = float(ins.mean() - outs.mean())
    s2 = float(outs.var(ddof=1))
    step_var = kurt = None
    if sum_sq is not None and steps > 0:
        sq = np.asarray(sum_sq, dtype=np.float64).ravel()[~is_in]
        step_var = float(sq.sum() / (n0 * steps))
        if sum_4 is not None and step_var > 0:
            q4 = np.asarray(sum_4, dtype=np.float64).ravel()[~is_in]
            kurt = float(q4.sum() / (n0 * steps) / step_var ** 2)
    return ReleaseMoments(n1, n0, int(steps), d, s2, step_var, kurt, weight_sum)


def schedule_moments(values: np.ndarray, sigmas: Sequence[float] | np.ndarray,
                     is_in: np.ndarray) -> tuple[ReleaseMoments, Any]:
    """(moments, schedule) of per-step canary values [steps, m] under per-step multipliers
    ``sigmas``: the sums weighted by w_t, and the second and fourth moments of Z_t / b_t (what
    the one-run monitor accumulates)."""
    from ._whitebox_schedule import NoiseSchedule

    z = np.asarray(values, dtype=np.float64)
    sched = NoiseSchedule.from_steps(sigmas)
    s = np.asarray(sigmas, dtype=np.float64).ravel()
    if z.ndim != 2 or z.shape[0] != s.size:
        raise ValueError(f"values {z.shape} must be [steps, m] with {s.size} steps")
    b = s / sched.ref
    x = z / b[:, None]
    sq = (x * x).sum(0)
    return release_moments(z.T @ (1.0 / b ** 2), is_in, s.size, sq, (x ** 4).sum(0),
                           weight_sum=sched.weight_sum), sched


@dataclass(frozen=True)
class FamilyCheck:
    """Whether the OUT canaries' per-step values fit the family: ``passed``, and why not.

    ``level``: the level of each part (the check's alpha split over :data:`FAMILY_PARTS`);
    ``whole_null_log_wealth`` / ``lag_log_wealth``: the largest log-wealth the whole-null shape
    test and the two-sided lag sign test reached, against ``log_threshold`` = log(1 / level);
    ``value_steps``: the steps of per-step values those two tests saw."""

    passed: bool
    reason: str
    dispersion: float | None = None
    dispersion_min: float | None = None
    kurtosis: float | None = None
    kurtosis_tolerance: float | None = None
    level: float | None = None
    whole_null_log_wealth: float | None = None
    whole_null_worst: str | None = None
    lag_log_wealth: float | None = None
    lag_worst: int | None = None
    log_threshold: float | None = None
    value_steps: int | None = None
    noise_free: bool = False


def _finite(*vals: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in vals)


def _out_rows(out_values: np.ndarray | None, n_out: int) -> np.ndarray | None:
    """The OUT canaries' per-step values [steps, n0] (float64), rows with a non-finite value
    dropped (a skipped step carries no evidence); ValueError on a wrong shape."""
    if out_values is None:
        return None
    x = np.asarray(out_values)
    if x.ndim != 2 or x.shape[1] != n_out:
        raise ValueError(f"out_values must be [steps, {n_out}] (one column per OUT canary), "
                         f"got shape {x.shape}")
    x = x.astype(np.float64, copy=False)
    keep = np.isfinite(x).all(axis=1)
    return x if keep.all() else x[keep]


def whole_null_tests(xi: np.ndarray, level: float) -> tuple[Any, Any]:
    """The noise monitor's whole-null tests, run on standardised per-step values ``xi``
    [steps, n] (iid N(0, 1) under the null): the shape / tails / lag-1 cells of
    :class:`~dpaudit_torch.stats.noise_null.NoiseNullTest` and the sign test of
    :class:`~dpaudit_torch.stats.noise.NoiseIndependenceTest` at lags :data:`FAMILY_LAGS`,
    two-sided; each at ``level``.  Returns the two tests after every row."""
    from .noise import NoiseIndependenceTest
    from .noise_null import NoiseNullTest

    n = int(xi.shape[1])
    null = NoiseNullTest(np.zeros(n, dtype=np.int64), None, None, alpha=level)
    lags = NoiseIndependenceTest(FAMILY_LAGS, alpha=level, two_sided=True)
    for r0 in range(0, int(xi.shape[0]), _FEED_ROWS):
        block = xi[r0:r0 + _FEED_ROWS]
        null.update_steps(block)
        lags.update_steps(block)
    return null, lags


def family_check(mom: ReleaseMoments, alpha: float = WHITEBOX_ALPHA, *,
                 q: float | None = None, out_values: np.ndarray | None = None) -> FamilyCheck:
    """Check the family's assumptions on the OUT canaries (docs/design.md section 13).

    The check runs at level ``alpha`` (the bound's own): its parts, :data:`FAMILY_PARTS`, each
    at alpha / 4, so a release in the family has its bound withheld with probability at most
    alpha (Bonferroni; the scale of the shape test is estimated, which only makes it more
    conservative: Chernoff & Lehmann, Ann. Math. Statist. 1954).

    * Independent steps, in the sums: S^2 / (T step_var) is chi^2(n0 - 1) / (n0 - 1) when the
      steps are independent.  Too small a ratio means the sums vary less than independent steps
      allow (negatively correlated noise), which would inflate L; a larger ratio only makes the
      bound smaller, so this part is one-sided.
    * Gaussian shape, in the moments: the kurtosis of the N = n0 T values is 3 +- sqrt(24 / N)
      for Gaussian noise; outside 3 +- z sqrt(24 / N) (two-sided) the shape is not Gaussian.
    * Gaussian shape, in the cells: the noise monitor's whole-null test
      (:class:`~dpaudit_torch.stats.noise_null.NoiseNullTest`: 16 equal-mass cells, the tail
      cells and the lag-1 transition cells) on the OUT values standardised by their RMS.
      A noise of kurtosis 3 with another shape passes the kurtosis and fails here.
    * Independence across steps, in the signs: the noise monitor's sign test
      (:class:`~dpaudit_torch.stats.noise.NoiseIndependenceTest`) at lags 1-16, two-sided:
      scale-free, and it sees steps correlated in pairs, which the variance ratio misses when
      few canaries are OUT.

    ``out_values``: the OUT canaries' per-step values [steps, n0] (units of C; any window of
    consecutive steps fixed in advance); without them the check fails.  ``q``: the inclusion
    rate, for the noise-free test (the contribution c_hat = D / (q T)); None uses q = 1 (a
    smaller c_hat: a stricter test).  A noise-free release (per-step RMS at most
    :data:`NOISE_FREE_RATIO` c_hat, with D > 0) is the family's limit sigma -> 0 and passes.
    Every statistic must be finite: a NaN or infinite one withholds the bound, with its name.
    """
    alpha = check_alpha(alpha)
    if q is not None and not (0.0 < q <= 1.0):
        raise ValueError(f"inclusion rate q must be in (0, 1], got {q!r}")
    level = alpha / len(FAMILY_PARTS)
    x = _out_rows(out_values, mom.n_out)
    if mom.step_var is None:
        return FamilyCheck(False, "per-step moments were not recorded (a checkpoint of an "
                                  "older version): the family check cannot run", level=level)
    if mom.steps < 2:
        return FamilyCheck(False, "fewer than 2 steps: the family check cannot run",
                           level=level)
    for name, v in (("the IN-OUT difference D", mom.d), ("the OUT sums' variance", mom.s2),
                    ("the per-step variance", mom.step_var)):
        if not _finite(v):
            return FamilyCheck(False, f"{name} is not finite ({v!r}): the family check "
                                      f"cannot run", level=level)
    rms = math.sqrt(max(mom.step_var, 0.0))
    c_hat = mom.d / ((1.0 if q is None else float(q)) * mom.signal_steps)
    if mom.d > 0 and rms <= NOISE_FREE_RATIO * c_hat:
        return FamilyCheck(True, f"a noise-free release: the OUT canaries' values have RMS "
                                 f"{rms:.3g} C, at most {NOISE_FREE_RATIO:g} times the "
                                 f"canaries' measured contribution {c_hat:.3g} C (the "
                                 f"family's limit sigma -> 0)", level=level, noise_free=True)
    if not mom.step_var > 0:
        return FamilyCheck(False, "the OUT canaries' values carry no noise and the IN canaries "
                                  "no signal", level=level)
    nu = mom.n_out - 1
    ratio = mom.s2 / (mom.signal_steps * mom.step_var)
    r_min = float(stats.chi2.ppf(level, nu) / nu)
    if not _finite(ratio):
        return FamilyCheck(False, f"the variance ratio is not finite ({ratio!r})", ratio, r_min,
                           level=level)
    if ratio < r_min:
        return FamilyCheck(False, f"the OUT canaries' sums vary less than independent steps "
                                  f"allow (variance ratio {ratio:.4g} < {r_min:.4g}): the "
                                  f"steps' noise is not independent", ratio, r_min, level=level)
    if mom.kurtosis is None:
        return FamilyCheck(False, "per-step fourth moments were not recorded", ratio, r_min,
                           level=level)
    n_vals = mom.n_out * mom.steps
    tol = float(stats.norm.isf(level / 2) * math.sqrt(24.0 / n_vals))
    if not _finite(mom.kurtosis):
        return FamilyCheck(False, f"the kurtosis of the OUT values is not finite "
                                  f"({mom.kurtosis!r})", ratio, r_min, mom.kurtosis, tol,
                           level=level)
    if abs(mom.kurtosis - 3.0) > tol:
        return FamilyCheck(False, f"the per-step noise is not Gaussian: kurtosis "
                                  f"{mom.kurtosis:.4g} outside 3 +- {tol:.3g}", ratio, r_min,
                           mom.kurtosis, tol, level=level)
    parts: dict[str, Any] = {"dispersion": ratio, "dispersion_min": r_min,
                             "kurtosis": mom.kurtosis, "kurtosis_tolerance": tol,
                             "level": level, "log_threshold": math.log(1.0 / level)}
    if x is None or x.shape[0] < 2:
        return FamilyCheck(False, "the OUT canaries' per-step values were not recorded: the "
                                  "whole-null shape and lag tests cannot run", **parts)
    scale = math.sqrt(float(np.mean(x * x)))
    if not (scale > 0 and math.isfinite(scale)):
        return FamilyCheck(False, f"the OUT canaries' per-step values have RMS {scale!r}: "
                                  f"the whole-null tests cannot run", **parts)
    null, lags = whole_null_tests(x / scale, level)
    parts.update(whole_null_log_wealth=null.max_log_wealth, whole_null_worst=null.worst_family(),
                 lag_log_wealth=lags.max_log_wealth, lag_worst=lags.worst_lag(),
                 value_steps=int(x.shape[0]))
    if not _finite(null.max_log_wealth, lags.max_log_wealth):
        return FamilyCheck(False, "a whole-null test's log-wealth is not finite", **parts)
    if null.rejected:
        return FamilyCheck(False, f"the per-step noise is not iid Gaussian: the whole-null "
                                  f"test rejects (log-wealth {null.max_log_wealth:.3g} >= "
                                  f"{parts['log_threshold']:.3g}, worst cells "
                                  f"'{null.worst_family()}')", **parts)
    if lags.rejected:
        return FamilyCheck(False, f"the steps' noise is not independent: the sign test rejects "
                                  f"(log-wealth {lags.max_log_wealth:.3g} >= "
                                  f"{parts['log_threshold']:.3g}, worst lag "
                                  f"{lags.worst_lag()})", **parts)
    return FamilyCheck(True, "independent steps and Gaussian shape not rejected (variance "
                             "ratio, kurtosis, whole-null cells, lag signs)", **parts)


# ------------------------------------------------------------------------------------------------
# the exact law of L: _whitebox_law.ReleaseLaw (re-exported here)
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _law(n_in: int, n_out: int, steps: int, q: float) -> ReleaseLaw:
    return ReleaseLaw(n_in, n_out, steps, q)


def rho_lower_bound(mom: ReleaseMoments, q: float, alpha: float = WHITEBOX_ALPHA) -> float:
    """Lower confidence bound on rho = c / sigma at level alpha from the moments."""
    return _law(mom.n_in, mom.n_out, mom.steps, float(q)).rho_lower_bound(
        mom.statistic, check_alpha(alpha))


# ------------------------------------------------------------------------------------------------
# epsilon of the family
# ------------------------------------------------------------------------------------------------
#: RDP orders of the PRV domain's tail bound: integer orders only (exact and fast); a tail bound
#: from fewer orders is larger, so the domain is wider, never narrower, than Opacus's own
@dataclass(frozen=True)
class WhiteboxResult:
    """The white-box bound and how it was reached (``to_dict`` is the report's detail)."""

    bound: float | None
    method: str
    alpha: float
    delta: float
    m: int
    n_in: int
    n_out: int
    steps: int
    q: float
    statistic: float
    rho_lower: float
    sigma_upper: float | None
    sigma_hat: float | None
    ceiling: float
    family_verified: bool
    family_check: dict[str, Any]
    family: str = WHITEBOX_FAMILY_NOTE
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.update(self.extra)
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None if k != "bound" else v
        return d


def whitebox_bound(mom: ReleaseMoments, q: float, delta: float, alpha: float = WHITEBOX_ALPHA,
                   check: bool = True, out_values: np.ndarray | None = None,
                   schedule: Any = None) -> WhiteboxResult:
    """The white-box bound: eps_lower of DP-SGD at noise multiplier 1 / rho_lb (docs/design.md
    section 13).  Under a ``schedule`` (a non-constant
    :class:`~dpaudit_torch.stats._whitebox_schedule.NoiseSchedule`; ``mom`` of the weighted sums
    and standardised values, its ``weight_sum`` set) the law and the epsilon are the
    schedule's.  With ``check`` the family check runs first, at the bound's own ``alpha``, on
    the moments and the OUT canaries' per-step values ``out_values`` [steps, n0]; a failed
    check gives ``bound=None`` with its reason.

    The bound is a lower bound on epsilon for releases in the Gaussian DP-SGD family
    (:data:`WHITEBOX_FAMILY_NOTE`), the claim's own model: above the claim it refutes the claim
    as stated (its model or its parameters), not the true epsilon of an arbitrary mechanism."""
    alpha = check_alpha(alpha)
    delta = check_delta(delta)
    if delta <= 0:
        raise ValueError(f"the white-box bound needs delta > 0, got {delta!r}")
    if not (0.0 < q <= 1.0):
        raise ValueError(f"inclusion rate q must be in (0, 1], got {q!r}")
    fc = (family_check(mom, alpha, q=q, out_values=out_values) if check
          else FamilyCheck(True, "not checked (check=False)"))
    sched = None if schedule is None or schedule.constant else schedule
    if sched is None:
        ceiling = dpsgd_epsilon(smallest_sigma(float(q), mom.steps, float(delta)), q,
                                mom.steps, delta, "lower")
        rho = rho_lower_bound(mom, q, alpha)
    else:
        from ._whitebox_schedule import scheduled_terms

        if sched.steps != mom.steps or mom.weight_sum is None or not math.isclose(
                mom.weight_sum, sched.weight_sum, rel_tol=1e-9):
            raise ValueError(f"the schedule ({sched.steps} steps, weight sum "
                             f"{sched.weight_sum:.6g}) does not fit the moments ({mom.steps} "
                             f"steps, weight sum {mom.weight_sum!r})")
        ceiling, rho, eps_of = scheduled_terms(mom.n_in, mom.n_out, mom.statistic, float(q),
                                               delta, alpha, sched)
    sigma_up = (1.0 / rho) if rho > 0 else None
    if mom.step_var is not None and mom.step_var >= 0:
        sigma_hat = math.sqrt(mom.step_var)
    else:
        sigma_hat = math.sqrt(mom.s2 / mom.signal_steps) if mom.steps else None
    note = ""
    if not fc.passed:
        bound: float | None = None
        note = f"no white-box bound: {fc.reason}"
    elif rho <= 0:
        bound = 0.0
    elif sched is not None:
        bound = eps_of(rho)
    else:
        bound = dpsgd_epsilon(1.0 / rho if math.isfinite(rho) else 0.0, q, mom.steps, delta,
                              "lower")
    return WhiteboxResult(
        bound=bound, method="whitebox", alpha=alpha, delta=delta, m=mom.n_in + mom.n_out,
        n_in=mom.n_in, n_out=mom.n_out, steps=mom.steps, q=float(q), statistic=mom.statistic,
        rho_lower=rho, sigma_upper=sigma_up, sigma_hat=sigma_hat, ceiling=ceiling,
        family_verified=fc.passed, family_check=asdict(fc), note=note,
        extra={} if sched is None else {"schedule": sched.to_dict()})


def whitebox_power(sigma: float, q: float, steps: int, m: int, *, delta: float,
                   alpha: float = WHITEBOX_ALPHA, claimed_epsilon: float | None = None,
                   target_power: float = 0.8, n_in: int | None = None,
                   epsilon_of_sigma: Callable[[float], float] | None = None
                   ) -> dict[str, Any]:
    """What the white-box bound finds with these settings, in the report's ``power`` format.

    No simulation is needed: rho_lb is an increasing function of L, so the quantiles of the
    bound are the bound at the quantiles of L under rho = 1 / sigma (exact law), and the
    smallest refutable epsilon is that of the rho at which L exceeds the critical value of the
    claim with probability ``target_power``.
    """
    out: dict[str, Any] = {
        "method": "whitebox", "score": "sum", "mode": "law", "replicates": None,
        "sigma": sigma, "q": q, "steps": int(steps), "m": int(m), "c": 1.0,
        "mean_inclusions": q * steps, "alpha": alpha, "delta": delta,
        "claimed_epsilon": claimed_epsilon, "target_power": target_power, "no_power": False,
        "note": "", "warnings": []}
    n1 = int(n_in) if n_in is not None else m // 2
    n0 = m - n1
    if steps < 1 or n1 < 1 or n0 < 2 or not (sigma > 0) or not (q > 0):
        out.update({"expected_bound": None, "expected_bound_quantiles": None,
                    "min_refutable_epsilon": None, "min_refutable_sigma": None,
                    "no_power": True,
                    "note": "no power: no step, too few canaries or no noise"})
        return out
    few = few_inclusions_warning(q, steps)
    if few:
        out["warnings"].append(few)
    law = _law(n1, n0, int(steps), float(q))
    rho = 1.0 / sigma

    def bound_at(stat: float) -> float:
        r = law.rho_lower_bound(stat, alpha)
        if r <= 0:
            return 0.0
        return dpsgd_epsilon(1.0 / r if math.isfinite(r) else 0.0, q, steps, delta, "lower")

    qs = [law.quantile(p, rho) for p in (0.1, 0.5, 0.9)]
    out["expected_bound"] = bound_at(qs[1])
    out["expected_bound_quantiles"] = [bound_at(qs[0]), bound_at(qs[2])]
    s_min = smallest_sigma(float(q), int(steps), float(delta))
    out["ceiling"] = dpsgd_epsilon(s_min, q, steps, delta, "lower")
    out["min_refutable_epsilon"] = out["min_refutable_sigma"] = None
    if claimed_epsilon is not None and math.isfinite(claimed_epsilon) and claimed_epsilon > 0:
        if out["ceiling"] <= claimed_epsilon:
            out["note"] = (f"the white-box ceiling {out['ceiling']:.4g} (a noise-free release) is "
                           f"not above the claim {claimed_epsilon:.4g}")
            return out
        # rho_c: the smallest rho whose bound exceeds the claim
        def excess(log_s: float) -> float:
            return dpsgd_epsilon(math.exp(log_s), q, steps, delta, "lower") - claimed_epsilon

        a, b = math.log(s_min), math.log(max(2.0 * sigma, 1.0))
        while excess(b) > 0:
            b += math.log(4.0)
        sig_c = (math.exp(optimize.brentq(excess, a, b, xtol=2e-3)) if excess(a) > 0
                 else s_min)
        rho_c = 1.0 / sig_c
        # critical value of L at rho_c, then the rho that exceeds it with target_power
        stat_c = law.quantile(1.0 - alpha, rho_c, conservative=True)
        lo, hi = rho_c, 2.0 * rho_c
        while law.tail(stat_c, hi, conservative=False) < target_power:
            hi *= 2.0
        rho_star = float(optimize.brentq(
            lambda r: law.tail(stat_c, r, conservative=False) - target_power, lo, hi,
            xtol=1e-10))
        sig_star = 1.0 / rho_star
        out["min_refutable_sigma"] = sig_star
        try:
            if epsilon_of_sigma is None:
                out["note"] = ("no epsilon_of_sigma given: the refutable epsilon is the PRV "
                               "accountant's estimate")
                mre = dpsgd_epsilon(sig_star, q, steps, delta, "estimate")
            else:
                mre = epsilon_of_sigma(sig_star)
            out["min_refutable_epsilon"] = float(mre)
        except Exception as e:  # noqa: BLE001 - an accountant's failure leaves it None
            out["note"] = f"the accountant failed at sigma {sig_star:.4g}: {e!r}"
    return out


# ------------------------------------------------------------------------------------------------
# simulation of the white-box release (tests, benchmarks, power checks): in _whitebox_sim.py,
# importable from here as before
# ------------------------------------------------------------------------------------------------
_SIMULATION = ("simulate_release", "simulate_sums", "flat_laplace_shape", "NOISES",
               "_flat_laplace", "_flat_laplace_draw")


def __getattr__(name: str) -> Any:
    if name in _SIMULATION:
        from . import _whitebox_sim

        return getattr(_whitebox_sim, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
