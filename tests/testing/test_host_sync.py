"""testing.host_sync: the host-read counter and the switch to the accelerator's code path
(what they prove together: tests/audit/test_device_path.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup

from dpaudit_torch._validation import check_finite_tensor
from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.testing.host_sync import (
    HOST_READS,
    HostReadCounter,
    force_device_path,
)


def test_every_host_read_is_counted_and_the_methods_are_restored() -> None:
    before = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}
    t, i = torch.tensor([1.5]), torch.tensor(1)
    with HostReadCounter() as counter:
        t.item()  # not counting yet
        with counter.counting() as reads:
            t.item()
            t.cpu()
            t.tolist()
            t.numpy()
            bool(t)
            float(t)
            int(t)
            _ = [0, 1][i]
            t.data_ptr()
        t.item()  # no longer counting
    assert [r.method for r in reads] == list(HOST_READS)
    assert all(not r.host_side for r in reads)
    assert all("outside the package" in r.site and "test_host_sync.py" in r.site for r in reads)
    assert {name: torch.Tensor.__dict__.get(name) for name in HOST_READS} == before


def test_a_read_inside_the_package_is_attributed_to_it() -> None:
    with HostReadCounter() as counter, counter.counting() as reads:
        check_finite_tensor(torch.ones(3, dtype=torch.float64), "x")
    assert [r.method for r in reads] == ["numpy"]
    assert reads[0].site.startswith("dpaudit_torch/_validation.py:")
    assert reads[0].site.endswith(" in check_finite_tensor")
    assert str(reads[0]) == f"numpy at {reads[0].site}"


def test_misuse_is_refused() -> None:
    counter = HostReadCounter()
    with pytest.raises(RuntimeError, match="enter"), counter.counting():
        pass
    with counter, pytest.raises(RuntimeError, match="already entered"):
        counter.__enter__()


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_force_device_path_switches_every_host_path_off(mode: str) -> None:
    s = make_private_setup(mode=mode, sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=4, m_canaries=20)
    reader, inj = aud.tap.reader, aud.tap.injector
    assert reader.check_finite_every_step and reader.compiled  # the CPU's own path
    force_device_path(aud)
    assert not reader.check_finite_every_step and not reader.compiled
    if inj.shadow is not None:
        assert not (inj.shadow.replica_clip or inj.shadow.host_rows or inj.shadow.compiled_add)
    else:
        assert not inj.strategy.compiled_add
    switched = [m for m in aud.monitors.values() if hasattr(m, "host_rows")]
    assert switched and not any(m.host_rows for m in switched)
    x, y = next(s.batches(1, batch=16))
    s.step(x, y)
    assert isinstance(reader.last_values, torch.Tensor) and reader.compiled_reads == 0
    with pytest.raises(ValueError, match="before the auditor's first step"):
        force_device_path(aud)
    aud.detach()
