"""The sequential pairs monitor (dpaudit_torch/audit/monitors/sequential_pairs.py): hand-made
records of a per-step Gaussian mechanism fed to its testers; its evidence, findings, report
contribution, segments, interference diagnostic and checkpoint state."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import gaussian_step_records

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord, build_monitors
from dpaudit_torch.audit.config import DEFAULT_NULL_GRID
from dpaudit_torch.audit.monitors import SequentialPairsMonitor, per_step_null_grid
from dpaudit_torch.canaries import SecretCoins
from dpaudit_torch.contract import NOISE_MULTIPLIER
from dpaudit_torch.registry import ONE_STEP
from dpaudit_torch.stats.thresholds import gaussian_profile_grid

K, M = 4, 8
CHECK = 5


def _records(n: int, sigma: float, noise: float, seed: int, start: int = 1,
             real: bool = False) -> list[StepRecord]:
    """n steps of a per-step Gaussian mechanism (conftest's ``gaussian_step_records``)."""
    return gaussian_step_records(n, K, M, sigma, noise, seed, start, real)


def _monitor(sigma: float | None = 1.0, **cfg: Any) -> tuple[SequentialPairsMonitor, list[str]]:
    warned: list[str] = []
    # alpha 0.1: the decision's share, the pairs' level, is 0.05 (docs/design.md section 14),
    # the level these tests are written at
    ctx = MonitorContext(config=AuditConfig(k_pairs=K, m_canaries=M, **{"alpha": 0.1, **cfg}),
                         k_pairs=K,
                         m_canaries=M, device="cpu", warn=warned.append,
                         coins=SecretCoins(M, torch.Generator().manual_seed(0)),
                         facts={} if sigma is None else {NOISE_MULTIPLIER: sigma})
    mon = build_monitors(ctx, ("sequential_pairs",))["sequential_pairs"]
    assert isinstance(mon, SequentialPairsMonitor)
    return mon, warned


def _feed(mon: SequentialPairsMonitor, recs: list[StepRecord]) -> list[Any]:
    out = []
    for r in recs:
        mon.observe(r)
        if r.step % CHECK == 0:
            out.append(mon.advance())
    return out


# ------------------------------------------------------------------ the per-step null
def test_per_step_null_grid_is_the_gaussian_profile() -> None:
    eps, dels = per_step_null_grid(2.0)
    assert eps.tolist() == [c / 2.0 for c in DEFAULT_NULL_GRID]
    np.testing.assert_array_equal(dels, gaussian_profile_grid(2.0, eps))
    assert np.all(np.diff(dels) < 0) and np.all((dels > 0) & (dels < 1))
    eps2, _ = per_step_null_grid(1.0, grid=(1.0, 4.0))
    assert eps2.tolist() == [1.0, 4.0]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="noise multiplier must be a finite number > 0"):
            per_step_null_grid(bad)


def test_starts_from_the_adapters_noise_multiplier_or_by_hand() -> None:
    mon, _ = _monitor(1.5)
    assert len(mon.segments) == 1 and mon.segment.sigma == 1.5
    assert set(mon.segment.testers) == {"mmd", "hockey_stick"}
    assert mon.segment.null["type"] == "gaussian_profile"
    assert mon.segment.epsilons == pytest.approx([c / 1.5 for c in DEFAULT_NULL_GRID])
    bare, _ = _monitor(None)  # no adapter: the owner starts it
    assert bare.segments == []
    bare.start(1.0, start_step=3)
    assert bare.segment.sigma == 1.0 and bare.segment.start_step == 3
    hs, _ = _monitor(tests=("hockey_stick",))
    assert list(hs.segment.testers) == ["hockey_stick"]
    assert hs.columns() == ("epsilon_lower_bound", "hockey_stick")


def test_columns_and_metric_names() -> None:
    mon, _ = _monitor()
    assert mon.columns() == ("epsilon_lower_bound", "mmd", "hockey_stick")
    assert mon.metric_name("epsilon_lower_bound") == "epsilon_lower_bound_sequential"
    assert mon.metric_name("mmd") == "log_wealth_mmd"


