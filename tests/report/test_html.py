"""Tests of dpaudit_torch/report/html.py: the self-contained page (verdict first, every tagged
number equal to its field, inline plots, no network reference, escaping), the verdict box (the
deciding monitors named by the report's labels, the per-step null when a deciding finding is about
one step), the findings, the power sentence and the configuration."""

from __future__ import annotations

import html
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import make_report, power_dict

from dpaudit_torch.registry import ONE_STEP, WHOLE_RUN
from dpaudit_torch.report import HTML_NAME, AuditReport, format_number
from dpaudit_torch.report.formatting import NO_STEPS_SENTENCE
from dpaudit_torch.report.html import (
    config_shown,
    findings_text,
    meaning_text,
    power_text,
    render_html,
    verdict_section,
    violation_text,
)
from dpaudit_torch.report.view import ReportView

KINDS = ("violation", "refuted", "nothing")

# ----------------------------------------------------------------------------------------------
# HTML inspection helpers
# ----------------------------------------------------------------------------------------------


class _Collector(HTMLParser):
    """Collects data-field elements (text + data-value), img/link/script tags, visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.fields: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")
        if "data-field" in a:
            self._open.append({"field": a["data-field"], "value": a.get("data-value"),
                               "text": "", "tag": tag})

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False
        if self._open and self._open[-1]["tag"] == tag:
            self.fields.append(self._open.pop())

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        for f in self._open:
            f["text"] += data


def parse_html(page: str) -> _Collector:
    c = _Collector()
    c.feed(page)
    c.close()
    return c


def field_value(report_dict: dict[str, Any], path: str, report: AuditReport) -> Any:
    """Value of a dotted data-field path ("verdict" is the property)."""
    if path == "verdict":
        return report.verdict
    value: Any = report_dict
    for part in path.split("."):
        value = value[part]
    return value


_NETWORK = re.compile(
    r"""(?:\b(?:src|href|action|poster|srcset|data|formaction)\s*=\s*["']?\s*(?:[a-z]+:)?//)"""
    r"""|(?:url\s*\()|(?:@import)""",
    re.IGNORECASE,
)


def check_html_fields(page: str, report: AuditReport) -> set[str]:
    """Every data-field element shows format_number(field) and carries the field's exact value."""
    d = report.to_dict()
    parsed = parse_html(page)
    seen = set()
    for f in parsed.fields:
        expected = field_value(d, f["field"], report)
        if f["field"] in ("verdict", "schema_version"):
            assert f["text"] == expected
        else:
            assert f["text"] == format_number(expected), f
            raw = json.loads(f["value"])
            assert raw == expected or (raw == "Infinity" and expected == math.inf), f
        seen.add(f["field"])
    return seen


def _visible(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def _power(page: str) -> str:
    """Visible text of the verdict's power paragraph (tags removed)."""
    m = re.search(r'<p id="power">(.*?)</p>', page)
    assert m, "no power sentence"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))


# ----------------------------------------------------------------------------------------------
# the page
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_html_shows_verdict_and_numbers_equal_to_fields(tmp_path: Path, kind: str) -> None:
    report = make_report(kind)
    page = (report.save(tmp_path) / HTML_NAME).read_text(encoding="utf-8")
    seen = check_html_fields(page, report)
    required = {"verdict", "claimed_epsilon", "delta", "alpha", "schema_version",
                "lower_bound_details.steinke.ceiling", "lower_bound_details.fdp.ceiling"}
    required |= {f"epsilon_lower_bounds.{m}" for m in report.epsilon_lower_bounds}
    if kind == "violation":
        required.add("violation_step")
    assert required <= seen, required - seen
    # the verdict comes first, before any other section
    assert page.index('id="verdict"') < page.index('id="bounds"') < page.index('id="plots"')
    assert "Verdict: <span" in page and report.verdict in page
    # plain-language meaning of the verdict
    if kind == "nothing":
        assert "is not a proof of privacy" in page
        # the ceiling of the family-free method is named (f-DP cannot refute on its own)
        assert "whatever the mechanism, is 3.914" in page
    if kind == "refuted":
        assert "The privacy claim is <strong>false</strong>" in page
    # method, level, strategy, canary count and ceiling are all in the bounds table
    for needle in ("bonferroni (two_sided)", "95% confidence", "0.00625 per candidate",
                   "over 8 candidates", "60 / 52", "3.914", "per-step bound",
                   "Gaussian (mu-GDP) curve family", "not a valid lower bound"):
        assert needle in page, needle
    # the threat model, seed policy, versions and warnings are written down
    for needle in ("White-box", "Every step observed", "Clipping exercised",
                   report.seed_policy, report.versions["torch"], report.warnings[0]):
        assert needle in page, needle
    # the embedded machine-readable copy equals the report
    parsed = parse_html(page)
    assert len(parsed.scripts) == 1
    embedded = json.loads(parsed.scripts[0])
    assert AuditReport.from_dict(embedded).to_dict() == report.to_dict()


