"""Facts about an Opacus DP optimizer that the adapter reads at each step, the step's
injection plan (:class:`StepPlan`), who draws it (:class:`StepPlanner`) and what an injection
strategy needs of the injector that composes it (:class:`InjectionHost`).

Opacus 1.6 (``optimizers/``): flat, per-layer (``max_grad_norms``), adaptive
(``AdaClipDPOptimizer``, its noise multiplier adjusted as in Andrew et al., NeurIPS 2021,
Theorem 1) and ghost (``DPOptimizerFastGradientClipping``) clipping.

All randomness of a plan comes from the auditor's own CPU ``torch.Generator`` stream
(``mechanics``: role coins and Poisson inclusion), never from Opacus's noise generator or the
global RNG, so auditing does not perturb the noise stream and the draws are identical on every
device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from .._buffers import host_zeros
from ..canaries import CanaryDesign, SecretCoins
from ._step_kernels import plan_step

__all__ = ["StepPlan", "StepPlanner", "InjectionHost", "is_ghost", "is_adaclip",
           "per_param_clip", "effective_noise_multiplier", "opacus_clipped_value",
           "OPACUS_NORM_EPS", "joint_norm_clipping", "ends_logical_step", "DRAW_BLOCK"]

#: uniforms of the mechanics stream drawn at once (role coins and inclusions of many steps)
DRAW_BLOCK = 1 << 16


#: the constant Opacus adds to per-sample norms before dividing (``optimizers/optimizer.py``)
OPACUS_NORM_EPS = 1e-6


def is_ghost(optimizer: Any) -> bool:
    from opacus.optimizers import DPOptimizerFastGradientClipping

    return isinstance(optimizer, DPOptimizerFastGradientClipping)


def per_param_clip(optimizer: Any, n_params: int) -> list[float]:
    """The clipping bound C_i that applies to each parameter tensor right now.

    Flat (and adaptive) clipping: one joint bound ``max_grad_norm`` (adaptive clipping changes it
    every step, so it is read at injection time). Per-layer clipping: ``max_grad_norms[i]``.
    """
    norms = getattr(optimizer, "max_grad_norms", None)
    if norms is not None:
        vals = [float(c) for c in norms]
        if len(vals) != n_params:
            raise RuntimeError(f"per-layer clipping has {len(vals)} bounds for {n_params} "
                               f"parameter tensors")
        return vals
    return [float(optimizer.max_grad_norm)] * n_params


#: what Opacus's own flat clipping (``DPOptimizer.clip_and_accumulate``) calls on ``self``
_STOCK_MEMBERS = ("clip_and_accumulate", "_get_flat_grad_sample", "grad_samples", "params",
                  "param_groups")
_stock: list[tuple[Any, ...]] = []


def _stock_members() -> tuple[Any, ...]:
    """Opacus's own functions behind :data:`_STOCK_MEMBERS` (empty when the class attribute is
    not code from Opacus's ``optimizers/optimizer.py``, e.g. patched before this import)."""
    if not _stock:
        from opacus.optimizers import optimizer as mod

        fns: list[Any] = []
        for name in _STOCK_MEMBERS:
            f = mod.DPOptimizer.__dict__.get(name)
            f = f.fget if isinstance(f, property) else f
            code = getattr(f, "__code__", None)
            if code is None or code.co_filename != mod.__file__ or (
                    f.__qualname__ != f"DPOptimizer.{name}"):
                fns = []
                break
            fns.append(f)
        _stock.append(tuple(fns))
    return _stock[0]


def joint_norm_clipping(optimizer: Any) -> bool:
    """True when the optimizer clips with Opacus's own ``DPOptimizer.clip_and_accumulate``:
    the class attribute and everything that method calls on ``self`` are Opacus's code (not an
    override, a subclass's or a patch), with one flat bound ``max_grad_norm``. That code clips
    each sample by the norm of the concatenation of its per-tensor gradients and treats every
    tensor alike, so clipping the canaries as one concatenated tensor gives the same sums
    (docs/design.md section 5, "Compact canary rows")."""
    stock = _stock_members()
    if not stock:
        return False
    cls = type(optimizer)
    for name, fn in zip(_STOCK_MEMBERS, stock):
        f = getattr(cls, name, None)
        if (f.fget if isinstance(f, property) else f) is not fn:
            return False
    return getattr(optimizer, "max_grad_norms", None) is None and isinstance(
        optimizer.max_grad_norm, (int, float))


