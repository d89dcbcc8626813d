"""`dpaudit demo`: the README's main job, end to end through the real command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from dpaudit_torch.report import AuditReport


def _demo(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpaudit_torch.cli", "demo", "--no-progress",
                           *args], capture_output=True, text=True, timeout=600)


def test_demo_correct_run_writes_report_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _demo(["--steps", "25", "--out", str(out), "--seed", "3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "audit.json").is_file() and (out / "report.html").is_file()
    report = AuditReport.load(out)
    assert report.violation is False and report.claim_refuted is False
    assert report.training["steps"] == 25
    assert report.claimed_epsilon is not None and report.claimed_epsilon > 0
    assert "nothing found" in proc.stdout.lower()
    assert str(out / "report.html") in proc.stdout
    data = json.loads((out / "audit.json").read_text())
    assert data["config"]["demo"]["dataset"].startswith("scikit-learn digits")


def test_demo_with_bug_stops_early_and_exits_3(tmp_path: Path) -> None:
    out = tmp_path / "bug"
    proc = _demo(["--bug", "no-noise", "--steps", "100", "--out", str(out), "--seed", "1"])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = AuditReport.load(out)
    assert report.violation is True
    assert report.stopped_early is True
    assert report.violation_step is not None and report.violation_step <= 10
    assert report.training["steps"] < 100
    # both findings are told: the per-step violation and, since the observations are free of
    # the real data's gradient, the whole-run bound above the claim after a handful of steps
    assert "less private than claimed" in proc.stdout
    assert report.claim_refuted == ("claim refuted" in proc.stdout.lower())
    # no Python warning reaches the terminal: Opacus's RDP "Optimal order is the smallest
    # alpha" and NumPy's overflow in the PRV, raised when the accounting monitor recomputes
    # epsilon for the noise measured (none), are logged at DEBUG
    assert not re.search(r"\w+Warning\b|warnings\.warn", proc.stderr), proc.stderr


def test_demo_progress_bar_shows_loss_and_wealth(tmp_path: Path) -> None:
    """The bar reads the auditor's `latest_metrics`: loss and the e-process vs its threshold."""
    proc = subprocess.run([sys.executable, "-m", "dpaudit_torch.cli", "demo", "--steps", "6",
                           "--out", str(tmp_path / "p")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "loss=" in proc.stderr
    # the proof's threshold: log(1 / 5e-4) = 7.60, the decision's share of alpha = 1e-3
    assert "logK=" in proc.stderr and "/7.60" in proc.stderr


def test_demo_trains_with_ghost_clipping(tmp_path: Path) -> None:
    """`--grad-sample-mode ghost`: Opacus wraps the loss as well as the model, the optimizer and
    the loader (make_private returns four objects); the demo trains through the wrapped loss, so
    the clipped second backward runs, and the audit finds nothing on a correct run and proves the
    no-noise bug."""
    out = tmp_path / "ghost"
    proc = _demo(["--grad-sample-mode", "ghost", "--steps", "25", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = AuditReport.load(out)
    assert report.violation is False and report.training["steps"] == 25
    assert report.training["grad_sample_mode"] == "ghost"
    bug = _demo(["--grad-sample-mode", "ghost", "--bug", "no-noise", "--steps", "40",
                 "--out", str(tmp_path / "ghost_bug")])
    assert bug.returncode == 3, bug.stdout + bug.stderr
    assert AuditReport.load(tmp_path / "ghost_bug").violation is True
