"""The class users get: :class:`AuditReport`, the report's data with its files and renderings.

:class:`AuditReport` is :class:`~dpaudit_torch.report.schema.ReportData` (the fields, their checks,
their JSON and the verdict) plus what is made from them: the self-contained HTML page
(:mod:`dpaudit_torch.report.html`), the plain-text summary (:mod:`dpaudit_torch.report.summary`)
and the two files written by :meth:`AuditReport.save`. It sits above the schema and the renderers
and imports both; they import only the schema, so the package has no import circle.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .html import render_html
from .schema import HTML_NAME, JSON_NAME, ReportData
from .summary import summary_text

logger = logging.getLogger(__name__)

__all__ = ["AuditReport"]


@dataclass
class AuditReport(ReportData):
    """Result of a privacy audit: claimed epsilon beside audited lower bounds, and how it was run.

    Every field is a plain JSON-able value and has a default, so a report can be built piecemeal.
    The schema is documented field by field in ``docs/report.md`` (version
    :data:`~dpaudit_torch.report.SCHEMA_VERSION`); the fields, :meth:`to_dict`, :meth:`to_json`,
    :meth:`from_dict`, :meth:`load` and :attr:`verdict` come from
    :class:`~dpaudit_torch.report.schema.ReportData`.

    Lower bounds hold with probability at least ``1 - alpha`` over the audit's randomness
    (canary coins); they can prove a claim false, never true.
    """

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``audit.json`` and a self-contained ``report.html`` into ``directory``.

        The directory is created if needed. Returns the directory as a :class:`~pathlib.Path`.

        Raises:
            ValueError: the report does not validate.
            OSError: the directory cannot be created or written; one error whose message names
                the directory (the underlying error is its ``__cause__``).
        """
        out = Path(directory)
        text = self.to_json()
        page = self.to_html()
        try:
            out.mkdir(parents=True, exist_ok=True)
            _atomic_write(out / JSON_NAME, text + "\n")
            _atomic_write(out / HTML_NAME, page)
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
            raise OSError(f"cannot write the audit report into {str(out)!r}: {why}") from exc
        logger.info("audit report written to %s", out)
        return out

    def summary_text(self) -> str:
        """A few plain-language lines: the verdict, the whole-run claim beside its lower bounds,
        the per-step bound on a line of its own, the deciding monitors and the findings
        (:func:`dpaudit_torch.report.summary.summary_text`)."""
        return summary_text(self)

    def to_html(self) -> str:
        """The self-contained HTML page (no network access; plots inline)."""
        return render_html(self)


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
