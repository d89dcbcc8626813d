"""Long runs: 10^6 pairs through both testers, time and memory per pair.

Streams (scalar pairs, fed in batches of 1000 as a training hook with k = 1000 canary pairs would;
generated batch by batch from a seeded generator, so the stream itself is never held in memory):

* ``null``: the exact Gaussian mechanism with sensitivity 1 and noise sigma = 1 (x ~ N(0, 1),
  y ~ N(1, 1)), tested on a 4-point grid eps = 0.25, 0.5, 1, 2 at the deltas of its own privacy
  profile (docs/design.md section 5): every null is true, nothing should be rejected, and the
  log-wealth must stay finite and small (ONS has logarithmic regret, so it cannot underflow);
* ``non-DP``: the same claim, but y ~ N(6, 1) (the noise is 6x too small): the log-wealth grows
  linearly, to thousands; kept as a product the wealth would overflow float64 (e^709.78) within a
  few thousand pairs. It must stay finite.

Testers: ``HockeyStickTest`` (defaults) and ``SequentialMMDTest`` (R = 1): uncapped (exact,
O(t d) work for pair t, so O(T^2) in total: run only while the projected time stays within
``--uncapped-budget`` seconds, the rest is extrapolated and marked) and with
``max_witness_points = --cap`` (O(cap d) per pair, linear in T).

At each checkpoint T = 10^3, 10^4, 10^5, 10^6: time per pair over the window since the previous
checkpoint (the marginal cost, what a training step pays at that point) and cumulative time;
bytes held in tensors/arrays reachable from the tester (deduplicated by storage; MMD also reports
its own ``memory_bytes``); growth of the process's resident set (``VmRSS``, fresh process per
configuration, after a warm-up); min/max over the grid of the log-wealth, the combined log-wealth
and whether everything is finite. ``torch.set_num_threads(1)``.

    python benchmarks/long_run.py [--quick] [--no-write] [--cap 1024] [--uncapped-budget 240]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

GRID = [0.25, 0.5, 1.0, 2.0]
BATCH = 1000
LOG_FLOAT64_MAX = math.log(np.finfo(np.float64).max)


# ----------------------------------------------------------------------------- measurement
def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor / array reachable from ``obj``'s attributes (storage-deduplicated)."""
    seen: set[int] = set()
    seen_obj: set[int] = set()

    def walk(v: Any, depth: int) -> int:
        if depth > 6 or id(v) in seen_obj:
            return 0
        seen_obj.add(id(v))
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            key = st.data_ptr()
            if key in seen or st.nbytes() == 0:
                return 0
            seen.add(key)
            return int(st.nbytes())
        if isinstance(v, np.ndarray):
            base = v if v.base is None else v.base
            if not isinstance(base, np.ndarray) or id(base) in seen:
                return 0
            seen.add(id(base))
            return int(base.nbytes)
        if isinstance(v, dict):
            return sum(walk(x, depth + 1) for x in v.values())
        if isinstance(v, (list, tuple)):
            return sum(walk(x, depth + 1) for x in v)
        if hasattr(v, "__dict__") and not isinstance(v, type) and v.__class__.__module__.startswith(
            ("dpaudit_torch",)
        ):
            return sum(walk(x, depth + 1) for x in vars(v).values())
        return 0

    return walk(obj, 0)


def _make(tester: str, cap: int | None) -> Any:
    from dpaudit_torch.stats.hockey_stick import HockeyStickTest
    from dpaudit_torch.stats.mmd import SequentialMMDTest
    from dpaudit_torch.stats.thresholds import gaussian_profile_grid

    deltas = gaussian_profile_grid(1.0, GRID)
    if tester == "hockey_stick":
        return HockeyStickTest(GRID, deltas)
    return SequentialMMDTest(GRID, deltas, witness_radius=1.0, max_witness_points=cap)


