"""Tests of the audit report: schema round trip, validation, HTML content, robustness."""

from __future__ import annotations

import html
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_report

from dpaudit_torch.report import (
    HTML_NAME,
    JSON_NAME,
    SCHEMA_VERSION,
    AuditReport,
    format_number,
)

KINDS = ("violation", "refuted", "nothing")


# ----------------------------------------------------------------------------------------------
# HTML inspection helpers (also used by the browser test)
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


# ----------------------------------------------------------------------------------------------
# data object and JSON
# ----------------------------------------------------------------------------------------------


def test_defaults_build_piecemeal() -> None:
    r = AuditReport()
    assert r.schema_version == SCHEMA_VERSION
    assert set(r.versions) == {"dpaudit_torch", "torch", "opacus", "python"}
    r.claimed_epsilon = 1.5
    r.epsilon_lower_bounds["steinke"] = 0.3
    d = r.to_dict()
    assert d["claimed_epsilon"] == 1.5 and d["epsilon_lower_bounds"] == {"steinke": 0.3}
    assert r.verdict == "nothing found"


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(tmp_path: Path, kind: str) -> None:
    report = make_report(kind)
    out = report.save(tmp_path / "nested" / kind)
    assert out == tmp_path / "nested" / kind
    assert (out / JSON_NAME).is_file() and (out / HTML_NAME).is_file()
    for where in (out, out / JSON_NAME, str(out / JSON_NAME)):
        back = AuditReport.load(where)
        assert back.to_dict() == report.to_dict()
        assert back == report
    # saving again overwrites in place and leaves no temporary files behind
    if kind == "violation":
        report.save(out)
    assert sorted(p.name for p in out.iterdir()) == [JSON_NAME, HTML_NAME]


def test_json_is_strict_and_nonfinite_round_trips(tmp_path: Path) -> None:
    report = make_report("nothing")
    report.claimed_epsilon = math.inf  # e.g. a run with no noise: nothing is claimed
    report.wealth_history["mmd"][3] = -math.inf
    report.sequential["nan_example"] = math.nan
    out = report.save(tmp_path)

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} written")

    raw = json.loads((out / JSON_NAME).read_text(encoding="utf-8"), parse_constant=no_constants)
    assert raw["claimed_epsilon"] == "Infinity"
    back = AuditReport.load(out)
    assert back.claimed_epsilon == math.inf
    assert back.wealth_history["mmd"][3] == -math.inf
    assert math.isnan(back.sequential["nan_example"])


def test_to_dict_converts_numpy_and_torch() -> None:
    import torch

    r = AuditReport(claimed_epsilon=np.float32(2.0), delta=np.float64(1e-5),
                    epsilon_lower_bounds={"steinke": torch.tensor(0.25, dtype=torch.float64)},
                    wealth_history={"step": np.arange(3), "mmd": torch.zeros(3)},
                    violation=np.bool_(True), violation_step=np.int64(2))
    d = r.to_dict()
    assert d["claimed_epsilon"] == 2.0 and type(d["claimed_epsilon"]) is float
    assert d["epsilon_lower_bounds"]["steinke"] == 0.25
    assert d["wealth_history"] == {"step": [0, 1, 2], "mmd": [0.0, 0.0, 0.0]}
    assert d["violation"] is True and d["violation_step"] == 2
    json.dumps(d)  # plain types only


