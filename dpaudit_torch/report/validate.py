"""Consistency of an audit report: fields that contradict each other, or no results at all.

:meth:`AuditReport.from_dict` checks each field on its own (types, ranges). A document can pass
those checks and still contradict itself, e.g. ``claim_refuted: true`` while every bound that may
refute lies below the claim, or a finding of level ``"violation"`` while ``violation`` is false;
rendering such a document would show a verdict its own numbers deny. :func:`validate` finds
these contradictions; the ``dpaudit report`` command refuses a document that has any.

The rules are those by which :func:`dpaudit_torch.report.build.build_report` and the auditor
fill the fields (which bound may refute a claim comes from :mod:`dpaudit_torch.registry`: only a
family-free bound on the whole run, Steinke, Nasr & Jagielski, NeurIPS 2023), so every report the
library writes passes. A report built by hand with only some fields (e.g. a black-box audit
without findings) passes as long as what it holds agrees.
"""

from __future__ import annotations

import math
from typing import Any

from ..registry import bound_method, refuting_methods
from .fingerprint import stored_fingerprint_contradictions
from .formatting import format_number
from .schema import ReportData, check_status, is_num

__all__ = ["InconsistentReportError", "contradictions", "validate"]

#: relative tolerance when two fields must hold the same number
_RTOL = 1e-9


class InconsistentReportError(ValueError):
    """An audit report whose fields contradict each other, or that holds no results."""


def _same(a: Any, b: Any) -> bool:
    if not (is_num(a) and is_num(b)):
        return True  # nothing to compare
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=_RTOL, abs_tol=1e-12)


def _fmt_bounds(bounds: dict[str, Any]) -> str:
    return ", ".join(f"{m} {format_number(v)}" for m, v in bounds.items()) or "none"


def _refutation(d: dict[str, Any]) -> list[str]:
    out = []
    claim, bounds = d["claimed_epsilon"], d["epsilon_lower_bounds"]
    refuting = refuting_methods(bounds, claim, d.get("lower_bound_details"))
    if d["claim_refuted"] and claim is None:
        out.append("claim_refuted is true but claimed_epsilon is null (no claim to refute)")
    elif d["claim_refuted"] and not refuting:
        out.append(f"claim_refuted is true but no bound that may refute the claim exceeds "
                   f"claimed_epsilon {format_number(claim)} (bounds: {_fmt_bounds(bounds)})")
    elif not d["claim_refuted"] and refuting:
        out.append(f"claim_refuted is false but the {refuting[0]} bound "
                   f"{format_number(bounds[refuting[0]])} exceeds claimed_epsilon "
                   f"{format_number(claim)}")
    return out


def _findings(d: dict[str, Any]) -> list[str]:
    out = []
    levels = {f.get("level") for f in d["findings"]}
    for level, flag in (("violation", "violation"), ("refuted", "claim_refuted"),
                        ("inconsistent", "claim_inconsistent")):
        if level in levels and not d[flag]:
            out.append(f"a finding of level {level!r} is recorded but {flag} is false")
        # a report that records findings records the one behind each flag
        elif d["findings"] and d[flag] and level not in levels:
            out.append(f"{flag} is true but no finding of level {level!r} says what was found")
    return out


def _sequential(d: dict[str, Any]) -> list[str]:
    out = []
    seq, vstep = d["sequential"], d["violation_step"]
    if d["stopped_early"] and not (d["violation"] or d["evidence"]):
        out.append("stopped_early is true but violation and evidence are false (training is "
                   "only stopped on a proven violation, or on evidence where asked)")
    if d["violation"] and d["alpha_warn"] is not None and not d["evidence"]:
        out.append("violation is true but evidence is false (a proof reaches the evidence "
                   "level first: 1/alpha_warn <= the proof's threshold)")
    estep = d["evidence_step"]
    if is_num(estep) and is_num(vstep) and estep > vstep:
        out.append(f"evidence_step {estep!r} is after violation_step {vstep!r}")
    if "crossed_at_step" in seq:
        crossed = seq["crossed_at_step"]
        if d["violation"] and crossed is None:
            out.append("violation is true but sequential.crossed_at_step is null (the "
                       "decision never crossed its threshold)")
        elif not d["violation"] and crossed is not None:
            out.append(f"sequential.crossed_at_step is {crossed!r} but violation is false")
        elif is_num(crossed) and is_num(vstep) and crossed > vstep:
            out.append(f"sequential.crossed_at_step {crossed!r} is after violation_step "
                       f"{vstep!r} (a violation is declared at or after the crossing)")
    steps = d["training"].get("audited_steps")
    if d["violation"] and is_num(steps) and steps == 0:
        out.append("violation is true but training.audited_steps is 0 (nothing was observed)")
    return out


