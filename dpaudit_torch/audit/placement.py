"""Where the hook's sequential testers run: the rule behind ``tester_placement="auto"``.

The sequential monitor feeds its testers (MMD and hockey-stick, :mod:`dpaudit_torch.stats`) once
per check with the ``check_every x k_pairs`` pairs buffered since the last one
(docs/auditor.md, "On a GPU"). They can run

* on the **host** (``"host"``): the pairs come to the host with everything else the monitors
  buffered, in the check's one transfer, and the testers' compiled host code works on the copy;
* on the audit's **device** (``"device"``): the testers are built there and fed the buffered
  device tensors directly (no host copy of the pairs); their betting recursion reads each
  chunk's payoffs back to the host, so the check then waits more than once.

On a CPU-only run both are the same device and compute the same thing. Which is faster on an
accelerator depends on how many pairs a check brings (kernel launches and read-backs cost about
the same for a few dozen pairs as for a few thousand), so ``"auto"`` looks the setting up in
:data:`MEASURED_PLACEMENTS`, the table ``benchmarks/gpu_check.py`` measures: per device type, at
``check_every`` 5 and 50 with 16 and 64 pairs per step, the check's time with the testers on the
host and on the device, side by side (its rows "tester placement", section "GPU readiness" of
docs/benchmarks.md; it prints the table's entries ready to paste).

**Not measured yet.** No GPU has run that part of ``benchmarks/gpu_check.py``, so the table is
empty and ``"auto"`` chooses the host everywhere: the placement the auditor has always had and
the one its GPU measurements were made with. To derive the rule on a machine with a GPU: run
``python benchmarks/gpu_check.py`` there, copy the printed ``MEASURED_PLACEMENTS`` entries here
and re-run ``tests/audit/test_placement.py``. Framework-free (no Opacus, no statistics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .config import TESTER_PLACEMENTS

__all__ = ["MEASURED_PLACEMENTS", "auto_placement", "resolve_placement"]

#: (device type, check_every, pairs per step) -> the placement ``benchmarks/gpu_check.py``
#: measured faster there (``"host"`` or ``"device"``). Empty: no GPU has measured it yet, and
#: ``"auto"`` then keeps the host, the measured status quo.
MEASURED_PLACEMENTS: dict[tuple[str, int, int], str] = {}


def auto_placement(device_type: str, check_every: int, pairs_per_step: int,
                   table: Mapping[tuple[str, int, int], str] | None = None) -> tuple[str, str]:
    """``"host"`` or ``"device"`` for a run on ``device_type`` (``"cuda"``, ``"cpu"``, ...), and
    the reason in words.

    The rule, from the measured points of that device type in ``table`` (default
    :data:`MEASURED_PLACEMENTS`): a check brings ``n = check_every x pairs_per_step`` pairs,
    and the device's advantage is taken to grow with n (its launches and read-backs cost per
    chunk, the work it speeds up per pair). The device is chosen when a measured point with at
    most n pairs per check was faster on the device and no point with at least n pairs per
    check was faster on the host; the host otherwise (always without a measurement, and on the
    CPU, where both are the same device)."""
    if device_type == "cpu":
        return "host", "a CPU run: the host is the device"
    points = MEASURED_PLACEMENTS if table is None else table
    mine = [(ce * k, p) for (dev, ce, k), p in points.items() if dev == device_type]
    bad = sorted({p for _, p in mine} - {"host", "device"})
    if bad:
        raise ValueError(f"measured placements must be 'host' or 'device', got {bad}")
    if not mine:
        return "host", (f"no measurement of the placement on {device_type} yet "
                        f"(benchmarks/gpu_check.py): the host, the measured status quo")
    n = check_every * pairs_per_step
    device_below = [m for m, p in mine if p == "device" and m <= n]
    host_above = [m for m, p in mine if p == "host" and m >= n]
    if device_below and not host_above:
        return "device", (f"{n} pairs per check: the device was faster at "
                          f"{max(device_below)} pairs per check on {device_type}")
    near = min(mine, key=lambda mp: abs(math.log(mp[0] / n)))
    return "host", (f"{n} pairs per check on {device_type}: the device is not measured faster "
                    f"at that size (nearest measured point: {near[0]} pairs per check, "
                    f"{near[1]} faster)")


def resolve_placement(setting: str, device_type: str, check_every: int,
                      pairs_per_step: int) -> tuple[str, str]:
    """The placement a setting of :data:`~dpaudit_torch.audit.config.TESTER_PLACEMENTS` gives
    (``"host"`` or ``"device"``) and why; ValueError naming an unknown setting."""
    if setting not in TESTER_PLACEMENTS:
        raise ValueError(f"tester_placement must be one of {TESTER_PLACEMENTS}, got {setting!r}")
    if setting == "auto":
        placement, why = auto_placement(device_type, check_every, pairs_per_step)
        return placement, f"auto: {why}"
    return setting, "set by the user"
