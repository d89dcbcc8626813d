"""Tests of the noise checks: variance, independence across steps, low-precision grids
(docs/design.md section 11).

Noise samples are in units of C: N(0, sigma^2) under H0. Type-I rates are compared with alpha plus
three binomial standard deviations of the estimate.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy import stats as sps

from dpaudit_torch.stats.noise import (
    NoiseIndependenceTest,
    NoiseVarianceTest,
    low_precision_grid,
)

SIGMA = 1.3


def _tol(alpha: float, runs: int) -> float:
    return alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / runs)


# ---------------------------------------------------------------------- variance: validity
@pytest.mark.parametrize("n,r", [(1, 0.5), (5, 0.5), (5, 0.95), (40, 0.7)])
def test_likelihood_ratio_has_mean_one(n: int, r: float) -> None:
    # E[r^(-n/2) exp(-(1/r - 1) V / 2)] = 1 for V ~ chi2_n (the chi-square MGF)
    def f(v: float) -> float:
        return math.exp(-0.5 * n * math.log(r) - 0.5 * (1 / r - 1) * v) * sps.chi2.pdf(v, n)

    val, _ = integrate.quad(f, 0, np.inf, limit=200)
    assert val == pytest.approx(1.0, rel=1e-7)


def _variance_type1(alpha: float, runs: int, steps: int, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    groups = np.arange(n) % 2
    rej = 0
    for _ in range(runs):
        t = NoiseVarianceTest(n_groups=2, alpha=alpha)
        for xi in rng.normal(0.0, SIGMA, size=(steps, n)):
            t.update(xi, groups, SIGMA)
        rej += t.rejected
    return rej / runs


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_variance_type1_fast(alpha: float) -> None:
    runs = 200
    assert _variance_type1(alpha, runs, 40, 64, seed=10) <= _tol(alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("n", [4, 64, 2048])
def test_variance_type1_slow(n: int) -> None:
    runs, alpha = 1000, 0.2
    assert _variance_type1(alpha, runs, 100, n, seed=11) <= _tol(alpha, runs)


# ---------------------------------------------------------------------- variance: power
@pytest.mark.parametrize("seed", range(5))
def test_too_little_noise_rejected_at_first_step(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = NoiseVarianceTest(n_groups=3)
    t.update(rng.normal(0.0, 0.8 * SIGMA, 2048), rng.integers(0, 3, 2048), SIGMA)
    assert t.rejected_at == 1
    assert t.log_wealth > 15  # measured about 29


def test_group_without_noise() -> None:
    rng = np.random.default_rng(1)
    n = 100_000
    groups = np.repeat([0, 1, 2], [n // 2, n // 4, n - n // 2 - n // 4])
    xi = rng.normal(0.0, SIGMA, n)
    xi[groups == 1] = 0.0  # V = 0: LR = r^(-n/2), huge; must not overflow
    t = NoiseVarianceTest(n_groups=3).update(xi, groups, SIGMA)
    lw = t.group_log_wealth
    assert np.all(np.isfinite(lw)) and lw[1] > 1e3 and lw[0] < 0 and lw[2] < 0
    assert t.worst_group() == 1 and t.rejected
    est = t.variance_ratio_estimate()
    assert est[1].tolist() == [0.0, 0.0, 0.0]


def test_late_onset_found_at_once() -> None:
    rng = np.random.default_rng(2)
    t = NoiseVarianceTest()
    for _ in range(300):
        t.update(rng.normal(0.0, SIGMA, 2048), 0, SIGMA)
    assert not t.rejected
    t.update(rng.normal(0.0, 0.8 * SIGMA, 2048), 0, SIGMA)
    assert t.rejected_at == 301  # the start at step 301 costs only 2 log(301)


def test_small_persistent_shortfall_accumulates() -> None:
    # 5% too little noise (r = 0.9025), 256 samples a step: measured 2-8 steps
    rng = np.random.default_rng(3)
    t = NoiseVarianceTest()
    for _ in range(200):
        t.update(rng.normal(0.0, 0.95 * SIGMA, 256), 0, SIGMA)
        if t.rejected:
            break
    assert t.rejected_at is not None and t.rejected_at <= 40


def test_too_much_noise_is_not_a_violation_but_is_measured() -> None:
    rng = np.random.default_rng(4)
    t = NoiseVarianceTest(n_groups=2)
    for _ in range(50):
        t.update(rng.normal(0.0, 1.5 * SIGMA, 400), np.arange(400) % 2, SIGMA)
    assert not t.rejected and t.log_wealth < 0
    est = t.variance_ratio_estimate()
    assert np.all((est[:, 1] < 2.25) & (2.25 < est[:, 2]))
    lo, hi = t.sigma_interval()  # type: ignore[misc]
    assert lo < 1.5 * SIGMA < hi and hi - lo < 0.05
    assert t.summary()["sigma_interval"] == [lo, hi]


@pytest.mark.parametrize("runs", [pytest.param(300), pytest.param(2000, marks=pytest.mark.slow)])
def test_variance_interval_coverage(runs: int) -> None:
    rng = np.random.default_rng(5)
    alpha, miss = 0.1, 0
    for _ in range(runs):
        t = NoiseVarianceTest()
        for _ in range(3):
            t.update(rng.normal(0.0, SIGMA, 30), 0, SIGMA)
        _, lo, hi = t.variance_ratio_estimate(alpha)[0]
        miss += not (lo <= 1.0 <= hi)
    assert miss / runs <= _tol(alpha, runs)


def test_variance_unseen_groups_and_changing_sigma() -> None:
    t = NoiseVarianceTest(n_groups=4)
    assert t.sigma_interval() is None and t.log_wealth == 0.0
    rng = np.random.default_rng(6)
    t.update(rng.normal(0, 1.0, 500), 0, 1.0)
    t.update(rng.normal(0, 2.0, 500), 0, 2.0)  # a new sigma: V is normalised per step
    est = t.variance_ratio_estimate()
    assert np.isnan(est[1:]).all() and 0.85 < est[0, 0] < 1.15
    assert t.counts.tolist() == [1000, 0, 0, 0]
    json.dumps(t.summary())


def test_variance_state_dict_round_trip() -> None:
    rng = np.random.default_rng(7)
    xs = rng.normal(0, SIGMA, (12, 300))
    g = np.arange(300) % 3
    a = NoiseVarianceTest(n_groups=3)
    for x in xs[:6]:
        a.update(x, g, SIGMA)
    b = NoiseVarianceTest(n_groups=3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for x in xs[6:]:
        a.update(x, g, SIGMA)
        b.update(x, g, SIGMA)
    assert a.summary() == b.summary()
    with pytest.raises(ValueError, match="different configuration"):
        NoiseVarianceTest(n_groups=2).load_state_dict(a.state_dict())


def _crossing_then_recovery(rng: np.random.Generator, t: NoiseVarianceTest,
                            late: int = 60) -> np.ndarray:
    """Group 1 (of groups 0, 1; group 2 never has samples) gets 0.6 x the variance for 3 steps,
    then ``late`` correct steps: its test crosses early and its log-wealth falls back below 0,
    under the unseen group's 0. Returns the group ids."""
    groups = np.repeat([0, 1], [200, 100])
    scale = np.where(groups == 1, math.sqrt(0.6), 1.0)
    for _ in range(3):
        t.update(rng.normal(0.0, SIGMA, 300) * scale, groups, SIGMA)
    assert t.rejected and t.rejected_group == 1
    for _ in range(late):
        t.update(rng.normal(0.0, SIGMA, 300), groups, SIGMA)
    return groups


