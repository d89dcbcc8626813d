"""Tests of the report's data layer (dpaudit_torch/report/schema.py): fields and their checks,
strict JSON, versions (older minor versions load with the new fields at their defaults), the
verdict, and the readings of the data the renderers share."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_report, power_dict

from dpaudit_torch.registry import ONE_STEP, WHOLE_RUN
from dpaudit_torch.report import JSON_NAME, SCHEMA_VERSION, AuditReport
from dpaudit_torch.report.schema import (
    FINDING_LEVELS,
    VERDICT_EXIT_CODES,
    VERDICTS,
    ReportData,
    decode_nonfinite,
    encode_nonfinite,
    is_num,
    is_one_step,
    library_versions,
    no_steps_audited,
    per_step_delta,
    plain,
    verdict_phrase,
)

KINDS = ("violation", "refuted", "nothing")


def _write(tmp_path: Path, report: ReportData) -> Path:
    """audit.json of ``report`` (no page: the schema alone)."""
    path = tmp_path / JSON_NAME
    path.write_text(report.to_json() + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# data object and JSON
# ----------------------------------------------------------------------------------------------


def test_defaults_build_piecemeal() -> None:
    r = AuditReport()
    assert r.schema_version == SCHEMA_VERSION
    assert set(r.versions) == {"dpaudit_torch", "torch", "opacus", "python"}
    assert r.monitor_labels == {} and r.findings == []
    r.claimed_epsilon = 1.5
    r.epsilon_lower_bounds["steinke"] = 0.3
    d = r.to_dict()
    assert d["claimed_epsilon"] == 1.5 and d["epsilon_lower_bounds"] == {"steinke": 0.3}
    assert r.verdict == "nothing found"


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip(tmp_path: Path, kind: str) -> None:
    report = make_report(kind)
    back = AuditReport.load(_write(tmp_path, report))
    assert back == report and back.to_dict() == report.to_dict()
    assert AuditReport.from_dict(json.loads(report.to_json())) == report


def test_json_is_strict_and_nonfinite_round_trips(tmp_path: Path) -> None:
    report = make_report("nothing")
    report.claimed_epsilon = math.inf  # e.g. a run with no noise: nothing is claimed
    report.wealth_history["mmd"][3] = -math.inf
    report.sequential["nan_example"] = math.nan
    path = _write(tmp_path, report)

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} written")

    raw = json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constants)
    assert raw["claimed_epsilon"] == "Infinity"
    back = AuditReport.load(tmp_path)
    assert back.claimed_epsilon == math.inf
    assert back.wealth_history["mmd"][3] == -math.inf
    assert math.isnan(back.sequential["nan_example"])


def test_encode_and_decode_nonfinite() -> None:
    value = {"a": [1.0, math.inf, {"b": -math.inf}], "c": math.nan, "d": "text", "e": None}
    encoded = encode_nonfinite(value)
    assert encoded == {"a": [1.0, "Infinity", {"b": "-Infinity"}], "c": "NaN", "d": "text",
                       "e": None}
    json.dumps(encoded, allow_nan=False)
    back = decode_nonfinite(encoded)
    assert back["a"] == [1.0, math.inf, {"b": -math.inf}] and math.isnan(back["c"])


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


def test_plain_names_the_bad_value() -> None:
    assert plain((1, np.int32(2), {"k": np.float16(0.5)}), "x") == [1, 2, {"k": 0.5}]
    with pytest.raises(ValueError, match=r"x\.k: keys must be strings"):
        plain({"k": {3: 1}}, "x")
    with pytest.raises(ValueError, match=r"x\[1\]: value .* of type object is not JSON-able"):
        plain([1, object()], "x")


def test_is_num() -> None:
    assert is_num(1) and is_num(0.5) and is_num(math.inf)
    assert not is_num(True) and not is_num("1") and not is_num(None)


def test_library_versions() -> None:
    v = library_versions()
    assert set(v) == {"dpaudit_torch", "torch", "opacus", "python"}
    assert all(isinstance(x, str) and x for x in v.values())


# ----------------------------------------------------------------------------------------------
# field checks
# ----------------------------------------------------------------------------------------------


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
        ({"monitor_labels": ["noise"]}, "'monitor_labels'"),
        ({"monitor_labels": {"noise": 3}}, "'monitor_labels'"),
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


# ----------------------------------------------------------------------------------------------
# versions: power (1.1), findings (1.2), monitor_labels (1.3), fingerprint (1.4)
# ----------------------------------------------------------------------------------------------


def test_power_round_trip_and_schema_version(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == "1.6"
    report = make_report("nothing")
    report.power = power_dict()
    path = _write(tmp_path, report)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["schema_version"] == "1.6" and raw["power"] == power_dict()
    back = AuditReport.load(path)
    assert back == report and back.power == power_dict()
    assert AuditReport().to_dict()["power"] == {}


def test_old_reports_without_power_still_load(tmp_path: Path) -> None:
    d = make_report("violation").to_dict()
    for key in ("power", "findings", "claim_inconsistent", "audits", "monitor_labels",
                "fingerprint", "checks", "alpha_warn", "evidence", "evidence_step",
                "proof_levels"):
        del d[key]
    d["schema_version"] = "1.0"
    (tmp_path / JSON_NAME).write_text(json.dumps(d), encoding="utf-8")
    old = AuditReport.load(tmp_path)
    assert old.power == {} and old.schema_version == SCHEMA_VERSION  # read as this version
    assert old.monitor_labels == {} and old.findings == [] and old.audits == {}
    assert old.claimed_epsilon == d["claimed_epsilon"] and old.violation
    (tmp_path / "again").mkdir()
    again = _write(tmp_path / "again", old)
    assert json.loads(again.read_text())["schema_version"] == "1.6"
    # a 1.0 document cannot hold a field that 1.0 did not have
    d["power"] = power_dict()
    with pytest.raises(ValueError, match=r"\['power'\] do not exist in schema 1.0"):
        AuditReport.from_dict(d)


def test_monitor_labels_since_1_3() -> None:
    labels = {"noise": "noise", "sampling": "sampling (batch sizes not Poisson)"}
    report = make_report("nothing")
    report.monitor_labels = labels
    assert AuditReport.from_dict(report.to_dict()).monitor_labels == labels
    # a 1.2 document has no labels: it loads with {} and carries 1.3 afterwards
    d = report.to_dict()
    del d["monitor_labels"], d["fingerprint"], d["checks"]
    for key in ("alpha_warn", "evidence", "evidence_step", "proof_levels"):
        del d[key]
    d["schema_version"] = "1.2"
    old = AuditReport.from_dict(d)
    assert old.monitor_labels == {} and old.schema_version == SCHEMA_VERSION
    # ... and cannot hold them
    d["monitor_labels"] = labels
    with pytest.raises(ValueError, match=r"\['monitor_labels'\] do not exist in schema 1.2 "
                                         r"\(added in 1.3\)"):
        AuditReport.from_dict(d)


def test_fingerprint_since_1_4() -> None:
    """A 1.3 document (tests/data/report_v1_3.json, written by the 1.3 release) loads with
    ``fingerprint = {}`` and carries 1.4 afterwards; a 1.3 document cannot hold one; a
    fingerprint must be an object."""
    data = Path(__file__).resolve().parents[1] / "data" / "report_v1_3.json"
    raw = json.loads(data.read_text(encoding="utf-8"))
    assert raw["schema_version"] == "1.3" and "fingerprint" not in raw
    old = AuditReport.from_dict(raw)
    assert old.fingerprint == {} and old.schema_version == SCHEMA_VERSION
    assert AuditReport.from_dict(old.to_dict()) == old
    with pytest.raises(ValueError, match=r"\['fingerprint'\] do not exist in schema 1.3 "
                                         r"\(added in 1.4\)"):
        AuditReport.from_dict({**raw, "fingerprint": {"version": 1}})
    with pytest.raises(ValueError, match="'fingerprint' must be a dict"):
        AuditReport.from_dict({**old.to_dict(), "fingerprint": ["white box"]})


def test_findings_with_and_without_scope() -> None:
    report = make_report("nothing")
    report.findings = [
        {"monitor": "a", "level": "note", "message": "no scope", "where": None},
        {"monitor": "b", "level": "note", "message": "one step", "where": None,
         "scope": ONE_STEP},
        {"monitor": "c", "level": "note", "message": "whole run", "where": "x",
         "scope": WHOLE_RUN},
        {"monitor": "d", "level": "note", "message": "none", "where": None, "scope": None},
    ]
    assert AuditReport.from_dict(report.to_dict()).findings == report.findings
    report.findings = [{"monitor": "a", "level": "note", "message": "m", "where": None,
                        "scope": "a fortnight"}]
    with pytest.raises(ValueError, match=r"'findings\[0\]'.*optionally scope"):
        report.to_dict()


def test_power_is_validated_key_by_key() -> None:
    for change, message in [({"expected_bound": -1.0}, "'power.expected_bound'"),
                            ({"min_refutable_epsilon": "big"}, "'power.min_refutable_epsilon'"),
                            ({"target_power": 1.2}, "'power.target_power'"),
                            ({"replicates": 2.5}, "'power.replicates'"),
                            ({"expected_bound_quantiles": [0.1]},
                             "'power.expected_bound_quantiles'"),
                            ({"warnings": [3]}, "'power.warnings'"),
                            ({"no_power": "no"}, "'power.no_power'"),
                            ({"score": 7}, "'power.score'")]:
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


# ----------------------------------------------------------------------------------------------
# verdict
# ----------------------------------------------------------------------------------------------


def test_verdict_precedence() -> None:
    v = make_report("violation")
    assert v.verdict == f"violation proven at step {v.violation_step}"
    assert AuditReport(violation=True).verdict == "violation proven"
    r = make_report("refuted")
    assert r.verdict == "claim refuted"
    r.violation, r.violation_step = True, 5  # a refuted claim takes precedence
    assert r.verdict == "claim refuted"
    assert make_report("nothing").verdict == "nothing found"


def test_verdict_vocabulary_and_findings(tmp_path: Path) -> None:
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
    assert verdict_phrase(base.verdict) in VERDICTS
    back = AuditReport.load(_write(tmp_path, base))
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


def test_verdict_phrase_and_exit_codes() -> None:
    assert verdict_phrase("violation proven at step 3") == "violation proven"
    with pytest.raises(ValueError, match="not a verdict"):
        verdict_phrase("probably fine")
    assert set(VERDICT_EXIT_CODES) == set(VERDICTS)
    assert VERDICT_EXIT_CODES["nothing found"] == 0 and VERDICT_EXIT_CODES["claim refuted"] == 3
    assert FINDING_LEVELS[0] == "violation"


def test_exit_codes_of_the_command_follow_the_verdict() -> None:
    from dpaudit_torch.cli import verdict_exit_code

    r = make_report("nothing")
    assert verdict_exit_code(r) == 0
    r.findings = [{"monitor": "accounting", "level": "inconsistent", "message": "m",
                   "where": "accountant"}]
    r.claim_inconsistent = True
    assert verdict_exit_code(r) == 4
    r.claim_inconsistent = False
    r.findings = [{"monitor": "noise", "level": "finding", "message": "bfloat16 grid",
                   "where": "noise generation"}]
    assert r.verdict == "finding (not a proof)" and verdict_exit_code(r) == 5
    r.violation, r.violation_step = True, 3
    assert verdict_exit_code(r) == 3


# ----------------------------------------------------------------------------------------------
# readings shared by the renderers
# ----------------------------------------------------------------------------------------------


def test_no_steps_audited() -> None:
    assert no_steps_audited({"audited_steps": 0})
    assert not no_steps_audited({"audited_steps": 3})
    assert not no_steps_audited({})  # not recorded is not "none"


def test_per_step_delta() -> None:
    det = {"grid_epsilons": [0.1, 0.5, 1.0], "grid_deltas": [1e-6, 2e-6, 3e-6]}
    assert per_step_delta(0.5, det) == 2e-6
    assert per_step_delta(0.0, det) is None  # nothing rejected
    assert per_step_delta(0.7, det) is None  # not a grid point
    assert per_step_delta(0.5, {"grid_epsilons": [0.5], "grid_deltas": []}) is None
    assert per_step_delta(None, det) is None


def test_is_one_step() -> None:
    assert is_one_step("sequential")
    assert not is_one_step("steinke") and not is_one_step("fdp")
    assert not is_one_step("a_method_from_the_future")


def test_checks_since_1_5() -> None:
    """A 1.4 document has no ``checks``: it loads with ``[]`` and carries 1.5 afterwards, and
    cannot hold them; a section must have its keys and a known status."""
    report = make_report("nothing")
    section = {"monitor": "m", "title": "M", "ran": True, "reason_not_run": None,
               "status": "checked, nothing found", "checked": [{"check": "c", "outcome": "o"}],
               "measured": [{"quantity": "q", "value": 1.5}], "not_checked": [],
               "findings": []}
    report.checks = [section]
    assert AuditReport.from_dict(report.to_dict()).checks == [section]
    d = report.to_dict()
    for key in ("checks", "alpha_warn", "evidence", "evidence_step", "proof_levels"):
        del d[key]
    d["schema_version"] = "1.4"
    old = AuditReport.from_dict(d)
    assert old.checks == [] and old.schema_version == SCHEMA_VERSION
    d["checks"] = [section]
    with pytest.raises(ValueError, match=r"\['checks'\] do not exist in schema 1.4 "
                                         r"\(added in 1.5\)"):
        AuditReport.from_dict(d)
    report.checks = [{**section, "status": "fine"}]
    with pytest.raises(ValueError, match=r"'checks\[0\]'.*a status among"):
        report.to_dict()
