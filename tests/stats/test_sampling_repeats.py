"""stats/sampling_repeats.py: the test of fresh batches (repeats of the batch sizes at any lag).

Checked: the e-values' conditional mean (exactly, from the pmf), the martingale property of the
whole mixture by exact enumeration of every sequence on a small support, agreement with the
second implementation (``simulate_log_wealth``, straight from the definition), the level by
simulation on correct Poisson sizes (also at a rate other than the one given: the e-values do not
need it), and the power on re-seeded loaders (the same epoch of sizes again).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from dpaudit_torch.stats.sampling_repeats import (
    EPOCH_MULTIPLES,
    LOG_B_MARGIN,
    MAX_LAG,
    BatchRepeatTest,
    candidate_lags,
    match_probability,
    max_binomial_log_pmf,
    no_match_mass,
    simulate_log_wealth,
)

DIGITS = (1437, 1 / 23)  # the demo's digits: N, q = 1 / len(loader)


def _reseeded(n_records: int, rate: float, epochs: int, seed: int, every: int = 1,
              epoch: int | None = None) -> np.ndarray:
    """Sizes of a loader re-seeded every ``every`` epochs of ``epoch`` steps (1/q by default)."""
    steps = epoch or int(1 / rate)
    fresh = np.random.default_rng(seed).binomial(n_records, rate, every * steps)
    return np.concatenate([fresh[(e % every) * steps:(e % every + 1) * steps]
                           for e in range(epochs)])


def test_lag_weights_sum_to_one_and_favour_the_epoch_length() -> None:
    lags, log_v, epochs = candidate_lags(DIGITS[1])
    v = np.exp(log_v)
    assert epochs == [23] and lags[0] == 1 and np.all(np.diff(lags) > 0)
    assert math.isclose(v.sum(), 1.0, rel_tol=1e-12)
    assert set(range(1, MAX_LAG + 1)) <= set(lags.tolist())
    h = sum(1.0 / p for p in range(1, MAX_LAG + 1))
    # 1/2 over the multiples k = 1..4 of 23 (1 / (k (k + 1)), renormalised), 1/2 as 1 / (P H)
    wk = np.array([1 / (k * (k + 1)) for k in range(1, EPOCH_MULTIPLES + 1)])
    wk /= wk.sum()
    for k in range(1, EPOCH_MULTIPLES + 1):
        got = v[lags == 23 * k][0]
        assert math.isclose(got, 0.5 * wk[k - 1] + 0.5 / (23 * k * h), rel_tol=1e-12)
    assert math.isclose(v[lags == 35][0], 0.5 / (35 * h), rel_tol=1e-12)
    # 1 / (1 / 93) is 92.99...: Opacus's int(1 / q) steps and the loader's 93 both count
    assert candidate_lags(1 / 93, max_lag=8)[2] == [92, 93]
    big, lv, none = candidate_lags(0.75, max_lag=16)  # no epoch of 2 steps or more
    assert none == [] and big.tolist() == list(range(1, 17))
    assert math.isclose(np.exp(lv).sum(), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("n_records", [1, 7, 60, 1437])
def test_the_denominator_bounds_the_pmf_at_every_rate(n_records: int) -> None:
    """b(k) = Binomial(N, k/N)(k) >= Binomial(N, q)(k) for every q: so E[e_t] <= 1 at any
    rate (the e-value's validity)."""
    k = np.arange(n_records + 1)
    log_b = max_binomial_log_pmf(k, n_records)
    grid = np.linspace(0.0, 1.0, 401)
    pmf = sps.binom.logpmf(k[None, :], n_records, grid[:, None])
    assert np.all(pmf <= log_b[None, :] - LOG_B_MARGIN / 2)  # rounding well inside the margin
    at_k = sps.binom.logpmf(k, n_records, k / n_records)  # the maximum, at q = k / N
    np.testing.assert_allclose(at_k, log_b - LOG_B_MARGIN, rtol=0, atol=1e-12)
    assert log_b[0] == log_b[-1] == LOG_B_MARGIN  # b(0) = b(N) = 1, raised by the margin


@pytest.mark.parametrize(("n_records", "rate"), [DIGITS, (20, 0.05), (100, 0.5), (60000, 0.01)])
def test_the_factor_has_mean_at_most_one_exactly(n_records: int, rate: float) -> None:
    """E[1 - lam + lam 1{n = m} / b(m)] = 1 - lam + lam p(m) / b(m) <= 1 given m (the past),
    and summed over m ~ p: 1 - lam + lam sum p^2 / b <= 1; with p in place of b it is 1."""
    k = np.arange(n_records + 1)
    p = sps.binom.pmf(k, n_records, rate)
    b = np.exp(max_binomial_log_pmf(k, n_records))
    lam = 0.5
    given = 1 - lam + lam * p / b
    assert np.all(given <= 1 + 1e-12)
    assert 1 - lam + lam * np.sum(p * p / b) <= 1.0
    exact = 1 - lam + lam * np.sum(np.where(p > 0, p * p / np.where(p > 0, p, 1.0), 0.0))
    assert math.isclose(exact, 1.0, rel_tol=1e-12)
    assert math.isclose(match_probability(n_records, rate), np.sum(p * p), rel_tol=1e-9)


def test_no_match_mass_is_its_recursion() -> None:
    d = no_match_mass(0.5, 50)
    ref = [0.0]
    for j in range(1, 50):
        ref.append(0.5 * (ref[-1] + 1.0 / (j * (j + 1))))
    np.testing.assert_allclose(d, ref, rtol=1e-14, atol=0)


def _enumerate(test: BatchRepeatTest, support: np.ndarray, p: np.ndarray, steps: int
               ) -> np.ndarray:
    """E[exp(log-wealth after each step)] over every sequence of ``steps`` iid sizes."""
    mean = np.zeros(steps)
    for seq in itertools.product(range(support.size), repeat=steps):
        test.reset()
        traj = test.update_with_trajectory(support[list(seq)])
        mean += np.prod(p[list(seq)]) * np.exp(traj)
    return mean


def test_the_mixture_is_a_martingale_by_exact_enumeration() -> None:
    """Every sequence of 5 steps of Binomial(3, 0.4) sizes (4^5 of them): with the e-values'
    denominator set to the pmf itself the mixture over lags and start times has mean exactly 1
    after every step (a test martingale); with b (any rate) its mean is at most 1."""
    N, q, T = 3, 0.4, 5
    support = np.arange(N + 1)
    p = sps.binom.pmf(support, N, q)
    test = BatchRepeatTest(N, q, 0.05, max_lag=4, epoch_multiples=2)
    valid = _enumerate(test, support, p, T)
    assert np.all(valid <= 1.0 + 1e-12) and valid[-1] < 0.999
    lo, _ = test._table
    test._table = (lo, np.log(p))  # the exact pmf as the denominator (its table covers 0..N)
    exact = _enumerate(test, support, p, T)
    np.testing.assert_allclose(exact, np.ones(T), rtol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 7, 200])
