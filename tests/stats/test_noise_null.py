"""Tests of the whole-null noise test (docs/design.md section 11, "The whole null").

Validity: the KT mixture has mean exactly 1 (enumeration), the trajectory is the same whatever
the block sizes (predictable), and the false alarm rate of simulated correct releases (exact
N(0, 1) noise added to a real-data sum of realistic size in float32 or float64, then subtracted
in float64 as the reader does) is at most alpha plus three binomial standard errors. Power:
noise of the claimed variance but another shape, or dependent within a step or across steps.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpaudit_torch.stats.noise_null import (
    NoiseNullTest,
    _cell_edges,
    _kt_log_e,
    noise_pairs,
)

SHAPES = [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (8,), (10, 32), (10,)]


def _layout(fraction: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t, f = [], []
    for i, s in enumerate(SHAPES):
        n = int(np.prod(s))
        k = max(1, int(round(fraction * n)))
        f.append(np.sort(rng.choice(n, k, replace=False)))
        t.append(np.full(k, i))
    return np.concatenate(t), np.concatenate(f)


def _test(alpha: float = 0.05, fraction: float = 1.0) -> NoiseNullTest:
    t, f = _layout(fraction)
    return NoiseNullTest(t, f, SHAPES, alpha)


def _tol(alpha: float, runs: int) -> float:
    return alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / runs)


def _released_noise(rng: np.random.Generator, steps: int, n: int, dtype: type) -> np.ndarray:
    """Standardised noise as the reader reconstructs it: (release - real sum) / std, with the
    release computed in ``dtype`` (float32 as Opacus's, or float64) and a real-data sum of
    realistic size (a few noise standard deviations)."""
    std = 0.7
    real = rng.normal(0.0, 3.0 * std, size=(steps, n))
    noise = rng.standard_normal((steps, n)).astype(dtype)
    release = (real.astype(dtype) + noise * dtype(std)).astype(np.float64)
    return (release - real.astype(dtype).astype(np.float64)) / std


# ---------------------------------------------------------------------- construction
def test_kt_mixture_has_mean_one_by_enumeration() -> None:
    # E over the null of the KT mixture likelihood ratio of 3 values in 4 cells is exactly 1,
    # for uniform and for non-uniform null masses
    for p0 in (np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])):
        total = 0.0
        for seq in itertools.product(range(4), repeat=3):
            counts = np.bincount(seq, minlength=4)
            prob = float(np.prod(p0[list(seq)]))
            total += math.exp(_kt_log_e(counts[None], np.log(p0))[0]) * prob
        assert total == pytest.approx(1.0, rel=1e-12)


def test_cells_are_exact_quantiles_of_the_null() -> None:
    edges, shape_map, tail_map, quart_map, tail_mass = _cell_edges()
    from scipy import stats as sps

    fine_mass = np.diff(np.r_[0.0, sps.norm.cdf(edges), 1.0])
    shape_mass = np.bincount(shape_map, weights=fine_mass)
    assert np.allclose(shape_mass, 1 / 16, atol=1e-15)
    assert np.allclose(np.bincount(quart_map, weights=fine_mass), 0.25, atol=1e-15)
    assert np.allclose(np.bincount(tail_map, weights=fine_mass), tail_mass, atol=1e-15)
    # the grid binning agrees with searchsorted everywhere, edges and their neighbours included
    test = _test()
    x = np.r_[edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf), -9.0, 9.0,
              -4.0078125, 4.0, 0.0, -0.0, np.linspace(-6, 6, 10001)]
    assert np.array_equal(test._fine_cells(x[None])[0], np.searchsorted(edges, x, side="right"))


def test_pairs_are_structured_and_disjoint() -> None:
    t, f = _layout(0.6, seed=3)
    pairs = noise_pairs(t, f, SHAPES)
    numel = [int(np.prod(s)) for s in SHAPES]
    for name, (a, b) in pairs.items():
        both = np.r_[a, b]
        assert np.unique(both).size == both.size, name  # no value in two pairs of a family
        if name == "adjacent":
            assert np.all((t[a] == t[b]) & (f[b] == f[a] + 1))
        elif name == "column":
            rows = np.array([s[0] for s in SHAPES])
            assert np.all((t[a] == t[b]) & (f[b] - f[a] == np.array(numel)[t[a]] // rows[t[a]]))
        else:
            assert np.all((f[a] == f[b]) & (t[a] != t[b]))
    assert {"adjacent", "column", "aligned_even", "aligned_odd", "same_shape"} <= set(pairs)
    assert np.all(np.array([SHAPES[i] for i in t[pairs["same_shape"][0]]], dtype=object)
                  == np.array([SHAPES[i] for i in t[pairs["same_shape"][1]]], dtype=object))


def test_without_structure_only_single_values_and_lag() -> None:
    t, _ = _layout()
    test = NoiseNullTest(t, None, None)
    assert test.families == ["shape", "tails", "lag1"]


def test_blocks_give_the_same_trajectory_and_state_round_trips() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, _test().n))
    one = _test()
    whole = one.update_steps(x)
    parts = _test()
    pieces = [parts.update_steps(x[i:j]) for i, j in ((0, 1), (1, 5), (5, 6), (6, 12))]
    assert np.array_equal(whole, np.concatenate(pieces))
    # a trajectory value depends on the rows up to it only
    other = _test()
    y = x.copy()
    y[7:] = rng.laplace(size=y[7:].shape)
    assert np.array_equal(other.update_steps(y)[:7], whole[:7])
    saved = _test()
    saved.update_steps(x[:6])
    again = _test()
    again.load_state_dict(saved.state_dict())
    assert np.array_equal(again.update_steps(x[6:]), whole[6:])
    assert again.summary()["log_wealth"] == pytest.approx(one.log_wealth)


def test_bad_input() -> None:
    test = _test()
    with pytest.raises(ValueError):
        test.update_steps(np.zeros((2, test.n + 1)))
    with pytest.raises(ValueError):
        test.update_steps(np.full((1, test.n), np.nan))
    with pytest.raises(ValueError):
        noise_pairs(np.array([0, 7]), np.array([0, 0]), SHAPES)
    assert test.update_steps(np.zeros((0, test.n))).size == 0
    empty = NoiseNullTest(np.zeros(0, np.int64), np.zeros(0, np.int64), SHAPES)
    assert np.array_equal(empty.update_steps(np.zeros((2, 0))), np.zeros(2))


# ---------------------------------------------------------------------- validity
def _alarms(alpha: float, runs: int, steps: int, seed: int, frac: float, dtype: type) -> int:
    """Runs of the test on simulated correct releases (exact iid Gaussian noise added to and
    taken from a real sum in ``dtype``) that reject."""
    rng = np.random.default_rng(seed)
    t, f = _layout(frac)
    alarms = 0
    for _ in range(runs):
        test = NoiseNullTest(t, f, SHAPES, alpha)
        test.update_steps(_released_noise(rng, steps, test.n, dtype))
        alarms += test.rejected
    return alarms


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_false_alarms_below_alpha(dtype: type) -> None:
    # 300 simulated correct releases x 30 steps at alpha = 0.2 (a level at which a broken
    # e-process shows); fixed seed
    alpha, runs = 0.2, 300
    alarms = _alarms(alpha, runs, 30, 2024 if dtype is np.float32 else 2025, 0.5, dtype)
    assert alarms / runs <= _tol(alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_false_alarms_below_alpha_long(dtype: type) -> None:
    alpha, runs = 0.1, 1000
    alarms = _alarms(alpha, runs, 200, 7 if dtype is np.float32 else 8, 1.0, dtype)
    assert alarms / runs <= _tol(alpha, runs)


# ---------------------------------------------------------------------- power
def _departure(kind: str, rng: np.random.Generator, test: NoiseNullTest, steps: int
               ) -> np.ndarray:
    n = test.n
    x = rng.standard_normal((steps, n))
    if kind == "laplace":
        return rng.laplace(scale=1 / math.sqrt(2), size=(steps, n))
    if kind == "uniform":
        return rng.uniform(-math.sqrt(3), math.sqrt(3), size=(steps, n))
    if kind == "rademacher":
        return rng.choice([-1.0, 1.0], size=(steps, n))
    if kind == "student5":  # Student t with 5 degrees of freedom, variance 1
        return rng.standard_t(5, size=(steps, n)) / math.sqrt(5 / 3)
    a, b = test.pairs["adjacent" if kind in ("adjacent", "adjacent_rho") else "aligned_even"]
    if kind == "adjacent_rho":  # correlation 0.5 between the coordinates of adjacent pairs
        x[:, b] = 0.5 * x[:, a] + math.sqrt(0.75) * x[:, b]
    else:
        x[:, b] = x[:, a]
    if kind == "lag":
        x = np.repeat(rng.standard_normal((1, n)), steps, axis=0)
    return x


@pytest.mark.parametrize("kind,within", [
    ("laplace", 2), ("uniform", 1), ("rademacher", 1), ("student5", 5), ("adjacent", 1),
    ("adjacent_rho", 3), ("aligned", 2), ("lag", 2)])
def test_power_against_fixed_departures(kind: str, within: int) -> None:
    for seed in (0, 1):
        test = _test()
        x = _departure(kind, np.random.default_rng(seed), test, 10)
        test.update_steps(x)
        assert test.rejected and test.rejected_at <= within, (kind, seed, test.rejected_at)


def test_power_after_a_correct_stretch() -> None:
    test = _test()
    rng = np.random.default_rng(5)
    test.update_steps(rng.standard_normal((100, test.n)))
    assert not test.rejected
    test.update_steps(rng.laplace(scale=1 / math.sqrt(2), size=(20, test.n)))
    assert test.rejected and test.rejected_at <= 110
    assert test.worst_family() in ("shape", "tails")