def is_adaclip(optimizer: Any) -> bool:
    from opacus.optimizers import AdaClipDPOptimizer

    return isinstance(optimizer, AdaClipDPOptimizer)


def effective_noise_multiplier(optimizer: Any, adaclip: bool | None = None) -> float:
    """The noise multiplier the optimizer really uses for the gradient noise this step.

    Adaptive clipping (Andrew et al. 2021, Theorem 1) draws the gradient noise with
    ``(sigma^-2 - (2 sigma_u)^-2)^(-1/2)``; ghost clipping may carry an
    ``_adjusted_noise_multiplier``; otherwise it is ``noise_multiplier`` (what the accountant is
    told).
    """
    sigma = float(optimizer.noise_multiplier)
    if adaclip is None:
        adaclip = is_adaclip(optimizer)
    if adaclip and sigma > 0:
        return float((sigma ** -2 - (2.0 * float(optimizer.unclipped_num_std)) ** -2) ** -0.5)
    adj = getattr(optimizer, "_adjusted_noise_multiplier", None)
    if adj is not None:
        return float(adj)
    return sigma


def ends_logical_step(optimizer: Any) -> bool:
    """Whether the clipping call now running ends a logical step (Opacus's
    ``_check_skip_next_step(pop_next=False)`` is False): canaries are injected only then, so
    ``BatchMemoryManager`` gets one set of canaries per logical step."""
    return not optimizer._check_skip_next_step(pop_next=False)


def opacus_clipped_value(raw: float, clip: float) -> float:
    """What Opacus's flat clipping makes of a one-coordinate row of value ``raw``."""
    return raw * min(1.0, clip / (abs(raw) + OPACUS_NORM_EPS))


@dataclass
class StepPlan:
    """This step's injection plan: what the observer needs to read it (all small; tensors on
    the device)."""

    coins: torch.Tensor  # [k] bool on device: True -> the canary went to coordinate a_j
    coins_cpu: torch.Tensor  # [k] bool on host (same values)
    clip: list[float]  # C_i per parameter tensor at injection time
    unit_scale: list[float]  # per parameter: multiply p.grad by this to get units of C_i
    sigma: float  # effective noise multiplier of this step
    sigma_claimed: float  # the optimizer's noise_multiplier (what the accountant is told)
    n_rows: int  # canary rows (or clipped canaries, ghost) added this step
    n_one_run: int  # one-run canaries included this step
    injected: bool  # False on DDP ranks other than 0
    #: [k] the coins as a NumPy array (the memory ``coins_cpu`` views), None if not given
    coins_np: np.ndarray | None = None
    #: [n] one-run canaries included (host; private): :attr:`included` as a tensor
    included_np: np.ndarray | None = None
    #: [E] the parameter tensor of each canary entry (a row's entry; a spread row has L)
    entry_param: np.ndarray | None = None
    #: [E] each entry's flat index in its (real) tensor
    entry_flat: np.ndarray | None = None
    #: [E] each entry's position in the step's compact rows buffer (per-sample modes)
    entry_index: np.ndarray | None = None
    pair_order: np.ndarray | None = None  # [2k] positions of (x_j), then (y_j), in [a, b]
    #: [E] the weight of each entry (1 / sqrt(L) on spread rows), None when all are 1
    entry_weight: np.ndarray | None = None
    #: [n_params] entries per parameter tensor: the widths of its compact rows this step
    entry_counts: np.ndarray | None = None
    #: [E] the flat index of each column of the compact rows, tensor by tensor
    column_flat: np.ndarray | None = None
    #: [2k + m] the real examples' clipped sum / C at every canary coordinate, read before the
    #: canaries and the noise (summed over DDP ranks by the adapter before the observation)
    real_sum: torch.Tensor | None = None
    #: real examples clipped in this logical step, over all its micro-batches (per-sample
    #: modes: rows of ``p.grad_sample``; None under ghost clipping, whose optimizer never sees
    #: them)
    n_real: int | None = None
    #: micro-batches (clipping calls) that made up this logical step
    micro_steps: int = 1
    #: standard deviation of the Gaussian noise the optimizer should add, in the gradient's raw
    #: units: effective noise multiplier x the bound the noise is scaled with (``max_grad_norm``;
    #: per-layer clipping: the norm of the per-layer bounds)
    noise_std: float = 0.0
    #: [u] the real examples' raw sum at the noise-audit coordinates (snapshot)
    noise_real_sum: torch.Tensor | None = None
    #: (every tensor's ``summed_grad``, their flat NumPy views) as the snapshot read them
    #: (compiled CPU path only; None otherwise): the canaries' clipped sums are added through
    #: the views while the tensors are still the optimizer's
    summed_host: tuple[list[Any], tuple[np.ndarray, ...]] | None = None
    #: what the canaries changed in the summed gradients, with the values before
    #: (:class:`~.recovery.Added`; None until this rank adds canaries): a failure puts it back
    added: Any = None
    #: (noise generator, its state right before Opacus's noise) in one process, for
    #: :func:`~.recovery.take_out`; None where it is not kept or cannot be read
    noise_state: tuple[torch.Generator, torch.Tensor] | None = None
    #: why the optimizer's clipping could not be run on this step's canaries (they were added
    #: already clipped, :mod:`.forms`); None when it ran on them
    clip_fallback: str | None = None

    @property
    def included(self) -> torch.Tensor | None:
        """[n] int64 the one-run canaries included this step (host; a view of
        :attr:`included_np`, made when asked: the step itself reads the NumPy array)."""
        return None if self.included_np is None else torch.from_numpy(self.included_np)


