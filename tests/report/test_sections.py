"""Tests of dpaudit_torch/report/sections.py: the sequential tests, the plots, the threat model
and audit strength, and the provenance sections of the page."""

from __future__ import annotations

import html
import re

from conftest import make_report, power_dict

from dpaudit_torch.report import AuditReport
from dpaudit_torch.report.sections import (
    plots_section,
    provenance_section,
    sequential_section,
    strength_section,
)
from dpaudit_torch.report.view import ReportView


def _visible(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_sequential_section() -> None:
    report = make_report("violation")
    section = sequential_section(ReportView(report))
    assert section.startswith('<section id="sequential">')
    rows = re.findall(r"<tr><td>.*?</tr>", section)
    assert [_visible(r).split(" yes")[0] for r in rows] == ["MMD (González et al. 2025)",
                                                           "hockey-stick"]
    assert "Per-step null hypothesis" in section and "log(1/α) = 2.996" in section
    assert 'data-field="sequential.combined_log_wealth"' in section
    assert "Full summary: mmd" in section
    empty = sequential_section(ReportView(AuditReport()))
    assert "No sequential test was run." in empty


def test_decision_cadence_is_explained() -> None:
    report = make_report("violation")
    report.sequential["crossed_at_step"] = 4
    report.sequential["check_every"] = 10
    section = sequential_section(ReportView(report))
    assert (f"first reached the threshold at step 4; the violation was declared at step "
            f"{report.violation_step} (the decision is checked every 10 steps)") in section
    assert "Other sequential settings" in section  # crossed_at_step, check_every


def test_plots_section_has_three_figures() -> None:
    section = plots_section(ReportView(make_report("violation")))
    for anchor in ("plot-wealth", "plot-epsilon", "plot-scores"):
        # the drawn x tick labels beside the image (data-xticks), then the image
        assert re.search(rf'<figure id="{anchor}" data-xticks="\[[^"]+\]"><img '
                         rf'src="data:image/png;base64,', section), anchor
    assert section.count("<figcaption>") == 3
    empty = plots_section(ReportView(AuditReport()))
    assert empty.count('<div class="nodata">Nothing to plot') == 3
    assert "<img" not in empty


def test_strength_section() -> None:
    report = make_report("nothing")
    report.canaries["per_parameter"] = [
        {"param_index": 0, "shape": [16, 1, 3, 3], "pairs": 1, "one_run": 23},
        {"param_index": 1, "shape": [16], "pairs": 2, "one_run": 3},
    ]
    section = strength_section(ReportView(report))
    text = _visible(section)
    assert "Clipping exercised no: the canaries bypass the clipping code" in text
    assert "4 canary pairs feed the sequential tests and 400 canaries the one-run audit" in text
    assert "Steinke et al. one-run (2023): ceiling ε = 3.914." in text
    assert "sequential tests by betting: ceiling ε = 1 (per step)." in text
    assert "Interference from real data" in section
    assert "canaries are inserted before clipping" in text
    report.threat_model = {"white_box": True, "extra_flag": "x"}
    report.power = power_dict(warnings=["too few inclusions"])
    text = _visible(strength_section(ReportView(report)))
    assert "Every step observed not recorded" in text and "extra_flag x" in text
    assert "too few inclusions" in text and "Power of the one-run audit" in text


def test_records_are_one_table_in_the_page() -> None:
    report = make_report("violation")
    report.canaries["per_parameter"] = [
        {"param_index": 0, "shape": [16, 1, 3, 3], "pairs": 1, "one_run": 23},
        {"param_index": 1, "shape": [16], "pairs": 2, "one_run": 3},
    ]
    page = report.to_html()
    assert page.count('<table class="records">') == 1
    assert "<th>param_index</th>" in page and "16, 1, 3, 3" in page


def test_provenance_section() -> None:
    report = make_report("nothing")
    text = _visible(provenance_section(ReportView(report)))
    assert "Seed policy secret: canary coins drawn from os.urandom" in text
    assert "Warnings clipping was active on 3% of real examples" in text
    empty = AuditReport(versions={})
    text = _visible(provenance_section(ReportView(empty)))
    assert "Seed policy not recorded" in text and "Library versions not recorded" in text
    assert text.endswith("Warnings None.")


def test_pair_counts_say_what_they_count() -> None:
    """The sequential table's pair columns are the pairs fed over the run, and the sentence
    below it tells them from the canary pairs of one step (the per-step bound's "4 pairs per
    step", the Canaries section's k_pairs)."""
    report = make_report("violation")
    n = report.sequential["tests"]["mmd"]["n_pairs"]
    steps = report.training["audited_steps"] = n // 4
    section = sequential_section(ReportView(report))
    assert "Pairs fed over the run" in section and "Rejected after (pairs fed)" in section
    assert "Pairs seen" not in section
    (counts,) = re.findall(r'<p id="pair-counts">.*?</p>', section)
    assert _visible(counts).replace("( ", "(") == (
        f"Canary pairs: 4 canary pairs per step (k_pairs); each sequential test was fed {n} "
        f"pairs over the run ({steps} audited steps x 4).")
    assert 'data-field="sequential.tests.mmd.n_pairs"' in counts
    page = report.to_html()
    canaries = page.split('<section id="canaries">', 1)[1].split("</section>", 1)[0]
    assert "4 canary pairs per step (k_pairs)" in _visible(canaries)
