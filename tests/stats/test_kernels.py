"""The compiled passes that replace NumPy's many small calls on the tests' small arrays give
NumPy's values (to rounding), special values included."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit_torch._compiled import compiled, set_compiled
from dpaudit_torch.stats.betting import log_mean_exp
from dpaudit_torch.stats.sampling import fresh_start_log_mass


def _numpy_path(fn, *args, **kw):
    before = compiled()
    set_compiled(False)
    try:
        return fn(*args, **kw)
    finally:
        set_compiled(before)


@pytest.mark.parametrize("shape", [(7,), (80, 5), (80, 5, 2), (1, 1), (3, 0, 4), (300, 40)])
def test_log_mean_exp_matches_numpy(shape):
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 30.0, shape)
    if a.size:
        a.flat[0] = -np.inf
    got = log_mean_exp(a, axis=-1)
    want = _numpy_path(log_mean_exp, a, axis=-1)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


def test_log_mean_exp_special_rows():
    a = np.array([[-np.inf, -np.inf], [np.inf, 0.0], [np.nan, 1.0], [1000.0, 1000.0],
                  [-1000.0, -np.inf]])
    got = log_mean_exp(a)
    want = _numpy_path(log_mean_exp, a)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-15)


@pytest.mark.parametrize("t0", [0, 7, 10_000])
def test_fresh_start_matches_numpy(t0):
    rng = np.random.default_rng(t0)
    log_e = rng.normal(0.0, 0.5, (25, 4))
    log_s0 = np.array([-np.inf, -3.0, 0.5, 20.0])
    got = fresh_start_log_mass(log_s0, log_e, t0)
    want = _numpy_path(fresh_start_log_mass, log_s0, log_e, t0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("t0", [0, 5, 10_000])
def test_fresh_start_mixture_matches_numpy(t0):
    """The noise tests' started masses and mixed wealth over a block of steps: the compiled pass
    gives the NumPy path's values."""
    from dpaudit_torch.stats.noise import _advance_mixed

    rng = np.random.default_rng(t0 + 1)
    log_e = rng.normal(-0.2, 1.0, (6, 3, 5))
    log_s0 = np.full((3, 5), -np.inf) if t0 == 0 else rng.normal(-2.0, 1.0, (3, 5))
    before = log_s0.copy()
    got_s, got_traj = _advance_mixed(log_s0, log_e, t0)
    np.testing.assert_array_equal(log_s0, before)  # the input is not changed
    want_s, want_traj = _numpy_path(_advance_mixed, log_s0, log_e, t0)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_traj, want_traj, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["mmd", "hockey_stick"])
def test_record_chunk_matches_numpy(name):
    """A tester's book-keeping of its chunks (combined wealth, first crossings, running
    maxima): the compiled pass and the NumPy path give the same state and trajectories."""
    import torch

    from dpaudit_torch.registry import tester_class

    def run() -> tuple:
        t = tester_class(name)([0.5, 1.0, 2.0], [1e-5] * 3, 0.05, simultaneous=True)
        rng = np.random.default_rng(3)
        trajs = []
        for _ in range(6):  # a mechanism far from private: crossings happen
            x = torch.as_tensor(rng.normal(3.0, 1.0, 40))
            y = torch.as_tensor(rng.normal(0.0, 1.0, 40))
            trajs.append(t.update_with_trajectory(x, y))
        return (np.concatenate(trajs), t.grid_rejected_at, t.rejected_at,
                t.max_log_wealth.numpy(), t._max_combined_lw)

    got, want = run(), _numpy_path(run)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    assert got[1] == want[1] and got[2] == want[2] and got[2] is not None
    np.testing.assert_allclose(got[3], want[3], rtol=1e-12, atol=1e-12)
    assert got[4] == pytest.approx(want[4], rel=1e-12)
