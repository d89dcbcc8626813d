"""The step plan (``opacus_tap/plan.py``): the facts read off an Opacus optimizer at each step,
and :class:`StepPlanner`, which draws each logical step's role coins and Poisson inclusions from
the auditor's own stream, reproducibly from a checkpoint's (state, position)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_private_setup

from dpaudit_torch.canaries import SecretCoins, draw_design
from dpaudit_torch.opacus_tap import plan
from dpaudit_torch.opacus_tap.plan import (
    OPACUS_NORM_EPS,
    StepPlanner,
    effective_noise_multiplier,
    ends_logical_step,
    is_adaclip,
    is_ghost,
    opacus_clipped_value,
    per_param_clip,
)

K, M = 6, 120


def _planner(s, seed: int = 0, k: int = K, m: int = M, mechanics_seed: int | None = None
             ) -> StepPlanner:
    params = list(s.optimizer.params)
    design = draw_design([tuple(p.shape) for p in params], k, m,
                         torch.Generator().manual_seed(seed))
    coins = SecretCoins(m, torch.Generator().manual_seed(seed + 1))
    mech = torch.Generator().manual_seed(seed + 2 if mechanics_seed is None else mechanics_seed)
    return StepPlanner(s.optimizer, params, design, coins, mech, s.loader.sample_rate,
                       torch.device("cpu"), ghost=is_ghost(s.optimizer), injects=True,
                       data_parallel=1)


def _draws(p: StepPlanner, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for _ in range(n):
        rec = p.plan()
        out.append((rec.coins_np.copy(), rec.included_np.copy()))
    return out


@pytest.mark.parametrize("block", [None, 97])
def test_plans_reproducible_from_draw_position(monkeypatch, block):
    """(generator state, uniforms used) from :meth:`draw_position`, set on another planner's
    generator with :meth:`resume_draws`, reproduce the coming coins and inclusions exactly;
    blocks of 97 uniforms make steps cross block ends."""
    if block is not None:
        monkeypatch.setattr(plan, "DRAW_BLOCK", block)
    s = make_private_setup()
    a = _planner(s)
    first = _draws(a, 7)
    state, used = a.draw_position()
    coming = _draws(a, 25)
    b = _planner(s, mechanics_seed=99)  # same design and coins, another stream
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(_draws(b, 7), first))
    b.mechanics.set_state(state)
    b.resume_draws(used)
    for (ca, ia), (cb, ib) in zip(coming, _draws(b, 25)):
        np.testing.assert_array_equal(ca, cb)
        np.testing.assert_array_equal(ia, ib)
    if block is not None:
        assert a.block_crossings >= 3  # about 21 uniforms per step here
    else:
        assert a.block_crossings == 0


def test_resume_draws_range():
    p = _planner(make_private_setup())
    with pytest.raises(ValueError, match="outside"):
        p.resume_draws(-1)
    with pytest.raises(ValueError, match="outside"):
        p.resume_draws(plan.DRAW_BLOCK)


def test_coins_are_the_stream_uniforms_below_one_half():
    """Pair j's role coin is the step's j-th uniform < 1/2 (canary at a_j); the stream is the
    mechanics generator's float64 uniforms, in order."""
    s = make_private_setup()
    p = _planner(s)
    g = torch.Generator().manual_seed(2)
    stream = torch.rand(1000, generator=g, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(p.next_uniforms(), stream[:K + 1])
    at = 0
    for _ in range(10):
        u = p.next_uniforms()
        np.testing.assert_array_equal(u, stream[at:at + K + 1])
        rec = p.plan()
        np.testing.assert_array_equal(rec.coins_np, u[:K] < 0.5)
        assert torch.equal(rec.coins_cpu, torch.from_numpy(u[:K] < 0.5))
        at += K + 1 + rec.n_one_run  # k coins, one uniform per inclusion, one past the last


def test_only_in_canaries_included_at_the_loader_rate():
    """IN canaries are included independently with the Poisson rate q, OUT ones never."""
    s = make_private_setup()
    p = _planner(s, m=200)
    q = s.loader.sample_rate
    in_mask = SecretCoins(200, torch.Generator().manual_seed(1)).sampling_mask().numpy()
    counts = np.zeros(200)
    steps = 400
    for _ in range(steps):
        rec = p.plan()
        inc = rec.included_np
        assert np.all(np.diff(inc) > 0)  # ascending, no repeats
        assert torch.equal(rec.included, torch.from_numpy(inc))
        counts[inc] += 1
    assert counts[~in_mask].sum() == 0
    n = steps * int(in_mask.sum())
    rate = counts[in_mask].sum() / n
    assert abs(rate - q) < 5 * math.sqrt(q * (1 - q) / n)


def test_plan_entries_are_the_chosen_coordinates():
    """Rows: the k pairs (each at the side its coin chose), then the included one-run canaries;
    one entry per row (Dirac canaries), grouped by tensor."""
    s = make_private_setup()
    p = _planner(s)
    d = p.design
    for _ in range(5):
        rec = p.plan()
        assert rec.n_rows == K + rec.n_one_run and rec.injected
        want = {(int(d.pair_param[j]), int(d.pair_a[j] if rec.coins_np[j] else d.pair_b[j]))
                for j in range(K)}
        want |= {(int(d.one_param[i]), int(d.one_flat[i])) for i in rec.included_np}
        got = set(zip(rec.entry_param.tolist(), rec.entry_flat.tolist()))
        assert got == want and len(rec.entry_param) == rec.n_rows
        assert rec.entry_weight is None
        assert rec.entry_counts.tolist() == np.bincount(rec.entry_param,
                                                        minlength=d.n_params).tolist()
        assert sorted(rec.column_flat.tolist()) == sorted(rec.entry_flat.tolist())


def test_scales_of_flat_clipping():
    s = make_private_setup(sigma=1.3, max_grad_norm=0.7)
    rec = _planner(s).plan()
    n = len(list(s.optimizer.params))
    assert rec.clip == [0.7] * n
    assert rec.unit_scale == pytest.approx([s.optimizer.expected_batch_size / 0.7] * n)
    assert rec.sigma == rec.sigma_claimed == 1.3
    assert rec.noise_std == pytest.approx(1.3 * 0.7)
    assert rec.micro_steps == 1 and rec.n_real is None  # counted by the strategies


def test_scales_of_sum_reduction_and_per_layer_clipping():
    s = make_private_setup(clipping="per_layer", max_grad_norm=[1.0, 0.5, 2.0, 0.25],
                           loss_reduction="sum")
    rec = _planner(s).plan()
    assert rec.clip == [1.0, 0.5, 2.0, 0.25] == per_param_clip(s.optimizer, 4)
    assert rec.unit_scale == [1.0, 2.0, 0.5, 4.0]  # sum: 1 / C
    with pytest.raises(RuntimeError, match="4 bounds for 3"):
        per_param_clip(s.optimizer, 3)


def test_adaptive_clipping_effective_noise():
    """Andrew et al. 2021, Theorem 1: the gradient noise uses (sigma^-2 - (2 sigma_u)^-2)^-1/2."""
    s = make_private_setup(clipping="adaptive", sigma=1.0, target_unclipped_quantile=0.5,
                           clipbound_learning_rate=0.2, max_clipbound=10.0, min_clipbound=0.1,
                           unclipped_num_std=2.0)
    assert is_adaclip(s.optimizer) and not is_ghost(s.optimizer)
    want = (1.0 - 1.0 / 16.0) ** -0.5
    assert effective_noise_multiplier(s.optimizer) == pytest.approx(want)
    rec = _planner(s).plan()
    assert rec.sigma == pytest.approx(want) and rec.sigma_claimed == 1.0


def test_ghost_facts():
    s = make_private_setup(mode="ghost")
    assert is_ghost(s.optimizer) and not is_adaclip(s.optimizer)
    s.optimizer._adjusted_noise_multiplier = 0.9
    assert effective_noise_multiplier(s.optimizer) == 0.9
    assert _planner(s).plan().sigma == 0.9


def test_ends_logical_step_peeks_without_popping():
    s = make_private_setup()
    opt = s.optimizer
    assert ends_logical_step(opt)
    opt.signal_skip_step(True)
    assert not ends_logical_step(opt) and not ends_logical_step(opt)  # not popped
    assert opt._check_skip_next_step() is True
    assert ends_logical_step(opt)


def test_opacus_clipped_value():
    assert opacus_clipped_value(25.0, 1.0) == pytest.approx(25.0 / (25.0 + OPACUS_NORM_EPS))
    assert opacus_clipped_value(0.5, 1.0) == 0.5
    assert opacus_clipped_value(-3.0, 2.0) == pytest.approx(-3.0 * 2.0 / (3.0 + OPACUS_NORM_EPS))
