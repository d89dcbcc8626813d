"""The one-run membership game on the canaries (docs/design.md sections 5-6).

Each of the m one-run canaries is IN with probability 1/2 (a secret coin, revealed only at
finalize) and an IN canary is included at every step with the data loader's Poisson rate, so the
audited mechanism is the one the accountant describes. Its score is the sum over steps of its
value. At finalize the secret is revealed and the whole-run lower bounds registered for this
monitor (:func:`dpaudit_torch.registry.methods_of`) are computed: Steinke, Nasr & Jagielski
(NeurIPS 2023) and the Gaussian-family f-DP test of Mahloujifar, Melis & Chaudhuri (ICML 2025),
by :class:`~dpaudit_torch.stats.one_run.OneRunAudit`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...registry import methods_of
from ..record import StepRecord
from .base import Evidence, Finding, MonitorContext, register_monitor

logger = logging.getLogger(__name__)

__all__ = ["OneRunMonitor"]


@register_monitor("one_run")
class OneRunMonitor:
    """Running scores of the one-run canaries; whole-run bounds at finalize."""

    name = "one_run"

    def __init__(self, ctx: MonitorContext) -> None:
        self.config = ctx.config
        self.m = ctx.m_canaries
        self.device = torch.device(ctx.device)
        self.coins = ctx.coins
        self._warn = ctx.warn
        self.methods = methods_of(self.name)
        self.steps = 0
        self.scores = torch.zeros(self.m, dtype=torch.float64, device=self.device)
        self.bounds: dict[str, float] = {}
        self.details: dict[str, dict[str, Any]] = {}
        self._in_mask: torch.Tensor | None = None

    def observe(self, record: StepRecord) -> None:
        if self.m:
            self.scores += record.one_run
        self.steps += 1

    def advance(self) -> Evidence | None:
        return None  # no evidence during training: the game is played once, at the end

    def log_evidence(self) -> float | None:
        return None

    def finalize(self, claimed_epsilon: float | None) -> None:
        """Reveal the secret coins and compute every whole-run bound of this monitor."""
        self._in_mask = self.coins.reveal()
        scores = self.scores.detach().cpu()
        ins, outs = scores[self._in_mask], scores[~self._in_mask]
        if self.steps == 0 or ins.numel() == 0 or outs.numel() == 0:
            note = "no one-run bound: no audited steps or an empty IN/OUT group"
            for method in self.methods:
                self.bounds[method] = 0.0
                self.details[method] = {"bound": 0.0, "method": method, "note": note}
            return
        from ...stats.one_run import OneRunAudit

        audit = OneRunAudit(ins, outs)
        for method in self.methods:
            try:
                res = audit.epsilon_lower_bound(delta=self.config.delta, alpha=self.config.alpha,
                                                method=method)
                self.bounds[method] = float(res.bound)
                self.details[method] = dict(res.to_dict())
            except Exception as e:  # noqa: BLE001 - report, never crash the end of training
                msg = f"one-run {method} bound failed: {e!r}"
                self._warn(msg)
                self.bounds[method] = 0.0
                self.details[method] = {"bound": 0.0, "method": method, "note": msg}

    def findings(self) -> list[Finding]:
        return []

    def report_section(self) -> dict[str, Any]:
        """The bounds, their details and the scores split by the revealed coins (after
        :meth:`finalize`)."""
        if self._in_mask is None:
            raise RuntimeError("the one-run report section exists only after finalize()")
        scores = self.scores.detach().cpu()
        return {
            "bounds": dict(self.bounds), "details": dict(self.details),
            "scores": {"in": scores[self._in_mask].tolist(),
                       "out": scores[~self._in_mask].tolist()},
            "n_in": int(self._in_mask.sum()),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "scores": self.scores.detach().cpu().clone()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if tuple(sd["scores"].shape) != (self.m,):
            raise ValueError(f"one-run state for {tuple(sd['scores'].shape)} canaries does not "
                             f"fit m={self.m}")
        self.steps = int(sd["steps"])
        self.scores = sd["scores"].to(self.device, torch.float64).clone()
