"""Tests of the nulls' thresholds: MMD tau (Theorem 3.1 of González et al. 2025) and the exact
privacy profile of the Gaussian mechanism (Balle & Wang 2018; Dong, Roth & Su 2019)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpaudit_torch.stats.thresholds import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_profile_grid,
    mmd_tau,
)


def brute_force_delta(eps: float, mu: float) -> float:
    """sup_E P(E) - e^eps Q(E) = int max(p - e^eps q, 0) for P = N(mu, 1), Q = N(0, 1).

    Integrated numerically over the set where p > e^eps q (x > eps / mu + mu / 2), found here
    by the integrand itself, not by the closed form under test.
    """

    def f(x: float) -> float:
        return max(stats.norm.pdf(x, loc=mu) - math.exp(eps) * stats.norm.pdf(x), 0.0)

    val, _ = integrate.quad(f, -np.inf, np.inf, epsabs=1e-14, epsrel=1e-12, limit=400)
    # quad on an infinite range can miss a narrow support; integrate on a wide finite range too
    lo, hi = -40.0, 40.0 + mu
    val2, _ = integrate.quad(f, lo, hi, epsabs=1e-14, epsrel=1e-12, limit=400)
    return max(val, val2)


@pytest.mark.parametrize("mu", [0.25, 1.0, 2.0])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5, 1.0, 2.0])
def test_gaussian_delta_matches_brute_force(eps: float, mu: float) -> None:
    assert float(gaussian_delta(eps, mu)) == pytest.approx(brute_force_delta(eps, mu),
                                                           rel=1e-7, abs=1e-12)


def test_gaussian_delta_known_values() -> None:
    # eps = 0: delta = TV(N(mu,1), N(0,1)) = Phi(mu/2) - Phi(-mu/2); mu = 1: 0.38292492254802624
    assert float(gaussian_delta(0.0, 1.0)) == pytest.approx(0.38292492254802624, rel=1e-14)
    # vectorised over eps
    e = np.array([0.0, 0.5, 1.0])
    np.testing.assert_allclose(gaussian_delta(e, 1.0), [float(gaussian_delta(x, 1.0)) for x in e])
    # huge eps: 0, not NaN
    assert float(gaussian_delta(600.0, 1.0)) == 0.0


def test_gaussian_delta_monotone() -> None:
    eps = np.linspace(0.0, 8.0, 200)
    for mu in (0.3, 1.0, 3.0):
        d = gaussian_delta(eps, mu)
        assert np.all(np.diff(d) <= 0.0)  # decreasing in eps
    # increasing in mu (less noise, more leakage)
    mus = np.linspace(0.1, 5.0, 100)
    d = np.array([float(gaussian_delta(1.0, m)) for m in mus])
    assert np.all(np.diff(d) > 0.0)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 1e-2, 0.1])
def test_gaussian_epsilon_inverts_delta(delta: float, mu: float) -> None:
    e = gaussian_epsilon(delta, mu)
    if float(gaussian_delta(0.0, mu)) <= delta:
        assert e == 0.0
        return
    assert float(gaussian_delta(e, mu)) == pytest.approx(delta, rel=1e-8)
    # the smallest such eps: slightly less gives a larger delta
    assert float(gaussian_delta(e * (1 - 1e-6), mu)) > delta


def test_gaussian_epsilon_edges_and_monotone() -> None:
    assert gaussian_epsilon(0.0, 1.0) == math.inf
    assert gaussian_epsilon(0.5, 1.0) == 0.0  # delta(0) = 0.383 <= 0.5
    deltas = [1e-8, 1e-6, 1e-4, 1e-2]
    eps = [gaussian_epsilon(d, 1.0) for d in deltas]
    assert all(a > b for a, b in zip(eps, eps[1:]))  # decreasing in delta
    eps_mu = [gaussian_epsilon(1e-5, m) for m in (0.5, 1.0, 2.0)]
    assert all(a < b for a, b in zip(eps_mu, eps_mu[1:]))  # increasing in mu
    with pytest.raises(ValueError, match="mu"):
        gaussian_epsilon(1e-5, 0.0)
    with pytest.raises(ValueError, match="mu"):
        gaussian_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="delta"):
        gaussian_epsilon(1.0, 1.0)
    with pytest.raises(ValueError, match="delta"):
        gaussian_epsilon(-0.1, 1.0)


def test_gaussian_profile_grid() -> None:
    eps = [0.1, 1.0, 3.0]
    np.testing.assert_array_equal(gaussian_profile_grid(2.0, eps), gaussian_delta(eps, 0.5))
    with pytest.raises(ValueError, match="noise multiplier"):
        gaussian_profile_grid(0.0, eps)
    with pytest.raises(ValueError, match="noise multiplier"):
        gaussian_profile_grid(float("inf"), eps)


def test_mmd_tau_values_and_monotone() -> None:
    # by hand: tau(eps, 0) = sqrt(2) tanh(eps / 2); tau(0, delta) = sqrt(2) delta;
    # tau(ln 3, 0) = sqrt(2) / 2; tau -> sqrt(2) as eps -> inf
    assert float(mmd_tau(0.0, 0.0)) == 0.0
    assert float(mmd_tau(0.0, 0.3)) == pytest.approx(math.sqrt(2) * 0.3, rel=1e-15)
    assert float(mmd_tau(math.log(3.0), 0.0)) == pytest.approx(math.sqrt(2) / 2, rel=1e-15)
    for e in (0.01, 0.1, 1.0, 5.0):
        assert float(mmd_tau(e, 0.0)) == pytest.approx(math.sqrt(2) * math.tanh(e / 2), rel=1e-13)
    assert float(mmd_tau(800.0, 0.0)) == pytest.approx(math.sqrt(2), rel=1e-15)
    e = np.linspace(0, 10, 300)
    assert np.all(np.diff(mmd_tau(e, 1e-5)) > 0)
    d = np.linspace(0, 0.99, 100)
    assert np.all(np.diff(mmd_tau(0.5, d)) > 0)
    np.testing.assert_allclose(mmd_tau(np.array([0.1, 0.2]), np.array([0.0, 1e-5])),
                               [float(mmd_tau(0.1, 0.0)), float(mmd_tau(0.2, 1e-5))])


def test_mmd_tau_bounds_randomised_response() -> None:
    """Theorem 3.1 on its extremal pair: randomised response with atoms far apart (k ~ 0) has
    MMD = sqrt(2) TV = sqrt(2) (e^eps - 1) / (e^eps + 1) = tau(eps, 0), and never more."""
    for eps in (0.1, 1.0, 3.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        for k01 in (0.0, 0.3, 0.9):  # kernel value between the two atoms
            mmd = (2 * p - 1) * math.sqrt(2 - 2 * k01)
            assert mmd <= float(mmd_tau(eps, 0.0)) * (1 + 1e-12)
        assert (2 * p - 1) * math.sqrt(2) == pytest.approx(float(mmd_tau(eps, 0.0)), rel=1e-12)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: mmd_tau(float("nan"), 0.0), "epsilon"),
        (lambda: mmd_tau(-1.0, 0.0), "epsilon"),
        (lambda: mmd_tau(1.0, 1.5), "delta"),
        (lambda: mmd_tau(1.0, -0.5), "delta"),
        (lambda: mmd_tau([0.1, -0.1], 0.0), "epsilon"),
        (lambda: gaussian_delta(float("nan"), 1.0), "epsilon"),
        (lambda: gaussian_delta(-1.0, 1.0), "epsilon"),
        (lambda: gaussian_delta(1.0, 0.0), "mu"),
        (lambda: gaussian_profile_grid(1.0, [float("nan")]), "epsilon"),
        (lambda: gaussian_profile_grid(-1.0, [1.0]), "noise multiplier"),
    ],
)
def test_bad_threshold_inputs_raise_value_error(call, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()


@pytest.mark.parametrize("mu", ["a", True, None])
def test_bad_mu_type_raises_type_error_naming_mu(mu: object) -> None:
    with pytest.raises(TypeError, match="mu"):
        gaussian_delta(1.0, mu)  # type: ignore[arg-type]
