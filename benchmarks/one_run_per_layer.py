"""Per-layer clipping: the white-box bound of correct runs against the exact law of the
contribution their canaries reach (issue 37 part 7; docs/design.md section 5, "Per-layer
clipping").

The demo's digits CNN (:class:`dpaudit_torch.demo.DigitsCNN`, 10 parameter tensors from 10 to
4608 coordinates, scikit-learn's bundled digits), sigma 1.0, expected batch 64 (q = 64 / 1437),
lr 0.5, C = 1, Opacus hooks mode, Poisson sampling, PRV accountant, 150 steps, auditor defaults,
one torch thread. Clipping modes:

* ``flat``: ``max_grad_norm=1.0``;
* ``per_layer_equal``: ``clipping="per_layer"``, C_l = 1 / sqrt(10) on every tensor;
* ``per_layer_size``: ``clipping="per_layer"``, C_l = sqrt(n_l / n) (n_l: the tensor's
  coordinates, n: the model's), so that sum C_l^2 = 1;
* ``per_layer_dirac``: as ``per_layer_equal`` but with the Dirac one-run canaries of flat
  clipping (the layered design switched off): what the auditor did before;
* ``adaptive``: ``clipping="adaptive"`` (target unclipped quantile 0.5, clip-bound learning rate
  0.2, bounds [0.1, 10], unclipped_num_std 20).

For each run: the white-box bound, the contribution c the canaries reach (units of C) and
their layout, the report's power statement (the exact law's median bound and its 10% / 90%
quantiles at the canaries' noise multiplier sigma / c, this run's T, m and IN count), the
epsilon of the canaries' own release (the PRV estimate at sigma / c), and the percentile of the
run's statistic L in the exact law at rho = c / sigma (uniform on a correct run). Target: median
real bound / median expected bound >= 0.9 for the per-layer modes.

    python benchmarks/one_run_per_layer.py [--seeds 5] [--steps 150] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

import dpaudit_torch.canary_layers as layers_mod  # noqa: E402
from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.canary_layers import layout_of  # noqa: E402
from dpaudit_torch.demo import DigitsCNN, load_digits_tensors  # noqa: E402
from dpaudit_torch.stats.whitebox import ReleaseLaw  # noqa: E402

DELTA, SIGMA, BATCH, LR = 1e-5, 1.0, 64, 0.5
TARGET = 0.9
MODES = ("flat", "per_layer_equal", "per_layer_size", "per_layer_dirac", "adaptive")
TARGET_MODES = ("per_layer_equal", "per_layer_size")
BREAK = "  "  # a Markdown line break


def private_setup(mode: str, seed: int) -> tuple[Any, ...]:
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    data, _ = load_digits_tensors(0)
    model = DigitsCNN()
    sizes = [p.numel() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dl = DataLoader(data, batch_size=BATCH, generator=torch.Generator().manual_seed(seed))
    kw: dict[str, Any] = {"max_grad_norm": 1.0}
    if mode in ("per_layer_equal", "per_layer_dirac"):
        kw = {"max_grad_norm": [len(sizes) ** -0.5] * len(sizes), "clipping": "per_layer"}
    elif mode == "per_layer_size":
        kw = {"max_grad_norm": [(n / sum(sizes)) ** 0.5 for n in sizes],
              "clipping": "per_layer"}
    elif mode == "adaptive":
        kw = {"max_grad_norm": 1.0, "clipping": "adaptive", "target_unclipped_quantile": 0.5,
              "clipbound_learning_rate": 0.2, "max_clipbound": 10.0, "min_clipbound": 0.1,
              "unclipped_num_std": 20.0}
    engine = PrivacyEngine(accountant="prv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=SIGMA,
            noise_generator=torch.Generator().manual_seed(10_000 + seed), **kw)
    return engine, model, opt, dl


def audited_run(mode: str, seed: int, steps: int) -> dict[str, Any]:
    engine, model, opt, dl = private_setup(mode, seed)
    saved = layers_mod.draw_layered_canaries
    if mode == "per_layer_dirac":  # the design before layered canaries
        layers_mod.draw_layered_canaries = lambda *a, **k: None
    try:
        aud = PrivacyAuditor(engine, opt, dl, delta=DELTA, seed=seed)
    finally:
        layers_mod.draw_layered_canaries = saved
    lay = layout_of(aud.design)
    crit = nn.CrossEntropyLoss(reduction="sum")
    done, t0 = 0, time.perf_counter()
    while done < steps:
        for x, y in dl:
            opt.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (crit(model(x), y) / BATCH).backward()
            opt.step()
            done += 1
            if done >= steps:
                break
    rep = aud.finalize()
    wb, pw = rep.lower_bound_details["whitebox"], rep.power
    c = lay.contribution if lay is not None else 1.0
    if mode == "per_layer_dirac":  # a Dirac canary contributes C_l = C / sqrt(10)
        c = len(aud.design.shapes) ** -0.5
    pct = None
    if wb.get("statistic") is not None and wb.get("n_in"):
        law = ReleaseLaw(wb["n_in"], wb["n_out"], wb["steps"], wb["q"])
        pct = 100.0 * (1.0 - law.tail(wb["statistic"], c / SIGMA, conservative=False))
    return {"mode": mode, "seed": seed, "bound": float(rep.epsilon_lower_bounds["whitebox"]),
            "expected": pw.get("expected_bound"), "quantiles": pw.get("expected_bound_quantiles"),
            "c": c, "width": lay.width if lay is not None else 1,
            "m": int(rep.canaries["m_one_run"]), "release": pw.get("release_epsilon"),
            "claim": float(rep.claimed_epsilon), "family": bool(wb.get("family_verified")),
            "violation": bool(rep.violation), "refuted": bool(rep.claim_refuted),
            "pct": pct, "seconds": time.perf_counter() - t0}


def _med(xs: list[Any]) -> float:
    vals = [float(x) for x in xs if x is not None]
    return statistics.median(vals) if vals else float("nan")


def table(runs: dict[str, list[dict[str, Any]]]) -> tuple[str, bool]:
    rows, ok = [], True
    for mode, rs in runs.items():
        real, exp = _med([r["bound"] for r in rs]), _med([r["expected"] for r in rs])
        q10 = _med([r["quantiles"][0] for r in rs if r["quantiles"]])
        q90 = _med([r["quantiles"][1] for r in rs if r["quantiles"]])
        ratio = real / exp if exp > 0 else float("nan")
        met = "n/a"
        if mode in TARGET_MODES:
            met = "yes" if ratio >= TARGET else "no"
            ok = ok and met == "yes"
        rel = _med([r["release"] for r in rs])
        per_seed = ", ".join(f"{r['bound']:.3g}" for r in rs)
        rows.append([
            mode, rs[0]["width"], rs[0]["m"], f"{rs[0]['c']:.3f}", len(rs),
            f"{rs[0]['claim']:.3f}",
            f"{real:.3f} ({per_seed})",
            f"{exp:.3f} [{q10:.3g}, {q90:.3g}]",
            "n/a" if rel != rel else f"{rel:.3f}",
            f"{ratio:.3f}", f">= {TARGET}" if mode in TARGET_MODES else "-", met,
            ", ".join("n/a" if r["pct"] is None else f"{r['pct']:.0f}" for r in rs),
            f"{sum(r['family'] for r in rs)}/{len(rs)}",
            f"{sum(r['violation'] or r['refuted'] for r in rs)}/{len(rs)}",
        ])
    head = ["clipping", "tensors spanned by a canary", "one-run canaries m",
            "contribution c (of C)",
            "seeds", "claimed eps (PRV)", "white-box bound: median (per seed)",
            "expected at c (power.expected_bound): median [10%, 90%]",
            "eps of the canaries' release (sigma / c)", "ratio real / expected", "target",
            "met", "percentile of L in the exact law at c / sigma (per seed)",
            "family verified", "violation or refuted"]
    return markdown_table(head, rows), ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the per-layer modes")
    ap.add_argument("--other-seeds", type=int, default=3,
                    help="seeds of flat, adaptive and the Dirac per-layer design")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--quick", action="store_true", help="2 seeds, 30 steps; writes nothing")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.seeds, args.other_seeds, args.steps = 2, 1, 30
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in args.modes.split(","):
        n = args.seeds if mode in TARGET_MODES else args.other_seeds
        runs[mode] = []
        for seed in range(n):
            r = audited_run(mode, seed, args.steps)
            runs[mode].append(r)
            print(f"{mode} seed {seed}: bound {r['bound']:.3f}, expected {r['expected']}, "
                  f"c {r['c']:.3f}, |S| {r['width']}, m {r['m']}, pct {r['pct']}, "
                  f"{r['seconds']:.0f} s", flush=True)
    tab, ok = table(runs)
    print(tab)
    print("targets met" if ok else "TARGET MISSED")
    if args.quick or args.no_write:
        return
    c_eq = runs.get("per_layer_equal", [{"c": float("nan")}])[0]["c"]
    c_size = runs.get("per_layer_size", [{"c": float("nan")}])[0]["c"]
    body = f"""## Per-layer clipping: the bound at the contribution reached (`one_run_per_layer`)

