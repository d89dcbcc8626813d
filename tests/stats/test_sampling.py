"""Tests of the Poisson batch-size test and the sampling-rate interval (docs/design.md section 10).

Type-I rates are compared with alpha plus three binomial standard deviations of the estimate;
power checks use the scenarios of the contract (fixed-size batches at the demo's and MNIST-like
sizes, shuffled loaders, wrong rates, a loader that goes wrong late).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from dpaudit_torch.stats.sampling import (
    PoissonBatchTest,
    binomial_capped_chi2_mean,
    fresh_start_log_mass,
    fresh_start_log_wealth,
    rate_interval,
)

# (N, q): the demo (1437 records, q = 1 / len(loader) with 23 batches), a large q, MNIST-like
# sizes (60000 records, batch 256 -> 235 batches) and a small dataset
NULL_CASES = [(1437, 1 / 23), (1437, 0.3), (60000, 1 / 235), (60000, 0.01), (20, 0.05)]


def _tol(alpha: float, runs: int) -> float:
    return alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / runs)


def _type1(n_records: int, rate: float, alpha: float, runs: int, steps: int,
           seed: int) -> float:
    rng = np.random.default_rng(seed)
    rej = 0
    for _ in range(runs):
        t = PoissonBatchTest(n_records, rate, alpha)
        t.update(rng.binomial(n_records, rate, size=steps))
        rej += t.rejected
    return rej / runs


# ---------------------------------------------------------------------- the null mean m_c
@pytest.mark.parametrize("n_records,rate,cap", [(1, 0.3, 4.0), (20, 0.05, 4.0),
                                                (1437, 0.045, 4.0), (300, 0.5, 2.5),
                                                (60000, 0.004, 9.0)])
def test_null_mean_matches_full_support_sum(n_records: int, rate: float, cap: float) -> None:
    k = np.arange(n_records + 1)
    z = (k - n_records * rate) ** 2 / (n_records * rate * (1 - rate))
    brute = float(np.sum(sps.binom.pmf(k, n_records, rate) * np.minimum(z, cap)))
    assert binomial_capped_chi2_mean(n_records, rate, cap) == pytest.approx(brute, rel=1e-12)


def test_null_mean_large_n_tends_to_capped_chi2() -> None:
    # E[min(chi2_1, c)] = P(chi2_3 < c) + c P(chi2_1 >= c)
    limit = sps.chi2.cdf(4.0, 3) + 4.0 * sps.chi2.sf(4.0, 1)
    for n in (10**6, 10**9, 10**12):
        assert binomial_capped_chi2_mean(n, 0.3, 4.0) == pytest.approx(limit, abs=2e-3)
    t = PoissonBatchTest(10**12, 0.01, 0.05)
    t.update([10**10, 10**10 + 5])
    assert math.isfinite(t.log_wealth)


# ---------------------------------------------------------------------- type I
@pytest.mark.parametrize("n_records,rate", NULL_CASES)
@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_type1_fast(n_records: int, rate: float, alpha: float) -> None:
    runs = 300
    rate_hat = _type1(n_records, rate, alpha, runs, 200, seed=n_records + int(1e4 * rate))
    assert rate_hat <= _tol(alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("n_records,rate", NULL_CASES)
def test_type1_slow(n_records: int, rate: float) -> None:
    runs, alpha = 2000, 0.05
    assert _type1(n_records, rate, alpha, runs, 200, seed=1) <= _tol(alpha, runs)


@pytest.mark.slow
def test_type1_long_runs() -> None:
    runs, alpha = 300, 0.2
    assert _type1(1437, 0.045, alpha, runs, 5000, seed=2) <= _tol(alpha, runs)


# ---------------------------------------------------------------------- power
@pytest.mark.parametrize("n_records,rate", [(1437, 0.045), (60000, 0.004)])
def test_fixed_size_batches_rejected_within_20_steps(n_records: int, rate: float) -> None:
    t = PoissonBatchTest(n_records, rate, 0.05)
    t.update([round(n_records * rate)] * 20)
    assert t.rejected and t.rejected_at is not None and t.rejected_at <= 20
    # about log(1 + 0.9 m_c / (c - m_c)) per step once the ONS stake is at its cap
    per_step = math.log1p(0.9 * t.null_mean / (t.cap - t.null_mean))
    assert 0.2 < per_step < 0.3


def test_shuffled_loader_with_and_without_drop_last() -> None:
    n, b = 1437, 64
    q = b / n
    drop = PoissonBatchTest(n, q, 0.05).update([b] * 40)
    epoch = [b] * (n // b) + [n - (n // b) * b]  # 22 batches of 64, then 29
    keep = PoissonBatchTest(n, q, 0.05).update(epoch * 2)
    assert drop.rejected_at is not None and drop.rejected_at <= 20
    assert keep.rejected_at is not None and keep.rejected_at <= 25


def test_wrong_rate_and_wrong_n_rejected() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        t = PoissonBatchTest(1437, 0.045, 0.05).update(rng.binomial(1437, 0.0675, 100))
        assert t.rejected_at is not None and t.rejected_at <= 10  # measured: 4-5
        t = PoissonBatchTest(60000, 0.004, 0.05).update(rng.binomial(50000, 0.004, 100))
        assert t.rejected_at is not None and t.rejected_at <= 10  # measured: 4-5
    # a 20% rate error (about 1.6 standard deviations of n_t): tens of steps
    t = PoissonBatchTest(1437, 0.045, 0.05).update(rng.binomial(1437, 0.054, 300))
    assert t.rejected


def test_late_onset_is_found_quickly() -> None:
    rng = np.random.default_rng(5)
    t = PoissonBatchTest(1437, 0.045, 0.05)
    t.update(rng.binomial(1437, 0.045, 2000))
    assert not t.rejected
    t.update([65] * 200)
    # the ONS bettors alone would need many hundreds of steps here (their A_t is large); the
    # fresh-start components pay 2 log(2000) and reject within about 80 steps (measured 60-85)
    assert t.rejected_at is not None and t.rejected_at - 2000 <= 150


# ---------------------------------------------------------------------- mechanics
def test_chunked_equals_stepwise() -> None:
    rng = np.random.default_rng(1)
    sizes = np.r_[rng.binomial(1437, 0.045, 60), [65] * 15]
    whole = PoissonBatchTest(1437, 0.045, 0.05).update(sizes)
    step = PoissonBatchTest(1437, 0.045, 0.05)
    for s in sizes:
        step.update(int(s))
    odd = PoissonBatchTest(1437, 0.045, 0.05)
    for chunk in np.array_split(sizes, [1, 8, 9, 40]):
        odd.update(chunk)
    traj = PoissonBatchTest(1437, 0.045, 0.05)
    per_step = [traj.update(int(s)).log_wealth for s in sizes]
    np.testing.assert_allclose(
        PoissonBatchTest(1437, 0.045, 0.05).update_with_trajectory(sizes), per_step,
        rtol=1e-12, atol=1e-12)
    for other in (step, odd):
        assert other.n_steps == whole.n_steps == sizes.size
        assert other.log_wealth == pytest.approx(whole.log_wealth, abs=1e-9)
        assert other.rejected_at == whole.rejected_at
        assert other.total == whole.total == int(sizes.sum())


def test_fresh_start_recursion_and_martingale() -> None:
    # vectorised chunk == the recursion S_t = e_t (S_{t-1} + w_t)
    rng = np.random.default_rng(2)
    log_e = rng.normal(0, 2, size=(30, 3))
    got = fresh_start_log_mass(np.full(3, -np.inf), log_e, 0)
    s = np.zeros(3)
    for t in range(1, 31):
        s = np.exp(log_e[t - 1]) * (s + 1.0 / (t * (t + 1)))
        np.testing.assert_allclose(got[t - 1], np.log(s), rtol=1e-10)
    # exact expectation: e_t in {0.5, 1.5} with probability 1/2 each -> E[W_T] = 1
    T = 8
    total = 0.0
    for seq in itertools.product([0.5, 1.5], repeat=T):
        ls = fresh_start_log_mass(np.array([-np.inf]), np.log(np.array(seq))[:, None], 0)
        total += math.exp(fresh_start_log_wealth(ls[-1], T)[0])
    assert total / 2**T == pytest.approx(1.0, rel=1e-12)


def test_payoff_ranges_keep_factors_positive() -> None:
    t = PoissonBatchTest(1437, 0.045, 0.05)
    # the extreme sizes 0 and N give Y = c: the under-dispersion factor is 1 - 0.9 > 0
    t.update([0, 1437, 0, 1437] * 10)
    assert all(math.isfinite(v) for v in t.component_log_wealth.values())
    assert t.rejected  # wildly over-dispersed


def test_rate_one_is_deterministic() -> None:
    t = PoissonBatchTest(10, 1.0, 0.05).update([10] * 50)
    assert not t.rejected and t.log_wealth == 0.0
    t.update(9)
    assert t.rejected_at == 51


def test_degenerate_cannot_reject_stays_finite() -> None:
    # N = 1, q = 1/2: Z = 1 whatever n is, so every payoff is 0
    t = PoissonBatchTest(1, 0.5, 0.05).update([0, 1] * 50)
    assert t.log_wealth == pytest.approx(0.0, abs=1e-9)
    assert not t.rejected


def test_state_dict_round_trip() -> None:
    rng = np.random.default_rng(3)
    sizes = rng.binomial(60000, 0.004, 80)
    a = PoissonBatchTest(60000, 0.004, 0.05).update(sizes[:50])
    sd = json.loads(json.dumps(a.state_dict()))
    b = PoissonBatchTest(60000, 0.004, 0.05)
    b.load_state_dict(sd)
    assert b.n_steps == 50 and b.total == int(sizes[:50].sum())
    a.update(sizes[50:])
    b.update(sizes[50:])
    assert a.summary() == b.summary()
    with pytest.raises(ValueError, match="different configuration"):
        PoissonBatchTest(60000, 0.005, 0.05).load_state_dict(sd)
    with pytest.raises(ValueError):
        b.load_state_dict({"x": 1})


def test_summary_plain_types() -> None:
    t = PoissonBatchTest(1437, 0.045, 0.05)
    assert t.summary()["rate_interval"] is None
    t.update([60, 70, 64])
    s = json.loads(json.dumps(t.summary()))
    assert s["n_steps"] == 3 and s["mean_batch_size"] == pytest.approx(194 / 3)
    assert s["expected_batch_size"] == pytest.approx(1437 * 0.045)
    lo, hi = s["rate_interval"]
    assert lo < 194 / (3 * 1437) < hi


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"n_records": 0}, ValueError, "n_records"),
    ({"n_records": 2.5}, TypeError, "n_records"),
    ({"rate": 0.0}, ValueError, "rate"),
    ({"rate": 1.5}, ValueError, "rate"),
    ({"rate": float("nan")}, ValueError, "rate"),
    ({"alpha": 1.0}, ValueError, "alpha"),
    ({"cap": 1.0}, ValueError, "cap"),
    ({"cap": float("inf")}, ValueError, "cap"),
])
def test_bad_config(kwargs: dict, exc: type, match: str) -> None:
    args = {"n_records": 100, "rate": 0.1, "alpha": 0.05, **kwargs}
    with pytest.raises(exc, match=match):
        PoissonBatchTest(**args)


@pytest.mark.parametrize("bad,exc,match", [
    (-1, ValueError, r"\[-1.0\]"),
    (2.5, ValueError, r"\[2.5\]"),
    ([3, float("nan")], ValueError, "integers"),
    (101, ValueError, r"101"),
    (True, TypeError, "integers"),
    ("7", TypeError, "integers"),
])
def test_bad_batch_sizes(bad: object, exc: type, match: str) -> None:
    t = PoissonBatchTest(100, 0.1, 0.05)
    with pytest.raises(exc, match=match):
        t.update(bad)  # type: ignore[arg-type]
    assert t.n_steps == 0
    t.update(np.array([10.0, 9.0]))  # integral floats are accepted
    assert t.n_steps == 2


# ---------------------------------------------------------------------- rate interval
def test_rate_interval_exact_coverage() -> None:
    # exact coverage from the Binomial(M, q) pmf, over a grid of q: >= 1 - alpha everywhere
    n_records, steps, alpha = 25, 4, 0.1
    m = n_records * steps
    cis = np.array([rate_interval(x, n_records, steps, alpha) for x in range(m + 1)])
    for q in np.linspace(0.005, 0.995, 199):
        inside = (cis[:, 0] <= q) & (q <= cis[:, 1])
        assert sps.binom.pmf(np.arange(m + 1), m, q)[inside].sum() >= 1 - alpha - 1e-12


@pytest.mark.parametrize("runs", [pytest.param(400), pytest.param(2000, marks=pytest.mark.slow)])
def test_rate_interval_coverage_by_simulation(runs: int) -> None:
    rng = np.random.default_rng(4)
    n, q, steps, alpha = 1437, 0.045, 200, 0.05
    hits = 0
    for _ in range(runs):
        lo, hi = rate_interval(int(rng.binomial(n, q, steps).sum()), n, steps, alpha)
        hits += lo <= q <= hi
    assert 1 - hits / runs <= _tol(alpha, runs)


def test_rate_interval_edges_and_bad_inputs() -> None:
    assert rate_interval(0, 10, 3, 0.05)[0] == 0.0
    assert rate_interval(30, 10, 3, 0.05)[1] == 1.0
    lo, hi = rate_interval(15, 10, 3, 0.05)
    assert lo < 0.5 < hi
    with pytest.raises(ValueError, match="total"):
        rate_interval(31, 10, 3, 0.05)
    with pytest.raises(ValueError, match="total"):
        rate_interval(-1, 10, 3, 0.05)
    with pytest.raises(TypeError, match="total"):
        rate_interval(1.5, 10, 3, 0.05)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        rate_interval(1, 10, 0, 0.05)
    with pytest.raises(ValueError, match="alpha"):
        rate_interval(1, 10, 3, 0.0)
    with pytest.raises(ValueError, match="n_records"):
        rate_interval(0, 0, 3, 0.05)
