"""Property tests (hypothesis) on every public statistics function and constructor.

Random VALID inputs never crash and keep the invariants the statistics rely on:

* thresholds: tau(eps, delta) in [0, sqrt 2], nondecreasing in eps and in delta; the Gaussian
  profile delta_mu(eps) in [0, 1], nonincreasing in eps, nondecreasing in mu; gaussian_epsilon
  inverts it;
* betting: for payoffs inside the bound that lambda_max was derived for, the wealth stays > 0
  (finite log-wealth) and the bet stays in [0, lambda_max];
* sequential tests: random streams (any batching, atoms, vectors, caps) keep a finite log-wealth,
  an epsilon lower bound that is 0 or a grid point, a decision that never reverts, a simultaneous
  (Bonferroni) bound <= the per-point one, and the anytime bound >= the current one;
* one-run audit: bounds >= 0, nondecreasing in alpha (a larger alpha is a weaker requirement),
  below their ceiling; Steinke's p-value in [0, 1] and nondecreasing in epsilon;
* mechanisms: finite samples of the requested shape, dtype and seed-determinism.

Random INVALID inputs (eps <= 0 or non-finite, delta outside [0, 1), alpha outside (0, 1), NaN or
inf pairs, mismatched shapes, empty scores) raise ValueError/TypeError whose message names the
parameter or shows the bad value, and leave the object unchanged.

Deterministic: ``derandomize=True`` (examples derived from the test's name) and a small
``max_examples``, so the file runs in well under a minute and never flakes. For a bug hunt,
``DPAUDIT_PROPERTY_SCALE=20`` runs twenty times more examples with random seeds.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaudit_torch import mechanisms as mech
from dpaudit_torch.stats import one_run
from dpaudit_torch.stats.base import CannotRejectWarning
from dpaudit_torch.stats.betting import OnlineNewtonStep, log_mean_exp
from dpaudit_torch.stats.hockey_stick import HockeyStickTest
from dpaudit_torch.stats.mmd import SequentialMMDTest
from dpaudit_torch.stats.thresholds import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_profile_grid,
    mmd_tau,
)

SQRT2 = math.sqrt(2.0)


#: ``DPAUDIT_PROPERTY_SCALE=20`` runs 20x more examples, randomly (a bug hunt, not for CI)
_SCALE = int(os.environ.get("DPAUDIT_PROPERTY_SCALE", "1"))


def fast(n: int = 25) -> settings:
    kw = {"database": None} if _SCALE == 1 else {}  # a hunt keeps its failures to replay
    return settings(
        max_examples=n * _SCALE,
        derandomize=_SCALE == 1,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **kw,
    )


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ strategies
eps_st = st.floats(min_value=1e-6, max_value=50.0, allow_nan=False, allow_infinity=False)
delta_st = st.one_of(
    st.just(0.0), st.floats(min_value=0.0, max_value=0.999, allow_nan=False, exclude_max=False)
)
alpha_st = st.floats(min_value=1e-6, max_value=0.999, allow_nan=False)
mu_st = st.floats(min_value=1e-3, max_value=20.0, allow_nan=False)

#: invalid epsilons, deltas, alphas (each with the substring its error message must contain)
bad_eps_st = st.sampled_from([0.0, -1.0, -1e-300, float("nan"), float("inf"), -float("inf")])
bad_delta_st = st.sampled_from([-1e-9, -1.0, 1.0, 1.5, float("nan"), float("inf")])
bad_alpha_st = st.sampled_from([0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")])


def _names_param(err: Exception, name: str, bad: object) -> bool:
    msg = str(err)
    return name in msg or repr(bad) in msg or str(bad) in msg


# ------------------------------------------------------------------------------ thresholds
@fast(60)
@given(e1=eps_st, e2=eps_st, d1=delta_st, d2=delta_st)
def test_mmd_tau_range_and_monotone(e1: float, e2: float, d1: float, d2: float) -> None:
    lo_e, hi_e = sorted((e1, e2))
    lo_d, hi_d = sorted((d1, d2))
    t = float(mmd_tau(lo_e, lo_d))
    # [0, sqrt 2): the supremum sqrt 2 is reached only in the limit; in floating point
    # 1 - 2 (1 - delta) expit(-eps) can round to exactly 1, so allow equality
    assert 0.0 <= t <= SQRT2
    assert float(mmd_tau(hi_e, lo_d)) >= t  # nondecreasing in eps
    assert float(mmd_tau(lo_e, hi_d)) >= t  # nondecreasing in delta
    # vectorised form agrees with the scalar one
    v = mmd_tau(np.array([lo_e, hi_e]), np.array([lo_d, lo_d]))
    assert v.shape == (2,) and float(v[0]) == t


@fast(60)
@given(e1=st.floats(0.0, 60.0), e2=st.floats(0.0, 60.0), mu1=mu_st, mu2=mu_st)
def test_gaussian_delta_range_and_monotone(e1: float, e2: float, mu1: float, mu2: float) -> None:
    lo_e, hi_e = sorted((e1, e2))
    lo_m, hi_m = sorted((mu1, mu2))
    d = float(gaussian_delta(lo_e, lo_m))
    assert 0.0 <= d <= 1.0
    # nonincreasing in eps and nondecreasing in mu, up to the absolute rounding of
    # Phi(a) - exp(eps + log Phi(b)) (each term within a few ulp of a number <= 1)
    tol = 4e-16
    assert float(gaussian_delta(hi_e, lo_m)) <= d + tol
    assert float(gaussian_delta(lo_e, hi_m)) >= d - tol
    # sigma = 1 / mu: 1 / (1 / mu) differs from mu by an ulp, and delta_mu(eps) at large eps is a
    # difference of two close terms (relative error amplified): agree to 1e-9 relative
    grid = gaussian_profile_grid(1.0 / lo_m, [lo_e, hi_e])
    np.testing.assert_allclose(grid, gaussian_delta(np.array([lo_e, hi_e]), lo_m), rtol=1e-9,
                               atol=1e-300)


@fast(40)
@given(delta=st.floats(1e-12, 0.99), mu=st.floats(0.05, 10.0))
def test_gaussian_epsilon_inverts_delta(delta: float, mu: float) -> None:
    eps = gaussian_epsilon(delta, mu)
    assert eps >= 0.0 and math.isfinite(eps)
    if eps == 0.0:
        assert float(gaussian_delta(0.0, mu)) <= delta
    else:
        # brentq to xtol = rtol = 1e-12: the root's delta within a relative ~1e-9 (the slope of
        # delta_mu at the root is at most 1 in absolute value, delta >= 1e-12)
        assert float(gaussian_delta(eps, mu)) == pytest.approx(delta, rel=1e-6, abs=1e-15)
        # smallest such eps: a little less epsilon is not enough
        assert float(gaussian_delta(eps * (1 - 1e-6), mu)) >= delta * (1 - 1e-9)
    # nonincreasing in delta
    assert gaussian_epsilon(min(0.999, delta * 2.0), mu) <= eps + 1e-9


@fast(30)
@given(bad=bad_delta_st, mu=mu_st)
def test_gaussian_epsilon_bad_delta(bad: float, mu: float) -> None:
    with pytest.raises(ValueError) as ei:
        gaussian_epsilon(bad, mu)
    assert _names_param(ei.value, "delta", bad)


@fast(20)
@given(bad=st.sampled_from([0.0, -1.0, float("nan"), float("inf")]))
def test_gaussian_functions_bad_mu_sigma(bad: float) -> None:
    with pytest.raises(ValueError, match="mu"):
        gaussian_delta(0.5, bad)
    with pytest.raises(ValueError, match="mu"):
        gaussian_epsilon(1e-5, bad)
    with pytest.raises(ValueError, match="noise multiplier"):
        gaussian_profile_grid(bad, [0.5])


# ------------------------------------------------------------------------------ betting
@fast(40)
@given(
    lmax=st.lists(st.floats(1e-3, 10.0), min_size=1, max_size=4),
    data=st.data(),
)
def test_ons_wealth_positive_within_bounds(lmax: list[float], data: st.DataObject) -> None:
    """Payoffs p >= -(1 - 1e-6) / lambda_max keep 1 + lambda p > 0: finite log-wealth."""
    lm = np.array(lmax)
    n = data.draw(st.integers(1, 60), label="n")
    u = data.draw(st.lists(st.floats(0.0, 1.0), min_size=n * lm.size, max_size=n * lm.size),
                  label="u")
    # map u in [0, 1] to [-(1 - 1e-6)/lmax, 5]: down to just above the bound, up to large gains
    lo = -(1.0 - 1e-6) / lm
    p = lo + np.asarray(u).reshape(n, lm.size) * (5.0 - lo)
    ons = OnlineNewtonStep(lm)
    split = data.draw(st.integers(1, n), label="split")
    traj = np.concatenate([ons.run(p[:split]), ons.run(p[split:])])
    assert traj.shape == (n, lm.size)
    assert np.all(np.isfinite(traj))
    assert np.all((ons.lam >= 0.0) & (ons.lam <= lm))
    assert np.all(ons.a_sum >= 1.0) and np.all(np.isfinite(ons.a_sum))
    # one chunk or two: identical (the recursion is sequential and stateless otherwise)
    whole = OnlineNewtonStep(lm).run(p)
    np.testing.assert_array_equal(whole, traj)
    assert np.isfinite(log_mean_exp(ons.log_wealth))


@fast(20)
@given(bad=st.sampled_from([[0.0], [-1.0], [float("nan")], [float("inf")], [], [0.5, 0.0]]))
def test_ons_bad_lambda_max(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="lambda_max"):
        OnlineNewtonStep(np.array(bad))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
def test_ons_bad_payoffs() -> None:
    ons = OnlineNewtonStep(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="payoffs must have shape"):
        ons.run(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="payoffs must have shape"):
        ons.run(np.zeros(2))
    ons.run(np.ones((5, 2)))  # lambda > 0 now
    lw = ons.log_wealth.copy()
    lam = ons.lam.copy()
    for bad in (-1e6, float("nan"), float("inf"), -float("inf")):
        p = np.ones((4, 2))
        p[2, 1] = bad
        with pytest.raises(RuntimeError, match="betting bound violated"):
            ons.run(p)
        np.testing.assert_array_equal(ons.log_wealth, lw)  # nothing consumed
        np.testing.assert_array_equal(ons.lam, lam)


# ------------------------------------------------------------------------------ sequential tests
@st.composite
def streams(draw: st.DrawFn, max_n: int = 70) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A random valid stream of pairs [n] or [n, d] and a random split into batches."""
    n = draw(st.integers(0, max_n), label="n")
    d = draw(st.sampled_from([None, 1, 3]), label="d")
    kind = draw(st.sampled_from(["continuous", "atoms", "shifted", "constant"]), label="kind")
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    scale = draw(st.sampled_from([1e-6, 1.0, 1e6]), label="scale")
    rng = np.random.default_rng(seed)
    shape = (n,) if d is None else (n, d)
    if kind == "continuous":
        x, y = rng.normal(size=shape), rng.normal(size=shape)
    elif kind == "shifted":
        x, y = rng.normal(size=shape), 3.0 + rng.normal(size=shape)
    elif kind == "atoms":
        x = rng.integers(0, 3, size=shape).astype(float)
        y = rng.integers(0, 2, size=shape).astype(float)
    else:
        x, y = np.zeros(shape), np.ones(shape)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5), label="cuts"))
    sizes = np.diff([0, *cuts, n]).tolist()
    return scale * x, scale * y, sizes


