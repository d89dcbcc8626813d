"""Contract bugs of the release clause (:mod:`dpaudit_torch.testing.training`): something of
the model that training changes changes outside the DP release.

Each class edits a :class:`~dpaudit_torch.testing.training.Training` the way real training code
does; the model handed to the auditor is the one trained. The coverage monitor
(docs/monitors/coverage.md) reports each at ``finalize()`` (level ``finding``).
"""

from __future__ import annotations

import torch
from torch import nn

from .training import ContractBug, Training

__all__ = ["CLASSES"]


def _inner(tr: Training) -> nn.Module:
    """The user's model inside Opacus's (and DDP's) wrappers."""
    m = tr.model
    while hasattr(m, "_module") or hasattr(m, "module"):
        m = getattr(m, "_module", None) or m.module
    return m


def _head(tr: Training) -> nn.Module:
    """The model's last linear layer (the head a user fine-tunes)."""
    return [m for m in _inner(tr).modules() if isinstance(m, nn.Linear)][-1]


def _second_optimizer(tr: Training) -> Training:
    # a second, non-private optimizer over the head, created from the model's parameters (a
    # "faster head" trick): it steps with the head's non-private gradient every iteration
    extra = torch.optim.SGD(_head(tr).parameters(), lr=0.05)
    tr.between.append(extra.step)
    return tr


def _manual_update(tr: Training) -> Training:
    # a hand-written update of the head's bias from its non-private gradient, through .data
    # (which bumps no version counter)
    bias = _head(tr).bias

    def update() -> None:
        if bias.grad is not None:
            bias.data.add_(bias.grad, alpha=-0.1)

    tr.between.append(update)
    return tr


class _RunningInputStats(nn.Module):
    """Keeps the running mean and variance of the model's inputs (per pixel), updated in every
    forward pass from the data; the buffers are part of the trained model's state."""

    def __init__(self, shape: torch.Size, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))

    def update(self, x: torch.Tensor) -> None:
        if x.shape[0] == 0:
            return
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(x.mean(0), alpha=m)
            # a re-assignment, as many hand-written modules do
            self.running_var = (1 - m) * self.running_var + m * x.var(0, unbiased=False)


def _running_stats_buffer(tr: Training) -> Training:
    inner = _inner(tr)
    first = next(m for m in inner.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    shape = torch.Size([1, 8, 8]) if isinstance(first, nn.Conv2d) else \
        torch.Size([first.in_features])
    stats = _RunningInputStats(shape)
    inner.add_module("input_stats", stats)
    inner.register_forward_pre_hook(lambda _m, args: stats.update(args[0]))
    return tr


def _group_misses_a_tensor(tr: Training) -> Training:
    # the DP optimizer's param groups miss the head's bias (built from a filtered list), and a
    # second optimizer steps it with its non-private gradient
    bias = _head(tr).bias
    for group in tr.optimizer.param_groups:
        group["params"] = [p for p in group["params"] if p is not bias]
    extra = torch.optim.SGD([bias], lr=0.1)

    def step() -> None:
        extra.step()
        extra.zero_grad()
        bias.grad_sample = None  # Opacus's zero_grad clears only what the DP optimizer holds

    tr.between.append(step)
    return tr


#: name -> bug, in the order the detection benchmark runs them
CLASSES: dict[str, ContractBug] = {b.name: b for b in (
    ContractBug("second-optimizer", "release",
                "a second, non-private SGD over the head's parameters (created from the model) "
                "is stepped in the training loop besides the DP optimizer",
                _second_optimizer, per_step=False),
    ContractBug("manual-update", "release",
                "the head's bias is updated by hand in the loop from its non-private gradient "
                "(bias.data.add_(bias.grad, alpha=-lr))",
                _manual_update, per_step=False),
    ContractBug("running-stats-buffer", "release",
                "a module of the model keeps the running mean and variance of its inputs in "
                "buffers, updated in forward from the data (one in place, one re-assigned)",
                _running_stats_buffer, per_step=False),
    ContractBug("group-misses-tensor", "release",
                "the DP optimizer's param groups miss the head's bias, which a second "
                "non-private optimizer steps",
                _group_misses_a_tensor, per_step=False),
)}
