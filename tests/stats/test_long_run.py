"""Long runs: log-wealth exact and finite far beyond float64's range of e^x.

The wealth K_t = prod (1 + lambda_t p_t) of a strongly non-DP stream passes e^709.78 (the largest
float64) after a few thousand pairs, so the library keeps log K_t (docs/design.md section 1). These
tests feed streams whose log-wealth exceeds 800 and check, against an independent pure-Python
recomputation (ONS from the formulas, log-wealth as ``math.fsum`` of ``log1p`` terms), that the
log-wealth is finite and exact, and that every piece of state stays bounded.

Underflow: ONS has logarithmic regret against the constant bet lambda = 0 (Shekhar & Ramdas,
IEEE Trans. IT 2023), so log K_t >= -O(log t) on ANY payoff sequence within the bounds; a null
stream can only drift down slowly. The null streams below check that it stays finite and small.
The 10^6-pair runs (time and memory) are in ``benchmarks/long_run.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit_torch.stats.base import SequentialTest
from dpaudit_torch.stats.betting import ONS_C, FixedStake, OnlineNewtonStep, log_mean_exp
from dpaudit_torch.stats.hockey_stick import HockeyStickTest
from dpaudit_torch.stats.mmd import SequentialMMDTest

#: log of the largest float64: exp of anything above overflows
LOG_FLOAT64_MAX = math.log(np.finfo(np.float64).max)  # 709.78


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_ons(payoffs: np.ndarray, lambda_max: np.ndarray) -> tuple[np.ndarray, dict]:
    """docs/design.md section 1 written out per component with Python floats.

    Returns the final log-wealth, each a ``math.fsum`` of the log1p terms (correctly rounded
    sum, so no accumulated rounding), and the final ONS state.
    """
    n, k = payoffs.shape
    out = np.empty(k)
    lams, sums = np.empty(k), np.empty(k)
    for j in range(k):
        lam, a_sum, lmax = 0.0, 1.0, float(lambda_max[j])
        terms = []
        for t in range(n):
            p = float(payoffs[t, j])
            terms.append(math.log1p(lam * p))
            z = -p / (1.0 + lam * p)
            a_sum += z * z
            lam = min(max(lam - ONS_C * z / a_sum, 0.0), lmax)
        out[j] = math.fsum(terms)
        lams[j], sums[j] = lam, a_sum
    return out, {"lam": lams, "a_sum": sums}


class _Recorder:
    """Keeps every payoff a tester bets on (in order), through its ``payoff_observer`` hook."""

    def __init__(self, tester: SequentialTest) -> None:
        self.chunks: list[np.ndarray] = []

        def observe(start: int, p: np.ndarray) -> None:
            self.chunks.append(np.array(p, dtype=np.float64, copy=True))

        tester.payoff_observer = observe

    @property
    def payoffs(self) -> np.ndarray:
        return np.concatenate(self.chunks)


# --------------------------------------------------------------------------------------------
# the bettor alone
# --------------------------------------------------------------------------------------------
def test_ons_log_wealth_beyond_float64_is_exact() -> None:
    """20,000 favourable payoffs: log-wealth ~ thousands, equal to the fsum of log1p terms."""
    rng = np.random.default_rng(0)
    n = 20_000
    # payoffs in [-1, 1] with mean 0.6 (first two components) and a fair coin (third)
    p = np.clip(rng.normal([0.6, 0.6, 0.0], 0.4, size=(n, 3)), -1.0, 1.0)
    lmax = np.array([0.5, 0.25, 0.5])  # 1 + lambda p >= 1/2 > 0 for |p| <= 1
    ons = OnlineNewtonStep(lmax)
    traj = np.concatenate([ons.run(p[i : i + 997]) for i in range(0, n, 997)])  # odd chunks
    ref, state = reference_ons(p, lmax)
    assert np.all(np.isfinite(traj))
    assert ons.log_wealth[0] > 2 * LOG_FLOAT64_MAX and ons.log_wealth[1] > LOG_FLOAT64_MAX
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(ons.log_wealth[:2])).all()  # the product form would overflow
    # float sum of n terms vs correctly rounded sum: |error| <= n * ulp(total) ~ 2e4 * 1e-12
    np.testing.assert_allclose(ons.log_wealth, ref, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(ons.lam, state["lam"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ons.a_sum, state["a_sum"], rtol=1e-10)
    # bounded state: K numbers each, bets within [0, lambda_max], A_t <= 1 + sum z^2 <= 1 + 4 n
    assert ons.lam.shape == ons.a_sum.shape == ons.log_wealth.shape == (3,)
    assert np.all((ons.lam >= 0) & (ons.lam <= lmax))
    assert np.all(ons.a_sum <= 1.0 + 4.0 * n)
    # the fair component (mean 0): log-wealth stays O(log n), far from underflow
    assert abs(ons.log_wealth[2]) < 50.0
    # the average of the three e-processes is computed stably from the logs
    assert log_mean_exp(ons.log_wealth) == pytest.approx(
        max(ref) + math.log(np.exp(ref - max(ref)).mean()), rel=1e-12
    )


def test_ons_adversarial_stream_cannot_underflow() -> None:
    """Payoffs alternating at the bounds after a winning streak: losses stay O(log n)."""
    n = 20_000
    p = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    p[:200] = 1.0  # build up a large bet first
    p = p[:, None]
    ons = OnlineNewtonStep(np.array([0.5]))
    traj = ons.run(p)[:, 0]
    ref, _ = reference_ons(p, np.array([0.5]))
    assert np.all(np.isfinite(traj))
    assert traj[-1] == pytest.approx(ref[0], rel=1e-10, abs=1e-9)
    # the streak won ~200 log(1.5); afterwards the alternation cannot lose more than the regret
    assert traj.min() > -50.0


# --------------------------------------------------------------------------------------------
# the testers
# --------------------------------------------------------------------------------------------
def _far_apart(n: int, seed: int, d: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = 6.0 + torch.randn(n, d, generator=gen, dtype=torch.float64)
    return x, y


def _iid(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen, dtype=torch.float64),
            torch.randn(n, generator=gen, dtype=torch.float64))


def _check_exact(tester: SequentialTest, rec: _Recorder) -> np.ndarray:
    """The tester's component log-wealth equals the independent recomputation (ONS, or the
    fixed stake of the hockey-stick test's default stake mixture)."""
    bets = tester.betting_state()
    if isinstance(tester._bets, FixedStake):
        ref = np.array([math.fsum(np.log1p(rec.payoffs[:, k] * bets["lambda_max"][k]))
                        for k in range(rec.payoffs.shape[1])])
        np.testing.assert_allclose(bets["log_wealth"], ref, rtol=1e-10, atol=1e-9)
        np.testing.assert_array_equal(bets["lam"], bets["lambda_max"])
    else:
        ref, state = reference_ons(rec.payoffs, bets["lambda_max"])
        np.testing.assert_allclose(bets["log_wealth"], ref, rtol=1e-10, atol=1e-9)
        np.testing.assert_allclose(bets["lam"], state["lam"], rtol=1e-10, atol=1e-12)
    assert np.all((bets["lam"] >= 0) & (bets["lam"] <= bets["lambda_max"]))
    grid = tester.log_wealth.numpy()
    assert np.all(np.isfinite(grid))
    assert math.isfinite(tester.combined_log_wealth)
    return ref


