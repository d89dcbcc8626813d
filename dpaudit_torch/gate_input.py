"""What the release gate reads: ``audit.json`` files that a CI job, a person or an attacker may
have written (``dpaudit gate``, docs/release_gate.md, "What the gate refuses").

:func:`read_audit` accepts a document only when the gate's decision can rest on it, and refuses
everything else with :class:`GateInputError`, one line naming the file and the problem (the
command's exit 2), never with an internal error:

* a file larger than :data:`MAX_BYTES`, or not a regular file (a device, a pipe);
* text that is not UTF-8, not JSON, or JSON nested deeper than :data:`MAX_DEPTH` (a report is
  about 6 levels deep; a document nested 200,000 deep would exhaust the parser's recursion), or
  holding an integer too large for a float;
* a document that is not an audit report, has another schema major version, lacks a field its
  own schema version has (this library writes every field of its version: a missing one means
  the document was not written by it), fails a field's check or contradicts itself
  (:func:`dpaudit_torch.report.validate`);
* a non-finite number (NaN, Infinity) among the verdict's inputs (:func:`verdict_inputs`): the
  claim, every lower bound and its details' bound, ceiling and level, the power numbers of the
  strength order, the steps, the sample rate and the canary counts. A NaN compares false with
  everything, so a NaN claim is never exceeded and a NaN bound never exceeds; an infinite claim
  promises nothing. This library never writes one there (its bounds stop at their ceiling).

Only the standard library: the gate imports neither torch nor NumPy.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report.fingerprint import Fingerprint, fingerprint_of
from .report.schema import _FIELDS_SINCE, JSON_NAME, SCHEMA_VERSION, ReportData, _minor

__all__ = ["MAX_BYTES", "MAX_DEPTH", "GateInputError", "AuditInput", "read_audit",
           "verdict_inputs"]

#: the largest ``audit.json`` the gate reads (a report of a long run with 10,000 canaries is a
#: few MiB)
MAX_BYTES = 64 * 1024 * 1024
#: the deepest nesting of arrays and objects the gate reads
MAX_DEPTH = 64
#: errors a hostile document may provoke in the report's own checks: reported as bad input
_CHECK_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)


class GateInputError(ValueError):
    """An input the gate cannot use: unreadable, not an audit report, another schema major
    version, incomplete, inconsistent or with a non-finite input of the verdict. Its message is
    one line."""


@dataclass(frozen=True)
class AuditInput:
    """One audit as the gate reads it: where from, the report, the schema version it was written
    with (an older document is read as this version, its new fields at their defaults) and its
    fingerprint."""

    path: str
    report: ReportData
    written_schema: str
    fingerprint: Fingerprint

    @classmethod
    def of(cls, report: ReportData, path: str = "<report>") -> AuditInput:
        """A report already in memory (its written schema: the one it carries)."""
        return cls(path, report, report.schema_version, fingerprint_of(report))


def _depth_and_numbers(doc: Any) -> tuple[int, str | None]:
    """The nesting depth of ``doc`` (without recursion) and the path of the first integer too
    large for a float, if any."""
    deepest, stack = 0, [(doc, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest, None
            stack.extend((v, depth + 1, f"{where}.{k}" if where else str(k))
                         for k, v in node.items())
        elif isinstance(node, list):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest, None
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            try:
                float(node)
            except OverflowError:
                return deepest, where or "the document"
    return deepest, None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def verdict_inputs(d: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, value) of every number among the gate's verdict's inputs in a report dict (values
    that are not numbers are the field checks' business)."""

    def sub(name: str) -> Mapping[str, Any]:
        v = d.get(name)
        return v if isinstance(v, Mapping) else {}

    for key in ("claimed_epsilon", "alpha", "delta"):
        yield key, d.get(key)
    for m, v in sub("epsilon_lower_bounds").items():
        yield f"epsilon_lower_bounds.{m}", v
    for m, det in sub("lower_bound_details").items():
        if isinstance(det, Mapping):
            for key in ("bound", "ceiling", "alpha", "level"):
                yield f"lower_bound_details.{m}.{key}", det.get(key)
    power = sub("power")
    for key in ("expected_bound", "min_refutable_epsilon", "claimed_epsilon", "mean_inclusions",
                "replicates"):
        yield f"power.{key}", power.get(key)
    qs = power.get("expected_bound_quantiles")
    for i, v in enumerate(qs if isinstance(qs, list) else []):
        yield f"power.expected_bound_quantiles[{i}]", v
    for key in ("audited_steps", "sample_rate"):
        yield f"training.{key}", sub("training").get(key)
    for section, keys in (("canaries", ("m_one_run", "k_pairs")),
                          ("config", ("m_canaries", "k_pairs"))):
        for key in keys:
            yield f"{section}.{key}", sub(section).get(key)


