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
:class:`~dpaudit_torch.audit.record.StepRecord`. Everything stays on the parameters' device: a step
costs a handful of index gathers and no host synchronisation (except the finiteness check on CPU,
where it is free; on CPU one compiled pass reads every coordinate).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..audit.record import StepRecord
from ..canaries import CanaryDesign
from ._step_kernels import observe_step
from .plan import StepPlan

__all__ = ["GradientReader"]

#: gradient dtypes the compiled CPU path reads (NumPy has no bfloat16)
_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)
_NO_PAIRS = np.zeros(0, dtype=np.int64)


class _CoordinateSet:
    """A fixed set of (tensor, flat index) coordinates and how to gather them: per tensor the flat
    indices on the device (tensor-major), the permutation back to the given order, and the host
    arrays of the compiled pass."""

    def __init__(self, coord_param: torch.Tensor, coord_flat: torch.Tensor, n_params: int,
                 device: torch.device) -> None:
        order = torch.argsort(coord_param, stable=True)
        self.flat: list[torch.Tensor] = []
        self.which: list[int] = []
        for i in range(n_params):
            sel = order[coord_param[order] == i]
            if sel.numel():
                self.which.append(i)
                self.flat.append(coord_flat[sel].to(device))
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel())
        self.perm = inv.to(device)
        self.pos_param = coord_param[order].to(device)
        self.param_np = coord_param.numpy().astype(np.int64)
        self.flat_np = coord_flat.numpy().astype(np.int64)
        self.n = int(coord_param.numel())
        self.zeros_np = np.zeros(self.n)


