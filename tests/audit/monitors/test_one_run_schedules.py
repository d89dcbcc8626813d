"""Opacus's noise and clipping schedulers are correct runs (docs/design.md section 13,
"Schedules"; docs/one_run.md): each of ``opacus.schedulers``' six ends with nothing found, says
a schedule once when first seen and once at finalize (not a line per change), and gets a
white-box bound under its schedule rather than none.

Each run: the conftest's 16-32-2 MLP, Poisson batches of 32 from 256 examples, 12 steps, the
scheduler stepped every 3 steps (3 changes), 64 one-run canaries; 1.5-6 s each, so two of
them run in the fast suite and four are slow-marked.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from conftest import make_private_setup
from opacus import schedulers

from dpaudit_torch.audit import PrivacyAuditor

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS, EVERY = 12, 3

SCHEDULERS: dict[str, Any] = {
    "ExponentialNoise": lambda o: schedulers.ExponentialNoise(o, gamma=0.8),
    "LambdaNoise": lambda o: schedulers.LambdaNoise(o, noise_lambda=lambda e: 1.0 + 0.25 * e),
    "StepNoise": lambda o: schedulers.StepNoise(o, step_size=2, gamma=0.5),
    "ExponentialGradClip": lambda o: schedulers.ExponentialGradClip(o, gamma=0.7),
    "LambdaGradClip": lambda o: schedulers.LambdaGradClip(
        o, scheduler_function=lambda e: 1.0 + 0.5 * e),
    "StepGradClip": lambda o: schedulers.StepGradClip(o, step_size=2, gamma=0.5),
}
#: the noise multipliers each noise scheduler gives over the 12 steps (4 blocks of 3)
NOISE_LEVELS = {"ExponentialNoise": [1.0, 0.8, 0.64, 0.512],
                "LambdaNoise": [1.0, 1.25, 1.5, 1.75],
                "StepNoise": [1.0, 1.0, 0.5, 0.5]}
#: the clipping bounds of each clipping scheduler
CLIP_LEVELS = {"ExponentialGradClip": [1.0, 0.7, 0.49, 0.343],
               "LambdaGradClip": [1.0, 1.5, 2.0, 2.5],
               "StepGradClip": [1.0, 1.0, 0.5, 0.5]}


#: in the fast suite (a noise and a clipping scheduler); the other four are slow-marked
FAST = ("ExponentialNoise", "LambdaGradClip")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(SCHEDULERS)])
def test_each_opacus_scheduler_is_a_correct_run(name: str, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    s = make_private_setup(seed=3)
    opt = s.optimizer
    sched = SCHEDULERS[name](opt)
    aud = PrivacyAuditor(s.engine, opt, s.loader, seed=3, k_pairs=4, m_canaries=64,
                         model=s.model)
    sigmas, clips = [], []
    with caplog.at_level(logging.INFO, logger="dpaudit_torch"):
        done = 0
        while done < STEPS:
            for x, y in s.loader:
                sigmas.append(float(opt.noise_multiplier))
                clips.append(float(opt.max_grad_norm))
                s.step(x, y)
                done += 1
                if done % EVERY == 0:
                    sched.step()
                if done >= STEPS:
                    break
        rep = aud.finalize()
    noise_sched = name in NOISE_LEVELS
    levels = NOISE_LEVELS[name] if noise_sched else CLIP_LEVELS[name]
    seen = sigmas if noise_sched else clips
    assert seen == pytest.approx([v for v in levels for _ in range(EVERY)], rel=1e-12)
    # nothing found: no proof, no refutation, no finding, no noise rejection
    assert not rep.violation and not rep.claim_refuted and rep.findings == []
    assert not rep.audits["noise"]["whole_null"]["rejected"]
    # a schedule is said once when first seen and once at finalize
    lines = [r.getMessage() for r in caplog.records]
    noise_lines = [w for w in lines if "noise multiplier changed" in w]
    clip_lines = [w for w in lines if "clipping bound changed" in w]
    changes = sum(a != b for a, b in zip(levels, levels[1:]))
    if noise_sched:
        assert len(noise_lines) == (2 if changes > 1 else 1) and clip_lines == []
        assert sum("noise multiplier changed" in w for w in rep.warnings) == len(noise_lines)
    else:
        assert noise_lines == [] and len(clip_lines) == (2 if changes > 1 else 1)
        second = next(v for v in levels if v != levels[0])
        assert f"from 1 to {second:.6g} at step" in clip_lines[0]
        assert not any("clipping bound" in w for w in rep.warnings)  # followed, not a warning
    # the white-box bound under the schedule, not withheld
    det = rep.lower_bound_details["whitebox"]
    assert det["family_verified"] and det["note"] == "", det.get("note")
    assert rep.epsilon_lower_bounds["whitebox"] <= rep.claimed_epsilon
    if noise_sched and changes:
        assert det["schedule"]["sigmas"] == pytest.approx(sorted(set(levels)), rel=1e-12)
        assert det["schedule"]["steps"] == [EVERY * levels.count(v)
                                            for v in sorted(set(levels))]
    else:
        assert "schedule" not in det


# ------------------------------------------------------------------ the monitor, hand-made records
def _monitor(seed: int = 0, m: int = 200) -> tuple[Any, list[str], Any]:
    import torch

    from dpaudit_torch.audit import AuditConfig, MonitorContext, build_monitors
    from dpaudit_torch.canaries import SecretCoins
    from dpaudit_torch.contract import SAMPLE_RATE

    warned: list[str] = []
    coins = SecretCoins(m, torch.Generator().manual_seed(seed))
    cfg = AuditConfig(k_pairs=2, m_canaries=m)
    ctx = MonitorContext(config=cfg, k_pairs=2, m_canaries=m, device="cpu", warn=warned.append,
                         coins=coins, facts={SAMPLE_RATE: 0.5})
    return build_monitors(ctx, ("one_run",))["one_run"], warned, coins


def _scheduled_records(coins: Any, sigmas: list[float], seed: int,
                       device_flags: bool = False) -> list[Any]:
    """Correct steps under per-step multipliers: an IN canary adds 1 with probability 0.5, the
    noise has standard deviation sigma_t (units of C_t)."""
    import torch

    from dpaudit_torch.audit import StepRecord

    g = torch.Generator().manual_seed(seed)
    inside = coins.sampling_mask()
    out = []
    for t, s in enumerate(sigmas):
        v = s * torch.randn(4 + coins.m, generator=g, dtype=torch.float64)
        v[4:] += (inside & (torch.rand(coins.m, generator=g) < 0.5)).double()
        out.append(StepRecord(step=t + 1, values=v, x=v[:2].clone(), y=v[2:4].clone(),
                              coins=torch.tensor([True, False]), sigma=s, sigma_claimed=s,
                              finite=torch.tensor(True) if device_flags else True,
                              noise_std=s * 1.0))
    return out


@pytest.mark.parametrize("device_flags", [False, True])
def test_the_monitor_keeps_the_weighted_sums_and_resumes_them(device_flags: bool) -> None:
    """Both scoring paths keep the weighted sums, the standardised moments and trace and the
    schedule; a checkpoint in the middle resumes them exactly; the bound is the stats
    module's on the same values."""
    import numpy as np
    import torch

    from dpaudit_torch.stats import whitebox as wb

    sigmas = [2.0] * 20 + [1.0] * 13 + [1.5] * 7
    mon, _, coins = _monitor(seed=7)
    recs = _scheduled_records(coins, sigmas, seed=8, device_flags=device_flags)
    for r in recs[:25]:
        mon.observe(r)
    again, _, _ = _monitor(seed=7)
    again.load_state_dict(mon.state_dict())
    for mm in (mon, again):
        for r in recs[25:]:
            mm.observe(r)
        mm.finalize(1.5)
    z = torch.stack([r.one_run for r in recs]).numpy()
    w = (2.0 / np.asarray(sigmas)) ** 2
    np.testing.assert_allclose(mon._wsum.numpy(), z.T @ w, rtol=1e-12)
    np.testing.assert_allclose(mon.trace(), z / (np.asarray(sigmas) / 2.0)[:, None],
                               rtol=1e-6)
    assert torch.equal(mon._wsum, again._wsum) and mon.bounds == again.bounds
    det = mon.details["whitebox"]
    assert det["schedule"] == {"reference_sigma": 2.0, "sigmas": [1.0, 1.5, 2.0],
                               "steps": [13, 7, 20], "weight_sum": pytest.approx(w.sum())}
    mask = mon._in_mask.numpy()
    mom, sched = wb.schedule_moments(z, sigmas, mask)
    res = wb.whitebox_bound(mom, 0.5, 1e-5, alpha=mon.config.whitebox_alpha,
                            out_values=(z / (np.asarray(sigmas) / 2.0)[:, None])[:, ~mask],
                            schedule=sched)  # at the monitor's own level (its share of alpha)
    assert det["family_verified"] and res.family_verified, det.get("note")
    assert mon.bounds["whitebox"] == pytest.approx(res.bound, rel=1e-6, abs=1e-9)
    assert "a noise schedule (3 multipliers)" in mon.power["note"]


def test_an_old_checkpoint_of_a_scheduled_run_withholds_the_bound() -> None:
    """A checkpoint written before the schedule was kept, of a run whose multiplier changed:
    no white-box bound, with the reason; nothing else breaks."""
    mon, _, coins = _monitor(seed=3)
    for r in _scheduled_records(coins, [2.0] * 6 + [1.0] * 6, seed=4):
        mon.observe(r)
    sd = mon.state_dict()
    sd.pop("schedule")
    again, _, _ = _monitor(seed=3)
    again.load_state_dict(sd)
    again.finalize(1.5)
    assert again.bounds["whitebox"] == 0.0
    assert "lacks its schedule" in again.details["whitebox"]["note"]
