"""Counting the host reads of tensors: a CPU instrument for "no host synchronisation between
checks" (docs/auditor.md, "On a GPU").

On an accelerator, reading a tensor's value on the host (``.item()``, ``.cpu()``, ``.tolist()``,
``.numpy()``, ``bool()``, ``float()``, ``int()``, a tensor used as a Python index) makes the host
wait for every kernel queued before it; CUDA's ``torch.cuda.set_sync_debug_mode`` reports those
calls. On the CPU nothing waits, so that check cannot run there; this module counts the calls
themselves instead:

* :class:`HostReadCounter` replaces those methods of ``torch.Tensor`` by counting wrappers while
  it is entered, and records every call made inside :meth:`HostReadCounter.counting`, with the
  place in this package that made it (:class:`HostRead`);
* :func:`force_device_path` makes an auditor on the CPU take the code path it takes on an
  accelerator (torch gathers with a deferred finiteness flag, the canaries' rows written and
  added by torch, the pairs and noise rows kept as tensor copies until the check copies them to
  the host in one transfer) instead of its compiled host path, which reads NumPy views of CPU
  tensors by design.

What it does not see: host-to-device copies (``.to(device)`` without ``non_blocking=True`` waits
on CUDA too), which are no-ops on the CPU; the auditor's step path makes its copies
``non_blocking``, and ``benchmarks/gpu_check.py`` counts every synchronisation on a GPU. Calls on
tensors that are host tensors on every device are recorded with ``host_side=True``: the uniforms
of the auditor's own CPU generator (:data:`HOST_SIDE`), and everything done inside the calls of
:data:`HOST_SIDE_CALLS` (the sequential testers the hook feeds with ``tester_placement`` on the
host: built on the host on every device, and fed the check's host copies; with the testers on
the device their reads are counted as the device's).

Used by tests/audit/test_device_path.py and ``benchmarks/gpu_check.py --smoke``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any

import torch

__all__ = ["HOST_READS", "HOST_SIDE", "HOST_SIDE_CALLS", "HostRead", "HostReadCounter",
           "TESTER_DEVICE_CODE", "force_device_path", "pack_gathers"]

#: the ``torch.Tensor`` methods that read a value on the host (a synchronisation on a device),
#: and ``data_ptr``: the address the package's NumPy views of CPU tensors are built from
#: (:mod:`dpaudit_torch._host_view`, which never calls it on a device tensor), so that the
#: CPU's host path, which reads the gradients through such views, is seen like ``numpy()``
HOST_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__",
              "__index__", "data_ptr")

#: (module path in the package, function) whose tensors are host tensors on every device: the
#: blocks of uniforms drawn from the auditor's CPU generator (``StepPlanner``, every 65,536
#: uniforms)
HOST_SIDE = frozenset({("opacus_tap/plan.py", "_uniforms"),
                       ("opacus_tap/plan.py", "_more_uniforms")})

#: (module path in the package, function) inside whose calls every tensor is a host tensor on
#: every device: the monitor's feed of the hook's sequential testers placed on the host (built
#: with ``device="cpu"``, fed host tensors made from the check's one host copy)
HOST_SIDE_CALLS = frozenset({("audit/monitors/sequential_pairs.py", "_feed_host")})

#: per sequential tester: the options that make it run, on the CPU, the code an accelerator runs
#: (its torch code instead of the compiled host passes; the same statistics within 1e-9)
TESTER_DEVICE_CODE: dict[str, dict[str, Any]] = {"mmd": {"force_torch": True},
                                                 "hockey_stick": {"force_vectorised": True}}

_PACKAGE = Path(__file__).resolve().parent.parent
_TORCH = Path(torch.__file__).resolve().parent


@dataclass(frozen=True)
class HostRead:
    """One host read: the method, where it was made (``path:line in function``: the innermost
    frame in this package, else the first one outside torch) and whether the tensor is a host
    tensor on every device (:data:`HOST_SIDE`)."""

    method: str
    site: str
    host_side: bool = False

    def __str__(self) -> str:
        return f"{self.method} at {self.site}" + (" (host-side tensor)" if self.host_side else "")


@cache
def _where(filename: str) -> tuple[str | None, bool]:
    """(the file's path in this package or None, whether it is torch's own)."""
    path = Path(filename).resolve()
    if path.is_relative_to(_PACKAGE):
        return path.relative_to(_PACKAGE).as_posix(), False
    return None, path.is_relative_to(_TORCH)


def _inside_host_calls(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame outward runs a function of :data:`HOST_SIDE_CALLS`."""
    while frame is not None:
        rel, _ = _where(frame.f_code.co_filename)
        if rel is not None and (rel, frame.f_code.co_name) in HOST_SIDE_CALLS:
            return True
        frame = frame.f_back
    return False


