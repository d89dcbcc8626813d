"""Which tensors of a model changed between two points of training, cheaply (the coverage
monitor's per-step watch, docs/monitors/coverage.md).

A *fingerprint* of the model at one point is, per watched tensor (every parameter and buffer),
its L2 norm in its own precision (``torch._foreach_norm``: one fused pass over the tensors of a
device and dtype, no copy) and its values at a fixed sample of coordinates (every coordinate of
a tensor with no more than ``sample`` of them). Two fingerprints are compared bit for bit on
the device: a tensor whose fingerprint differs changed between the two points (equal values
written again, e.g. DDP's buffer broadcast or an in-place no-op, give equal fingerprints). The
per-tensor counters (steps with a change, the first and the last such step) stay on the device
until :meth:`TensorWatch.changes` reads them: no host synchronisation per point.

Tensors are looked up by name in their module at every point, so a buffer or parameter
*replaced* (``self.running = 0.9 * self.running + ...`` in ``forward``, ``p.data = ...``) is
compared by value like one written in place. A tensor replaced by one of another shape, or
removed, is recorded on the host as changed (its values are not comparable); a change of device
or dtype (``model.to(...)``) rebuilds the layout without a finding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..._compiled import compiled
from ..._gather import HostGather, PackedGather, count_changes, sum_squares
from ..._host_view import host_views

logger = logging.getLogger(__name__)

__all__ = ["WatchedTensor", "TensorWatch", "Fingerprint", "module_path"]

#: wrapper prefixes removed from a tensor's name (Opacus's GradSampleModule, DDP, DPDDP)
_WRAPPERS = ("_module.", "module.")


def module_path(name: str) -> str:
    """A tensor's name in the user's model: wrapper prefixes removed."""
    stripped = True
    while stripped:
        stripped = False
        for w in _WRAPPERS:
            if name.startswith(w):
                name, stripped = name[len(w):], True
    return name


@dataclass(frozen=True)
class WatchedTensor:
    """One tensor of the model: its path (wrappers removed), where it lives, what it is."""

    path: str
    module: torch.nn.Module = field(compare=False, repr=False)
    attr: str
    kind: str  # "parameter" | "buffer"
    held: bool  # held by the DP optimizer (its update at a release is the release)

    def current(self) -> torch.Tensor | None:
        table = self.module._parameters if self.kind == "parameter" else self.module._buffers
        t = table.get(self.attr)
        if t is None:
            return None
        # a sharded (DTensor) parameter: this rank's shard (a plain tensor skips the lookup,
        # which costs an exception for each tensor at every point)
        if type(t) not in _PLAIN and hasattr(t, "to_local"):
            t = t.to_local()
        return torch.view_as_real(t) if t.is_complex() else t


#: tensor types that are never sharded (no ``to_local``)
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def _key(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


#: on the CPU's host path, the tensors of one dtype are fingerprinted by one compiled pass of
#: sums of squares up to this many elements in all; larger ones by torch's fused norms (a
#: scalar loop over a large model would cost more than the dispatcher operations it saves)
HOST_NORM_MAX = 1 << 20


@dataclass
class Fingerprint:
    """The model's fingerprint at one point: one vector per device, of one layout."""

    layout: int
    #: per device group: a tensor, or on the CPU's host path a float64 NumPy array
    vectors: list[torch.Tensor | np.ndarray]