def _check_sequential_invariants(make, x: np.ndarray, y: np.ndarray, sizes: list[int]) -> None:
    """Feed the stream batch by batch to make(False) and make(True) (simultaneous)."""
    t, ts = make(False), make(True)
    i = 0
    was_rejected, rejected_at = False, None
    prev_grid = np.zeros(t.grid_size, dtype=bool)
    for s in sizes:
        xb, yb = torch.as_tensor(x[i : i + s]), torch.as_tensor(y[i : i + s])
        t.update(xb, yb)
        ts.update(xb, yb)
        i += s
        assert t.n_pairs == i and ts.n_pairs == i
        lw = t.log_wealth.numpy()
        assert lw.shape == (t.grid_size,) and np.all(np.isfinite(lw))
        assert math.isfinite(t.combined_log_wealth)
        assert np.all(t.max_log_wealth.numpy() >= lw - 1e-12)
        assert np.all(t.max_log_wealth.numpy() >= 0.0)  # the running max starts at log 1 = 0
        # the decision never reverts, and its pair index never moves
        if was_rejected:
            assert t.rejected and t.rejected_at == rejected_at
        was_rejected, rejected_at = t.rejected, t.rejected_at
        if t.rejected:
            assert 1 <= t.rejected_at <= i
        grid = t.grid_rejected
        assert np.all(grid >= prev_grid)
        prev_grid = grid.copy()
        for lb in (t.epsilon_lower_bound, ts.epsilon_lower_bound, t.epsilon_lower_bound_current):
            assert lb == 0.0 or lb in t.epsilons.tolist()
        assert ts.epsilon_lower_bound <= t.epsilon_lower_bound
        assert t.epsilon_lower_bound_current <= t.epsilon_lower_bound
        # the combined decision averages the grid: it is never ahead of every grid point...
        if t.rejected:
            assert t.max_log_wealth.numpy().max() >= math.log(1.0 / t.alpha) - 1e-12
        # same data, same state: the simultaneous test differs only in its per-point level
        np.testing.assert_array_equal(ts.log_wealth.numpy(), lw)
        assert ts.rejected_at == t.rejected_at
    s = t.summary()
    assert s["n_pairs"] == i and s["rejected"] == t.rejected


