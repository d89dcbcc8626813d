"""stats.reuse: the near-equality reuse test's tolerance, null bound, type I and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit_torch.stats.reuse import (
    KAPPA,
    SIGNATURE_SIZE,
    NoiseReuseTest,
    near_probability,
    rounding_tolerance,
    unit_roundoff,
)
from dpaudit_torch.testing.reuse_bugs import opacus_release


def _sums(rng: np.random.Generator, n: int) -> np.ndarray:
    """Clipped sums of mixed scales (units of the noise std), as in benchmarks/reuse.py."""
    return rng.standard_normal(n) * rng.choice(np.array([0.01, 0.1, 1.0, 5.0, 50.0]), n)


def _run(test: NoiseReuseTest, noises: list[np.ndarray], dtype: torch.dtype, seed: int = 0,
         batch: float = 64.0) -> np.ndarray:
    """Releases each step's noise as Opacus does (fresh clipped sums) and feeds the test."""
    rng = np.random.default_rng(seed)
    traj = []
    for n in noises:
        rel, x = opacus_release(_sums(rng, n.size), n, batch, dtype)
        traj.append(test.update_steps(x[None], rel[None], unit_roundoff(dtype), [1.0])[0])
    return np.array(traj)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_tolerance_covers_two_releases_of_one_draw(dtype):
    """Reference: tau = KAPPA u (|release| + |s|) with KAPPA = 2 (two roundings of |s + n|)."""
    rng = np.random.default_rng(1)
    n = rng.standard_normal(20_000)
    ra, xa = opacus_release(_sums(rng, n.size), n, 64.0, dtype)
    rb, xb = opacus_release(_sums(rng, n.size), n, 64.0, dtype)
    u = unit_roundoff(dtype)
    tau_a, tau_b = rounding_tolerance(ra, ra - xa, u), rounding_tolerance(rb, rb - xb, u)
    assert np.all(np.abs(xa - xb) <= tau_a + tau_b)
    assert KAPPA == 2.0 and unit_roundoff(torch.float32) == 2.0 ** -24
    assert np.allclose(tau_a, 2 * u * (np.abs(ra) + np.abs(ra - xa)), rtol=0, atol=0)


def _near_rate(y: np.ndarray, tau_y: np.ndarray, x: np.ndarray, tau_x: np.ndarray) -> float:
    hits = 0
    for yi, ti in zip(y, tau_y):
        hits += int(np.sum(np.abs(x - yi) <= tau_x + ti))
    return hits / x.size


