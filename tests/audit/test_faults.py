"""PrivacyAuditor under faults: non-finite gradients, failures inside the
auditor, frozen parameters, several parameter groups, parameters added after attach, autocast.

All runs use a tiny MLP and a few steps (each test takes a second or two)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import capture_released as _capture
from conftest import expected_presence, make_private_setup
from conftest import optimizer_untouched as _untouched
from torch import nn

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.opacus_tap import GradientReader
from dpaudit_torch.opacus_tap.plan import StepPlanner
from dpaudit_torch.opacus_tap.shadow import ShadowClipper

SMALL = dict(k_pairs=4, m_canaries=40, check_every=2)


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _nan_batch(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[0, 0] = float("nan")  # one example: its per-sample gradient, hence the clipped sum, is NaN
    return x


def _build(freeze_first: bool = False, groups: bool = False, first_layer_only: bool = False,
           sigma: float = 1.0):
    """A 16-32-2 MLP made private with a custom optimizer layout."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    X = torch.randn(128, 16, generator=g)
    Y = (X[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    if freeze_first:
        model[0].weight.requires_grad_(False)
    if groups:
        opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                               {"params": model[2].parameters(), "lr": 0.05}], lr=0.1)
    elif first_layer_only:
        opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    else:
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    dl = DataLoader(TensorDataset(X, Y), batch_size=16)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=sigma,
            max_grad_norm=1.0, noise_generator=torch.Generator().manual_seed(1))
    return engine, model, opt, dl, X, Y


def _step(model, opt, x, y) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


# ------------------------------------------------------------------ non-finite gradients
def test_nonfinite_raise_before_update_state_untouched():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **SMALL)
    batches = list(s.batches(3, batch=16))
    s.step(*batches[0])
    before, step, scores = _params(s.model), aud.step, aud.monitors["one_run"].stacked_scores()
    with pytest.raises(ValueError, match="non-finite gradient at canary"):
        s.step(_nan_batch(batches[1][0]), batches[1][1])
    assert _same(_params(s.model), before)  # the update was not applied
    assert aud.step == step and torch.equal(aud.monitors["one_run"].stacked_scores(), scores)
    assert aud.attached and not _untouched(s.optimizer)  # still auditing
    s.step(*batches[2])  # training goes on
    assert aud.step == step + 1


def _sanitizer(opt):
    """A user's own pre-hook that runs after the auditor's and zeroes non-finite gradients (so
    that one bad batch does not poison the parameters of the skip test)."""
    def hook(_o, _a, _k):
        for p in opt.params:
            if p.grad is not None:
                p.grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return opt.original_optimizer.register_step_pre_hook(hook)


def _skip_run(deferred: bool):
    """on_nonfinite="skip": the bad step's observation is dropped and counted, on the host at
    once (CPU) or at the next decision (the accelerator path, forced here on CPU)."""
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, on_nonfinite="skip", **SMALL)
    aud.tap.reader.check_finite_every_step = not deferred
    _sanitizer(s.optimizer)
    n = 7
    for i, (x, y) in enumerate(s.batches(n, batch=16)):
        s.step(_nan_batch(x) if i in (2, 5) else x, y)
    rep = aud.finalize()
    assert rep.training["nonfinite_steps_skipped"] == 2
    assert not rep.threat_model["every_step_observed"]
    assert any("non-finite" in w for w in rep.warnings)
    for t in aud.monitors["sequential_pairs"].segment.testers.values():
        assert t.n_pairs == (n - 2) * aud.config.k_pairs
    hist = rep.wealth_history
    assert all(math.isfinite(v) for k, vals in hist.items() for v in vals)
    assert torch.isfinite(aud.monitors["one_run"].stacked_scores()).all()
    assert math.isfinite(rep.sequential["combined_log_wealth"])
    return rep


def test_nonfinite_skip_counts_and_never_nan_on_both_paths():
    a = _skip_run(False)
    b = _skip_run(True)
    assert a.wealth_history == b.wealth_history
    # the same scores; the host path adds the likelihood-ratio score with NumPy, the deferred
    # path with torch: they may differ in the last bits
    for side in ("in", "out"):
        np.testing.assert_allclose(a.one_run_scores[side], b.one_run_scores[side],
                                   rtol=1e-12, atol=1e-12)


