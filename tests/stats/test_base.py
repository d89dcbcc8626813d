"""Tests of the shared sequential-test machinery (docs/design.md sections 1 and 4) through a tiny
subclass whose payoffs are deterministic functions of the pairs.

``Dummy`` has two components per grid point g: payoff ``s_g * x_t`` and ``s_g * y_t`` (scalar
pairs in [-1, 1]). It is not a statistical test (the payoff is not predictable); it exercises
only the book-keeping: burn-in, chunking, decision by averaging, grid bounds, state.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.stats.base import CannotRejectWarning, SequentialTest
from dpaudit_torch.stats.betting import OnlineNewtonStep, log_mean_exp

LMAX = 0.5


class Dummy(SequentialTest):
    kind = "dummy"

    def __init__(self, epsilons: Any, *args: Any, scales: Any = None, chunk: int = 1 << 30,
                 **kw: Any) -> None:
        g = np.atleast_1d(np.asarray(epsilons, dtype=float)).size
        self.scales = np.ones(g) if scales is None else np.asarray(scales, dtype=float)
        self.chunk = chunk
        self.burn_seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.payoff_pairs = 0
        super().__init__(epsilons, *args, **kw)

    def _component_groups(self) -> np.ndarray:
        return np.repeat(np.arange(self.grid_size), 2)

    def _lambda_max(self) -> np.ndarray:
        return np.full(2 * self.grid_size, LMAX)

    def _payoff_upper_bound(self) -> np.ndarray:
        return np.repeat(self.scales, 2)

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.burn_seen.append((x.clone(), y.clone()))

    def _chunk_limit(self) -> int:
        return self.chunk

    def _payoffs(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        self.payoff_pairs += int(x.shape[0])
        xs, ys = x[:, 0].cpu().numpy(), y[:, 0].cpu().numpy()
        out = np.empty((len(xs), 2 * self.grid_size))
        out[:, 0::2] = xs[:, None] * self.scales[None, :]
        out[:, 1::2] = ys[:, None] * self.scales[None, :]
        return out

    def _config(self) -> dict[str, Any]:
        return {"scales": self.scales.tolist()}


def _independent(x: np.ndarray, y: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Log-wealth trajectories [n, 2G] of each component computed alone."""
    cols = []
    for s in scales:
        for v in (x, y):
            b = OnlineNewtonStep(np.array([LMAX]))
            cols.append(b.run((s * v)[:, None])[:, 0])
    return np.stack(cols, axis=1)


def test_grid_decision_by_averaging_and_burn_in_counting() -> None:
    rng = np.random.default_rng(0)
    burn = 7
    n = 400
    x = rng.uniform(-0.6, 1.0, n)  # mild positive drift: wealth grows
    y = rng.uniform(-1.0, 0.6, n)  # negative drift
    scales = np.array([0.2, 0.6, 1.0])
    eps = [0.1, 0.2, 0.4]
    ref = _independent(x[burn:], y[burn:], scales)
    combined = log_mean_exp(ref, axis=1)
    thr = math.log(1 / 0.05)
    first = int(np.nonzero(combined >= thr)[0][0])
    for sizes in ([n], [1] * n, [3, 4, 50, 1, 342]):
        for chunk in (1 << 30, 5):
            t = Dummy(eps, 0.0, 0.05, burn, scales=scales, chunk=chunk)
            i = 0
            for s in sizes:
                t.update(torch.as_tensor(x[i : i + s]), torch.as_tensor(y[i : i + s]))
                i += s
            # burn-in pairs: fitted once, exactly the first `burn`, never bet on
            assert len(t.burn_seen) == 1
            np.testing.assert_array_equal(t.burn_seen[0][0][:, 0].numpy(), x[:burn])
            assert t.payoff_pairs == n - burn and t.n_pairs == n
            # rejected_at counts the burn-in pairs
            assert t.rejected_at == burn + first + 1
            assert t.combined_log_wealth == pytest.approx(combined[-1], abs=1e-12)
            grid = np.stack([log_mean_exp(ref[:, 2 * g : 2 * g + 2], axis=1)
                             for g in range(3)], axis=1)
            np.testing.assert_allclose(t.log_wealth.numpy(), grid[-1], atol=1e-12)
            np.testing.assert_allclose(t.max_log_wealth.numpy(), grid.max(axis=0), atol=1e-12)
            # grid points: alpha / G each by default (Bonferroni, simultaneous over the grid)
            thr_g = math.log(len(eps) / 0.05)
            assert t.per_point_alpha == pytest.approx(0.05 / len(eps))
            for g in range(3):
                hits = np.nonzero(grid[:, g] >= thr_g)[0]
                exp_at = burn + int(hits[0]) + 1 if hits.size else None
                assert t.grid_rejected_at[g] == exp_at
            rej = grid.max(axis=0) >= thr_g
            assert t.epsilon_lower_bound == (max(np.asarray(eps)[rej]) if rej.any() else 0.0)
            rej_pp = grid.max(axis=0) >= thr  # each point at level alpha, not simultaneous
            assert t.epsilon_lower_bound_per_point == (max(np.asarray(eps)[rej_pp])
                                                       if rej_pp.any() else 0.0)