def _project(windows: list[tuple[int, int, float]], n1: int, n2: int) -> float:
    """Seconds for pairs n1..n2 if pair t costs a + b t (uncapped MMD), fitted on the windows.

    A window [m1, m2] costs a (m2 - m1) + b (m2^2 - m1^2) / 2; least squares over the measured
    windows (a, b >= 0). With one window, all of its cost is put into the quadratic term
    (pessimistic).
    """
    A = np.array([[m2 - m1, (m2 * m2 - m1 * m1) / 2.0] for m1, m2, _ in windows], dtype=float)
    y = np.array([w[2] for w in windows], dtype=float)
    if len(windows) >= 2:
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        a, b = max(float(coef[0]), 0.0), max(float(coef[1]), 0.0)
    else:
        a, b = 0.0, float(y[0] / A[0, 1])
    return a * (n2 - n1) + b * (n2 * n2 - n1 * n1) / 2.0


def worker(cfg: dict[str, Any]) -> None:
    """One configuration in this (fresh) process; prints one JSON line per checkpoint."""
    torch.set_num_threads(1)
    shift = 6.0 if cfg["stream"] == "non-DP" else 1.0
    gen = torch.Generator().manual_seed(cfg["seed"])

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(BATCH, generator=gen, dtype=torch.float64)
        y = shift + torch.randn(BATCH, generator=gen, dtype=torch.float64)
        return x, y

    # warm-up in a throw-away tester (imports, allocator, kernels), then the RSS baseline
    _make(cfg["tester"], cfg["cap"]).update(*batch())
    t = _make(cfg["tester"], cfg["cap"])
    gen.manual_seed(cfg["seed"])
    rss0 = _rss_bytes()
    checkpoints = [c for c in (10**3, 10**4, 10**5, 10**6) if c <= cfg["max_n"]]
    n, elapsed, prev_n = 0, 0.0, 0
    windows: list[tuple[int, int, float]] = []
    for cp in checkpoints:
        if cfg["budget"] is not None and windows:
            projected = _project(windows, prev_n, cp)
            if elapsed + projected > cfg["budget"]:
                print(json.dumps({"n": cp, "skipped": True, "projected_s": elapsed + projected}),
                      flush=True)
                continue
        t0 = time.perf_counter()
        while n < cp:
            t.update(*batch())
            n += BATCH
        dt = time.perf_counter() - t0
        elapsed += dt
        lw = t.log_wealth.cpu().numpy()
        bets = t.betting_state()
        comp = bets["log_wealth"]
        row = {
            "n": n,
            "window_us_per_pair": 1e6 * dt / (n - prev_n),
            "elapsed_s": elapsed,
            "tensor_bytes": tensor_bytes(t),
            "memory_bytes": int(getattr(t, "memory_bytes", -1)),
            "rss_delta": _rss_bytes() - rss0,
            "lw_min": float(lw.min()),
            "lw_max": float(lw.max()),
            "combined": float(t.combined_log_wealth),
            "finite": bool(np.all(np.isfinite(lw)) and np.all(np.isfinite(comp))
                           and math.isfinite(t.combined_log_wealth)
                           and np.all(np.isfinite(bets["lam"]))
                           and np.all(np.isfinite(bets["a_sum"]))),
            "rejected_at": t.rejected_at,
            "n_stored": int(getattr(t, "n_stored", -1)),
        }
        if hasattr(t, "exact_witness_norm") and cfg["cap"] is not None:
            row["witness_norm"] = t.witness_norm
            row["exact_witness_norm"] = t.exact_witness_norm()
        print(json.dumps(row), flush=True)
        windows.append((prev_n, n, dt))
        prev_n = n


def run_config(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(cfg)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed for {cfg}:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


# ----------------------------------------------------------------------------- report
def _fmt_bytes(b: int) -> str:
    if b <= 0:
        return "<= 0"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b} B"


