"""How tight is the one-run audit?  Idealized white-box DP-SGD (docs/design.md section 6).

Setting (CIFAR-10 DP-SGD hyper-parameters, as in Steinke et al. 2023 and Mahloujifar et al. 2025):
n = 50,000 examples, expected batch 4096 (Poisson rate q = 4096 / 50,000), T = 2500 steps,
m = 5000 Dirac canaries, no interference from real data, delta = 1e-5.  The noise multiplier sigma
is calibrated with Opacus's PRV accountant (``opacus.accountants.utils.get_noise_multiplier``,
accountant "prv") to eps = 2 / 4 / 8.  Each canary is IN with probability 1/2; at each step an IN
canary is present with probability q; the projection of the step's noisy gradient on the canary's
coordinate, in units of the clipping norm C, is 1{present} + N(0, sigma^2).  Two scores:

* ``sum``: the sum over steps of the projections (what the hook accumulates);
* ``lr``:  the sum over steps of the per-step log likelihood ratio of the mixture,
  log[(1 - q) N(x; 0, sigma) + q N(x; 1, sigma)] - log N(x; 0, sigma)
  = log(1 - q + q exp((2x - 1) / (2 sigma^2))): the exact log-likelihood ratio of IN vs OUT for the
  whole trace (steps are independent), i.e. the Neyman-Pearson optimal per-canary score.

For each (eps, seed, score) the audit reports Steinke and f-DP bounds with the default strategy
(Bonferroni over the 1-2-5 grid of guess counts, valid) and the best guess count uncorrected (the
diagnostic, which is what the section-6 targets are), one- and two-sided.  A second part re-runs
the coverage simulation of tests/stats/test_one_run.py at 10x its size.

Run:  .venv/bin/python benchmarks/one_run_tightness.py            (about 5 minutes, one thread)
      .venv/bin/python benchmarks/one_run_tightness.py --quick    (smoke test, nothing written)
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
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.stats.one_run import (  # noqa: E402
    Bonferroni,
    FixedK,
    OneRunAudit,
    RandomSplit,
    ceiling,
    default_candidates,
)
from dpaudit_torch.stats.thresholds import gaussian_epsilon  # noqa: E402

N_DATA, BATCH, T_STEPS, M_CANARIES, DELTA, ALPHA = 50_000, 4096, 2500, 5000, 1e-5, 0.05
TARGETS = {  # docs/design.md section 6: best k, uncorrected, single draws
    2.0: {"steinke": 0.86, "fdp": 1.10},
    4.0: {"steinke": 2.12, "fdp": 2.83},
    8.0: {"steinke": 3.62, "fdp": 5.11},
}


def calibrate(eps: float, q: float, steps: int) -> tuple[float, float]:
    """sigma from Opacus's PRV accountant for (eps, DELTA), and the accountant's eps at sigma."""
    from opacus.accountants import PRVAccountant
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sigma = get_noise_multiplier(target_epsilon=eps, target_delta=DELTA, sample_rate=q,
                                     steps=steps, accountant="prv")
        acc = PRVAccountant()
        acc.history = [(sigma, q, steps)]
        return float(sigma), float(acc.get_epsilon(DELTA))


def simulate(sigma: float, q: float, steps: int, m: int, rng: np.random.Generator,
             chunk: int = 250) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Secret bits and the two scores of m Dirac canaries over `steps` DP-SGD steps (vectorised)."""
    lab = rng.random(m) < 0.5
    s_sum = np.zeros(m)
    s_lr = np.zeros(m)
    log_q, log_1q = math.log(q), math.log1p(-q)
    for t0 in range(0, steps, chunk):
        c = min(chunk, steps - t0)
        x = rng.standard_normal((m, c))
        x *= sigma
        x += lab[:, None] & (rng.random((m, c)) < q)
        s_sum += x.sum(axis=1)
        s_lr += np.logaddexp(log_1q, log_q + (2.0 * x - 1.0) / (2.0 * sigma**2)).sum(axis=1)
    return lab, s_sum, s_lr


def fmt(vals: list[float]) -> str:
    a = np.asarray(vals)
    sd = a.std(ddof=1) if a.size > 1 else 0.0
    return f"{a.mean():.2f} ± {sd:.2f} [{a.min():.2f}, {a.max():.2f}]"