def test_average_rejects_where_no_single_component_needs_to() -> None:
    """The decision averages wealths: one strong component out of two suffices if it is strong
    enough (its wealth >= 2/alpha), and a test cannot reject before any component could."""
    n = 40
    x = np.ones(n)  # component (x) wins at every step
    y = -np.ones(n)  # component (y) never bets
    t = Dummy([0.1], 0.0, 0.05, 2).update(torch.as_tensor(x), torch.as_tensor(y))
    lw_x = OnlineNewtonStep(np.array([LMAX])).run(x[2:, None])[:, 0]
    # average of wealth e^lw and 1 >= 20  <=>  lw >= log(39)
    first = int(np.nonzero(lw_x >= math.log(39.0))[0][0])
    assert t.rejected_at == 2 + first + 1
    assert not np.any(lw_x[:first] >= math.log(39.0))


def _peak_then_drop(alpha: float) -> tuple[np.ndarray, int]:
    """+1 payoffs until the first time log-wealth >= log(1/alpha), then one -1 payoff.

    Once lambda is capped at 0.5 each +1 adds log 1.5 = 0.405, so the first crossing lies in
    [log 20, log 20 + 0.405) and the -1 payoff (lambda = 0.5) subtracts log 2 = 0.693: the
    current wealth falls back below 1/alpha, the running maximum does not.
    """
    b = OnlineNewtonStep(np.array([LMAX]))
    lw = b.run(np.ones((100, 1)))[:, 0]
    k = int(np.nonzero(lw >= math.log(1 / alpha))[0][0]) + 1
    return np.concatenate([np.ones(k), [-1.0]]), k


def test_epsilon_lower_bound_anytime_and_current() -> None:
    seq, k = _peak_then_drop(0.05)
    burn = 2
    x = np.concatenate([np.zeros(burn), seq])
    eps = [0.05, 0.1, 0.2]
    scales = np.array([1.0, 1.0, 1e-3])  # points 0, 1 follow the sequence, point 2 barely moves
    # both components of a point must win for its average to reach 20: feed seq as x and y
    t = Dummy(eps, 0.0, 0.05, burn, scales=scales, simultaneous=False)
    t.update(torch.as_tensor(x[: burn + k]), torch.as_tensor(x[: burn + k]))
    assert t.epsilon_lower_bound == 0.1
    assert t.epsilon_lower_bound_current == 0.1
    assert t.grid_rejected.tolist() == [True, True, False]
    t.update(torch.as_tensor(x[burn + k :]), torch.as_tensor(x[burn + k :]))
    assert t.epsilon_lower_bound == 0.1  # anytime: once rejected, stays rejected
    assert t.epsilon_lower_bound_current == 0.0  # the paper's definition: current wealth
    assert t.grid_rejected_at == [burn + k, burn + k, None]
    # the combined decision averages all six components: (4 * ~20 + 2 * ~1) / 6 < 20
    assert not t.rejected and t.combined_log_wealth < math.log(20.0)


def test_simultaneous_bonferroni() -> None:
    alpha = 0.05
    seq, k = _peak_then_drop(alpha)
    seq = seq[:-1]  # stop at the first crossing of log 20 (< log 20 + 0.41 < log 80)
    G = 4
    assert math.log(1 / alpha) <= OnlineNewtonStep(np.array([LMAX])).run(seq[:, None])[-1, 0]
    x = torch.as_tensor(np.concatenate([np.zeros(2), seq]))
    eps = [0.1, 0.2, 0.3, 0.4]
    plain = Dummy(eps, 0.0, alpha, 2, scales=np.ones(G), simultaneous=False).update(x, x)
    simul = Dummy(eps, 0.0, alpha, 2, scales=np.ones(G)).update(x, x)  # the default
    assert plain.per_point_alpha == alpha and simul.per_point_alpha == alpha / G
    assert simul.simultaneous and not plain.simultaneous
    assert plain.epsilon_lower_bound == 0.4
    assert simul.epsilon_lower_bound == 0.0  # needs wealth 80 per point (alpha / G)
    # the per-point maximum stays available under its explicit name, whatever the flag
    assert simul.epsilon_lower_bound_per_point == plain.epsilon_lower_bound_per_point == 0.4
    # the combined decision is at level alpha in both (average of e-processes, no split)
    assert plain.rejected and simul.rejected and plain.rejected_at == simul.rejected_at
    assert simul.summary()["simultaneous"] is True
    # keep going: with more wins the Bonferroni bound also rejects, later
    more = torch.ones(10, dtype=torch.float64)
    simul.update(more, more)
    assert simul.epsilon_lower_bound == 0.4
    assert simul.grid_rejected_at[0] > plain.grid_rejected_at[0]