def test_rejected_group_is_the_one_that_crossed_never_an_unseen_one() -> None:
    """The finding names the group that drove the crossing, recorded then: later the
    crossing group's wealth decays (correct noise) and an unseen group (wealth 1, no estimate)
    would be the argmax of the current log-wealth."""
    t = NoiseVarianceTest(n_groups=3)
    _crossing_then_recovery(np.random.default_rng(21), t)
    lw = t.group_log_wealth
    assert abs(lw[2]) < 1e-12 and lw[:2].max() < -0.1  # the old argmax: the unseen group
    assert t.rejected_group == 1 and t.worst_group() in (0, 1)
    assert t.rejected_at <= 3 and 0.3 < t.rejected_ratio < 0.85  # up to the crossing only
    assert np.isnan(t.variance_ratio_estimate()[2, 0])
    summ = t.summary()
    assert summ["rejected_group"] == 1 and summ["worst_group"] != 2
    assert NoiseVarianceTest(n_groups=3).worst_group() == 0  # nothing seen yet
    assert NoiseVarianceTest(n_groups=3).rejected_group is None


def test_rejected_group_inside_a_block_equals_step_by_step() -> None:
    """A crossing in the middle of a block of steps records the same group and ratio as the
    same steps fed one by one (the block is replayed up to the crossing)."""
    rng = np.random.default_rng(22)
    groups = np.repeat([0, 1, 2], [150, 100, 50])
    xs = rng.normal(0.0, SIGMA, (12, 300))
    xs[4:, groups == 2] *= math.sqrt(0.5)  # group 2 from step 5 on; group 0 slightly low
    xs[:, groups == 0] *= math.sqrt(0.97)
    one = NoiseVarianceTest(n_groups=4)
    for x in xs:
        one.update(x, groups, SIGMA)
    block = NoiseVarianceTest(n_groups=4)
    block.update_steps(xs, groups, SIGMA)
    assert one.rejected_at == block.rejected_at and 5 <= one.rejected_at < 12
    assert one.rejected_group == block.rejected_group == 2
    assert one.rejected_ratio == pytest.approx(block.rejected_ratio, rel=1e-12)


