"""A monitor's check section: what it checked, what it measured, what it did not check and
why (the report's ``checks``, one section per monitor, docs/report.md "Checks by monitor").

A monitor returns a :class:`CheckSection` from :meth:`Monitor.check_section
<dpaudit_torch.audit.monitors.base.Monitor.check_section>`; the assembly of the report adds its
status and its findings (:func:`section_dict`,
:func:`dpaudit_torch.report.checks.with_status`), so a monitor only says what it did. Sections are
plain data: a new check of a monitor is one more :meth:`CheckSection.check` line.

A monitor's checks that passed may rule out a cause that another monitor's finding names (the
noise check passed: a canary pair violation is then about clipping or scaling, not the noise):
:attr:`CheckSection.rules_out` and :attr:`Finding.causes
<dpaudit_torch.audit.monitors.base.Finding>`, worded by :func:`causes_text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckSection", "causes_text", "outcome_of", "section_dict"]

@dataclass
class CheckSection:
    """What one monitor checked (``checked``: check -> outcome), measured (quantity -> value:
    a number, a list of numbers, a string) and did not check (check -> why); ``ran`` False with
    ``reason_not_run`` when it did not run at all; ``rules_out``: the causes its checks rule out
    when they found nothing (e.g. ``("noise",)``)."""

    title: str
    ran: bool = True
    reason_not_run: str | None = None
    checked: list[tuple[str, str]] = field(default_factory=list)
    measured: list[tuple[str, Any]] = field(default_factory=list)
    not_checked: list[tuple[str, str]] = field(default_factory=list)
    rules_out: tuple[str, ...] = ()

    def check(self, what: str, outcome: str) -> CheckSection:
        self.checked.append((what, outcome))
        return self

    def measure(self, quantity: str, value: Any) -> CheckSection:
        if value is not None:
            self.measured.append((quantity, value))
        return self

    def skip(self, what: str, why: str) -> CheckSection:
        self.not_checked.append((what, why))
        return self


def causes_text(causes: Sequence[str], cleared: Sequence[str] = ()) -> str:
    """``"bad noise, clipping or scaling"``; with ``cleared`` ruled out by checks that passed,
    ``"noise check passed: clipping or scaling"``."""
    rest = [c for c in causes if c not in cleared]
    done = [c for c in causes if c in cleared]

    def either(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]

    if not done or not rest:
        return "bad " + either(list(causes))
    return f"{' and '.join(done)} check{'s' if len(done) > 1 else ''} passed: {either(rest)}"


def outcome_of(summary: dict[str, Any] | None, unit: str = "step") -> str:
    """The outcome of an anytime-valid test from its summary (``rejected``, ``rejected_at``,
    ``log_wealth``, ``max_log_wealth``, ``n_steps``)."""
    if not summary:
        return "not run"
    if summary.get("rejected"):
        at = summary.get("rejected_at")
        return f"rejected (after {at} {unit}s)" if at is not None else "rejected"
    parts = []
    if summary.get("n_steps") is not None:
        parts.append(f"{summary['n_steps']} steps")
    lw = summary.get("log_wealth")
    if isinstance(lw, (int, float)):
        parts.append(f"log-wealth {lw:.3g}")
    mx = summary.get("max_log_wealth")
    if isinstance(mx, (int, float)):
        parts.append(f"largest {mx:.3g}")
    return "not rejected" + (f" ({', '.join(parts)})" if parts else "")


def section_dict(name: str, sec: CheckSection) -> dict[str, Any]:
    """The report's section of monitor ``name`` (its status and findings are filled in from the
    report's findings by :func:`dpaudit_torch.report.checks.with_status`)."""
    return {
        "monitor": name, "title": sec.title, "ran": sec.ran,
        "reason_not_run": None if sec.ran else sec.reason_not_run,
        "checked": [{"check": c, "outcome": o} for c, o in sec.checked],
        "measured": [{"quantity": q, "value": v} for q, v in sec.measured],
        "not_checked": [{"check": c, "why": w} for c, w in sec.not_checked],
    }
