"""One-run privacy audit: epsilon lower bounds from ONE training run (docs/design.md section 6).

The game.  m canaries each carry a secret bit S_i, uniform in {IN, OUT} and drawn independently of
everything else; IN canaries are trained on.  After training every canary has a score (higher =
"looks more IN").  The auditor guesses IN for the k+ highest scores, OUT for the k- lowest and
abstains on the rest: r = k+ + k- guesses, v of them correct.  An (eps, delta)-DP training run
cannot make v large, which turns (r, v) into a lower bound on eps.

Two tests turn (m, r, v) into a bound:

* ``method="steinke"`` -- Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
  NeurIPS 2023 (arXiv 2305.08846), Theorem 3.1 / Proposition 5.2.  With q = e^eps / (1 + e^eps),
  B ~ Binomial(r, q):  p = min(1, P[B >= v] + 2 m delta max_{i=1..v} (1/i) P[v-i <= B < v]).
  The bound is the largest eps whose p-value is below alpha.  Family-free: it holds for every
  (eps, delta)-DP mechanism.
* ``method="fdp"`` -- Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run",
  ICML 2025 (arXiv 2410.22235), the recursion of their Algorithm (``audit_rh_with_cap``) for the
  Gaussian trade-off curves f_mu(x) = Phi(Phi^-1(1-x) - mu).  It rejects "the run is mu-GDP" and
  reports eps(delta) of the largest rejected mu.  It is a test against the Gaussian (mu-GDP) curve
  family, NOT a family-free bound: a mechanism that is (eps, delta)-DP but not Gaussian-shaped (e.g.
  randomized response) can be reported above its eps.  Every result says so.

Choosing the number of guesses after looking at which guesses were right is selection on the
secret, so the guesses are chosen by a *strategy*, each valid at level alpha:

* :class:`FixedK` -- k+ and k- fixed before the audit;
* :class:`Bonferroni` -- the best of a candidate set fixed before the audit, each candidate tested
  at alpha / (number of candidates) (default; the default candidate set is the 1-2-5 sequence of
  guess counts, see :func:`default_candidates`);
* :class:`RandomSplit` -- a seeded random subset of the canaries chooses the guess fraction, the
  other canaries certify it (so m of the certificate is the held-out count).

The reference implementation compared with (not copied) is ``jax_privacy/auditing.py``
(google-deepmind/jax_privacy); ``Bonferroni(candidates="roc_hull")`` reproduces its guess semantics
(one-sided, thresholds on the ROC hull, alpha divided by the hull size).

The tests live in :mod:`~dpaudit_torch.stats.steinke` and :mod:`~dpaudit_torch.stats.fdp`, the
canary game and the bounds over candidate guesses in :mod:`~dpaudit_torch.stats.one_run_bounds`;
their public names are re-exported here, where users import them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._one_run_checks import GUESSES, check_bound_request, check_int
from .fdp import (
    FDP_FAMILY_NOTE,
    fdp_epsilon_lower_bound,
    fdp_mu_lower_bound,
    fdp_rejects,
    fdp_test_statistic,
)
from .one_run_bounds import CanaryGame, best_bound, ceiling, reachable_ceiling
from .steinke import steinke_epsilon_lower_bound, steinke_p_value

logger = logging.getLogger(__name__)

__all__ = [
    "FDP_FAMILY_NOTE",
    "FixedK",
    "Bonferroni",
    "RandomSplit",
    "OneRunResult",
    "OneRunAudit",
    "steinke_p_value",
    "steinke_epsilon_lower_bound",
    "fdp_test_statistic",
    "fdp_rejects",
    "fdp_mu_lower_bound",
    "fdp_epsilon_lower_bound",
    "ceiling",
    "default_candidates",
]


# ------------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FixedK:
    """Guess IN for the ``k_pos`` highest scores and OUT for the ``k_neg`` lowest, fixed in advance.

    ``k_neg=None`` means 0 for one-sided guesses and ``k_pos`` for two-sided guesses.
    """

    k_pos: int
    k_neg: int | None = None

    def __post_init__(self) -> None:
        check_int("k_pos", self.k_pos, 0)
        if self.k_neg is not None:
            check_int("k_neg", self.k_neg, 0)

    def describe(self, guesses: str) -> str:
        kp, kn = self.resolve(guesses)
        return f"FixedK(k_pos={kp}, k_neg={kn}) fixed in advance"

    def resolve(self, guesses: str) -> tuple[int, int]:
        kp = int(self.k_pos)
        if self.k_neg is None:
            kn = kp if guesses == "two_sided" else 0
        else:
            kn = int(self.k_neg)
        if guesses == "one_sided" and kn > 0:
            raise ValueError(f"guesses='one_sided' makes no OUT guesses, but k_neg={kn}")
        if kp + kn < 1:
            raise ValueError(f"FixedK needs at least one guess, got k_pos={kp}, k_neg={kn}")
        return kp, kn


@dataclasses.dataclass(frozen=True)
class Bonferroni:
    """Best of a candidate set stated before the audit, each tested at alpha / len(candidates).

    ``candidates``:

    * ``"grid"`` (default) -- guess counts r in the 1-2-5 sequence 10, 20, 50, 100, ... that are
      <= m, plus r = m (see :func:`default_candidates`); two-sided guesses split r as
      k+ = ceil(r/2), k- = floor(r/2);
    * ``"all"`` -- every r = 1..m (same split);
    * a sequence of ints (guess counts r, split as above) or of (k_pos, k_neg) pairs;
    * ``"roc_hull"`` -- jax_privacy compatibility (one-sided only): guess IN for scores >= t for
      every threshold t on the upper hull of the ROC staircase, alpha divided by the hull size.
      The hull (hence the correction) depends on the labels, so the Bonferroni argument does not
      cover it strictly; it is offered to reproduce jax_privacy's numbers and its coverage is
      checked by simulation only.
    """

    candidates: str | tuple[Any, ...] = "grid"

    def __post_init__(self) -> None:
        c = self.candidates
        if isinstance(c, str):
            if c not in ("grid", "all", "roc_hull"):
                raise ValueError(
                    f"Bonferroni candidates must be 'grid', 'all', 'roc_hull' or a sequence, "
                    f"got {c!r}"
                )
            return
        if not isinstance(c, Sequence) or len(c) == 0:
            raise ValueError(f"Bonferroni candidates must be a non-empty sequence, got {c!r}")
        object.__setattr__(self, "candidates", tuple(
            tuple(x) if isinstance(x, (tuple, list)) else x for x in c))
        for x in self.candidates:
            if isinstance(x, tuple):
                if len(x) != 2:
                    raise ValueError(f"a candidate pair must be (k_pos, k_neg), got {x!r}")
                check_int("k_pos", x[0], 0)
                check_int("k_neg", x[1], 0)
                if int(x[0]) + int(x[1]) < 1:
                    raise ValueError(f"a candidate must make at least one guess, got {x!r}")
            else:
                check_int("candidate guess count", x, 1)


@dataclasses.dataclass(frozen=True)
class RandomSplit:
    """Choose the guesses on a seeded random subset of canaries, certify on the others.

    A uniformly random ``fraction`` of the canaries (permutation from ``seed``, drawn over canary
    positions, never over labels or scores) picks the best guess fractions k+/m1, k-/m1 with no
    correction (every r = 1..m1, or a 4000-point geometric grid above 20,000); the held-out m2
    canaries are then audited with k+ = round(k+/m1 * m2), k- likewise, at level alpha, and
    m = m2 in the certificate.  Valid because, conditionally on the selection half (its labels
    become part of the fixed dataset), the held-out bits are still i.i.d. uniform and the guess
    counts are fixed.
    """

    fraction: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating)) or not (0 < f < 1):
            raise ValueError(f"RandomSplit fraction must lie in (0, 1), got {f!r}")
        check_int("RandomSplit seed", self.seed, 0)


_Strategy = FixedK | Bonferroni | RandomSplit


def default_candidates(m: int) -> list[int]:
    """The default Bonferroni candidate guess counts: 1-2-5 sequence from 10, capped at m, plus m.

    m = 5000 -> [10, 20, 50, 100, 200, 500, 1000, 2000, 5000] (9 candidates, alpha / 9 each).
    Chosen so that the Bonferroni price stays small (about 3 log10(m) candidates) while any r is
    within a factor 2.5 of a candidate.
    """
    m_ = check_int("m", m, 1)
    out: list[int] = []
    base = 10
    while base <= m_:
        for f in (1, 2, 5):
            if f * base <= m_:
                out.append(f * base)
        base *= 10
    if not out or out[-1] != m_:
        out.append(m_)
    return out


def _diagnostic_candidates(m: int) -> np.ndarray:
    """Guess counts searched for the uncorrected diagnostic and by RandomSplit's selection half."""
    if m <= 20000:
        return np.arange(1, m + 1, dtype=np.int64)
    return np.unique(np.round(np.geomspace(1, m, 4000)).astype(np.int64))


