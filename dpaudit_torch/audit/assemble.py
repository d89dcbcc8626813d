"""The white-box audit's report: every monitor's contribution and the engine's decision,
gathered at finalize.

Loops over the monitors the engine ran and never names one: each gives its
:class:`~dpaudit_torch.audit.monitors.Contribution` (bounds, its ``audits`` section, the report
fields it owns, entries of the canaries section, a verdict level) and its findings; the verdict
rules are applied by :func:`dpaudit_torch.report.build.build_report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .engine import AUDITOR, DECISION
from .monitors.checks import CheckSection, causes_text, section_dict

if TYPE_CHECKING:  # pragma: no cover
    from ..report import AuditReport
    from .auditor import PrivacyAuditor

__all__ = ["assemble_report"]


def _findings(aud: PrivacyAuditor, sections: dict[str, CheckSection]
              ) -> list[dict[str, Any]]:
    """Every monitor's findings; a monitor's own violation is a note unless the decision (the
    average of every monitor's evidence) crossed 1/alpha. A finding's possible causes that
    another monitor's passed checks rule out are worded as passed (``Finding.causes``)."""
    dec = aud.engine.decision
    found = [f for m in aud.engine.monitors.values() for f in m.findings()]
    cleared = [c for name, sec in sections.items() for c in sec.rules_out
               if sec.ran and not any(f.monitor == name and f.level != "note" for f in found)]
    findings = []
    for f in found:
        d = f.to_dict()
        if f.causes and set(f.causes) & set(cleared):
            d["message"] = d["message"].replace(causes_text(f.causes),
                                                causes_text(f.causes, cleared))
        findings.append(d)
    if not dec.violation:  # one monitor's own test is not the audit's decision (level alpha)
        for f in findings:
            if f["level"] == "violation":
                f["level"] = "note"
                f["message"] = ("not decided: this monitor's own test crossed 1/alpha but the "
                                "audit's decision (the average of every monitor's evidence) did "
                                "not, so this is not a proof at the audit's level: " + f["message"])
    if dec.violation and not any(f["level"] == "violation" for f in findings):
        findings.insert(0, {"monitor": DECISION[0], "level": "violation",
                            "message": "the average of the monitors' e-processes crossed 1/alpha "
                                       "(no single monitor did on its own)", "where": None})
    eng = aud.engine
    if eng.incomplete_from is not None:
        findings.append({
            "monitor": AUDITOR[0], "level": "note", "where": None,
            "message": f"the audit is incomplete from step {eng.incomplete_from}: the "
                       f"auditor's own code failed there ({eng.internal_failure}) and it "
                       f"detached itself; every statistic of this report covers the "
                       f"{eng.step} step(s) audited before it (and, in the monitors that had "
                       f"observed it, the failing step's release), none after"})
    return findings


def assemble_report(aud: PrivacyAuditor, claimed: float | None) -> AuditReport:
    """The report of a finalized white-box audit (``claimed``: the accountant's epsilon)."""
    from ..report.build import build_report
    from ..report.fingerprint import architecture_hash

    cfg, tap, eng = aud.config, aud.tap, aud.engine
    dec = eng.decision
    inj = tap.injector
    assert inj is not None and tap.reader is not None
    bounds: dict[str, tuple[float, dict[str, Any]]] = {}
    audits: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    canaries: dict[str, Any] = {}
    inconsistent = False
    for name, m in eng.monitors.items():
        c = m.contribution()
        clash = (set(c.bounds) & set(bounds)) | (set(c.fields) & set(fields))
        if clash:
            raise RuntimeError(f"monitor {name!r} reports {sorted(clash)}, which another "
                               f"monitor already reported")
        bounds.update(c.bounds)
        fields.update(c.fields)
        canaries.update(c.canaries)
        if c.section is not None:
            audits[name] = c.section
        inconsistent = inconsistent or c.verdict == "inconsistent"
    sections = {name: m.check_section() for name, m in eng.monitors.items()}
    findings = _findings(aud, sections)
    checks = [section_dict(name, sec) for name, sec in sections.items()]
    warnings = list(aud.warnings)
    if eng.skipped_nonfinite:
        msg = (f"{eng.skipped_nonfinite} step(s) had a non-finite gradient at a canary "
               f"coordinate; their observations were dropped (on_nonfinite='skip')")
        if msg not in warnings:
            warnings.append(msg)
    sequential = {
        **fields.pop("sequential", {}),
        "combined_log_wealth": dec.log_wealth,
        "decision_threshold_log": dec.threshold_log,
        "evidence_threshold_log": dec.evidence_threshold_log,
        "crossed_at_step": dec.crossed_at,
        "evidence_at_step": dec.evidence_at,
        "check_every": cfg.check_every,
        "decision": "average of the tests' e-processes >= 1/alpha (Ville): proof at the "
                    "decision's share of alpha, evidence at 1/alpha_warn",
    }
    # the one field whose empty form the page reads by key (the report's defaults do the rest)
    fields.setdefault("one_run_scores", {"in": [], "out": []})
    return build_report(
        findings=findings,
        checks=checks,
        claim_inconsistent=inconsistent,
        audits=audits,
        claimed_epsilon=claimed,
        bounds=bounds,
        warnings=warnings,
        threat_notes=tap.threat_notes(),
        every_step_observed=(eng.unobserved_steps == 0 and eng.skipped_nonfinite == 0
                             and eng.incomplete_from is None),
        clipping_exercised=tap.clipping_exercised,
        delta=cfg.delta,
        alpha=cfg.alpha,
        alpha_warn=cfg.alpha_warn,
        evidence=dec.evidence,
        evidence_step=dec.evidence_step,
        proof_levels=cfg.proof_levels,
        accountant=tap.accountant.name,
        violation=dec.violation,
        violation_step=dec.violation_step,
        stopped_early=bool(eng.should_stop),
        sequential=sequential,
        wealth_history={k: list(v) for k, v in dec.history.items()},
        canaries={
            **aud.design.summary(),
            "norm_multiplier": cfg.canary_norm,
            **inj.counters(),
            **canaries,
            "inclusion_rate": tap.sample_rate,
            # DDP: rank 0 inserts every canary; FSDP: each rank those in its own shard
            "injecting_rank": 0 if tap.layout is None else "shard owner",
            "seed_policy": aud.seed_policy,
        },
        training={
            **tap.training_info(),
            "audited_steps": eng.step,
            "nonfinite_steps_skipped": eng.skipped_nonfinite,
            "audit_incomplete_from_step": eng.incomplete_from,
            "steps_at_attach": eng.steps_at_attach,
            "claimed_epsilon_history": [[s, e] for s, e in eng.claimed_history],
            # module classes and parameter shapes of the model handed over (model=), or None
            "architecture_hash": architecture_hash(tap.model),
        },
        config={**cfg.to_dict(), "device": str(aud.device)},
        seed_policy=aud.seed_policy,
        monitor_labels=eng.labels(),
        **fields,
    )
