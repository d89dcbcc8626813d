"""Tests of dpaudit_torch/report/bounds.py: the whole-run claim beside its lower bounds in one
table, the per-step bound in another (never compared with the claim), and the notes on both."""

from __future__ import annotations

import html
import re

from conftest import make_report

from dpaudit_torch.report import AuditReport
from dpaudit_torch.report.bounds import bounds_section
from dpaudit_torch.report.view import ReportView


def _section(report: AuditReport) -> str:
    return bounds_section(ReportView(report))


def _table(section: str, table_id: str) -> str:
    m = re.search(rf'<table id="{table_id}">.*?</table>', section, re.S)
    assert m is not None, table_id
    return m.group(0)


def _visible(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_whole_run_and_per_step_tables_are_apart() -> None:
    section = _section(make_report("violation"))
    whole = _table(section, "bounds-table")
    step = _table(section, "per-step-bound-table")
    assert 'data-method="steinke"' in whole and 'data-method="fdp"' in whole
    assert 'data-method="sequential"' not in whole
    assert 'data-method="sequential"' in step and 'data-method="steinke"' not in step
    assert "Lower bound ε (whole run)" in whole and "Lower bound ε (one step)" in step
    assert section.index("bounds-table") < section.index("per-step-bound-table")
    # the per-step bound holds at the delta of its grid point, each point at level alpha
    row = _visible(step.split("<tbody>")[1])
    assert "0.5 1e-06 α = 0.05 (95% confidence) each point at level α (not simultaneous), " \
           "5 points 4 pairs per step 1" in row
    assert "All recorded details: sequential" in section


def test_whole_run_row() -> None:
    whole = _table(_section(make_report("nothing")), "bounds-table")
    row = _visible(re.search(r'<tr data-method="steinke">.*?</tr>', whole, re.S).group(0))
    assert row == ("Steinke et al. one-run (2023) whole training run 0.7312 no α = 0.05 (95% "
                   "confidence); 0.00625 per candidate (Bonferroni over 8 candidates) bonferroni "
                   "(two_sided) 400 60 / 52 3.914 1.02")
    assert 'data-field="lower_bound_details.steinke.ceiling"' in whole


def test_a_gaussian_family_bound_alone_does_not_refute() -> None:
    report = make_report("nothing")
    report.claimed_epsilon = 0.8  # below the f-DP bound 0.9877, above Steinke's 0.7312
    section = _section(report)
    assert section.count("yes: claim refuted") == 0
    assert "assumes the Gaussian family, so it does not refute the claim" in section
    report.claimed_epsilon = 0.5  # now Steinke (family-free) exceeds it too
    report.claim_refuted = True
    section = _section(report)
    assert section.count("yes: claim refuted") == 1
    assert "The privacy claim is <strong>false</strong>" in report.to_html()


def test_an_unknown_method_never_refutes() -> None:
    report = make_report("nothing")
    report.epsilon_lower_bounds["newer"] = 9.0
    report.lower_bound_details["newer"] = {}
    row = re.search(r'<tr data-method="newer">.*?</tr>', _section(report), re.S).group(0)
    assert "not known to this version of dpaudit_torch" in row
    assert "does not count it as refuting the claim" in row


def test_ceiling_below_claim_is_pointed_out() -> None:
    report = make_report("nothing")
    report.claimed_epsilon = 5.0  # above Steinke's ceiling 3.914 (f-DP never refutes alone)
    assert _section(report).count(
        "could not have refuted the claim even with every guess right") == 1
    assert "could not have refuted" not in _section(make_report("nothing"))


def test_no_bounds() -> None:
    assert "No lower bound was computed." in _section(AuditReport())
    only_step = make_report("nothing")
    for m in ("steinke", "fdp"):
        del only_step.epsilon_lower_bounds[m], only_step.lower_bound_details[m]
    section = _section(only_step)
    assert "No lower bound on the whole run" in section and "per-step-bound-table" in section
    zero = _visible(_table(section, "per-step-bound-table"))
    assert "none: no grid point rejected" in zero
