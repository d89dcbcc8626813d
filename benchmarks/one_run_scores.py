"""Which per-canary score should the one-run audit use?  "sum" against "llr".

Idealized white-box DP-SGD game of docs/design.md sections 5-6 (what the auditor observes for a
correct implementation once the real data's clipped sum is subtracted): m = 1000 canaries, each IN
with probability 1/2; at each of T steps an IN canary is present with probability q; the
observation is Z = 1{present} + N(0, sigma^2) in units of the clipping norm.  sigma is calibrated
with Opacus's PRV accountant (``get_noise_multiplier(..., accountant="prv")``) to eps = 2 and 8 at
delta = 1e-5 for every (q, T) in {0.01, 0.05, 0.1, 0.3} x {300, 2500}.  Both scores are computed
on the SAME simulated games (step-by-step simulation, paired by seed) and audited with the
auditor's call (``OneRunAudit(ins, outs).epsilon_lower_bound(delta, alpha)``: Steinke, one-sided,
Bonferroni over the 1-2-5 grid -- a valid bound).  A column checks the tail-exact
approximation of the llr simulation (dpaudit_torch.stats.one_run_power) against the exact one.

The second part times :func:`dpaudit_torch.stats.one_run_power.one_run_power` (the report's power
estimate) at two settings (sigma 1: q 0.05 for 300 steps, q 0.004 for 10,000) and writes the
"how many canaries and steps" table of docs/one_run.md.

Run:  .venv/bin/python benchmarks/one_run_scores.py            (a few minutes, one thread)
      .venv/bin/python benchmarks/one_run_scores.py --quick    (smoke test, nothing written)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.stats.one_run_power import (  # noqa: E402
    bounds_from_scores,
    one_run_power,
    simulate_one_run_bounds,
    simulate_scores,
)

DELTA, ALPHA, M = 1e-5, 0.05, 1000
QS, TS, EPSS = (0.01, 0.05, 0.1, 0.3), (300, 2500), (2.0, 8.0)


def calibrate(eps: float, q: float, steps: int) -> float:
    """sigma of Opacus's PRV accountant for (eps, DELTA) at sample rate q and `steps` steps."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(get_noise_multiplier(target_epsilon=eps, target_delta=DELTA, sample_rate=q,
                                          steps=steps, accountant="prv"))


