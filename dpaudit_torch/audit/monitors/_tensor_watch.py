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

*Weight averages.* A buffer paired with a parameter (:func:`pair_averages`: declared, or by
the name rule of :func:`average_stems`) shares that parameter's sampled coordinates; where it
changed, :func:`~dpaudit_torch._gather.fit_averages` checks at those coordinates whether the
change is one update ``b <- (1 - beta) b + beta p`` towards the parameter's value after the
release, for one beta in [0, 1], within the rounding of the buffer's dtype. A change that fits
is counted as post-processing of the release, not as a change (docs/monitors/coverage.md,
"Weight averages"). The extra work is one compiled pass (or a fixed number of vectorised torch
operations) per comparison over the paired buffers' sampled coordinates, and none for a model
without paired buffers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import torch

from ..._compiled import compiled
from ..._gather import (
    HostGather,
    PackedGather,
    average_tolerance,
    count_changes,
    fit_averages,
    sum_squares,
)
from ..._host_view import host_views
from ...contract import module_path

logger = logging.getLogger(__name__)

__all__ = ["WatchedTensor", "TensorWatch", "Fingerprint", "module_path", "ignore_matches",
           "average_stems", "AVERAGE_MARKERS", "AveragePair"]


def ignore_matches(path: str, entry: str) -> bool:
    """Whether the coverage ``ignore`` entry ``entry`` leaves the tensor ``path`` out: the
    path itself, a prefix ending in ``"."``, or a shell-style pattern (``fnmatch``: ``*``
    matches any characters, dots included; ``?``, ``[seq]``)."""
    return (path == entry or (entry.endswith(".") and path.startswith(entry))
            or fnmatchcase(path, entry))


#: the words that mark a weight average in a buffer's path (the pairing rule of
#: :func:`average_stems`)
AVERAGE_MARKERS = ("ema", "swa", "avg", "average", "averaged", "shadow")


def _marked(component: str) -> bool:
    return any(component == m or component.startswith(m + "_") or component.endswith("_" + m)
               for m in AVERAGE_MARKERS)


def _unmarked(component: str) -> list[str]:
    """``component`` with a marker prefix ``marker_`` or suffix ``_marker`` removed."""
    out = []
    for m in AVERAGE_MARKERS:
        if component.startswith(m + "_") and len(component) > len(m) + 1:
            out.append(component[len(m) + 1:])
        if component.endswith("_" + m) and len(component) > len(m) + 1:
            out.append(component[:-len(m) - 1])
    return out