class _Group:
    """The tensors of one device: how a fingerprint is laid out, and the change counters."""

    def __init__(self, idx: list[int], tensors: list[torch.Tensor], held: list[bool],
                 sample: int, gen: torch.Generator, pack: bool | None = None) -> None:
        dev = tensors[0].device
        self.idx = idx
        by_norm: dict[torch.dtype, list[int]] = {}
        by_sample: dict[torch.dtype, list[int]] = {}
        self.take: list[torch.Tensor] = []
        for j, t in enumerate(tensors):
            if t.is_floating_point() and t.numel() > sample:
                by_norm.setdefault(t.dtype, []).append(j)
            by_sample.setdefault(t.dtype, []).append(j)
            n = t.numel()
            # a larger tensor: one coordinate drawn in each of ``sample`` equal strata
            # (distinct, ascending; O(sample) memory: a permutation of the whole tensor would
            # allocate 8 bytes per coordinate, hundreds of MB on a large model)
            pick = (torch.arange(n) if n <= sample
                    else torch.arange(sample) * (n // sample)
                    + torch.randint(n // sample, (sample,), generator=gen))
            self.take.append(pick.to(dev))
        self.norm_parts = list(by_norm.values())
        self.sample_parts = list(by_sample.values())
        self.numels = [t.numel() for t in tensors]
        self.gathers: list[PackedGather] = []
        #: on the CPU, unpacked: per sampled part, its dispatch-free host gather
        self.host: list[HostGather] | None = None
        self._cpu = dev.type == "cpu"
        self.set_pack(not self._cpu if pack is None else pack)
        seg = [j for part in self.norm_parts for j in part]
        seg += [j for part in self.sample_parts for j in part
                for _ in range(int(self.take[j].numel()))]
        self.seg = torch.tensor(seg, dtype=torch.long, device=dev)
        n = len(tensors)
        self.outside_held = torch.tensor([not h for h in held], dtype=torch.bool, device=dev)
        self.steps = torch.zeros(n, dtype=torch.int32, device=dev)
        self.first = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.last = torch.full((n,), -1, dtype=torch.long, device=dev)
        # the CPU's host path: the same counters through NumPy views, and the layout on the host
        self._np = ((self.steps.numpy(), self.first.numpy(), self.last.numpy(),
                     self.seg.numpy(), self.outside_held.numpy()) if self._cpu else None)
        self._norm_at = np.cumsum([0] + [len(p) for p in self.norm_parts]).tolist()
        self._norm_elements = [sum(self.numels[j] for j in p) for p in self.norm_parts]
        self._width = len(seg)

    def set_pack(self, pack: bool) -> None:
        """One gather per dtype of the sampled coordinates, packed (few launches, for an
        accelerator) or one take per tensor; the same values either way."""
        self.gathers = [PackedGather([self.take[j] for j in part],
                                     [self.numels[j] for j in part], pack)
                        for part in self.sample_parts]
        self.host = ([HostGather([self.take[j] for j in part]) for part in self.sample_parts]
                     if self._cpu and not pack else None)

    def _host_fingerprint(self, tensors: list[torch.Tensor]) -> np.ndarray | None:
        """:meth:`fingerprint` on the CPU with no dispatcher operation (compiled mode): each
        tensor's sum of squares (float64, one compiled pass per dtype) in place of its norm,
        and the sampled coordinates (:class:`HostGather`; torch's takes for a part of a dtype
        NumPy lacks, such as an integer buffer); None where the tensors of a sums-of-squares
        part have no NumPy views (the torch path then runs)."""
        assert self.host is not None
        out = np.empty(self._width, dtype=np.float64)
        view_of: dict[int, np.ndarray] = {}  # each tensor viewed once per point
        at = self._norm_at[-1]
        for part, gather, by_torch in zip(self.sample_parts, self.host, self.gathers):
            ts = [tensors[j] for j in part]
            views = host_views(ts)
            if views is None:  # no NumPy dtype (an integer buffer): torch's takes
                vals = by_torch(ts).double().numpy()
            else:
                vals = gather.read(views)
                view_of.update(zip(part, views))
            out[at:at + vals.shape[0]] = vals
            at += vals.shape[0]
        for k, part in enumerate(self.norm_parts):
            into = out[self._norm_at[k]:self._norm_at[k + 1]]
            if self._norm_elements[k] > HOST_NORM_MAX:  # torch's fused (vectorised) norms
                into[:] = torch.stack(torch._foreach_norm([tensors[j] for j in part])
                                      ).double().numpy()
                continue
            views = tuple(view_of[j] for j in part) if all(j in view_of for j in part) \
                else host_views([tensors[j] for j in part])
            if views is None:
                return None
            sum_squares(views, into)
        return out

    def fingerprint(self, tensors: list[torch.Tensor]) -> torch.Tensor | np.ndarray:
        if self.host is not None and compiled():
            host = self._host_fingerprint(tensors)
            if host is not None:
                return host
        parts = [torch.stack(torch._foreach_norm([tensors[j] for j in part])).double()
                 for part in self.norm_parts]
        for k, (part, gather) in enumerate(zip(self.sample_parts, self.gathers)):
            got = [tensors[j] for j in part]
            # the CPU's dispatch-free read where the part has NumPy views, else torch's takes
            read = None if self.host is None else self.host[k](got)
            parts.append(gather(got).double() if read is None else torch.from_numpy(read))
        return torch.cat(parts)

    def compare(self, now: torch.Tensor | np.ndarray, before: torch.Tensor | np.ndarray,
                step: int, held_too: bool) -> None:
        if isinstance(now, np.ndarray) or isinstance(before, np.ndarray):
            if not (isinstance(now, np.ndarray) and isinstance(before, np.ndarray)):
                return  # one point read on the host, one by torch: not comparable
            assert self._np is not None
            steps, first, last, seg, outside = self._np
            count_changes(now.view(np.int64), before.view(np.int64), seg, outside, held_too,
                          step, steps, first, last)
            return
        diff = (now.view(torch.int64) != before.view(torch.int64)).to(torch.int32)
        changed = torch.zeros_like(self.steps).index_add_(0, self.seg, diff) > 0
        if not held_too:
            changed &= self.outside_held
        self.steps += (changed & (self.last != step)).to(torch.int32)
        self.first = torch.where(changed & (self.first < 0), step, self.first)
        self.last = torch.where(changed, step, self.last)


class TensorWatch:
    """Fingerprints of every parameter and buffer of ``model`` and the changes between them.

    Args:
        model: the model being trained.
        held: ids of the tensors the DP optimizer holds.
        sample: coordinates sampled per tensor (every coordinate of a smaller one).
        ignore: paths (or path prefixes ending in ".") not watched.
    """

    def __init__(self, model: torch.nn.Module, held: set[int], sample: int = 8,
                 ignore: tuple[str, ...] = ()) -> None:
        self.sample = int(sample)
        seen: set[int] = set()
        self.tensors: list[WatchedTensor] = []
        for prefix, mod in model.named_modules():
            for kind, table in (("parameter", mod._parameters), ("buffer", mod._buffers)):
                for attr, t in table.items():
                    if t is None or id(t) in seen:
                        continue
                    seen.add(id(t))
                    path = module_path(f"{prefix}.{attr}" if prefix else attr)
                    if any(path == i or (i.endswith(".") and path.startswith(i))
                           for i in ignore):
                        continue
                    self.tensors.append(WatchedTensor(path, mod, attr, kind, id(t) in held))
        self._keys: list[tuple[Any, ...] | None] = []
        self._layout = 0  # how many layouts were built (fingerprints of one layout compare)
        self._groups: list[_Group] = []
        #: host totals per tensor index: [steps, first, last] (counters of earlier layouts)
        self._host: dict[int, list[int]] = {}
        #: tensor index -> first step at which it was replaced by another shape or removed
        self.reshaped: dict[int, int] = {}
        self._gen = torch.Generator().manual_seed(20240717)
        #: pack the sampled coordinates' gathers (None: on an accelerator only; :meth:`set_pack`)
        self.pack: bool | None = None

    def set_pack(self, pack: bool) -> None:
        """Pack the sampled coordinates' gathers on every device (True; tests run the
        accelerator's way on the CPU) or on none (False)."""
        self.pack = pack
        for g in self._groups:
            g.set_pack(pack)

    # ------------------------------------------------------------------ points
    def fingerprint(self, step: int | None) -> Fingerprint:
        """The model's fingerprint now (one vector per device). Where the layout changed since
        the last point (``step``: where a reshaped or removed tensor is recorded), it is not
        comparable with the earlier ones."""
        cur = [w.current() for w in self.tensors]
        keys = [_key(t) for t in cur]
        if keys != self._keys:
            if self._layout:
                for i, (a, b) in enumerate(zip(self._keys, keys)):
                    if a != b and (a is None or b is None or a[0] != b[0]):
                        self.reshaped.setdefault(i, -1 if step is None else step)
                logger.debug("coverage watch: the model's tensors changed layout; rebuilt")
            self._rebuild(cur, keys)
        with torch.no_grad():
            return Fingerprint(self._layout,
                               [g.fingerprint([cur[i] for i in g.idx]) for g in self._groups])

    def compare(self, now: Fingerprint, before: Fingerprint | None, step: int,
                held_too: bool) -> None:
        """Record the tensors whose fingerprint differs between ``before`` and ``now`` as
        changed at ``step`` (the DP optimizer's own tensors only where ``held_too``)."""
        if before is None or before.layout != now.layout:
            return
        with torch.no_grad():
            for g, a, b in zip(self._groups, now.vectors, before.vectors):
                g.compare(a, b, step, held_too)

    def _rebuild(self, cur: list[torch.Tensor | None], keys: list[Any]) -> None:
        for g in self._groups:  # keep what the old layout counted (host, a rare event)
            for j, i in enumerate(g.idx):
                s, f, last = int(g.steps[j]), int(g.first[j]), int(g.last[j])
                if s:
                    h = self._host.setdefault(i, [0, f, last])
                    h[0] += s
                    h[2] = max(h[2], last)
        by_dev: dict[Any, list[int]] = {}
        for i, t in enumerate(cur):
            if t is not None and t.numel() > 0:
                by_dev.setdefault(t.device, []).append(i)
        self._groups = [
            _Group(idx, [cur[i] for i in idx], [self.tensors[i].held for i in idx],
                   self.sample, self._gen, self.pack)
            for idx in by_dev.values()]
        self._keys = keys
        self._layout += 1

    # ------------------------------------------------------------------ results
    def changes(self) -> dict[int, tuple[int, int]]:
        """Tensor index -> (steps with a change, first such step), read to the host."""
        out = {i: (h[0], h[1]) for i, h in self._host.items()}
        for g in self._groups:
            steps, first = g.steps.tolist(), g.first.tolist()
            for j, i in enumerate(g.idx):
                if steps[j]:
                    s0, f0 = out.get(i, (0, first[j]))
                    out[i] = (s0 + steps[j], min(f0, first[j]) if f0 >= 0 else first[j])
        for i, step in self.reshaped.items():
            s0, f0 = out.get(i, (0, step))
            out[i] = (max(s0, 1), min(f0, step) if f0 >= 0 else step)
        return out
