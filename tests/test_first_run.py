"""A newcomer's first run: where Numba caches the kernels, the message while they compile, the
warm-up before the first step, and the claimed epsilon from step 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import loads_in_fresh_process

from dpaudit_torch import _numba
from dpaudit_torch._numba import CacheChoice, choose_cache, user_cache_dir


def _unwritable(tmp_path: Path) -> Path:
    """A directory path that cannot be created, even by root: its parent is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return blocker / "pkg"


def test_user_numba_cache_dir_always_wins(tmp_path: Path) -> None:
    choice = choose_cache(str(tmp_path / "mine"), [_unwritable(tmp_path)], tmp_path / "user")
    assert choice == CacheChoice("NUMBA_CACHE_DIR", tmp_path / "mine")
    assert not (tmp_path / "user").exists()


def test_writable_package_keeps_numbas_default(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "dpaudit_torch"
    dirs = [pkg / "stats", pkg / "opacus_tap"]
    choice = choose_cache("", dirs, tmp_path / "user")
    assert choice.where == "package" and choice.enabled
    assert all((d / "__pycache__").is_dir() for d in dirs)
    assert not (tmp_path / "user").exists()  # nothing created outside the package


def test_read_only_package_uses_the_user_cache_dir(tmp_path: Path) -> None:
    user = tmp_path / "xdg" / "dpaudit_torch" / "numba"
    writable = tmp_path / "site" / "stats"
    # one kernel directory read-only is enough: both kernel modules must share one place
    choice = choose_cache("", [writable, _unwritable(tmp_path)], user)
    assert choice == CacheChoice("user", user)
    assert user.is_dir()
    assert str(user) in choice.describe()


def test_nothing_writable_compiles_in_memory(tmp_path: Path) -> None:
    choice = choose_cache("", [_unwritable(tmp_path)], _unwritable(tmp_path) / "user")
    assert choice == CacheChoice("none", None)
    assert not choice.enabled
    assert "NUMBA_CACHE_DIR" in choice.describe()
    assert choose_cache("", [_unwritable(tmp_path)], None).where == "none"


def test_user_cache_dir_follows_xdg(tmp_path: Path) -> None:
    assert user_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "dpaudit_torch" / "numba"
    # a relative XDG_CACHE_HOME is invalid by the XDG specification and ignored
    assert user_cache_dir({"XDG_CACHE_HOME": "rel/cache"}) == \
        Path.home() / ".cache" / "dpaudit_torch" / "numba"
    assert user_cache_dir({}) == Path.home() / ".cache" / "dpaudit_torch" / "numba"


def test_this_numba_accepts_the_user_cache_locator(tmp_path: Path) -> None:
    """The per-user cache for a read-only package relies on Numba's cache-locator list; if a
    Numba release moves it, this fails (instead of silently falling back to ~/.cache/numba)."""
    code = ("import sys; from pathlib import Path; from dpaudit_torch import _numba; "
            "print(_numba._install_locator(_numba.CacheChoice('user', Path(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


_WARM = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, "
         "format='%(name)s: %(message)s'); from dpaudit_torch import _numba, _warmup; "
         "print(_numba.cache_choice().where, _warmup.warm_up())")


def test_compile_message_once_then_silent_from_the_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _WARM], capture_output=True, text=True,
                              env=env, timeout=300, cwd=tmp_path)

    from dpaudit_torch import _gather
    from dpaudit_torch.opacus_tap import _step_kernels
    from dpaudit_torch.stats import _kernels

    first = run()
    assert first.returncode == 0, first.stderr
    where, compiled = first.stdout.split()
    # every statistics kernel, plan_step and the coverage watch's comparison (no parameters
    # given: no observation kernels)
    expected = (len(_kernels.signatures()) + len(_step_kernels.signatures())
                + len(_gather.signatures()))
    assert where == "NUMBA_CACHE_DIR" and int(compiled) == expected == 14
    assert first.stderr.count("compiling the audit kernels, once") == 1, first.stderr
    assert f"Numba caches them in {tmp_path / 'numba'}" in first.stderr
    assert "audit kernels compiled in" in first.stderr
    assert any((tmp_path / "numba").rglob("*.nbi"))
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["NUMBA_CACHE_DIR", "0"]  # loaded, not compiled
    assert "compiling" not in second.stderr and "compiled" not in second.stderr


