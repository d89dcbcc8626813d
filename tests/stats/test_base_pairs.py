"""The testers' input check has a fast path for CPU float64 tensors of a known dimension (the
training hook's pairs): it must accept and refuse exactly what the general path does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit_torch.stats.hockey_stick import HockeyStickTest
from dpaudit_torch.stats.mmd import SequentialMMDTest


def _make(kind: str):
    if kind == "mmd":
        return SequentialMMDTest(0.05, chunk_size=16, max_witness_points=40)
    return HockeyStickTest([0.5, 1.0], 1e-5, 0.05)


@pytest.mark.parametrize("kind", ["mmd", "hockey_stick"])
def test_fast_path_same_trajectory_as_general_path(kind: str) -> None:
    rng = np.random.default_rng(4)
    xs, ys = rng.normal(0, 1, 600), rng.normal(0.5, 1, 600)
    a, b = _make(kind), _make(kind)
    taken = []
    orig = a._as_pairs_host

    def spy(x, y):
        out = orig(x, y)
        taken.append(out is not None)
        return out

    a._as_pairs_host = spy
    for i in range(0, 600, 50):  # tensors (fast path once the dimension is known) vs lists
        ta = a.update_with_trajectory(torch.as_tensor(xs[i:i + 50]), torch.as_tensor(ys[i:i + 50]))
        tb = b.update_with_trajectory(xs[i:i + 50].tolist(), ys[i:i + 50].tolist())
        np.testing.assert_array_equal(ta, tb)
    assert taken[0] is False and all(taken[1:])


@pytest.mark.parametrize("kind", ["mmd", "hockey_stick"])
def test_fast_path_refuses_what_the_general_path_refuses(kind: str) -> None:
    t = _make(kind)
    t.update(torch.randn(30, dtype=torch.float64), torch.randn(30, dtype=torch.float64))
    bad = torch.tensor([0.0, float("nan"), 1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="non-finite"):
        t.update(bad, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        t.update(torch.zeros(3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="dimension"):
        t.update(torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64))
    assert t.n_pairs == 30  # nothing refused was consumed
