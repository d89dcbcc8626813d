"""The package as a user installs it: a wheel (not an editable install) in a fresh virtual
environment outside the source tree, with its package directory read-only, run from an
unrelated directory.

The wheel is the one in ``$DPAUDIT_WHEEL`` (CI builds it as a user would, with
``pip wheel . --no-deps``), else it is built here from a copy of the sources, without build
isolation so that nothing is downloaded. The new environment gets the heavy dependencies (torch,
Opacus, ...) from this interpreter's site-packages through a ``.pth`` line, and the wheel with
``pip install --no-deps --no-index``: offline and fast, and the package itself only comes from
the wheel (the ``.pth`` line does not run the editable install's hooks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], timeout: int = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def _wheel(tmp: Path) -> Path:
    given = os.environ.get("DPAUDIT_WHEEL")
    if given:
        return Path(given).resolve()
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "dpaudit_torch", src / "dpaudit_torch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    proc = _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                 "--no-build-isolation", "--no-index", "-w", str(tmp / "dist")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the license is an SPDX string: setuptools has nothing to deprecate
    assert "license" not in proc.stderr.lower(), proc.stderr
    (whl,) = (tmp / "dist").glob("dpaudit_torch-*.whl")
    return whl


def _venv(tmp: Path, wheel: Path) -> tuple[Path, Path]:
    """A fresh venv with the wheel installed; returns (its bin dir, the package directory)."""
    venv = tmp / "venv"
    proc = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert proc.returncode == 0, proc.stderr
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                     ).stdout.strip())
    proc = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                 "--no-index", str(wheel)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the heavy dependencies from this environment, after the new one's own site-packages;
    # written after the install: pip would otherwise see this environment's (editable)
    # dpaudit-torch through it and uninstall it from here
    (site / "_dpaudit_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin", site / "dpaudit_torch"


def _read_only(pkg: Path) -> tuple[list[str], bool]:
    """A command prefix under which ``pkg`` is read-only, and whether that took effect.

    As root, permission bits do not stop writes: a private mount namespace with a read-only bind
    mount of ``pkg`` does (``unshare``); otherwise the write bits are removed."""
    if os.geteuid() != 0:
        for d in [pkg, *[p for p in pkg.rglob("*") if p.is_dir()]]:
            d.chmod(0o555)
        return [], True
    prefix = ["unshare", "--mount", "sh", "-c",
              'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"', str(pkg)]
    probe = _run([*prefix, "sh", "-c", 'touch "$0/probe" 2>/dev/null', str(pkg)], timeout=60) \
        if shutil.which("unshare") else None
    if probe is None or probe.returncode == 0 or "mount" in probe.stderr:
        (pkg / "probe").unlink(missing_ok=True)
        return [], False  # no mount namespaces here: the package stays writable
    return prefix, True


def test_wheel_installs_and_runs_from_any_directory_read_only(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    bindir, pkg = _venv(tmp_path, wheel)
    assert (bindir / "dpaudit").is_file()
    assert (pkg / "_bootstrap" / "sitecustomize.py").is_file()  # dpaudit run's start-up hook
    prefix, read_only = _read_only(pkg)
    work, home, xdg = tmp_path / "work", tmp_path / "home", tmp_path / "xdg"
    for d in (work, home, xdg):
        d.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(xdg), PATH=f"{bindir}{os.pathsep}"
               f"{env.get('PATH', '')}")

    where = _run([*prefix, str(bindir / "python"), "-c",
                  "import dpaudit_torch, sys; print(dpaudit_torch.__file__)"], cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).parent == pkg  # the wheel's copy, not the source tree

    demo = _run([*prefix, "dpaudit", "demo", "--steps", "30", "--out", "out"], cwd=work,
                env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert (work / "out" / "audit.json").is_file() and (work / "out" / "report.html").is_file()
    assert "Traceback" not in demo.stderr and "Warning:" not in demo.stderr, demo.stderr
    # the package's own warnings (the command's log lines are "LEVEL logger: message"): at 30
    # steps only the one that says the one-run bound has almost no power (q T is small)
    ours = [ln for ln in demo.stderr.splitlines() if ln.startswith("WARNING dpaudit_torch")]
    assert all("almost no power" in ln for ln in ours), ours
    assert demo.stderr.count("compiling the audit kernels, once") == 1, demo.stderr
    cache = xdg / "dpaudit_torch" / "numba"
    if read_only:  # the kernels went to the per-user cache, nothing into the package
        assert f"Numba caches them in {cache}" in demo.stderr, demo.stderr
        assert any(cache.rglob("*.nbi"))
        assert not any(pkg.rglob("*.nbi"))
    assert "eps=" in demo.stderr  # the claimed epsilon in the progress bar

    report = _run([*prefix, "dpaudit", "report", "out/audit.json"], cwd=work, env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "report:" in report.stdout

    # a second process loads the kernels from that cache: no compile, no message
    again = _run([*prefix, str(bindir / "python"), "-c",
                  "import logging; logging.basicConfig(level=logging.INFO); "
                  "from dpaudit_torch import _warmup; print(_warmup.warm_up())"],
                 cwd=work, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "0" and "compiling" not in again.stderr
    assert not any(work.glob("*.egg-info")) and sorted(p.name for p in work.iterdir()) == ["out"]

