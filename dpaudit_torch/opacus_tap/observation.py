"""Reading the DP gradient at the canary coordinates: the real data's sum, then the release.

Two reads per logical step (docs/design.md section 8):

1. **Snapshot** (:meth:`GradientReader.snapshot`), inside the injection wrapper, right after
   Opacus has clipped and summed the *real* examples of the step into ``p.summed_grad`` (summed
   over every ``BatchMemoryManager`` micro-batch of the step) and before the canaries and the
   noise are added: S_t / C at every canary coordinate.
2. **Release** (:meth:`GradientReader.read`), in a step pre-hook of
   ``optimizer.original_optimizer`` (``DPOptimizer`` itself does not call ``Optimizer.__init__``,
   so it has no hooks of its own): Opacus has noised and scaled the gradient (and, under DDP,
   all-reduced it), and the update has not been applied yet. The value at a canary coordinate is
   ``p.grad * expected_batch_size * accumulated_iterations (* world_size) / C_i - S_t / C_i``
   (under DDP S_t is summed over the ranks first), which for a correct implementation is
   ``c 1{canary present} + N(0, sigma^2)`` with c = 1: the real data's gradient no longer
   interferes.

:class:`GradientReader` turns one step into a framework-free
:class:`~dpaudit_torch.contract.StepRecord`. Everything stays on the parameters' device: a step
costs a handful of index gathers and no host synchronisation (except the finiteness check on CPU,
where it is free; on CPU one compiled pass reads every coordinate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._buffers import NUMPY_FLOAT_OF, host_copy, host_zeros
from .._compiled import compiled as kernels_compiled
from .._gather import PackedGather
from .._host_view import host_views
from ..canaries import CanaryDesign
from ..contract import StepRecord
from ._step_kernels import release_step, snapshot_step
from .plan import StepPlan

__all__ = ["GradientReader", "host_views"]

class _HostBuffers:
    """The compiled CPU path's coordinates and output arrays, allocated once.

    The canary coordinates (design order) followed by the noise-audit coordinates, as one pair
    of index arrays, and every per-step output as a persistent float64 array (with a torch view
    of each): a step allocates nothing of the coordinates' size, so that the auditor leaves
    the process's heap as training shapes it (docs/auditor.md, "Memory"). The values of a step
    are overwritten by the next one: a monitor that keeps them copies them."""

    def __init__(self, canary: CoordinateSet, noise: CoordinateSet | None, k: int) -> None:
        n_c, u = canary.n, 0 if noise is None else noise.n
        self.n_canary, self.n_noise, self.k = n_c, u, k
        parts = [canary] if noise is None else [canary, noise]
        # filled in place: no temporary of the coordinates' size on the C heap
        self.param, self.flat = host_zeros(n_c + u, np.int64), host_zeros(n_c + u, np.int64)
        at = 0
        for c in parts:
            self.param[at:at + c.n], self.flat[at:at + c.n] = c.param_np, c.flat_np
            at += c.n
        self.snap = host_zeros(n_c + u)
        self.vals = host_zeros(n_c)
        self.xy = host_zeros(2 * k)
        self.rel, self.noise_raw, self.noise = host_zeros(u), host_zeros(u), host_zeros(u)
        t = torch.from_numpy
        self.snap_t, self.vals_t, self.xy_t = t(self.snap), t(self.vals), t(self.xy)
        self.real_t, self.noise_real_t = self.snap_t[:n_c], self.snap_t[n_c:]
        self.x_t, self.y_t = self.xy_t[:k], self.xy_t[k:]
        self.rel_t, self.noise_raw_t, self.noise_t = t(self.rel), t(self.noise_raw), t(self.noise)

        self._vector: _VectorPass | None = None

    def vector(self, n_params: int, dtype: torch.dtype | None = None) -> _VectorPass:
        """The NumPy version of the one-pass reads (Python mode): built with the reader in
        Python mode (before training, like every long-lived buffer, its scratch for the
        gradients' ``dtype`` too), else at its first use."""
        if self._vector is None:
            self._vector = _VectorPass(self, n_params)
        if dtype is not None:
            self._vector.scratch(NUMPY_FLOAT_OF.get(dtype))
        return self._vector


class _VectorPass:
    """The one-pass reads of :func:`~._step_kernels.snapshot_step` and
    :func:`~._step_kernels.release_step` as a few vectorised NumPy calls per tensor, for
    Python mode (the kernels' Python source loops over every coordinate in the interpreter).

    Every coordinate is gathered tensor by tensor into one tensor-major scratch array of the
    gradients' dtype (``np.take`` into a slice, one call per tensor holding coordinates),
    converted and scaled into a float64 array in one call, then put in design order by one
    ``np.take`` per output: the same float64 operations as the kernels, into arrays allocated
    once (:func:`~dpaudit_torch._buffers.host_zeros`), so that a step allocates nothing of the
    coordinates' size on the heap training allocates from (docs/auditor.md, "Memory"). The one
    difference: the noise's sum of squares is summed pairwise (NumPy), not in coordinate order,
    so it may differ from the kernel's in its last bits."""

    def __init__(self, b: _HostBuffers, n_params: int) -> None:
        n, n_c = b.param.shape[0], b.n_canary
        order = np.argsort(b.param, kind="stable")
        self.n_canary = n_c
        # long-lived arrays of the coordinates' size: off the heap (host_copy)
        self.param_tm = host_copy(b.param[order])
        self.canary_tm = host_copy(order < n_c)  # tensor-major: a canary's coordinate?
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n, dtype=np.int64)
        self.inv_c = host_copy(inv[:n_c])
        self.inv_u = host_copy(inv[n_c:])
        counts = np.bincount(self.param_tm, minlength=n_params)
        starts = np.concatenate([[0], np.cumsum(counts)])
        flat_tm = b.flat[order]
        #: (tensor, start, end, its coordinates' flat indices) of every tensor holding some
        self.groups = [(p, int(starts[p]), int(starts[p + 1]),
                        np.ascontiguousarray(flat_tm[starts[p]:starts[p + 1]]))
                       for p in range(n_params) if counts[p]]
        self.tm64 = host_zeros(n)
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._factors: dict[str, tuple[np.ndarray, np.ndarray | None, np.ndarray]] = {}

    def _factor(self, what: str, canary: np.ndarray, other: np.ndarray | None) -> np.ndarray:
        """Per coordinate (tensor-major): ``canary[p]`` at the canary coordinates, ``other[p]``
        (None: 1) at the others; rebuilt only when the per-tensor arrays change (the reader
        caches them, so an unchanged factor is the same array)."""
        hit = self._factors.get(what)
        if hit is None or hit[0] is not canary or hit[1] is not other:
            fac = host_zeros(self.param_tm.shape[0])
            np.copyto(fac, np.where(self.canary_tm, canary[self.param_tm],
                                    1.0 if other is None else other[self.param_tm]))
            hit = self._factors[what] = (canary, other, fac)
        return hit[2]

    def gather(self, grads: tuple[np.ndarray, ...], factor: np.ndarray) -> np.ndarray:
        """Every coordinate's value times its factor, float64, tensor-major (:attr:`tm64`)."""
        n = self.tm64.shape[0]
        if not n:
            return self.tm64
        s = self.scratch(grads[self.groups[0][0]].dtype)
        assert s is not None
        for p, a, e, flat in self.groups:
            np.take(grads[p], flat, out=s[a:e], mode="clip")  # (indices are in range)
        np.multiply(s, factor, out=self.tm64)
        return self.tm64

    def scratch(self, dt: np.dtype | None) -> np.ndarray | None:
        """The tensor-major scratch array for gradients of NumPy dtype ``dt`` (made once)."""
        if dt is None:
            return None
        s = self._scratch.get(dt)
        if s is None:
            s = self._scratch[dt] = host_zeros(self.tm64.shape[0], dt)
        return s

    def snapshot(self, grads: tuple[np.ndarray, ...], inv_clip: np.ndarray,
                 out: np.ndarray) -> None:
        """:func:`~._step_kernels.snapshot_step`: canary coordinates times 1 / C_p, the
        noise-audit coordinates raw, into ``out`` (design order)."""
        tm = self.gather(grads, self._factor("snapshot", inv_clip, None))
        np.take(tm, self.inv_c, out=out[:self.n_canary], mode="clip")
        np.take(tm, self.inv_u, out=out[self.n_canary:], mode="clip")

    def release(self, grads: tuple[np.ndarray, ...], unit: np.ndarray, denom: np.ndarray,
                real: np.ndarray, noise_real: np.ndarray, inv_std: float,
                pair_order: np.ndarray, k: int, spread_pair: np.ndarray, side_a: np.ndarray,
                side_b: np.ndarray, spread_w: float, coins: np.ndarray, vals: np.ndarray,
                xy: np.ndarray, rel: np.ndarray, noise_raw: np.ndarray, noise: np.ndarray
                ) -> tuple[bool, float]:
        """:func:`~._step_kernels.release_step` (same arguments and outputs)."""
        tm = self.gather(grads, self._factor("release", unit, denom))
        np.take(tm, self.inv_c, out=vals, mode="clip")
        np.subtract(vals, real, out=vals)
        total = float(np.add.reduce(vals)) if vals.size else 0.0
        # a finite sum proves every value finite; otherwise look (a sum may also overflow)
        finite = math.isfinite(total) or bool(np.isfinite(vals).all())
        sumsq = 0.0
        if rel.size:
            np.take(tm, self.inv_u, out=rel, mode="clip")
            np.subtract(rel, noise_real, out=noise_raw)
            np.multiply(noise_raw, inv_std, out=noise)
            sumsq = float(np.dot(noise, noise))
        if k:
            np.take(vals, pair_order, out=xy, mode="clip")
        if spread_pair.size:
            sa = vals[side_a].sum(axis=1) * spread_w
            sb = vals[side_b].sum(axis=1) * spread_w
            c = coins[spread_pair]
            xy[spread_pair] = np.where(c, sa, sb)
            xy[k + spread_pair] = np.where(c, sb, sa)
        return finite, sumsq


