"""Detection benchmark of the PrivacyAuditor: steps to detect each bug, false alarms (issue 4).

Setting (small, so that it runs in minutes on a CPU): the demo's DigitsCNN (two 3x3 convolutions
with GroupNorm and a linear head, 6,186 parameters) on scikit-learn's bundled 8x8 digits (1,437
real training images, nothing downloaded), Opacus ``hooks`` mode, Poisson sampling with expected
batch 64 (q = 0.0445), lr 0.5, sigma = 1, C = 1, RDP accountant, delta = 1e-5. The auditor runs
with its defaults (16 pairs, 1,000 one-run canaries, canary norm 25 C, both sequential tests,
Gaussian per-step null, check_every = 5, alpha = 0.05).

* Detection: for each bug of :mod:`dpaudit_torch.testing.bugs`, ``--seeds`` runs (default 20) of
  at most ``--max-steps`` steps; reported: how many runs were stopped, the median and max
  ``violation_step`` (the step at which the decision was available, a multiple of check_every)
  and of ``crossed_at_step`` (the step whose observation pushed the wealth over 1/alpha).
* False alarms: ``--null-runs`` (default 200) correct runs of ``--null-steps`` steps (default
  50, i.e. 800 test pairs each); the fraction flagged with a Clopper-Pearson 95% interval.

    python benchmarks/detection.py [--seeds 20] [--null-runs 200] [--null-steps 50]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.demo import DigitsCNN, load_digits_tensors  # noqa: E402
from dpaudit_torch.testing import bugs  # noqa: E402

TARGETS = {"no-noise": 5, "noise-divided-by-batch": 5, "noise-halved": 15, "no-clipping": 5}


def one_run(train: Any, seed: int, bug: str | None, max_steps: int, batch: int = 64,
            lr: float = 0.5, sigma: float = 1.0) -> dict[str, Any]:
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    dl = DataLoader(train, batch_size=batch, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=sigma,
            max_grad_norm=1.0, noise_generator=torch.Generator().manual_seed(10_000 + seed))
    if bug is not None:
        bugs.apply_bug(opt, bug)
    aud = PrivacyAuditor(engine, opt, dl, delta=1e-5, seed=seed)
    crit = nn.CrossEntropyLoss(reduction="sum")  # an empty Poisson batch gives a zero loss
    steps = 0
    while steps < max_steps and not aud.should_stop:
        for x, y in dl:
            opt.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (crit(model(x), y) / batch).backward()
            opt.step()
            steps += 1
            if aud.should_stop or steps >= max_steps:
                break
    aud.detach()
    return {"violation": aud.violation, "step": aud.violation_step,
            "crossed": aud.crossed_at_step, "steps": steps, "lw": aud.combined_log_wealth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--null-runs", type=int, default=200)
    ap.add_argument("--null-steps", type=int, default=50)
    ap.add_argument("--bugs", default=",".join(bugs.names()))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("dpaudit_torch").setLevel(logging.ERROR)
    train, _ = load_digits_tensors(0)
    t0 = time.time()
    rows = []
    for bug in args.bugs.split(","):
        res = [one_run(train, s, bug, args.max_steps) for s in range(args.seeds)]
        det = [r for r in res if r["violation"]]
        vs = [r["step"] for r in det] or [float("nan")]
        cs = [r["crossed"] for r in det] or [float("nan")]
        # an undetected run counts as "more than max_steps" in the median
        med = statistics.median([r["step"] if r["violation"] else float("inf") for r in res])
        ok = med <= TARGETS.get(bug, float("inf"))
        rows.append([bug, f"{len(det)}/{len(res)}", med, max(vs), statistics.median(cs),
                     max(cs), f"<= {TARGETS.get(bug, '-')}", "yes" if ok else "NO"])
        print(f"{bug}: detected {len(det)}/{len(res)}, decision step median {med} max "
              f"{max(vs)}, crossing median {statistics.median(cs)} max {max(cs)} "
              f"({time.time() - t0:.0f}s)", flush=True)
    alarms, top = 0, []
    for s in range(args.null_runs):
        r = one_run(train, 100_000 + s, None, args.null_steps)
        alarms += r["violation"]
        top.append(r["lw"])
        if (s + 1) % 50 == 0:
            print(f"  correct runs: {s + 1}, false alarms {alarms} ({time.time() - t0:.0f}s)",
                  flush=True)
    n = args.null_runs
    lo = stats.beta.ppf(0.025, alarms, n - alarms + 1) if alarms else 0.0
    hi = stats.beta.ppf(0.975, alarms + 1, n - alarms) if alarms < n else 1.0
    table = markdown_table(
        ["bug", "detected", "median decision step", "max decision step",
         "median crossing step", "max crossing step", "target (median)", "met"], rows)
    null_line = (f"False alarms on correct DP-SGD: {alarms}/{n} runs of {args.null_steps} steps "
                 f"({args.null_steps * 16} pairs each): rate {alarms / n:.3f}, 95% "
                 f"Clopper-Pearson [{lo:.3f}, {hi:.3f}] (target: <= alpha = 0.05). Largest final "
                 f"combined log-wealth {max(top):.2f} (threshold ln 20 = 3.00), median "
                 f"{statistics.median(top):.2f}.")
    print(table)
    print(null_line)
    print(f"total {time.time() - t0:.0f}s")
    if not args.no_write:
        body = (
            "## Detection of silent DP bugs (benchmarks/detection.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "DigitsCNN (6,186 parameters) on scikit-learn's bundled 8x8 digits (1,437 training "
            "images), Opacus hooks mode, Poisson sampling with expected batch 64, lr 0.5, sigma "
            "1, C 1, RDP accountant; auditor defaults (16 pairs/step, 1,000 one-run canaries, "
            "canary norm 25 C, MMD + hockey-stick tests at 5 points of the per-step Gaussian "
            f"profile, check_every 5, alpha 0.05). {args.seeds} seeds per bug, at most "
            f"{args.max_steps} steps. *Decision step* = `violation_step`, the step at which the "
            "violation was decided (a check step, so a multiple of check_every = 5); *crossing "
            "step* = the step whose observations first pushed the averaged e-process over "
            "1/alpha (what check_every = 1 would report).\n\n" + table + "\n\n" + null_line
            + "\n")
        write_section("detection", body)


if __name__ == "__main__":
    main()
