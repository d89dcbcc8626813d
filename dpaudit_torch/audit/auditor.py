"""``PrivacyAuditor``: audits Opacus DP-SGD while it trains, and stops it on a proven violation.

Two lines in a training loop that already uses Opacus::

    auditor = PrivacyAuditor(privacy_engine, optimizer, data_loader, delta=1e-5)
    for x, y in data_loader:
        ...; optimizer.step(); optimizer.zero_grad()
        if auditor.should_stop:
            break
    report = auditor.finalize()

A facade that only wires three parts (docs/auditor.md "How it works"; docs/design.md sections
5 and 6): the Opacus adapter (:class:`~dpaudit_torch.opacus_tap.OpacusTap`: canaries through
Opacus's own clipping, one :class:`~dpaudit_torch.contract.StepRecord` per released step, the
facts the monitors ask for), the engine (:class:`~dpaudit_torch.audit.engine.AuditEngine`: the
registered monitors, the checks, the anytime-valid decision) and the report
(:mod:`dpaudit_torch.audit.assemble`); checkpoints are laid out by
:mod:`dpaudit_torch.audit.checkpoint`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..canaries import (
    SecretCoins,
    add_spread_pairs,
    derive_seeds,
    draw_design,
    draw_noise_coordinates,
)
from . import checkpoint
from .config import AuditConfig, default_m_canaries
from .engine import AuditEngine, PrivacyViolationError
from .monitors import MonitorContext, build_monitors

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "STATE_VERSION"]

#: the layout of :meth:`PrivacyAuditor.state_dict` (:mod:`dpaudit_torch.audit.checkpoint`)
STATE_VERSION = checkpoint.STATE_VERSION

StepCallback = Callable[[dict[str, Any]], Any]


def _callbacks(on_step: Any) -> list[StepCallback]:
    if on_step is None:
        return []
    if callable(on_step):
        return [on_step]
    if isinstance(on_step, Sequence) and all(callable(f) for f in on_step):
        return list(on_step)
    raise TypeError(f"on_step must be a callable or a sequence of callables, got {on_step!r}")


def _engine_attr(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.engine, name), doc=doc)


class PrivacyAuditor:
    """Audit an Opacus DP-SGD run while it trains (white-box, every step observed).

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer
            (its accountant gives the claimed epsilon).
        optimizer: the optimizer ``make_private`` returned (an Opacus ``DPOptimizer``; flat,
            per-layer, adaptive or ghost clipping).
        data_loader: the data loader ``make_private`` returned.
        delta, alpha: the delta of the claim and of the bounds, and the level of every test.
        model: the model being trained (optional; monitors that check the model, such as the
            coverage monitor, say they did not run without it).
        config: an :class:`~dpaudit_torch.audit.config.AuditConfig`; keyword ``settings`` (its
            field names: ``k_pairs``, ``m_canaries``, ``check_every``, ``on_violation``,
            ``seed``, ``monitors``, ``disable_monitors``, ``monitor_options``, ...; each is
            documented there and in docs/auditor.md) override it.
        on_step: a callable (or a sequence of callables) receiving :attr:`latest_metrics` after
            every audited step; its exceptions are logged, never raised into training.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (exact resume, also in a new
    process). Faults: an exception inside the auditor detaches it (optimizer restored) before the
    step's update; parameters added or frozen after attach are refused at the next step.

    Raises:
        TypeError / ValueError naming the bad value (not an Opacus optimizer, a setting out of
        range, a loader without a rate, a model too small for the canaries, an unknown monitor,
        another auditor already attached). On any error the model and optimizer are untouched.
    """

    def __init__(self, privacy_engine: Any, optimizer: Any, data_loader: Any,
                 delta: float | None = None, alpha: float | None = None, *,
                 model: torch.nn.Module | None = None, config: AuditConfig | None = None,
                 on_step: StepCallback | Sequence[StepCallback] | None = None,
                 **settings: Any) -> None:
        from .._compiled import COMPILED_BELOW, set_compiled
        from .._compiled import compiled as kernels_compiled
        from ..opacus_tap import OpacusTap

        if delta is not None:
            settings["delta"] = delta
        if alpha is not None:
            settings["alpha"] = alpha
        cfg = AuditConfig.from_kwargs(config, **settings)
        callbacks = _callbacks(on_step)
        self.warnings: list[str] = []
        self.tap = tap = OpacusTap(privacy_engine, optimizer, data_loader, self.warn,
                                   model=model, delta=cfg.delta)
        try:
            self.device = (torch.device(cfg.device) if cfg.device is not None
                           else tap.param_device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must name a torch device, got {cfg.device!r} ({e})"
                             ) from None
        if cfg.m_canaries is None:  # the default, sized to the model
            cfg = cfg.replace(m_canaries=default_m_canaries(tap.n_coordinates, cfg.k_pairs))
        assert cfg.m_canaries is not None
        need = 2 * cfg.k_pairs + cfg.m_canaries
        if need > tap.n_coordinates:
            raise ValueError(
                f"the model has {tap.n_coordinates} trainable coordinates, fewer than the "
                f"{need} canary coordinates requested (2 * k_pairs + m_canaries); lower k_pairs "
                f"or m_canaries")
        if cfg.compiled_kernels is None:  # by the model's size (dpaudit_torch/_compiled.py)
            cfg = cfg.replace(compiled_kernels=tap.n_coordinates < COMPILED_BELOW)
        self.config = cfg
        # process-wide while attached: which implementation the host kernels run (never changes
        # a result); detach() / finalize() put back what the process had
        self._kernels_before = kernels_compiled()
        set_compiled(bool(cfg.compiled_kernels))
        seeds, self.seed_policy = derive_seeds(cfg.seed)
        share = None
        if tap.world_size > 1:  # after all validation: collectives every rank reaches
            from ..opacus_tap.ddp import broadcast_decision, share_seeds

            seeds, self.seed_policy = share_seeds(seeds, self.seed_policy, cfg.seed is not None,
                                                  tap.rank, tap.param_device, self.warn)

            def share(d: Any) -> tuple[bool, int | None, int | None]:
                return broadcast_decision(d.violation, d.violation_step, d.crossed_at,
                                          tap.param_device)
        design_gen = torch.Generator().manual_seed(seeds["design"])
        self.design = draw_design(tap.shapes, cfg.k_pairs, cfg.m_canaries, design_gen)
        if not tap.clipping()[1]:  # spread canaries (flat clipping: per-layer bounds differ)
            self.design = add_spread_pairs(self.design, cfg.spread_pairs, cfg.spread_tensors,
                                           design_gen)
        #: the noise-audit coordinates U (drawn after the design, from the same stream)
        self.noise_coords = draw_noise_coordinates(self.design, cfg.noise_coordinates_per_tensor,
                                                   design_gen, cfg.noise_coordinates_total)
        self.coins = SecretCoins(cfg.m_canaries, torch.Generator().manual_seed(seeds["secret"]))
        monitors = build_monitors(self.monitor_context(self.coins, self.noise_coords))
        self.engine = AuditEngine(cfg, monitors, self.warn, tap.read_claim, share, callbacks)
        self.engine.steps_at_attach = tap.steps_at_attach
        tap.build(self.design, self.coins, torch.Generator().manual_seed(seeds["mechanics"]),
                  cfg.canary_norm, self.device, self.on_internal_failure, self.noise_coords)
        self._report: Any = None
        if cfg.compiled_kernels:
            from .._numba import warm_up

            # compile (once; later: load from Numba's cache) every kernel before the first step
            warm_up(tap.params, host=self.device.type == "cpu")
        tap.attach(self, self.observe_hook)
        logger.info("PrivacyAuditor attached: %d pairs, %d one-run canaries, sample rate %.4g, "
                    "noise multiplier %.4g, %s; monitors %s", cfg.k_pairs, cfg.m_canaries,
                    tap.sample_rate, tap.noise_multiplier(),
                    "ghost clipping" if tap.ghost else "per-sample clipping", ", ".join(monitors))

    def monitor_context(self, coins: SecretCoins, noise_coords: tuple[torch.Tensor, torch.Tensor],
                        config: AuditConfig | None = None) -> MonitorContext:
        """What the monitors of this audit are built with (the tap answers their facts)."""
        cfg = self.config if config is None else config
        assert cfg.m_canaries is not None
        return MonitorContext(config=cfg, k_pairs=cfg.k_pairs, m_canaries=cfg.m_canaries,
                              device=self.device, warn=self.warn, coins=coins,
                              noise_tensor=noise_coords[0].numpy(), facts=self.tap)

    # ------------------------------------------------------------------ public state
    def warn(self, msg: str) -> None:
        """Log ``msg`` and keep it (once) for the report's warnings."""
        logger.warning(msg)
        if msg not in self.warnings:
            self.warnings.append(msg)

    monitors = _engine_attr("monitors", "The monitors this audit runs, by name.")
    decision = _engine_attr("decision", "The anytime-valid decision over their evidence.")
    step = _engine_attr("step", "Audited (observed) logical steps.")
    should_stop = _engine_attr("should_stop", "True once a proven violation asks training to "
                                              "stop (``on_violation`` 'stop' or 'raise').")
    violation = _engine_attr("violation", "Has the audit proved a violation (level alpha)?")
    claimed_epsilon = _engine_attr("claimed_epsilon", "The last claimed epsilon read.")
    claimed_history = _engine_attr("claimed_history", "(accountant steps, claimed epsilon) "
                                                      "at every read of the accountant.")
    steps_at_attach = _engine_attr("steps_at_attach", "Training steps before the audit began.")
    unobserved_steps = _engine_attr("unobserved_steps", "Steps that bypassed the clipping.")
    skipped_nonfinite = _engine_attr("skipped_nonfinite", "Steps dropped as non-finite.")

    @property
    def attached(self) -> bool:
        return self.tap.attached

    @property
    def is_main_process(self) -> bool:
        """True on the rank that writes the report (rank 0; always True without DDP)."""
        return self.tap.rank == 0

    @property
    def violation_step(self) -> int | None:
        """Training step at which the violation decision was available, or None."""
        return self.engine.decision.violation_step

    @property
    def crossed_at_step(self) -> int | None:
        """Training step whose observation first pushed the combined wealth over 1/alpha."""
        return self.engine.decision.crossed_at

    @property
    def combined_log_wealth(self) -> float:
        """Log of the decision's e-process (as of the last check)."""
        return self.engine.decision.log_wealth

    @property
    def latest_metrics(self) -> dict[str, Any]:
        """Host-side audit metrics (no device synchronisation): the wealth as of the last check,
        the claimed epsilon as of the last accountant read."""
        return self.engine.metrics()

    # ------------------------------------------------------------------ the hook
    def on_internal_failure(self, exc: BaseException) -> None:
        """The auditor's own code failed inside a step: detach (every wrapped attribute back,
        the pre-hook removed) so that training can go on unaudited; the step raises before its
        update, so the parameters keep their values."""
        logger.error("internal auditor failure: %r", exc)
        self.warn(f"internal auditor failure ({exc!r}); the auditor detached itself and "
                  f"restored the optimizer; this step's update was not applied")
        self.detach()

    def observe_hook(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        """The step pre-hook the adapter registers on ``optimizer.original_optimizer``: observes
        the released step before its update (not for direct calls)."""
        try:
            plan = self.tap.pop_plan()
            if plan is None:
                self.engine.unobserved()
                return
            self.engine.before_step()
            eng = self.engine
            self.engine.on_step(self.tap.read(plan, eng.steps_at_attach + eng.step + 1))
        except (PrivacyViolationError, ValueError):
            raise  # decisions and refused observations: the audit state is consistent
        except Exception as e:
            self.on_internal_failure(e)
            raise

    # ------------------------------------------------------------------ detach / finalize
    def attach(self) -> None:
        """Attach again after :meth:`detach` (the audit goes on from where it was; steps taken
        while detached are not audited). ValueError if another auditor holds the optimizer."""
        if self._report is not None:
            raise RuntimeError("attach() of a finalized auditor")
        if not self.attached:
            self.tap.attach(self, self.observe_hook)

    def detach(self) -> None:
        """Restore every wrapped optimizer attribute and remove the step pre-hook (idempotent).

        Observations buffered since the last check are kept; ``finalize`` still works after."""
        if self.attached:
            self.tap.detach()
            logger.info("PrivacyAuditor detached after %d audited steps", self.engine.step)
        from .._compiled import set_compiled

        set_compiled(getattr(self, "_kernels_before", True))

    def finalize(self, detach: bool = True) -> Any:
        """Finish the audit and return an :class:`~dpaudit_torch.report.AuditReport`: the last
        check, the claimed epsilon, every monitor's whole-run statistics (the secret coins are
        revealed for the one-run bounds). Calling it again returns the same report. With
        ``detach=True`` (default) the auditor is detached."""
        if self._report is not None:
            return self._report
        if detach and self.attached:  # the kernel mode stays this audit's until the end
            self.tap.detach()
        claimed = self.engine.finalize()
        from .assemble import assemble_report

        self._report = assemble_report(self, claimed)
        if detach:
            self.detach()
        return self._report

    # ------------------------------------------------------------------ checkpoint / resume
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the audit (tensors and plain types; ``torch.save``-able;
        layout: :mod:`dpaudit_torch.audit.checkpoint`). **It contains the secret coins**: keep it
        as private as the model's weights. Call it between steps; to resume, build a new auditor
        with the same configuration on the resumed run, then :meth:`load_state_dict`."""
        inj = self.tap.injector
        if inj is not None and inj.in_step:
            raise RuntimeError("state_dict() called inside an optimizer step; call it between "
                               "steps")
        if self._report is not None:
            raise RuntimeError("state_dict() of a finalized auditor; checkpoint before "
                               "finalize()")
        return checkpoint.write_state(self)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of an auditor with the same configuration (this
        release's layout or the previous one). Validates everything before changing anything:
        a state of another model or configuration raises ValueError naming what differs. The
        design and coins of the state replace this auditor's own (``seed=None`` resumes
        correctly). Monitors the state lacks start fresh, with a note."""
        if self._report is not None:
            raise RuntimeError("load_state_dict() into a finalized auditor")
        checkpoint.load_state(self, sd)

    def __repr__(self) -> str:
        return (f"PrivacyAuditor(step={self.engine.step}, k_pairs={self.config.k_pairs}, "
                f"m_canaries={self.config.m_canaries}, violation={self.violation}, "
                f"attached={self.attached})")
