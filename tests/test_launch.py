"""``dpaudit run`` (dpaudit_torch/launch.py, dpaudit_torch/_bootstrap): unmodified scripts audited.

The end-to-end tests run ``dpaudit run`` (in this process: ``cli.main``) on scripts that are
never edited: ``examples/quickstart.py`` (which builds its own auditor), ``examples/
mnist_opacus.py`` (plain Opacus, FakeData of MNIST's shape), under ``torchrun`` with 2 gloo
ranks, and small scripts written here (a crash, no ``make_private``). Each keeps its steps few
through its own command-line arguments.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from dpaudit_torch import launch
from dpaudit_torch.cli import EXIT_USAGE, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MNIST = str(EXAMPLES / "mnist_opacus.py")
#: few steps: FakeData of 640 images at expected batch 64 is 10 steps an epoch
SMALL = ["--fake-size", "640"]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # two shared cores: one thread per process is faster than oversubscription
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    # an uninstalled checkout: the script's processes import dpaudit_torch from here
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args])
    out, err = capfd.readouterr()
    return code, out, err


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("dpaudit: error:")]


def _report(path: Path) -> dict[str, Any]:
    from dpaudit_torch import AuditReport

    AuditReport.load(path)  # a valid report
    assert (path / "report.html").is_file()
    return json.loads((path / "audit.json").read_text(encoding="utf-8"))


def _verdict(path: Path) -> str:
    from dpaudit_torch import AuditReport

    return AuditReport.load(path).verdict


# ------------------------------------------------------------------ end to end
def test_quickstart_unchanged_its_own_auditor_is_reported(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capfd, "--out", str(tmp_path / "audit"), "--",
                          sys.executable, str(EXAMPLES / "quickstart.py"), "--steps", "20",
                          "--out", str(tmp_path / "own"))
    assert code == 0, err
    assert _verdict(tmp_path / "audit") == "nothing found"
    # the script's own auditor (built right after make_private) is the one reported: the same
    # audit as the report the script saved itself
    own = json.loads((tmp_path / "own" / "audit.json").read_text(encoding="utf-8"))
    ours = _report(tmp_path / "audit")
    assert ours["wealth_history"] == own["wealth_history"]
    assert ours["training"]["audited_steps"] == 20
    assert "its own PrivacyAuditor" in err
    assert f"report: {tmp_path / 'audit' / 'report.html'}" in out
    assert not _errors(err)


def test_mnist_example_correct_runs_one_report_per_make_private_call(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capfd, "--out", str(tmp_path), "--config", str(_config(tmp_path)),
                          "--", sys.executable, MNIST, *SMALL, "--n-runs", "2")
    assert code == 0, err
    for i in (0, 1):  # two make_private calls: one report each
        rep = _report(tmp_path / f"audit-{i}")
        assert rep["training"]["audited_steps"] == 10
        assert rep["config"]["k_pairs"] == 8 and rep["config"]["delta"] == 1e-6
        assert rep["config"]["on_violation"] == "warn"
    assert not (tmp_path / "audit.json").exists()
    assert out.count("Verdict: nothing found") == 2
    assert "Test set" in out  # the script's own output goes through


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "audit.toml"
    path.write_text("k_pairs = 8\ndelta = 1e-6\nseed = 3\n", encoding="utf-8")
    return path


def test_injected_bug_is_a_violation_and_training_goes_on(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capfd, "--out", str(tmp_path), "--inject-bug", "no-noise", "--",
                          sys.executable, MNIST, *SMALL)
    assert code == 3, err
    rep = _report(tmp_path)
    assert rep["violation"] and rep["training"]["audited_steps"] == 10  # not stopped
    assert "no-noise" in err and "PrivacyViolationError" not in err
    assert not _errors(err)


def test_stop_on_violation_raises_from_the_step(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capfd, "--out", str(tmp_path), "--inject-bug", "no-noise",
                          "--stop-on-violation", "--", sys.executable, MNIST, *SMALL)
    assert code == 3, err  # the verdict's, not a failed script's
    assert "dpaudit_torch.audit.engine.PrivacyViolationError: privacy violation proven" in err
    assert "optimizer.step()" in err or "in step" in err  # raised from the step
    assert "raised by dpaudit run --stop-on-violation" in err
    rep = _report(tmp_path)
    assert rep["violation"] and rep["training"]["audited_steps"] < 10
    assert "Test set" not in out  # the script stopped
    assert not _errors(err)


CRASH = """
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(512, 20)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
engine = PrivacyEngine()
model, opt, dl = engine.make_private_with_epsilon(
    module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
    target_epsilon=3.0, target_delta=1e-5, epochs=2, max_grad_norm=1.0)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5)  # wraps optimizer.step itself
for i, (xb, yb) in enumerate(dl):
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    sched.step()
    if i == 7:
        raise RuntimeError("the data pipeline broke")