def test_the_class_equals_the_definition_chunk_by_chunk(chunk: int) -> None:
    N, q = DIGITS
    rng = np.random.default_rng(4)
    x = rng.binomial(N, q, (4, 150))
    x[1] = _reseeded(N, q, 7, seed=1)[:150]
    x[2, 60:] = x[2, 10:100]  # a replay of 50 steps later on
    x[3] = 63  # constant sizes
    ref = simulate_log_wealth(x, N, q)
    for r in range(x.shape[0]):
        test = BatchRepeatTest(N, q, 0.05)
        got = np.concatenate([test.update_with_trajectory(x[r, i:i + chunk])
                              for i in range(0, 150, chunk)])
        tol = 1e-13 * max(1.0, float(np.abs(ref[r]).max()))  # float64 sums of a few hundred
        np.testing.assert_allclose(got, ref[r], rtol=0, atol=tol)
        assert test.log_wealth == pytest.approx(got[-1], abs=tol)


def _type1(n_records: int, rate: float, runs: int, steps: int, alpha: float, seed: int,
           true_rate: float | None = None) -> tuple[float, float, float]:
    """(rejection rate, its bound alpha + 3 sd, mean final wealth and its 3-sd bound) on
    correct Poisson sizes, at ``true_rate`` where given (the test is told ``rate``)."""
    rng = np.random.default_rng(seed)
    hits, finals = 0, []
    for start in range(0, runs, 10_000):
        n = min(10_000, runs - start)
        x = rng.binomial(n_records, true_rate or rate, (n, steps))
        lw = simulate_log_wealth(x, n_records, rate)
        hits += int(np.sum(lw.max(axis=1) >= math.log(1 / alpha)))
        finals.append(np.exp(lw[:, -1]))
    w = np.concatenate(finals)
    return (hits / runs, alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs),
            float(w.mean()), 1 + 3 * float(w.std()) / math.sqrt(runs))


