#!/usr/bin/env python3
"""Black-box audit of your own noisy function with the sequential (anytime-valid) testers.

No training, no Opacus: anything you can run many times on two neighbouring data sets can be
audited. Here a "private mean" of records in [0, 1], written twice:

* ``private_mean``: clips each record to [0, 1], so one record moves the mean by at most 1/n, and
  adds Gaussian noise calibrated for (epsilon, delta)-DP (the classical Gaussian mechanism,
  sigma = sqrt(2 ln(1.25/delta)) * (1/n) / epsilon; Dwork & Roth 2014, Theorem A.1).
* ``buggy_private_mean``: the same, except that it clamps the *result* to [0, 1] instead of each
  record -- a plausible slip. One outlying record can then move the output by up to 1, not 1/n.

The worst neighbours an adversary can pick: S = n records at 0.5, and S' = S with one record
replaced by 100 (an out-of-range value the function should neutralise). Both functions claim
(epsilon, delta)-DP. Pairs (x ~ f(S), y ~ f(S')) are streamed in batches into:

* ``SequentialMMDTest`` (Gonzalez, Dulce-Rubio, Ramdas, Ribero, NeurIPS 2025): kernel MMD by
  betting; rejects when MMD(P, Q) exceeds what (epsilon, delta)-DP allows;
* ``HockeyStickTest`` (this project): bets on learned events E, checking P(E) <= e^eps Q(E) + delta.

Each test is a test of the claim at level alpha that stays valid however often it is looked at,
so the loop stops as soon as a test rejects (or the pair budget runs out). A rejection proves,
with confidence 1 - alpha, that the function is NOT (epsilon, delta)-DP; no rejection proves
nothing (the function may leak in a way these tests, with this budget, cannot see).

    python examples/audit_mechanism.py --budget 5000
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import torch

from dpaudit_torch import AuditReport, HockeyStickTest, SequentialMMDTest

# ------------------------------------------------------------------------------------------------
# the functions under audit (what a user would have written)
# ------------------------------------------------------------------------------------------------


def gaussian_sigma(n: int, epsilon: float, delta: float) -> float:
    """Noise of the classical Gaussian mechanism for a mean of n records in [0, 1]."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) * (1.0 / n) / epsilon


def private_mean(data: torch.Tensor, epsilon: float, delta: float, size: int,
                 generator: torch.Generator) -> torch.Tensor:
    """``size`` independent releases of the (epsilon, delta)-DP mean of ``data`` (correct)."""
    sigma = gaussian_sigma(len(data), epsilon, delta)
    mean = data.clamp(0.0, 1.0).mean()  # each record clipped: sensitivity 1/n
    return mean + sigma * torch.randn(size, generator=generator, dtype=torch.float64)


def buggy_private_mean(data: torch.Tensor, epsilon: float, delta: float, size: int,
                       generator: torch.Generator) -> torch.Tensor:
    """The same with a bug: the mean is clamped, not the records (sensitivity up to 1, not 1/n)."""
    sigma = gaussian_sigma(len(data), epsilon, delta)
    mean = data.mean().clamp(0.0, 1.0)  # BUG: clamps the output, not each record
    return mean + sigma * torch.randn(size, generator=generator, dtype=torch.float64)


# ------------------------------------------------------------------------------------------------
# the audit: stream pairs, stop at the first rejection
# ------------------------------------------------------------------------------------------------


def audit(function, S: torch.Tensor, S_prime: torch.Tensor, test, *, epsilon: float,
          delta: float, budget: int, batch: int, seed: int) -> dict:
    """Feed pairs (f(S), f(S')) to ``test`` in batches until it rejects or ``budget`` pairs."""
    gen = torch.Generator().manual_seed(seed)
    used = 0
    history: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    while used < budget and not test.rejected:
        b = min(batch, budget - used)
        x = function(S, epsilon, delta, b, gen)
        y = function(S_prime, epsilon, delta, b, gen)
        test.update(x, y)  # pairs are processed one by one, in order (anytime-valid)
        used += b
        history.append((used, float(test.combined_log_wealth)))
    return {
        "rejected": bool(test.rejected),
        "pairs": int(test.rejected_at) if test.rejected else used,
        "lower_bound": float(test.epsilon_lower_bound),
        "seconds": time.perf_counter() - t0,
        "history": history,
        "summary": test.summary(),
    }


