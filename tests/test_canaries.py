"""Tests of dpaudit_torch/canaries.py: the canary design, the noise-audit coordinates and the
secret coins (docs/design.md sections 5 and 11).

Design: counts per tensor, no coordinate ever used twice, coordinates inside their tensor,
reproducible from a seeded generator, uniform over a tensor, the checkpoint round trip, the spread
pairs and their positions.  Noise coordinates: never on a canary coordinate, as many per tensor as
asked or available.  Seeds: three independent streams, OS entropy without a seed.  Coins: half IN,
hidden from repr, revealed only on request, the checkpoint round trip.  Bad input raises naming
the value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit_torch.canaries import (
    NOISE_COORDINATES_FLOOR,
    CanaryDesign,
    SecretCoins,
    add_spread_pairs,
    allocate,
    derive_seeds,
    draw_design,
    draw_noise_coordinates,
    noise_allotment,
)

#: the parameter shapes of the tests' 16-32-2 MLP (tests/conftest.py), 610 coordinates
MLP = [(32, 16), (32,), (2, 32), (2,)]
#: a tensor large enough for the samplers' rejection path (> 2^16 coordinates) beside small ones
LARGE = [(300_000,), (3,), (40, 5)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _coords(design: CanaryDesign) -> list[tuple[int, int]]:
    p, f = design.coordinates()
    return list(zip(p.tolist(), f.tolist()))


def _assert_valid(design: CanaryDesign) -> None:
    """Every coordinate inside its tensor, none used twice, pairs inside one tensor."""
    coords = _coords(design)
    assert len(coords) == 2 * design.k_pairs + design.m_canaries + design.n_extra
    assert len(set(coords)) == len(coords)
    assert all(0 <= f < _numel(design.shapes[p]) for p, f in coords)
    assert all(0 <= p < design.n_params for p, _ in coords)


# ------------------------------------------------------------------------------------------------
# seeds
# ------------------------------------------------------------------------------------------------
def test_derive_seeds_seeded() -> None:
    seeds, policy = derive_seeds(5)
    assert policy == "seeded (5)" and set(seeds) == {"design", "mechanics", "secret"}
    assert len(set(seeds.values())) == 3 and all(0 <= s < 2**63 for s in seeds.values())
    assert derive_seeds(5) == (seeds, policy)
    assert derive_seeds(np.int64(5)) == (seeds, policy)
    other, _ = derive_seeds(6)
    assert not set(other.values()) & set(seeds.values())


def test_derive_seeds_from_os_entropy() -> None:
    a, policy = derive_seeds(None)
    b, _ = derive_seeds(None)
    assert policy == "os-entropy" and set(a) == {"design", "mechanics", "secret"}
    assert a != b and all(0 <= s < 2**63 for s in a.values())


@pytest.mark.parametrize(("seed", "error", "match"),
                         [(True, TypeError, "True"), (1.5, TypeError, "1.5"),
                          ("3", TypeError, "'3'"), (-1, ValueError, "seed must be >= 0, got -1")])
def test_derive_seeds_bad_input(seed: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        derive_seeds(seed)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# allocation over tensors
# ------------------------------------------------------------------------------------------------
def test_allocate_by_hand() -> None:
    assert allocate(10, [100, 100]) == [5, 5]
    # at least one per tensor, the rest proportionally (58.2, 29.1, 9.7 -> largest remainder)
    assert allocate(100, [600, 300, 100]) == [60, 30, 10]
    assert allocate(3, [1000, 10, 10]) == [1, 1, 1]
    # fewer items than tensors: no minimum, all by proportion
    assert allocate(2, [1000, 10, 10]) == [2, 0, 0]
    # capacities respected; an empty tensor gets nothing
    assert allocate(5, [1, 100]) == [1, 4]
    assert allocate(3, [0, 10]) == [0, 3]
    assert allocate(0, [5, 5]) == [0, 0]
    assert allocate(10, [4, 6]) == [4, 6]


def test_allocate_invariants() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(0, 200, size=int(rng.integers(1, 8))).tolist()
        total = int(rng.integers(0, sum(sizes) + 1))
        out = allocate(total, sizes)
        assert sum(out) == total
        assert all(0 <= o <= s for o, s in zip(out, sizes))
        if total >= sum(s > 0 for s in sizes):
            assert all(o >= 1 for o, s in zip(out, sizes) if s > 0)


def test_allocate_refuses_more_than_the_capacity() -> None:
    with pytest.raises(ValueError, match="cannot place 11 canary slots .* holding only 10"):
        allocate(11, [5, 5])


# ------------------------------------------------------------------------------------------------
# the design
# ------------------------------------------------------------------------------------------------
def test_design_counts_and_coordinates() -> None:
    d = draw_design(MLP, 8, 64, _gen(0))
    _assert_valid(d)
    assert (d.k_pairs, d.m_canaries, d.n_params, d.kind) == (8, 64, 4, "dirac")
    assert (d.n_spread, d.spread_width, d.n_extra) == (0, 1, 0)
    # pairs by numel // 2, one-run canaries by what the pairs left; every tensor gets a pair, and
    # a one-run canary where room is left (the 2-coordinate bias is filled by its pair); most go
    # to the largest tensor
    pairs = np.bincount(d.pair_param.numpy(), minlength=4)
    ones = np.bincount(d.one_param.numpy(), minlength=4)
    assert pairs.tolist() == allocate(8, [_numel(s) // 2 for s in MLP]) == [5, 1, 1, 1]
    left = [_numel(s) - 2 * p for s, p in zip(MLP, pairs)]
    assert left[3] == 0 and ones.tolist() == allocate(64, left)
    assert (ones[:3] >= 1).all() and ones[3] == 0 and ones.argmax() == 0
    # one-run canaries sorted by tensor; the design order of coordinates()
    assert torch.all(d.one_param[1:] >= d.one_param[:-1])
    p, f = d.coordinates()
    assert torch.equal(f[:8], d.pair_a) and torch.equal(f[8:16], d.pair_b)
    assert torch.equal(f[16:], d.one_flat) and torch.equal(p[8:16], d.pair_param)
    summary = d.summary()
    assert (summary["k_pairs"], summary["m_one_run"], summary["design"]) == (8, 64, "dirac")
    assert [t["pairs"] for t in summary["per_parameter"]] == pairs.tolist()
    assert [t["one_run"] for t in summary["per_parameter"]] == ones.tolist()
    assert [t["numel"] for t in summary["per_parameter"]] == [512, 32, 64, 2]


def test_design_is_reproducible_from_a_seeded_generator() -> None:
    a, b, c = (draw_design(MLP, 8, 64, _gen(s)) for s in (3, 3, 4))
    assert _coords(a) == _coords(b) and _coords(a) != _coords(c)
    la, lb = (draw_design(LARGE, 6, 300, _gen(s)) for s in (3, 3))
    assert _coords(la) == _coords(lb)


def test_large_tensor_rejection_path() -> None:
    d = draw_design(LARGE, 6, 300, _gen(1))
    _assert_valid(d)
    assert (d.k_pairs, d.m_canaries) == (6, 300)
    assert int((d.one_param == 0).sum()) > 250  # mostly in the large tensor


def test_coordinates_are_uniform_over_a_tensor() -> None:
    # one canary in a 10-coordinate tensor, 2000 designs: each coordinate 200 times in
    # expectation; Pearson's chi-square with 9 degrees of freedom, p-value above 1e-3
    g = _gen(0)
    hits = np.bincount([int(draw_design([(10,)], 0, 1, g).one_flat[0]) for _ in range(2000)],
                       minlength=10)
    assert stats.chisquare(hits).pvalue > 1e-3


def test_design_bad_input() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        draw_design([], 1, 1, _gen(0))
    with pytest.raises(ValueError, match="cannot place 306 canary slots .* holding only 305"):
        draw_design(MLP, 306, 0, _gen(0))  # a pair per two coordinates: 305 pairs at most
    with pytest.raises(ValueError, match="cannot place"):
        draw_design(MLP, 300, 11, _gen(0))  # 600 coordinates of pairs + 11 > 610


def _assert_same_design(a: CanaryDesign, b: CanaryDesign) -> None:
    assert a.shapes == b.shapes and a.kind == b.kind
    for name in ("pair_param", "pair_a", "pair_b", "one_param", "one_flat", "spread_pair",
                 "spread_param", "spread_a", "spread_b"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype == torch.long and torch.equal(x, y), name


def test_state_round_trip() -> None:
    for d in (draw_design(MLP, 8, 64, _gen(0)),
              add_spread_pairs(draw_design(MLP, 8, 64, _gen(0)), 2, 3, _gen(1))):
        sd = d.to_state()
        back = CanaryDesign.from_state(sd)
        _assert_same_design(back, d)
        sd["pair_a"][0] += 1  # the state holds copies
        assert not torch.equal(sd["pair_a"], d.pair_a)
    # a state stored with other integer dtypes (and no kind) still loads
    sd = draw_design(MLP, 4, 8, _gen(2)).to_state()
    narrow = {k: (v.int() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()
              if k != "kind"}
    _assert_same_design(CanaryDesign.from_state(narrow), CanaryDesign.from_state(sd))


# ------------------------------------------------------------------------------------------------
# spread pairs
# ------------------------------------------------------------------------------------------------
def test_spread_pairs() -> None:
    base = draw_design(MLP, 8, 64, _gen(0))
    d = add_spread_pairs(base, 2, 3, _gen(1))
    _assert_valid(d)
    assert (d.n_spread, d.spread_width, d.n_extra) == (2, 3, 8)
    assert _coords(d)[:2 * 8 + 64] == _coords(base)  # the Dirac coordinates are kept
    # the pairs of the largest tensor; their extras in the two largest other tensors (64, 32)
    assert d.pair_param[d.spread_pair].tolist() == [0, 0]
    assert d.spread_param.tolist() == [[2, 1], [2, 1]]
    # spread_sides: design-order positions of every coordinate of each side
    side_a, side_b = d.spread_sides()
    assert side_a.shape == side_b.shape == (2, 3)
    p, f = d.coordinates()
    for q, j in enumerate(d.spread_pair.tolist()):
        assert p[side_a[q]].tolist() == [int(d.pair_param[j])] + d.spread_param[q].tolist()
        assert f[side_a[q]].tolist() == [int(d.pair_a[j])] + d.spread_a[q].tolist()
        assert p[side_b[q]].tolist() == [int(d.pair_param[j])] + d.spread_param[q].tolist()
        assert f[side_b[q]].tolist() == [int(d.pair_b[j])] + d.spread_b[q].tolist()
    assert set(side_a.ravel()).isdisjoint(side_b.ravel())
    s = d.summary()
    assert (s["spread_pairs"], s["spread_tensors"]) == (2, 3)
    # reproducible from a seeded generator
    again = add_spread_pairs(draw_design(MLP, 8, 64, _gen(0)), 2, 3, _gen(1))
    _assert_same_design(again, d)


def test_spread_pairs_limits() -> None:
    base = draw_design(MLP, 8, 64, _gen(0))
    assert add_spread_pairs(base, 0, 3, _gen(1)) is base
    assert add_spread_pairs(base, 2, 1, _gen(1)) is base
    one_tensor = draw_design([(100,)], 4, 4, _gen(0))
    assert add_spread_pairs(one_tensor, 2, 3, _gen(1)) is one_tensor
    # a tensor without room for the extras (2 free coordinates per spread pair) is skipped: the
    # MLP's 2-coordinate output bias holds a pair (test_design_counts_and_coordinates), so a
    # spread canary as wide as the model covers the other three tensors only
    d = add_spread_pairs(base, 2, 4, _gen(1))
    _assert_valid(d)
    assert d.spread_width == 3 and 3 not in d.spread_param.ravel().tolist()
    # more spread pairs than pairs, wider than the model: capped at k and at the tensors with room
    d = add_spread_pairs(base, 50, 10, _gen(1))
    _assert_valid(d)
    assert d.n_spread == 8 and d.spread_width == 3


def test_spread_sides_without_spread_pairs() -> None:
    a, b = draw_design(MLP, 4, 4, _gen(0)).spread_sides()
    assert a.shape == b.shape == (0, 1)


# ------------------------------------------------------------------------------------------------
# noise-audit coordinates
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shapes", [MLP, LARGE])
@pytest.mark.parametrize("per_tensor", [0, 5, 100, 10_000])
def test_noise_coordinates_never_on_a_canary(shapes: list[tuple[int, ...]], per_tensor: int
                                            ) -> None:
    design = add_spread_pairs(draw_design(shapes, 6, 40, _gen(0)), 2, 3, _gen(1))
    param, flat = draw_noise_coordinates(design, per_tensor, _gen(2))
    assert param.dtype == flat.dtype == torch.long and param.shape == flat.shape
    coords = list(zip(param.tolist(), flat.tolist()))
    canary = set(_coords(design))
    assert not canary & set(coords) and len(set(coords)) == len(coords)
    assert all(0 <= f < _numel(shapes[p]) for p, f in coords)
    # tensor-major, sorted inside each tensor
    assert coords == sorted(coords)
    # as many per tensor as asked, or all a tensor has beside its canaries
    free = [_numel(s) - sum(p == i for p, _ in canary) for i, s in enumerate(shapes)]
    assert np.bincount(param.numpy(), minlength=len(shapes)).tolist() == \
        [min(per_tensor, a) for a in free]
    # reproducible from a seeded generator
    again = draw_noise_coordinates(design, per_tensor, _gen(2))
    assert torch.equal(again[0], param) and torch.equal(again[1], flat)


def test_noise_coordinates_under_a_cap() -> None:
    design = draw_design(MLP, 8, 64, _gen(0))
    canary = set(_coords(design))
    free = [_numel(s) - sum(p == i for p, _ in canary) for i, s in enumerate(MLP)]
    param, flat = draw_noise_coordinates(design, 400, _gen(3), total=300)
    counts = np.bincount(param.numpy(), minlength=4).tolist()
    assert counts == noise_allotment(free, 400, 300)
    assert not canary & set(zip(param.tolist(), flat.tolist()))


def test_noise_allotment_invariants() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        avail = rng.integers(0, 3000, size=int(rng.integers(1, 10))).tolist()
        per = int(rng.integers(0, 2500))
        total = int(rng.integers(1, 10_000))
        out = noise_allotment(avail, per, total)
        uncapped = noise_allotment(avail, per, None)
        assert uncapped == [min(per, a) for a in avail]
        assert all(0 <= o <= u for o, u in zip(out, uncapped))
        if sum(uncapped) <= total:
            assert out == uncapped
        elif max(out) > min(per, NOISE_COORDINATES_FLOOR):  # above the floor the cap holds
            assert sum(out) <= total


# ------------------------------------------------------------------------------------------------
# secret coins
# ------------------------------------------------------------------------------------------------
def test_coins_are_fair_and_reproducible() -> None:
    m = 4000
    coins = SecretCoins(m, _gen(0))
    mask = coins.sampling_mask()
    assert coins.m == m and mask.dtype == torch.bool and mask.shape == (m,)
    # IN with probability 1/2: within 3 binomial standard errors of m / 2
    assert abs(int(mask.sum()) - m / 2) <= 3 * math.sqrt(m / 4)
    assert torch.equal(SecretCoins(m, _gen(0)).sampling_mask(), mask)
    assert not torch.equal(SecretCoins(m, _gen(1)).sampling_mask(), mask)


def test_coins_revealed_only_on_request() -> None:
    coins = SecretCoins(16, _gen(0))
    assert repr(coins) == str(coins) == "SecretCoins(m=16, revealed=False)"
    mask, revealed = coins.state()
    coins.sampling_mask()
    assert not revealed and not coins.revealed  # neither call reveals
    out = coins.reveal()
    assert coins.revealed and repr(coins) == "SecretCoins(m=16, revealed=True)"
    assert torch.equal(out, mask)
    out[:] = ~out  # the revealed mask is a copy
    assert torch.equal(coins.reveal(), mask)
    with pytest.raises(AttributeError):
        coins.extra = 1  # type: ignore[attr-defined]  # __slots__: nowhere else to hide them
    assert not hasattr(coins, "__dict__")


def test_coins_state_round_trip() -> None:
    coins = SecretCoins(50, _gen(4))
    mask, revealed = coins.state()
    back = SecretCoins.from_state(mask, revealed)
    assert torch.equal(back.sampling_mask(), coins.sampling_mask()) and not back.revealed
    mask[0] = ~mask[0]  # the state is a copy
    assert not torch.equal(mask, coins.sampling_mask())
    coins.reveal()
    again = SecretCoins.from_state(*coins.state())
    assert again.revealed and torch.equal(again.reveal(), coins.reveal())
    # another dtype is read as IN/OUT
    as_int = SecretCoins.from_state(torch.tensor([1, 0, 1]), False)
    assert as_int.sampling_mask().tolist() == [True, False, True]


@pytest.mark.parametrize("bad", [torch.zeros(2, 2, dtype=torch.bool), [True, False],
                                 torch.tensor(True)])
def test_coins_bad_state(bad: object) -> None:
    with pytest.raises(ValueError, match="secret coins must be a 1-d tensor"):
        SecretCoins.from_state(bad, False)  # type: ignore[arg-type]


def test_noise_coordinates_of_large_tensors_come_in_the_whole_null_tests_pairs() -> None:
    """Where U is a small share of a tensor, it is drawn as neighbours and aligned positions
    (docs/design.md section 11), so the pairs the whole-null test bets on are observed on
    large tensors; a broadcast-per-row noise, invisible to single values, is then caught."""
    from dpaudit_torch.stats.noise_null import NoiseNullTest, noise_pairs

    shapes = [(512, 256), (512,), (512, 512), (1024, 512)]
    design = draw_design(shapes, 8, 64, torch.Generator().manual_seed(0))
    p, f = draw_noise_coordinates(design, 1024, torch.Generator().manual_seed(1))
    again = draw_noise_coordinates(design, 1024, torch.Generator().manual_seed(1))
    assert torch.equal(p, again[0]) and torch.equal(f, again[1])  # fixed by the generator
    coords = list(zip(p.tolist(), f.tolist()))
    cp, cf = design.coordinates()
    busy_bias = int((cp == 1).sum())  # the bias: every free coordinate (uniform path)
    assert np.bincount(p.numpy()).tolist() == [1024, 512 - busy_bias, 1024, 1024]
    assert len(set(coords)) == len(coords) and not set(zip(cp.tolist(), cf.tolist())) & set(
        coords)
    pairs = {k: len(v[0]) for k, v in noise_pairs(p.numpy(), f.numpy(), shapes).items()}
    # a uniform draw of 1024 of 131,072 coordinates has about 8 adjacent pairs; structured:
    assert pairs["adjacent"] > 300 and pairs["column"] > 150 and pairs["aligned_odd"] > 100
    # one noise value per output row, broadcast over the row (exact N(0, 1) marginals)
    rng = np.random.default_rng(3)
    test = NoiseNullTest(p.numpy(), f.numpy(), shapes, alpha=0.05)
    rows = np.array([fl // (math.prod(shapes[t]) // shapes[t][0]) if len(shapes[t]) > 1 else fl
                     for t, fl in coords])
    for _ in range(5):
        per_row = {t: rng.standard_normal(shapes[t][0]) for t in range(len(shapes))}
        test.update_steps(np.array([[per_row[t][r] for t, r in zip(p.tolist(), rows)]]))
    assert test.rejected
