"""The audit report's data: its fields (:class:`ReportData`), their checks and their JSON
(``audit.json``).

:class:`ReportData` is a plain dataclass of JSON-able fields (schema documented field by field in
``docs/report.md``); :class:`~dpaudit_torch.report.AuditReport` is that dataclass with its files
and renderings. :class:`~dpaudit_torch.audit.PrivacyAuditor` builds one in ``finalize()``; anyone
can build one piecemeal (every field has a default), e.g. for a black-box audit.

The numbers it carries come from:

* the one-run guessing game of Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
  Training Run" (NeurIPS 2023) -- method ``"steinke"`` -- and its f-DP refinement by Mahloujifar,
  Melis and Chaudhuri, "Auditing f-Differential Privacy in One Run" (2024) -- method ``"fdp"``;
* the sequential (anytime-valid) tests by betting of Gonzalez et al. (2025) and Kutta et al. (2026)
  -- method ``"sequential"``, a lower bound on the epsilon of ONE training step, not of the run;
* the power of the one-run audit (schema 1.1, field ``power``): simulated bounds of a correct
  implementation with the run's settings (:mod:`dpaudit_torch.stats.one_run_power`).

Monitors are named by the report's own data (field ``monitor_labels``, schema 1.3, filled by the
engine), never by a table of this package; a finding's optional ``scope`` (the registry's
:data:`~dpaudit_torch.registry.ONE_STEP`) says that it is about the per-step guarantee. The
audit's fingerprint (schema 1.4, field ``fingerprint``; :mod:`dpaudit_torch.report.fingerprint`)
says what the audit was, so that two releases' audits can be compared (``dpaudit gate``).
Schema 1.6 states the two levels of evidence (docs/design.md, "Two levels of evidence"):
``alpha`` is the level of every proof together, ``proof_levels`` its split among the proof
paths, and ``alpha_warn`` / ``evidence`` / ``evidence_step`` the evidence of a violation (the
decision's e-process at 1/alpha_warn), which is not a proof.

Every epsilon here is a statistical LOWER bound: the report can prove a privacy claim false; it can
never prove a claim true.

JSON encoding: ``audit.json`` is strict JSON (RFC 8259). Non-finite floats, which strict JSON cannot
hold, are written as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"`` and read back as
floats, wherever they occur.

This module is the data layer of the report package and imports none of its renderers: the
class users get, :class:`~dpaudit_torch.report.audit_report.AuditReport`, is :class:`ReportData`
plus its files and renderings (``save``, ``to_html``, ``summary_text``), defined above both. The
names of the bound methods and what each may prove are read from :mod:`dpaudit_torch.registry`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import platform
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any, TypeVar

from ..registry import ONE_STEP, WHOLE_RUN, bound_method

logger = logging.getLogger(__name__)

__all__ = [
    "ReportData",
    "SCHEMA_VERSION",
    "JSON_NAME",
    "HTML_NAME",
    "library_versions",
    "VERDICT_REFUTED",
    "VERDICT_NOTHING",
    "VERDICT_VIOLATION",
    "VERDICT_INCONSISTENT",
    "VERDICT_FINDING",
    "VERDICT_EVIDENCE",
    "VERDICTS",
    "VERDICT_EXIT_CODES",
    "verdict_phrase",
    "FINDING_LEVELS",
    "FINDING_SCOPES",
    "plain",
    "encode_nonfinite",
    "decode_nonfinite",
    "is_num",
    "no_steps_audited",
    "is_one_step",
    "per_step_delta",
    "CHECK_STATUSES",
    "NOTHING_FOUND",
    "NOT_RUN",
    "check_status",
]

#: version of the ``audit.json`` schema written by this module (see docs/report.md)
SCHEMA_VERSION = "1.6"
#: fields added after 1.0, with the minor version that introduced them (a document of an older
#: minor version must not carry them; reading it fills in their defaults)
_FIELDS_SINCE = {"power": 1, "findings": 2, "claim_inconsistent": 2, "audits": 2,
                 "monitor_labels": 3, "fingerprint": 4, "checks": 5, "alpha_warn": 6,
                 "evidence": 6, "evidence_step": 6, "proof_levels": 6}
#: file names written by :meth:`AuditReport.save`
JSON_NAME = "audit.json"
HTML_NAME = "report.html"

#: :attr:`AuditReport.verdict` when a valid whole-run lower bound exceeds the claimed epsilon
VERDICT_REFUTED = "claim refuted"
#: :attr:`AuditReport.verdict` when no test rejected
VERDICT_NOTHING = "nothing found"
#: :attr:`AuditReport.verdict` prefix when the sequential decision proved a violation
VERDICT_VIOLATION = "violation proven"
#: :attr:`AuditReport.verdict` when the accountant's inputs contradict the training that ran
VERDICT_INCONSISTENT = "claim inconsistent"
#: :attr:`AuditReport.verdict` prefix when the sequential decision showed evidence of a
#: violation (level ``alpha_warn``) but proved none (schema 1.6)
VERDICT_EVIDENCE = "evidence of a violation (not a proof)"
#: :attr:`AuditReport.verdict` when only findings that are not proofs were made
VERDICT_FINDING = "finding (not a proof)"
#: every verdict phrase, strongest first (``verdict`` starts with one of them)
VERDICTS = (VERDICT_REFUTED, VERDICT_VIOLATION, VERDICT_INCONSISTENT, VERDICT_EVIDENCE,
            VERDICT_FINDING, VERDICT_NOTHING)
#: the ``dpaudit`` command's exit code for each verdict (0 and 3 as before the vocabulary grew)
VERDICT_EXIT_CODES = {VERDICT_REFUTED: 3, VERDICT_VIOLATION: 3, VERDICT_INCONSISTENT: 4,
                      VERDICT_EVIDENCE: 6, VERDICT_FINDING: 5, VERDICT_NOTHING: 0}


def verdict_phrase(verdict: str) -> str:
    """The phrase of :data:`VERDICTS` that ``verdict`` starts with."""
    for phrase in VERDICTS:
        if verdict.startswith(phrase):
            return phrase
    raise ValueError(f"not a verdict of this version: {verdict!r}")


#: levels of a finding (``findings[i]["level"]``)
FINDING_LEVELS = ("violation", "refuted", "inconsistent", "finding", "note")
#: what a finding may say it is about (optional ``findings[i]["scope"]``, the registry's scopes):
#: :data:`~dpaudit_torch.registry.ONE_STEP` marks a finding about the per-step guarantee
FINDING_SCOPES = (WHOLE_RUN, ONE_STEP)


def is_num(v: Any) -> bool:
    """True for an int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)