def _split_counts(r: np.ndarray, guesses: str) -> tuple[np.ndarray, np.ndarray]:
    if guesses == "one_sided":
        return r.copy(), np.zeros_like(r)
    kp = (r + 1) // 2
    return kp, r - kp


# ------------------------------------------------------------------------------------------------
# result
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """A one-run epsilon lower bound with everything needed to read it.

    Attributes:
        bound: the epsilon lower bound, valid at level ``alpha`` under ``strategy``.
        method: ``"steinke"`` or ``"fdp"``.
        strategy: how the guesses were chosen, in words (with the candidate count).
        guesses: ``"one_sided"`` or ``"two_sided"``.
        m: canaries in the certificate (held-out count for RandomSplit).
        r, v: guesses made and correct guesses of the certified candidate.
        k_pos, k_neg: IN and OUT guesses of the certified candidate.
        alpha: overall level; ``alpha_per_test`` the level each candidate was tested at.
        delta: the delta of the (eps, delta) statement.
        ceiling: the largest bound this audit could have reported (all guesses right, over the
            candidates the strategy allowed, at ``alpha_per_test``).
        family: for ``fdp`` the family note (:data:`FDP_FAMILY_NOTE`), else None.
        mu: for ``fdp`` the largest rejected mu of mu-GDP, else None.
        n_candidates: candidates the correction paid for (1 for FixedK and RandomSplit).
        m_total: canaries in the game.
        uncorrected_best: DIAGNOSTIC ONLY, NOT A VALID BOUND -- the best bound over every guess
            count r (two-sided: even split; above m = 20,000 a 4000-point geometric grid of r) on
            all m_total canaries at level alpha with no correction for the selection;
            ``uncorrected_best_r`` its r.
    """

    bound: float
    method: str
    strategy: str
    guesses: str
    m: int
    r: int
    v: int
    k_pos: int
    k_neg: int
    alpha: float
    alpha_per_test: float
    delta: float
    ceiling: float
    family: str | None
    mu: float | None
    n_candidates: int
    m_total: int
    uncorrected_best: float
    uncorrected_best_r: int

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["uncorrected_best_note"] = (
            "diagnostic only: best over all guess counts with no correction for choosing it; "
            "not a valid lower bound"
        )
        return d

    def __str__(self) -> str:
        fam = f" [{self.family}]" if self.family else ""
        return (
            f"eps >= {self.bound:.4g} (delta={self.delta:g}, alpha={self.alpha:g}, "
            f"method={self.method}{fam}, {self.guesses}, {self.strategy}; "
            f"v={self.v}/r={self.r} on m={self.m}; ceiling {self.ceiling:.4g}; "
            f"diagnostic uncorrected best {self.uncorrected_best:.4g})"
        )


