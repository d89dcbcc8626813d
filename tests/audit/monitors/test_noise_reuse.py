"""The noise monitor's reuse check (docs/design.md section 11, "Reuse by near-equality"):
records built as the adapter fills them. The reuse forms of testing.bugs on the digits CNN:
tests/testing/test_reuse_runs.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord
from dpaudit_torch.audit.monitors.noise import NoiseMonitor
from dpaudit_torch.contract import GROUP_NAMES, TENSOR_GROUPS, TENSOR_NAMES

U = 1200  # three tensors of 400 sampled coordinates
STD = 1e-2  # the claimed noise std, raw units


def _monitor(**options: object) -> NoiseMonitor:
    cfg = AuditConfig(k_pairs=2, m_canaries=4, monitor_options={"noise": options})
    ctx = MonitorContext(options=NoiseMonitor.config_class.build(cfg, options), config=cfg,
                         k_pairs=2, m_canaries=4, device="cpu", warn=lambda _m: None,
                         noise_tensor=np.repeat(np.arange(3), U // 3),
                         facts={TENSOR_GROUPS: [0, 0, 0], TENSOR_NAMES: ["a", "b", "c"],
                                GROUP_NAMES: ["group 0"]})
    return NoiseMonitor(ctx)


def _feed(mon: NoiseMonitor, steps: int, reuse_from: int | None, lag: int, seed: int = 0,
          host_rows: bool = True) -> None:
    """Steps whose release is float32(float32(sum + noise) / 64) x 64; from step
    ``reuse_from`` on, the noise of tensor "b" is that of ``lag`` steps before."""
    mon.host_rows = host_rows
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(2, dtype=torch.float64)
    drawn: list[torch.Tensor] = []
    for t in range(1, steps + 1):
        real = STD * 3 * torch.randn(U, generator=g, dtype=torch.float64)
        noise = (STD * torch.randn(U, generator=g, dtype=torch.float64)).float()
        if reuse_from is not None and t >= reuse_from:
            noise[400:800] = drawn[t - 1 - lag][400:800]
        drawn.append(noise.clone())
        released = ((real.float() + noise) / 64).double() * 64
        raw = released - real.float().double()
        mon.observe(StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                               coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                               noise=raw / STD, noise_raw=raw, release_raw=released,
                               noise_std=STD))
        if t % 5 == 0:
            mon.advance()


@pytest.mark.parametrize("host_rows", [True, False])
def test_reuse_at_a_long_lag_is_proven_at_the_check_after_it(host_rows):
    mon = _monitor()
    _feed(mon, 30, reuse_from=21, lag=17, host_rows=host_rows)
    sec = mon.report_section()["reuse"]
    assert sec["rejected"] and 21 <= sec["rejected_at"] <= 25
    assert sec["common_lags"][0] == 17 and sec["signature_bytes"] <= 30 * 24 * 16
    msg = [f.message for f in mon.findings() if "reused" in f.message]
    assert len(msg) == 1 and "17" in msg[0] and "earlier step" in msg[0]
    again = _monitor()
    again.load_state_dict(mon.state_dict())
    assert again.report_section()["reuse"] == sec


def test_fresh_noise_is_quiet_and_an_old_checkpoint_keeps_its_e_process():
    mon = _monitor()
    _feed(mon, 30, reuse_from=None, lag=1, seed=1)
    sec = mon.report_section()["reuse"]
    assert not sec["rejected"] and sec["max_log_wealth"] < np.log(20)
    assert mon.findings() == []
    sd = mon.state_dict()
    del sd["reuse"]  # a checkpoint made before the check existed
    old = _monitor()
    old.load_state_dict(sd)
    assert old.reuse is None and "reuse" not in old.report_section()
    _feed(old, 5, reuse_from=None, lag=1, seed=2)  # still runs, without it


def test_reuse_turned_off_is_not_run_and_says_so():
    mon = _monitor(reuse=False)
    _feed(mon, 30, reuse_from=21, lag=17)
    assert mon.reuse is None and "reuse" not in mon.report_section()
    assert not any("reused" in f.message for f in mon.findings())
    skipped = dict(mon.check_section().not_checked)
    assert "turned off" in next(v for k, v in skipped.items() if "reused" in k)


@pytest.mark.parametrize("bad", [0, 1, "no", None])
def test_the_switch_takes_a_bool(bad: object) -> None:
    """``reuse`` is a switch: 0, "no" or None is a TypeError naming it, not a silent truthy or
    falsy value."""
    cfg = AuditConfig(k_pairs=2, m_canaries=4)
    with pytest.raises(TypeError, match=r"option 'reuse' of NoiseConfig must be True or False"):
        NoiseMonitor.config_class.build(cfg, {"reuse": bad})
    assert NoiseMonitor.config_class.build(cfg, {"reuse": False}).reuse is False