def test_compile_message_shown_without_logging_configured(tmp_path: Path) -> None:
    """A script that never configures logging still sees the one compile message (through
    Python's last-resort handler), and nothing else from the package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
    code = "from dpaudit_torch import _warmup; print(_warmup.warm_up())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("compiling the audit kernels, once"), out.stderr
    assert len(lines) == 1, out.stderr


def test_warm_up_prepares_every_kernel_an_audited_cpu_run_calls(private_setup) -> None:
    """After the auditor's warm-up, training compiles nothing more: the warm-up's argument types
    are exactly the ones the audit passes (else the first steps would compile again)."""
    from dpaudit_torch import PrivacyAuditor

    s = private_setup(mode="hooks")
    auditor = PrivacyAuditor(s.engine, s.optimizer, s.loader, delta=1e-5, k_pairs=8,
                             m_canaries=64, check_every=2, seed=0, claimed_every=1000)
    before = {k.py_func.__name__: set(k.signatures) for k in _numba._KERNELS}
    assert all(before.values()), before  # every kernel prepared at attach
    n_params = len([p for p in s.model.parameters() if p.requires_grad])
    grads = [sig[0] for name in ("snapshot_step", "release_step") for sig in before[name]]
    assert any(getattr(g, "count", None) == n_params for g in grads)
    s.train(6, auditor)
    after = {k.py_func.__name__: set(k.signatures) for k in _numba._KERNELS}
    assert after == before
    assert auditor.tap.reader.compiled_reads > 0  # the compiled path was the one used
    auditor.finalize()


def test_claimed_epsilon_known_from_the_first_step(tmp_path: Path) -> None:
    from dpaudit_torch.demo import DemoConfig, run_demo

    seen: list[dict] = []
    events: list[str] = []
    result = run_demo(DemoConfig(steps=3, k_pairs=8, m_canaries=64), tmp_path / "out",
                      on_step=lambda m: (seen.append(m), events.append("step")),
                      on_start=lambda: events.append("start"))
    assert events == ["start", "step", "step", "step"]
    eps1 = seen[0]["claimed_epsilon"]
    assert eps1 is not None and 0 < eps1 < result.report.claimed_epsilon
    assert [m["step"] for m in seen] == [1, 2, 3]


_CLI_LOGGING = """
import logging, sys
from dpaudit_torch import _numba, cli
cli._configure_logging(verbose=sys.argv[1] == "-v")
kernels = logging.getLogger("dpaudit_torch._numba")
# as the compile listener logs them once handlers are configured
kernels.log(logging.INFO if kernels.hasHandlers() else logging.WARNING, _numba.COMPILE_MESSAGE,
            "Numba caches them in /c")
kernels.info("audit kernels compiled in %.1f s", 2.0)
kernels.warning("a warning of the kernel module")
logging.getLogger("dpaudit_torch.demo").info("applied bug 'no-noise'")
logging.getLogger("dpaudit_torch.demo").warning("auditor stopped training")
"""


def test_cli_shows_the_compile_message_and_no_other_info_line_without_v() -> None:
    """Without -v the command shows no INFO line: the compile message alone gets through, as
    the command's own line (a first run waits for the compiler); -v shows every INFO record."""
    def stderr(*flags: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _CLI_LOGGING, *flags], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return [ln for ln in out.stderr.splitlines() if ln.strip()]

    assert stderr("-") == [
        "dpaudit: compiling the audit kernels, once (Numba caches them in /c)",
        "WARNING dpaudit_torch._numba: a warning of the kernel module",
        "WARNING dpaudit_torch.demo: auditor stopped training",
    ]
    assert stderr("-v") == [
        "INFO dpaudit_torch._numba: compiling the audit kernels, once (Numba caches them in /c)",
        "INFO dpaudit_torch._numba: audit kernels compiled in 2.0 s",
        "WARNING dpaudit_torch._numba: a warning of the kernel module",
        "INFO dpaudit_torch.demo: applied bug 'no-noise'",
        "WARNING dpaudit_torch.demo: auditor stopped training",
    ]


def test_the_command_leaves_the_kernel_logger_as_it_found_it(tmp_path: Path) -> None:
    import logging

    from dpaudit_torch import cli

    logger = logging.getLogger(cli.KERNELS_LOGGER)
    before = (logger.level, list(logger.filters))
    assert cli.main(["report", str(tmp_path / "missing.json")]) == cli.EXIT_USAGE
    assert (logger.level, list(logger.filters)) == before


def test_kernels_import_no_opacus() -> None:
    """The statistics layer's kernels (and their Numba set-up) never import Opacus."""
    assert not loads_in_fresh_process("import dpaudit_torch.stats._kernels", "opacus")