def _numbers(d: dict[str, Any]) -> list[str]:
    out = []
    for m, det in d["lower_bound_details"].items():
        bound = d["epsilon_lower_bounds"].get(m)
        if "bound" in det and not _same(det["bound"], bound):
            out.append(f"epsilon_lower_bounds.{m} is {format_number(bound)} but "
                       f"lower_bound_details.{m}.bound is {format_number(det['bound'])}")
        ceiling = det.get("ceiling")
        spec = bound_method(m)
        if (spec is not None and is_num(ceiling) and is_num(bound)
                and bound > ceiling * (1 + 1e-6) + 1e-9):  # numerical search slack
            out.append(f"epsilon_lower_bounds.{m} {format_number(bound)} exceeds its ceiling "
                       f"{format_number(ceiling)} (the largest bound the method can certify)")
    power_claim = d["power"].get("claimed_epsilon")
    if power_claim is not None and not _same(power_claim, d["claimed_epsilon"]):
        out.append(f"power.claimed_epsilon {format_number(power_claim)} differs from "
                   f"claimed_epsilon {format_number(d['claimed_epsilon'])}")
    out += _inconsistency(d)
    return out


def _inconsistency(d: dict[str, Any]) -> list[str]:
    """``claim_inconsistent`` against the monitors' sections that record ``inconsistent`` (a
    bool): true exactly when one of them is."""
    flags = {name: sec["inconsistent"] for name, sec in d["audits"].items()
             if isinstance(sec, dict) and isinstance(sec.get("inconsistent"), bool)}
    claim = d["claim_inconsistent"]
    disagree = [n for n, flag in flags.items() if flag and not claim]
    if flags and claim and not any(flags.values()):
        disagree = list(flags)
    return [f"claim_inconsistent is {str(claim).lower()} but audits.{n}.inconsistent is "
            f"{str(flags[n]).lower()}" for n in disagree]


def _checks(d: dict[str, Any]) -> list[str]:
    """Each monitor's check section against the report's findings of that monitor."""
    out = []
    for i, sec in enumerate(d.get("checks", [])):
        want = check_status(sec, d["findings"])
        if sec["status"] != want:
            out.append(f"checks[{i}].status is {sec['status']!r} but the findings of monitor "
                       f"{sec['monitor']!r} make it {want!r}")
    return out


def contradictions(report: ReportData) -> list[str]:
    """Every contradiction between the fields of ``report`` (empty when it is consistent), and
    "no results" when it holds no lower bound, no sequential test and no finding.

    Raises:
        ValueError: a field fails its own check (as :meth:`AuditReport.to_dict`).
    """
    d = report.to_dict()
    if not d["epsilon_lower_bounds"] and not d["findings"] and not d["sequential"].get("tests"):
        return ["it holds no results (no lower bound, no sequential test, no finding)"]
    return (_refutation(d) + _findings(d) + _sequential(d) + _numbers(d) + _checks(d)
            + stored_fingerprint_contradictions(d))


def validate(report: ReportData) -> None:
    """Raise if the fields of ``report`` contradict each other or it holds no results.

    Raises:
        InconsistentReportError: (a ``ValueError``) one line listing every contradiction.
        ValueError: a field fails its own check.
    """
    found = contradictions(report)
    if found:
        raise InconsistentReportError("audit report is inconsistent: " + "; ".join(found))