def average_stems(path: str) -> list[str]:
    """The parameter paths a buffer at ``path`` may be the weight average of, by the name rule
    (docs/monitors/coverage.md, "Weight averages"): one module component that is a marker of
    :data:`AVERAGE_MARKERS`, or carries one as a ``marker_`` prefix or ``_marker`` suffix,
    removed (``ema.fc.weight``, ``model_ema.fc.weight`` -> ``fc.weight``) or freed of its
    marker (``net_ema.fc.weight`` -> ``net.fc.weight``), or the marker prefix or suffix removed
    from the tensor's own name (``fc.weight_ema``, ``fc.ema_weight`` -> ``fc.weight``). (A
    marked component may also stand for another module: :meth:`TensorWatch._pair` matches
    ``ema.fc.weight`` with ``net.fc.weight``.)"""
    comps = path.split(".")
    out: list[str] = []
    for i, c in enumerate(comps[:-1]):
        if _marked(c):
            out.append(".".join(comps[:i] + comps[i + 1:]))
            out += [".".join([*comps[:i], u, *comps[i + 1:]]) for u in _unmarked(c)]
    out += [".".join([*comps[:-1], u]) for u in _unmarked(comps[-1])]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class AveragePair:
    """A buffer watched as the weight average of a parameter (indices into the watch's
    tensors) and how the pair was made (``"declared"`` or ``"name"``)."""

    buffer: int
    parameter: int
    paired_by: str


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
                 sample: int, gen: torch.Generator, pack: bool | None = None,
                 pairs: list[tuple[int, int, int]] = ()) -> None:  # type: ignore[assignment]
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
        for jb, jp, _ in pairs:  # a weight average is read where its parameter is
            self.take[jb] = self.take[jp]
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
        self._pairs_layout(pairs, seg, len(self._norm_at) and self._norm_at[-1], dev, tensors)

    def _pairs_layout(self, pairs: list[tuple[int, int, int]], seg: list[int], n_norm: int,
                      dev: torch.device, tensors: list[torch.Tensor]) -> None:
        """Where each paired buffer's and its parameter's sampled coordinates lie in a
        fingerprint (the same coordinates, in the same order), the fit's constants and its
        counters (per pair: steps that fit, the first and last, the fitted beta's range)."""
        at: dict[int, list[int]] = {}
        wanted = {j for jb, jp, _ in pairs for j in (jb, jp)}
        for e in range(n_norm, len(seg)):
            if seg[e] in wanted:
                at.setdefault(seg[e], []).append(e)
        off, pos_b, pos_p = [0], [], []
        for jb, jp, _ in pairs:
            pos_b += at[jb]
            pos_p += at[jp]
            off.append(len(pos_b))
        #: the watch's pair index of each pair of this group
        self.av_index = [k for _, _, k in pairs]
        i64 = dict(dtype=torch.long, device=dev)
        self.av_buf = torch.tensor([jb for jb, _, _ in pairs], **i64)
        self.av_off = torch.tensor(off, **i64)
        self.av_pos_b = torch.tensor(pos_b, **i64)
        self.av_pos_p = torch.tensor(pos_p, **i64)
        self.av_seg = torch.repeat_interleave(
            torch.arange(len(pairs), **i64), self.av_off.diff()) if pairs else self.av_pos_b
        fin = [torch.finfo(tensors[jb].dtype) for jb, _, _ in pairs]
        f64 = dict(dtype=torch.float64, device=dev)
        self.av_unit = torch.tensor([f.eps / 2 for f in fin], **f64)
        self.av_tiny = torch.tensor([f.tiny for f in fin], **f64)
        k = len(pairs)
        self.av_steps = torch.zeros(k, dtype=torch.int32, device=dev)
        self.av_first = torch.full((k,), -1, **i64)
        self.av_last = torch.full((k,), -1, **i64)
        self.beta_min = torch.full((k,), float("inf"), **f64)
        self.beta_max = torch.full((k,), float("-inf"), **f64)
        self.excused = torch.zeros(len(self.numels), dtype=torch.bool, device=dev)
        self._av_np = (tuple(t.numpy() for t in (
            self.av_buf, self.av_off, self.av_pos_b, self.av_pos_p, self.av_unit, self.av_tiny,
            self.excused, self.av_steps, self.av_first, self.av_last, self.beta_min,
            self.beta_max)) if self._cpu else None)

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
                step: int, held_too: bool, post_now: bool) -> None:
        pairs = len(self.av_index) > 0
        if isinstance(now, np.ndarray) or isinstance(before, np.ndarray):
            if not (isinstance(now, np.ndarray) and isinstance(before, np.ndarray)):
                return  # one point read on the host, one by torch: not comparable
            assert self._np is not None and self._av_np is not None
            steps, first, last, seg, outside = self._np
            (buf, off, pos_b, pos_p, unit, tiny, excused, av_steps, av_first, av_last, bmin,
             bmax) = self._av_np
            now_bits, before_bits = now.view(np.int64), before.view(np.int64)
            if pairs:
                fit_averages(now, before, now if post_now else before, now_bits, before_bits,
                             buf, off, pos_b, pos_p, unit, tiny, step, excused, av_steps,
                             av_first, av_last, bmin, bmax)
            count_changes(now_bits, before_bits, seg, outside, held_too, step, steps, first,
                          last, excused)
            return
        diff = (now.view(torch.int64) != before.view(torch.int64)).to(torch.int32)
        changed = torch.zeros_like(self.steps).index_add_(0, self.seg, diff) > 0
        if not held_too:
            changed &= self.outside_held
        if pairs:
            changed &= ~self._fit(now, before, now if post_now else before, step)
        self.steps += (changed & (self.last != step)).to(torch.int32)
        self.first = torch.where(changed & (self.first < 0), step, self.first)
        self.last = torch.where(changed, step, self.last)

    def _fit(self, now: torch.Tensor, before: torch.Tensor, post: torch.Tensor,
             step: int) -> torch.Tensor:
        """:func:`~dpaudit_torch._gather.fit_averages` in vectorised torch operations (a fixed
        number, whatever the number of pairs): the tensors whose change fits."""
        pb, seg, k = self.av_pos_b, self.av_seg, len(self.av_index)
        bo, bn, p = before[pb], now[pb], post[self.av_pos_p]
        moved = torch.zeros(k, dtype=torch.int32, device=bo.device).index_add_(
            0, seg, (now.view(torch.int64)[pb] != before.view(torch.int64)[pb]).to(torch.int32))
        d, e = bn - bo, p - bo
        t = average_tolerance(self.av_unit[seg], bo, bn, p, self.av_tiny[seg])
        zero = e == 0
        bad = ~(bo.isfinite() & bn.isfinite() & p.isfinite()) | (zero & (d.abs() > t))
        safe = torch.where(zero, torch.ones_like(e), e)
        a, c = (d - t) / safe, (d + t) / safe
        lo_e = torch.where(zero, torch.zeros_like(e), torch.minimum(a, c))
        hi_e = torch.where(zero, torch.ones_like(e), torch.maximum(a, c))
        lo = torch.zeros(k, dtype=torch.float64, device=bo.device).scatter_reduce_(
            0, seg, lo_e, "amax")
        hi = torch.ones(k, dtype=torch.float64, device=bo.device).scatter_reduce_(
            0, seg, hi_e, "amin")
        nbad = torch.zeros_like(moved).index_add_(0, seg, bad.to(torch.int32))
        fits = (moved > 0) & (nbad == 0) & (lo <= hi)
        tied = torch.zeros_like(moved).index_add_(0, seg, (~zero).to(torch.int32)) > 0
        beta = torch.where(fits & tied, 0.5 * (lo + hi), torch.full_like(lo, float("nan")))
        self.av_steps += (fits & (self.av_last != step)).to(torch.int32)
        # in place: on the CPU the host path's NumPy views share these counters
        self.av_first.copy_(torch.where(fits & (self.av_first < 0), step, self.av_first))
        self.av_last.copy_(torch.where(fits, step, self.av_last))
        self.beta_min.copy_(torch.where(fits, torch.fmin(self.beta_min, beta), self.beta_min))
        self.beta_max.copy_(torch.where(fits, torch.fmax(self.beta_max, beta), self.beta_max))
        return torch.zeros_like(self.excused).index_put_((self.av_buf,), fits)


