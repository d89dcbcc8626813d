"""The white-box auditor's report: every part's section, gathered at finalize.

Reads only public state of the auditor, its adapter, monitors and decision; the verdict rules
are applied by :func:`dpaudit_torch.report.build.assemble_report`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..report import AuditReport
    from .auditor import PrivacyAuditor

__all__ = ["build_audit_report"]


def build_audit_report(auditor: PrivacyAuditor, claimed: float | None) -> AuditReport:
    """The report of a finalized white-box audit (``claimed``: the accountant's epsilon)."""
    from ..report.build import assemble_report

    cfg, tap, dec = auditor.config, auditor.tap, auditor.decision
    pairs = auditor.monitors["sequential_pairs"]
    one_run = auditor.monitors["one_run"].report_section()
    seq = pairs.report_section()
    inj = tap.injector
    assert inj is not None and tap.reader is not None
    sigma_eff = tap.noise_multiplier()
    bounds: dict[str, tuple[float, dict[str, Any]]] = {
        m: (one_run["bounds"][m], one_run["details"][m]) for m in one_run["bounds"]}
    bounds["sequential"] = (seq["bound"], seq["details"])
    warnings = list(auditor.warnings)
    if auditor.skipped_nonfinite:
        msg = (f"{auditor.skipped_nonfinite} step(s) had a non-finite gradient at a canary "
               f"coordinate; their observations were dropped (on_nonfinite='skip')")
        if msg not in warnings:
            warnings.append(msg)
    findings = [dataclasses.asdict(f) for m in auditor.monitors.values() for f in m.findings()]
    if not dec.violation:  # one monitor's own test is not the audit's decision (level alpha)
        for f in findings:
            if f["level"] == "violation":
                f["level"] = "note"
                f["message"] = ("not decided: this monitor's own test crossed 1/alpha but the "
                                "audit's decision (the average of every monitor's evidence) did "
                                "not, so this is not a proof at the audit's level: " + f["message"])
    if dec.violation and not any(f["level"] == "violation" for f in findings):
        findings.insert(0, {"monitor": "decision", "level": "violation",
                            "message": "the average of the monitors' e-processes crossed 1/alpha "
                                       "(no single monitor did on its own)", "where": None})
    accounting = auditor.monitors["accounting"].report_section()
    return assemble_report(
        findings=findings,
        claim_inconsistent=bool(accounting.get("inconsistent", False)),
        audits={n: auditor.monitors[n].report_section()
                for n in ("noise", "sampling", "accounting")},
        claimed_epsilon=claimed,
        bounds=bounds,
        warnings=warnings,
        threat_notes=tap.threat_notes(),
        every_step_observed=(auditor.unobserved_steps == 0 and auditor.skipped_nonfinite == 0),
        clipping_exercised=not tap.ghost,
        delta=cfg.delta,
        alpha=cfg.alpha,
        accountant=tap.accountant.name,
        violation=dec.violation,
        violation_step=dec.violation_step,
        stopped_early=bool(auditor.should_stop),
        sequential={
            **seq["sequential"],
            "combined_log_wealth": dec.log_wealth,
            "decision_threshold_log": dec.threshold_log,
            "crossed_at_step": dec.crossed_at,
            "check_every": cfg.check_every,
            "decision": "average of the tests' e-processes >= 1/alpha (Ville)",
        },
        wealth_history={k: list(v) for k, v in dec.history.items()},
        one_run_scores=one_run["scores"],
        power=one_run["power"],
        canaries={
            **auditor.design.summary(),
            "norm_multiplier": cfg.canary_norm,
            **inj.counters(),
            "one_run_in": one_run["n_in"],
            "inclusion_rate": tap.sample_rate,
            # DDP: rank 0 inserts every canary; FSDP: each rank those in its own shard
            "injecting_rank": 0 if tap.layout is None else "shard owner",
            "seed_policy": auditor.seed_policy,
        },
        training={
            **tap.training_info(),
            "audited_steps": auditor.step,
            "nonfinite_steps_skipped": auditor.skipped_nonfinite,
            "steps_at_attach": auditor.steps_at_attach,
            "claimed_epsilon_history": [[s, e] for s, e in auditor.claimed_history],
        },
        interference=pairs.interference_summary(sigma_eff if sigma_eff > 0 else None),
        config={**cfg.to_dict(), "device": str(auditor.device)},
        seed_policy=auditor.seed_policy,
    )
