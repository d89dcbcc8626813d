"""Tests of dpaudit_torch/report/build.py: build_report applies the verdict rules of the registry
(only a family-free bound on the whole run refutes the claim) to the parts of an audit."""

from __future__ import annotations

from typing import Any

from conftest import MONITOR_LABELS

from dpaudit_torch.registry import ONE_STEP
from dpaudit_torch.report import AuditReport, contradictions
from dpaudit_torch.report.build import THREAT_MODEL_NOTES, build_report


def _build(claimed: float | None, bounds: dict[str, float], **kw: Any) -> AuditReport:
    args: dict[str, Any] = {
        "claimed_epsilon": claimed,
        "bounds": {m: (b, {"bound": b}) for m, b in bounds.items()},
        "warnings": ["w"], "threat_notes": ["canaries bypass nothing"],
        "every_step_observed": True, "clipping_exercised": False}
    args.update(kw)
    return build_report(**args)


def test_a_family_free_whole_run_bound_above_the_claim_refutes_it() -> None:
    report = _build(0.5, {"sequential": 0.9, "fdp": 0.2, "steinke": 0.7, "newer": 3.0})
    assert isinstance(report, AuditReport)
    assert report.claim_refuted and report.verdict == "claim refuted"
    # registry order first, then the methods this version does not know
    assert list(report.epsilon_lower_bounds) == ["steinke", "fdp", "sequential", "newer"]
    assert report.lower_bound_details["steinke"] == {"bound": 0.7}
    refuted = report.findings[0]
    assert refuted == {"monitor": "one_run", "level": "refuted", "where": "the whole training run",
                       "message": "the Steinke et al. one-run (2023) lower bound 0.7 on the "
                                  "whole run's epsilon exceeds the claimed epsilon 0.5"}
    assert contradictions(report) == []


def test_a_gaussian_family_bound_above_the_claim_is_a_warning() -> None:
    report = _build(0.5, {"steinke": 0.3, "fdp": 0.9, "sequential": 2.0})
    assert not report.claim_refuted and report.findings == []
    assert report.warnings[0] == "w"
    assert report.warnings[1] == (
        "the f-DP one-run, Gaussian family (Mahloujifar et al.) bound 0.9 exceeds the claimed "
        "epsilon 0.5; it assumes the Gaussian trade-off family, so it is not used to refute the "
        "claim")
    assert len(report.warnings) == 2  # the per-step bound is never compared with the claim
    assert not _build(None, {"fdp": 0.9}).warnings[1:]  # no claim, nothing to compare


def test_findings_threat_model_and_other_fields() -> None:
    mine = [{"monitor": "pairs", "level": "violation", "message": "m", "where": None,
             "scope": ONE_STEP}]
    report = _build(2.0, {"steinke": 0.1}, findings=mine, violation=True, violation_step=4,
                    monitor_labels=MONITOR_LABELS, seed_policy="secret")
    assert report.findings == mine and report.findings is not mine
    assert report.monitor_labels == MONITOR_LABELS and report.seed_policy == "secret"
    assert report.threat_model == {
        "white_box": True, "every_step_observed": True, "clipping_exercised": False,
        "notes": [*THREAT_MODEL_NOTES, "canaries bypass nothing"]}
    assert report.verdict == "violation proven at step 4"
    AuditReport.from_dict(report.to_dict())
