"""The level of each proof path, shown by simulation at the statistic level (docs/design.md
section 14, "Two levels of evidence").

A proof path is valid at its level when a correct run crosses it with probability at most that
level. A training run is far too slow to show a rate of 1e-4 (it takes about 10^5 runs), but
each whole-run path is a test of one statistic whose law under a correct implementation is
known, so it can be drawn directly, 10^5 times in seconds, and put through the library's own
code for the path:

* ``whitebox``: the white-box release bound (:mod:`dpaudit_torch.stats.whitebox`, docs/design.md
  section 13): a correct release gives every canary the sum c K_i + N(0, T sigma^2) with K_i ~
  Binomial(T, q) for IN canaries; the bound exceeds the true rho = c / sigma (hence the true
  epsilon, a monotone map) exactly when L = D / S exceeds the critical value whose conservative
  tail at rho is the level (:meth:`~dpaudit_torch.stats.whitebox.ReleaseLaw.quantile`), the
  value :meth:`~dpaudit_torch.stats.whitebox.ReleaseLaw.rho_lower_bound` inverts;
* ``steinke``: the bound of Steinke, Nasr & Jagielski (NeurIPS 2023) on r guesses, v of them
  right: the least private eps-DP mechanism (randomized response on each canary's bit) makes v
  ~ Binomial(r, e^eps / (1 + e^eps)); the bound
  (:func:`~dpaudit_torch.stats.steinke.steinke_epsilon_lower_bound`) is computed for every v
  drawn and compared with eps;
* ``consistency``: the accounting monitor's intervals: the examples over the run ~
  Binomial(N T, q) (:func:`~dpaudit_torch.stats.sampling.rate_interval`) and the noise's sum of
  squares ~ chi2(n) in units of the claimed sigma
  (:func:`~dpaudit_torch.audit.monitors.accounting.sigma_ratio_interval`), each at half the
  path's level; the claim is called inconsistent only where the rate's lower end lies above the
  true q or the noise multiplier's upper end below the true sigma.

The sequential decision's path is Ville's inequality (exact for any e-process); its rate on
correct streams is measured in ``benchmarks/levels.py`` with the auditor's own monitors, and on
training runs in ``benchmarks/false_alarms.py``.

Every rate comes with an exact Clopper-Pearson interval (Clopper & Pearson, Biometrika 1934). A
power check against a non-private mechanism (the same statistic at a smaller sigma, a larger
eps, a wrong q or sigma) shows that the simulated path can reject at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from .._validation import check_alpha, check_positive_int
from .common import clopper_pearson

__all__ = ["LevelResult", "whitebox_level", "steinke_level", "consistency_level"]


@dataclass(frozen=True)
class LevelResult:
    """How often a proof path fired on ``runs`` simulated games.

    ``exceed``: games where the path made a proof; ``level``: the level it was run at;
    ``truth_private``: whether the simulated mechanism satisfies the claim (a validity row) or
    not (a power row); ``setting``: the parameters, in words."""

    path: str
    level: float
    runs: int
    exceed: int
    truth_private: bool
    setting: str

    @property
    def rate(self) -> float:
        return self.exceed / self.runs

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """Exact Clopper-Pearson interval of the rate."""
        return clopper_pearson(self.exceed, self.runs, confidence)


def whitebox_level(level: float, runs: int, seed: int, *, sigma: float = 1.0,
                   true_sigma: float | None = None, q: float = 0.1, steps: int = 50,
                   m: int = 200, chunk: int = 5000) -> LevelResult:
    """White-box bound above the claim's rho = 1 / ``sigma`` in ``runs`` simulated releases
    whose noise multiplier is ``true_sigma`` (default ``sigma``: a correct run), half the
    ``m`` canaries IN (the law is conditional on the revealed counts)."""
    from ..stats.whitebox import ReleaseLaw

    level = check_alpha(level, "level")
    runs = check_positive_int(runs, "runs")
    true_sigma = sigma if true_sigma is None else float(true_sigma)
    n1, n0 = m // 2, m - m // 2
    law = ReleaseLaw(n1, n0, steps, q)
    crit = law.quantile(1.0 - level, 1.0 / sigma, conservative=True)
    rng = np.random.default_rng(seed)
    scale = true_sigma * math.sqrt(steps)
    exceed, done = 0, 0
    while done < runs:
        n = min(chunk, runs - done)
        ins = rng.binomial(steps, q, size=(n, n1)) + scale * rng.standard_normal((n, n1))
        outs = scale * rng.standard_normal((n, n0))
        stat = (ins.mean(axis=1) - outs.mean(axis=1)) / outs.std(axis=1, ddof=1)
        exceed += int(np.count_nonzero(stat > crit))
        done += n
    return LevelResult("whitebox", level, runs, exceed, true_sigma >= sigma,
                       f"sigma {true_sigma:g} (claim {sigma:g}), q {q:g}, T {steps}, m {m}")


def steinke_level(level: float, runs: int, seed: int, *, eps: float = 1.0,
                  true_eps: float | None = None, guesses: int = 1000, m: int = 2000,
                  delta: float = 1e-5) -> LevelResult:
    """Steinke bound above ``eps`` in ``runs`` games of r = ``guesses`` guesses on the least
    private ``true_eps``-DP mechanism (default ``eps``: a correct run)."""
    from ..stats.steinke import steinke_epsilon_lower_bound

    level = check_alpha(level, "level")
    runs = check_positive_int(runs, "runs")
    true_eps = eps if true_eps is None else float(true_eps)
    rng = np.random.default_rng(seed)
    right = rng.binomial(guesses, float(special.expit(true_eps)), size=runs)
    values, counts = np.unique(right, return_counts=True)
    # the bound is non-decreasing in v: find the smallest v whose bound exceeds eps
    above = np.array([steinke_epsilon_lower_bound(m, guesses, int(v), delta, level) > eps
                      for v in values])
    exceed = int(counts[above].sum())
    return LevelResult("steinke", level, runs, exceed, true_eps <= eps,
                       f"eps {true_eps:g} (claim {eps:g}), r {guesses}, m {m}, delta {delta:g}")


def consistency_level(level: float, runs: int, seed: int, *, n_records: int = 60000,
                      q: float = 0.01, steps: int = 500, noise_values: int = 20000,
                      true_q: float | None = None, true_ratio: float = 1.0) -> LevelResult:
    """The accounting intervals' false "claim inconsistent" in ``runs`` runs of ``steps``
    releases over ``n_records`` records at rate ``true_q`` (default ``q``) and noise
    ``true_ratio`` x the claimed sigma, measured on ``noise_values`` values: a miss is the
    rate's lower end above ``q`` or the noise multiplier's upper end below the claimed one."""
    from ..audit.monitors.accounting import sigma_ratio_interval
    from ..stats.sampling import rate_interval

    level = check_alpha(level, "level")
    runs = check_positive_int(runs, "runs")
    true_q = q if true_q is None else float(true_q)
    rng = np.random.default_rng(seed)
    examples = rng.binomial(n_records * steps, true_q, size=runs)
    values, inverse = np.unique(examples, return_inverse=True)
    lo_q = np.array([rate_interval(int(x), n_records, steps, level / 2.0)[0] for x in values])
    miss_q = lo_q[inverse] > q
    ss = true_ratio ** 2 * rng.chisquare(noise_values, size=runs)
    # the interval's ends are sqrt(ss) times those of ss = 1 (the library's function, once)
    hi = np.sqrt(ss) * sigma_ratio_interval(1.0, noise_values, level / 2.0)[1]
    miss_s = hi < 1.0
    exceed = int(np.count_nonzero(miss_q | miss_s))
    private = true_q <= q and true_ratio >= 1.0
    return LevelResult("consistency", level, runs, exceed, private,
                       f"q {true_q:g} (claim {q:g}), noise x {true_ratio:g}, N {n_records}, "
                       f"T {steps}, {noise_values} noise values")