# ------------------------------------------------------------------ observe / advance
def test_observe_copies_the_pairs_and_advance_feeds_them() -> None:
    mon, _ = _monitor()
    recs = _records(3, 1.0, 1.0, seed=1)
    kept = [r.x.clone() for r in recs]
    for r in recs:
        mon.observe(r)
        r.x.fill_(99.0)  # the adapter's buffer overwritten by the next step
    assert mon.pending_steps == [1, 2, 3]
    assert all(torch.equal(a, b) for a, b in zip(mon.buffer_x, kept))
    ev = mon.advance()
    assert ev is not None and ev.steps == [1, 2, 3] and ev.log_e.shape == (3,)
    assert set(ev.extra) == {"epsilon_lower_bound", "mmd", "hockey_stick"}
    assert all(v.shape == (3,) for v in ev.extra.values())
    assert mon.log_wealth == ev.log_e[-1] and mon.pending_steps == []
    assert mon.test_log_wealth == {t: float(ev.extra[t][-1]) for t in ("mmd", "hockey_stick")}
    # the monitor's e-process is the average of its testers'
    both = np.stack([ev.extra["mmd"], ev.extra["hockey_stick"]])
    np.testing.assert_allclose(ev.log_e, np.log(np.exp(both).mean(axis=0)), rtol=1e-12)
    assert mon.segment.testers["mmd"].n_pairs == 3 * K
    assert mon.advance() is None and mon.dropped_last == 0


def test_discard_pending_and_device_flags() -> None:
    mon, _ = _monitor()
    recs = _records(4, 1.0, 1.0, seed=2)
    for r in recs[:2]:
        mon.observe(r)
    assert mon.discard_pending() == [1, 2] and mon.pending_steps == []
    assert mon.advance() is None
    recs[2].finite = torch.tensor(False)
    recs[3].finite = torch.tensor(True)
    for r in recs[2:]:
        mon.observe(r)
    ev = mon.advance()
    assert ev is not None and ev.steps == [4] and mon.dropped_last == 1
    assert mon.segment.testers["hockey_stick"].n_pairs == K


def test_correct_records_do_not_reach_a_violation() -> None:
    """Type I, a few seeded runs of a correct mechanism: the e-process stays below 1/alpha."""
    for seed in range(4):
        mon, warned = _monitor()
        evidence = _feed(mon, _records(100, 1.0, 1.0, seed=seed))
        top = max(float(e.log_e.max()) for e in evidence)
        assert top < math.log(20.0), seed
        assert mon.findings() == [] and mon.sequential_bound() == 0.0 and not warned


def test_too_little_noise_is_a_one_step_violation() -> None:
    """Power: noise sigma / 4 is decided within a few checks, and the per-step lower bound
    rises above 0."""
    mon, _ = _monitor()
    evidence = _feed(mon, _records(60, 1.0, 0.25, seed=1))
    log_e = np.concatenate([e.log_e for e in evidence])
    first = int(np.argmax(log_e >= math.log(20.0))) + 1
    assert log_e.max() >= math.log(20.0) and first <= 20
    (f,) = mon.findings()
    assert f.monitor == "sequential_pairs" and f.level == "violation"
    assert f.scope == ONE_STEP and f.where == "the canary pairs' coordinates"
    assert "Gaussian mechanism, noise multiplier 1" in f.message and "level 0.05" in f.message
    assert mon.sequential_bound() > 0.0 and mon.bound == mon.sequential_bound()
    assert evidence[-1].extra["epsilon_lower_bound"][-1] == mon.bound


def test_a_crossing_keeps_its_finding_when_the_wealth_falls_back() -> None:
    mon, _ = _monitor()
    crossed = None
    for r in _records(60, 1.0, 0.25, seed=1):  # step by step until the e-process crosses
        mon.observe(r)
        mon.advance()
        if mon.log_wealth >= math.log(20.0):
            crossed = r.step
            break
    assert crossed is not None and len(mon.findings()) == 1
    _feed(mon, _records(400, 1.0, 1.0, seed=2, start=crossed + 1))  # correct steps after it
    assert mon.log_wealth < math.log(20.0)  # the wealth fell back below 1/alpha
    assert len(mon.findings()) == 1


