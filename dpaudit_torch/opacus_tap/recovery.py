"""Taking the auditor out of a step whose own part failed (docs/auditor.md, "Faults").

When the auditor's own code fails inside a training step and ``on_internal_error="continue"``
(the default), the auditor detaches and the step goes on exactly as it would have without the
auditor. What that takes depends on how far the step got:

* **before the canaries were added** to the optimizer's summed gradients (planning, the canary
  rows, their clipping on the shadow, the snapshot): nothing; the real clipping runs (or has
  run) as without the auditor;
* **after some or all of them were added** (inside the clipping wrapper): every addition is
  preceded by reading the values it changes (:class:`Added`, in float64, exact for every float
  dtype), and those values are put back, bit for bit;
* **in the observation**, after Opacus noised and scaled the gradient (:func:`take_out`): the
  summed gradients are put back as above, then the released gradient is recomputed without the
  canaries. Where the optimizer noises with Opacus's own ``add_noise`` and ``scale_grad`` (flat,
  per-layer and ghost clipping in one process), its noise generator (``optimizer.generator``, or
  the device's default generator) is set back to where it stood before the noise, whose state
  is kept at every step, and those two methods run again: the same draws and the same
  operations, so the gradient is the one of a run without the auditor, bit for bit, and the
  generator ends where it would have. Elsewhere (adaptive clipping, an optimizer with its own
  noise code, a generator whose state cannot be read) the canaries' contribution is subtracted
  at their coordinates (float64, then rounded to the gradient's dtype): exact when no noise was
  added and the batch scaling is a power of two, else within one unit in the last place at
  those coordinates (the noise of a step is not kept, and the rounding of ``summed + noise``
  cannot be undone without it);
* **several processes** (DDP, sharded parameters): a failure before the noise is put back on the
  rank that added the canaries, before the gradients are reduced, so every rank gets the
  gradient without them. After the reduction the amounts rank 0 added are known on rank 0 only:
  the canaries' contribution then stays in that one update on every rank (consistently), at
  most one clipped canary per canary coordinate, and the warning says so.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._step_kernels import take_columns

if TYPE_CHECKING:
    from .plan import StepPlan

logger = logging.getLogger(__name__)

__all__ = ["Added", "add_at", "noise_state", "replayable", "take_out"]


class Added:
    """What the canaries of one step changed in the optimizer's summed gradients, with the values
    there before, so that it can be put back bit for bit.

    The injection strategies call :meth:`keep_host` (the compiled CPU additions, through the
    snapshot's NumPy views) or :meth:`keep` (one tensor's ``index_add_``) right before adding,
    and :meth:`created` when they create a summed gradient for the canaries."""

    def __init__(self) -> None:
        self._host: tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._parts: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._created: list[Any] = []

    def keep_host(self, dst: tuple[np.ndarray, ...], counts: np.ndarray,
                  col_flat: np.ndarray) -> None:
        """Before the compiled additions at ``col_flat`` (grouped by ``counts`` per tensor) of the
        flat summed gradients ``dst``: their values, in float64 (one compiled pass)."""
        old = np.empty(col_flat.shape[0])
        take_columns(dst, counts, col_flat, old)
        self._host = (dst, counts, col_flat, old)

    @torch.no_grad()
    def keep(self, i: int, target: torch.Tensor, index: torch.Tensor) -> None:
        """Before adding at the flat (row-major) ``index`` of ``target``, the summed gradient
        of tensor ``i``: one ``take``."""
        self._parts.append((i, target, index, target.take(index)))

    def created(self, owner: Any) -> None:
        """``owner.summed_grad`` was created for the canaries (set back to None)."""
        self._created.append(owner)

    @torch.no_grad()
    def restore(self) -> None:
        """Put back every value the canaries changed (idempotent)."""
        if self._host is not None:
            dst, counts, col_flat, old = self._host
            off = 0
            for p, c in enumerate(counts.tolist()):
                if c:
                    dst[p][col_flat[off:off + c]] = old[off:off + c]
                off += c
        for _, target, index, old in self._parts:
            target.put_(index, old)
        for owner in self._created:
            owner.summed_grad = None

    def entries(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(tensor, flat indices, values before the canaries) of every tensor they changed."""
        out: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        if self._host is not None:
            _, counts, col_flat, old = self._host
            off = 0
            for p, c in enumerate(counts.tolist()):
                if c:
                    out.append((p, torch.from_numpy(col_flat[off:off + c]),
                                torch.from_numpy(old[off:off + c])))
                off += c
        out += [(i, index, old) for i, _, index, old in self._parts]
        return out


