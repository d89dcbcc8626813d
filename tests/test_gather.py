"""dpaudit_torch._gather: packed gathers read exactly what one take per tensor reads."""

from __future__ import annotations

import pytest
import torch
from conftest import devices

from dpaudit_torch._gather import PackedGather


def _case(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (1,), (50, 7), (2, 3, 5), (400,), (6,), (33, 9), (2,)]
    tensors = [torch.randn(s, generator=g) for s in shapes]
    flat = [torch.randint(0, t.numel(), (int(torch.randint(1, 12, (1,), generator=g)),),
                          generator=g) for t in tensors]
    return tensors, flat


def _reference(tensors: list[torch.Tensor], flat: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([torch.take(t, f) for t, f in zip(tensors, flat)])


@pytest.mark.parametrize("budget", [1, 40, 300, 500, 10_000])
def test_packed_equals_one_take_per_tensor(budget: int) -> None:
    tensors, flat = _case(budget)
    ref = _reference(tensors, flat)
    for pack in (True, False):
        got = PackedGather(flat, [t.numel() for t in tensors], pack, budget)(tensors)
        assert torch.equal(got, ref)


def test_packing_cuts_the_operations_and_respects_the_budget() -> None:
    tensors, flat = _case(1)
    numels = [t.numel() for t in tensors]
    unpacked = PackedGather(flat, numels, pack=False)
    assert unpacked.operations == len(tensors)
    one = PackedGather(flat, numels, pack=True)  # everything fits one chunk
    assert len(one.chunks) == 1 and one.operations == 2
    small = PackedGather(flat, numels, pack=True, budget=400)
    for members, _ in small.chunks:  # a chunk exceeds the budget only as a single tensor
        assert len(members) == 1 or sum(numels[j] for j in members) <= 400
    assert [j for members, _ in small.chunks for j in members] == list(range(len(tensors)))


def test_noncontiguous_mixed_dtypes_and_changed_sizes() -> None:
    tensors, flat = _case(3)
    tensors[2] = tensors[2].t().contiguous().t()  # same values, transposed strides
    assert not tensors[2].is_contiguous()
    tensors[3] = tensors[3].half()  # promoted in the concatenation, as in the reference
    gather = PackedGather(flat, [t.numel() for t in tensors], pack=True)
    assert torch.equal(gather(tensors), _reference(tensors, flat))
    # a tensor whose size is not the planned one: its chunk is read one take per tensor
    bigger = list(tensors)
    bigger[0] = torch.arange(100.0)
    assert torch.equal(gather(bigger), _reference(bigger, flat))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="2 index tensors for 1 tensors"):
        PackedGather([torch.tensor([0]), torch.tensor([0])], [3], pack=True)


def test_without_the_cpp_flattening_the_python_one_gives_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tensors, flat = _case(4)
    gather = PackedGather(flat, [t.numel() for t in tensors], pack=True)
    ref = gather(tensors)
    monkeypatch.setattr(torch._C._nn, "flatten_dense_tensors", None, raising=False)
    assert torch.equal(gather(tensors), ref)
    assert torch.equal(ref, _reference(tensors, flat))


@pytest.mark.parametrize("device", devices())
def test_on_each_device_and_across_devices(device: str) -> None:
    """On the device (CUDA where there is one) the packed gather reads what the takes read;
    tensors on another device than the indices (a model moved after the gather was planned)
    are read one take per tensor, on their device."""
    tensors, flat = _case(5)
    tensors = [t.to(device) for t in tensors]
    flat = [f.to(device) for f in flat]
    gather = PackedGather(flat, [t.numel() for t in tensors], pack=True)
    got = gather(tensors)
    assert got.device.type == device and torch.equal(got, _reference(tensors, flat))
    moved = [t.cpu() for t in tensors]
    assert torch.equal(gather(moved), _reference(moved, [f.cpu() for f in flat]))


def test_large_tensors_are_read_alone_in_their_place() -> None:
    tensors, flat = _case(6)
    numels = [t.numel() for t in tensors]  # 12, 1, 350, 30, 400, 6, 297, 2
    gather = PackedGather(flat, numels, pack=True, budget=10_000, small=300)
    assert [m for m, _ in gather.chunks] == [[0, 1], [2], [3], [4], [5, 6, 7]]
    assert torch.equal(gather(tensors), _reference(tensors, flat))
