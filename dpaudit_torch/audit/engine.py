"""The audit engine: the step loop, the checks and the decision over every registered monitor.

Framework-free: it is fed :class:`~dpaudit_torch.contract.StepRecord` by an adapter (the Opacus
tap, or a test) and never names a monitor. Per audited step (:meth:`AuditEngine.observe`:
:meth:`~AuditEngine.observe_step`, then :meth:`~AuditEngine.finish_step`):

1. the record's finiteness is checked (a non-finite observation is refused before the update,
   or dropped with ``on_nonfinite="skip"``);
2. every monitor observes it (monitors that count releases also see dropped steps); after the
   step's update, the optimizer's post-hook calls :meth:`AuditEngine.after_release`;
3. every ``check_every`` steps, the check (:meth:`AuditEngine.check`, one host synchronisation):
   the device tensors buffered since the last check (the deferred finiteness flags, every
   monitor's :meth:`~dpaudit_torch.audit.monitors.Monitor.pending_tensors`) are copied to the
   host in one transfer and handed back to their owners; the monitors process what they
   buffered and return their evidence, which the decision
   (:class:`~dpaudit_torch.audit.decision.Decision`) averages into one e-process against
   1/alpha (docs/design.md section 1), and against 1/alpha_warn for evidence ("Two levels of
   evidence");
4. the claimed epsilon is read every ``claimed_every`` steps (and at the first);
5. the callbacks get the metrics (the ``on_evidence`` callbacks once, when evidence is first
   reached), and a proven violation (or, with ``stop_on="evidence"``, evidence) is acted on
   (stop / raise / warn).

At the end :meth:`AuditEngine.finalize` runs the last check and every monitor's whole-run
statistics; the report is gathered by :mod:`dpaudit_torch.audit.assemble`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._host_thread import run_here
from ..contract import StepRecord, StepRefused
from .config import AuditConfig
from .decision import Decision
from .monitors import Finding, Monitor, plain_state
from .monitors.base import host_copies

logger = logging.getLogger(__name__)

__all__ = ["AuditEngine", "PrivacyViolationError", "DECISION", "AUDITOR", "StepCallback",
           "step_callbacks"]

#: the name findings of the decision itself carry (no single monitor crossed 1/alpha)
DECISION = ("decision", "combined decision (no single monitor on its own)")
#: the name of the finding that says the audit is incomplete (the auditor's own code failed)
AUDITOR = ("auditor", "the auditor itself (its own failure)")

StepCallback = Callable[[dict[str, Any]], Any]


def step_callbacks(on_step: Any, name: str = "on_step") -> list[StepCallback]:
    """``on_step`` (None, a callable or a sequence of callables) as a list; TypeError (naming
    the setting ``name``) else."""
    if on_step is None:
        return []
    if callable(on_step):
        return [on_step]
    if isinstance(on_step, Sequence) and all(callable(f) for f in on_step):
        return list(on_step)
    raise TypeError(f"{name} must be a callable or a sequence of callables, got {on_step!r}")


class PrivacyViolationError(RuntimeError):
    """Raised (``on_violation="raise"``) before the update of the step at which the sequential
    audit proved that the per-step privacy guarantee does not hold."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


