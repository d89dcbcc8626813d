"""Tests of dpaudit_torch/report/view.py: ReportView, the page's view of one report (method
order, ceilings, which bounds may refute, the per-step null in words and as a sentence)."""

from __future__ import annotations

import math

import pytest
from conftest import make_report

from dpaudit_torch.report import AuditReport
from dpaudit_torch.report.view import ReportView


def test_view_holds_the_validated_data() -> None:
    report = make_report("violation")
    v = ReportView(report)
    assert v.r is report and v.d == report.to_dict() and v.level_pct == "95"
    with pytest.raises(ValueError, match="'delta'"):
        ReportView(AuditReport(delta=2.0))


def test_methods_in_registry_order_then_unknown_ones() -> None:
    report = make_report("nothing")
    report.epsilon_lower_bounds = {"zeta": 0.1, "sequential": 0.0, "steinke": 0.7312,
                                   "alpha_method": 0.2}
    report.lower_bound_details["only_details"] = {}
    v = ReportView(report)
    assert v.methods() == ["steinke", "fdp", "sequential", "alpha_method", "only_details",
                           "zeta"]
    assert v.detail("zeta") == {} and v.detail("steinke")["r"] == 60
    assert v.one_step("sequential") and not v.one_step("steinke") and not v.one_step("zeta")
    assert v.may_refute("steinke")
    assert not v.may_refute("fdp") and not v.may_refute("sequential")
    assert not v.may_refute("zeta")


def test_ceilings_and_canaries() -> None:
    v = ReportView(make_report("nothing"))
    assert v.ceiling("steinke") == 3.914 and v.ceiling("fdp") == 6.5
    assert v.ceiling("sequential") == 1.0  # the largest grid epsilon
    assert v.ceiling("unknown") is None
    assert v.best_ceiling() == ("steinke", 3.914)  # only a method that may refute
    assert v.canary_count("steinke") == "400"
    assert v.canary_count("sequential") == "4 pairs per step"
    report = make_report("nothing")
    report.lower_bound_details["steinke"]["m"] = 300
    assert ReportView(report).canary_count("steinke") == "300 of 400"


def test_threshold_and_refuting() -> None:
    v = ReportView(make_report("refuted"))
    assert v.threshold_log() == pytest.approx(math.log(20.0))
    assert v.refuting() == ["steinke"]
    report = AuditReport(alpha=0.01)
    assert ReportView(report).threshold_log() == pytest.approx(math.log(100.0))
    assert ReportView(report).refuting() == [] and ReportView(report).best_ceiling() is None


def test_per_step_null_as_a_sentence_and_in_words() -> None:
    report = make_report("nothing")
    v = ReportView(report)
    sentence = v.per_step_null_text()
    assert sentence.startswith("Per-step null hypothesis: each training step is the Gaussian "
                               "mechanism with noise multiplier σ = 1.1")
    assert "It was tested at 5 points of that profile" in sentence
    assert v.per_step_null_words() == (
        "each step is the Gaussian mechanism with noise multiplier 1.1 (sensitivity C), tested "
        "at 5 points of its privacy profile (epsilon from 0.05 to 1)")
    report.sequential["per_step_null"] = {"type": "explicit", "epsilon": 1.0, "delta": 1e-5}
    v = ReportView(report)
    assert v.per_step_null_text() == ("Per-step null hypothesis: each training step is "
                                      "(ε = 1, δ = 1e-05)-DP.")
    assert v.per_step_null_words() == "each step is (epsilon = 1, delta = 1e-05)-DP"
    report.sequential["per_step_null"] = {"type": "from_the_future"}
    v = ReportView(report)
    assert v.per_step_null_text() == "No per-step null hypothesis was recorded."
    assert v.per_step_null_words() is None
    assert ReportView(AuditReport()).per_step_null_words() is None