def epsilon_of(q: float, steps: int):  # noqa: ANN201 - a closure
    """The run's accountant as a function of sigma: PRV, RDP where PRV fails (tiny sigma)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    def eps(sigma: float) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for cls in (PRVAccountant, RDPAccountant):
                acc = cls()
                acc.history = [(sigma, q, steps)]
                try:
                    return float(acc.get_epsilon(DELTA))
                except Exception:  # noqa: BLE001, S112 - PRV's domain is limited; RDP is not
                    continue
        return math.inf

    return eps


def mean_sd(a: np.ndarray) -> str:
    return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}"


def compare(seeds: int, approx_reps: int, qs: tuple, ts: tuple) -> tuple[str, dict]:
    rows, diffs = [], {}
    for eps in EPSS:
        for q in qs:
            for steps in ts:
                t0 = time.perf_counter()
                sigma = calibrate(eps, q, steps)
                b = {}
                for score in ("sum", "llr"):
                    lab, s = simulate_scores(sigma, q, steps, M, score=score,
                                             replicates=seeds, seed=1, mode="exact")
                    b[score] = bounds_from_scores(lab, s, delta=DELTA, alpha=ALPHA)
                approx = simulate_one_run_bounds(sigma, q, steps, M, score="llr", delta=DELTA,
                                                 alpha=ALPHA, replicates=approx_reps, seed=2,
                                                 mode="approx")
                d = b["llr"] - b["sum"]
                diffs[(eps, q, steps)] = d
                se = d.std(ddof=1) / math.sqrt(d.size)
                rows.append([
                    f"{eps:g}", f"{q:g}", steps, f"{sigma:.3f}", f"{q * steps:g}",
                    mean_sd(b["sum"]), mean_sd(b["llr"]), f"{d.mean():+.3f} ± {se:.3f}",
                    f"{int((d > 0).sum())}/{int((d < 0).sum())}",
                    f"{approx.mean():.2f} ± {approx.std(ddof=1):.2f}",
                    f"{time.perf_counter() - t0:.1f}",
                ])
                print(rows[-1], flush=True)
    head = ["eps", "q", "T", "sigma (PRV)", "q T", "sum: bound", "llr: bound",
            "llr - sum (paired, ± SE)", "llr better / worse", "llr, approx. simulation",
            "seconds"]
    return markdown_table(head, rows), diffs


def timings(replicates: int) -> str:
    """one_run_power at two settings (sigma 1; q 0.05, 300 steps; q 0.004, 10,000 steps):
    without a claim (expected bound only), and with the claim eps = 2 (search for the smallest
    refutable eps); the accountant's own time is counted apart."""
    rows = []
    for sigma, q, steps in ((1.0, 0.05, 300), (1.0, 0.004, 10_000)):
        acc = epsilon_of(q, steps)
        spent = [0.0]

        def eps_of(s: float, acc=acc, spent=spent) -> float:  # noqa: B008 - bound per setting
            t = time.perf_counter()
            try:
                return acc(s)
            finally:
                spent[0] += time.perf_counter() - t

        for score in ("llr", "sum"):
            plain = one_run_power(sigma, q, steps, M, score=score, delta=DELTA, alpha=ALPHA,
                                  replicates=replicates)
            spent[0] = 0.0
            res = one_run_power(sigma, q, steps, M, score=score, delta=DELTA, alpha=ALPHA,
                                claimed_epsilon=2.0, epsilon_of_sigma=eps_of,
                                replicates=replicates)
            lo, hi = res.expected_bound_quantiles or (math.nan, math.nan)
            rows.append([f"{sigma:g}", f"{q:g}", steps, M, score, res.mode,
                         f"{res.expected_bound:.3f} [{lo:.2f}, {hi:.2f}]",
                         f"{plain.seconds:.1f}",
                         "n/a" if res.min_refutable_sigma is None
                         else f"{res.min_refutable_sigma:.3f}",
                         "n/a" if res.min_refutable_epsilon is None
                         else f"{res.min_refutable_epsilon:.2f}",
                         f"{res.seconds - spent[0]:.1f} + {spent[0]:.1f}"])
            print(rows[-1], flush=True)
    head = ["sigma", "q", "T", "m", "score", "simulation", "expected bound [10%, 90%]",
            "seconds (no claim)", "sigma' refuting eps 2 (80%)", "its eps (PRV)",
            "seconds with claim 2 (power + accountant)"]
    return markdown_table(head, rows)


