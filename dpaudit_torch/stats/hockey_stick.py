"""Sequential hockey-stick test: bet directly on the events that define (eps, delta)-DP.

docs/design.md section 3. (eps, delta)-DP says, for every event E,

    P(E) <= e^eps Q(E) + delta   and   Q(E) <= e^eps P(E) + delta,

where P = law of A(S) (the ``x`` of each pair) and Q = law of A(S') (the ``y``). By the layer-cake
formula f = int_0^1 1{f > u} du the same holds for every *soft* set f: R -> [0, 1]:
E f(X) <= e^eps E f(Y) + delta. So for any f_t fixed before pair t is seen (built from pairs < t
only: *predictable*) the payoffs

    direction 1:  g_t  = f_t(x_t)  - e^eps f_t(y_t)  - delta
    direction 2:  g'_t = f'_t(y_t) - e^eps f'_t(x_t) - delta

have conditional mean <= 0 under H0 (only the marginals of x_t and y_t enter, so x_t and y_t may
be dependent). With indicator sets f_t = 1{E_t} these are exactly the event payoffs of section 3.
Every payoff lies in [-e^eps - delta, 1 - delta].

Betting (``bet="mixture"``, the default). The soft set already carries the stake: it is the
exponentially weighted mixture of *experts* (E, lambda_j), a candidate set E and a stake lambda_j
= r_j lambda_top from a grid fixed in advance (r_j = 1, 1/2, 1/4, 1/8, 1/16; lambda_top =
``max_stake`` / (e^eps + delta), max_stake = 0.7), f_t = sum_{E, j} w_t(E, j) r_j 1{E}, and each
component bets the fixed stake lambda_top on g_t = f_t(x_t) - e^eps f_t(y_t) - delta m_t, with
m_t = sum w_t(E, j) r_j the stake-weighted mass (so the empty set, abstaining, is charged
nothing). Then 1 + lambda_top g_t = sum_{E, j} w_t(E, j) (1 + lambda_j (1{x_t in E} - e^eps
1{y_t in E} - delta)) + w_t(empty): the wealth grows like a mixture of fixed-stake bettors, one
per (set, stake), and 1 + lambda_top g >= 1 - max_stake = 0.3 > 0. This replaces Online Newton
Step (Shekhar & Ramdas, IEEE Trans. IT 2023; ``bet="ons"``, the former default), whose stake
starts at 0 and needs tens of pairs to grow: on the Table-1 leaks the stake mixture rejects
after 20-25% fewer pairs (docs/statistics.md). The stake grid reaching 1/16 of lambda_top keeps
weak leaks detectable (their Kelly stake is small); a single fixed stake would lose them.

Validity: every w_t(E, j) is a function of pairs < t, the grid and its prior weights are fixed in
advance, so g_t is predictable; under H0 E[1{X in E} - e^eps 1{Y in E} - delta | past] <= 0 for
every E, hence E[g_t | past] = sum w r_j (P(E) - e^eps Q(E) - delta) <= 0, and the wealth
prod (1 + lambda_top g_t) is a nonnegative supermartingale. The average of the 2G wealths (two
directions times G grid points, uniform weights fixed in advance) is an e-process: Ville's
inequality gives P(sup_t mean wealth >= 1/alpha) <= alpha under H0 (testing by betting: Shafer
2021, JRSS-A; Waudby-Smith & Ramdas 2024, JRSS-B).

Unlike the MMD test (Gonzalez et al., NeurIPS 2025, arXiv 2509.07055) this test has no ceiling:
any violation of the (eps, delta) inequality by an event that the set learner can approximate is
eventually detected, including point masses (atoms) that the MMD bound cannot see.

Learning the sets (all predictable)
-----------------------------------
(The learner is the mixin :class:`~dpaudit_torch.stats._event_sets.EventSetLearner`.)
*Scores.* Every output v is mapped to S = 2 real scores: for d = 1, the value itself and its
distance |v - m| to the pooled median m of the past (half-lines of the first catch location
shifts, of the second changes of spread); for d > 1, after robust standardisation (pooled median
and 1.4826 MAD per coordinate, clipped at +-10), the projection on the difference of the past mean
of x and of y, and the distance to the pooled centre. The score parameters are refitted at each
refresh point from past pairs only. A user callable ``score(v: Tensor[n, d]) -> Tensor[n]``, or a
sequence of them, may be given instead (a fixed function that does not look at the stream).

*Grids, atoms, refreshes.* At refresh points t = burn_in, f burn_in, f^2 burn_in, ... (f =
``refresh_factor``, default 2) each score gets a grid: the midpoints at the pooled (x and y
together) empirical quantiles j/B, j = 1..B-1 (B = ``grid_cells``, at most the sample size), plus
every value repeated in the pooled sample (an atom; the ``max_atoms`` most frequent). With sorted
unique edges e_1 < ... < e_m a score s lies in cell 2i when exactly i edges are < s and s is not
an edge, and in cell 2i - 1 when s == e_i: an atom is always a cell of its own. Quantiles make the
grid invariant under monotone rescaling, so heavy tails (Cauchy) and scales of 1e-9 next to 1e9
are handled alike. Between refreshes the grids are fixed and the per-cell counts of past x and past
y are updated incrementally: the counts used for pair t cover exactly the pairs < t, also inside
one batch (exclusive cumulative sums over a chunk added to the counts of earlier chunks).

*Candidate sets.* For each score: every half-line {cell < k} and {cell >= k} of its grid (proper,
non-empty), every atom cell alone, and the empty set (abstain). For pair t each expert (E, j)
gets the plug-in log-growth of betting l = lambda_j on E, from the past counts
a = #{s < t: x_s in E}, b = #{s < t: y_s in E} (direction 1; x and y swapped for direction 2):

    t * J(E, l) = [a (t-b) log(1 + l(1-delta)) + b (t-a) log(1 - l(e^eps + delta))
                   + a b log(1 + l(1 - e^eps - delta)) + (t-a)(t-b) log(1 - l delta)] / t,

i.e. the in-sample log-wealth of betting l on E if x_s and y_s were independent. This Kelly
criterion prefers sets whose y-mass is small over the total-variation maximiser, which is what
makes the wealth grow fastest, picks the stake that would have grown the wealth fastest, and
abstains (empty set, log-weight 0) when no expert looks profitable.

*Soft set by exponential weights.* Rather than following the leader (the argmax, which jumps
between near-equivalent sets while few pairs are known), the weights are the Gibbs mixture
w_t(E, j) proportional to pi_j exp(eta t J(E, lambda_j)) (``eta``, default 1.5; the prior
pi_j = ``stake_weights``, default 1/2 on the largest stake and 1/8 on each other, is uniform over
the candidates and gives the empty set the weight of one candidate; eta = 1 would be the Bayes
mixture of the experts' plug-in wealths). It concentrates on the best expert as t grows and
hedges early on; f_t takes values in [0, 1], so the payoffs above apply. With ``bet="ons"`` (the
former default) there is one stake, lambda_max = 1 / (2 (e^eps + delta)), and ONS chooses the
bet on top.

Why this is valid: the grids for pair t are functions of the pairs before the last refresh point
(<= t - 1), the counts of the pairs < t, hence the weights, f_t (f'_t) and m_t are functions of
pairs < t only; E[g_t | past] = sum w r_j (P(E) - e^eps Q(E) - delta) <= 0 under H0, and the
stake is fixed (or, with ``bet="ons"``, the ONS bet is a function of pairs < t). Burn-in pairs
only fit the first grid and counts and are never bet on.

Cost: each refresh sorts the pooled history (O(t log t)); with geometric refresh points that is
amortised O(log t) per pair. Between refreshes each pair costs O(G S C L) device work
(C <= 2 (grid_cells + max_atoms) + 1 cells, L stakes: binary search, counts, weights), done for
a whole chunk at once with no Python loop over past pairs and no host synchronisation per pair;
only the wealth recursion runs pair by pair on the host (one transfer per chunk). On the CPU the
same payoffs come from two compiled pair-by-pair loops around one vectorised exponential
(``_payoffs_compiled``; fewer, larger operations, 3x faster in the hook's chunks of 80 pairs).
Memory is linear in the number of pairs (the history is kept for the refreshes). Results do not
depend on how the stream is batched (up to floating-point summation order, ~1e-15).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch

from .._compiled import compiled as kernels_compiled
from .._validation import check_positive_int
from .._vecmath import exp_
from ._event_sets import EventSetLearner, ScoreFn
from ._kernels import hockey_stick_cells_1d, hockey_stick_finish, hockey_stick_gaps
from .base import SequentialTest
from .betting import FixedStake, OnlineNewtonStep

logger = logging.getLogger(__name__)

__all__ = ["HockeyStickTest"]

#: stake ratios of the default bet="mixture" (fractions of the largest stake)
DEFAULT_STAKES: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125, 0.0625)
#: prior weights of those stakes, fixed in advance: half on the largest
DEFAULT_STAKE_WEIGHTS: tuple[float, ...] = (0.5, 0.125, 0.125, 0.125, 0.125)
#: the largest stake, as a fraction of the wealth-preserving bound 1 / (e^eps + delta)
DEFAULT_MAX_STAKE: float = 0.7

#: soft cap on the number of float64 entries of one chunk's candidate tensors
_CHUNK_BUDGET = 1 << 21


def _check_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


class HockeyStickTest(EventSetLearner, SequentialTest):
    """Anytime-valid sequential test of (eps, delta)-DP by betting on learned events.

    docs/design.md section 3 (this project's addition to the betting framework of Shekhar & Ramdas
    2023 and Gonzalez et al. 2025). See the module docstring for the construction and the proof
    of validity. Interface as :class:`~dpaudit_torch.stats.base.SequentialTest`: ``update(x, y)``
    with x ~ A(S), y ~ A(S'), then ``rejected``, ``rejected_at``, ``epsilon_lower_bound``,
    ``log_wealth``, ``state_dict`` / ``load_state_dict``.

    Args:
        epsilons: one epsilon or a grid; each finite and > 0.
        delta: one delta, or one per epsilon (e.g. a privacy profile), each in [0, 1).
        alpha: level of the test, in (0, 1).
        burn_in: pairs used only to fit the first grids (never bet on); >= 2. Default 4: the
            learner keeps refining its sets from every later pair, so a long burn-in only
            delays the bets (20 cost 9-13 more pairs on the Table-1 leaks with ``bet="ons"``;
            2 and 4 tie).
        score: ``"auto"`` (value and distance to the median for d = 1; projection and distance
            for d > 1), a callable ``score(v: Tensor[n, d]) -> Tensor[n]``, or a non-empty
            sequence of such callables.
        grid_cells: quantile cells per score grid (>= 2; half-line thresholds at its edges).
        eta: inverse temperature of the exponential weights over the (set, stake) experts
            (> 0; default 1.5: on the Table-1 leaks 1 costs 2-5 more pairs, 2 saves 1-2 on
            NonDPGaussian1 and costs 2-4 on NonDPLaplace1; 200 seeds).
        bet: ``"mixture"`` (default): bet the fixed stake ``max_stake / (e^eps + delta)`` on the
            stake-weighted soft sets (a mixture of fixed-stake experts; see the module
            docstring); ``"ons"``: one stake per set, bet chosen by Online Newton Step capped at
            1 / (2 (e^eps + delta)) (the former default; 20-25% more pairs on the Table-1
            leaks).
        stakes: the stake grid of ``bet="mixture"`` as fractions in (0, 1] of the largest
            stake; default (1, 1/2, 1/4, 1/8, 1/16). Smaller stakes keep weak leaks detectable.
        stake_weights: prior weights of the stakes (> 0, normalised; fixed in advance); default
            (1/2, 1/8, 1/8, 1/8, 1/8) with the default stakes, uniform with one's own.
        max_stake: the largest stake as a fraction of 1 / (e^eps + delta), in (0, 1); default
            0.7 (every wealth factor >= 0.3). The Table-1 Kelly stakes are 0.45-0.8 of it.
        refresh_factor: grids are refitted at burn_in * refresh_factor^k (> 1; default 2).
        max_atoms: at most this many repeated values get cells of their own, per score (>= 0).
        max_chunk: most pairs per vectorised chunk (memory vs overhead; the results do not
            depend on it beyond floating-point summation order).
        force_vectorised: compute the payoffs of CPU tensors with the vectorised chunk code that
            accelerators use, instead of the compiled pair-by-pair loops (same payoffs up to
            floating-point summation order, ~3x slower on the CPU; for tests and benchmarks).
        simultaneous, device, dtype: see :class:`~dpaudit_torch.stats.base.SequentialTest`
            (``simultaneous=True``, the default: the epsilon lower bound holds at level alpha
            simultaneously over the grid).

    Example::

        t = HockeyStickTest(epsilons=[0.5, 1.0], delta=[0.1, 0.02])
        t.update(x, y)          # x ~ A(S), y ~ A(S'), tensors [n] or [n, d]
        t.rejected, t.rejected_at, t.epsilon_lower_bound
    """

    kind = "hockey_stick"

    def __init__(
        self,
        epsilons: float | list[float] | np.ndarray | torch.Tensor,
        delta: float | list[float] | np.ndarray | torch.Tensor = 0.0,
        alpha: float = 0.05,
        burn_in: int = 4,
        *,
        score: str | ScoreFn | Sequence[ScoreFn] = "auto",
        grid_cells: int = 32,
        eta: float = 1.5,
        bet: str = "mixture",
        stakes: Sequence[float] | None = None,
        stake_weights: Sequence[float] | None = None,
        max_stake: float | None = None,
        refresh_factor: float = 2.0,
        max_atoms: int = 8,
        max_chunk: int = 512,
        force_vectorised: bool = False,
        simultaneous: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if isinstance(score, str):
            if score != "auto":
                raise ValueError(f"score must be 'auto', a callable or a sequence of callables, "
                                 f"got {score!r}")
            self._score_fns: list[ScoreFn] | None = None
        elif callable(score):
            self._score_fns = [score]
        elif (isinstance(score, Sequence) and len(score) > 0
              and all(callable(s) for s in score)):
            self._score_fns = list(score)
        else:
            raise TypeError(f"score must be 'auto', a callable or a non-empty sequence of "
                            f"callables, got {score!r}")
        self.grid_cells = check_positive_int(grid_cells, "grid_cells", minimum=2)
        self.eta = _check_real(eta, "eta")
        if self.eta <= 0:
            raise ValueError(f"eta must be > 0, got {eta!r}")
        if bet not in ("mixture", "ons"):
            raise ValueError(f"bet must be 'mixture' or 'ons', got {bet!r}")
        self.bet = bet
        #: delta charged on the soft set's mass (the mixture) or in full (ONS, as it always was:
        #: a checkpoint of an earlier release resumes to the same wealth)
        self._charge_mass = 1.0 if bet == "mixture" else 0.0
        if bet == "ons":
            if stakes is not None or stake_weights is not None or max_stake is not None:
                raise ValueError("stakes, stake_weights and max_stake apply to bet='mixture' "
                                 "only (bet='ons' learns one stake capped at 1/2)")
            ratios, weights, cap = (1.0,), (1.0,), 0.5
        else:
            ratios = DEFAULT_STAKES if stakes is None else stakes
            weights = (DEFAULT_STAKE_WEIGHTS if stakes is None and stake_weights is None
                       else (stake_weights if stake_weights is not None
                             else [1.0] * len(list(ratios))))
            cap = DEFAULT_MAX_STAKE if max_stake is None else max_stake
        self.stakes = tuple(_check_real(r, "stakes") for r in ratios)
        if not self.stakes or any(not (0.0 < r <= 1.0) for r in self.stakes):
            raise ValueError(f"stakes must be a non-empty sequence of ratios in (0, 1], got "
                             f"{stakes!r}")
        w = [_check_real(v, "stake_weights") for v in weights]
        if len(w) != len(self.stakes) or any(v <= 0 for v in w):
            raise ValueError(f"stake_weights must be {len(self.stakes)} numbers > 0, got "
                             f"{stake_weights!r}")
        self.stake_weights = tuple(v / sum(w) for v in w)
        self.max_stake = _check_real(cap, "max_stake")
        if not (0.0 < self.max_stake < 1.0):
            raise ValueError(f"max_stake must be in (0, 1), got {max_stake!r}")
        self.refresh_factor = _check_real(refresh_factor, "refresh_factor")
        if self.refresh_factor <= 1.0:
            raise ValueError(f"refresh_factor must be > 1, got {refresh_factor!r}")
        self.max_atoms = check_positive_int(max_atoms, "max_atoms", minimum=0)
        self.max_chunk = check_positive_int(max_chunk, "max_chunk", minimum=1)
        if not isinstance(force_vectorised, bool):
            raise TypeError(f"force_vectorised must be a bool, got {force_vectorised!r}")
        self.force_vectorised = force_vectorised
        super().__init__(epsilons, delta, alpha, burn_in, simultaneous=simultaneous,
                         device=device, dtype=dtype)
        ee, d = np.exp(self.epsilons), self.deltas
        self._exp_eps = ee
        top = self.max_stake / (ee + d)  # the largest stake; 1 + top * payoff >= 1 - max_stake
        # an expert (E, j) bets lambda_j = top * stakes[j] on E; its plug-in log-wealth
        # t J(E, lambda_j) = na c_a + nb c_b + (na nb / t) c_ab + t l_0 from
        # log(1 + lambda_j * payoff) for: x in E only, y in E only, both, neither
        blocks = []
        for r, pw in zip(self.stakes, self.stake_weights, strict=True):
            # bet="ons" compares the sets at the ONS cap 1 / (2 (e^eps + delta)), computed as it
            # always was, relative to the empty set charged delta like them (so no t term): the
            # same weights, bit for bit, as before the stake mixture
            lam = r * top if self.bet == "mixture" else 1.0 / (2.0 * (ee + d))
            l_a = np.log1p(lam * (1.0 - d))  # a in E, b not
            l_b = np.log1p(-lam * (ee + d))  # b in E, a not
            l_ab = np.log1p(lam * (1.0 - ee - d))  # both
            l_0 = np.log1p(-lam * d)  # neither
            c_a, c_b, c_ab = l_a - l_0, l_b - l_0, l_ab + l_0 - l_a - l_b
            # columns 0..G-1: (a, b) = (x, y) (direction 1); G..2G-1: (a, b) = (y, x)
            blocks.append(np.stack((
                self.eta * np.concatenate((c_a, c_b)), self.eta * np.concatenate((c_b, c_a)),
                self.eta * np.concatenate((c_ab, c_ab)),
                self._charge_mass * self.eta * np.concatenate((l_0, l_0)),
                np.full(2 * self.grid_size, math.log(pw)))))
        # [5, L * 2G]: column j * 2G + c is stake j, component c; features (na, nb, na nb / t,
        # t, 1)
        self._kelly_coef = torch.as_tensor(np.concatenate(blocks, axis=1), dtype=torch.float64)
        self._kelly_np = np.ascontiguousarray(self._kelly_coef.numpy())
        self._stake_ratio_t = torch.as_tensor(self.stakes, dtype=torch.float64)
        self._stake_ratio_np = np.asarray(self.stakes, dtype=np.float64)

    # ------------------------------------------------------------------ base-class hooks
    def _component_groups(self) -> np.ndarray:
        # component k = 2 g + direction (direction 0: x-heavy sets, 1: y-heavy sets)
        return np.repeat(np.arange(self.grid_size), 2)

    def _lambda_max(self) -> np.ndarray:
        # payoffs lie in [-(e^eps + delta), 1 - delta]: 1 + lambda g >= 1 - max_stake with this
        # cap (1/2 for bet="ons"); bet="mixture" bets exactly this stake on every payoff
        return np.repeat(self.max_stake / (np.exp(self.epsilons) + self.deltas), 2)

    def _make_bettor(self) -> OnlineNewtonStep | FixedStake:
        if self.bet == "ons":
            return OnlineNewtonStep(self._lambda_max())
        return FixedStake(self._lambda_max())

    def _payoff_upper_bound(self) -> np.ndarray:
        return np.repeat(1.0 - self.deltas, 2)

    def _config(self) -> dict[str, Any]:
        if self._score_fns is None:
            score: str | list[str] = "auto"
        else:
            score = [getattr(f, "__qualname__", type(f).__name__) for f in self._score_fns]
        return {
            "score": score,
            "grid_cells": self.grid_cells,
            "eta": self.eta,
            "bet": self.bet,
            "stakes": list(self.stakes),
            "stake_weights": list(self.stake_weights),
            "max_stake": self.max_stake,
            "refresh_factor": self.refresh_factor,
            "max_atoms": self.max_atoms,
        }

    def _reset_extra(self) -> None:
        self._hist_x: list[torch.Tensor] = []
        self._hist_y: list[torch.Tensor] = []
        self._t = 0  # pairs in the history (= pairs consumed, once the burn-in is over)
        self._next_refresh = self.burn_in
        self._refresh_points: list[int] = []
        self._score_params: dict[str, torch.Tensor] = {}
        self._edges: torch.Tensor | None = None  # [S, W] sorted edges, padded with +inf
        self._n_cells_s: torch.Tensor | None = None  # [S] cells of each score's grid
        self._atom_cell: torch.Tensor | None = None  # [S, C] bool: cell is an atom's own
        self._cnt_x: torch.Tensor | None = None  # [S * C] int64 counts of past x per cell
        self._cnt_y: torch.Tensor | None = None

    def _chunk_limit(self) -> int:
        V = self._n_scores * 3 * (self.grid_cells + 2 * self.max_atoms)  # >= candidates
        by_memory = max(1, _CHUNK_BUDGET // (self.grid_size * V * len(self.stakes)))
        end = self._next_refresh
        if self._t >= end:  # the next chunk starts with a refresh: it may run to the one after
            end = self._refresh_after(self._t)
        return max(1, min(self.max_chunk, by_memory, end - self._t))

    def _refresh_after(self, t: int) -> int:
        return max(t + 1, int(math.ceil(t * self.refresh_factor)))

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self._append_history(x, y)
        self._refresh()

    def _payoffs(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        if self._t >= self._next_refresh:
            self._refresh()
        n = int(x.shape[0])
        if self._t + n > self._next_refresh:  # the base honours _chunk_limit; be defensive
            raise RuntimeError("internal error: a chunk crosses a refresh point")
        dev = x.device
        S, C = self._n_scores, self._n_cells
        if self._use_compiled(dev) and self._score_fns is None and x.shape[1] == 1:
            # one-dimensional outputs on the CPU: the automatic scores (the value and its
            # distance to the centre, exact operations) and their cells in one compiled pass,
            # the same integers as the torch code gives, without its per-operation overhead
            return self._payoffs_compiled(x, y, *self._cells_1d_pair(x, y))
        cx = self._cells(self._scores(x))  # [n, S] cell of x_i in each score's grid
        cy = self._cells(self._scores(y))
        if self._use_compiled(dev):
            return self._payoffs_compiled(x, y, cx, cy)
        offs = torch.arange(S, device=dev) * C
        gx, gy = cx + offs, cy + offs  # ids into the flat [S * C] count tables
        # counts over pairs < i for each pair i of the chunk: earlier chunks + exclusive cumsum
        ohx = torch.zeros(n, S * C, dtype=torch.int64, device=dev)
        ohx.scatter_(1, gx, 1)
        ohy = torch.zeros(n, S * C, dtype=torch.int64, device=dev)
        ohy.scatter_(1, gy, 1)
        tab_x = (torch.cumsum(ohx, 0) - ohx + self._cnt_x).view(n, S, C)
        tab_y = (torch.cumsum(ohy, 0) - ohy + self._cnt_y).view(n, S, C)
        del ohx, ohy
        t_i = (self._t + torch.arange(n, device=dev)).to(torch.float64)  # pairs before pair i
        fx, fy, mass = self._soft_sets(tab_x, tab_y, cx, cy, t_i)  # [n, 2G] each
        G = self.grid_size
        del tab_x, tab_y
        ee = torch.as_tensor(self._exp_eps, dtype=torch.float64, device=dev)
        dd = torch.as_tensor(self.deltas, dtype=torch.float64, device=dev)
        if not self._charge_mass:  # bet="ons": delta charged in full, as before the mixture
            mass = torch.ones_like(mass)
        pay = torch.stack((fx[:, :G] - ee * fy[:, :G] - dd * mass[:, :G],  # direction 1
                           fy[:, G:] - ee * fx[:, G:] - dd * mass[:, G:]), dim=2)  # direction 2
        # state for the next chunk
        self._cnt_x = self._cnt_x + torch.bincount(gx.reshape(-1), minlength=S * C)
        self._cnt_y = self._cnt_y + torch.bincount(gy.reshape(-1), minlength=S * C)
        self._append_history(x, y)
        return pay.reshape(n, 2 * self.grid_size).cpu().numpy()  # one transfer per chunk

    def _completed_fingerprint(self, fp: dict[str, Any]) -> dict[str, Any]:
        """States saved before the stake mixture record no bet: they bet by ONS (one stake
        ratio 1 of weight 1, capped at 1/2), and resume as such."""
        if "config_bet" not in fp and "config_eta" in fp:
            fp.update(config_bet="ons", config_stakes=[1.0], config_stake_weights=[1.0],
                      config_max_stake=0.5)
        return fp

    def _use_compiled(self, dev: torch.device) -> bool:
        """CPU tensors go through the compiled pair-by-pair kernel; accelerators, and the CPU
        while the kernels run as Python (:mod:`dpaudit_torch._compiled`), keep the vectorised
        chunk computation (same payoffs up to floating-point summation order)."""
        return dev.type == "cpu" and not self.force_vectorised and kernels_compiled()

    def _edges_host(self) -> tuple[np.ndarray, float]:
        """The grids' edges [2, W] as a NumPy view and the automatic scores' centre, cached
        until the grids are refitted."""
        assert self._edges is not None
        c = self._score_params["center"]
        hit = self.__dict__.get("_edges_np")
        if hit is None or hit[0] is not self._edges or hit[1] is not c:  # refitted
            hit = (self._edges, c, np.ascontiguousarray(self._edges.numpy(), dtype=np.float64),
                   float(c.reshape(-1)[0]))
            self._edges_np = hit
        return hit[2], hit[3]

    def _cells_1d_pair(self, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_cells` of :meth:`_scores` for one-dimensional CPU outputs x and y [n, 1]
        with the automatic scores, in one compiled pass
        (:func:`~dpaudit_torch.stats._kernels.hockey_stick_cells_1d`; the same integers):
        [n, 2] int64 each."""
        edges, center = self._edges_host()
        n = int(x.shape[0])
        cx, cy = np.empty((n, 2), dtype=np.int64), np.empty((n, 2), dtype=np.int64)
        xs = np.ascontiguousarray(x.numpy()[:, 0], dtype=np.float64)
        ys = np.ascontiguousarray(y.numpy()[:, 0], dtype=np.float64)
        hockey_stick_cells_1d(xs, ys, edges, center, cx, cy)
        return cx, cy

    def _payoffs_compiled(self, x: torch.Tensor, y: torch.Tensor, cx: torch.Tensor | np.ndarray,
                          cy: torch.Tensor | np.ndarray) -> np.ndarray:
        """Host path of :meth:`_payoffs` (float64): compiled loops over the pairs
        (:mod:`~dpaudit_torch.stats._kernels`; counts updated pair by pair in place) around one
        vectorised exponential of the chunk's log-weights."""
        n = int(x.shape[0])
        assert self._cnt_x is not None and self._cnt_y is not None
        cnt_x = self._cnt_x.numpy()  # CPU int64: shares memory with the state tensors
        cnt_y = self._cnt_y.numpy()
        cxn = np.ascontiguousarray(cx if isinstance(cx, np.ndarray) else cx.numpy(),
                                   dtype=np.int64)
        cyn = np.ascontiguousarray(cy if isinstance(cy, np.ndarray) else cy.numpy(),
                                   dtype=np.int64)
        kind, score, k = self._cand_np
        G2 = 2 * self.grid_size
        gaps = np.empty((n, kind.size, self._kelly_np.shape[1]))
        top = np.empty((n, G2))
        hockey_stick_gaps(cxn, cyn, cnt_x, cnt_y, self._n_cells, kind, score, k,
                          self._kelly_np, self._t, gaps, top)
        exp_(gaps)  # vectorised (the faster library here); the compiled loops do the rest
        out = np.empty((n, G2))
        hockey_stick_finish(cxn, cyn, kind, score, k, gaps, top, self._stake_ratio_np,
                            self._exp_eps, self.deltas, self._charge_mass, out)
        self._append_history(x, y)
        return out

    # ------------------------------------------------------------------ diagnostics
    @property
    def n_refreshes(self) -> int:
        """How many times the grids were refitted (grows like log(t) / log(refresh_factor))."""
        return len(self._refresh_points)

    @property
    def refresh_points(self) -> list[int]:
        """Pairs consumed when each refit happened."""
        return list(self._refresh_points)

    def cells(self, scores: torch.Tensor) -> torch.Tensor:
        """Cells [n, S] of scores [n, S] in the current grids (docs/design.md section 3).

        A score with exactly i grid edges below it lies in cell 2i, unless it equals the edge
        e_i: then in cell 2i - 1 (so an atom is a cell of its own). Reading it does not change
        the test; the grids exist once the burn-in is complete.
        """
        if self._edges is None:
            raise RuntimeError("the grids are fitted at the end of the burn-in")
        s = torch.as_tensor(scores).to(device=self._edges.device, dtype=torch.float64)
        if s.ndim != 2 or s.shape[1] != self._edges.shape[0]:
            raise ValueError(f"scores must have shape [n, {self._edges.shape[0]}], got "
                             f"{tuple(s.shape)}")
        return self._cells(s)

    def diagnostics(self) -> dict[str, Any]:
        """The set learner's state, as copies on the test's device (white-box tests).

        Keys (tensors are ``None`` before the burn-in is complete): ``edges`` [S, W] (each
        score's sorted grid edges, padded with +inf), ``atom_cell`` [S, C] (bool: the cell is an
        atom's own), ``n_cells`` [S], ``cell_counts_x`` and ``cell_counts_y`` [S, C] (int64:
        pairs consumed so far, burn-in included, per score and cell), ``history_x`` and
        ``history_y`` [t, d] (the pairs kept for the refreshes, in the test's dtype) and
        ``score_params`` (the automatic scores' fitted parameters). Reading it does not change
        the test.
        """
        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.clone()

        C = self._n_cells
        return {
            "edges": copy(self._edges),
            "atom_cell": copy(self._atom_cell),
            "n_cells": copy(self._n_cells_s),
            "cell_counts_x": None if self._cnt_x is None else self._cnt_x.view(-1, C).clone(),
            "cell_counts_y": None if self._cnt_y is None else self._cnt_y.view(-1, C).clone(),
            "history_x": torch.cat(self._hist_x) if self._hist_x else None,
            "history_y": torch.cat(self._hist_y) if self._hist_y else None,
            "score_params": {k: v.clone() for k, v in self._score_params.items()},
        }

    # ------------------------------------------------------------------ internals
    @property
    def _n_scores(self) -> int:
        return 2 if self._score_fns is None else len(self._score_fns)

    @property
    def _n_cells(self) -> int:
        return 0 if self._atom_cell is None else int(self._atom_cell.shape[1])

    def _append_history(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self._hist_x.append(x)
        self._hist_y.append(y)
        self._t += int(x.shape[0])

    def _history(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._hist_x) > 1:
            self._hist_x = [torch.cat(self._hist_x)]
            self._hist_y = [torch.cat(self._hist_y)]
        return self._hist_x[0], self._hist_y[0]

    def _refresh(self) -> None:
        """Refit scores, grids and counts on every pair so far (all before the next pair)."""
        hx, hy = self._history()
        t = int(hx.shape[0])
        dev = hx.device
        if self._score_fns is None:
            self._fit_auto_score(hx, hy)
        sx, sy = self._scores(hx), self._scores(hy)  # [t, S]
        S = sx.shape[1]
        grids = [self._grid(torch.sort(torch.cat((sx[:, s], sy[:, s]))).values)
                 for s in range(S)]
        W = max(1, max(int(e.numel()) for e, _ in grids))
        C = 2 * W + 1
        edges = torch.full((S, W), math.inf, dtype=torch.float64, device=dev)
        atom_cell = torch.zeros(S, C, dtype=torch.bool, device=dev)
        n_cells = torch.zeros(S, dtype=torch.int64, device=dev)
        for s, (e, is_atom) in enumerate(grids):
            m = int(e.numel())
            edges[s, :m] = e
            atom_cell[s, 1 : 2 * m : 2] = is_atom
            n_cells[s] = 2 * m + 1
        self._edges, self._atom_cell, self._n_cells_s = edges, atom_cell, n_cells
        self._build_candidates()
        offs = torch.arange(S, device=dev) * C
        self._cnt_x = torch.bincount((self._cells(sx) + offs).reshape(-1), minlength=S * C)
        self._cnt_y = torch.bincount((self._cells(sy) + offs).reshape(-1), minlength=S * C)
        self._refresh_points.append(t)
        self._next_refresh = self._refresh_after(t)
        logger.debug("hockey-stick refresh at t=%d: %d scores, %d cells", t, S, C)

    # ------------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
            # a copy: the CPU path updates the counts in place
            return None if t is None else t.detach().cpu().clone()

        return {
            "hist_x": torch.cat(self._hist_x).cpu() if self._hist_x else None,
            "hist_y": torch.cat(self._hist_y).cpu() if self._hist_y else None,
            "t": self._t,
            "next_refresh": self._next_refresh,
            "refresh_points": list(self._refresh_points),
            "score_params": {k: v.detach().cpu() for k, v in self._score_params.items()},
            "edges": cpu(self._edges),
            "n_cells_s": cpu(self._n_cells_s),
            "atom_cell": cpu(self._atom_cell),
            "cnt_x": cpu(self._cnt_x),
            "cnt_y": cpu(self._cnt_y),
        }

    def _load_extra_state(self, sd: dict[str, Any]) -> None:
        dev = self._device or torch.device("cpu")

        def to(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dev)

        self._hist_x = [] if sd["hist_x"] is None else [sd["hist_x"].to(dev, self.dtype)]
        self._hist_y = [] if sd["hist_y"] is None else [sd["hist_y"].to(dev, self.dtype)]
        self._t = int(sd["t"])
        self._next_refresh = int(sd["next_refresh"])
        self._refresh_points = [int(v) for v in sd["refresh_points"]]
        self._score_params = {k: v.to(dev) for k, v in sd["score_params"].items()}
        self._edges = to(sd["edges"])
        self._n_cells_s = to(sd["n_cells_s"])
        self._atom_cell = to(sd["atom_cell"])
        # own copies: the CPU path updates the counts in place
        self._cnt_x = None if sd["cnt_x"] is None else sd["cnt_x"].to(dev, torch.int64).clone()
        self._cnt_y = None if sd["cnt_y"] is None else sd["cnt_y"].to(dev, torch.int64).clone()
        if self._atom_cell is not None:
            self._build_candidates()