def test_verdict_and_summary() -> None:
    v = make_report("violation")
    assert v.verdict == f"violation proven at step {v.violation_step}"
    assert AuditReport(violation=True).verdict == "violation proven"
    r = make_report("refuted")
    assert r.verdict == "claim refuted"
    r.violation, r.violation_step = True, 5  # a refuted claim takes precedence
    assert r.verdict == "claim refuted"
    assert make_report("nothing").verdict == "nothing found"
    for kind in KINDS:
        rep = make_report(kind)
        text = rep.summary_text()
        assert rep.verdict in text
        assert format_number(rep.claimed_epsilon) in text
        for bound in rep.epsilon_lower_bounds.values():
            assert format_number(bound) in text
    assert "not a proof of privacy" in make_report("nothing").summary_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": "2.0"}, "unsupported audit report schema_version '2.0'"),
        ({"schema_version": 1.0}, "must be a string"),
        ({"bogus_field": 1}, "unknown audit report field"),
        ({"claimed_epsilon": "big"}, "'claimed_epsilon'"),
        ({"claimed_epsilon": -1.0}, "'claimed_epsilon'"),
        ({"alpha": 1.5}, "'alpha'"),
        ({"delta": -0.1}, "'delta'"),
        ({"accountant": 3}, "'accountant'"),
        ({"created_at": "yesterday"}, "'created_at'"),
        ({"epsilon_lower_bounds": {"steinke": -0.5}}, "'epsilon_lower_bounds.steinke'"),
        ({"epsilon_lower_bounds": [0.5]}, "'epsilon_lower_bounds'"),
        ({"lower_bound_details": {"steinke": 3}}, "'lower_bound_details.steinke'"),
        ({"claim_refuted": "yes"}, "'claim_refuted'"),
        ({"violation_step": -1}, "'violation_step'"),
        ({"violation_step": 1.5}, "'violation_step'"),
        ({"violation": False, "violation_step": 4}, "'violation' is False"),
        ({"wealth_history": {"mmd": ["a"]}}, "'wealth_history.mmd'"),
        ({"one_run_scores": {"in": 3}}, "'one_run_scores.in'"),
        ({"training": []}, "'training'"),
        ({"seed_policy": None}, "'seed_policy'"),
        ({"warnings": ["ok", 1]}, "'warnings'"),
    ],
)
def test_from_dict_rejects_bad_documents(change: dict[str, Any], message: str) -> None:
    d = make_report("violation").to_dict()
    d.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        AuditReport.from_dict(d)


def test_from_dict_structure_errors() -> None:
    with pytest.raises(ValueError, match="must be a JSON object"):
        AuditReport.from_dict([1, 2])
    d = make_report("nothing").to_dict()
    del d["schema_version"]
    with pytest.raises(ValueError, match="no 'schema_version'"):
        AuditReport.from_dict(d)


