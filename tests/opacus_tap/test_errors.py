"""Errors that are not the auditor's: an exception raised by the clipping method the auditor wraps
(Opacus, or a subclass / the user's code it runs) carries a note saying so, and the auditor stays
attached; the auditor's own failures still detach it and carry no such note (by default the step
then goes on without the auditor and nothing is raised; with on_internal_error="raise" the
auditor's own exception propagates)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

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


def _params(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


def test_auditor_failure_detaches_without_the_note():
    """on_internal_error="raise": the auditor's own failure propagates as it is, without the
    note, and the auditor is detached."""
    s = make_private_setup(mode="hooks")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, on_internal_error="raise", **CONFIG)

    def broken(plan):
        raise KeyError("the auditor's own snapshot failed")

    aud.tap.injector.read_real_sum = broken
    x, y = next(s.batches(1))
    before = _params(s.model)
    with pytest.raises(KeyError) as info:
        s.step(x, y)
    assert not any(MARK in n for n in getattr(info.value, "__notes__", []))
    assert not aud.attached
    assert all(torch.equal(p, q) for p, q in zip(before, s.model.parameters()))
    assert any("internal auditor failure" in w for w in aud.warnings)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_auditor_failure_continues_by_default(mode):
    """The default (on_internal_error="continue"): the same failure raises nothing, the auditor
    detaches, and the step is applied exactly as by an unaudited twin (same seeds)."""
    s, twin = make_private_setup(mode=mode), make_private_setup(mode=mode)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)

    def broken(plan):
        raise KeyError("the auditor's own snapshot failed")

    aud.tap.injector.read_real_sum = broken
    for x, y in s.batches(2):
        s.step(x, y)  # no exception
        twin.step(x, y)
    assert not aud.attached and aud.step == 0
    assert all(torch.equal(p, q) for p, q in zip(_params(s.model), _params(twin.model)))
    assert any("internal auditor failure at step 1" in w for w in aud.warnings)


def test_users_error_in_the_canaries_clipping_surfaces_first(monkeypatch):
    """The canaries' clipping runs the optimizer's own clipping code first: when it fails
    because that code is broken, the real call fails the same way and the user's error is what
    surfaces (with the note); the auditor stays attached, as for any error of that call."""
    s = make_private_setup(mode="hooks")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    aud.tap.injector.shadow.replica_clip = False  # the optimizer's own code on the shadow
    _break(s.optimizer, "clip_and_accumulate")
    x, y = next(s.batches(1))
    with pytest.raises(ModelError) as info:
        s.step(x, y)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and MARK in notes[0]
    assert aud.attached and not any("internal auditor failure" in w for w in aud.warnings)


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
