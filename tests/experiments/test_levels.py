"""The level of each whole-run proof path by simulation at the statistic level
(dpaudit_torch/experiments/levels.py; docs/design.md section 14).

Limits, derived: a path valid at level a fires in n independent games a number of times
stochastically below Binomial(n, a), so it exceeds q = the 0.999 quantile of Binomial(n, a) with
probability at most 1e-3; the seeds are fixed, so a failure is a real excess. Each path is run at
its share of the default alpha (1e-3) and at 0.05, where a wrong critical value would show. The
power rows (a non-private mechanism: a smaller sigma, a larger eps, too little noise) must fire
far more often than the level allows. The 10^5-game versions are the slow test below and
``benchmarks/levels.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from dpaudit_torch.audit.levels import path_levels
from dpaudit_torch.experiments.levels import (
    LevelResult,
    consistency_level,
    steinke_level,
    whitebox_level,
)

N = 10_000  # games per fast row (about 0.4 s for the white-box path)
LEVELS = path_levels(1e-3)
PATHS = {"whitebox": whitebox_level, "steinke": steinke_level, "consistency": consistency_level}


def _limit(n: int, a: float) -> int:
    return int(sps.binom(n, a).ppf(0.999))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("level_of", ["share", "0.05"])
def test_each_path_holds_its_level(path: str, level_of: str) -> None:
    level = LEVELS[path] if level_of == "share" else 0.05
    r = PATHS[path](level, N, seed=11)
    assert r.truth_private and r.runs == N
    assert r.exceed <= _limit(N, level), (r.exceed, _limit(N, level))


@pytest.mark.parametrize("path,unprivate", [("whitebox", {"true_sigma": 0.7}),
                                            ("steinke", {"true_eps": 2.0, "m": 1000}),
                                            ("consistency", {"true_ratio": 0.99})])
def test_each_path_rejects_a_mechanism_that_breaks_the_claim(path: str, unprivate: dict) -> None:
    """Power: at the path's share of alpha, the measured rates were 0.044 (10^5 games), 0.975
    (2 10^4) and 0.033 (10^5); a rate 5 x the level's 0.999 quantile is far below each. (The
    Steinke game with every canary guessed, r = m = 1000: its delta term 2 m delta is 0.02; at
    m = 2000 with 1000 guesses it keeps the bound below eps = 1 at this level, even for a true
    eps of 3: the bound's power at small levels needs 2 m delta well below 1.)"""
    r = PATHS[path](LEVELS[path], N, seed=12, **unprivate)
    assert not r.truth_private
    assert r.exceed > 5 * _limit(N, LEVELS[path]), r.exceed


def test_the_whitebox_shortcut_is_the_library_bound() -> None:
    """L above the critical value is exactly the library's bound above the true rho: the
    same games through ``release_moments`` and ``rho_lower_bound`` (at 0.05, where both sides
    occur)."""
    from dpaudit_torch.stats import whitebox as wb

    sigma, q, steps, m, level = 1.0, 0.1, 50, 200, 0.05
    law = wb.ReleaseLaw(m // 2, m - m // 2, steps, q)
    crit = law.quantile(1.0 - level, 1.0 / sigma, conservative=True)
    rng = np.random.default_rng(3)
    is_in = np.arange(m) < m // 2
    sides = set()
    for _ in range(24):
        sums = rng.binomial(steps, q, size=m) * is_in + rng.standard_normal(m) * math.sqrt(steps)
        mom = wb.release_moments(sums, is_in, steps)
        above = wb.rho_lower_bound(mom, q, level) > 1.0 / sigma
        assert above == (mom.statistic > crit)
        sides.add(above)
    assert sides == {True, False}


def test_result_interval_and_bad_input() -> None:
    r = LevelResult("x", 0.01, 100, 0, True, "")
    assert r.rate == 0.0 and r.interval()[0] == 0.0 and 0.03 < r.interval()[1] < 0.04
    with pytest.raises(ValueError, match="level"):
        whitebox_level(1.5, 10, 0)
    with pytest.raises(ValueError, match="runs"):
        steinke_level(0.05, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_path_holds_its_level_in_1e5_games(path: str) -> None:
    n = 100_000
    r = PATHS[path](LEVELS[path], n, seed=21)
    assert r.exceed <= _limit(n, LEVELS[path]), (r.exceed, _limit(n, LEVELS[path]))
