"""Throughput (pairs/s) and memory of the sequential testers vs a naive baseline.

For T = 10^3, 10^4, 10^5 pairs and a 16-point epsilon grid (the sigma = 1 Gaussian privacy profile,
eps in [0.05, 4]), on a stream from the exact Gaussian mechanism (sigma = 1; the null holds, so
no test stops early):

* ours: one ``SequentialMMDTest`` (R = 1) / ``HockeyStickTest`` with the whole grid, fed in batches
  of 1000 pairs (and, at T = 10^4, in batches of 10 pairs, as a training hook would);
* naive: a straightforward implementation written here, ONE INDEPENDENT TESTER PER EPSILON, pairs
  processed one at a time in a Python loop:
  - naive MMD (docs/design.md section 2 written out): for each pair, the witness value is a sum over
    all past pairs, computed with numpy over the past pairs ("numpy" baseline) or with a Python
    loop over the past pairs ("python" baseline); the OGA coefficients are all rescaled at every
    projection; scalar ONS. The numpy baseline's log-wealth is checked against ours (same
    statistic) at T = 10^3.
  - naive hockey-stick (section 3's prototype): for each pair, bin edges at the 8-quantiles of the
    pooled past values (unique, so atoms get their own bins), counts of past x and y per bin,
    the two sets, scalar ONS per direction.

Memory: peak resident-set growth of a fresh process running one configuration (everything: state,
transient kernel blocks, allocator slack), and the bytes held by the tester's state at the end
(tensors and arrays reachable from it; on CUDA, torch.cuda.max_memory_allocated). The ratio
ours / naive at T = 10^4 is the figure; naive runs that would take longer than ``--naive-limit``
seconds are extrapolated (power law fitted on the two smaller T) and marked as such.

    python benchmarks/throughput.py [--quick] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch import mechanisms as mech  # noqa: E402
from dpaudit_torch.stats.betting import ONS_C  # noqa: E402
from dpaudit_torch.stats.thresholds import gaussian_profile_grid, mmd_tau  # noqa: E402

GRID = np.geomspace(0.05, 4.0, 16)
DELTAS = gaussian_profile_grid(1.0, GRID)
ALPHA = 0.05
BURN_IN_MMD = 20
BURN_IN_HS = 8


# ----------------------------------------------------------------------------- naive baselines
class NaiveONS:
    """Scalar Online Newton Step bet (docs/design.md section 1), one e-process."""

    def __init__(self, lambda_max: float) -> None:
        self.lam, self.a, self.lw, self.lmax = 0.0, 1.0, 0.0, lambda_max

    def step(self, p: float) -> float:
        self.lw += math.log1p(self.lam * p)
        z = -p / (1.0 + self.lam * p)
        self.a += z * z
        self.lam = min(max(self.lam - ONS_C * z / self.a, 0.0), self.lmax)
        return self.lw


class NaiveMMD:
    """Section 2 written out for ONE epsilon; per-pair loop; inner sum over past pairs."""

    def __init__(self, eps: float, delta: float, radius: float = 1.0, inner: str = "numpy"):
        self.tau = float(mmd_tau(eps, delta))
        self.R = radius
        self.inner = inner
        self.ons = NaiveONS(1.0 / (8.0 + 4.0 * self.tau))
        self.burn: list[tuple[float, float]] = []
        self.bw = 1.0
        # numpy inner: preallocated arrays (grown by doubling); python inner: lists
        self.X: Any = np.empty(1024) if inner == "numpy" else []
        self.Y: Any = np.empty(1024) if inner == "numpy" else []
        self.C: Any = np.empty(1024) if inner == "numpy" else []
        self.t = 0  # pairs stored
        self.m = 0.0
        self.s = 0.0
        self.rejected_at: int | None = None
        self.n = 0

    def k(self, a: float, b: float) -> float:
        """Gaussian kernel exp(-(a - b)^2 / (2 bw^2)) with the fitted bandwidth."""
        return math.exp(-((a - b) ** 2) / (2.0 * self.bw * self.bw))

    def update_one(self, x: float, y: float) -> None:
        self.n += 1
        if len(self.burn) < BURN_IN_MMD:
            self.burn.append((x, y))
            if len(self.burn) == BURN_IN_MMD:
                pooled = np.array([p[0] for p in self.burn] + [p[1] for p in self.burn])
                d = np.abs(pooled[:, None] - pooled[None, :])[np.triu_indices(pooled.size, 1)]
                self.bw = float(np.median(d))
            return
        if self.inner == "numpy":
            if self.t:
                t = self.t
                Xa, Ya, Ca = self.X[:t], self.Y[:t], self.C[:t]
                h = 1.0 / (2.0 * self.bw * self.bw)
                v = float(Ca @ (np.exp(-h * (Xa - x) ** 2) - np.exp(-h * (Xa - y) ** 2)
                                - np.exp(-h * (Ya - x) ** 2) + np.exp(-h * (Ya - y) ** 2)))
            else:
                v = 0.0
        else:
            v = 0.0
            for xi, yi, ci in zip(self.X, self.Y, self.C):
                v += ci * (self.k(xi, x) - self.k(xi, y) - self.k(yi, x) + self.k(yi, y))
        lw = self.ons.step(v - self.tau)
        if self.rejected_at is None and lw >= math.log(1.0 / ALPHA):
            self.rejected_at = self.n
        g2 = 2.0 - 2.0 * self.k(x, y)
        self.m += g2
        eta = 0.5 / math.sqrt(self.m) if self.m > 0 else 0.0
        n2 = max(self.s + 2.0 * eta * v + eta * eta * g2, 0.0)
        gamma = min(1.0, self.R / math.sqrt(n2)) if n2 > 0 else 1.0
        if self.inner == "numpy":
            if self.t == self.X.size:
                self.X, self.Y, self.C = (np.concatenate([a, np.empty(a.size)])
                                          for a in (self.X, self.Y, self.C))
            self.X[self.t], self.Y[self.t], self.C[self.t] = x, y, eta
            self.t += 1
            if gamma != 1.0:
                self.C[: self.t] *= gamma
        else:
            self.X.append(x)
            self.Y.append(y)
            self.C.append(eta)
            self.t += 1
            if gamma != 1.0:
                self.C = [c * gamma for c in self.C]
        self.s = gamma * gamma * n2


class NaiveHockeyStick:
    """Section 3's prototype for ONE epsilon: per pair, 8-quantile bins of the pooled past."""

    def __init__(self, eps: float, delta: float, bins: int = 8) -> None:
        self.e = math.exp(eps)
        self.delta = delta
        self.bins = bins
        lm = 1.0 / (2.0 * (self.e + delta))
        self.ons = [NaiveONS(lm), NaiveONS(lm)]
        self.X: list[float] = []
        self.Y: list[float] = []
        self.rejected_at: int | None = None
        self.n = 0

    def update_one(self, x: float, y: float) -> None:
        self.n += 1
        if len(self.X) >= BURN_IN_HS:
            Xa, Ya = np.array(self.X), np.array(self.Y)
            pooled = np.concatenate([Xa, Ya])
            edges = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, self.bins + 1)[1:-1]))
            # cell 2i: strictly between edges; 2i + 1: equal to edge i (atoms get their own cell)
            def cell(v: np.ndarray) -> np.ndarray:
                lo = np.searchsorted(edges, v, side="left")
                hi = np.searchsorted(edges, v, side="right")
                return 2 * lo + (hi > lo)

            k = 2 * edges.size + 1
            cx = np.bincount(cell(Xa), minlength=k)
            cy = np.bincount(cell(Ya), minlength=k)
            c_x, c_y = cell(np.array([x, y]))
            in1 = cx > self.e * cy
            in2 = cy > self.e * cx
            p1 = float(in1[c_x]) - self.e * float(in1[c_y]) - self.delta
            p2 = float(in2[c_y]) - self.e * float(in2[c_x]) - self.delta
            lw1, lw2 = self.ons[0].step(p1), self.ons[1].step(p2)
            if self.rejected_at is None and 0.5 * (math.exp(lw1) + math.exp(lw2)) >= 1 / ALPHA:
                self.rejected_at = self.n
        self.X.append(x)
        self.Y.append(y)