def test_html_has_three_inline_plots_and_no_network_references() -> None:
    import base64

    page = render_html(make_report("violation"))
    parsed = parse_html(page)
    imgs = [a for tag, a in parsed.tags if tag == "img"]
    assert len(imgs) == 3
    for a in imgs:
        src = a["src"] or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
        assert a.get("alt")
    for tag, a in parsed.tags:
        for attr in ("src", "href"):
            if a.get(attr) is not None:
                assert a[attr].startswith("data:"), (tag, a)
        if tag == "script":
            assert a.get("type") == "application/json"  # data only, no JavaScript
    assert not _NETWORK.search(page)
    assert "http://" not in page and "https://" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "no data" not in page


def test_html_escapes_user_strings() -> None:
    report = make_report("nothing")
    evil = '<script>alert("x")</script><img src="https://evil.example/x.png">'
    report.warnings.append(evil)
    report.seed_policy = evil
    report.accountant = evil
    report.config[evil] = evil
    report.threat_model["notes"].append(evil)
    report.lower_bound_details["steinke"]["note"] = evil
    report.sequential["tests"][evil] = {"rejected": False}
    report.monitor_labels["noise"] = evil
    report.findings = [{"monitor": evil, "level": "finding", "message": evil, "where": evil}]
    page = report.to_html()
    assert "<script>alert" not in page and '<img src="https' not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    parsed = parse_html(page)
    assert len(parsed.scripts) == 1
    assert all((a.get("src") or "data:").startswith("data:") for _, a in parsed.tags)
    assert not _NETWORK.search(page.replace("https://evil.example", ""))
    # the embedded JSON still round-trips the hostile strings exactly
    embedded = json.loads(parsed.scripts[0])
    assert embedded["seed_policy"] == evil and embedded["monitor_labels"]["noise"] == evil


def test_html_with_empty_or_short_histories() -> None:
    empty = AuditReport()
    page = empty.to_html()
    assert page.count('class="nodata"') == 3 and "Nothing to plot" in page
    assert "nothing found" in page and "is not a proof of privacy" in page
    check_html_fields(page, empty)

    short = make_report("violation")
    short.wealth_history = {"step": [5], "mmd": [0.3], "combined": [0.2],
                            "epsilon_lower_bound": [0.0]}
    short.one_run_scores = {"in": [1.0]}
    page = short.to_html()
    # a per-step bound that stayed 0 is one sentence, not an empty plot
    assert page.count("data:image/png;base64,") == 2
    assert page.count('class="nodata"') == 1
    assert ("Nothing to plot: no point of the per-step null&#x27;s grid was rejected in the 1 "
            "recorded step(s), so the per-step ε lower bound is 0 throughout.") in page
    assert "no OUT scores" in page
    short.wealth_history["epsilon_lower_bound"] = [0.2]
    assert short.to_html().count("data:image/png;base64,") == 3

    odd = make_report("nothing")
    odd.wealth_history["mmd"] = odd.wealth_history["mmd"][:-5]  # shorter than "step"
    odd.wealth_history["combined"][0] = math.inf
    odd.wealth_history.pop("step")
    odd.one_run_scores = {"in": [math.nan, 2.0, 2.0], "out": [2.0, 2.0]}  # constant scores
    odd.wealth_history["epsilon_lower_bound"][-1] = 0.1  # "nothing" has a bound of 0 throughout
    page = odd.to_html()
    assert page.count("data:image/png;base64,") == 3
    assert "non-finite" in page and "record index" not in page  # axis label is inside the PNG

    nan_only = make_report("nothing")
    nan_only.wealth_history = {"step": [0, 1], "mmd": [math.nan, math.nan],
                               "epsilon_lower_bound": [math.nan, math.inf]}
    nan_only.one_run_scores = {"in": [], "out": []}
    assert nan_only.to_html().count('class="nodata"') == 3


def test_render_html_validates_first() -> None:
    with pytest.raises(ValueError, match="'alpha'"):
        render_html(AuditReport(alpha=3.0))


# ----------------------------------------------------------------------------------------------
# the verdict box
# ----------------------------------------------------------------------------------------------


def _deciding(monitor: str, scope: str | None = None, **kw: Any) -> dict[str, Any]:
    f = {"monitor": monitor, "level": "violation", "where": kw.get("where"),
         "message": kw.get("message", f"{monitor} found a leak")}
    if scope is not None:
        f["scope"] = scope
    return f