# ------------------------------------------------------------------ the report
def test_contribution_bounds_fields_and_interference() -> None:
    mon, _ = _monitor()
    recs = _records(10, 1.0, 1.0, seed=3, real=True)
    _feed(mon, recs)
    c = mon.contribution()
    assert c.section is None and c.canaries == {} and c.verdict is None
    bound, details = c.bounds["sequential"]
    assert list(c.bounds) == ["sequential"] and bound == mon.sequential_bound() == 0.0
    assert details["level"] == 0.05 and details["simultaneous"] is True
    assert details["grid_epsilons"] == mon.segment.epsilons
    assert "per-step bound, not the whole-run epsilon" in details["note"]
    assert "alpha / 2" in details["note"]
    assert set(c.fields) == {"sequential", "interference"}
    seq = c.fields["sequential"]
    assert set(seq["tests"]) == {"mmd", "hockey_stick"} and seq["pairs_per_step"] == K
    assert seq["per_step_null"]["type"] == "gaussian_profile"
    assert seq["segments"] == [{"start_step": 0, "noise_multiplier": 1.0,
                                "null": mon.segment.null}]
    inter = c.fields["interference"]
    assert inter["n"] == 10 * 2 * K and inter["mean"] == pytest.approx(0.5)
    assert inter["std"] == pytest.approx(0.0, abs=1e-12) and inter["max_abs"] == 0.5
    assert inter["removed"] is True and inter["units"] == "C (clipping bound)"
    ys = torch.stack([r.y for r in recs])
    assert inter["observation_std"] == pytest.approx(float(ys.std(unbiased=False)), rel=1e-9)
    assert "std_from_observation_minus_noise" in inter


def test_interference_without_real_sums_or_noise_multiplier() -> None:
    mon, _ = _monitor(None)
    mon.start(1.0)
    for r in _records(3, 1.0, 1.0, seed=4):
        mon.observe(r)  # not drained yet: the buffered steps count
    inter = mon.contribution().fields["interference"]
    assert inter["source"] == "none read (no audited step)" and "n" not in inter
    assert inter["observation_std"] > 0
    assert "std_from_observation_minus_noise" not in inter  # no noise multiplier known


def test_a_change_of_noise_multiplier_starts_a_new_segment() -> None:
    mon, warned = _monitor()
    _feed(mon, _records(5, 1.0, 1.0, seed=5))
    wealth = mon.log_wealth
    ev = _feed(mon, _records(5, 2.0, 2.0, seed=6, start=6))[0]
    assert [s.sigma for s in mon.segments] == [1.0, 2.0] and mon.segment.start_step == 6
    assert any("noise multiplier changed from 1 to 2 at step 6" in w for w in warned)
    assert mon._offset == wealth and ev.steps == [6, 7, 8, 9, 10]
    seg = mon.contribution().fields["sequential"]["segments"]
    assert [s["noise_multiplier"] for s in seg] == [1.0, 2.0]


def test_a_schedule_of_noise_multipliers_says_so_once_and_sums_up_at_finalize() -> None:
    """Opacus's noise schedulers change the multiplier at every epoch or step: one line when
    the schedule is first seen, one summary at finalize, not a line per change."""
    mon, warned = _monitor()
    for i, sigma in enumerate((1.0, 1.5, 2.0, 2.5)):
        _feed(mon, _records(5, sigma, sigma, seed=20 + i, start=1 + 5 * i))
    assert [s.sigma for s in mon.segments] == [1.0, 1.5, 2.0, 2.5]
    changed = [w for w in warned if "noise multiplier changed" in w]
    assert len(changed) == 1 and "from 1 to 1.5 at step 6" in changed[0]
    assert "summed up at finalize" in changed[0]
    mon.finalize(None)
    summary = [w for w in warned if "noise multiplier changed" in w][1:]
    assert summary == ["noise multiplier changed 3 times (a schedule), from 1 at the start to 2.5 "
                       "from step 16 (range 1 to 2.5); each change started a new per-step null"]