@pytest.mark.parametrize(("n_records", "rate"), [DIGITS, (20, 0.05), (100, 0.5)])
def test_type1_fast(n_records: int, rate: float) -> None:
    """500 correct runs of 100 steps at alpha = 0.05: rejections within alpha + 3 sd of the
    binomial, and the final wealth's mean within 3 standard errors of at most 1."""
    rate_hat, bound, mean, mean_bound = _type1(n_records, rate, 500, 100, 0.05, seed=11)
    assert rate_hat <= bound and mean <= mean_bound


def test_type1_fast_at_another_rate_than_the_one_given() -> None:
    """The e-values hold at any rate: sizes at 1.5 q (a rate the test is not told) keep the
    level."""
    rate_hat, bound, mean, mean_bound = _type1(*DIGITS, 500, 100, 0.05, seed=12,
                                               true_rate=1.5 / 23)
    assert rate_hat <= bound and mean <= mean_bound


@pytest.mark.slow
@pytest.mark.parametrize(("n_records", "rate", "true_rate"),
                         [(*DIGITS, None), (20, 0.05, None), (*DIGITS, 0.7 / 23)])
def test_type1_slow(n_records: int, rate: float, true_rate: float | None) -> None:
    """10^5 correct runs of 100 steps at alpha = 1e-3 (the audit's proof level)."""
    rate_hat, bound, mean, mean_bound = _type1(n_records, rate, 100_000, 100, 1e-3, seed=13,
                                               true_rate=true_rate)
    assert rate_hat <= bound and mean <= mean_bound


@pytest.mark.parametrize(("n_records", "rate"), [DIGITS, (60000, 1 / 235), (50000, 1 / 781),
                                                 (20, 0.05)])
def test_a_loader_reseeded_every_epoch_is_proven_within_two_epochs(n_records: int,
                                                                  rate: float) -> None:
    """The same epoch of Poisson sizes again: decided at alpha = 1e-3 before the end of the
    second epoch (for N = 20, q = 0.05 most sizes are 0 or 1, which carry little evidence:
    within four epochs)."""
    steps = int(1 / rate)
    epochs = 4 if n_records == 20 else 2
    for seed in range(3):
        test = BatchRepeatTest(n_records, rate, 1e-3)
        test.update(_reseeded(n_records, rate, epochs, seed))
        assert test.rejected and steps < test.rejected_at <= epochs * steps
        if n_records > 20:
            assert test.best_lag()["lag"] == steps
            assert test.rejected_at <= steps + 15


@pytest.mark.parametrize(("every", "epoch"), [(1, 34), (1, 12), (3, None), (5, None),
                                              (2, 100)])
def test_other_periods_are_proven_within_two_periods(every: int, epoch: int | None) -> None:
    """Re-seeded every k epochs, or with epochs of another length than 1/q: decided within two
    periods of the first repeat."""
    N, q = DIGITS
    period = every * (epoch or 23)
    test = BatchRepeatTest(N, q, 1e-3)
    test.update(_reseeded(N, q, 2 * every + 2, seed=5, every=every, epoch=epoch))
    assert test.rejected and period < test.rejected_at <= 2 * period
    assert test.best_lag()["lag"] == period