class CoordinateSet:
    """A fixed set of (tensor, flat index) coordinates and how to gather them: the host arrays of
    the compiled pass, and (built at their first use: the compiled CPU path never needs them) per
    tensor the flat indices on the device (tensor-major) and the permutation back to the given
    order."""

    def __init__(self, coord_param: torch.Tensor, coord_flat: torch.Tensor, n_params: int,
                 device: torch.device) -> None:
        self._param, self._flat, self._n_params, self._device = (coord_param, coord_flat,
                                                                 n_params, device)
        self.n = int(coord_param.numel())
        self._torch: tuple[list[int], list[torch.Tensor], torch.Tensor, torch.Tensor] | None = None
        self._packed: tuple[bool, PackedGather] | None = None

    @property
    def param_np(self) -> np.ndarray:
        """The tensor of each coordinate (int64, a view of the given tensor: the compiled
        pass's buffers hold the one host copy)."""
        return self._param.numpy().astype(np.int64, copy=False)

    @property
    def flat_np(self) -> np.ndarray:
        """The flat index of each coordinate in its tensor (int64 view, as :attr:`param_np`)."""
        return self._flat.numpy().astype(np.int64, copy=False)

    def _index(self) -> tuple[list[int], list[torch.Tensor], torch.Tensor, torch.Tensor]:
        if self._torch is None:
            coord_param, coord_flat, device = self._param, self._flat, self._device
            order = torch.argsort(coord_param, stable=True)
            which: list[int] = []
            flat: list[torch.Tensor] = []
            for i in range(self._n_params):
                sel = order[coord_param[order] == i]
                if sel.numel():
                    which.append(i)
                    flat.append(coord_flat[sel].to(device, non_blocking=True))
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel())
            # (host-to-device copies of pageable memory: non_blocking makes the host wait for
            # none of the device's queued work; the values are staged before the call returns)
            self._torch = (which, flat, inv.to(device, non_blocking=True),
                           coord_param[order].to(device, non_blocking=True))
        return self._torch

    @property
    def which(self) -> list[int]:
        """The tensors holding coordinates of the set, in order."""
        return self._index()[0]

    @property
    def flat(self) -> list[torch.Tensor]:
        """Per tensor of :attr:`which`, its coordinates' flat indices (device)."""
        return self._index()[1]

    @property
    def perm(self) -> torch.Tensor:
        """From the tensor-major gather back to the set's order (device)."""
        return self._index()[2]

    @property
    def pos_param(self) -> torch.Tensor:
        """The tensor of each coordinate, in the tensor-major order (device)."""
        return self._index()[3]

    def gather(self, tensors: list[torch.Tensor], pack: bool,
               numels: list[int]) -> torch.Tensor:
        """The set's coordinates of ``tensors`` (one per tensor of :attr:`which`),
        tensor-major: :class:`~dpaudit_torch._gather.PackedGather`, built at the first call
        (``pack``: few device operations; else one take per tensor; ``numels``: every
        parameter tensor's size, read then)."""
        hit = self._packed
        if hit is None or hit[0] != pack:
            hit = (pack, PackedGather(self.flat, [numels[i] for i in self.which], pack))
            self._packed = hit
        return hit[1](tensors)


