"""The audit report: one archivable record of a privacy audit (``audit.json`` + ``report.html``).

:class:`AuditReport` holds the claimed epsilon beside the audited lower bounds (the one-run bounds
of Steinke, Nasr & Jagielski, NeurIPS 2023, and Mahloujifar, Melis & Chaudhuri, ICML 2025; the
per-step bound of the sequential tests by betting, docs/design.md sections 1-4) and how the audit
was run. Its schema is documented field by field in ``docs/report.md``.

Modules:

* :mod:`~dpaudit_torch.report.schema`: :class:`AuditReport`, field checks, strict JSON
  (non-finite floats as strings), save / load, the verdict and the summary text;
* :mod:`~dpaudit_torch.report.html` (with :mod:`~dpaudit_torch.report.sections` and
  :mod:`~dpaudit_torch.report.markup`): the self-contained HTML page;
* :mod:`~dpaudit_torch.report.plots`: its inline PNG plots (matplotlib, off-screen);
* :mod:`~dpaudit_torch.report.validate`: :func:`validate`, the consistency of a report's fields
  with each other (used by ``dpaudit report`` to refuse a self-contradicting ``audit.json``);
* :mod:`~dpaudit_torch.report.summary` and :mod:`~dpaudit_torch.report.wording`: the plain-text
  summary, and the words for a proven violation (which monitor decided it, what failed).

Method and tester names, labels, colours and the rule of which bound may refute a claim come from
:mod:`dpaudit_torch.registry`.
"""

from __future__ import annotations

from .schema import (
    HTML_NAME,
    JSON_NAME,
    SCHEMA_VERSION,
    VERDICT_NOTHING,
    VERDICT_REFUTED,
    AuditReport,
    format_number,
    library_versions,
)
from .validate import InconsistentReportError, contradictions, validate

__all__ = ["AuditReport", "SCHEMA_VERSION", "JSON_NAME", "HTML_NAME", "VERDICT_NOTHING",
           "VERDICT_REFUTED", "format_number", "library_versions", "validate", "contradictions",
           "InconsistentReportError"]