grid_st = st.lists(st.floats(0.01, 5.0), min_size=1, max_size=4, unique=True)


@fast(30)
@given(
    stream=streams(),
    eps=grid_st,
    delta=st.floats(0.0, 0.5),
    alpha=st.floats(0.01, 0.5),
    burn_in=st.integers(2, 8),
    radius=st.sampled_from([None, 1.0, 0.5, 0.1]),
    cap=st.sampled_from([None, 1, 5, 30]),
    chunk=st.sampled_from([1, 7, 512]),
)
def test_mmd_random_streams(stream, eps, delta, alpha, burn_in, radius, cap, chunk) -> None:
    x, y, sizes = stream

    def make(simultaneous: bool) -> SequentialMMDTest:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CannotRejectWarning)
            t = SequentialMMDTest(eps, delta, alpha, burn_in, radius, simultaneous=simultaneous,
                                  max_witness_points=cap, chunk_size=chunk)
        # a null the test can never reject is flagged and warned about, never silent
        ours = [w for w in caught if issubclass(w.category, CannotRejectWarning)]
        assert bool(t.cannot_reject.any()) == bool(ours) == _mmd_cannot(eps, delta, radius)
        return t

    _check_sequential_invariants(make, x, y, sizes)
    t = make(False).update(torch.as_tensor(x), torch.as_tensor(y))
    R = t.witness_radius
    assert t.witness_norm <= R * (1 + 1e-9)
    assert t.exact_witness_norm() <= R * (1 + 1e-9)
    if cap is not None:
        assert t.n_stored <= cap
    # whatever the batching, the result is the same up to rounding
    t2 = make(False)
    i = 0
    for s in sizes:
        t2.update(torch.as_tensor(x[i : i + s]), torch.as_tensor(y[i : i + s]))
        i += s
    np.testing.assert_allclose(t2.log_wealth.numpy(), t.log_wealth.numpy(), rtol=1e-7, atol=1e-9)