def test_no_noise_claimed_means_no_per_step_null() -> None:
    mon, warned = _monitor(0.0)
    assert mon.segment.testers == {} and mon.segment.null["type"] == "none"
    assert any("no per-step Gaussian null" in w for w in warned)
    ev = _feed(mon, _records(5, 0.0, 0.0, seed=7))[0]
    assert ev.log_e.tolist() == [0.0] * 5 and mon.findings() == []
    assert mon.segment.null_text() == "none (no noise claimed)"


def test_an_explicit_per_step_null() -> None:
    mon, _ = _monitor(per_step_null=(2.0, 1e-3))
    assert mon.segment.null == {"type": "explicit", "epsilon": 2.0, "delta": 1e-3}
    assert mon.segment.epsilons == [2.0] and mon.segment.deltas == [1e-3]
    assert mon.segment.null_text() == "explicit per-step (2.0, 0.001)-DP"


# ------------------------------------------------------------------ checkpoint
def test_state_round_trip_gives_identical_later_evidence() -> None:
    recs = _records(40, 1.0, 0.5, seed=8, real=True)
    mon, _ = _monitor()
    _feed(mon, recs[:17])  # steps 16 and 17 buffered
    sd = mon.state_dict()
    assert sd["buffer_steps"] == [16, 17] and tuple(sd["buffer_x"].shape) == (2, K)
    again, _ = _monitor()
    again.load_state_dict(sd)
    ev1, ev2 = _feed(mon, recs[17:]), _feed(again, recs[17:])
    assert ev1[0].steps == ev2[0].steps == [16, 17, 18, 19, 20]
    for a, b in zip(ev1, ev2):
        np.testing.assert_array_equal(a.log_e, b.log_e)
        for key in a.extra:
            np.testing.assert_array_equal(a.extra[key], b.extra[key])
    assert mon.findings() == again.findings()
    assert mon.contribution() == again.contribution()


def test_state_that_does_not_fit_is_refused() -> None:
    mon, _ = _monitor()
    for r in _records(2, 1.0, 1.0, seed=9):
        mon.observe(r)
    sd = mon.state_dict()
    ctx = MonitorContext(config=AuditConfig(k_pairs=K + 1, m_canaries=M), k_pairs=K + 1,
                         m_canaries=M, device="cpu", warn=lambda _m: None,
                         facts={NOISE_MULTIPLIER: 1.0})
    wider = build_monitors(ctx, ("sequential_pairs",))["sequential_pairs"]
    with pytest.raises(ValueError, match=f"does not fit k={K + 1}"):
        wider.load_state_dict(sd)
    fresh, _ = _monitor()
    with pytest.raises(ValueError, match="no tester segments"):
        fresh.load_state_dict({**sd, "segments": []})
    assert len(fresh.segments) == 1 and fresh.pending_steps == []  # unchanged on error


# ------------------------------------------------------------------ where the testers run
def test_tester_placement_is_a_setting_validated_by_name() -> None:
    with pytest.raises(ValueError, match=r"tester_placement must be one of \('auto', 'host', "
                                         r"'device'\), got 'gpu'"):
        _monitor(monitor_options={"sequential_pairs": {"tester_placement": "gpu"}})
    mon, _ = _monitor(tester_placement="device")  # the audit's setting, taken by the monitor
    assert mon.settings.tester_placement == "device"
    assert mon.settings.to_dict()["tester_placement"] == "device"  # stored in checkpoints
    mon, _ = _monitor(tester_placement="device",
                      monitor_options={"sequential_pairs": {"tester_placement": "host"}})
    assert mon.settings.tester_placement == "host"  # the monitor's own option first