@torch.no_grad()
def add_at(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor,
           added: Added | None, i: int) -> None:
    """``target`` (the summed gradient of tensor ``i``) plus ``values`` at its flat (row-major)
    ``index``, the old values kept in ``added`` first: one ``take`` and one accumulating
    ``put_`` on the tensor as it is (no flattening view, no copy where the dtypes agree), the
    same additions in the same dtype as an ``index_add_`` into its flat view."""
    if values.dtype != target.dtype:
        values = values.to(target.dtype)
    if added is not None:
        added.keep(i, target, index)
    target.put_(index, values, accumulate=True)


def replayable(optimizer: Any) -> bool:
    """Whether the optimizer noises and scales with Opacus's own ``DPOptimizer.add_noise`` (or
    ghost clipping's, which differs only in its noise multiplier) and ``DPOptimizer.scale_grad``,
    neither replaced on the instance: running them again after the generator is set back gives
    the same noise draws and operations."""
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

    cls = type(optimizer)
    stock = (DPOptimizer.add_noise, DPOptimizerFastGradientClipping.add_noise)
    return (getattr(cls, "add_noise", None) in stock
            and getattr(cls, "scale_grad", None) is DPOptimizer.scale_grad
            and not {"add_noise", "scale_grad"} & set(vars(optimizer)))


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The generator ``torch.normal`` draws from on ``device`` when given none."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[idx]
    return None


def noise_state(optimizer: Any, params: list[torch.nn.Parameter]
                ) -> tuple[torch.Generator, torch.Tensor] | None:
    """(the generator the optimizer's noise comes from, its state now), read at the end of the
    clipping, right before Opacus adds the noise; None where it cannot be read (a generator
    without ``get_state``, parameters on several devices). Reading it draws nothing."""
    gen = getattr(optimizer, "generator", None)
    if gen is None:
        devices = {p.device for p in params}
        gen = _default_generator(params[0].device) if len(devices) == 1 else None
    if gen is None:
        return None
    try:
        return gen, gen.get_state()
    except (AttributeError, RuntimeError, TypeError, NotImplementedError):
        return None


def _replay(optimizer: Any, params: list[torch.nn.Parameter],
            state: tuple[torch.Generator, torch.Tensor]) -> None:
    """Opacus's ``add_noise`` and ``scale_grad`` again, from the generator state of the step."""
    gen, before = state
    after = gen.get_state()
    for p in params:
        sg = getattr(p, "summed_grad", None)
        if sg is not None and hasattr(sg, "_processed"):  # Opacus's mark: noised once
            del sg._processed
    gen.set_state(before)
    try:
        optimizer.add_noise()
        optimizer.scale_grad()
    finally:
        gen.set_state(after)


@torch.no_grad()
def _subtract(params: list[torch.nn.Parameter], plan: StepPlan, added: Added) -> None:
    """The canaries' contribution taken out of ``p.grad`` at their coordinates: the released
    value minus (summed gradient now - before) / the scaling Opacus divided by."""
    for i, index, old in added.entries():
        p = params[i]
        g, sg = p.grad, getattr(p, "summed_grad", None)
        denom = plan.unit_scale[i] * plan.clip[i]
        if g is None or sg is None or not (math.isfinite(denom) and denom > 0):
            continue
        flat = g.view(-1)
        idx = index.to(flat.device)
        now = sg.reshape(-1).index_select(0, idx.to(sg.device)).to(flat.device, torch.float64)
        canary = (now - old.to(flat.device, torch.float64)) / denom
        fixed = flat.index_select(0, idx).to(torch.float64) - canary
        flat.index_copy_(0, idx, fixed.to(flat.dtype))


def take_out(optimizer: Any, params: list[torch.nn.Parameter], plan: StepPlan,
             world_size: int) -> str:
    """After a failure in the observation of the step ``plan`` (its gradient noised and scaled,
    not yet applied): the summed gradients and the released gradient as they would be without
    the auditor (see the module docstring). Returns how, in words, for the warning."""
    added = plan.added
    if added is None:
        return "no canary had been added on this process"
    if world_size > 1:
        added.restore()
        return ("the canaries' contribution stays in this one update on every rank (it was "
                "added on one rank before the gradients were reduced)")
    state = plan.noise_state
    if state is not None and replayable(optimizer):
        added.restore()
        _replay(optimizer, params, state)
        return ("its gradient was recomputed without the canaries by the optimizer's own "
                "add_noise and scale_grad from the same noise draws (exact)")
    _subtract(params, plan, added)
    added.restore()
    return ("the canaries' contribution was subtracted at their coordinates (exact without "
            "noise, else within one unit in the last place there)")
