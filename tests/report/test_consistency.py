"""The report on real audits: the whole-run claim kept apart from the per-step bound, the wording
of a violation (which monitor decided it, what failed), an empty bound plot, the per-step null in
the configuration, a finalize() after 0 steps, the consistency check of `dpaudit report`, and
docs/report.md against a real `to_dict()`, key by key. (The same on synthetic reports is tested
module by module: test_summary.py, test_html.py, test_wording.py, test_validate.py, ...)"""

from __future__ import annotations

import html
import json
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import make_private_setup, make_report

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.cli import EXIT_USAGE
from dpaudit_torch.report import HTML_NAME, JSON_NAME, AuditReport, contradictions, validate
from dpaudit_torch.report.formatting import NO_STEPS_SENTENCE
from dpaudit_torch.testing import bugs

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "report.md"
AUDIT_KW: dict[str, Any] = {"delta": 1e-5, "seed": 0, "k_pairs": 4, "m_canaries": 100,
                            "check_every": 5, "claimed_every": 5}


def _auditor(setup: Any, **kw: Any) -> PrivacyAuditor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivacyAuditor(setup.engine, setup.optimizer, setup.loader, **{**AUDIT_KW, **kw})


def _run(steps: int, bug: str | None = None, **kw: Any) -> tuple[AuditReport, PrivacyAuditor]:
    s = make_private_setup()
    if bug is not None:
        bugs.apply_bug(s.optimizer, bug)
    a = _auditor(s, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.train(steps, a)
    return a.finalize(), a


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[AuditReport, PrivacyAuditor]]:
    """Two real audits: a correct run of 20 steps (default per-step null), and a run without
    noise and with an explicit per-step null, stopped at the violation."""
    return {"correct": _run(20),
            "bug": _run(60, bug="no-noise", per_step_null=(1.0, 1e-5))}


def _visible(fragment: str) -> str:
    text = re.sub(r"<[^>]+>", " ", fragment)
    return re.sub(r"\s+", " ", html.unescape(text))


def _section(page: str, anchor: str) -> str:
    m = re.search(rf'<section id="{anchor}".*?</section>', page, re.S)
    assert m is not None, anchor
    return m.group(0)


# ---------------------------------------------------------------- whole run vs one step
def test_per_step_bound_is_apart_from_the_whole_run_claim(runs: dict) -> None:
    for report, _ in runs.values():
        page = report.to_html()
        bounds = _section(page, "bounds")
        whole = re.search(r'<table id="bounds-table">.*?</table>', bounds, re.S).group(0)
        step = re.search(r'<table id="per-step-bound-table">.*?</table>', bounds, re.S).group(0)
        assert 'data-method="sequential"' not in whole
        assert 'data-method="steinke"' in whole and 'data-method="fdp"' in whole
        assert 'data-method="sequential"' in step and 'data-method="steinke"' not in step
        # the claim is not a column of either table, each table says what it is about
        assert "Claimed" not in whole and "Claimed" not in step
        assert "Lower bound ε (whole run)" in whole and "Lower bound ε (one step)" in step
        assert "Per-step bound: a statement about one training step" in bounds
        assert bounds.index("bounds-table") < bounds.index("per-step-bound-table")
        text = report.summary_text().splitlines()
        claim_line = [ln for ln in text if ln.startswith("Whole-run claim:")]
        step_lines = [ln for ln in text if ln.startswith("Per-step bound (sequential;")]
        assert len(claim_line) == 1 and len(step_lines) == 1
        assert "ONE training step" in step_lines[0] and "never compared" in step_lines[0]
        assert not any("Per-step" in ln for ln in claim_line)
        for ln in text:
            if ln.startswith("Audited lower bound ("):
                assert "sequential" not in ln and "whole training run" in ln


# ---------------------------------------------------------------- empty plot, configuration
def test_empty_bound_plot_is_one_sentence(runs: dict) -> None:
    report, _ = runs["correct"]
    assert set(report.wealth_history["epsilon_lower_bound"]) == {0.0}  # nothing rejected
    fig = re.search(r'<figure id="plot-epsilon">(.*?)</figure>', report.to_html(), re.S)
    body = fig.group(1)
    assert "<img" not in body and "<figcaption" not in body
    sentence = _visible(body).strip()
    n = len(report.wealth_history["step"])
    assert sentence == (f"Nothing to plot: no point of the per-step null's grid was rejected "
                        f"in the {n} recorded step(s), so the per-step ε lower bound is 0 "
                        f"throughout.")


