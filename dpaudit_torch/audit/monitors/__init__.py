"""Monitors of the audit engine: each watches the stream of step records and contributes
evidence, findings and a report section (protocol and registry in :mod:`.base`)."""

from .accounting import AccountingMonitor
from .base import (
    MONITORS,
    Evidence,
    Finding,
    Monitor,
    MonitorContext,
    build_monitors,
    register_monitor,
)
from .noise import NoiseMonitor
from .one_run import OneRunMonitor
from .sampling import SamplingMonitor
from .sequential_pairs import SequentialPairsMonitor, per_step_null_grid

#: the monitors a PrivacyAuditor runs, in the order they observe, decide and finalize
DEFAULT_MONITORS = ("sequential_pairs", "noise", "sampling", "one_run", "accounting")

__all__ = ["MONITORS", "Evidence", "Finding", "Monitor", "MonitorContext", "build_monitors",
           "register_monitor", "OneRunMonitor", "SequentialPairsMonitor", "per_step_null_grid",
           "NoiseMonitor", "SamplingMonitor", "AccountingMonitor", "DEFAULT_MONITORS"]
