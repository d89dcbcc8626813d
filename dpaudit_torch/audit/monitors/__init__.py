"""Monitors of the audit engine: each watches the stream of step records and contributes
evidence, findings and a report section (protocol and registry in :mod:`.base`)."""

from .base import (
    MONITORS,
    Evidence,
    Finding,
    Monitor,
    MonitorContext,
    build_monitors,
    register_monitor,
)
from .one_run import OneRunMonitor
from .sequential_pairs import SequentialPairsMonitor, per_step_null_grid  # noqa: I001 (order)

__all__ = ["MONITORS", "Evidence", "Finding", "Monitor", "MonitorContext", "build_monitors",
           "register_monitor", "OneRunMonitor", "SequentialPairsMonitor", "per_step_null_grid"]
