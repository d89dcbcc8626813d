"""Power of the MMD test in the training hook against its witness cap (``max_witness_points``).

The hook's per-step null is the Gaussian mechanism (sensitivity 1 in units of C, noise
multiplier sigma = 1), tested at the default grid of 5 points of its privacy profile, both tests
at alpha / 2 with a simultaneous grid bound, exactly as ``PrivacyAuditor`` builds them. The
stream is what a broken step produces at one sequential pair: x ~ N(1, s^2) (canary present),
y ~ N(0, s^2), with s < 1 (less noise than claimed: s = 0.5 is "noise multiplier halved").
For each s and cap: pairs until the MMD test rejects, over ``--seeds`` streams (the same streams
for every cap), and the hockey-stick test beside it. A cap makes each pair cheaper (its kernel
work is proportional to the cap), so the hook uses the smallest cap that loses no power here.

    python benchmarks/witness_cap.py [--seeds 8] [--max-pairs 5000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.audit import per_step_null_grid  # noqa: E402
from dpaudit_torch.stats.hockey_stick import HockeyStickTest  # noqa: E402
from dpaudit_torch.stats.mmd import SequentialMMDTest  # noqa: E402

ALPHA = 0.05 / 2  # each of the hook's two tests


def pairs_to_reject(make, s: float, seed: int, max_pairs: int, chunk: int = 80) -> int | None:
    """Pairs until rejection on the stream of seed ``seed`` (None: not within max_pairs)."""
    g = torch.Generator().manual_seed(seed)
    x = 1.0 + s * torch.randn(max_pairs, generator=g, dtype=torch.float64)
    y = s * torch.randn(max_pairs, generator=g, dtype=torch.float64)
    t = make()
    for i in range(0, max_pairs, chunk):  # the hook feeds 5 steps x 16 pairs per check
        t.update(x[i:i + chunk], y[i:i + chunk])
        if t.rejected:
            return int(t.rejected_at)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--max-pairs", type=int, default=5000)
    ap.add_argument("--noise", default="0.4,0.5,0.62,0.7")
    ap.add_argument("--caps", default="128,256,1024,none")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    eps, dels = per_step_null_grid(1.0)
    eps_l, dels_l = eps.tolist(), dels.tolist()
    caps: list[int | None] = [None if c == "none" else int(c) for c in args.caps.split(",")]
    rows = []
    t0 = time.time()
    for s in (float(v) for v in args.noise.split(",")):
        makers = [(f"MMD cap {c}" if c else "MMD uncapped",
                   lambda c=c: SequentialMMDTest(eps_l, dels_l, ALPHA, simultaneous=True,
                                                 max_witness_points=c)) for c in caps]
        makers.append(("hockey-stick", lambda: HockeyStickTest(eps_l, dels_l, ALPHA,
                                                               simultaneous=True)))
        for name, make in makers:
            res = [pairs_to_reject(make, s, seed, args.max_pairs) for seed in range(args.seeds)]
            hit = [r for r in res if r is not None]
            med = statistics.median([r if r is not None else float("inf") for r in res])
            rows.append([s, name, f"{len(hit)}/{len(res)}", med,
                         " ".join(str(r) if r is not None else "-" for r in res)])
            print(f"s={s} {name}: rejected {len(hit)}/{len(res)}, median pairs {med} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    table = markdown_table(["noise s (claimed 1)", "test", "rejected", "median pairs",
                            "pairs per seed"], rows)
    print(table)
    if not args.no_write:
        body = (
            "## Witness cap of the hook's MMD test (benchmarks/witness_cap.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "Per-step null of the hook (Gaussian mechanism, noise multiplier 1, 5 profile "
            "points, alpha/2 per test, simultaneous grid); streams x ~ N(1, s^2), y ~ N(0, s^2) "
            f"with s < 1 (s = 0.5: noise multiplier halved), {args.seeds} seeds, the same "
            f"streams for every test, fed 80 pairs at a time as the hook does, at most "
            f"{args.max_pairs} pairs ('-': not rejected). Where the MMD test rejects within "
            "~1,500 pairs, the cap changes its pairs to rejection by a few percent at most (the "
            "witness is held at its norm bound by projections that shrink old terms, so the "
            "oldest pairs weigh little): cap 128 against 256 is the same at s = 0.4, a few "
            "pairs later at s = 0.5 and about 3% later at s = 0.62; at s = 0.7, where the MMD "
            "test needs ~5,000 pairs, the caps of 256 and below lose the 2 of 8 rejections that "
            "cap 1024 makes by 5,000 pairs. The hockey-stick test rejects 4-10x sooner than the "
            "MMD test in every case, all 8 seeds at s = 0.7 included, and the hook's decision "
            "averages the two e-processes, so the late MMD rejections never decide. The hook "
            "therefore runs the MMD test with `max_witness_points=128` "
            "(`DEFAULT_TEST_OPTIONS`): its kernel work per pair is half of cap 256's and an "
            "eighth of "
            "1024.\n\n" + table + "\n")
        write_section("witness_cap", body)


if __name__ == "__main__":
    main()
