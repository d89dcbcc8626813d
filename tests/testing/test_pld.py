"""The independent privacy-loss computation of dpaudit_torch.testing.pld against closed forms:
Gaussian noise against the PRV accountant (Gopi, Lee & Wutschitz 2021, through Opacus), and the
pair-correlated Gaussian release at q = 1 against the Gaussian mechanism's exact epsilon (Balle &
Wang 2018). Tolerances: the composition grid's rounding, T h (h = LOSS_GRID), plus the PRV
accountant's eps error 0.01."""

from __future__ import annotations

import math

import pytest

from dpaudit_torch.stats import whitebox as wb
from dpaudit_torch.testing import pld


@pytest.mark.parametrize("sigma", [1.0, 3.0])
def test_gaussian_noise_matches_the_prv_accountant(sigma: float) -> None:
    q, steps = 0.1, 100
    res = pld.release_epsilon("gaussian", sigma, q, steps, 1e-5)
    lo = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "lower")
    up = wb.dpsgd_epsilon(sigma, q, steps, 1e-5, "upper")
    assert res.lower <= res.upper <= res.lower + steps * pld.LOSS_GRID + 1e-3  # + the cells
    assert lo - 0.01 <= res.lower and res.upper <= up + 0.01


def test_paired_steps_at_full_rate_are_the_gaussian_mechanism() -> None:
    sigma, r, steps = 1.0, -0.2, 10
    res = pld.pair_correlated_epsilon(sigma, r, 1.0, steps, 1e-5)
    exact = pld.gaussian_mechanism_epsilon(math.sqrt(steps / (sigma ** 2 * (1 + r))), 1e-5)
    assert res.lower <= exact + 1e-6 and exact <= res.upper + 1e-3
    # uncorrelated pairs are the plain subsampled Gaussian release
    a = pld.pair_correlated_epsilon(1.0, 0.0, 0.1, 40, 1e-5)
    b = pld.release_epsilon("gaussian", 1.0, 0.1, 40, 1e-5)
    assert abs(a.lower - b.lower) <= 40 * pld.LOSS_GRID + 0.01


def test_laplace_is_more_private_than_its_gaussian_twin_at_a_large_signal() -> None:
    lap = pld.release_epsilon("laplace", 0.5, 0.1, 50, 1e-5)
    gau = pld.release_epsilon("gaussian", 0.5, 0.1, 50, 1e-5)
    assert lap.upper < gau.lower
    with pytest.raises(ValueError, match="noise"):
        pld.noise_cdf("cauchy")
    with pytest.raises(ValueError, match="even"):
        pld.pair_correlated_epsilon(1.0, 0.1, 0.1, 3, 1e-5)
