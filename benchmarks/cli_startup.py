"""Start-up time of the ``dpaudit`` command line: how long ``--help``, a bad invocation and
``gate`` take from a fresh process to its exit, against ``python -c pass`` and
``python -c "import torch"``.

Every run is a fresh ``python`` process (wall clock, median over ``--runs``), started as the
``dpaudit`` console script starts: ``from dpaudit_torch.cli import main; sys.exit(main())``, with
the package of this checkout (or of ``--package-root``) first on ``PYTHONPATH`` and a temporary
directory as the working directory (``python -c`` puts it first on ``sys.path``). ``gate`` compares
``tests/data/report_v1_3.json`` with a copy of itself (pass, exit 0) and the 1.2 report
``tests/data/report_v2.json`` (a proven violation) with it (fail, exit 1), writing its page each
time. One more run of each command reports which of the heavy libraries (torch, Opacus, numba,
SciPy, matplotlib, NumPy) it had imported when it exited. The target is at most 0.5 s for every
``dpaudit`` row.

    python benchmarks/cli_startup.py [--runs 11] [--package-root DIR] [--before REV] [--no-write]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
HEAVY = ("torch", "opacus", "numba", "scipy", "matplotlib", "numpy")
TARGET_S = 0.5
#: the console script's body (pyproject.toml: dpaudit = "dpaudit_torch.cli:main")
DPAUDIT = "import sys; from dpaudit_torch.cli import main; sys.exit(main())"
#: the same, reporting on stderr which heavy libraries were imported when it exits
DPAUDIT_SEEN = ("import atexit, sys; atexit.register(lambda: sys.stderr.write('\\nHEAVY ' + "
                f"','.join(m for m in {HEAVY!r} if m in sys.modules) + '\\n')); " + DPAUDIT)


def _time(argv: list[str], env: dict[str, str], cwd: str, expected: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if proc.returncode != expected:
        raise SystemExit(f"{argv}: exit code {proc.returncode}, expected {expected}\n"
                         f"{proc.stderr}")
    return dt


def _heavy(args: list[str], env: dict[str, str], cwd: str) -> str:
    proc = subprocess.run([sys.executable, "-c", DPAUDIT_SEEN, *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY ")][-1]
    return line[len("HEAVY "):].replace(",", ", ") or "none"


def _checkout(rev: str, target: Path) -> str:
    """The package ``dpaudit_torch`` of git revision ``rev`` extracted under ``target``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev,
                              "dpaudit_torch"], capture_output=True, check=True).stdout
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return str(target)


def _env(package_root: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(package_root).resolve())]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=11, help="fresh processes per row (default 11)")
    ap.add_argument("--package-root", default=str(ROOT),
                    help="directory holding the dpaudit_torch package to time (default: this "
                         "checkout)")
    ap.add_argument("--before", default=None, metavar="REV",
                    help="also time the dpaudit_torch package of git revision REV of this "
                         "repository (the code before a change), its runs interleaved with the "
                         "others'")
    ap.add_argument("--no-write", action="store_true", help="print only; docs/ unchanged")
    args = ap.parse_args()
    envs = {"now": _env(args.package_root)}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            envs["before"] = _env(_checkout(args.before, Path(tmp) / "before"))
        new = Path(tmp) / "release-2" / "audit.json"
        new.parent.mkdir()
        shutil.copy(DATA / "report_v1_3.json", new)
        old, bad = str(DATA / "report_v1_3.json"), str(DATA / "report_v2.json")
        cases: list[tuple[str, list[str] | None, int]] = [
            ("python -c pass", None, 0),
            ('python -c "import torch"', None, 0),
            ("dpaudit --help", ["--help"], 0),
            ("dpaudit frobnicate (unknown command)", ["frobnicate"], 2),
            ("dpaudit gate --bogus (bad flag)", ["gate", "--bogus"], 2),
            ("dpaudit gate missing.json --first-release (missing file)",
             ["gate", str(Path(tmp) / "missing.json"), "--first-release"], 2),
            ("dpaudit gate NEW --baseline OLD (pass)", ["gate", str(new), "--baseline", old], 0),
            ("dpaudit gate BAD --baseline OLD --html PAGE (fail)",
             ["gate", bad, "--baseline", old, "--html", str(Path(tmp) / "fail.html")], 1),
        ]
        rows = []
        for name, dp_args, expected in cases:
            if dp_args is None:
                code = "pass" if name.endswith("pass") else "import torch"
                argv = [sys.executable, "-c", code]
                which = ["now"]
            else:
                argv = [sys.executable, "-c", DPAUDIT, *dp_args]
                which = list(envs)
            times: dict[str, list[float]] = {w: [] for w in which}
            for w in which:
                _time(argv, envs[w], tmp, expected)  # warm the file cache
            for _ in range(args.runs):  # interleaved: load on a shared machine hits both alike
                for w in which:
                    times[w].append(_time(argv, envs[w], tmp, expected))
            med = statistics.median(times["now"])
            seen = "-" if dp_args is None else _heavy(dp_args, envs["now"], tmp)
            met = "-" if dp_args is None else ("yes" if med <= TARGET_S else "no")
            row: list[object] = [name, expected, f"{med:.3f}", f"{min(times['now']):.3f}",
                                 f"{max(times['now']):.3f}", seen, met]
            line = (f"{name}: median {med:.3f} s (min {min(times['now']):.3f}, max "
                    f"{max(times['now']):.3f}) over {args.runs}; heavy imports: {seen}")
            if args.before:
                if dp_args is None:
                    row += ["-", "-"]
                else:
                    b = statistics.median(times["before"])
                    row += [f"{b:.3f}", _heavy(dp_args, envs["before"], tmp)]
                    line += f"; before: median {b:.3f} s, heavy imports: {row[-1]}"
            rows.append(row)
            print(line, flush=True)
    load_end = os.getloadavg()[0]
    headers = ["command", "exit code", "median s", "min s", "max s", "heavy libraries imported",
               f"<= {TARGET_S} s"]
    if args.before:
        headers += ["before: median s", "before: heavy libraries imported"]
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_write:
        before = (f" The before columns time the package of commit {args.before} (`--before`), "
                  f"its runs interleaved with this checkout's."
                  if args.before else "")
        body = (
            "## Command-line start-up (benchmarks/cli_startup.py)\n\n"
            f"Command: `{command()}`  \n"
            f"Machine: {machine()}; load average (1 min) {load_start:.1f} at the start, "
            f"{load_end:.1f} at the end\n\n"
            f"Wall clock from the start of a fresh `python` process to its exit, median of "
            f"{args.runs} runs per row (one warm-up run before), the `dpaudit` rows started as "
            f"the console script starts (`{DPAUDIT}`). `gate` compares tests/data/"
            f"report_v1_3.json with a copy of itself (pass) and the 1.2 report tests/data/"
            f"report_v2.json, a proven violation, with it (fail), writing its page each time. "
            f"The heavy libraries column is what one more run of the command had imported when "
            f"it exited (of {', '.join(HEAVY)}).{before} `--help`, argument errors and `gate` "
            f"import only the standard library and the package's report layer; `demo`, "
            f"`table1`, `report` and `run` import what they need when they run.\n\n"
            + table + "\n"
        )
        write_section("cli_startup", body)


if __name__ == "__main__":
    main()
