"""Table 1 of Gonzalez et al. (NeurIPS 2025): paper vs MMD R=1/2, MMD R=1, hockey-stick.

Protocol (the paper's): alpha = 0.05, 20 runs per cell, budget 5000 pairs, eps in {0.01, 0.1},
the six mechanisms of docs/design.md section 7 in the ``dp_auditorium`` variant (what the paper's
experiments ran). A run stops at its first rejection; pairs are counted including the burn-in.

    python benchmarks/table1.py              # full protocol; writes the "table1" section of docs
    python benchmarks/table1.py --quick      # 3 runs, budget 1000 (~1-2 min); prints only

The comparison with Kutta et al. is made on a second, larger run of the hockey-stick test on the
four cells they report (``--kutta-runs``, default 200 runs, ~15 s): a 20-run mean has a standard
error of 5-10% of itself, too much to claim a difference of that size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, write_section  # noqa: E402

from dpaudit_torch.experiments import (  # noqa: E402
    format_kutta_cells,
    format_table1,
    format_table1_checks,
    format_table1_detail,
    run_kutta_cells,
    run_table1,
    table1_checks,
)

EXPLANATION = """\
**Reading the table.** The "DP" rows (DPGaussian, DPLaplace) of the `dp_auditorium` variant are
*not* differentially private: DP-Auditorium does not clip the noisy count n~ = n + Lap(2/eps) and
floors the noise scale at 1e-12, so whenever n~ < 0 (probability (1/2) e^(-eps/2), about one half)
the output under S = (0) is the noiseless value 0, an atom that S' = (0, 1) never produces
(there the noiseless value is 1/n~ < 0). That is a violation with delta ~ 0.5, at any epsilon.
A rejection on these rows is therefore a **detected leak, never a type-I error**. The MMD test
does not see it within the budget: under S' the noiseless outputs 1/n~ are small negative numbers
next to 0, so the two kernel mean embeddings differ by less than tau; the hockey-stick test gives
the repeated value its own cell, bets on the event {output = 0} and rejects within a few dozen
pairs. An MMD rejection on these rows is also a correct decision (the mechanism is not DP, so
Theorem 3.1 does not bound its MMD). False-rejection rates on truly DP mechanisms (the `clipped`
variant, exact Gaussian and Laplace) are in the "type1" section.

The paper's column is its Table 1 (authors' code: witness radius R = 1/2, the paper's tau).
"Kutta et al." is the best published sequential auditor (arXiv 2602.06518), mean pairs."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20, help="runs per cell (default 20)")
    p.add_argument("--budget", type=int, default=5000, help="pairs per run at most (default 5000)")
    p.add_argument("--quick", action="store_true",
                   help="3 runs, budget 1000; print only (does not write the docs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="dp_auditorium", choices=["dp_auditorium", "clipped"])
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    p.add_argument("--kutta-runs", type=int, default=200,
                   help="runs of the hockey-stick test on Kutta et al.'s 4 cells (default 200; "
                        "0: judge the goal on the main table)")
    p.add_argument("--json", default=None, help="also dump the raw rows to this JSON file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    runs, budget = (3, 1000) if args.quick else (args.runs, args.budget)
    t0 = time.perf_counter()
    rows = run_table1(runs=runs, budget=budget, seed=args.seed, variant=args.variant,
                      progress=not args.no_progress)
    kutta_rows = []
    kutta_runs = 0 if args.quick else args.kutta_runs
    if kutta_runs > 0:
        kutta_rows = run_kutta_cells(runs=kutta_runs, budget=budget, seed=args.seed,
                                     variant=args.variant, progress=not args.no_progress)
    wall = time.perf_counter() - t0
    table = format_table1(rows)
    kutta_md = format_kutta_cells(kutta_rows) if kutta_rows else ""
    checks = table1_checks(rows, kutta_rows or None)
    check_md = format_table1_checks(checks)
    print(table)
    print()
    print(check_md)
    if kutta_md:
        print()
        print(kutta_md)
    required = [c for c in checks if not c["check"].startswith("goal")]
    n_ok = sum(c["passed"] for c in required)
    summary = (f"Required checks passed: {n_ok} / {len(required)}; goals (beat Kutta et al.): "
               f"{sum(c['passed'] for c in checks if c['check'].startswith('goal'))} / "
               f"{sum(c['check'].startswith('goal') for c in checks)}. Wall time {wall:.0f} s.")
    print()
    print(summary)
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in rows]
                                              + [dict(r.to_dict(), kutta_cells=True)
                                                 for r in kutta_rows], indent=1))
    ratios = {c["cell"]: c["ratio"] for c in checks
              if c["check"].startswith("MMD R=1/2 mean pairs") and c["ratio"] is not None}
    others = [abs(v - 1.0) for k, v in ratios.items() if k != "NonDPLaplace2 eps=0.1"]
    worst_other = max(others) if others else float("nan")
    nl2_row = [r for r in rows if (r.mechanism, r.epsilon, r.method)
               == ("NonDPLaplace2", 0.1, "mmd_r0.5")]
    nl2 = ("-" if not nl2_row or nl2_row[0].mean_pairs is None
           else f"{nl2_row[0].rate:.2f} / {nl2_row[0].mean_pairs:.0f}")
    if not args.quick and not args.no_write:
        body = "\n\n".join([
            "## Table 1 (Gonzalez et al., NeurIPS 2025): paper vs this project",
            f"Command: `{command()}`  \nMachine: {machine()}",
            table,
            EXPLANATION,
            "**Acceptance checks, measured in this run.** MMD R=1/2 within 25% "
            "of the paper's mean pairs where the paper rejects at rate >= 0.85 and within 0.2 of "
            "its rate elsewhere; MMD R=1 at most 0.7x the paper's pairs on those cells; "
            "hockey-stick rate 1.0 and at most 0.25x the paper's pairs on every NonDP cell; "
            "goal: fewer pairs than Kutta et al."
            + (f", judged on {kutta_runs} runs of the hockey-stick test per Kutta cell (mean "
               "plus two standard errors below their mean; table below)" if kutta_rows else ""),
            check_md,
            *([f"**Against Kutta et al., {kutta_runs} runs per cell** (the same protocol and "
               f"seeds; runs 0-{args.runs - 1} are the main table's):", kutta_md]
              if kutta_rows else []),
            summary,
            "**Known discrepancy.** On NonDPLaplace2 at eps = 0.1 the paper reports 0.95 / 770 for "
            "MMD R=1/2; the independent numpy re-run of the MMD test (docs/design.md section 7) "
            f"gets 0.90 / 450 and this implementation gets {nl2}, while it reproduces the paper's "
            f"other {len(others)} rejecting cells within {worst_other:.0%} (see the standard "
            "errors in the detail table).",
            "<details><summary>Per-cell detail (mean +- standard error over the rejecting runs, "
            "median)</summary>\n\n" + format_table1_detail(rows) + "\n\n</details>",
        ])
        write_section("table1", body)
        print("wrote the table1 section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
