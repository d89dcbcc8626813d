"""`make test` on a fresh machine without Chromium: tests/report/test_html_browser.py, run as
`make test` runs it but with no Chromium reachable, ends with its browser tests skipped (one line
saying how to enable them) and exit code 0; with DPAUDIT_REQUIRE_BROWSER=1, as ``.ci/run`` runs
it, the same run fails with that line. The system Chromium that CI installs is hidden by
DPAUDIT_CHROMIUM (set: the only candidate) and by a PATH without any folder holding one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BROWSER_TESTS = "tests/report/test_html_browser.py"
HINT = "apt-get install chromium (root), or set DPAUDIT_CHROMIUM=/path/to/chromium"
N_BROWSER_TESTS = 5  # test_chromium_is_found and the four that render a report

pytestmark = pytest.mark.timeout(240)


def _path_without_chromium() -> str:
    names = ("chromium", "chromium-browser")
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, n)) for n in names)]
    return os.pathsep.join(dirs)


def _env(chromium: str, require: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DPAUDIT_REQUIRE_BROWSER", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env["PATH"] = _path_without_chromium()
    env["COLUMNS"] = "400"  # pytest cuts its summary lines to the terminal's width
    env["DPAUDIT_CHROMIUM"] = chromium
    if require:
        env["DPAUDIT_REQUIRE_BROWSER"] = "1"
    return env


def test_browser_tests_skip_without_chromium_and_fail_when_required(tmp_path: Path) -> None:
    not_executable = tmp_path / "chromium"
    not_executable.write_text("not a browser\n")
    not_executable.chmod(0o644)
    cmd = [sys.executable, "-m", "pytest", BROWSER_TESTS, "-p", "no:cacheprovider", "-q"]
    runs = {  # both at once: each spends most of its time importing torch
        "fresh": (str(not_executable), False),
        "ci": ("", True),
    }
    procs = {name: subprocess.Popen(cmd, cwd=REPO, env=_env(chromium, require), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for name, (chromium, require) in runs.items()}
    out = {name: p.communicate(timeout=200)[0] for name, p in procs.items()}

    fresh = out["fresh"]
    assert procs["fresh"].returncode == 0, fresh
    assert re.search(rf"\b{N_BROWSER_TESTS} skipped\b", fresh), fresh
    assert not re.search(r"\b(failed|error|errors)\b", fresh), fresh
    skip_lines = [line for line in fresh.splitlines() if line.startswith("SKIPPED")]
    assert skip_lines and all("Chromium not found" in line for line in skip_lines), fresh
    assert "is not an executable file" in fresh

    ci = out["ci"]
    assert procs["ci"].returncode == 1, ci
    assert re.search(r"\b1 failed\b", ci) and re.search(r"\b4 errors?\b", ci), ci
    assert "skipped" not in ci, ci
    fail_lines = [line for line in ci.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert len(fail_lines) == N_BROWSER_TESTS, ci
    assert all(HINT in line and "DPAUDIT_REQUIRE_BROWSER is set" in line
               for line in fail_lines), ci