def test_rejected_group_state_round_trip_and_older_states() -> None:
    t = NoiseVarianceTest(n_groups=3)
    _crossing_then_recovery(np.random.default_rng(23), t, late=5)
    sd = json.loads(json.dumps(t.state_dict()))
    back = NoiseVarianceTest(n_groups=3)
    back.load_state_dict(sd)
    assert (back.rejected_group, back.rejected_ratio) == (1, t.rejected_ratio)
    old = NoiseVarianceTest(n_groups=3)  # a state saved before the group was kept
    old.load_state_dict({k: v for k, v in sd.items()
                         if k not in ("rejected_group", "rejected_ratio")})
    assert old.rejected and old.rejected_group is None and old.worst_group() in (0, 1)


def test_variance_group_ids_may_change_in_place() -> None:
    # the validated ids are cached while equal; a caller mutating its array must still be seen
    rng = np.random.default_rng(12)
    xs = rng.normal(0, SIGMA, (4, 50))
    g = np.zeros(50, dtype=np.int64)
    a, b = NoiseVarianceTest(n_groups=3), NoiseVarianceTest(n_groups=3)
    expected = np.zeros(3, dtype=np.int64)
    for i, x in enumerate(xs):
        g[: 10 * i] = i % 3
        a.update(x, g, SIGMA)
        b.update(x, g.copy(), SIGMA)
        expected += np.bincount(g, minlength=3)
    assert a.summary() == b.summary()
    assert a.counts.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="group ids"):
        g[0] = 7
        a.update(xs[0], g, SIGMA)


