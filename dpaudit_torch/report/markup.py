"""Building blocks of the HTML page: escaping, numbers, generic tables, and :class:`ReportView`.

Every value a report carries is written through :func:`esc` (user strings never become markup)
and every number through :func:`~dpaudit_torch.report.schema.format_number`. A number that is a
report field is tagged with ``data-field`` (its dotted path) and ``data-value`` (its exact JSON
value), so tests and readers can check that the page shows what ``audit.json`` holds.

:class:`ReportView` holds the validated plain data of one report and the facts the sections
derive from it (method order, ceilings, which bounds may refute the claim). What a bound method
is and may prove is read from :mod:`dpaudit_torch.registry`; a method this version does not know
(a report from a newer writer) is shown under its own name and never counted as refuting.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from ..registry import BOUND_METHODS, ONE_STEP, TESTERS, bound_method, refuting_methods
from .schema import AuditReport, encode_nonfinite, format_number, is_num

__all__ = [
    "esc",
    "json_attr",
    "json_for_script",
    "num",
    "scalar",
    "generic",
    "kv_section",
    "method_label",
    "tester_label",
    "ReportView",
]

#: a list longer than this is summarised in the generic tables
_MAX_LIST = 12
#: a list of records longer than this is only counted
_MAX_ROWS = 200


def esc(value: Any) -> str:
    """Escape any user-provided value for HTML text or attributes."""
    return html.escape(str(value), quote=True)


def json_attr(value: Any) -> str:
    """``value`` as strict JSON, escaped for an attribute."""
    return esc(json.dumps(encode_nonfinite(value), allow_nan=False))


def json_for_script(value: Any) -> str:
    """JSON for a <script type="application/json"> block: "<", ">" and "&" written as \\u
    escapes (still the same JSON), so no string in it can close or open a tag."""
    text = json.dumps(encode_nonfinite(value), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def num(value: Any, field_path: str | None = None) -> str:
    """A formatted number; tagged with ``data-field`` / ``data-value`` when it is a report field."""
    text = esc(format_number(value))
    if field_path is None:
        return text
    return (
        f'<span class="num" data-field="{esc(field_path)}" '
        f'data-value="{json_attr(value)}">{text}</span>'
    )


def scalar(value: Any) -> str:
    """A number (formatted), None, a bool, or any other value as escaped text."""
    if value is None or isinstance(value, (bool, int, float)):
        return num(value)
    return esc(value)


def generic(value: Any, depth: int = 0) -> str:
    """Any plain value as HTML: dicts as nested tables, long lists summarised."""
    if isinstance(value, dict):
        if not value:
            return "<em>empty</em>"
        if depth >= 3:
            return f"<code>{esc(json.dumps(encode_nonfinite(value)))}</code>"
        rows = "".join(
            f"<tr><th>{esc(k)}</th><td>{generic(v, depth + 1)}</td></tr>"
            for k, v in value.items()
        )
        return f'<table class="kv">{rows}</table>'
    if isinstance(value, list):
        if not value:
            return "<em>none</em>"
        if all(is_num(v) for v in value):
            if len(value) <= _MAX_LIST:
                return ", ".join(num(v) for v in value)
            finite = [float(v) for v in value if math.isfinite(float(v))]
            rng = (
                f"from {num(min(finite))} to {num(max(finite))}" if finite else "none finite"
            )
            return f"{len(value)} values, {rng}"
        if all(isinstance(v, dict) for v in value) and len(value) <= _MAX_ROWS:
            # records (e.g. one per parameter tensor): one table, one row each
            keys: list[str] = []
            for v in value:
                keys += [k for k in v if k not in keys]
            head = "".join(f"<th>{esc(k)}</th>" for k in keys)
            body = "".join(
                "<tr>" + "".join(
                    f"<td>{generic(v[k], depth + 1) if k in v else ''}</td>" for k in keys
                ) + "</tr>"
                for v in value
            )
            return f'<table class="records"><tr>{head}</tr>{body}</table>'
        if all(not isinstance(v, (dict, list)) for v in value) and len(value) <= _MAX_LIST:
            return "<br>".join(scalar(v) for v in value)
        if len(value) <= _MAX_LIST:
            return "".join(f"<div>{generic(v, depth + 1)}</div>" for v in value)
        return f"{len(value)} entries"
    return scalar(value)


def kv_section(title: str, anchor: str, data: dict, empty: str) -> str:
    """A section showing ``data`` as a generic table (``empty`` when there is none)."""
    body = generic(data) if data else f"<p><em>{esc(empty)}</em></p>"
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{body}</section>'


def method_label(method: str) -> str:
    """The registry's name of a bound method (the key itself for one this version does not
    know)."""
    spec = bound_method(method)
    return spec.label if spec is not None else method


def tester_label(name: str) -> str:
    """The registry's name of a sequential tester (the key itself for an unknown one)."""
    spec = TESTERS.get(name)
    return spec.label if spec is not None else name


