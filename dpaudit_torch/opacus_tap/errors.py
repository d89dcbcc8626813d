"""Exceptions that are not the auditor's: a note on errors raised by Opacus or by the user's code
inside the clipping call the auditor wraps.

The auditor stands in front of the optimizer instance's clipping method (``clip_and_accumulate``,
or ``accumulate`` under ghost clipping), so an error raised *by* that method (Opacus's own checks,
a subclass of the optimizer, the user's model or hooks it runs) shows a traceback that passes
through the auditor's wrapper. :func:`call_theirs` adds a note (PEP 678) saying where the error
comes from; the exception itself, its type and its traceback are unchanged, and the auditor stays
attached (it detaches only when its own code fails).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

__all__ = ["call_theirs", "NOT_OURS_NOTE"]

T = TypeVar("T")

#: the note added to an exception raised inside the wrapped call
NOT_OURS_NOTE = (
    "dpaudit_torch: this exception was raised by Opacus or by the model / optimizer code inside "
    "the optimizer's {method}(), which the PrivacyAuditor wraps; the auditor did not cause it "
    "(the traceback passes through the auditor's wrapper only because it calls that method). "
    "The auditor is still attached.")


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python >= 3.11); on older versions the note is appended to
    ``exc.__notes__`` (shown by tools that backport PEP 678) and logged."""
    adder = getattr(exc, "add_note", None)
    if callable(adder):
        adder(note)
        return
    try:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
        notes.append(note)
        exc.__notes__ = notes  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type that refuses attributes
        pass
    logger.error("%s: %s", type(exc).__name__, note)


def call_theirs(fn: Callable[[], T], method: str) -> T:
    """``fn()`` (Opacus's clipping method); an exception it raises gets the note
    :data:`NOT_OURS_NOTE` and propagates unchanged otherwise."""
    try:
        return fn()
    except Exception as e:
        add_note(e, NOT_OURS_NOTE.format(method=method))
        raise
