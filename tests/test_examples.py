"""Smoke runs of the three examples (each as a subprocess, as a user would run it).

Each example runs in a tiny form (few steps, small budgets) and must exit 0 and leave its report
files. The WideResNet is also checked for its architecture (WRN-16-4: 2.75M parameters, every
layer accepted by Opacus) without training it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # two shared cores: one thread per process is faster than oversubscription
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-5000:]}"
    )


def _report_files(directory: Path) -> dict:
    assert (directory / "audit.json").is_file(), f"no audit.json in {directory}"
    assert (directory / "report.html").is_file(), f"no report.html in {directory}"
    from dpaudit_torch import AuditReport

    report = AuditReport.load(directory)  # the saved report validates and loads back
    return json.loads((directory / "audit.json").read_text(encoding="utf-8")) | {
        "_verdict": report.verdict
    }


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------


def test_quickstart(tmp_path: Path) -> None:
    out = tmp_path / "qs"
    proc = _run("quickstart.py", "--steps", "30", "--out", str(out), cwd=tmp_path)
    _ok(proc)
    d = _report_files(out)
    assert "Verdict:" in proc.stdout
    assert d["claimed_epsilon"] is not None and d["claimed_epsilon"] > 0
    assert d["training"]["steps"] == 30


def test_mnist_opacus_runs_without_the_auditor(tmp_path: Path) -> None:
    # a plain Opacus script (dpaudit run audits it: tests/test_launch.py); an empty --data-root
    # falls back to FakeData of MNIST's shape, 4 steps
    proc = _run("mnist_opacus.py", "--fake-size", "256", "--data-root", str(tmp_path),
                cwd=tmp_path)
    _ok(proc)
    assert f"no MNIST files under {tmp_path}: training on FakeData" in proc.stdout
    assert "Train Epoch: 1" in proc.stdout and "(ε = " in proc.stdout
    assert "Test set: Average loss" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing fetched


def test_audit_mechanism_finds_the_bug(tmp_path: Path) -> None:
    out = tmp_path / "am"
    proc = _run("audit_mechanism.py", "--budget", "400", "--out", str(out), cwd=tmp_path)
    _ok(proc)
    lines = proc.stdout.splitlines()
    buggy = lines.index("buggy_private_mean:")
    # the bug makes one record move the output by ~1.03 noise standard deviations, far above what
    # epsilon = 0.1 allows: both tests reject it within ~200 pairs (fixed seed 0: 173 and 97)
    assert "NOT (0.1, 1e-05)-DP" in lines[buggy + 1], proc.stdout
    assert "NOT (0.1, 1e-05)-DP" in lines[buggy + 2], proc.stdout
    d = _report_files(out / "buggy_private_mean")
    assert d["violation"] is True and d["claim_refuted"] is True
    assert d["_verdict"] == "claim refuted"
    _report_files(out / "private_mean")


def test_audit_mechanism_bad_budget(tmp_path: Path) -> None:
    proc = _run("audit_mechanism.py", "--budget", "0", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "--budget" in proc.stderr


def test_cifar10_wrn_fake_data(tmp_path: Path) -> None:
    # the real WRN-16-4 (default width), 2 logical steps of ~16 examples in physical batches of
    # at most 8; the noise is calibrated by Opacus to epsilon = 8 (RDP: faster than PRV here)
    out = tmp_path / "wrn"
    proc = _run(
        "cifar10_wrn.py", "--fake-data", "--fake-size", "256", "--steps", "2",
        "--batch-size", "16", "--max-physical-batch-size", "8", "--m-canaries", "200",
        "--epsilon", "8", "--accountant", "rdp", "--device", "cpu", "--seed", "0",
        "--no-progress", "--out", str(out), cwd=tmp_path,
    )
    _ok(proc)
    d = _report_files(out)
    ex = d["config"]["example"]
    assert ex["steps_run"] == 2
    assert ex["model"] == "WideResNet-16-4 (GroupNorm)" and ex["parameters"] == 2_748_890
    assert ex["max_physical_batch_size"] == 8
    assert d["training"]["steps"] == 2
    assert d["canaries"]["m_one_run"] == 200
    # Opacus's calibration stops within its tolerance (0.01) below the target
    assert 7.98 <= d["claimed_epsilon"] <= 8.0 + 1e-9


def test_cifar10_wrn_power_only_prints_the_expected_audit(tmp_path: Path) -> None:
    """--power-only: the white-box bound a correct run of the papers' setting gives, without
    data; a smaller setting here (the default T = 2500 costs about 10 s)."""
    proc = _run("cifar10_wrn.py", "--power-only", "--steps", "300", "--m-canaries", "4000",
                "--epsilon", "4", cwd=tmp_path, timeout=300)
    _ok(proc)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("expected audit of a correct run (sigma ")
    assert "T 300, 4000 canaries): white-box bound " in line
    assert "against the claimed epsilon 4" in line and "lower bound of 1.8 against" in line
    bound = float(line.split("white-box bound ")[1].split(" ")[0])
    assert 0.5 * 4 < bound < 4


def test_cifar10_wrn_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    proc = _run("cifar10_wrn.py", "--data", str(tmp_path / "nowhere"), "--device", "cpu",
                cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "no CIFAR-10 under" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wide_resnet_16_4_architecture() -> None:
    from opacus.validators import ModuleValidator

    wrn = _load_example("cifar10_wrn")
    model = wrn.WideResNet(depth=16, width=4)
    n_params = sum(p.numel() for p in model.parameters())
    # 3x3 stem, 3 groups x 2 pre-activation blocks at widths 64/128/256, 1x1 projections,
    # GroupNorm affine parameters, 256 -> 10 head
    assert n_params == 2_748_890
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert ModuleValidator.validate(model, strict=False) == []
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 + 3 * 2 * 2 + 3  # stem + two 3x3 per block + 3 projections
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="6n \\+ 4"):
        wrn.WideResNet(depth=15)
