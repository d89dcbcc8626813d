"""The noise monitor's floating-point check through the monitor (docs/design.md section 11):
records built without Opacus, as the adapter fills them (the noise read at the noise-audit
coordinates in raw units, the released values it was reconstructed from, and the claimed std)."""

from __future__ import annotations

import numpy as np
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord
from dpaudit_torch.audit.monitors.noise import PRECISION_STEPS, NoiseMonitor
from dpaudit_torch.contract import GROUP_NAMES, TENSOR_GROUPS, TENSOR_NAMES

U = 2816  # noise-audit coordinates per step: 8 steps -> 22,528 values
STD = 1e-3  # the claimed noise std, raw units


def _monitor() -> NoiseMonitor:
    cfg = AuditConfig(k_pairs=2, m_canaries=4)
    ctx = MonitorContext(config=cfg, k_pairs=2, m_canaries=4, device="cpu", warn=lambda _m: None,
                         noise_tensor=np.zeros(U, dtype=np.int64),
                         facts={TENSOR_GROUPS: [0], TENSOR_NAMES: ["fc.weight"],
                                GROUP_NAMES: ["group 0"]})
    return NoiseMonitor(ctx)


def _run(noise: str, seed: int) -> NoiseMonitor:
    """PRECISION_STEPS steps whose released value is float32(real sum + noise); the noise is
    absent ("none"), float32 Gaussian ("float32") or Gaussian rounded to bfloat16 ("bf16")."""
    mon = _monitor()
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(2, dtype=torch.float64)
    for t in range(1, PRECISION_STEPS + 1):
        real = 1e-5 * torch.randn(U, generator=g, dtype=torch.float64)
        draw = STD * torch.randn(U, generator=g, dtype=torch.float64)
        added = {"none": torch.zeros(U, dtype=torch.float64), "float32": draw.float().double(),
                 "bf16": draw.to(torch.bfloat16).double()}[noise]
        released = (real + added).float().double()
        raw = released - real
        mon.observe(StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                               coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                               noise=raw / STD, noise_raw=raw, release_raw=released,
                               noise_std=STD))
    mon.advance()
    mon.finalize(None)
    return mon


def _grid_findings(mon: NoiseMonitor) -> list[str]:
    return [f.message for f in mon.findings() if f.level == "finding"]


def test_no_noise_run_has_no_precision_finding() -> None:
    mon = _run("none", seed=1)
    p = mon.report_section()["precision"]
    assert p["n"] == PRECISION_STEPS * U and p["n_below_std_floor"] == p["n"]
    assert p["finding"] is None and _grid_findings(mon) == []
    # the missing noise itself is a violation of the variance test, not a precision finding
    assert any("too little noise" in f.message for f in mon.findings())


def test_bf16_noise_is_found_and_worded_as_a_share() -> None:
    mon = _run("bf16", seed=2)
    p = mon.report_section()["precision"]
    assert p["finding"] == "bfloat16" and p["bfloat16"] == 1.0
    (msg,) = _grid_findings(mon)
    checked = p["n_eligible_bfloat16"]
    assert 0.9 * p["n"] < checked < p["n"]  # about 92 % above 0.1 std
    assert f"(100.0% of the {checked} values checked, of {p['n']} read)" in msg
    assert "1 of" not in msg and "bfloat16 grid" in msg


def test_float32_noise_has_no_precision_finding_and_state_keeps_the_std() -> None:
    mon = _run("float32", seed=3)
    assert mon.report_section()["precision"]["finding"] is None and _grid_findings(mon) == []
    sd = mon.state_dict()
    assert sd["precision_std"] == [STD] * PRECISION_STEPS
    again = _monitor()
    again.load_state_dict(sd)
    again.finalize(None)
    assert again.report_section()["precision"] == mon.report_section()["precision"]
    # a state saved before the std was kept still loads (the check then runs without a floor)
    old = {k: v for k, v in sd.items() if k != "precision_std"}
    legacy = _monitor()
    legacy.load_state_dict(old)
    legacy.finalize(None)
    assert legacy.report_section()["precision"]["n_below_std_floor"] == 0


def test_violation_location_names_the_tensor_and_group_once() -> None:
    mon = _run("none", seed=2)
    (v,) = [f for f in mon.findings() if f.level == "violation"]
    assert v.where == "fc.weight; worst parameter group: group 0"
    assert "fc.weight" in v.message


