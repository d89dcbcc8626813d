"""Every check visible (issue 38 parts 4 to 6): each monitor's check section on the page of a
short real run, the log-wealth plot's lines and ticks, and the wording of the report's text,
read from the produced files."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest
from conftest import make_report

from dpaudit_torch.audit.monitors import DEFAULT_MONITORS
from dpaudit_torch.demo import DemoConfig, run_demo
from dpaudit_torch.report import AuditReport

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(tmp: Path, bug: str | None, steps: int = 10) -> tuple[dict, str]:
    res = run_demo(DemoConfig(steps=steps, bug=bug, seed=1), out_dir=tmp)
    data = json.loads((res.report_dir / "audit.json").read_text(encoding="utf-8"))
    page = (res.report_dir / "report.html").read_text(encoding="utf-8")
    return data, page


def _text(page: str) -> str:
    """The page's visible text (tags removed, entities decoded; the embedded JSON dropped)."""
    body = page.split('<script type="application/json"')[0]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def test_a_clean_run_has_a_section_for_each_monitor(tmp_path: Path) -> None:
    data, page = _run(tmp_path, None)
    names = [s["monitor"] for s in data["checks"]]
    assert names == list(DEFAULT_MONITORS)  # every monitor, in the order they run
    for sec in data["checks"]:
        assert sec["status"] == "checked, nothing found", sec
        assert sec["checked"] or sec["measured"], sec["monitor"]
        assert f'id="check-{sec["monitor"]}"' in page
    # after the verdict and the bounds, before the sequential tests
    at = page.index('id="checks"')
    assert page.index('id="verdict"') < page.index('id="bounds"') < at
    assert at < page.index('id="sequential"')
    noise = next(s for s in data["checks"] if s["monitor"] == "noise")
    interval = next(m["value"] for m in noise["measured"]
                    if m["quantity"].startswith("interval for the noise multiplier"))
    assert interval == data["audits"]["noise"]["noise_std_ratio_interval"]
    accounting = next(s for s in data["checks"] if s["monitor"] == "accounting")
    recomputed = next(m["value"] for m in accounting["measured"]
                      if m["quantity"] == "recomputed ε")
    assert recomputed == data["audits"]["accounting"]["recomputed_epsilon"]
    text = _text(page)
    assert text.count("Checked, nothing found.") == len(DEFAULT_MONITORS)
    assert "Not checked" in text and "the canary coordinates" in text
    assert AuditReport.from_dict(data).checks == data["checks"]  # validates
    # the Interference and Training sections: readable labels, the key only beside them
    for key, label in (("std_from_observation_minus_noise", "Part of it not explained by the "
                        "noise"), ("audited_steps", "Steps the auditor observed")):
        row = re.search(rf'<tr data-key="{key}"><th>(.*?)</th>', page)
        assert row is not None and _text(row.group(1)).strip().startswith(label), key
    # the Canaries and Configuration sections' spread_tensors: the difference explained
    got, asked = data["canaries"]["spread_tensors"], data["config"]["spread_tensors"]
    assert (got, asked) == (3, 4)
    assert (f"Each spread pair covers {got} tensors ( spread_tensors here), not the {asked} "
            "the configuration asks for") in text


def _wealth_figure(page: str) -> tuple[list[str], str]:
    fig = re.search(r'<figure id="plot-wealth" data-xticks="([^"]*)">(.*?)</figure>', page, re.S)
    assert fig is not None
    return json.loads(html.unescape(fig.group(1))), _text(fig.group(2))


def _lines_of_the_decision(data: dict, page: str) -> None:
    """One line per monitor that bets, the decision labelled as the average it is (and equal
    to the log-mean-exp of the monitors' lines), integer step ticks."""
    wh = data["wealth_history"]
    betting = sorted(k[len("monitor."):] for k in wh if k.startswith("monitor."))
    assert betting == ["noise", "sampling", "sequential_pairs"]
    for i in range(len(wh["step"])):
        terms = [wh[f"monitor.{m}"][i] for m in betting]
        top = max(terms)
        mean = top + math.log(sum(math.exp(t - top) for t in terms) / len(terms))
        # float64 log-sum-exp of 3 terms: a few ulps of the largest magnitude involved
        assert abs(wh["combined"][i] - mean) <= 1e-12 * max(1.0, abs(top), abs(mean))
    ticks, text = _wealth_figure(page)
    assert ticks and all(re.fullmatch(r"−?\d+", t) for t in ticks), ticks
    for label in ("monitor: noise", "monitor: sampling", "monitor: sequential pairs",
                  "the decision: log of the average of the monitors' e-values"):
        assert label in text, label


def test_a_noise_bug_names_the_tensor_by_module_path_and_gives_no_steps_advice(
        tmp_path: Path) -> None:
    data, page = _run(tmp_path, "noise-divided-one-tensor")
    assert data["stopped_early"]
    noise = next(s for s in data["checks"] if s["monitor"] == "noise")
    assert noise["status"] == "violation"
    text = _text(page)
    # the model was handed over: the finding names the tensor by its module path
    assert "too little noise: on features.0.weight (group 0, shape 16x1x3x3)" in text
    assert "tensor 0 (group" not in text
    # the audit itself stopped training: no advice to raise the number of steps
    assert "raise the number of steps" not in text
    assert "the audit stopped training after" in text
    # a 5-step run's wealth plot: whole-number step ticks, one line per betting monitor
    assert data["wealth_history"]["step"][-1] == 5
    _lines_of_the_decision(data, page)


@pytest.mark.slow
def test_a_clipping_violation_says_the_noise_check_passed(tmp_path: Path) -> None:
    data, page = _run(tmp_path, "no-clipping")
    noise = next(s for s in data["checks"] if s["monitor"] == "noise")
    assert noise["status"] == "checked, nothing found"
    text = _text(page)
    assert "allows: noise check passed: clipping or scaling" in text
    assert "bad noise, clipping or scaling" not in text


def test_a_withheld_bound_reads_as_no_bound_not_0() -> None:
    report = make_report("nothing")
    report.epsilon_lower_bounds["whitebox"] = 0.0
    report.lower_bound_details["whitebox"] = {
        "bound": 0.0, "method": "whitebox", "family_verified": False,
        "note": "no white-box bound: the noise multiplier changed during the run"}
    page = report.to_html()
    row = re.search(r'<tr data-method="whitebox">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert _text(cells[2]).strip() == "withheld: no bound"