def test_deciding_monitors_are_named_by_the_reports_labels() -> None:
    report = make_report("violation")
    report.findings = [_deciding("sampling", where="data loader")]
    box = violation_text(ReportView(report))
    assert '<ul id="deciding-monitors"><li data-monitor="sampling"><strong>sampling (batch ' \
           "sizes not Poisson)</strong> (data loader): sampling found a leak</li></ul>" in box
    report.monitor_labels = {}  # an older report: the monitor under its own name
    assert "<strong>sampling</strong> (data loader)" in violation_text(ReportView(report))
    report.findings = []
    assert "The deciding monitor was not recorded" in violation_text(ReportView(report))


@pytest.mark.parametrize(("scope", "shown"), [(ONE_STEP, True), (None, False),
                                              (WHOLE_RUN, False)])
def test_per_step_null_is_stated_for_a_one_step_finding(scope: str | None, shown: bool) -> None:
    report = make_report("violation")
    # the monitor's name plays no part: only the finding's scope does
    report.findings = [_deciding("any_monitor", scope)]
    box = violation_text(ReportView(report))
    assert ("Per-step null hypothesis: each training step is the Gaussian mechanism with noise "
            "multiplier σ" in box) is shown
    # a one-step finding that did not decide the violation does not count
    report.findings = [dict(_deciding("any_monitor", ONE_STEP), level="note"),
                       _deciding("other", scope)]
    assert ("noise multiplier σ" in violation_text(ReportView(report))) is shown


def test_verdict_of_a_refuted_claim_with_a_violation_names_the_deciders() -> None:
    report = make_report("refuted")
    report.violation, report.violation_step = True, 8
    report.findings = [_deciding("sampling")]
    box = verdict_section(ReportView(report))
    assert 'class="verdict verdict-refuted"' in box
    assert "The privacy claim is <strong>false</strong>" in box
    # the proof during training is told as in a violation's box, with its deciding monitors
    assert 'id="deciding-monitors"' in box and 'data-monitor="sampling"' in box
    assert "sampling found a leak" in box and "at training step" in box


def test_verdict_of_an_inconsistent_claim_and_of_a_finding() -> None:
    report = make_report("nothing")
    report.findings = [{"monitor": "noise", "level": "finding", "message": "bfloat16 grid",
                        "where": "noise generation"}]
    box = verdict_section(ReportView(report))
    assert "the audit made a finding that is not a statistical proof" in box
    report.claim_inconsistent = True
    box = verdict_section(ReportView(report))
    assert "inconsistent with the training that ran" in box
    # the box says why, in the inconsistent findings' own words (escaped), whichever monitor
    report.findings.append({"monitor": "coverage", "level": "inconsistent",
                            "message": "head.bias changed <outside> the DP release",
                            "where": "head.bias"})
    box = verdict_section(ReportView(report))
    assert "<li>head.bias changed &lt;outside&gt; the DP release</li>" in box
    assert "recomputed by the same accountant" not in box
    report.training["audited_steps"] = 0
    assert html.escape(NO_STEPS_SENTENCE) in verdict_section(ReportView(report))


def test_findings_list() -> None:
    report = make_report("nothing")
    assert findings_text(ReportView(report)) == ""
    report.findings = [
        {"monitor": "accounting", "level": "inconsistent", "where": "accountant",
         "message": "the accountant counted 80 steps; noise was released 20 times"},
        {"monitor": "sampling", "level": "note", "message": "check not run: x", "where": None}]
    report.claim_inconsistent = True
    items = findings_text(ReportView(report))
    assert items.startswith('<ul id="findings"><li data-level="inconsistent">')
    assert "(accounting, accountant): the accountant counted 80 steps" in items
    assert items.index("inconsistent") < items.index('data-level="note"')  # notes last
    # the deciding findings of a violation are in the verdict itself, not in the list
    violation = make_report("violation")
    violation.findings = [_deciding("noise"), report.findings[1]]
    assert "noise found a leak" not in findings_text(ReportView(violation))


def test_meaning_text() -> None:
    nothing = meaning_text(ReportView(make_report("nothing")))
    assert '"Nothing found" is not a proof of privacy.' in nothing
    assert "whatever the mechanism, is 3.914 (Steinke et al. one-run (2023))" in nothing
    violation = meaning_text(ReportView(make_report("violation")))
    assert "A rejection is a proof at the stated level" in violation
    assert "The whole-run lower bounds below do not exceed the claim" in violation
    refuted = meaning_text(ReportView(make_report("refuted")))
    assert "The whole-run lower bounds below" not in refuted