class TensorWatch:
    """Fingerprints of every parameter and buffer of ``model`` and the changes between them.

    Args:
        model: the model being trained.
        held: ids of the tensors the DP optimizer holds.
        sample: coordinates sampled per tensor (every coordinate of a smaller one).
        ignore: entries of :func:`ignore_matches` (paths, prefixes ending in ".", patterns):
            the tensors they match are not watched; :attr:`unmatched_ignore` lists those that
            match no name of the model.
        averages: declared (buffer path, parameter path) pairs of weight averages; ValueError
            where one names no watched buffer or parameter or the two do not fit together.
            Other buffers are paired by the name rule (:func:`average_stems`).
    """

    def __init__(self, model: torch.nn.Module, held: set[int], sample: int = 8,
                 ignore: tuple[str, ...] = (),
                 averages: tuple[tuple[str, str], ...] = ()) -> None:
        self.sample = int(sample)
        seen: set[int] = set()
        matched: set[str] = set()
        self.tensors: list[WatchedTensor] = []
        for prefix, mod in model.named_modules(remove_duplicate=False):
            for kind, table in (("parameter", mod._parameters), ("buffer", mod._buffers)):
                for attr, t in table.items():
                    if t is None:
                        continue
                    path = module_path(f"{prefix}.{attr}" if prefix else attr)
                    hits = [i for i in ignore if ignore_matches(path, i)]
                    matched.update(hits)
                    if id(t) in seen or hits:
                        seen.add(id(t))
                        continue
                    seen.add(id(t))
                    self.tensors.append(WatchedTensor(path, mod, attr, kind, id(t) in held))
        #: the ``ignore`` entries that match no parameter or buffer of the model
        self.unmatched_ignore = [i for i in dict.fromkeys(ignore) if i not in matched]
        #: the weight averages watched as such
        self.pairs = self._pair(averages)
        self._keys: list[tuple[Any, ...] | None] = []
        self._layout = 0  # how many layouts were built (fingerprints of one layout compare)
        self._groups: list[_Group] = []
        #: host totals per tensor index: [steps, first, last] (counters of earlier layouts)
        self._host: dict[int, list[int]] = {}
        #: host totals per pair index: [steps, first, last, beta min, beta max] (likewise)
        self._av_host: dict[int, list[float]] = {}
        #: tensor index -> first step at which it was replaced by another shape or removed
        self.reshaped: dict[int, int] = {}
        self._gen = torch.Generator().manual_seed(20240717)
        #: pack the sampled coordinates' gathers (None: on an accelerator only; :meth:`set_pack`)
        self.pack: bool | None = None

    def _pairable(self, b: int, p: int) -> str | None:
        """Why buffer ``b`` cannot be watched as the average of parameter ``p``, or None."""
        tb, tp = self.tensors[b].current(), self.tensors[p].current()
        if tb is None or tp is None:
            return "one of them is None"
        if not (tb.is_floating_point() and tp.is_floating_point()):
            return "both must be floating point"
        if tb.shape != tp.shape:
            return f"their shapes differ ({tuple(tb.shape)} and {tuple(tp.shape)})"
        if tb.device != tp.device:
            return f"they lie on different devices ({tb.device} and {tp.device})"
        if min(tb.numel(), self.sample) < 2:
            return ("fewer than two coordinates are sampled (any change of one coordinate "
                    "fits some beta)")
        return None

    def _pair(self, declared: tuple[tuple[str, str], ...]) -> list[AveragePair]:
        by_path = {w.path: i for i, w in enumerate(self.tensors)}
        out: dict[int, AveragePair] = {}
        for b_path, p_path in declared:
            b, p = by_path.get(b_path), by_path.get(p_path)
            if b is None or self.tensors[b].kind != "buffer":
                raise ValueError(f"averages: {b_path!r} is not a watched buffer of the model "
                                 f"(paths are the model's, wrapper prefixes removed)")
            if p is None or self.tensors[p].kind != "parameter":
                raise ValueError(f"averages: {p_path!r} (the parameter of {b_path!r}) is not a "
                                 f"watched parameter of the model")
            why = self._pairable(b, p)
            if why is not None:
                raise ValueError(f"averages: {b_path!r} cannot be the average of {p_path!r}: "
                                 f"{why}")
            out[b] = AveragePair(b, p, "declared")
        params = {w.path: i for i, w in enumerate(self.tensors) if w.kind == "parameter"}
        #: (position, the path without that component) -> parameters (built where needed)
        sibling: dict[tuple[int, tuple[str, ...]], list[int]] | None = None
        for b, w in enumerate(self.tensors):
            if w.kind != "buffer" or b in out:
                continue
            comps = w.path.split(".")
            marked = [i for i, c in enumerate(comps[:-1]) if _marked(c)]
            found = [params[c] for c in average_stems(w.path) if c in params]
            if marked and sibling is None:
                sibling = {}
                for path, i in params.items():
                    pc = path.split(".")
                    for j in range(len(pc) - 1):
                        if not _marked(pc[j]):
                            sibling.setdefault((j, tuple(pc[:j] + pc[j + 1:])), []).append(i)
            for j in marked:  # the marked component standing for another module
                assert sibling is not None
                found += sibling.get((j, tuple(comps[:j] + comps[j + 1:])), [])
            cands = [p for p in dict.fromkeys(found) if self._pairable(b, p) is None]
            if len(cands) == 1:
                out[b] = AveragePair(b, cands[0], "name")
            elif cands:
                logger.debug("coverage watch: %s matches several parameters by name; not paired",
                             w.path)
        return [out[b] for b in sorted(out)]

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
                held_too: bool, post_now: bool = False) -> None:
        """Record the tensors whose fingerprint differs between ``before`` and ``now`` as
        changed at ``step`` (the DP optimizer's own tensors only where ``held_too``), except a
        paired buffer whose change fits a weight-average update towards its parameter's
        values after the release: those of ``now`` where ``post_now`` (the release lies
        between the two points), else those of ``before``."""
        if before is None or before.layout != now.layout:
            return
        with torch.no_grad():
            for g, a, b in zip(self._groups, now.vectors, before.vectors):
                g.compare(a, b, step, held_too, post_now)

    def _rebuild(self, cur: list[torch.Tensor | None], keys: list[Any]) -> None:
        for g in self._groups:  # keep what the old layout counted (host, a rare event)
            for j, i in enumerate(g.idx):
                s, f, last = int(g.steps[j]), int(g.first[j]), int(g.last[j])
                if s:
                    h = self._host.setdefault(i, [0, f, last])
                    h[0] += s
                    h[2] = max(h[2], last)
            self._keep_averages(g)
        by_dev: dict[Any, list[int]] = {}
        for i, t in enumerate(cur):
            if t is not None and t.numel() > 0:
                by_dev.setdefault(t.device, []).append(i)
        self._groups = [
            _Group(idx, [cur[i] for i in idx], [self.tensors[i].held for i in idx],
                   self.sample, self._gen, self.pack, self._local_pairs(idx))
            for idx in by_dev.values()]
        self._keys = keys
        self._layout += 1

    def _local_pairs(self, idx: list[int]) -> list[tuple[int, int, int]]:
        """The pairs of a device group in its own indices (buffer, parameter, pair index):
        those whose two tensors lie in it and still fit together in this layout."""
        local = {i: j for j, i in enumerate(idx)}
        out = []
        for k, pr in enumerate(self.pairs):
            if pr.buffer in local and pr.parameter in local:
                if self._pairable(pr.buffer, pr.parameter) is None:
                    out.append((local[pr.buffer], local[pr.parameter], k))
                else:
                    logger.debug("coverage watch: %s no longer fits %s; watched as a buffer",
                                 self.tensors[pr.buffer].path, self.tensors[pr.parameter].path)
        return out

    def _keep_averages(self, g: _Group) -> None:
        steps, first, last = g.av_steps.tolist(), g.av_first.tolist(), g.av_last.tolist()
        lo, hi = g.beta_min.tolist(), g.beta_max.tolist()
        for j, k in enumerate(g.av_index):
            if steps[j]:
                h = self._av_host.setdefault(k, [0, first[j], last[j], lo[j], hi[j]])
                h[0] += steps[j]
                h[2], h[3], h[4] = max(h[2], last[j]), min(h[3], lo[j]), max(h[4], hi[j])

    # ------------------------------------------------------------------ results
    def averages(self) -> dict[int, tuple[int, int, float, float]]:
        """Pair index -> (steps at which its buffer changed as a weight average, the first
        such step, the fitted beta's smallest and largest value), read to the host; pairs
        whose buffer never so changed are left out."""
        acc = {k: list(h) for k, h in self._av_host.items()}
        for g in self._groups:
            steps, first, last = g.av_steps.tolist(), g.av_first.tolist(), g.av_last.tolist()
            lo, hi = g.beta_min.tolist(), g.beta_max.tolist()
            for j, k in enumerate(g.av_index):
                if not steps[j]:
                    continue
                h = acc.get(k)
                if h is None:
                    acc[k] = [steps[j], first[j], last[j], lo[j], hi[j]]
                else:
                    h[0] += steps[j]
                    h[1], h[3], h[4] = min(h[1], first[j]), min(h[3], lo[j]), max(h[4], hi[j])
        return {k: (int(h[0]), int(h[1]), float(h[3]), float(h[4])) for k, h in acc.items()}


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
