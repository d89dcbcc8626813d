"""The audit report: one archivable record of a privacy audit (``audit.json`` + ``report.html``).

:class:`AuditReport` is a plain dataclass of JSON-able fields (schema documented field by field in
``docs/report.md``). :class:`~dpaudit_torch.hook.PrivacyAuditor` builds one in ``finalize()``;
anyone can build one piecemeal (every field has a default), e.g. for a black-box audit.

The numbers it carries come from:

* the one-run guessing game of Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
  Training Run" (NeurIPS 2023) -- method ``"steinke"`` -- and its f-DP refinement by Mahloujifar,
  Melis and Chaudhuri, "Auditing f-Differential Privacy in One Run" (2024) -- method ``"fdp"``;
* the sequential (anytime-valid) tests by betting of Gonzalez et al. (2025) and Kutta et al. (2026)
  -- method ``"sequential"``, a lower bound on the epsilon of ONE training step, not of the run.

Every epsilon here is a statistical LOWER bound: the report can prove a privacy claim false; it can
never prove a claim true.

JSON encoding: ``audit.json`` is strict JSON (RFC 8259). Non-finite floats, which strict JSON cannot
hold, are written as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"`` and read back as
floats, wherever they occur.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import logging
import math
import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from numbers import Integral, Real
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "AuditReport",
    "SCHEMA_VERSION",
    "JSON_NAME",
    "HTML_NAME",
    "format_number",
    "library_versions",
]

#: version of the ``audit.json`` schema written by this module (see docs/report.md)
SCHEMA_VERSION = "1.0"
#: file names written by :meth:`AuditReport.save`
JSON_NAME = "audit.json"
HTML_NAME = "report.html"

VERDICT_REFUTED = "claim refuted"
VERDICT_NOTHING = "nothing found"

_NONFINITE_TO_STR = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def library_versions() -> dict[str, str]:
    """Versions of the libraries an audit depends on (read from package metadata, no import)."""
    from . import __version__

    return {
        "dpaudit_torch": __version__,
        "torch": _dist_version("torch"),
        "opacus": _dist_version("opacus"),
        "python": platform.python_version(),
    }


def format_number(value: Any) -> str:
    """The one way the report writes a number (HTML, summary text); tests compare against it.

    ``None`` -> ``"n/a"``; booleans -> ``"yes"``/``"no"``; integers as is; floats with 4
    significant digits (``inf`` -> ``"∞"``, ``nan`` -> ``"NaN"``).
    """
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        return f"{v:.4g}"
    return str(value)


# ----------------------------------------------------------------------------------------------
# plain-type conversion and validation
# ----------------------------------------------------------------------------------------------


def _plain(obj: Any, where: str) -> Any:
    """Recursively turn numpy / torch / tuple values into plain JSON-able Python values."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, Integral):
        return int(obj)
    if isinstance(obj, Real):
        return float(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    # numpy arrays / scalars and torch tensors without importing either
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and type(obj).__module__.split(".")[0] in ("numpy", "torch"):
        if hasattr(obj, "detach"):
            obj = obj.detach().cpu()
        return _plain(obj.tolist(), where)
    raise ValueError(f"{where}: value {obj!r} of type {type(obj).__name__} is not JSON-able")


def _encode_nonfinite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else _NONFINITE_TO_STR[obj]
    if isinstance(obj, dict):
        return {k: _encode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode_nonfinite(v) for v in obj]
    return obj


def _decode_nonfinite(obj: Any) -> Any:
    if isinstance(obj, str) and obj in _STR_TO_NONFINITE:
        return _STR_TO_NONFINITE[obj]
    if isinstance(obj, dict):
        return {k: _decode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_nonfinite(v) for v in obj]
    return obj


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _need(cond: bool, name: str, expected: str, value: Any) -> None:
    if not cond:
        raise ValueError(
            f"AuditReport field {name!r} must be {expected}, got {value!r} "
            f"({type(value).__name__})"
        )


def _check_fields(d: dict[str, Any]) -> None:
    """Type and range checks of a plain report dict; ValueError naming the field and value."""
    g = d.get
    _need(isinstance(g("created_at"), str), "created_at", "an ISO-8601 string", g("created_at"))
    try:
        _dt.datetime.fromisoformat(d["created_at"])
    except ValueError:
        raise ValueError(
            f"AuditReport field 'created_at' must be an ISO-8601 time, got {d['created_at']!r}"
        ) from None
    ce = g("claimed_epsilon")
    _need(
        ce is None or (_is_num(ce) and (ce >= 0 or math.isnan(ce))),
        "claimed_epsilon", "None or a number >= 0 (inf allowed)", ce,
    )
    _need(_is_num(g("delta")) and 0.0 <= g("delta") < 1.0, "delta", "a number in [0, 1)",
          g("delta"))
    _need(_is_num(g("alpha")) and 0.0 < g("alpha") < 1.0, "alpha", "a number in (0, 1)",
          g("alpha"))
    _need(g("accountant") is None or isinstance(g("accountant"), str), "accountant",
          "None or a string", g("accountant"))
    lb = g("epsilon_lower_bounds")
    _need(isinstance(lb, dict), "epsilon_lower_bounds", "a dict {method: epsilon}", lb)
    for k, v in lb.items():
        _need(_is_num(v) and (v >= 0 or math.isnan(v)), f"epsilon_lower_bounds.{k}",
              "a number >= 0", v)
    det = g("lower_bound_details")
    _need(isinstance(det, dict), "lower_bound_details", "a dict {method: dict}", det)
    for k, v in det.items():
        _need(isinstance(v, dict), f"lower_bound_details.{k}", "a dict", v)
    for name in ("claim_refuted", "violation", "stopped_early"):
        _need(isinstance(g(name), bool), name, "a bool", g(name))
    vs = g("violation_step")
    _need(vs is None or (isinstance(vs, int) and not isinstance(vs, bool) and vs >= 0),
          "violation_step", "None or an int >= 0", vs)
    if vs is not None and not d["violation"]:
        raise ValueError(
            f"AuditReport field 'violation_step' is {vs!r} but 'violation' is False"
        )
    wh = g("wealth_history")
    _need(isinstance(wh, dict), "wealth_history", "a dict {series: list}", wh)
    for k, v in wh.items():
        _need(isinstance(v, list) and all(_is_num(x) for x in v), f"wealth_history.{k}",
              "a list of numbers", v if not isinstance(v, list) else "a list with non-numbers")
    sc = g("one_run_scores")
    _need(isinstance(sc, dict), "one_run_scores", "a dict {'in': list, 'out': list}", sc)
    for k, v in sc.items():
        _need(isinstance(v, list) and all(_is_num(x) for x in v), f"one_run_scores.{k}",
              "a list of numbers", v if not isinstance(v, list) else "a list with non-numbers")
    for name in ("sequential", "canaries", "training", "threat_model", "interference", "config",
                 "versions"):
        _need(isinstance(g(name), dict), name, "a dict", g(name))
    _need(isinstance(g("seed_policy"), str), "seed_policy", "a string", g("seed_policy"))
    w = g("warnings")
    _need(isinstance(w, list) and all(isinstance(x, str) for x in w), "warnings",
          "a list of strings", w)


def _check_schema_version(version: Any) -> None:
    if not isinstance(version, str):
        raise ValueError(f"audit report 'schema_version' must be a string, got {version!r}")
    major = version.split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise ValueError(
            f"unsupported audit report schema_version {version!r}: this dpaudit_torch reads "
            f"{SCHEMA_VERSION.split('.')[0]}.x (writes {SCHEMA_VERSION})"
        )


def _minor(version: str) -> int:
    parts = version.split(".")
    try:
        return int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ValueError(f"malformed audit report schema_version {version!r}") from None


# ----------------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------------


@dataclass
class AuditReport:
    """Result of a privacy audit: claimed epsilon beside audited lower bounds, and how it was run.

    Every field is a plain JSON-able value and has a default, so a report can be built piecemeal.
    The schema is documented field by field in ``docs/report.md`` (version :data:`SCHEMA_VERSION`).

    Lower bounds hold with probability at least ``1 - alpha`` over the audit's randomness
    (canary coins); they can prove a claim false, never true.
    """

    schema_version: str = SCHEMA_VERSION
    created_at: str = field(default_factory=_utc_now)
    claimed_epsilon: float | None = None
    delta: float = 1e-5
    alpha: float = 0.05
    accountant: str | None = None
    epsilon_lower_bounds: dict[str, float] = field(default_factory=dict)
    lower_bound_details: dict[str, dict] = field(default_factory=dict)
    claim_refuted: bool = False
    violation: bool = False
    violation_step: int | None = None
    stopped_early: bool = False
    sequential: dict = field(default_factory=dict)
    wealth_history: dict[str, list] = field(default_factory=dict)
    one_run_scores: dict[str, list[float]] = field(default_factory=dict)
    canaries: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    threat_model: dict = field(default_factory=dict)
    interference: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    seed_policy: str = ""
    versions: dict = field(default_factory=library_versions)
    warnings: list[str] = field(default_factory=list)

    # -- plain data ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict of every field (numpy / torch values converted), validated.

        Raises:
            ValueError: a field has a wrong type or value (the message names it).
        """
        d = {f.name: _plain(getattr(self, f.name), f.name) for f in dataclasses.fields(self)}
        _check_schema_version(d["schema_version"])
        _check_fields(d)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON of :meth:`to_dict` (non-finite floats as "Infinity"/"-Infinity"/"NaN")."""
        return json.dumps(
            _encode_nonfinite(self.to_dict()), indent=indent, allow_nan=False, ensure_ascii=False
        )

    @classmethod
    def from_dict(cls, d: Any) -> AuditReport:
        """Build a report from :meth:`to_dict` output (or parsed ``audit.json``), validating it.

        Accepts any ``1.x`` schema version; fields unknown to this version are ignored (with a
        logged warning) only if the document declares a newer minor version.

        Raises:
            ValueError: not a dict, missing or unsupported ``schema_version``, unknown fields,
                or a field of the wrong type / out of range (the message names it).
        """
        if not isinstance(d, dict):
            raise ValueError(f"an audit report must be a JSON object, got {type(d).__name__}")
        if "schema_version" not in d:
            raise ValueError("not an audit report: no 'schema_version' field")
        version = d["schema_version"]
        _check_schema_version(version)
        d = _decode_nonfinite(d)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            if _minor(version) > _minor(SCHEMA_VERSION):
                logger.warning(
                    "reading audit report schema %s as %s: ignoring fields %s",
                    version, SCHEMA_VERSION, unknown,
                )
            else:
                raise ValueError(f"unknown audit report field(s) {unknown} in schema {version}")
        kwargs = {k: v for k, v in d.items() if k in names}
        if _minor(version) > _minor(SCHEMA_VERSION):
            # the object holds what this version understood, and says so when saved again
            kwargs["schema_version"] = SCHEMA_VERSION
        report = cls(**kwargs)
        report.to_dict()  # validates every field
        return report

    # -- files -----------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``audit.json`` and a self-contained ``report.html`` into ``directory``.

        The directory is created if needed. Returns the directory as a :class:`~pathlib.Path`.

        Raises:
            ValueError: the report does not validate.
            OSError: the directory cannot be created or written.
        """
        out = Path(directory)
        text = self.to_json()
        page = self.to_html()
        out.mkdir(parents=True, exist_ok=True)
        _atomic_write(out / JSON_NAME, text + "\n")
        _atomic_write(out / HTML_NAME, page)
        logger.info("audit report written to %s", out)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AuditReport:
        """Read a report from ``audit.json`` or from the directory that holds it.

        Raises:
            FileNotFoundError: no such file (or no ``audit.json`` in the directory).
            ValueError: the file is not valid JSON or not a valid audit report.
        """
        p = Path(path)
        if p.is_dir():
            p = p / JSON_NAME
        if not p.is_file():
            raise FileNotFoundError(f"no audit report at {str(p)!r}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{str(p)!r} is not UTF-8 text: {exc}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{str(p)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from None
        try:
            return cls.from_dict(d)
        except ValueError as exc:
            raise ValueError(f"{str(p)!r}: {exc}") from None

    # -- reading ---------------------------------------------------------------------------------

    @property
    def verdict(self) -> str:
        """``"claim refuted"``, ``"violation proven at step N"`` or ``"nothing found"``.

        A refuted claim (a valid lower bound on the whole run's epsilon above the claimed epsilon)
        takes precedence; a sequential violation is about one training step's privacy.
        """
        if self.claim_refuted:
            return VERDICT_REFUTED
        if self.violation:
            if self.violation_step is None:
                return "violation proven"
            return f"violation proven at step {self.violation_step}"
        return VERDICT_NOTHING

    def summary_text(self) -> str:
        """A few plain-language lines: verdict, claimed epsilon, each lower bound."""
        level = format_number(100.0 * (1.0 - self.alpha))
        lines = [f"Verdict: {self.verdict}."]
        claim = format_number(self.claimed_epsilon)
        acc = f" (accountant: {self.accountant})" if self.accountant else ""
        lines.append(f"Claimed epsilon: {claim} at delta={format_number(self.delta)}{acc}.")
        if self.epsilon_lower_bounds:
            for method, bound in self.epsilon_lower_bounds.items():
                scope = {
                    "sequential": "one training step",
                    "fdp": "the whole training run, Gaussian family",
                }.get(method, "the whole training run")
                lines.append(
                    f"Audited lower bound ({method}, for {scope}): epsilon >= "
                    f"{format_number(bound)} with {level}% confidence."
                )
        else:
            lines.append("No lower bound was computed.")
        if self.claim_refuted:
            lines.append(
                "A valid lower bound exceeds the claimed epsilon: the claim is false "
                "(with the stated confidence)."
            )
        if self.violation:
            at = "" if self.violation_step is None else f" at training step {self.violation_step}"
            stop = " Training was stopped early." if self.stopped_early else ""
            lines.append(
                f"The sequential test proved{at} that a training step is less private than "
                f"claimed.{stop}"
            )
        if not self.claim_refuted and not self.violation:
            lines.append(
                "Nothing found is not a proof of privacy: these are lower bounds, and this "
                "audit could only have detected leaks up to its ceiling."
            )
        return "\n".join(lines)

    def to_html(self) -> str:
        """The self-contained HTML page (no network access; plots inline)."""
        return _render_html(self)


def _render_html(report: AuditReport) -> str:
    return _HtmlPage(report).render()


# ----------------------------------------------------------------------------------------------
# the HTML page
# ----------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif;
       color: #1d2128; background: #fff; margin: 0; line-height: 1.45; }
main { max-width: 72rem; margin: 0 auto; padding: 1.2rem 1.5rem 3rem; }
h1 { font-size: 1.6rem; margin: 0.2rem 0; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #d8dde3;
     padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
.meta { color: #5a6270; font-size: 0.9rem; margin: 0; }
.verdict { border-radius: 6px; padding: 0.8rem 1.1rem; margin: 1.2rem 0; border: 2px solid; }
.verdict h2 { border: none; margin: 0 0 0.4rem; font-size: 1.45rem; }
.verdict-refuted, .verdict-violation { background: #fdecea; border-color: #c62828; }
.verdict-nothing { background: #eef3f8; border-color: #51667d; }
.callout { background: #fff8e1; border-left: 4px solid #f0a500; padding: 0.5rem 0.8rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.92rem; }
th, td { border: 1px solid #d8dde3; padding: 0.3rem 0.55rem; text-align: left;
         vertical-align: top; }
th { background: #f3f5f7; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { width: 14rem; }
table.kv table { margin: 0; }
.wide { overflow-x: auto; }
.bad { color: #b71c1c; font-weight: 600; }
.ok { color: #2e7d32; }
figure { margin: 1rem 0 1.5rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6ea; }
figcaption { font-size: 0.9rem; color: #3b4250; margin-top: 0.3rem; }
.nodata { border: 1px dashed #9aa3ad; color: #5a6270; padding: 1.2rem; text-align: center;
          background: #fafbfc; }
.notes { font-size: 0.85rem; color: #6b4f00; }
ul.warnings li { color: #6b4f00; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.86rem; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; }
footer { margin-top: 2.5rem; font-size: 0.85rem; color: #5a6270; }
@media print { .verdict { break-inside: avoid; } figure { break-inside: avoid; } }
"""

#: human names of the lower-bound methods
_METHOD_NAMES = {
    "steinke": "Steinke et al. one-run (2023)",
    "fdp": "f-DP one-run, Gaussian family (Mahloujifar et al.)",
    "sequential": "sequential tests by betting",
}
_METHOD_ORDER = ("steinke", "fdp", "sequential")
_LABEL_TESTS = {"mmd": "MMD (González et al. 2025)", "hockey_stick": "hockey-stick"}
#: a list longer than this is summarised in the generic tables
_MAX_LIST = 12
#: a list of records longer than this is only counted
_MAX_ROWS = 200


def _e(value: Any) -> str:
    """Escape any user-provided value for HTML text or attributes."""
    return html.escape(str(value), quote=True)


def _json_attr(value: Any) -> str:
    return _e(json.dumps(_encode_nonfinite(value), allow_nan=False))


def _json_for_script(value: Any) -> str:
    """JSON for a <script type="application/json"> block: "<", ">" and "&" written as \\u
    escapes (still the same JSON), so no string in it can close or open a tag."""
    text = json.dumps(_encode_nonfinite(value), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _num(value: Any, field_path: str | None = None) -> str:
    """A formatted number; tagged with ``data-field`` / ``data-value`` when it is a report field."""
    text = _e(format_number(value))
    if field_path is None:
        return text
    return (
        f'<span class="num" data-field="{_e(field_path)}" '
        f'data-value="{_json_attr(value)}">{text}</span>'
    )


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return _num(value)
    return _e(value)


def _generic(value: Any, depth: int = 0) -> str:
    """Any plain value as HTML: dicts as nested tables, long lists summarised."""
    if isinstance(value, dict):
        if not value:
            return "<em>empty</em>"
        if depth >= 3:
            return f"<code>{_e(json.dumps(_encode_nonfinite(value)))}</code>"
        rows = "".join(
            f"<tr><th>{_e(k)}</th><td>{_generic(v, depth + 1)}</td></tr>"
            for k, v in value.items()
        )
        return f'<table class="kv">{rows}</table>'
    if isinstance(value, list):
        if not value:
            return "<em>none</em>"
        if all(_is_num(v) for v in value):
            if len(value) <= _MAX_LIST:
                return ", ".join(_num(v) for v in value)
            finite = [float(v) for v in value if math.isfinite(float(v))]
            rng = (
                f"from {_num(min(finite))} to {_num(max(finite))}" if finite else "none finite"
            )
            return f"{len(value)} values, {rng}"
        if all(isinstance(v, dict) for v in value) and len(value) <= _MAX_ROWS:
            # records (e.g. one per parameter tensor): one table, one row each
            keys: list[str] = []
            for v in value:
                keys += [k for k in v if k not in keys]
            head = "".join(f"<th>{_e(k)}</th>" for k in keys)
            body = "".join(
                "<tr>" + "".join(
                    f"<td>{_generic(v[k], depth + 1) if k in v else ''}</td>" for k in keys
                ) + "</tr>"
                for v in value
            )
            return f'<table class="records"><tr>{head}</tr>{body}</table>'
        if all(not isinstance(v, (dict, list)) for v in value) and len(value) <= _MAX_LIST:
            return "<br>".join(_scalar(v) for v in value)
        if len(value) <= _MAX_LIST:
            return "".join(f"<div>{_generic(v, depth + 1)}</div>" for v in value)
        return f"{len(value)} entries"
    return _scalar(value)


def _kv_section(title: str, anchor: str, data: dict, empty: str) -> str:
    body = _generic(data) if data else f"<p><em>{_e(empty)}</em></p>"
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{body}</section>'


class _HtmlPage:
    """Builds the self-contained page for one report (see docs/report.md, "Reading the report")."""

    def __init__(self, report: AuditReport) -> None:
        self.r = report
        self.d = report.to_dict()  # validated plain data; the page shows exactly these values
        self.level_pct = format_number(100.0 * (1.0 - self.d["alpha"]))

    # -- derived facts -------------------------------------------------------------------------

    def methods(self) -> list[str]:
        names = list(self.d["epsilon_lower_bounds"]) + [
            k for k in self.d["lower_bound_details"] if k not in self.d["epsilon_lower_bounds"]
        ]
        order = {m: i for i, m in enumerate(_METHOD_ORDER)}
        return sorted(names, key=lambda m: (order.get(m, len(order)), m))

    def detail(self, method: str) -> dict:
        return self.d["lower_bound_details"].get(method, {})

    def ceiling(self, method: str) -> float | None:
        det = self.detail(method)
        c = det.get("ceiling")
        if _is_num(c):
            return float(c)
        grid = det.get("grid_epsilons")
        if method == "sequential" and isinstance(grid, list) and grid and all(
            _is_num(g) for g in grid
        ):
            return float(max(grid))
        return None

    def canary_count(self, method: str) -> str:
        det, can = self.detail(method), self.d["canaries"]
        if method == "sequential":
            k = can.get("k_pairs")
            return f"{_num(k)} pairs" if k is not None else _num(None)
        m = det.get("m", can.get("m_one_run"))
        total = det.get("m_total")
        if _is_num(total) and _is_num(m) and total != m:
            return f"{_num(m)} of {_num(total)}"
        return _num(m)

    def threshold_log(self) -> float:
        t = self.d["sequential"].get("decision_threshold_log")
        return float(t) if _is_num(t) else math.log(1.0 / self.d["alpha"])

    def family_free(self, method: str) -> bool:
        """Can this whole-run method refute an (eps, delta) claim? Only family-free bounds can:
        the f-DP one-run test assumes the Gaussian trade-off family (Mahloujifar et al.)."""
        if method == "sequential" or method == "fdp":
            return False
        return not self.detail(method).get("family")

    def whole_run_refuting(self) -> list[str]:
        """Family-free whole-run methods whose bound exceeds a finite claimed epsilon."""
        claim = self.d["claimed_epsilon"]
        if claim is None or not math.isfinite(claim):
            return []
        return [
            m for m in self.methods()
            if self.family_free(m) and self.d["epsilon_lower_bounds"].get(m, 0.0) > claim
        ]

    def per_step_null_text(self) -> str:
        null = self.d["sequential"].get("per_step_null") or {}
        kind = null.get("type")
        if kind == "gaussian_profile":
            eps = null.get("epsilons") or []
            grid = (
                f" It was tested at {len(eps)} points of that profile (ε from "
                f"{_num(min(eps))} to {_num(max(eps))})."
                if eps and all(_is_num(x) for x in eps) else ""
            )
            return (
                "Per-step null hypothesis: each training step is the Gaussian mechanism with "
                f"noise multiplier σ = {_num(null.get('noise_multiplier'))} relative to the "
                "clipping norm, i.e. its privacy profile is that of a correct DP-SGD step."
                + grid
            )
        if kind == "explicit":
            return (
                "Per-step null hypothesis: each training step is "
                f"(ε = {_num(null.get('epsilon'))}, δ = {_num(null.get('delta'))})-DP."
            )
        return "No per-step null hypothesis was recorded."

    # -- sections ------------------------------------------------------------------------------

    def render(self) -> str:
        d = self.d
        title = f"Privacy audit report: {self.r.verdict}"
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # nothing may be loaded from anywhere: only inline styles and data: images
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "img-src data:; style-src 'unsafe-inline'\">",
            '<link rel="icon" href="data:,">',
            f"<title>{_e(title)}</title>",
            f"<style>{_CSS}</style></head><body><main>",
            "<header><h1>Differential-privacy audit report</h1>",
            f'<p class="meta">Created {_e(d["created_at"])} · dpaudit_torch '
            f'{_e(d["versions"].get("dpaudit_torch", "?"))} · report schema '
            f'<span data-field="schema_version">{_e(d["schema_version"])}</span></p></header>',
            self.verdict_section(),
            self.bounds_section(),
            self.sequential_section(),
            self.plots_section(),
            self.strength_section(),
            _kv_section("Training (as observed by the auditor)", "training", d["training"],
                        "No training information was recorded."),
            _kv_section("Canaries", "canaries", d["canaries"],
                        "No canary information was recorded."),
            _kv_section("Configuration", "configuration", d["config"],
                        "No configuration was recorded."),
            self.provenance_section(),
            '<footer><p>Every ε in this report is a statistical lower bound, valid with the '
            "stated confidence over the audit's own randomness. The machine-readable record is "
            f"<code>{JSON_NAME}</code> next to this file (schema {_e(d['schema_version'])}, "
            "documented in docs/report.md of dpaudit_torch); a copy is embedded in this page."
            "</p></footer>",
            '<script type="application/json" id="audit-data">',
            # a JSON data block, never executed
            _json_for_script(d),
            "</script>",
            "</main></body></html>",
        ]
        return "\n".join(parts) + "\n"

    def verdict_section(self) -> str:
        d, r = self.d, self.r
        claim = _num(d["claimed_epsilon"], "claimed_epsilon")
        delta = _num(d["delta"], "delta")
        alpha = _num(d["alpha"], "alpha")
        if d["claim_refuted"]:
            css = "verdict-refuted"
            refuting = self.whole_run_refuting()
            which = (
                "; ".join(
                    f"{_e(_METHOD_NAMES.get(m, m))}: ε ≥ "
                    f"{_num(d['epsilon_lower_bounds'][m], f'epsilon_lower_bounds.{m}')}"
                    for m in refuting
                )
                or "see the table below"
            )
            text = (
                f"<p>The privacy claim is <strong>false</strong>. The training run claims ε = "
                f"{claim} at δ = {delta}, but the audit certified, with confidence at least "
                f"{self.level_pct}% (α = {alpha}), a larger ε for the whole run ({which}). "
                "The implementation or its accounting does not deliver the privacy it "
                "states.</p>"
            )
            if d["violation"]:
                step = d["violation_step"]
                at = (
                    f" at training step {_num(step, 'violation_step')}" if step is not None
                    else ""
                )
                text += (
                    f"<p>The sequential test also proved{at} that a single training step leaks "
                    "more than a correct DP-SGD step can.</p>"
                )
        elif d["violation"]:
            css = "verdict-violation"
            step = d["violation_step"]
            at = (
                f" at training step {_num(step, 'violation_step')}" if step is not None else ""
            )
            stop = (
                " Training was stopped early." if d["stopped_early"]
                else " Training was not stopped."
            )
            text = (
                f"<p>The sequential test proved{at}, at level α = {alpha}, that a single "
                "training step leaks more than a correctly clipped and noised DP-SGD step can. "
                f"{self.per_step_null_text()} Every step of a correct implementation satisfies "
                "this hypothesis, so the implementation does not add the noise or clipping it "
                f"claims, and the claimed ε = {claim} (δ = {delta}), computed by an accountant "
                f"that assumes it does, cannot be trusted.{stop}</p>"
            )
        else:
            css = "verdict-nothing"
            claim_part = (
                f"no audited lower bound exceeds the claimed ε = {claim} (δ = {delta})"
                if d["claimed_epsilon"] is not None
                else f"no claimed ε was recorded (δ = {delta}), so no claim could be refuted"
            )
            text = (
                f"<p>No test rejected: {claim_part}, and the sequential tests proved no "
                f"per-step violation at level α = {alpha}.</p>"
            )
        meaning = self.meaning_text()
        return (
            f'<section id="verdict" class="verdict {css}">'
            f'<h2>Verdict: <span id="verdict-text" data-field="verdict">{_e(r.verdict)}</span>'
            f"</h2>{text}{meaning}</section>"
        )

    def meaning_text(self) -> str:
        d = self.d
        if d["claim_refuted"] or d["violation"]:
            extra = ""
            if d["violation"] and not d["claim_refuted"]:
                extra = (
                    " The whole-run lower bounds below do not exceed the claim: the proof "
                    "concerns the mechanism of each step, which is what the claim rests on."
                )
            return (
                '<p class="callout">A rejection is a proof at the stated level: if the '
                "implementation were as private as claimed, the chance of seeing evidence this "
                f"strong is at most α = {_num(d['alpha'])}.{extra}</p>"
            )
        best = self.best_ceiling()
        ceiling = (
            f" The largest ε this audit could have certified for the whole run, whatever the "
            f"mechanism, is {_num(best[1])} ({_e(_METHOD_NAMES.get(best[0], best[0]))}), even "
            "with every guess right." if best else ""
        )
        return (
            '<p class="callout"><strong>"Nothing found" is not a proof of privacy.</strong> '
            "Every number in this report is a lower bound: an audit can show that a privacy "
            "claim is false, never that it is true. It means this audit, with its strength, "
            f"found no evidence against the claim.{ceiling} The true ε may lie anywhere "
            "between the lower bounds and the claim, or above the claim through a leak these "
            "tests cannot see (see the threat model below).</p>"
        )

    def best_ceiling(self) -> tuple[str, float] | None:
        """The highest ceiling among the methods that could refute the claim."""
        best = None
        for m in self.methods():
            if not self.family_free(m):
                continue
            c = self.ceiling(m)
            if c is not None and (best is None or c > best[1]):
                best = (m, c)
        return best

    def bounds_section(self) -> str:
        d = self.d
        methods = self.methods()
        head = (
            "<tr><th>Method</th><th>Scope</th><th class=\"n\">Lower bound ε</th>"
            "<th class=\"n\">Claimed ε</th><th>Exceeds claim</th><th>Level</th>"
            "<th>Guess strategy</th><th class=\"n\">Canaries</th>"
            "<th class=\"n\">Guesses / correct</th><th class=\"n\">Ceiling ε</th>"
            "<th class=\"n\">Uncorrected best (diagnostic)</th></tr>"
        )
        rows = []
        notes = []
        for m in methods:
            det = self.detail(m)
            bound = d["epsilon_lower_bounds"].get(m)
            bound_html = (
                _num(bound, f"epsilon_lower_bounds.{m}") if bound is not None else _num(None)
            )
            claim = _num(d["claimed_epsilon"], "claimed_epsilon")
            if m == "sequential":
                scope = "one training step"
                exceeds = "not comparable (per-step bound)"
                lvl_alpha = det.get("level", d["alpha"])
                simul = det.get("simultaneous")
                strategy = (
                    "grid, simultaneous (Bonferroni over the grid)" if simul is True
                    else "grid, each point at level α (not simultaneous)" if simul is False
                    else "grid"
                )
                grid = det.get("grid_epsilons")
                if isinstance(grid, list):
                    strategy += f", {len(grid)} points"
                guesses = _num(None)
            else:
                scope = "whole training run"
                claim_v = d["claimed_epsilon"]
                if bound is None or claim_v is None:
                    exceeds = _num(None)
                elif bound > claim_v and self.family_free(m):
                    exceeds = '<span class="bad">yes: claim refuted</span>'
                elif bound > claim_v:
                    exceeds = (
                        '<span class="bad">yes</span>, but this test assumes the Gaussian '
                        "family, so it does not refute the claim on its own"
                    )
                else:
                    exceeds = '<span class="ok">no</span>'
                lvl_alpha = det.get("alpha", d["alpha"])
                strategy = _e(det["strategy"]) if "strategy" in det else _num(None)
                if "guesses" in det and not isinstance(det["guesses"], (dict, list)):
                    strategy += f" ({_scalar(det['guesses'])})"
                guesses = f"{_num(det.get('r'))} / {_num(det.get('v'))}"
            level = (
                f"α = {_num(lvl_alpha)} ({_num(100.0 * (1.0 - lvl_alpha))}% confidence)"
                if _is_num(lvl_alpha) else _scalar(lvl_alpha)
            )
            per_test = det.get("alpha_per_test")
            if _is_num(per_test) and _is_num(lvl_alpha) and per_test != lvl_alpha:
                n_cand = det.get("n_candidates")
                over = f" over {_num(n_cand)} candidates" if _is_num(n_cand) else ""
                level += f"; {_num(per_test)} per candidate (Bonferroni{over})"
            ceiling = self.ceiling(m)
            ceiling_html = (
                _num(ceiling, f"lower_bound_details.{m}.ceiling") if "ceiling" in det
                else _num(ceiling)
            )
            unc = det.get("uncorrected_best")
            rows.append(
                f'<tr data-method="{_e(m)}"><td>{_e(_METHOD_NAMES.get(m, m))}</td>'
                f"<td>{scope}</td><td class=\"n\">{bound_html}</td><td class=\"n\">{claim}</td>"
                f"<td>{exceeds}</td><td>{level}</td><td>{strategy}</td>"
                f"<td class=\"n\">{self.canary_count(m)}</td><td class=\"n\">{guesses}</td>"
                f"<td class=\"n\">{ceiling_html}</td>"
                f"<td class=\"n\">{_scalar(unc) if not isinstance(unc, (dict, list)) else ''}"
                "</td></tr>"
            )
            for key, label in (("family", "family"), ("note", ""), ("null", "null"),
                               ("uncorrected_best_note", "uncorrected best")):
                if det.get(key) and isinstance(det[key], str):
                    label_html = f" {_e(label)}" if label else ""
                    notes.append(f"<li><strong>{_e(m)}</strong>{label_html}: {_e(det[key])}</li>")
            claim_v = d["claimed_epsilon"]
            if (
                self.family_free(m) and ceiling is not None and claim_v is not None
                and ceiling <= claim_v
            ):
                notes.append(
                    f"<li><strong>{_e(m)}</strong>: its ceiling ε = {_num(ceiling)} is not above "
                    f"the claimed ε = {_num(claim_v)}, so this method could not have refuted the "
                    "claim even with every guess right; more canaries raise the ceiling.</li>"
                )
        if not rows:
            table = "<p><em>No lower bound was computed.</em></p>"
        else:
            table = (
                f'<div class="wide"><table id="bounds-table"><thead>{head}</thead>'
                f'<tbody>{"".join(rows)}</tbody></table></div>'
            )
        acc = _e(d["accountant"]) if d["accountant"] else "not recorded"
        intro = (
            f"<p>Claimed: ε = {_num(d['claimed_epsilon'], 'claimed_epsilon')} at δ = "
            f"{_num(d['delta'], 'delta')}, from the accountant <strong>{acc}</strong>. "
            "Each audited number is a lower bound on the true ε at the same δ: it holds with "
            "the confidence shown. The ceiling is the largest ε the method could have "
            "certified with this many canaries, even if every guess were right. The "
            "uncorrected best is a diagnostic (the best threshold chosen after seeing the "
            "answers) and is <em>not</em> a valid bound.</p>"
        )
        note_html = f'<ul class="notes">{"".join(notes)}</ul>' if notes else ""
        details = "".join(
            f"<details><summary>All recorded details: {_e(m)}</summary>"
            f"{_generic(self.detail(m))}</details>"
            for m in methods if self.detail(m)
        )
        return (
            '<section id="bounds"><h2>Claimed ε and audited lower bounds</h2>'
            f"{intro}{table}{note_html}{details}</section>"
        )

    def sequential_section(self) -> str:
        seq = self.d["sequential"]
        tests = seq.get("tests") or {}
        if not tests and not seq:
            return (
                '<section id="sequential"><h2>Sequential tests</h2>'
                "<p><em>No sequential test was run.</em></p></section>"
            )
        rows = []
        for name, s in tests.items():
            s = s if isinstance(s, dict) else {}
            eps = s.get("epsilons")
            grid = len(eps) if isinstance(eps, list) else None
            rows.append(
                f"<tr><td>{_e(_LABEL_TESTS.get(name, name))}</td>"
                f"<td>{_scalar(s.get('rejected'))}</td>"
                f"<td class=\"n\">{_scalar(s.get('rejected_at'))}</td>"
                f"<td class=\"n\">{_scalar(s.get('n_pairs'))}</td>"
                f"<td class=\"n\">{_scalar(s.get('combined_log_wealth'))}</td>"
                f"<td class=\"n\">{_num(grid)}</td>"
                f"<td class=\"n\">{_scalar(s.get('epsilon_lower_bound'))}</td></tr>"
            )
        table = (
            "<table id=\"sequential-table\"><thead><tr><th>Test</th><th>Rejected</th>"
            "<th class=\"n\">Rejected after pairs</th><th class=\"n\">Pairs seen</th>"
            "<th class=\"n\">Log-wealth</th><th class=\"n\">Grid points</th>"
            "<th class=\"n\">Per-step ε lower bound</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>" if rows else ""
        )
        comb = seq.get("combined_log_wealth")
        decision = (
            f"<p>Decision: the combined log-wealth "
            f"{_num(comb, 'sequential.combined_log_wealth') if _is_num(comb) else _num(None)} "
            f"is compared with log(1/α) = "
            f"{_num(self.threshold_log())}; the tests reject when it is reached (Ville's "
            "inequality bounds the chance that a true null ever gets there by α, however long "
            "training runs).</p>"
        )
        crossed, every = seq.get("crossed_at_step"), seq.get("check_every")
        vstep = self.d["violation_step"]
        if _is_num(crossed) and vstep is not None and crossed != vstep:
            cadence = (
                f" (the decision is checked every {_num(every)} steps)" if _is_num(every) else ""
            )
            decision += (
                f"<p>The combined log-wealth first reached the threshold at step "
                f"{_num(crossed)}; the violation was declared at step {_num(vstep)}"
                f"{cadence}.</p>"
            )
        others = {k: v for k, v in seq.items()
                  if k not in ("tests", "combined_log_wealth", "decision_threshold_log",
                               "per_step_null")}
        extra = (
            f"<details><summary>Other sequential settings</summary>{_generic(others)}</details>"
            if others else ""
        )
        full = "".join(
            f"<details><summary>Full summary: {_e(name)}</summary>{_generic(s)}</details>"
            for name, s in tests.items()
        )
        return (
            '<section id="sequential"><h2>Sequential tests (during training)</h2>'
            f"<p>{self.per_step_null_text()}</p>{decision}{table}{extra}{full}</section>"
        )

    def plots_section(self) -> str:
        from . import _plots

        d = self.d
        wh = d["wealth_history"]
        det = self.detail("sequential")
        crossed = d["sequential"].get("crossed_at_step")
        grid = det.get("grid_epsilons")
        grid_max = (
            float(max(grid)) if isinstance(grid, list) and grid and all(_is_num(g) for g in grid)
            else None
        )
        figs = [
            ("plot-wealth", _plots.plot_log_wealth(wh, self.threshold_log(), d["violation_step"],
                                                   crossed if _is_num(crossed) else None),
             "Log-wealth of each sequential test over training steps. A test proves a violation "
             "when its log-wealth reaches the dashed line log(1/α); under a true null it "
             "stays below it with probability at least 1 − α."),
            ("plot-epsilon", _plots.plot_epsilon_lower_bound(wh, grid_max, d["violation_step"]),
             "Sequential ε lower bound for ONE training step (anytime form: once a grid point "
             "is rejected it stays rejected). It is not a bound on the whole run's ε."),
            ("plot-scores", _plots.plot_score_histograms(d["one_run_scores"]),
             "One-run audit: scores of the canaries that were secretly inserted (IN) and of "
             "those that were not (OUT). The more the two separate, the more the training run "
             "reveals about single examples."),
        ]
        out = ['<section id="plots"><h2>Plots</h2>']
        for anchor, plot, caption in figs:
            if plot.png is None:
                body = f'<div class="nodata">{_e(plot.reason)}</div>'
            else:
                body = (
                    f'<img src="data:image/png;base64,{plot.png}" '
                    f'alt="{_e(caption.split(".")[0])}">'
                )
            notes = (
                f'<div class="notes">{"; ".join(_e(n) for n in plot.notes)}</div>'
                if plot.notes else ""
            )
            out.append(
                f'<figure id="{anchor}">{body}<figcaption>{_e(caption)}</figcaption>{notes}'
                "</figure>"
            )
        out.append("</section>")
        return "".join(out)

    def strength_section(self) -> str:
        d = self.d
        tm = d["threat_model"]
        can = d["canaries"]

        def flag(key: str, yes: str, no: str) -> str:
            v = tm.get(key)
            if v is None:
                return "not recorded"
            return _e(yes) if v else f'<span class="bad">{_e(no)}</span>'

        rows = [
            ("White-box (gradients observed)", flag(
                "white_box", "yes: the auditor reads the privatised gradient of every step",
                "no: only the final model is observed")),
            ("Every step observed", flag(
                "every_step_observed", "yes", "no: some steps were not observed")),
            ("Clipping exercised", flag(
                "clipping_exercised", "yes: the canaries go through the library's own clipping",
                "no: the canaries bypass the clipping code, so a clipping bug is invisible to "
                "them")),
        ]
        table = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
        other_tm = {k: v for k, v in tm.items()
                    if k not in ("white_box", "every_step_observed", "clipping_exercised",
                                 "notes")}
        if other_tm:
            table += "".join(
                f"<tr><th>{_e(k)}</th><td>{_generic(v)}</td></tr>" for k, v in other_tm.items()
            )
        tm_notes = tm.get("notes") or []
        notes = (
            "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in tm_notes) + "</ul>" if tm_notes else ""
        )
        strength = []
        if can:
            strength.append(
                f"<li>{_num(can.get('k_pairs'))} canary pairs feed the sequential tests and "
                f"{_num(can.get('m_one_run'))} canaries the one-run audit (design "
                f"{_e(can.get('design', 'n/a'))}, canary norm {_num(can.get('norm_multiplier'))}"
                " × clipping norm).</li>"
            )
        for m in self.methods():
            c = self.ceiling(m)
            if c is not None:
                strength.append(
                    f"<li>{_e(_METHOD_NAMES.get(m, m))}: ceiling ε = {_num(c)}"
                    f"{' (per step)' if m == 'sequential' else ''}.</li>"
                )
        inter = d["interference"]
        inter_html = (
            "<h3>Interference from real data</h3><p>Spread of the real-data gradient at the "
            "canary coordinates, in units of the clipping norm C. Interference costs power "
            "(weaker bounds), not validity.</p>" + _generic(inter) if inter else ""
        )
        strength_html = (
            "<h3>Strength of this audit</h3><ul>" + "".join(strength) + "</ul>"
            if strength else ""
        )
        return (
            '<section id="threat-model"><h2>Threat model and audit strength</h2>'
            "<p>The auditor inserts data-independent canary gradients before clipping and "
            "reads the privatised gradient at their coordinates. It tests the privacy of what "
            "it observes; leaks it does not observe (e.g. through data-dependent choices "
            "outside the optimizer step) are out of its sight.</p>"
            f'<table class="kv">{table}</table>{notes}{strength_html}{inter_html}</section>'
        )

    def provenance_section(self) -> str:
        d = self.d
        seed = d["seed_policy"] or "not recorded"
        versions = _generic(d["versions"]) if d["versions"] else "<em>not recorded</em>"
        warns = d["warnings"]
        warn_html = (
            '<ul class="warnings">' + "".join(f"<li>{_e(w)}</li>" for w in warns) + "</ul>"
            if warns else "<p>None.</p>"
        )
        return (
            '<section id="provenance"><h2>Seed policy, versions, warnings</h2>'
            f'<h3>Seed policy</h3><p id="seed-policy">{_e(seed)}</p>'
            f"<h3>Library versions</h3>{versions}"
            f'<h3>Warnings</h3><div id="warnings">{warn_html}</div></section>'
        )



def _atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename (readers never see half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
