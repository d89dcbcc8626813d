"""The end-to-end demo: DP-SGD on real images with the auditor attached.

Trains a small CNN with Opacus on scikit-learn's bundled 8x8 handwritten digits (1,797 real
images shipped inside the scikit-learn wheel: nothing is downloaded), with a
:class:`~dpaudit_torch.audit.PrivacyAuditor` attached, and writes the audit report.
``bug=`` applies one of :mod:`dpaudit_torch.testing.bugs` to show an early stop.

Library code: it logs, and reports progress through an optional callback; the command line
(:mod:`dpaudit_torch.cli`) owns the terminal and the progress bar.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger(__name__)

__all__ = ["DemoConfig", "DemoResult", "DigitsCNN", "load_digits_tensors", "run_demo"]


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 digits (GroupNorm, so every layer is Opacus-compatible)."""

    def __init__(self, n_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.GroupNorm(4, 32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 2 * 2, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def load_digits_tensors(
    seed: int = 0, test_fraction: float = 0.2
) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled digits as (train, test) datasets of [N, 1, 8, 8] float images."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.4
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


@dataclass(frozen=True)
class DemoConfig:
    """Settings of :func:`run_demo` (the ``dpaudit demo`` flags)."""

    steps: int = 300
    batch_size: int = 64
    lr: float = 0.5
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    delta: float = 1e-5
    alpha: float = 1e-3  # every proof together (the auditor's default; evidence at 0.05)
    seed: int | None = 0
    device: str = "cpu"
    bug: str | None = None
    grad_sample_mode: str = "hooks"
    m_canaries: int | None = None  # the auditor's default, sized to the model
    k_pairs: int = 16


@dataclass
class DemoResult:
    report: Any
    report_dir: Path
    steps_run: int
    test_accuracy: float
    stopped_early: bool


def run_demo(
    config: DemoConfig,
    out_dir: str | Path,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> DemoResult:
    """Train the digits CNN with DP-SGD and the auditor attached; save the report to ``out_dir``.

    ``on_step`` receives, after each training step, a dict with ``step``, ``loss`` and the
    auditor's latest metrics (for the command line's progress bar); ``on_start`` is called once
    the model, Opacus and the auditor are set up (the audit kernels compiled), right before the
    first step.
    """
    from opacus import PrivacyEngine

    from .audit import AuditConfig, PrivacyAuditor
    from .testing import bugs

    if config.steps < 1:
        raise ValueError(f"steps must be >= 1, got {config.steps}")
    if config.bug is not None and config.bug not in bugs.names():
        raise ValueError(f"unknown bug {config.bug!r}; choose one of {bugs.names()}")
    # the audit settings are validated before anything is trained
    audit_config = AuditConfig(
        delta=config.delta,
        alpha=config.alpha,
        seed=config.seed,
        m_canaries=config.m_canaries,
        k_pairs=config.k_pairs,
        # the progress bar shows the claim (read at step 1, then every 50 steps; a PRV read
        # costs about 0.1 s on a 2-core machine)
        claimed_every=50,
    )
    device = torch.device(config.device)
    out = Path(out_dir)

    data_seed = 0 if config.seed is None else config.seed
    torch.manual_seed(data_seed)
    train, test = load_digits_tensors(seed=data_seed)
    model = DigitsCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.0)
    loader = DataLoader(train, batch_size=config.batch_size, shuffle=True)
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.CrossEntropyLoss()
    ghost = config.grad_sample_mode == "ghost"
    with warnings.catch_warnings():
        # Opacus warns that secure_mode is off; the demo does not need a cryptographic RNG
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="prv")
        made = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=config.noise_multiplier,
            max_grad_norm=config.max_grad_norm,
            grad_sample_mode=config.grad_sample_mode,
            criterion=criterion,
        )
    # ghost clipping wraps the loss too: its backward runs the second (clipped) pass
    if ghost:
        model, optimizer, criterion, loader = made
    else:
        model, optimizer, loader = made
    if config.bug is not None:  # an optimizer bug, or a setup bug (new optimizer / loader)
        optimizer, loader = bugs.apply_to_training(engine, optimizer, loader, config.bug)
        logger.info("applied bug %r", config.bug)

    auditor = PrivacyAuditor(engine, optimizer, loader, model=model, config=audit_config)
    step = 0
    stopped_early = False
    model.train()
    if on_start is not None:
        on_start()
    while step < config.steps and not stopped_early:
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad(set_to_none=True)
            logits = model(xb)
            if len(yb) or ghost:  # (ghost's loss takes an empty batch: noise only, loss nan)
                loss = criterion(logits, yb)
            else:  # an empty Poisson batch: zero per-sample rows; Opacus still noises the step
                loss = logits.sum() * 0.0
            with warnings.catch_warnings():
                # Opacus's hooks on the first layer fire although the images need no gradient
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            optimizer.step()
            step += 1
            if on_step is not None:
                metrics = dict(getattr(auditor, "latest_metrics", {}))
                metrics["step"] = step
                metrics["loss"] = loss.item() if len(yb) else math.nan
                on_step(metrics)
            if auditor.should_stop:
                stopped_early = True
                logger.warning("auditor stopped training at step %d: %s", step,
                               "privacy violation proven")
                break
            if step >= config.steps:
                break
    report = auditor.finalize()
    auditor.detach()
    acc = _accuracy(model, test, device)
    report.config.setdefault("demo", {})
    report.config["demo"].update({
        "dataset": "scikit-learn digits (8x8, bundled)",
        "model": "DigitsCNN (2 conv + GroupNorm + linear)",
        "bug": config.bug,
        "test_accuracy": acc,
        "steps_requested": config.steps,
    })
    report_dir = report.save(out)
    return DemoResult(report, Path(report_dir), step, acc, stopped_early)


@torch.no_grad()
def _accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    model.eval()
    x, y = data.tensors
    pred = model(x.to(device)).argmax(dim=1).cpu()
    model.train()
    return float((pred == y).float().mean())
