"""The one-run monitor (dpaudit_torch/audit/monitors/one_run.py): running scores of the one-run
canaries of hand-made records, the coins revealed at finalize, the whole-run bounds, the power
statement and the report contribution; its checkpoint state."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord, build_monitors
from dpaudit_torch.audit.monitors import OneRunMonitor
from dpaudit_torch.canaries import SecretCoins
from dpaudit_torch.contract import EPSILON_OF_SIGMA, NOISE_MULTIPLIER, SAMPLE_RATE
from dpaudit_torch.registry import methods_of
from dpaudit_torch.stats.one_run_scores import llr_step_score

K, M = 2, 200
Q, T, SIGMA = 0.5, 40, 2.0


def eps_of_sigma(sigma: float, steps: int) -> float:
    """A stand-in for the claim's accountant (decreasing in sigma)."""
    return 3.0 / sigma


def _monitor(facts: dict[Any, Any] | None = None, seed: int = 0, m: int = M,
             **options: Any) -> tuple[OneRunMonitor, list[str], SecretCoins]:
    warned: list[str] = []
    coins = SecretCoins(m, torch.Generator().manual_seed(seed))
    # the guess-based bounds at 0.05, the level these tests are written at (the audit's default
    # gives them an eighth of alpha = 1e-3: docs/design.md section 14); the white-box bound at
    # its share
    options.setdefault("alpha", 0.05)
    cfg = AuditConfig(k_pairs=K, m_canaries=m, monitor_options={"one_run": options})
    ctx = MonitorContext(config=cfg, k_pairs=K, m_canaries=m, device="cpu", warn=warned.append,
                         coins=coins,
                         facts={SAMPLE_RATE: Q, EPSILON_OF_SIGMA: eps_of_sigma}
                         if facts is None else facts)
    mon = build_monitors(ctx, ("one_run",))["one_run"]
    assert isinstance(mon, OneRunMonitor)
    return mon, warned, coins


def _records(coins: SecretCoins, n: int, noise: float, seed: int, sigma: float = SIGMA,
             start: int = 1, device_flags: bool = False) -> list[StepRecord]:
    """n steps of the one-run game: an IN canary (the secret coin) is present at a step with
    probability Q and then adds 1 (units of C); the noise has std ``noise`` (= sigma: correct).
    Read the coins without revealing them, as the injector does."""
    g = torch.Generator().manual_seed(seed)
    inside = coins.sampling_mask()
    out = []
    for t in range(n):
        v = noise * torch.randn(2 * K + coins.m, generator=g, dtype=torch.float64)
        v[2 * K:] += (inside & (torch.rand(coins.m, generator=g) < Q)).double()
        out.append(StepRecord(step=start + t, values=v, x=v[:K].clone(), y=v[K:2 * K].clone(),
                              coins=torch.tensor([True, False]), sigma=sigma,
                              sigma_claimed=sigma,
                              finite=torch.tensor(True) if device_flags else True))
    return out


def _played(noise: float = SIGMA, claimed: float = 1.5, **kw: Any
            ) -> tuple[OneRunMonitor, list[str], SecretCoins]:
    mon, warned, coins = _monitor(**kw)
    for r in _records(coins, T, noise, seed=1):
        mon.observe(r)
    mon.finalize(claimed)
    return mon, warned, coins


# ------------------------------------------------------------------ scores
def test_running_scores_are_the_sum_and_the_likelihood_ratio() -> None:
    mon, _, coins = _monitor()
    recs = _records(coins, 12, SIGMA, seed=2)
    for r in recs:
        mon.observe(r)
    assert mon.steps == 12 and mon.sigmas == {SIGMA}
    z = torch.stack([r.one_run for r in recs])
    np.testing.assert_allclose(mon.scores["sum"].numpy(), z.sum(0).numpy(), rtol=1e-12)
    llr = sum(llr_step_score(r.one_run, Q, SIGMA) for r in recs)
    np.testing.assert_allclose(mon.scores["llr"].numpy(), llr.numpy(), rtol=1e-12)
    stacked = mon.stacked_scores()
    assert stacked.shape == (2, M) and stacked.dtype == torch.float64
    stacked.zero_()  # a copy
    assert mon.scores["sum"].abs().sum() > 0
    assert mon.advance() is None  # no evidence during training
    assert not coins.revealed  # scoring never looks at the coins


def test_host_and_device_scoring_paths_agree() -> None:
    """The CPU path scores pending steps together; records with a deferred (device) finiteness
    flag are scored one by one in torch: the same scores."""
    a, _, coins_a = _monitor()
    b, _, coins_b = _monitor()
    for ra, rb in zip(_records(coins_a, 13, SIGMA, seed=3),
                      _records(coins_b, 13, SIGMA, seed=3, device_flags=True)):
        a.observe(ra)
        b.observe(rb)
    for score in ("sum", "llr"):
        np.testing.assert_allclose(a.scores[score].numpy(), b.scores[score].numpy(),
                                   rtol=1e-12, atol=1e-12)