def test_newer_minor_version_is_read_without_its_new_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = make_report("nothing").to_dict()
    d["schema_version"] = "1.99"
    d["field_from_the_future"] = {"x": 1}
    with caplog.at_level("WARNING", logger="dpaudit_torch.report"):
        r = AuditReport.from_dict(d)
    assert "field_from_the_future" in caplog.text
    assert r.schema_version == SCHEMA_VERSION  # the object holds what this version understood
    assert r.claimed_epsilon == d["claimed_epsilon"]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no audit report"):
        AuditReport.load(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=JSON_NAME):
        AuditReport.load(tmp_path)  # a directory without audit.json
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": "1.0", ', encoding="utf-8")
    with pytest.raises(ValueError, match=r"not valid JSON \(line 1"):
        AuditReport.load(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not UTF-8"):
        AuditReport.load(bad)
    d = make_report("nothing").to_dict()
    d["schema_version"] = "0.3"
    bad.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json.*unsupported audit report schema_version"):
        AuditReport.load(bad)


def test_save_into_a_file_path_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(OSError):
        make_report("nothing").save(blocker)
    with pytest.raises(ValueError, match="'alpha'"):
        AuditReport(alpha=2.0).save(tmp_path / "never")
    assert not (tmp_path / "never").exists()  # validated before anything is written


def test_format_number() -> None:
    assert format_number(None) == "n/a"
    assert format_number(True) == "yes" and format_number(False) == "no"
    assert format_number(12) == "12" and format_number(np.int64(3)) == "3"
    assert format_number(0.98765) == "0.9877" and format_number(1e-5) == "1e-05"
    assert format_number(math.inf) == "∞" and format_number(-math.inf) == "-∞"
    assert format_number(math.nan) == "NaN"


# ----------------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------------

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


def test_html_has_three_inline_plots_and_no_network_references(tmp_path: Path) -> None:
    import base64

    report = make_report("violation")
    page = (report.save(tmp_path) / HTML_NAME).read_text(encoding="utf-8")
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


def test_html_escapes_user_strings(tmp_path: Path) -> None:
    report = make_report("nothing")
    evil = '<script>alert("x")</script><img src="https://evil.example/x.png">'
    report.warnings.append(evil)
    report.seed_policy = evil
    report.accountant = evil
    report.config[evil] = evil
    report.threat_model["notes"].append(evil)
    report.lower_bound_details["steinke"]["note"] = evil
    report.sequential["tests"][evil] = {"rejected": False}
    page = (report.save(tmp_path) / HTML_NAME).read_text(encoding="utf-8")
    assert "<script>alert" not in page and '<img src="https' not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    parsed = parse_html(page)
    assert len(parsed.scripts) == 1
    assert all((a.get("src") or "data:").startswith("data:") for _, a in parsed.tags)
    assert not _NETWORK.search(page.replace("https://evil.example", ""))
    # the embedded JSON still round-trips the hostile strings exactly
    embedded = json.loads(parsed.scripts[0])
    assert embedded["seed_policy"] == evil


def test_html_with_empty_or_short_histories(tmp_path: Path) -> None:
    empty = AuditReport()
    page = (empty.save(tmp_path / "empty") / HTML_NAME).read_text(encoding="utf-8")
    assert page.count('class="nodata"') == 3 and "Nothing to plot" in page
    assert "nothing found" in page and "is not a proof of privacy" in page
    check_html_fields(page, empty)

    short = make_report("violation")
    short.wealth_history = {"step": [5], "mmd": [0.3], "combined": [0.2],
                            "epsilon_lower_bound": [0.0]}
    short.one_run_scores = {"in": [1.0]}
    page = (short.save(tmp_path / "short") / HTML_NAME).read_text(encoding="utf-8")
    # a per-step bound that stayed 0 is one sentence, not an empty plot
    assert page.count("data:image/png;base64,") == 2
    assert page.count('class="nodata"') == 1
    assert ("Nothing to plot: no point of the per-step null&#x27;s grid was rejected in the 1 "
            "recorded step(s), so the per-step ε lower bound is 0 throughout.") in page
    assert "no OUT scores" in page
    short.wealth_history["epsilon_lower_bound"] = [0.2]
    page = short.to_html()
    assert page.count("data:image/png;base64,") == 3

    odd = make_report("nothing")
    odd.wealth_history["mmd"] = odd.wealth_history["mmd"][:-5]  # shorter than "step"
    odd.wealth_history["combined"][0] = math.inf
    odd.wealth_history.pop("step")
    odd.one_run_scores = {"in": [math.nan, 2.0, 2.0], "out": [2.0, 2.0]}  # constant scores
    odd.wealth_history["epsilon_lower_bound"][-1] = 0.1  # "nothing" has a bound of 0 throughout
    page = (odd.save(tmp_path / "odd") / HTML_NAME).read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3
    assert "non-finite" in page and "record index" not in page  # axis label is inside the PNG

    nan_only = make_report("nothing")
    nan_only.wealth_history = {"step": [0, 1], "mmd": [math.nan, math.nan],
                               "epsilon_lower_bound": [math.nan, math.inf]}
    nan_only.one_run_scores = {"in": [], "out": []}
    page = (nan_only.save(tmp_path / "nan") / HTML_NAME).read_text(encoding="utf-8")
    assert page.count('class="nodata"') == 3


def test_ceiling_below_claim_is_pointed_out(tmp_path: Path) -> None:
    report = make_report("nothing")
    report.claimed_epsilon = 5.0  # above Steinke's ceiling 3.914 (f-DP never refutes alone)
    page = report.to_html()
    assert page.count("could not have refuted the claim even with every guess right") == 1


def test_gaussian_family_bound_alone_does_not_refute() -> None:
    report = make_report("nothing")
    report.claimed_epsilon = 0.8  # below the f-DP bound 0.9877, above Steinke's 0.7312
    page = report.to_html()
    assert page.count("yes: claim refuted") == 0
    assert "assumes the Gaussian family, so it does not refute the claim" in page
    report.claimed_epsilon = 0.5  # now Steinke (family-free) exceeds it too
    report.claim_refuted = True
    page = report.to_html()
    assert page.count("yes: claim refuted") == 1
    assert "The privacy claim is <strong>false</strong>" in page


def test_records_and_decision_cadence_are_rendered() -> None:
    report = make_report("violation")
    report.canaries["per_parameter"] = [
        {"param_index": 0, "shape": [16, 1, 3, 3], "pairs": 1, "one_run": 23},
        {"param_index": 1, "shape": [16], "pairs": 2, "one_run": 3},
    ]
    report.sequential["crossed_at_step"] = 4
    report.sequential["check_every"] = 10
    page = report.to_html()
    assert page.count('<table class="records">') == 1
    assert "<th>param_index</th>" in page and "16, 1, 3, 3" in page
    assert (
        f"first reached the threshold at step 4; the violation was declared at step "
        f"{report.violation_step} (the decision is checked every 10 steps)"
    ) in page


# ----------------------------------------------------------------------------------------------
# the power object (schema 1.1)
# ----------------------------------------------------------------------------------------------


def power_dict(**changes: Any) -> dict[str, Any]:
    """A ``power`` object shaped like one_run_power(...).to_dict()."""
    d = {"expected_bound": 0.4123, "expected_bound_quantiles": [0.3, 0.52],
         "min_refutable_epsilon": 4.567, "min_refutable_sigma": 0.61, "claimed_epsilon": 2.0,
         "target_power": 0.8, "mean_inclusions": 15.0, "replicates": 200, "score": "llr",
         "method": "steinke", "mode": "exact", "seconds": 1.5, "warnings": [],
         "no_power": False, "note": None, "sigma": 1.1, "q": 0.05, "steps": 300, "m": 1000,
         "c": 1.0, "delta": 1e-5, "alpha": 0.05}
    d.update(changes)
    return d


def _text(page: str) -> str:
    """Visible text of the verdict's power paragraph (tags removed)."""
    m = re.search(r'<p id="power">(.*?)</p>', page)
    assert m, "no power sentence"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))


