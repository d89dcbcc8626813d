"""``OpacusTap``: the auditor's only contact with Opacus.

It validates what ``make_private`` returned, injects the canaries through Opacus's own clipping
(:mod:`.injection`), reads the released gradient before the update (:mod:`.observation`), reads
the accountant (:mod:`.accountant`) and shares seeds and decisions across DDP ranks (:mod:`.ddp`).
On sharded parameters (Opacus FSDP2 or tensor-parallel ghost clipping) the canaries are injected
and read on the rank holding their shard (:mod:`.fsdp`).
Every Opacus private name the project relies on is used in this package and nowhere else:
``DPOptimizer._check_skip_next_step`` (is this micro-batch the end of a logical step),
``p.grad_sample`` / ``p.summed_grad`` (per-sample rows, pre-noise sum), ``_processed`` marks,
``original_optimizer`` (the step pre-hook), ``_adjusted_noise_multiplier``, and
``DPOptimizerFastGradientClipping`` / ``AdaClipDPOptimizer`` / ``DistributedPerLayerOptimizer``,
``FSDPOptimizerFastGradientClipping.grad_state`` (the sharded summed gradient) and the
``merge_flag`` Opacus's tensor-parallel ghost clipping sets on its parameters.

The accountant's step-hook slot is never touched (Opacus has only one, and replacing it would
silently switch off accounting).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .. import contract as facts
from .._compiled import set_compiled
from .._host_thread import HostThread
from ..canaries import CanaryDesign, SecretCoins
from ..contract import Fact, FactUnavailable, StepRecord
from .accountant import AccountantView
from .injection import Injector
from .observation import GradientReader
from .plan import StepPlan, effective_noise_multiplier, is_ghost
from .recovery import take_out

logger = logging.getLogger(__name__)

__all__ = ["OpacusTap"]

#: the attribute that marks an optimizer as audited (one auditor per optimizer)
OWNER_ATTR = "_dpaudit_auditor"


def _not_poisson_warning(data_loader: Any, rate: float) -> str:
    """The warning for a verified loader that is not Opacus's Poisson loader. One of fixed-size
    batches (``batch_size`` set) is what ``make_private`` was given (the loader from before
    it), or what it returned with ``poisson_sampling=False``: the warning says so."""
    name = type(data_loader).__name__
    bs = getattr(data_loader, "batch_size", None)
    if isinstance(bs, int) and not isinstance(bs, bool):
        what = (f"the data loader handed to the auditor ({name}, fixed batches of {bs}) is "
                f"not Opacus's Poisson loader: it is the loader from before make_private (or "
                f"one make_private returned with poisson_sampling=False); if training iterates "
                f"the Poisson loader make_private returned, pass that one")
    else:
        what = f"the data loader ({name}) is not Opacus's Poisson loader"
    return (f"{what}: its rate is taken as 1 / len(loader) = {rate:.4g}, as make_private does "
            f"for the accountant; the sampling audit checks whether its batches are Poisson "
            f"samples")


class OpacusTap:
    """Validates and wraps the Opacus objects of one training run.

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer.
        optimizer: the optimizer ``make_private`` returned (an Opacus ``DPOptimizer``).
        data_loader: the data loader ``make_private`` returned (its ``sample_rate`` is the Poisson
            rate really used).
        warn: receives messages for the report's warnings.

    Raises:
        TypeError / ValueError naming the bad object; nothing is changed on error.
    """

    def __init__(self, privacy_engine: Any, optimizer: Any, data_loader: Any,
                 warn: Callable[[str], None], model: Any = None, delta: float = 1e-5) -> None:
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                f"optimizer must be the DP optimizer returned by PrivacyEngine.make_private "
                f"(an opacus DPOptimizer), got {type(optimizer).__module__}."
                f"{type(optimizer).__name__}")
        if any(c.__name__ == "DistributedPerLayerOptimizer" for c in type(optimizer).__mro__):
            raise TypeError("DistributedPerLayerOptimizer clips inside backward hooks and is not "
                            "supported by the auditor")
        accountant = getattr(privacy_engine, "accountant", None)
        if accountant is None or not callable(getattr(accountant, "get_epsilon", None)):
            raise TypeError(f"privacy_engine must be an opacus PrivacyEngine (with an accountant),"
                            f" got {type(privacy_engine).__name__}")
        from .setup import check_setup

        #: what the audit takes from the engine and loader, checked against the optimizer
        self.setup = check_setup(privacy_engine, optimizer, data_loader,
                                 int(getattr(optimizer, "world_size", 1)))
        sample_rate = self.setup.rate
        self.poisson_loader = getattr(data_loader, "sample_rate", None) is not None
        if not self.poisson_loader and self.setup.loader_verified:
            # not Opacus's Poisson loader (poisson_sampling=False, a user's own sampler): the
            # sampling monitor tests whether the batches really are Poisson samples
            warn(_not_poisson_warning(data_loader, sample_rate))
        for problem in self.setup.problems:
            if problem.level != "note":
                warn(problem.message)
        other = getattr(optimizer, OWNER_ATTR, None)
        if other is not None and other.attached:
            raise ValueError("this optimizer already has a PrivacyAuditor attached; call its "
                             "detach() (or finalize()) before attaching another")
        params = list(optimizer.params)
        if not params:
            raise ValueError("the optimizer has no trainable parameters")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be the torch.nn.Module being trained (or None), got "
                            f"{type(model).__name__}")
        self.model = model
        self.delta = float(delta)
        self.privacy_engine = privacy_engine
        self.optimizer = optimizer
        self.data_loader = data_loader
        self.accountant = AccountantView(accountant, warn)
        self.sample_rate = sample_rate
        self.params = params
        self.rank = int(getattr(optimizer, "rank", 0))
        self.world_size = int(getattr(optimizer, "world_size", 1))
        #: the host thread of the auditor's per-step work while attached in Python-kernel mode
        #: (large models) where :meth:`host_thread_fits`, else None
        self.host_thread: HostThread | None = None
        self.ghost = is_ghost(optimizer)
        from .fsdp import detect_layout

        #: where the shards of sharded (DTensor) parameters lie; None without sharding
        self.layout = detect_layout(optimizer, params, self.rank, self.world_size)
        self.injector: Injector | None = None
        self.reader: GradientReader | None = None
        self._handle: Any = None
        self._owner: Any = None
        #: the accountant's step count when the audit began (its history is read from there)
        self.steps_at_attach = self.accountant.steps()

    # ------------------------------------------------------------------ facts
    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the trainable parameter tensors (``optimizer.params`` order)."""
        return [tuple(p.shape) for p in self.params]

    @property
    def n_records(self) -> int | None:
        """N, the size of the training set, where the data loader handed over is verified to
        be the training's (:mod:`.setup`); else None."""
        return self.setup.n_records

    def tensor_names(self) -> list[str]:
        """A name per parameter tensor: its module path in the model where the model was
        handed over (``model=``; wrapper prefixes such as Opacus's ``_module.`` removed), else
        its index; then its parameter group and shape, e.g. ``"head.weight (group 0, shape
        10x128)"`` or ``"tensor 8 (group 0, shape 10x128)"``."""
        groups = self.tensor_groups()
        paths: dict[int, str] = {}
        if self.model is not None:
            paths = {id(p): facts.module_path(n) for n, p in self.model.named_parameters()}
        return [f"{paths.get(id(p)) or f'tensor {i}'} (group {g}, shape "
                f"{'x'.join(map(str, s)) or 'scalar'})"
                for i, (p, g, s) in enumerate(zip(self.params, groups, self.shapes))]

    def tensor_groups(self) -> list[int]:
        """The optimizer parameter group of each parameter tensor."""
        where = {}
        for g, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                where[id(p)] = g
        return [where.get(id(p), 0) for p in self.params]

    @property
    def n_coordinates(self) -> int:
        return sum(p.numel() for p in self.params)

    @property
    def param_device(self) -> torch.device:
        return self.params[0].device

    def noise_multiplier(self) -> float:
        """The noise multiplier the optimizer really uses now (adaptive / ghost adjusted)."""
        return effective_noise_multiplier(self.optimizer)

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint's run must share with this one."""
        fp = {"parameter_shapes": [list(s) for s in self.shapes], "ghost": self.ghost,
              "sample_rate": self.sample_rate, "optimizer": type(self.optimizer).__name__}
        if self.layout is not None:  # the design is global: any world size resumes it
            fp["sharding"] = self.layout.kind
        return fp

    def answer(self, fact: Fact[Any]) -> Any:
        """The value of a fact a monitor needs (:mod:`dpaudit_torch.contract`), or
        :class:`~dpaudit_torch.contract.FactUnavailable` saying why it is not known."""
        if fact == facts.SAMPLE_RATE:
            return self.sample_rate
        if fact == facts.N_RECORDS:
            n = self.n_records
            if n is None:
                raise FactUnavailable(fact, self.setup.n_reason or "N is not known")
            return n
        if fact == facts.SETUP_CHECK:
            return self.setup.summary()
        if fact == facts.NOISE_MULTIPLIER:
            return self.noise_multiplier()
        if fact == facts.TENSOR_NAMES:
            return self.tensor_names()
        if fact == facts.TENSOR_GROUPS:
            return self.tensor_groups()
        if fact == facts.GROUP_NAMES:
            return [f"group {g}" for g in range(len(self.optimizer.param_groups))]
        if fact == facts.EPSILON_OF_SIGMA:
            return lambda sigma, steps: self.accountant.epsilon_for(
                sigma, self.sample_rate, steps, self.delta)
        if fact == facts.ACCOUNTANT_HISTORY:
            return lambda: self.accountant.history_since(self.steps_at_attach)
        if fact == facts.EPSILON_OF_HISTORY:
            return lambda h: self.accountant.epsilon_of_history(h, self.delta)
        if fact == facts.EPSILON_LOWER_OF_HISTORY:
            return lambda h: self.accountant.epsilon_lower_of_history(h, self.delta)
        if fact == facts.MODEL:
            if self.model is None:
                raise FactUnavailable(fact, "no model was handed to the auditor (pass "
                                            "model=... to PrivacyAuditor)")
            return self.model
        if fact == facts.OPTIMIZER_PARAMS:
            return list(self.params)
        if fact == facts.PARAM_GROUPS:
            return list(self.optimizer.param_groups)
        if fact == facts.DATA_LOADER:
            return self.data_loader
        if fact == facts.ACCOUNTANT_NAME:
            return self.accountant.name
        raise FactUnavailable(fact, f"{fact.meaning}: the Opacus adapter does not know it")

    def read_claim(self) -> tuple[int, float | None] | None:
        """(the accountant's step count, its epsilon at the audit's delta), or None before
        its first step."""
        steps = self.accountant.steps()
        if steps == 0:
            return None
        return steps, self.accountant.epsilon(self.delta)

    def share_seeds(self, seeds: dict[str, int], policy: str, seed: int | None,
                    warn: Callable[[str], None]) -> tuple[dict[str, int], str]:
        """Under DDP, rank 0's seeds on every rank (a collective every rank reaches); as they
        are without DDP."""
        if self.world_size == 1:
            return seeds, policy
        from .ddp import share_seeds

        return share_seeds(seeds, policy, seed is not None, self.rank, self.param_device, warn)

    def decision_sharer(self) -> Callable[[Any], tuple[bool, int | None, int | None]] | None:
        """Under DDP, a function taking this rank's decision and returning rank 0's
        ``(violation, violation_step, crossed_at)`` (one collective per check); None
        without DDP."""
        if self.world_size == 1:
            return None
        from .ddp import broadcast_decision

        dev = self.param_device
        return lambda d: broadcast_decision(d.violation, d.violation_step, d.crossed_at, dev)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The adapter's part of a checkpoint: where the canary mechanics' generator stands
        (the state of the current block of uniforms and how many it used), the injector's
        counters, the reader's count of reads, and the accountant's steps at attach."""
        inj = self.injector
        assert inj is not None
        rng_state, pos = inj.draw_position()
        return {"mechanics_rng": rng_state, "mechanics_pos": pos, "mechanics_unit": "uniforms",
                "injector": inj.counters(),
                "reads": self.reader.reads if self.reader is not None else 0,
                "steps_at_attach": self.steps_at_attach}

    @staticmethod
    def mechanics_of_state(sd: dict[str, Any]) -> torch.Generator:
        """The canary mechanics' generator of a checkpoint (its block start)."""
        gen = torch.Generator()
        gen.set_state(sd["mechanics_rng"])
        return gen

    def load_state_dict(self, sd: dict[str, Any], draws_per_step: int) -> None:
        """After :meth:`build` with :meth:`mechanics_of_state`'s generator: move the draws
        to where the checkpoint stood, restore the counters. ``draws_per_step``: the uniforms
        a step used in layouts that counted steps instead of uniforms."""
        inj, reader = self.injector, self.reader
        assert inj is not None and reader is not None
        unit = 1 if sd.get("mechanics_unit") == "uniforms" else draws_per_step
        inj.resume_draws(int(sd["mechanics_pos"]) * unit)
        inj.load_counters(sd["injector"])
        reader.reads = int(sd["reads"])
        self.steps_at_attach = int(sd["steps_at_attach"])

    # ------------------------------------------------------------------ wiring
    def build(self, design: CanaryDesign, coins: SecretCoins, mechanics: torch.Generator,
              canary_norm: float, device: torch.device,
              on_failure: Callable[[BaseException], Any],
              noise_coords: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """(Re)build the injector and the reader for a canary design (not attached yet)."""
        inj = Injector(self.optimizer, self.params, design, coins, mechanics, self.sample_rate,
                       canary_norm, device, layout=self.layout)
        inj.on_failure = on_failure
        inj.run_host = self.run_host
        model = self.model
        if model is not None and hasattr(inj.strategy, "model_norms"):
            # ghost clipping: Opacus's wrapped model keeps the per-sample norms of its last
            # backward pass (the real examples' count where the parameters carry none)
            inj.strategy.model_norms = lambda: getattr(model, "_per_sample_gradient_norms", None)
        old = self.reader  # a rebuild (resume) keeps how the reader was set to read
        self.injector = inj
        finite = old.check_finite_every_step if old is not None else device.type == "cpu"
        # the one-pass CPU read (compiled kernels, or vectorised NumPy in Python mode)
        compiled = old.compiled if old is not None else True
        if self.layout is None:
            self.reader = GradientReader(self.params, design, device,
                                         check_finite_every_step=finite, compiled=compiled,
                                         noise_coords=noise_coords)
        else:
            from .fsdp import ShardedGradientReader, summed_grad_of

            opt = self.optimizer
            self.reader = ShardedGradientReader(
                self.params, design, device, finite, compiled, noise_coords, self.layout,
                lambda p: summed_grad_of(opt, p))
        if old is not None:
            self.reader.pack_gathers = old.pack_gathers
        inj.read_real_sum = self.reader.snapshot

    @property
    def attached(self) -> bool:
        return self.injector is not None and self.injector.attached

    def host_thread_fits(self) -> bool:
        """Whether the auditor's per-step work may run on a host thread of its own
        (:mod:`dpaudit_torch._host_thread`): one process (no collectives to order across
        threads) and every parameter on the CPU (a CUDA stream is per thread)."""
        return (self.world_size == 1 and self.layout is None
                and all(p.device.type == "cpu" for p in self.params))

    def run_host(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the host thread while attached with one (the caller waits), else in
        place: the injector's part of a step, the observation, the post-update hook."""
        thread = self.host_thread
        return fn() if thread is None else thread.call(fn)

    def attach(self, owner: Any, pre_hook: Callable[..., Any],
               wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
               post_hook: Callable[[bool], Any] | None = None, *, compiled: bool) -> None:
        """Wrap the clipping and register the observation pre-hook; all or nothing. ``compiled``:
        the audit's kernel mode, set process-wide here (``set_compiled``; in Python mode, where
        :meth:`host_thread_fits`, the host thread starts here too); every attach passes it, so
        no caller attaches in the process's mode instead of the audit's. ``wrap``
        wraps the injection wrapper (benchmarks time it). ``post_hook``: called with True after
        every update of ``original_optimizer`` (its step post-hook; a failure there goes to the
        injector's ``on_failure`` like any failure of the auditor inside a step) and once with
        False here, when watching starts."""
        assert self.injector is not None
        other = getattr(self.optimizer, OWNER_ATTR, None)
        if other is not None and other is not owner and other.attached:
            raise ValueError("this optimizer already has a PrivacyAuditor attached; call its "
                             "detach() (or finalize()) before attaching another")
        try:
            set_compiled(bool(compiled))
            self.injector.attach(wrap)
            self._handle = self.optimizer.original_optimizer.register_step_pre_hook(pre_hook)
            if post_hook is not None:
                self._post_handle = self.optimizer.original_optimizer.register_step_post_hook(
                    self._after_update(post_hook))
                post_hook(False)
            setattr(self.optimizer, OWNER_ATTR, owner)
            self._owner = owner
            if not compiled and self.host_thread_fits() and self.host_thread is None:
                self.host_thread = HostThread()
        except BaseException:
            self.detach()
            raise

    def _after_update(self, post_hook: Callable[[bool], Any]) -> Callable[..., None]:
        """The step post-hook calling ``post_hook(True)``; the auditor's own failure there is
        handled as inside the step (detach; raise unless training is to go on)."""

        def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
            try:
                self.run_host(lambda: post_hook(True))
            except Exception as e:
                inj = self.injector
                if inj is None or inj.on_failure is None or inj.on_failure(e) is not True:
                    raise

        return hook

    def detach(self) -> None:
        """Restore every wrapped attribute, remove the pre- and post-hooks (idempotent)."""
        if self.injector is not None:
            self.injector.detach()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if getattr(self, "_post_handle", None) is not None:
            self._post_handle.remove()
            self._post_handle = None
        if self._owner is not None and getattr(self.optimizer, OWNER_ATTR, None) is self._owner:
            delattr(self.optimizer, OWNER_ATTR)
        self._owner = None
        thread, self.host_thread = self.host_thread, None
        if thread is not None:
            thread.close()

    def pop_plan(self) -> StepPlan | None:
        """The plan of the step being released, or None if no step passed the clipping."""
        assert self.injector is not None
        return self.injector.pop_plan()

    def read(self, plan: StepPlan, step: int) -> StepRecord:
        """The record of the step being released. Under DDP the real-data sums of every rank are
        added first (the released gradient is the reduction of every rank's sum plus the
        noise): one collective of 2k + m numbers per step. On sharded parameters the reader
        sums its vectors over the ranks itself (one collective, :mod:`.fsdp`)."""
        assert self.reader is not None
        if self.world_size > 1 and plan.real_sum is not None and self.layout is None:
            from .ddp import all_reduce_sum

            # one collective: the real sums at the canary and noise coordinates, and the
            # number of real examples of every rank
            parts = [plan.real_sum.reshape(-1)]
            if plan.noise_real_sum is not None:
                parts.append(plan.noise_real_sum.to(plan.real_sum.device).reshape(-1))
            if plan.n_real is not None:
                parts.append(torch.tensor([float(plan.n_real)], dtype=plan.real_sum.dtype,
                                          device=plan.real_sum.device))
            total = all_reduce_sum(torch.cat(parts), self.param_device)
            n0 = plan.real_sum.numel()
            plan.real_sum = total[:n0]
            if plan.noise_real_sum is not None:
                n1 = plan.noise_real_sum.numel()
                plan.noise_real_sum = total[n0:n0 + n1]
                n0 += n1
            if plan.n_real is not None:
                plan.n_real = int(round(float(total[n0])))
        return self.reader.read(plan, step)

    def take_out(self, plan: StepPlan) -> str:
        """After the auditor's own failure in the observation of ``plan``'s step (its gradient
        noised, not yet applied; the auditor already detached): the step's summed and released
        gradients as without the auditor (:func:`.recovery.take_out`). Returns how, in words;
        never raises (what failed is logged and said)."""
        try:
            return take_out(self.optimizer, self.params, plan, self.world_size)
        except Exception as e:  # noqa: BLE001 - training goes on: say what is left
            logger.error("taking the canaries out of the update failed: %r", e)
            return f"the canaries could not be taken out of this update ({e!r})"

    # ------------------------------------------------------------------ report
    def clipping(self) -> tuple[str, bool]:
        """(clipping kind, per-layer?) for the report."""
        from opacus.optimizers import AdaClipDPOptimizer

        opt = self.optimizer
        per_layer = getattr(opt, "max_grad_norms", None) is not None
        kind = ("ghost (flat)" if self.ghost else "adaptive" if isinstance(
            opt, AdaClipDPOptimizer) else "per_layer" if per_layer else "flat")
        return kind, per_layer

    def training_info(self) -> dict[str, Any]:
        """The Opacus side of the report's ``training`` section."""
        opt = self.optimizer
        kind, per_layer = self.clipping()
        return {
            "noise_multiplier": float(opt.noise_multiplier),
            "effective_noise_multiplier": self.noise_multiplier(),
            "max_grad_norm": (list(map(float, opt.max_grad_norms)) if per_layer
                              else float(opt.max_grad_norm)),
            "sample_rate": self.sample_rate,
            "expected_batch_size": float(opt.expected_batch_size)
            if opt.expected_batch_size is not None else None,
            "steps": self.accountant.steps(),
            "world_size": self.world_size,
            "sharding": "none" if self.layout is None else self.layout.describe(),
            "optimizer": type(opt).__name__,
            "grad_sample_mode": "ghost" if self.ghost else "per-sample",
            "clipping": kind,
            "loss_reduction": opt.loss_reduction,
        }

    def threat_notes(self) -> list[str]:
        """What the report must say about what the canaries exercise."""
        notes = []
        if self.ghost:
            notes.append("ghost clipping: the clipped canary is added after clipping, so the "
                         "clipping code is NOT exercised by the canaries")
        if self.clipping()[1]:
            notes.append("per-layer clipping: a canary in tensor i contributes C_i while the "
                         "noise has std sigma * ||C||; the per-step null of sigma is then "
                         "conservative")
        if self.injector is not None:  # the clipping method's form (opacus_tap/forms.py)
            notes.extend(self.injector.clipping_notes())
        return notes

    @property
    def clipping_exercised(self) -> bool:
        """Whether the canaries went through the optimizer's clipping code at every step."""
        return not self.ghost and (self.injector is None or self.injector.clipping_exercised)
