"""Overhead of the PrivacyAuditor: audited / unaudited DP-SGD step time (issue 4).

A small CNN (two 5x5 convolutions, two linear layers, about 46k parameters) on synthetic 28x28
images (no download), Opacus with ``hooks`` and ``ghost`` clipping, sigma = 1, expected batch 64
and 256 (Poisson), one thread. For each setting, two identical private setups live in the same
process: one with the auditor attached (default settings), one without. Blocks of steps
alternate between them (interleaved repetitions, so drifts of a shared machine hit both alike);
the figure of merit is the ratio of the median per-step CPU times of the training thread
(robust to other load on a shared machine; wall-clock ratios are reported beside it). The
auditor's own share is also
measured by timing its step pre-hook (observation + decisions) and its injection wrapper.

    python benchmarks/overhead.py [--trials 3] [--reps 15] [--block 15] [--warmup 100]
                                  [--modes hooks,ghost] [--batches 64,256]
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
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.hook import PrivacyAuditor  # noqa: E402


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 5)
        self.c2 = nn.Conv2d(16, 32, 5)
        self.f1 = nn.Linear(32 * 4 * 4, 64)
        self.f2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.f2(torch.relu(self.f1(x.flatten(1))))


def make(mode: str, seed: int, n: int, batch: int) -> dict[str, Any]:
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, 28, 28, generator=g)
    Y = torch.randint(0, 10, (n,), generator=g)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dl = DataLoader(TensorDataset(X, Y), batch_size=batch,
                    generator=torch.Generator().manual_seed(seed + 1))
    engine = PrivacyEngine(accountant="rdp")
    crit = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(module=model, optimizer=opt, data_loader=dl,
                                  noise_multiplier=1.0, max_grad_norm=1.0,
                                  grad_sample_mode=mode, criterion=crit,
                                  noise_generator=torch.Generator().manual_seed(seed + 2))
    if mode == "ghost":
        model, opt, crit, dl = out
    else:
        model, opt, dl = out
    return {"engine": engine, "model": model, "opt": opt, "dl": dl, "crit": crit,
            "it": iter(dl), "n_params": sum(p.numel() for p in model.parameters())}


def run_block(s: dict[str, Any], steps: int) -> tuple[float, float]:
    """Run ``steps`` logical steps; return (wall seconds, CPU seconds of this thread) per step."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for _ in range(steps):
        try:
            x, y = next(s["it"])
        except StopIteration:
            s["it"] = iter(s["dl"])
            x, y = next(s["it"])
        s["opt"].zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = s["crit"](s["model"](x), y)
            loss.backward()
        s["opt"].step()
    return (time.perf_counter() - t0) / steps, (time.thread_time() - c0) / steps


def instrument(aud: PrivacyAuditor) -> dict[str, float]:
    """Accumulate the CPU time (this thread) spent in the auditor's pre-hook and injection
    wrapper (the wrapper without the Opacus clipping calls it makes)."""
    acc = {"hook": 0.0, "inject": 0.0}
    hook = aud._pre_hook

    def timed_hook(*a: Any) -> Any:
        t = time.thread_time()
        try:
            return hook(*a)
        finally:
            acc["hook"] += time.thread_time() - t

    aud._handle.remove()
    aud._handle = aud.optimizer.original_optimizer.register_step_pre_hook(timed_hook)
    inj = aud._injector
    attr = inj._attr
    wrapped = getattr(aud.optimizer, attr)

    def timed_inject() -> Any:
        t = time.thread_time()
        orig = inj._original()
        t_orig = [0.0]

        def counted() -> Any:
            t1 = time.thread_time()
            try:
                return orig()
            finally:
                t_orig[0] += time.thread_time() - t1

        inj._original = lambda: counted  # type: ignore[method-assign]
        try:
            return wrapped()
        finally:
            del inj._original
            acc["inject"] += time.thread_time() - t - t_orig[0]

    setattr(aud.optimizer, attr, timed_inject)
    return acc