def test_power_round_trip_and_schema_version(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == "1.2"
    report = make_report("nothing")
    report.power = power_dict()
    out = report.save(tmp_path)
    raw = json.loads((out / JSON_NAME).read_text(encoding="utf-8"))
    assert raw["schema_version"] == "1.2" and raw["power"] == power_dict()
    back = AuditReport.load(out)
    assert back == report and back.power == power_dict()
    assert AuditReport().to_dict()["power"] == {}


def test_old_reports_without_power_still_load(tmp_path: Path) -> None:
    d = make_report("violation").to_dict()
    for key in ("power", "findings", "claim_inconsistent", "audits"):
        del d[key]
    d["schema_version"] = "1.0"
    (tmp_path / JSON_NAME).write_text(json.dumps(d), encoding="utf-8")
    old = AuditReport.load(tmp_path)
    assert old.power == {} and old.schema_version == SCHEMA_VERSION  # read as this version
    assert old.claimed_epsilon == d["claimed_epsilon"] and old.violation
    assert '<p id="power">' not in old.to_html()
    old.save(tmp_path / "again")
    assert json.loads((tmp_path / "again" / JSON_NAME).read_text())["schema_version"] == "1.2"
    # a 1.0 document cannot hold a field that 1.0 did not have
    d["power"] = power_dict()
    with pytest.raises(ValueError, match=r"\['power'\] do not exist in schema 1.0"):
        AuditReport.from_dict(d)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"expected_bound": -1.0}, "'power.expected_bound'"),
     ({"min_refutable_epsilon": "big"}, "'power.min_refutable_epsilon'"),
     ({"target_power": 1.2}, "'power.target_power'"),
     ({"replicates": 2.5}, "'power.replicates'"),
     ({"expected_bound_quantiles": [0.1]}, "'power.expected_bound_quantiles'"),
     ({"warnings": [3]}, "'power.warnings'"),
     ({"no_power": "no"}, "'power.no_power'"),
     ({"score": 7}, "'power.score'")],
)
def test_power_is_validated(change: dict[str, Any], message: str) -> None:
    d = make_report("nothing").to_dict()
    d["power"] = power_dict(**change)
    with pytest.raises(ValueError, match=re.escape(message)):
        AuditReport.from_dict(d)
    with pytest.raises(ValueError, match="'power'"):
        AuditReport(power=[1]).to_dict()  # type: ignore[arg-type]
    # every number may be None
    ok = power_dict(expected_bound=None, min_refutable_epsilon=None, expected_bound_quantiles=None,
                    replicates=None, target_power=None, mean_inclusions=None)
    AuditReport(power=ok).to_dict()