def make_report(name: str, results: dict[str, dict], *, epsilon: float, delta: float,
                alpha: float, grid: list[float], budget: int) -> AuditReport:
    """A black-box AuditReport: claimed epsilon beside the sequential lower bound (per release)."""
    rejected = [r for r in results.values() if r["rejected"]]
    first = min((r["pairs"] for r in rejected), default=None)
    steps = sorted({s for r in results.values() for s, _ in r["history"]})
    wealth: dict[str, list] = {"step": steps}
    for kind, r in results.items():
        lw = dict(r["history"])
        last = 0.0
        series = []
        for s in steps:
            last = lw.get(s, last)
            series.append(last)
        wealth[kind] = series
    bound = max(r["lower_bound"] for r in results.values())
    return AuditReport(
        claimed_epsilon=epsilon,
        delta=delta,
        alpha=alpha,
        accountant=None,
        epsilon_lower_bounds={"sequential": bound},
        lower_bound_details={"sequential": {
            "level": 1.0 - alpha, "simultaneous": True, "grid_epsilons": grid,
            "grid_deltas": [delta] * len(grid),
            "null": "the function is (epsilon, delta)-DP at each grid point",
            "note": "black-box bound for one release of the function",
        }},
        # the grid starts at the claim, so every grid null contains the claim: a rejection
        # refutes the claim itself (one release is the whole mechanism here)
        claim_refuted=bool(rejected),
        violation=bool(rejected),
        violation_step=first,
        stopped_early=bool(rejected),
        sequential={"tests": {k: r["summary"] for k, r in results.items()},
                    "per_step_null": {"type": "explicit", "epsilon": epsilon, "delta": delta}},
        wealth_history=wealth,
        threat_model={"white_box": False, "every_step_observed": True,
                      "clipping_exercised": True,
                      "notes": [f"black-box audit of {name}: pairs of releases on S and S'",
                                "violation_step counts pairs of releases, not training steps"]},
        config={"function": name, "budget": budget, "grid_epsilons": grid},
        seed_policy="fixed seed (a reproducible example)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Black-box sequential audit of a noisy mean.")
    p.add_argument("--budget", type=int, default=5000,
                   help="most pairs of releases per test (default 5000)")
    p.add_argument("--batch", type=int, default=100, help="pairs drawn per batch (default 100)")
    p.add_argument("--epsilon", type=float, default=0.1, help="claimed epsilon (default 0.1)")
    p.add_argument("--delta", type=float, default=1e-5, help="claimed delta (default 1e-5)")
    p.add_argument("--alpha", type=float, default=0.05, help="level of the tests (default 0.05)")
    p.add_argument("--n", type=int, default=100, help="records in the data set (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the function's noise")
    p.add_argument("--out", default=None,
                   help="if given, write one report (audit.json + report.html) per function")
    args = p.parse_args(argv)
    if args.budget < 1 or args.batch < 1 or args.n < 2:
        p.error("--budget and --batch must be >= 1, --n >= 2")
    if not (0 < args.epsilon < 1):
        p.error(f"--epsilon must be in (0, 1) (the classical Gaussian mechanism), got "
                f"{args.epsilon}")

    S = torch.full((args.n,), 0.5, dtype=torch.float64)
    S_prime = S.clone()
    S_prime[-1] = 100.0  # one record replaced by an out-of-range value
    # a grid from the claim upwards: rejecting any point refutes the claim; the largest rejected
    # point is the certified lower bound (docs/design.md section 4)
    grid = [args.epsilon * f for f in (1, 2, 4, 8)]
    print(f"claim: (epsilon={args.epsilon:g}, delta={args.delta:g})-DP; neighbours: {args.n} "
          f"records at 0.5 vs one replaced by 100; level alpha={args.alpha:g}; budget "
          f"{args.budget} pairs per test\n")
    exit_reports = []
    for name, function in (("private_mean", private_mean),
                           ("buggy_private_mean", buggy_private_mean)):
        results = {}
        for kind, cls in (("mmd", SequentialMMDTest), ("hockey_stick", HockeyStickTest)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. grid points a test cannot reject
                test = cls(grid, delta=args.delta, alpha=args.alpha)
            results[kind] = audit(function, S, S_prime, test, epsilon=args.epsilon,
                                  delta=args.delta, budget=args.budget, batch=args.batch,
                                  seed=args.seed)
        print(f"{name}:")
        for kind, r in results.items():
            if r["rejected"]:
                verdict = (f"NOT ({args.epsilon:g}, {args.delta:g})-DP: rejected after "
                           f"{r['pairs']} pairs; certified epsilon >= {r['lower_bound']:.3g}")
            else:
                verdict = (f"no violation found in {r['pairs']} pairs (not a proof of privacy)")
            print(f"  {kind:>12}: {verdict}  [{r['seconds']:.2f} s]")
        if args.out is not None:
            report = make_report(name, results, epsilon=args.epsilon, delta=args.delta,
                                 alpha=args.alpha, grid=grid, budget=args.budget)
            exit_reports.append(report.save(Path(args.out) / name))
    if exit_reports:
        print("\nreports: " + ", ".join(str(d) for d in exit_reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
