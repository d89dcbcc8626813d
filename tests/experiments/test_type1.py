"""Type-I error of both sequential testers on every truly DP mechanism.

See docs/design.md sections 1 and 7.

Under H0 each test's wealth is a nonnegative supermartingale, so by Ville's inequality a run of
any length rejects with probability <= alpha = 0.05. With R independent runs the number of false
rejections K is then stochastically below Bin(R, 0.05). We assert K <= q, the 0.999 quantile:

* R = 200:  q = 21, P[Bin(200, 0.05) > 21] = 4.8e-4;
* R = 1000: q = 73, P[Bin(1000, 0.05) > 73] = 6.5e-4

(scipy.stats.binom(R, 0.05).ppf(0.999); checked in ``test_quantiles``). Over the 20 rows
(10 cases x 2 testers) a valid implementation fails somewhere with probability <= 20 x 6.5e-4
~ 1.3%, and the seeds are fixed, so a failure means a real excess, e.g. a non-predictable
payoff, which typically rejects in a large fraction of runs. (The fast version uses short runs:
Ville's bound holds at every horizon, so it tests the same guarantee on the first pairs, where
burn-in and set-learning bugs show up; the benchmark benchmarks/type1.py runs 1000 x 2000.)
"""

from __future__ import annotations

import pytest
from scipy import stats as sps

from dpaudit_torch import experiments as ex

ALPHA = 0.05
FAST_RUNS, FAST_Q = 200, 21
SLOW_RUNS, SLOW_Q = 1000, 73
FAST_PAIRS = 150  # 200 runs x 10 cases x 2 testers in ~1-2 min on one shared core
SLOW_PAIRS = 500


def test_quantiles() -> None:
    for runs, q in ((FAST_RUNS, FAST_Q), (SLOW_RUNS, SLOW_Q)):
        b = sps.binom(runs, ALPHA)
        assert b.ppf(0.999) == q
        assert b.sf(q) <= 1e-3 < b.sf(q - 1)


def _check(runs: int, pairs: int, q: int, seed: int) -> None:
    rows = ex.run_type1(runs=runs, pairs=pairs, alpha=ALPHA, seed=seed, progress=False,
                        batch=pairs)
    assert len(rows) == 20
    bad = [(r.case, r.method, r.rejections) for r in rows if r.rejections > q]
    assert not bad, f"false rejections above the 0.999 binomial quantile {q}: {bad}"


def test_type1_fast() -> None:
    _check(FAST_RUNS, FAST_PAIRS, FAST_Q, seed=2024)


@pytest.mark.slow
def test_type1_slow() -> None:
    _check(SLOW_RUNS, SLOW_PAIRS, SLOW_Q, seed=2025)
