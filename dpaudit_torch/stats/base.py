"""The machinery every sequential privacy test shares (docs/design.md sections 1 and 4).

A concrete test (MMD, hockey-stick) turns each incoming pair (x_t, y_t) into payoffs for K
e-process *components*, each attached to one grid point (eps_i, delta_i). This base class owns:

* argument validation (eps > 0, delta in [0, 1), alpha in (0, 1), burn_in >= 2);
* the pair stream: shapes [n] or [n, d], finiteness, batches processed pair by pair in order,
  the burn-in (pairs used only to fit hyper-parameters, never bet on);
* the bets (:class:`~dpaudit_torch.stats.betting.OnlineNewtonStep`, or a subclass's
  ``_make_bettor``, e.g. :class:`~dpaudit_torch.stats.betting.FixedStake`) and the log-wealth;
* the decision: the average of ALL components' wealths (an average of e-processes on one
  filtration is an e-process) compared with 1/alpha, so a whole grid (and both directions of DP)
  gives ONE level-alpha decision with no Bonferroni split;
* the per-grid-point tests (average of that point's components) and the empirical epsilon lower
  bound of section 4, in its anytime form, Bonferroni-simultaneous over the grid by default
  (``epsilon_lower_bound``; the per-point maximum, not a level-alpha bound over a grid, is
  ``epsilon_lower_bound_per_point``);
* ``state_dict`` / ``load_state_dict`` with a configuration fingerprint;
* read-only views for diagnostics and white-box tests: ``betting_state()``,
  ``component_groups``, ``payoff_upper_bound`` and the ``payoff_observer`` hook.

Subclasses implement ``_component_groups``, ``_lambda_max``, ``_payoff_upper_bound``,
``_fit_burn_in``, ``_payoffs`` (which must be *predictable*: the payoff of pair t may use pairs < t
only, also inside one chunk) and the state hooks.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._compiled import compiled
from .._validation import (
    check_alpha,
    check_deltas,
    check_epsilons,
    check_finite_tensor,
    check_positive_int,
)
from ._kernels import record_chunk
from .betting import FixedStake, OnlineNewtonStep, log_mean_exp

logger = logging.getLogger(__name__)

__all__ = ["SequentialTest", "CannotRejectWarning"]


class CannotRejectWarning(RuntimeWarning):
    """A grid point's null cannot be rejected by this test, whatever the data."""