def _mmd_cannot(eps: list[float], delta: float, radius: float | None) -> bool:
    R = 1.0 if radius is None else radius
    return bool(np.any(R * SQRT2 - mmd_tau(np.array(eps), delta) <= 1e-12))


@fast(30)
@given(bad=bad_eps_st, pos=st.integers(0, 2))
def test_mmd_bad_epsilon(bad: float, pos: int) -> None:
    grid = [0.1, 0.2, 0.3]
    grid[pos] = bad
    with pytest.raises(ValueError) as ei:
        SequentialMMDTest(grid)
    assert _names_param(ei.value, "epsilon", bad)
    with pytest.raises(ValueError) as ei:
        SequentialMMDTest(bad)
    assert _names_param(ei.value, "epsilon", bad)


@fast(20)
@given(bad_d=bad_delta_st, bad_a=bad_alpha_st)
def test_mmd_bad_delta_alpha(bad_d: float, bad_a: float) -> None:
    with pytest.raises(ValueError) as ei:
        SequentialMMDTest(0.1, delta=bad_d)
    assert _names_param(ei.value, "delta", bad_d)
    with pytest.raises(ValueError) as ei:
        SequentialMMDTest([0.1, 0.2], delta=[0.0, bad_d])
    assert _names_param(ei.value, "delta", bad_d)
    with pytest.raises(ValueError) as ei:
        SequentialMMDTest(0.1, alpha=bad_a)
    assert _names_param(ei.value, "alpha", bad_a)


@st.composite
def bad_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, str]:
    """A batch that must be refused, and the substring its error must contain."""
    n = draw(st.integers(1, 20), label="n")
    which = draw(st.sampled_from(["nan_x", "inf_y", "ninf_x", "shape", "ndim", "dim"]),
                 label="which")
    rng = np.random.default_rng(draw(st.integers(0, 1000), label="seed"))
    x, y = rng.normal(size=n), rng.normal(size=n)
    pos = draw(st.integers(0, n - 1), label="pos")
    if which == "nan_x":
        x[pos] = np.nan
        return x, y, "non-finite"
    if which == "inf_y":
        y[pos] = np.inf
        return x, y, "non-finite"
    if which == "ninf_x":
        x[pos] = -np.inf
        return x, y, "non-finite"
    if which == "shape":
        return x, y[: n - 1] if n > 1 else np.zeros(2), "same shape"
    if which == "ndim":
        return x.reshape(n, 1, 1), y.reshape(n, 1, 1), "shape"
    return rng.normal(size=(n, 2)), rng.normal(size=(n, 2)), "dimension"


