"""Reading the released DP gradient at the canary coordinates (after noise and scaling).

Read in a step pre-hook of ``optimizer.original_optimizer`` (``DPOptimizer`` itself does not call
``Optimizer.__init__``, so it has no hooks of its own): at that point Opacus has clipped, summed,
noised and scaled the gradient (and, under DDP, all-reduced it), and the update has not been
applied yet. Each canary coordinate's value of ``p.grad`` times
``expected_batch_size * accumulated_iterations (* world_size) / C_i`` is, in units of the
clipping bound, ``1{canary present} + N(0, sigma^2) + W`` for a correct implementation, W being
the real-data gradient at that coordinate ("interference", docs/design.md section 5).

:class:`GradientReader` turns one step into a framework-free
:class:`~dpaudit_torch.audit.record.StepRecord`; what is done with it is the monitors' business.
Everything stays on the parameters' device: a step costs a handful of index gathers, and no host
synchronisation (except the finiteness check on CPU, where it is free; on CPU one compiled pass
reads every coordinate).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..audit.record import StepRecord
from ..canaries import CanaryDesign
from ._step_kernels import observe_step
from .injection import StepPlan

__all__ = ["GradientReader"]

#: gradient dtypes the compiled CPU path reads (NumPy has no bfloat16)
_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)


class GradientReader:
    """Reads one step's values at every canary coordinate into a :class:`StepRecord`.

    Args:
        params: the optimizer's trainable parameters (``optimizer.params`` order).
        design: the canary coordinates.
        device: where the record's tensors live.
        check_finite_every_step: check finiteness on the host at every step (free on CPU; the
            record's ``finite`` is then a bool); otherwise it is a device flag, and non-finite
            values are replaced by 0 in the record so that no statistic sees them.
        interference_every: read the pre-noise sum at the pair coordinates (the interference
            diagnostic W) at every this many observed steps (a systematic subsample).
        compiled: allow the compiled CPU pass (tests switch it off to compare both paths).
    """

    def __init__(self, params: list[torch.nn.Parameter], design: CanaryDesign,
                 device: torch.device, check_finite_every_step: bool,
                 interference_every: int = 1, compiled: bool = True) -> None:
        self.params = params
        self.interference_every = max(1, int(interference_every))
        self.design = design
        self.device = device
        self.check_finite_every_step = check_finite_every_step
        self.compiled = compiled
        k = design.k_pairs
        self.k = k
        all_param, all_flat = design.coordinates()
        # gather order: parameter-major; `perm` maps design order -> gathered position
        self._flat, self._which, self._perm, self._pos_param = self._gather_plan(
            all_param, all_flat, device)
        # the pre-noise sum p.summed_grad is read at the 2k pair coordinates only (interference)
        self._pflat, self._pwhich, self._pperm, self._ppos_param = self._gather_plan(
            all_param[:2 * k], all_flat[:2 * k], device)
        # the compiled CPU path reads every coordinate in design order directly
        self._host = device.type == "cpu" and all(p.device.type == "cpu" for p in params)
        self._coord_param_np = all_param.numpy().astype(np.int64)
        self._coord_flat_np = all_flat.numpy().astype(np.int64)
        self._n_coords = int(all_param.numel())
        self._scale_key: tuple[float, ...] | None = None
        self._scale_vec: torch.Tensor | None = None
        self._inv_clip_key: tuple[float, ...] | None = None
        self._inv_clip_vec: torch.Tensor | None = None
        self.reads = 0  # steps read (the interference subsample counts these)
        self.compiled_reads = 0  # of which by the compiled CPU pass
        #: values of the last step read (design order, units of C), for diagnostics and tests
        self.last_values: torch.Tensor | None = None

    def _gather_plan(self, coord_param: torch.Tensor, coord_flat: torch.Tensor,
                     device: torch.device
                     ) -> tuple[list[torch.Tensor], list[int], torch.Tensor, torch.Tensor]:
        """Per parameter tensor: the flat indices to read (parameter-major order), which
        tensors, the permutation back to the given order and each gathered entry's tensor."""
        order = torch.argsort(coord_param, stable=True)
        flats: list[torch.Tensor] = []
        which: list[int] = []
        for i in range(self.design.n_params):
            sel = order[coord_param[order] == i]
            if sel.numel():
                which.append(i)
                flats.append(coord_flat[sel].to(device))
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel())
        return flats, which, inv.to(device), coord_param[order].to(device)

    def _per_entry(self, values: list[float], pos_param: torch.Tensor, cache: str
                   ) -> torch.Tensor:
        """A per-parameter factor spread over the gathered entries (rebuilt only when the factors
        change, e.g. every step under adaptive clipping)."""
        key = tuple(values)
        if getattr(self, f"_{cache}_key") != key:
            vec = torch.tensor(key, dtype=torch.float64).to(self.device)[pos_param]
            setattr(self, f"_{cache}_key", key)
            setattr(self, f"_{cache}_vec", vec)
        return getattr(self, f"_{cache}_vec")

    @torch.no_grad()
    def gather(self, rec: StepPlan, with_sums: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Projections of this step, design order, float64: the final gradient in units of C at
        every canary coordinate [2k + m], and (if ``with_sums``) the pre-noise sum
        ``p.summed_grad`` / C at the 2k pair coordinates (None when not read, or when some
        parameter has no ``summed_grad``)."""
        parts = []
        for i, flat in zip(self._which, self._flat):
            g = self.params[i].grad
            if g is None:
                raise ValueError(f"parameter tensor {i} has no gradient at the optimizer step; "
                                 f"the audit cannot observe it")
            parts.append(torch.take(g, flat if flat.device == g.device else flat.to(g.device)))
        raw = torch.cat(parts) if len(parts) > 1 else parts[0]
        scale = self._per_entry(rec.unit_scale, self._pos_param, "scale")
        vals = (raw.to(self.device, torch.float64) * scale)[self._perm]
        return vals, (self._gather_sums(rec) if with_sums else None)

    @torch.no_grad()
    def _gather_sums(self, rec: StepPlan) -> torch.Tensor | None:
        """The pre-noise sum ``p.summed_grad`` / C at the 2k pair coordinates, design order
        (None when some parameter has no ``summed_grad``)."""
        sums: list[torch.Tensor] = []
        for i, flat in zip(self._pwhich, self._pflat):
            sg = getattr(self.params[i], "summed_grad", None)
            if not isinstance(sg, torch.Tensor):
                return None
            sums.append(torch.take(sg, flat if flat.device == sg.device else flat.to(sg.device)))
        inv_clip = self._per_entry([1.0 / c if c else math.inf for c in rec.clip],
                                   self._ppos_param, "inv_clip")
        raw_s = torch.cat(sums) if len(sums) > 1 else sums[0]
        return (raw_s.to(self.device, torch.float64) * inv_clip)[self._pperm]

    def read(self, plan: StepPlan, step: int) -> StepRecord:
        """The record of one logical step (``plan`` from the injector). On the host path a
        non-finite step gives ``finite=False`` and is not counted as read."""
        with_sums = self.reads % self.interference_every == 0
        if self.compiled and self._compiled_ok(plan):
            rec = self._read_compiled(plan, step, with_sums)
        else:
            rec = self._read_torch(plan, step, with_sums)
        if rec.finite is not False:
            self.reads += 1
        self.last_values = rec.values
        return rec

    def _read_torch(self, plan: StepPlan, step: int, with_sums: bool) -> StepRecord:
        vals, sums = self.gather(plan, with_sums=with_sums)
        fin = torch.isfinite(vals).all()
        finite: bool | torch.Tensor
        if self.check_finite_every_step:
            finite = bool(fin)
        else:  # no host sync: a non-finite step contributes zeros and carries its flag
            finite = fin
            vals = torch.where(fin, vals, torch.zeros_like(vals))
            if sums is not None:
                sums = torch.where(fin, sums, torch.zeros_like(sums))
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
        return StepRecord(step=step, values=vals, x=x, y=y, coins=c, sigma=plan.sigma,
                          sigma_claimed=plan.sigma_claimed, finite=finite, pair_sums=sums)

    def _compiled_ok(self, rec: StepPlan) -> bool:
        """The compiled host path applies: CPU, finiteness checked at every step, one
        NumPy-representable gradient dtype, and the step's pair order known."""
        if not (self._host and self.check_finite_every_step and rec.pair_order is not None):
            return False
        dt = None
        for p in self.params:
            g = p.grad
            if g is None or g.device.type != "cpu" or g.dtype not in _NUMPY_FLOATS or (
                    dt is not None and g.dtype != dt):
                return False
            dt = g.dtype
        return True

    def _read_compiled(self, plan: StepPlan, step: int, with_sums: bool) -> StepRecord:
        """:meth:`read` for the CPU in one compiled pass
        (:func:`~dpaudit_torch.opacus_tap._step_kernels.observe_step`); same values."""
        k = self.k
        self.compiled_reads += 1
        grads = tuple(p.grad.detach().reshape(-1).numpy() for p in self.params)
        vals_np = np.empty(self._n_coords)
        xy_np = np.empty(2 * k)
        ok = observe_step(grads, self._coord_param_np, self._coord_flat_np,
                          np.asarray(plan.unit_scale, dtype=np.float64), plan.pair_order, k,
                          vals_np, xy_np)
        xy = torch.from_numpy(xy_np)
        sums = self._gather_sums(plan) if (with_sums and ok) else None
        return StepRecord(step=step, values=torch.from_numpy(vals_np), x=xy[:k], y=xy[k:],
                          coins=plan.coins, sigma=plan.sigma, sigma_claimed=plan.sigma_claimed,
                          finite=bool(ok), pair_sums=sums)