class GradientReader:
    """Reads the real data's sum and the released gradient at every canary coordinate.

    Args:
        params: the optimizer's trainable parameters (``optimizer.params`` order).
        design: the canary coordinates.
        device: where the record's tensors live.
        check_finite_every_step: check finiteness on the host at every step (free on CPU; the
            record's ``finite`` is then a bool); otherwise it is a device flag, and non-finite
            values are replaced by 0 in the record so that no statistic sees them.
        compiled: allow the compiled CPU pass (tests switch it off to compare both paths).
        noise_coords: (tensor, flat) of the noise-audit coordinates U (docs/design.md section
            11), or None: the released noise is read there as well.
    """

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
        self._coords = _CoordinateSet(all_param, all_flat, design.n_params, device)
        self._noise = (None if noise_coords is None or not noise_coords[0].numel()
                       else _CoordinateSet(noise_coords[0], noise_coords[1], design.n_params,
                                           device))
        # the compiled CPU path reads every coordinate in design order directly
        self._host = device.type == "cpu" and all(p.device.type == "cpu" for p in params)
        self._n_coords = self._coords.n
        # spread pairs: x and y are sums over their sides' coordinates / sqrt(L)
        self._spread_pair = design.spread_pair.numpy().astype(np.int64)
        self._side_a, self._side_b = design.spread_sides()
        self._spread_w = 1.0 / math.sqrt(design.spread_width)
        self._n_extra = design.n_extra
        self._factors: dict[str, tuple[tuple[float, ...], torch.Tensor]] = {}
        self.reads = 0  # steps read
        self.compiled_reads = 0  # of which by the compiled CPU pass
        #: values of the last step read (design order, units of C), for diagnostics and tests
        self.last_values: torch.Tensor | None = None

    # ------------------------------------------------------------------ helpers
    def _per_entry(self, values: list[float], cache: str, cs: _CoordinateSet | None = None
                   ) -> torch.Tensor:
        """A per-parameter factor spread over the gathered entries (rebuilt only when the factors
        change, e.g. every step under adaptive clipping)."""
        cs = self._coords if cs is None else cs
        key = tuple(values)
        hit = self._factors.get(cache)
        if hit is None or hit[0] != key:
            hit = (key, torch.tensor(key, dtype=torch.float64).to(self.device)[cs.pos_param])
            self._factors[cache] = hit
        return hit[1]

    def _host_arrays(self, tensors: list[torch.Tensor | None]) -> tuple[np.ndarray, ...] | None:
        """The flat NumPy views of ``tensors`` if the compiled pass can read them (CPU, one
        NumPy dtype, none missing), else None."""
        if not (self.compiled and self._host):
            return None
        dt = None
        for t in tensors:
            if t is None or t.device.type != "cpu" or t.dtype not in _NUMPY_FLOATS or (
                    dt is not None and t.dtype != dt):
                return None
            dt = t.dtype
        return tuple(t.detach().reshape(-1).numpy() for t in tensors)  # type: ignore[union-attr]

    @torch.no_grad()
    def _gather(self, get: Callable[[int], torch.Tensor | None], scale: torch.Tensor,
                what: str, cs: _CoordinateSet | None = None) -> torch.Tensor:
        cs = self._coords if cs is None else cs
        parts = []
        for i, flat in zip(cs.which, cs.flat):
            g = get(i)
            if g is None:
                raise ValueError(f"parameter tensor {i} has no {what} at the optimizer step; "
                                 f"the audit cannot observe it")
            parts.append(torch.take(g, flat if flat.device == g.device else flat.to(g.device)))
        raw = torch.cat(parts) if len(parts) > 1 else parts[0]
        return (raw.to(self.device, torch.float64) * scale)[cs.perm]

    def _read_set(self, tensors: list[torch.Tensor | None], factors: list[float], cache: str,
                  what: str, cs: _CoordinateSet, offset: np.ndarray | None = None
                  ) -> torch.Tensor:
        """``tensors[i][flat] * factors[i] (- offset)`` at every coordinate of ``cs`` (float64,
        ``cs`` order); a missing tensor reads as zeros."""
        host = self._host_arrays(tensors)
        if host is not None:
            out = np.empty(cs.n)
            observe_step(host, cs.param_np, cs.flat_np, np.asarray(factors, dtype=np.float64),
                         cs.zeros_np if offset is None else offset, _NO_PAIRS, 0, out,
                         np.empty(0))
            return torch.from_numpy(out)
        vals = self._gather(lambda i: tensors[i] if isinstance(tensors[i], torch.Tensor)
                            else torch.zeros_like(self.params[i]),
                            self._per_entry(factors, cache, cs), what, cs)
        return vals if offset is None else vals - torch.from_numpy(offset).to(vals.device)

    # ------------------------------------------------------------------ the two reads
    @torch.no_grad()
    def snapshot(self, plan: StepPlan) -> torch.Tensor:
        """S_t / C: the real examples' clipped sum ``p.summed_grad`` at every canary coordinate
        (design order, float64), read before any canary or noise is added (a parameter without
        ``summed_grad`` contributes 0). Also keeps the raw sum at the noise-audit coordinates
        in ``plan.noise_real_sum``."""
        sums = [getattr(p, "summed_grad", None) for p in self.params]
        if self._noise is not None:
            plan.noise_real_sum = self._read_set(sums, [1.0] * len(sums), "one", "summed_grad",
                                                 self._noise)
        inv_clip = [1.0 / c if c else math.inf for c in plan.clip]
        return self._read_set(sums, inv_clip, "inv_clip", "summed_grad", self._coords)

    @torch.no_grad()
    def _read_noise(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(released, noise) in raw units at the noise-audit coordinates: the released value
        times the scaling Opacus divided by, and that minus the real examples' sum."""
        if self._noise is None or plan.noise_real_sum is None:
            return None
        denom = [u * c for u, c in zip(plan.unit_scale, plan.clip)]
        rel = self._read_set([p.grad for p in self.params], denom, "denom", "gradient",
                             self._noise)
        return rel, rel - plan.noise_real_sum.to(rel.device)

    def read(self, plan: StepPlan, step: int) -> StepRecord:
        """The record of one logical step (``plan`` from the injector, its ``real_sum`` already
        summed over DDP ranks). On the host path a non-finite step gives ``finite=False``."""
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
        rec.n_real, rec.micro_steps, rec.noise_std = plan.n_real, plan.micro_steps, plan.noise_std
        rec.n_extra = self._n_extra
        noise = self._read_noise(plan)
        if noise is not None and plan.noise_std > 0:
            rec.release_raw, rec.noise_raw = noise
            rec.noise = noise[1] / plan.noise_std
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
                                   else order.to(vals.device))
            x, y = xy[:k], xy[k:]
        else:
            a, b = vals[:k], vals[k:2 * k]
            x = torch.where(c, a, b)
            y = torch.where(c, b, a)
        if self._spread_pair.size:
            dev = vals.device
            sp = torch.from_numpy(self._spread_pair).to(dev)
            sa = vals[torch.from_numpy(self._side_a).to(dev)].sum(1) * self._spread_w
            sb = vals[torch.from_numpy(self._side_b).to(dev)].sum(1) * self._spread_w
            cs = c.to(dev)[sp]
            x, y = x.clone(), y.clone()
            x[sp] = torch.where(cs, sa, sb)
            y[sp] = torch.where(cs, sb, sa)
        return StepRecord(step=step, values=vals, x=x, y=y, coins=c, sigma=plan.sigma,
                          sigma_claimed=plan.sigma_claimed, finite=finite, real_sums=real)

    def _read_compiled(self, grads: tuple[np.ndarray, ...], plan: StepPlan, step: int,
                       real: torch.Tensor) -> StepRecord:
        """:meth:`read` for the CPU in one compiled pass
        (:func:`~dpaudit_torch.opacus_tap._step_kernels.observe_step`); same values."""
        k = self.k
        self.compiled_reads += 1
        vals_np = np.empty(self._n_coords)
        xy_np = np.empty(2 * k)
        ok = observe_step(grads, self._coords.param_np, self._coords.flat_np,
                          np.asarray(plan.unit_scale, dtype=np.float64),
                          real.numpy(), plan.pair_order, k, vals_np, xy_np)
        if self._spread_pair.size:
            sp = self._spread_pair
            sa = vals_np[self._side_a].sum(1) * self._spread_w
            sb = vals_np[self._side_b].sum(1) * self._spread_w
            cs = plan.coins_cpu.numpy()[sp]
            xy_np[sp] = np.where(cs, sa, sb)
            xy_np[k + sp] = np.where(cs, sb, sa)
        xy = torch.from_numpy(xy_np)
        return StepRecord(step=step, values=torch.from_numpy(vals_np), x=xy[:k], y=xy[k:],
                          coins=plan.coins, sigma=plan.sigma, sigma_claimed=plan.sigma_claimed,
                          finite=bool(ok), real_sums=real)