def test_violation_names_the_tensor_that_crossed_not_one_without_samples() -> None:
    """Three tensors, the last without noise-audit coordinates (a 2-value bias, as the DPLSTM
    classifier's head): the middle one has too little noise for 3 steps, then correct noise
    for 60. The finding names the middle tensor (the largest log-wealth when the test
    crossed), never the tensor without samples (log-wealth 0, variance estimate nan)."""
    cfg = AuditConfig(k_pairs=2, m_canaries=4)
    tensor = np.repeat([0, 1], [400, 200])
    ctx = MonitorContext(config=cfg, k_pairs=2, m_canaries=4, device="cpu",
                         warn=lambda _m: None, noise_tensor=tensor,
                         facts={TENSOR_GROUPS: [0, 0, 0],
                                TENSOR_NAMES: ["lstm.weight_ih", "lstm.weight_hh", "head.bias"],
                                GROUP_NAMES: ["group 0"]})
    mon = NoiseMonitor(ctx)
    g = torch.Generator().manual_seed(5)
    z = torch.zeros(2, dtype=torch.float64)
    low = torch.from_numpy(np.where(tensor == 1, 0.75, 1.0))
    for t in range(1, 64):
        xi = torch.randn(tensor.size, generator=g, dtype=torch.float64) * (low if t <= 3 else 1)
        mon.observe(StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                               coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                               noise=xi, noise_std=1.0))
        if t % 3 == 0:
            mon.advance()
    bt = mon.by_tensor
    assert bt.rejected and bt.rejected_at <= 3 and bt.rejected_group == 1
    lw = bt.group_log_wealth
    assert abs(lw[2]) < 1e-12 and lw[:2].max() < -0.1  # the old argmax: head.bias
    (v,) = [f for f in mon.findings() if f.level == "violation"]
    assert v.where == "lstm.weight_hh; worst parameter group: group 0"
    assert "on lstm.weight_hh the noise variance was about" in v.message
    span = ("at the first step, where the test crossed" if bt.rejected_at == 1
            else f"over the {bt.rejected_at} steps up to the test's crossing")
    assert span in v.message
    assert "over all 63 steps" in v.message
    assert "nan" not in v.message and "head.bias" not in v.message + v.where
    # restored from a checkpoint: the same words
    again = NoiseMonitor(ctx)
    again.load_state_dict(mon.state_dict())
    assert [f.message for f in again.findings()] == [f.message for f in mon.findings()]


def test_step_with_non_finite_noise_carries_no_evidence_with_or_without_sumsq():
    """A step whose noise holds a NaN is skipped (the wealth stays where it was), whether the
    adapter gave the step's sum of squares (the shortcut: a finite sum proves the step finite,
    a NaN one sends the check to the values) or not."""
    z = torch.zeros(2, dtype=torch.float64)
    wealth = []
    for with_sumsq in (True, False):
        mon = _monitor()
        g = torch.Generator().manual_seed(3)
        for t in range(1, 6):
            xi = 0.5 * torch.randn(U, generator=g, dtype=torch.float64)  # too little noise
            if t == 3:
                xi[7] = float("nan")
            rec = StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                             coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                             noise=xi, noise_std=STD,
                             noise_sumsq=float((xi * xi).sum()) if with_sumsq else None)
            mon.observe(rec)
        ev = mon.advance()
        assert ev is not None and ev.steps == [1, 2, 3, 4, 5]
        assert ev.log_e[2] == ev.log_e[1]  # step 3 skipped
        assert np.all(np.isfinite(ev.log_e)) and ev.log_e[-1] > ev.log_e[2]
        wealth.append(ev.log_e)
    np.testing.assert_array_equal(wealth[0], wealth[1])


# ---------------------------------------------------------------------- the whole null
def _structured_monitor(flat: bool = True) -> NoiseMonitor:
    """A monitor over two tensors of shape [32, 44] fully observed (U = 2816), with the flat
    indices and the tensors (OPTIMIZER_PARAMS) known, or without the flat indices."""
    from dpaudit_torch.contract import OPTIMIZER_PARAMS

    cfg = AuditConfig(k_pairs=2, m_canaries=4)
    half = U // 2
    tensor = np.repeat([0, 1], half)
    ctx = MonitorContext(config=cfg, k_pairs=2, m_canaries=4, device="cpu",
                         warn=lambda _m: None, noise_tensor=tensor,
                         noise_flat=np.tile(np.arange(half), 2) if flat else None,
                         facts={TENSOR_GROUPS: [0, 0], TENSOR_NAMES: ["a.weight", "b.weight"],
                                GROUP_NAMES: ["group 0"],
                                OPTIMIZER_PARAMS: [torch.zeros(32, 44), torch.zeros(32, 44)]})
    return NoiseMonitor(ctx)


def _feed(mon: NoiseMonitor, xs: torch.Tensor) -> None:
    z = torch.zeros(2, dtype=torch.float64)
    for t, xi in enumerate(xs, start=1):
        mon.observe(StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                               coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                               noise=xi, noise_std=STD))
    mon.advance()


def test_whole_null_finds_equal_neighbours_and_says_so() -> None:
    g = torch.Generator().manual_seed(4)
    pairs = torch.randn(5, U // 2, 1, generator=g, dtype=torch.float64)
    xs = pairs.expand(5, U // 2, 2).reshape(5, U)  # coordinates 2j, 2j + 1 equal: variance 1
    mon = _structured_monitor()
    _feed(mon, xs)
    section = mon.report_section()
    assert not section["by_tensor"]["rejected"]  # the variance is the claimed one
    assert section["whole_null"]["rejected"] and section["whole_null"]["rejected_at"] == 1
    assert section["whole_null"]["worst_family"] == "adjacent"
    msg = [f.message for f in mon.findings() if f.level == "violation"]
    assert any("neighbouring coordinates of a tensor are dependent" in m for m in msg)
    again = _structured_monitor()
    again.load_state_dict(mon.state_dict())
    assert again.report_section()["whole_null"] == section["whole_null"]


def test_whole_null_quiet_on_gaussian_noise_and_without_structure() -> None:
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(10, U, generator=g, dtype=torch.float64)
    for flat in (True, False):
        mon = _structured_monitor(flat)
        _feed(mon, xs)
        whole = mon.report_section()["whole_null"]
        assert not whole["rejected"] and whole["log_wealth"] < 0
        assert mon.findings() == []
        assert ("adjacent" in whole["families"]) is flat
