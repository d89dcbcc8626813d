"""Clipping installed in every form (``opacus_tap/forms.py``): a subclass override, a closure,
lambda, ``types.MethodType``, ``functools.partial`` or decorator on the optimizer instance or
class. The canaries go through the user's code (a wrong bound inside it is what they show),
a form that cannot run on them falls back without touching training and the report says so,
a method installed after attach is adopted, and detach puts back the user's own object."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import capture_released, expected_presence, make_private_setup

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.canaries import SecretCoins, draw_design
from dpaudit_torch.opacus_tap import Injector
from dpaudit_torch.opacus_tap.forms import (
    ClippingNotRunError,
    bound_to,
    describe,
    resolve,
    run_swapped,
)

#: fixed-size batches (PrivateSetup.batches) repeat at every lag, which the sampling monitor
#: proves within a few steps: it is left out of these runs, which test the clipping forms
CONFIG = dict(k_pairs=4, m_canaries=20, seed=3, check_every=2, disable_monitors=("sampling",))
NAME = "clip_and_accumulate"


def _clip_at(opt: Any, factor: float, log: list[bool], real0: Any,
             inner: Callable[[], None] | None = None) -> None:
    """The user's clipping: ``inner`` (Opacus's own method) with the bound multiplied by
    ``factor`` (1: correct); logs whether it ran on the real parameters (False: the
    canaries')."""
    log.append(opt.params[0] is real0)
    c = opt.max_grad_norm
    opt.max_grad_norm = factor * c
    try:
        (inner or _opacus(opt))()
    finally:
        opt.max_grad_norm = c


def _opacus(opt: Any) -> Callable[[], None]:
    from opacus.optimizers import DPOptimizer

    return functools.partial(DPOptimizer.clip_and_accumulate, opt)


def _install(form: str, opt: Any, factor: float = 1.0) -> tuple[list[bool], Any]:
    """Install clipping at ``factor`` C in ``form``; returns (the call log, the object installed
    on the instance, or None for a class form)."""
    log: list[bool] = []
    real0 = opt.params[0]
    base = type(opt)
    if form == "closure":
        captured = opt.clip_and_accumulate  # Opacus's method, bound to the real optimizer

        def clip() -> None:
            _clip_at(opt, factor, log, real0, captured)
        opt.clip_and_accumulate = clip
    elif form == "lambda":
        opt.clip_and_accumulate = lambda: _clip_at(opt, factor, log, real0)
    elif form == "method_type":
        opt.clip_and_accumulate = types.MethodType(
            lambda self: _clip_at(self, factor, log, real0), opt)
    elif form == "partial_user":
        opt.clip_and_accumulate = functools.partial(_clip_at, opt, factor, log, real0)
    elif form == "partial_opacus":  # Opacus's unbound method with the optimizer
        assert factor == 1.0
        inner = functools.partial(base.clip_and_accumulate, opt)

        def logged() -> None:
            log.append(opt.params[0] is real0)
            inner()
        opt.clip_and_accumulate = functools.partial(logged)
    elif form == "decorator_instance":
        def deco(fn: Callable[[], None]) -> Callable[[], None]:
            @functools.wraps(fn)
            def wrapper() -> None:
                _clip_at(opt, factor, log, real0, fn)
            return wrapper
        opt.clip_and_accumulate = deco(opt.clip_and_accumulate)
    elif form == "decorator_class":  # no functools.wraps, on a subclass
        def deco_cls(fn: Callable[[Any], None]) -> Callable[[Any], None]:
            def clip_and_accumulate(self: Any) -> None:
                log.append(self.params[0] is real0)
                c = self.max_grad_norm
                self.max_grad_norm = factor * c
                try:
                    fn(self)
                finally:
                    self.max_grad_norm = c
            return clip_and_accumulate
        opt.__class__ = type("Decorated", (base,), {NAME: deco_cls(base.clip_and_accumulate)})
        return log, None
    elif form == "class_partial":  # a class attribute that does not bind
        opt.__class__ = type("WithPartial", (base,), {
            NAME: functools.partial(_clip_at, opt, factor, log, real0)})
        return log, None
    else:
        raise AssertionError(form)
    return log, vars(opt)[NAME]


FORMS = ["closure", "lambda", "method_type", "partial_user", "partial_opacus",
         "decorator_instance", "decorator_class", "class_partial"]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_runs_with_the_canaries_through_it(form):
    """Correct clipping in every form: training runs to the end with no violation, the user's
    code runs once on the canaries and once on the real examples at every step, the canaries'
    clipping is never replaced, and detach puts back the very object installed."""
    s = make_private_setup(seed=1)
    log, installed = _install(form, s.optimizer)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    assert aud.tap.injector.form
    steps = 6
    for x, y in s.batches(steps):
        s.step(x, y)
    assert aud.step == steps and log.count(False) == steps and log.count(True) == steps
    rep = aud.finalize()
    assert not rep.violation and rep.threat_model["clipping_exercised"]
    assert aud.tap.injector.fallback_steps == 0
    if installed is None:
        assert NAME not in vars(s.optimizer)
    else:
        assert vars(s.optimizer)[NAME] is installed


@pytest.mark.parametrize("form", ["closure", "lambda", "method_type", "partial_user",
                                  "decorator_instance", "decorator_class", "class_partial"])
def test_canaries_are_clipped_by_the_users_bound(form):
    """At sigma = 0, against an unaudited twin with the same code: each canary adds exactly
    what the user's clipping at 4 C makes of it (4 C, not C), so a wrong bound inside the
    user's function is what the canaries show."""
    a = make_private_setup(sigma=0.0, lr=0.0, poisson=False)
    b = make_private_setup(sigma=0.0, lr=0.0, poisson=False)
    _install(form, a.optimizer, 4.0)
    _install(form, b.optimizer, 4.0)
    params = list(a.optimizer.params)
    design = draw_design([tuple(p.shape) for p in params], 4, 30, torch.Generator().manual_seed(0))
    inj = Injector(a.optimizer, params, design, SecretCoins(30, torch.Generator().manual_seed(1)),
                   torch.Generator().manual_seed(2), 1.0 / len(a.loader), canary_norm=25.0,
                   device=torch.device("cpu"))
    inj.attach()
    cap_a, cap_b = capture_released(a, design), capture_released(b, design)
    recs = []
    inj.on_inject = recs.append
    for x, y in a.batches(3, batch=20):
        a.step(x, y)
        b.step(x, y)
        inj.pop_plan()
    assert len(recs) == 3 and inj.fallback_steps == 0
    for rec, va, vb in zip(recs, cap_a, cap_b):
        want = 4.0 * expected_presence(rec, design) * (25.0 / (25.0 + 4e-6))
        torch.testing.assert_close(va - vb, want, atol=1e-4, rtol=0)


def test_a_wrong_bound_inside_a_closure_is_caught():
    s = make_private_setup(seed=2)
    _install("closure", s.optimizer, 10.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    for x, y in s.batches(30):
        s.step(x, y)
        if aud.should_stop:
            break
    # measured: evidence (alpha_warn 0.05) at step 10, the proof (alpha 1e-3) at step 18
    assert aud.evidence and aud.evidence_step <= 12
    assert aud.violation and aud.violation_step <= 30


def _unreachable_forms(opt: Any) -> dict[str, Callable[[], None]]:
    """Correct clipping that cannot run on the canaries: code that reaches the real parameters
    by a captured list (it raises on them), and code that handles only parameters it knows."""
    params = list(opt.params)
    captured = functools.partial(type(opt).clip_and_accumulate, opt)

    def own_list() -> None:
        norms = torch.stack([p.grad_sample.reshape(len(p.grad_sample), -1).norm(2, dim=1)
                             for p in params], dim=1).norm(2, dim=1)
        assert norms.numel() > 0
        captured()

    known = set(map(id, params))

    def known_only() -> None:
        if id(opt.params[0]) in known:
            captured()

    return {"own_list": own_list, "known_only": known_only}


@pytest.mark.parametrize("form", ["own_list", "known_only"])
def test_a_form_that_cannot_run_on_the_canaries_falls_back(form, caplog):
    """Training is never interrupted: the canaries of those steps are added already clipped,
    the audit goes on (no violation for correct clipping), and the report names the check that
    did not run and why; detach restores the user's object."""
    s = make_private_setup(seed=4)
    fn = _unreachable_forms(s.optimizer)[form]
    s.optimizer.clip_and_accumulate = fn
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CONFIG)
    for x, y in s.batches(6):
        s.step(x, y)  # no exception
    assert aud.attached and aud.step == 6 and aud.tap.injector.fallback_steps == 6
    rep = aud.finalize()
    assert not rep.violation and not rep.threat_model["clipping_exercised"]
    note = [n for n in rep.threat_model["notes"] if n.startswith("clipping check not run")]
    assert len(note) == 1 and "6 of 6" in note[0] and "could not be run on the canaries" in note[0]
    assert vars(s.optimizer)[NAME] is fn


def test_a_method_installed_after_attach_is_adopted():
    """A closure that replaces the auditor's wrapper (calling Opacus's method, not the wrapper):
    the step it first runs bypasses the audit, then the wrapper stands in front of it again and
    the canaries go through it; one installed on top of the wrapper (calling it) is adopted the
    same way without recursion. Detach leaves the newest object, and no step raises."""
    s = make_private_setup(seed=5)
    opt = s.optimizer
    aud = PrivacyAuditor(s.engine, opt, s.loader, **CONFIG)
    batches = s.batches(12)
    for _ in range(2):
        s.step(*next(batches))
    calls: list[bool] = []
    real0 = opt.params[0]
    captured = functools.partial(type(opt).clip_and_accumulate, opt)

    def replacing() -> None:
        calls.append(opt.params[0] is real0)
        captured()
    opt.clip_and_accumulate = replacing
    for _ in range(3):
        s.step(*next(batches))
    assert aud.unobserved_steps == 1 and aud.step == 4 and calls.count(False) == 2
    assert vars(opt)[NAME] is not replacing  # the wrapper is back in front of it
    on_top: list[bool] = []
    ours = opt.clip_and_accumulate

    def decorating() -> None:
        on_top.append(opt.params[0] is real0)
        ours()
    opt.clip_and_accumulate = decorating
    for _ in range(3):
        s.step(*next(batches))
    assert aud.step == 7 and on_top.count(True) == 3 and on_top.count(False) == 2
    notes = [n for n in aud.tap.threat_notes() if "replaced after the auditor attached" in n]
    assert len(notes) == 2
    rep = aud.finalize()
    assert not rep.violation and vars(opt)[NAME] is decorating
    s.step(*next(batches))  # after detach: the user's chain alone
    assert on_top[-1] is True and calls[-1] is True


def test_detach_right_after_a_later_install_keeps_it():
    s = make_private_setup(seed=6)
    opt = s.optimizer
    aud = PrivacyAuditor(s.engine, opt, s.loader, **CONFIG)
    ours = opt.clip_and_accumulate
    seen = []

    def later() -> None:
        seen.append(1)
        ours()
    opt.clip_and_accumulate = later
    aud.detach()
    assert vars(opt)[NAME] is later
    s.step(*next(s.batches(1)))  # the stale wrapper passes through: Opacus's method
    assert seen == [1] and aud.tap.injector.steps_injected == 0


# ------------------------------------------------------------------ the helpers
def test_resolve_bound_to_and_describe():
    s = make_private_setup()
    opt = s.optimizer
    base = type(opt)
    assert resolve(opt, NAME, None, False).__func__ is base.clip_and_accumulate
    shadow = object.__new__(base)
    assert bound_to(opt, NAME, shadow).__self__ is shadow
    part = functools.partial(print)
    opt.__class__ = type("P", (base,), {NAME: part, "other": staticmethod(len)})
    assert resolve(opt, NAME, None, False) is part and bound_to(opt, NAME, shadow) is None
    assert bound_to(opt, "other", shadow) is None and resolve(opt, "other", None, False) is len
    assert "functools.partial" in describe(part, True) and "instance" in describe(part, True)
    assert "lambda" in describe(lambda: None, False) and "class" in describe(len, False)
    assert "bound" in describe(types.MethodType(len, opt), True)


def test_run_swapped_restores_state_and_gradients_on_failure():
    s = make_private_setup()
    opt = s.optimizer
    x, y = next(s.batches(1))
    opt.zero_grad()
    s.criterion(s.model(x), y).backward()
    own, grads = opt.__dict__, [p.grad_sample for p in opt.params]
    seen = []

    def failing() -> None:
        seen.append((opt.__dict__ is state, all(p.grad_sample is None for p in params)))
        raise KeyError("boom")
    state, params = {"marker": 1}, list(opt.params)
    with pytest.raises(ClippingNotRunError, match="KeyError"):
        run_swapped(opt, failing, state, params)
    assert seen == [(True, True)] and opt.__dict__ is own
    assert all(p.grad_sample is g for p, g in zip(opt.params, grads))
