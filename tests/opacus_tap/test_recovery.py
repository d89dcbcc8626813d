"""Taking the auditor out of a failed step (dpaudit_torch/opacus_tap/recovery.py): what the
canaries changed is put back bit for bit, which optimizers have their noise replayed, the noise
generator's state, and the released gradient without the canaries (replayed or subtracted).
The training-loop tests of every failure point are in tests/audit/test_faults.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.opacus_tap.recovery import (  # noqa: E402
    Added,
    noise_state,
    replayable,
    take_out,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_added_puts_back_every_value_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, generator=g).to(dtype)
    b = torch.randn(7, 3, generator=g).to(dtype)
    want = [a.clone(), b.clone()]
    added = Added()
    ia, ib = torch.tensor([3, 17, 41]), torch.tensor([0, 20])
    added.keep(0, a, ia)
    a.index_add_(0, ia, torch.full((3,), 0.3, dtype=dtype))
    added.keep(1, b.view(-1), ib)
    b.view(-1).index_add_(0, ib, torch.full((2,), 1.0 / 3.0, dtype=dtype))
    assert not torch.equal(a, want[0]) and not torch.equal(b, want[1])
    added.restore()
    assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    added.restore()  # idempotent
    assert torch.equal(a, want[0])
    got = added.entries()
    assert [i for i, _, _ in got] == [0, 1] and torch.equal(got[1][1], ib)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_added_host_views_put_back_bit_for_bit(dtype):
    rng = np.random.default_rng(1)
    dst = (rng.standard_normal(20).astype(dtype), rng.standard_normal(9).astype(dtype))
    want = tuple(d.copy() for d in dst)
    counts = np.array([3, 2], dtype=np.int64)
    cols = np.array([1, 7, 19, 0, 8], dtype=np.int64)
    added = Added()
    added.keep_host(dst, counts, cols)
    dst[0][[1, 7, 19]] += dtype(0.1)
    dst[1][[0, 8]] += dtype(1.0 / 3.0)
    added.restore()
    assert all(np.array_equal(d, w) for d, w in zip(dst, want))
    (p0, i0, old0), (p1, i1, old1) = added.entries()
    assert (p0, p1) == (0, 1) and i0.tolist() == [1, 7, 19] and i1.tolist() == [0, 8]
    assert np.array_equal(old1.numpy(), want[1][[0, 8]].astype(np.float64))


def test_added_created_summed_grad_set_back_to_none():
    p = torch.nn.Parameter(torch.zeros(3))
    p.summed_grad = torch.zeros(3)
    added = Added()
    added.created(p)
    added.restore()
    assert p.summed_grad is None


def test_replayable_only_for_opacus_own_noise():
    assert replayable(make_private_setup().optimizer)
    assert replayable(make_private_setup(mode="ghost").optimizer)
    assert replayable(make_private_setup(clipping="per_layer", max_grad_norm=[1.0] * 4).optimizer)
    ada = make_private_setup(clipping="adaptive", target_unclipped_quantile=0.5,
                             clipbound_learning_rate=0.2, max_clipbound=10.0, min_clipbound=0.1,
                             unclipped_num_std=2.0)
    assert not replayable(ada.optimizer)  # its own add_noise (it also noises a count)
    opt = make_private_setup().optimizer
    opt.add_noise = lambda: None  # replaced on the instance
    assert not replayable(opt)
    opt = make_private_setup().optimizer
    opt.__class__ = type("OwnNoise", (type(opt),), {"add_noise": lambda self: None})
    assert not replayable(opt)


def test_noise_state_reads_without_drawing():
    s = make_private_setup()
    gen = s.optimizer.generator
    before = gen.get_state()
    got = noise_state(s.optimizer, list(s.optimizer.params))
    assert got is not None and got[0] is gen and torch.equal(got[1], before)
    assert torch.equal(gen.get_state(), before)
    # no generator of its own: the device's default one (the global CPU generator)
    s = make_private_setup(noise_seed=None)
    got = noise_state(s.optimizer, list(s.optimizer.params))
    assert got is not None and got[0] is torch.default_generator

    class NoState:
        def get_state(self):
            raise RuntimeError("this generator keeps no readable state")

    s.optimizer.generator = NoState()
    assert noise_state(s.optimizer, list(s.optimizer.params)) is None


def _noised_step(s, twin, keep_state: bool) -> str:
    """One step of ``s`` whose clipping adds canary-like values to summed_grad, kept in an Added
    as the injection does, and whose released gradient :func:`take_out` puts back in a step
    pre-hook (as after a failure in the observation); ``twin`` takes the same step unaudited.
    Returns what take_out says it did."""
    params = list(s.optimizer.params)
    plan = SimpleNamespace(added=Added(), noise_state=None, clip=[1.0] * len(params),
                           unit_scale=[float(s.optimizer.expected_batch_size)] * len(params))

    def add_canaries():
        type(s.optimizer).clip_and_accumulate(s.optimizer)
        for i, p in enumerate(params):
            idx = torch.tensor([0, p.numel() - 1])
            plan.added.keep(i, p.summed_grad.view(-1), idx)
            p.summed_grad.view(-1).index_add_(0, idx, torch.tensor([0.75, -0.5]))
        if keep_state:
            plan.noise_state = noise_state(s.optimizer, params)

    s.optimizer.clip_and_accumulate = add_canaries
    said = []
    s.optimizer.original_optimizer.register_step_pre_hook(
        lambda *_: said.append(take_out(s.optimizer, params, plan, 1)))
    x, y = next(s.batches(1, batch=16))
    s.step(x, y)
    twin.step(x, y)
    return said[0]


@pytest.mark.parametrize("sigma,keep_state", [(1.0, True), (0.0, False), (1.0, False)])
def test_take_out_gives_the_twins_update(sigma, keep_state):
    """The released gradient without the canaries: replayed from the kept generator state
    (exact), or subtracted (exact at sigma = 0 with a power-of-two batch scaling; within one
    float32 unit in the last place with noise)."""
    s, twin = make_private_setup(sigma=sigma), make_private_setup(sigma=sigma)
    how = _noised_step(s, twin, keep_state)
    assert ("exact" in how) if keep_state else ("subtracted" in how)
    for p, q in zip(s.optimizer.params, twin.optimizer.params):
        assert torch.equal(p.summed_grad, q.summed_grad)  # put back
        if keep_state or sigma == 0.0:
            assert torch.equal(p.grad, q.grad) and torch.equal(p, q)
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=2.0 ** -23, atol=2e-8)
    assert torch.equal(s.optimizer.generator.get_state(), twin.optimizer.generator.get_state())


def test_take_out_several_processes_leaves_the_release():
    p = torch.nn.Parameter(torch.zeros(4))
    p.summed_grad = torch.arange(4.0)
    p.grad = torch.ones(4)
    added = Added()
    idx = torch.tensor([1])
    added.keep(0, p.summed_grad, idx)
    p.summed_grad.index_add_(0, idx, torch.tensor([5.0]))

    plan = SimpleNamespace(added=added, noise_state=None)
    how = take_out(object(), [p], plan, world_size=2)
    assert "stays in this one update" in how
    assert torch.equal(p.summed_grad, torch.arange(4.0)) and torch.equal(p.grad, torch.ones(4))
    plan.added = None
    assert "no canary" in take_out(object(), [p], plan, world_size=1)
