"""Tests of SequentialMMDTest (docs/design.md section 2; González et al., NeurIPS 2025)."""

from __future__ import annotations

import io
import logging
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import devices

from dpaudit_torch.stats.base import CannotRejectWarning
from dpaudit_torch.stats.mmd import REFRESH_FACTOR, SequentialMMDTest
from dpaudit_torch.stats.thresholds import gaussian_delta

ONS_C = 2.0 / (2.0 - math.log(3.0))


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------
# A straightforward implementation of docs/design.md section 2, written independently of the
# library: explicit coefficients c_i rescaled one by one at every projection, the kernel row
# computed from direct differences over all past pairs, ||f||^2 recomputed from the Gram matrix
# (not tracked recursively), its own ONS.
# --------------------------------------------------------------------------------------------
def reference_mmd(
    xs: np.ndarray,
    ys: np.ndarray,
    epsilons: list[float],
    delta: float,
    alpha: float,
    burn_in: int,
    radius: float,
) -> dict:
    xs = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)
    ys = np.asarray(ys, dtype=np.float64).reshape(len(ys), -1)
    pooled = np.vstack([xs[:burn_in], ys[:burn_in]])
    dists = [
        float(np.sqrt(np.sum((pooled[i] - pooled[j]) ** 2)))
        for i in range(len(pooled))
        for j in range(i + 1, len(pooled))
    ]
    bw = float(np.median(dists))
    if bw == 0.0:
        nz = [d for d in dists if d > 0]
        bw = float(np.mean(nz)) if nz else 1.0

    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # a: [t, d] or [d], b: [d]
        return np.exp(-np.sum((a - b) ** 2, axis=-1) / (2.0 * bw * bw))

    taus = [math.sqrt(2.0) * (1.0 - 2.0 * (1.0 - delta) / (1.0 + math.exp(e))) for e in epsilons]
    G = len(epsilons)
    lam, A, lw = [0.0] * G, [1.0] * G, [0.0] * G
    coef: list[float] = []
    gram = np.zeros((len(xs), len(xs)))
    m = 0.0
    traj = []
    rejected_at = None
    for t in range(burn_in, len(xs)):
        x, y = xs[t], ys[t]
        j = t - burn_in  # index of this pair in the witness
        px, py = xs[burn_in:t], ys[burn_in:t]
        h = k(px, x) - k(px, y) - k(py, x) + k(py, y)  # [j]: <k(x_i,.)-k(y_i,.), g_t>
        c = np.array(coef)
        v = float(c @ h) if j else 0.0
        for g in range(G):
            p = v - taus[g]
            lw[g] += math.log1p(lam[g] * p)
            z = -p / (1.0 + lam[g] * p)
            A[g] += z * z
            lam[g] = min(max(lam[g] - ONS_C * z / A[g], 0.0), 1.0 / (8.0 + 4.0 * taus[g]))
        g2 = 2.0 - 2.0 * float(k(x, y))
        gram[j, :j] = h
        gram[:j, j] = h
        gram[j, j] = g2
        m += g2
        eta = 1.0 / (2.0 * math.sqrt(m)) if m > 0 else 0.0
        coef.append(eta)
        c = np.array(coef)
        norm2 = float(c @ gram[: j + 1, : j + 1] @ c)
        gamma = min(1.0, radius / math.sqrt(norm2)) if norm2 > 0 else 1.0
        coef = [ci * gamma for ci in coef]
        comb = max(lw) + math.log(np.mean(np.exp(np.array(lw) - max(lw))))
        if rejected_at is None and comb >= math.log(1.0 / alpha):
            rejected_at = t + 1
        traj.append(list(lw))
    return {"bandwidth": bw, "traj": np.array(traj), "rejected_at": rejected_at}