def test_configuration_shows_the_per_step_null_used(runs: dict) -> None:
    def row(report: AuditReport) -> str:
        cfg = _section(report.to_html(), "configuration")
        m = re.search(r"<tr><th>per_step_null</th><td>(.*?)</td></tr>", cfg, re.S)
        assert m is not None
        return _visible(m.group(1))

    correct, bug = runs["correct"][0], runs["bug"][0]
    assert correct.config["per_step_null"] is None  # the JSON keeps what was given
    shown = row(correct)
    assert "n/a" not in shown
    sigma = correct.sequential["per_step_null"]["noise_multiplier"]
    assert f"Gaussian mechanism with noise multiplier {sigma:g}" in shown
    assert "the default" in shown
    assert row(bug) == "each step is (epsilon = 1, delta = 1e-05)-DP"


def test_claimed_epsilon_history_has_no_duplicate_steps(runs: dict) -> None:
    for report, auditor in runs.values():
        hist = report.training["claimed_epsilon_history"]
        steps = [s for s, _ in hist]
        assert steps == sorted(set(steps)), hist  # strictly increasing: each step once
        # finalize read the accountant at the last step, which a periodic read also hit
        assert steps[-1] == report.training["steps"]
        assert auditor.finalize() is report  # a second finalize adds nothing
        assert report.training["claimed_epsilon_history"] == hist
    correct = runs["correct"][0]
    assert correct.training["steps"] % AUDIT_KW["claimed_every"] == 0
    assert [s for s, _ in correct.training["claimed_epsilon_history"]][-2:] == [15, 20]


# ---------------------------------------------------------------- 0 steps
def test_finalize_after_zero_steps_warns_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    a = _auditor(make_private_setup(sigma=1.5))
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch"):
        report = a.finalize()
    assert "finalize() after 0 audited steps" in caplog.text
    assert any("finalize() after 0 audited steps" in w for w in report.warnings)
    assert report.training["audited_steps"] == 0
    assert NO_STEPS_SENTENCE in report.summary_text()
    # sigma = 1.5 was claimed: the power note names the missing steps, with the claimed sigma
    assert report.power["note"] == ("no training step was audited: the power statement is "
                                    "not defined")
    assert report.power["sigma"] == 1.5
    assert "no noise multiplier was claimed" not in report.summary_text()
    assert "no training step was audited" in report.summary_text()
    verdict = _section(report.to_html(), "verdict")
    assert 'id="no-steps"' in verdict and html.escape(NO_STEPS_SENTENCE) in verdict
    validate(report)  # consistent: it holds (zero) bounds
    # a report with steps does not carry the sentence
    assert NO_STEPS_SENTENCE not in make_report("nothing").summary_text()


# ---------------------------------------------------------------- violation wording
def test_violation_names_the_deciding_monitor(runs: dict,
                                              caplog: pytest.LogCaptureFixture) -> None:
    report, auditor = runs["bug"]
    assert report.violation and report.stopped_early
    deciding = [f for f in report.findings if f["level"] == "violation"]
    assert deciding and {f["monitor"] for f in deciding} <= {"noise", "sequential_pairs",
                                                              "sampling", "decision"}
    msg = auditor.engine.violation_message()
    for f in deciding:
        assert f["monitor"] in msg and f["message"] in msg
    if [f["monitor"] for f in deciding] == ["noise"]:
        assert "by the noise monitor" in msg and "too little noise" in msg
    assert "claimed noise multiplier" not in msg
    text = report.summary_text()
    assert "Deciding monitor(s): " in text and deciding[0]["message"] in text
    # the deciding finding is told once in the summary (not again as a plain finding)
    assert text.count(deciding[0]["message"]) == 1
    verdict = _section(report.to_html(), "verdict")
    assert 'id="deciding-monitors"' in verdict
    assert html.escape(deciding[0]["message"]) in verdict
    assert "does not add the noise or clipping" not in verdict


def test_raised_violation_names_the_deciding_monitor() -> None:
    from dpaudit_torch.audit import PrivacyViolationError

    s = make_private_setup(seed=1)
    bugs.apply_bug(s.optimizer, "no-noise")
    a = _auditor(s, on_violation="raise")
    with pytest.raises(PrivacyViolationError) as err:
        for x, y in s.batches(40):
            s.step(x, y)
    text = str(err.value)
    assert text.startswith(f"privacy violation proven at training step {err.value.step} by the ")
    deciding = [f for f in a.finalize().findings if f["level"] == "violation"]
    assert deciding and all(f["monitor"] in text for f in deciding)
    assert "claimed noise multiplier" not in text