def _site(frame: FrameType | None) -> tuple[str, bool]:
    """(where, host_side) of the call made from ``frame`` outward."""
    first: str | None = None
    while frame is not None:
        code = frame.f_code
        rel, in_torch = _where(code.co_filename)
        if rel is not None:
            where = f"dpaudit_torch/{rel}:{frame.f_lineno} in {code.co_name}"
            return where, (rel, code.co_name) in HOST_SIDE or _inside_host_calls(frame)
        if first is None and not in_torch:
            first = (f"{Path(code.co_filename).name}:{frame.f_lineno} in {code.co_name} "
                     f"(outside the package)")
        frame = frame.f_back
    return first or "unknown", False


class HostReadCounter:
    """While entered, :data:`HOST_READS` of ``torch.Tensor`` are counting wrappers; the calls
    made inside :meth:`counting` are recorded. Not re-entrant; one at a time per process.

    Example::

        with HostReadCounter() as counter:
            with counter.counting() as reads:
                optimizer.step()
        assert [r for r in reads if not r.host_side] == []
    """

    def __init__(self) -> None:
        self._saved: dict[str, Any] = {}
        self._reads: list[HostRead] | None = None

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        counter = self

        def counted(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads = counter._reads
            if reads is not None:
                where, host_side = _site(sys._getframe(1))
                reads.append(HostRead(name, where, host_side))
            return fn(t, *args, **kwargs)

        counted.__name__ = name
        return counted

    def __enter__(self) -> HostReadCounter:
        if self._saved:
            raise RuntimeError("HostReadCounter is already entered")
        for name in HOST_READS:
            own = torch.Tensor.__dict__.get(name)
            self._saved[name] = own  # None: inherited (from torch._C.TensorBase)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, own in self._saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        self._saved = {}
        self._reads = None

    @contextmanager
    def counting(self) -> Iterator[list[HostRead]]:
        """Record the host reads made inside the block into the list it yields."""
        if not self._saved:
            raise RuntimeError("enter the HostReadCounter before counting")
        reads: list[HostRead] = []
        self._reads = reads
        try:
            yield reads
        finally:
            self._reads = None


def force_device_path(auditor: Any) -> None:
    """Make ``auditor`` (a :class:`~dpaudit_torch.audit.PrivacyAuditor` on the CPU, before its
    first step) run the code an accelerator runs, with the same statistics:

    * the reader gathers with torch, packed (``pack_gathers``, :mod:`dpaudit_torch._gather`;
      so does the coverage watch) and keeps a step's finiteness as a tensor flag, checked at
      the next check (``check_finite_every_step=False``, ``compiled=False``: an accelerator's
      reader never has NumPy views of the gradients);
    * the canaries' rows are written, clipped by the optimizer's own code and added to the
      summed gradient by torch (the shadow's ``replica_clip``, ``host_rows`` and
      ``compiled_add`` switched off; ghost clipping: the strategy's ``compiled_add``);
    * monitors with a ``host_rows`` switch (the noise monitor) keep their rows as tensor copies;
    * monitors with a ``force_device_code`` method (the sequential pairs) build testers placed
      on the device (``tester_placement="device"``) with :data:`TESTER_DEVICE_CODE`, the torch
      code an accelerator runs (testers placed on the host keep their host code, as there);
    * so, with the reader's records, every monitor keeps device tensors until the check, whose
      one transfer brings them to the host (``Monitor.pending_tensors``).

    For tests and ``benchmarks/gpu_check.py --smoke``: a checkpoint resume rebuilds the injector
    with its defaults. ValueError after the first step (the rows buffer is set up then)."""
    if auditor.step:
        raise ValueError("force_device_path() must be called before the auditor's first step "
                         f"({auditor.step} steps audited)")
    tap = auditor.tap
    reader = tap.reader
    reader.check_finite_every_step = False
    reader.compiled = False
    inj = tap.injector
    if inj.shadow is not None:
        inj.shadow.replica_clip = False
        inj.shadow.host_rows = False
        inj.shadow.compiled_add = False
    if hasattr(inj.strategy, "compiled_add"):
        inj.strategy.compiled_add = False
    for monitor in auditor.monitors.values():
        if hasattr(monitor, "host_rows"):
            monitor.host_rows = False
        if hasattr(monitor, "force_device_code"):
            monitor.force_device_code(TESTER_DEVICE_CODE)
    pack_gathers(auditor, True)


def pack_gathers(auditor: Any, pack: bool) -> None:
    """Switch the packed gathers (:mod:`dpaudit_torch._gather`) of ``auditor``'s reader and of
    every monitor that watches tensors on (what an accelerator runs) or off (one take per
    tensor, the CPU's way): the same values either way. For force_device_path and
    ``benchmarks/gpu_check.py``, which times both on a GPU."""
    auditor.tap.reader.pack_gathers = pack
    for monitor in auditor.monitors.values():
        watch = getattr(monitor, "watch", None)
        if watch is not None and hasattr(watch, "set_pack"):
            watch.set_pack(pack)