def test_variance_bad_inputs() -> None:
    t = NoiseVarianceTest(n_groups=2)
    x = np.ones(4)
    with pytest.raises(ValueError, match="sigma"):
        t.update(x, 0, 0.0)
    with pytest.raises(ValueError, match="sigma"):
        t.update(x, 0, float("inf"))
    with pytest.raises(ValueError, match=r"group ids must lie in \[0, 2\), got \[2\]"):
        t.update(x, np.array([0, 1, 2, 0]), 1.0)
    with pytest.raises(ValueError, match="3 entries"):
        t.update(x, np.array([0, 1, 0]), 1.0)
    with pytest.raises(TypeError, match="integer"):
        t.update(x, np.array([0.0, 1, 0, 1]), 1.0)
    with pytest.raises(ValueError, match="non-finite"):
        t.update(np.array([1.0, np.nan]), 0, 1.0)
    with pytest.raises(ValueError, match="one-dimensional"):
        t.update(np.ones((2, 2)), 0, 1.0)
    with pytest.raises(ValueError, match="ratios"):
        NoiseVarianceTest(ratios=(0.5, 1.0))
    with pytest.raises(ValueError, match="n_groups"):
        NoiseVarianceTest(n_groups=0)
    assert t.n_steps == 0


# ---------------------------------------------------------------------- independence
def _independence_type1(alpha: float, runs: int, steps: int, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    rej = 0
    for _ in range(runs):
        t = NoiseIndependenceTest(alpha=alpha)
        for xi in rng.normal(0.0, SIGMA, size=(steps, n)):
            t.update(xi)
        rej += t.rejected
    return rej / runs


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_independence_type1_fast(alpha: float) -> None:
    runs = 200
    assert _independence_type1(alpha, runs, 40, 64, seed=20) <= _tol(alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 64, 2048])
def test_independence_type1_slow(n: int) -> None:
    runs, alpha = 1000, 0.2
    assert _independence_type1(alpha, runs, 100, n, seed=21) <= _tol(alpha, runs)


def test_noise_reused_every_second_step() -> None:
    rng = np.random.default_rng(8)
    t = NoiseIndependenceTest()
    x = rng.normal(0, SIGMA, 2048)
    for s in range(1, 26):
        if s % 2 == 1:
            x = rng.normal(0, SIGMA, 2048)
        t.update(x)  # even steps repeat the previous step's noise
    assert t.rejected_at is not None and t.rejected_at <= 25  # measured: 2
    assert t.worst_lag() == 1 and t.mean_sign[0] > 0.4


def test_generator_reseeded_every_10_steps() -> None:
    hist: list[np.ndarray] = []
    t = NoiseIndependenceTest()
    for s in range(25):
        x = np.random.default_rng(100 + s % 10).normal(0, SIGMA, 2048)
        hist.append(x)
        t.update(x)
    assert t.rejected_at is not None and t.rejected_at <= 11  # the first repeat, step 11
    assert t.worst_lag() == 10


def test_weak_dependence_and_late_reuse() -> None:
    rng = np.random.default_rng(9)
    t = NoiseIndependenceTest()
    x = rng.normal(0, 1, 2048)
    for _ in range(100):  # AR(1) with rho = 0.1: mean sign 0.064 at lag 1
        x = 0.1 * x + math.sqrt(0.99) * rng.normal(0, 1, 2048)
        t.update(x)
    assert t.rejected and t.worst_lag() == 1
    late = NoiseIndependenceTest()
    for _ in range(300):
        late.update(rng.normal(0, 1, 2048))
    assert not late.rejected
    y = rng.normal(0, 1, 2048)
    late.update(y)
    late.update(y)
    assert late.rejected_at == 302


def test_zeros_give_no_evidence() -> None:
    t = NoiseIndependenceTest()
    for _ in range(30):
        t.update(np.zeros(100))
    assert not t.rejected and t.log_wealth == pytest.approx(0.0, abs=1e-9)
    assert np.isnan(t.mean_sign).all()
    # partly zero: only the non-zero products count
    u = NoiseIndependenceTest(lags=(1,))
    x = np.r_[np.zeros(50), np.ones(50)]
    u.update(x)
    u.update(x)
    assert u.mean_sign[0] == 1.0 and u._plus[0] == 50 and u._minus[0] == 0


def test_independence_counts_match_brute_force() -> None:
    rng = np.random.default_rng(10)
    xs = rng.normal(0, 1, (20, 37))
    xs[3, :5] = 0.0
    lags = (1, 2, 5)
    t = NoiseIndependenceTest(lags=lags)
    for x in xs:
        t.update(x)
    for i, k in enumerate(lags):
        s = np.sign(xs[k:] * xs[:-k])
        assert t._plus[i] == int((s > 0).sum()) and t._minus[i] == int((s < 0).sum())


