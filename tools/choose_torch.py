#!/usr/bin/env python3
"""Install the PyTorch build that fits this machine, before ``make`` installs the package.

On Linux, pip's default ``torch`` wheel brings about 6 GB of CUDA libraries. A machine without a
CUDA device never uses them, and PyTorch publishes a CPU-only build of the same version on its
own index (https://download.pytorch.org/whl/cpu). So, in the ``.venv`` that ``make demo`` and
``make test`` create:

1. a ``torch`` already installed there is kept (for instance one installed by hand from the
   index that fits your GPU);
2. ``DPAUDIT_TORCH=cpu`` or ``DPAUDIT_TORCH=default`` forces the choice;
3. on Linux without a CUDA device, the CPU-only build is installed when PyTorch's CPU index
   answers within ``--timeout`` seconds (a short probe: CI machines and offline mirrors cannot
   reach it, and must not wait for it);
4. otherwise the default wheel from pip's configured index is installed.

It prints one line saying which build it installed and why. Standard library only: it runs
before anything else is installed. The version range comes from ``pyproject.toml``'s torch
requirement, so that installing the package afterwards keeps this torch.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OVERRIDE_ENV = "DPAUDIT_TORCH"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Choice:
    """What to do about torch: ``keep`` (nothing), ``cpu`` or ``default``, and why."""

    kind: str
    reason: str

    def pip_args(self, spec: str) -> list[str]:
        """The arguments of ``pip install`` for this choice (empty for ``keep``)."""
        if self.kind == "keep":
            return []
        if self.kind == "cpu":
            return [spec, "--index-url", CPU_INDEX]
        return [spec]


def torch_requirement(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The ``torch`` requirement of the project's dependencies, e.g. ``torch>=2.6,<=2.14.1``."""
    text = pyproject.read_text(encoding="utf-8")
    match = re.search(r'^\s*"(torch[<>=!~][^"]*)"', text, flags=re.MULTILINE)
    if match is None:
        raise ValueError(f"no torch requirement found in {pyproject}")
    return match.group(1)


def installed_torch() -> str | None:
    """The version of the torch installed for this interpreter, or None."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def cuda_device_present() -> bool:
    """Whether this machine shows an NVIDIA device (driver files or a working ``nvidia-smi``)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    if Path("/dev/nvidia0").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def index_reachable(url: str = CPU_INDEX, timeout: float = 3.0) -> bool:
    """Whether ``url`` answers within ``timeout`` seconds in all (name lookup included, which
    ``urlopen``'s own timeout does not bound: the request runs in a daemon thread)."""
    answered: list[bool] = []

    def ask() -> None:
        try:
            request = urllib.request.Request(url + "/torch/", method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                answered.append(200 <= response.status < 400)
        except Exception:  # any failure means "not reachable"  # noqa: BLE001
            answered.append(False)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answered and answered[0])


def choose(*, installed: str | None, override: str | None, system: str, cuda: bool,
           reachable: Callable[[], bool]) -> Choice:
    """The decision, from what was found (``reachable`` is called only when it matters)."""
    if override is not None and override not in ("cpu", "default"):
        raise ValueError(f"{OVERRIDE_ENV}={override!r}: expected 'cpu' or 'default'")
    if installed is not None:
        return Choice("keep", f"torch {installed} is already installed here")
    if override == "cpu":
        return Choice("cpu", f"{OVERRIDE_ENV}=cpu")
    if override == "default":
        return Choice("default", f"{OVERRIDE_ENV}=default")
    if system != "Linux":
        return Choice("default", f"on {system} the default wheel has no CUDA libraries")
    if cuda:
        return Choice("default", "a CUDA device is present")
    if reachable():
        return Choice("cpu", f"no CUDA device, and {CPU_INDEX} answered")
    return Choice("default", f"no CUDA device, but {CPU_INDEX} did not answer in time")


def describe(choice: Choice, version: str | None) -> str:
    """The line printed after the install."""
    build = {"keep": "kept", "cpu": "CPU-only build from " + CPU_INDEX,
             "default": "default wheel from pip's configured index"}[choice.kind]
    return f"torch {version or '?'}: {build} ({choice.reason})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=3.0,
                        help="seconds to wait for PyTorch's CPU index (default 3)")
    parser.add_argument("--dry-run", action="store_true", help="print the choice, install nothing")
    args = parser.parse_args(argv)
    try:
        choice = choose(installed=installed_torch(), override=os.environ.get(OVERRIDE_ENV) or None,
                        system=platform.system(), cuda=cuda_device_present(),
                        reachable=lambda: index_reachable(timeout=args.timeout))
    except ValueError as exc:
        print(f"choose_torch: {exc}", file=sys.stderr)
        return 2
    spec = torch_requirement()
    if args.dry_run or choice.kind == "keep":
        print(describe(choice, installed_torch()) if choice.kind == "keep"
              else f"would install {spec} ({choice.kind}: {choice.reason})")
        return 0
    command = [sys.executable, "-m", "pip", "install", "-q", *choice.pip_args(spec)]
    done = subprocess.run(command, check=False)
    if done.returncode != 0 and choice.kind == "cpu":  # the index answered, then failed
        print(f"the CPU-only torch did not install from {CPU_INDEX}; installing the default "
              "wheel instead", file=sys.stderr)
        choice = Choice("default", f"{CPU_INDEX} answered but the install failed")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=False)
    if done.returncode != 0:
        return done.returncode
    after = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; "
                            "print(m.version('torch'))"], capture_output=True, text=True)
    print(describe(choice, after.stdout.strip() or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