def test_on_nonfinite_validated():
    s = make_private_setup(sigma=1.0)
    with pytest.raises(ValueError, match="on_nonfinite"):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, on_nonfinite="ignore")
    assert _untouched(s.optimizer)


# ------------------------------------------------------------------ failures inside the auditor
def _boom(*_a, **_k):
    raise RuntimeError("injected failure")


def test_on_internal_error_validated_and_reported():
    from dpaudit_torch.audit import AuditConfig

    assert AuditConfig().on_internal_error == "continue"
    assert AuditConfig(on_internal_error="raise").to_dict()["on_internal_error"] == "raise"
    s = make_private_setup(sigma=1.0)
    with pytest.raises(ValueError, match="on_internal_error.*'ignore'"):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, on_internal_error="ignore")
    assert _untouched(s.optimizer)


@pytest.mark.parametrize("where", ["observation", "injection", "plan"])
def test_internal_failure_raise_restores_optimizer_model_untouched(monkeypatch, where):
    """on_internal_error="raise": an exception inside the auditor: the step raises before its
    update, the auditor detaches itself (every wrapped attribute back, pre-hook removed),
    p.grad_sample holds the real per-sample gradients, and training then goes on exactly like an
    unaudited optimizer (sigma = 0 so the comparison with the twin is exact)."""
    a = make_private_setup(sigma=0.0)
    b = make_private_setup(sigma=0.0)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=1, on_internal_error="raise",
                         **SMALL)
    # fault injection at three points of the auditor's own code inside a step
    target = {"observation": (GradientReader, "read"),
              "injection": (ShadowClipper, "write_rows"), "plan": (StepPlanner, "plan")}[where]
    monkeypatch.setattr(*target, _boom)
    batches = list(a.batches(3, batch=16))
    before = _params(a.model)
    with pytest.raises(RuntimeError, match="injected failure"):
        a.step(*batches[0])
    monkeypatch.undo()
    assert _same(_params(a.model), before)
    assert _untouched(a.optimizer) and not aud.attached
    for p in a.optimizer.params:  # the real per-sample gradients, as Opacus left them
        assert p.grad_sample is not None and p.grad_sample.shape[0] == 16
    assert any("internal auditor failure" in w for w in aud.warnings)
    for x, y in batches:
        a.step(x, y)
        b.step(x, y)
    assert _same(_params(a.model), _params(b.model))
    rep = aud.finalize()  # the audit of what it saw is still reported
    assert any("internal auditor failure" in w for w in rep.warnings)
    assert rep.training["audit_incomplete_from_step"] == 1


#: Opacus's adaptive clipping (noise drawn by its own add_noise)
ADAPTIVE = dict(clipping="adaptive", target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                max_clipbound=10.0, min_clipbound=0.1, unclipped_num_std=2.0)


def _sync(a, b) -> None:
    """The unaudited twin ``b`` from where the audited run ``a`` stands: its parameters, its
    noise generator and (adaptive clipping) its clipping bound."""
    b.model.load_state_dict(a.model.state_dict())
    b.optimizer.generator.set_state(a.optimizer.generator.get_state())
    bound = a.optimizer.max_grad_norm
    b.optimizer.max_grad_norm = bound.clone() if isinstance(bound, torch.Tensor) else bound


def _partial_add(monkeypatch, aud) -> None:
    """The canaries' addition (torch path) fails after the first tensors were added."""
    aud.tap.injector.shadow.compiled_add = False
    real = ShadowClipper._add_torch

    def half(self, adds, counts, col_flat, added=None):
        last = max(i for i, c in enumerate(counts.tolist()) if c)
        real(self, [None if i == last else t for i, t in enumerate(adds)], counts, col_flat,
             added)

    monkeypatch.setattr(ShadowClipper, "_add_torch", half)


def _bad_observation(*_a, **_k):
    raise ValueError("a bug of the reader, not a refusal")