def test_independence_state_dict_round_trip() -> None:
    rng = np.random.default_rng(11)
    xs = rng.normal(0, SIGMA, (30, 100))
    a = NoiseIndependenceTest()
    for x in xs[:20]:
        a.update(x)
    sd = a.state_dict()
    assert sd["neg"].dtype == np.bool_
    # what a checkpoint gives back after numpy arrays became tensors (torch.load weights_only)
    as_tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                  for k, v in sd.items()}
    b = NoiseIndependenceTest()
    b.load_state_dict(as_tensors)
    for x in xs[20:]:
        a.update(x)
        b.update(x)
    assert a.summary() == b.summary()
    json.dumps(a.summary())
    with pytest.raises(ValueError, match="different configuration"):
        NoiseIndependenceTest(lags=(1, 2)).load_state_dict(sd)


def test_independence_bad_inputs() -> None:
    t = NoiseIndependenceTest()
    with pytest.raises(ValueError, match="at least one"):
        t.update(np.array([]))
    t.update(np.ones(5))
    with pytest.raises(ValueError, match="earlier steps had 5"):
        t.update(np.ones(6))
    with pytest.raises(ValueError, match="non-finite"):
        t.update(np.array([1.0, np.inf, 0, 0, 0]))
    with pytest.raises(ValueError, match="lags"):
        NoiseIndependenceTest(lags=(1, 1))
    with pytest.raises(ValueError, match="lags"):
        NoiseIndependenceTest(lags=(0,))
    with pytest.raises(ValueError, match="stakes"):
        NoiseIndependenceTest(stakes=(0.5, 1.0))
    assert t.n_steps == 1