_NONFINITE_TO_STR = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _dist_version(name: str) -> str:
    from importlib import metadata  # here: reading a report (dpaudit gate) never needs it

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def library_versions() -> dict[str, str]:
    """Versions of the libraries an audit depends on (read from package metadata, no import)."""
    from .. import __version__

    return {
        "dpaudit_torch": __version__,
        "torch": _dist_version("torch"),
        "opacus": _dist_version("opacus"),
        "python": platform.python_version(),
    }


def plain(obj: Any, where: str) -> Any:
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
            out[k] = plain(v, f"{where}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    # numpy arrays / scalars and torch tensors without importing either
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and type(obj).__module__.split(".")[0] in ("numpy", "torch"):
        if hasattr(obj, "detach"):
            obj = obj.detach().cpu()
        return plain(obj.tolist(), where)
    raise ValueError(f"{where}: value {obj!r} of type {type(obj).__name__} is not JSON-able")


def _map_leaves(obj: Any, fn: Any) -> Any:
    """``obj`` (nested dicts and lists) with ``fn`` applied to every other value."""
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_leaves(v, fn) for v in obj]
    return fn(obj)


def _encode_leaf(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else _NONFINITE_TO_STR[v]
    return v


def _decode_leaf(v: Any) -> Any:
    return _STR_TO_NONFINITE[v] if isinstance(v, str) and v in _STR_TO_NONFINITE else v


def encode_nonfinite(obj: Any) -> Any:
    """``obj`` with every non-finite float written as "Infinity", "-Infinity" or "NaN"."""
    return _map_leaves(obj, _encode_leaf)


def decode_nonfinite(obj: Any) -> Any:
    """Inverse of :func:`encode_nonfinite`: the strings "Infinity", "-Infinity", "NaN" as floats."""
    return _map_leaves(obj, _decode_leaf)


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
        ce is None or (is_num(ce) and (ce >= 0 or math.isnan(ce))),
        "claimed_epsilon", "None or a number >= 0 (inf allowed)", ce,
    )
    _need(is_num(g("delta")) and 0.0 <= g("delta") < 1.0, "delta", "a number in [0, 1)",
          g("delta"))
    _need(is_num(g("alpha")) and 0.0 < g("alpha") < 1.0, "alpha", "a number in (0, 1)",
          g("alpha"))
    aw = g("alpha_warn")
    _need(aw is None or (is_num(aw) and g("alpha") <= aw < 1.0), "alpha_warn",
          "None or a number in [alpha, 1)", aw)
    _need(isinstance(g("evidence"), bool), "evidence", "a bool", g("evidence"))
    es = g("evidence_step")
    _need(es is None or (isinstance(es, int) and not isinstance(es, bool) and es >= 0),
          "evidence_step", "None or an int >= 0", es)
    if es is not None and not d["evidence"]:
        raise ValueError(f"AuditReport field 'evidence_step' is {es!r} but 'evidence' is False")
    pl = g("proof_levels")
    _need(isinstance(pl, dict) and all(is_num(v) and 0.0 < v < 1.0 for v in pl.values()),
          "proof_levels", "a dict {proof path: level in (0, 1)}", pl)
    _need(g("accountant") is None or isinstance(g("accountant"), str), "accountant",
          "None or a string", g("accountant"))
    lb = g("epsilon_lower_bounds")
    _need(isinstance(lb, dict), "epsilon_lower_bounds", "a dict {method: epsilon}", lb)
    for k, v in lb.items():
        _need(is_num(v) and (v >= 0 or math.isnan(v)), f"epsilon_lower_bounds.{k}",
              "a number >= 0", v)
    det = g("lower_bound_details")
    _need(isinstance(det, dict), "lower_bound_details", "a dict {method: dict}", det)
    for k, v in det.items():
        _need(isinstance(v, dict), f"lower_bound_details.{k}", "a dict", v)
    for name in ("claim_refuted", "violation", "stopped_early", "claim_inconsistent"):
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
        _need(isinstance(v, list) and all(is_num(x) for x in v), f"wealth_history.{k}",
              "a list of numbers", v if not isinstance(v, list) else "a list with non-numbers")
    sc = g("one_run_scores")
    _need(isinstance(sc, dict), "one_run_scores", "a dict {'in': list, 'out': list}", sc)
    for k, v in sc.items():
        _need(isinstance(v, list) and all(is_num(x) for x in v), f"one_run_scores.{k}",
              "a list of numbers", v if not isinstance(v, list) else "a list with non-numbers")
    for name in ("sequential", "canaries", "training", "threat_model", "interference", "config",
                 "versions", "audits", "fingerprint"):
        _need(isinstance(g(name), dict), name, "a dict", g(name))
    _need(isinstance(g("seed_policy"), str), "seed_policy", "a string", g("seed_policy"))
    w = g("warnings")
    _need(isinstance(w, list) and all(isinstance(x, str) for x in w), "warnings",
          "a list of strings", w)
    _check_power(g("power"))
    _check_findings(g("findings"))
    _check_checks(g("checks"))
    labels = g("monitor_labels")
    _need(isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()),
          "monitor_labels", "a dict {monitor: label} of strings", labels)