#: where the auditor's own code is made to fail inside a step, in step order: before the real
#: clipping (plan, the canaries' rows and clipping), after it (the snapshot, the canaries'
#: addition cut half-way, all of them added), after the noise (the observation, a monitor)
FAILURES = {
    "plan": lambda mp, aud: mp.setattr(StepPlanner, "plan", _boom),
    "shadow_clip": lambda mp, aud: mp.setattr(ShadowClipper, "clip", _boom),
    "write_rows": lambda mp, aud: (setattr(aud.tap.injector.shadow, "replica_clip", False),
                                   mp.setattr(ShadowClipper, "write_rows", _boom)),
    "snapshot": lambda mp, aud: mp.setattr(aud.tap.injector, "read_real_sum", _boom),
    "partial_add": _partial_add,
    "after_add": lambda mp, aud: mp.setattr(aud.tap.injector, "finish_step", _boom),
    "read": lambda mp, aud: mp.setattr(GradientReader, "read", _bad_observation),
    "monitor": lambda mp, aud: mp.setattr(aud.monitors["noise"], "observe", _boom),
}
FAIL_AT = 3  # the failing step (two audited steps before it)


def _continue_run(monkeypatch, where: str, sigma: float, n_steps: int = 5, mode: str = "hooks",
                  audit: dict | None = None, **kw):
    """An audited run whose auditor fails at step FAIL_AT, and its unaudited twin taken from the
    audited run's parameters and noise generator right before that step: returns them, the
    auditor and the largest parameter difference after every step from the failing one on."""
    a = make_private_setup(sigma=sigma, mode=mode, **kw)
    b = make_private_setup(sigma=sigma, mode=mode, **kw)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=1, **SMALL, **(audit or {}))
    diffs, injected = [], None
    for i, (x, y) in enumerate(a.batches(n_steps, batch=16), 1):
        if i == FAIL_AT:
            _sync(a, b)
            FAILURES[where](monkeypatch, aud)
        a.step(x, y)  # no exception reaches the training loop
        if i < FAIL_AT:
            continue
        b.step(x, y)
        diffs.append(max(float((p - q).abs().max()) for p, q in zip(_params(a.model),
                                                                      _params(b.model))))
        if i == FAIL_AT:
            monkeypatch.undo()
            assert not aud.attached and _untouched(a.optimizer)
            injected = aud.tap.injector.steps_injected
    assert aud.step == FAIL_AT - 1  # later steps are not audited
    assert aud.tap.injector.steps_injected == injected
    return aud, diffs


def _incomplete_report(aud, where: str) -> None:
    rep = aud.finalize()
    assert rep.training["audit_incomplete_from_step"] == FAIL_AT
    assert rep.training["audited_steps"] == FAIL_AT - 1
    assert rep.threat_model["every_step_observed"] is False
    notes = [f for f in rep.findings if f["monitor"] == "auditor"]
    assert len(notes) == 1 and notes[0]["level"] == "note"
    assert f"incomplete from step {FAIL_AT}" in notes[0]["message"]
    said = {"read": "ValueError: a bug of the reader",
            "partial_add": "left no summed_grad"}.get(where, "injected failure")
    assert said in notes[0]["message"]
    assert "auditor" in rep.monitor_labels
    assert any(f"incomplete from step {FAIL_AT}" in w and "as without the auditor" in w
               for w in rep.warnings)
    assert rep.verdict == "nothing found"  # a correct run: nothing claimed past the audit


@pytest.mark.parametrize("where,sigma", [(w, 1.0) for w in FAILURES] + [
    (w, 0.0) for w in ("plan", "partial_add", "read")])
def test_internal_failure_continue_applies_the_step_as_without_the_auditor(monkeypatch, where,
                                                                           sigma):
    """on_internal_error="continue" (the default): wherever the auditor's own code fails inside a
    step, no exception reaches the training loop, the auditor detaches, and the parameters after
    the failing step and after every later (unaudited) step equal those of an unaudited twin
    that took the same steps from the same parameters and noise generator state, bit for bit:
    before the real clipping nothing was changed; after it the canaries' additions to
    summed_grad are put back; after the noise the optimizer's own add_noise and scale_grad run
    again from the kept generator state. The report says the audit is incomplete from the
    failing step."""
    aud, diffs = _continue_run(monkeypatch, where, sigma)
    assert diffs == [0.0] * len(diffs)
    _incomplete_report(aud, where)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("where", ["plan", "snapshot", "after_add", "read", "monitor"])
