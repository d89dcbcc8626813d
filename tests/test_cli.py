"""The ``dpaudit`` command line: exit codes and one-line usage errors (never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpaudit_torch.cli import EXIT_USAGE, UsageError, _writable_dir, main


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpaudit_torch.cli", *args],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )


def _assert_one_line_usage_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == EXIT_USAGE, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dpaudit: error:")
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_help_everywhere() -> None:
    for args in (["--help"], ["demo", "--help"], ["table1", "--help"], ["report", "--help"]):
        proc = _run(args)
        assert proc.returncode == 0, proc.stderr
        assert "usage:" in proc.stdout


def test_no_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE


def test_unknown_bug_name() -> None:
    _assert_one_line_usage_error(_run(["demo", "--bug", "no-such-bug"]), "no-such-bug")


def test_unknown_option() -> None:
    _assert_one_line_usage_error(_run(["demo", "--frobnicate"]), "--frobnicate")


def test_bad_steps() -> None:
    _assert_one_line_usage_error(_run(["demo", "--steps", "0"]), "--steps")


def test_unwritable_output_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _assert_one_line_usage_error(_run(["demo", "--out", str(blocker / "sub")]), str(blocker))


def test_report_unreadable_json(tmp_path: Path) -> None:
    bad = tmp_path / "audit.json"
    bad.write_text("{not json")
    _assert_one_line_usage_error(_run(["report", str(bad)]), "audit.json")


def test_report_wrong_schema(tmp_path: Path) -> None:
    bad = tmp_path / "audit.json"
    bad.write_text(json.dumps({"schema_version": "999"}))
    _assert_one_line_usage_error(_run(["report", str(bad)]), "audit.json")


def test_report_missing_file(tmp_path: Path) -> None:
    _assert_one_line_usage_error(_run(["report", str(tmp_path / "nope.json")]), "nope.json")


def test_out_naming_an_existing_file_says_so(tmp_path: Path) -> None:
    """`--out file.json` where the file exists: the message says that --out is a file, not a
    directory (not a bare "File exists"); `dpaudit report --out` checks it the same way."""
    existing = tmp_path / "file.json"
    existing.write_text("{}")
    proc = _run(["demo", "--out", str(existing)])
    _assert_one_line_usage_error(proc, f"--out {str(existing)!r} is an existing file, not a "
                                       "directory")
    assert "File exists" not in proc.stderr
    with pytest.raises(UsageError, match=r"cannot be a directory: .*file\.json' is an existing "
                                         r"file"):
        _writable_dir(str(existing / "sub"))


def test_python_warnings_become_log_records(caplog: pytest.LogCaptureFixture) -> None:
    """Inside the command a Python warning is a log record: another library's at INFO (shown
    with -v), this package's own at WARNING; the previous showwarning is put back after."""
    import logging
    import warnings

    from dpaudit_torch.cli import _log_warning
    from dpaudit_torch.stats.base import CannotRejectWarning

    with caplog.at_level(logging.INFO, logger="py.warnings"):
        _log_warning(UserWarning("Optimal order is the smallest alpha."), UserWarning,
                     "/x/opacus/rdp.py", 332)
        _log_warning(CannotRejectWarning("cannot reject"), CannotRejectWarning, "/x/t.py", 1)
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [(logging.INFO, "UserWarning: Optimal order is the smallest alpha. "
                                  "(/x/opacus/rdp.py:332)"),
                   (logging.WARNING, "CannotRejectWarning: cannot reject (/x/t.py:1)")]
    before = warnings.showwarning
    assert main(["report", "missing.json"]) == EXIT_USAGE
    assert warnings.showwarning is before