@fast(40)
@given(bad=bad_pairs(), before=st.integers(0, 30))
def test_mmd_bad_pairs_refused_state_unchanged(bad, before: int) -> None:
    x, y, msg = bad
    rng = np.random.default_rng(before)
    t = SequentialMMDTest([0.1, 1.0], burn_in=5, max_witness_points=8)
    t.update(torch.as_tensor(rng.normal(size=before)), torch.as_tensor(rng.normal(size=before)))
    if before == 0 and msg == "dimension":
        t.update(torch.zeros(3), torch.zeros(3))  # fix d = 1 first
    sd = t.summary()
    with pytest.raises(ValueError, match=msg):
        t.update(torch.as_tensor(x), torch.as_tensor(y))
    assert t.summary() == sd  # refused as a whole: nothing consumed


# ------------------------------------------------------------------------------ hockey-stick
@fast(30)
@given(
    stream=streams(),
    eps=grid_st,
    delta=st.one_of(st.just(0.0), st.floats(0.0, 0.5)),
    alpha=st.floats(0.01, 0.5),
    burn_in=st.integers(2, 8),
    cells=st.integers(2, 40),
    eta=st.floats(0.1, 10.0),
    refresh=st.sampled_from([1.25, 2.0, 4.0]),
    atoms=st.integers(0, 8),
    chunk=st.sampled_from([1, 7, 512]),
)
def test_hockey_stick_random_streams(stream, eps, delta, alpha, burn_in, cells, eta, refresh,
                                     atoms, chunk) -> None:
    x, y, sizes = stream

    def make(simultaneous: bool) -> HockeyStickTest:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CannotRejectWarning)  # no ceiling: never warns
            return HockeyStickTest(eps, delta, alpha, burn_in, grid_cells=cells, eta=eta,
                                   refresh_factor=refresh, max_atoms=atoms, max_chunk=chunk,
                                   simultaneous=simultaneous)

    _check_sequential_invariants(make, x, y, sizes)
    # documented: the results do not depend on the batching beyond summation order
    t1 = make(False).update(torch.as_tensor(x), torch.as_tensor(y))
    t2 = make(False)
    i = 0
    for s in sizes:
        t2.update(torch.as_tensor(x[i : i + s]), torch.as_tensor(y[i : i + s]))
        i += s
    np.testing.assert_allclose(t2.log_wealth.numpy(), t1.log_wealth.numpy(), rtol=1e-9,
                               atol=1e-9)
    assert t2.rejected_at == t1.rejected_at


@fast(30)
@given(bad=bad_eps_st, bad_d=bad_delta_st, bad_a=bad_alpha_st)
def test_hockey_stick_bad_levels(bad: float, bad_d: float, bad_a: float) -> None:
    with pytest.raises(ValueError) as ei:
        HockeyStickTest([0.5, bad])
    assert _names_param(ei.value, "epsilon", bad)
    with pytest.raises(ValueError) as ei:
        HockeyStickTest(0.5, delta=bad_d)
    assert _names_param(ei.value, "delta", bad_d)
    with pytest.raises(ValueError) as ei:
        HockeyStickTest(0.5, alpha=bad_a)
    assert _names_param(ei.value, "alpha", bad_a)


@fast(20)
@given(
    which=st.sampled_from(["grid_cells", "eta", "refresh_factor", "max_atoms", "max_chunk",
                           "burn_in", "score"]),
    bad=st.sampled_from([-1, 0, 1, float("nan"), float("inf"), "x", None, True]),
)
def test_hockey_stick_bad_options(which: str, bad: object) -> None:
    ok = {
        # values that ARE valid for the option (they must construct without error)
        "grid_cells": lambda b: isinstance(b, int) and not isinstance(b, bool) and b >= 2,
        "eta": lambda b: isinstance(b, (int, float)) and not isinstance(b, bool)
        and math.isfinite(b) and b > 0,
        "refresh_factor": lambda b: isinstance(b, (int, float)) and not isinstance(b, bool)
        and math.isfinite(b) and b > 1,
        "max_atoms": lambda b: isinstance(b, int) and not isinstance(b, bool) and b >= 0,
        "max_chunk": lambda b: isinstance(b, int) and not isinstance(b, bool) and b >= 1,
        "burn_in": lambda b: isinstance(b, int) and not isinstance(b, bool) and b >= 2,
        "score": lambda b: False,
    }[which]
    if which == "burn_in":
        call = lambda: HockeyStickTest(0.5, 0.0, 0.05, bad)  # noqa: E731
    else:
        call = lambda: HockeyStickTest(0.5, **{which: bad})  # noqa: E731
    if ok(bad):
        call()
        return
    with pytest.raises((ValueError, TypeError)) as ei:
        call()
    assert _names_param(ei.value, which, bad)