#: status of a monitor's check section without a finding (notes aside)
NOTHING_FOUND = "checked, nothing found"
#: status of a monitor's check section when the monitor did not run at all
NOT_RUN = "not run"
#: the statuses of a check section (``checks[i].status``), strongest first
CHECK_STATUSES = ("violation", "refuted", "inconsistent", "finding", NOT_RUN, NOTHING_FOUND)
_SECTION_KEYS = {"monitor": str, "title": str, "ran": bool, "status": str, "checked": list,
                 "measured": list, "not_checked": list, "findings": list}


def check_status(section: dict[str, Any], findings: list[dict[str, Any]]) -> str:
    """The status of a monitor's check section from the report's findings of its monitor: the
    strongest finding level among them (notes aside), else "not run" (the monitor did not run)
    or "checked, nothing found"."""
    levels = {f.get("level") for f in findings if f.get("monitor") == section.get("monitor")}
    found = next((s for s in CHECK_STATUSES[:4] if s in levels), None)
    if found is not None:
        return found
    return NOTHING_FOUND if section.get("ran", True) else NOT_RUN


def _check_checks(checks: Any) -> None:
    """``checks`` (schema 1.5): one section per monitor (docs/report.md)."""
    _need(isinstance(checks, list), "checks", "a list of sections", checks)
    for i, sec in enumerate(checks):
        ok = isinstance(sec, dict) and all(
            isinstance(sec.get(k), t) for k, t in _SECTION_KEYS.items())
        _need(ok and sec["status"] in CHECK_STATUSES, f"checks[{i}]",
              f"a dict with {sorted(_SECTION_KEYS)} and a status among {CHECK_STATUSES}", sec)


