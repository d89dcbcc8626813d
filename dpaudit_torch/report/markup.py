"""Building blocks of the HTML page: escaping, numbers, generic tables, the names of methods and
testers.

Every value a report carries is written through :func:`esc` (user strings never become markup)
and every number through :func:`~dpaudit_torch.report.formatting.format_number`. A number that is
a report field is tagged with ``data-field`` (its dotted path) and ``data-value`` (its exact JSON
value), so tests and readers can check that the page shows what ``audit.json`` holds. Names come
from :mod:`dpaudit_torch.registry`; a method or tester this version does not know (a report from a
newer writer) is shown under its own name.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from ..registry import TESTERS, bound_method
from .formatting import format_number
from .schema import encode_nonfinite, is_num

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


def kv_section(title: str, anchor: str, data: dict, empty: str, intro: str = "") -> str:
    """A section showing ``data`` as a generic table (``empty`` when there is none), after
    ``intro`` (HTML) when there is data."""
    body = intro + generic(data) if data else f"<p><em>{esc(empty)}</em></p>"
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
