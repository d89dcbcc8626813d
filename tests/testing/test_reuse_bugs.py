"""testing.reuse_bugs: each reuse form repeats Gaussian draws in its pattern, silently."""

from __future__ import annotations

import numpy as np
import torch
from conftest import make_private_setup

from dpaudit_torch.testing import bugs, reuse_bugs


def _capture(setup) -> list[list[torch.Tensor]]:
    """Records each release's noise (gradient minus clipped sum, before the scaling)."""
    opt = setup.optimizer
    seen: list[list[torch.Tensor]] = []
    original = opt.scale_grad

    def scale_grad() -> None:
        seen.append([(p.grad - p.summed_grad.view_as(p)).detach().clone().reshape(-1)
                     for p in opt.params])
        original()

    opt.scale_grad = scale_grad
    return seen


def _steps(setup, loader, n: int) -> None:
    done = 0
    while done < n:
        for x, y in loader:
            setup.step(x, y)
            done += 1
            if done >= n:
                return


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # float32 noise recovered as (s + n) - s: a few ulps of |s + n| (|s| < C = 1, |n| < 8)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=0, atol=1e-5))


def _fresh(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.allclose(a, b, rtol=0, atol=1e-3)


def test_flat_sliced_shares_the_draw_between_tensors_at_the_stride():
    s = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(s.optimizer, "noise-flat-sliced")
    seen = _capture(s)
    _steps(s, s.loader, 2)
    k = reuse_bugs.FLAT_STRIDE
    for noise in seen:
        for a, b in zip(noise, noise[1:]):  # tensor i's value at j + k is tensor i+1's at j
            m = min(a.numel() - k, b.numel())
            assert m > 0 and _close(a[k:k + m], b[:m])
    assert _fresh(seen[0][0], seen[1][0])  # a new flat draw per release
    assert 0.8 < float(torch.cat(seen[0]).std()) < 1.2  # sigma C = 1


def test_rolled_adds_the_previous_noise_rolled():
    s = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(s.optimizer, "noise-rolled")
    seen = _capture(s)
    _steps(s, s.loader, 4)
    for t in (0, 2):
        for a, b in zip(seen[t], seen[t + 1]):
            assert _close(torch.roll(a, reuse_bugs.ROLL_SHIFT), b) and _fresh(a, b)
    assert _fresh(seen[1][0], seen[2][0])


def test_reused_subset_repeats_only_some_tensors():
    s = make_private_setup(lr=0.0, noise_seed=3)
    bugs.apply_bug(s.optimizer, "noise-reused-subset")
    seen = _capture(s)
    _steps(s, s.loader, 2)
    same = [_close(a, b) for a, b in zip(seen[0], seen[1])]
    assert same == [i % 3 == 0 for i in range(len(same))] and not all(same)


def test_reseeded_each_epoch_repeats_the_first_epochs_noise():
    s = make_private_setup(lr=0.0, noise_seed=3)
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "noise-reseeded-each-epoch")
    assert opt is s.optimizer and dl.sample_rate == s.loader.sample_rate
    seen = _capture(s)
    e = len(dl)
    _steps(s, dl, e + 2)
    for t in range(2):
        assert all(_close(a, b) for a, b in zip(seen[t], seen[e + t]))
    assert _fresh(seen[0][0], seen[1][0])


def test_manual_seed_each_epoch_repeats_batches_and_noise():
    s = make_private_setup(lr=0.0, noise_seed=3)
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "manual-seed-each-epoch")
    assert opt.generator is None
    seen = _capture(s)
    e = len(dl)
    batches = []
    done = 0
    while done < e + 2:
        for x, y in dl:
            batches.append(x.clone())
            s.step(x, y)
            done += 1
            if done >= e + 2:
                break
    for t in range(2):
        assert torch.equal(batches[t], batches[e + t])
        assert all(_close(a, b) for a, b in zip(seen[t], seen[e + t]))


def test_opacus_release_recovers_the_noise_to_the_rounding():
    rng = np.random.default_rng(0)
    s, n = rng.standard_normal(1000) * 3, rng.standard_normal(1000)
    rel, noise = reuse_bugs.opacus_release(s, n, 64.0, torch.float32)
    # two float32 roundings of |s + n| (2^-24 each) and the rounding of n itself
    bound = 2.0 ** -23 * (np.abs(rel) + np.abs(n)) * 1.01
    assert np.all(np.abs(noise - n) <= bound)