"""


def test_a_crashing_script_is_exit_2_and_its_report_is_written(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH, encoding="utf-8")
    code, out, err = _run(capfd, "--out", str(tmp_path / "out"), "--", sys.executable,
                          str(script))
    assert code == EXIT_USAGE
    (line,) = _errors(err)
    assert "the script failed (exit code 1: RuntimeError: the data pipeline broke)" in line
    assert f"the report of what ran was written: {tmp_path / 'out'}" in line
    # one call of make_private_with_epsilon (which calls make_private): one report, in --out
    rep = _report(tmp_path / "out")
    assert rep["training"]["audited_steps"] == 8
    assert any("ended with an exception (RuntimeError: the data pipeline broke) after 8 "
               "audited step(s)" in w for w in rep["warnings"])
    assert "Traceback" in err and "the data pipeline broke" in err  # the script's own


def test_a_script_that_never_calls_make_private_is_one_line_exit_2(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('no Opacus here')\n", encoding="utf-8")
    code, out, err = _run(capfd, "--out", str(tmp_path / "out"), "--", sys.executable,
                          str(script))
    assert code == EXIT_USAGE
    assert err.strip().splitlines() == [
        "dpaudit: error: the script never called PrivacyEngine.make_private (or "
        "make_private_with_epsilon): nothing was audited (a Python started with -E, -I or -S "
        "ignores PYTHONPATH and is not reached)"]
    assert "no Opacus here" in out
    assert not (tmp_path / "out" / "audit.json").exists()


TINY = """
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

x, y = torch.randn(64, 2), torch.randint(0, 2, (64,))
model = nn.Linear(2, 2)  # 6 coordinates: too few for the canaries
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, dl = PrivacyEngine().make_private(
    module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
    noise_multiplier=1.0, max_grad_norm=1.0)