def test_cannot_reject_flag_and_warning() -> None:
    with pytest.warns(CannotRejectWarning, match=r"\[0\.2\]"):
        t = Dummy([0.1, 0.2], scales=[1.0, 0.0])
    assert t.cannot_reject.tolist() == [False, True]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Dummy([0.1, 0.2], scales=[1.0, 0.5])


def test_per_epsilon_deltas_and_validation() -> None:
    t = Dummy([0.1, 0.2], delta=[1e-5, 1e-3])
    assert t.deltas.tolist() == [1e-5, 1e-3]
    assert Dummy([0.1, 0.2], delta=1e-6).deltas.tolist() == [1e-6, 1e-6]
    with pytest.raises(ValueError, match="delta"):
        Dummy([0.1, 0.2], delta=[1e-5])
    with pytest.raises(ValueError, match="epsilons"):
        Dummy([])
    with pytest.raises(TypeError, match="burn_in"):
        Dummy(0.1, burn_in=2.5)
    with pytest.raises(TypeError, match="simultaneous"):
        Dummy(0.1, simultaneous=1)
    with pytest.raises(TypeError, match="dtype"):
        Dummy(0.1, dtype=torch.int64)
    with pytest.raises(TypeError, match="real numbers"):
        Dummy(0.1).update(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one coordinate"):
        Dummy(0.1).update(torch.zeros(3, 0), torch.zeros(3, 0))


def test_state_dict_round_trip_during_and_after_burn_in() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-0.5, 1, 60), rng.uniform(-1, 0.5, 60)
    for cut in (3, 10, 30):
        a = Dummy([0.1, 0.3], 1e-5, 0.05, 10, scales=[0.5, 1.0])
        a.update(torch.as_tensor(x[:cut]), torch.as_tensor(y[:cut]))
        buf = io.BytesIO()
        torch.save(a.state_dict(), buf)
        buf.seek(0)
        b = Dummy([0.1, 0.3], 1e-5, 0.05, 10, scales=[0.5, 1.0])
        b.load_state_dict(torch.load(buf, weights_only=False))
        for t in (a, b):
            t.update(torch.as_tensor(x[cut:]), torch.as_tensor(y[cut:]))
        assert torch.equal(a.log_wealth, b.log_wealth)
        assert a.summary() == b.summary()
    with pytest.raises(ValueError, match=r"different test configuration.*scales"):
        Dummy([0.1, 0.3], 1e-5, 0.05, 10, scales=[0.5, 0.9]).load_state_dict(a.state_dict())


def test_reset_and_summary_types() -> None:
    t = Dummy([0.1], burn_in=2).update(torch.ones(30), torch.ones(30))
    s = t.summary()
    assert s["test"] == "dummy" and s["n_pairs"] == 30 and s["rejected"] is True
    assert isinstance(s["log_wealth"], list) and s["config_scales"] == [1.0]
    t.reset()
    assert t.n_pairs == 0 and not t.rejected and t.dim is None
    assert t.log_wealth.tolist() == [0.0]


def test_update_with_trajectory_matches_pair_by_pair_updates() -> None:
    """The per-pair combined log-wealth returned by update_with_trajectory equals what a caller
    reads after feeding the same pairs one at a time (burn-in pairs keep the starting wealth)."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-0.3, 1.0, size=57)
    y = rng.uniform(-0.3, 1.0, size=57)
    one = Dummy([0.5, 1.0], burn_in=4, scales=[0.5, 1.0], chunk=5)
    expected = []
    for i in range(57):
        one.update(torch.tensor(x[i : i + 1]), torch.tensor(y[i : i + 1]))
        expected.append(one.combined_log_wealth)
    batched = Dummy([0.5, 1.0], burn_in=4, scales=[0.5, 1.0], chunk=5)
    got = np.concatenate([
        batched.update_with_trajectory(torch.tensor(x[a:b]), torch.tensor(y[a:b]))
        for a, b in ((0, 2), (2, 13), (13, 14), (14, 57))
    ])
    assert got.shape == (57,)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert np.all(got[:4] == 0.0)  # burn-in: not bet on
    assert batched.rejected_at == one.rejected_at


def test_empty_batch_is_a_no_op_and_does_not_fix_the_dimension() -> None:
    t = Dummy([0.5], burn_in=2)
    t.update(torch.zeros(0), torch.zeros(0))
    assert t.n_pairs == 0 and t.dim is None
    t.update(torch.zeros(5, 3), torch.zeros(5, 3))
    assert t.n_pairs == 5 and t.dim == 3
