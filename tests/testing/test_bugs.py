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
                  "noise-divided-one-tensor", "per-tensor-clipping", "noise-flat-sliced",
                  "noise-rolled", "noise-reused-subset"]
SETUP_BUGS = ["accountant-rate-4x", "accumulation-counted-per-micro-step", "fixed-size-batches",
              "noise-reseeded-each-epoch", "manual-seed-each-epoch", "loader-reseeded",
              "loader-reseeded-every-3-epochs", "loader-reseeded-other-epoch-length",
              "loader-global-seed"]


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


# ---------------------------------------------------------------------- noise bugs
def _noises(setup, steps: int) -> list[list[torch.Tensor]]:
    """The noise (in units of the clipped sum) of ``steps`` steps on fixed batches, lr = 0."""
    return [[n for _, n in _one_step(setup, seed=t)] for t in range(steps)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))


def test_noise_reused_repeats_the_noise_of_every_odd_release():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "noise-reused")
    n_ok, n_bad = _noises(ok, 6), _noises(bad, 6)
    assert not _same(n_ok[0], n_ok[1])  # a correct run draws fresh noise
    for t in (0, 2, 4):  # releases 1, 3, 5: fresh draws (the generator advances as usual)
        assert _same(n_bad[t], n_ok[t])
        assert _same(n_bad[t + 1], n_bad[t])  # releases 2, 4, 6: the same noise again
        assert all(float(n.abs().max()) > 0.1 for n in n_bad[t + 1])


def test_noise_reseeded_repeats_every_ten_releases():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "noise-reseeded")
    n_ok, n_bad = _noises(ok, 12), _noises(bad, 12)
    for t in range(10):  # the first ten releases are those of a correct run
        assert _same(n_bad[t], n_ok[t])
    assert not _same(n_ok[10], n_ok[0])
    assert _same(n_bad[10], n_bad[0]) and _same(n_bad[11], n_bad[1])
    assert bad.optimizer.generator.initial_seed() == 3


def test_noise_reseeded_without_a_generator_gets_its_own_and_remove_restores_none():
    s = make_private_setup(lr=0.0, noise_seed=None)
    assert s.optimizer.generator is None
    bugs.apply_bug(s.optimizer, "noise-reseeded")
    n = _noises(s, 11)
    assert isinstance(s.optimizer.generator, torch.Generator)
    assert _same(n[10], n[0]) and not _same(n[1], n[0])
    bugs.remove_bug(s.optimizer)
    assert s.optimizer.generator is None and not hasattr(s.optimizer, "_dpaudit_bug_state")


def test_noise_bf16_rounds_the_same_draws_to_bfloat16():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "noise-bf16")
    for (s0, n0), (s1, n1) in zip(_one_step(ok), _one_step(bad)):
        assert torch.equal(s0, s1)
        bf = n0.to(torch.bfloat16).float()
        assert torch.allclose(n1, bf, atol=1e-5, rtol=0)  # the draw, rounded to 8 bits
        assert torch.allclose(n1, n1.to(torch.bfloat16).float(), atol=1e-5, rtol=0)
        if n0.numel() > 16:
            assert float((n1 - n0).abs().max()) > 1e-4  # and not the float32 draw


def test_noise_divided_one_tensor_touches_the_first_tensor_only():
    ok = make_private_setup(lr=0.0, noise_seed=3)
    bad = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(bad.optimizer, "noise-divided-one-tensor")
    ebs = float(bad.optimizer.expected_batch_size)
    for i, ((s0, n0), (s1, n1)) in enumerate(zip(_one_step(ok), _one_step(bad))):
        assert torch.equal(s0, s1)
        assert torch.allclose(n1, n0 / ebs if i == 0 else n0, atol=1e-5)


# ---------------------------------------------------------------------- per-tensor clipping
def _per_sample_grads(setup, x, y) -> list[torch.Tensor]:
    setup.optimizer.zero_grad()
    setup.criterion(setup.model(x), y).backward()
    return [p.grad_sample.detach().clone() for p in setup.optimizer.params]


def test_per_tensor_clipping_clips_every_tensor_to_c_separately():
    c = 0.05  # small enough that every sample is clipped, tensor by tensor
    ok = make_private_setup(lr=0.0, max_grad_norm=c)
    bad = make_private_setup(lr=0.0, max_grad_norm=c)
    bugs.apply_bug(bad.optimizer, "per-tensor-clipping")
    x, y = next(bad.batches(1, seed=2))
    gs = _per_sample_grads(bad, x, y)
    bad.optimizer.step()
    flat_norms = torch.zeros(x.shape[0])
    for p, g in zip(bad.optimizer.params, gs):
        n = g.reshape(len(g), -1).norm(dim=1)
        f = (c / (n + 1e-6)).clamp(max=1.0)
        expected = torch.einsum("i,i...", f, g)
        assert torch.allclose(p.summed_grad.view_as(p), expected, rtol=1e-5, atol=1e-7)
        flat_norms += (f * n) ** 2
    # a clipped sample's total norm is up to C sqrt(#tensors) = 2 C for this 4-tensor model
    assert float(flat_norms.sqrt().max()) > 1.5 * c
    _one_step(ok, seed=2)
    assert any(not torch.allclose(p.summed_grad, q.summed_grad)
               for p, q in zip(bad.optimizer.params, ok.optimizer.params))
    assert bad.optimizer.max_grad_norm == c


