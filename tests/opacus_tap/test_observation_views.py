"""host_views: flat NumPy views that share memory with the tensors, or None where a compiled
pass cannot use them."""

from __future__ import annotations

import torch

from dpaudit_torch.opacus_tap.observation import host_views


def test_views_share_memory_and_are_flat():
    ts = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(1, 1, 2)]
    views = host_views(ts)
    assert views is not None and [v.shape for v in views] == [(6,), (4,), (2,)]
    views[0][4] = 7.0
    assert ts[0][1, 1] == 7.0
    p = torch.nn.Parameter(torch.zeros(3))  # requires grad: viewed through detach()
    v = host_views([p])
    assert v is not None and v[0].shape == (3,)
    assert host_views([]) == ()


def test_refusals():
    assert host_views([torch.zeros(2), None]) is None  # a missing tensor
    assert host_views([torch.zeros(2, dtype=torch.bfloat16)]) is None  # no NumPy dtype
    assert host_views([torch.zeros(2, dtype=torch.int64)]) is None  # not a float
    assert host_views([torch.zeros(2), torch.zeros(2, dtype=torch.float64)]) is None  # mixed
    assert host_views([torch.zeros(3, 4).t()]) is None  # not contiguous
    assert host_views([torch.zeros(2, device="meta")]) is None  # not on the CPU
