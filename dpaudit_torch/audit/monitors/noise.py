"""Noise monitor: the released noise on a fixed random subset U of every tensor
(docs/design.md section 11).

At the coordinates of U (up to ``noise_coordinates_per_tensor`` per tensor, at most
``noise_coordinates_total`` in all; never a canary coordinate) the adapter reads
the released noise xi = released x scaling - (real examples' sum), divided by the standard
deviation a correct implementation uses (noise multiplier x the bound the noise is scaled with),
so that xi ~ N(0, 1), independent across coordinates and steps. Four anytime-valid tests
(:mod:`dpaudit_torch.stats.noise`), averaged into this monitor's e-process:

* too little noise per tensor, and per parameter group (likelihood ratios of smaller variances);
* noise dependent across steps (re-used or re-seeded noise: signs of xi_t xi_{t-k});
* the whole null, iid N(0, 1) (:mod:`dpaudit_torch.stats.noise_null`): the cells of the PIT of
  single values (shape, tails) and of structured pairs (within a tensor, across tensors, across
  steps), so that noise of the claimed variance but another shape, or dependent within a step,
  is found too;

and one check that is a finding, not a statistical rejection: noise drawn on a low-precision grid
(bfloat16 / float16; Mironov, CCS 2012). Findings name the tensor and the parameter group.
Too much noise is a utility warning, not a violation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._buffers import NUMPY_FLOAT_OF, host_copy, host_zeros
from ...contract import GROUP_NAMES, OPTIMIZER_PARAMS, TENSOR_GROUPS, TENSOR_NAMES, StepRecord
from .base import (
    Contribution,
    Evidence,
    Finding,
    Monitor,
    MonitorConfig,
    MonitorContext,
    host_flags,
    register_monitor,
)
from .checks import CheckSection, outcome_of

logger = logging.getLogger(__name__)

__all__ = ["NoiseMonitor"]

#: steps whose raw noise is kept for the floating-point check
PRECISION_STEPS = 8
#: at most this many values per step are kept for it (a fixed subset spread over U): a few
#: hundred suffice for the check, and U holds thousands per tensor
PRECISION_VALUES = 4096


class _StepRows:
    """The buffered steps' noise, one row per step, until the next check.

    A record's noise may be a view of the adapter's buffer (overwritten by the next step), so it
    is copied: CPU rows into one host matrix allocated once and grown only if a check comes
    late (no allocation of U's size per step), device rows as device copies (no host
    synchronisation per step; one copy to the host at the check)."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = max(1, int(capacity))
        self.steps: list[int] = []
        self.flags: list[bool | torch.Tensor] = []
        self._host: np.ndarray | None = None
        #: rows kept as tensor copies, replaced by their host copies at the check
        self._device: list[torch.Tensor | np.ndarray] = []

    def __len__(self) -> int:
        return len(self.steps)

    def append(self, step: int, row: torch.Tensor, flag: bool | torch.Tensor,
               host: np.ndarray | None = None, host_rows: bool = True) -> None:
        """``host``: the same row as a float64 NumPy array, where the caller has one;
        ``host_rows=False``: a CPU row is kept as a copy like a device row (the accelerator's
        path, run on the CPU by tests)."""
        i = len(self.steps)
        if host is not None and self._host is not None and self._host.shape[0] > i \
                and self._host.shape[1] == host.shape[0]:
            np.copyto(self._host[i], host)  # the common case: no torch call
        elif host_rows and row.device.type == "cpu":
            u = int(row.numel())
            if self._host is None or self._host.shape[1] != u or self._host.shape[0] <= i:
                grown = host_zeros((max(self.capacity, 2 * i), u))
                if self._host is not None and self._host.shape[1] == u:
                    grown[:i] = self._host[:i]
                self._host = grown
            np.copyto(self._host[i], row.detach().to(torch.float64).numpy())
        else:
            self._device.append(row.detach().clone())
        self.steps.append(int(step))
        self.flags.append(flag)

    def pending(self) -> list[torch.Tensor]:
        """The rows and finiteness flags still held as tensors (the accelerator's path)."""
        return [v for b in (self._device, self.flags) for v in b if isinstance(v, torch.Tensor)]

    def take_host_copies(self, arrays: Iterator[np.ndarray]) -> None:
        """Put the host copies of :meth:`pending` (in its order) in place of the tensors."""
        self._device = [next(arrays) if isinstance(v, torch.Tensor) else v for v in self._device]
        self.flags = [bool(next(arrays)) if isinstance(v, torch.Tensor) else v
                      for v in self.flags]

    def copy_rows(self) -> torch.Tensor:
        """The buffered rows as a CPU tensor [n, u] (a copy; the buffer is unchanged)."""
        if not self.steps:
            return torch.zeros(0)
        if self._device:
            return torch.stack([torch.as_tensor(r) for r in self._device]).cpu()
        assert self._host is not None
        return torch.from_numpy(self._host[:len(self.steps)].copy())

    def take(self) -> tuple[list[int], list[bool | torch.Tensor], np.ndarray | None]:
        """(steps, flags, rows [n, u] on the host, or None if empty); clears the buffer (the
        host matrix is kept for the next steps: the rows returned are a copy only for device
        rows)."""
        steps, flags, n = self.steps, self.flags, len(self.steps)
        self.steps, self.flags = [], []
        if not n:
            return steps, flags, None
        if self._device:
            held, self._device = self._device, []
            rows = (np.stack(held) if all(isinstance(r, np.ndarray) for r in held)  # host copies
                    else torch.stack(held).cpu().numpy())
        else:
            assert self._host is not None
            rows = self._host[:n]
        return steps, flags, rows


