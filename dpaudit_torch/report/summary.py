"""The plain-text summary of an audit report (:meth:`AuditReport.summary_text`, printed by the
``dpaudit`` command).

It keeps apart what the report says about the *whole training run* (the claimed epsilon and the
one-run lower bounds of Steinke, Nasr & Jagielski, NeurIPS 2023, and Mahloujifar, Melis &
Chaudhuri, ICML 2025, all at the claim's delta) and what it says about *one training step* (the
bound of the sequential tests, docs/design.md section 4, at the delta of its own grid point): the
two are never on the same line, and the per-step bound is never compared with the claim.
"""

from __future__ import annotations

from ..registry import bound_method, refuting_methods
from .formatting import (
    NO_STEPS_SENTENCE,
    bound_alpha,
    decision_alpha,
    evidence_sentence,
    format_number,
    levels_sentence,
    pairs_sentence,
    power_sentence,
    scope_text,
)
from .schema import (
    VERDICT_NOTHING,
    ReportData,
    is_num,
    is_one_step,
    no_steps_audited,
    per_step_delta,
)
from .wording import deciders_text, deciding_findings

__all__ = ["summary_text", "family_promise"]


def family_promise(method: str) -> str | None:
    """What a family bound that may refute a claim proves (None for any other method): a lower
    bound for releases in its family, which is the claim's own model, not for an arbitrary
    mechanism (docs/design.md section 13)."""
    spec = bound_method(method)
    if spec is None or spec.family_free or not spec.refutes_if_verified or not spec.family:
        return None
    return (f"It is a lower bound for releases in the {spec.family} family, which is the "
            f"claim's own model: above the claim it refutes the claim as stated (its model or "
            f"its parameters), not the true epsilon of an arbitrary mechanism.")


def summary_text(report: ReportData) -> str:
    """A few plain-language lines: the verdict, the whole-run claim and its lower bounds, then
    (separately) the per-step bound, the deciding monitors (named by the report's
    ``monitor_labels``) and the other findings."""
    r = report
    level = format_number(100.0 * (1.0 - r.alpha))
    lines = [f"Verdict: {r.verdict}."]

    def step_level(details: dict) -> str:  # the per-step grid's own level where it records one
        own = details.get("level")
        return (format_number(100.0 * (1.0 - own)) if is_num(own) and 0.0 < own < 1.0
                else level)

    if no_steps_audited(r.training):
        lines.append(NO_STEPS_SENTENCE)
    acc = f" (accountant: {r.accountant})" if r.accountant else ""
    lines.append(f"Whole-run claim: epsilon = {format_number(r.claimed_epsilon)} at delta = "
                 f"{format_number(r.delta)}{acc}.")
    whole = [m for m in r.epsilon_lower_bounds if not is_one_step(m)]
    step = [m for m in r.epsilon_lower_bounds if is_one_step(m)]
    for method in whole:
        scope = (scope_text(method, article=True, with_family=True)
                 or "a scope this version of dpaudit_torch does not know")
        own = bound_alpha(r.lower_bound_details.get(method, {}), r.alpha)  # its own level
        pct = level if own == r.alpha else format_number(100.0 * (1.0 - own))
        line = (f"Audited lower bound ({method}, for {scope}, at the same delta): epsilon >= "
                f"{format_number(r.epsilon_lower_bounds[method])} with {pct}% confidence.")
        promise = family_promise(method)
        if promise:
            line += f" {promise}"
        lines.append(line)
    if not r.epsilon_lower_bounds:
        lines.append("No lower bound was computed.")
    elif not whole:
        lines.append("No lower bound on the whole run's epsilon was computed.")
    for method in step:
        bound = r.epsilon_lower_bounds[method]
        details = r.lower_bound_details.get(method, {})
        delta = per_step_delta(bound, details)
        at = (f" at that step's delta = {format_number(delta)}" if delta is not None
              else " (no grid point rejected)" if bound == 0 else "")
        lines.append(
            f"Per-step bound ({method}; a statement about ONE training step, not about the "
            f"whole-run claim, and never compared with it): epsilon >= {format_number(bound)}"
            f"{at} with {step_level(details)}% confidence.")
    pairs = pairs_sentence(r.canaries, r.sequential, r.training) if step else None
    if pairs:  # "16 pairs" beside "4800 pairs": per step, and fed over the run
        lines.append(f"Canary pairs: {pairs}")
    if r.claim_refuted:
        refuting = refuting_methods(r.epsilon_lower_bounds, r.claimed_epsilon,
                                    r.lower_bound_details)
        if refuting and all(family_promise(m) for m in refuting):
            lines.append("A lower bound valid within the claim's own model exceeds the claimed "
                         "epsilon: the claim as stated (its model or its parameters) is false "
                         "(with the stated confidence).")
        else:
            lines.append("A valid lower bound on the whole run's epsilon exceeds the claimed "
                         "epsilon: the claim is false (with the stated confidence).")
    shown: list[object] = []
    if r.violation:
        at = "" if r.violation_step is None else f" at training step {r.violation_step}"
        stop = " Training was stopped early." if r.stopped_early else ""
        deciders = deciders_text(r.findings, labels=r.monitor_labels)
        level = format_number(decision_alpha(r.sequential, r.alpha))
        lines.append(f"The audit proved{at} that the training is less private than claimed "
                     f"(anytime-valid decision at level alpha = {level}). "
                     f"Deciding monitor(s): {deciders}.{stop}")
        shown = list(deciding_findings(r.findings))
    elif r.evidence:
        lines.append(evidence_sentence(r.evidence_step, r.alpha_warn, r.violation,
                                       r.stopped_early))
    for f in r.findings:
        if f.get("level") in ("violation", "inconsistent", "finding") and f not in shown:
            where = f" [{f['where']}]" if f.get("where") else ""
            lines.append(f"Finding ({f.get('monitor')}, {f.get('level')}){where}: "
                         f"{f.get('message')}")
    if r.verdict == VERDICT_NOTHING:
        lines.append(
            "Nothing found is not a proof of privacy: these are lower bounds, and this "
            "audit could only have detected leaks up to its ceiling.")
    power = power_sentence(r.power)
    if power:
        lines.append(power)
    levels = levels_sentence(r.alpha, r.alpha_warn, r.proof_levels)
    if levels:
        lines.append(levels)
    return "\n".join(lines)