@pytest.mark.parametrize("case", ["float16", "bfloat16-cast"])
def test_the_null_bound_holds_by_simulation(case):
    """The bound sum_y (A_y + a B_y) (a: each fresh value's own term) against the simulated
    rate at which a fresh value is near one of the earlier values y, where that rate is large
    enough to measure: a float16 release (u = 2^-11), and bfloat16-cast noise in a float32
    release (exact collisions)."""
    rng = np.random.default_rng(2)
    dtype = torch.float16 if case == "float16" else torch.float32
    u = unit_roundoff(dtype)

    def draw(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = rng.standard_normal(m)
        if case == "bfloat16-cast":
            n = torch.from_numpy(n).to(torch.bfloat16).double().numpy()
        s = rng.standard_normal(m) * 0.5
        rel, x = opacus_release(s, n, 4.0, dtype)
        return x, rounding_tolerance(rel, rel - x, u), np.abs(rel - x)

    y, tau_y, _ = draw(40)
    x, tau_x, s_abs = draw(200_000)
    a_max = float((2 * KAPPA * u * s_abs).max())
    A, B = near_probability(y, tau_y, a_max, u, 1.0)
    bound = float(A.sum() + np.mean(2 * KAPPA * u * s_abs) * B.sum())  # mean over the x
    rate = _near_rate(y, tau_y, x, tau_x)
    se = math.sqrt(max(rate, 1e-6) / x.size)
    assert rate <= bound + 3 * se
    # and not vacuous (a float16 release's tolerance is 1/4 of bfloat16's spacing, so the
    # bfloat16 null's cells weigh in: 5.5x here; float32 releases: about 2.5x, see the type I)
    assert bound < 8 * rate


@pytest.mark.parametrize("kind", ["float32", "float64", "bfloat16"])
def test_type1_on_fresh_noise(kind):
    """No rejection at alpha = 0.05 on fresh noise in 12 runs of 12 steps x 600 values, and the
    matches seen stay under the null bound (Poisson-like count: 3 standard errors)."""
    dtype = torch.float64 if kind == "float64" else torch.float32
    matches, bound = 0, 0.0
    for r in range(12):
        rng = np.random.default_rng(100 + r)
        noises = [rng.standard_normal(600) for _ in range(12)]
        if kind == "bfloat16":
            noises = [torch.from_numpy(n).to(torch.bfloat16).double().numpy() for n in noises]
        t = NoiseReuseTest(alpha=0.05)
        _run(t, noises, dtype, seed=r)
        assert not t.rejected and t.max_log_wealth < math.log(20)
        sm = t.summary()
        matches += sm["matched_across_steps"] + sm["matched_within_step"]
        bound += sm["null_bound_matches"]
    assert matches <= bound + 3 * math.sqrt(bound)


def _fresh(rng: np.random.Generator, steps: int, n: int = 500) -> list[np.ndarray]:
    return [rng.standard_normal(n) for _ in range(steps)]


@pytest.mark.parametrize("form", ["cache-lag-37", "rolled", "within-step", "subset"])
def test_power_within_ten_steps_of_the_first_reuse(form):
    rng = np.random.default_rng(3)
    noises = _fresh(rng, 60)
    first = 45
    for t in range(first, 60):
        if form == "cache-lag-37":
            noises[t] = noises[t - 37].copy()
        elif form == "rolled":
            noises[t] = np.roll(noises[t - 1], 3)
        elif form == "within-step":  # one draw shared by two "tensors" at an offset: 20 pairs
            noises[t][300:320] = noises[t][40:60]
        else:  # two of ten tensors of 50 values reuse their noise of 5 steps before
            for lo in (0, 150):
                noises[t][lo:lo + 50] = noises[t - 5][lo:lo + 50]
    t = NoiseReuseTest(alpha=1e-3, strata=np.arange(0, 501, 50))
    traj = _run(t, noises, torch.float32)
    assert traj[:first].max() < math.log(20)  # nothing before the reuse
    assert t.rejected and first < t.rejected_at <= first + 10


def test_state_dict_resumes_exactly_and_memory_per_step():
    rng = np.random.default_rng(4)
    noises = _fresh(rng, 12, 300)
    noises[9] = noises[2].copy()
    a, b = NoiseReuseTest(), NoiseReuseTest()
    ta = _run(a, noises, torch.float32)
    _run(b, noises[:6], torch.float32)
    c = NoiseReuseTest()
    c.load_state_dict(b.state_dict())
    rng2 = np.random.default_rng(0)
    for _ in range(6):  # the clipped sums the first six steps drew
        _sums(rng2, 300)
    tc = []
    for n in noises[6:]:
        rel, x = opacus_release(_sums(rng2, 300), n, 64.0, torch.float32)
        tc.append(c.update_steps(x[None], rel[None], 2.0 ** -24, [1.0])[0])
    assert np.allclose(tc, ta[6:], rtol=1e-12, atol=1e-12)
    assert c.summary()["common_lags"] == [7]
    assert a.signature_bytes == 12 * SIGNATURE_SIZE * 16  # a few hundred bytes per step


def test_bad_input():
    t = NoiseReuseTest()
    x = np.zeros((1, 3))
    with pytest.raises(ValueError, match="stds"):
        t.update_steps(x, x, 2.0 ** -24, [-1.0])
    with pytest.raises(ValueError, match="one shape"):
        t.update_steps(x, np.zeros((1, 4)), 2.0 ** -24, [1.0])
    with pytest.raises(ValueError, match="rhos"):
        NoiseReuseTest(rhos=(0.5,))
    with pytest.raises(ValueError, match="alpha"):
        NoiseReuseTest(alpha=2.0)
    with pytest.raises(ValueError, match="state_dict"):
        t.load_state_dict({"config": {}})


# ---------------------------------------------------------------- the search's helpers
def test_search_helpers_equal_their_reference_definitions() -> None:
    """The reuse test's faster helpers give what the definitions they replace give, so the
    test's trajectory does not depend on them: the lower quartile is ``np.quantile(a, 0.25)``
    (same arithmetic, same machine), the order is ``argsort(kind="stable")`` with and without
    ties, and the store search finds exactly the pairs |x - v| <= tau_x + tau_v, with the
    largest matching index, on sorted and unsorted keys, above and below the key-sorting size."""
    from dpaudit_torch.stats.reuse import _lower_quartile, _sorted_matches, _stable_order

    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 5, 7, 100, 1001):
        a = np.abs(rng.standard_normal(n))
        assert _lower_quartile(a) == np.quantile(a, 0.25)
    v = rng.standard_normal(300)
    assert np.array_equal(_stable_order(v), np.argsort(v, kind="stable"))
    v[[10, 50, 200]] = v[7]  # ties: the stable order keeps positions in order
    assert np.array_equal(_stable_order(v), np.argsort(v, kind="stable"))
    assert np.array_equal(_stable_order(v, np.argsort(v)), np.argsort(v, kind="stable"))
    for n_store in (40, 3000):
        sv = np.sort(rng.standard_normal(n_store))
        st = np.full(n_store, 1e-6)
        x = rng.standard_normal(500)
        x[:20] = sv[rng.integers(0, n_store, 20)] + 5e-7  # near-equal to a stored value
        x[20] = sv[5]
        tau = np.full(x.size, 1e-6)
        hit, which = _sorted_matches(x, tau, sv, st, 1e-6)
        near = np.abs(x[:, None] - sv[None, :]) <= tau[:, None] + st[None, :]
        assert np.array_equal(hit, near.any(axis=1)) and hit[:21].all()
        last = np.where(near.any(axis=1), n_store - 1 - np.argmax(near[:, ::-1], axis=1), -1)
        assert np.array_equal(which, last)
        hit_k, which_k = _sorted_matches(x, tau, sv, st, 1e-6, np.argsort(x))
        assert np.array_equal(hit_k, hit) and np.array_equal(which_k, which)
