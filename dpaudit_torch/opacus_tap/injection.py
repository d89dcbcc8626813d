"""Canary injection through Opacus's own code path (the only place that edits gradients).

The :class:`Injector` composes strategy objects, one per concern, and owns what they share:

* :class:`~.plan.StepPlanner`: each logical step's role coins, Poisson inclusions and canary
  entries (one compiled call), from the auditor's own generator;
* the injection strategy whose :meth:`wrapper` the injector puts in front of the optimizer
  instance's clipping method, chosen by the Opacus mode: :class:`PerSampleInjection` (below) or
  :class:`~.ghost.GhostInjection`, which composes :class:`~.fsdp.ShardedInjection` on sharded
  parameters;
* the per-sample strategy composes :class:`~.shadow.ShadowClipper`, the canaries' clipping on a
  shadow of the optimizer.

The strategies reach the injector only through :class:`~.plan.InjectionHost` (the step's guards,
the wrapped method, the snapshot, where a step's plan and failures go) and the shadow through
:class:`~.shadow.WrappedClipping` (the wrapped method).

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
own part fails, and then takes itself out of the step (:mod:`.recovery`).

All randomness comes from the auditor's own CPU ``torch.Generator`` streams (role coins and
Poisson inclusion: ``mechanics``; IN/OUT: the secret coins), never from Opacus's noise generator
or the global RNG, so auditing does not perturb the noise stream and the draws are identical on
every device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._host_thread import run_here
from ..canaries import CanaryDesign, SecretCoins
from ..contract import StepRefused
from .errors import call_theirs
from .forms import bound_to, describe, resolve, run_swapped
from .ghost import GhostInjection
from .plan import (
    InjectionHost,
    StepPlan,
    StepPlanner,
    ends_logical_step,
    is_adaclip,
    is_ghost,
)
from .recovery import Added, noise_state
from .shadow import ShadowClipper

logger = logging.getLogger(__name__)

__all__ = ["Injector", "PerSampleInjection"]

_MISSING = object()  # no instance attribute


class PerSampleInjection:
    """The per-sample injection strategy (Opacus's ``hooks``, ``functorch``, ``ew`` modes; flat,
    per-layer and adaptive clipping): wraps ``clip_and_accumulate``.

    Public interface: :meth:`wrapper` (what the injector installs), :attr:`shadow` (the
    canaries' clipping) and the counter :attr:`compiled_adds`.

    Args:
        host: the injector (:class:`~.plan.InjectionHost`): guards, the wrapped method, the
            snapshot, where a step's plan and failures go.
        planner: draws each logical step's plan.
        optimizer: the Opacus ``DPOptimizer``.
        params: its trainable parameters, in ``optimizer.params`` order.
        injects: whether this rank adds canaries (DDP: rank 0 only).
        shadow: clips the canaries on a shadow of the optimizer and adds their sums.
    """

    kind = "per-sample"
    #: the optimizer method the wrapper stands in front of
    method_name = "clip_and_accumulate"

    def __init__(self, host: InjectionHost, planner: StepPlanner, optimizer: Any,
                 params: list[torch.nn.Parameter], injects: bool, shadow: ShadowClipper) -> None:
        self._host = host
        self._planner = planner
        self.optimizer = optimizer
        self.params = params
        self.injects = injects
        self.shadow = shadow
        # real examples and micro-batches since the last logical step
        self._rows_pending = 0
        self._micro_pending = 0

    @property
    def compiled_adds(self) -> int:
        """Steps whose canary sums the compiled pass added."""
        return self.shadow.compiled_adds

    def _count_micro(self, gs0: Any) -> None:
        """Count the real examples (rows) and micro-batches this clipping call covers."""
        self._micro_pending += len(gs0) if isinstance(gs0, list) else 1
        if isinstance(gs0, list):
            self._rows_pending += sum(int(g.shape[0]) for g in gs0)
        elif isinstance(gs0, torch.Tensor):
            self._rows_pending += int(gs0.shape[0])

    def _take_counts(self, rec: StepPlan) -> None:
        rec.n_real, rec.micro_steps = self._rows_pending, max(1, self._micro_pending)
        self._rows_pending = 0
        self._micro_pending = 0

    def wrapper(self) -> Any:
        """Stands in front of the optimizer's ``clip_and_accumulate``: at the end of a logical
        step the canaries are clipped (before the real examples: it reads only the rows and the
        optimizer's bounds, and leaves the optimizer's code warm for the real call), the real
        examples clipped and summed by the original, their sum read, and the canaries' clipped
        sums added.

        If the auditor's own part fails (:mod:`.recovery`), the auditor detaches
        (:meth:`~.plan.InjectionHost.report_failure`) and the real examples' sum is left as
        without the auditor: before the real call nothing was changed and the call runs;
        after it, what the canaries changed is put back bit for bit. With
        ``on_internal_error="continue"`` the step then goes on unaudited, else it raises before
        any noise or update."""
        host = self._host
        host.check_params()  # a refusal (StepRefused) before anything of the step runs
        original = host.original_method()
        failed: Exception | None = None
        try:
            # (on the auditor's host thread where it has one, as the part after the real call)
            planned = host.run_host(self._prepare)
        except Exception as e:
            failed, planned = e, None
        # the real examples, as without the auditor
        result = call_theirs(original, "clip_and_accumulate")
        if failed is not None:
            # reported after the real call: an error of the user's own code in that call (which
            # the canaries' clipping runs first) surfaces first, as without the auditor
            self._rows_pending = self._micro_pending = 0
            if host.report_failure(failed):
                return result
            raise failed
        if planned is None:
            return result
        rec, adds, joint = planned
        self._take_counts(rec)

        def read_and_add() -> None:
            read = host.read_real_sum
            rec.real_sum = read(rec) if read else None
            if adds is not None:
                # added at the canary coordinates after the real sum was read there; every
                # value changed is kept first, to be put back on a failure
                rec.added = Added()
                self.shadow.add(rec, adds, joint)
            host.finish_step(rec, adds is not None)

        try:
            host.run_host(read_and_add)
        except Exception as e:
            if rec.added is not None:
                rec.added.restore()
            if host.report_failure(e):
                return result
            raise  # before any noise or update
        return result

    def _prepare(self) -> tuple[StepPlan, list[torch.Tensor | None] | None, bool] | None:
        """Before the real call: the step's plan and, if this rank injects, the canaries'
        clipped sums (the shadow's layout with them); None when this call does not end a logical
        step or Opacus is about to refuse it (nothing is injected or recorded)."""
        params = self.params
        gs0 = getattr(params[0], "grad_sample", None) if params else None
        if gs0 is None or _already_processed(params):
            # let Opacus raise its own error (missing per-sample gradients, or zero_grad not
            # called)
            return None
        self._count_micro(gs0)
        if not ends_logical_step(self.optimizer):
            return None
        rec = self._planner.plan()
        if not self.injects:
            return rec, None, False
        # the canaries: one extra micro-batch of compact per-sample rows, clipped by the
        # optimizer's own clipping method on a shadow of the optimizer, their sums kept for
        # p.summed_grad
        gs = params[0].grad_sample
        ref0 = gs[-1] if isinstance(gs, list) else gs
        joint = self.shadow.joint()
        return rec, self.shadow.clip(rec, ref0.dtype, joint), joint


def _already_processed(params: list[torch.nn.Parameter]) -> bool:
    for p in params:
        gs = getattr(p, "grad_sample", None)
        items = gs if isinstance(gs, list) else [gs]
        for t in items:
            if t is None or hasattr(t, "_processed"):
                return True
    return False


class Injector:
    """Wraps the optimizer instance's ``clip_and_accumulate`` (or ``accumulate`` in ghost mode)
    with the wrapper of the strategy chosen for the Opacus mode.

    Composes :attr:`planner` (:class:`~.plan.StepPlanner`), :attr:`strategy`
    (:class:`PerSampleInjection` or :class:`~.ghost.GhostInjection`) and, in per-sample modes,
    :attr:`shadow` (:class:`~.shadow.ShadowClipper`); it is their
    :class:`~.plan.InjectionHost` and :class:`~.shadow.WrappedClipping`, and keeps the step
    bookkeeping (the pending plan, the insertion counters).

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
        #: draws each logical step's plan (the step's canaries: docs/design.md section 5)
        self.planner = StepPlanner(optimizer, params, design, coins, mechanics, sample_rate,
                                   device, ghost=self.ghost, injects=self.injects,
                                   data_parallel=self.data_parallel)
        #: the canaries' clipping on a shadow of the optimizer (per-sample modes; None: ghost)
        self.shadow: ShadowClipper | None = None
        #: the injection strategy whose wrapper stands in front of the optimizer's method
        self.strategy: PerSampleInjection | GhostInjection
        if self.ghost:
            self.strategy = GhostInjection(self, self.planner, optimizer, params, device,
                                           canary_norm, self.injects, layout)
        else:
            self.shadow = ShadowClipper(
                optimizer, params, device, canary_norm, self,
                joint_shadow=layout is None and len({(p.dtype, p.device) for p in params}) <= 1)
            self.strategy = PerSampleInjection(self, self.planner, optimizer, params,
                                               self.injects, self.shadow)
        self._attr = self.strategy.method_name
        # what the wrapper stands in front of: (instance attribute?, that attribute); the last
        # is the newest (a method installed after attach is adopted, :meth:`_adopt`), each
        # stands in front of the one before it
        self._saved: Any = None
        self._had_instance_attr = False
        self._below: list[tuple[bool, Any]] = []
        self._installed: Any = None  # the attribute attach put on the optimizer
        self._depth = 0  # nested calls of that attribute (a later method that calls it)
        #: how the clipping method was installed, in words (:func:`.forms.describe`)
        self.form = ""
        #: steps whose canaries were added already clipped (the optimizer's clipping could not
        #: be run on them, :mod:`.forms`), the first one's injected-step number and reason
        self.fallback_steps = 0
        self._fallback_first: tuple[int, str] | None = None
        self._replaced: list[str] = []  # methods installed after attach, in words
        self._attached = False
        self._pending: StepPlan | None = None
        self.on_inject: Callable[[StepPlan], None] | None = None
        self.insertions = 0  # canaries inserted (pairs + one-run), this rank
        self.one_run_insertions = 0
        self.steps_injected = 0
        self._param_ids = [id(p) for p in params]
        #: runs the auditor's part of a step (a function of no arguments) and returns its
        #: result: in place, or on the auditor's host thread (:mod:`dpaudit_torch._host_thread`;
        #: the adapter sets its ``run_host``)
        self.run_host: Callable[[Callable[[], Any]], Any] = run_here
        #: reads the real examples' clipped sum at the canary coordinates (set by the adapter:
        #: GradientReader.snapshot), right after the optimizer clipped and summed them
        self.read_real_sum: Callable[[StepPlan], torch.Tensor] | None = None
        #: called with the exception when the auditor's own part of a step fails (the auditor
        #: then detaches itself); returns True when the step is to go on without the auditor
        #: (``on_internal_error="continue"``); set by PrivacyAuditor
        self.on_failure: Callable[[BaseException], Any] | None = None
        #: keep the noise generator's state at every injected step (one process: a failure in
        #: the observation then recomputes the released gradient exactly, :mod:`.recovery`)
        self.keep_noise_state = layout is None and int(getattr(optimizer, "world_size", 1)) == 1

    # ------------------------------------------------------------------ attach / detach
    def attach(self, wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None
               ) -> None:
        """Put the strategy's wrapper in front of the optimizer instance's clipping method
        (``wrap``, if given, wraps the wrapper: benchmarks time it that way)."""
        opt = self.optimizer
        self._had_instance_attr = self._attr in vars(opt)
        self._saved = vars(opt).get(self._attr)
        self._below = []
        self.form = describe(self.original_method(), self._had_instance_attr)
        entry = self._entry
        self._installed = entry if wrap is None else wrap(entry)
        setattr(opt, self._attr, self._installed)
        self._attached = True

    def detach(self) -> None:
        """Restore the optimizer's clipping method as it was before :meth:`attach`, or the one
        installed since (the newest: the same object) (idempotent); a step in progress is
        forgotten."""
        if not self._attached:
            return
        self._check_installed(None)
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

    def _entry(self) -> Any:
        """What attach installs: the strategy's wrapper; a nested call (a method installed
        after attach that calls this one) or a call after detach runs what this stood in front
        of, as without the auditor."""
        chain = [*self._below, (self._had_instance_attr, self._saved)]
        level = self._depth + (0 if self._attached else min(1, len(chain) - 1))
        self._depth += 1
        try:
            if self._attached and level == 0:
                return self.strategy.wrapper()
            on_instance, saved = chain[-1 - level] if level < len(chain) else (False, None)
            return resolve(self.optimizer, self._attr, saved, on_instance)()
        finally:
            self._depth -= 1

    def _check_installed(self, passed: bool | None) -> None:
        """If the clipping method was replaced on the optimizer since attach (the step that
        just ran ``passed`` through the wrapper or not), adopt the new one (:meth:`_adopt`)."""
        if vars(self.optimizer).get(self._attr, _MISSING) is not self._installed:
            self._adopt(passed)

    def _adopt(self, passed: bool | None) -> None:
        """A method installed on the optimizer after attach (one dict look-up per step finds
        it): the wrapper goes back in front of it, so from the next step the canaries run
        through it too; it stays what detach restores. Said in the report
        (:meth:`clipping_notes`)."""
        opt = self.optimizer
        self._below.append((self._had_instance_attr, self._saved))
        self._had_instance_attr = self._attr in vars(opt)
        self._saved = vars(opt).get(self._attr)
        form = describe(self.original_method(), self._had_instance_attr)
        when = ("before detach" if passed is None else
                f"after injected step {self.steps_injected}" if passed else
                f"before the step following injected step {self.steps_injected}, which "
                f"therefore bypassed the audit")
        then = ("detach leaves it in place" if passed is None else
                "the auditor put its wrapper back in front of it, so the canaries go through it "
                "from the next step")
        self._replaced.append(
            f"the optimizer's {self._attr} was replaced after the auditor attached ({when}) by "
            f"{form}; {then}")
        logger.warning(self._replaced[-1])
        if self._attached:
            setattr(opt, self._attr, self._installed)

    def pop_plan(self) -> StepPlan | None:
        """The plan of the step whose clipping just ran (None if no step passed through the
        clipping since the last call); clears it. A clipping method installed on the optimizer
        since attach is adopted here (:meth:`_adopt`)."""
        rec, self._pending = self._pending, None
        if self._attached:
            self._check_installed(rec is not None)
        return rec

    # ------------------------------------------------------------------ what ran on the canaries
    @property
    def clipping_exercised(self) -> bool:
        """Whether every injected step's canaries went through the optimizer's clipping code
        (False under ghost clipping, or once a step fell back to already clipped canaries)."""
        return not self.ghost and self.fallback_steps == 0

    def clipping_notes(self) -> list[str]:
        """What the report must say about the clipping method's form: steps whose canaries
        could not be run through it (which check did not run and why), and methods installed
        after attach."""
        notes = list(self._replaced)
        if self._fallback_first is not None:
            first, why = self._fallback_first
            notes.append(
                f"clipping check not run at {self.fallback_steps} of {self.steps_injected} "
                f"injected step(s) (the first: injected step {first}): the optimizer's "
                f"{self._attr} ({self.form}) could not be run on the canaries: {why}. Those "
                f"steps' canaries were added already clipped, as a correct clipper would (as "
                f"under ghost clipping), so a clipping bug does not show in them; the other "
                f"checks are unaffected")
        return notes

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
        return None if self.shadow is None else self.shadow.rows_buffer

    @property
    def compiled_adds(self) -> int:
        """Steps whose canaries the compiled pass added to the summed gradient."""
        return self.strategy.compiled_adds

    def counters(self) -> dict[str, int]:
        """Insertions so far (this rank): canaries, one-run canaries, steps injected."""
        return {"insertions": self.insertions, "one_run_insertions": self.one_run_insertions,
                "steps_injected": self.steps_injected}

    def load_counters(self, counters: dict[str, int]) -> None:
        """Set the counters of :meth:`counters` (a resumed audit)."""
        self.insertions = int(counters["insertions"])
        self.one_run_insertions = int(counters["one_run_insertions"])
        self.steps_injected = int(counters["steps_injected"])

    # ------------------------------------------------------------------ the step plan
    def plan_next(self) -> StepPlan:
        """Draw the next logical step's plan (:meth:`~.plan.StepPlanner.plan`; it uses up that
        step's uniforms: tests compare streams with it)."""
        return self.planner.plan()

    def next_uniforms(self) -> np.ndarray:
        """The uniforms the next step would start from (a copy; tests compare streams)."""
        return self.planner.next_uniforms()

    def draw_position(self) -> tuple[torch.Tensor, int]:
        """(generator state, uniforms already used from it) that reproduce the coming draws
        exactly."""
        return self.planner.draw_position()

    def resume_draws(self, used: int) -> None:
        """The generator was just set to a block's start state: skip its first ``used``
        uniforms at the next draw."""
        self.planner.resume_draws(used)

    # ------------------------------------------------------------------ the wrapped method
    @property
    def method_name(self) -> str:
        """The optimizer method the wrapper stands in front of."""
        return self._attr

    @property
    def method_on_instance(self) -> bool:
        """Whether the wrapped method was an instance attribute of the optimizer at attach."""
        return self._had_instance_attr

    def original_method(self) -> Callable[[], Any]:
        """The method the wrapper stands in front of, as Python would call it: the instance
        attribute as stored (a function, closure, ``partial``, bound method), else the class's,
        looked up at call time, so that anything the class does (including a deliberately
        broken subclass from testing.bugs) runs."""
        return resolve(self.optimizer, self._attr, self._saved, self._had_instance_attr)

    def method_bound_to(self, target: Any) -> Callable[[], Any]:
        """The method the wrapper stands in front of, made to run on ``target`` (the shadow of
        the optimizer the canaries are clipped on): a function of the class bound to it; any
        other form (:mod:`.forms`) called as installed on the optimizer whose state is, for that
        call, ``target``'s."""
        if not self._had_instance_attr:
            bound = bound_to(self.optimizer, self._attr, target)
            if bound is not None:
                return bound
        fn, opt, state, params = self.original_method(), self.optimizer, vars(target), self.params

        def swapped() -> None:
            run_swapped(opt, fn, state, params)
        return swapped

    # ------------------------------------------------------------------ the strategies' host
    def check_params(self) -> None:
        """ValueError if the optimizer's trainable parameters are not those seen at attach
        (``add_param_group``, or ``requires_grad`` changed): canaries could not be placed or read
        consistently. Raised before anything of the step runs (state untouched)."""
        now = self.optimizer.params
        if len(now) != len(self._param_ids) or any(
                id(p) != i for p, i in zip(now, self._param_ids)):
            raise StepRefused(
                f"the optimizer's trainable parameters changed after the PrivacyAuditor was "
                f"attached ({len(self._param_ids)} tensors at attach, {len(now)} now: "
                f"add_param_group, or requires_grad changed); the audit cannot place or read its "
                f"canaries consistently. Nothing of this step was applied; detach() or "
                f"finalize() this auditor and attach a new one")

    def report_failure(self, exc: BaseException) -> bool:
        """The auditor's own part of a step failed: :attr:`on_failure` (which detaches). True
        when it says the step goes on as without the auditor, False when the caller raises."""
        return self.on_failure is not None and self.on_failure(exc) is True

    def finish_step(self, rec: StepPlan, injected: bool) -> None:
        """The step's plan is complete: count its canaries if this rank ``injected`` them
        (:attr:`on_inject` sees the plan), and keep it for :meth:`pop_plan`."""
        if injected:
            self.insertions += rec.n_rows
            self.one_run_insertions += rec.n_one_run
            self.steps_injected += 1
            if rec.clip_fallback is not None:
                self.fallback_steps += 1
                if self._fallback_first is None:
                    self._fallback_first = (self.steps_injected, rec.clip_fallback)
                    logger.warning(self.clipping_notes()[-1])
            if self.keep_noise_state:  # right before Opacus's noise: nothing draws in between
                rec.noise_state = noise_state(self.optimizer, self.params)
            if self.on_inject is not None:
                self.on_inject(rec)
        self._pending = rec
