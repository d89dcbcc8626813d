"""testing.bugs: each bug does what its name says, silently (claimed epsilon unchanged)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup
from opacus.optimizers import DPOptimizer

from dpaudit_torch.testing import bugs


def _one_step(setup, seed: int = 0):
    """One step on a fixed batch with lr = 0; returns (clipped sum, noise) per parameter."""
    x, y = next(setup.batches(1, seed=seed))
    setup.step(x, y)
    ebs = float(setup.optimizer.expected_batch_size)
    out = []
    for p in setup.optimizer.params:
        s = p.summed_grad.detach().clone().view_as(p)
        out.append((s, p.grad.detach() * ebs - s))
    return out


OPTIMIZER_BUGS = ["no-noise", "noise-divided-by-batch", "noise-halved", "no-clipping",
                  "bias-no-noise", "noise-reused", "noise-reseeded", "noise-bf16", "noise-0.8",
                  "noise-divided-one-tensor", "per-tensor-clipping"]
SETUP_BUGS = ["accountant-rate-4x", "accumulation-counted-per-micro-step", "fixed-size-batches"]


def test_registry():
    assert bugs.names("optimizer") == OPTIMIZER_BUGS
    assert bugs.names("setup") == SETUP_BUGS
    assert bugs.names() == OPTIMIZER_BUGS + SETUP_BUGS
    with pytest.raises(ValueError, match="kind"):
        bugs.names("other")
    for reg in (bugs.BUGS, bugs.SETUP_BUGS):
        for name, bug in reg.items():
            assert bug.name == name and len(bug.description) > 10
            assert f'"{name}"' in (bugs.__doc__ or "")  # each one is documented


@pytest.mark.parametrize("name,factor", [("no-noise", 0.0), ("noise-halved", 0.5),
                                         ("noise-0.8", 0.8), ("noise-divided-by-batch", None)])
def test_noise_bugs_scale_the_same_draws(name, factor):
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, name)
    ebs = float(bad.optimizer.expected_batch_size)
    f = 1.0 / ebs if factor is None else factor
    noises = []
    for (s0, n0), (s1, n1) in zip(_one_step(ok), _one_step(bad)):
        assert torch.equal(s0, s1)  # clipping untouched
        assert torch.allclose(n1, f * n0, atol=1e-5), (n1 - f * n0).abs().max()
        noises.append(n0.reshape(-1))
    # the correct run adds noise of std sigma * C = 1 (610 draws: sample std within ~0.1)
    assert 0.85 < float(torch.cat(noises).std()) < 1.15
    assert bad.optimizer.noise_multiplier == 1.0


def test_bias_no_noise_drops_the_noise_on_one_dimensional_tensors_only():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "bias-no-noise")
    params = list(bad.optimizer.params)
    for p, (s0, n0), (s1, n1) in zip(params, _one_step(ok), _one_step(bad)):
        assert torch.equal(s0, s1)
        if p.dim() == 1:
            assert float(n1.abs().max()) < 1e-6  # no noise left
        else:
            assert torch.allclose(n1, n0, atol=1e-5)


def test_no_clipping_sums_unclipped_gradients_and_keeps_the_noise():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    huge = make_private_setup(lr=0.0, noise_seed=3, max_grad_norm=1e9, sigma=1e-9)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "no-clipping")
    r_ok, r_huge, r_bad = _one_step(ok), _one_step(huge), _one_step(bad)
    for (_s0, n0), (sh, _), (s1, n1) in zip(r_ok, r_huge, r_bad):
        assert torch.allclose(s1, sh, rtol=1e-5, atol=1e-6)  # = the unclipped sum
        assert torch.allclose(n1, n0, atol=1e-5)  # noise still sigma * the real C
    assert any(not torch.allclose(a[0], b[0]) for a, b in zip(r_ok, r_bad))
    assert bad.optimizer.max_grad_norm == 1.0


def test_no_clipping_per_layer_restores_the_bounds():
    s = make_private_setup(clipping="per_layer", max_grad_norm=[0.1, 0.2, 0.3, 0.4], lr=0.0)
    bugs.apply_bug(s.optimizer, "no-clipping")
    _one_step(s)
    assert s.optimizer.max_grad_norms == [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize("name", bugs.names("optimizer"))
def test_bugs_are_silent_for_the_accountant(name):
    ok = make_private_setup(seed=5)
    bad = make_private_setup(seed=5)
    bugs.apply_bug(bad.optimizer, name)
    ok.train(4)
    bad.train(4)
    assert ok.engine.accountant.history == bad.engine.accountant.history
    assert ok.engine.get_epsilon(1e-5) == bad.engine.get_epsilon(1e-5)
    assert isinstance(bad.optimizer, DPOptimizer) and bugs.applied_bug(bad.optimizer) == name


def test_apply_and_remove_and_bad_input():
    s = make_private_setup(lr=0.0, noise_seed=4)
    ref = make_private_setup(lr=0.0, noise_seed=4)
    cls = type(s.optimizer)
    assert bugs.apply_bug(s.optimizer, "no-noise") is s.optimizer
    assert type(s.optimizer).__name__.startswith("Buggy_no_noise")
    with pytest.raises(ValueError, match="already"):
        bugs.apply_bug(s.optimizer, "noise-halved")
    bugs.remove_bug(s.optimizer)
    assert type(s.optimizer) is cls and bugs.applied_bug(s.optimizer) is None
    bugs.remove_bug(s.optimizer)  # no-op
    for (a, na), (b, nb) in zip(_one_step(s), _one_step(ref)):
        assert torch.equal(a, b) and torch.equal(na, nb)
    with pytest.raises(ValueError, match="no-noise"):
        bugs.apply_bug(s.optimizer, "no-such-bug")
    with pytest.raises(TypeError, match="SGD"):
        bugs.apply_bug(s.optimizer.original_optimizer, "no-noise")


def test_ghost_mode():
    g = make_private_setup(mode="ghost", lr=0.0, noise_seed=2)
    with pytest.raises(ValueError, match="ghost"):
        bugs.apply_bug(g.optimizer, "no-clipping")
    bugs.apply_bug(g.optimizer, "no-noise")
    x, y = next(g.batches(1))
    g.step(x, y)
    ebs = float(g.optimizer.expected_batch_size)
    for p in g.optimizer.params:
        assert torch.allclose(p.grad * ebs, p.summed_grad.view_as(p), atol=1e-6)


def test_adaptive_clipping_noise_halved():
    kw = dict(clipping="adaptive", target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
              max_clipbound=10.0, min_clipbound=0.1, unclipped_num_std=5.0)
    s = make_private_setup(lr=0.0, **kw)
    bugs.apply_bug(s.optimizer, "noise-halved")
    _one_step(s)
    assert s.optimizer.noise_multiplier == 1.0