def tightness(seeds: int, m: int, steps: int) -> tuple[str, dict]:
    q = BATCH / N_DATA
    rows, lr_rows = [], []
    summary: dict = {}
    for eps in (2.0, 4.0, 8.0):
        t0 = time.time()
        sigma, eps_acc = calibrate(eps, q, steps)
        vals: dict = {}
        for seed in range(seeds):
            rng = np.random.default_rng([seed, int(eps * 100)])
            lab, s_sum, s_lr = simulate(sigma, q, steps, m, rng)
            for score, s in (("sum", s_sum), ("lr", s_lr)):
                audit = OneRunAudit.from_labels(s, lab)
                for method in ("steinke", "fdp"):
                    for guesses in ("one_sided", "two_sided"):
                        res = audit.epsilon_lower_bound(DELTA, ALPHA, method, guesses)
                        key = (score, method, guesses)
                        vals.setdefault(key + ("default",), []).append(res.bound)
                        vals.setdefault(key + ("best",), []).append(res.uncorrected_best)
                        vals.setdefault(key + ("ceil",), []).append(res.ceiling)
        for score in ("sum", "lr"):
            for method in ("steinke", "fdp"):
                rows.append([
                    f"{eps:g} ({eps_acc:.3f})", f"{sigma:.4g}", score, method,
                    TARGETS[eps][method],
                    fmt(vals[(score, method, "one_sided", "best")]),
                    fmt(vals[(score, method, "two_sided", "best")]),
                    fmt(vals[(score, method, "one_sided", "default")]),
                    fmt(vals[(score, method, "two_sided", "default")]),
                    f"{ceiling(m, ALPHA, DELTA, method):.2f} / "
                    f"{np.mean(vals[(score, method, 'one_sided', 'ceil')]):.2f}",
                ])
        for method in ("steinke", "fdp"):
            for guesses in ("one_sided", "two_sided"):
                for kind in ("best", "default"):
                    d = np.subtract(vals[("lr", method, guesses, kind)],
                                    vals[("sum", method, guesses, kind)])
                    lr_rows.append([f"{eps:g}", method, guesses, kind, f"{d.mean():+.3f}",
                                    f"{int((d > 0).sum())}/{d.size}"])
        summary[eps] = {"sigma": sigma, "eps_acc": eps_acc, "vals": vals,
                        "seconds": time.time() - t0}
        print(f"eps {eps:g}: sigma {sigma:.4g}, {time.time() - t0:.0f} s", flush=True)
    head = ["eps (accountant)", "sigma", "score", "method", "target",
            "best k one-sided (diag.)", "best k two-sided (diag.)",
            "default one-sided", "default two-sided", "ceiling all r / default"]
    lr_head = ["eps", "method", "guesses", "bound", "mean(lr - sum)", "seeds lr > sum"]
    return markdown_table(head, rows) + "\n\n" + markdown_table(lr_head, lr_rows), summary


# ------------------------------------------------------------------------------------------------
# coverage at 10x the suite's size (same games as tests/stats/test_one_run.py)
# ------------------------------------------------------------------------------------------------
MU, EPS0, M_COV = 2.0, 2.0, 100


def _truth(game: str, method: str) -> float:
    if game == "gauss":
        return gaussian_epsilon(DELTA, MU)
    if method == "steinke":
        return EPS0
    return gaussian_epsilon(DELTA, 2.0 * float(special.ndtri(special.expit(EPS0))))


