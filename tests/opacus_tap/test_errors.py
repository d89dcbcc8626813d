"""Errors that are not the auditor's: an exception raised by the clipping method the auditor wraps
(Opacus, or a subclass / the user's code it runs) carries a note saying so, and the auditor stays
attached; the auditor's own failures still detach it and carry no such note."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.opacus_tap.errors import NOT_OURS_NOTE, add_note, call_theirs  # noqa: E402

CONFIG = dict(k_pairs=4, m_canaries=20, seed=3)
MARK = "the auditor did not cause it"


class ModelError(RuntimeError):
    pass


def _break(opt, method: str) -> None:
    """Make the optimizer's class ``method`` raise ModelError (like a user's subclass)."""
    def boom(self) -> None:
        raise ModelError("raised by the user's optimizer subclass")

    opt.__class__ = type(f"Raising{type(opt).__name__}", (type(opt),), {method: boom})


@pytest.mark.parametrize("mode,method", [("hooks", "clip_and_accumulate"),
                                         ("ghost", "accumulate")])
def test_error_inside_the_wrapped_call_gets_a_note(mode, method):
    s = make_private_setup(mode=mode)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    x, y = next(s.batches(1))
    s.step(x, y)  # a normal audited step first
    assert aud.step == 1
    _break(s.optimizer, method)
    with pytest.raises(ModelError) as info:
        s.step(x, y)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and MARK in notes[0] and f"{method}()" in notes[0]
    # not the auditor's failure: still attached, nothing recorded against it
    assert aud.attached
    assert not any("internal auditor failure" in w for w in aud.warnings)


def test_opacus_own_error_gets_a_note():
    """Opacus's own check (a second step without zero_grad: "Gradients haven't been cleared")
    passes through the wrapper unchanged, with the note."""
    s = make_private_setup(mode="hooks")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    x, y = next(s.batches(1))
    s.step(x, y)
    with pytest.raises(ValueError, match="zero_grad") as info:
        s.optimizer.step()
    assert any(MARK in n for n in getattr(info.value, "__notes__", []))
    assert aud.attached and aud.step == 1


def test_auditor_failure_detaches_without_the_note():
    s = make_private_setup(mode="hooks")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)

    def broken(plan):
        raise KeyError("the auditor's own snapshot failed")

    aud.tap.injector.read_real_sum = broken
    x, y = next(s.batches(1))
    with pytest.raises(KeyError) as info:
        s.step(x, y)
    assert not any(MARK in n for n in getattr(info.value, "__notes__", []))
    assert not aud.attached
    assert any("internal auditor failure" in w for w in aud.warnings)


def test_note_fallback_without_add_note(caplog):
    """Python 3.10 has no BaseException.add_note: the note goes to __notes__ and to the log."""
    class OldStyleError(Exception):
        add_note = None  # as if the interpreter had none

    e = OldStyleError("x")
    with caplog.at_level(logging.ERROR, logger="dpaudit_torch.opacus_tap.errors"):
        add_note(e, "a note")
    assert e.__notes__ == ["a note"]
    assert any("a note" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError) as info:
        call_theirs(lambda: int("nope"), "accumulate")
    assert info.value.__notes__ == [NOT_OURS_NOTE.format(method="accumulate")]
