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


# ---------------------------------------------------------------- the CPU's dispatch-free reads
def test_host_gather_reads_what_one_take_per_tensor_reads_without_a_dispatcher_op() -> None:
    import numpy as np

    from dpaudit_torch._compiled import set_compiled
    from dpaudit_torch._gather import HostGather
    from dpaudit_torch.testing.op_count import top_level_ops

    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=g) for n in (7, 64, 1000)]
    flat = [torch.tensor([0, 6]), torch.tensor([63, 1, 5]), torch.tensor([999])]
    want = torch.cat([t.take(f) for t, f in zip(tensors, flat)]).double().numpy()
    gather = HostGather(flat)
    for compiled in (True, False):  # the compiled pass and Python mode's NumPy gathers
        set_compiled(compiled)
        try:
            got: list = []
            assert top_level_ops(lambda got=got: got.append(gather(tensors))) == {}
            np.testing.assert_array_equal(got[0], want)
        finally:
            set_compiled(True)
    # no NumPy view: an integer tensor, a non-contiguous one, another dtype in the list
    assert gather([tensors[0], tensors[1], torch.arange(1000)]) is None
    assert gather([tensors[0], tensors[1], torch.randn(2000)[::2]]) is None
    assert gather([tensors[0], tensors[1].double(), tensors[2]]) is None


def test_host_views_share_memory_cost_no_op_and_are_reused() -> None:
    from dpaudit_torch._host_view import ViewCache, host_views
    from dpaudit_torch.testing.op_count import top_level_ops

    cache = ViewCache(size=4)
    t = [torch.zeros(5), torch.ones(3)]
    out: list = []
    assert top_level_ops(lambda: out.append(host_views(t, cache))) == {}
    views = out[0]
    views[0][2] = 4.0  # writes through
    assert t[0][2].item() == 4.0 and views[1].tolist() == [1.0, 1.0, 1.0]
    built = cache.built
    again = host_views(t, cache)
    assert cache.built == built and again[0] is views[0]  # same address: the cached view
    for i in range(8):  # bounded: the oldest views are dropped
        host_views([torch.zeros(10 + i)], cache)
    assert len(cache._views) <= 4
    assert host_views([], cache) == ()
    assert host_views([None], cache) is None
    assert host_views([torch.zeros(2, dtype=torch.bfloat16)], cache) is None
    assert host_views([torch.zeros(2), None], cache) is None
    assert host_views([torch.zeros(4, 4).t()], cache) is None  # not contiguous
    assert len(host_views([torch.zeros(0)], cache)[0]) == 0


def test_the_watch_kernels_sum_squares_and_count_changes() -> None:
    import numpy as np

    from dpaudit_torch._gather import count_changes, sum_squares

    a = np.array([1.0, 2.0], dtype=np.float32)
    b = np.array([3.0], dtype=np.float32)
    out = np.empty(2)
    sum_squares((a, b), out)
    assert out.tolist() == [5.0, 9.0]
    now = np.array([1.0, 2.0, 3.0, 4.0]).view(np.int64)
    before = np.array([1.0, 2.5, 3.0, 4.5]).view(np.int64)
    seg = np.array([0, 0, 1, 2])  # entries of tensors 0, 0, 1, 2
    steps, first, last = np.zeros(3, np.int32), np.full(3, -1), np.full(3, -1)
    outside = np.array([False, True, True])
    none = np.zeros(3, dtype=np.bool_)
    count_changes(now, before, seg, outside, False, 7, steps, first, last, none)
    assert steps.tolist() == [0, 0, 1] and first.tolist() == [-1, -1, 7]  # 0 is held
    count_changes(now, before, seg, outside, True, 7, steps, first, last, none)
    assert steps.tolist() == [1, 0, 1] and last.tolist() == [7, -1, 7]  # step 7 counted once
    count_changes(now, before, seg, outside, True, 9, steps, first, last, none)
    assert steps.tolist() == [2, 0, 2] and first.tolist() == [7, -1, 7]
    # an excused tensor (a weight average that fitted) is not counted
    count_changes(now, before, seg, outside, True, 11, steps, first, last,
                  np.array([False, False, True]))
    assert steps.tolist() == [3, 0, 2]


def test_fit_averages_accepts_one_beta_within_the_rounding_and_nothing_else() -> None:
    """fit_averages at its tolerance: an EMA step computed in float32 fits (beta in
    {0.1, 0.5, 1}, products-and-sum and lerp forms, 64 coordinates); the same step off by ten
    tolerances at one coordinate, coordinates needing different betas, or a beta outside
    [0, 1] do not."""
    import numpy as np

    from dpaudit_torch._gather import average_tolerance, fit_averages

    g = np.random.default_rng(0)
    n = 64
    b = g.standard_normal(n).astype(np.float32)
    p = g.standard_normal(n).astype(np.float32)

    def fits(b_new: np.ndarray) -> bool:
        before = np.concatenate([b, p]).astype(np.float64)
        now = np.concatenate([b_new, p]).astype(np.float64)
        i64 = np.int64
        excused = np.zeros(2, dtype=np.bool_)
        fit_averages(now, before, now, now.view(i64), before.view(i64), np.array([0]),
                     np.array([0, n]), np.arange(n), np.arange(n, 2 * n),
                     np.array([2.0 ** -24]), np.array([float(np.finfo(np.float32).tiny)]), 1,
                     excused, np.zeros(1, np.int32), np.full(1, -1), np.full(1, -1),
                     np.full(1, np.inf), np.full(1, -np.inf))
        return bool(excused[0])

    for beta in (0.1, 0.5, 1.0):
        f = np.float32
        assert fits(b * f(1 - beta) + p * f(beta))
        assert fits(b + (p - b) * f(beta))
    ema = b * np.float32(0.9) + p * np.float32(0.1)
    # one coordinate off by 10 tolerances (a data term), or by half of one (rounding)
    t3 = average_tolerance(2.0 ** -24, float(b[3]), float(ema[3]), float(p[3]),
                           float(np.finfo(np.float32).tiny))
    off = ema.copy()
    off[3] = np.float32(float(ema[3]) + 10 * t3)
    near = ema.copy()
    near[3] = np.float32(float(ema[3]) + 0.5 * t3)
    assert fits(near)
    assert not fits(off)
    two = ema.copy()
    two[:8] = b[:8] * np.float32(0.8) + p[:8] * np.float32(0.2)
    assert not fits(two)
    assert not fits(b + (p - b) * np.float32(1.5)) and not fits(b - (p - b) * np.float32(0.1))