def _stream(kind: str, n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "scalar":  # NonDP-like: a shift of 0.8 noise standard deviations
        return rng.normal(0.0, 1.0, n), rng.normal(0.8, 1.0, n)
    if kind == "vector":
        return rng.normal(0.0, 1.0, (n, 3)), rng.normal(0.5, 1.0, (n, 3))
    if kind == "atoms":  # randomised response on {0, 1}: x == y often (||g||^2 = 0)
        return (rng.random(n) < 0.85).astype(float), (rng.random(n) < 0.15).astype(float)
    raise AssertionError(kind)


STREAMS = {
    "scalar": dict(epsilons=[0.01]),
    "vector": dict(epsilons=[0.01, 0.05, 0.2]),
    "atoms": dict(epsilons=[0.05, 0.5]),
}
_REF_CACHE: dict[str, dict] = {}


def _reference(kind: str) -> dict:
    if kind not in _REF_CACHE:
        xs, ys = _stream(kind)
        _REF_CACHE[kind] = reference_mmd(xs, ys, STREAMS[kind]["epsilons"], 0.0, 0.05, 20, 0.5)
    return _REF_CACHE[kind]


@pytest.mark.parametrize("kind", sorted(STREAMS))
@pytest.mark.parametrize("split", ["one", "odd", "big", "small_chunks"])
def test_reference_trajectory(kind: str, split: str) -> None:
    """Same rejection pair and log-wealth to 1e-9 as the straightforward implementation."""
    ref = _reference(kind)
    xs, ys = _stream(kind)
    n = len(xs)
    chunk = 7 if split == "small_chunks" else 512
    t = SequentialMMDTest(STREAMS[kind]["epsilons"], 0.0, 0.05, 20, preset="paper",
                          chunk_size=chunk)
    if split == "one":
        sizes = [1] * n
    elif split == "odd":
        sizes = [3, 17, 1, 29, 5, 101, 13, 250]
        sizes.append(n - sum(sizes))
    else:
        sizes = [n]
    i = 0
    for s in sizes:
        t.update(torch.as_tensor(xs[i : i + s]), torch.as_tensor(ys[i : i + s]))
        i += s
        if i > 20:
            np.testing.assert_allclose(t.log_wealth.numpy(), ref["traj"][i - 21], rtol=0,
                                       atol=1e-9)
    assert i == n
    assert t.bandwidth == pytest.approx(ref["bandwidth"], rel=1e-12)
    assert t.rejected_at == ref["rejected_at"]
    assert ref["rejected_at"] is not None or kind == "atoms"
    assert t.witness_norm <= 0.5 + 1e-12


def test_reference_streams_reject() -> None:
    """The reference streams are informative: the NonDP-like ones reject within 600 pairs."""
    assert _reference("scalar")["rejected_at"] is not None
    assert _reference("vector")["rejected_at"] is not None


# --------------------------------------------------------------------------------------------
# thresholds, ceiling, configuration
# --------------------------------------------------------------------------------------------
def test_tau_values_and_lambda_max() -> None:
    # tau(eps, delta) = sqrt(2) (1 - 2 (1 - delta) / (1 + e^eps)), evaluated by hand:
    # eps = 0.01, delta = 0: 1 - 2/(1+e^0.01) = tanh(0.005) = 0.004999958333...
    #   -> tau = 0.0070710089...;
    # eps = ln 3, delta = 0: 1 - 2/4 = 1/2 -> tau = sqrt(2)/2 = 0.70710678...;
    # eps = 1, delta = 1e-5: 1 - 2 (0.99999) / (1 + e) = 0.46211... -> 0.65353995801451789;
    # eps = 0.1, delta = 0.5: 1 - 1 / (1 + e^0.1) = 0.52497918747894 -> 0.74243268689632465
    # (40-digit decimal arithmetic).
    t = SequentialMMDTest([0.01, 1.0, 0.1], delta=[0.0, 1e-5, 0.5])
    expected = np.array([
        math.sqrt(2) * math.tanh(0.005),
        math.sqrt(2) * (1 - 2 * 0.99999 / (1 + math.e)),
        math.sqrt(2) * (1 - 1 / (1 + math.exp(0.1))),
    ])
    np.testing.assert_allclose(t.tau, expected, rtol=1e-12)
    np.testing.assert_allclose(
        t.tau, [0.0070710088868896261, 0.65353995801451789, 0.74243268689632465], rtol=1e-12
    )
    np.testing.assert_allclose(t.betting_state()["lambda_max"], 1.0 / (8.0 + 4.0 * expected),
                               rtol=1e-15)


def test_ceiling_warning_and_flag() -> None:
    eps = [0.5, math.log(3.0), 2.0]
    with pytest.warns(CannotRejectWarning, match="cannot be rejected") as rec:
        t = SequentialMMDTest(eps, delta=1e-12, preset="paper")
    assert rec[0].filename == __file__  # the warning points at the caller
    assert t.cannot_reject.tolist() == [False, True, True]
    assert t.summary()["cannot_reject"] == [False, True, True]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t1 = SequentialMMDTest(eps, delta=1e-12, witness_radius=1.0)
    assert not t1.cannot_reject.any()
    # R = 1: the ceiling is tau >= sqrt(2), never reached for delta < 1 (eps = 5, delta = 0.5:
    # tau = 1.4047484418 < sqrt(2)); tau within 1e-12 of the ceiling counts as reaching it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t5 = SequentialMMDTest([5.0], delta=0.5)
    assert t5.tau[0] == pytest.approx(1.4047484418250301, rel=1e-12)
    with pytest.warns(CannotRejectWarning):
        SequentialMMDTest([50.0], delta=0.9)


def test_cannot_reject_really_never_rejects() -> None:
    """At the ceiling the wealth can only shrink, even on wildly non-DP data."""
    with pytest.warns(CannotRejectWarning):
        t = SequentialMMDTest([2.0], preset="paper")
    x = torch.zeros(400, dtype=torch.float64)
    y = torch.full((400,), 100.0, dtype=torch.float64)
    t.update(torch.cat([x[:10], y[:10]]), torch.cat([y[:10], x[:10]]))  # burn-in: bw ~ 100
    t.update(x, y)
    assert not t.rejected
    assert float(t.max_log_wealth[0]) <= 0.0


def test_presets_and_radius_validation() -> None:
    assert SequentialMMDTest(0.1).witness_radius == 1.0
    assert SequentialMMDTest(0.1, preset="paper").witness_radius == 0.5
    assert SequentialMMDTest(0.1, witness_radius=0.5, preset="paper").witness_radius == 0.5
    assert SequentialMMDTest(0.1, witness_radius=0.3).witness_radius == 0.3
    with pytest.raises(ValueError, match="preset"):
        SequentialMMDTest(0.1, preset="nope")
    with pytest.raises(ValueError, match="witness_radius"):
        SequentialMMDTest(0.1, witness_radius=1.0, preset="paper")
    for bad in (0.0, -1.0, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="witness_radius"):
            SequentialMMDTest(0.1, witness_radius=bad)
    with pytest.raises(TypeError, match="witness_radius"):
        SequentialMMDTest(0.1, witness_radius="1")
    with pytest.raises(ValueError, match="chunk_size"):
        SequentialMMDTest(0.1, chunk_size=0)
    assert SequentialMMDTest(0.1).kind == "mmd"


def test_bandwidth_median_and_fallbacks() -> None:
    # median of pooled pairwise distances (numpy convention: mean of the two middle values)
    x = torch.tensor([0.0, 1.0, 3.0])
    y = torch.tensor([7.0, 4.0, 2.0])
    t = SequentialMMDTest(0.1, burn_in=3).update(x, y)
    pooled = np.array([0, 1, 3, 7, 4, 2.0])
    d = np.abs(pooled[:, None] - pooled[None, :])[np.triu_indices(6, 1)]
    assert t.bandwidth == pytest.approx(float(np.median(d)), rel=1e-15)
    assert t.bandwidth_source == "median"
    # atoms: most distances are 0 -> mean nonzero distance
    x = torch.tensor([0.0] * 9 + [1.0])
    t = SequentialMMDTest(0.1, burn_in=10).update(x, torch.zeros(10))
    assert t.bandwidth_source == "mean_nonzero" and t.bandwidth == pytest.approx(1.0)
    # all equal -> 1.0
    t = SequentialMMDTest(0.1, burn_in=5).update(torch.ones(5, 2), torch.ones(5, 2))
    assert t.bandwidth_source == "default" and t.bandwidth == 1.0
    s = t.summary()
    assert s["bandwidth"] == 1.0 and s["bandwidth_source"] == "default"
    assert s["config_witness_radius"] == 1.0 and s["test"] == "mmd"
    # identical pairs afterwards: ||g||^2 = 0 -> eta = 0, no NaN anywhere
    t.update(torch.ones(50, 2), torch.ones(50, 2))
    assert torch.isfinite(t.log_wealth).all() and t.witness_norm == 0.0


def test_burn_in_does_not_seed_witness() -> None:
    """Authors' choice: burn-in pairs fit the bandwidth only; the first bet pair has f = 0."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(21, generator=g, dtype=torch.float64)
    t = SequentialMMDTest(0.1, burn_in=20).update(x, x + 5.0)
    assert t.n_stored == 1 and t.n_pairs == 21
    # v = 0 for the first pair: payoff -tau, bet 0 -> log-wealth exactly 0
    assert float(t.log_wealth[0]) == 0.0


# --------------------------------------------------------------------------------------------
# statistics: type-I error and power
# --------------------------------------------------------------------------------------------
def _rr(n: int, eps: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomised response on {0, 1}: exactly eps-DP, the extremal pair of Theorem 3.1's bound."""
    p = math.exp(eps) / (1.0 + math.exp(eps))
    x = (torch.rand(n, generator=gen, dtype=torch.float64) < p).double()
    y = (torch.rand(n, generator=gen, dtype=torch.float64) < 1.0 - p).double()
    return x, y


def _gauss(n: int, sigma: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact Gaussian mechanism on neighbouring scalars 0 and 1 with noise sigma."""
    x = sigma * torch.randn(n, generator=gen, dtype=torch.float64)
    y = 1.0 + sigma * torch.randn(n, generator=gen, dtype=torch.float64)
    return x, y


def _rejections(cell: str, runs: int, pairs: int, seed: int) -> int:
    gen = torch.Generator().manual_seed(seed)
    count = 0
    for _ in range(runs):
        if cell == "iid":
            # X, Y iid: 0-DP, so every eps is a true null. With eps = 1e-6 the payoff v_t - tau
            # has conditional mean ~ -1e-6: the game is almost fair and the wealth a martingale,
            # so this is the sharpest check that nothing looks ahead (a witness that used pair t
            # to predict pair t would have v_t >= eta_t ||g_t||^2 > 0 and reject every run).
            x = torch.randn(pairs, generator=gen, dtype=torch.float64)
            y = torch.randn(pairs, generator=gen, dtype=torch.float64)
            t = SequentialMMDTest(1e-6, 0.0, 0.05, witness_radius=1.0)
        elif cell == "rr":  # eps-DP randomised response tested at its own eps (delta 0)
            x, y = _rr(pairs, 0.5, gen)
            t = SequentialMMDTest(0.5, 0.0, 0.05, witness_radius=1.0)
        else:  # Gaussian mechanism (sigma = 1, mu = 1) at a point of its own profile
            x, y = _gauss(pairs, 1.0, gen)
            t = SequentialMMDTest(0.3, float(gaussian_delta(0.3, 1.0)), 0.05,
                                  witness_radius=1.0)
        count += t.update(x, y).rejected
    return count


def _binomial_cap(runs: int, alpha: float) -> float:
    # Under H0 each run rejects with probability p <= alpha (Ville), independently, so the count
    # is Binomial(runs, p) with mean <= runs * alpha and standard error
    # <= sqrt(runs * alpha * (1 - alpha)). A valid test exceeds mean + 3 SE with probability
    # about 0.1-0.2% (normal approximation; exact binomial tail for 200 runs: ~0.2%).
    return runs * alpha + 3.0 * math.sqrt(runs * alpha * (1.0 - alpha))


@pytest.mark.parametrize("cell", ["iid", "gauss"])
def test_type1_fast(cell: str) -> None:
    # 200 runs: cap = 10 + 3 * 3.08 = 19.2
    runs = 200
    assert _rejections(cell, runs, 500, seed=11) <= _binomial_cap(runs, 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["iid", "rr", "gauss"])
def test_type1_slow(cell: str) -> None:
    runs = 1000  # cap = 50 + 3 * 6.89 = 70.7
    assert _rejections(cell, runs, 2000, seed=12) <= _binomial_cap(runs, 0.05)


def test_power_shift_two_sigma() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(400, generator=gen, dtype=torch.float64)
    y = 2.0 + torch.randn(400, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest(0.1).update(x, y)
    assert t.rejected and t.rejected_at <= 100
    assert t.epsilon_lower_bound == pytest.approx(0.1)
    # the paper's radius is slower but also rejects
    t2 = SequentialMMDTest(0.1, preset="paper").update(x, y)
    assert t2.rejected and t2.rejected_at >= t.rejected_at


def test_power_rr_above_claim() -> None:
    """Randomised response at eps = 3 tested against a claim of eps = 0.1: a true violation."""
    gen = torch.Generator().manual_seed(6)
    x, y = _rr(1500, 3.0, gen)
    t = SequentialMMDTest([0.1, 0.5], witness_radius=1.0).update(x, y)
    assert t.rejected


def test_grid_one_witness_many_epsilons() -> None:
    """A grid's per-point log-wealth equals that of separate single-epsilon tests."""
    xs, ys = _stream("scalar")
    grid = [0.01, 0.1, 0.3]
    t = SequentialMMDTest(grid).update(torch.as_tensor(xs), torch.as_tensor(ys))
    single = [float(SequentialMMDTest(e).update(torch.as_tensor(xs), torch.as_tensor(ys))
                    .log_wealth[0]) for e in grid]
    np.testing.assert_allclose(t.log_wealth.numpy(), single, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# interface: bad input, state, device, host synchronisation
# --------------------------------------------------------------------------------------------
def test_bad_input() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        SequentialMMDTest(0.0)
    with pytest.raises(ValueError, match="epsilon"):
        SequentialMMDTest([0.1, -1.0])
    with pytest.raises(ValueError, match="delta"):
        SequentialMMDTest(0.1, delta=1.0)
    with pytest.raises(ValueError, match="delta"):
        SequentialMMDTest(0.1, delta=-0.1)
    with pytest.raises(ValueError, match="delta"):
        SequentialMMDTest([0.1, 0.2], delta=[0.0, 0.0, 0.0])
    for a in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            SequentialMMDTest(0.1, alpha=a)
    with pytest.raises(ValueError, match="burn_in"):
        SequentialMMDTest(0.1, burn_in=1)
    t = SequentialMMDTest(0.1, burn_in=2)
    with pytest.raises(ValueError, match="non-finite"):
        t.update(torch.tensor([0.0, float("nan")]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="non-finite"):
        t.update(torch.tensor([0.0, 1.0]), torch.tensor([float("inf"), 1.0]))
    with pytest.raises(ValueError, match="same shape"):
        t.update(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="same shape"):
        t.update(torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="shape"):
        t.update(torch.zeros(3, 2, 1), torch.zeros(3, 2, 1))
    t.update(torch.zeros(5, 2), torch.ones(5, 2))
    with pytest.raises(ValueError, match="dimension"):
        t.update(torch.zeros(5, 3), torch.ones(5, 3))
    with pytest.raises(ValueError, match="dimension"):
        t.update(torch.zeros(5), torch.ones(5))  # [n] means d = 1
    assert t.n_pairs == 5


def test_load_state_of_another_test_raises() -> None:
    x = torch.randn(50, dtype=torch.float64)
    sd = SequentialMMDTest(0.1).update(x, x + 1).state_dict()
    for other in (SequentialMMDTest(0.2), SequentialMMDTest(0.1, preset="paper"),
                  SequentialMMDTest(0.1, delta=1e-5), SequentialMMDTest(0.1, burn_in=30),
                  SequentialMMDTest(0.1, alpha=0.01), SequentialMMDTest(0.1, dtype=torch.float32)):
        with pytest.raises(ValueError, match="different test configuration"):
            other.load_state_dict(sd)
    with pytest.raises(ValueError, match="not a state_dict"):
        SequentialMMDTest(0.1).load_state_dict({"x": 1})
    # a test that rejected a foreign state is unchanged and still usable
    t = SequentialMMDTest(0.2)
    with pytest.raises(ValueError):
        t.load_state_dict(sd)
    t.update(x, x + 1)
    assert t.n_pairs == 50


@pytest.mark.parametrize("cut", [7, 20, 333])
def test_state_dict_round_trip(cut: int) -> None:
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(700, 2, generator=gen, dtype=torch.float64)
    y = 0.3 + torch.randn(700, 2, generator=gen, dtype=torch.float64)
    a = SequentialMMDTest([0.01, 0.1], chunk_size=64).update(x[:cut], y[:cut])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = SequentialMMDTest([0.01, 0.1], chunk_size=64)
    b.load_state_dict(torch.load(buf, weights_only=False))
    assert b.n_pairs == cut and b.bandwidth == a.bandwidth
    a.update(x[cut:], y[cut:])
    b.update(x[cut:], y[cut:])
    assert torch.equal(a.log_wealth, b.log_wealth)
    assert a.rejected_at == b.rejected_at and a.witness_norm == b.witness_norm
    assert a.summary() == b.summary()


def test_reset() -> None:
    x = torch.randn(100, dtype=torch.float64)
    t = SequentialMMDTest(0.1).update(x, x + 2)
    lw = t.log_wealth.clone()
    t.reset()
    assert t.n_pairs == 0 and t.bandwidth is None and t.n_stored == 0 and t.memory_bytes == 0
    t.update(x, x + 2)
    assert torch.equal(t.log_wealth, lw)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_device_and_dtype(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 4, generator=gen).to(device)
    y = (0.7 + torch.randn(300, 4, generator=gen)).to(device)
    t = SequentialMMDTest([0.01, 0.1], dtype=dtype, chunk_size=100).update(x, y)
    assert t.device.type == device  # (CUDA: the input's device, cuda:0)
    d = t.diagnostics()
    for key in ("x", "y", "x_sqnorm", "y_sqnorm", "coef", "center"):
        assert d[key].device.type == device and d[key].dtype == dtype
    assert t.log_wealth.device.type == device
    ref = SequentialMMDTest([0.01, 0.1]).update(x.cpu().double(), y.cpu().double())
    tol = 1e-9 if dtype == torch.float64 else 1e-3
    np.testing.assert_allclose(t.log_wealth.cpu().numpy(), ref.log_wealth.numpy(), atol=tol)


def test_memory_linear_and_amortised_growth() -> None:
    t = SequentialMMDTest(0.1, chunk_size=256)
    gen = torch.Generator().manual_seed(2)
    caps = []
    for _ in range(12):
        x = torch.randn(256, 3, generator=gen, dtype=torch.float64)
        t.update(x, x + 0.1)
        caps.append(t.diagnostics()["capacity"])
    # capacity doubles (few reallocations) and stays within 2x of what is stored
    assert len(set(caps)) <= 4
    assert t.n_stored <= caps[-1] <= 2 * max(t.n_stored, 1024)
    per_pair = (2 * 3 + 3) * 8  # x, y [d] + two squared norms + one coefficient, float64
    assert t.memory_bytes <= 2 * max(t.n_stored, 1024) * per_pair + 3 * 8


@pytest.mark.parametrize("force_torch,per_chunk", [(True, 4), (False, 4)])
def test_no_host_sync_per_pair(monkeypatch: pytest.MonkeyPatch, force_torch: bool,
                               per_chunk: int) -> None:
    """Device-to-host traffic is O(chunks), not O(pairs). The torch code (what accelerators
    run): one copy to the host and one write-back per chunk. The CPU's NumPy path: zero-copy
    ``.numpy()`` views (the chunk's pairs; the state's views are cached), nothing per pair."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1400, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(1400, 2, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest(0.1, chunk_size=256, force_torch=force_torch).update(x[:100], y[:100])
    counts = {"n": 0}
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "to"):
        orig = getattr(torch.Tensor, name)

        def wrapped(self, *a, _orig=orig, **k):  # type: ignore[no-untyped-def]
            counts["n"] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    t.update(x[100:], y[100:])  # 1300 pairs = 6 chunks of <= 256
    monkeypatch.undo()
    # per chunk: one device-to-host copy (.to + .numpy) and one host-to-device write-back;
    # per call: the finiteness checks. 1300 pairs would give >= 1300 calls if it were per pair.
    assert counts["n"] <= per_chunk * 6 + 4, counts


def test_long_stream_renormalisation(caplog: pytest.LogCaptureFixture) -> None:
    """A tiny radius projects at every step: the global scale is folded, nothing overflows."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3000, generator=gen, dtype=torch.float64)
    y = 3.0 + torch.randn(3000, generator=gen, dtype=torch.float64)
    with caplog.at_level(logging.DEBUG, logger="dpaudit_torch.stats.mmd"):
        t = SequentialMMDTest(1e-4, witness_radius=1e-3, chunk_size=1000).update(x, y)
    assert "renormalised" in caplog.text
    d = t.diagnostics()
    assert 1e-30 <= d["scale"] <= 1.0
    assert d["coef"].shape == (t.n_stored,) and torch.isfinite(d["coef"]).all()
    assert t.witness_norm == pytest.approx(1e-3, rel=1e-6)
    u = SequentialMMDTest(1e-4, witness_radius=1e-3, chunk_size=37).update(x, y)
    np.testing.assert_allclose(u.log_wealth.numpy(), t.log_wealth.numpy(), rtol=1e-9)
    # and the renormalised witness still follows the straightforward implementation
    n = 700
    ref = reference_mmd(x[:n].numpy(), y[:n].numpy(), [1e-4], 0.0, 0.05, 20, 1e-3)
    w = SequentialMMDTest(1e-4, witness_radius=1e-3, chunk_size=128)
    with caplog.at_level(logging.DEBUG, logger="dpaudit_torch.stats.mmd"):
        caplog.clear()
        w.update(x[:n], y[:n])
    assert "renormalised" in caplog.text
    np.testing.assert_allclose(w.log_wealth.numpy(), ref["traj"][-1], rtol=0, atol=1e-9)
    assert w.rejected_at == ref["rejected_at"]


# --------------------------------------------------------------------------------------------
# the witness cap (long runs): max_witness_points
# --------------------------------------------------------------------------------------------
def reference_mmd_capped(
    xs: np.ndarray, ys: np.ndarray, eps: float, burn_in: int, radius: float, cap: int
) -> dict:
    """Straightforward capped witness, written from the docstring's four steps.

    Explicit support list (oldest first) of (x_i, y_i, c_i); the value from direct kernel
    evaluations over the support; after the gradient step the oldest pair is removed from the
    list, and ||f|| is recomputed from the Gram matrix of the support (not tracked); then the
    projection. Own ONS, one epsilon, delta 0.
    """
    xs = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)
    ys = np.asarray(ys, dtype=np.float64).reshape(len(ys), -1)
    pooled = np.vstack([xs[:burn_in], ys[:burn_in]])
    diff = pooled[:, None, :] - pooled[None, :, :]
    dist = np.sqrt((diff**2).sum(-1))[np.triu_indices(len(pooled), 1)]
    bw = float(np.median(dist))

    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # [s, d] x [d] -> [s]
        return np.exp(-np.sum((a - b) ** 2, axis=-1) / (2.0 * bw * bw))

    tau = math.sqrt(2.0) * (1.0 - 2.0 / (1.0 + math.exp(eps)))
    lam, A, lw = 0.0, 1.0, 0.0
    sx: list[np.ndarray] = []
    sy: list[np.ndarray] = []
    coef: list[float] = []
    m = 0.0
    traj, norms = [], []
    for t in range(burn_in, len(xs)):
        x, y = xs[t], ys[t]
        if coef:
            px, py, c = np.array(sx), np.array(sy), np.array(coef)
            v = float(c @ (k(px, x) - k(px, y) - k(py, x) + k(py, y)))
        else:
            v = 0.0
        p = v - tau
        lw += math.log1p(lam * p)
        z = -p / (1.0 + lam * p)
        A += z * z
        lam = min(max(lam - ONS_C * z / A, 0.0), 1.0 / (8.0 + 4.0 * tau))
        g2 = 2.0 - 2.0 * float(k(x[None], y)[0])
        m += g2
        sx.append(x)
        sy.append(y)
        coef.append(1.0 / (2.0 * math.sqrt(m)) if m > 0 else 0.0)
        if len(coef) > cap:  # FIFO drop of the oldest pair
            sx.pop(0)
            sy.pop(0)
            coef.pop(0)
        px, py, c = np.array(sx), np.array(sy), np.array(coef)
        gram = np.stack([k(px, px[i]) - k(px, py[i]) - k(py, px[i]) + k(py, py[i])
                         for i in range(len(c))])
        norm = math.sqrt(max(float(c @ gram @ c), 0.0))
        if norm > radius:
            coef = [ci * radius / norm for ci in coef]
            norm = radius
        traj.append(lw)
        norms.append(norm)
    return {"traj": np.array(traj), "norms": np.array(norms), "coef": np.array(coef), "bw": bw}


def _exact_norm_from_data(
    t: SequentialMMDTest, xs: np.ndarray, ys: np.ndarray
) -> float:
    """||f|| from scratch: the support is the last n_stored pairs given, in order."""
    xs = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)[-t.n_stored:]
    ys = np.asarray(ys, dtype=np.float64).reshape(len(ys), -1)[-t.n_stored:]
    c = t.witness_coefficients()
    bw = t.bandwidth

    def gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        sq = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.exp(-sq / (2.0 * bw * bw))

    H = gram(xs, xs) - gram(xs, ys) - gram(ys, xs) + gram(ys, ys)
    return math.sqrt(max(float(c @ H @ c), 0.0))


@pytest.mark.parametrize("kind", ["vector", "scalar"])
@pytest.mark.parametrize("cap,chunk", [(1, 5), (7, 3), (7, 512), (40, 16)])
def test_capped_matches_reference(cap: int, chunk: int, kind: str) -> None:
    """Same log-wealth (1e-9) and witness norm as the straightforward capped loop."""
    xs, ys = _stream(kind, n=220, seed=3)
    ref = reference_mmd_capped(xs, ys, 0.05, 20, 1.0, cap)
    t = SequentialMMDTest(0.05, witness_radius=1.0, chunk_size=chunk, max_witness_points=cap)
    i = 0
    for s in [1, 2, 30, 1, 17, 100, 69]:  # odd batches (20 + 200 pairs)
        t.update(torch.as_tensor(xs[i : i + s]), torch.as_tensor(ys[i : i + s]))
        i += s
        if i > 20:
            assert float(t.log_wealth[0]) == pytest.approx(ref["traj"][i - 21], abs=1e-9)
            assert t.witness_norm == pytest.approx(ref["norms"][i - 21], abs=1e-9)
    assert i == 220 and t.n_stored == cap and t.n_evicted == 200 - cap
    np.testing.assert_allclose(t.witness_coefficients(), ref["coef"], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("radius", [1.0, 0.5, 1e-3])
def test_capped_norm_never_exceeds_radius(radius: float) -> None:
    """(a) After every batch, ||f|| recomputed from raw data and the bandwidth is <= R."""
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(1200, 2, generator=gen, dtype=torch.float64)
    y = 1.0 + 2.0 * torch.randn(1200, 2, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest(1e-4, witness_radius=radius, chunk_size=64, max_witness_points=50)
    for i0 in range(0, 1200, 150):
        t.update(x[i0 : i0 + 150], y[i0 : i0 + 150])
        exact = _exact_norm_from_data(t, x[: i0 + 150].numpy(), y[: i0 + 150].numpy())
        assert exact <= radius * (1.0 + 1e-9)
        assert t.witness_norm == pytest.approx(exact, rel=1e-9, abs=1e-15)
        assert t.exact_witness_norm() == pytest.approx(exact, rel=1e-9, abs=1e-15)
    assert t.n_evicted == 1200 - 20 - 50
    # 1130 drops >= 16 * 50: the from-scratch norm refresh ran (and changed nothing visible)
    assert t.n_norm_refreshes == 1130 // (REFRESH_FACTOR * 50) == 1


def test_capped_memory_bounded() -> None:
    """(b) Allocation stops at the cap: (2 d + 3) numbers per pair plus the centre."""
    d, cap = 3, 300
    t = SequentialMMDTest(0.1, chunk_size=128, max_witness_points=cap)
    gen = torch.Generator().manual_seed(22)
    sizes = []
    for _ in range(15):
        x = torch.randn(128, d, generator=gen, dtype=torch.float64)
        t.update(x, x + 0.2)
        sizes.append(t.memory_bytes)
    assert t.n_stored == cap and t.diagnostics()["capacity"] == cap
    assert sizes[-1] == cap * (2 * d + 3) * 8 + d * 8
    assert len(set(sizes[4:])) == 1  # constant once the cap is reached
    t32 = SequentialMMDTest(0.1, dtype=torch.float32, max_witness_points=cap)
    t32.update(torch.randn(2000, d, generator=gen), torch.randn(2000, d, generator=gen))
    assert t32.memory_bytes == cap * (2 * d + 3) * 4 + d * 4


def test_capped_type1_fast() -> None:
    """(c) Level alpha with a small cap (many drops): X, Y iid tested at eps = 1e-6.

    As in test_type1_fast, the game is almost fair, so any look-ahead introduced by the drops
    or the ring buffer would show. 200 runs: cap = 200 * 0.05 + 3 SE = 19.2 (see _binomial_cap).
    """
    gen = torch.Generator().manual_seed(23)
    runs, count = 200, 0
    for _ in range(runs):
        x = torch.randn(300, generator=gen, dtype=torch.float64)
        y = torch.randn(300, generator=gen, dtype=torch.float64)
        t = SequentialMMDTest(1e-6, 0.0, 0.05, witness_radius=1.0, max_witness_points=25)
        count += t.update(x, y).rejected
    assert count <= _binomial_cap(runs, 0.05)


def test_capped_power_retained() -> None:
    """(d) A 2-sigma shift is still rejected quickly with a 32-pair witness."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(400, generator=gen, dtype=torch.float64)
    y = 2.0 + torch.randn(400, generator=gen, dtype=torch.float64)
    full = SequentialMMDTest(0.1).update(x, y)
    capped = SequentialMMDTest(0.1, max_witness_points=32).update(x, y)
    assert capped.rejected and capped.rejected_at <= 2 * full.rejected_at
    assert capped.n_stored == 32 and capped.n_evicted > 0


@pytest.mark.parametrize("kind", sorted(STREAMS))
def test_cap_at_least_T_is_exactly_uncapped(kind: str) -> None:
    """(e) With cap >= pairs bet on nothing is dropped: bit-identical trajectory."""
    xs, ys = _stream(kind)
    eps = STREAMS[kind]["epsilons"]
    a = SequentialMMDTest(eps, preset="paper", chunk_size=64)
    b = SequentialMMDTest(eps, preset="paper", chunk_size=64, max_witness_points=580)
    for i0 in range(0, 600, 97):
        a.update(torch.as_tensor(xs[i0 : i0 + 97]), torch.as_tensor(ys[i0 : i0 + 97]))
        b.update(torch.as_tensor(xs[i0 : i0 + 97]), torch.as_tensor(ys[i0 : i0 + 97]))
        assert torch.equal(a.log_wealth, b.log_wealth)
        assert a.witness_norm == b.witness_norm
    assert b.n_evicted == 0 and b.rejected_at == a.rejected_at
    assert b.rejected_at == _reference(kind)["rejected_at"]


def test_capped_state_round_trip_after_wrap() -> None:
    gen = torch.Generator().manual_seed(24)
    x = torch.randn(500, 2, generator=gen, dtype=torch.float64)
    y = 0.4 + torch.randn(500, 2, generator=gen, dtype=torch.float64)
    a = SequentialMMDTest([0.01, 0.1], max_witness_points=60, chunk_size=25).update(x[:233],
                                                                                    y[:233])
    assert a.diagnostics()["ring_head"] != 0  # the ring buffer has wrapped
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = SequentialMMDTest([0.01, 0.1], max_witness_points=60, chunk_size=25)
    b.load_state_dict(torch.load(buf, weights_only=False))
    np.testing.assert_array_equal(b.witness_coefficients(), a.witness_coefficients())
    a.update(x[233:], y[233:])
    b.update(x[233:], y[233:])
    np.testing.assert_allclose(a.log_wealth.numpy(), b.log_wealth.numpy(), rtol=0, atol=1e-12)
    assert a.n_evicted == b.n_evicted and a.rejected_at == b.rejected_at
    with pytest.raises(ValueError, match="different test configuration"):
        SequentialMMDTest([0.01, 0.1], max_witness_points=61).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="different test configuration"):
        SequentialMMDTest([0.01, 0.1]).load_state_dict(a.state_dict())


@pytest.mark.parametrize("chunk", [7, 25, 64])
def test_capped_forward_sums_match_recomputation(chunk: int) -> None:
    """The tracked fwd_i (witness at stored pair i from the pairs no older than i), which
    replaces the kernel evaluations at the dropped points, equals its from-scratch value after
    many wraps of the ring buffer, renormalisations included. The from-scratch value is the one
    a state saved without fwd is loaded with (see the next test)."""
    gen = torch.Generator().manual_seed(26)
    x = torch.randn(900, generator=gen, dtype=torch.float64)
    y = 0.7 + torch.randn(900, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest([0.05, 0.5], max_witness_points=60, chunk_size=chunk)
    for i in range(0, 900, 113):
        t.update(x[i : i + 113], y[i : i + 113])
        tracked = t.diagnostics()["forward_sums"]
        sd = t.state_dict()
        del sd["extra"]["fwd"]
        u = SequentialMMDTest([0.05, 0.5], max_witness_points=60, chunk_size=chunk)
        u.load_state_dict(sd)  # recomputes fwd from scratch over the stored pairs
        assert tracked.shape == (t.n_stored,)
        torch.testing.assert_close(tracked, u.diagnostics()["forward_sums"], rtol=1e-10,
                                   atol=1e-12)
    assert t.n_evicted > 10 * 60


def test_capped_state_without_forward_sums_is_rebuilt() -> None:
    """A state saved without fwd (earlier versions) is loaded by recomputing it: the continued
    stream gives the same log-wealth as the uninterrupted test."""
    gen = torch.Generator().manual_seed(27)
    x = torch.randn(400, generator=gen, dtype=torch.float64)
    y = 0.5 + torch.randn(400, generator=gen, dtype=torch.float64)
    a = SequentialMMDTest(0.1, max_witness_points=50, chunk_size=20).update(x[:177], y[:177])
    sd = a.state_dict()
    del sd["extra"]["fwd"]
    b = SequentialMMDTest(0.1, max_witness_points=50, chunk_size=20)
    b.load_state_dict(sd)
    a.update(x[177:], y[177:])
    b.update(x[177:], y[177:])
    np.testing.assert_allclose(a.log_wealth.numpy(), b.log_wealth.numpy(), rtol=0, atol=1e-10)


def test_capped_norm_refresh_repairs_drift() -> None:
    """A drifted tracked norm is replaced by the from-scratch value within 16 * cap drops."""
    gen = torch.Generator().manual_seed(25)
    x = torch.randn(500, generator=gen, dtype=torch.float64)
    y = 1.0 + torch.randn(500, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest(0.1, max_witness_points=20, chunk_size=10).update(x[:100], y[:100])
    refreshes = t.n_norm_refreshes
    sd = t.state_dict()  # pretend rounding made the tracked ||f||^2 slightly too small
    sd["extra"]["s"] = (1.0 - 1e-4) * sd["extra"]["s"]
    t.load_state_dict(sd)
    assert t.witness_norm**2 == pytest.approx((1.0 - 1e-4) * t.exact_witness_norm()**2)
    t.update(x[100:], y[100:])  # 400 more drops >= 16 * 20
    assert t.n_norm_refreshes > refreshes
    assert t.witness_norm == pytest.approx(t.exact_witness_norm(), rel=1e-9)
    assert t.exact_witness_norm() <= 1.0 + 1e-12


def test_capped_norm_guard_raises_on_inconsistent_state() -> None:
    """A tracked norm far below the truth makes a drop negative: a bug, reported, not hidden."""
    gen = torch.Generator().manual_seed(25)
    x = torch.randn(400, generator=gen, dtype=torch.float64)
    y = 1.0 + torch.randn(400, generator=gen, dtype=torch.float64)
    t = SequentialMMDTest(0.1, max_witness_points=20, chunk_size=10).update(x[:100], y[:100])
    sd = t.state_dict()
    sd["extra"]["s"] = 0.25 * sd["extra"]["s"]
    t.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="witness norm"):
        t.update(x[100:], y[100:])


def test_cap_bad_input() -> None:
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_witness_points"):
            SequentialMMDTest(0.1, max_witness_points=bad)
    for bad in (2.5, "10", True):
        with pytest.raises(TypeError, match="max_witness_points"):
            SequentialMMDTest(0.1, max_witness_points=bad)
    t = SequentialMMDTest(0.1, max_witness_points=np.int64(10))
    assert t.max_witness_points == 10 and t.summary()["max_witness_points"] == 10
    assert SequentialMMDTest(0.1).summary()["max_witness_points"] is None


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_capped_device_and_dtype(device: str, dtype: torch.dtype) -> None:
    """The ring buffer, the gathered dropped pairs and the refresh run on any device/dtype."""
    gen = torch.Generator().manual_seed(26)
    x = torch.randn(800, 3, generator=gen, dtype=torch.float64)  # 740 drops >= 16 * 40
    y = 0.7 + torch.randn(800, 3, generator=gen, dtype=torch.float64)
    ref = SequentialMMDTest([0.01, 0.1], max_witness_points=40).update(x, y)
    t = SequentialMMDTest([0.01, 0.1], max_witness_points=40, dtype=dtype)
    t.update(x.to(device), y.to(device))
    d = t.diagnostics()
    assert d["x"].device.type == device and d["x"].dtype == dtype and d["capacity"] == 40
    assert t.n_norm_refreshes == ref.n_norm_refreshes > 0
    tol = 1e-9 if dtype == torch.float64 else 1e-3
    np.testing.assert_allclose(t.log_wealth.cpu().numpy(), ref.log_wealth.numpy(), atol=tol)
    assert t.exact_witness_norm() <= 1.0 + 1e-6


@pytest.mark.parametrize(("scale", "dtype"), [(1e160, torch.float64), (1e-170, torch.float64),
                                              (1e19, torch.float32)])
def test_bandwidth_is_scale_invariant_at_extreme_scales(scale: float, dtype: torch.dtype) -> None:
    """Distances are computed on rescaled data: no overflow/underflow of squared distances, so
    the decision equals the one at scale 1 (the kernel test is invariant to rescaling)."""
    def run(s: float, dt: torch.dtype) -> SequentialMMDTest:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(300, generator=g, dtype=torch.float64) * s
        y = (torch.randn(300, generator=g, dtype=torch.float64) + 3.0) * s
        return SequentialMMDTest(0.01, 1e-5, dtype=dt).update(x, y)

    ref, t = run(1.0, dtype), run(scale, dtype)
    assert t.bandwidth_source == "median"
    assert math.isfinite(t.bandwidth) and t.bandwidth > 0
    assert t.bandwidth == pytest.approx(ref.bandwidth * scale, rel=1e-5)
    assert t.rejected_at == ref.rejected_at is not None


@pytest.mark.parametrize("cap,d", [(None, 1), (None, 3), (128, 1), (16, 1), (40, 2)])
def test_host_path_matches_torch_path(cap: int | None, d: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU float64 chunks run in NumPy; the torch code (``force_torch``, what accelerators run)
    gives the same trajectory (to rounding), the same rejections and the same stored witness.
    The NumPy run never enters the torch chunk code."""
    eps = np.linspace(0.2, 6.0, 12)
    runs = []
    for force in (False, True):
        t = SequentialMMDTest(eps, 1e-5, 0.05, max_witness_points=cap, force_torch=force)
        g = torch.Generator().manual_seed(11)
        trajs = []
        with monkeypatch.context() as mp:
            if not force:
                def no_torch_chunk(*a: object) -> None:
                    raise AssertionError("the host path ran the torch chunk code")
                mp.setattr(SequentialMMDTest, "_stored_part", no_torch_chunk)
                mp.setattr(SequentialMMDTest, "_witness_values_capped", no_torch_chunk)
            for _ in range(40):
                n = int(torch.randint(1, 60, (1,), generator=g))
                x = torch.randn(n, d, generator=g, dtype=torch.float64) + 1.5
                y = torch.randn(n, d, generator=g, dtype=torch.float64)
                trajs.append(t.update_with_trajectory(x, y))
        runs.append((np.concatenate(trajs), t.grid_rejected_at, t.witness_coefficients(),
                     t.witness_norm, t.n_stored))
    (a, rej_a, coef_a, norm_a, n_a), (b, rej_b, coef_b, norm_b, n_b) = runs
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)
    assert rej_a == rej_b and any(r is not None for r in rej_a)
    np.testing.assert_allclose(coef_a, coef_b, rtol=1e-12, atol=1e-15)
    assert norm_a == pytest.approx(norm_b, rel=1e-12) and n_a == n_b


@pytest.mark.parametrize("d", [1, 3])
def test_gram_from_three_blocks_equals_the_stacked_kernel(d):
    """The host witness takes <g_i, g_j> from three N x N kernel blocks: for scalar pairs the
    very numbers of the blocks of the 2N x 2N kernel matrix (same terms, same order); for
    vectors equal to rounding."""
    from dpaudit_torch.stats._mmd_witness import KernelWitness

    rng = np.random.default_rng(d)
    X, Y = rng.normal(size=(37, d)), rng.normal(size=(37, d)) + 0.3
    Q = np.concatenate([X, Y])
    Qn = (Q * Q).sum(axis=1)
    K = KernelWitness._kernel_host(Q, Qn, Q, Qn)
    N = X.shape[0]
    want = K[:N, :N] - K[:N, N:] - K[N:, :N] + K[N:, N:]
    got = KernelWitness._gram_host(X, Qn[:N], Y, Qn[N:])
    if d == 1:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kind", ["scalar", "atoms"])
@pytest.mark.parametrize("cap,chunk", [(128, 80), (40, 16), (7, 3)])
def test_capped_scalar_passes_equal_numpy_path(monkeypatch: pytest.MonkeyPatch, kind: str,
                                               cap: int, chunk: int) -> None:
    """The compiled passes of the capped witness for one-dimensional pairs (the auditor's
    setting: cap 128, chunks of 80) give the NumPy path's trajectory, witness norm and
    coefficients up to the order of the sums over the stored pairs (1e-12), across ring
    wrap-arounds and norm refreshes, and are the branch these streams take."""
    from dpaudit_torch.stats import _mmd_host, _mmd_witness

    xs, ys = _stream(kind, n=4000, seed=5)
    calls = []
    fast = _mmd_witness.KernelWitness._witness_values_capped_1d

    def spy(self, *a):
        calls.append(1)
        return fast(self, *a)

    def run(compiled_passes: bool) -> tuple[np.ndarray, float, np.ndarray, int]:
        with monkeypatch.context() as m:
            m.setattr(_mmd_witness.KernelWitness, "_witness_values_capped_1d", spy)
            if not compiled_passes:
                m.setattr(_mmd_host, "compiled", lambda: False)
            t = SequentialMMDTest(0.05, witness_radius=1.0, chunk_size=chunk,
                                  max_witness_points=cap)
            traj = t.update_with_trajectory(torch.as_tensor(xs), torch.as_tensor(ys))
            return traj, t.witness_norm, t.witness_coefficients(), t._n_norm_refreshes

    a = run(True)
    assert calls and a[3] > 0
    n_fast = len(calls)
    b = run(False)
    assert len(calls) == n_fast  # the NumPy run took the general branch
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12, atol=1e-12)
    assert a[1] == pytest.approx(b[1], rel=1e-12)
    np.testing.assert_allclose(a[2], b[2], rtol=1e-10, atol=1e-14)