@pytest.mark.parametrize("kind", KINDS)
def test_power_sentence(kind: str) -> None:
    report = make_report(kind)
    assert power_text(ReportView(report)) == ""
    report.power = power_dict()
    page = report.to_html()
    assert _power(page) == (
        "A correct implementation with this run's settings would give a Steinke bound of about "
        "0.4123 (median of 200 simulated runs); this audit refutes a true ε of 4.567 or more "
        "with probability 80%."
    )
    seen = check_html_fields(page, report)
    assert {"power.expected_bound", "power.min_refutable_epsilon", "power.replicates"} <= seen
    # inside the verdict box, and the ceiling sentence stays
    assert page.index('id="verdict"') < page.index('<p id="power">') < page.index('id="bounds"')
    if kind == "nothing":
        assert "whatever the mechanism, is 3.914" in page


def test_power_sentence_without_power_or_refutation() -> None:
    report = make_report("nothing")
    report.power = power_dict(min_refutable_epsilon=None, min_refutable_sigma=None,
                              note="this audit cannot refute the claim at this m and T: ...")
    assert _power(report.to_html()).endswith(
        "; this audit cannot refute the claim with this many canaries and steps, even for a "
        "true ε far above it.")
    report.power = power_dict(min_refutable_epsilon=None, note=None)
    assert _power(power_text(ReportView(report))).endswith("(median of 200 simulated runs).")
    evil = "no training steps were audited <script>x</script>"
    report.power = power_dict(no_power=True, expected_bound=None, min_refutable_epsilon=None,
                              expected_bound_quantiles=None, note=evil,
                              warnings=["the one-run audit has no power: " + evil])
    page = report.to_html()
    assert _power(page) == (
        "The one-run audit had no power to detect a leak (no training steps were audited "
        "<script>x</script>)."
    )
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "the one-run audit has no power" in page  # the warning, in the strength section


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


def test_configuration_shows_the_per_step_null_used() -> None:
    report = make_report("nothing")
    assert "per_step_null" not in config_shown(ReportView(report))  # not recorded, not added
    report.config["per_step_null"] = None
    shown = config_shown(ReportView(report))["per_step_null"]
    assert shown == ("each step is the Gaussian mechanism with noise multiplier 1.1 "
                     "(sensitivity C), tested at 5 points of its privacy profile (epsilon from "
                     "0.05 to 1) (the default: the optimizer's noise multiplier)")
    report.config["per_step_null"] = [1.0, 1e-5]
    report.sequential["per_step_null"] = {"type": "explicit", "epsilon": 1.0, "delta": 1e-5}
    assert config_shown(ReportView(report))["per_step_null"] == (
        "each step is (epsilon = 1, delta = 1e-05)-DP")
    assert report.config["per_step_null"] == [1.0, 1e-5]  # the report itself is unchanged
    row = re.search(r"<tr><th>per_step_null</th><td>(.*?)</td></tr>", report.to_html(), re.S)
    assert row is not None and _visible(row.group(1)) == "each step is (epsilon = 1, delta = " \
                                                         "1e-05)-DP"


def test_the_white_box_bound_refutes_only_with_its_family_verified() -> None:
    """A white-box bound above the claim refutes it when its detail says the family check
    passed (the verdict gives its own level), and is a plain 'yes, but' row otherwise."""
    from dpaudit_torch.report.bounds import bounds_section

    def with_whitebox(verified: bool) -> Any:
        report = make_report("nothing")
        report.epsilon_lower_bounds = {"whitebox": 9.5, **report.epsilon_lower_bounds}
        report.lower_bound_details = {
            "whitebox": {"bound": 9.5, "method": "whitebox", "alpha": 0.001, "delta": 1e-5,
                         "rho_lower": 2.0, "ceiling": 40.0, "family_verified": verified,
                         "family": "DP-SGD family", "score": "sum"},
            **report.lower_bound_details}
        report.claim_refuted = verified
        return ReportView(report)

    v = with_whitebox(True)
    assert v.refuting() == ["whitebox"] and v.may_refute("whitebox")
    box = verdict_section(v)
    assert "The privacy claim is <strong>false</strong>" in box
    assert "99.9% confidence" in box and "0.001" in box
    row = bounds_section(v)
    assert "yes: claim refuted" in row and "every observation" in row
    text = v.r.summary_text()  # each bound at its own level
    assert "(whitebox, for the whole training run" in text and "9.5 with 99.9% confidence" in text
    assert "(steinke, for the whole training run" in text and "with 95% confidence" in text
    # what it proves: a bound within the claim's own model, not on an arbitrary mechanism
    assert "own model" in box and "not the true epsilon of an arbitrary mechanism" in box
    assert "the claim as stated (its model or its parameters) is false" in text
    assert "not the true epsilon of an arbitrary mechanism" in text
    v = with_whitebox(False)
    assert v.refuting() == [] and not v.may_refute("whitebox")
    assert "which its check on this run's data did not verify" in bounds_section(v)
