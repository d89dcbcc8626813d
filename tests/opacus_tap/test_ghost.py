"""Ghost clipping (``opacus_tap/ghost.py``): :class:`GhostInjection` adds the already clipped
canary, computed in the gradient's dtype as Opacus's flat clipping would, after the real
examples' sum is read; its compiled addition equals the torch additions; a rank that does not
inject only plans; and on sharded parameters it composes :class:`~.fsdp.ShardedInjection`."""

from __future__ import annotations

import pytest
import torch
from conftest import capture_released, expected_presence, make_private_setup

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.canaries import SecretCoins, draw_design
from dpaudit_torch.opacus_tap import Injector
from dpaudit_torch.opacus_tap.fsdp import ShardedInjection, ShardLayout
from dpaudit_torch.opacus_tap.ghost import GhostInjection
from dpaudit_torch.opacus_tap.plan import OPACUS_NORM_EPS

NORM = 25.0


def _injector(s, layout: ShardLayout | None = None, k: int = 6, m: int = 60) -> Injector:
    params = list(s.optimizer.params)
    design = draw_design([tuple(p.shape) for p in params], k, m,
                         torch.Generator().manual_seed(0))
    coins = SecretCoins(m, torch.Generator().manual_seed(1))
    return Injector(s.optimizer, params, design, coins, torch.Generator().manual_seed(2),
                    s.loader.sample_rate, canary_norm=NORM, device=torch.device("cpu"),
                    layout=layout)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_canary_value_is_opacus_flat_clipping_in_the_gradient_dtype(dtype):
    strategy = _injector(make_private_setup(mode="ghost")).strategy
    assert isinstance(strategy, GhostInjection)
    like = torch.zeros(3, dtype=dtype)
    for c in (1.0, 0.3, 7.5):
        raw = torch.tensor(NORM * c, dtype=dtype)
        want = (c / (raw + OPACUS_NORM_EPS)).clamp(max=1.0) * raw
        got = strategy.canary_value(c, like)
        assert got.dtype == dtype and got.dim() == 0 and torch.equal(got, want)
        assert strategy.canary_value(c, like) is got  # cached per bound, dtype and device
    first = strategy.canary_value(1.0, like)
    for i in range(100):  # adaptive clipping: a new bound every step (the cache is emptied)
        strategy.canary_value(1.0 + i / 100, like)
    assert torch.equal(strategy.canary_value(1.0, like), first)


def test_ghost_step_adds_the_clipped_canary_after_the_real_sum():
    """sigma = 0, twin optimizers: the audited one releases the twin's value plus the clipped
    canary at every placed canary coordinate; the plan counts the real examples (the length of
    Opacus's per-sample norms) and one micro-batch."""
    a = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    b = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    inj = _injector(a)
    read = []
    inj.read_real_sum = lambda rec: read.append(rec) or torch.zeros(1)
    recs = []
    inj.on_inject = recs.append
    inj.attach()
    cap_a, cap_b = capture_released(a, inj.design), capture_released(b, inj.design)
    for x, y in a.batches(3, batch=20):
        a.step(x, y)
        b.step(x, y)
        assert inj.pop_plan() is recs[-1]
    assert read == recs and len(recs) == 3
    value = float(inj.strategy.canary_value(1.0, torch.zeros(())))
    for rec, va, vb in zip(recs, cap_a, cap_b):
        assert rec.n_real == 20 and rec.micro_steps == 1 and rec.injected
        torch.testing.assert_close(va - vb, expected_presence(rec, inj.design) * value,
                                   atol=1e-5, rtol=0)
    assert inj.counters()["steps_injected"] == 3
    inj.detach()
    assert "accumulate" not in vars(a.optimizer)


def test_rank_that_does_not_inject_only_plans():
    """DDP: a rank other than 0 plans the same steps (same coins) but adds nothing."""
    a = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    b = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    a.optimizer.rank = 1
    inj, ref = _injector(a), _injector(b)
    assert not inj.injects and not inj.strategy.injects
    inj.attach()
    cap_a, cap_b = capture_released(a, inj.design), capture_released(b, inj.design)
    x, y = next(a.batches(1, batch=20))
    a.step(x, y)
    b.step(x, y)
    rec = inj.pop_plan()
    assert rec is not None and not rec.injected and inj.steps_injected == 0
    assert torch.equal(rec.coins_cpu, ref.plan_next().coins_cpu)
    torch.testing.assert_close(cap_a[0], cap_b[0], atol=0, rtol=0)
    inj.detach()


