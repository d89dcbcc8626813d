"""benchmarks/gpu_check.py before any GPU runs it: ``--smoke`` runs its whole logic on the CPU at
tiny sizes (exit code 0, every row of its table met, nothing written), and without a CUDA device
it says so in one line and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
DOC = ROOT / "docs" / "benchmarks.md"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the CPU, also on a machine with a GPU
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _table(stdout: str) -> list[list[str]]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_smoke_runs_the_whole_logic_on_the_cpu() -> None:
    from dpaudit_torch.registry import TESTERS

    before = DOC.read_bytes() if DOC.exists() else None
    out = _run("--smoke", "--lora", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = _table(out.stdout)
    assert table[0] == ["check", "setting", "measured", "criterion", "met"]
    rows = table[1:]
    checks = [r[0] for r in rows]
    for name in TESTERS:  # every registered tester, on a correct stream and a broken one
        assert sum(c.startswith(f"tester {name}:") for c in checks) == 2
    for part in ("noise monitor:", "sampling monitor:", "one-run scores:", "model:"):
        assert sum(c.startswith(part) for c in checks) == 1, part
    syncs = [r for r in rows if r[0].startswith("auditor: host reads")]
    costs = [r for r in rows if r[0].startswith("auditor: cost")]
    assert len(syncs) == len(costs) == 5  # two models x hooks, ghost; the LoRA model, hooks
    assert all("between: max 0 over" in r[2] for r in syncs)
    for r in syncs:  # one host read at each check: the one transfer
        at = r[2].split("at checks: ")[1].split(";")[0].split(" (")[0]
        assert at and all(int(n) == 1 for n in at.split(", ")), r[2]
        assert r[3] == "0 between checks, at most 1 per check"
    assert {r[1].split(" (")[0] for r in syncs} == {"digits", "wrn10-1", "lora"}
    # the guard's step-time targets apply on a GPU only (reported rows, never hard)
    assert all(r[3] == "reported" and r[4] == "-" for r in costs)
    detections = [r for r in rows if r[0].startswith("detection:")]
    assert sorted({r[0] for r in detections}) == ["detection: no-noise",
                                                  "detection: noise-halved"]
    assert len(detections) == 4 and all("violation at step 2" in r[2] for r in detections)
    # the tester placement: host and device side by side, the same numbers, per setting
    same = [r for r in rows if r[0] == "tester placement: device = host"]
    timed = [r for r in rows if r[0] == "tester placement: time per check, host / device"]
    settings = ["check_every 2, 4 pairs per step (8 pairs per check)",
                "check_every 5, 4 pairs per step (20 pairs per check)"]
    assert [r[1] for r in same] == [r[1] for r in timed] == settings
    assert all(r[4] == "yes" and "testers ran on cpu / cpu" in r[2] for r in same)
    assert all("faster: " in r[2] and r[4] == "-" for r in timed)
    entries = [ln for ln in out.stdout.splitlines() if ln.startswith("MEASURED_PLACEMENTS")]
    assert len(entries) == 1 and "('cpu', 2, 4): " in entries[0]
    assert all(r[4] in ("yes", "-") for r in rows), [r for r in rows if r[4] not in ("yes", "-")]
    assert f"{len(rows)} of {len(rows)} rows pass" in out.stdout
    assert (DOC.read_bytes() if DOC.exists() else None) == before  # nothing written


def test_without_a_cuda_device_it_says_so_and_exits_0() -> None:
    out = _run(timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "no CUDA device\n"