class ReportView:
    """The validated plain data of one report and the facts the page derives from it."""

    def __init__(self, report: AuditReport) -> None:
        self.r = report
        self.d = report.to_dict()  # validated plain data; the page shows exactly these values
        self.level_pct = format_number(100.0 * (1.0 - self.d["alpha"]))

    def methods(self) -> list[str]:
        """Methods with a bound or details: registry order first, unknown ones by name."""
        names = list(self.d["epsilon_lower_bounds"]) + [
            k for k in self.d["lower_bound_details"] if k not in self.d["epsilon_lower_bounds"]
        ]
        order = {m: i for i, m in enumerate(BOUND_METHODS)}
        return sorted(names, key=lambda m: (order.get(m, len(order)), m))

    def detail(self, method: str) -> dict:
        return self.d["lower_bound_details"].get(method, {})

    def one_step(self, method: str) -> bool:
        """Does the bound of ``method`` speak about one training step (the grid of sequential
        tests of docs/design.md section 4) rather than the whole run?"""
        spec = bound_method(method)
        return spec is not None and spec.scope == ONE_STEP

    def may_refute(self, method: str) -> bool:
        """Can this method's bound refute the (eps, delta) claim? Only a family-free bound on the
        whole run can (the registry's rule): the f-DP one-run test assumes the Gaussian trade-off
        family (Mahloujifar, Melis & Chaudhuri, ICML 2025) and the sequential bound is about one
        step. A method this version does not know never counts as refuting."""
        spec = bound_method(method)
        return spec is not None and spec.may_refute

    def ceiling(self, method: str) -> float | None:
        """The largest epsilon the method could have certified (its recorded ``ceiling``; for
        a per-step bound, the largest grid epsilon)."""
        det = self.detail(method)
        c = det.get("ceiling")
        if is_num(c):
            return float(c)
        grid = det.get("grid_epsilons")
        if self.one_step(method) and isinstance(grid, list) and grid and all(
            is_num(g) for g in grid
        ):
            return float(max(grid))
        return None

    def canary_count(self, method: str) -> str:
        det, can = self.detail(method), self.d["canaries"]
        if self.one_step(method):
            k = can.get("k_pairs")
            return f"{num(k)} pairs" if k is not None else num(None)
        m = det.get("m", can.get("m_one_run"))
        total = det.get("m_total")
        if is_num(total) and is_num(m) and total != m:
            return f"{num(m)} of {num(total)}"
        return num(m)

    def threshold_log(self) -> float:
        """log(1/alpha), or the decision threshold the sequential tests recorded."""
        t = self.d["sequential"].get("decision_threshold_log")
        return float(t) if is_num(t) else math.log(1.0 / self.d["alpha"])

    def refuting(self) -> list[str]:
        """Methods whose bound exceeds a finite claimed epsilon and that may refute it."""
        return refuting_methods(self.d["epsilon_lower_bounds"], self.d["claimed_epsilon"])

    def best_ceiling(self) -> tuple[str, float] | None:
        """The highest ceiling among the methods that could refute the claim."""
        best = None
        for m in self.methods():
            if not self.may_refute(m):
                continue
            c = self.ceiling(m)
            if c is not None and (best is None or c > best[1]):
                best = (m, c)
        return best

    def per_step_null_text(self) -> str:
        null = self.d["sequential"].get("per_step_null") or {}
        kind = null.get("type")
        if kind == "gaussian_profile":
            eps = null.get("epsilons") or []
            grid = (
                f" It was tested at {len(eps)} points of that profile (ε from "
                f"{num(min(eps))} to {num(max(eps))})."
                if eps and all(is_num(x) for x in eps) else ""
            )
            return (
                "Per-step null hypothesis: each training step is the Gaussian mechanism with "
                f"noise multiplier σ = {num(null.get('noise_multiplier'))} relative to the "
                "clipping norm, i.e. its privacy profile is that of a correct DP-SGD step."
                + grid
            )
        if kind == "explicit":
            return (
                "Per-step null hypothesis: each training step is "
                f"(ε = {num(null.get('epsilon'))}, δ = {num(null.get('delta'))})-DP."
            )
        return "No per-step null hypothesis was recorded."