def test_a_step_flagged_non_finite_on_the_device_adds_no_likelihood_ratio() -> None:
    mon, _, coins = _monitor()
    (rec,) = _records(coins, 1, SIGMA, seed=4)
    rec.finite = torch.tensor(False)
    mon.observe(rec)
    assert mon.scores["llr"].abs().sum() == 0.0 and mon.steps == 1


# ------------------------------------------------------------------ finalize
def test_finalize_reveals_the_coins_and_computes_the_bounds() -> None:
    mon, warned, coins = _monitor()
    for r in _records(coins, T, SIGMA, seed=1):
        mon.observe(r)
    with pytest.raises(RuntimeError, match="only after finalize"):
        mon.report_section()
    assert not coins.revealed
    mon.finalize(1.5)
    assert coins.revealed and mon.score_used == "llr"
    assert set(mon.bounds) == set(methods_of("one_run")) == {"whitebox", "steinke", "fdp"}
    assert all(b > 0 for b in mon.bounds.values())
    for method, d in mon.details.items():
        assert d["bound"] == mon.bounds[method] and d["method"] == method
        # the guess-based tests rank the configured score; the white-box bound uses the sums
        assert d["score"] == ("sum" if method == "whitebox" else "llr")
    assert mon.details["whitebox"]["family_verified"] is True
    assert not warned


def test_contribution_bounds_scores_power_and_in_count() -> None:
    mon, _, coins = _played()
    inside = coins.reveal()
    c = mon.contribution()
    assert c.section is None and c.verdict is None
    assert list(c.bounds) == ["whitebox", "steinke", "fdp"]
    assert c.bounds["steinke"] == (mon.bounds["steinke"], mon.details["steinke"])
    assert set(c.fields) == {"one_run_scores", "power"}
    scores = mon.scores["llr"]
    assert c.fields["one_run_scores"] == {"in": scores[inside].tolist(),
                                          "out": scores[~inside].tolist()}
    assert c.canaries == {"one_run_in": int(inside.sum())}
    assert len(c.fields["one_run_scores"]["in"]) == c.canaries["one_run_in"]
    assert c.fields["power"] == mon.power


def test_power_statement() -> None:
    calls: list[tuple[float, int]] = []

    def accountant(sigma: float, steps: int) -> float:
        calls.append((sigma, steps))
        return eps_of_sigma(sigma, steps)

    mon, _, _ = _played(facts={SAMPLE_RATE: Q, EPSILON_OF_SIGMA: accountant})
    p = mon.power
    assert (p["sigma"], p["q"], p["steps"], p["m"]) == (SIGMA, Q, T, M)
    # the power statement is the default (white-box) bound's: exact, no simulated runs
    assert p["method"] == "whitebox" and p["mode"] == "law" and p["replicates"] is None
    assert p["claimed_epsilon"] == 1.5 and p["score"] == "sum"
    assert p["mean_inclusions"] == pytest.approx(Q * T) and "seconds" not in p
    assert p["expected_bound"] > 0 and p["no_power"] is False
    # this test's accountant claims 1.5, below the PRV epsilon of the release at SIGMA (about
    # 3.2), so the white-box bound refutes it even with more noise than SIGMA; the refutable
    # epsilon is the run's accountant's at that noise
    from dpaudit_torch.stats.whitebox import dpsgd_epsilon

    assert dpsgd_epsilon(SIGMA, Q, T, 1e-5, "lower") > 1.5
    assert p["min_refutable_sigma"] > SIGMA
    assert p["min_refutable_epsilon"] == pytest.approx(eps_of_sigma(p["min_refutable_sigma"], T))
    assert calls and all(steps == T for _, steps in calls)


def test_power_statement_without_the_accountant() -> None:
    """EPSILON_OF_SIGMA unavailable: the expected bound is still stated (the white-box bound
    maps its noise level with the PRV accountant either way); the refutable epsilon is the PRV
    accountant's, and the note says so."""
    with_acc, _, _ = _played()
    mon, warned, _ = _played(facts={SAMPLE_RATE: Q})
    p = mon.power
    assert p["expected_bound"] == with_acc.power["expected_bound"] > 0
    assert p["expected_bound_quantiles"] == with_acc.power["expected_bound_quantiles"]
    assert p["min_refutable_sigma"] == with_acc.power["min_refutable_sigma"]
    assert "no epsilon_of_sigma given" in p["note"]
    assert mon.bounds == with_acc.bounds and not warned