def one_trial(mode: str, batch: int, trial: int, args: argparse.Namespace) -> dict[str, Any]:
    """Two identical private setups (seed = trial); the auditor goes on the first in even trials
    and on the second in odd ones (memory placement effects average out); interleaved blocks."""
    pair = [make(mode, trial, args.n, batch), make(mode, trial, args.n, batch)]
    audited, base = (pair[0], pair[1]) if trial % 2 == 0 else (pair[1], pair[0])
    aud = PrivacyAuditor(audited["engine"], audited["opt"], audited["dl"], seed=trial)
    acc = instrument(aud)
    run_block(base, args.warmup)
    run_block(audited, args.warmup)
    acc["hook"] = acc["inject"] = 0.0
    w_base, w_aud, c_base, c_aud = [], [], [], []
    for r in range(args.reps):
        first, second = (base, audited) if r % 2 == 0 else (audited, base)
        a = run_block(first, args.block)
        b = run_block(second, args.block)
        ra, rb = (a, b) if first is base else (b, a)  # (base, audited)
        w_base.append(ra[0])
        w_aud.append(rb[0])
        c_base.append(ra[1])
        c_aud.append(rb[1])
    steps = args.reps * args.block
    out = {
        "n_params": base["n_params"], "check_every": aud.check_every,
        "cpu_base": statistics.median(c_base), "cpu_aud": statistics.median(c_aud),
        "cpu_paired": statistics.median(a / b for a, b in zip(c_aud, c_base)),
        "wall_ratio": statistics.median(w_aud) / statistics.median(w_base),
        "inject": acc["inject"] / steps, "hook": acc["hook"] / steps,
    }
    out["cpu_ratio"] = out["cpu_aud"] / out["cpu_base"]
    aud.detach()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--block", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--modes", default="hooks,ghost")
    ap.add_argument("--n", type=int, default=6400)
    ap.add_argument("--batches", default="64,256", help="expected batch sizes")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    combos = [(m, int(b)) for b in args.batches.split(",") for m in args.modes.split(",")]
    for mode, batch in combos:
        res = [one_trial(mode, batch, t, args) for t in range(args.trials)]
        med = {k: statistics.median(r[k] for r in res) for k in res[0]}
        per_trial = ", ".join(f"{r['cpu_ratio']:.3f}" for r in res)
        rows.append([mode, batch, res[0]["n_params"], res[0]["check_every"],
                     args.warmup + args.reps * args.block, 1e3 * med["cpu_base"],
                     1e3 * med["cpu_aud"], med["cpu_ratio"], per_trial, med["cpu_paired"],
                     med["wall_ratio"], 1e3 * med["inject"], 1e3 * med["hook"]])
        print(f"{mode} batch {batch}: CPU unaudited {1e3 * med['cpu_base']:.2f} ms/step, audited "
              f"{1e3 * med['cpu_aud']:.2f} ms/step; ratio {med['cpu_ratio']:.3f} (trials "
              f"{per_trial}; paired {med['cpu_paired']:.3f}); wall ratio "
              f"{med['wall_ratio']:.3f}; injection {1e3 * med['inject']:.2f} ms, observation + "
              f"tests {1e3 * med['hook']:.2f} ms per step", flush=True)
    table = markdown_table(
        ["mode", "batch", "params", "check_every", "audited steps at end",
         "unaudited CPU ms/step", "audited CPU ms/step", "CPU ratio (median of trials)",
         "CPU ratio per trial", "CPU median paired ratio", "wall ratio",
         "injection CPU ms/step", "observation+tests CPU ms/step"], rows)
    print(table)
    if not args.no_write:
        body = (
            "## Overhead of the auditor (benchmarks/overhead.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "Small CNN (2 conv + 2 linear), synthetic 28x28 inputs, sigma 1, C 1, expected batch "
            f"{args.batches} (Poisson, n = {args.n}), one thread; auditor with default settings "
            "(16 pairs, 1000 one-run canaries, canary norm 25, both sequential tests). Audited "
            "and unaudited setups live in the same process; "
            f"{args.trials} trials; each builds two identical setups (the auditor on the first "
            "in even trials, on the second in odd ones, so that memory placement averages out) "
            f"and runs {args.reps} interleaved blocks of {args.block} steps after "
            f"{args.warmup} warm-up steps (the MMD witness is full, at its 1024-pair cap, after "
            "64 steps). The figure of merit is the CPU time of the training thread (everything "
            "runs on it: one torch thread, no data-loader workers): the ratio of the median "
            "per-step times, median over trials (each trial's ratio is listed; the paired "
            "column is the median ratio of adjacent blocks, the wall column the wall-clock "
            "ratio). The last two columns time the auditor's own code (injection wrapper "
            "without Opacus's clipping calls; step pre-hook: observation, "
            "sequential tests, claimed epsilon).\n\n" + table + "\n")
        write_section("overhead", body)


if __name__ == "__main__":
    main()
