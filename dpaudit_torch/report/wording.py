"""The words for a proven violation: which monitor(s) decided it and what each found.

The audit's decision averages the e-processes of several monitors; a violation it proves may
therefore be about the noise of one tensor, the batch sizes of the data loader or the per-step
guarantee of the canary pairs. Each monitor whose own anytime-valid test crossed 1/alpha records a
finding of level ``"violation"`` (``monitor``, ``message``, ``where`` and, for a finding about the
per-step guarantee, ``scope`` = :data:`~dpaudit_torch.registry.ONE_STEP`); when none did on its
own, the engine records one for the decision itself. This module turns those findings into the
one sentence that the auditor logs (and raises with), the summary text and the page's verdict box
all use, so the three never disagree.

Monitors are named as the report says (its ``monitor_labels``, filled by the engine, passed here
as ``labels``); this module knows no monitor's name, and a monitor without a label (e.g. in a
report older than schema 1.3) is shown under its own name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..registry import ONE_STEP

__all__ = ["monitor_label", "deciding_findings", "decided_per_step", "deciders_text",
           "violation_message"]


def monitor_label(name: Any, labels: Mapping[str, str] | None = None) -> str:
    """How the report names monitor ``name``: its label in ``labels`` (the report's
    ``monitor_labels``), else the name itself."""
    key = str(name)
    return (labels or {}).get(key, key)


def deciding_findings(findings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The findings of level ``"violation"``: what the deciding monitor(s) established."""
    return [f for f in findings if isinstance(f, Mapping) and f.get("level") == "violation"]


def decided_per_step(findings: Sequence[Mapping[str, Any]]) -> bool:
    """Is a deciding finding about the per-step guarantee (``scope`` is
    :data:`~dpaudit_torch.registry.ONE_STEP`)? Then the report states the per-step null it was
    tested against."""
    return any(f.get("scope") == ONE_STEP for f in deciding_findings(findings))


def deciders_text(findings: Sequence[Mapping[str, Any]], text: Callable[[str], str] = str,
                  labels: Mapping[str, str] | None = None) -> str:
    """``"noise [tensor fc.weight]: too little noise: ...; sampling (...): ..."`` for the
    violation findings, each monitor named by ``labels`` (:func:`monitor_label`), or a sentence
    saying the deciding monitor was not recorded (a report written by hand, or before findings
    existed). ``text`` escapes recorded strings (HTML)."""
    found = deciding_findings(findings)
    if not found:
        return "the deciding monitor was not recorded in this report"
    parts = []
    for f in found:
        where = f" [{text(str(f['where']))}]" if f.get("where") else ""
        parts.append(f"{text(monitor_label(f.get('monitor'), labels))}{where}: "
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
                      log_wealth: float | None = None,
                      labels: Mapping[str, str] | None = None) -> str:
    """The one-line message of a proven violation (logged by the auditor, and the text of its
    :class:`~dpaudit_torch.audit.PrivacyViolationError`): the step, the deciding monitor(s) and
    what each found, e.g. ``"privacy violation proven at training step 12 by the noise monitor
    (anytime-valid decision at level alpha=0.05 ...): noise [tensor fc.weight, ...]: too little
    noise: ..."``. ``labels``: how the report names each monitor (its ``monitor_labels``)."""
    at = "" if step is None else f" at training step {step}"
    wealth = "" if log_wealth is None else f"; wealth exp({log_wealth:.3g}) >= 1/alpha"
    return (f"privacy violation proven{at} by {_monitors_phrase(findings)} (anytime-valid "
            f"decision at level alpha={alpha:g}{wealth}): {deciders_text(findings, labels=labels)}")
