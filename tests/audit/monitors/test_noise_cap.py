"""The cap on the noise-audit coordinates (``noise_coordinates_total``, docs/auditor.md "Memory"):
small models keep exactly their uncapped coordinates, a large one is cut to a common level per
tensor (never below the floor), a variance shortfall on one tensor is still decided at the first
check under the cap, and bad values are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, PrivacyAuditor, StepRecord
from dpaudit_torch.audit.config import DEFAULT_NOISE_COORDINATES_TOTAL
from dpaudit_torch.audit.monitors.noise import NoiseMonitor
from dpaudit_torch.canaries import (
    NOISE_COORDINATES_FLOOR,
    draw_design,
    draw_noise_coordinates,
    noise_allotment,
)
from dpaudit_torch.contract import GROUP_NAMES, TENSOR_GROUPS, TENSOR_NAMES

#: the parameter shapes of benchmarks/scale.py's 100M transformer (V 10000, d 768, L 12, S 32):
#: 150 tensors, 212,480 coordinates at 2,048 per tensor
V, D, L, S = 10000, 768, 12, 32


def _lm_shapes() -> list[tuple[int, ...]]:
    block = [(D,), (D,), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,), (4 * D, D), (4 * D,),
             (D, 4 * D), (D,)]
    return [(V, D), (S, D)] + block * L + [(D,), (D,), (V, D), (V,)]


def test_allotment_is_the_uncapped_one_unless_the_cap_binds() -> None:
    avail = [10, 5000, 300, 2048, 100_000]
    assert noise_allotment(avail, 2048, None) == [10, 2048, 300, 2048, 2048]
    assert noise_allotment(avail, 2048, 6454) == [10, 2048, 300, 2048, 2048]  # sum is 6454
    cut = noise_allotment(avail, 2048, 3000)
    # the largest common level within the cap: 10 + 300 + 3 * 896 = 2998
    assert cut == [10, 896, 300, 896, 896] and sum(cut) <= 3000
    # never below the floor (or all a tensor has): the cap is then exceeded
    floor = noise_allotment(avail, 2048, 100)
    assert floor == [10, NOISE_COORDINATES_FLOOR, NOISE_COORDINATES_FLOOR,
                     NOISE_COORDINATES_FLOOR, NOISE_COORDINATES_FLOOR]
    assert noise_allotment(avail, 64, 100) == [10, 64, 64, 64, 64]  # per_tensor below the floor
    assert noise_allotment(avail, 0, 100) == [0] * 5


def test_draw_under_a_cap_that_does_not_bind_is_the_uncapped_draw() -> None:
    shapes = [(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 128), (10,)]
    design = draw_design(shapes, 4, 40, torch.Generator().manual_seed(0))
    a = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(5))
    b = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(5),
                               DEFAULT_NOISE_COORDINATES_TOTAL)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_large_model_is_capped_evenly_and_off_the_canaries() -> None:
    shapes = _lm_shapes()
    design = draw_design(shapes, 16, 5000, torch.Generator().manual_seed(0))
    param, flat = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(1),
                                         DEFAULT_NOISE_COORDINATES_TOTAL)
    counts = np.bincount(param.numpy(), minlength=len(shapes))
    assert len(shapes) == 150 and param.numel() <= DEFAULT_NOISE_COORDINATES_TOTAL
    assert counts.min() == counts.max() == 436  # every tensor has more than the level
    cp, cf = design.coordinates()
    canary = set(zip(cp.tolist(), cf.tolist()))
    coords = list(zip(param.tolist(), flat.tolist()))
    assert len(set(coords)) == len(coords) and not canary & set(coords)
    assert all(0 <= f < math.prod(shapes[p]) for p, f in coords)


def _monitor(tensor_of: np.ndarray, n_tensors: int) -> NoiseMonitor:
    cfg = AuditConfig(k_pairs=2, m_canaries=4)
    ctx = MonitorContext(config=cfg, k_pairs=2, m_canaries=4, device="cpu", warn=lambda _m: None,
                         noise_tensor=tensor_of,
                         facts={TENSOR_GROUPS: [0] * n_tensors,
                                TENSOR_NAMES: [f"t{i}" for i in range(n_tensors)],
                                GROUP_NAMES: ["group 0"]})
    return NoiseMonitor(ctx)


@pytest.mark.parametrize("seed", range(3))
def test_shortfall_on_one_tensor_is_decided_at_the_first_check_under_the_cap(seed: int) -> None:
    """sigma x 0.8 on one tensor of the 100M transformer, the others correct: at the capped
    allotment (436 coordinates per tensor) the noise monitor's e-process crosses 1 / alpha at
    the first check (check_every = 5 steps), and the finding names that tensor."""
    shapes = _lm_shapes()
    design = draw_design(shapes, 16, 5000, torch.Generator().manual_seed(seed))
    param, _ = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(seed),
                                      DEFAULT_NOISE_COORDINATES_TOTAL)
    tensor_of = param.numpy()
    bad = 37  # the third block's fc2 bias: 768 coordinates
    mon = _monitor(tensor_of, len(shapes))
    g = torch.Generator().manual_seed(100 + seed)
    scale = torch.where(torch.from_numpy(tensor_of) == bad, 0.8, 1.0).double()
    z = torch.zeros(2, dtype=torch.float64)
    for t in range(1, mon.config.check_every + 1):
        xi = torch.randn(tensor_of.size, generator=g, dtype=torch.float64) * scale
        mon.observe(StepRecord(step=t, values=torch.zeros(8, dtype=torch.float64), x=z, y=z,
                               coins=torch.tensor([True, False]), sigma=1.0, sigma_claimed=1.0,
                               noise=xi))
    ev = mon.advance()
    assert ev is not None and ev.log_e[-1] >= math.log(1.0 / mon.config.alpha)
    (f,) = [f for f in mon.findings() if f.level == "violation"]
    assert f.where.startswith(f"t{bad};")


def test_config_validates_the_cap() -> None:
    assert AuditConfig().noise_coordinates_total == DEFAULT_NOISE_COORDINATES_TOTAL == 65536
    assert AuditConfig(noise_coordinates_total=None).noise_coordinates_total is None
    assert AuditConfig(noise_coordinates_total=np.int64(1000)).noise_coordinates_total == 1000
    for bad in (0, -3):
        with pytest.raises(ValueError, match=rf"noise_coordinates_total must be >= 1, got {bad}"):
            AuditConfig(noise_coordinates_total=bad)
    for bad in (True, 1.5, "1000"):
        with pytest.raises(TypeError, match="noise_coordinates_total must be an integer"):
            AuditConfig(noise_coordinates_total=bad)
    a, b = AuditConfig(), AuditConfig(noise_coordinates_total=None)
    assert a.fingerprint() != b.fingerprint()
    assert a.to_dict()["noise_coordinates_total"] == 65536


def test_small_model_keeps_its_uncapped_coordinates(private_setup) -> None:
    """The auditor on a small model (fewer coordinates than the cap) reads the same noise-audit
    coordinates with the default cap as without one."""
    s = private_setup()
    a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=3, k_pairs=2, m_canaries=8)
    coords = (a.noise_coords[0].clone(), a.noise_coords[1].clone())
    a.detach()
    b = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=3, k_pairs=2, m_canaries=8,
                       noise_coordinates_total=None)
    assert torch.equal(coords[0], b.noise_coords[0]) and torch.equal(coords[1],
                                                                      b.noise_coords[1])
    assert b.noise_coords[0].numel() > 0
    b.detach()


def test_digits_cnn_keeps_its_uncapped_coordinates() -> None:
    """The demo's DigitsCNN (the detection benchmark's model): 6,186 parameters, so no cap of
    at least that size binds; its coordinates are the uncapped ones."""
    from dpaudit_torch.demo import DigitsCNN

    shapes = [tuple(p.shape) for p in DigitsCNN().parameters()]
    design = draw_design(shapes, 16, 1000, torch.Generator().manual_seed(0))
    a = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(2))
    b = draw_noise_coordinates(design, 2048, torch.Generator().manual_seed(2),
                               DEFAULT_NOISE_COORDINATES_TOTAL)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
