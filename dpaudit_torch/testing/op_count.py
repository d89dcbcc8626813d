"""Counting the dispatcher operations the auditor adds to a training step (docs/auditor.md,
"Cost").

The auditor's per-step work must not grow with the number of parameter tensors: it reads every
tensor's canary and noise-audit coordinates, watches every parameter and buffer and adds the
canaries' clipped sums, and each of those done as one operation per tensor costs a model of
hundreds of tensors thousands of operations per step. This module counts them the way a
profiler shows them: the **top-level** ``aten::`` operations of ``torch.profiler`` (those not
called from inside another ``aten::`` operation). On the CPU they are host dispatch work; on
the accelerator's code path (``testing.host_sync.force_device_path``, which runs on the CPU)
each stands for a kernel launch. Counts are deterministic: tests pin them, never a time.

:func:`added_ops_per_step` runs an audited and an unaudited twin of one training set-up (the
same seeds, data and steps) and returns the difference per step, averaged over whole check
intervals (``steps`` a multiple of the auditor's ``check_every``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["top_level_ops", "added_ops_per_step", "OpCount", "layer_stack"]


def layer_stack(blocks: int = 40, width: int = 16, classes: int = 10) -> torch.nn.Module:
    """The many-tensor model of the cost tests and benchmarks: ``blocks`` x (Linear
    ``width`` x ``width``, GroupNorm(4, ``width``), ReLU) and a linear head; 4 blocks + 2
    parameter tensors (162 for 40 blocks), every one small, so that per-tensor work shows."""
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.GroupNorm(4, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def top_level_ops(fn: Callable[[], object]) -> Counter[str]:
    """The top-level ``aten::`` operations ``fn()`` runs, by name (every thread the profiler
    sees: the auditor's host thread included)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    counts: Counter[str] = Counter()
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            counts[e.name] += 1
    return counts


@dataclass(frozen=True)
class OpCount:
    """Top-level operations per step added by the auditor, and by which operation."""

    per_step: float
    steps: int
    by_op: dict[str, float]

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The ``n`` operations adding the most per step."""
        return sorted(self.by_op.items(), key=lambda kv: -abs(kv[1]))[:n]


def added_ops_per_step(run: Callable[[bool], Callable[[int], None]], steps: int,
                       warmup: int = 5) -> OpCount:
    """The auditor's added top-level operations per step.

    ``run(audited)`` builds one twin (audited or not) and returns a function that trains it
    for a given number of steps; both twins are warmed up for ``warmup`` steps (the auditor's
    one-time work at its first steps is not per-step work), then ``steps`` steps of each are
    counted. ``steps`` should be a multiple of the auditor's check interval."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    got: dict[bool, Counter[str]] = {}
    for audited in (True, False):
        train = run(audited)
        train(warmup)
        got[audited] = top_level_ops(lambda t=train: t(steps))
    diff = Counter(got[True])
    diff.subtract(got[False])
    total = sum(got[True].values()) - sum(got[False].values())
    return OpCount(total / steps, steps, {k: v / steps for k, v in diff.items() if v})