def coverage(n_runs: int) -> str:
    limit = ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / n_runs)
    rows = []
    for game in ("gauss", "rr"):
        for method in ("steinke", "fdp"):
            for strat in ("FixedK", "Bonferroni", "RandomSplit"):
                for guesses in ("one_sided", "two_sided"):
                    truth = _truth(game, method)
                    fails = diag_fails = 0
                    bounds = []
                    for run in range(n_runs):
                        rng = np.random.default_rng([2, run])
                        lab = rng.random(M_COV) < 0.5
                        if game == "gauss":
                            s = MU * lab + rng.standard_normal(M_COV)
                        else:
                            s = (lab ^ (rng.random(M_COV) < special.expit(-EPS0))).astype(float)
                        if strat == "FixedK":
                            st = FixedK(M_COV // 4 if guesses == "two_sided" else M_COV // 2)
                        elif strat == "Bonferroni":
                            st = Bonferroni()
                        else:
                            st = RandomSplit(0.5, seed=run)
                        res = OneRunAudit.from_labels(s, lab, tie_break_seed=run
                                                      ).epsilon_lower_bound(
                            DELTA, ALPHA, method, guesses, st)
                        fails += res.bound > truth
                        diag_fails += res.uncorrected_best > truth
                        bounds.append(res.bound)
                    rows.append([game, method, strat, guesses, f"{truth:.3f}",
                                 f"{np.mean(bounds):.3f}", f"{fails / n_runs:.3f}",
                                 "yes" if fails / n_runs <= limit else "NO",
                                 f"{diag_fails / n_runs:.3f}"])
    head = ["game", "method", "strategy", "guesses", "true eps", "mean bound",
            "P[bound > true]", f"<= {limit:.3f}", "diag. P[uncorrected > true]"]
    return markdown_table(head, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--coverage-runs", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="tiny sizes, nothing written")
    args = p.parse_args()
    torch.set_num_threads(1)
    m, steps = (M_CANARIES, T_STEPS) if not args.quick else (500, 200)
    seeds = args.seeds if not args.quick else 2
    cov_runs = args.coverage_runs if not args.quick else 20

    t0 = time.time()
    table, summary = tightness(seeds, m, steps)
    t1 = time.time()
    cov = coverage(cov_runs)
    t2 = time.time()
    print(table)
    print()
    print(cov)

    s = summary

    def mean(eps: float, *key: str) -> float:
        return float(np.mean(s[eps]["vals"][key]))

    # how far are the targets from our one-sided best-k means, in units of the seed sd?
    z = []
    for eps in s:
        for method in ("steinke", "fdp"):
            v = np.asarray(s[eps]["vals"][("sum", method, "one_sided", "best")])
            sd = v.std(ddof=1) if v.size > 1 else float("nan")
            z.append(abs(v.mean() - TARGETS[eps][method]) / sd)
    z_max = max(z)
    # likelihood-ratio vs sum: the 8 bounds of one seed share its data, so average them per seed
    # first; the seed means are independent (5 per eps)
    kinds = [k for k in s[2.0]["vals"] if k[0] == "sum" and k[-1] != "ceil"]
    lr_parts, all_seed_means, gains, losses = [], [], [], []
    for eps in s:
        per_seed = np.mean([np.subtract(s[eps]["vals"][("lr",) + k[1:]], s[eps]["vals"][k])
                            for k in kinds], axis=0)
        all_seed_means.append(per_seed)
        se = per_seed.std(ddof=1) / math.sqrt(per_seed.size) if per_seed.size > 1 else math.nan
        lr_parts.append(f"eps {eps:g} (sigma {s[eps]['sigma']:.2f}): {per_seed.mean():+.3f} "
                        f"± {se:.3f}")
        if per_seed.mean() > 2 * se:
            gains.append(f"{eps:g}")
        elif per_seed.mean() < -2 * se:
            losses.append(f"{eps:g}")
    seed_means = np.concatenate(all_seed_means)
    d_mean = float(seed_means.mean())
    d_se = float(seed_means.std(ddof=1) / math.sqrt(seed_means.size))
    verdict = []
    if gains:
        verdict.append(f"tighten the bounds at eps {', '.join(gains)} (by more than 2 SE)")
    if losses:
        verdict.append(f"loosen them at eps {', '.join(losses)}")
    rest = [f"{e:g}" for e in s if f"{e:g}" not in gains + losses]
    if rest:
        verdict.append(f"change nothing beyond seed noise at eps {', '.join(rest)}")
    lr_sentence = (f"Per-step likelihood-ratio scores {'; '.join(verdict)}.  lr - sum, averaged "
                   f"over the 8 bounds of a seed, then mean ± SE over seeds: "
                   f"{'; '.join(lr_parts)}; all {seed_means.size} seeds {d_mean:+.3f} ± "
                   f"{d_se:.3f}")

    def triple(method: str) -> str:
        return " / ".join(f"{mean(e, 'sum', method, 'one_sided', 'best'):.2f}" for e in s)

    two_more = sum(mean(e, "sum", mth, "two_sided", "best") > mean(e, "sum", mth, "one_sided",
                                                                     "best")
                   for e in s for mth in ("steinke", "fdp"))
    cost = np.mean([1 - mean(e, "sum", mth, g, "default") / mean(e, "sum", mth, g, "best")
                    for e in s for mth in ("steinke", "fdp") for g in ("one_sided", "two_sided")])
    sig_min = min(s[e]["sigma"] for e in s)

    text = f"""## One-run audit tightness (`one_run_tightness`)

Idealized white-box DP-SGD of docs/design.md section 6: n = {N_DATA:,}, expected batch {BATCH}
(Poisson q = {BATCH / N_DATA:.5f}), T = {steps} steps, m = {m} Dirac canaries (each IN with
probability 1/2, present at each step with probability q), no interference, delta = {DELTA:g},
alpha = {ALPHA}, {seeds} seeds per eps.  sigma calibrated with Opacus's **PRV** accountant
(`get_noise_multiplier(..., accountant="prv")`); the accountant's eps at that sigma is in brackets.
Cells: mean ± sd [min, max] over seeds.  "best k" = `uncorrected_best`, the best guess count
chosen after seeing the answers (diagnostic, not a valid bound; it is what the targets report).
"default" = Bonferroni over the 1-2-5 grid of guess counts ({len(default_candidates(m))}
candidates for m = {m}), a valid bound.  Ceiling: all guesses right, best r, at alpha (left) and
under the default strategy's alpha / {len(default_candidates(m))} (right).

{table}

The second table is the per-step likelihood-ratio score minus the summed score, paired by seed.

**Reading it.**
* One-sided best-k (sum score) against the section-6 targets: Steinke {triple('steinke')} vs
  0.86 / 2.12 / 3.62; f-DP {triple('fdp')} vs 1.10 / 2.83 / 5.11.  Every target is within
  {z_max:.1f} seed sd of our mean; the targets are single draws, and single draws vary by about
  the sd shown.  Two-sided guesses (also guessing OUT for the lowest scores) give more in
  {two_more} of the 6 (eps, method) cells.
* The gap to the theoretical eps is the one-run audit's, not the implementation's: with m = {m}
  canaries seen once, each canary contributes one weak guess, so the test sees the centre of
  the privacy-loss distribution while eps(1e-5) of DP-SGD is set by its tail.  The ceilings
  ({ceiling(m, ALPHA, DELTA, 'steinke'):.2f} Steinke, {ceiling(m, ALPHA, DELTA, 'fdp'):.2f} f-DP,
  all guesses right) are far above the measured bounds, so they do not cause the gap.  The f-DP
  test is tighter because DP-SGD's trade-off curve is close to a Gaussian one and the test uses
  the whole curve, not a single (eps, delta) point.
* The valid default bound is on average {100 * cost:.0f} % below best-k: the price of choosing k
  honestly (alpha / {len(default_candidates(m))} and a grid with factor 2-2.5 steps).  It is the
  number to report.
* {lr_sentence}.  The per-step log-ratio log(1 - q + q e^((2x - 1) / (2 sigma^2))) is nearly
  affine in x when sigma is large (sigma >= {sig_min:.2f} here), so the optimal statistic ranks
  canaries almost like the sum; whatever gain there is should grow as sigma falls.

### Coverage at 10x the suite ({cov_runs} runs per row, m = {M_COV} canaries)

A run fails when the bound exceeds the true eps; a valid bound fails with probability <= alpha,
accepted up to alpha + 3 binomial SE.  Games: `gauss` = scores mu S + N(0, 1) with mu = {MU}
(mu-GDP, true eps = eps_mu(delta)); `rr` = randomized response on the bit with eps0 = {EPS0}
(Steinke's truth eps0; the f-DP test's truth is eps(delta) of the smallest mu making RR mu-GDP,
mu = 2 Phi^-1(e^eps0 / (1 + e^eps0)), because it tests the Gaussian family).  The last column is
the uncorrected diagnostic used as if it were a bound: it shows what the correction buys.

{cov}

Tightness part {t1 - t0:.0f} s, coverage part {t2 - t1:.0f} s.

Command: `{command()}`
Machine: {machine()}
"""
    if not args.quick:
        write_section("one_run_tightness", text)
        print("written to docs/benchmarks.md (section one_run_tightness)")
    else:
        print(text[text.index("**Reading it.**"):text.index("### Coverage")])


if __name__ == "__main__":
    main()
