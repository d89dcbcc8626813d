#!/usr/bin/env python3
"""White-box audit of DP-SGD on CIFAR-10 with a WideResNet-16-4 (the setting of the papers).

This is the white-box setting of Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023), and of Mahloujifar, Melis and Chaudhuri, "Auditing f-Differential
Privacy in One Run" (ICML 2025): a WideResNet-16-4 with GroupNorm (De et al., "Unlocking
High-Accuracy Differentially Private Image Classification through Scale", 2022) trained with
DP-SGD on CIFAR-10, no data augmentation, a large logical batch built from small physical batches
with Opacus's ``BatchMemoryManager``, and thousands of gradient canaries. The auditor also runs the
sequential (anytime-valid) tests at every step and stops training if one proves a violation.

Run (a local CIFAR-10 in torchvision's format, e.g. ``DIR/cifar-10-batches-py``; nothing is
downloaded)::

    python examples/cifar10_wrn.py --data DIR --device cuda --out cifar_audit

Smoke test on CPU (torchvision's FakeData, a narrower network)::

    python examples/cifar10_wrn.py --fake-data --steps 2 --batch-size 16 \\
        --max-physical-batch-size 8 --m-canaries 200 --width 1 --out /tmp/wrn_audit

What a correct run of this exact setting should give, before paying for the GPU run (seconds on
a CPU, no data needed)::

    python examples/cifar10_wrn.py --power-only

Every run prints the same statement before training: the white-box bound's expected value for a
correct implementation with these sigma, q, T and canaries (exact, from the law of its statistic:
docs/one_run.md), beside what Steinke et al. (2023) report in this setting (an empirical lower
bound of 1.8 against a theoretical epsilon of 4, white box).

The report (``audit.json`` + ``report.html``) is written to ``--out``. Exit code 0 when the run
completes (whatever the verdict), 2 on bad arguments or missing data.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger("cifar10_wrn")

#: per-channel mean and standard deviation of the CIFAR-10 training images
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


# ------------------------------------------------------------------------------------------------
# WideResNet with GroupNorm (Zagoruyko & Komodakis 2016, pre-activation blocks; BatchNorm replaced
# by GroupNorm so that per-sample gradients exist, as in De et al. 2022)
# ------------------------------------------------------------------------------------------------


def _group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class WideBasicBlock(nn.Module):
    """Pre-activation basic block: GN-ReLU-conv3x3-GN-ReLU-conv3x3, plus a (projected) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, groups: int) -> None:
        super().__init__()
        self.norm1 = _group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm2 = _group_norm(out_ch, groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.act = nn.ReLU()
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.act(self.norm1(x))
        # the projection shortcut takes the pre-activated input (standard WRN)
        skip = x if self.shortcut is None else self.shortcut(o)
        o = self.conv1(o)
        o = self.conv2(self.act(self.norm2(o)))
        return o + skip


class WideResNet(nn.Module):
    """WRN-depth-width: a 3x3 stem, three groups of (depth - 4) / 6 blocks, GN-ReLU, pool, linear.

    WRN-16-4 (the default) has widths 16 -> 64 -> 128 -> 256 and about 2.75 million parameters.
    """

    def __init__(
        self, depth: int = 16, width: int = 4, n_classes: int = 10, groups: int = 16
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WideResNet depth must be 6n + 4 with n >= 1, got {depth}")
        if width < 1:
            raise ValueError(f"WideResNet width must be >= 1, got {width}")
        n = (depth - 4) // 6
        widths = [16, 16 * width, 32 * width, 64 * width]
        self.stem = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        in_ch = widths[0]
        for g, stride in zip(range(1, 4), (1, 2, 2)):
            for i in range(n):
                blocks.append(WideBasicBlock(in_ch, widths[g], stride if i == 0 else 1, groups))
                in_ch = widths[g]
        self.blocks = nn.Sequential(*blocks)
        self.norm = _group_norm(in_ch, groups)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(in_ch, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.blocks(self.stem(x))
        o = self.pool(self.act(self.norm(o))).flatten(1)
        return self.head(o)


# ------------------------------------------------------------------------------------------------
# data: uint8 tensors in memory, normalised on the device (augmentation-free)
# ------------------------------------------------------------------------------------------------


class DataError(Exception):
    """The data set could not be loaded (reported in one line, exit code 2)."""


def load_cifar10(root: str) -> tuple[TensorDataset, TensorDataset]:
    """CIFAR-10 (train, test) from ``root`` as uint8 [N, 3, 32, 32] tensors; never downloads."""
    base = Path(root) / "cifar-10-batches-py"
    if not base.is_dir():  # fail fast, before importing torchvision
        raise DataError(
            f"no CIFAR-10 under {root!r}: expected torchvision's layout {str(base)!r} (the python "
            "version of CIFAR-10 from https://www.cs.toronto.edu/~kriz/cifar.html, extracted); "
            "this example never downloads. Use --fake-data for a smoke test."
        )
    from torchvision.datasets import CIFAR10

    try:
        train = CIFAR10(root=root, train=True, download=False)
        test = CIFAR10(root=root, train=False, download=False)
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted."
        raise DataError(
            f"no CIFAR-10 under {root!r} ({exc}). Expected torchvision's layout "
            f"{root}/cifar-10-batches-py/ (the python version of CIFAR-10 from "
            "https://www.cs.toronto.edu/~kriz/cifar.html, extracted); this example never "
            "downloads. Use --fake-data for a smoke test."
        ) from None

    def to_tensors(ds: CIFAR10) -> TensorDataset:
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return TensorDataset(x, torch.tensor(ds.targets, dtype=torch.long))

    return to_tensors(train), to_tensors(test)


def load_fake(n_train: int, n_test: int, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """torchvision FakeData (random 3x32x32 images, 10 classes) as uint8 tensors (smoke tests)."""
    from torchvision.datasets import FakeData
    from torchvision.transforms import PILToTensor

    def make(size: int, offset: int) -> TensorDataset:
        ds = FakeData(size=size, image_size=(3, 32, 32), num_classes=10,
                      transform=PILToTensor(), random_offset=offset)
        xs, ys = zip(*(ds[i] for i in range(size)))
        return TensorDataset(torch.stack(xs), torch.tensor(ys, dtype=torch.long))

    return make(n_train, seed), make(n_test, seed + 1_000_003)


def normalise(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR10_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=x.device).view(1, 3, 1, 1)
    return (x.float() / 255.0 - mean) / std


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device, batch: int) -> float:
    model.eval()
    correct = 0
    for xb, yb in DataLoader(data, batch_size=batch):
        correct += int((model(normalise(xb.to(device))).argmax(1).cpu() == yb).sum())
    model.train()
    return correct / max(1, len(data))


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="DP-SGD on CIFAR-10 (WideResNet-16-4, GroupNorm, no augmentation) with the "
        "white-box privacy auditor attached; writes audit.json and report.html.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", metavar="DIR", help="root of a local CIFAR-10 "
                     "(torchvision layout: DIR/cifar-10-batches-py); never downloaded")
    src.add_argument("--fake-data", action="store_true",
                     help="torchvision FakeData (random 3x32x32 images, 10 classes): smoke test")
    p.add_argument("--fake-size", type=_positive_int, default=512,
                   help="training-set size with --fake-data (default 512)")
    p.add_argument("--steps", type=_positive_int, default=2500,
                   help="logical DP-SGD steps (default 2500)")
    p.add_argument("--batch-size", type=_positive_int, default=4096,
                   help="expected logical batch size (Poisson sampling; default 4096)")
    p.add_argument("--max-physical-batch-size", type=_positive_int, default=256,
                   help="largest physical batch (Opacus BatchMemoryManager; default 256)")
    privacy = p.add_mutually_exclusive_group()
    privacy.add_argument("--epsilon", type=_positive_float, default=None,
                         help="target epsilon for the whole run at --delta; the noise multiplier "
                         "is calibrated by Opacus (default 8.0 unless --noise-multiplier)")
    privacy.add_argument("--noise-multiplier", type=float, default=None,
                         help="noise multiplier sigma (instead of --epsilon)")
    p.add_argument("--max-grad-norm", type=_positive_float, default=1.0,
                   help="clipping norm C (default 1.0)")
    p.add_argument("--delta", type=_positive_float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument("--alpha", type=_positive_float, default=1e-3,
                   help="level of the audit's proofs, every path together (default 0.001; "
                        "evidence at 0.05)")
    p.add_argument("--lr", type=_positive_float, default=2.0, help="SGD learning rate (default 2)")
    p.add_argument("--m-canaries", type=_positive_int, default=20000,
                   help="one-run canaries (each IN with probability 1/2; default 20000)")
    p.add_argument("--power-only", action="store_true",
                   help="print what a correct run of this setting gives (the white-box bound's "
                   "expected value) and exit, without data or training")
    p.add_argument("--k-pairs", type=_positive_int, default=16,
                   help="canary coordinate pairs for the sequential tests (default 16)")
    p.add_argument("--depth", type=int, default=16, help="WideResNet depth, 6n+4 (default 16)")
    p.add_argument("--width", type=_positive_int, default=4,
                   help="WideResNet widening factor (default 4: WRN-16-4; smaller for smoke tests)")
    p.add_argument("--grad-sample-mode", choices=("hooks", "functorch"), default="hooks",
                   help="how Opacus computes per-sample gradients (default hooks)")
    p.add_argument("--accountant", choices=("prv", "rdp"), default="prv",
                   help="Opacus accountant for the claimed epsilon (default prv)")
    p.add_argument("--device", default="auto",
                   help="torch device: auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--seed", type=int, default=None,
                   help="seed for data order, model, noise and the audit (default: none, the "
                   "secure choice: the audit's secret coins come from the OS)")
    p.add_argument("--out", default="cifar10_audit",
                   help="report directory (default cifar10_audit)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return p


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DataError(f"unknown --device {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device {name!r} asked for, but CUDA is not available")
    return dev


def _logical_steps(engine: object) -> int:
    """Logical steps so far, from the accountant (len(accountant) counts segments: Opacus #834)."""
    return int(sum(n for (_, _, n) in engine.accountant.history))  # type: ignore[attr-defined]


def expected_audit(sigma: float, q: float, steps: int, m: int, delta: float,
                   claimed: float | None) -> str:
    """What a correct implementation of this setting gives: the white-box bound's median and
    [10 %, 90 %] quantiles from its exact law (no simulation), and the smallest true epsilon the
    audit refutes with probability 0.8."""
    from dpaudit_torch.stats.whitebox import whitebox_power

    pw = whitebox_power(sigma, q, steps, m, delta=delta, claimed_epsilon=claimed)
    lo, hi = pw["expected_bound_quantiles"]
    text = (f"expected audit of a correct run (sigma {sigma:.4g}, q {q:.4g}, T {steps}, "
            f"{m} canaries): white-box bound {pw['expected_bound']:.3g} "
            f"[10%: {lo:.3g}, 90%: {hi:.3g}]")
    if claimed is not None:
        text += f" against the claimed epsilon {claimed:.3g}"
        mre = pw.get("min_refutable_epsilon")
        if mre is not None:
            text += f"; it refutes a true epsilon of {mre:.3g} or more with probability 80%"
    return text + ("; for comparison, Steinke et al. (2023) report an empirical lower bound of "
                   "1.8 against a theoretical epsilon of 4 in the white-box setting")


def _power_only(args: argparse.Namespace) -> int:
    """--power-only: the expected audit of the configured setting, without data."""
    from opacus.accountants.utils import get_noise_multiplier

    from dpaudit_torch.stats.whitebox import dpsgd_epsilon

    n = args.fake_size if args.fake_data else 50_000
    q = 1.0 / math.ceil(n / args.batch_size)  # Opacus: 1 / len(loader)
    if args.noise_multiplier is not None:
        sigma = float(args.noise_multiplier)
        claimed = dpsgd_epsilon(sigma, q, args.steps, args.delta, "upper")
    else:
        claimed = 8.0 if args.epsilon is None else args.epsilon
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sigma = get_noise_multiplier(target_epsilon=claimed, target_delta=args.delta,
                                         sample_rate=q, steps=args.steps,
                                         accountant=args.accountant)
    print(expected_audit(sigma, q, args.steps, args.m_canaries, args.delta, claimed))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.power_only:
        return _power_only(args)
    device = _device(args.device)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.fake_data:
        train, test = load_fake(args.fake_size, max(64, args.fake_size // 8),
                                0 if args.seed is None else args.seed)
        data_name = f"torchvision FakeData ({args.fake_size} random 3x32x32 images)"
    else:
        train, test = load_cifar10(args.data)
        data_name = f"CIFAR-10 from {args.data}"

    from opacus import PrivacyEngine
    from opacus.accountants.utils import get_noise_multiplier
    from opacus.utils.batch_memory_manager import BatchMemoryManager
    from tqdm import tqdm

    from dpaudit_torch import PrivacyAuditor
    n = len(train)
    if args.batch_size > n:
        raise DataError(f"--batch-size {args.batch_size} exceeds the training-set size {n}")

    model = WideResNet(depth=args.depth, width=args.width).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    engine = PrivacyEngine(accountant=args.accountant)
    sample_rate = 1.0 / len(loader)  # what make_private will use (Poisson sampling)
    if args.noise_multiplier is not None:
        sigma = float(args.noise_multiplier)
        if not sigma >= 0:
            raise DataError(f"--noise-multiplier must be >= 0, got {args.noise_multiplier}")
        target = None
    else:
        target = 8.0 if args.epsilon is None else args.epsilon
        # the same calibration make_private_with_epsilon does, but for an exact step count
        sigma = get_noise_multiplier(target_epsilon=target, target_delta=args.delta,
                                     sample_rate=sample_rate, steps=args.steps,
                                     accountant=args.accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # secure_mode off: fine for an audit experiment
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
            max_grad_norm=args.max_grad_norm, grad_sample_mode=args.grad_sample_mode,
        )
    logger.info("WRN-%d-%d (%d parameters) on %s, %d training examples; sigma=%.4g, q=%.4g",
                args.depth, args.width, n_params, data_name, n, sigma, sample_rate)
    m_room = min(args.m_canaries, (n_params - 2 * args.k_pairs) // 2)
    print(expected_audit(sigma, sample_rate, args.steps, m_room, args.delta, target))

    auditor = PrivacyAuditor(
        engine, optimizer, loader, delta=args.delta, alpha=args.alpha, model=model,
        m_canaries=args.m_canaries, k_pairs=args.k_pairs, seed=args.seed,
    )
    criterion = nn.CrossEntropyLoss()
    bar = tqdm(total=args.steps, unit="step", disable=args.no_progress, file=sys.stderr,
               dynamic_ncols=True)
    t0 = time.perf_counter()
    loss_value = math.nan
    done = 0
    model.train()
    try:
        while done < args.steps and not auditor.should_stop:
            with BatchMemoryManager(data_loader=loader,
                                    max_physical_batch_size=args.max_physical_batch_size,
                                    optimizer=optimizer) as physical:
                for xb, yb in physical:
                    optimizer.zero_grad(set_to_none=True)
                    if len(yb):
                        loss = criterion(model(normalise(xb.to(device))), yb.to(device))
                        loss.backward()
                        loss_value = float(loss.detach())
                    optimizer.step()  # a no-op (no noise) except on a logical step's last batch
                    now = _logical_steps(engine)
                    if now > done:
                        bar.update(now - done)
                        done = now
                        post = {"loss": f"{loss_value:.3f}"}
                        metrics = getattr(auditor, "latest_metrics", None) or {}
                        for key in ("log_wealth", "combined_log_wealth"):
                            if key in metrics:
                                post["log_wealth"] = f"{float(metrics[key]):.2f}"
                        bar.set_postfix(post)
                    if done >= args.steps or auditor.should_stop:
                        break
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    if auditor.should_stop:
        logger.warning("the auditor stopped training at step %d: violation proven", done)

    report = auditor.finalize()
    auditor.detach()
    acc = accuracy(model, test, device, args.max_physical_batch_size)
    report.config["example"] = {
        "script": "examples/cifar10_wrn.py",
        "data": data_name,
        "model": f"WideResNet-{args.depth}-{args.width} (GroupNorm)",
        "parameters": n_params,
        "augmentation": "none",
        "target_epsilon": target,
        "noise_multiplier": sigma,
        "logical_batch_size": args.batch_size,
        "max_physical_batch_size": args.max_physical_batch_size,
        "lr": args.lr,
        "steps_requested": args.steps,
        "steps_run": done,
        "test_accuracy": acc,
        "train_seconds": seconds,
        "device": str(device),
    }
    out = report.save(args.out)
    print(report.summary_text())
    print(f"steps run: {done} of {args.steps} in {seconds:.1f} s; test accuracy {acc:.3f}")
    print(f"report: {Path(out) / 'report.html'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.power_only and args.data is None and not args.fake_data:
        parser.error("one of the arguments --data --fake-data is required (or --power-only)")
    if not args.power_only:
        from dpaudit_torch._requires import require

        require("examples/cifar10_wrn.py", "torchvision", "tqdm")
    try:
        return run(args)
    except DataError as exc:
        print(f"cifar10_wrn.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
