"""The white-box bound under a noise schedule (dpaudit_torch.stats._whitebox_schedule;
docs/design.md section 13, "Schedules").

Randomised checks use fixed seeds; their tolerances are binomial standard errors of the
simulated frequencies (3 SE, or 4 SE for Monte Carlo tails).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit_torch.stats import _whitebox_schedule as ws
from dpaudit_torch.stats import whitebox as wb
from dpaudit_torch.testing.pld import gaussian_mechanism_epsilon

Q, T = 0.1, 60
#: StepNoise-like: three levels of 20 steps
STEPS3 = [1.0] * 20 + [1.5] * 20 + [2.0] * 20


def test_a_constant_schedule_is_the_constant_case() -> None:
    """Same tails, bound and epsilon as the constant law (within the law's +inf cell, at most
    1e-15, and float rounding)."""
    sched = ws.NoiseSchedule.from_steps([1.5] * T)
    assert sched.constant and sched.weight_sum == T and sched.steps == T
    law0, law1 = wb.ReleaseLaw(290, 310, T, Q), ws.ScheduledReleaseLaw(290, 310, sched, Q)
    for stat in (-1.0, 0.5, 2.0, 5.0):
        for rho in (0.0, 0.7, 1.5):
            assert law1.tail(stat, rho) == pytest.approx(law0.tail(stat, rho), abs=1e-14)
    assert law1.rho_lower_bound(5.0, 1e-3) == pytest.approx(law0.rho_lower_bound(5.0, 1e-3),
                                                            rel=1e-9)
    assert ws.scheduled_epsilon(sched, 1 / 1.5, Q, 1e-5) == pytest.approx(
        wb.dpsgd_epsilon(1.5, Q, T, 1e-5), rel=1e-12)
    # the bound through the public function: a constant schedule changes nothing
    rng = np.random.default_rng(0)
    lab, sums, sq, q4, v = wb.simulate_release(1.5, Q, T, 400, rng, keep_values=True)
    mom = wb.release_moments(sums, lab, T, sq, q4)
    a = wb.whitebox_bound(mom, Q, 1e-5, out_values=v[:, ~lab])
    b = wb.whitebox_bound(mom, Q, 1e-5, out_values=v[:, ~lab], schedule=sched)
    assert a.to_dict() == b.to_dict()


def test_the_weighted_count_law_is_exact_for_multiples() -> None:
    """Weights 1 and 4 (a multiplier halved): the lattice law is the convolution of the two
    scaled binomials, computed here by brute force."""
    n1, q = 7, 0.3
    vals, pmf, inf_mass = ws.weighted_count_law(n1, q, np.array([1.0, 4.0]), np.array([3, 2]))
    exact: dict[float, float] = {}
    for a in range(n1 * 3 + 1):
        for b in range(n1 * 2 + 1):
            p = stats.binom.pmf(a, n1 * 3, q) * stats.binom.pmf(b, n1 * 2, q)
            exact[a + 4.0 * b] = exact.get(a + 4.0 * b, 0.0) + p
    got: dict[float, float] = {}
    for x, p in zip(vals, pmf):
        if p > 0:
            got[round(float(x), 9)] = got.get(round(float(x), 9), 0.0) + float(p)
    for x, p in exact.items():
        if p > 1e-14:
            assert got.get(x, 0.0) == pytest.approx(p, rel=1e-9, abs=1e-15)
    assert inf_mass <= 1e-14


def test_the_law_matches_monte_carlo_and_is_conservative() -> None:
    """Three noise levels: the computed tail of L agrees with 200,000 draws from its definition
    (within 4 SE) and the conservative tail is never below the accurate one."""
    sched = ws.NoiseSchedule.from_steps(STEPS3)
    n1, n0 = 290, 310
    law = ws.ScheduledReleaseLaw(n1, n0, sched, Q)
    rng = np.random.default_rng(1)
    n = 200_000
    k = sum(w * rng.binomial(n1 * c, Q, size=n) for w, c in zip(sched.weights(), sched.counts))
    v = sched.weight_sum
    for rho in (0.0, 1.0, 2.0):
        z, w = rng.standard_normal(n), rng.chisquare(n0 - 1, size=n)
        draws = (rho * k / n1 + math.sqrt(v * (1 / n1 + 1 / n0)) * z) / np.sqrt(v * w / (n0 - 1))
        for p in (0.5, 0.1, 0.01):
            stat = float(np.quantile(draws, 1 - p))
            se = math.sqrt(p * (1 - p) / n)
            acc = law.tail(stat, rho, conservative=False)
            assert abs(acc - p) < 4 * se + 1e-4
            assert acc - 1e-12 <= law.tail(stat, rho) <= acc * 1.10 + 1e-4


def test_the_epsilon_map_is_the_heterogeneous_composition() -> None:
    """At q = 1 a schedule of Gaussian steps is the Gaussian mechanism with
    mu^2 = sum_t 1 / sigma_t^2 (Dong, Roth & Su 2022): the PRV composition agrees (0.02)."""
    sched = ws.NoiseSchedule.from_steps([4.0] * 10 + [6.0] * 10 + [8.0] * 10)
    mu = math.sqrt(sum(1 / s ** 2 for s in [4.0] * 10 + [6.0] * 10 + [8.0] * 10))
    want = gaussian_mechanism_epsilon(mu, 1e-5)
    got = ws.scheduled_epsilon(sched, 1 / 4.0, 1.0, 1e-5, "estimate")
    assert got == pytest.approx(want, abs=0.02)
    assert ws.scheduled_epsilon(sched, 1 / 4.0, 1.0, 1e-5) <= want + 1e-9  # the lower end
    # less noise (a larger rho) is less private
    assert ws.scheduled_epsilon(sched, 1 / 3.0, 1.0, 1e-5) > got


def test_coverage_at_the_claim_under_a_schedule() -> None:
    """Correct releases under a decreasing schedule, exactly at their claim (rho = 1 /
    sigma_0): rho_lb exceeds the true rho, so the bound exceeds the true epsilon, at most alpha
    of the time. 1000 exact weighted sums (300 IN, 300 OUT) at alpha = 0.1; rho_lb > rho iff
    P_rho(L >= l) < alpha (the tail is monotone), and on one release the whole bound is
    compared with the claim's own composition (the PRV accountant's upper end)."""
    sigmas = [1.0] * 30 + [0.8] * 20 + [0.6] * 10
    sched = ws.NoiseSchedule.from_steps(sigmas)
    rng = np.random.default_rng(5)
    alpha, runs, n = 0.1, 1000, 300
    law = ws.ScheduledReleaseLaw(n, n, sched, Q)
    lab = np.arange(2 * n) < n
    k = sum(w * rng.binomial(c, Q, size=(runs, 2 * n))
            for w, c in zip(sched.weights(), sched.counts)) * lab
    sums = k + rng.standard_normal((runs, 2 * n)) * math.sqrt(sched.weight_sum)
    over = 0
    for i in range(runs):
        mom = wb.release_moments(sums[i], lab, len(sigmas), weight_sum=sched.weight_sum)
        if i == 0:
            res = wb.whitebox_bound(mom, Q, 1e-5, alpha=alpha, check=False, schedule=sched)
            assert res.extra["schedule"]["sigmas"] == [0.6, 0.8, 1.0]
            assert res.rho_lower == pytest.approx(law.rho_lower_bound(mom.statistic, alpha))
            true_eps = ws.scheduled_epsilon(sched, 1.0, Q, 1e-5, "upper")
            assert (res.bound > true_eps) <= (res.rho_lower > 1.0)
        over += law.tail(mom.statistic, 1.0) < alpha
    assert over / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), over


def test_per_step_values_give_the_weighted_moments_and_pass_the_check() -> None:
    """From per-step values (what the monitor keeps): the weighted sums, V, and the family
    check on the standardised values passes a correct scheduled release; its bound is reported
    and below the claim's composition."""
    rng = np.random.default_rng(2)
    sig = np.asarray(STEPS3)
    m = 400
    lab = rng.random(m) < 0.5
    z = (rng.random((T, m)) < Q) * lab[None, :] + rng.standard_normal((T, m)) * sig[:, None]
    mom, sched = wb.schedule_moments(z, sig, lab)
    w = 1.0 / sig ** 2
    assert mom.weight_sum == pytest.approx(w.sum(), rel=1e-12)
    ins = (z.T @ w)[lab].mean() - (z.T @ w)[~lab].mean()
    assert mom.d == pytest.approx(ins, rel=1e-9)
    assert mom.kurtosis == pytest.approx(3.0, abs=0.3)
    res = wb.whitebox_bound(mom, Q, 1e-5, out_values=(z / sig[:, None])[:, ~lab],
                            schedule=sched)
    assert res.family_verified and res.bound is not None, res.note
    assert res.bound <= ws.scheduled_epsilon(sched, 1.0, Q, 1e-5, "upper")


