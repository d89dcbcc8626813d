"""The stored rule behind ``tester_placement="auto"`` (dpaudit_torch/audit/placement.py): the host
until a GPU has measured the placement, and, from a measured table, the device only where it
was measured faster at as few pairs per check or fewer and never slower at as many or more."""

from __future__ import annotations

import re

import pytest

from dpaudit_torch.audit.config import TESTER_PLACEMENTS
from dpaudit_torch.audit.placement import (
    MEASURED_PLACEMENTS,
    auto_placement,
    resolve_placement,
)


def test_nothing_is_measured_yet_so_auto_keeps_the_host_everywhere() -> None:
    """The table is empty until benchmarks/gpu_check.py has run on a GPU and its entries were
    copied in: then this test is to be updated with them."""
    assert MEASURED_PLACEMENTS == {}
    for dev in ("cuda", "xpu", "mps", "cpu"):
        for every in (1, 5, 50, 500):
            for k in (1, 16, 64, 256):
                placement, why = auto_placement(dev, every, k)
                assert placement == "host", (dev, every, k)
                assert why


def test_the_cpu_is_always_the_host() -> None:
    table = {("cpu", 5, 16): "device"}
    assert auto_placement("cpu", 50, 64, table) == ("host", "a CPU run: the host is the device")


def test_without_a_measurement_of_that_device_type_the_host() -> None:
    placement, why = auto_placement("xpu", 50, 64, {("cuda", 5, 16): "device"})
    assert placement == "host" and "no measurement of the placement on xpu yet" in why


@pytest.mark.parametrize("every,k,expected", [
    (5, 16, "host"),     # 80 pairs per check: measured host
    (50, 16, "host"),    # 800: the host was faster at 800
    (5, 64, "host"),     # 320: below the first device point (3200), host
    (50, 64, "device"),  # 3200: measured device
    (100, 64, "device"),  # 6400: more than a device point, no host point above
    (40, 64, "host"),    # 2560: between host (800) and device (3200): not measured faster
])
def test_a_measured_table_by_pairs_per_check(every: int, k: int, expected: str) -> None:
    table = {("cuda", 5, 16): "host", ("cuda", 50, 16): "host", ("cuda", 50, 64): "device"}
    placement, why = auto_placement("cuda", every, k, table)
    assert placement == expected, why
    assert f"{every * k} pairs per check" in why


def test_a_host_point_above_vetoes_the_device() -> None:
    """Conservative: the device is chosen only where no measurement with at least as many pairs
    per check found the host faster."""
    table = {("cuda", 5, 16): "device", ("cuda", 50, 64): "host"}
    assert auto_placement("cuda", 50, 16, table)[0] == "host"
    assert auto_placement("cuda", 100, 64, table)[0] == "device"


def test_a_bad_table_entry_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("must be 'host' or 'device', got ['gpu']")):
        auto_placement("cuda", 5, 16, {("cuda", 5, 16): "gpu"})


def test_resolve() -> None:
    assert resolve_placement("host", "cuda", 5, 16) == ("host", "set by the user")
    assert resolve_placement("device", "cpu", 5, 16) == ("device", "set by the user")
    placement, why = resolve_placement("auto", "cuda", 5, 16)
    assert placement == "host" and why.startswith("auto: no measurement")
    assert set(TESTER_PLACEMENTS) == {"auto", "host", "device"}
    with pytest.raises(ValueError, match=re.escape("tester_placement must be one of ('auto', "
                                                   "'host', 'device'), got 'gpu'")):
        resolve_placement("gpu", "cuda", 5, 16)
