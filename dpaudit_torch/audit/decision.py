"""The decision: one anytime-valid verdict from every monitor's evidence (docs/design.md s. 1).

Each monitor that bets gives, at every check, the log of its e-process after each step it
processed (:class:`~dpaudit_torch.audit.monitors.base.Evidence`). The decision's e-process is
their average (an average of e-processes on the same filtration is an e-process), compared with
two thresholds (docs/design.md, "Two levels of evidence"): 1/alpha_warn ("evidence of a
violation") and 1/alpha, alpha here being the decision's share of the audit's proof level
("violation proven"). By Ville's inequality, P(sup_t E_t >= 1/a) <= a at every threshold a, so a
correct implementation shows evidence with probability at most alpha_warn, and is proven wrong
with probability at most alpha, over the whole run, however long, however often it is looked at.

The decision also keeps the wealth history the report plots, and the violation bookkeeping:
``crossed_at`` (the step whose observation first pushed the average over 1/alpha) and
``violation_step`` (the step at which the decision was available: the first check at or after
the crossing); likewise ``evidence_at`` and ``evidence_step`` for the lower threshold.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .monitors import Evidence

logger = logging.getLogger(__name__)

__all__ = ["Decision", "MONITOR_COLUMN"]

#: the prefix of a betting monitor's column in the history: ``"monitor." + name`` holds the log
#: of its e-process, one of the terms the decision (``combined``) averages; a column appears
#: when the monitor first bets (the points before it hold 0: wealth 1 before any bet)
MONITOR_COLUMN = "monitor."


def _log_mean_exp(stack: np.ndarray) -> np.ndarray:
    top = stack.max(axis=0)
    return top + np.log(np.mean(np.exp(stack - top), axis=0))


class Decision:
    """Averages the monitors' e-processes; evidence at ``alpha_warn``, proof at ``alpha``.

    Args:
        alpha: the level of the proof (the decision's share of the audit's alpha).
        history_stride: keep every ``history_stride``-th step in the history.
        extra_keys: names of the per-step diagnostics the monitors report (history columns).
        alpha_warn: the level of evidence (None: no evidence level below the proof's).
    """

    def __init__(self, alpha: float, history_stride: int, extra_keys: list[str],
                 alpha_warn: float | None = None) -> None:
        self.alpha = alpha
        self.threshold_log = math.log(1.0 / alpha)
        self.alpha_warn = alpha if alpha_warn is None else alpha_warn
        #: log(1 / alpha_warn): evidence of a violation at this (never above the proof's)
        self.evidence_threshold_log = min(math.log(1.0 / self.alpha_warn), self.threshold_log)
        #: the step whose observation first pushed the average over 1/alpha_warn, and the step
        #: at which that was available (the first check at or after it); None before
        self.evidence_at: int | None = None
        self.evidence_step: int | None = None
        self.evidence = False
        self.history_stride = history_stride
        self.log_wealth = 0.0
        self.latest: dict[str, float] = {k: 0.0 for k in extra_keys}
        self.crossed_at: int | None = None
        #: the averaged log-wealth at ``crossed_at`` (what crossed 1/alpha; None before)
        self.crossed_log_wealth: float | None = None
        self.violation_step: int | None = None
        self.violation = False
        self.history: dict[str, list] = {"step": [], "combined": [],
                                         **{k: [] for k in extra_keys}}
        self._last: dict[str, float] = {}  # each monitor's latest log e-value
        #: monitors whose evidence is not averaged (started after the run began, on resume)
        self.excluded: set[str] = set()
        #: monitors that no longer bet: their last log e-value stays in the average
        self.frozen: dict[str, float] = {}
        #: each betting monitor's log e-value at the latest step processed (the history's
        #: ``monitor.<name>`` columns)
        self.monitor_latest: dict[str, float] = {}

    def freeze(self, name: str) -> None:
        """Keep monitor ``name``'s last e-value in the average from now on (a constant
        e-process: the average stays one over the same monitors)."""
        self.frozen[name] = self._last.get(name, 0.0)

    def update(self, evidence: dict[str, Evidence | None] | list[Evidence], now: int) -> bool:
        """Take one check's evidence (by monitor name; a list is named by position); ``now`` is
        the current training step. Returns True when the violation was decided at this check.

        The monitors normally report the same steps; a monitor that has no value at a step (it
        dropped a non-finite step, say) keeps its last value there: its e-process is constant
        where it did not bet, which keeps the average an e-process."""
        if isinstance(evidence, list):
            evidence = {str(i): e for i, e in enumerate(evidence)}
        named = {n: e for n, e in evidence.items()
                 if e is not None and e.steps and n not in self.excluded}
        if named:
            steps = sorted(set().union(*(e.steps for e in named.values())))
            cols, extras = [], {}
            for name, e in named.items():
                if list(e.steps) == steps:  # the common case: a value at every step
                    col = np.asarray(e.log_e, dtype=np.float64)
                    self._last[name] = float(col[-1])
                    cols.append(col)
                    extras.update(e.extra)
                    continue
                idx = np.searchsorted(np.asarray(e.steps), steps, side="right") - 1
                col = np.where(idx >= 0, e.log_e[np.clip(idx, 0, None)],
                               self._last.get(name, 0.0))
                self._last[name] = float(col[-1])
                cols.append(col)
                for k, v in e.extra.items():
                    extras[k] = v[np.clip(idx, 0, None)]
            names = list(named)
            for n, v in self.frozen.items():
                if n not in named:
                    cols.append(np.full(len(steps), v))
                    names.append(n)
            stack = np.stack(cols)
            comb = stack[0] if len(cols) == 1 else _log_mean_exp(stack)
            for s, st in enumerate(steps):
                self.log_wealth = float(comb[s])
                for n, col in zip(names, cols):
                    self.monitor_latest[n] = float(col[s])
                for key, col in extras.items():
                    self.latest[key] = float(col[s])
                if self.log_wealth >= self.evidence_threshold_log and self.evidence_at is None:
                    self.evidence_at = st
                if self.log_wealth >= self.threshold_log and self.crossed_at is None:
                    self.crossed_at = st
                    self.crossed_log_wealth = self.log_wealth
                if st % self.history_stride == 0:
                    self.record(st)
        if self.evidence_at is not None and not self.evidence:
            self.evidence = True
            self.evidence_step = now
            logger.warning("audit decision: evidence of a violation (not a proof) at step %d: "
                           "the e-process reached 1/alpha_warn = %.4g at step %d (proof needs "
                           "1/alpha = %.4g)", now, 1.0 / self.alpha_warn, self.evidence_at,
                           1.0 / self.alpha)
        if self.crossed_at is not None and not self.violation:
            self.violation = True
            self.violation_step = now
            logger.info("audit decision: violation crossed at step %d, decided at step %d",
                        self.crossed_at, self.violation_step)
            return True
        return False

    def record(self, step: int) -> None:
        """Add the current values to the history at ``step`` (once per step)."""
        h = self.history
        if h["step"] and h["step"][-1] == step:
            return
        h["step"].append(int(step))
        h["combined"].append(float(self.log_wealth))
        for key, v in self.latest.items():
            h[key].append(float(v))
        for name, v in self.monitor_latest.items():  # each betting monitor's own term
            col = h.setdefault(MONITOR_COLUMN + name, [0.0] * (len(h["step"]) - 1))
            col.append(float(v))

    def adopt(self, violation: bool, violation_step: int | None, crossed_at: int | None) -> bool:
        """Take another process's decision (DDP: rank 0's); True if it differed from ours."""
        differs = violation != self.violation or (violation and (
            violation_step, crossed_at) != (self.violation_step, self.crossed_at))
        if crossed_at != self.crossed_at:  # the other rank's crossing: its value is not ours
            self.crossed_log_wealth = None
        self.violation, self.violation_step, self.crossed_at = (violation, violation_step,
                                                                crossed_at)
        if violation and not self.evidence:  # a proof is evidence too (1/alpha_warn below it)
            self.evidence, self.evidence_step, self.evidence_at = True, violation_step, crossed_at
        return differs

    def state_dict(self) -> dict[str, Any]:
        return {"log_wealth": self.log_wealth, "latest": dict(self.latest),
                "crossed_at": self.crossed_at, "violation_step": self.violation_step,
                "crossed_log_wealth": self.crossed_log_wealth, "violation": self.violation,
                "evidence": self.evidence, "evidence_at": self.evidence_at,
                "evidence_step": self.evidence_step,
                "last": dict(self._last),
                "excluded": sorted(self.excluded), "frozen": dict(self.frozen),
                "monitor_latest": dict(self.monitor_latest),
                "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, sd: dict[str, Any], lenient: bool = False) -> None:
        """Restore ``sd``. Its history columns must be this decision's, unless ``lenient``
        (a resume with another set of monitors): then the columns both have are restored, a
        column only this decision has is filled with zeros for the earlier points, and a column
        only the state has is dropped."""
        hist = {k: list(v) for k, v in sd["history"].items()}
        # the betting monitors' columns come and go with the monitors that bet: kept as saved
        mine = {k: v for k, v in hist.items() if k.startswith(MONITOR_COLUMN)}
        hist = {k: v for k, v in hist.items() if k not in mine}
        fixed = {k for k in self.history if not k.startswith(MONITOR_COLUMN)}
        if set(hist) != fixed:
            if not lenient:
                raise ValueError(f"decision state has history columns {sorted(hist)}, "
                                 f"this auditor {sorted(fixed)}")
            n = len(hist.get("step", []))
            hist = {k: hist.get(k, [0.0] * n) for k in self.history if k in fixed}
        hist.update(mine)
        self.log_wealth = float(sd["log_wealth"])
        self.latest = {**{k: 0.0 for k in self.latest},
                       **{k: float(v) for k, v in sd["latest"].items() if k in self.latest}}
        self.crossed_at = None if sd["crossed_at"] is None else int(sd["crossed_at"])
        cw = sd.get("crossed_log_wealth")  # absent from states written before it was kept
        self.crossed_log_wealth = None if cw is None else float(cw)
        self.violation_step = (None if sd["violation_step"] is None
                               else int(sd["violation_step"]))
        self.violation = bool(sd["violation"])
        # absent from states written before the two levels: their one level was both
        ev_at, ev_step = sd.get("evidence_at", sd["crossed_at"]), sd.get(
            "evidence_step", sd["violation_step"])
        self.evidence_at = None if ev_at is None else int(ev_at)
        self.evidence_step = None if ev_step is None else int(ev_step)
        self.evidence = bool(sd.get("evidence", sd["violation"]))
        self.history = hist
        self._last = {str(k): float(v) for k, v in sd.get("last", {}).items()}
        self.excluded = set(sd.get("excluded", []))
        self.frozen = {str(k): float(v) for k, v in sd.get("frozen", {}).items()}
        # the betting monitors' latest terms: their last values (absent before they were kept)
        self.monitor_latest = {k[len(MONITOR_COLUMN):]: float(v[-1]) for k, v in mine.items()
                               if v}
        self.monitor_latest.update(sd.get("monitor_latest", {}))
