"""The level of each proof path (docs/design.md section 14, "Two levels of evidence").

Every proof ("violation proven", "claim refuted", "claim inconsistent") is made at alpha = 0.001
in total, split among the proof paths (the union bound): the sequential decision 1/2, the
white-box bound 1/4, the Steinke bound 1/8, the accounting intervals 1/8. 1,000 training runs
cannot show a rate of 1e-4, so each whole-run path is simulated at the statistic level, 10^5
games per row, through the library's own code (`dpaudit_torch.experiments.levels`: the
white-box bound's critical value, the Steinke bound on the least private eps-DP game, the
accounting intervals), at its share of alpha and at 0.05, with a power row (a mechanism that
breaks the claim). The decision's path is Ville's inequality; its rate is measured on correct
per-step Gaussian streams through the auditor's own monitors and decision (every registered
monitor, the default tests and 16 pairs a step, the records of tests/audit/test_decision.py),
counting evidence (1/alpha_warn = 20) and proofs (1/5e-4 = 2000). Rates with exact 95%
Clopper-Pearson intervals (Clopper & Pearson, Biometrika 1934).

    python benchmarks/levels.py [--games 100000] [--decision-runs 1000] [--steps 250]
        [--workers N] [--no-write]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.audit import (  # noqa: E402
    AuditConfig,
    Decision,
    MonitorContext,
    StepRecord,
    build_monitors,  # noqa: E402
)
from dpaudit_torch.audit.levels import path_levels  # noqa: E402
from dpaudit_torch.canaries import SecretCoins  # noqa: E402
from dpaudit_torch.experiments.common import clopper_pearson  # noqa: E402
from dpaudit_torch.experiments.levels import (  # noqa: E402
    consistency_level,
    steinke_level,
    whitebox_level,
)

LEVELS = path_levels(1e-3)
#: (path, simulation, keyword arguments of a mechanism that breaks the claim)
WHOLE_RUN = [("whitebox", whitebox_level, {"true_sigma": 0.7}),
             ("steinke", steinke_level, {"true_eps": 2.0, "m": 1000}),
             ("consistency", consistency_level, {"true_ratio": 0.99})]


def decision_run(seed: int, steps: int) -> tuple[bool, bool]:
    """One correct stream through the auditor's monitors and decision: (evidence, proof)."""
    torch.set_num_threads(1)
    m = 8
    cfg = AuditConfig(m_canaries=m)
    k = cfg.k_pairs
    coins_secret = SecretCoins(m, torch.Generator().manual_seed(seed))
    mons = build_monitors(MonitorContext(config=cfg, k_pairs=k, m_canaries=m, device="cpu",
                                         warn=lambda _m: None, coins=coins_secret))
    mons["sequential_pairs"].start(1.0)
    dec = Decision(cfg.decision_alpha, cfg.history_stride, ["epsilon_lower_bound", *cfg.tests],
                   alpha_warn=cfg.alpha_warn)
    g = torch.Generator().manual_seed(1_000_000 + seed)
    coins = torch.rand(steps, k, generator=g) < 0.5
    vals = torch.randn(steps, 2 * k + m, generator=g, dtype=torch.float64)
    vals[:, :k] += coins.double()
    vals[:, k:2 * k] += (~coins).double()
    for t in range(steps):
        v, c = vals[t], coins[t]
        rec = StepRecord(step=t + 1, values=v, x=torch.where(c, v[:k], v[k:2 * k]),
                         y=torch.where(c, v[k:2 * k], v[:k]), coins=c, sigma=1.0,
                         sigma_claimed=1.0)
        for mon in mons.values():
            mon.observe(rec)
        if rec.step % cfg.check_every == 0 or rec.step == steps:
            dec.update([e for e in (mon.advance() for mon in mons.values()) if e], now=rec.step)
    return dec.evidence, dec.violation


def _cell(k: int, n: int) -> tuple[str, str]:
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} = {k / n:.2e}", f"[{lo:.2e}, {hi:.2e}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--games", type=int, default=100_000)
    ap.add_argument("--decision-runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    rows: list[list[Any]] = []
    ok = True
    for path, sim, unprivate in WHOLE_RUN:
        for level in (LEVELS[path], 0.05):
            r = sim(level, args.games, seed=31)
            rate, ci = _cell(r.exceed, r.runs)
            held = r.interval()[0] <= level
            ok = ok and held
            rows.append([path, "correct (the claim holds)", r.setting, f"{level:.3g}", rate, ci,
                         "yes" if held else "NO"])
        r = sim(LEVELS[path], args.games, seed=32, **unprivate)
        rate, ci = _cell(r.exceed, r.runs)
        rows.append([path, "power (breaks the claim)", r.setting, f"{LEVELS[path]:.3g}", rate,
                     ci, "-"])
        print(rows[-3:], f"({time.time() - t0:.0f}s)", flush=True)
    if args.decision_runs:
        seeds = list(range(args.decision_runs))
        if args.workers > 1:
            with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
                out = pool.starmap(decision_run, [(s, args.steps) for s in seeds])
        else:
            out = [decision_run(s, args.steps) for s in seeds]
        n = len(out)
        setting = (f"{args.steps} steps of 16 pairs at sigma 1 (the claim), every monitor, "
                   f"check_every 5")
        for what, level, k in (("evidence", 0.05, sum(e for e, _ in out)),
                               ("proof", LEVELS["decision"], sum(p for _, p in out))):
            rate, ci = _cell(k, n)
            held = clopper_pearson(k, n)[0] <= level
            ok = ok and held
            rows.append([f"decision ({what})", "correct (the claim holds)", setting,
                         f"{level:.3g}", rate, ci, "yes" if held else "NO"])
        print(rows[-2:], f"({time.time() - t0:.0f}s)", flush=True)
    table = markdown_table(["path", "mechanism", "setting", "level", "rate",
                            "95% Clopper-Pearson", "level held (CP lower end <= level)"], rows)
    summary = (f"Every path's rate within its level: {'yes' if ok else 'NO'}. "
               f"Total {time.time() - t0:.0f} s wall.")
    print(table)
    print(summary)
    if not args.no_write:
        body = ("## The level of each proof path (benchmarks/levels.py)\n\n"
                f"Command: `{command()}`  \nMachine: {machine()}\n\n"
                + " ".join((__doc__ or "").split("\n\n")[1].split()) + "\n\n"
                + table + "\n\n" + summary + "\n")
        write_section("levels", body)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