@pytest.mark.parametrize("device_code", [False, True])
def test_the_device_placement_gives_the_host_placements_numbers(device_code: bool) -> None:
    """With the testers on the device the check's transfer brings the flags only (the pairs
    stay device tensors, fed to the testers as they are); on a CPU run the device is the host,
    and with the accelerator's tester code (``force_device_code``) the numbers agree to
    1e-9."""
    from dpaudit_torch.testing.host_sync import TESTER_DEVICE_CODE

    recs = _records(4 * CHECK, 1.0, 0.6, seed=5)  # too little noise: the wealth moves
    for i, r in enumerate(recs):  # device flags; two steps flagged non-finite at the check
        r.finite = torch.tensor(i not in (3, 12))
    out = {}
    for placement in ("host", "device"):
        mon, _ = _monitor(tester_placement=placement)
        if device_code:
            mon.force_device_code(TESTER_DEVICE_CODE)
        assert mon.placement == placement
        seen = []
        for r in recs:
            mon.observe(r)
            if r.step % CHECK == 0:
                pending = mon.pending_tensors()
                # flags (one per step) and, with the testers on the host, the pairs
                assert len(pending) == CHECK * (3 if placement == "host" else 1)
                mon.fetch_pending()
                seen.append(mon.advance())
        out[placement] = (seen, mon)
    (h, mh), (d, md) = out["host"], out["device"]
    np.testing.assert_allclose(np.concatenate([e.log_e for e in d]),
                               np.concatenate([e.log_e for e in h]), rtol=0, atol=1e-9)
    for key in h[0].extra:
        np.testing.assert_allclose(np.concatenate([e.extra[key] for e in d]),
                                   np.concatenate([e.extra[key] for e in h]), rtol=0,
                                   atol=1e-9, err_msg=key)
    assert [e.steps for e in d] == [e.steps for e in h]
    assert md.max_log_wealth == pytest.approx(mh.max_log_wealth, abs=1e-9)
    assert md.sequential_bound() == mh.sequential_bound()
    for name, t in mh.segment.testers.items():
        assert md.segment.testers[name].rejected_at == t.rejected_at
        assert md.segment.testers[name].grid_rejected_at == t.grid_rejected_at
    assert [f.message for f in md.findings()] == [f.message for f in mh.findings()]
    if not device_code:
        np.testing.assert_array_equal(np.concatenate([e.log_e for e in d]),
                                      np.concatenate([e.log_e for e in h]))


def test_the_report_says_where_the_testers_ran() -> None:
    for setting, placement in (("auto", "host"), ("host", "host"), ("device", "device")):
        mon, _ = _monitor(tester_placement=setting)
        where = mon.contribution().fields["sequential"]["tester_placement"]
        assert where["setting"] == setting and where["placement"] == placement
        assert where["device"] == "cpu"  # a CPU run: the device is the host
        assert all(str(t.device) == "cpu" for t in mon.segment.testers.values())
        assert where["reason"] == ("set by the user" if setting != "auto" else
                                   "auto: a CPU run: the host is the device")


def test_force_device_code_rebuilds_only_unfed_testers_of_the_device_placement() -> None:
    from dpaudit_torch.testing.host_sync import TESTER_DEVICE_CODE

    mon, _ = _monitor(tester_placement="host")
    before = mon.segment.testers["mmd"]
    mon.force_device_code(TESTER_DEVICE_CODE)  # host placement: the host's code stays
    assert mon.segment.testers["mmd"] is before and not before.force_torch
    mon, _ = _monitor(tester_placement="device")
    mon.force_device_code(TESTER_DEVICE_CODE)
    assert mon.segment.testers["mmd"].force_torch
    assert mon.segment.testers["hockey_stick"].force_vectorised
    # kept through a checkpoint round trip (the testers are rebuilt with the same options)
    _feed(mon, _records(CHECK, 1.0, 1.0, seed=6))
    mon.load_state_dict(mon.state_dict())
    assert mon.segment.testers["mmd"].force_torch
