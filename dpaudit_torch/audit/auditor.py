"""``PrivacyAuditor``: audits Opacus DP-SGD while it trains, and stops it on a proven violation.

Two lines in a training loop that already uses Opacus::

    auditor = PrivacyAuditor(privacy_engine, optimizer, data_loader, delta=1e-5)
    for x, y in data_loader:
        ...; optimizer.step(); optimizer.zero_grad()
        if auditor.should_stop:
            break
    report = auditor.finalize()

The auditor is a facade over three parts (docs/auditor.md; docs/design.md sections 5 and 6):

1. the Opacus adapter (:class:`~dpaudit_torch.opacus_tap.OpacusTap`): Dirac canaries drawn from
   the auditor's own generator (``k_pairs`` sequential pairs, ``m_canaries`` one-run canaries IN
   with probability 1/2) go through Opacus's own clipping, and after noise and scaling, before
   the update, the released gradient at every canary coordinate becomes a
   :class:`~dpaudit_torch.audit.record.StepRecord`;
2. the monitors (:mod:`dpaudit_torch.audit.monitors`): the sequential pairs, tested every
   ``check_every`` steps by anytime-valid tests of the per-step Gaussian null (González et al.,
   NeurIPS 2025; the hockey-stick test), and the one-run scores, turned into whole-run lower
   bounds at finalize (Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis & Chaudhuri,
   ICML 2025);
3. the decision (:class:`~dpaudit_torch.audit.decision.Decision`): the average of the monitors'
   e-processes against 1/alpha, so a correct implementation is flagged with probability at most
   alpha over the whole run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..canaries import (
    CanaryDesign,
    SecretCoins,
    add_spread_pairs,
    derive_seeds,
    draw_design,
    draw_noise_coordinates,
)
from .config import DEFAULT_NOISE_COORDINATES_TOTAL, AuditConfig
from .context import monitor_context
from .decision import Decision
from .monitors import DEFAULT_MONITORS, MonitorContext, build_monitors
from .monitors.base import plain_state

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "STATE_VERSION"]

#: version of the layout of :meth:`PrivacyAuditor.state_dict` (1: before the engine/monitor
#: restructuring; refused with a message naming it)
STATE_VERSION = 2

StepCallback = Callable[[dict[str, Any]], Any]


class PrivacyViolationError(RuntimeError):
    """Raised (``on_violation="raise"``) before the update of the step at which the sequential
    audit proved that the per-step privacy guarantee does not hold."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def _callbacks(on_step: Any) -> list[StepCallback]:
    if on_step is None:
        return []
    if callable(on_step):
        return [on_step]
    if isinstance(on_step, Sequence) and all(callable(f) for f in on_step):
        return list(on_step)
    raise TypeError(f"on_step must be a callable or a sequence of callables, got {on_step!r}")