def test_per_tensor_clipping_is_a_flat_clipping_bug():
    for kw in (dict(mode="ghost"), dict(clipping="per_layer", max_grad_norm=[0.5] * 4),
               dict(clipping="adaptive", target_unclipped_quantile=0.5,
                    clipbound_learning_rate=0.2, max_clipbound=10.0, min_clipbound=0.1,
                    unclipped_num_std=5.0)):
        s = make_private_setup(**kw)
        with pytest.raises(ValueError, match="ghost|flat"):
            bugs.apply_bug(s.optimizer, "per-tensor-clipping")
        assert bugs.applied_bug(s.optimizer) is None


# ---------------------------------------------------------------------- setup bugs
def _train_loop(setup, loader, batches: int) -> None:
    """The usual loop (zero_grad, backward, step on every batch) over ``loader``."""
    done = 0
    while done < batches:
        for x, y in loader:
            setup.step(x, y)
            done += 1
            if done >= batches:
                return


def test_accountant_rate_4x_tells_the_accountant_a_quarter_of_the_rate():
    ok = make_private_setup(seed=5)
    bad = make_private_setup(seed=5)
    cls = type(bad.optimizer)
    opt, dl = bugs.apply_setup_bug(bad.engine, bad.optimizer, bad.loader, "accountant-rate-4x")
    assert opt is bad.optimizer and dl is bad.loader and type(opt) is cls
    assert bugs.applied_bug(opt) == "accountant-rate-4x"
    _train_loop(ok, ok.loader, 4)
    _train_loop(bad, dl, 4)
    q = bad.loader.sample_rate
    assert ok.engine.accountant.history == [(1.0, q, 4)]
    assert bad.engine.accountant.history == [(1.0, q / 4, 4)]
    assert bad.engine.get_epsilon(1e-5) < ok.engine.get_epsilon(1e-5)


def test_accumulation_releases_every_fourth_batch_and_counts_every_batch():
    s = make_private_setup(seed=5, lr=0.5)
    q = s.loader.sample_rate
    k = bugs.ACCUMULATION_STEPS
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader,
                                   "accumulation-counted-per-micro-step")
    assert opt is s.optimizer and dl.sample_rate == q and len(dl) == len(s.loader)
    batch = 0
    releases: list[int] = []
    opt.original_optimizer.register_step_pre_hook(lambda *_: releases.append(batch))
    moved: list[int] = []
    while batch < 2 * k:
        for x, y in dl:  # the usual loop: zero_grad, backward, step on every batch
            batch += 1
            before = [p.detach().clone() for p in s.model.parameters()]
            s.step(x, y)
            if any(not torch.equal(a, p) for a, p in zip(before, s.model.parameters())):
                moved.append(batch)
            if batch >= 2 * k:
                break
    assert releases == [k, 2 * k] and moved == [k, 2 * k]  # one release per k batches
    # ... while the accountant counted every batch as a step at the loader's rate
    assert sum(h[2] for h in s.engine.accountant.history) == 2 * k
    assert all(h[:2] == (1.0, q) for h in s.engine.accountant.history)


def test_fixed_size_batches_keep_the_accountants_rate():
    s = make_private_setup(seed=5)
    q = s.loader.sample_rate
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "fixed-size-batches")
    assert opt is s.optimizer and getattr(dl, "sample_rate", None) is None
    assert len(dl) == len(s.loader) and 1.0 / len(dl) == q  # what make_private would tell it
    sizes, seen = [], []
    for x, _ in dl:  # one epoch: a permutation of the records in fixed-size batches
        sizes.append(len(x))
        seen.append(x)
    assert sizes == [32] * 8
    rows = torch.cat(seen)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, s.X.tolist()))
    _train_loop(s, dl, 3)
    assert s.engine.accountant.history == [(1.0, q, 3)]


def test_setup_bug_errors_and_dispatch():
    s = make_private_setup()
    with pytest.raises(ValueError, match="apply_setup_bug"):
        bugs.apply_bug(s.optimizer, "fixed-size-batches")
    with pytest.raises(ValueError, match="apply_bug"):
        bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "no-noise")
    with pytest.raises(ValueError, match="no-noise"):
        bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "no-such-bug")
    with pytest.raises(TypeError, match="SGD"):
        bugs.apply_setup_bug(s.engine, s.optimizer.original_optimizer, s.loader,
                             "accountant-rate-4x")
    opt, dl = bugs.apply_to_training(s.engine, s.optimizer, s.loader, "accountant-rate-4x")
    with pytest.raises(ValueError, match="already"):
        bugs.apply_to_training(s.engine, opt, dl, "noise-halved")
    with pytest.raises(ValueError, match="cannot be removed"):
        bugs.remove_bug(opt)
    t = make_private_setup()
    opt2, dl2 = bugs.apply_to_training(t.engine, t.optimizer, t.loader, "noise-halved")
    assert opt2 is t.optimizer and dl2 is t.loader and bugs.applied_bug(opt2) == "noise-halved"


def test_demo_runs_a_setup_bug(tmp_path):
    """``dpaudit demo --bug`` offers the setup bugs: the demo trains with the returned loader."""
    from dpaudit_torch.demo import DemoConfig, run_demo

    k = bugs.ACCUMULATION_STEPS
    res = run_demo(DemoConfig(steps=2 * k, seed=1, bug="accumulation-counted-per-micro-step",
                              m_canaries=64), tmp_path)
    acc = res.report.audits["accounting"]
    assert res.steps_run == 2 * k and acc["releases"] == 2 and acc["accountant_steps"] == 2 * k
    assert res.report.config["demo"]["bug"] == "accumulation-counted-per-micro-step"