class AuditEngine:
    """The monitors, the decision and the bookkeeping of one audit.

    Args:
        config: the audit's settings.
        monitors: name -> monitor, in the order they run.
        warn: records a warning for the report.
        read_claim: returns (accountant steps, claimed epsilon) or None before any step.
        share_decision: under DDP, takes this process's decision and returns rank 0's
            ``(violation, violation_step, crossed_at)``; None without DDP.
        callbacks: receive :meth:`metrics` after every audited step (errors logged only).
        evidence_callbacks: receive :meth:`metrics` once, after the step at which the decision
            first showed evidence of a violation (errors logged only).
    """

    def __init__(self, config: AuditConfig, monitors: dict[str, Monitor],
                 warn: Callable[[str], None],
                 read_claim: Callable[[], tuple[int, float | None] | None] | None = None,
                 share_decision: Callable[[Decision], tuple[bool, int | None, int | None]]
                 | None = None,
                 callbacks: list[StepCallback] | None = None,
                 evidence_callbacks: list[StepCallback] | None = None) -> None:
        self.config = config
        self.monitors = monitors
        self._tell_monitors()
        self.warn = warn
        self._read_claim = read_claim
        self._share = share_decision
        self.callbacks = list(callbacks or [])
        self.evidence_callbacks = list(evidence_callbacks or [])
        #: whether the evidence callbacks were called (once per audit)
        self.evidence_told = False
        #: whether evidence was acted on (``stop_on="evidence"``)
        self.acted_on_evidence = False
        self.decision = self.new_decision(monitors)
        self.step = 0  # audited (observed) logical steps
        self.steps_at_attach = 0  # the training step count when the audit began
        self.should_stop = False
        self.raised = False
        #: (accountant steps, claimed epsilon) at every read of the accountant
        self.claimed_history: list[tuple[int, float | None]] = []
        #: optimizer steps that did not pass through the DP clipping (not audited)
        self.unobserved_steps = 0
        #: steps whose observation was dropped as non-finite (``on_nonfinite="skip"``)
        self.skipped_nonfinite = 0
        self._nonfinite_flags: list[torch.Tensor] = []  # deferred finiteness since the check
        #: the training step from which the audit is incomplete (the auditor's own code failed
        #: there and it detached), and that failure in words; None while complete
        self.incomplete_from: int | None = None
        self.internal_failure: str | None = None

    def _tell_monitors(self) -> None:
        """Give this engine's monitors the way to ask whether it stopped training (read at
        finalize)."""
        for m in self.monitors.values():
            m.ctx.stopped_training = self._stopped_training

    def _stopped_training(self) -> bool:
        """Whether this audit stopped training on a proven violation (``should_stop``)."""
        return self.should_stop

    def new_decision(self, monitors: dict[str, Monitor]) -> Decision:
        """A fresh decision whose history has the monitors' columns."""
        cols = [c for m in monitors.values() for c in m.columns()]
        cfg = self.config
        return Decision(cfg.decision_alpha, cfg.history_stride, cols, alpha_warn=cfg.alpha_warn)

    # ------------------------------------------------------------------ state
    @property
    def violation(self) -> bool:
        return self.decision.violation

    @property
    def claimed_epsilon(self) -> float | None:
        """The last claimed epsilon read (None before the first read)."""
        return self.claimed_history[-1][1] if self.claimed_history else None

    def labels(self) -> dict[str, str]:
        """How the report names each monitor (and the decision; the auditor itself once its
        own code failed)."""
        out = {**{n: m.label for n, m in self.monitors.items()}, DECISION[0]: DECISION[1]}
        if self.incomplete_from is not None:
            out[AUDITOR[0]] = AUDITOR[1]
        return out

    def metrics(self) -> dict[str, Any]:
        """Host-side metrics (no device synchronisation): the wealth as of the last check, the
        claimed epsilon as of the last read, and every history column."""
        d = self.decision
        out: dict[str, Any] = {
            "step": self.steps_at_attach + self.step, "audited_steps": self.step,
            "combined_log_wealth": d.log_wealth, "decision_threshold_log": d.threshold_log,
            "violation": d.violation, "claimed_epsilon": self.claimed_epsilon,
            "evidence": d.evidence, "evidence_step": d.evidence_step,
            "evidence_threshold_log": d.evidence_threshold_log}
        for m in self.monitors.values():
            for col in m.columns():
                out[m.metric_name(col)] = d.latest.get(col, 0.0)
        return out

    # ------------------------------------------------------------------ the step
    def unobserved(self) -> None:
        """An optimizer step ran without passing through the DP clipping."""
        self.unobserved_steps += 1
        if self.unobserved_steps == 1:
            self.warn("an optimizer step ran without passing through the DP optimizer's "
                      "clipping (e.g. original_optimizer.step() called directly); it is not "
                      "audited")

    def stop_auditing(self, exc: BaseException, step: int | None, go_on: bool,
                      how: str | None = None) -> str:
        """The auditor's own code failed inside training step ``step`` (None: the next one)
        and the auditor detached: the audit covers the steps before it only. Returns the
        warning; ``go_on``: the step went on as without the auditor (``how``: what was done to
        its update), else it raised before its update."""
        step = self.steps_at_attach + self.step + 1 if step is None else int(step)
        logger.error("internal auditor failure at step %d: %r", step, exc)
        if self.incomplete_from is None:
            self.incomplete_from = step
            self.internal_failure = f"{type(exc).__name__}: {exc}"
        then = ("the step was applied as without the auditor" + (f" ({how})" if how else "")
                + " and training goes on unaudited") if go_on else (
            "this step raised before its update (on_internal_error='raise')")
        return (f"internal auditor failure at step {step} ({exc!r}); the auditor detached "
                f"itself and restored the optimizer; {then}; the audit is incomplete from "
                f"step {step}")

    def before_step(self) -> None:
        """With ``on_violation="raise"``, a step after a proven violation (or after evidence,
        with ``stop_on="evidence"``) is refused."""
        if self.config.on_violation != "raise":
            return
        d = self.decision
        if d.violation:
            raise PrivacyViolationError(self.violation_message(), d.violation_step)
        if self.acts_on_evidence():
            raise PrivacyViolationError(self.evidence_message(), d.evidence_step)

    def observe(self, read: Callable[[], StepRecord],
                run: Callable[[Callable[[], Any]], Any] = run_here) -> None:
        """One audited step whose record ``read()`` returns: the reading and
        :meth:`observe_step` through ``run`` (the auditor's host thread where it has one:
        large models on the CPU, docs/auditor.md "Memory"), then :meth:`finish_step` here, on
        the training thread (the user's callbacks, the action on a violation)."""
        run(lambda: self.observe_step(read()))
        self.finish_step()

    def observe_step(self, rec: StepRecord) -> None:
        """The monitors' observation of one audited step and, at a check step, the check (the
        auditor's host thread runs this part where it has one)."""
        cfg = self.config
        skip = cfg.on_nonfinite == "skip"
        if rec.finite is False and not skip:  # refused before any state changes
            bad = np.nonzero(~np.isfinite(rec.values.cpu().numpy()))[0][:3].tolist()
            raise StepRefused(
                f"non-finite gradient at canary coordinate(s) {bad} (design order) at step "
                f"{rec.step}: the audit refuses this observation; the update was not applied")
        if rec.finite is False:
            self.skipped_nonfinite += 1
        elif isinstance(rec.finite, torch.Tensor):
            self._nonfinite_flags.append(rec.finite)
        for m in self.monitors.values():
            # a dropped step still was a release: monitors that count releases see it (and
            # must not use its values); the others see finite steps only
            if rec.finite is not False or m.observes_nonfinite:
                m.observe(rec)
        self.step = step = self.step + 1
        if step % cfg.check_every == 0:
            self.check()
        if step % cfg.claimed_every == 0 or step == 1:
            self.read_claim()

    def finish_step(self) -> None:
        """After :meth:`observe_step`, on the training thread: the ``on_step`` callbacks with
        the latest metrics, then the action on a proven violation."""
        if self.callbacks:
            metrics = self.metrics()
            for fn in self.callbacks:
                try:
                    fn(dict(metrics))
                except Exception as e:  # noqa: BLE001 - a logging callback must not break training
                    logger.warning("on_step callback %r failed: %r", fn, e)
        self.tell_evidence()
        if self.decision.violation and not self.raised:
            self.act()
        elif self.acts_on_evidence() and not self.acted_on_evidence:
            self.act(evidence=True)

    def acts_on_evidence(self) -> bool:
        """Whether evidence is reached and acts (``stop_on="evidence"``)."""
        return self.config.stop_on == "evidence" and self.decision.evidence

    def tell_evidence(self) -> None:
        """The ``on_evidence`` callbacks, once, when the decision first shows evidence."""
        if not self.decision.evidence or self.evidence_told:
            return
        self.evidence_told = True
        metrics = self.metrics()
        for fn in self.evidence_callbacks:
            try:
                fn(dict(metrics))
            except Exception as e:  # noqa: BLE001 - a callback must not break training
                logger.warning("on_evidence callback %r failed: %r", fn, e)

    def after_release(self, applied: bool = True) -> None:
        """The DP optimizer's step post-hook (``applied``: the update of the last step was
        applied) or the audit attaching (not ``applied``): every monitor's ``after_release``
        with that training step, or None."""
        step = self.steps_at_attach + self.step if applied else None
        for m in self.monitors.values():
            m.after_release(step)

    def check(self) -> None:
        """Feed what the monitors buffered, take the decision (one host synchronisation)."""
        flags, self._nonfinite_flags = self._nonfinite_flags, []
        ok = self._to_host(flags)
        if flags:  # accelerators: finiteness of the buffered steps, checked here
            if not ok.all():
                if self.config.on_nonfinite == "skip":
                    self.skipped_nonfinite += int((~ok).sum())
                else:
                    steps = sorted({s for m in self.monitors.values()
                                    for s in m.discard_pending()})
                    span = f"{steps[0]}..{steps[-1]}" if steps else "since the last check"
                    raise StepRefused(
                        f"non-finite gradient at canary coordinates during steps {span}: those "
                        f"observations are discarded and this step's update was not applied")
        evidence = {n: m.advance() for n, m in self.monitors.items()}
        self.decision.update(evidence, now=self.steps_at_attach + self.step)
        if self._share is not None:
            d = self.decision
            if d.adopt(*self._share(d)):
                self.warn("sequential decision differed from rank 0's; rank 0's decision is "
                          "used")

    def _to_host(self, flags: list[torch.Tensor]) -> np.ndarray:
        """The check's one transfer (docs/auditor.md, "On a GPU"): the deferred finiteness
        ``flags`` and every monitor's pending device tensors copied to the host together; each
        monitor gets its copies (:meth:`Monitor.take_host_copies`). Returns the flags (bool)."""
        wanted = [(m, m.pending_tensors()) for m in self.monitors.values()]
        tensors = list(flags) + [t for _, ts in wanted for t in ts]
        if not tensors:
            return np.ones(0, dtype=bool)
        host = host_copies(tensors)
        pos = len(flags)
        for m, ts in wanted:
            if ts:
                m.take_host_copies(host[pos:pos + len(ts)])
                pos += len(ts)
        return np.array([bool(a) for a in host[:len(flags)]], dtype=bool)

    def read_claim(self) -> float | None:
        """Read the accountant's epsilon now (kept once per accountant step count)."""
        got = self._read_claim() if self._read_claim is not None else None
        if got is None:
            return None
        steps, eps = got
        if not self.claimed_history or self.claimed_history[-1][0] != steps:
            self.claimed_history.append((steps, eps))
        else:
            self.claimed_history[-1] = (steps, eps)
        return eps

    # ------------------------------------------------------------------ violations
    def findings(self) -> list[Finding]:
        """Every monitor's findings (a monitor whose findings fail is logged and skipped)."""
        out: list[Finding] = []
        for m in self.monitors.values():
            try:
                out += m.findings()
            except Exception as e:  # noqa: BLE001 - wording must not break the decision
                logger.debug("findings() of monitor %s failed: %r", m.name, e)
        return out

    def violation_message(self) -> str:
        """Names the deciding monitor(s) and what each found (their violation findings)."""
        from ..report.wording import violation_message

        return violation_message([f.to_dict() for f in self.findings()],
                                 self.decision.violation_step, self.decision.alpha,
                                 self.crossing_log_wealth(), labels=self.labels())

    def crossing_log_wealth(self) -> float:
        """The averaged log-wealth that crossed 1/alpha (at ``crossed_at``; the current value
        where the crossing is not known here, e.g. a decision adopted from another rank)."""
        d = self.decision
        return d.log_wealth if d.crossed_log_wealth is None else d.crossed_log_wealth

    def evidence_message(self) -> str:
        """Evidence (not a proof) of a violation, with its level and the proof's."""
        d = self.decision
        return (f"evidence of a per-step privacy violation at step {d.evidence_step} (the "
                f"decision's e-process reached 1/alpha_warn = {1.0 / d.alpha_warn:.4g}; not a "
                f"proof, which needs 1/alpha = {1.0 / d.alpha:.4g}); stop_on='evidence'")

    def act(self, evidence: bool = False) -> None:
        """Act as configured (``on_violation``) on a proven violation, or on evidence
        (``evidence``, with ``stop_on="evidence"``)."""
        if evidence:
            self.acted_on_evidence = True
        else:
            self.raised = True
        if self.acted_on_evidence and not evidence and self.config.on_violation == "raise":
            return  # already raised at the evidence; later steps are refused (before_step)
        msg = self.evidence_message() if evidence else self.violation_message()
        mode = self.config.on_violation
        if mode == "warn":
            logger.warning(msg)
            return
        self.should_stop = True
        if mode == "stop":
            logger.warning(msg + "; should_stop is set")
        else:
            logger.error(msg + "; raising before this step's update")
            d = self.decision
            raise PrivacyViolationError(msg, d.evidence_step if evidence else d.violation_step)

    # ------------------------------------------------------------------ the end
    def finalize(self) -> float | None:
        """The last check, the claimed epsilon, every monitor's whole-run statistics; returns
        the claimed epsilon."""
        self.check()
        self.tell_evidence()
        evidence = self.acts_on_evidence() and not self.acted_on_evidence
        if (self.decision.violation and not self.raised) or evidence:
            self.raised = self.raised or self.decision.violation
            self.acted_on_evidence = self.acted_on_evidence or evidence
            if self.config.on_violation in ("stop", "raise"):
                self.should_stop = True
            logger.warning(self.violation_message() if self.decision.violation
                           else self.evidence_message())
        if self.step:
            self.decision.record(self.steps_at_attach + self.step)  # the final point
        else:
            self.warn("finalize() after 0 audited steps: no training step was audited, so "
                      "this report holds no evidence about the run")
        claimed = self.read_claim()
        for m in self.monitors.values():
            m.finalize(claimed)
        return claimed

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Every monitor's state and settings (under its name), the decision, the counters."""
        return {
            "monitors": {n: plain_state(m.state_dict()) for n, m in self.monitors.items()},
            "monitor_settings": {n: m.settings.to_dict() for n, m in self.monitors.items()},
            "decision": self.decision.state_dict(),
            "counters": {"step": self.step, "steps_at_attach": self.steps_at_attach,
                         "should_stop": self.should_stop, "raised": self.raised,
                         "evidence_told": self.evidence_told,
                         "acted_on_evidence": self.acted_on_evidence,
                         "unobserved_steps": self.unobserved_steps,
                         "skipped_nonfinite": self.skipped_nonfinite,
                         "incomplete_from": self.incomplete_from,
                         "internal_failure": self.internal_failure},
            "claimed": [[s, e] for s, e in self.claimed_history],
        }

    def restore(self, config: AuditConfig, monitors: dict[str, Monitor], decision: Decision,
                sd: dict[str, Any]) -> None:
        """Swap in monitors and a decision already loaded, and the counters of ``sd``."""
        c = sd["counters"]
        self.config, self.monitors, self.decision = config, monitors, decision
        self._tell_monitors()
        self.step = int(c["step"])
        self.steps_at_attach = int(c["steps_at_attach"])
        self.should_stop = bool(c["should_stop"])
        self.raised = bool(c["raised"])
        self.evidence_told = bool(c.get("evidence_told", self.decision.evidence))
        self.acted_on_evidence = bool(c.get("acted_on_evidence", False))
        self.unobserved_steps = int(c["unobserved_steps"])
        self.skipped_nonfinite = int(c["skipped_nonfinite"])
        self.incomplete_from = c.get("incomplete_from")  # absent from older layouts
        self.internal_failure = c.get("internal_failure")
        self.claimed_history = [(int(s), None if e is None else float(e))
                                for s, e in sd["claimed"]]
        self._nonfinite_flags = []
