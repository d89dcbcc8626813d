"""Tests of dpaudit_torch/report/audit_report.py: AuditReport, one class (the data layer plus its
files and renderings), its save() and the public names of dpaudit_torch.report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import make_report

import dpaudit_torch
import dpaudit_torch.report as report_pkg
from dpaudit_torch.report import HTML_NAME, JSON_NAME, AuditReport
from dpaudit_torch.report.html import render_html
from dpaudit_torch.report.schema import ReportData
from dpaudit_torch.report.summary import summary_text

KINDS = ("violation", "refuted", "nothing")


def test_public_names_are_importable() -> None:
    for name in ("AuditReport", "SCHEMA_VERSION", "JSON_NAME", "HTML_NAME", "VERDICT_NOTHING",
                 "VERDICT_REFUTED", "format_number", "library_versions", "validate",
                 "contradictions", "InconsistentReportError"):
        assert getattr(report_pkg, name) is not None, name
    assert set(report_pkg.__all__) >= {"AuditReport", "validate", "format_number"}
    assert dpaudit_torch.AuditReport is AuditReport
    assert report_pkg.VERDICT_NOTHING == "nothing found"
    assert report_pkg.VERDICT_REFUTED == "claim refuted"


def test_one_class_over_the_data_layer(tmp_path: Path) -> None:
    report = make_report("nothing")
    assert isinstance(report, ReportData) and issubclass(AuditReport, ReportData)
    back = AuditReport.from_dict(report.to_dict())
    assert type(back) is AuditReport and back == report
    assert type(AuditReport.load(report.save(tmp_path))) is AuditReport
    assert repr(report).startswith("AuditReport(")
    # the renderings are those of the renderers (which read the data layer only)
    assert report.summary_text() == summary_text(report)
    assert report.to_html() == render_html(report)
    assert not hasattr(ReportData, "save") and not hasattr(ReportData, "to_html")


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(tmp_path: Path, kind: str) -> None:
    report = make_report(kind)
    out = report.save(tmp_path / "nested" / kind)
    assert out == tmp_path / "nested" / kind
    assert (out / JSON_NAME).is_file() and (out / HTML_NAME).is_file()
    assert (out / HTML_NAME).read_text(encoding="utf-8") == report.to_html()
    for where in (out, out / JSON_NAME, str(out / JSON_NAME)):
        back = AuditReport.load(where)
        assert back.to_dict() == report.to_dict()
        assert back == report
    # saving again overwrites in place and leaves no temporary files behind
    if kind == "violation":
        report.save(out)
    assert sorted(p.name for p in out.iterdir()) == [JSON_NAME, HTML_NAME]


def test_save_into_a_file_path_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(OSError):
        make_report("nothing").save(blocker)
    with pytest.raises(ValueError, match="'alpha'"):
        AuditReport(alpha=2.0).save(tmp_path / "never")
    assert not (tmp_path / "never").exists()  # validated before anything is written


def test_save_into_unwritable_path_raises_one_error_naming_it(tmp_path: Path) -> None:
    report = make_report("nothing")
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    for target in (blocker, blocker / "sub"):
        with pytest.raises(OSError, match=re.escape(f"cannot write the audit report into "
                                                    f"{str(target)!r}")):
            report.save(target)
    # the directory exists but its audit.json cannot be replaced (a directory is in the way)
    out = tmp_path / "out"
    (out / JSON_NAME).mkdir(parents=True)
    with pytest.raises(OSError, match=re.escape(repr(str(out)))) as info:
        report.save(out)
    assert isinstance(info.value.__cause__, OSError)
    assert sorted(p.name for p in out.iterdir()) == [JSON_NAME]  # no temporary file left
