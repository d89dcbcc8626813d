"""The report's ``checks``: one section per monitor, saying what it checked, what it measured,
what it found ("checked, nothing found" or its findings) and what it did not check and why
(docs/report.md, "Checks by monitor").

The sections come from the monitors themselves (their check sections, in the order the monitors
run); this module names none of them: it fills in each section's status from the report's
findings of the same monitor (:func:`with_status`), checks their shape (:func:`check_checks`)
and writes them on the page (:func:`checks_section`), each under the report's label of its
monitor.
"""

from __future__ import annotations

from typing import Any

from .markup import esc, generic, scalar
from .schema import NOT_RUN, NOTHING_FOUND, check_status
from .view import ReportView
from .wording import monitor_label

__all__ = ["with_status", "checks_section"]

def with_status(checks: list[dict[str, Any]], findings: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """``checks`` with each section's ``status`` (the strongest level among its monitor's
    findings, else "not run" or "checked, nothing found") and ``findings`` (level and message
    of each of its monitor's findings, notes included)."""
    out = []
    for sec in checks:
        own = [f for f in findings if f.get("monitor") == sec.get("monitor")]
        out.append({**sec, "status": check_status(sec, findings),
                    "findings": [{"level": f.get("level"), "message": f.get("message")}
                                 for f in own]})
    return out


def _rows(items: list[Any], key: str, value: str, render: Any) -> str:
    return "".join(
        f"<tr><th>{esc(it.get(key))}</th><td>{render(it.get(value))}</td></tr>"
        for it in items if isinstance(it, dict))


def _value(v: Any) -> str:
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
        return "[" + ", ".join(scalar(x) for x in v) + "]"
    return scalar(v) if not isinstance(v, (dict, list)) else generic(v)


def _one(v: ReportView, i: int, sec: dict[str, Any]) -> str:
    name = str(sec.get("monitor"))
    label = monitor_label(name, v.d["monitor_labels"]).split(" (")[0]  # not its violation
    status = str(sec.get("status"))
    css = "ok" if status == NOTHING_FOUND else "" if status == NOT_RUN else "bad"
    found = [f for f in sec.get("findings", []) if isinstance(f, dict)]
    if status == NOT_RUN:
        lead = f"Not run: {esc(sec.get('reason_not_run') or 'no reason recorded')}."
    elif status == NOTHING_FOUND:
        lead = "Checked, nothing found."
    else:
        lead = f"Found ({esc(status)}): see below."
    finds = "".join(f'<li data-level="{esc(f.get("level"))}"><strong>{esc(f.get("level"))}'
                    f"</strong>: {esc(f.get('message'))}</li>" for f in found)
    parts = [f'<div class="check" id="check-{esc(name)}" data-monitor="{esc(name)}">'
             f"<h3>{esc(sec.get('title'))} <small>(monitor: {esc(label)})</small></h3>"
             f'<p class="{css}" data-field="checks.{i}.status" data-value="{esc(status)}">'
             f"{lead}</p>"]
    if finds:
        parts.append(f"<ul>{finds}</ul>")
    for title, key, k, val, render in (
            ("Checked", "checked", "check", "outcome", esc),
            ("Measured", "measured", "quantity", "value", _value),
            ("Not checked", "not_checked", "check", "why", esc)):
        rows = _rows(sec.get(key, []), k, val, render)
        if rows:
            parts.append(f'<table class="kv" data-part="{key}"><caption>{title}</caption>'
                         f"{rows}</table>")
    parts.append("</div>")
    return "".join(parts)


def checks_section(v: ReportView) -> str:
    """The page's "Checks by monitor" section: one block per monitor, in the report's order
    (the order the monitors run)."""
    checks = v.d.get("checks") or []
    if not checks:
        body = ("<p><em>No check section was recorded (a report written before they were, or "
                "built by hand).</em></p>")
    else:
        body = ("<p>Every monitor of the audit, in the order they run: what each checked, "
                "what it measured, what it found, and what it did not check and why.</p>"
                + "".join(_one(v, i, s) for i, s in enumerate(checks)))
    return f'<section id="checks"><h2>Checks by monitor</h2>{body}</section>'