def test_demo_trains_on_one_thread_unless_told(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """The demo's tiny model trains on one torch thread by default (more threads only contend
    on a busy machine), `--threads N` sets another count; the count is put back after."""
    import torch

    import dpaudit_torch.demo

    seen: list[int] = []

    def fake_run_demo(*args: object, **kwargs: object) -> None:
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt  # stop here: the command answers 130

    monkeypatch.setattr(dpaudit_torch.demo, "run_demo", fake_run_demo)
    before = torch.get_num_threads()
    out = str(tmp_path / "out")
    assert main(["demo", "--no-progress", "--out", out]) == 130
    assert main(["demo", "--no-progress", "--out", out, "--threads", "2"]) == 130
    assert seen == [1, 2] and torch.get_num_threads() == before
    _assert_one_line_usage_error(_run(["demo", "--threads", "0"]), "--threads must be >= 1")


#: what the command line must not import for --help, a bad invocation or ``gate`` (each takes
#: seconds to import; docs/benchmarks.md, "Command-line start-up")
HEAVY = ("torch", "opacus", "numba", "scipy", "matplotlib")

DATA = Path(__file__).resolve().parent / "data"

_LIGHT_CHILD = r"""
import contextlib, io, json, sys
from dpaudit_torch.cli import main
runs = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help
            code = exc.code
    runs.append([code, out.getvalue(), err.getvalue()])
heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
print(json.dumps({"runs": runs, "heavy": heavy}))
"""


def test_help_bad_invocations_and_gate_import_no_heavy_library(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpaudit --help``, a bad invocation and ``gate`` (pass, fail, impossible, --html) run in a
    fresh process without importing torch, Opacus, numba, SciPy or matplotlib, and answer
    exactly as the command does in a process that has imported them all (this one)."""
    import torch  # noqa: F401 - the reference answers come from a process that has torch

    monkeypatch.setenv("COLUMNS", "80")  # --help wraps alike here and in the child
    old = DATA / "report_v1_3.json"
    new = tmp_path / "new" / "audit.json"
    new.parent.mkdir()
    new.write_text(old.read_text(encoding="utf-8"), encoding="utf-8")
    black = json.loads(old.read_text(encoding="utf-8"))
    black["threat_model"]["white_box"] = False
    (tmp_path / "black.json").write_text(json.dumps(black), encoding="utf-8")
    cases = [
        (["--help"], 0), (["gate", "--help"], 0),
        (["frobnicate"], EXIT_USAGE), (["gate", "--bogus"], EXIT_USAGE),
        (["gate", str(tmp_path / "missing.json"), "--first-release"], EXIT_USAGE),
        (["gate", str(new), "--baseline", str(old)], 0),  # pass: gate.html next to new
        (["gate", str(DATA / "report_v2.json"), "--baseline", str(old),  # violation proven
          "--html", str(tmp_path / "fail.html")], 1),
        (["gate", str(tmp_path / "black.json"), "--baseline", str(old),  # threat models differ
          "--html", str(tmp_path / "impossible.html")], 2),
    ]
    argvs = [argv for argv, _ in cases]
    proc = subprocess.run([sys.executable, "-c", _LIGHT_CHILD, json.dumps(argvs),
                           json.dumps(HEAVY)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout)
    assert child["heavy"] == []
    pages = {p: p.read_text(encoding="utf-8") for p in (new.parent / "gate.html",
                                                        tmp_path / "fail.html",
                                                        tmp_path / "impossible.html")}
    for (argv, expected), (code, out, err) in zip(cases, child["runs"]):
        assert code == expected, (argv, err)
        try:
            here = main(argv)
        except SystemExit as exc:
            here = exc.code
        seen = capsys.readouterr()
        assert (here, seen.out, seen.err) == (code, out, err), argv
        if code == EXIT_USAGE and not out:  # a usage error: one line, no traceback
            assert len(err.strip().splitlines()) == 1 and err.startswith("dpaudit: error:")
    assert child["runs"][0][1].startswith("usage: dpaudit")
    assert child["runs"][5][1].splitlines()[-1].startswith("PASS:")
    assert child["runs"][6][1].splitlines()[-1].startswith("FAIL:")
    assert child["runs"][7][1].splitlines()[-1].startswith("CANNOT COMPARE:")
    for page, text in pages.items():  # the pages the light process wrote, written alike here
        assert page.read_text(encoding="utf-8") == text, page


def test_the_bug_registry_imports_no_torch() -> None:
    """``dpaudit --help`` lists the bug names: the registry of :mod:`dpaudit_torch.testing.bugs`
    imports torch only when a bug runs."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from dpaudit_torch.testing import "
                           "bugs; assert bugs.names(); print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