@fast(40)
@given(bad=bad_pairs(), before=st.integers(0, 30))
def test_hockey_stick_bad_pairs_refused_state_unchanged(bad, before: int) -> None:
    x, y, msg = bad
    rng = np.random.default_rng(before)
    t = HockeyStickTest([0.1, 1.0], burn_in=5)
    t.update(torch.as_tensor(rng.normal(size=before)), torch.as_tensor(rng.normal(size=before)))
    if before == 0 and msg == "dimension":
        t.update(torch.zeros(3), torch.zeros(3))
    sd = t.summary()
    with pytest.raises(ValueError, match=msg):
        t.update(torch.as_tensor(x), torch.as_tensor(y))
    assert t.summary() == sd


# ------------------------------------------------------------------------------ one-run audit
@st.composite
def games(draw: st.DrawFn) -> tuple[int, int, int]:
    m = draw(st.integers(1, 5000), label="m")
    r = draw(st.integers(0, min(m, 2000)), label="r")
    v = draw(st.integers(0, r), label="v")
    return m, r, v


@fast(40)
@given(game=games(), delta=st.sampled_from([0.0, 1e-6, 1e-3]), a1=alpha_st, a2=alpha_st)
def test_steinke_bound_nonnegative_monotone_in_alpha(game, delta, a1, a2) -> None:
    m, r, v = game
    lo, hi = sorted((a1, a2))
    b_lo = one_run.steinke_epsilon_lower_bound(m, r, v, delta, lo)
    b_hi = one_run.steinke_epsilon_lower_bound(m, r, v, delta, hi)
    assert b_lo >= 0.0 and math.isfinite(b_lo)
    assert b_hi >= b_lo - 1e-9  # brentq tolerance 1e-12 (x) + 1e-12 (relative)
    if b_lo > 0.0:  # the bound is a rejected claim: its p-value is (at) alpha
        assert one_run.steinke_p_value(m, r, v, b_lo * (1 - 1e-6), delta) < lo
    if r > 0 and v == r and r < m:  # one more right guess can only help
        assert one_run.steinke_epsilon_lower_bound(m, r + 1, v + 1, delta, lo) >= b_lo - 1e-9


@fast(40)
@given(game=games(), delta=st.sampled_from([0.0, 1e-6, 1e-3]), e1=st.floats(0.0, 20.0),
       e2=st.floats(0.0, 20.0))
def test_steinke_p_value_range_and_monotone(game, delta, e1, e2) -> None:
    m, r, v = game
    lo, hi = sorted((e1, e2))
    p_lo = one_run.steinke_p_value(m, r, v, lo, delta)
    p_hi = one_run.steinke_p_value(m, r, v, hi, delta)
    assert 0.0 <= p_lo <= 1.0 and 0.0 <= p_hi <= 1.0
    assert p_hi >= p_lo - 1e-12  # a weaker claim (larger eps) is never more surprising
    arr = one_run.steinke_p_value(m, r, v, np.array([lo, hi]), delta)
    np.testing.assert_array_equal(arr, [p_lo, p_hi])


@fast(30)
@given(game=games(), delta=st.sampled_from([1e-6, 1e-3]), a1=alpha_st, a2=alpha_st)
def test_fdp_bounds_nonnegative_monotone_in_alpha(game, delta, a1, a2) -> None:
    m, r, v = game
    lo, hi = sorted((a1, a2))
    mu_lo = one_run.fdp_mu_lower_bound(m, r, v, lo)
    mu_hi = one_run.fdp_mu_lower_bound(m, r, v, hi)
    assert mu_lo >= 0.0 and mu_hi >= mu_lo - 1e-9
    e_lo = one_run.fdp_epsilon_lower_bound(m, r, v, delta, lo)
    e_hi = one_run.fdp_epsilon_lower_bound(m, r, v, delta, hi)
    assert e_lo >= 0.0 and e_hi >= e_lo - 1e-9
    if mu_lo > 0.0:
        assert one_run.fdp_rejects(m, r, v, mu_lo * (1 - 1e-6), lo)
        assert not one_run.fdp_rejects(m, r, v, mu_lo * (1 + 1e-6) + 1e-9, lo)


@fast(20)
@given(m=st.integers(1, 400), a1=st.floats(0.001, 0.5), a2=st.floats(0.001, 0.5),
       delta=st.sampled_from([0.0, 1e-5]), method=st.sampled_from(["steinke", "fdp"]))