class GradientReader:
    """Reads the real data's sum and the released gradient at every canary coordinate.

    Args:
        params: the optimizer's trainable parameters (``optimizer.params`` order).
        design: the canary coordinates.
        device: where the record's tensors live.
        check_finite_every_step: check finiteness on the host at every step (free on CPU; the
            record's ``finite`` is then a bool); otherwise it is a device flag, and non-finite
            values are replaced by 0 in the record so that no statistic sees them.
        compiled: allow the one-pass CPU read (the compiled kernels, or their vectorised NumPy
            version in Python mode; tests switch it off to compare with the torch path).
        noise_coords: (tensor, flat) of the noise-audit coordinates U (docs/design.md section
            11), or None: the released noise is read there as well.
    """

    #: whether this reader can use the compiled CPU pass (a sharded reader cannot)
    host_path = True

    def __init__(self, params: list[torch.nn.Parameter], design: CanaryDesign,
                 device: torch.device, check_finite_every_step: bool,
                 compiled: bool = True,
                 noise_coords: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.params = params
        self.design = design
        self.device = device
        self.check_finite_every_step = check_finite_every_step
        self.compiled = compiled
        self.k = design.k_pairs
        all_param, all_flat = design.coordinates()
        self._coords = CoordinateSet(all_param, all_flat, design.n_params, device)
        self._noise = (None if noise_coords is None or not noise_coords[0].numel()
                       else CoordinateSet(noise_coords[0], noise_coords[1], design.n_params,
                                           device))
        # the compiled CPU path reads every coordinate in design order directly
        self._host = device.type == "cpu" and all(p.device.type == "cpu" for p in params)
        #: the torch path's gathers packed (few launches; :mod:`dpaudit_torch._gather`) on an
        #: accelerator, one take per tensor on the CPU (tests switch it on there)
        self.pack_gathers = any(p.device.type != "cpu" for p in params)
        self._numels = [p.numel() for p in params]
        self._n_coords = self._coords.n
        # spread pairs: x and y are sums over their sides' coordinates / sqrt(L)
        self._spread_pair = design.spread_pair.numpy().astype(np.int64)
        self._side_a, self._side_b = design.spread_sides()
        self._spread_w = 1.0 / math.sqrt(design.spread_width)
        self._spread_dev: tuple[torch.device, torch.Tensor, torch.Tensor, torch.Tensor] | None \
            = None  # the three above on the record's device (_spread_on)
        self._n_extra = design.n_extra
        self._factors: dict[str, tuple[tuple[float, ...], torch.Tensor]] = {}
        self._host_factors: dict[str, tuple[tuple[Any, ...], np.ndarray]] = {}
        # the compiled CPU path's buffers, allocated now (before training allocates around
        # them) where that path can run, else at its first use
        self._bufs: _HostBuffers | None = (
            _HostBuffers(self._coords, self._noise, self.k)
            if compiled and self._host and self.host_path else None)
        if self._bufs is not None and not kernels_compiled() and params:
            # now, not among training's blocks at the first step
            self._bufs.vector(len(params), params[0].dtype)
        sa, sb = (np.ascontiguousarray(v, dtype=np.int64) for v in (self._side_a, self._side_b))
        width = sa.shape[1] if sa.ndim == 2 and sa.shape[0] else 1
        self._side_a_2d = sa.reshape(-1, width)
        self._side_b_2d = sb.reshape(-1, width)
        self.reads = 0  # steps read
        self.compiled_reads = 0  # of which by the one-pass CPU read
        #: values of the last step read (design order, units of C), for diagnostics and tests
        self.last_values: torch.Tensor | None = None

    # ------------------------------------------------------------------ helpers
    def _per_entry(self, values: list[float], cache: str, cs: CoordinateSet | None = None
                   ) -> torch.Tensor:
        """A per-parameter factor spread over the gathered entries (rebuilt only when the factors
        change, e.g. every step under adaptive clipping)."""
        cs = self._coords if cs is None else cs
        key = tuple(values)
        hit = self._factors.get(cache)
        if hit is None or hit[0] != key:
            hit = (key, torch.tensor(key, dtype=torch.float64).to(
                self.device, non_blocking=True)[cs.pos_param])
            self._factors[cache] = hit
        return hit[1]

    def _per_param(self, what: str, values: list[float], clip: list[float] | None = None
                   ) -> np.ndarray:
        """A per-parameter float64 array of the compiled passes, rebuilt only when its inputs
        change (every step under adaptive clipping): ``inv_clip`` 1 / C_i (inf for C_i = 0),
        ``unit`` the unit scales, ``denom`` unit scale x C_i."""
        key = (tuple(values), None if clip is None else tuple(clip))
        hit = self._host_factors.get(what)
        if hit is None or hit[0] != key:
            if what == "inv_clip":
                arr = np.asarray([1.0 / c if c else math.inf for c in values], dtype=np.float64)
            elif what == "unit":
                arr = np.asarray(values, dtype=np.float64)
            else:
                assert clip is not None
                arr = np.asarray([u * c for u, c in zip(values, clip)], dtype=np.float64)
            hit = (key, arr)
            self._host_factors[what] = hit
        return hit[1]

    def _host_arrays(self, tensors: list[torch.Tensor | None]) -> tuple[np.ndarray, ...] | None:
        """:func:`host_views` of ``tensors`` where this reader runs the one-pass CPU read, else
        None."""
        if not (self.compiled and self._host):
            return None
        return host_views(tensors)

    @torch.no_grad()
    def _gather(self, get: Callable[[int], torch.Tensor | None], scale: torch.Tensor,
                what: str, cs: CoordinateSet | None = None) -> torch.Tensor:
        cs = self._coords if cs is None else cs
        tensors = []
        for i in cs.which:
            g = get(i)
            if g is None:
                raise ValueError(f"parameter tensor {i} has no {what} at the optimizer step; "
                                 f"the audit cannot observe it")
            tensors.append(g)
        raw = cs.gather(tensors, self.pack_gathers, self._numels)
        return (raw.to(self.device, torch.float64) * scale)[cs.perm]

    # ------------------------------------------------------------------ the two reads
    def _buffers(self) -> _HostBuffers:
        if self._bufs is None:
            self._bufs = _HostBuffers(self._coords, self._noise, self.k)
        return self._bufs

    def snapshot(self, plan: StepPlan) -> torch.Tensor:
        """S_t / C: the real examples' clipped sum ``p.summed_grad`` at every canary coordinate
        (design order, float64), read before any canary or noise is added (a parameter without
        ``summed_grad`` contributes 0). Also keeps the raw sum at the noise-audit coordinates
        in ``plan.noise_real_sum``. On the compiled CPU path both are views of the reader's
        buffers (valid until the next step)."""
        sums = [getattr(p, "summed_grad", None) for p in self.params]
        host = self._host_arrays(sums)
        # the injector adds the canaries' sums through these views
        plan.summed_host = None if host is None else (sums, host)
        inv_clip = self._per_param("inv_clip", plan.clip)
        if host is not None:
            b = self._buffers()
            if kernels_compiled():
                snapshot_step(host, b.param, b.flat, inv_clip, b.n_canary, b.snap)
            else:  # Python mode: the same pass in vectorised NumPy
                b.vector(len(self.params)).snapshot(host, inv_clip, b.snap)
            if self._noise is not None:
                plan.noise_real_sum = b.noise_real_t
            return b.real_t

        def get(i: int) -> torch.Tensor:
            t = sums[i]
            return t if isinstance(t, torch.Tensor) else torch.zeros_like(self.params[i])

        with torch.no_grad():  # (the compiled pass above needs no autograd context)
            if self._noise is not None:
                plan.noise_real_sum = self._gather(
                    get, self._per_entry([1.0] * len(sums), "one", self._noise), "summed_grad",
                    self._noise)
            return self._gather(get, self._per_entry(inv_clip.tolist(), "inv_clip"),
                                "summed_grad")

    @torch.no_grad()
    def _read_noise(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(released, noise) in raw units at the noise-audit coordinates: the released value
        times the scaling Opacus divided by, and that minus the real examples' sum (torch
        path; the compiled path computes them in its single pass)."""
        if self._noise is None or plan.noise_real_sum is None:
            return None
        denom = [u * c for u, c in zip(plan.unit_scale, plan.clip)]
        rel = self._gather(lambda i: self.params[i].grad, self._per_entry(denom, "denom",
                                                                           self._noise),
                           "gradient", self._noise)
        return rel, rel - plan.noise_real_sum.to(rel.device)

    def read(self, plan: StepPlan, step: int) -> StepRecord:
        """The record of one logical step (``plan`` from the injector, its ``real_sum`` already
        summed over DDP ranks). On the host path a non-finite step gives ``finite=False``, and
        the record's tensors are views of the reader's buffers, valid until the next step."""
        real = plan.real_sum
        if real is None:  # the wrapper did not run its snapshot (cannot happen in a step)
            raise RuntimeError("no real-data snapshot for this step")
        grads = [p.grad for p in self.params]
        host = self._host_arrays(grads) if self.check_finite_every_step and (
            plan.pair_order is not None) else None
        if host is not None:
            rec = self._read_compiled(host, plan, step, real)
        else:
            rec = self._read_torch(plan, step, real)
            noise = self._read_noise(plan)
            if noise is not None and plan.noise_std > 0:
                rec.release_raw, rec.noise_raw = noise
                rec.noise = noise[1] / plan.noise_std
        rec.n_real, rec.micro_steps, rec.noise_std = plan.n_real, plan.micro_steps, plan.noise_std
        rec.n_extra = self._n_extra
        if rec.finite is not False:
            self.reads += 1
        self.last_values = rec.values
        return rec

    def _read_torch(self, plan: StepPlan, step: int, real: torch.Tensor) -> StepRecord:
        scale = self._per_entry(plan.unit_scale, "scale")
        vals = self._gather(lambda i: self.params[i].grad, scale, "gradient")
        vals = vals - real.to(vals.device)
        fin = torch.isfinite(vals).all()
        finite: bool | torch.Tensor
        if self.check_finite_every_step:
            finite = bool(fin)
        else:  # no host sync: a non-finite step contributes zeros and carries its flag
            finite = fin
            vals = torch.where(fin, vals, torch.zeros_like(vals))
            real = torch.where(fin, real, torch.zeros_like(real))
        k = self.k
        c = plan.coins
        if plan.pair_order is not None:  # x: the canary's coordinate of each pair, y: the other
            order = torch.from_numpy(plan.pair_order)
            xy = vals.index_select(0, order if order.device == vals.device
                                   else order.to(vals.device, non_blocking=True))
            x, y = xy[:k], xy[k:]
        else:
            a, b = vals[:k], vals[k:2 * k]
            x = torch.where(c, a, b)
            y = torch.where(c, b, a)
        if self._spread_pair.size:
            dev = vals.device
            sp, side_a, side_b = self._spread_on(dev)
            sa = vals[side_a].sum(1) * self._spread_w
            sb = vals[side_b].sum(1) * self._spread_w
            cs = c.to(dev)[sp]
            x, y = x.clone(), y.clone()
            x[sp] = torch.where(cs, sa, sb)
            y[sp] = torch.where(cs, sb, sa)
        return StepRecord(step=step, values=vals, x=x, y=y, coins=c, sigma=plan.sigma,
                          sigma_claimed=plan.sigma_claimed, finite=finite, real_sums=real)

    def _spread_on(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The spread pairs and the coordinates of their sides (design order) on ``dev``,
        copied there once (not at every step: a blocking host-to-device copy waits for the
        device's queued work)."""
        hit = self._spread_dev
        if hit is None or hit[0] != dev:
            hit = (dev, *(torch.from_numpy(a).to(dev, non_blocking=True)
                          for a in (self._spread_pair, self._side_a, self._side_b)))
            self._spread_dev = hit
        return hit[1], hit[2], hit[3]

    def _read_compiled(self, grads: tuple[np.ndarray, ...], plan: StepPlan, step: int,
                       real: torch.Tensor) -> StepRecord:
        """:meth:`read` for the CPU in one compiled pass
        (:func:`~dpaudit_torch.opacus_tap._step_kernels.release_step`; in Python mode its
        vectorised NumPy version, :class:`_VectorPass`): the canaries' values,
        the pairs (spread ones included) and, at the noise-audit coordinates, the released
        values and the noise; same values as the torch path."""
        self.compiled_reads += 1
        b = self._buffers()
        noise_on = self._noise is not None and plan.noise_real_sum is not None \
            and plan.noise_std > 0
        nr = plan.noise_real_sum
        if not b.n_noise or nr is None:
            noise_real = b.noise
        elif nr is b.noise_real_t:  # the snapshot's own buffer (no DDP sum): no torch call
            noise_real = b.snap[b.n_canary:]
        else:
            noise_real = (nr if nr.dtype == torch.float64 and nr.device.type == "cpu"
                          else nr.to("cpu", torch.float64)).numpy()
        unit = self._per_param("unit", plan.unit_scale, plan.clip)
        denom = self._per_param("denom", plan.unit_scale, plan.clip)
        real_np = (b.snap[:b.n_canary] if real is b.real_t
                   else (real if real.dtype == torch.float64 and real.device.type == "cpu"
                         else real.to("cpu", torch.float64)).numpy())
        coins = plan.coins_cpu.numpy() if plan.coins_np is None else plan.coins_np
        tail = (real_np, noise_real, 1.0 / plan.noise_std if noise_on else 0.0,
                plan.pair_order, self.k, self._spread_pair, self._side_a_2d, self._side_b_2d,
                self._spread_w, coins, b.vals, b.xy, b.rel, b.noise_raw, b.noise)
        if kernels_compiled():
            ok, sumsq = release_step(grads, b.param, b.flat, unit, denom, b.n_canary, *tail)
        else:  # Python mode: the same pass in vectorised NumPy
            ok, sumsq = b.vector(len(self.params)).release(grads, unit, denom, *tail)
        rec = StepRecord(step=step, values=b.vals_t, x=b.x_t, y=b.y_t, coins=plan.coins,
                         sigma=plan.sigma, sigma_claimed=plan.sigma_claimed, finite=bool(ok),
                         real_sums=real, host=b)
        if noise_on:
            rec.release_raw, rec.noise_raw, rec.noise = b.rel_t, b.noise_raw_t, b.noise_t
            rec.noise_sumsq = float(sumsq)
        return rec