Command: `{command()}`{BREAK}
Machine: {machine()}

The demo's digits CNN (10 parameter tensors of 10 to 4608 coordinates, 6186 in all), sigma
{SIGMA}, expected batch {BATCH} (q = 64 / 1437), lr {LR}, C = 1, hooks mode, Poisson sampling, PRV
accountant, {args.steps} steps, auditor defaults (white-box bound at alpha / 4 = 2.5e-4,
docs/design.md section 14), one torch thread.
*per_layer_equal*: C_l = 1 / sqrt(10) on every tensor; *per_layer_size*: C_l = sqrt(n_l / n);
*per_layer_dirac*: equal bounds with the Dirac one-run canaries of flat clipping (the design
before layered canaries; its power statement then assumed c = 1); *adaptive*: Opacus's
adaptive clipping (quantile 0.5, learning rate 0.2, bounds [0.1, 10], unclipped_num_std 20).
Layered canaries (`dpaudit_torch.canary_layers`, docs/design.md section 5) span |S| tensors and
contribute c = C_S / C; the expected bound is the report's `power.expected_bound`, the median of
the white-box bound's exact law at noise multiplier sigma / c with the run's T, m and IN count;
the percentile column places each run's statistic L in the exact law at rho = c / sigma
(uniform on a correct run). The Dirac design's c is C_l / C for every canary (equal bounds).

{tab}

Reading: with equal bounds the small tensors (10 to 144 coordinates) hold too few canaries for
spanning them to pay at this horizon, so the layout keeps the largest tensor (c = {c_eq:.3f}):
the audit now says so (expected bound and the release's epsilon at that c, far below the claim)
instead of expecting the full-C bound, which the Dirac design's report did. With bounds that grow
with the tensors' sizes most of C sits in the largest tensor and the canaries reach
c = {c_size:.3f}. Adaptive clipping keeps Dirac canaries at the full C.
Total time {time.perf_counter() - t0:.0f} s.
"""
    write_section("one_run_per_layer", body)


if __name__ == "__main__":
    main()
