"""Canary injection under ghost clipping (``DPOptimizerFastGradientClipping`` and its DDP / FSDP
subclasses): the part of :class:`~.injection.Injector` that wraps ``accumulate``.

There are no per-sample gradients in the optimizer (clipping happens in the loss's second
backward), so after Opacus's accumulation the real examples' sum is read and the *already
clipped* canary, ``raw * min(1, C / (raw + 1e-6))`` exactly as Opacus's flat clipping would
produce it, is added to the summed gradient. Clipping is then not exercised. On sharded
parameters (FSDP2, tensor parallelism) every rank adds the canaries whose coordinates its shard
holds (:func:`~.fsdp.inject_sharded`); otherwise rank 0 adds them all (DDP: the ranks' sums are
all-reduced afterwards). On the CPU with compiled kernels the additions are one compiled pass
through the snapshot's NumPy views of ``summed_grad`` (the same values and additions, in the
gradient's dtype, as the torch path's ``index_add_`` per tensor).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._compiled import compiled
from ._step_kernels import add_joint
from .errors import call_theirs
from .plan import OPACUS_NORM_EPS, StepPlan

__all__ = ["GhostInjection"]


class GhostInjection:
    """Mixin of :class:`~.injection.Injector`: the ghost-clipping wrapper and injection."""

    # attributes of the Injector this mixin uses
    params: list[torch.nn.Parameter]
    device: torch.device
    canary_norm: float
    injects: bool
    layout: Any
    _ghost_values: dict[tuple[float, torch.dtype, torch.device], torch.Tensor]
    _micro_pending: int
    _pending: Any

    def _wrapper_ghost(self) -> Any:
        self.check_params()  # type: ignore[attr-defined]
        original = self.original_method()  # type: ignore[attr-defined]
        result = call_theirs(original, "accumulate")
        self._micro_pending += 1
        if not self._ends_logical_step():  # type: ignore[attr-defined]
            return result
        try:
            self._ghost_inject()
        except Exception as e:
            self._fail(e)  # type: ignore[attr-defined]
            raise
        return result

    def _ghost_inject(self) -> None:
        rec = self._plan()  # type: ignore[attr-defined]
        self._take_counts(rec)  # type: ignore[attr-defined]
        read = self.read_real_sum  # type: ignore[attr-defined]
        rec.real_sum = read(rec) if read else None
        if self.layout is not None:
            from .fsdp import inject_sharded

            inject_sharded(self, rec, self.layout)
            self._count(rec)  # type: ignore[attr-defined]
        elif self.injects:
            params, flats = rec.entry_param, rec.entry_flat
            assert params is not None and flats is not None
            order = np.argsort(params, kind="stable")
            if self._ghost_add_compiled(rec, order):
                self._count(rec)  # type: ignore[attr-defined]
                self._pending = rec
                return
            counts = np.bincount(params, minlength=len(self.params))
            flat_sorted = torch.from_numpy(flats[order]).to(self.device, non_blocking=True)
            w_sorted = (None if rec.entry_weight is None
                        else torch.from_numpy(rec.entry_weight[order]))
            start = 0
            for i, cnt in enumerate(counts.tolist()):
                if not cnt:
                    continue
                p = self.params[i]
                sg = p.summed_grad
                if sg is None:
                    sg = torch.zeros_like(p)
                    p.summed_grad = sg
                f = flat_sorted[start:start + cnt]
                if f.device != sg.device:
                    f = f.to(sg.device)
                val = self._ghost_value(rec.clip[i], sg).expand(cnt)
                if w_sorted is not None:  # a spread canary: 1 / sqrt(L) of it per coordinate
                    val = val * w_sorted[start:start + cnt].to(device=sg.device, dtype=sg.dtype)
                start += cnt
                sg.view(-1).index_add_(0, f, val)
            self._count(rec)  # type: ignore[attr-defined]
        self._pending = rec

    def _ghost_add_compiled(self, rec: StepPlan, order: np.ndarray) -> bool:
        """The clipped canaries added to ``p.summed_grad`` in one compiled pass through the
        snapshot's NumPy views (CPU, compiled kernels, float32 or float64): the values of the
        torch path, computed in the gradient's dtype (the clipped canary of each bound, times
        its weight on a spread canary's coordinates), and the same additions; False where this
        path does not apply (the torch path then runs)."""
        if rec.summed_host is None or not compiled() or rec.entry_counts is None or (
                rec.column_flat is None):
            return False
        sums, dst = rec.summed_host
        for p, t in zip(self.params, sums):
            if getattr(p, "summed_grad", None) is not t:  # the views must still be theirs
                return False
        dt = dst[0].dtype if dst else None
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            return False
        assert rec.entry_param is not None
        key = (tuple(rec.clip), dt)
        hit = self.__dict__.get("_ghost_np")
        if hit is None or hit[0] != key:
            like = torch.zeros((), dtype=torch.float32 if dt == np.float32 else torch.float64)
            vals = np.array([float(self._ghost_value(c, like)) for c in rec.clip], dtype=dt)
            hit = self._ghost_np = (key, vals)
        src = hit[1][rec.entry_param[order]]
        if rec.entry_weight is not None:
            src = src * rec.entry_weight[order].astype(dt)
        add_joint(dst, np.ascontiguousarray(src), rec.entry_counts, rec.column_flat)
        return True

    def _ghost_value(self, clip: float, like: torch.Tensor) -> torch.Tensor:
        """The clipped canary, ``raw * min(1, C / (raw + 1e-6))`` with ``raw = canary_norm * C``,
        computed in the gradient's dtype exactly as Opacus's flat clipping would (0-d tensor;
        cached per bound, dtype and device)."""
        key = (clip, like.dtype, like.device)
        val = self._ghost_values.get(key)
        if val is None:
            raw_t = torch.tensor(self.canary_norm * clip, dtype=like.dtype, device=like.device)
            val = (clip / (raw_t + OPACUS_NORM_EPS)).clamp(max=1.0) * raw_t
            if len(self._ghost_values) > 64:  # adaptive clipping: a new bound every step
                self._ghost_values.clear()
            self._ghost_values[key] = val
        return val