def _check_findings(fs: Any) -> None:
    """``findings``: dicts with monitor, level, message, where, and optionally scope (1.3)."""
    _need(isinstance(fs, list), "findings", "a list of dicts", fs)
    for i, f in enumerate(fs):
        _need(isinstance(f, dict) and isinstance(f.get("monitor"), str)
              and f.get("level") in FINDING_LEVELS and isinstance(f.get("message"), str)
              and (f.get("where") is None or isinstance(f.get("where"), str))
              and (f.get("scope") is None or f.get("scope") in FINDING_SCOPES),
              f"findings[{i}]", f"a dict with monitor, level (one of {FINDING_LEVELS}), "
              f"message, where and optionally scope (one of {FINDING_SCOPES})", f)


def _check_power(p: Any) -> None:
    """The ``power`` object (schema 1.1): every known number may be None."""
    _need(isinstance(p, dict), "power", "a dict (empty when no power was computed)", p)
    for k in ("expected_bound", "min_refutable_epsilon", "min_refutable_sigma",
              "mean_inclusions", "claimed_epsilon"):
        v = p.get(k)
        _need(v is None or (is_num(v) and (v >= 0 or math.isnan(v))), f"power.{k}",
              "None or a number >= 0", v)
    tp = p.get("target_power")
    _need(tp is None or (is_num(tp) and 0.0 < tp < 1.0), "power.target_power",
          "None or a number in (0, 1)", tp)
    n = p.get("replicates")
    _need(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0),
          "power.replicates", "None or an int >= 0", n)
    for k in ("score", "method", "note", "mode"):
        _need(p.get(k) is None or isinstance(p[k], str), f"power.{k}", "None or a string",
              p.get(k))
    qs = p.get("expected_bound_quantiles")
    _need(qs is None or (isinstance(qs, list) and len(qs) == 2 and all(is_num(x) for x in qs)),
          "power.expected_bound_quantiles", "None or a list of 2 numbers", qs)
    pw = p.get("warnings", [])
    _need(isinstance(pw, list) and all(isinstance(x, str) for x in pw), "power.warnings",
          "a list of strings", pw)
    _need(isinstance(p.get("no_power", False), bool), "power.no_power", "a bool",
          p.get("no_power"))


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


def no_steps_audited(training: dict[str, Any]) -> bool:
    """Did the auditor record that it saw no training step (``training.audited_steps == 0``)?"""
    n = training.get("audited_steps")
    return is_num(n) and n == 0


def is_one_step(method: str) -> bool:
    """Does the bound of ``method`` speak about one training step (the registry's scope; False
    for a method this version does not know, e.g. from a newer writer)?"""
    spec = bound_method(method)
    return spec is not None and spec.scope == ONE_STEP


def per_step_delta(bound: Any, details: dict[str, Any]) -> float | None:
    """The delta at which a per-step bound holds: that of the grid point equal to ``bound``
    (``lower_bound_details.sequential.grid_epsilons`` / ``grid_deltas``), or None (no grid
    point was rejected, or no grid was recorded)."""
    eps, deltas = details.get("grid_epsilons"), details.get("grid_deltas")
    if not (is_num(bound) and bound > 0 and isinstance(eps, list) and isinstance(deltas, list)
            and len(eps) == len(deltas)):
        return None
    for e, d in zip(eps, deltas):
        if is_num(e) and is_num(d) and math.isclose(e, bound, rel_tol=1e-12, abs_tol=0.0):
            return float(d)
    return None


# ----------------------------------------------------------------------------------------------
# the report's data
# ----------------------------------------------------------------------------------------------

#: the class :meth:`ReportData.from_dict` and :meth:`ReportData.load` build (a subclass's own)
_R = TypeVar("_R", bound="ReportData")