class InjectionHost(Protocol):
    """What an injection strategy (:class:`~.injection.PerSampleInjection`,
    :class:`~.ghost.GhostInjection`) needs of the :class:`~.injection.Injector` that composes
    it: the step's guards, the method it stands in front of, the tap's snapshot, and where a
    step's plan and failures go. Looked up at call time, so that what the tap (or a benchmark)
    sets on the injector takes effect."""

    #: reads the real examples' clipped sum at the canary coordinates (docs/design.md section
    #: 8), set by the tap (``GradientReader.snapshot``); None: not read
    read_real_sum: Callable[[StepPlan], torch.Tensor] | None
    #: runs the auditor's part of a step (a function of no arguments), in place or on the
    #: auditor's host thread, and returns its result
    run_host: Callable[[Callable[[], Any]], Any]

    def check_params(self) -> None:
        """ValueError when the optimizer's trainable parameters changed since attach."""

    def original_method(self) -> Callable[[], Any]:
        """The optimizer's method the strategy's wrapper stands in front of (bound)."""

    def finish_step(self, rec: StepPlan, injected: bool) -> None:
        """The step's plan is complete (its canaries added when ``injected``): count it and keep
        it for the observation."""

    def report_failure(self, exc: BaseException) -> bool:
        """The auditor's own part of a step failed (the injector's owner detaches it): True when
        the step goes on as without the auditor, False when the strategy re-raises."""