class SequentialTest:
    """Base class: anytime-valid sequential test of (eps, delta)-DP on a stream of pairs.

    Args:
        epsilons: one epsilon or a sequence (the grid); each finite and > 0.
        delta: one delta for all grid points, or one per epsilon; each in [0, 1).
        alpha: level of the test, in (0, 1).
        burn_in: number of initial pairs used to fit hyper-parameters; never bet on (>= 2).
        simultaneous: True (default): ``epsilon_lower_bound`` and ``grid_rejected`` use
            alpha / len(grid) per grid point (Bonferroni), so the bound holds at level alpha
            simultaneously over the grid, which is what a reported bound needs. False: each
            grid point at level alpha on its own; the maximum over the grid is then NOT a
            level-alpha bound (only G x alpha bounds its error); that per-point bound is also
            always available as ``epsilon_lower_bound_per_point``. The combined decision
            ``rejected`` is always at level alpha (average of e-processes) whatever this flag.
        device: where the test's tensors live; default: the device of the first pairs given.
        dtype: floating type of the device computations (float64 by default).

    Attributes:
        payoff_observer: ``None`` (default) or a callable ``observer(start, payoffs)``, called
            with every chunk of payoffs just before the test bets on it: ``start`` is the number
            of pairs consumed before the chunk (burn-in included), so row i is pair
            ``start + i`` of the stream; ``payoffs`` is a read-only float64 array [n, K]
            (burn-in pairs are never bet on, hence never observed). For diagnostics and
            white-box tests; it does not change the bets or the decisions. Not part of the
            configuration (``state_dict`` ignores it).
    """

    #: name used in reports and in the state fingerprint
    kind: str = "sequential"

    def __init__(
        self,
        epsilons: float | list[float] | np.ndarray | torch.Tensor,
        delta: float | list[float] | np.ndarray | torch.Tensor = 0.0,
        alpha: float = 0.05,
        burn_in: int = 20,
        *,
        simultaneous: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.epsilons = check_epsilons(epsilons)
        self.deltas = check_deltas(delta, self.epsilons.size)
        self.alpha = check_alpha(alpha)
        self.burn_in = check_positive_int(burn_in, "burn_in", minimum=2)
        if not isinstance(simultaneous, bool):
            raise TypeError(f"simultaneous must be a bool, got {simultaneous!r}")
        self.simultaneous = simultaneous
        if dtype not in (torch.float64, torch.float32):
            raise TypeError(f"dtype must be torch.float64 or torch.float32, got {dtype!r}")
        self.dtype = dtype
        self.payoff_observer: Callable[[int, np.ndarray], None] | None = None
        self._device = torch.device(device) if device is not None else None
        self._groups = np.asarray(self._component_groups(), dtype=np.int64)
        # components laid out as G contiguous blocks of equal size c (both tests): the per-grid
        # wealth is then a reshape, not a loop over the grid
        G, K = self.grid_size, self._groups.size
        c = K // G if G and K % G == 0 else 0
        self._group_block = (c if c and np.array_equal(self._groups, np.repeat(np.arange(G), c))
                             else None)
        self._bets = self._make_bettor()
        ub = np.asarray(self._payoff_upper_bound(), dtype=np.float64)
        # a grid point whose every component has payoff <= 0 surely can never be rejected
        self.cannot_reject = np.array(
            [bool(np.all(ub[self._groups == g] <= 0.0)) for g in range(self.grid_size)]
        )
        if self.cannot_reject.any():
            bad = self.epsilons[self.cannot_reject].tolist()
            msg = (
                f"{type(self).__name__}: the null at epsilon(s) {bad} cannot be rejected by this "
                f"test whatever the data (its payoff is never positive); "
                f"see `cannot_reject` and the docs"
            )
            warnings.warn(msg, CannotRejectWarning, stacklevel=2)
            logger.warning(msg)
        self._reset_base()

    # ------------------------------------------------------------------ subclass interface
    def _component_groups(self) -> np.ndarray:
        """Grid index of each of the K e-process components (array [K])."""
        raise NotImplementedError

    def _lambda_max(self) -> np.ndarray:
        """Per-component bet cap guaranteeing 1 + lambda g > 0 for every possible payoff."""
        raise NotImplementedError

    def _make_bettor(self) -> OnlineNewtonStep | FixedStake:
        """The bettor of the K components: Online Newton Step capped at :meth:`_lambda_max`
        (a subclass whose payoffs carry their own stake may bet a fixed one instead)."""
        return OnlineNewtonStep(self._lambda_max())

    def _payoff_upper_bound(self) -> np.ndarray:
        """Per-component supremum of the payoff (<= 0 means the component can never win)."""
        raise NotImplementedError

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit hyper-parameters on the burn-in pairs (called once, with all of them)."""
        raise NotImplementedError

    def _payoffs(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Payoffs [n, K] of a chunk of pairs, predictable pair by pair; updates the state."""
        raise NotImplementedError

    def _chunk_limit(self) -> int:
        """How many pairs the next ``_payoffs`` call may take (e.g. up to a refresh point)."""
        return 1 << 30

    def _config(self) -> dict[str, Any]:
        """Subclass hyper-parameters that must match for a state to be loadable."""
        return {}

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, sd: dict[str, Any]) -> None:
        return None

    def _reset_extra(self) -> None:
        return None

    # ------------------------------------------------------------------ public API
    @property
    def grid_size(self) -> int:
        return int(self.epsilons.size)

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def n_pairs(self) -> int:
        """Pairs consumed so far, burn-in included."""
        return self._n_pairs

    @property
    def dim(self) -> int | None:
        return self._dim

    @property
    def n_components(self) -> int:
        """Number K of e-process components (a fixed number per grid point)."""
        return int(self._groups.size)

    @property
    def component_groups(self) -> np.ndarray:
        """Grid index of each of the K e-process components, int64 array [K] (a copy).

        Grid point g's test averages the wealths of the components with index g; the combined
        decision averages all K (docs/design.md sections 1 and 4).
        """
        return self._groups.copy()

    @property
    def payoff_upper_bound(self) -> np.ndarray:
        """Supremum of each component's payoff, float64 array [K] (a new array).

        A grid point whose components all have a bound <= 0 can never be rejected
        (``cannot_reject``).
        """
        return np.array(self._payoff_upper_bound(), dtype=np.float64)

    def betting_state(self) -> dict[str, np.ndarray]:
        """The Online Newton Step state of the K components, as copies (float64 arrays [K]).

        Keys: ``lambda_max`` (the bet caps, which keep 1 + lambda g > 0 for every possible
        payoff g), ``lam`` (the bets for the next pair), ``a_sum`` (the ONS sums A_t) and
        ``log_wealth`` (each component's log-wealth). See
        :class:`~dpaudit_torch.stats.betting.OnlineNewtonStep` and docs/design.md section 1.
        Reading it does not change the test.
        """
        b = self._bets
        return {
            "lambda_max": b.lambda_max.copy(),
            "lam": b.lam.copy(),
            "a_sum": b.a_sum.copy(),
            "log_wealth": b.log_wealth.copy(),
        }

    def reset(self) -> None:
        """Forget every pair (the configuration is kept)."""
        self._reset_base()

    def update(self, x: torch.Tensor, y: torch.Tensor) -> SequentialTest:
        """Consume n pairs (x[i], y[i]), i = 0..n-1, in order. x ~ A(S), y ~ A(S').

        ``x`` and ``y`` are tensors (or array-likes) of shape [n] or [n, d] with identical shape.
        Checking finiteness costs one host synchronisation per call, never one per pair.
        """
        self._consume(x, y, None)
        return self

    def update_with_trajectory(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Like :meth:`update`, and return the combined log-wealth after each of the n pairs.

        Array [n] (host, float64). Burn-in pairs are not bet on: they carry the wealth the test
        had before them. Lets a caller that feeds many pairs in one call (e.g. the training hook,
        k pairs per step) read the decision's e-process at every pair, not only at the end.
        """
        current = self.combined_log_wealth
        chunks: list[tuple[str, Any]] = []
        n = self._consume(x, y, chunks)
        out = np.empty(n)
        pos = 0
        for kind, item in chunks:
            if kind == "burn":
                out[pos : pos + item] = current
                pos += item
            elif item.size:
                out[pos : pos + item.size] = item
                pos += item.size
                current = float(item[-1])
        return out

    def _consume(self, x: Any, y: Any, chunks: list[tuple[str, Any]] | None) -> int:
        """Process pairs in order (burn-in, then betting chunks); optionally log the chunks."""
        x, y = self._as_pairs(x, y)
        n = int(x.shape[0])
        i = 0
        while i < n:
            if self._n_pairs < self.burn_in:
                take = min(n - i, self.burn_in - self._n_pairs)
                self._burn_x.append(x[i : i + take])
                self._burn_y.append(y[i : i + take])
                self._n_pairs += take
                if chunks is not None:
                    chunks.append(("burn", take))
                if self._n_pairs == self.burn_in:
                    bx, by = torch.cat(self._burn_x), torch.cat(self._burn_y)
                    self._burn_x, self._burn_y = [], []
                    self._fit_burn_in(bx, by)
                    self._fitted = True
            else:
                take = max(1, min(n - i, int(self._chunk_limit())))
                payoffs = self._payoffs(x[i : i + take], y[i : i + take])
                if self.payoff_observer is not None:
                    view = np.asarray(payoffs, dtype=np.float64).view()
                    view.flags.writeable = False
                    self.payoff_observer(self._n_pairs, view)
                traj = self._bets.run(payoffs)
                combined = self._record(traj)
                if chunks is not None:
                    chunks.append(("bet", combined))
            i += take
        return n

    @property
    def log_wealth(self) -> torch.Tensor:
        """Current log-wealth of each grid point's test, tensor [len(epsilons)]."""
        return torch.as_tensor(self._grid_log_wealth(self._bets.log_wealth), device=self._out_dev)

    @property
    def combined_log_wealth(self) -> float:
        """log of the average wealth over every component (the decision's e-process)."""
        return float(log_mean_exp(self._bets.log_wealth))

    @property
    def max_log_wealth(self) -> torch.Tensor:
        """Running maximum of each grid point's log-wealth, tensor [len(epsilons)]."""
        return torch.as_tensor(self._max_grid_lw.copy(), device=self._out_dev)

    @property
    def rejected(self) -> bool:
        """The decision at level alpha: has the combined wealth ever reached 1/alpha?"""
        return self._rejected_at is not None

    @property
    def rejected_at(self) -> int | None:
        """Pairs consumed (burn-in included) when the combined test first rejected, or None."""
        return self._rejected_at

    @property
    def grid_rejected(self) -> np.ndarray:
        """Per grid point: has its own test (level alpha/G if simultaneous, the default, or
        alpha) rejected?"""
        return self._grid_rejected_at >= 0

    @property
    def grid_rejected_at(self) -> list[int | None]:
        return [int(v) if v >= 0 else None for v in self._grid_rejected_at]

    @property
    def per_point_alpha(self) -> float:
        """Level of each grid point's own test: alpha / len(grid) if ``simultaneous`` (the
        default), else alpha."""
        return self.alpha / self.grid_size if self.simultaneous else self.alpha

    @property
    def epsilon_lower_bound(self) -> float:
        """Largest grid epsilon whose test has rejected so far (anytime form), 0.0 if none.

        With ``simultaneous=True`` (the default) each grid point is tested at
        alpha / len(grid), so under any DP mechanism the bound is positive with probability at
        most alpha over the whole run, simultaneously over the grid (docs/design.md section 4).
        With ``simultaneous=False`` it equals :attr:`epsilon_lower_bound_per_point`.
        """
        rej = self.grid_rejected
        return float(self.epsilons[rej].max()) if rej.any() else 0.0

    @property
    def epsilon_lower_bound_per_point(self) -> float:
        """Largest grid epsilon whose own test at level alpha has rejected so far, 0.0 if none.

        Each grid point's statement "not (eps_i, delta_i)-DP" holds at level alpha on its own,
        but the maximum over a grid of G points does NOT: under a DP mechanism it may be
        positive with probability up to G x alpha (docs/design.md section 4 gives measured
        rates). Use :attr:`epsilon_lower_bound` for a reported bound; this one is for reading
        a single grid point chosen in advance. Independent of ``simultaneous``.
        """
        rej = self._max_grid_lw >= math.log(1.0 / self.alpha)
        return float(self.epsilons[rej].max()) if rej.any() else 0.0

    @property
    def epsilon_lower_bound_current(self) -> float:
        """The paper's definition: max eps in the grid whose CURRENT wealth is >= 1/alpha'."""
        lw = self._grid_log_wealth(self._bets.log_wealth)
        rej = lw >= math.log(1.0 / self.per_point_alpha)
        return float(self.epsilons[rej].max()) if rej.any() else 0.0

    def summary(self) -> dict[str, Any]:
        """Plain-type summary for reports (host synchronisation)."""
        return {
            "test": self.kind,
            "epsilons": self.epsilons.tolist(),
            "deltas": self.deltas.tolist(),
            "alpha": self.alpha,
            "burn_in": self.burn_in,
            "simultaneous": self.simultaneous,
            "n_pairs": self._n_pairs,
            "rejected": self.rejected,
            "rejected_at": self._rejected_at,
            "combined_log_wealth": self.combined_log_wealth,
            "log_wealth": self._grid_log_wealth(self._bets.log_wealth).tolist(),
            "max_log_wealth": self._max_grid_lw.tolist(),
            "grid_rejected_at": self.grid_rejected_at,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "cannot_reject": self.cannot_reject.tolist(),
            **{f"config_{k}": v for k, v in self._config().items()},
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (plain types and CPU tensors; ``torch.save``-able)."""
        return {
            "fingerprint": self._fingerprint(),
            "n_pairs": self._n_pairs,
            "dim": self._dim,
            "fitted": self._fitted,
            "burn_x": [t.detach().cpu() for t in self._burn_x],
            "burn_y": [t.detach().cpu() for t in self._burn_y],
            "bets": self._bets.state_dict(),
            "rejected_at": self._rejected_at,
            "grid_rejected_at": self._grid_rejected_at.tolist(),
            "max_grid_lw": self._max_grid_lw.tolist(),
            "max_combined_lw": self._max_combined_lw,
            "extra": self._extra_state(),
        }

    def _completed_fingerprint(self, fp: dict[str, Any]) -> dict[str, Any]:
        """A saved fingerprint with the settings an earlier release did not record filled in
        with the values that release used (a subclass that adds a setting overrides this)."""
        return fp

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore a state made by ``state_dict`` of a test with the same configuration."""
        if not isinstance(sd, dict) or "fingerprint" not in sd:
            raise ValueError("not a state_dict of a dpaudit_torch sequential test")
        mine, theirs = self._fingerprint(), self._completed_fingerprint(dict(sd["fingerprint"]))
        if mine != theirs:
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            hint = ("; states saved with the former default simultaneous=False load into a test "
                    "built with simultaneous=False" if "simultaneous" in diff else "")
            raise ValueError(
                f"state_dict was made by a different test configuration (differs in {diff}: "
                f"{ {k: theirs.get(k) for k in diff} } vs this test's "
                f"{ {k: mine.get(k) for k in diff} }){hint}"
            )
        self._reset_base()
        self._n_pairs = int(sd["n_pairs"])
        self._dim = sd["dim"]
        self._fitted = bool(sd["fitted"])
        dev = self._device or torch.device("cpu")
        self._burn_x = [t.to(dev) for t in sd["burn_x"]]
        self._burn_y = [t.to(dev) for t in sd["burn_y"]]
        self._bets.load_state_dict(sd["bets"])
        self._rejected_at = sd["rejected_at"]
        self._grid_rejected_at = np.array(sd["grid_rejected_at"], dtype=np.int64)
        self._max_grid_lw = np.array(sd["max_grid_lw"], dtype=np.float64)
        self._max_combined_lw = float(sd["max_combined_lw"])
        self._load_extra_state(sd["extra"])

    # ------------------------------------------------------------------ internals
    @property
    def _out_dev(self) -> torch.device:
        return self._device or torch.device("cpu")

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "class": type(self).__name__,
            "epsilons": self.epsilons.tolist(),
            "deltas": self.deltas.tolist(),
            "alpha": self.alpha,
            "burn_in": self.burn_in,
            "simultaneous": self.simultaneous,
            "dtype": str(self.dtype),
            **{f"config_{k}": v for k, v in self._config().items()},
        }

    def _reset_base(self) -> None:
        self._n_pairs = 0
        self._dim: int | None = None
        self._fitted = False
        self._burn_x: list[torch.Tensor] = []
        self._burn_y: list[torch.Tensor] = []
        self._bets.reset()
        self._rejected_at: int | None = None
        self._grid_rejected_at = np.full(self.grid_size, -1, dtype=np.int64)
        self._max_grid_lw = np.zeros(self.grid_size)
        self._max_combined_lw = 0.0
        self._reset_extra()

    def _as_pairs(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        fast = self._as_pairs_host(x, y)
        if fast is not None:
            return fast
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(np.asarray(x, dtype=np.float64))
        if not isinstance(y, torch.Tensor):
            y = torch.as_tensor(np.asarray(y, dtype=np.float64))
        if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"x must hold real numbers, got dtype {x.dtype}")
        if not (y.is_floating_point() or y.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"y must hold real numbers, got dtype {y.dtype}")
        if x.shape != y.shape:
            raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        if x.ndim not in (1, 2):
            raise ValueError(f"pairs must have shape [n] or [n, d], got {tuple(x.shape)}")
        if self._device is None:
            self._device = x.device
        x = x.detach().to(device=self._device, dtype=self.dtype)
        y = y.detach().to(device=self._device, dtype=self.dtype)
        if x.ndim == 1:
            x, y = x.unsqueeze(1), y.unsqueeze(1)
        d = int(x.shape[1])
        if d == 0:
            raise ValueError("pairs must have at least one coordinate (got d = 0)")
        if self._dim is not None and d != self._dim:
            raise ValueError(f"pairs have dimension {d}, but this test has seen dimension "
                             f"{self._dim}")
        check_finite_tensor(x, "x")
        check_finite_tensor(y, "y")
        if self._dim is None and x.shape[0] > 0:
            # only a non-empty batch that passed every check fixes the dimension
            self._dim = d
        return x, y

    def _as_pairs_host(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_as_pairs` for the common case of a CPU float64 test fed CPU float64 tensors
        of a known dimension (the training hook's): the same checks, in NumPy on views of the
        tensors, without torch's per-call cost; None where any condition does not hold (the
        general path then runs and raises what it raises)."""
        dev = self._device
        if (dev is None or dev.type != "cpu" or self.dtype != torch.float64
                or type(x) is not torch.Tensor or type(y) is not torch.Tensor):
            return None
        try:
            xn, yn = x.numpy(), y.numpy()  # refuses tensors that need grad or are not on the CPU
        except (RuntimeError, TypeError):
            return None
        if (xn.dtype != np.float64 or yn.dtype != np.float64 or xn.shape != yn.shape
                or xn.ndim not in (1, 2) or (1 if xn.ndim == 1 else xn.shape[1]) != self._dim):
            return None
        if not (np.isfinite(xn).all() and np.isfinite(yn).all()):
            return None  # the general path names the bad values
        if xn.ndim == 1:
            return torch.from_numpy(xn.reshape(-1, 1)), torch.from_numpy(yn.reshape(-1, 1))
        return x, y

    def _grid_log_wealth(self, comp_lw: np.ndarray) -> np.ndarray:
        """Per grid point log-wealth (average over its components), for [K] or [n, K] input."""
        comp_lw = np.asarray(comp_lw, dtype=np.float64)
        c = self._group_block
        if c == 1:
            return comp_lw.copy()
        if c is not None:
            return log_mean_exp(comp_lw.reshape(comp_lw.shape[:-1] + (self.grid_size, c)),
                                axis=-1)
        out = np.empty(comp_lw.shape[:-1] + (self.grid_size,))
        for g in range(self.grid_size):
            out[..., g] = log_mean_exp(comp_lw[..., self._groups == g], axis=-1)
        return out

    def _record(self, traj: np.ndarray) -> np.ndarray:
        """Book-keep a chunk's log-wealth trajectory [n, K]; first crossings, running maxima.
        Returns the combined log-wealth after each pair, [n]."""
        n = traj.shape[0]
        start = self._n_pairs  # pairs consumed before this chunk
        self._n_pairs += n
        if n == 0:
            return np.empty(0)
        c = self._group_block
        if compiled() and c is not None and traj.ndim == 2 and traj.shape[1] > 0:
            # one compiled pass (a chunk is a few dozen pairs by a few components)
            combined = np.empty(n)
            first, top = record_chunk(np.ascontiguousarray(traj, dtype=np.float64), int(c),
                                      math.log(1.0 / self.alpha),
                                      math.log(1.0 / self.per_point_alpha), start,
                                      self._grid_rejected_at, self._max_grid_lw, combined)
            if self._rejected_at is None and first >= 0:
                self._rejected_at = start + first + 1
                logger.info("%s rejected H0 after %d pairs", type(self).__name__,
                            self._rejected_at)
            self._max_combined_lw = max(self._max_combined_lw, float(top))
            return combined
        combined = log_mean_exp(traj, axis=-1)
        thr = math.log(1.0 / self.alpha)
        if self._rejected_at is None:
            hits = np.nonzero(combined >= thr)[0]
            if hits.size:
                self._rejected_at = start + int(hits[0]) + 1
                logger.info("%s rejected H0 after %d pairs", type(self).__name__,
                            self._rejected_at)
        self._max_combined_lw = max(self._max_combined_lw, float(combined.max()))
        grid = self._grid_log_wealth(traj)
        self._max_grid_lw = np.maximum(self._max_grid_lw, grid.max(axis=0))
        thr_g = math.log(1.0 / self.per_point_alpha)
        hit = grid >= thr_g  # [n, G]: first crossings of the grid points not rejected before
        new = hit.any(axis=0) & (self._grid_rejected_at < 0)
        if new.any():
            self._grid_rejected_at[new] = start + hit.argmax(axis=0)[new] + 1
        return combined
