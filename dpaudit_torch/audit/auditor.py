"""``PrivacyAuditor``: audits Opacus DP-SGD while it trains, and stops it on a proven violation.

Two lines in a training loop that already uses Opacus::

    auditor = PrivacyAuditor(privacy_engine, optimizer, data_loader, delta=1e-5)
    for x, y in data_loader:
        ...; optimizer.step(); optimizer.zero_grad()
        if auditor.should_stop:
            break
    report = auditor.finalize()

A facade (docs/auditor.md "How it works") that wires the Opacus adapter (:class:`~dpaudit_torch.
opacus_tap.OpacusTap`), the engine (:class:`~dpaudit_torch.audit.engine.AuditEngine`: the
monitors, the checks, the decision), the report (:mod:`.assemble`) and the checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from .._compiled import compiled as kernels_compiled
from .._compiled import set_compiled
from ..canaries import SecretCoins, derive_seeds
from ..canary_layers import draw_canaries_for, layout_of
from ..contract import StepRefused
from . import checkpoint
from .config import AuditConfig
from .engine import AuditEngine, PrivacyViolationError, StepCallback, step_callbacks
from .monitors import MonitorContext, build_monitors

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "STATE_VERSION"]

#: the layout of :meth:`PrivacyAuditor.state_dict` (:mod:`dpaudit_torch.audit.checkpoint`)
STATE_VERSION = checkpoint.STATE_VERSION

def _engine_attr(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.engine, name), doc=doc)


def _decision_attr(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.engine.decision, name), doc=doc)


class PrivacyAuditor:
    """Audit an Opacus DP-SGD run while it trains (white-box, every step observed).

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer
            (its accountant gives the claimed epsilon).
        optimizer: the optimizer ``make_private`` returned (an Opacus ``DPOptimizer``; flat,
            per-layer, adaptive or ghost clipping).
        data_loader: the data loader ``make_private`` returned.
        delta, alpha: the delta of the claim and the bounds; the level of all proofs together.
        model: the model being trained (optional; monitors that check the model, such as the
            coverage monitor, say they did not run without it).
        config: an :class:`~dpaudit_torch.audit.config.AuditConfig`; keyword ``settings`` (its
            field names: ``k_pairs``, ``m_canaries``, ``check_every``, ``on_violation``,
            ``seed``, ``monitors``, ``disable_monitors``, ``monitor_options``, ...; each is
            documented there and in docs/auditor.md) override it.
        on_step: a callable (or a sequence of callables) receiving :attr:`latest_metrics` after
            every audited step; its exceptions are logged, never raised into training.
        on_evidence: likewise, once, at the first evidence of a violation (not a proof).

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (exact resume, also in a new
    process). Faults: an exception inside the auditor detaches it (optimizer restored) and, by
    default, the step is applied as without it (docs/auditor.md, "Faults"); parameters added or
    frozen after attach are refused at the next step.

    Raises:
        TypeError / ValueError naming the bad value (not an Opacus optimizer, a setting out of
        range, a loader without a rate, a model too small for the canaries, an unknown monitor,
        another auditor already attached). On any error the model and optimizer are untouched.
    """

    def __init__(self, privacy_engine: Any, optimizer: Any, data_loader: Any,
                 delta: float | None = None, alpha: float | None = None, *,
                 model: torch.nn.Module | None = None, config: AuditConfig | None = None,
                 on_step: StepCallback | Sequence[StepCallback] | None = None,
                 on_evidence: StepCallback | Sequence[StepCallback] | None = None,
                 **settings: Any) -> None:
        from .._compiled import COMPILED_BELOW  # (read now: tests patch it)
        from ..opacus_tap import OpacusTap

        if delta is not None:
            settings["delta"] = delta
        if alpha is not None:
            settings["alpha"] = alpha
        cfg = AuditConfig.from_kwargs(config, **settings)
        callbacks = step_callbacks(on_step), step_callbacks(on_evidence, "on_evidence")
        self.warnings: list[str] = []
        self.tap = tap = OpacusTap(privacy_engine, optimizer, data_loader, self.warn,
                                   model=model, delta=cfg.delta)
        try:
            self.device = (torch.device(cfg.device) if cfg.device is not None
                           else tap.param_device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must name a torch device, got {cfg.device!r} ({e})"
                             ) from None
        self.config = cfg = cfg.sized_for(tap.n_coordinates, COMPILED_BELOW)
        # process-wide while attached: which implementation the host kernels run (never changes
        # a result); detach() / finalize() put back what the process had
        self._kernels_before = kernels_compiled()
        set_compiled(bool(cfg.compiled_kernels))
        seeds, self.seed_policy = derive_seeds(cfg.seed)
        seeds, self.seed_policy = tap.share_seeds(seeds, self.seed_policy, cfg.seed, self.warn)
        #: the canary design, the noise-audit coordinates U and the secret IN/OUT coins
        self.design, self.noise_coords, self.coins, cfg = draw_canaries_for(tap, cfg, seeds)
        self.config = cfg
        monitors = build_monitors(self.monitor_context(self.coins, self.noise_coords))
        self.engine = AuditEngine(cfg, monitors, self.warn, tap.read_claim,
                                  tap.decision_sharer(), *callbacks)
        self.engine.steps_at_attach = tap.steps_at_attach
        tap.build(self.design, self.coins, torch.Generator().manual_seed(seeds["mechanics"]),
                  cfg.canary_norm, self.device, self.on_internal_failure, self.noise_coords)
        self._report: Any = None
        if cfg.compiled_kernels:
            from .._warmup import warm_up

            # compile (once; later: load from Numba's cache) every kernel before the first step
            warm_up(tap.params, host=self.device.type == "cpu")
        self.attach()
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
            device=self.device, warn=self.warn, coins=coins, facts=self.tap,
            layout=layout_of(self.design),
            noise_tensor=noise_coords[0].numpy(), noise_flat=noise_coords[1].numpy())

    # ------------------------------------------------------------------ public state
    def warn(self, msg: str) -> None:
        """Log ``msg`` and keep it (once) for the report's warnings."""
        logger.warning(msg)
        if msg not in self.warnings:
            self.warnings.append(msg)

    monitors = _engine_attr("monitors", "The monitors this audit runs, by name.")
    decision = _engine_attr("decision", "The anytime-valid decision over their evidence.")
    step = _engine_attr("step", "Audited (observed) logical steps.")
    should_stop = _engine_attr("should_stop", "Training should stop (on_violation, stop_on).")
    violation = _engine_attr("violation", "Has the audit proved a violation (level alpha)?")
    evidence = _decision_attr("evidence", "Evidence of a violation (alpha_warn; not a proof)?")
    evidence_step = _decision_attr("evidence_step", "The step evidence was available, or None.")
    claimed_epsilon = _engine_attr("claimed_epsilon", "The last claimed epsilon read.")
    claimed_history = _engine_attr("claimed_history", "(accountant steps, claimed epsilon) "
                                                      "at every read of the accountant.")
    steps_at_attach = _engine_attr("steps_at_attach", "Training steps before the audit began.")
    unobserved_steps = _engine_attr("unobserved_steps", "Steps that bypassed the clipping.")
    skipped_nonfinite = _engine_attr("skipped_nonfinite", "Steps dropped as non-finite.")

    attached = property(lambda self: self.tap.attached, doc="Is the auditor attached?")
    optimizer = property(lambda self: self.tap.optimizer, doc="The audited DP optimizer.")
    is_main_process = property(lambda self: self.tap.rank == 0, doc="True on the rank that "
                               "writes the report (rank 0; always True without DDP).")

    violation_step = _decision_attr("violation_step", "The training step at which the violation "
                                                      "decision was available, or None.")
    crossed_at_step = _decision_attr("crossed_at", "The step that first crossed the proof's level.")
    combined_log_wealth = _decision_attr("log_wealth", "Log of the decision's e-process.")

    latest_metrics = property(lambda self: self.engine.metrics(), doc="Host-side audit metrics "
                              "(no device synchronisation): the wealth as of the last check, the "
                              "claimed epsilon as of the last accountant read.")

    # ------------------------------------------------------------------ the hook
    def on_internal_failure(self, exc: BaseException, plan: Any = None,
                            step: int | None = None) -> bool:
        """The auditor's own code failed inside a step (docs/auditor.md, "Faults"): it detaches
        (every wrapped attribute back, the pre-hook removed); the audit is incomplete from this
        step. True (``on_internal_error="continue"``): the step goes on as without the auditor
        (``plan``: the step whose released gradient the canaries are taken out of); False: the
        caller raises before the update."""
        go_on = self.config.on_internal_error == "continue"
        self.detach()
        how = self.tap.take_out(plan) if go_on and plan is not None else None
        self.warn(self.engine.stop_auditing(exc, step, go_on, how))
        return go_on

    def observe_hook(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        """The step pre-hook the adapter registers on ``optimizer.original_optimizer``: observes
        the released step before its update (not for direct calls)."""
        eng, plan = self.engine, None
        step = eng.steps_at_attach + eng.step + 1
        try:
            plan = self.tap.pop_plan()
            if plan is None:
                eng.unobserved()
                return
            eng.before_step()
            eng.observe(lambda: self.tap.read(plan, step), self.tap.run_host)
        except (PrivacyViolationError, StepRefused):
            raise  # decisions and refused observations: the audit state is consistent
        except Exception as e:
            if not self.on_internal_failure(e, plan, step):
                raise

    # ------------------------------------------------------------------ detach / finalize
    def attach(self) -> None:
        """Attach again after :meth:`detach` (the audit goes on from where it was; steps taken
        while detached are not audited). ValueError if another auditor holds the optimizer."""
        if self._report is not None:
            raise RuntimeError("attach() of a finalized auditor")
        if not self.attached:  # the kernels' mode is this audit's again while attached
            self.tap.attach(self, self.observe_hook, post_hook=self.engine.after_release,
                            compiled=bool(self.config.compiled_kernels))

    def detach(self) -> None:
        """Restore every wrapped optimizer attribute and remove the step pre-hook (idempotent).

        Observations buffered since the last check are kept; ``finalize`` still works after."""
        if self.attached:
            self.tap.detach()
            logger.info("PrivacyAuditor detached after %d audited steps", self.engine.step)
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