def _ghost_run(compiled_add: bool) -> tuple[torch.Tensor, ...]:
    s = make_private_setup(mode="ghost", seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, k_pairs=8,
                         m_canaries=96, check_every=3)
    inj = aud.tap.injector
    assert isinstance(inj.strategy, GhostInjection)
    inj.strategy.compiled_add = compiled_add
    projections = []
    for x, y in s.batches(7, batch=24):
        s.step(x, y)
        projections.append(aud.tap.reader.last_values.clone())
    # every step's canaries added by the compiled pass, or none
    assert inj.compiled_adds == (7 if compiled_add else 0) and aud.design.n_spread
    return (torch.stack(projections), aud.monitors["one_run"].scores["llr"].clone(),
            *[p.detach().clone() for p in s.model.parameters()])


def test_ghost_compiled_addition_equals_torch_addition():
    """On the CPU the clipped canaries are added by one compiled pass; twin runs against the
    torch additions (one ``take`` and one ``put_`` per tensor) are identical, spread canaries
    included."""
    for u, v in zip(_ghost_run(True), _ghost_run(False)):
        assert torch.equal(u, v)


def test_ghost_torch_addition_per_tensor_values_equal_the_copied_ones(monkeypatch):
    """The torch path copies the entries' values made on the host once per step where the
    gradients have one NumPy dtype; elsewhere (bfloat16, mixed dtypes) each tensor's clipped
    canary, times the spread weights, is made by torch: the same additions bit for bit."""
    import dpaudit_torch.opacus_tap.ghost as ghost

    copied = _ghost_run(False)
    monkeypatch.setattr(ghost, "NUMPY_FLOAT_OF", {})  # no NumPy dtype: the per-tensor values
    for u, v in zip(copied, _ghost_run(False)):
        assert torch.equal(u, v)


def test_sharded_strategy_composed_on_a_layout():
    """With a shard layout the ghost strategy composes the sharded injection, which adds the
    canary value divided by the data-parallel degree D on every coordinate this rank holds
    (here one process holding every tensor whole, D = 2)."""
    a = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    b = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    params = list(a.optimizer.params)
    layout = ShardLayout(params, rank=0, world=1, data_parallel=2, kind="fsdp")
    inj = _injector(a, layout=layout)
    sharded = inj.strategy.sharded
    assert isinstance(sharded, ShardedInjection) and sharded.layout is layout
    assert inj.injects and inj.data_parallel == 2 and inj.shadow is None
    inj.attach()
    cap_a, cap_b = capture_released(a, inj.design), capture_released(b, inj.design)
    x, y = next(a.batches(1, batch=20))
    a.step(x, y)
    b.step(x, y)
    rec = inj.pop_plan()
    assert rec is not None and inj.steps_injected == 1
    # FSDP keeps the per-sample norms on the model: without it nothing is counted, with it
    # (the tap hands it over where the audit has the model) its norms of the pass are
    assert rec.n_real is None
    inj.strategy.model_norms = lambda: torch.ones(17)
    a.step(x, y)
    assert inj.pop_plan().n_real == 17
    value = float(inj.strategy.canary_value(1.0, torch.zeros(())))
    torch.testing.assert_close(cap_a[0] - cap_b[0],
                               expected_presence(rec, inj.design) * value / 2,
                               atol=1e-5, rtol=0)
    inj.detach()


def test_real_examples_counted_over_micro_batches_and_empty_batches():
    """The real-example count of a logical step is the sum over its micro-batches (as
    BatchMemoryManager splits a Poisson batch) of the per-sample norms' length, 0 for an empty
    batch; a micro-batch without norms to count (none computed) leaves the step uncounted."""
    a = make_private_setup(mode="ghost", sigma=0.0, lr=0.0)
    inj = _injector(a)
    recs = []
    inj.on_inject = recs.append
    inj.attach()
    x, y = next(a.batches(1, batch=20, seed=5))
    a.optimizer.zero_grad()
    a.criterion(a.model(x[:8]), y[:8]).backward()
    a.optimizer.signal_skip_step(True)
    a.optimizer.step()
    assert not recs
    a.optimizer.zero_grad()  # as BatchMemoryManager's loop: the summed gradient is kept
    a.criterion(a.model(x[8:]), y[8:]).backward()
    a.optimizer.step()
    assert inj.pop_plan() is recs[-1] and recs[-1].n_real == 20 and recs[-1].micro_steps == 2
    a.step(x[:0], y[:0])  # an empty Poisson batch: noise only
    assert inj.pop_plan() is recs[-1] and recs[-1].n_real == 0
    for p in a.optimizer.params:
        p._norm_sample = None  # nothing to count
    a.optimizer.zero_grad()
    a.optimizer.step()
    assert inj.pop_plan() is recs[-1] and recs[-1].n_real is None and len(recs) == 3
    inj.detach()