def run_naive(kind: str, xs: np.ndarray, ys: np.ndarray, n_eps: int = 16) -> list[Any]:
    """Run the naive baseline: one independent tester for each of the first n_eps grid points."""
    testers: list[Any]
    pts = list(zip(GRID, DELTAS))[:n_eps]
    if kind == "hs":
        testers = [NaiveHockeyStick(float(e), float(d)) for e, d in pts]
    else:
        inner = "python" if kind == "mmd_python" else "numpy"
        testers = [NaiveMMD(float(e), float(d), inner=inner) for e, d in pts]
    for t in testers:  # one independent tester per epsilon
        for i in range(xs.size):
            t.update_one(float(xs[i]), float(ys[i]))
    return testers


# ----------------------------------------------------------------------------- measurement
def _state_bytes(obj: Any, seen: set[int] | None = None, depth: int = 0) -> int:
    """Bytes of tensors / arrays / float lists reachable from obj's attributes (depth <= 3)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, float) for v in obj[:4]):
            return sys.getsizeof(obj) + 24 * len(obj)
        return sum(_state_bytes(v, seen, depth + 1) for v in obj)
    if isinstance(obj, dict):
        return sum(_state_bytes(v, seen, depth + 1) for v in obj.values())
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(_state_bytes(v, seen, depth + 1) for v in vars(obj).values())
    return 0


def _stream(T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    m = mech.get("Gaussian", epsilon=1.0, sigma=1.0)
    return m.sample(T, generator=torch.Generator().manual_seed(seed))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this (fresh) process and measure it."""
    torch.set_num_threads(1)
    impl, kind, T = spec["impl"], spec["kind"], int(spec["T"])
    device = torch.device(spec.get("device", "cpu"))
    x, y = _stream(T)
    out: dict[str, Any] = {"impl": impl, "kind": kind, "T": T}
    if impl == "ours":
        from dpaudit_torch.stats.hockey_stick import HockeyStickTest
        from dpaudit_torch.stats.mmd import SequentialMMDTest

        def make() -> Any:
            if kind == "mmd":
                return SequentialMMDTest(GRID, DELTAS, ALPHA, witness_radius=1.0, device=device)
            return HockeyStickTest(GRID, DELTAS, ALPHA, device=device)

        # warm-up (allocator, kernels, lazy imports) on a short stream, then a fresh tester
        w = make()
        w.update(x[:200].to(device), y[:200].to(device))
        del w
        x, y = x.to(device), y.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        tester = make()
        batch = int(spec.get("batch", 1000))
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, T, batch):
            tester.update(x[i : i + batch], y[i : i + batch])
        _ = tester.rejected  # reading the decision may synchronise
        if device.type == "cuda":
            torch.cuda.synchronize()
            out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        out["log_wealth"] = tester.log_wealth.tolist()
        out["state_bytes"] = _state_bytes(tester)
        if hasattr(tester, "memory_bytes"):
            out["state_bytes_reported"] = int(tester.memory_bytes)
        out["batch"] = batch
    else:
        xs, ys = x.numpy(), y.numpy()
        run_naive(kind if kind != "mmd" else "mmd_numpy", xs[:200], ys[:200])  # warm-up
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0, c0 = time.perf_counter(), time.process_time()
        n_eps = int(spec.get("n_eps", 16))
        testers = run_naive(impl if impl == "mmd_python" else kind, xs, ys, n_eps)
        # the 16 testers are independent and cost the same (no early stop under the null):
        # timing n_eps of them and scaling by 16 / n_eps is exact up to timing noise
        wall = (time.perf_counter() - t0) * 16 / n_eps
        cpu = (time.process_time() - c0) * 16 / n_eps
        out["n_eps_timed"] = n_eps
        if kind == "mmd":
            out["log_wealth"] = [t.ons.lw for t in testers]
        else:
            out["log_wealth"] = [math.log(0.5 * (math.exp(t.ons[0].lw) + math.exp(t.ons[1].lw)))
                                 for t in testers]
        out["state_bytes"] = sum(_state_bytes(t) for t in testers)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # single-threaded runs on a shared machine: CPU time is the measure of work (wall time
    # includes waiting for the CPU); both are recorded
    out.update(seconds=cpu, wall_seconds=wall, pairs_per_s=T / cpu,
               rss_growth_bytes=max(0, rss1 - rss0))
    return out