def _nonfinite(d: Mapping[str, Any]) -> tuple[str, float] | None:
    for where, v in verdict_inputs(d):
        if _number(v) and not math.isfinite(v):
            return where, v
    return None


def _missing_fields(raw: Mapping[str, Any], version: str) -> list[str]:
    """The fields of ``version`` (this version's for a newer minor) that ``raw`` lacks."""
    minor = min(_minor(version), _minor(SCHEMA_VERSION))
    return [f.name for f in dataclasses.fields(ReportData)
            if _FIELDS_SINCE.get(f.name, 0) <= minor and f.name not in raw]


def _read_text(p: Path, where: str) -> str:
    try:
        if p.exists() and not p.is_file():
            raise GateInputError(f"cannot read {where}: not a regular file")
        with p.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise GateInputError(f"cannot read {where}: no such file") from None
    except OSError as exc:
        raise GateInputError(f"cannot read {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise GateInputError(f"{where} is larger than {MAX_BYTES // (1024 * 1024)} MiB: not an "
                             f"audit report (a report of a long run is a few MiB)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise GateInputError(f"cannot read {where}: it is not UTF-8 text") from None


def _parse(text: str, where: str) -> Any:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateInputError(f"cannot read {where}: not valid JSON (line {exc.lineno}, column "
                             f"{exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise GateInputError(f"cannot read {where}: JSON nested too deeply (more than "
                             f"{MAX_DEPTH} levels)") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise GateInputError(f"cannot read {where}: not valid JSON "
                             f"({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    depth, huge = _depth_and_numbers(raw)
    if depth > MAX_DEPTH:
        raise GateInputError(f"cannot read {where}: JSON nested too deeply (more than "
                             f"{MAX_DEPTH} levels)")
    if huge is not None:
        raise GateInputError(f"{where} is not a valid audit report: {huge} is an integer too "
                             f"large for a number")
    return raw


def read_audit(path: str | Path, role: str = "report") -> AuditInput:
    """Read ``audit.json`` (or the directory holding it) for the gate.

    Raises:
        GateInputError: one line naming ``role`` and the path (module docstring: what is
            refused).
    """
    from .report.validate import validate

    p = Path(path)
    if p.is_dir():
        p = p / JSON_NAME
    where = f"the {role} {str(path)!r}"
    raw = _parse(_read_text(p, where), where)
    if not isinstance(raw, dict) or "schema_version" not in raw:
        raise GateInputError(f"{where} is not an audit report (a JSON object with a "
                             f"'schema_version', as dpaudit_torch writes in audit.json)")
    version = raw["schema_version"]
    major = SCHEMA_VERSION.split(".")[0]
    if not isinstance(version, str) or version.split(".")[0] != major:
        raise GateInputError(f"{where} has audit schema {str(version)[:40]!r}: this "
                             f"dpaudit_torch reads schema {major}.x (writes {SCHEMA_VERSION}) "
                             f"and cannot compare it")
    try:
        missing = _missing_fields(raw, version)
    except ValueError as exc:
        raise GateInputError(f"{where} is not a valid audit report: {exc}") from None
    if missing:
        raise GateInputError(f"{where} is not a complete audit report: schema {version} has "
                             f"the field(s) {', '.join(missing)}, which it lacks")
    try:
        report = ReportData.from_dict(raw)
        d = report.to_dict()
    except _CHECK_ERRORS as exc:
        raise GateInputError(f"{where} is not a valid audit report: "
                             f"{_one_line(exc)}") from None
    bad = _nonfinite(d)
    if bad is not None:
        raise GateInputError(f"{where} holds a non-finite number among the gate's inputs: "
                             f"{bad[0]} is {bad[1]!r} (the verdict cannot rest on it)")
    try:
        validate(report)
        fingerprint = fingerprint_of(d)
    except _CHECK_ERRORS as exc:
        raise GateInputError(f"{where} is not a valid audit report: "
                             f"{_one_line(exc)}") from None
    return AuditInput(str(path), report, version, fingerprint)


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 600 else text[:600] + " ..."
