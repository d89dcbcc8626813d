"""Tests of the Online Newton Step bettor and log-space wealth (docs/design.md section 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit_torch.stats.betting import ONS_C, OnlineNewtonStep, log_mean_exp


def test_ons_constant() -> None:
    # c = 2 / (2 - ln 3) (Shekhar & Ramdas 2023), 2.2188010496002884 to 17 digits
    assert ONS_C == pytest.approx(2.2188010496002884, rel=1e-15)
    assert ONS_C == 2.0 / (2.0 - math.log(3.0))


def test_initial_state() -> None:
    b = OnlineNewtonStep(np.array([0.25, 0.5]))
    assert b.lam.tolist() == [0.0, 0.0]  # lambda_1 = 0
    assert b.a_sum.tolist() == [1.0, 1.0]  # A_0 = 1
    assert b.log_wealth.tolist() == [0.0, 0.0]


def test_three_step_trajectory_by_hand() -> None:
    # lambda_max = 0.5, payoffs 0.2, -0.1, 0.3; 40-digit decimal arithmetic of
    #   z = -p / (1 + lam p), A += z^2, lam = clip(lam - c z / A, 0, 0.5):
    # t=1: lam=0,      lw = 0,                   A = 1.04,      lam -> 0.42669250953851700
    # t=2: lam=0.4267, lw = log(1 - 0.04266925) = -0.043606336950105273, A = 1.0509112870964236,
    #                                                              lam -> 0.20615102295853773
    # t=3: lam=0.2062, lw += log(1 + 0.06184531) -> 0.016401913195449801, A = 1.1307328093117482,
    #                                                              lam -> 0.5 (clipped)
    b = OnlineNewtonStep(np.array([0.5]))
    traj = b.run(np.array([[0.2], [-0.1], [0.3]]))
    np.testing.assert_allclose(
        traj[:, 0], [0.0, -0.043606336950105273, 0.016401913195449801], rtol=1e-14, atol=1e-16
    )
    assert b.a_sum[0] == pytest.approx(1.1307328093117482, rel=1e-14)
    assert b.lam[0] == 0.5
    # the same trajectory one pair at a time
    c = OnlineNewtonStep(np.array([0.5]))
    steps = [c.run(np.array([[p]]))[0, 0] for p in (0.2, -0.1, 0.3)]
    np.testing.assert_array_equal(steps, traj[:, 0])


def test_components_are_independent() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(-0.9, 0.9, size=(50, 3))
    lm = np.array([0.1, 0.5, 1.0])
    joint = OnlineNewtonStep(lm).run(p)
    for k in range(3):
        alone = OnlineNewtonStep(lm[k : k + 1]).run(p[:, k : k + 1])
        np.testing.assert_array_equal(joint[:, k], alone[:, 0])


def test_lower_clip_at_zero() -> None:
    b = OnlineNewtonStep(np.array([0.5]))
    traj = b.run(np.array([[-0.5], [-0.5], [-0.5]]))
    assert b.lam[0] == 0.0
    assert traj[:, 0].tolist() == [0.0, 0.0, 0.0]  # never bets on losing payoffs


def test_violated_bound_raises() -> None:
    b = OnlineNewtonStep(np.array([0.5]))
    # t=1: lam = 0; then lam -> min(c / 2, 0.5) = 0.5; t=2: 1 + 0.5 * (-3) < 0
    with pytest.raises(RuntimeError, match="betting bound violated"):
        b.run(np.array([[1.0], [-3.0]]))
    b = OnlineNewtonStep(np.array([0.5]))
    with pytest.raises(RuntimeError, match="betting bound violated"):
        b.run(np.array([[1.0], [-2.0]]))  # exactly 1 + lam p = 0 is a violation too


def test_bad_arguments() -> None:
    for bad in ([], [0.0], [-1.0], [np.inf], [np.nan]):
        with pytest.raises(ValueError, match="lambda_max"):
            OnlineNewtonStep(np.array(bad))
    b = OnlineNewtonStep(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="shape"):
        b.run(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="shape"):
        b.run(np.zeros(2))


def test_state_dict_round_trip() -> None:
    rng = np.random.default_rng(1)
    p = rng.uniform(-0.5, 0.5, size=(40, 2))
    a = OnlineNewtonStep(np.array([0.3, 0.6]))
    a.run(p[:20])
    b = OnlineNewtonStep(np.array([0.3, 0.6]))
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.run(p[20:]), b.run(p[20:]))
    with pytest.raises(ValueError, match="shape"):
        OnlineNewtonStep(np.array([0.3])).load_state_dict(a.state_dict())


def test_log_wealth_stays_finite_long_run() -> None:
    # 10^5 steps of steady gains: the wealth itself would overflow float64 (> 1e308)
    b = OnlineNewtonStep(np.array([0.5]))
    b.run(np.full((100_000, 1), 0.9))
    assert math.isfinite(b.log_wealth[0]) and b.log_wealth[0] > 710.0


def test_log_mean_exp() -> None:
    a = np.array([0.0, math.log(3.0)])
    assert log_mean_exp(a) == pytest.approx(math.log(2.0), rel=1e-15)
    big = np.array([1000.0, 1000.0, 1000.0 + math.log(4.0)])
    assert log_mean_exp(big) == pytest.approx(1000.0 + math.log(2.0), rel=1e-15)
    small = np.array([-1000.0, -1000.0])
    assert log_mean_exp(small) == pytest.approx(-1000.0, rel=1e-15)
    m = np.array([[0.0, 0.0], [math.log(2.0), math.log(4.0)]])
    np.testing.assert_allclose(log_mean_exp(m, axis=-1), [0.0, math.log(3.0)], rtol=1e-15)
    np.testing.assert_allclose(log_mean_exp(m, axis=0),
                               [math.log(1.5), math.log(2.5)], rtol=1e-15)
    # one -inf component (a wealth that hit 0) does not poison the average
    assert log_mean_exp(np.array([-np.inf, 0.0])) == pytest.approx(math.log(0.5))


def test_fixed_stake_wealth_and_bound() -> None:
    """FixedStake (the hockey-stick test's default bettor): log-wealth is the running sum of
    log(1 + lambda p); a factor <= 0 raises and leaves the state unchanged."""
    from dpaudit_torch.stats.betting import FixedStake

    b = FixedStake(np.array([0.5, 0.25]))
    p = np.array([[1.0, -1.0], [-1.5, 2.0], [0.2, 0.0]])
    out = b.run(p)
    np.testing.assert_allclose(out, np.cumsum(np.log1p(p * [0.5, 0.25]), axis=0))
    np.testing.assert_allclose(b.log_wealth, out[-1])
    np.testing.assert_allclose(b.lam, [0.5, 0.25])
    before = b.state_dict()
    with pytest.raises(RuntimeError, match="betting bound"):
        b.run(np.array([[-2.0, 0.0]]))
    assert b.state_dict() == before
    c = FixedStake(np.array([0.5, 0.25]))
    c.load_state_dict(before)
    np.testing.assert_allclose(c.log_wealth, b.log_wealth)
    with pytest.raises(ValueError):
        FixedStake(np.array([0.0]))