def planning(replicates: int, ms: tuple, settings: tuple) -> str:
    """How many canaries and steps: claim eps = 4 (PRV) at each (q, T)."""
    rows = []
    for q, steps in settings:
        sigma = calibrate(4.0, q, steps)
        eps_of = epsilon_of(q, steps)
        for m in ms:
            res = one_run_power(sigma, q, steps, m, delta=DELTA, alpha=ALPHA,
                                claimed_epsilon=4.0, epsilon_of_sigma=eps_of,
                                replicates=replicates)
            lo, hi = res.expected_bound_quantiles or (math.nan, math.nan)
            rows.append([f"{q:g}", steps, f"{q * steps:g}", f"{sigma:.3f}", m,
                         f"{res.expected_bound:.2f} [{lo:.2f}, {hi:.2f}]",
                         "n/a" if res.min_refutable_epsilon is None
                         else f"{res.min_refutable_epsilon:.2f}",
                         f"{res.seconds:.1f}"])
            print(rows[-1], flush=True)
    head = ["q", "T", "q T", "sigma (eps 4, PRV)", "m canaries", "expected bound [10%, 90%]",
            "min refutable eps (80%)", "seconds"]
    return markdown_table(head, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--approx-replicates", type=int, default=100)
    p.add_argument("--power-replicates", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="tiny sizes, nothing written")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        seeds, approx_reps, qs, ts = 3, 5, (0.05, 0.3), (300,)
        power_reps, ms, settings = 20, (1000,), ((0.05, 300),)
    else:
        seeds, approx_reps, qs, ts = args.seeds, args.approx_replicates, QS, TS
        power_reps, ms = args.power_replicates, (1000, 5000)
        settings = ((0.01, 2500), (0.05, 300), (0.05, 2500), (0.3, 2500))

    t0 = time.perf_counter()
    table, diffs = compare(seeds, approx_reps, qs, ts)
    t1 = time.perf_counter()
    timing = timings(power_reps)
    t2 = time.perf_counter()
    plan = planning(power_reps, ms, settings)
    t3 = time.perf_counter()

    d_all = np.concatenate(list(diffs.values()))
    cells = len(diffs)
    better = sum(d.mean() > 2 * d.std(ddof=1) / math.sqrt(d.size) for d in diffs.values())
    worse = sum(d.mean() < -2 * d.std(ddof=1) / math.sqrt(d.size) for d in diffs.values())
    best_cell = max(diffs, key=lambda k: diffs[k].mean())
    worst_cell = min(diffs, key=lambda k: diffs[k].mean())
    # llr is the Neyman-Pearson statistic of the idealized game, so a small loss in one cell is
    # finite-sample noise of the top-r guesses; it is the default unless it loses materially
    choice = "llr" if d_all.mean() > 0 and diffs[worst_cell].mean() > -0.05 else "sum"
    summary = (
        f"Over the {cells} cells, llr - sum averages {d_all.mean():+.3f} "
        f"(paired, {d_all.size} games); llr is better by more than 2 SE in {better} cells and "
        f"worse by more than 2 SE in {worse}.  Largest gain {diffs[best_cell].mean():+.3f} at "
        f"eps {best_cell[0]:g}, q {best_cell[1]:g}, T {best_cell[2]}; smallest "
        f"{diffs[worst_cell].mean():+.3f} at eps {worst_cell[0]:g}, q {worst_cell[1]:g}, "
        f"T {worst_cell[2]}.  Rule: llr if it gains on average and loses no more than 0.05 "
        f"in any cell; choice: **{choice}**."
    )
    text = f"""## One-run scores: sum vs llr (`one_run_scores`)

Idealized white-box DP-SGD (docs/design.md sections 5-6): m = {M} canaries, IN with probability
1/2, an IN canary present at each step with probability q, observation 1{{present}} +
N(0, sigma^2) in units of C; sigma from Opacus's PRV accountant for the eps of the row at
delta = {DELTA:g}.  Both scores on the same {seeds} simulated games per row (step by step, paired);
bound: the auditor's call, Steinke, one-sided, Bonferroni over the 1-2-5 grid (valid), alpha =
{ALPHA}.  Cells: mean ± sd over games; "llr - sum": paired mean ± SE; "better / worse": games
where llr gives the larger / smaller bound.  Last column: the llr bound from the
tail-exact approximation of `one_run_power` ({approx_reps} independent games), to
compare with the exact "llr" column.

{table}

{summary}

### `one_run_power` timings (m = {M}, {power_reps} replicates)

The search for the smallest refutable eps uses a quarter as many replicates (at least 50) at each
of up to 10 noise levels (8 bisection steps); the accountant's time is counted apart.

{timing}

### How many canaries and steps (claim eps = 4 at delta = {DELTA:g}, sigma from PRV)

Expected Steinke bound of a correct run (median of {power_reps} simulated runs, llr score) and
the smallest true eps the audit refutes with probability 80 %.

{plan}

Parts: scores {t1 - t0:.0f} s, timings {t2 - t1:.0f} s, planning {t3 - t2:.0f} s.

Command: `{command()}`
Machine: {machine()}
"""
    print(text)
    if not args.quick:
        write_section("one_run_scores", text)
        print("written to docs/benchmarks.md (section one_run_scores)")


if __name__ == "__main__":
    main()