class PrivacyAuditor:
    """Audit an Opacus DP-SGD run while it trains (white-box, every step observed).

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer
            (its accountant gives the claimed epsilon).
        optimizer: the optimizer ``make_private`` returned (an Opacus ``DPOptimizer``; flat,
            per-layer, adaptive or ghost clipping).
        data_loader: the data loader ``make_private`` returned; its ``sample_rate`` is the Poisson
            rate really used, whatever the accountant was told.
        delta: the delta of the claimed (eps, delta) and of the one-run bounds, in (0, 1).
        alpha: level of every test, in (0, 1): a correct run is flagged with probability <= alpha.
        config: an :class:`~dpaudit_torch.audit.config.AuditConfig` holding every setting below
            (keyword arguments given as well override it).
        k_pairs: sequential canary pairs (each gives one test pair per step).
        m_canaries: one-run canaries (IN with probability 1/2, secret until ``finalize``); default
            5,000, or half of the coordinates the pairs leave free in a smaller model
            (:func:`~dpaudit_torch.audit.config.default_m_canaries`). Each costs a few numbers
            per step, not a row of the model's size.
        canary_norm: raw canary norm as a multiple of the clipping bound C (> 1, so that clipping
            is exercised). A correct optimizer clips the canary to C whatever this is; a missing
            or broken clipping lets ``canary_norm * C`` through, so a large value makes clipping
            bugs stand out above the (then unclipped, large) real-data gradients. Default 25
            (4 needed about twice as many steps to detect disabled clipping, see
            docs/benchmarks.md).
        per_step_null: None (default: the Gaussian mechanism of the optimizer's current noise
            multiplier, tested at a grid of points of its privacy profile,
            :func:`~dpaudit_torch.audit.monitors.per_step_null_grid`; a change of the noise
            multiplier starts new testers whose wealth multiplies the old one) or an explicit
            per-step ``(epsilon, delta)``.
        tests: sequential testers to run, names registered in :mod:`dpaudit_torch.registry`
            (``"mmd"``, ``"hockey_stick"``).
        check_every: steps between host synchronisations, where the buffered pairs are fed to the
            testers and the decision is taken. A violation is acted on at the first check at or
            after the step whose observation crossed the threshold (``violation_step``;
            ``crossed_at_step`` is also reported).
        claimed_every: steps between calls of the accountant's ``get_epsilon`` (also at the
            first audited step, so that the claim is known from the start, and at finalize;
            an RDP or PRV read costs 0.02-0.5 s, so frequent reads dominate the overhead).
        on_violation: ``"stop"`` (set :attr:`should_stop`), ``"raise"`` (raise
            :class:`PrivacyViolationError` before that step's update is applied) or ``"warn"``.
        on_nonfinite: a non-finite gradient at a canary coordinate: ``"raise"`` (default:
            ``ValueError`` before the update, the audit state untouched) or ``"skip"`` (drop that
            step's observation, count it in the report).
        seed: seed of the auditor's own random streams (canary design, role coins, Poisson
            inclusion, secret coins); None: OS entropy (secure default). Under DDP rank 0's seeds
            are broadcast to every rank, and rank 0's decision at every check; construct the
            auditor and call ``finalize`` on every rank.
        history_stride: keep every ``history_stride``-th step in the log-wealth history.
        device: where the audit's buffers and testers live (default: the parameters' device).
        test_options: extra keyword arguments per test, e.g.
            ``{"mmd": {"witness_radius": 0.5}}``; they override
            :data:`~dpaudit_torch.audit.config.DEFAULT_TEST_OPTIONS`.
        on_step: a callable (or a sequence of callables) receiving :attr:`latest_metrics` after
            every audited step; its exceptions are logged, never raised into training.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (exact resume, also in a new
    process). Faults: an exception inside the auditor detaches it (optimizer restored) before the
    step's update; parameters added or frozen after attach are refused at the next step.

    Raises:
        TypeError: the optimizer is not an Opacus DP optimizer, or an argument has a wrong type.
        ValueError: a value is out of range, the data loader has no sample rate, the model is too
            small for the canaries, or another auditor is already attached to the optimizer.
        On any error the model and the optimizer are left untouched.
    """

    def __init__(self, privacy_engine: Any, optimizer: Any, data_loader: Any,
                 delta: float | None = None, alpha: float | None = None, *,
                 config: AuditConfig | None = None,
                 on_step: StepCallback | Sequence[StepCallback] | None = None,
                 **settings: Any) -> None:
        from .._compiled import COMPILED_BELOW, set_compiled
        from .._compiled import compiled as kernels_compiled
        from ..opacus_tap import OpacusTap

        if delta is not None:
            settings["delta"] = delta
        if alpha is not None:
            settings["alpha"] = alpha
        self.config = cfg = AuditConfig.from_kwargs(config, **settings)
        self._callbacks = _callbacks(on_step)
        self.warnings: list[str] = []
        self.tap = tap = OpacusTap(privacy_engine, optimizer, data_loader, self.warn)
        try:
            self.device = (torch.device(cfg.device) if cfg.device is not None
                           else tap.param_device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must name a torch device, got {cfg.device!r} ({e})"
                             ) from None
        if cfg.m_canaries is None:  # the default, sized to the model
            from .config import default_m_canaries

            self.config = cfg = cfg.replace(
                m_canaries=default_m_canaries(tap.n_coordinates, cfg.k_pairs))
        assert cfg.m_canaries is not None
        need = 2 * cfg.k_pairs + cfg.m_canaries
        if need > tap.n_coordinates:
            raise ValueError(
                f"the model has {tap.n_coordinates} trainable coordinates, fewer than the "
                f"{need} canary coordinates requested (2 * k_pairs + m_canaries); lower k_pairs "
                f"or m_canaries")
        if cfg.compiled_kernels is None:  # by the model's size (dpaudit_torch/_compiled.py)
            self.config = cfg = cfg.replace(
                compiled_kernels=tap.n_coordinates < COMPILED_BELOW)
        # process-wide while attached: which implementation the host kernels run (never changes
        # a result); detach() / finalize() put back what the process had
        self._kernels_before = kernels_compiled()
        set_compiled(bool(cfg.compiled_kernels))
        seeds, self.seed_policy = derive_seeds(cfg.seed)
        if tap.world_size > 1:  # after all validation: a collective every rank reaches
            from ..opacus_tap.ddp import share_seeds

            seeds, self.seed_policy = share_seeds(seeds, self.seed_policy, cfg.seed is not None,
                                                  tap.rank, tap.param_device, self.warn)
        self.optimizer = optimizer
        design_gen = torch.Generator().manual_seed(seeds["design"])
        self.design: CanaryDesign = draw_design(tap.shapes, cfg.k_pairs, cfg.m_canaries,
                                                design_gen)
        if not tap.clipping()[1]:  # spread canaries (flat clipping: per-layer bounds differ)
            self.design = add_spread_pairs(self.design, cfg.spread_pairs, cfg.spread_tensors,
                                           design_gen)
        #: the noise-audit coordinates U (drawn after the design, from the same stream)
        self.noise_coords = draw_noise_coordinates(self.design,
                                                   cfg.noise_coordinates_per_tensor, design_gen,
                                                   cfg.noise_coordinates_total)
        self._coins = SecretCoins(cfg.m_canaries, torch.Generator().manual_seed(seeds["secret"]))
        self.monitors = build_monitors(self._context(self._coins), DEFAULT_MONITORS)
        self.monitors["sequential_pairs"].start(tap.noise_multiplier())
        self.decision = Decision(cfg.alpha, cfg.history_stride,
                                 ["epsilon_lower_bound", *cfg.tests])
        tap.build(self.design, self._coins,
                  torch.Generator().manual_seed(seeds["mechanics"]), cfg.canary_norm,
                  self.device, self._on_internal_failure, self.noise_coords)
        self.step = 0  # audited (observed) logical steps
        self.steps_at_attach = tap.accountant.steps()
        self.should_stop = False
        self._raised = False
        #: (accountant steps, claimed epsilon) at every read of the accountant
        self.claimed_history: list[tuple[int, float | None]] = []
        #: optimizer steps that did not pass through the DP clipping (not audited)
        self.unobserved_steps = 0
        #: steps whose observation was dropped as non-finite (``on_nonfinite="skip"``)
        self.skipped_nonfinite = 0
        self._nonfinite_flags: list[torch.Tensor] = []  # deferred finiteness since the last check
        self._report: Any = None
        if cfg.compiled_kernels:
            from .._numba import warm_up

            # compile (once; later: load from Numba's cache) every kernel before the first step
            warm_up(tap.params, host=self.device.type == "cpu")
        tap.attach(self, self.observe_hook)
        logger.info("PrivacyAuditor attached: %d pairs, %d one-run canaries, sample rate %.4g, "
                    "noise multiplier %.4g, %s", cfg.k_pairs, cfg.m_canaries, tap.sample_rate,
                    tap.noise_multiplier(),
                    "ghost clipping" if tap.ghost else "per-sample clipping")

    def _context(self, coins: SecretCoins,
                 noise_coords: tuple[torch.Tensor, torch.Tensor] | None = None) -> MonitorContext:
        return monitor_context(self.config, self.tap, self.device, self.warn, coins,
                               self.noise_coords if noise_coords is None else noise_coords,
                               lambda: self.steps_at_attach)

    # ------------------------------------------------------------------ public state
    def warn(self, msg: str) -> None:
        """Log ``msg`` and keep it (once) for the report's warnings."""
        logger.warning(msg)
        if msg not in self.warnings:
            self.warnings.append(msg)

    @property
    def attached(self) -> bool:
        return self.tap.attached

    @property
    def is_main_process(self) -> bool:
        """True on the rank that writes the report (rank 0; always True without DDP)."""
        return self.tap.rank == 0

    @property
    def violation(self) -> bool:
        """Has the sequential audit proved a violation (at level alpha)?"""
        return self.decision.violation

    @property
    def violation_step(self) -> int | None:
        """Training step at which the violation decision was available, or None."""
        return self.decision.violation_step

    @property
    def crossed_at_step(self) -> int | None:
        """Training step whose observation first pushed the combined wealth over 1/alpha."""
        return self.decision.crossed_at

    @property
    def combined_log_wealth(self) -> float:
        """Log of the decision's e-process (as of the last check)."""
        return self.decision.log_wealth

    @property
    def claimed_epsilon(self) -> float | None:
        """The last claimed epsilon read from the accountant (None before the first read)."""
        return self.claimed_history[-1][1] if self.claimed_history else None

    @property
    def latest_metrics(self) -> dict[str, Any]:
        """Host-side audit metrics (no device synchronisation): the wealth is as of the last
        check, the claimed epsilon as of the last accountant read."""
        d = self.decision
        out: dict[str, Any] = {
            "step": self.steps_at_attach + self.step,
            "audited_steps": self.step,
            "combined_log_wealth": d.log_wealth,
            "decision_threshold_log": d.threshold_log,
            "violation": d.violation,
            "epsilon_lower_bound_sequential": d.latest["epsilon_lower_bound"],
            "claimed_epsilon": self.claimed_epsilon,
        }
        for t in self.config.tests:
            out[f"log_wealth_{t}"] = d.latest[t]
        return out

    # ------------------------------------------------------------------ the hook
    def _on_internal_failure(self, exc: BaseException) -> None:
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
            self._observe_step()
        except (PrivacyViolationError, ValueError):
            raise  # decisions and refused observations: the audit state is consistent
        except Exception as e:
            self._on_internal_failure(e)
            raise

    def _observe_step(self) -> None:
        cfg = self.config
        plan = self.tap.pop_plan()
        if plan is None:
            self.unobserved_steps += 1
            if self.unobserved_steps == 1:
                self.warn("an optimizer step ran without passing through the DP optimizer's "
                          "clipping (e.g. original_optimizer.step() called directly); it is not "
                          "audited")
            return
        if self.decision.violation and cfg.on_violation == "raise":
            raise PrivacyViolationError(self._violation_message(), self.violation_step)
        step = self.step + 1
        rec = self.tap.read(plan, self.steps_at_attach + step)
        skip = cfg.on_nonfinite == "skip"
        if rec.finite is False and not skip:  # refused before any state changes
            bad = np.nonzero(~np.isfinite(rec.values.cpu().numpy()))[0][:3].tolist()
            raise ValueError(
                f"non-finite gradient at canary coordinate(s) {bad} (design order) at step "
                f"{rec.step}: the audit refuses this observation; the update was not applied")
        if rec.finite is False:
            self.skipped_nonfinite += 1
        elif isinstance(rec.finite, torch.Tensor):
            self._nonfinite_flags.append(rec.finite)
        for m in self.monitors.values():
            # a dropped step still was a release: monitors that count releases see it (and
            # must not use its values); the others see finite steps only
            if rec.finite is not False or getattr(m, "observes_nonfinite", False):
                m.observe(rec)
        self.step = step
        if step % cfg.check_every == 0:
            self._check()
        if step % cfg.claimed_every == 0 or step == 1:
            self._read_claimed()
        if self._callbacks:
            metrics = self.latest_metrics
            for fn in self._callbacks:
                try:
                    fn(dict(metrics))
                except Exception as e:  # noqa: BLE001 - a logging callback must not break training
                    logger.warning("on_step callback %r failed: %r", fn, e)
        if self.decision.violation and not self._raised:
            self._act()

    def _violation_message(self) -> str:
        """Names the deciding monitor(s) and what each found (their violation findings)."""
        from ..report.wording import violation_message

        found: list[dict[str, Any]] = []
        for m in self.monitors.values():
            try:
                found += [vars(f) for f in m.findings()]
            except Exception as e:  # noqa: BLE001 - the message must not break the decision
                logger.debug("findings() of a monitor failed while wording a violation: %r", e)
        return violation_message(found, self.violation_step, self.config.alpha,
                                 self.decision.log_wealth)

    def _act(self) -> None:
        self._raised = True
        msg = self._violation_message()
        mode = self.config.on_violation
        if mode == "warn":
            logger.warning(msg)
            return
        self.should_stop = True
        if mode == "stop":
            logger.warning(msg + "; should_stop is set")
        else:
            logger.error(msg + "; raising before this step's update")
            raise PrivacyViolationError(msg, self.violation_step)

    def _check(self) -> None:
        """Feed what the monitors buffered, take the decision (one host synchronisation)."""
        flags, self._nonfinite_flags = self._nonfinite_flags, []
        if flags:  # accelerators: finiteness of the buffered steps, checked here
            ok = torch.stack(flags).cpu()
            if not bool(ok.all()):
                if self.config.on_nonfinite == "skip":
                    self.skipped_nonfinite += int((~ok).sum())
                else:
                    steps = self.monitors["sequential_pairs"].discard_pending()
                    raise ValueError(
                        f"non-finite gradient at canary coordinates during steps "
                        f"{steps[0]}..{steps[-1]}: those observations are discarded and this "
                        f"step's update was not applied")
        evidence = {n: m.advance() for n, m in self.monitors.items()}
        self.decision.update(evidence, now=self.steps_at_attach + self.step)
        if self.tap.world_size > 1:
            from ..opacus_tap.ddp import broadcast_decision

            d = self.decision
            if d.adopt(*broadcast_decision(d.violation, d.violation_step, d.crossed_at,
                                           self.tap.param_device)):
                self.warn(f"rank {self.tap.rank}: sequential decision differed from rank 0's; "
                          f"rank 0's decision is used")

    def _read_claimed(self) -> float | None:
        steps = self.tap.accountant.steps()
        if steps == 0:
            return None
        eps = self.tap.accountant.epsilon(self.config.delta)
        if not self.claimed_history or self.claimed_history[-1][0] != steps:
            self.claimed_history.append((steps, eps))
        else:
            self.claimed_history[-1] = (steps, eps)
        return eps

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
        self._detach()
        self._restore_kernel_mode()

    def _detach(self) -> None:
        if not self.attached:
            return
        self.tap.detach()
        logger.info("PrivacyAuditor detached after %d audited steps", self.step)

    def _restore_kernel_mode(self) -> None:
        """The kernel implementation the process had before this auditor (its later tests,
        e.g. a black-box audit, run as before)."""
        from .._compiled import set_compiled

        set_compiled(getattr(self, "_kernels_before", True))

    def finalize(self, detach: bool = True) -> Any:
        """Finish the audit and return an :class:`~dpaudit_torch.report.AuditReport`.

        Feeds the remaining buffered pairs, reads the claimed epsilon, reveals the secret coins
        and computes the one-run bounds. Calling it again returns the same report. With
        ``detach=True`` (default) the auditor is detached first.
        """
        if self._report is not None:
            return self._report
        if detach:
            self._detach()  # the kernel mode stays this audit's until the report is made
        self._check()
        if self.decision.violation and not self._raised:
            self._raised = True
            if self.config.on_violation in ("stop", "raise"):
                self.should_stop = True
            logger.warning(self._violation_message())
        if self.step:
            self.decision.record(self.steps_at_attach + self.step)  # the final point
        else:
            self.warn("finalize() after 0 audited steps: no training step was audited, so "
                      "this report holds no evidence about the run")
        claimed = self._read_claimed()
        for m in self.monitors.values():
            m.finalize(claimed)
        from .assemble import build_audit_report

        self._report = build_audit_report(self, claimed)
        if detach:
            self._restore_kernel_mode()
        return self._report

    # ------------------------------------------------------------------ checkpoint / resume
    def _fingerprint(self) -> dict[str, Any]:
        return {**self.config.fingerprint(), **self.tap.fingerprint()}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the audit (tensors and plain types; ``torch.save``-able).

        Holds the canary design, the secret IN/OUT coins, every monitor's state (scores, buffered
        pairs, tester states), the decision, the auditor's generator position, the counters, the
        claimed-epsilon bookkeeping and the warnings. **The checkpoint contains the secret
        coins**: keep it as private as the model's weights.

        Call it between steps. To resume: build a new auditor with the same configuration on the
        resumed model / optimizer / data loader, then :meth:`load_state_dict`.
        """
        inj = self.tap.injector
        assert inj is not None
        if inj.in_step:
            raise RuntimeError("state_dict() called inside an optimizer step; call it between "
                               "steps")
        if self._report is not None:
            raise RuntimeError("state_dict() of a finalized auditor; checkpoint before "
                               "finalize()")
        mask, revealed = self._coins.state()
        rng_state, pos = inj.draw_position()
        return {
            "version": STATE_VERSION,
            "config": self._fingerprint(),
            "seed_policy": self.seed_policy,
            "design": self.design.to_state(),
            "coins": {"in": mask, "revealed": revealed},
            "noise_coords": {"param": self.noise_coords[0].clone(),
                             "flat": self.noise_coords[1].clone()},
            "mechanics_rng": rng_state, "mechanics_pos": pos, "mechanics_unit": "uniforms",
            "injector": inj.counters(),
            "monitors": {n: plain_state(m.state_dict()) for n, m in self.monitors.items()},
            "decision": self.decision.state_dict(),
            "counters": {"step": self.step, "steps_at_attach": self.steps_at_attach,
                         "should_stop": self.should_stop, "raised": self._raised,
                         "unobserved_steps": self.unobserved_steps,
                         "skipped_nonfinite": self.skipped_nonfinite,
                         "reads": self.tap.reader.reads if self.tap.reader else 0},
            "claimed": [[s, e] for s, e in self.claimed_history],
            "warnings": list(self.warnings),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of an auditor with the same configuration.

        Validates everything before changing anything: a state of another model or
        configuration raises ValueError naming what differs, and leaves this auditor as it was.
        The design and the coins of the state replace this auditor's own (so ``seed=None``
        resumes correctly). A state written by an older layout raises ValueError naming its
        version.
        """
        if not isinstance(sd, dict) or "config" not in sd or "version" not in sd:
            raise ValueError("not a PrivacyAuditor state_dict (no 'config'/'version' entries)")
        if sd["version"] != STATE_VERSION:
            raise ValueError(f"PrivacyAuditor state_dict version {sd['version']!r} is not "
                             f"supported (this version reads {STATE_VERSION}); resume it with "
                             f"the dpaudit_torch release that wrote it, or start a new audit")
        if self._report is not None:
            raise RuntimeError("load_state_dict() into a finalized auditor")
        theirs = sd["config"]
        config = self._config_of_state(theirs)
        mine = {**config.fingerprint(), **self.tap.fingerprint()}
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            raise ValueError(
                "PrivacyAuditor state_dict was made for a different model or configuration; "
                "differs in " + ", ".join(f"{k} (state: {theirs.get(k)!r}, this auditor: "
                                          f"{mine.get(k)!r})" for k in diff))
        previous, self.config = self.config, config
        try:
            self._restore(sd)
        except BaseException:
            self.config = previous
            raise
        if config is not previous:
            logger.info("PrivacyAuditor: the checkpoint was written before "
                        "noise_coordinates_total existed; resumed with its uncapped noise-audit "
                        "coordinates (noise_coordinates_total=None)")
        logger.info("PrivacyAuditor resumed at audited step %d", self.step)

    def _config_of_state(self, theirs: dict[str, Any]) -> AuditConfig:
        """This auditor's configuration as a checkpoint's fingerprint ``theirs`` needs it: a
        checkpoint written before ``noise_coordinates_total`` existed drew its noise-audit
        coordinates uncapped; where this auditor has the default cap, it resumes with None (the
        coordinates themselves come from the checkpoint), so that a later default does not
        orphan the checkpoints of an earlier release. A cap set to another value is compared
        as any other setting."""
        cfg = self.config
        if "noise_coordinates_total" not in theirs and \
                cfg.noise_coordinates_total == DEFAULT_NOISE_COORDINATES_TOTAL:
            return cfg.replace(noise_coordinates_total=None)
        return cfg

    def _restore(self, sd: dict[str, Any]) -> None:
        """Build every part from ``sd`` first (an error leaves this auditor untouched), then
        swap them in."""
        cfg = self.config
        design = CanaryDesign.from_state(sd["design"])
        if [list(s) for s in design.shapes] != [list(s) for s in self.tap.shapes] or (
                design.k_pairs, design.m_canaries) != (cfg.k_pairs, cfg.m_canaries):
            raise ValueError("PrivacyAuditor state_dict: its canary design does not fit this "
                             "model's parameters / canary counts")
        coins = SecretCoins.from_state(sd["coins"]["in"], sd["coins"]["revealed"])
        if coins.m != cfg.m_canaries:
            raise ValueError(f"PrivacyAuditor state_dict: {coins.m} secret coins for "
                             f"m_canaries={cfg.m_canaries}")
        mechanics = torch.Generator()
        mechanics.set_state(sd["mechanics_rng"])
        saved_warnings = list(self.warnings)
        try:  # building testers may warn; the state's own warnings replace them below
            noise_coords = (sd["noise_coords"]["param"], sd["noise_coords"]["flat"])
            monitors = build_monitors(self._context(coins, noise_coords), DEFAULT_MONITORS)
            if set(monitors) != set(sd["monitors"]):
                raise ValueError(f"PrivacyAuditor state_dict: monitors {sorted(sd['monitors'])}"
                                 f", this auditor {sorted(monitors)}")
            for name, m in monitors.items():
                m.load_state_dict(sd["monitors"][name])
            decision = Decision(cfg.alpha, cfg.history_stride,
                                ["epsilon_lower_bound", *cfg.tests])
            decision.load_state_dict(sd["decision"])
        finally:
            self.warnings = saved_warnings
        c = sd["counters"]
        # ---- commit
        was_attached = self.attached
        self.tap.detach()
        self.design, self._coins, self.monitors, self.decision = design, coins, monitors, decision
        self.seed_policy = str(sd["seed_policy"])
        self.noise_coords = noise_coords
        self.tap.build(design, coins, mechanics, cfg.canary_norm, self.device,
                       self._on_internal_failure, noise_coords)
        inj, reader = self.tap.injector, self.tap.reader
        assert inj is not None and reader is not None
        # (block start's generator state, uniforms used); older states counted steps of k + m
        unit = 1 if sd.get("mechanics_unit") == "uniforms" else cfg.k_pairs + cfg.m_canaries
        inj.resume_draws(int(sd["mechanics_pos"]) * unit)
        inj.load_counters(sd["injector"])
        reader.reads = int(c["reads"])
        if was_attached:
            self.tap.attach(self, self.observe_hook)
        self.step = int(c["step"])
        self.steps_at_attach = int(c["steps_at_attach"])
        self.should_stop = bool(c["should_stop"])
        self._raised = bool(c["raised"])
        self.unobserved_steps = int(c["unobserved_steps"])
        self.skipped_nonfinite = int(c["skipped_nonfinite"])
        self.claimed_history = [(int(s), None if e is None else float(e))
                                for s, e in sd["claimed"]]
        self.warnings = list(sd["warnings"])

    def __repr__(self) -> str:
        return (f"PrivacyAuditor(step={self.step}, k_pairs={self.config.k_pairs}, "
                f"m_canaries={self.config.m_canaries}, violation={self.violation}, "
                f"attached={self.attached})")