class _TensorSums:
    """Per step, the sums of the squared noise per tensor and per group, in one pass over the
    samples: ``usable`` where the coordinates are tensor-major (each tensor one segment) and
    every tensor lies in one group."""

    def __init__(self, tensor_of: np.ndarray, group_of: np.ndarray, n_t: int, n_g: int
                 ) -> None:
        self.usable = False
        if not tensor_of.size or group_of.shape != tensor_of.shape or np.any(
                np.diff(tensor_of) < 0):
            return
        self.starts = np.flatnonzero(np.r_[True, np.diff(tensor_of) != 0])
        self.present = tensor_of[self.starts]
        to_group = np.full(n_t, -1, dtype=np.int64)
        to_group[tensor_of] = group_of
        if np.any(to_group[tensor_of] != group_of):
            return
        self.n_t = n_t
        self.t_counts = np.bincount(tensor_of, minlength=n_t).astype(np.float64)
        self.g_counts = np.bincount(group_of, minlength=n_g).astype(np.float64)
        self.members = [np.flatnonzero(to_group == g) for g in range(n_g)]  # group -> tensors
        self.usable = True

    def __call__(self, rows: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray],
                                                  tuple[np.ndarray, np.ndarray]]:
        with np.errstate(over="ignore"):
            sq = rows * rows
        t_sums = np.zeros((rows.shape[0], self.n_t))
        t_sums[:, self.present] = np.add.reduceat(sq, self.starts, axis=1)
        g_sums = np.empty((rows.shape[0], len(self.members)))
        for g, members in enumerate(self.members):  # sums, not a product: inf stays inf
            g_sums[:, g] = t_sums[:, members].sum(axis=1)
        return (t_sums, self.t_counts), (g_sums, self.g_counts)


#: what a rejection of the whole null says, by the family with the strongest evidence
_WHOLE_NULL_WORDS = {
    "shape": "its distribution has another shape than the Gaussian (heavier or lighter tails, "
             "discrete or bimodal values)",
    "tails": "its tails are not those of the Gaussian",
    "adjacent": "neighbouring coordinates of a tensor are dependent",
    "column": "the same position of consecutive output rows is dependent",
    "aligned_even": "the same position in two tensors is dependent (noise shared or re-seeded "
                    "across tensors)",
    "aligned_odd": "the same position in two tensors is dependent (noise shared or re-seeded "
                   "across tensors)",
    "same_shape": "the same position in two tensors of one shape is dependent (a shared noise "
                  "vector)",
    "lag1": "a coordinate's noise depends on its noise at the step before",
}


@dataclass(frozen=True)
class NoiseConfig(MonitorConfig):
    """Settings of the noise monitor: the level of its tests, the check period (the size of
    its step buffer), and ``reuse``: whether the reuse-by-near-equality test runs
    (docs/monitors/noise.md; turn it off only for noise that is discrete on a grid other than
    bfloat16's or float16's, which lies outside its null, or where two audits of one training
    must agree beyond the release's rounding: it counts coincidences at that rounding)."""

    alpha: float = 0.05
    check_every: int = 5
    reuse: bool = True


