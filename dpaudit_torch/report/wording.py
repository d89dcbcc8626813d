"""How a proven violation is put into words: which monitor(s) decided it and what failed.

The decision of the white-box audit (:class:`~dpaudit_torch.audit.decision.Decision`) averages
the e-processes of several monitors (the sequential canary pairs, the noise audit, the sampling
audit); a violation it proves may therefore be about the noise of one tensor, the batch sizes of
the data loader or the per-step guarantee of the canary pairs. Each monitor whose own
anytime-valid test crossed 1/alpha records a ``"violation"`` finding (``monitor``, ``message``,
``where``); when none did on its own, the engine records one for the monitor ``"decision"``.
This module turns those findings into the one sentence that the auditor logs (and raises with),
the summary text and the page's verdict box all use, so the three never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["MONITOR_LABELS", "monitor_label", "deciding_findings", "deciders_text",
           "violation_message"]

#: how the report names each monitor, with what its violation is about
MONITOR_LABELS = {
    "sequential_pairs": "sequential pairs (per-step guarantee violated)",
    "noise": "noise",
    "sampling": "sampling (batch sizes not Poisson)",
    "accounting": "accounting",
    "one_run": "one-run",
    "decision": "combined decision (no single monitor on its own)",
}


def monitor_label(name: Any) -> str:
    """The report's name of a monitor (the name itself for one this version does not know)."""
    return MONITOR_LABELS.get(str(name), str(name))


def deciding_findings(findings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The findings of level ``"violation"``: what the deciding monitor(s) established."""
    return [f for f in findings if isinstance(f, Mapping) and f.get("level") == "violation"]


def deciders_text(findings: Sequence[Mapping[str, Any]],
                  text: Callable[[str], str] = str) -> str:
    """``"noise [tensor fc.weight]: too little noise: ...; sampling (...): ..."`` for the
    violation findings, or a sentence saying the deciding monitor was not recorded (a report
    written by hand, or before findings existed). ``text`` escapes recorded strings (HTML)."""
    found = deciding_findings(findings)
    if not found:
        return "the deciding monitor was not recorded in this report"
    parts = []
    for f in found:
        where = f" [{text(str(f['where']))}]" if f.get("where") else ""
        parts.append(f"{text(monitor_label(f.get('monitor')))}{where}: "
                     f"{text(str(f.get('message', '')))}")
    return "; ".join(parts)


def _monitors_phrase(findings: Sequence[Mapping[str, Any]]) -> str:
    names = []
    for f in deciding_findings(findings):
        name = str(f.get("monitor"))
        if name not in names:
            names.append(name)
    if not names:
        return "the audit"
    if len(names) == 1:
        return f"the {names[0]} monitor"
    return "the " + ", ".join(names[:-1]) + f" and {names[-1]} monitors"


def violation_message(findings: Sequence[Mapping[str, Any]], step: int | None, alpha: float,
                      log_wealth: float | None = None) -> str:
    """The one-line message of a proven violation (logged by the auditor, and the text of its
    :class:`~dpaudit_torch.audit.PrivacyViolationError`): the step, the deciding monitor(s) and
    what each found, e.g. ``"privacy violation proven at training step 12 by the noise monitor
    (anytime-valid decision at level alpha=0.05 ...): noise [tensor fc.weight, ...]: too little
    noise: ..."``."""
    at = "" if step is None else f" at training step {step}"
    wealth = "" if log_wealth is None else f"; wealth exp({log_wealth:.3g}) >= 1/alpha"
    return (f"privacy violation proven{at} by {_monitors_phrase(findings)} (anytime-valid "
            f"decision at level alpha={alpha:g}{wealth}): {deciders_text(findings)}")
