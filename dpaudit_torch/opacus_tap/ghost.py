"""Canary injection under ghost clipping (``DPOptimizerFastGradientClipping`` and its DDP / FSDP
subclasses): the strategy object :class:`GhostInjection`, whose wrapper the
:class:`~.injection.Injector` puts in front of ``accumulate``.

There are no per-sample gradients in the optimizer (clipping happens in the loss's second
backward), so after Opacus's accumulation the real examples' sum is read and the *already
clipped* canary, ``raw * min(1, C / (raw + 1e-6))`` exactly as Opacus's flat clipping would
produce it, is added to the summed gradient. Clipping is then not exercised. The real examples
of each micro-batch are counted from the per-sample gradient norms Opacus computed for the
clipping (``p._norm_sample``; on sharded parameters the wrapped model's), for the sampling and
accounting monitors. On sharded
parameters (FSDP2, tensor parallelism) every rank adds the canaries whose coordinates its shard
holds (:class:`~.fsdp.ShardedInjection`); otherwise rank 0 adds them all (DDP: the ranks' sums
are all-reduced afterwards). On the CPU with compiled kernels the additions are one compiled
pass through the snapshot's NumPy views of ``summed_grad`` (the same values and additions, in
the gradient's dtype, as the torch path's ``index_add_`` per tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._buffers import NUMPY_FLOAT_OF
from .._compiled import compiled
from ._step_kernels import add_joint
from .errors import call_theirs
from .plan import OPACUS_NORM_EPS, InjectionHost, StepPlan, StepPlanner, ends_logical_step
from .recovery import Added, add_at

if TYPE_CHECKING:
    from .fsdp import ShardedInjection, ShardLayout

__all__ = ["GhostInjection"]


class GhostInjection:
    """The ghost-clipping injection strategy: wraps ``accumulate``.

    Public interface: :meth:`wrapper` (what the injector installs), :meth:`canary_value` (the
    clipped canary of a bound), the switch :attr:`compiled_add`, the counter
    :attr:`compiled_adds` and :attr:`sharded` (the sharded strategy, None without sharding).

    Args:
        host: the injector (:class:`~.plan.InjectionHost`): guards, the wrapped method, the
            snapshot, where a step's plan and failures go.
        planner: draws each logical step's plan.
        optimizer: the Opacus ``DPOptimizerFastGradientClipping``.
        params: its trainable parameters, in ``optimizer.params`` order.
        device: the parameters' device.
        canary_norm: raw canary norm as a multiple of the clipping bound.
        injects: whether this rank adds canaries (DDP: rank 0 only).
        layout: where the shards of sharded (DTensor) parameters lie, or None.
    """

    kind = "ghost"
    #: the optimizer method the wrapper stands in front of
    method_name = "accumulate"

    def __init__(self, host: InjectionHost, planner: StepPlanner, optimizer: Any,
                 params: list[torch.nn.Parameter], device: torch.device, canary_norm: float,
                 injects: bool, layout: ShardLayout | None = None) -> None:
        self._host = host
        self._planner = planner
        self.optimizer = optimizer
        self.params = params
        self.device = device
        self.canary_norm = float(canary_norm)
        self.injects = injects
        #: add the clipped canaries in one compiled pass where it can (tests switch it off to
        #: compare with the torch path)
        self.compiled_add = True
        self.compiled_adds = 0  # steps whose canaries the compiled pass added
        self.sharded: ShardedInjection | None = None
        if layout is not None:
            from .fsdp import ShardedInjection

            self.sharded = ShardedInjection(optimizer, params, layout, self.canary_value)
        self._values: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
        self._values_np: tuple[Any, np.ndarray] | None = None  # (bounds and dtype, values)
        self._micro_pending = 0  # micro-batches since the last logical step
        # real examples since the last logical step (None: a micro-batch whose rows were not
        # seen), counted from the per-sample norms of the clipping (:meth:`_rows_now`)
        self._rows_pending: int | None = 0
        #: the per-sample norms Opacus's wrapped model kept of its last backward pass, where
        #: the model was handed to the audit (set by the tap): the count under sharded ghost
        #: clipping, which keeps them on the modules, not on the parameters
        self.model_norms: Callable[[], Any] | None = None

    def wrapper(self) -> Any:
        """Stands in front of the optimizer's ``accumulate``: Opacus accumulates the real
        examples, then, at the end of a logical step, the step is planned, the real sum read and
        the clipped canaries added."""
        host = self._host
        host.check_params()  # a refusal (StepRefused) before anything of the step runs
        original = host.original_method()
        result = call_theirs(original, "accumulate")
        planned: list[StepPlan] = []

        def plan_and_inject() -> None:
            planned.append(self._planner.plan())
            self._inject(planned[0])

        try:
            self._micro_pending += 1
            rows = self._rows_now()
            self._rows_pending = (None if rows is None or self._rows_pending is None
                                  else self._rows_pending + rows)
            if not ends_logical_step(self.optimizer):
                return result
            host.run_host(plan_and_inject)  # (on the auditor's host thread where it has one)
        except Exception as e:
            rec = planned[0] if planned else None
            # the auditor's own part failed: what the canaries changed is put back (bit for
            # bit, :mod:`.recovery`), the auditor detaches; "continue": the step goes on
            # unaudited, "raise": it raises before any noise or update
            self._micro_pending, self._rows_pending = 0, 0
            if rec is not None and rec.added is not None:
                rec.added.restore()
            if host.report_failure(e):
                return result
            raise
        return result

    def _rows_now(self) -> int | None:
        """The real examples of the micro-batch just accumulated: the length of the per-sample
        gradient norms Opacus's ghost clipping computed in the backward pass (``_norm_sample``
        of a trainable parameter, one entry per example; empty for an empty Poisson batch), a
        shape, so no read of the device. On sharded parameters (Opacus's FSDP clipping keeps the
        norms on the modules) the wrapped model's norms of the pass (:attr:`model_norms`). None
        where neither is there. A rank counts its own examples; under DDP the adapter, on
        sharded parameters the sharded reader, sums the counts over the ranks."""
        if self.sharded is None:
            for p in self.params:
                ns = getattr(p, "_norm_sample", None)
                if isinstance(ns, torch.Tensor):
                    return int(ns.shape[0]) if ns.dim() else None
        ns = self.model_norms() if self.model_norms is not None else None
        return int(ns.shape[0]) if isinstance(ns, torch.Tensor) and ns.dim() else None

    def _inject(self, rec: StepPlan) -> None:
        host = self._host
        rec.n_real, rec.micro_steps = self._rows_pending, max(1, self._micro_pending)
        self._micro_pending, self._rows_pending = 0, 0
        read = host.read_real_sum
        rec.real_sum = read(rec) if read else None
        if self.sharded is not None:
            rec.added = Added()
            self.sharded.inject(rec)
            host.finish_step(rec, True)
            return
        if not self.injects:
            host.finish_step(rec, False)
            return
        rec.added = Added()
        params, flats = rec.entry_param, rec.entry_flat
        assert params is not None and flats is not None
        order = np.argsort(params, kind="stable")
        if self._add_compiled(rec, order):
            host.finish_step(rec, True)
            return
        counts = np.bincount(params, minlength=len(self.params))
        flat_sorted = torch.from_numpy(flats[order]).to(self.device, non_blocking=True)
        # one non-blocking copy per step (a blocking one would wait for the device's queue)
        sizes = counts.tolist()
        f_parts = flat_sorted.split(sizes)  # split once, not sliced per tensor
        # the entries' values made on the host in the gradients' one NumPy dtype and copied
        # once (else per tensor, from its own dtype's clipped canary)
        dtypes = {p.dtype for p in self.params}
        dt = NUMPY_FLOAT_OF.get(next(iter(dtypes))) if len(dtypes) == 1 else None
        v_parts = (None if dt not in (np.dtype(np.float32), np.dtype(np.float64)) else
                   torch.from_numpy(self._entry_values(rec, order, dt)).to(
                       self.device, non_blocking=True).split(sizes))
        w_parts: tuple[torch.Tensor, ...] | None = None  # the weights, where needed (once)
        for i, cnt in enumerate(sizes):
            if not cnt:
                continue
            p = self.params[i]
            sg = p.summed_grad
            if sg is None:
                sg = torch.zeros_like(p)
                p.summed_grad = sg
                rec.added.created(p)
            f = f_parts[i] if f_parts[i].device == sg.device else f_parts[i].to(sg.device)
            if v_parts is not None and v_parts[i].dtype == sg.dtype:
                val = v_parts[i] if v_parts[i].device == sg.device else v_parts[i].to(sg.device)
            else:
                val = self.canary_value(rec.clip[i], sg).expand(cnt)
                if rec.entry_weight is not None:  # a spread canary: 1 / sqrt(L) per coordinate
                    if w_parts is None:
                        w_parts = torch.from_numpy(rec.entry_weight[order]).to(
                            self.device, non_blocking=True).split(sizes)
                    val = val * w_parts[i].to(device=sg.device, dtype=sg.dtype)
            add_at(sg, f, val, rec.added, i)
        host.finish_step(rec, True)

    def _add_compiled(self, rec: StepPlan, order: np.ndarray) -> bool:
        """The clipped canaries added to ``p.summed_grad`` in one compiled pass through the
        snapshot's NumPy views (CPU, compiled kernels, float32 or float64): the values of the
        torch path, computed in the gradient's dtype (the clipped canary of each bound, times
        its weight on a spread canary's coordinates), and the same additions; False where this
        path does not apply (the torch path then runs)."""
        if not self.compiled_add or rec.summed_host is None or not compiled() or (
                rec.entry_counts is None or rec.column_flat is None):
            return False
        sums, dst = rec.summed_host
        for p, t in zip(self.params, sums):
            if getattr(p, "summed_grad", None) is not t:  # the views must still be theirs
                return False
        dt = dst[0].dtype if dst else None
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            return False
        src = self._entry_values(rec, order, dt)
        if rec.added is not None:
            rec.added.keep_host(dst, rec.entry_counts, rec.column_flat)
        add_joint(dst, src, rec.entry_counts, rec.column_flat)
        self.compiled_adds += 1
        return True

    def _entry_values(self, rec: StepPlan, order: np.ndarray, dt: np.dtype) -> np.ndarray:
        """Every entry's clipped canary in the NumPy float dtype ``dt`` (float32 or float64),
        in ``order``: the clipped canary of its tensor's bound (:meth:`canary_value`, computed
        by torch in that dtype, cached per bounds), times its weight on a spread canary's
        coordinates, multiplied in ``dt``: the torch path's values, bit for bit."""
        assert rec.entry_param is not None
        key = (tuple(rec.clip), dt)
        hit = self._values_np
        if hit is None or hit[0] != key:
            like = torch.zeros((), dtype=torch.float32 if dt == np.float32 else torch.float64)
            # written into the host array by torch (no read of a tensor's value)
            vals = np.empty(len(rec.clip), dtype=dt)
            torch.stack([self.canary_value(c, like) for c in rec.clip],
                        out=torch.from_numpy(vals))
            hit = self._values_np = (key, vals)
        src = hit[1][rec.entry_param[order]]
        if rec.entry_weight is not None:
            src = src * rec.entry_weight[order].astype(dt)
        return np.ascontiguousarray(src)

    def canary_value(self, clip: float, like: torch.Tensor) -> torch.Tensor:
        """The clipped canary, ``raw * min(1, C / (raw + 1e-6))`` with ``raw = canary_norm * C``,
        computed in the gradient's dtype exactly as Opacus's flat clipping would (0-d tensor;
        cached per bound, dtype and device)."""
        key = (clip, like.dtype, like.device)
        val = self._values.get(key)
        if val is None:
            raw_t = torch.tensor(self.canary_norm * clip, dtype=like.dtype).to(
                like.device, non_blocking=True)
            val = (clip / (raw_t + OPACUS_NORM_EPS)).clamp(max=1.0) * raw_t
            if len(self._values) > 64:  # adaptive clipping: a new bound every step
                self._values.clear()
            self._values[key] = val
        return val
