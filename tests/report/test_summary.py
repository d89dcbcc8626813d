"""Tests of dpaudit_torch/report/summary.py: the plain-text summary (whole-run claim and per-step
bound on lines of their own, the deciding monitors named by the report's labels, the findings,
the power sentence)."""

from __future__ import annotations

from conftest import make_report, power_dict

from dpaudit_torch.registry import ONE_STEP
from dpaudit_torch.report import AuditReport, format_number
from dpaudit_torch.report.formatting import NO_STEPS_SENTENCE
from dpaudit_torch.report.summary import summary_text

KINDS = ("violation", "refuted", "nothing")


def test_verdict_claim_and_bounds_are_in_the_summary() -> None:
    for kind in KINDS:
        rep = make_report(kind)
        text = summary_text(rep)
        assert text.splitlines()[0] == f"Verdict: {rep.verdict}."
        assert format_number(rep.claimed_epsilon) in text
        for bound in rep.epsilon_lower_bounds.values():
            assert format_number(bound) in text
    assert "not a proof of privacy" in summary_text(make_report("nothing"))
    assert "the claim is false" in summary_text(make_report("refuted"))


def test_whole_run_and_per_step_lines_are_apart() -> None:
    lines = summary_text(make_report("violation")).splitlines()
    claim = [ln for ln in lines if ln.startswith("Whole-run claim:")]
    assert claim == ["Whole-run claim: epsilon = 2.346 at delta = 1e-05 (accountant: prv)."]
    whole = [ln for ln in lines if ln.startswith("Audited lower bound (")]
    assert [ln.split(",")[0] for ln in whole] == ["Audited lower bound (steinke",
                                                 "Audited lower bound (fdp"]
    assert "for the whole training run, Gaussian family" in whole[1]
    step = [ln for ln in lines if ln.startswith("Per-step bound (sequential;")]
    assert len(step) == 1
    assert "epsilon >= 0.5 at that step's delta = 1e-06 with 95% confidence" in step[0]
    nothing = summary_text(make_report("nothing"))
    assert "epsilon >= 0 (no grid point rejected)" in nothing


def test_missing_bounds_and_unknown_methods() -> None:
    assert "No lower bound was computed." in summary_text(AuditReport())
    only_step = AuditReport(epsilon_lower_bounds={"sequential": 0.0})
    assert "No lower bound on the whole run's epsilon was computed." in summary_text(only_step)
    future = AuditReport(epsilon_lower_bounds={"newer": 0.25})
    assert ("Audited lower bound (newer, for a scope this version of dpaudit_torch does not "
            "know, at the same delta): epsilon >= 0.25") in summary_text(future)


def test_deciding_monitors_are_named_by_the_reports_labels() -> None:
    report = make_report("violation")
    report.findings = [{"monitor": "sampling", "level": "violation", "where": "data loader",
                        "message": "batch sizes vary too little"}]
    text = summary_text(report)
    assert ("Deciding monitor(s): sampling (batch sizes not Poisson) [data loader]: "
            "batch sizes vary too little. Training was stopped early.") in text
    assert text.count("vary too little") == 1  # told once, not again as a plain finding
    report.monitor_labels = {}  # an older report: the monitor under its own name
    assert ("Deciding monitor(s): sampling [data loader]: batch sizes vary too little."
            in summary_text(report))
    report.findings = []
    assert "the deciding monitor was not recorded" in summary_text(report)


def test_per_step_scope_changes_nothing_in_the_summary() -> None:
    report = make_report("violation")
    finding = {"monitor": "pairs", "level": "violation", "where": None, "message": "leaks"}
    report.findings = [finding]
    plain = summary_text(report)
    report.findings = [dict(finding, scope=ONE_STEP)]
    assert summary_text(report) == plain


def test_other_findings_are_listed() -> None:
    report = make_report("nothing")
    report.findings = [
        {"monitor": "accounting", "level": "inconsistent", "where": "accountant",
         "message": "the accountant counted 80 steps; noise was released 20 times"},
        {"monitor": "noise", "level": "finding", "where": None, "message": "bfloat16 grid"},
        {"monitor": "sampling", "level": "note", "where": None, "message": "check not run"}]
    report.claim_inconsistent = True
    text = summary_text(report)
    assert ("Finding (accounting, inconsistent) [accountant]: the accountant counted 80 steps; "
            "noise was released 20 times") in text
    assert "Finding (noise, finding): bfloat16 grid" in text
    assert "check not run" not in text  # notes stay in the report


def test_power_and_no_steps_sentences() -> None:
    report = make_report("nothing")
    report.power = power_dict()
    assert summary_text(report).splitlines()[-1].startswith(
        "A correct implementation with this run's settings would give a Steinke bound of about "
        "0.4123")
    report.power = power_dict(no_power=True, expected_bound=None, note="no steps")
    assert "had no power to detect a leak (no steps)" in summary_text(report)
    assert NO_STEPS_SENTENCE not in summary_text(report)
    report.training["audited_steps"] = 0
    assert summary_text(report).splitlines()[1] == NO_STEPS_SENTENCE


def test_the_two_pair_counts_say_what_they_count() -> None:
    """"4 pairs" (a step's canary pairs) beside "80 pairs" (fed to each test over the run):
    the summary says which is which, and the product when it holds."""
    rep = make_report("violation")
    n = rep.sequential["tests"]["mmd"]["n_pairs"]
    steps = rep.training["audited_steps"] = n // 4
    line = [ln for ln in summary_text(rep).splitlines() if ln.startswith("Canary pairs:")]
    assert line == [f"Canary pairs: 4 canary pairs per step (k_pairs); each sequential test "
                    f"was fed {n} pairs over the run ({steps} audited steps x 4)."]
    rep.sequential["tests"]["mmd"]["n_pairs"] = n - 4  # e.g. a step dropped as non-finite
    rep.sequential["tests"]["hockey_stick"]["n_pairs"] = n - 4
    (line,) = [ln for ln in summary_text(rep).splitlines() if ln.startswith("Canary pairs:")]
    assert line.endswith(f"was fed {n - 4} pairs over the run.")
    assert "Canary pairs:" not in summary_text(AuditReport())