def measure(spec: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    # one thread everywhere (torch is set to 1 thread in the child; numpy's BLAS, used by the
    # naive baselines' dot products, would otherwise spawn threads and inflate CPU time)
    env = {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                             "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                             env=env)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"child {spec} failed:\n{exc.stderr[-3000:]}") from None
    return json.loads(res.stdout.strip().splitlines()[-1])


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--Ts", default="1000,10000,100000")
    p.add_argument("--naive-limit", type=float, default=300.0,
                   help="seconds; longer naive runs time fewer testers, or are extrapolated")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="T = 1000, 10000 only; no docs")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--kinds", default="mmd,hs", help="which testers to measure now")
    p.add_argument("--cache", default=None,
                   help="JSON file of measurements: reused if present, updated after each one")
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    torch.set_num_threads(1)
    Ts = [int(t) for t in args.Ts.split(",")]
    if args.quick:
        Ts = [t for t in Ts if t <= 10_000]
    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        for r in json.loads(cache.read_text()):
            results[(r["key"][0], r["key"][1], int(r["key"][2]))] = r
        print(f"reusing {len(results)} cached measurements from {cache}")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    notes: list[str] = []

    def record(impl: str, kind: str, T: int, batch: int = 1000,
               n_eps: int = 16) -> dict[str, Any] | None:
        spec = {"impl": impl, "kind": kind, "T": T, "device": args.device, "batch": batch,
                "n_eps": n_eps}
        key = (impl if batch == 1000 else f"{impl}_b{batch}", kind, T)
        if key in results:
            return results[key]
        if kind not in kinds:
            return None
        t0 = time.perf_counter()
        # the limit is meant in CPU seconds; on a shared machine wall time can be several times more
        r = measure(spec, timeout=3600.0 if impl == "ours" else 10.0 * args.naive_limit)
        if r is not None:
            r["key"] = list(key)
            results[key] = r
            if cache is not None:
                cache.write_text(json.dumps(list(results.values())))
            print(f"{key}: {r['pairs_per_s']:.0f} pairs/s, {r['seconds']:.2f} s CPU "
                  f"({r['wall_seconds']:.2f} s wall), state "
                  f"{_mib(r['state_bytes'])} MiB, rss +{_mib(r['rss_growth_bytes'])} MiB "
                  f"(wall {time.perf_counter() - t0:.0f} s)", flush=True)
        else:
            print(f"{key}: over {args.naive_limit:.0f} s, to be extrapolated", flush=True)
        return r

    for kind in ("mmd", "hs"):
        for T in Ts:
            record("ours", kind, T)
            if T == 10_000:
                record("ours", kind, T, batch=10)
        for T in Ts:
            prev = [results.get(("naive", kind, t)) for t in Ts if t < T]
            if prev and prev[-1] is not None:
                # predict from the last measured point (quadratic at worst) before launching
                est = prev[-1]["seconds"] * (T / prev[-1]["T"]) ** 2
                if ("naive", kind, T) in results:
                    continue
                if est > args.naive_limit:
                    # time fewer of the 16 independent per-epsilon testers, if that fits
                    k = max(1, min(16, int(16 * args.naive_limit / est)))
                    if est * k / 16 <= 2.0 * args.naive_limit and k < 16:
                        print(f"naive {kind} T={T}: predicted {est:.0f} s; timing {k} of the 16 "
                              f"testers", flush=True)
                        record("naive", kind, T, n_eps=k)
                        continue
                if est > 2.0 * args.naive_limit:
                    print(f"naive {kind} T={T}: predicted {est:.0f} s, extrapolating", flush=True)
                    continue
            record("naive", kind, T)
    record("mmd_python", "mmd", 1000)

    # consistency: the naive numpy MMD computes the same statistic as ours
    a, b = results.get(("ours", "mmd", 1000)), results.get(("naive", "mmd", 1000))
    if a and b:
        diff = float(np.max(np.abs(np.array(a["log_wealth"]) - np.array(b["log_wealth"]))))
        notes.append(f"Check: at T = 1000 the naive MMD's 16 log-wealths equal ours to "
                     f"{diff:.1e} (same statistic, different implementation).")

    def seconds(impl: str, kind: str, T: int) -> tuple[float | None, bool]:
        r = results.get((impl, kind, T))
        if r is not None:
            return r["seconds"], False
        pts = sorted((t, results[(impl, kind, t)]["seconds"]) for t in Ts
                     if (impl, kind, t) in results)
        if not pts:
            return None, False
        if len(pts) >= 2:
            (t1, s1), (t2, s2) = pts[-2], pts[-1]
            k = math.log(s2 / s1) / math.log(t2 / t1)
        else:
            (t2, s2), k = pts[-1], 2.0
        k = max(k, 1.0)
        return s2 * (T / t2) ** k, True

    rows = []
    ratio_1e4: dict[str, float | None] = {}
    for kind, label in (("mmd", "MMD (R = 1)"), ("hs", "hockey-stick")):
        for T in Ts:
            ours = results.get(("ours", kind, T))
            ns, extrap = seconds("naive", kind, T)
            ratio = None if (ours is None or ns is None) else ns / ours["seconds"]
            if T == 10_000:
                ratio_1e4[kind] = ratio
            naive_r = results.get(("naive", kind, T))
            how = " (extrapolated in T)" if extrap else ""
            if naive_r is not None and naive_r.get("n_eps_timed", 16) < 16:
                k = naive_r["n_eps_timed"]
                how = f" ({k} of 16 testers timed, x{16 / k:.3g})"
            row = [
                label, T,
                "-" if ours is None else f"{ours['pairs_per_s']:.0f}",
                "-" if ns is None else f"{T / ns:.1f}" + how,
                "-" if ratio is None else f"{ratio:.0f}x",
                "-" if ours is None else _mib(ours["state_bytes"]),
                "-" if ours is None else _mib(ours["rss_growth_bytes"]),
                "-" if ours is None else f"{ours['state_bytes'] / T:.0f}",
                "-" if naive_r is None else _mib(naive_r["state_bytes"]),
            ]
            rows.append(row)
    head = ["tester", "T", "ours pairs/s", "naive pairs/s", "ours / naive", "ours state MiB",
            "ours peak RSS growth MiB", "ours state bytes / pair", "naive state MiB"]
    table = markdown_table(head, rows)
    extra = []
    for kind, label in (("mmd", "MMD"), ("hs", "hockey-stick")):
        r = results.get(("ours_b10", kind, 10_000))
        if r is not None:
            extra.append(f"{label}: {r['pairs_per_s']:.0f} pairs/s at T = 10^4 in batches of 10 "
                         f"pairs (hook-like use)")
    py = results.get(("mmd_python", "mmd", 1000))
    if py is not None:
        n1 = results.get(("naive", "mmd", 1000))
        extra.append(
            f"pure-Python naive MMD (Python loop over past pairs): {py['pairs_per_s']:.1f} "
            f"pairs/s at T = 10^3" + ("" if n1 is None else
                                      f" vs {n1['pairs_per_s']:.1f} for the numpy-inner naive") +
            f"; extrapolated quadratically to T = 10^4: {1000 / py['seconds'] / 10:.2f} pairs/s, "
            f"i.e. ours is about "
            + ("-" if ("ours", "mmd", 10_000) not in results else
               f"{py['seconds'] * 100 / results[('ours', 'mmd', 10_000)]['seconds']:.0f}x")
            + " faster than that baseline")
    verdict = ", ".join(f"{k}: {'-' if v is None else f'{v:.0f}x'}" for k, v in ratio_1e4.items())
    summary = (f"Ratio ours / naive at T = 10^4 with 16 epsilons: {verdict} (goal >= 10x). "
               "Memory: our state grows linearly in T (bytes per pair roughly constant across T; "
               "buffers grow by doubling, so the allocated capacity is up to 2x the pairs held); "
               "the peak RSS growth is dominated by transient per-chunk buffers whose size is "
               "bounded independently of T (MMD kernel blocks: ~2^17 elements on the CPU, "
               "~2^23 on accelerators), so it "
               "grows far more slowly than T.")
    print(table)
    print()
    for line in extra + notes:
        print(line)
    print(summary)
    if not args.quick and not args.no_write:
        body = "\n\n".join([
            "## Throughput and memory (16-point epsilon grid)",
            f"Command: `{command()}`  \nMachine: {machine()}",
            "Stream: exact Gaussian mechanism, sigma = 1 (the null holds, no early stop). Grid: "
            "16 epsilons in [0.05, 4] with their sigma = 1 profile deltas. Ours: one tester for "
            "the grid, batches of 1000 pairs, torch on 1 thread. Times are CPU seconds of the "
            "single-threaded process (the machine is shared; wall time adds waiting). "
            "Naive: one independent tester per epsilon, a Python loop over pairs (MMD: sum "
            "over past pairs in numpy; hockey-stick: quantile bins recomputed from all past "
            "pairs at each pair). Every "
            "configuration runs in a fresh process. A naive run predicted to exceed "
            f"{args.naive_limit:.0f} s times only some of its 16 independent per-epsilon testers "
            "(each costs the same: same stream, no early stop) and scales by 16 / k (marked); "
            "one still too long is extrapolated from the two smaller T by a fitted power law "
            "(marked)."
            + (" With --cache, the measurements of earlier invocations (same script, same "
               "configurations, each in its own fresh process) are reused." if cache else ""),
            table,
            "\n".join(f"- {s}" for s in extra + notes),
            summary,
        ])
        write_section("throughput", body)
        print("wrote the throughput section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
