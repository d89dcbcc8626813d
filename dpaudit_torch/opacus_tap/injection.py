"""Canary injection through Opacus's own code path (the only place that edits gradients).

Hook points (Opacus 1.6, ``optimizers/optimizer.py``; see docs/auditor.md):

* per-sample modes (``hooks``, ``functorch``, ``ew``): the optimizer *instance's*
  ``clip_and_accumulate`` is wrapped. After the original has clipped and summed the real
  examples, ``p.grad_sample`` is set to the canary rows (one per injected canary, raw norm
  ``canary_norm * C`` at the canary's coordinate, zero elsewhere; ``C`` read at injection time:
  per-layer clipping reads ``max_grad_norms[i]``, adaptive clipping its current
  ``max_grad_norm``) and the original runs again: the canaries are one extra micro-batch of the
  logical step (the path ``BatchMemoryManager`` uses), clipped by the same code as every real
  example and accumulated into ``p.summed_grad``; then ``p.grad_sample`` is restored. A clipping
  bug therefore shows in the canaries. (Appending the rows to the real ones with ``torch.cat``
  would copy all B x d real per-sample gradients every step: 32 ms of a 144 ms step measured at
  batch 256.) The rows live in one persistent all-zero buffer: a step writes its k + (a few)
  entries, Opacus reads the rows, and exactly those entries are set back to zero, so no step
  allocates or clears R x d elements.
* ghost clipping (``DPOptimizerFastGradientClipping``): there are no per-sample gradients in the
  optimizer (clipping happens in the loss's second backward), so ``accumulate`` is wrapped and
  the *already clipped* canary, ``raw * min(1, C / (raw + 1e-6))`` exactly as Opacus's flat
  clipping would produce it, is added to ``p.summed_grad``. Clipping is then not exercised.

Injection happens only on the micro-batch that ends a logical step
(``optimizer._check_skip_next_step(pop_next=False)`` is False), so ``BatchMemoryManager`` gets one
set of canaries per logical step. Under DDP only rank 0 injects (``optimizer.rank``), while every
rank draws the same role coins, so that every rank can observe the same pairs after the
all-reduce.

All randomness comes from the auditor's own CPU ``torch.Generator`` streams (role coins and
Poisson inclusion: ``mechanics``; IN/OUT: the secret coins), never from Opacus's noise generator
or the global RNG, so auditing does not perturb the noise stream and the draws are identical on
every device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..canaries import CanaryDesign, SecretCoins
from ._step_kernels import plan_step

logger = logging.getLogger(__name__)

__all__ = ["StepPlan", "Injector", "is_ghost", "per_param_clip", "effective_noise_multiplier",
           "opacus_clipped_value"]

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


def _is_adaclip(optimizer: Any) -> bool:
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
        adaclip = _is_adaclip(optimizer)
    if adaclip and sigma > 0:
        return float((sigma ** -2 - (2.0 * float(optimizer.unclipped_num_std)) ** -2) ** -0.5)
    adj = getattr(optimizer, "_adjusted_noise_multiplier", None)
    if adj is not None:
        return float(adj)
    return sigma


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
    included: torch.Tensor | None = None  # [n] one-run canaries included (host; private)
    entry_param: np.ndarray | None = None  # [n_rows] parameter tensor of each row's entry
    entry_flat: np.ndarray | None = None  # [n_rows] flat index of each row's entry
    entry_index: np.ndarray | None = None  # [n_rows] position in the step's rows buffer
    pair_order: np.ndarray | None = None  # [2k] positions of (x_j), then (y_j), in [a, b]


class Injector:
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
    """

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter], design: CanaryDesign,
                 coins: SecretCoins, mechanics: torch.Generator, sample_rate: float,
                 canary_norm: float, device: torch.device) -> None:
        self.optimizer = optimizer
        self.params = params
        self.design = design
        self.coins = coins
        self.mechanics = mechanics
        self.sample_rate = float(sample_rate)
        self.canary_norm = float(canary_norm)
        self.device = device
        self.ghost = is_ghost(optimizer)
        self.adaclip = _is_adaclip(optimizer)
        self.rank = int(getattr(optimizer, "rank", 0))
        self.injects = self.rank == 0
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
        # the step's canary coordinates are computed on the host (numpy; k + a few entries) and
        # sent to the device in one small copy; per-sample modes write them into one persistent
        # zero buffer holding all canary rows of the step
        numel = [int(p.numel()) for p in params]
        off = [0]
        for n in numel[:-1]:
            off.append(off[-1] + n)
        self._offsets = off
        self._d_total = sum(numel)
        self._in_mask_np = coins.sampling_mask().numpy()  # shares memory with the private coins
        # design constants of plan_step in one array: pair_param, pair_a, pair_b (k each),
        # one_param, one_flat (m each), offsets, numel (one per parameter tensor)
        self._consts = np.concatenate([
            design.pair_param.numpy(), design.pair_a.numpy(), design.pair_b.numpy(),
            design.one_param.numpy(), design.one_flat.numpy(), np.asarray(off),
            np.asarray(numel)]).astype(np.int64)
        # uniforms drawn ahead for this many steps (at most ~2^16 numbers)
        self._draw_block = max(1, min(64, (1 << 16) // (self._k + design.m_canaries)))
        self._draws: np.ndarray | None = None
        self._draw_state: torch.Tensor | None = None
        self._draw_pos = 0
        self._resume_pos = 0
        self._zero_buf: torch.Tensor | None = None
        self._views: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self._ghost_values: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
        self._param_ids = [id(p) for p in params]
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
        k + m uniforms from the auditor's own stream (drawn in blocks of steps), one compiled
        call (:func:`~dpaudit_torch.opacus_tap._step_kernels.plan_step`) for coins, inclusions
        and the rows' entries."""
        opt = self.optimizer
        coins, included, e_param, e_flat, e_index, pair_order = plan_step(
            self.next_uniforms(), self._in_mask_np, self.sample_rate, self._consts, self._k,
            self.design.m_canaries, len(self.params))
        clip = per_param_clip(opt, len(self.params))
        if self.ghost:
            acc = 1
        else:  # Opacus's accumulated_iterations, read off one parameter (they all agree)
            gs = self.params[0].grad_sample
            acc = len(gs) if isinstance(gs, list) else 1
        world = int(getattr(opt, "world_size", 1))
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
            clip=clip,
            unit_scale=unit_scale,
            sigma=effective_noise_multiplier(opt, self.adaclip),
            sigma_claimed=float(opt.noise_multiplier),
            n_rows=self._k + n_one,
            n_one_run=n_one,
            injected=self.injects,
            included=torch.from_numpy(included),
            entry_param=e_param,
            entry_flat=e_flat,
            entry_index=e_index,
            pair_order=pair_order,
        )

    def next_uniforms(self) -> np.ndarray:
        """The next step's k + m uniforms. They are drawn from the ``mechanics`` generator for
        a block of steps at once (one call instead of one per step); the generator state at
        the block's start and the position in it make a checkpoint exact
        (:meth:`draw_position`, :meth:`resume_draws`)."""
        if self._draws is None or self._draw_pos >= self._draws.shape[0]:
            self._draw_state = self.mechanics.get_state()
            self._draws = torch.rand(self._draw_block, self._k + self.design.m_canaries,
                                     generator=self.mechanics, dtype=torch.float64).numpy()
            self._draw_pos = self._resume_pos
            self._resume_pos = 0
        u = self._draws[self._draw_pos]
        self._draw_pos += 1
        return u

    def draw_position(self) -> tuple[torch.Tensor, int]:
        """(generator state, steps already used) that reproduce the coming draws exactly."""
        if self._draws is None:
            return self.mechanics.get_state(), self._resume_pos
        assert self._draw_state is not None
        return self._draw_state, self._draw_pos

    def resume_draws(self, steps_used: int) -> None:
        """The generator was just set to a block's start state: skip its first ``steps_used``
        rows at the next draw."""
        if not 0 <= int(steps_used) < self._draw_block:
            raise ValueError(f"draw position {steps_used!r} outside [0, {self._draw_block})")
        self._draws, self._draw_state, self._draw_pos = None, None, 0
        self._resume_pos = int(steps_used)

    def _rows_buffer(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A persistent all-zero buffer of at least ``size`` elements.

        Each step writes its few canary entries and sets exactly those back to zero after
        Opacus has read the rows, so no step pays for zeroing R x d elements. It is sized for
        a few rows more than asked (the row count varies with the Poisson inclusions), not
        doubled: for a large model one row is the whole parameter count."""
        buf = self._zero_buf
        if buf is None or buf.dtype != dtype or buf.numel() < size:
            rows = -(-size // self._d_total)
            cap = (rows + max(4, rows // 8)) * self._d_total
            buf = torch.zeros(cap, dtype=dtype, device=self.device)
            self._zero_buf = buf
            self._views.clear()  # views of the old buffer
        return buf[:size]

    def _row_views(self, n_rows: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Per parameter, the [R, *shape] view of the rows buffer for R = ``n_rows`` rows
        (cached per R: a step then creates no tensors for its rows)."""
        key = (n_rows, dtype)
        views = self._views.get(key)
        if views is None:
            buf = self._rows_buffer(n_rows * self._d_total, dtype)
            views = [buf[n_rows * off:n_rows * (off + int(p.numel()))].view((n_rows,) + p.shape)
                     for off, p in zip(self._offsets, self.params)]
            self._views[key] = views
        return views

    # ------------------------------------------------------------------ the wrappers
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

    def _wrapper(self) -> Any:
        self.check_params()
        original = self.original_method()
        if not self._ends_logical_step():
            return original()
        params = self.params
        gs0 = getattr(params[0], "grad_sample", None) if params else None
        if gs0 is None or _already_processed(params):
            # let Opacus raise its own error (missing per-sample gradients, or zero_grad not
            # called): nothing is injected and nothing is recorded
            return original()
        try:
            rec = self._plan()
        except Exception as e:
            self._fail(e)
            raise
        result = original()  # the real examples, exactly as without the auditor
        if self.injects:
            # the canaries: one extra micro-batch of per-sample rows through the same clipping
            # code (as BatchMemoryManager's micro-batches are), accumulated into p.summed_grad.
            # Appending them to the real rows instead would copy every real per-sample
            # gradient (B x d) at every step.
            n_rows = rec.n_rows
            saved = [p.grad_sample for p in params]
            written: torch.Tensor | None = None
            views: list[torch.Tensor] = []
            try:
                ref0 = saved[0][-1] if isinstance(saved[0], list) else saved[0]
                index, which = rec.entry_index, rec.entry_param
                assert index is not None and which is not None
                views = self._row_views(n_rows, ref0.dtype)
                buf = self._zero_buf
                assert buf is not None
                written = torch.from_numpy(index)
                if written.device != buf.device:
                    written = written.to(buf.device, non_blocking=True)
                clip = rec.clip
                if all(c == clip[0] for c in clip):
                    buf.index_fill_(0, written, self.canary_norm * clip[0])
                else:
                    vals = torch.from_numpy(self.canary_norm * np.asarray(clip)[which])
                    buf.index_copy_(0, written, vals.to(device=buf.device, dtype=buf.dtype))
                for p, rows, gs in zip(params, views, saved):
                    ref = gs[-1] if isinstance(gs, list) else gs
                    if rows.dtype != ref.dtype or rows.device != ref.device:
                        rows = rows.to(device=ref.device, dtype=ref.dtype)  # a copy
                    p.grad_sample = rows
                original()
                self._count(rec)
                self._after_clip(rec)
            except Exception as e:
                # the auditor's part failed: per-sample gradients back (finally), the auditor
                # detaches itself, the step raises before any noise or update
                self._fail(e)
                raise
            finally:
                for p, gs in zip(params, saved):
                    p.grad_sample = gs
                for v in views:  # Opacus marks what it clipped; the cached views are reused
                    if hasattr(v, "_processed"):
                        del v._processed
                if written is not None and self._zero_buf is not None:
                    self._zero_buf.index_fill_(0, written, 0.0)  # all zeros again
        self._pending = rec
        return result

    def _after_clip(self, rec: StepPlan) -> None:
        """Keep adaptive clipping's unclipped-fraction estimate about real examples only."""
        opt = self.optimizer
        if self.injects and self.adaclip:
            # every canary row (raw norm canary_norm * C > C) is clipped, so it only inflated
            # the sample count; remove it so the clipping-bound update sees the real data only
            opt.sample_size -= rec.n_rows

    def _wrapper_ghost(self) -> Any:
        self.check_params()
        original = self.original_method()
        result = original()
        if not self._ends_logical_step():
            return result
        try:
            self._ghost_inject()
        except Exception as e:
            self._fail(e)
            raise
        return result

    def _ghost_inject(self) -> None:
        rec = self._plan()
        if self.injects:
            params, flats = rec.entry_param, rec.entry_flat
            assert params is not None and flats is not None
            order = np.argsort(params, kind="stable")
            counts = np.bincount(params, minlength=len(self.params))
            flat_sorted = torch.from_numpy(flats[order]).to(self.device, non_blocking=True)
            start = 0
            for i, cnt in enumerate(counts.tolist()):
                if not cnt:
                    continue
                p = self.params[i]
                sg = p.summed_grad
                if sg is None:
                    sg = torch.zeros_like(p)
                    p.summed_grad = sg
                f = flat_sorted[start:start + cnt]
                start += cnt
                if f.device != sg.device:
                    f = f.to(sg.device)
                val = self._ghost_value(rec.clip[i], sg)
                sg.view(-1).index_add_(0, f, val.expand(cnt))
            self._count(rec)
        self._pending = rec

    def _ghost_value(self, clip: float, like: torch.Tensor) -> torch.Tensor:
        """The clipped canary, ``raw * min(1, C / (raw + 1e-6))`` with ``raw = canary_norm * C``,
        computed in the gradient's dtype exactly as Opacus's flat clipping would (0-d tensor;
        cached per bound, dtype and device)."""
        key = (clip, like.dtype, like.device)
        val = self._ghost_values.get(key)
        if val is None:
            raw_t = torch.tensor(self.canary_norm * clip, dtype=like.dtype, device=like.device)
            val = (clip / (raw_t + OPACUS_NORM_EPS)).clamp(max=1.0) * raw_t
            if len(self._ghost_values) > 64:  # adaptive clipping: a new bound every step
                self._ghost_values.clear()
            self._ghost_values[key] = val
        return val

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
