"""The audit report: one archivable record of a privacy audit (``audit.json`` + ``report.html``).

:class:`AuditReport` holds the claimed epsilon beside the audited lower bounds (the one-run bounds
of Steinke, Nasr & Jagielski, NeurIPS 2023, and Mahloujifar, Melis & Chaudhuri, ICML 2025; the
per-step bound of the sequential tests by betting, docs/design.md sections 1-4) and how the audit
was run. Its schema is documented field by field in ``docs/report.md``.

Modules, from the bottom up (each imports only those above it in this list):

* :mod:`~dpaudit_torch.report.schema`: the data layer: :class:`~.schema.ReportData` (the fields,
  their checks, strict JSON with non-finite floats as strings, ``from_dict`` / ``load``, the
  verdict), the verdict vocabulary and a few readings of the data; it imports no renderer;
* :mod:`~dpaudit_torch.report.fingerprint`: the audit's fingerprint (what the audit was) and the
  strength order of two audits (used by the release gate, ``dpaudit gate``);
* :mod:`~dpaudit_torch.report.formatting`: how numbers, scopes and recurring sentences are written
  in words (shared by the page and the summary);
* :mod:`~dpaudit_torch.report.wording`: the words for a proven violation (which monitor decided
  it, what failed), monitors named by the report's ``monitor_labels``;
* :mod:`~dpaudit_torch.report.summary`: the plain-text summary;
* :mod:`~dpaudit_torch.report.markup` (HTML building blocks), :mod:`~dpaudit_torch.report.view`
  (the page's view of a report), :mod:`~dpaudit_torch.report.plots` (inline PNG plots),
  :mod:`~dpaudit_torch.report.bounds` and :mod:`~dpaudit_torch.report.sections` (the page's
  sections) and :mod:`~dpaudit_torch.report.html` (the self-contained page);
* :mod:`~dpaudit_torch.report.audit_report`: :class:`AuditReport`, the data with its files and
  renderings (``save``, ``to_html``, ``summary_text``);
* :mod:`~dpaudit_torch.report.build`: :func:`~.build.build_report`, the verdict rules applied to
  the parts of an audit;
* :mod:`~dpaudit_torch.report.validate`: :func:`validate`, the consistency of a report's fields
  with each other (used by ``dpaudit report`` to refuse a self-contradicting ``audit.json``).

Method and tester names, labels, colours and the rule of which bound may refute a claim come from
:mod:`dpaudit_torch.registry`; monitors are named by the report itself (``monitor_labels``).
"""

from __future__ import annotations

from .audit_report import AuditReport
from .formatting import format_number
from .schema import (
    HTML_NAME,
    JSON_NAME,
    SCHEMA_VERSION,
    VERDICT_NOTHING,
    VERDICT_REFUTED,
    library_versions,
)
from .validate import InconsistentReportError, contradictions, validate

__all__ = ["AuditReport", "SCHEMA_VERSION", "JSON_NAME", "HTML_NAME", "VERDICT_NOTHING",
           "VERDICT_REFUTED", "format_number", "library_versions", "validate", "contradictions",
           "InconsistentReportError"]
