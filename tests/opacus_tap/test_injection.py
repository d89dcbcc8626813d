"""The injector (``opacus_tap/injection.py``): the strategy composed for each Opacus mode, the
strategies' public interfaces, the wrapper installed on the optimizer and removed at detach,
the step bookkeeping it hosts, and canaries that reach the released gradient exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import capture_released, expected_presence, make_private_setup

from dpaudit_torch.canaries import SecretCoins, draw_design
from dpaudit_torch.opacus_tap import Injector
from dpaudit_torch.opacus_tap.ghost import GhostInjection
from dpaudit_torch.opacus_tap.injection import PerSampleInjection
from dpaudit_torch.opacus_tap.plan import InjectionHost, StepPlan, StepPlanner
from dpaudit_torch.opacus_tap.shadow import ShadowClipper, WrappedClipping

ADAPTIVE = {"target_unclipped_quantile": 0.5, "clipbound_learning_rate": 0.2,
            "max_clipbound": 10.0, "min_clipbound": 0.1, "unclipped_num_std": 1.0}


def _injector(s, k: int = 4, m: int = 40, seed: int = 0) -> Injector:
    params = list(s.optimizer.params)
    design = draw_design([tuple(p.shape) for p in params], k, m,
                         torch.Generator().manual_seed(seed))
    coins = SecretCoins(m, torch.Generator().manual_seed(seed + 1))
    return Injector(s.optimizer, params, design, coins, torch.Generator().manual_seed(seed + 2),
                    getattr(s.loader, "sample_rate", 1.0 / len(s.loader)), canary_norm=25.0,
                    device=torch.device("cpu"))


@pytest.mark.parametrize("mode,clipping,kw,strategy,joint", [
    ("hooks", "flat", {}, PerSampleInjection, True),
    ("functorch", "flat", {}, PerSampleInjection, True),
    ("hooks", "per_layer", {"max_grad_norm": [1.0, 0.5, 2.0, 1.0]}, PerSampleInjection, False),
    ("hooks", "adaptive", ADAPTIVE, PerSampleInjection, False),
    ("ghost", "flat", {}, GhostInjection, None),
])
def test_strategy_chosen_for_each_mode(mode, clipping, kw, strategy, joint):
    """Per-sample modes: the per-sample strategy with the shadow clipping (one joint shadow
    tensor for Opacus's own flat clipping only); ghost clipping: the ghost strategy, no shadow,
    no sharded injection without DTensor parameters."""
    s = make_private_setup(mode=mode, clipping=clipping, **kw)
    inj = _injector(s)
    assert type(inj.strategy) is strategy and inj.ghost == (mode == "ghost")
    assert isinstance(inj.planner, StepPlanner)
    if strategy is GhostInjection:
        assert inj.strategy.method_name == inj.method_name == "accumulate"
        assert inj.shadow is None and inj.strategy.sharded is None and inj.rows_buffer is None
        assert inj.strategy.kind == "ghost"
    else:
        assert inj.strategy.method_name == inj.method_name == "clip_and_accumulate"
        assert isinstance(inj.shadow, ShadowClipper) and inj.strategy.shadow is inj.shadow
        assert inj.shadow.joint() is joint and inj.strategy.kind == "per-sample"
    assert inj.compiled_adds == 0 and inj.counters() == {
        "insertions": 0, "one_run_insertions": 0, "steps_injected": 0}


def test_public_interfaces():
    """What the strategies offer and what they ask of the injector (its host protocols)."""
    inj = _injector(make_private_setup())
    for name in ("read_real_sum", "check_params", "original_method", "finish_step",
                 "report_failure"):
        assert name in InjectionHost.__dict__ or name in InjectionHost.__annotations__
        assert hasattr(inj, name)
    for name in ("method_name", "method_on_instance", "method_bound_to"):
        assert name in WrappedClipping.__dict__ and hasattr(inj, name)
    for strategy in (inj.strategy, _injector(make_private_setup(mode="ghost")).strategy):
        assert callable(strategy.wrapper) and isinstance(strategy.method_name, str)
        assert strategy.compiled_adds == 0 and isinstance(strategy.kind, str)
    for name in ("joint", "clip", "add", "write_rows", "clip_rows", "rows_buffer",
                 "replica_ok", "replica_steps"):
        assert hasattr(ShadowClipper, name), name
    shadow = inj.shadow
    assert (shadow.joint_shadow, shadow.replica_clip, shadow.compiled_add, shadow.host_rows) == (
        True, True, True, True)
    assert shadow.replica_ok and shadow.replica_steps == 0 and shadow.rows_buffer is None


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_attach_installs_the_strategy_wrapper_and_detach_restores(mode):
    s = make_private_setup(mode=mode)
    opt = s.optimizer
    inj = _injector(s)
    name = inj.method_name
    assert name not in vars(opt) and not inj.attached
    cls_method = getattr(type(opt), name)
    inj.attach()
    assert inj.attached and vars(opt)[name] == inj._entry  # runs the strategy's wrapper
    assert not inj.method_on_instance
    assert inj.original_method().__func__ is cls_method  # looked up at call time
    inj.detach()
    assert name not in vars(opt) and not inj.attached and not inj.in_step
    inj.detach()  # idempotent
    # wrap (benchmarks) wraps the wrapper
    seen = []

    def wrap(fn):
        def timed():
            seen.append(1)
            return fn()
        return timed

    inj.attach(wrap)
    x, y = next(s.batches(1))
    s.step(x, y)
    assert seen == [1] and inj.steps_injected == 1
    inj.detach()
    assert name not in vars(opt)


def test_an_instance_patch_is_run_and_restored():
    """A clipping method patched on the optimizer instance before attach is what the wrapper
    and the shadow run (never taken for Opacus's joint-norm code), and detach puts it back. It
    runs as installed: on the canaries, on the optimizer object whose state is, for that call,
    the shadow's (opacus_tap/forms.py)."""
    s = make_private_setup()
    opt = s.optimizer
    calls = []
    original = type(opt).clip_and_accumulate

    real0 = opt.params[0]

    def patched(self):
        calls.append(self.params[0] is real0)  # False: the canaries' (shadow) parameters
        return original(self)

    opt.clip_and_accumulate = patched.__get__(opt, type(opt))
    saved = vars(opt)["clip_and_accumulate"]
    inj = _injector(s)
    inj.attach()
    assert inj.method_on_instance and inj.original_method() is saved
    assert not inj.shadow.joint()
    x, y = next(s.batches(1))
    s.step(x, y)
    assert sorted(calls) == [False, True]  # the shadow's call on the canaries, then the real one
    inj.detach()
    assert vars(opt)["clip_and_accumulate"] is saved


def test_plan_pending_until_popped_and_counted():
    s = make_private_setup()
    inj = _injector(s)
    seen: list[StepPlan] = []
    inj.on_inject = seen.append
    inj.attach()
    x, y = next(s.batches(1, batch=24))
    s.step(x, y)  # no observation pre-hook here: the plan stays pending
    assert inj.in_step
    rec = inj.pop_plan()
    assert rec is not None and seen == [rec] and not inj.in_step and inj.pop_plan() is None
    assert rec.n_real == 24 and rec.micro_steps == 1 and rec.real_sum is None
    assert inj.counters() == {"insertions": rec.n_rows, "one_run_insertions": rec.n_one_run,
                              "steps_injected": 1}
    assert inj.rows_buffer is not None and not bool(inj.rows_buffer.any())
    inj.load_counters({"insertions": 7, "one_run_insertions": 3, "steps_injected": 2})
    assert inj.counters() == {"insertions": 7, "one_run_insertions": 3, "steps_injected": 2}
    inj.detach()


def test_finish_step_and_report_failure():
    inj = _injector(make_private_setup())
    rec = inj.plan_next()
    inj.finish_step(rec, False)  # a rank that adds no canary: kept, not counted
    assert inj.in_step and inj.steps_injected == 0 and inj.pop_plan() is rec
    inj.report_failure(RuntimeError("x"))  # no on_failure: nothing happens
    got = []
    inj.on_failure = got.append
    err = RuntimeError("y")
    inj.report_failure(err)
    assert got == [err]


def test_canaries_reach_the_released_gradient_exactly():
    """sigma = 0, twin optimizers: the audited one releases, at every canary coordinate, the
    twin's value plus the clipped canary (C = 1) where a canary was placed, nothing elsewhere;
    micro-batches of a logical step are counted in its plan."""
    a = make_private_setup(sigma=0.0, lr=0.0, poisson=False)
    b = make_private_setup(sigma=0.0, lr=0.0, poisson=False)
    inj = _injector(a, k=6, m=60)
    inj.attach()
    cap_a, cap_b = capture_released(a, inj.design), capture_released(b, inj.design)
    recs = []
    inj.on_inject = recs.append
    for x, y in a.batches(3, batch=20):
        a.step(x, y)
        b.step(x, y)
        inj.pop_plan()
    assert len(recs) == 3
    for rec, va, vb in zip(recs, cap_a, cap_b):
        want = expected_presence(rec, inj.design) * (25.0 / (25.0 + 1e-6))
        torch.testing.assert_close(va - vb, want, atol=1e-5, rtol=0)
    # two micro-batches, one logical step: one plan, both counted
    x, y = next(a.batches(1, batch=20, seed=5))
    a.optimizer.zero_grad()
    a.criterion(a.model(x[:8]), y[:8]).backward()
    a.optimizer.signal_skip_step(True)
    a.optimizer.step()
    assert not inj.in_step and len(recs) == 3
    a.optimizer.zero_grad()  # as BatchMemoryManager's loop: the summed gradient is kept
    a.criterion(a.model(x[8:]), y[8:]).backward()
    a.optimizer.step()
    rec = inj.pop_plan()
    assert rec is not None and rec.n_real == 20 and rec.micro_steps == 2 and len(recs) == 4
    inj.detach()


def test_changed_parameters_refused_before_the_step():
    s = make_private_setup()
    inj = _injector(s)
    inj.attach()
    inj.check_params()
    next(iter(s.model.parameters())).requires_grad_(False)
    with pytest.raises(ValueError, match="trainable parameters changed"):
        inj.check_params()
    x, y = next(s.batches(1))
    with pytest.raises(ValueError, match="trainable parameters changed"):
        s.step(x, y)
    assert inj.steps_injected == 0 and not inj.in_step
    inj.detach()


def test_failure_of_the_canaries_clipping_is_reported_after_the_real_call(monkeypatch):
    """The auditor's own failure is reported (its owner detaches) once Opacus has clipped the
    real examples, the step raises before noise or update, and the rows buffer is clean."""
    s = make_private_setup()
    inj = _injector(s)
    got = []
    inj.on_failure = lambda e: (got.append(e), inj.detach())
    inj.attach()
    x, y = next(s.batches(1))
    s.step(x, y)  # the rows buffer exists
    inj.pop_plan()
    real_calls = []
    cls_method = type(s.optimizer).clip_and_accumulate

    def counted(self):
        real_calls.append(self is s.optimizer)
        return cls_method(self)

    monkeypatch.setattr(type(s.optimizer), "clip_and_accumulate", counted)
    monkeypatch.setattr(ShadowClipper, "clip_rows",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    inj.shadow.replica_clip = False  # through write_rows / clip_rows
    before = [p.detach().clone() for p in s.model.parameters()]
    with pytest.raises(RuntimeError, match="boom"):
        s.step(x, y)
    assert real_calls == [True] and len(got) == 1 and not inj.attached
    assert "clip_and_accumulate" not in vars(s.optimizer)
    assert all(torch.equal(p, q) for p, q in zip(before, s.model.parameters()))
    assert not bool(inj.rows_buffer.any())