def test_too_little_noise_gives_a_higher_bound_than_a_correct_run() -> None:
    correct, _, _ = _played(SIGMA)
    leaky, _, _ = _played(SIGMA / 10)
    assert leaky.bounds["steinke"] > correct.bounds["steinke"] + 0.5
    assert leaky.bounds["steinke"] > 1.5 > correct.bounds["steinke"]  # refutes a claim of 1.5


def test_the_score_can_be_the_plain_sum() -> None:
    mon, _, _ = _played(one_run_score="sum")
    assert mon.settings.one_run_score == "sum" and mon.score_used == "sum"
    assert mon.details["steinke"]["score"] == "sum" and mon.details["fdp"]["score"] == "sum"


def test_a_step_without_noise_falls_back_to_the_sum() -> None:
    mon, warned, coins = _monitor()
    recs = _records(coins, 5, SIGMA, seed=5)
    recs[2].sigma = 0.0  # a step that claimed no noise: the likelihood ratio is undefined
    for r in recs:
        mon.observe(r)
    mon.finalize(1.5)
    assert mon.score_used == "sum" and any("plain sum was used" in w for w in warned)
    assert mon.power["note"] == ("no noise multiplier was claimed: the power statement is not "
                                 "defined")
    assert mon.power["expected_bound"] is None and mon.power["min_refutable_epsilon"] is None


def test_no_steps_no_bound() -> None:
    mon, warned, coins = _monitor()
    mon.finalize(1.0)
    assert coins.revealed and mon.bounds == {"whitebox": 0.0, "steinke": 0.0, "fdp": 0.0}
    assert all("no audited steps" in d["note"] for d in mon.details.values())
    assert mon.power["no_power"] is True
    assert any("no power" in w for w in warned)
    assert mon.contribution().bounds["fdp"][0] == 0.0


def test_no_steps_power_says_no_step_was_audited_with_the_claimed_sigma() -> None:
    """finalize() after 0 steps: the note says that no training step was audited (not that no
    noise multiplier was claimed), and the power statement carries the optimizer's sigma."""
    mon, _, _ = _monitor(facts={SAMPLE_RATE: Q, EPSILON_OF_SIGMA: eps_of_sigma,
                                NOISE_MULTIPLIER: 1.25})
    mon.finalize(None)
    p = mon.power
    assert p["note"] == "no training step was audited: the power statement is not defined"
    assert p["sigma"] == 1.25 and p["steps"] == 0 and p["no_power"] is True
    assert p["expected_bound"] is None and p["min_refutable_epsilon"] is None
    # without the fact the note is the same: the missing steps are what matters
    bare, _, _ = _monitor(facts={SAMPLE_RATE: Q})
    bare.finalize(None)
    assert bare.power["note"] == p["note"]


# ------------------------------------------------------------------ checkpoint
def test_state_round_trip_gives_the_same_results() -> None:
    mon, _, coins = _monitor(seed=7)
    recs = _records(coins, T, SIGMA / 2, seed=8)
    for r in recs[:17]:
        mon.observe(r)  # some steps still pending a scoring pass
    sd = mon.state_dict()
    assert sd["steps"] == 17 and sd["sigmas"] == [SIGMA]
    again, _, _ = _monitor(seed=7)
    again.load_state_dict(sd)
    for m in (mon, again):
        for r in recs[17:]:
            m.observe(r)
        m.finalize(1.5)
    assert torch.equal(mon.stacked_scores(), again.stacked_scores())
    assert mon.bounds == again.bounds and mon.power == again.power
    assert mon.contribution() == again.contribution()


def test_state_of_another_canary_count_is_refused() -> None:
    mon, _, _ = _monitor()
    other, _, _ = _monitor(m=M + 1)
    with pytest.raises(ValueError, match=f"does not fit m={M + 1}"):
        other.load_state_dict(mon.state_dict())
    assert other.steps == 0 and math.isclose(float(other.scores["sum"].sum()), 0.0)


def test_the_white_box_family_check_sees_the_kept_per_step_values() -> None:
    """The monitor keeps every canary's per-step values and the white-box family check runs the
    whole-null tests on the OUT canaries' rows (value_steps = the steps observed)."""
    import numpy as np

    from dpaudit_torch.audit.monitors.one_run import OneRunMonitor

    mon = OneRunMonitor.__new__(OneRunMonitor)
    mon.m, mon.device, mon._trace, mon._trace_n, mon._trace_cap = 3, torch.device("cpu"), [], 0, 2
    mon._pending_sigma = []
    for v in ([1.0, 2.0, 3.0], np.array([4.0, 5.0, 6.0]), [7.0, 8.0, 9.0]):
        mon._keep(torch.tensor(v) if isinstance(v, list) else v)
    tr = mon.trace()
    assert tr.dtype == np.float32 and tr.tolist() == [[1, 2, 3], [4, 5, 6]]  # the cap: 2 steps
