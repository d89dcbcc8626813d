"""Observation of the final DP gradient at the canary coordinates (after noise and scaling).

Read in a step pre-hook of ``optimizer.original_optimizer`` (``DPOptimizer`` itself does not call
``Optimizer.__init__``, so it has no hooks of its own): at that point Opacus has clipped, summed,
noised and scaled the gradient (and, under DDP, all-reduced it), and the update has not been
applied yet. Each canary coordinate's value of ``p.grad`` times
``expected_batch_size * accumulated_iterations (* world_size) / C_i`` is, in units of the
clipping bound, ``1{canary present} + N(0, sigma^2) + W`` for a correct implementation, W being
the real-data gradient at that coordinate ("interference", ALGORITHMS.md section 5).

Everything stays on the parameters' device: a step costs a handful of index gathers and adds,
and no host synchronisation (except the finiteness check on CPU, where it is free).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ._step_kernels import observe_step
from .canaries import CanaryDesign
from .injection import StepRecord

__all__ = ["Observer"]

#: gradient dtypes the compiled CPU path reads (NumPy has no bfloat16)
_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)
#: the "all finite" flag of a step observed on the compiled path
_TRUE = torch.tensor(True)


class Observer:
    """Gathers canary projections, forms the sequential pairs, keeps one-run running scores.

    Args:
        params: the optimizer's trainable parameters (``optimizer.params`` order).
        design: the canary coordinates.
        device: where buffers and running sums live.
        check_finite_every_step: raise on non-finite projections at the step itself (free on
            CPU); otherwise the check happens when the buffer is drained.
        interference_every: read the pre-noise sum at the pair coordinates (the interference
            diagnostic W) at every this many observed steps (a systematic subsample; the
            sequential pairs and one-run scores use every step).
    """

    def __init__(self, params: list[torch.nn.Parameter], design: CanaryDesign,
                 device: torch.device, check_finite_every_step: bool,
                 interference_every: int = 1) -> None:
        self.params = params
        self.interference_every = max(1, int(interference_every))
        self.design = design
        self.device = device
        self.check_finite_every_step = check_finite_every_step
        k, m = design.k_pairs, design.m_canaries
        self.k, self.m = k, m
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
        self.reset()

    def reset(self) -> None:
        dev = self.device
        self.steps = 0
        self.buffer_x: list[torch.Tensor] = []
        self.buffer_y: list[torch.Tensor] = []
        self.buffer_steps: list[int] = []
        self.buffer_sigma: list[float] = []
        self.buffer_ok: list[torch.Tensor] = []  # per step: all projections finite (device)
        self.skipped_nonfinite = 0  # steps whose observation was dropped (on_nonfinite="skip")
        self.scores = torch.zeros(self.m, dtype=torch.float64, device=dev)
        self._scores_np = self.scores.numpy() if dev.type == "cpu" else None
        # interference W (units of C) at the non-canary coordinate of each pair
        self.w_sum = torch.zeros((), dtype=torch.float64, device=dev)
        self.w_sumsq = torch.zeros((), dtype=torch.float64, device=dev)
        self.w_maxabs = torch.zeros((), dtype=torch.float64, device=dev)
        self.w_count = 0
        # spread of the observation at the non-canary coordinate (W + noise)
        self.y_sum = torch.zeros((), dtype=torch.float64, device=dev)
        self.y_sumsq = torch.zeros((), dtype=torch.float64, device=dev)
        self.y_count = 0  # observations summed into y_sum (drained steps x k)
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        self.last_projection: torch.Tensor | None = None

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
    def gather(self, rec: StepRecord, with_sums: bool = True
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
    def _gather_sums(self, rec: StepRecord) -> torch.Tensor | None:
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

    def observe(self, rec: StepRecord, step: int, skip_nonfinite: bool = False
                ) -> torch.Tensor | None:
        """Record one logical step; returns the projections (None if dropped).

        A non-finite projection: with ``skip_nonfinite`` the step's observation is dropped and
        counted (on the host at once if ``check_finite_every_step``, else zeroed on the device and
        removed from the pairs at :meth:`drain`); otherwise ValueError (state untouched) if
        ``check_finite_every_step``, else flagged for the next drain."""
        # the interference W (diagnostic) is read every `interference_every` steps
        with_sums = self.steps % self.interference_every == 0
        if self._compiled_ok(rec):
            return self._observe_compiled(rec, step, skip_nonfinite, with_sums)
        vals, sums = self.gather(rec, with_sums=with_sums)
        fin = torch.isfinite(vals).all()
        if skip_nonfinite:
            if self.check_finite_every_step:
                if not bool(fin):
                    self.skipped_nonfinite += 1
                    return None
            else:  # no host sync: a dropped step contributes zeros, its pairs leave at drain
                vals = torch.where(fin, vals, torch.zeros_like(vals))
                if sums is not None:
                    sums = torch.where(fin, sums, torch.zeros_like(sums))
        elif self.check_finite_every_step and not bool(fin):
            bad = torch.nonzero(~torch.isfinite(vals)).reshape(-1)[:3].tolist()
            raise ValueError(
                f"non-finite gradient at canary coordinate(s) {bad} (design order) at step "
                f"{step}: the audit refuses this observation; the update was not applied")
        if not skip_nonfinite and not self.check_finite_every_step:
            self.nonfinite |= ~fin  # checked at the next drain
        k = self.k
        c = rec.coins
        if rec.pair_order is not None:  # x: the canary's coordinate of each pair, y: the other
            order = torch.from_numpy(rec.pair_order)
            xy = vals.index_select(0, order if order.device == vals.device
                                   else order.to(vals.device))
            x, y = xy[:k], xy[k:]
        else:
            a, b = vals[:k], vals[k:2 * k]
            x = torch.where(c, a, b)
            y = torch.where(c, b, a)
        self.buffer_x.append(x)
        self.buffer_y.append(y)
        self.buffer_steps.append(step)
        self.buffer_sigma.append(rec.sigma)
        self.buffer_ok.append(fin)
        if self.m:
            self.scores += vals[2 * k:]
        if sums is not None:
            self._add_interference(sums, c)
        self.steps += 1
        self.last_projection = vals
        return vals

    def _compiled_ok(self, rec: StepRecord) -> bool:
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

    def _observe_compiled(self, rec: StepRecord, step: int, skip_nonfinite: bool,
                          with_sums: bool) -> torch.Tensor | None:
        """:meth:`observe` for the CPU in one compiled pass
        (:func:`~dpaudit_torch._step_kernels.observe_step`); same results and errors."""
        k = self.k
        grads = tuple(p.grad.detach().reshape(-1).numpy() for p in self.params)
        vals_np = np.empty(self._n_coords)
        xy_np = np.empty(2 * k)
        ok = observe_step(grads, self._coord_param_np, self._coord_flat_np,
                          np.asarray(rec.unit_scale, dtype=np.float64), rec.pair_order, k,
                          vals_np, xy_np, self._scores_np)
        vals = torch.from_numpy(vals_np)
        if not ok:  # nothing was recorded (the scores are updated only for finite steps)
            if skip_nonfinite:
                self.skipped_nonfinite += 1
                return None
            bad = np.nonzero(~np.isfinite(vals_np))[0][:3].tolist()
            raise ValueError(
                f"non-finite gradient at canary coordinate(s) {bad} (design order) at step "
                f"{step}: the audit refuses this observation; the update was not applied")
        xy = torch.from_numpy(xy_np)
        self.buffer_x.append(xy[:k])
        self.buffer_y.append(xy[k:])
        self.buffer_steps.append(step)
        self.buffer_sigma.append(rec.sigma)
        self.buffer_ok.append(_TRUE)
        if with_sums:
            sums = self._gather_sums(rec)
            if sums is not None:
                self._add_interference(sums, rec.coins)
        self.steps += 1
        self.last_projection = vals
        return vals

    def _add_interference(self, sums: torch.Tensor, c: torch.Tensor) -> None:
        """W at the non-canary coordinate of each pair (pre-noise sum), into the running
        statistics."""
        k = self.k
        w = torch.where(c, sums[k:2 * k], sums[:k])
        w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
        self.w_sum += w.sum()
        self.w_sumsq += (w * w).sum()
        self.w_maxabs = torch.maximum(self.w_maxabs, w.abs().max())
        self.w_count += k

    def drain(self, skip_nonfinite: bool = False, record: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[float]]:
        """Buffered pairs as [n_steps, k] tensors (on device), their steps and sigmas; clears.
        With ``skip_nonfinite`` the steps flagged non-finite are removed (and counted);
        ``record=False`` discards them without adding them to the observation spread."""
        if not self.buffer_x:
            empty = torch.zeros((0, self.k), dtype=torch.float64, device=self.device)
            return empty, empty, [], []
        x = torch.stack(self.buffer_x)
        y = torch.stack(self.buffer_y)
        steps, sig = self.buffer_steps, self.buffer_sigma
        ok = torch.stack(self.buffer_ok)
        self.buffer_x, self.buffer_y, self.buffer_steps, self.buffer_sigma = [], [], [], []
        self.buffer_ok = []
        if skip_nonfinite:
            keep = ok.cpu()
            if not bool(keep.all()):
                self.skipped_nonfinite += int((~keep).sum())
                idx = torch.nonzero(keep).reshape(-1)
                x, y = x[idx.to(x.device)], y[idx.to(y.device)]
                steps = [s for s, kp in zip(steps, keep.tolist()) if kp]
                sig = [s for s, kp in zip(sig, keep.tolist()) if kp]
        if record:
            self._add_y_stats(y)
        return x, y, steps, sig

    def _add_y_stats(self, y: torch.Tensor) -> None:
        """Spread of the observation at the non-canary coordinates (interference + noise),
        accumulated once per drained chunk rather than per step."""
        if y.numel():
            self.y_sum += y.sum()
            self.y_sumsq += (y * y).sum()
            self.y_count += int(y.numel())

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint (CPU tensors and plain types); buffered pairs included."""
        def cpu(t: torch.Tensor) -> torch.Tensor:
            return t.detach().cpu().clone()

        stack = (lambda b: torch.stack(b).detach().cpu()) if self.buffer_x else (
            lambda b: torch.zeros((0, self.k), dtype=torch.float64))
        return {
            "steps": self.steps, "scores": cpu(self.scores),
            "buffer_x": stack(self.buffer_x), "buffer_y": stack(self.buffer_y),
            "buffer_ok": (torch.stack(self.buffer_ok).detach().cpu() if self.buffer_ok
                          else torch.zeros(0, dtype=torch.bool)),
            "buffer_steps": list(self.buffer_steps), "buffer_sigma": list(self.buffer_sigma),
            "w_sum": cpu(self.w_sum), "w_sumsq": cpu(self.w_sumsq),
            "w_maxabs": cpu(self.w_maxabs), "w_count": self.w_count,
            "y_sum": cpu(self.y_sum), "y_sumsq": cpu(self.y_sumsq), "y_count": self.y_count,
            "nonfinite": cpu(self.nonfinite), "skipped_nonfinite": self.skipped_nonfinite,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if tuple(sd["scores"].shape) != (self.m,) or (
                sd["buffer_x"].numel() and sd["buffer_x"].shape[1] != self.k):
            raise ValueError(f"observer state for {tuple(sd['scores'].shape)} one-run canaries /"
                             f" {tuple(sd['buffer_x'].shape)} buffered pairs does not fit "
                             f"m={self.m}, k={self.k}")
        dev = self.device
        self.reset()
        self.steps = int(sd["steps"])
        self.scores = sd["scores"].to(dev, torch.float64).clone()
        self._scores_np = self.scores.numpy() if dev.type == "cpu" else None
        n = len(sd["buffer_steps"])
        self.buffer_x = [sd["buffer_x"][i].to(dev) for i in range(n)]
        self.buffer_y = [sd["buffer_y"][i].to(dev) for i in range(n)]
        self.buffer_ok = [sd["buffer_ok"][i].to(dev) for i in range(n)]
        self.buffer_steps = [int(v) for v in sd["buffer_steps"]]
        self.buffer_sigma = [float(v) for v in sd["buffer_sigma"]]
        for name in ("w_sum", "w_sumsq", "w_maxabs", "y_sum", "y_sumsq"):
            setattr(self, name, sd[name].to(dev, torch.float64).clone())
        self.nonfinite = sd["nonfinite"].to(dev).clone()
        self.w_count = int(sd["w_count"])
        # states from before y was summed at drain time counted every observed step
        self.y_count = int(sd.get("y_count", (self.steps - n) * self.k))
        self.skipped_nonfinite = int(sd["skipped_nonfinite"])

    def interference_summary(self, sigma: float | None) -> dict[str, Any]:
        """Spread of the real-data gradient at canary coordinates, in units of C (host sync)."""
        out: dict[str, Any] = {"units": "C (clipping bound)",
                               "coordinates": "non-canary coordinate of each sequential pair",
                               "read_every_steps": self.interference_every}
        y_sum, y_sumsq, n_y = float(self.y_sum), float(self.y_sumsq), self.y_count
        if self.buffer_y:  # steps not drained yet
            yb = torch.stack(self.buffer_y)
            y_sum, y_sumsq, n_y = (y_sum + float(yb.sum()), y_sumsq + float((yb * yb).sum()),
                                   n_y + int(yb.numel()))
        if n_y:
            ym = y_sum / n_y
            yv = max(y_sumsq / n_y - ym * ym, 0.0)
            out["observation_std"] = math.sqrt(yv)
            if sigma is not None and math.isfinite(sigma):
                out["std_from_observation_minus_noise"] = math.sqrt(max(yv - sigma * sigma, 0.0))
        if self.w_count:
            wm = float(self.w_sum) / self.w_count
            wv = max(float(self.w_sumsq) / self.w_count - wm * wm, 0.0)
            out.update({"source": "p.summed_grad (exact pre-noise sum)", "mean": wm,
                        "std": math.sqrt(wv), "rms": math.sqrt(float(self.w_sumsq) / self.w_count),
                        "max_abs": float(self.w_maxabs), "n": self.w_count})
        else:
            out["source"] = "observations only (p.summed_grad unavailable)"
        return out