@pytest.mark.parametrize("kind", KINDS)
def test_html_power_sentence(kind: str) -> None:
    report = make_report(kind)
    report.power = power_dict()
    page = report.to_html()
    assert _text(page) == (
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
    assert "would give a Steinke bound of about 0.4123" in report.summary_text()


def test_html_power_sentence_without_power_or_refutation() -> None:
    report = make_report("nothing")
    report.power = power_dict(min_refutable_epsilon=None, min_refutable_sigma=None,
                              note="this audit cannot refute the claim at this m and T: ...")
    assert _text(report.to_html()).endswith(
        "; this audit cannot refute the claim with this many canaries and steps, even for a "
        "true ε far above it.")
    report.power = power_dict(min_refutable_epsilon=None, note=None)
    assert _text(report.to_html()).endswith("(median of 200 simulated runs).")
    evil = "no training steps were audited <script>x</script>"
    report.power = power_dict(no_power=True, expected_bound=None, min_refutable_epsilon=None,
                              expected_bound_quantiles=None, note=evil,
                              warnings=["the one-run audit has no power: " + evil])
    page = report.to_html()
    assert _text(page) == (
        "The one-run audit had no power to detect a leak (no training steps were audited "
        "<script>x</script>)."
    )
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "the one-run audit has no power" in page  # the warning, in the strength section
    assert "had no power to detect a leak" in report.summary_text()


# ------------------------------------------------------------------ findings and verdicts (1.2)
def test_verdict_vocabulary_and_findings(tmp_path: Path) -> None:
    from dpaudit_torch.report.schema import VERDICTS

    base = make_report("nothing")
    base.claim_refuted = base.violation = False
    base.violation_step = None
    assert base.verdict == "nothing found"
    base.findings = [{"monitor": "noise", "level": "finding", "message": "bf16 grid",
                      "where": "noise generation"}]
    assert base.verdict == "finding (not a proof)"
    base.claim_inconsistent = True
    assert base.verdict == "claim inconsistent"
    base.violation, base.violation_step = True, 7
    assert base.verdict == "violation proven at step 7"
    base.claim_refuted = True
    assert base.verdict == "claim refuted"
    assert all(any(v.startswith(p) for p in VERDICTS) for v in (base.verdict,))
    back = AuditReport.load(base.save(tmp_path))
    assert back.findings == base.findings and back.claim_inconsistent
    bad = make_report("nothing")
    bad.findings = [{"monitor": "noise", "level": "maybe", "message": "x", "where": None}]
    with pytest.raises(ValueError, match="findings"):
        bad.to_dict()
    # a 1.1 document cannot hold the findings
    d = make_report("nothing").to_dict()
    d["schema_version"] = "1.1"
    with pytest.raises(ValueError, match="do not exist in schema 1.1"):
        AuditReport.from_dict(d)


def test_findings_in_html_summary_and_exit_codes() -> None:
    from dpaudit_torch.cli import verdict_exit_code

    r = make_report("nothing")
    r.claim_refuted = r.violation = False
    r.violation_step = None
    assert verdict_exit_code(r) == 0
    r.findings = [{"monitor": "accounting", "level": "inconsistent",
                   "message": "the accountant counted 80 steps; noise was released 20 times",
                   "where": "accountant"},
                  {"monitor": "sampling", "level": "note", "message": "check not run: x",
                   "where": None}]
    r.claim_inconsistent = True
    page = r.to_html()
    assert 'id="findings"' in page and "noise was released 20 times" in page
    assert "inconsistent with the training that ran" in page
    assert "noise was released 20 times" in r.summary_text()
    assert verdict_exit_code(r) == 4
    r.claim_inconsistent = False
    r.findings = [{"monitor": "noise", "level": "finding", "message": "bfloat16 grid",
                   "where": "noise generation"}]
    assert r.verdict == "finding (not a proof)" and verdict_exit_code(r) == 5
    r.violation, r.violation_step = True, 3
    assert verdict_exit_code(r) == 3