def test_internal_failure_continue_python_mode_host_thread(monkeypatch, where, mode):
    """The same with the kernels in Python mode (the default for large models): the auditor's
    part of each step runs on its host thread (the training thread waiting for it), the
    canaries are added by torch operations and read by the vectorised NumPy pass. A failure
    there comes back to the training thread and is handled as in place; the thread ends with
    the detach."""
    import dpaudit_torch.opacus_tap.tap as tap_module

    threads = []

    class Recorded(tap_module.HostThread):
        def __init__(self) -> None:
            super().__init__()
            threads.append(self)

    monkeypatch.setattr(tap_module, "HostThread", Recorded)
    aud, diffs = _continue_run(monkeypatch, where, 1.0, mode=mode,
                               audit={"compiled_kernels": False})
    assert len(threads) == 1 and not threads[0].alive
    assert aud.tap.host_thread is None
    assert diffs == [0.0] * len(diffs)
    _incomplete_report(aud, where)


@pytest.mark.parametrize("where", ["plan", "after_add", "read"])
def test_internal_failure_continue_ghost_clipping(monkeypatch, where):
    """The same under ghost clipping (the clipped canaries added after Opacus's accumulate)."""
    aud, diffs = _continue_run(monkeypatch, where, 1.0, mode="ghost")
    assert diffs == [0.0] * len(diffs)
    _incomplete_report(aud, where)


@pytest.mark.parametrize("sigma", [0.0, 1.0])
@pytest.mark.parametrize("where", ["after_add", "read"])
def test_internal_failure_continue_adaptive_clipping(monkeypatch, where, sigma):
    """Adaptive clipping draws its noise with its own add_noise (it also noises the unclipped
    count and moves the bound afterwards), so after the noise the canaries' contribution is
    subtracted at their coordinates instead: exact without noise; with noise within one unit in
    the last place of float32 at those coordinates (lr 0.1 x the gradient's ulp, well below
    1e-7 here), since the step's noise is not kept and the rounding of summed + noise cannot be
    undone. Before the noise (after_add) it is exact as in every mode."""
    aud, diffs = _continue_run(monkeypatch, where, sigma, **ADAPTIVE)
    if where == "read" and sigma > 0:
        assert max(diffs) < 1e-7
    else:
        assert diffs == [0.0] * len(diffs)
    _incomplete_report(aud, where)


@pytest.mark.parametrize("where", ["after_add", "read"])
def test_internal_failure_continue_needs_the_canaries_taken_out(monkeypatch, where):
    """Control: without putting the canaries' values back (or, after the noise, without
    recomputing the released gradient) the failing step's update differs from the twin's, so
    the tests above do see the canaries."""
    from dpaudit_torch.opacus_tap import recovery

    monkeypatch.setattr(recovery.Added, "restore", lambda self: None)
    monkeypatch.setattr(recovery, "_replay", lambda *a, **k: None)
    _, diffs = _continue_run(monkeypatch, where, 1.0, n_steps=FAIL_AT)
    assert diffs[0] > 1e-4


def test_internal_failure_when_taking_the_canaries_out_fails_training_goes_on(monkeypatch):
    """The observation path never breaks training: if even taking the canaries out of the
    update fails, the step is applied (with them, as the warning says) and training goes on."""
    from dpaudit_torch.opacus_tap import recovery

    def broken(*_a, **_k):
        raise RuntimeError("replay failed")

    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **SMALL)
    monkeypatch.setattr(GradientReader, "read", _boom)
    monkeypatch.setattr(recovery, "_replay", broken)
    batches = list(s.batches(3, batch=16))
    s.step(*batches[0])
    monkeypatch.undo()
    assert not aud.attached and _untouched(s.optimizer)
    assert any("could not be taken out" in w and "replay failed" in w for w in aud.warnings)
    for x, y in batches[1:]:
        s.step(x, y)
    assert all(torch.isfinite(p).all() for p in s.model.parameters())
    assert aud.finalize().training["audit_incomplete_from_step"] == 1