@dataclass
class ReportData:
    """The fields of an audit report, their checks, their JSON and the verdict they give.

    Use :class:`dpaudit_torch.report.AuditReport`, which is this dataclass plus its files and
    renderings (``save``, ``to_html``, ``summary_text``); the renderers of this package read a
    report through this class only, so that the schema never imports them.

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
    #: (since 1.6) the level of "evidence of a violation" (the decision's e-process at
    #: 1/alpha_warn; not a proof); None where the report records no evidence level
    alpha_warn: float | None = None
    #: (since 1.6) whether the decision showed evidence, and the step at which it was available
    evidence: bool = False
    evidence_step: int | None = None
    #: (since 1.6) proof path -> the level it was decided at; their sum bounds the probability
    #: that a correct run gets any false proof (docs/design.md, "Two levels of evidence")
    proof_levels: dict[str, float] = field(default_factory=dict)
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
    power: dict = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    claim_inconsistent: bool = False
    audits: dict = field(default_factory=dict)
    #: (since 1.3) monitor name -> how the report names it, filled by the engine; a monitor
    #: without a label is shown under its name
    monitor_labels: dict[str, str] = field(default_factory=dict)
    #: (since 1.4) what the audit was (threat model, canaries, judge, power, subject, version),
    #: :func:`dpaudit_torch.report.fingerprint.fingerprint_of` of the other fields; ``{}`` when
    #: not filled (a report built by hand, or read from an older version)
    fingerprint: dict = field(default_factory=dict)
    #: (since 1.5) one section per monitor, in the order they run: what it checked, measured,
    #: found and did not check (docs/report.md, "Checks by monitor"); ``[]`` when not recorded
    checks: list[dict] = field(default_factory=list)

    # -- plain data ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict of every field (numpy / torch values converted), validated.

        Raises:
            ValueError: a field has a wrong type or value (the message names it).
        """
        d = {f.name: plain(getattr(self, f.name), f.name) for f in dataclasses.fields(self)}
        _check_schema_version(d["schema_version"])
        _check_fields(d)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON of :meth:`to_dict` (non-finite floats as "Infinity"/"-Infinity"/"NaN")."""
        return json.dumps(
            encode_nonfinite(self.to_dict()), indent=indent, allow_nan=False, ensure_ascii=False
        )

    @classmethod
    def from_dict(cls: type[_R], d: Any) -> _R:
        """Build a report from :meth:`to_dict` output (or parsed ``audit.json``), validating it.

        Accepts any ``1.x`` schema version; fields unknown to this version are ignored (with a
        logged warning) only if the document declares a newer minor version.  A document of an
        older minor version (e.g. ``1.0``, written before the ``power`` field existed) is read
        with the missing fields at their defaults and carries this version afterwards; it must
        not hold a field its own version did not have.

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
        d = decode_nonfinite(d)
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
        too_new = sorted(k for k in d if _FIELDS_SINCE.get(k, 0) > _minor(version))
        if too_new:
            raise ValueError(
                f"audit report field(s) {too_new} do not exist in schema {version} (added in "
                + ", ".join(f"1.{_FIELDS_SINCE[k]}" for k in too_new) + ")"
            )
        kwargs = {k: v for k, v in d.items() if k in names}
        if _minor(version) != _minor(SCHEMA_VERSION):
            # the object holds what this version understood (an older document with the new
            # fields at their defaults), and says so when saved again
            kwargs["schema_version"] = SCHEMA_VERSION
        report = cls(**kwargs)
        report.to_dict()  # validates every field
        return report

    # -- files -----------------------------------------------------------------------------------

    @classmethod
    def load(cls: type[_R], path: str | os.PathLike[str]) -> _R:
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
        """One phrase of :data:`VERDICTS`, the strongest that applies: ``"claim refuted"`` (a
        valid lower bound on the whole run's epsilon above the claim), ``"violation proven at
        step N"`` (the sequential decision, about one training step, any monitor), ``"claim
        inconsistent"`` (the accountant's inputs contradict what ran), ``"evidence of a
        violation (not a proof) at step N"`` (the decision's e-process reached 1/alpha_warn,
        schema 1.6), ``"finding (not a proof)"`` (e.g. noise on a low-precision grid), else
        ``"nothing found"``. Every finding is in :attr:`findings`."""
        if self.claim_refuted:
            return VERDICT_REFUTED
        if self.violation:
            if self.violation_step is None:
                return VERDICT_VIOLATION
            return f"{VERDICT_VIOLATION} at step {self.violation_step}"
        if self.claim_inconsistent:
            return VERDICT_INCONSISTENT
        if self.evidence:
            if self.evidence_step is None:
                return VERDICT_EVIDENCE
            return f"{VERDICT_EVIDENCE} at step {self.evidence_step}"
        if any(f.get("level") == "finding" for f in self.findings):
            return VERDICT_FINDING
        return VERDICT_NOTHING