# ---------------------------------------------------------------- consistency
def test_real_reports_are_consistent(runs: dict) -> None:
    for report, _ in runs.values():
        assert contradictions(report) == []
        assert contradictions(AuditReport.from_dict(json.loads(report.to_json()))) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpaudit_torch.cli", *args],
                          capture_output=True, text=True, timeout=300)


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dpaudit: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_report_refuses_contradictions_and_empty_reports(runs: dict,
                                                              tmp_path: Path) -> None:
    bad = tmp_path / "refuted" / JSON_NAME
    bad.parent.mkdir()
    d = make_report("nothing").to_dict()
    d["claim_refuted"] = True  # every bound is below the claim 2.346
    bad.write_text(json.dumps(d), encoding="utf-8")
    _one_line_error(_cli("report", str(bad)), "inconsistent",
                    "claim_refuted is true but no bound that may refute")
    assert not (bad.parent / HTML_NAME).exists()
    empty = tmp_path / "empty" / JSON_NAME
    empty.parent.mkdir()
    empty.write_text(AuditReport().to_json(), encoding="utf-8")
    _one_line_error(_cli("report", str(empty)), "it holds no results")
    # a real report is re-rendered, with the exit code of its verdict
    good = runs["bug"][0].save(tmp_path / "good")
    (good / HTML_NAME).unlink()
    proc = _cli("report", str(good))
    assert proc.returncode == 3, proc.stderr
    assert (good / HTML_NAME).is_file() and "Deciding monitor(s)" in proc.stdout
    # an output directory that cannot be written: one line naming it
    blocker = tmp_path / "blocker"
    blocker.write_text("x", encoding="utf-8")
    _one_line_error(_cli("report", str(good), "--out", str(blocker / "sub")), str(blocker))


# ---------------------------------------------------------------- docs/report.md
#: objects whose keys are names (methods, tests, monitors), not fixed fields: their values are
#: checked under "<path>.<name>", the objects themselves are described in words
_NAMED = {"epsilon_lower_bounds", "lower_bound_details", "sequential.tests",
          "config.test_options", "config.monitor_options", "monitor_labels", "audits",
          "fingerprint.scores", "fingerprint.levels"}
#: each monitor documents its own ``audits.<name>`` section on its page
MONITOR_DOCS = REPO / "docs" / "monitors"
_ROOT = "audit.json"


def _keys_by_path(value: Any, path: str, out: dict[str, set[str]]) -> None:
    if isinstance(value, dict):
        if path not in _NAMED:
            out.setdefault(path, set()).update(value)
        for k, v in value.items():
            _keys_by_path(v, k if path == _ROOT else f"{path}.{k}", out)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                _keys_by_path(item, f"{path}[]", out)


def _documented() -> list[tuple[list[str], set[str], set[str]]]:
    """(paths, keys, optional keys) of every heading of docs/report.md, and of the monitors'
    pages docs/monitors/*.md, followed by a key (or field) table; a key whose first cell says
    "(optional)" may be absent from a real report."""
    out: list[tuple[list[str], set[str], set[str]]] = []
    for doc in [DOC, *sorted(MONITOR_DOCS.glob("*.md"))]:
        out += _documented_in(doc)
    return out


def _documented_in(doc: Path) -> list[tuple[list[str], set[str], set[str]]]:
    sections: list[tuple[list[str], set[str], set[str]]] = []
    paths: list[str] | None = None
    keys: set[str] = set()
    optional: set[str] = set()
    in_table = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            if paths and keys:
                sections.append((paths, keys, optional))
            paths, keys, optional, in_table = re.findall(r"`([^`]+)`", line), set(), set(), False
        elif line.startswith("| key | meaning |") or line.startswith("| field | type |"):
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            first = line.split("|")[1]
            found = re.findall(r"`([^`]+)`", first)
            keys.update(found)
            if "(optional)" in first:
                optional.update(found)
        elif not line.startswith("|"):
            in_table = False
    if paths and keys:
        sections.append((paths, keys, optional))
    return sections


def test_docs_document_every_key_of_a_real_report(runs: dict) -> None:
    real: dict[str, set[str]] = {}
    for report, _ in runs.values():
        _keys_by_path(report.to_dict(), _ROOT, real)
    covered: set[str] = set()
    problems = []
    for paths, keys, optional in _documented():
        missing = [p for p in paths if p not in real]
        if missing:
            problems.append(f"documented path(s) {missing} are not in a real report")
        present = set().union(*(real.get(p, set()) for p in paths))
        if keys - optional - present:
            problems.append(f"{paths}: documented but absent: "
                            f"{sorted(keys - optional - present)}")
        if present - keys:
            problems.append(f"{paths}: present but undocumented: {sorted(present - keys)}")
        covered.update(paths)
    for path in sorted(set(real) - covered):
        problems.append(f"object {path!r} (keys {sorted(real[path])}) has no section")
    assert not problems, "\n".join(problems)


def test_docs_state_the_accountant_as_a_class_name(runs: dict) -> None:
    report = runs["correct"][0]
    assert report.accountant == "RDPAccountant"
    row = next(ln for ln in DOC.read_text(encoding="utf-8").splitlines()
               if ln.startswith("| `accountant` |"))
    assert '"RDPAccountant"' in row and '"prv"' not in row