# ---------------------------------------------------------------------- low precision
def _released(noise: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 release grad + noise and the noise reconstructed from it (float64)."""
    rel = (grad.astype(np.float32) + noise.astype(np.float32)).astype(np.float64)
    return rel - grad.astype(np.float32).astype(np.float64), rel


@pytest.mark.parametrize("fmt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shift", [0.0, 1.0, 10.0])
def test_low_precision_noise_found(fmt: torch.dtype, shift: float) -> None:
    g = torch.Generator().manual_seed(0)
    noise = (torch.randn(3000, generator=g, dtype=torch.float64) * 2.0).to(fmt)
    grad = np.random.default_rng(0).normal(shift, 0.01, 3000)
    xi, rel = _released(noise.to(torch.float32).numpy(), grad)
    out = low_precision_grid(xi, rel)
    name = "bfloat16" if fmt == torch.bfloat16 else "float16"
    assert out["finding"] == name and out[name] == 1.0 and out["n"] == 3000
    assert "Mironov" in out["explanation"]
    if name == "float16":
        assert out["bfloat16"] < 0.2  # 3 extra significand bits: about 1/8 by chance


@pytest.mark.parametrize("shift", [0.0, 1.0, 1000.0])
def test_float32_noise_not_found(shift: float) -> None:
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 2.0, 3000).astype(np.float32)
    xi, rel = _released(noise, rng.normal(shift, 0.01, 3000))
    out = low_precision_grid(xi, rel)
    assert out["finding"] is None
    for name in ("bfloat16", "float16"):
        assert out[name] is None or out[name] < 0.05
    # a large reference: the float32 difference is a multiple of ulp(S), which may be as coarse
    # as the bfloat16 spacing of xi; those values must not count
    big = low_precision_grid(noise.astype(np.float64) * 1e-3, 1e3)
    assert big["finding"] is None and big["n_eligible_bfloat16"] == 0


def test_low_precision_needs_enough_values() -> None:
    noise = torch.randn(100, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    out = low_precision_grid(noise.double().numpy(), 0.0)
    assert out["bfloat16"] == 1.0 and out["finding"] is None
    assert low_precision_grid(np.zeros(500), 0.0)["bfloat16"] is None  # zeros say nothing
    with pytest.raises(ValueError, match="non-finite"):
        low_precision_grid(np.array([np.nan]), 0.0)
    with pytest.raises(ValueError, match="reference"):
        low_precision_grid(np.ones(2), np.array([1.0, np.inf]))


def _leftovers(n: int, scale: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A step without noise: the released float32 value is the real sum (float64, as the
    auditor reads it) rounded to float32, so the reconstructed "noise" is rounding leftovers."""
    real = np.random.default_rng(seed).normal(0.0, scale, n)
    rel = real.astype(np.float32).astype(np.float64)
    return rel - real, rel


def test_no_noise_leftovers_are_not_a_precision_finding() -> None:
    # claimed noise std 1e-3 (raw units), real sums ~1e-5, no noise added at all
    xi, rel = _leftovers(22528, 1e-5, seed=6)
    assert np.abs(xi).max() < 1e-11 and np.count_nonzero(xi) > 20000
    # without the claimed scale, tiny leftovers sit on the float16 grid near 0 (the defect)
    assert low_precision_grid(xi, rel)["finding"] == "float16"
    out = low_precision_grid(xi, rel, noise_std=1e-3)
    assert out["finding"] is None and out["explanation"] is None
    assert out["n_below_std_floor"] == 22528
    assert out["n_eligible_float16"] == out["n_eligible_bfloat16"] == 0


@pytest.mark.parametrize("fmt", [torch.bfloat16, torch.float16])
def test_low_precision_noise_at_the_claimed_scale_still_found(fmt: torch.dtype) -> None:
    std = 1e-3
    g = torch.Generator().manual_seed(7)
    noise = (torch.randn(22528, generator=g, dtype=torch.float64) * std).to(fmt).double().numpy()
    real = np.random.default_rng(7).normal(0.0, 1e-5, 22528)
    rel = (real + noise).astype(np.float32).astype(np.float64)
    out = low_precision_grid(rel - real, rel, noise_std=np.full(22528, std))
    name = "bfloat16" if fmt == torch.bfloat16 else "float16"
    assert out["finding"] == name and out[name] == 1.0
    # P(|Z| < 0.1) = 0.080 for Z ~ N(0, 1): 1,800 of 22,528 expected below the floor, binomial
    # SE 41; 5 SE either side
    assert abs(out["n_below_std_floor"] - 0.0797 * 22528) < 5 * 41
    # float32 noise at the claimed scale: no finding
    f32 = (np.random.default_rng(8).normal(0.0, std, 22528)).astype(np.float32)
    rel = (real + f32).astype(np.float32).astype(np.float64)
    assert low_precision_grid(rel - real, rel, noise_std=std)["finding"] is None


def test_low_precision_noise_std_checked() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="noise_std"):
            low_precision_grid(np.ones(3), 1.0, noise_std=bad)
    with pytest.raises(ValueError, match="min_std_fraction"):
        low_precision_grid(np.ones(3), 1.0, noise_std=1.0, min_std_fraction=-0.5)


# ---------------------------------------------------------------------- blocks of steps
def _blocks(total: int) -> list[slice]:
    """Blocks of 1, 3, 7, 20 and the rest: shorter and longer than the largest lag (16)."""
    cuts = [0, 1, 4, 11, 31, total]
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]


def _noise_stream(steps: int, n: int, seed: int) -> np.ndarray:
    """Fresh noise with a re-used stretch, a re-seeded pair of steps and exact zeros."""
    rng = np.random.default_rng(seed)
    xs = rng.normal(0.0, SIGMA, (steps, n))
    xs[20:26] = xs[19]  # re-used noise
    xs[40] = xs[30]
    xs[5, :7] = 0.0
    xs[33, 3:9] = 0.0
    xs[45] *= 0.7  # too little noise on one step
    return xs


