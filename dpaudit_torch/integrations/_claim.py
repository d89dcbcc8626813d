"""The claimed epsilon as the trainer integrations log it: current at their logging steps.

The auditor reads the accountant every ``claimed_every`` steps only (default 1000: a read costs
0.02 s with RDP to 0.5 s with PRV), so ``auditor.latest_metrics["claimed_epsilon"]`` can be the
claim of many steps ago. A trainer logs far more often than that, so the callbacks read the claim
at their own logging steps, through :func:`current_claim`, which reads the accountant only when it
has counted a step since the auditor's last read.
"""

from __future__ import annotations

from typing import Any

__all__ = ["current_claim"]


def current_claim(auditor: Any) -> float | None:
    """The accountant's epsilon at the audit's delta now (None before the first step, or if the
    read failed: the auditor reports that). The auditor's last read when the accountant has
    counted no step since (no cost), else a fresh read, kept in the auditor's claim history as
    its own periodic reads are (``claimed_epsilon_history`` of the report)."""
    engine = auditor.engine
    history = engine.claimed_history
    if history and history[-1][0] == auditor.tap.accountant.steps():
        return history[-1][1]
    return engine.read_claim()