def test_mmd_capped_log_wealth_beyond_float64() -> None:
    """14,000 pairs six standard deviations apart: log-wealth > 800, exact, memory at the cap."""
    n = 14_000
    x, y = _far_apart(n, seed=1)
    t = SequentialMMDTest([0.01, 0.5], max_witness_points=64, chunk_size=256)
    rec = _Recorder(t)
    for i in range(0, n, 1000):
        t.update(x[i : i + 1000], y[i : i + 1000])
    ref = _check_exact(t, rec)
    assert ref[0] > 800.0 > LOG_FLOAT64_MAX  # eps = 0.01 gains ~0.077 per pair
    assert float(t.max_log_wealth[0]) == pytest.approx(float(t.log_wealth[0]), rel=1e-12)
    assert t.rejected and t.rejected_at is not None and t.rejected_at < 100
    assert t.epsilon_lower_bound == 0.5
    assert t.n_stored == 64 and t.n_evicted == n - 20 - 64
    assert t.memory_bytes == 64 * (2 * 1 + 3) * 8 + 8
    assert t.exact_witness_norm() <= 1.0 + 1e-12


def test_mmd_uncapped_null_stream_finite() -> None:
    """Uncapped MMD on 3,000 iid pairs: finite, exact, no rejection at eps = 0.5."""
    x, y = _iid(3000, seed=2)
    t = SequentialMMDTest([0.05, 0.5], chunk_size=512)
    rec = _Recorder(t)
    t.update(x, y)
    ref = _check_exact(t, rec)
    assert np.all(ref > -50.0) and not t.rejected


def test_hockey_stick_log_wealth_beyond_float64() -> None:
    """6,000 far-apart pairs: both grid points' log-wealth > 800, exact; state bounded."""
    x, y = _far_apart(6000, seed=3)
    t = HockeyStickTest([0.1, 1.0], delta=1e-6)
    rec = _Recorder(t)
    for i in range(0, 6000, 500):
        t.update(x[i : i + 500, 0], y[i : i + 500, 0])
    ref = _check_exact(t, rec)
    grid = t.log_wealth.numpy()
    assert grid.min() > 800.0
    # the average over the 2 directions: one direction wins, the other sits near 0
    assert ref.max() > 800.0 + math.log(2.0) and t.rejected
    assert t.epsilon_lower_bound == 1.0
    assert t.betting_state()["lam"].shape == (int(t.component_groups.size),)


def test_hockey_stick_null_stream_finite() -> None:
    x, y = _iid(6000, seed=4)
    t = HockeyStickTest([0.1, 1.0])
    rec = _Recorder(t)
    for i in range(0, 6000, 1500):
        t.update(x[i : i + 1500], y[i : i + 1500])
    ref = _check_exact(t, rec)
    assert np.all(ref > -50.0) and not t.rejected