# ------------------------------------------------------------------------------------------------
# the audit
# ------------------------------------------------------------------------------------------------
def _to_numpy(x: object, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        a = x.detach().to("cpu", torch.float64).numpy()
    else:
        try:
            a = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a tensor or array of numbers, got {x!r}") from err
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {tuple(a.shape)}")
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty, got {x!r}")
    if not np.isfinite(a).all():
        bad = a[~np.isfinite(a)][:3].tolist()
        raise ValueError(f"{name} contains non-finite values (e.g. {bad})")
    return a



class OneRunAudit:
    """The end-of-training guessing game on canary scores (docs/design.md section 6).

    Args:
        in_scores: scores of the canaries that were IN (trained on); tensor or array, 1-D.
        out_scores: scores of the canaries that were OUT.
        tie_break_seed: seed of the random permutation that breaks ties among equal scores
            (ties are broken independently of the labels).

    Higher score = "more likely IN".  With two arrays the canaries' own order is lost, so the
    tie-break and :class:`RandomSplit` permutations act on the pooled list [in..., out...]; their
    validity then rests on the seed being chosen independently of the data (as in jax_privacy).
    :meth:`from_labels` keeps the canaries in their own order (fixed before the secret bits were
    drawn), where any fixed seed is valid -- prefer it when canary order is known.

    Example::

        audit = OneRunAudit(in_scores, out_scores)
        res = audit.epsilon_lower_bound(delta=1e-5, alpha=0.05, method="steinke")
        print(res.bound, res.strategy, res.to_dict())
    """

    def __init__(self, in_scores: object, out_scores: object, *, tie_break_seed: int = 0) -> None:
        a = _to_numpy(in_scores, "in_scores")
        b = _to_numpy(out_scores, "out_scores")
        self._init(np.concatenate([a, b]),
                   np.concatenate([np.ones(a.size, bool), np.zeros(b.size, bool)]),
                   tie_break_seed)

    @classmethod
    def from_labels(cls, scores: object, is_in: object, *, tie_break_seed: int = 0
                    ) -> OneRunAudit:
        """Scores and IN/OUT labels in canary order (the order fixed before the bits were drawn)."""
        s = _to_numpy(scores, "scores")
        lab = is_in.detach().cpu().numpy() if isinstance(is_in, torch.Tensor) else np.asarray(is_in)
        if lab.shape != s.shape:
            raise ValueError(f"is_in must have the shape of scores {s.shape}, got {lab.shape}")
        if lab.dtype != bool:
            if not np.isin(lab, (0, 1)).all():
                vals = np.unique(lab)[:5]
                raise ValueError(f"is_in must hold booleans or 0/1, got values {vals}")
            lab = lab.astype(bool)
        if lab.all() or not lab.any():
            raise ValueError("is_in must contain both IN and OUT canaries")
        obj = cls.__new__(cls)
        obj._init(s, lab, tie_break_seed)
        return obj

    def _init(self, scores: np.ndarray, labels: np.ndarray, tie_break_seed: int) -> None:
        self._tie_seed = check_int("tie_break_seed", tie_break_seed, 0)
        self._game = CanaryGame(scores, labels, np.random.default_rng(self._tie_seed))
        n_ties = scores.size - np.unique(scores).size
        if n_ties:
            logger.info("%d tied scores; ties broken at random (seed %d), independently of labels",
                        n_ties, self._tie_seed)

    @property
    def m(self) -> int:
        """Number of canaries."""
        return self._game.m

    @property
    def n_in(self) -> int:
        return int(self._game.labels.sum())

    @property
    def n_out(self) -> int:
        return self.m - self.n_in

    def epsilon_lower_bound(
        self,
        delta: float,
        alpha: float = 0.05,
        method: str = "steinke",
        guesses: str = "one_sided",
        strategy: _Strategy | None = None,
    ) -> OneRunResult:
        """Level-alpha lower bound on eps of (eps, delta)-DP, with its method and strategy.

        Args:
            delta: the delta of the claim, in [0, 1) (``fdp`` needs delta > 0).
            alpha: level in (0, 1); the bound exceeds the truth with probability <= alpha.
            method: ``"steinke"`` (family-free) or ``"fdp"`` (Gaussian-family test).
            guesses: ``"one_sided"`` (top scores guessed IN) or ``"two_sided"`` (also the bottom
                scores guessed OUT, Steinke et al. Algorithm 1).
            strategy: :class:`FixedK`, :class:`Bonferroni` (default ``Bonferroni("grid")``) or
                :class:`RandomSplit`.
        """
        method, delta, alpha = check_bound_request(method, delta, alpha)
        if guesses not in GUESSES:
            raise ValueError(f"guesses must be one of {GUESSES}, got {guesses!r}")
        if strategy is None:
            strategy = Bonferroni()
        if not isinstance(strategy, (FixedK, Bonferroni, RandomSplit)):
            raise ValueError(
                f"strategy must be FixedK, Bonferroni or RandomSplit, got {strategy!r}"
            )
        g, m = self._game, self._game.m

        if isinstance(strategy, FixedK):
            kp, kn = strategy.resolve(guesses)
            if kp + kn > m:
                raise ValueError(
                    f"FixedK asks for k_pos + k_neg = {kp + kn} guesses but there are m = {m} "
                    f"canaries (k_pos={kp}, k_neg={kn})"
                )
            kpa, kna = np.array([kp]), np.array([kn])
            r, v = g.counts(kpa, kna)
            bound, _, mu = best_bound(method, m, r, v, alpha, delta)
            cert_m, a_test, n_cand, desc = m, alpha, 1, strategy.describe(guesses)
            sel = 0
            n_in_cert, n_out_cert = self.n_in, self.n_out
        elif isinstance(strategy, Bonferroni):
            kpa, kna, r, v, desc = self._bonferroni_candidates(strategy, guesses)
            n_cand = int(r.size)
            a_test = alpha / n_cand
            bound, sel, mu = best_bound(method, m, r, v, a_test, delta)
            sel = max(sel, 0)
            cert_m = m
            n_in_cert, n_out_cert = self.n_in, self.n_out
        else:
            bound, mu, cert_m, kpa, kna, r, v, desc, n_in_cert = self._random_split(
                strategy, method, guesses, alpha, delta)
            n_out_cert = cert_m - n_in_cert
            sel, a_test, n_cand = 0, alpha, 1

        # the ceiling of the audit as configured: its candidates, at their level, each with as
        # many right guesses as the IN / OUT counts allow (one-sided guesses can only be right
        # for the IN canaries); a perfect separation of the scores reaches it
        ceil_val = reachable_ceiling(method, cert_m, kpa, kna, n_in_cert, n_out_cert, a_test,
                                     delta)
        diag, diag_r = self._uncorrected(method, guesses, alpha, delta)
        res = OneRunResult(
            bound=float(bound),
            method=method,
            strategy=desc,
            guesses=guesses,
            m=int(cert_m),
            r=int(r[sel]),
            v=int(v[sel]),
            k_pos=int(kpa[sel]),
            k_neg=int(kna[sel]),
            alpha=alpha,
            alpha_per_test=float(a_test),
            delta=delta,
            ceiling=float(ceil_val),
            family=FDP_FAMILY_NOTE if method == "fdp" else None,
            mu=None if mu is None else float(mu),
            n_candidates=n_cand,
            m_total=m,
            uncorrected_best=float(diag),
            uncorrected_best_r=int(diag_r),
        )
        logger.info("one-run audit: %s", res)
        return res

    # -- strategies ------------------------------------------------------------------------------
    def _bonferroni_candidates(self, s: Bonferroni, guesses: str
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
        g, m = self._game, self._game.m
        c = s.candidates
        if c == "roc_hull":
            if guesses != "one_sided":
                raise ValueError("Bonferroni(candidates='roc_hull') supports guesses='one_sided' "
                                 f"only, got guesses={guesses!r}")
            r, v = g.roc_hull()
            desc = (f"Bonferroni over the {r.size} ROC-hull thresholds (jax_privacy semantics; "
                    "data-dependent count)")
            return r.copy(), np.zeros_like(r), r, v, desc
        if c in ("grid", "all"):
            rr = np.asarray(default_candidates(m) if c == "grid" else np.arange(1, m + 1),
                            dtype=np.int64)
            kp, kn = _split_counts(rr, guesses)
            shown = rr.tolist() if rr.size <= 12 else f"1..{m}"
            desc = f"Bonferroni over {rr.size} guess counts r in {shown}"
        else:
            kp_l, kn_l = [], []
            for x in c:
                if isinstance(x, tuple):
                    a, b = int(x[0]), int(x[1])
                    if guesses == "one_sided" and b > 0:
                        raise ValueError(f"guesses='one_sided' but candidate {x!r} has k_neg > 0")
                else:
                    (a,), (b,) = _split_counts(np.array([int(x)]), guesses)
                kp_l.append(int(a))
                kn_l.append(int(b))
                if a + b > m:
                    raise ValueError(f"candidate {x!r} asks for {a + b} guesses but m = {m}")
            kp, kn = np.array(kp_l, np.int64), np.array(kn_l, np.int64)
            desc = f"Bonferroni over {kp.size} stated candidates {list(c)}"
        r, v = g.counts(kp, kn)
        return kp, kn, r, v, desc

    def _random_split(self, s: RandomSplit, method: str, guesses: str, alpha: float, delta: float
                      ) -> tuple[float, float | None, int, np.ndarray, np.ndarray, np.ndarray,
                                 np.ndarray, str, int]:
        g, m = self._game, self._game.m
        m1 = int(math.floor(s.fraction * m))
        m2 = m - m1
        if m1 < 1 or m2 < 1:
            raise ValueError(f"RandomSplit(fraction={s.fraction}) leaves an empty half of m={m}")
        rng = np.random.default_rng(s.seed)
        perm = rng.permutation(m)
        g1 = g.subset(perm[:m1], rng)
        g2 = g.subset(perm[m1:], rng)
        rr = _diagnostic_candidates(m1)
        kp1, kn1 = _split_counts(rr, guesses)
        r1, v1 = g1.counts(kp1, kn1)
        _, j, _ = best_bound(method, m1, r1, v1, alpha, delta)
        if j < 0:  # nothing rejected on the selection half: certify the largest guess count
            j = int(rr.size - 1)
        kp2 = int(round(kp1[j] / m1 * m2))
        kn2 = int(round(kn1[j] / m1 * m2))
        if kp2 + kn2 < 1:
            kp2 = 1
        if kp2 + kn2 > m2:
            kp2 = m2 - kn2
        kpa, kna = np.array([kp2]), np.array([kn2])
        r2, v2 = g2.counts(kpa, kna)
        bound, _, mu = best_bound(method, m2, r2, v2, alpha, delta)
        desc = (f"RandomSplit(fraction={s.fraction}, seed={s.seed}): k chosen on {m1} canaries "
                f"(k_pos={int(kp1[j])}, k_neg={int(kn1[j])}), certified on the other {m2}")
        return bound, mu, m2, kpa, kna, r2, v2, desc, int(g2.labels.sum())

    def _uncorrected(self, method: str, guesses: str, alpha: float, delta: float
                     ) -> tuple[float, int]:
        rr = _diagnostic_candidates(self.m)
        kp, kn = _split_counts(rr, guesses)
        r, v = self._game.counts(kp, kn)
        b, j, _ = best_bound(method, self.m, r, v, alpha, delta)
        return b, (int(r[j]) if j >= 0 else 0)