def test_a_late_replay_and_fixed_sizes_are_found_quickly() -> None:
    N, q = DIGITS
    rng = np.random.default_rng(6)
    fresh = rng.binomial(N, q, 1000)
    test = BatchRepeatTest(N, q, 1e-3)
    test.update(fresh)
    assert not test.rejected
    test.update(fresh[:40])  # a resumed run replays its first steps: lag 1000
    assert test.rejected and test.rejected_at <= 1000 + 15
    assert test.best_lag()["lag"] == 1000
    fixed = BatchRepeatTest(N, q, 1e-3)
    fixed.update([63] * 22 + [51])
    assert fixed.rejected and fixed.rejected_at <= 10


def test_rate_one_is_never_evidence() -> None:
    test = BatchRepeatTest(50, 1.0, 0.05, max_lag=8)
    traj = test.update_with_trajectory([50] * 40)  # every bet wins 1 / b(N) = 1 - 1e-8
    assert np.all(traj <= 0.0) and np.all(traj > -1e-6)
    assert not test.rejected and test.epoch_lengths == []


def test_state_dict_round_trip_and_summary() -> None:
    N, q = DIGITS
    x = _reseeded(N, q, 3, seed=2)
    test = BatchRepeatTest(N, q, 0.01)
    test.update(x[:30])
    again = BatchRepeatTest(N, q, 0.01)
    again.load_state_dict(test.state_dict())
    np.testing.assert_array_equal(test.update_with_trajectory(x[30:]),
                                  again.update_with_trajectory(x[30:]))
    s = again.summary()
    assert s["test"] == "batch_repeat" and s["rejected"] and s["epoch_lengths"] == [23]
    assert s["best_lag"]["lag"] == 23 and s["best_lag"]["matches"] == s["best_lag"]["bets"] == 46
    assert s["lags_tested"] == MAX_LAG and s["n_steps"] == 69
    with pytest.raises(ValueError, match="different configuration"):
        BatchRepeatTest(N, q, 0.05).load_state_dict(test.state_dict())
    sd = test.state_dict()
    sd["x"] = sd["x"][:3]
    with pytest.raises(ValueError, match="does not fit"):
        BatchRepeatTest(N, q, 0.01).load_state_dict(sd)


def test_a_large_wealth_is_kept_in_scale() -> None:
    """A replay over thousands of steps: the excess is rescaled, the log-wealth stays finite
    and equal to the definition's."""
    N, q = 60000, 0.5
    x = np.tile(np.random.default_rng(3).binomial(N, q, 2), 400)[None, :]  # period 2
    ref = simulate_log_wealth(x, N, q, max_lag=4)
    test = BatchRepeatTest(N, q, 0.05, max_lag=4)
    got = test.update_with_trajectory(x[0])
    assert ref[0, -1] > 1000 and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref[0], rtol=1e-12)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"stake": 1.0}, ValueError, "stake"), ({"stake": 0.0}, ValueError, "stake"),
    ({"max_lag": 0}, ValueError, "max_lag"), ({"epoch_multiples": 1.5}, TypeError, "epoch"),
    ({"alpha": 2.0}, ValueError, "alpha"), ({"rate": 0.0}, ValueError, "rate"),
    ({"n_records": 0}, ValueError, "n_records"), ({"n_records": 2.5}, TypeError, "n_records")])
def test_bad_config(kwargs: dict, exc: type, match: str) -> None:
    args = {"n_records": 100, "rate": 0.1, "alpha": 0.05, **kwargs}
    with pytest.raises(exc, match=match):
        BatchRepeatTest(**args)


@pytest.mark.parametrize(("bad", "exc", "match"), [
    ([1.5], ValueError, "integers"), ([-1], ValueError, ">= 0"), ([101], ValueError, "<= n_rec"),
    (["a"], TypeError, "integers")])
def test_bad_batch_sizes(bad: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        BatchRepeatTest(100, 0.1, 0.05).update(bad)
    with pytest.raises(exc, match=match):
        simulate_log_wealth(np.array([bad]), 100, 0.1)
    with pytest.raises(ValueError, match="runs, steps"):
        simulate_log_wealth(np.array([1, 2]), 100, 0.1)