@register_monitor("noise")
class NoiseMonitor(Monitor):
    """Variance per tensor and per group, independence across steps, precision."""

    label = "noise"
    config_class = NoiseConfig
    needs = (TENSOR_NAMES, TENSOR_GROUPS, GROUP_NAMES, OPTIMIZER_PARAMS)

    def __init__(self, ctx: MonitorContext) -> None:
        from ...stats.noise import NoiseIndependenceTest, NoiseVarianceTest

        super().__init__(ctx)
        self.config = self.settings
        alpha = self.config.alpha
        self.tensor_of = (np.zeros(0, dtype=np.int64) if ctx.noise_tensor is None
                          else host_copy(np.asarray(ctx.noise_tensor), np.int64))
        groups = ctx.fact_or(TENSOR_GROUPS)
        self.group_of = (np.zeros(0, dtype=np.int64) if ctx.noise_tensor is None
                         else np.zeros_like(self.tensor_of) if groups is None
                         else host_copy(np.asarray(groups, dtype=np.int64)[self.tensor_of],
                                        np.int64))
        self.tensor_names = list(ctx.fact_or(TENSOR_NAMES, []))
        self.group_names = list(ctx.fact_or(GROUP_NAMES, []))
        self.reason_off: str | None = None
        n_t = max(len(self.tensor_names), int(self.tensor_of.max()) + 1 if self.tensor_of.size
                  else 1)
        n_g = max(len(self.group_names), int(self.group_of.max()) + 1 if self.group_of.size
                  else 1)
        self.by_tensor = NoiseVarianceTest(n_t, alpha)
        self.by_group = NoiseVarianceTest(n_g, alpha)
        # one pass per check feeds both variance tests: each step's sum of xi^2 per tensor
        # (segments of the tensor-major coordinates), then per group as sums of its tensors
        self._sums = _TensorSums(self.tensor_of, self.group_of, n_t, n_g)
        self.independence = NoiseIndependenceTest(alpha=alpha)
        self.whole = self._whole_null_test(ctx, alpha)
        from ._noise_reuse import ReuseWatch

        #: reuse of noise values by near-equality (None: a run resumed from a checkpoint made
        #: before it existed keeps its earlier e-process)
        self.reuse: ReuseWatch | None = ReuseWatch(
            self.tensor_of, ctx.fact_or(OPTIMIZER_PARAMS), alpha, self.config.check_every,
            _StepRows) if self.config.reuse else None
        #: whether the whole-null test bets: not in a run resumed from a checkpoint made before
        #: it existed (it would join the average mid-run; the run keeps its earlier e-process)
        self.whole_on = True
        if not self.tensor_of.size:
            self.reason_off = "no noise-audit coordinates (noise_coordinates_per_tensor = 0)"
        self._buffer = _StepRows(self.config.check_every)
        self._sumsq_finite: list[bool] = []  # per buffered step: its noise proven finite
        self._precision_at: torch.Tensor | None = None  # the subset kept for precision
        #: the host path's copies of that subset, [PRECISION_STEPS, 2, subset] (mapped pages)
        self._precision_host: np.ndarray | None = None
        self._precision_at_np: np.ndarray | None = None
        #: per step, (raw noise, released values) at that subset: copies of the record's
        #: tensors (no host synchronisation at the step), host arrays from the next check on
        self._precision: list[tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]] = []
        #: the claimed noise std (raw units) of each step in ``_precision``; None: unknown
        self._precision_std: list[float | None] = []
        self._precision_result: dict[str, Any] | None = None
        self.log_wealth = 0.0
        #: keep CPU noise rows in one host matrix (tests switch it off to run the accelerator's
        #: path on the CPU: each row a tensor copy, stacked and copied to the host at the check;
        #: :func:`dpaudit_torch.testing.host_sync.force_device_path`)
        self.host_rows = True

    def _whole_null_test(self, ctx: MonitorContext, alpha: float) -> Any:
        """The test of the whole null, with the structured pairs where the coordinates' flat
        indices and the tensors' shapes are known (else on single values and across steps)."""
        from ...stats.noise_null import NoiseNullTest

        flat = getattr(ctx, "noise_flat", None)
        params = ctx.fact_or(OPTIMIZER_PARAMS)
        shapes = None if params is None else [tuple(p.shape) for p in params]
        t = self.tensor_of
        if flat is None or shapes is None or len(flat) != t.size or (t.size and (
                int(t.max()) >= len(shapes) or np.any(np.asarray(flat) >= np.array(
                    [int(np.prod(sh)) for sh in shapes])[t]))):
            return NoiseNullTest(t, None, None, alpha)  # no structure known: no pairs
        return NoiseNullTest(t, np.asarray(flat, dtype=np.int64), shapes, alpha)

    def observe(self, record: StepRecord) -> None:
        if self.reason_off is not None:
            return
        if record.noise is None:
            self.reason_off = ("the noise was not read (no noise claimed, or the adapter cannot "
                               "read the real examples' sum)")
            self._buffer = _StepRows(self.config.check_every)
            self._sumsq_finite = []
            return
        hv = record.host
        self._buffer.append(record.step, record.noise, record.finite,
                            None if hv is None else hv.noise, self.host_rows)
        if self.reuse is not None:
            self.reuse.observe(record, self.host_rows)
        # a finite sum of squares proves every noise value of the step finite (a NaN or an
        # infinity would make it NaN or infinite); otherwise the check looks at the values
        ss = record.noise_sumsq
        self._sumsq_finite.append(ss is not None and math.isfinite(ss))
        if len(self._precision) < PRECISION_STEPS and record.noise_raw is not None \
                and record.release_raw is not None:
            if self._precision_at is None:
                u = int(record.noise_raw.numel())
                stride = max(1, -(-u // PRECISION_VALUES))
                self._precision_at = torch.arange(0, u, stride, device=record.noise_raw.device)
            at = self._precision_at
            if hv is not None and self.host_rows:
                # the host path: copied from the reader's buffers into one array of mapped
                # pages (nothing kept on the heap among training's blocks until the check)
                if self._precision_host is None:
                    self._precision_host = host_zeros((PRECISION_STEPS, 2, int(at.numel())))
                    self._precision_at_np = at.numpy()
                row, at_np = self._precision_host[len(self._precision)], self._precision_at_np
                np.take(hv.noise_raw, at_np, out=row[0])
                np.take(hv.rel, at_np, out=row[1])
                self._precision.append((row[0], row[1]))
            else:
                # copies on the record's device (indexing copies): no host synchronisation
                # here, to the host at the next check (_precision_to_host)
                self._precision.append((record.noise_raw.detach()[at],
                                        record.release_raw.detach()[at]))
            std = float(record.noise_std)
            self._precision_std.append(std if std > 0 and math.isfinite(std) else None)

    def pending_tensors(self) -> list[torch.Tensor]:
        """The accelerator's path: the floating-point check's values still held as tensors, the
        buffered rows and their finiteness flags."""
        held = [v for pair in self._precision for v in pair if isinstance(v, torch.Tensor)]
        return held + self._buffer.pending() + (
            [] if self.reuse is None else self.reuse.pending())

    def take_host_copies(self, arrays: list[np.ndarray]) -> None:
        it = iter(arrays)

        def back(v: np.ndarray | torch.Tensor) -> np.ndarray:  # in the tensor's own dtype
            # (the engine's copies are float64: exact in the tensor's dtype)
            return v if isinstance(v, np.ndarray) else next(it).astype(
                NUMPY_FLOAT_OF.get(v.dtype, np.dtype(np.float64)))

        self._precision = [(back(a), back(b)) for a, b in self._precision]
        self._buffer.take_host_copies(it)
        if self.reuse is not None:
            self.reuse.take_host_copies(it)

    def _precision_to_host(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The floating-point check's values as host arrays: those still held as tensors (kept
        at their step without a host synchronisation) copied to the host in one transfer."""
        held = [v for pair in self._precision for v in pair if isinstance(v, torch.Tensor)]
        if held:
            if len({t.dtype for t in held}) == 1:
                flat = torch.cat([t.reshape(-1) for t in held]).cpu().numpy()
                cuts = np.cumsum([t.numel() for t in held])[:-1]
                arrays = iter([a.copy() for a in np.split(flat, cuts)])
            else:
                arrays = iter([t.cpu().numpy() for t in held])
            kept: list[tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]] = []
            for a, b in self._precision:  # the same order as ``held``
                a = next(arrays) if isinstance(a, torch.Tensor) else a
                b = next(arrays) if isinstance(b, torch.Tensor) else b
                kept.append((a, b))
            self._precision = kept
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for a, b in self._precision:
            assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            out.append((a, b))
        return out

    def advance(self) -> Evidence | None:
        self.fetch_pending()  # nothing left after the engine's check (one transfer for all)
        self._precision_to_host()  # (the first checks only: PRECISION_STEPS steps are kept)
        if self.reason_off is not None or not len(self._buffer):
            return None
        steps, flags, rows = self._buffer.take()  # host copies (the engine's one transfer)
        rel, stds = (None, None) if self.reuse is None else self.reuse.take()
        if rel is not None and rel.shape[0] != len(steps):
            rel = None  # (not kept at every buffered step: no reuse check for this block)
        proven, self._sumsq_finite = self._sumsq_finite, []
        keep = host_flags(flags)  # drop steps flagged non-finite
        if not all(keep):
            steps = [s for s, k in zip(steps, keep) if k]
            rows = rows[np.asarray(keep)] if rows is not None else None
            if rel is not None and stds is not None:
                rel, stds = rel[np.asarray(keep)], stds[np.asarray(keep)]
        if not steps or rows is None:
            return None
        xs = rows  # [steps, U], host
        # a skipped (non-finite) step carries no evidence: the wealth stays where it was
        ok = (np.ones(len(steps), dtype=bool) if len(proven) == len(keep) and all(proven)
              else np.isfinite(xs).all(axis=1))
        log_e = np.empty(len(steps))
        if ok.any():
            rows = xs if ok.all() else xs[ok]
            if self._sums.usable:
                (t_sums, t_counts), (g_sums, g_counts) = self._sums(rows)
                tensor_lw = self.by_tensor.update_group_sums(t_sums, t_counts, 1.0)
                group_lw = self.by_group.update_group_sums(g_sums, g_counts, 1.0)
            else:
                tensor_lw = self.by_tensor.update_steps(rows, self.tensor_of, 1.0)
                group_lw = self.by_group.update_steps(rows, self.group_of, 1.0)
            indep_lw = self.independence.update_steps(rows)
            parts = [tensor_lw, group_lw, indep_lw]
            if self.whole_on:
                parts.append(self.whole.update_steps(rows))
            if self.reuse is not None and rel is not None and stds is not None:
                parts.append(self.reuse.update(rows, rel if ok.all() else rel[ok],
                                               stds if ok.all() else stds[ok],
                                               [s for s, k in zip(steps, ok) if k]))
            from ...stats.betting import log_mean_exp  # here: importing it loads Numba

            mixed = log_mean_exp(np.stack(parts), axis=0)
            # the monitor's wealth after each step: the last processed one's, or the old value
            done = np.cumsum(ok) - 1
            log_e[:] = np.where(done >= 0, mixed[np.maximum(done, 0)], self.log_wealth)
            self.log_wealth = float(mixed[-1])
        else:
            log_e[:] = self.log_wealth
        return Evidence(steps=steps, log_e=log_e, extra={})

    def finalize(self, claimed_epsilon: float | None) -> None:
        if self._precision and self._precision_result is None:
            from ...stats.noise import low_precision_grid

            kept = self._precision_to_host()
            raw = np.concatenate([a for a, _ in kept])
            ref = np.concatenate([b for _, b in kept])
            # the claimed std per value: only noise at the claimed scale is checked, so that
            # the float32 rounding leftovers of a run without noise are no "finding"
            stds = self._precision_std
            std = (None if len(stds) != len(self._precision) or any(v is None for v in stds)
                   else np.concatenate([np.full(a.size, v) for (a, _), v
                                        in zip(self._precision, stds)]))
            ok = np.isfinite(raw) & np.isfinite(ref)  # a step dropped as non-finite
            if ok.any():
                self._precision_result = low_precision_grid(
                    raw[ok], ref[ok], noise_std=None if std is None else std[ok])

    def sigma_interval(self, alpha: float) -> tuple[float, float] | None:
        """Interval for the measured noise std / the claimed one (pooled over tensors)."""
        if self.reason_off is not None or self.by_tensor.n_steps == 0:
            return None
        return self.by_tensor.sigma_interval(alpha)

    def _name(self, names: list[str], i: int, kind: str) -> str:
        return names[i] if 0 <= i < len(names) else f"{kind} {i}"

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        if self.reason_off is None:  # a rejection at any step stands (Ville)
            if self.by_tensor.rejected or self.by_group.rejected:
                out.append(self._variance_finding())
            if self.independence.rejected:
                lag = self.independence.worst_lag()
                out.append(Finding(
                    self.name, "violation",
                    f"the noise is not fresh at every step: it is correlated with the noise "
                    f"{lag} step(s) earlier (re-used or re-seeded noise)", "every tensor"))
            # (too little noise says more; dependence within a step can also make the
            # independence test's signs reject, so both are named then)
            if self.whole_on and self.whole.rejected and not (
                    self.by_tensor.rejected or self.by_group.rejected):
                fam = self.whole.worst_family()
                out.append(Finding(
                    self.name, "violation",
                    f"the noise is not iid Gaussian with the claimed variance: "
                    f"{_WHOLE_NULL_WORDS.get(fam, fam)} (anytime-valid test at level "
                    f"{self.config.alpha:g})", f"noise-audit coordinates ({fam})"))
            if self.reuse is not None and self.reuse.test.rejected and not (
                    self.by_tensor.rejected or self.by_group.rejected):
                out.append(Finding(self.name, "violation", self.reuse.finding_text(),
                                   "noise-audit coordinates (reuse)"))
        p = self._precision_result
        if p is not None and p.get("finding"):
            fmt = p["finding"]
            share = float(p.get(fmt) or 0.0)
            checked = int(p.get(f"n_eligible_{fmt}", 0))
            out.append(Finding(
                self.name, "finding",
                f"the noise values lie on the {fmt} grid ({100 * share:.1f}% of the {checked} "
                f"values checked, of {p.get('n')} read): noise drawn in low precision leaks "
                f"through its least significant bits (Mironov, CCS 2012); this is not a "
                f"statistical proof", "noise generation"))
        return out

    def _variance_finding(self) -> Finding:
        """Too little noise, on the tensor and the group whose evidence made their test cross
        (the largest log-wealth at the crossing, among those with samples, recorded then; a
        test that has not crossed: its largest log-wealth now, among those with samples)."""
        bt, bg = self.by_tensor, self.by_group
        t = bt.rejected_group if bt.rejected_group is not None else bt.worst_group()
        g = bg.rejected_group if bg.rejected_group is not None else bg.worst_group()
        tensor = self._name(self.tensor_names, t, "tensor")
        est = float(bt.variance_ratio_estimate()[t, 0])
        what = f"the noise variance is about {est:.3g} x the claimed one"
        if bt.rejected_group == t and bt.rejected_ratio is not None:
            span = ("at the first step, where the test crossed" if bt.rejected_at == 1 else
                    f"over the {bt.rejected_at} steps up to the test's crossing")
            what = (f"the noise variance was about {bt.rejected_ratio:.3g} x the claimed one "
                    f"{span} ({est:.3g} over all {bt.n_steps} steps)")
        return Finding(
            self.name, "violation",
            f"too little noise: on {tensor} {what} (anytime-valid test at level "
            f"{self.config.alpha:g})",
            f"{tensor}; worst parameter group: {self._name(self.group_names, g, 'group')}")

    def contribution(self) -> Contribution:
        return Contribution(section=self.report_section())

    #: the named tests of its ``audits`` section shown in its check section (a new test: one
    #: line here, with its summary under that key in :meth:`report_section`)
    CHECKS = {
        "by_tensor": "noise variance of each tensor at least the claimed (σ C)²",
        "by_group": "noise variance of each parameter group at least the claimed (σ C)²",
        "independence": "fresh noise at every step (no correlation with earlier steps)",
        "whole_null": "noise iid Gaussian with the claimed variance (shape, tails, pairs, "
                      "lag 1)",
        "reuse": "no noise value reused (values equal to the release's rounding, within a step "
                 "or against every past step's signature)",
    }

    def check_section(self) -> CheckSection:
        """The named tests (:attr:`CHECKS`), the noise multiplier's interval, the precision
        grid; the canary coordinates are not read here (the canary pairs test them)."""
        sec = CheckSection("Noise", ran=self.reason_off is None,
                           reason_not_run=self.reason_off)
        data = self.report_section()
        if sec.ran and not self.by_tensor.n_steps:
            sec.skip("the noise", "no training step was audited")
        for key, what in self.CHECKS.items():
            if key in data:
                sec.check(what, outcome_of(data[key]))
            elif key == "reuse" and not self.config.reuse:
                sec.skip(what, "turned off (monitor_options noise reuse=False)")
            elif sec.ran and self.by_tensor.n_steps:
                sec.skip(what, "not run in this audit (e.g. it resumed from a checkpoint "
                         "written before this test existed)")
        p = data.get("precision")
        if p:
            sec.check("noise drawn in full precision (not on the bfloat16 / float16 grid)",
                      f"on the {p['finding']} grid" if p.get("finding") else
                      f"passed ({p.get('n')} values read)")
        bt = data.get("by_tensor") or {}
        sec.measure("noise multiplier σ claimed", bt.get("sigma_claimed"))
        level = 100 * (1 - self.config.alpha)
        sec.measure(f"interval for the noise multiplier measured ({level:g}% confidence)",
                    bt.get("sigma_interval"))
        sec.measure("noise-audit coordinates read per step", data.get("coordinates"))
        sec.measure("log-wealth (its e-process in the decision)", data.get("log_wealth"))
        sec.skip("the canary coordinates", "the canaries sit there; the canary pairs' tests "
                 "check the noise of those coordinates")
        if sec.ran and self.by_tensor.n_steps and not any(
                (data.get(k) or {}).get("rejected") for k in self.CHECKS):
            sec.rules_out = ("noise",)
        return sec

    def report_section(self) -> dict[str, Any]:
        """This monitor's ``audits`` section."""
        out: dict[str, Any] = {"run": self.reason_off is None,
                               "reason_not_run": self.reason_off,
                               "coordinates": int(self.tensor_of.size),
                               "log_wealth": self.log_wealth}
        if self.reason_off is None and self.by_tensor.n_steps:
            out["by_tensor"] = self.by_tensor.summary()
            out["by_group"] = self.by_group.summary()
            out["independence"] = self.independence.summary()
            if self.whole_on:
                out["whole_null"] = self.whole.summary()
            if self.reuse is not None:
                out["reuse"] = self.reuse.test.summary()
            ci = self.sigma_interval(self.config.alpha)
            out["noise_std_ratio_interval"] = None if ci is None else list(ci)
        out["precision"] = self._precision_result
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"by_tensor": self.by_tensor.state_dict(), "by_group": self.by_group.state_dict(),
                "independence": self.independence.state_dict(),
                **({"whole_null": self.whole.state_dict()} if self.whole_on else {}),
                **({"reuse": self.reuse.state_dict()} if self.reuse is not None else {}),
                "buffer_steps": list(self._buffer.steps),
                "buffer": self._buffer.copy_rows(),
                "precision": [(torch.from_numpy(a), torch.from_numpy(b))
                              for a, b in self._precision_to_host()],
                "precision_std": [-1.0 if v is None else v for v in self._precision_std],
                "log_wealth": self.log_wealth, "reason_off": self.reason_off}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.by_tensor.load_state_dict(sd["by_tensor"])
        self.by_group.load_state_dict(sd["by_group"])
        self.independence.load_state_dict(sd["independence"])
        self.whole_on = "whole_null" in sd
        if self.whole_on:
            self.whole.load_state_dict(sd["whole_null"])
        if "reuse" in sd and self.reuse is not None:
            self.reuse.load_state_dict(sd["reuse"])
        else:
            self.reuse = None
        self._buffer = _StepRows(self.config.check_every)
        self._sumsq_finite = []  # the restored rows are checked value by value
        for i, step in enumerate(sd["buffer_steps"]):
            self._buffer.append(int(step), sd["buffer"][i], True)
        self._precision = [(a.numpy(), b.numpy()) for a, b in sd["precision"]]
        # states saved before the claimed std was kept: unknown (the check runs unfloored)
        stds = [float(v) for v in sd.get("precision_std", [])]
        self._precision_std = ([v if v > 0 else None for v in stds]
                               if len(stds) == len(self._precision)
                               else [None] * len(self._precision))
        self.log_wealth = float(sd["log_wealth"])
        self.reason_off = sd["reason_off"]