for xb, yb in dl:
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
print("trained", opt.state_dict()["state"] is not None)
"""


def test_a_setup_the_auditor_refuses_trains_on_unaudited_and_says_why(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(TINY, encoding="utf-8")
    code, out, err = _run(capfd, "--out", str(tmp_path / "out"), "--", sys.executable,
                          str(script))
    assert code == EXIT_USAGE
    assert "trained True" in out  # the script ran to its end
    (line,) = _errors(err)
    assert line.startswith("dpaudit: error: nothing was audited (the auditor could not be "
                           "attached to the optimizer of make_private call 0: ValueError: the "
                           "model has 6 trainable coordinates"), line
    assert not (tmp_path / "out" / "audit.json").exists()


def test_a_script_that_fails_before_make_private(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "early.py"
    script.write_text("import sys\nsys.exit(4)\n", encoding="utf-8")
    code, _, err = _run(capfd, "--out", str(tmp_path), "--", sys.executable, str(script))
    assert code == EXIT_USAGE
    assert _errors(err) == ["dpaudit: error: the script failed (exit code 4) before any "
                            "PrivacyEngine.make_private call: nothing was audited, no report"]


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="no torchrun next to this Python")
def test_torchrun_two_gloo_ranks_rank_0_writes(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    code, out, err = _run(capfd, "--out", str(tmp_path), "--", torchrun, "--standalone",
                          "--nproc_per_node", "2", MNIST, *SMALL)
    assert code == 0, err
    rep = _report(tmp_path)
    assert rep["training"]["world_size"] == 2 and rep["training"]["audited_steps"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.json", "report.html"]
    assert out.count("Verdict:") == 1  # one report: rank 0's


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("args,needle", [
    ([], "no script given"),
    (["--"], "no script given"),
    (["--inject-bug", "nope", "--", "python", "x.py"], "unknown bug 'nope'"),
    (["--delta", "2", "--", "python", "x.py"], "--delta: delta"),
    (["--", "/nonexistent/command"], "cannot run '/nonexistent/command'"),
])
def test_usage_errors_are_one_line(args: list[str], needle: str, tmp_path: Path,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capfd, "--out", str(tmp_path), *args)
    assert code == EXIT_USAGE
    (line,) = err.strip().splitlines()
    assert line.startswith("dpaudit: error:") and needle in line, line


@pytest.mark.parametrize("text,name,needle", [
    ('{"k_pairs": 0}', "a.json", "k_pairs"),
    ('{"kpairs": 4}', "a.json", "unknown audit setting(s) ['kpairs']"),
    ("[1, 2]", "a.json", "one table"),
    ("{nope", "a.json", "not valid JSON"),
    ("k_pairs = ", "a.toml", "not valid TOML"),
])
def test_bad_config_files(text: str, name: str, needle: str, tmp_path: Path,
                          capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, _, err = _run(capfd, "--out", str(tmp_path), "--config", str(path), "--",
                        "python", "x.py")
    assert code == EXIT_USAGE
    (line,) = err.strip().splitlines()
    assert line.startswith(f"dpaudit: error: --config {str(path)!r}") and needle in line, line


def test_settings_from_file_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text('{"k_pairs": 4, "delta": 1e-6, "on_violation": "stop"}', encoding="utf-8")
    file = launch.load_settings(path)
    assert launch.audit_settings(file) == {"k_pairs": 4, "delta": 1e-6, "on_violation": "stop"}
    assert launch.audit_settings(file, delta=1e-7, stop_on_violation=True) == {
        "k_pairs": 4, "delta": 1e-7, "on_violation": "raise"}
    assert launch.audit_settings() == {"on_violation": "warn"}


# ------------------------------------------------------------------ the verdict, from statuses
def _status(**kw: Any) -> dict[str, Any]:
    return {"pid": 1, "rank": 0, "executable": "python", "calls": [], "hook_error": None,
            "exception": None, "stopped_by_audit": False, **kw}


def test_run_result_problems_and_exit_codes() -> None:
    call = {"index": 0, "steps": 0, "error": None, "report_dir": None}
    never = launch.RunResult(0, [_status(calls=[call])])
    assert never.problem == "nothing was audited (the DP optimizer never stepped)"
    assert never.exit_code == EXIT_USAGE
    refused = launch.RunResult(0, [_status(calls=[{**call, "error": "the auditor could not "
                                                   "be attached: ValueError: x"}])])
    assert refused.problem == ("nothing was audited (the auditor could not be attached: "
                               "ValueError: x)")
    hook = launch.RunResult(0, [_status(hook_error="ImportError: no dpaudit_torch",
                                        executable="/usr/bin/python3")])
    assert hook.problem is not None and "/usr/bin/python3" in hook.problem
    killed = launch.RunResult(-9, [])
    assert "killed by signal 9" in (killed.problem or "")
    partly = launch.RunResult(0, [_status(calls=[
        {**call, "steps": 5, "report_dir": "a"},
        {**call, "index": 1, "error": "the auditor could not be attached to the optimizer of "
                                      "make_private call 1: ValueError: x"}])],
        reports=[(Path("a"), _Report("nothing found"))])
    assert partly.problem == ("not every make_private call was audited: the auditor could not "
                              "be attached to the optimizer of make_private call 1: ValueError: x")
    assert partly.exit_code == EXIT_USAGE


class _Report:
    def __init__(self, verdict: str) -> None:
        self.verdict = verdict


def test_the_strongest_verdict_is_the_exit_code() -> None:
    calls = [{"index": 0, "steps": 5, "error": None, "report_dir": "a"}]
    result = launch.RunResult(0, [_status(calls=calls)], reports=[
        (Path("a"), _Report("nothing found")), (Path("b"), _Report("claim inconsistent")),
        (Path("c"), _Report("finding (not a proof)"))])
    assert result.problem is None and result.exit_code == 4
    stopped = launch.RunResult(1, [_status(calls=calls, stopped_by_audit=True,
                                           exception="PrivacyViolationError: ...")],
                               reports=[(Path("a"), _Report("violation proven at step 5"))])
    assert stopped.problem is None and stopped.exit_code == 3


def test_mnist_example_does_not_import_dpaudit() -> None:
    tree = ast.parse(Path(MNIST).read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "opacus" in imported
    assert not any(m.split(".")[0] == "dpaudit_torch" for m in imported)


# ------------------------------------------------------------------ the release gate on dpaudit run
def test_gate_passes_two_correct_runs_and_fails_a_buggy_one(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Two correct ``dpaudit run``s of the unchanged MNIST example (other auditor seeds): the
    gate passes the second against the first; a run with a ``testing.bugs`` bug fails it."""
    runs = {"base": ([], 1), "new": ([], 2), "buggy": (["--inject-bug", "no-noise"], 3)}
    for name, (extra, seed) in runs.items():
        config = tmp_path / f"{name}.toml"
        config.write_text(f'k_pairs = 8\nseed = {seed}\nmodel_name = "SampleConvNet"\n'
                          f'dataset_name = "mnist-fake"\n', encoding="utf-8")
        code, _, err = _run(capfd, "--out", str(tmp_path / name), "--config", str(config),
                            *extra, "--", sys.executable, MNIST, *SMALL)
        assert code == (3 if extra else 0), err
    base = str(tmp_path / "base" / "audit.json")
    assert main(["gate", str(tmp_path / "new"), "--baseline", base]) == 0, capfd.readouterr()
    assert capfd.readouterr().out.strip().splitlines()[-1].startswith("PASS")
    assert main(["gate", str(tmp_path / "buggy"), "--baseline", base]) == 1
    assert capfd.readouterr().out.strip().splitlines()[-1].startswith("FAIL")