def test_variance_blocks_equal_steps() -> None:
    xs = _noise_stream(50, 300, 3)
    groups = np.arange(300) % 3
    step, block = NoiseVarianceTest(n_groups=3), NoiseVarianceTest(n_groups=3)
    traj = []
    for x in xs:
        step.update(x, groups, SIGMA)
        traj.append(step.log_wealth)
    got = np.concatenate([block.update_steps(xs[b], groups, SIGMA) for b in _blocks(50)])
    np.testing.assert_allclose(got, traj, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(block.group_log_wealth, step.group_log_wealth, rtol=1e-12)
    assert block.rejected_at == step.rejected_at and block.n_steps == step.n_steps == 50
    np.testing.assert_array_equal(block.counts, step.counts)
    np.testing.assert_allclose(block.variance_ratio_estimate(), step.variance_ratio_estimate())


def test_independence_blocks_equal_steps() -> None:
    xs = _noise_stream(50, 300, 4)
    step, block = NoiseIndependenceTest(), NoiseIndependenceTest()
    traj = []
    for x in xs:
        step.update(x)
        traj.append(step.log_wealth)
    got = np.concatenate([block.update_steps(xs[b]) for b in _blocks(50)])
    np.testing.assert_allclose(got, traj, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(block.lag_log_wealth, step.lag_log_wealth, rtol=1e-12)
    np.testing.assert_array_equal(block.mean_sign, step.mean_sign)
    assert block.rejected_at == step.rejected_at is not None
    # the ring of the last max(lag) steps is the same: the next step gives the same evidence
    nxt = np.random.default_rng(5).normal(0.0, SIGMA, 300)
    assert block.update(nxt).log_wealth == pytest.approx(step.update(nxt).log_wealth, abs=1e-12)


def test_blocks_refuse_bad_shapes() -> None:
    with pytest.raises(ValueError, match="steps, samples"):
        NoiseVarianceTest().update_steps(np.zeros(4), 0, 1.0)
    with pytest.raises(ValueError, match="non-finite"):
        NoiseIndependenceTest().update_steps(np.full((2, 3), np.nan))
    t = NoiseIndependenceTest()
    t.update_steps(np.ones((2, 3)))
    with pytest.raises(ValueError, match="earlier steps had 3"):
        t.update_steps(np.ones((2, 4)))


def test_group_sums_equal_samples() -> None:
    """update_group_sums (a caller's per-group sums of xi^2) gives the wealth of update_steps on
    the samples; and the noise monitor's one-pass per-tensor / per-group sums give both tests
    the trajectories of update_steps."""
    from dpaudit_torch.audit.monitors.noise import _TensorSums

    rng = np.random.default_rng(4)
    tensor_of = np.repeat(np.arange(5), [7, 40, 3, 90, 11])
    group_of = np.array([0, 0, 1, 1, 0])[tensor_of]
    sums = _TensorSums(tensor_of, group_of, 6, 2)  # tensor 5 holds no coordinate
    assert sums.usable
    a_t, b_t = NoiseVarianceTest(6), NoiseVarianceTest(6)
    a_g, b_g = NoiseVarianceTest(2), NoiseVarianceTest(2)
    for scale in (1.0, 1.0, 0.7):
        xs = rng.normal(scale=scale, size=(5, tensor_of.size))
        (ts, tc), (gs, gc) = sums(xs)
        np.testing.assert_allclose(a_t.update_steps(xs, tensor_of, 1.3),
                                   b_t.update_group_sums(ts, tc, 1.3), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a_g.update_steps(xs, group_of, 1.3),
                                   b_g.update_group_sums(gs, gc, 1.3), rtol=1e-12, atol=1e-12)
    assert b_t.rejected == a_t.rejected and b_g.rejected == a_g.rejected
    assert not _TensorSums(tensor_of[::-1].copy(), group_of, 6, 2).usable  # not tensor-major
    with pytest.raises(ValueError, match="sigma"):
        b_t.update_group_sums(ts, tc, 0.0)
    with pytest.raises(ValueError, match="sums must be"):
        b_t.update_group_sums(gs, gc, 1.0)
