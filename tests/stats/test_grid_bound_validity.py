"""Type-I error of the default epsilon lower bound over a grid of true nulls (docs/design.md
section 4).

Setting: the Gaussian mechanism with sensitivity 1 and noise 1 (x ~ N(0, 1), y ~ N(1, 1)) tested
at G = 30 points (eps_g, delta(eps_g)) of its OWN privacy profile, eps_g geometric from 0.1 to 3:
every one of the 30 nulls is true, and tight (the mechanism sits exactly on each point's
boundary). The bound is wrong whenever it is positive. The default (``simultaneous=True``)
tests each point at alpha / G; by Ville's inequality and a union bound over the G points, a run
of any length gives a positive bound with probability p <= alpha. The R runs are independent, so
the count K of positive bounds is stochastically below Binomial(R, alpha), and with q = its 0.999
quantile, P[K > q] <= 1e-3. R = 200: q = 21, P[Bin(200, 0.05) > 21] = 4.8e-4
(``test_limit_is_the_binomial_quantile``). Seeds are fixed: the outcome is deterministic.

Measured (the same construction, ``epsilon_lower_bound_per_point``, which is the former default):
the per-point maximum is positive in 76 of 2,000 hockey-stick runs of 2,000 pairs (3.8 %; the
Bonferroni bound: 1 of 2,000); only G x alpha bounds it in general, so it is never reported as
a level-alpha bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sps

from dpaudit_torch import HockeyStickTest, SequentialMMDTest
from dpaudit_torch.stats.thresholds import gaussian_profile_grid

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: threads only contend

ALPHA = 0.05
G = 30
RUNS, PAIRS = 200, 500
Q = 21  # Binomial(200, 0.05).ppf(0.999)
EPS = np.geomspace(0.1, 3.0, G)
DELTAS = gaussian_profile_grid(1.0, EPS)


def test_limit_is_the_binomial_quantile() -> None:
    b = sps.binom(RUNS, ALPHA)
    assert b.ppf(0.999) == Q
    assert b.sf(Q) <= 1e-3 < b.sf(Q - 1)


@pytest.mark.parametrize("cls", [HockeyStickTest, SequentialMMDTest])
def test_default_grid_bound_type1_on_a_null_grid(cls: type) -> None:
    gen = torch.Generator().manual_seed(7 if cls is HockeyStickTest else 8)
    positive = positive_per_point = 0
    for _ in range(RUNS):
        x = torch.randn(PAIRS, generator=gen, dtype=torch.float64)
        y = 1.0 + torch.randn(PAIRS, generator=gen, dtype=torch.float64)
        t = cls(EPS, DELTAS, ALPHA).update(x, y)
        # the default is the simultaneous (Bonferroni) bound
        assert t.simultaneous and t.per_point_alpha == pytest.approx(ALPHA / G)
        lb, lb_pp = t.epsilon_lower_bound, t.epsilon_lower_bound_per_point
        assert lb == 0.0 or lb in EPS.tolist()
        assert lb <= lb_pp  # alpha / G per point rejects only where alpha does
        positive += lb > 0.0
        positive_per_point += lb_pp > 0.0
    assert positive <= Q, (cls.__name__, positive, positive_per_point)


def test_per_point_form_is_explicit_and_old_states_say_how_to_load() -> None:
    gen = torch.Generator().manual_seed(9)
    x = 0.5 * torch.randn(800, generator=gen, dtype=torch.float64)
    y = 1.0 + 0.5 * torch.randn(800, generator=gen, dtype=torch.float64)
    eps = [0.5, 1.0, 2.0]
    old = HockeyStickTest(eps, gaussian_profile_grid(1.0, eps), simultaneous=False).update(x, y)
    new = HockeyStickTest(eps, gaussian_profile_grid(1.0, eps)).update(x, y)
    # sigma = 0.5 claimed as sigma = 1: every point is violated and rejected in both forms
    assert old.epsilon_lower_bound == old.epsilon_lower_bound_per_point == 2.0
    assert new.epsilon_lower_bound_per_point == 2.0 and new.epsilon_lower_bound == 2.0
    assert new.summary()["simultaneous"] is True
    fresh = HockeyStickTest(eps, gaussian_profile_grid(1.0, eps))
    with pytest.raises(ValueError, match="simultaneous=False"):
        fresh.load_state_dict(old.state_dict())
    again = HockeyStickTest(eps, gaussian_profile_grid(1.0, eps), simultaneous=False)
    again.load_state_dict(old.state_dict())
    assert again.epsilon_lower_bound == 2.0
