"""The sampling monitor (dpaudit_torch/audit/monitors/sampling.py): the real batch sizes of
hand-made step records tested against Binomial(N, q), as the Opacus adapter would hand them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord, build_monitors
from dpaudit_torch.audit.monitors import SamplingMonitor
from dpaudit_torch.canaries import SecretCoins
from dpaudit_torch.contract import N_REAL_NOT_OBSERVED, N_RECORDS, SAMPLE_RATE
from dpaudit_torch.stats.sampling import rate_interval

K, M = 2, 4
N, Q = 256, 0.125  # 32 examples per step on average
CHECK = 5


def _monitor(facts: dict[Any, Any] | None = None, **options: Any) -> SamplingMonitor:
    # alpha 0.1: the decision's share, the sampling test's level, is 0.05 (docs/design.md
    # section 14), the level these tests are written at
    cfg = AuditConfig(k_pairs=K, m_canaries=M, alpha=0.1, monitor_options={"sampling": options})
    warned: list[str] = []
    ctx = MonitorContext(config=cfg, k_pairs=K, m_canaries=M, device="cpu", warn=warned.append,
                         coins=SecretCoins(M, torch.Generator().manual_seed(0)),
                         facts={SAMPLE_RATE: Q, N_RECORDS: N} if facts is None else facts)
    mon = build_monitors(ctx, ("sampling",))["sampling"]
    assert isinstance(mon, SamplingMonitor)
    return mon


def _rec(step: int, n_real: int | None, finite: bool | torch.Tensor = True) -> StepRecord:
    v = torch.zeros(2 * K + M, dtype=torch.float64)
    return StepRecord(step=step, values=v, x=v[:K], y=v[K:2 * K],
                      coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                      n_real=n_real, finite=finite)


def _poisson(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).binomial(N, Q, n).tolist()


def _feed(mon: SamplingMonitor, sizes: list[int], start: int = 1) -> list[Any]:
    """Observe the sizes, advancing every CHECK steps; the evidence of every check."""
    out = []
    for i, n in enumerate(sizes):
        mon.observe(_rec(start + i, n))
        if (start + i) % CHECK == 0:
            out.append(mon.advance())
    return out


def test_buffers_batch_sizes_and_bets_on_them_at_each_check() -> None:
    mon = _monitor()
    assert mon.rate == Q and mon.n_records == N and mon.reason_off is None
    for t, n in enumerate([30, 35, 28], start=1):
        mon.observe(_rec(t, n))
    assert mon.test.n_steps == 0  # nothing processed before the check
    ev = mon.advance()
    assert ev is not None and ev.steps == [1, 2, 3] and ev.log_e.shape == (3,)
    assert ev.extra == {} and np.all(np.isfinite(ev.log_e))
    assert mon.test.n_steps == 3 and mon.test.total == 93
    # the monitor's e-process: the average of the batch-size and the repeat tests' (3/4, 1/4)
    both = np.logaddexp(mon.test.log_wealth + math.log(0.75),
                        mon.repeats.test.log_wealth + math.log(0.25))
    assert ev.log_e[-1] == pytest.approx(both, rel=1e-12)
    assert mon.repeats.test.n_steps == 3
    assert mon.advance() is None  # nothing buffered since
    assert mon.rate_interval(0.05) == pytest.approx(rate_interval(93, N, 3, 0.05))


def test_steps_flagged_non_finite_on_the_device_are_left_out() -> None:
    mon = _monitor()
    mon.observe(_rec(1, 30))
    mon.observe(_rec(2, 31, finite=torch.tensor(False)))
    mon.observe(_rec(3, 33, finite=torch.tensor(True)))
    ev = mon.advance()
    assert ev is not None and ev.steps == [1, 3] and mon.test.total == 63
    mon.observe(_rec(4, 32, finite=torch.tensor(False)))
    assert mon.advance() is None  # every buffered step dropped


def test_correct_poisson_sizes_give_no_finding_and_a_section() -> None:
    mon = _monitor()
    sizes = _poisson(100, seed=3)
    _feed(mon, sizes)
    assert mon.findings() == [] and not mon.test.rejected
    c = mon.contribution()
    assert c.bounds == {} and c.fields == {} and c.canaries == {} and c.verdict is None
    sec = c.section
    assert sec is not None
    assert (sec["rate"], sec["n_records"], sec["run"], sec["reason_not_run"]) == (Q, N, True, None)
    assert sec["n_steps"] == 100 and sec["mean_batch_size"] == pytest.approx(np.mean(sizes))
    assert sec["rejected"] is False and sec["rejected_at"] is None
    lo, hi = sec["rate_interval"]
    assert lo < Q < hi
    assert sec["rate_interval"] == pytest.approx(list(rate_interval(sum(sizes), N, 100, 0.05)))


def test_fixed_size_batches_are_rejected_quickly() -> None:
    """The power check: a loader that always gives N q = 32 examples (a shuffled loader) is
    decided within 50 steps."""
    mon = _monitor()
    evidence = _feed(mon, [32] * 50)
    assert mon.test.rejected and mon.test.rejected_at <= 50
    log_e = np.concatenate([e.log_e for e in evidence])
    assert log_e[-1] >= math.log(20.0)
    # constant sizes also repeat at every lag: the repeat test's finding comes second
    f, again = mon.findings()
    assert f.monitor == "sampling" and f.level == "violation" and f.where == "data loader"
    assert f.scope is None and "not Poisson samples" in f.message
    assert again.level == "violation" and "repeat with a period of 1 steps" in again.message
    assert (f"its own anytime-valid test crossed 1/alpha at training step "
            f"{mon.test.rejected_at};" in f.message)  # attached at step 0: the same count
    assert mon.rejected_step == mon.test.rejected_at
    assert "q = 0.125" in f.message and "N = 256" in f.message
    assert mon.contribution().section["rejected"] is True


def test_the_message_names_the_training_step_of_the_crossing() -> None:
    """Attached at training step 100, with a step dropped as non-finite: the test's own count
    (its rejected_at) and the training step differ, and the message gives the training step
    (the verdict's step is the check of the decision, which may come later: it says so)."""
    mon = _monitor()
    step, fed = 100, 0
    while not mon.test.rejected and fed < 60:
        for _ in range(CHECK):
            step += 1
            mon.observe(_rec(step, 32, finite=torch.tensor(step != 102)))
        mon.advance()
        fed += CHECK
    n = mon.test.rejected_at
    assert n is not None
    # steps 101, 103, 104, ...: the n-th step the test saw is training step 101 + n
    assert mon.rejected_step == 101 + n
    f = mon.findings()[0]
    assert n == 16  # the seeds are fixed
    assert ("crossed 1/alpha at training step 117, the 16th step it saw; the audit decides at "
            "its checks" in f.message)
    assert "verdict's step may differ" in f.message
    # a state written before the training step was kept: the message falls back to the count
    sd = mon.state_dict()
    del sd["rejected_step"]
    again = _monitor()
    again.load_state_dict(sd)
    assert again.rejected_step is None
    assert f"crossed 1/alpha after {n} steps;" in again.findings()[0].message


def test_alpha_comes_from_the_audit_or_the_monitors_options() -> None:
    assert _monitor().test.alpha == 0.05
    strict = _monitor(alpha=0.001)
    assert strict.settings.alpha == 0.001 and strict.test.alpha == 0.001


def test_correct_sizes_are_rarely_rejected_over_seeded_runs() -> None:
    """Type I: 40 seeded runs of 100 Poisson batch sizes each; at most n alpha + 3 sd of the
    binomial rejections (Ville's inequality bounds each run's rejection probability by alpha)."""
    runs, alpha = 40, 0.05
    rejected = 0
    for seed in range(runs):
        mon = _monitor()
        _feed(mon, _poisson(100, seed=100 + seed))
        rejected += int(mon.test.rejected)
    assert rejected <= runs * alpha + 3 * math.sqrt(runs * alpha * (1 - alpha))


def test_without_the_dataset_size_it_does_not_run_and_says_why() -> None:
    mon = _monitor({SAMPLE_RATE: Q})
    assert mon.test is None and mon.n_records is None
    _feed(mon, [32] * 10)
    assert mon.advance() is None and mon.findings() == [] and mon.rate_interval(0.05) is None
    sec = mon.contribution().section
    assert sec == {"rate": Q, "n_records": None, "run": False,
                   "reason_not_run": "the number of records N that Poisson sampling draws "
                                     "from is unknown: the number of records training samples "
                                     "from: not given to this audit"}
    bare = _monitor({})  # no rate either: taken as 1
    assert bare.rate == 1.0 and bare.contribution().section["run"] is False


def test_without_batch_sizes_it_does_not_run_and_says_why() -> None:
    mon = _monitor()
    mon.observe(_rec(1, None))  # sharded ghost clipping: no per-example count
    mon.observe(_rec(2, 32))
    assert mon.test is None and mon.advance() is None and mon.findings() == []
    sec = mon.contribution().section
    assert sec["run"] is False and sec["reason_not_run"] == N_REAL_NOT_OBSERVED


def test_state_round_trip_gives_the_same_later_results() -> None:
    sizes = _poisson(33, seed=5) + [32] * 60
    mon = _monitor()
    _feed(mon, sizes[:23])  # steps 21..23 still buffered
    sd = mon.state_dict()
    assert [b[0] for b in sd["buffer"]] == [21, 22, 23]
    again = _monitor()
    again.load_state_dict(sd)
    ev1 = _feed(mon, sizes[23:], start=24)
    ev2 = _feed(again, sizes[23:], start=24)
    assert ev1[0].steps == ev2[0].steps == [21, 22, 23, 24, 25]
    for a, b in zip(ev1, ev2):
        np.testing.assert_array_equal(a.log_e, b.log_e)
    assert mon.findings() == again.findings() and mon.findings()
    assert mon.contribution() == again.contribution()


def test_state_of_a_monitor_that_did_not_run() -> None:
    off = _monitor({SAMPLE_RATE: Q})
    sd = off.state_dict()
    assert sd["test"] is None
    with pytest.raises(ValueError, match="dataset size unknown"):
        _monitor({SAMPLE_RATE: Q}).load_state_dict(_monitor().state_dict())
    on = _monitor()
    on.load_state_dict(sd)  # a state written without the test: it stays off
    assert on.test is None and on.contribution().section["run"] is False
    assert on.contribution().section["reason_not_run"] == off.reason_off


def _replayed(epochs: int, period: int = 8, seed: int = 7) -> list[int]:
    """The sizes of a loader re-seeded at every epoch of ``period`` steps."""
    return _poisson(period, seed) * epochs


def test_replayed_batches_are_a_finding_of_the_repeat_test() -> None:
    """Poisson sizes, the same epoch again: the batch-size test sees nothing wrong, the repeat
    test finds the period (q = 1/8: epochs of 8 steps) within the second epoch."""
    mon = _monitor(alpha=0.001)
    _feed(mon, _replayed(4))
    assert not mon.test.rejected
    (f,) = mon.findings()
    assert f.monitor == "sampling" and f.level == "violation" and f.where == "data loader"
    assert "not drawn afresh" in f.message
    assert "period of 8 steps, one epoch of 8 steps" in f.message
    assert mon.repeats.rejected_step is not None and 8 < mon.repeats.rejected_step <= 16
    assert f"training step {mon.repeats.rejected_step};" in f.message
    sec = mon.contribution().section["repeats"]
    assert sec["rejected"] and sec["best_lag"]["lag"] == 8 and sec["weight"] == 0.25
    assert sec["epoch_lengths"] == [8]


def test_a_step_dropped_as_non_finite_is_left_out_of_both_tests() -> None:
    """A non-finite step leaves both tests (as on the host path, which never buffers it): the
    period shifts by one for one period, and the repeat is still found."""
    mon = _monitor(alpha=0.001)
    sizes = _replayed(3)
    for t, n in enumerate(sizes, start=1):
        mon.observe(_rec(t, n, finite=torch.tensor(t != 12)))
        if t % CHECK == 0:
            ev = mon.advance()
            assert 12 not in ev.steps
    assert mon.repeats.test.n_steps == 19 and mon.test.n_steps == 19
    assert mon.repeats.test.best_lag()["lag"] in (7, 8)  # 7 right after the dropped step


def test_a_state_written_before_the_repeat_test_resumes_without_it() -> None:
    mon = _monitor()
    _feed(mon, _poisson(12, seed=8))
    sd = mon.state_dict()
    again = _monitor()
    again.load_state_dict(sd)
    assert again.repeats is not None and again.repeats.test.n_steps == 10
    del sd["repeats"]
    old = _monitor()
    old.load_state_dict(sd)
    assert old.repeats is None and old.test.n_steps == 10
    ev = _feed(old, _poisson(8, seed=9), start=13)[-1]
    np.testing.assert_allclose(ev.log_e[-1], old.test.log_wealth)  # the batch-size test alone
    assert "repeats" not in old.contribution().section