def _reading(c: dict[tuple[str, str], list[dict[str, Any]]], cap: int) -> str:
    """The interpretation paragraph, built from the measured numbers only."""
    allr = [r for rs in c.values() for r in rs]
    finite = all(r["finite"] for r in allr)
    out = [
        "Reading (numbers from this run): "
        + ("every log-wealth, ONS bet and ONS normaliser stayed finite at every checkpoint. "
           if finite else "**a non-finite value appeared (see the table)**. ")
    ]
    nd = [r for (n, s), rs in c.items() if s == "non-DP" for r in rs]
    if nd:
        out.append(
            f"On the non-DP stream the log-wealth reached {max(r['lw_max'] for r in nd):.4g} "
            f"(the wealth as a product would be e^{max(r['lw_max'] for r in nd):.0f}, far beyond "
            f"float64's e^{LOG_FLOAT64_MAX:.2f}); it is a sum of `log1p` terms, and "
            "`tests/stats/test_long_run.py` checks it against an independent `math.fsum` "
            "recomputation beyond e^800. "
        )
    nl = [r for (n, s), rs in c.items() if s == "null" for r in rs]
    if nl:
        out.append(
            "On the null stream the smallest grid log-wealth was "
            f"{min(r['lw_min'] for r in nl):.3g} "
            "(ONS has logarithmic regret against the bet 0, so it drifts down only like log T "
            "and cannot underflow), and nothing was rejected"
            + ("" if all(r["rejected_at"] is None for r in nl) else " **except: see the table**")
            + ". "
        )
    un = c.get(("MMD, uncapped", "null"), [])
    if len(un) >= 2:
        a, b = un[0], un[-1]
        out.append(
            f"Uncapped MMD (exact): pair t costs O(t d), the time per pair grew from "
            f"{a['window_us_per_pair']:.0f} us at T = {a['n']:.0e} to "
            f"{b['window_us_per_pair']:.0f} us at T = {b['n']:.0e}; its memory is "
            f"{b['memory_bytes'] / b['n']:.1f} bytes per pair allocated at T = {b['n']:.0e} "
            "((2d + 3) * 8 = 40 bytes per stored scalar pair in float64, buffers doubling): "
            "40 MB at 10^6 would be fine, the O(T^2) time is what makes 10^6 infeasible. "
        )
    cp = c.get((f"MMD, cap {cap}", "null"), [])
    if len(cp) >= 2:
        a, b = cp[1] if len(cp) > 1 else cp[0], cp[-1]
        out.append(
            f"Capped MMD (`max_witness_points={cap}`): {a['window_us_per_pair']:.0f} us per pair "
            f"at T = {a['n']:.0e} and {b['window_us_per_pair']:.0f} us at T = {b['n']:.0e}, "
            f"tensor memory constant at {_fmt_bytes(b['tensor_bytes'])} "
            "(docs/statistics.md, MMD section, says why the capped test is still valid). "
        )
    hs = c.get(("HockeyStickTest", "null"), [])
    if len(hs) >= 2:
        a, b = hs[0], hs[-1]
        out.append(
            f"HockeyStickTest: {a['window_us_per_pair']:.0f} us per pair at T = {a['n']:.0e}, "
            f"{b['window_us_per_pair']:.0f} us at T = {b['n']:.0e}; its state grows linearly "
            f"({b['tensor_bytes'] / b['n']:.1f} bytes per pair at T = {b['n']:.0e}: it keeps the "
            "pair history for its refreshes)."
        )
    return "".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="10^4 pairs at most (smoke run)")
    ap.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    ap.add_argument("--cap", type=int, default=1024, help="max_witness_points of the capped MMD")
    ap.add_argument("--uncapped-budget", type=float, default=240.0,
                    help="seconds the uncapped (O(T^2)) MMD may take; later sizes extrapolated")
    ap.add_argument("--nondp-n", type=int, default=10**6,
                    help="pairs of the non-DP streams (log-wealth grows linearly)")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    torch.set_num_threads(1)
    max_n = 10**4 if args.quick else 10**6
    nondp_n = min(args.nondp_n, max_n)
    configs = [
        ("hockey_stick", None, "null", max_n, None),
        ("mmd", args.cap, "null", max_n, None),
        ("mmd", None, "null", max_n, args.uncapped_budget),
        ("hockey_stick", None, "non-DP", nondp_n, None),
        ("mmd", args.cap, "non-DP", nondp_n, None),
    ]
    headers = ["tester", "stream", "T", "us/pair (window)", "total s", "tensor bytes",
               "RSS growth", "log-wealth min..max (grid)", "combined", "finite",
               "rejected at"]
    rows: list[list[object]] = []
    notes: list[str] = []
    collected: dict[tuple[str, str], list[dict[str, Any]]] = {}
    t_start = time.perf_counter()
    for tester, cap, stream, n_max, budget in configs:
        cfg = {"tester": tester, "cap": cap, "stream": stream, "max_n": n_max,
               "budget": budget, "seed": 2024}
        name = ("HockeyStickTest" if tester == "hockey_stick" else
                f"MMD, cap {cap}" if cap is not None else "MMD, uncapped")
        t0 = time.perf_counter()
        results = run_config(cfg)
        collected[(name, stream)] = [r for r in results if not r.get("skipped")]
        print(f"[{time.perf_counter() - t0:.0f} s] {name} {stream}", flush=True)
        for r in results:
            if r.get("skipped"):
                proj = r["projected_s"]
                rows.append([name, stream, f"10^{round(math.log10(r['n']))}",
                             "not run", f"~{proj:.3g} (projected)", "-", "-", "-", "-", "-",
                             "-"])
                notes.append(
                    f"{name} at T = {r['n']:.0e}: not run, projected {proj:.3g} s "
                    f"({proj / 3600:.2g} h), fitting time per pair = a + b t on the measured "
                    f"windows (pair t costs O(t d): the window from T/10 to T costs ~100x the "
                    f"previous one)."
                )
                continue
            mem = _fmt_bytes(r["tensor_bytes"])
            if r["memory_bytes"] > 0:
                mem += f" (memory_bytes {_fmt_bytes(r['memory_bytes'])})"
            rows.append([
                name, stream, f"10^{round(math.log10(r['n']))}",
                f"{r['window_us_per_pair']:.0f}", f"{r['elapsed_s']:.1f}", mem,
                _fmt_bytes(r["rss_delta"]),
                f"{r['lw_min']:.4g} .. {r['lw_max']:.4g}", f"{r['combined']:.4g}",
                "yes" if r["finite"] else "**NO**",
                r["rejected_at"] if r["rejected_at"] is not None else "-",
            ])
            if "exact_witness_norm" in r:
                notes.append(
                    f"{name} {stream} T = {r['n']:.0e}: tracked witness norm "
                    f"{r['witness_norm']:.15g}, recomputed from scratch "
                    f"{r['exact_witness_norm']:.15g} (R = 1)."
                )
    total = time.perf_counter() - t_start
    table = markdown_table(headers, rows)
    print(table)
    print("\n".join(notes))
    body = (
        "## Long runs: 10^6 pairs (`benchmarks/long_run.py`)\n\n"
        f"Command: `{command()}`  \nMachine: {machine()}  \nTotal wall time: {total:.0f} s\n\n"
        "Scalar pairs in batches of 1000; grid eps = 0.25, 0.5, 1, 2 at the deltas of the "
        "sigma = 1 Gaussian profile; `null` = the exact Gaussian mechanism (sigma = 1, all nulls "
        "true), `non-DP` = y shifted by 6 noise standard deviations (the wealth, kept as a "
        "product, would overflow float64 after a few thousand pairs). `us/pair (window)`: "
        "time per pair between the previous checkpoint and this one (the marginal cost at that "
        "point of the run). `tensor bytes`: tensors/arrays reachable from the tester. "
        "`RSS growth`: resident-set growth of a fresh process since the tester was created "
        "(allocator slack included). A fresh process per row group.\n\n"
        + table + "\n\n"
        + "\n".join(f"- {n}" for n in notes) + "\n\n"
        + _reading(collected, args.cap)
    )
    print(body.split("\n\n")[-1])
    if not args.no_write and not args.quick:
        write_section("long_run", body)
        print("wrote the long_run section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
