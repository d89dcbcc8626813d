"""Tests of dpaudit_torch/report/validate.py: contradictions between a report's fields, and a
report with no results (what ``dpaudit report`` refuses)."""

from __future__ import annotations

import re

import pytest
from conftest import make_report

from dpaudit_torch.report import AuditReport, InconsistentReportError, contradictions, validate


def _consistent() -> AuditReport:
    r = make_report("nothing")
    r.findings = [{"monitor": "accounting", "level": "note", "message": "x", "where": None}]
    return r


CONTRADICTIONS = [
    ("claim_refuted with every bound below the claim",
     {"claim_refuted": True}, "claim_refuted is true but no bound that may refute"),
    ("claim_refuted without a claim",
     {"claim_refuted": True, "claimed_epsilon": None}, "claimed_epsilon is null"),
    ("a refuting bound above the claim, claim_refuted false",
     {"claimed_epsilon": 0.5}, "claim_refuted is false but the steinke bound 0.7312"),
    ("a violation finding with violation false",
     {"findings": [{"monitor": "noise", "level": "violation", "message": "m", "where": None}]},
     "a finding of level 'violation' is recorded but violation is false"),
    ("violation without its finding",
     {"violation": True, "violation_step": 3},
     "violation is true but no finding of level 'violation'"),
    ("a refuted finding with claim_refuted false",
     {"findings": [{"monitor": "one_run", "level": "refuted", "message": "m", "where": None}]},
     "a finding of level 'refuted' is recorded but claim_refuted is false"),
    ("stopped early without a violation", {"stopped_early": True},
     "stopped_early is true but violation and evidence are false"),
    ("a violation that is not evidence", {"violation": True, "violation_step": 3,
                                          "alpha_warn": 0.05},
     "violation is true but evidence is false"),
    ("evidence after the proof", {"violation": True, "violation_step": 3, "evidence": True,
                                  "evidence_step": 5},
     "evidence_step 5 is after violation_step 3"),
    ("a crossing without a violation", {"sequential_extra": {"crossed_at_step": 4}},
     "crossed_at_step is 4 but violation is false"),
    ("a bound that differs from its details",
     {"epsilon_lower_bounds": {"steinke": 0.5, "fdp": 0.9876543, "sequential": 0.0}},
     "epsilon_lower_bounds.steinke is 0.5 but lower_bound_details.steinke.bound is 0.7312"),
    ("a bound above its ceiling",
     {"epsilon_lower_bounds": {"steinke": 4.5, "fdp": 0.9876543, "sequential": 0.0},
      "claimed_epsilon": 5.0},
     "epsilon_lower_bounds.steinke 4.5 exceeds its ceiling 3.914"),
    ("claim_inconsistent against the accounting section",
     {"audits": {"accounting": {"inconsistent": True}}},
     "claim_inconsistent is false but audits.accounting.inconsistent is true"),
    ("claim_inconsistent with no section saying so",
     {"audits": {"accounting": {"inconsistent": False}}, "claim_inconsistent": True,
      "findings": [{"monitor": "accounting", "level": "inconsistent", "message": "m",
                    "where": None}]},
     "claim_inconsistent is true but audits.accounting.inconsistent is false"),
    ("power measured against another claim", {"power": {"claimed_epsilon": 1.0}},
     "power.claimed_epsilon 1 differs from claimed_epsilon 2.346"),
    ("a check section whose status its monitor's findings deny",
     {"checks": [{"monitor": "accounting", "title": "Accounting", "ran": True,
                  "reason_not_run": None, "status": "checked, nothing found", "checked": [],
                  "measured": [], "not_checked": [], "findings": []}],
      "audits": {"accounting": {"inconsistent": True}}, "claim_inconsistent": True,
      "findings": [{"monitor": "accounting", "level": "inconsistent", "message": "m",
                    "where": None}]},
     "checks[0].status is 'checked, nothing found' but the findings of monitor 'accounting' "
     "make it 'inconsistent'"),
    ("no results at all", {"epsilon_lower_bounds": {}, "lower_bound_details": {},
                           "findings": [], "sequential": {}}, "it holds no results"),
]


@pytest.mark.parametrize(("what", "change", "needle"), CONTRADICTIONS,
                         ids=[c[0] for c in CONTRADICTIONS])
def test_validate_finds_contradictions(what: str, change: dict, needle: str) -> None:
    r = _consistent()
    assert contradictions(r) == []
    for k, v in change.items():
        if k == "sequential_extra":
            r.sequential.update(v)
        else:
            setattr(r, k, v)
    found = contradictions(r)
    assert any(needle in c for c in found), found
    with pytest.raises(InconsistentReportError, match=re.escape(needle)):
        validate(r)


def test_synthetic_reports_are_consistent() -> None:
    for kind in ("violation", "refuted", "nothing"):
        report = make_report(kind)
        if kind == "violation":  # a report with findings records the one behind each flag
            report.findings = [{"monitor": "m", "level": "violation", "message": "x",
                                "where": None}]
        assert contradictions(report) == [], kind
        validate(report)
    assert contradictions(AuditReport()) == [
        "it holds no results (no lower bound, no sequential test, no finding)"]


def test_any_section_that_records_inconsistent_is_checked() -> None:
    """The rule names no monitor: every ``audits`` section with a bool ``inconsistent``."""
    r = _consistent()
    r.audits = {"some_monitor": {"inconsistent": True}, "other": {"inconsistent": False},
                "no_flag": {"x": 1}}
    assert contradictions(r) == [
        "claim_inconsistent is false but audits.some_monitor.inconsistent is true"]
    r.claim_inconsistent = True
    r.findings.append({"monitor": "some_monitor", "level": "inconsistent", "message": "m",
                       "where": None})
    assert contradictions(r) == []


def test_a_field_that_fails_its_own_check_is_a_value_error() -> None:
    r = _consistent()
    r.alpha = 2.0
    with pytest.raises(ValueError, match="'alpha'") as info:
        validate(r)
    assert not isinstance(info.value, InconsistentReportError)
