"""The first hour on a new machine (README "Quickstart", docs/examples.md): which torch
``make`` installs (tools/choose_torch.py, its reachability probe stubbed or pointed at a silent
local socket), and the one-line error of an example whose extra dependency is missing."""

from __future__ import annotations

import importlib.util
import runpy
import socket
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _choose_torch() -> ModuleType:
    path = ROOT / "tools" / "choose_torch.py"
    spec = importlib.util.spec_from_file_location("choose_torch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["choose_torch"] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


ct = _choose_torch()


def _never_called() -> bool:
    raise AssertionError("the probe ran where it does not matter")


@pytest.mark.parametrize(("reachable", "kind"), [(True, "cpu"), (False, "default")])
def test_linux_without_cuda_takes_the_cpu_build_only_where_its_index_answers(
        reachable: bool, kind: str) -> None:
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        return reachable

    choice = ct.choose(installed=None, override=None, system="Linux", cuda=False, reachable=probe)
    assert choice.kind == kind and calls == [1]
    args = choice.pip_args("torch>=2.6,<=2.14.1")
    assert args[0] == "torch>=2.6,<=2.14.1"
    assert ("--index-url" in args) == (kind == "cpu")
    if kind == "cpu":
        assert args[args.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(("kw", "kind", "word"), [
    ({"installed": "2.14.1", "override": None, "system": "Linux", "cuda": False}, "keep",
     "already installed"),
    ({"installed": None, "override": None, "system": "Linux", "cuda": True}, "default", "CUDA"),
    ({"installed": None, "override": None, "system": "Darwin", "cuda": False}, "default",
     "Darwin"),
    ({"installed": None, "override": "cpu", "system": "Linux", "cuda": True}, "cpu",
     "DPAUDIT_TORCH=cpu"),
    ({"installed": None, "override": "default", "system": "Linux", "cuda": False}, "default",
     "DPAUDIT_TORCH=default"),
])
def test_the_probe_runs_only_when_it_decides(kw: dict[str, Any], kind: str, word: str) -> None:
    choice = ct.choose(reachable=_never_called, **kw)
    assert choice.kind == kind and word in choice.reason
    assert (choice.pip_args("torch") == []) == (kind == "keep")


def test_a_bad_override_names_the_value() -> None:
    with pytest.raises(ValueError, match="'gpu'"):
        ct.choose(installed=None, override="gpu", system="Linux", cuda=False,
                  reachable=_never_called)


def test_the_probe_gives_up_after_its_timeout_on_a_silent_server() -> None:
    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/whl/cpu"
        start = time.monotonic()
        assert ct.index_reachable(url, timeout=0.5) is False
        assert time.monotonic() - start < 2.0


def test_make_prints_which_torch_it_installed(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[list[str]] = []

    class Done:
        returncode = 0
        stdout = "2.14.1\n"

    def run(command: list[str], **_: Any) -> Done:
        ran.append(command)
        return Done()

    monkeypatch.setattr(ct.subprocess, "run", run)
    monkeypatch.setattr(ct, "installed_torch", lambda: None)
    monkeypatch.setattr(ct, "cuda_device_present", lambda: False)
    monkeypatch.setattr(ct.platform, "system", lambda: "Linux")
    monkeypatch.delenv(ct.OVERRIDE_ENV, raising=False)
    for answers, build in ((True, "CPU-only build"), (False, "default wheel")):
        ran.clear()
        monkeypatch.setattr(ct, "index_reachable", lambda timeout, a=answers: a)
        assert ct.main([]) == 0
        line = capsys.readouterr().out.strip()
        assert line.startswith("torch 2.14.1: " + build), line
        assert ran[0][-1 if not answers else -3] == ct.torch_requirement()
        assert ("--index-url" in ran[0]) == answers


def test_the_torch_range_is_the_packages_own() -> None:
    spec = ct.torch_requirement()
    assert spec.startswith("torch>=")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"{spec}"' in pyproject
    assert f"'{spec}'" in (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "tools/choose_torch.py" in makefile and "examples" in makefile.split("EXTRAS")[1]


EXAMPLES_WITH_EXTRAS = [
    ("mnist_opacus.py", ["--fake-size", "16"], "torchvision"),
    ("cifar10_wrn.py", ["--fake-data", "--steps", "1"], "torchvision"),
    ("transformers_dp_finetune.py", ["--steps", "1"], "transformers"),
    ("llm_lora_dp.py", ["--steps", "1"], "peft"),
]


@pytest.mark.parametrize(("script", "argv", "blocked"), EXAMPLES_WITH_EXTRAS)
def test_an_example_without_its_extra_says_how_to_install_it(
        script: str, argv: list[str], blocked: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(sys.modules):
        if name == blocked or name.startswith(blocked + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, blocked, None)  # "import blocked" raises ImportError
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert blocked in err[0] and "[examples]" in err[0] and script in err[0]