@pytest.mark.slow
def test_less_noise_than_the_schedule_claims_is_refuted() -> None:
    """The noise a quarter of what the schedule claims: the bound is above the claim."""
    rng = np.random.default_rng(4)
    claimed = np.asarray([2.0] * 100 + [3.0] * 100)
    lab, sums, sched = ws.simulate_scheduled_sums(claimed / 4.0, 0.05, 1000, rng)
    claim = ws.scheduled_epsilon(ws.NoiseSchedule.from_steps(claimed), 1 / 2.0, 0.05, 1e-5,
                                 "upper")
    mom = wb.release_moments(sums, lab, 200, weight_sum=sched.weight_sum)
    res = wb.whitebox_bound(mom, 0.05, 1e-5, check=False, schedule=sched)
    assert res.bound > claim


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="0.0"):
        ws.NoiseSchedule.from_steps([1.0, 0.0])
    with pytest.raises(ValueError, match="nan"):
        ws.NoiseSchedule.from_steps([1.0, math.nan])
    with pytest.raises(ValueError, match="at least one step"):
        ws.NoiseSchedule.from_steps([])
    sched = ws.NoiseSchedule.from_steps(STEPS3)
    mom = wb.ReleaseMoments(10, 10, T, 1.0, 1.0)  # no weight sum
    with pytest.raises(ValueError, match="does not fit"):
        wb.whitebox_bound(mom, Q, 1e-5, check=False, schedule=sched)
    with pytest.raises(ValueError, match="must be \\[steps, m\\]"):
        wb.schedule_moments(np.zeros((3, 4)), [1.0, 2.0], np.ones(4, dtype=bool))