def test_canary_rows_buffer_is_zero_between_steps(monkeypatch):
    """The canary rows are compact (one column per canary entry of the step, whatever the
    model's size) and live in one persistent buffer: the optimizer class's own clipping runs on
    them (on a shadow of the optimizer, not on the real one), each row holds exactly its canary
    (one entry of canary_norm * C, L entries of canary_norm * C / sqrt(L) for a spread canary),
    and after every step (and after a step whose canary clipping raised) the buffer is all zeros
    again."""
    a = make_private_setup(sigma=0.0)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=2, **SMALL)
    inj = aud.tap.injector
    cls = type(a.optimizer)
    class_clip = cls.clip_and_accumulate
    seen: list[tuple[int, int, int, float]] = []

    def spy(self):
        if self is not a.optimizer:  # the canaries' call, on the shadow
            buf = inj.rows_buffer
            lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
            assert all(lo <= p.grad_sample.data_ptr() < hi for p in self.params
                       if p.grad_sample.numel())  # views of the persistent buffer
            rows = torch.cat([p.grad_sample for p in self.params], dim=1)
            seen.append((int(rows.shape[0]), int(rows.shape[1]), int((rows != 0).sum()),
                         float(rows.norm(dim=1).max())))
        return class_clip(self)

    monkeypatch.setattr(cls, "clip_and_accumulate", spy)
    for x, y in a.batches(4, batch=16):
        a.step(x, y)
        assert inj.rows_buffer is not None and not bool(inj.rows_buffer.any())
    assert len(seen) == 4
    d = aud.design
    extra = d.n_spread * (d.spread_width - 1)  # a spread row has L entries
    assert d.n_spread
    for n_rows, n_cols, nonzero, biggest in seen:
        assert n_cols == nonzero == n_rows + extra  # one column per entry
        assert biggest == pytest.approx(aud.config.canary_norm * 1.0)  # every row's norm
    most = max(r * c for r, c, *_ in seen)
    assert inj.rows_buffer.numel() <= 2 * most + 64  # sized by the entries
    assert inj.rows_buffer.numel() < aud.tap.n_coordinates  # far from one row of size d

    # a failure inside the canaries' clipping call still leaves the buffer clean
    def failing(self):
        if self is not a.optimizer:
            raise RuntimeError("clipping failed")
        return class_clip(self)

    monkeypatch.setattr(cls, "clip_and_accumulate", failing)
    a.step(*next(iter(a.batches(1, batch=16))))  # no exception
    # the optimizer's code, not the auditor's, failed on the canaries: that step's canaries
    # were added already clipped and the report says so (opacus_tap/forms.py)
    assert aud.attached and inj.fallback_steps == 1
    assert any("clipping failed" in n for n in aud.tap.threat_notes())
    assert not bool(inj.rows_buffer.any())


# ------------------------------------------------------------------ parameters
def test_frozen_parameters_never_canaries():
    engine, model, opt, dl, X, Y = _build(freeze_first=True)
    aud = PrivacyAuditor(engine, opt, dl, seed=1, **SMALL)
    frozen = model._module[0].weight
    assert all(p is not frozen for p in aud.tap.params)
    assert [tuple(s) for s in aud.design.shapes] == [(32,), (2, 32), (2,)]
    for i in range(3):
        _step(model, opt, X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16])
    assert aud.step == 3
    rep = aud.finalize()
    assert all(p["pairs"] + p["one_run"] > 0 for p in rep.canaries["per_parameter"])


def test_several_parameter_groups():
    """Two groups with different learning rates: canaries in every tensor of both groups, and
    at sigma = 0 a present canary adds exactly C (here 1) at its coordinate."""
    engine, model, opt, dl, X, Y = _build(groups=True, sigma=0.0)
    _, model_b, opt_b, _, _, _ = _build(groups=True, sigma=0.0)
    aud = PrivacyAuditor(engine, opt, dl, seed=2, **SMALL)
    assert len(opt.param_groups) == 2
    recs = []
    aud.tap.injector.on_inject = recs.append

    class _S:  # the shape _capture expects
        def __init__(self, o):
            self.optimizer = o

    cap_a, cap_b = _capture(_S(opt), aud.design), _capture(_S(opt_b), aud.design)
    for i in range(3):
        x, y = X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16]
        _step(model, opt, x, y)
        _step(model_b, opt_b, x, y)
    rep = aud.finalize()
    assert all(p["pairs"] + p["one_run"] > 0 for p in rep.canaries["per_parameter"])
    assert len(rep.canaries["per_parameter"]) == 4
    # the twins have the same parameters at step 1 only (the canaries move the audited one)
    exp = expected_presence(recs[0], aud.design)
    assert torch.allclose(cap_a[0] - cap_b[0], exp, rtol=1e-6, atol=1e-6)