def test_ceiling_nonnegative_monotone(m: int, a1: float, a2: float, delta: float,
                                      method: str) -> None:
    if method == "fdp" and delta == 0.0:
        with pytest.raises(ValueError, match="delta"):
            one_run.ceiling(m, a1, delta, method)
        return
    lo, hi = sorted((a1, a2))
    c_lo = one_run.ceiling(m, lo, delta, method)
    c_hi = one_run.ceiling(m, hi, delta, method)
    assert c_lo >= 0.0 and c_hi >= c_lo - 1e-9
    # the ceiling is the best the audit could ever report: above any all-right game's bound
    r = max(1, m // 3)
    assert one_run.ceiling(m, lo, delta, method, r=r) <= c_lo + 1e-9


@fast(30)
@given(m=st.integers(1, 10**7))
def test_default_candidates(m: int) -> None:
    c = one_run.default_candidates(m)
    assert c == sorted(set(c)) and c[-1] == m and all(1 <= k <= m for k in c)
    assert len(c) <= 3 * math.log10(max(m, 10)) + 1


@st.composite
def score_sets(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n_in = draw(st.integers(1, 120), label="n_in")
    n_out = draw(st.integers(1, 120), label="n_out")
    sep = draw(st.sampled_from([0.0, 1.0, 4.0]), label="sep")
    rng = np.random.default_rng(draw(st.integers(0, 10**6), label="seed"))
    ties = draw(st.booleans(), label="ties")
    a, b = sep + rng.normal(size=n_in), rng.normal(size=n_out)
    if ties:
        a, b = np.round(a), np.round(b)
    return a, b


strategy_st = st.sampled_from(["grid", "fixed", "split", "stated"])


@fast(25)
@given(scores=score_sets(), method=st.sampled_from(["steinke", "fdp"]),
       guesses=st.sampled_from(["one_sided", "two_sided"]), which=strategy_st,
       a1=st.floats(0.001, 0.5), a2=st.floats(0.001, 0.5))
def test_one_run_audit_bounds(scores, method, guesses, which, a1, a2) -> None:
    a, b = scores
    audit = one_run.OneRunAudit(torch.as_tensor(a), b)
    m = audit.m
    strategy = {
        "grid": one_run.Bonferroni(),
        "fixed": one_run.FixedK(max(1, m // 4)),
        "split": one_run.RandomSplit(0.5, seed=3),
        "stated": one_run.Bonferroni((1, max(1, m // 2), m)),
    }[which]
    if which == "split" and m < 2:
        return
    lo, hi = sorted((a1, a2))
    res_lo = audit.epsilon_lower_bound(1e-5, lo, method, guesses, strategy)
    res_hi = audit.epsilon_lower_bound(1e-5, hi, method, guesses, strategy)
    for res in (res_lo, res_hi):
        assert res.bound >= 0.0 and math.isfinite(res.bound)
        assert res.bound <= res.ceiling + 1e-9
        assert 0 <= res.v <= res.r <= res.m
        assert res.alpha_per_test <= res.alpha
        assert (res.family is not None) == (method == "fdp")
        d = res.to_dict()
        assert d["bound"] == res.bound and "diagnostic" in d["uncorrected_best_note"]
    if which != "split":
        # fixed candidates, each tested at alpha / n: a larger alpha can only raise the bound.
        # (RandomSplit chooses k on one half AT LEVEL alpha, so its certified k, and hence its
        # bound, may move either way with alpha: no monotonicity is claimed for it.)
        assert res_hi.bound >= res_lo.bound - 1e-9
    if which == "grid":
        # the uncorrected diagnostic searches every r at the full alpha: never below the bound
        assert res_lo.uncorrected_best >= res_lo.bound - 1e-9


@fast(20)
@given(bad=st.sampled_from(["empty", "nan", "inf", "2d", "str"]), side=st.booleans())
def test_one_run_bad_scores(bad: str, side: bool) -> None:
    good = np.array([1.0, 2.0, 3.0])
    val = {"empty": np.array([]), "nan": np.array([1.0, np.nan]), "inf": np.array([np.inf]),
           "2d": np.ones((2, 2)), "str": ["a", "b"]}[bad]
    args = (val, good) if side else (good, val)
    name = "in_scores" if side else "out_scores"
    with pytest.raises((ValueError, TypeError), match=name):
        one_run.OneRunAudit(*args)


@fast(30)
@given(bad_d=bad_delta_st, bad_a=bad_alpha_st, bad_e=st.sampled_from([-1.0, float("nan"),
                                                                      float("inf")]))
def test_one_run_bad_levels(bad_d: float, bad_a: float, bad_e: float) -> None:
    audit = one_run.OneRunAudit([1.0, 2.0, 3.0], [0.0, -1.0])
    with pytest.raises(ValueError) as ei:
        audit.epsilon_lower_bound(bad_d)
    assert _names_param(ei.value, "delta", bad_d)
    with pytest.raises(ValueError) as ei:
        audit.epsilon_lower_bound(1e-5, bad_a)
    assert _names_param(ei.value, "alpha", bad_a)
    with pytest.raises(ValueError) as ei:
        one_run.steinke_epsilon_lower_bound(100, 10, 5, bad_d)
    assert _names_param(ei.value, "delta", bad_d)
    with pytest.raises(ValueError) as ei:
        one_run.steinke_epsilon_lower_bound(100, 10, 5, 0.0, bad_a)
    assert _names_param(ei.value, "alpha", bad_a)
    with pytest.raises(ValueError) as ei:
        one_run.fdp_mu_lower_bound(100, 10, 5, bad_a)
    assert _names_param(ei.value, "alpha", bad_a)
    with pytest.raises(ValueError) as ei:
        one_run.steinke_p_value(100, 10, 5, bad_e, 0.0)
    assert _names_param(ei.value, "epsilon", bad_e)
    with pytest.raises(ValueError) as ei:
        one_run.ceiling(100, bad_a, 0.0)
    assert _names_param(ei.value, "alpha", bad_a)


@fast(30)
@given(m=st.integers(-3, 50), r=st.integers(-3, 60), v=st.integers(-3, 60))
def test_one_run_bad_counts(m: int, r: int, v: int) -> None:
    valid = m >= 1 and 0 <= r <= m and 0 <= v <= r
    if valid:
        assert one_run.steinke_epsilon_lower_bound(m, r, v, 0.0) >= 0.0
        return
    with pytest.raises(ValueError) as ei:
        one_run.steinke_epsilon_lower_bound(m, r, v, 0.0)
    assert any(k in str(ei.value) for k in ("m ", "r ", "v ", "m must", "r must", "v must"))
    with pytest.raises(ValueError):
        one_run.fdp_mu_lower_bound(m, r, v)


# ------------------------------------------------------------------------------ mechanisms
@fast(40)
@given(
    name=st.sampled_from(mech.names()),
    eps=st.floats(1e-3, 20.0),
    delta=st.floats(1e-9, 0.5),
    variant=st.sampled_from(list(mech.VARIANTS)),
    n=st.integers(1, 64),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_mechanism_samples_finite(name, eps, delta, variant, n, dtype, seed) -> None:
    if name == "Gaussian":
        m = mech.get(name, epsilon=eps, sigma=1.0 / eps if eps > 0.05 else 1.0)
    elif name == "Laplace":
        m = mech.get(name, epsilon=eps)
    elif name.startswith(("DPGaussian", "NonDPGaussian")):
        m = mech.get(name, epsilon=eps, delta=delta, variant=variant)
    else:
        m = mech.get(name, epsilon=eps, variant=variant)
    x, y = m.sample(n, torch.Generator().manual_seed(seed), dtype=dtype)
    assert x.shape == y.shape == (n,) and x.dtype == y.dtype == dtype
    assert torch.isfinite(x).all() and torch.isfinite(y).all()
    x2, y2 = m.sample(n, torch.Generator().manual_seed(seed), dtype=dtype)
    assert torch.equal(x, x2) and torch.equal(y, y2)  # seed-deterministic
    assert isinstance(m.is_dp, bool)
    if m.true_delta is not None:
        assert 0.0 <= m.true_delta <= 1.0
        assert m.is_dp == (m.true_delta <= m.delta + 1e-15)


@fast(30)
@given(name=st.sampled_from(mech.names()), bad=bad_eps_st)
def test_mechanism_bad_epsilon(name: str, bad: float) -> None:
    with pytest.raises(ValueError) as ei:
        mech.get(name, epsilon=bad)
    assert _names_param(ei.value, "epsilon", bad)


@fast(20)
@given(bad_n=st.sampled_from([0, -1]), bad_t=st.sampled_from([2.0, "3", None]))
def test_mechanism_bad_sample_size(bad_n: int, bad_t: object) -> None:
    m = mech.get("Laplace", epsilon=1.0)
    with pytest.raises(ValueError, match="n must be"):
        m.sample(bad_n)
    with pytest.raises(TypeError, match="n must be"):
        m.sample(bad_t)  # type: ignore[arg-type]
