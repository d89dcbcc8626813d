"""The monitors of the audit engine: each watches the stream of step records and contributes
evidence, findings and its part of the report (what a monitor is, and the registry:
:mod:`.base`). Importing a monitor's module registers it; the order of the imports below is the
order in which the monitors observe, decide and finalize. A new monitor is one module in this
package and one import line here (CONTRIBUTING.md, "A new monitor")."""

from .base import (
    MONITORS,
    Contribution,
    Evidence,
    Finding,
    Monitor,
    MonitorConfig,
    MonitorContext,
    build_monitors,
    monitor_names,
    plain_state,
    register_monitor,
)

# the registry: one line per monitor, in the order they run
# isort: off
from .sequential_pairs import SequentialPairsMonitor, per_step_null_grid
from .noise import NoiseMonitor
from .sampling import SamplingMonitor
from .one_run import OneRunMonitor
from .accounting import AccountingMonitor
from .coverage import CoverageMonitor  # noqa: F401 - registered on import
from .setup import SetupMonitor
# isort: on

#: the monitors an audit runs unless its configuration says otherwise, in registry order
DEFAULT_MONITORS = monitor_names()

__all__ = ["MONITORS", "Contribution", "Evidence", "Finding", "Monitor", "MonitorConfig",
           "MonitorContext", "build_monitors", "monitor_names", "plain_state",
           "register_monitor", "OneRunMonitor", "SequentialPairsMonitor", "per_step_null_grid",
           "NoiseMonitor", "SamplingMonitor", "AccountingMonitor", "SetupMonitor",
           "DEFAULT_MONITORS"]