def test_model_parameter_added_after_attach_rejected():
    engine, model, opt, dl, X, Y = _build(first_layer_only=True)
    aud = PrivacyAuditor(engine, opt, dl, seed=1, k_pairs=4, m_canaries=20)
    _step(model, opt, X[:16], Y[:16])
    opt.add_param_group({"params": list(model._module[2].parameters()), "lr": 0.1})
    before, step = _params(model), aud.step
    with pytest.raises(ValueError, match="trainable parameters changed after"):
        _step(model, opt, X[16:32], Y[16:32])
    assert _same(_params(model), before) and aud.step == step and aud.attached
    hist = len(engine.accountant.history)
    assert hist == 1  # the step did not reach the accountant either


def test_foreign_parameter_added_after_attach_rejected():
    engine, model, opt, dl, X, Y = _build()
    aud = PrivacyAuditor(engine, opt, dl, seed=1, **SMALL)
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(3))]})
    before = _params(model)
    with pytest.raises(ValueError):  # Opacus itself refuses first (no per-sample gradient)
        _step(model, opt, X[:16], Y[:16])
    assert _same(_params(model), before) and aud.step == 0


def test_parameter_frozen_after_attach_rejected():
    engine, model, opt, dl, X, Y = _build()
    aud = PrivacyAuditor(engine, opt, dl, seed=1, **SMALL)
    _step(model, opt, X[:16], Y[:16])
    model._module[0].weight.requires_grad_(False)
    before = _params(model)
    with pytest.raises(ValueError, match="requires_grad changed"):
        _step(model, opt, X[16:32], Y[16:32])
    assert _same(_params(model), before) and aud.step == 1


# ------------------------------------------------------------------ autocast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training(dtype):
    """Mixed precision forward (per-sample gradients in bf16 / fp16): the canary rows take the
    per-sample gradients' dtype, the statistics stay in float64. At sigma = 0 a present canary
    contributes C up to the half-precision rounding of Opacus's clipping (relative 2^-7 for
    bf16's 8-bit mantissa, tighter for fp16)."""
    a = make_private_setup(sigma=0.0, lr=0.0)
    b = make_private_setup(sigma=0.0, lr=0.0)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=4, **SMALL)
    recs = []
    aud.tap.injector.on_inject = recs.append
    cap_a, cap_b = _capture(a, aud.design), _capture(b, aud.design)

    def amp_step(s, x, y):
        s.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = s.criterion(s.model(x), y)
        loss.backward()
        assert s.optimizer.params[0].grad_sample.dtype == dtype
        s.optimizer.step()

    for x, y in a.batches(4, batch=16):
        amp_step(a, x, y)
        amp_step(b, x, y)
    aud.finalize()
    for rec, va, vb in zip(recs, cap_a, cap_b):
        exp = expected_presence(rec, aud.design)
        assert torch.allclose(va - vb, exp, rtol=0, atol=2.0 ** -6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_statistics_in_float64(dtype):
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=4, k_pairs=4, m_canaries=40,
                         check_every=3)
    for i, (x, y) in enumerate(s.batches(6, batch=16)):
        s.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = s.criterion(s.model(x), y)
        loss.backward()
        s.optimizer.step()
        if i == 0:  # observations are float64 from the start
            assert aud.monitors["sequential_pairs"].buffer_x[0].dtype == torch.float64
    rep = aud.finalize()
    assert aud.monitors["one_run"].stacked_scores().dtype == torch.float64
    for t in aud.monitors["sequential_pairs"].segment.testers.values():
        assert t.n_pairs == 6 * 4
    assert math.isfinite(rep.sequential["combined_log_wealth"])
    assert all(math.isfinite(v) for v in rep.one_run_scores["in"] + rep.one_run_scores["out"])
