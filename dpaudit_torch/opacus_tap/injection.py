"""Canary injection through Opacus's own code path (the only place that edits gradients).

Hook points (Opacus 1.6, ``optimizers/optimizer.py``; see docs/auditor.md):

* per-sample modes (``hooks``, ``functorch``, ``ew``): the optimizer *instance's*
  ``clip_and_accumulate`` is wrapped. The wrapper clips the canaries, then the original clips
  and sums the real examples, the wrapper reads their sum at every canary coordinate (the
  snapshot of docs/design.md section 8, subtracted from the observation) and adds the canaries'
  clipped sums. The canaries are R *compact* rows (one per
  injected canary, raw norm ``canary_norm * C`` at the canary's coordinate, spread over L
  tensors for a spread canary; ``C`` read at injection time: per-layer clipping reads
  ``max_grad_norms[i]``, adaptive clipping its current ``max_grad_norm``) holding, per
  parameter tensor, only the coordinates this step's canaries occupy in it, clipped by the
  optimizer class's own ``clip_and_accumulate`` run on a shadow of the optimizer whose
  parameters are those compact tensors, and added to ``p.summed_grad`` at the canary
  coordinates (docs/design.md section 5, "Compact canary rows"; Opacus's own joint-norm
  clipping gets one shadow tensor for all of them, the same sums). A clipping bug of the class
  therefore shows in the canaries, and the memory and the clipping work are R x E numbers
  (E: the step's canary entries, about R), not R x d. The rows live in one persistent all-zero
  buffer: a step writes its entries and sets exactly those back to zero.
* ghost clipping (``DPOptimizerFastGradientClipping``): ``accumulate`` is wrapped and the
  already clipped canary is added after the real examples' sum has been read (:mod:`.ghost`;
  sharded parameters: :mod:`.fsdp`). Clipping is then not exercised.

Injection happens only on the micro-batch that ends a logical step
(``optimizer._check_skip_next_step(pop_next=False)`` is False), so ``BatchMemoryManager`` gets one
set of canaries per logical step. Under DDP only rank 0 injects (``optimizer.rank``), while every
rank draws the same role coins, so that every rank can observe the same pairs after the
all-reduce; on sharded parameters every rank injects the canaries its shard holds.

An exception raised by the wrapped method itself (Opacus, or the user's code it runs) gets a note
saying so (:mod:`.errors`) and leaves the auditor attached; the auditor detaches only when its
own part fails.

All randomness comes from the auditor's own CPU ``torch.Generator`` streams (role coins and
Poisson inclusion: ``mechanics``; IN/OUT: the secret coins), never from Opacus's noise generator
or the global RNG, so auditing does not perturb the noise stream and the draws are identical on
every device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..canaries import CanaryDesign, SecretCoins
from ._step_kernels import plan_step
from .errors import call_theirs
from .ghost import GhostInjection
from .plan import (
    StepPlan,
    effective_noise_multiplier,
    is_adaclip,
    is_ghost,
    per_param_clip,
)
from .shadow import ShadowClipping

logger = logging.getLogger(__name__)

__all__ = ["Injector", "DRAW_BLOCK"]

#: uniforms of the mechanics stream drawn at once (role coins and inclusions of many steps)
DRAW_BLOCK = 1 << 16

class Injector(GhostInjection, ShadowClipping):
    """Wraps the optimizer instance's ``clip_and_accumulate`` (or ``accumulate`` in ghost mode).

    Args:
        optimizer: an Opacus ``DPOptimizer`` (any subclass).
        params: the optimizer's trainable parameters, in ``optimizer.params`` order.
        design: the canary coordinates.
        coins: the secret IN/OUT coins of the one-run canaries.
        mechanics: CPU generator for role coins and Poisson inclusion.
        sample_rate: the data loader's Poisson rate (an IN canary's inclusion probability).
        canary_norm: raw canary norm as a multiple of the clipping bound.
        device: the parameters' device (where index tensors live).
        layout: where the shards of sharded (DTensor) parameters lie (:mod:`.fsdp`), or None.
    """

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter], design: CanaryDesign,
                 coins: SecretCoins, mechanics: torch.Generator, sample_rate: float,
                 canary_norm: float, device: torch.device, layout: Any = None) -> None:
        self.optimizer = optimizer
        self.layout = layout
        self.params = params
        self.design = design
        self.coins = coins
        self.mechanics = mechanics
        self.sample_rate = float(sample_rate)
        self.canary_norm = float(canary_norm)
        self.device = device
        self.ghost = is_ghost(optimizer)
        self.adaclip = is_adaclip(optimizer)
        self.rank = int(getattr(optimizer, "rank", 0))
        self.injects = self.rank == 0 or layout is not None
        #: D, the ranks whose clipped sums the released gradient averages (DDP: the world size;
        #: tensor parallelism: 1)
        self.data_parallel = (int(getattr(optimizer, "world_size", 1)) if layout is None
                              else int(layout.data_parallel))
        self._attr = "accumulate" if self.ghost else "clip_and_accumulate"
        self._saved: Any = None
        self._had_instance_attr = False
        self._attached = False
        self._pending: StepPlan | None = None
        self.on_inject: Callable[[StepPlan], None] | None = None
        self.insertions = 0  # canaries inserted (pairs + one-run), this rank
        self.one_run_insertions = 0
        self.steps_injected = 0
        self._k = design.k_pairs
        # the step's canary entries are computed on the host (one compiled call) and sent to
        # the device in one small copy. Per-sample modes do not build rows of the model's size:
        # a canary row is *compact*, holding per parameter tensor only the coordinates this
        # step's canaries occupy in it, and the rows are clipped by the optimizer's own clipping
        # method run on a shadow of the optimizer whose parameters are these compact tensors
        # (see _shadow_clip); the clipped sums are then added to p.summed_grad at the canary
        # coordinates.
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
        # shadow parameters: one per real tensor (False) or one for all (True, joint clipping)
        self._shadow_params: dict[bool, list[torch.nn.Parameter]] = {}
        self._shadow_base: torch.Tensor | None = None  # zeros the shadow parameters view
        # the base's views by size, and the size each shadow parameter holds now
        self._shadow_views: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None
        self._shadow_sizes: dict[bool, list[int]] = {}
        #: clip the canaries as one concatenated shadow tensor where the optimizer's clipping is
        #: Opacus's own joint-norm code (:func:`~.plan.joint_norm_clipping`; tests switch it off
        #: to compare with one shadow tensor per real one)
        self.joint_shadow = layout is None and len({(p.dtype, p.device) for p in params}) <= 1
        # the IN one-run canaries (ascending): only they can be included. Secret like the coins
        # (never logged or reported)
        self._in_index = np.ascontiguousarray(
            np.flatnonzero(coins.sampling_mask().numpy()).astype(np.int64))
        self._in_scratch = np.empty(max(1, self._in_index.size), dtype=np.int64)
        q = self.sample_rate
        self._log1m_q = math.log1p(-q) if q < 1.0 else -math.inf
        # the uniforms of the mechanics stream: one block of DRAW_BLOCK at a time (a step uses
        # k + 1 + its inclusions); the generator state at the block's start and the position in
        # it make a checkpoint exact (draw_position / resume_draws)
        self._draws: np.ndarray | None = None
        self._draw_state: torch.Tensor | None = None
        self._draw_pos = 0
        self._resume_pos = 0
        self._next_states: list[torch.Tensor] = []  # start states of appended blocks
        self._zero_buf: torch.Tensor | None = None
        self._zero_np: np.ndarray | None = None  # its NumPy view (CPU)
        self._joint_width = 0  # columns of the joint shadow tensor (only grows)
        #: clip the canaries with the compiled replica of Opacus's joint-norm clipping where it
        #: applies (ShadowClipping._replica; tests switch it off to compare with Opacus's call)
        self.replica_clip = True
        self._replica_ok = True  # no disagreement with Opacus's own call seen
        self._replica_steps = 0  # steps clipped by the replica (every 64th also by Opacus)
        self._replica_buf: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._clip_cache: dict[Any, Any] = {}  # the bounds as an array (write_rows)
        self._ghost_values: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
        self._param_ids = [id(p) for p in params]
        #: add the canaries' clipped sums in one compiled pass where it can (tests switch it off
        #: to compare with the torch path)
        self.compiled_add = True
        self.compiled_adds = 0  # steps whose canary sums the compiled pass added
        # real examples and micro-batches since the last logical step (ghost: rows unknown)
        self._rows_pending: int | None = None if self.ghost else 0
        self._micro_pending = 0
        #: reads the real examples' clipped sum at the canary coordinates (set by the adapter:
        #: GradientReader.snapshot), right after the optimizer clipped and summed them
        self.read_real_sum: Callable[[StepPlan], torch.Tensor] | None = None
        #: called with the exception when the auditor's own part of a step fails (the auditor
        #: then detaches itself); set by PrivacyAuditor
        self.on_failure: Callable[[BaseException], None] | None = None

    # ------------------------------------------------------------------ attach / detach
    def attach(self, wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None
               ) -> None:
        """Put the wrapper in front of the optimizer instance's clipping method (``wrap``, if
        given, wraps the wrapper: benchmarks time it that way)."""
        opt = self.optimizer
        self._had_instance_attr = self._attr in vars(opt)
        self._saved = vars(opt).get(self._attr)
        wrapper = self._wrapper_ghost if self.ghost else self._wrapper
        setattr(opt, self._attr, wrapper if wrap is None else wrap(wrapper))
        self._attached = True

    def detach(self) -> None:
        if not self._attached:
            return
        opt = self.optimizer
        if self._had_instance_attr:
            setattr(opt, self._attr, self._saved)
        else:
            try:
                delattr(opt, self._attr)
            except AttributeError:
                pass
        self._attached = False
        self._pending = None

    def pop_plan(self) -> StepPlan | None:
        """The plan of the step whose clipping just ran (None if no step passed through the
        clipping since the last call); clears it."""
        rec, self._pending = self._pending, None
        return rec

    @property
    def in_step(self) -> bool:
        """True between the clipping of a step and its observation (inside ``optimizer.step``)."""
        return self._pending is not None

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def rows_buffer(self) -> torch.Tensor | None:
        """The persistent canary-rows buffer (all zeros between steps), None before the first
        injection in a per-sample mode."""
        return self._zero_buf

    def counters(self) -> dict[str, int]:
        """Insertions so far (this rank): canaries, one-run canaries, steps injected."""
        return {"insertions": self.insertions, "one_run_insertions": self.one_run_insertions,
                "steps_injected": self.steps_injected}

    def load_counters(self, counters: dict[str, int]) -> None:
        self.insertions = int(counters["insertions"])
        self.one_run_insertions = int(counters["one_run_insertions"])
        self.steps_injected = int(counters["steps_injected"])

    # ------------------------------------------------------------------ the step plan
    def original_method(self) -> Callable[[], Any]:
        """The method the wrapper stands in front of, looked up at call time, so that anything
        the class does (including a deliberately broken subclass from testing.bugs) runs."""
        if self._had_instance_attr:
            return self._saved
        opt = self.optimizer
        return getattr(type(opt), self._attr).__get__(opt, type(opt))

    def _plan(self) -> StepPlan:
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
                self._spread_flat, self._spread_w, self._in_scratch)
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
            self._draws = torch.rand(DRAW_BLOCK, generator=self.mechanics,
                                     dtype=torch.float64).numpy()
            self._draw_pos = self._resume_pos
            self._resume_pos = 0
        return self._draws, self._draw_pos

    def _more_uniforms(self) -> None:
        """A step needs more uniforms than the block has left: append the next block (the
        buffer stays the stream from ``_draw_state``; the used blocks are dropped after the
        step, :meth:`_drop_used`)."""
        assert self._draws is not None
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

    def check_params(self) -> None:
        """ValueError if the optimizer's trainable parameters are not those seen at attach
        (``add_param_group``, or ``requires_grad`` changed): canaries could not be placed or read
        consistently. Raised before anything of the step runs (state untouched)."""
        now = self.optimizer.params
        if len(now) != len(self._param_ids) or any(
                id(p) != i for p, i in zip(now, self._param_ids)):
            raise ValueError(
                f"the optimizer's trainable parameters changed after the PrivacyAuditor was "
                f"attached ({len(self._param_ids)} tensors at attach, {len(now)} now: "
                f"add_param_group, or requires_grad changed); the audit cannot place or read its "
                f"canaries consistently. Nothing of this step was applied; detach() or "
                f"finalize() this auditor and attach a new one")

    def _fail(self, exc: BaseException) -> None:
        if self.on_failure is not None:
            self.on_failure(exc)

    def _ends_logical_step(self) -> bool:
        return not self.optimizer._check_skip_next_step(pop_next=False)

    def _count_micro(self, gs0: Any) -> None:
        """Count the real examples (rows) and micro-batches this clipping call covers."""
        self._micro_pending += len(gs0) if isinstance(gs0, list) else 1
        if self._rows_pending is not None:
            if isinstance(gs0, list):
                self._rows_pending += sum(int(g.shape[0]) for g in gs0)
            elif isinstance(gs0, torch.Tensor):
                self._rows_pending += int(gs0.shape[0])

    def _take_counts(self, rec: StepPlan) -> None:
        rec.n_real, rec.micro_steps = self._rows_pending, max(1, self._micro_pending)
        self._rows_pending = None if self.ghost else 0
        self._micro_pending = 0

    def _wrapper(self) -> Any:
        self.check_params()
        original = self.original_method()
        params = self.params
        gs0 = getattr(params[0], "grad_sample", None) if params else None
        if gs0 is None or _already_processed(params):
            # let Opacus raise its own error (missing per-sample gradients, or zero_grad not
            # called): nothing is injected and nothing is recorded
            return call_theirs(original, self._attr)
        self._count_micro(gs0)
        if not self._ends_logical_step():
            return call_theirs(original, self._attr)
        try:
            rec = self._plan()
        except Exception as e:
            self._fail(e)
            raise
        adds: list[torch.Tensor | None] | None = None
        joint = False
        failed: Exception | None = None
        if self.injects:
            # the canaries: one extra micro-batch of compact per-sample rows, clipped by the
            # optimizer's own clipping method on a shadow of the optimizer (before the real
            # examples: it reads only the rows and the optimizer's bounds, and leaves the
            # optimizer's code warm for the real call), their sums kept for p.summed_grad
            undo: Callable[[], None] | None = None
            try:
                gs = params[0].grad_sample
                ref0 = gs[-1] if isinstance(gs, list) else gs
                joint = self._joint()
                if self._replica_applies(joint, ref0.dtype):
                    adds = self._replica(rec, ref0.dtype)
                else:
                    views, undo = self._write_rows(rec, ref0.dtype, joint)
                    adds = self._shadow_clip(views, rec, joint)
            except Exception as e:
                failed = e  # raised after the real call: an error of the user's own code in
                # that call surfaces first, as without the auditor (with its note)
            finally:
                if undo is not None:
                    undo()  # the rows buffer all zeros again
        result = call_theirs(original, self._attr)  # the real examples, as without the auditor
        if failed is not None:
            # the auditor's part failed: the auditor detaches itself, the step raises before
            # any noise or update
            self._fail(failed)
            raise failed
        self._take_counts(rec)
        try:
            rec.real_sum = self.read_real_sum(rec) if self.read_real_sum else None
            if adds is not None:
                # added at the canary coordinates after the real sum was read there
                self._add_clipped(rec, adds, joint)
                self._count(rec)
        except Exception as e:
            # the step raises before any noise or update
            self._fail(e)
            raise
        self._pending = rec
        return result

    def _count(self, rec: StepPlan) -> None:
        self.insertions += rec.n_rows
        self.one_run_insertions += rec.n_one_run
        self.steps_injected += 1
        if self.on_inject is not None:
            self.on_inject(rec)


def _already_processed(params: list[torch.nn.Parameter]) -> bool:
    for p in params:
        gs = getattr(p, "grad_sample", None)
        items = gs if isinstance(gs, list) else [gs]
        for t in items:
            if t is None or hasattr(t, "_processed"):
                return True
    return False