class StepPlanner:
    """Draws each logical step's role coins and Poisson inclusions and fills its
    :class:`StepPlan` (docs/design.md section 5).

    The uniforms come from ``mechanics`` one block of :data:`DRAW_BLOCK` at a time (a step uses
    k + 1 + its inclusions); the generator state at the block's start and the position in it
    make a checkpoint exact (:meth:`draw_position` / :meth:`resume_draws`).

    Args:
        optimizer: the Opacus ``DPOptimizer`` (its bounds, noise and batch scaling are read at
            every plan).
        params: its trainable parameters, in ``optimizer.params`` order.
        design: the canary coordinates.
        coins: the secret IN/OUT coins of the one-run canaries (only IN ones can be included).
        mechanics: CPU generator for role coins and Poisson inclusion.
        sample_rate: the data loader's Poisson rate (an IN canary's inclusion probability).
        device: the parameters' device (where the coins of a plan are sent).
        ghost: ghost clipping (no per-sample gradients to count micro-batches from).
        injects: whether this rank adds canaries (the plans' ``injected``).
        data_parallel: D, the ranks whose clipped sums the released gradient averages.
    """

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter], design: CanaryDesign,
                 coins: SecretCoins, mechanics: torch.Generator, sample_rate: float,
                 device: torch.device, *, ghost: bool, injects: bool,
                 data_parallel: int) -> None:
        self.optimizer = optimizer
        self.params = params
        self.design = design
        self.mechanics = mechanics
        self.device = device
        self.ghost = ghost
        self.adaclip = is_adaclip(optimizer)
        self.injects = injects
        self.data_parallel = int(data_parallel)
        #: steps whose uniforms ran past the end of a block (the next block appended)
        self.block_crossings = 0
        self._k = design.k_pairs
        coord_param, coord_flat = design.coordinates()
        cp, cf = coord_param.numpy().astype(np.int64), coord_flat.numpy().astype(np.int64)
        # the plan's constants (plan_step): pair_param, pair_a, pair_b (k each), one_param,
        # one_flat (m each), flat indices in the real tensors
        self._consts = np.ascontiguousarray(np.concatenate([
            design.pair_param.numpy(), design.pair_a.numpy(), design.pair_b.numpy(),
            design.one_param.numpy(), design.one_flat.numpy()]).astype(np.int64))
        # spread pairs (docs/design.md section 11): the extra coordinates of each side
        side_a, side_b = design.spread_sides()
        extra = np.stack([side_a[:, 1:], side_b[:, 1:]], axis=1)  # [s, 2, L - 1]
        if extra.shape[2] == 0:
            extra = np.zeros((extra.shape[0], 2, 0), dtype=np.int64)
        self._spread_rows = np.ascontiguousarray(design.spread_pair.numpy().astype(np.int64))
        self._spread_param = np.ascontiguousarray(cp[extra])
        self._spread_flat = np.ascontiguousarray(cf[extra])
        self._spread_w = 1.0 / math.sqrt(design.spread_width)
        # the IN one-run canaries (ascending): only they can be included. Secret like the coins
        # (never logged or reported)
        # (a layered design, :mod:`dpaudit_torch.canary_layers`: the IN canaries, each
        # standing for its ``layer_width`` members, which share its coin)
        self._group = design.layer_width
        self._in_index = np.ascontiguousarray(np.flatnonzero(
            coins.sampling_mask().numpy()[:design.m_canaries // self._group]).astype(np.int64))
        self._in_scratch = np.empty(max(1, self._in_index.size), dtype=np.int64)
        q = float(sample_rate)
        self._log1m_q = math.log1p(-q) if q < 1.0 else -math.inf
        self._draws: np.ndarray | None = None
        self._block = host_zeros(DRAW_BLOCK)  # where each block is drawn (mapped pages)
        self._block_t = torch.from_numpy(self._block)
        self._draw_state: torch.Tensor | None = None
        self._draw_pos = 0
        self._resume_pos = 0
        self._next_states: list[torch.Tensor] = []  # start states of appended blocks

    def plan(self) -> StepPlan:
        """Draw this step's role coins and Poisson inclusions (host) and fill a StepPlan:
        k + 1 + (inclusions) uniforms from the auditor's own stream (drawn in blocks), one compiled
        call (:func:`~dpaudit_torch.opacus_tap._step_kernels.plan_step`) for coins, inclusions
        and the rows' entries (spread canaries included)."""
        opt = self.optimizer
        while True:
            draws, at = self._uniforms()
            (pos, coins, included, e_param, e_flat, e_weight, e_index, counts, col_flat,
             pair_order) = plan_step(
                draws, at, self._in_index, self._log1m_q, self._consts, self._k,
                self.design.m_canaries, len(self.params), self._spread_rows, self._spread_param,
                self._spread_flat, self._spread_w, self._in_scratch, self._group)
            if pos >= 0:
                break
            self._more_uniforms()
        self._draw_pos = pos
        self._drop_used()
        clip = per_param_clip(opt, len(self.params))
        if self.ghost:
            acc = 1
        else:  # Opacus's accumulated_iterations, read off one parameter (they all agree)
            gs = self.params[0].grad_sample
            acc = len(gs) if isinstance(gs, list) else 1
        world = self.data_parallel
        if opt.loss_reduction == "mean":
            denom = float(opt.expected_batch_size) * acc * world
        else:
            denom = float(world) if world > 1 else 1.0
        unit_scale = [denom / c if c > 0 else math.nan for c in clip]
        coins_cpu = torch.from_numpy(coins)
        n_one = int(included.shape[0])
        return StepPlan(
            coins=(coins_cpu if self.device.type == "cpu"
                   else coins_cpu.to(self.device, non_blocking=True)),
            coins_cpu=coins_cpu,
            coins_np=coins,
            clip=clip,
            unit_scale=unit_scale,
            sigma=(sigma := effective_noise_multiplier(opt, self.adaclip)),
            noise_std=sigma * float(opt.max_grad_norm),
            sigma_claimed=float(opt.noise_multiplier),
            n_rows=self._k + n_one,
            n_one_run=n_one,
            injected=self.injects,
            included_np=included,
            entry_param=e_param,
            entry_flat=e_flat,
            entry_index=e_index,
            pair_order=pair_order,
            entry_weight=e_weight if self._spread_rows.size else None,
            entry_counts=counts,
            column_flat=col_flat,
        )

    def _uniforms(self) -> tuple[np.ndarray, int]:
        """(the uniforms drawn so far, the position of the next unused one)."""
        if self._draws is None or self._draw_pos >= self._draws.shape[0]:
            self._draw_state = self.mechanics.get_state()
            # drawn into the buffer allocated with the planner (the same draws as a fresh
            # tensor): a block is 512 KiB, and one allocated at a step would outlive the step
            # among training's blocks on the heap (docs/auditor.md, "Memory")
            torch.rand(DRAW_BLOCK, generator=self.mechanics, dtype=torch.float64,
                       out=self._block_t)
            self._draws = self._block
            self._draw_pos = self._resume_pos
            self._resume_pos = 0
        return self._draws, self._draw_pos

    def _more_uniforms(self) -> None:
        """A step needs more uniforms than the block has left: append the next block (the
        buffer stays the stream from ``_draw_state``; the used blocks are dropped after the
        step, :meth:`_drop_used`)."""
        assert self._draws is not None
        self.block_crossings += 1
        self._next_states.append(self.mechanics.get_state())
        nxt = torch.rand(DRAW_BLOCK, generator=self.mechanics, dtype=torch.float64).numpy()
        self._draws = np.concatenate([self._draws, nxt])

    def _drop_used(self) -> None:
        """Forget the blocks a step has used up (their successors' start states known)."""
        while self._next_states and self._draw_pos >= DRAW_BLOCK:
            assert self._draws is not None
            self._draws = self._draws[DRAW_BLOCK:]
            self._draw_state = self._next_states.pop(0)
            self._draw_pos -= DRAW_BLOCK

    def next_uniforms(self) -> np.ndarray:
        """The uniforms the next step would start from (a copy; tests compare streams)."""
        draws, at = self._uniforms()
        return draws[at:at + self._k + 1].copy()

    def draw_position(self) -> tuple[torch.Tensor, int]:
        """(generator state, uniforms already used from it) that reproduce the coming draws
        exactly."""
        if self._draws is None:
            return self.mechanics.get_state(), self._resume_pos
        if self._draw_pos >= self._draws.shape[0]:  # all used: the next block starts here
            return self.mechanics.get_state(), 0
        assert self._draw_state is not None
        return self._draw_state, self._draw_pos

    def resume_draws(self, used: int) -> None:
        """The generator was just set to a block's start state: skip its first ``used``
        uniforms at the next draw."""
        if not 0 <= int(used) < DRAW_BLOCK:
            raise ValueError(f"draw position {used!r} outside [0, {DRAW_BLOCK})")
        self._draws, self._draw_state, self._draw_pos = None, None, 0
        self._next_states = []
        self._resume_pos = int(used)
