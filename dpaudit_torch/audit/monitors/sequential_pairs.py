"""The sequential canary pairs: per-step tests that can stop training (docs/design.md sections 4-5).

Every step, pair j gives (X, Y) = (value at the coordinate that received its canary, value at the
other one). With the role coin fresh and fair at every step, X and Y form a neighbouring pair of
the per-step mechanism whatever the real data's gradients are (randomized roles). The pairs are
fed, step by step and pair by pair in order, to the registered sequential testers
(:mod:`dpaudit_torch.registry`), each testing the per-step null: the Gaussian mechanism of the
optimizer's current noise multiplier at a grid of points of its privacy profile, or an explicit
(eps, delta). The monitor's e-process is the average of its testers' (one decision at level
alpha); a change of the noise multiplier starts new testers whose wealth multiplies the old one.

The testers run where ``tester_placement`` puts them (:mod:`dpaudit_torch.audit.placement`): on
the host, fed the check's one host copy of the pairs, or on the audit's device, fed the buffered
device tensors (docs/auditor.md, "On a GPU"); the numbers are the same either way.

The monitor also keeps the interference diagnostic: the spread of the real data's gradient W at
the pair coordinates (from the pre-noise sum, when the adapter reads it) and of the observation
at the non-canary coordinate.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...contract import NOISE_MULTIPLIER, StepRecord
from ...registry import ONE_STEP, TESTERS, tester_class
from ..config import DEFAULT_NULL_GRID, DEFAULT_TEST_OPTIONS, TESTER_PLACEMENTS
from ..placement import resolve_placement
from .base import (
    Contribution,
    Evidence,
    Finding,
    Monitor,
    MonitorConfig,
    MonitorContext,
    plain_state,
    register_monitor,
)
from .checks import CheckSection, causes_text, outcome_of

logger = logging.getLogger(__name__)

#: what a canary pair violation may come from (checks that passed rule some out)
_CAUSES = ("noise", "clipping", "scaling")

__all__ = ["SequentialPairsMonitor", "per_step_null_grid", "Segment"]


def per_step_null_grid(sigma: float, grid: Sequence[float] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Grid points (eps_i, delta_sigma(eps_i)) of the Gaussian mechanism's privacy profile.

    With mu = 1 / sigma, eps_i = c_i mu (``grid`` = the c_i, default
    :data:`~dpaudit_torch.audit.config.DEFAULT_NULL_GRID`). docs/design.md section 5: a correct
    DP-SGD step with the canary present is the Gaussian mechanism with sensitivity C and noise
    sigma C, i.e. mu-GDP (Dong, Roth & Su 2019).
    """
    from ...stats.thresholds import gaussian_profile_grid

    if not (sigma > 0) or not math.isfinite(sigma):
        raise ValueError(f"noise multiplier must be a finite number > 0, got {sigma!r}")
    mu = 1.0 / sigma
    eps = np.array([c * mu for c in (DEFAULT_NULL_GRID if grid is None else grid)],
                   dtype=np.float64)
    return eps, gaussian_profile_grid(sigma, eps)


class Segment:
    """Sequential testers for a stretch of steps with one per-step null (one noise multiplier)."""

    def __init__(self, sigma: float, start_step: int, testers: dict[str, Any],
                 epsilons: list[float], deltas: list[float], null: dict[str, Any]) -> None:
        self.sigma = sigma
        self.start_step = start_step
        self.testers = testers
        self.epsilons = epsilons
        self.deltas = deltas
        self.null = null

    def bound(self) -> float:
        """The largest grid epsilon any of its testers rejected (0 if none)."""
        return max([0.0] + [float(t.epsilon_lower_bound) for t in self.testers.values()])

    def null_text(self) -> str:
        if self.null.get("type") == "explicit":
            return f"explicit per-step ({self.null['epsilon']}, {self.null['delta']})-DP"
        if self.null.get("type") == "gaussian_profile":
            return (f"Gaussian mechanism, noise multiplier {self.sigma:.6g} (sensitivity C), at "
                    f"{len(self.epsilons)} points of its privacy profile")
        return "none (no noise claimed)"


def _zero(dev: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64, device=dev)


@dataclass(frozen=True)
class SequentialPairsConfig(MonitorConfig):
    """Settings of the sequential pairs: the level, the testers (names registered in
    :data:`dpaudit_torch.registry.TESTERS`) and their options, and the per-step null (None: the
    Gaussian mechanism of the optimizer's noise multiplier, :func:`per_step_null_grid`), and
    where the testers run (``tester_placement``, :data:`~dpaudit_torch.audit.config.
    TESTER_PLACEMENTS`)."""

    alpha: float = 0.05
    tests: tuple[str, ...] = ("mmd", "hockey_stick")
    per_step_null: tuple[float, float] | None = None
    test_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    tester_placement: str = "auto"

    def __post_init__(self) -> None:
        if self.tester_placement not in TESTER_PLACEMENTS:
            raise ValueError(f"tester_placement must be one of {TESTER_PLACEMENTS}, got "
                             f"{self.tester_placement!r}")

    def tester_options(self, name: str) -> dict[str, Any]:
        """The keyword options tester ``name`` is built with (defaults, then the user's)."""
        return {**DEFAULT_TEST_OPTIONS.get(name, {}), **self.test_options.get(name, {})}


@register_monitor("sequential_pairs")
class SequentialPairsMonitor(Monitor):
    """Buffers the pairs of every step and feeds them to the sequential testers at each check."""

    label = "sequential pairs (per-step guarantee violated)"
    config_class = SequentialPairsConfig
    needs = (NOISE_MULTIPLIER,)
    _STATS = ("w_sum", "w_sumsq", "w_maxabs", "y_sum", "y_sumsq")

    def __init__(self, ctx: MonitorContext) -> None:
        super().__init__(ctx)
        self.config = self.settings
        self.k = ctx.k_pairs
        self.device = torch.device(ctx.device)
        self._warn = ctx.warn
        self.tests = self.config.tests
        self.segments: list[Segment] = []
        self._offset = 0.0  # log-wealth carried over from earlier segments
        self._test_offset = {t: 0.0 for t in self.tests}
        self.log_wealth = 0.0  # this monitor's e-process (log), after the last processed step
        #: the largest it has been (a crossing of 1/alpha at any step is a rejection: Ville)
        self.max_log_wealth = 0.0
        self.test_log_wealth = {t: 0.0 for t in self.tests}
        self.bound = 0.0  # sequential lower bound after the last processed step
        self.reset_buffers()
        dev = self.device
        for name in self._STATS:
            setattr(self, name, _zero(dev))
        self.w_count = 0
        self.y_count = 0
        self._w_pending: list[tuple[torch.Tensor, bool | torch.Tensor]] = []
        #: the buffered pairs are tensor copies, sent to the host by the engine's one transfer
        #: at the check (the accelerator's path; the host path buffers NumPy copies)
        self._copy_at_check = False
        #: where the testers run: "host" or "device" (resolved from ``tester_placement``)
        self.placement, self.placement_reason = resolve_placement(
            self.config.tester_placement, self.device.type, int(ctx.config.check_every), self.k)
        self.tester_device = self.device if self.placement == "device" else torch.device("cpu")
        #: extra tester options of the device placement (``force_device_code``: the code an
        #: accelerator runs, on the CPU)
        self._device_code: dict[str, dict[str, Any]] = {}
        sigma = ctx.fact_or(NOISE_MULTIPLIER)
        if sigma is not None:  # else the owner starts it (tests feeding records by hand)
            self.start(float(sigma))

    def columns(self) -> tuple[str, ...]:
        """The sequential lower bound and each tester's log-wealth, after every step."""
        return ("epsilon_lower_bound", *self.tests)

    def metric_name(self, column: str) -> str:
        return ("epsilon_lower_bound_sequential" if column == "epsilon_lower_bound"
                else f"log_wealth_{column}")

    # ------------------------------------------------------------------ segments
    def start(self, sigma: float, start_step: int = 0) -> None:
        """Begin the first segment (validates the null and builds the testers)."""
        self.segments = [self._new_segment(sigma, start_step)]

    @property
    def segment(self) -> Segment:
        """The segment being tested now."""
        return self.segments[-1]

    def _null_points(self, sigma: float) -> tuple[list[float], list[float], dict[str, Any]] | None:
        explicit = self.config.per_step_null
        if explicit is not None:
            e, d = explicit
            return [e], [d], {"type": "explicit", "epsilon": e, "delta": d}
        if not (sigma > 0) or not math.isfinite(sigma):
            return None
        eps, dels = per_step_null_grid(sigma)
        return eps.tolist(), dels.tolist(), {
            "type": "gaussian_profile", "noise_multiplier": sigma,
            "grid_over_mu": list(DEFAULT_NULL_GRID),
            "epsilons": eps.tolist(), "deltas": dels.tolist()}

    def _defaults_of_state(self, name: str, tester_state: dict[str, Any]) -> dict[str, Any]:
        """The auditor's own default options of tester ``name`` (``DEFAULT_TEST_OPTIONS``, where
        the user did not set them) as a checkpoint's tester was built with them: a resumed
        audit keeps them, so that a default changed by a later release (the MMD witness cap,
        say) does not orphan the checkpoints of an earlier one. Options the user sets are
        compared by the auditor's fingerprint instead."""
        fp = tester_state.get("fingerprint", {}) if isinstance(tester_state, dict) else {}
        user = self.config.test_options.get(name, {})
        return {k: fp[f"config_{k}"] for k in DEFAULT_TEST_OPTIONS.get(name, {})
                if k not in user and f"config_{k}" in fp}

    def _new_segment(self, sigma: float, start_step: int,
                     saved: dict[str, Any] | None = None) -> Segment:
        pts = self._null_points(sigma)
        if pts is None:
            self._warn(f"noise multiplier {sigma!r}: no per-step Gaussian null to test (no "
                       f"privacy is claimed); the sequential audit is off until it changes")
            return Segment(sigma, start_step, {}, [], [], {"type": "none",
                                                            "noise_multiplier": sigma})
        eps, dels, null = pts
        testers: dict[str, Any] = {}
        # each test's own grid bound is at alpha / len(tests) and simultaneous over its grid,
        # so that the reported sequential bound (max over tests and grid) has level alpha
        per_test_alpha = self.config.alpha / len(self.tests)
        for name in self.tests:
            # "host": fed the check's host copies of a few hundred pairs, whose per-chunk
            # betting recursion runs on the host anyway; "device": fed the device tensors
            opts = {"simultaneous": True, "device": self.tester_device,
                    **self.config.tester_options(name), **self._device_code.get(name, {})}
            if saved is not None and name in saved:
                opts.update(self._defaults_of_state(name, saved[name]))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                testers[name] = tester_class(name)(eps, dels, per_test_alpha, **opts)
            for w in caught:
                self._warn(f"{name}: {w.message}")
        return Segment(sigma, start_step, testers, eps, dels, null)

    def force_device_code(self, options: dict[str, dict[str, Any]]) -> None:
        """With the device placement, build the testers with ``options`` per tester (the
        options that make the CPU run the code an accelerator runs: ``force_torch``,
        ``force_vectorised``; :func:`dpaudit_torch.testing.host_sync.force_device_path`), and
        rebuild them where nothing was fed yet. Nothing changes with the host placement."""
        if self.placement != "device":
            return
        self._device_code = {n: dict(o) for n, o in options.items()}
        if self.segments and all(t.n_pairs == 0 for s in self.segments
                                 for t in s.testers.values()):
            self.segments = [self._new_segment(s.sigma, s.start_step) for s in self.segments]

    def _rotate(self, sigma: float, step: int) -> None:
        """The noise multiplier changed: freeze the current wealth as a factor, start anew."""
        self._offset = self.log_wealth
        self._test_offset = dict(self.test_log_wealth)
        text = (f"noise multiplier changed from {self.segment.sigma:.6g} to {sigma:.6g} at step "
                f"{step}: new per-step null; the sequential wealth carries over as a factor")
        if len(self.segments) == 1:  # a schedule (Opacus's noise schedulers) says so once
            self._warn(text + " (later changes are logged at DEBUG and summed up at finalize)")
        else:
            logger.debug(text)
        self.segments.append(self._new_segment(sigma, step))

    def finalize(self, claimed_epsilon: float | None) -> None:
        """One line for a schedule of noise multipliers (more than one change)."""
        if len(self.segments) > 2:
            sig = [s.sigma for s in self.segments]
            self._warn(f"noise multiplier changed {len(sig) - 1} times (a schedule), from "
                       f"{sig[0]:.6g} at the start to {sig[-1]:.6g} "
                       f"from step {self.segments[-1].start_step} (range {min(sig):.6g} to "
                       f"{max(sig):.6g}); each change started a new per-step null")

    # ------------------------------------------------------------------ per step
    def reset_buffers(self) -> None:
        self.buffer_x: list[torch.Tensor] = []
        self.buffer_y: list[torch.Tensor] = []
        self.buffer_steps: list[int] = []
        self.buffer_sigma: list[float] = []
        self.buffer_ok: list[torch.Tensor | bool] = []

    def observe(self, record: StepRecord) -> None:
        # copies: the record's tensors may be views of the adapter's buffers
        hv = record.host
        k = self.k
        if hv is not None and self.device.type == "cpu":  # the host path: NumPy copies
            from_np = torch.from_numpy
            self.buffer_x.append(from_np(hv.xy[:k].copy()))
            self.buffer_y.append(from_np(hv.xy[k:2 * k].copy()))
            rs = record.real_sums
            real = (None if rs is None else from_np(hv.snap[:2 * k].copy())
                    if rs is hv.real_t else rs[:2 * k].clone())  # DDP: the summed one
        else:
            self.buffer_x.append(record.x.clone())
            self.buffer_y.append(record.y.clone())
            real = None if record.real_sums is None else record.real_sums[:2 * k].clone()
            self._copy_at_check = True
        self.buffer_steps.append(record.step)
        self.buffer_sigma.append(record.sigma)
        self.buffer_ok.append(record.finite)
        if real is not None:
            # reduced once per check (interference_summary / _drain), not per step
            self._w_pending.append((real, record.finite))

    def _flush_interference(self) -> None:
        """W, the real data's clipped sum at both coordinates of every pair (units of C; it was
        subtracted from the observations), of the steps since the last call, into the running
        statistics (a non-finite value, or a step flagged non-finite, counts as 0)."""
        if not self._w_pending:
            return
        w = torch.stack([v for v, _ in self._w_pending])
        flags = [f for _, f in self._w_pending]
        self._w_pending = []
        if not all(f is True for f in flags):
            ok = torch.isfinite(w) & torch.stack(
                [torch.as_tensor(f, device=w.device) for f in flags])[:, None]
            w = torch.where(ok, w, torch.zeros_like(w))
        # else every step was checked finite on the host: its released values were finite, so
        # were the real sums subtracted from them
        self.w_sum += w.sum()
        self.w_sumsq += (w * w).sum()
        self.w_maxabs = torch.maximum(self.w_maxabs, w.abs().max())
        self.w_count += int(w.numel())

    @property
    def pending_steps(self) -> list[int]:
        """Steps observed but not yet fed to the testers."""
        return list(self.buffer_steps)

    def discard_pending(self) -> list[int]:
        """Drop the buffered steps without testing them (they held a non-finite value);
        returns their steps."""
        steps = list(self.buffer_steps)
        self.reset_buffers()
        return steps

    @property
    def _pairs_to_host(self) -> bool:
        """Whether the check's transfer brings the buffered pairs to the host (the accelerator's
        path with the testers on the host; with the device placement they stay there)."""
        return self._copy_at_check and self.placement == "host"

    def pending_tensors(self) -> list[torch.Tensor]:
        """The finiteness flags still on the device and, on the accelerator's path with the
        testers on the host, the buffered pairs."""
        bufs = (self.buffer_x, self.buffer_y, self.buffer_ok) if self._pairs_to_host else (
            self.buffer_ok,)
        return [v for b in bufs for v in b if isinstance(v, torch.Tensor)]

    def take_host_copies(self, arrays: list[np.ndarray]) -> None:
        it = iter(arrays)
        for b in ((self.buffer_x, self.buffer_y) if self._pairs_to_host else ()):
            b[:] = [next(it) if isinstance(v, torch.Tensor) else v for v in b]
        self.buffer_ok = [bool(next(it)) if isinstance(v, torch.Tensor) else v
                          for v in self.buffer_ok]

    def _drain_host(self) -> tuple[torch.Tensor, torch.Tensor, list[int], list[float], int]:
        """:meth:`_drain` on the host copies of the accelerator's path (NumPy, no device read);
        the testers are fed host tensors."""
        x, y = np.stack(self.buffer_x), np.stack(self.buffer_y)
        steps, sig, oks = self.buffer_steps, self.buffer_sigma, self.buffer_ok
        self.reset_buffers()
        keep = np.asarray([bool(ok) for ok in oks], dtype=bool)
        dropped = int((~keep).sum())
        if dropped:
            x, y = x[keep], y[keep]
            steps = [s for s, kp in zip(steps, keep) if kp]
            sig = [s for s, kp in zip(sig, keep) if kp]
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if yt.numel():  # spread at the non-canary coordinate (a host sum added on the device)
            self.y_sum += yt.sum()
            self.y_sumsq += (yt * yt).sum()
            self.y_count += int(yt.numel())
        return xt, yt, steps, sig, dropped

    def _drain(self) -> tuple[torch.Tensor, torch.Tensor, list[int], list[float], int]:
        """Buffered pairs as [n_steps, k] tensors, their steps and sigmas, and the number of
        steps dropped for a non-finite value; clears the buffer."""
        self._flush_interference()
        if not self.buffer_x:
            empty = torch.zeros((0, self.k), dtype=torch.float64, device=self.device)
            return empty, empty, [], [], 0
        if self._copy_at_check:
            self.fetch_pending()  # nothing left after the engine's check
            if self._pairs_to_host:
                return self._drain_host()
        # the host path's tensors, or the device placement's device tensors (flags on the host)
        x, y = torch.stack(self.buffer_x), torch.stack(self.buffer_y)
        steps, sig, oks = self.buffer_steps, self.buffer_sigma, self.buffer_ok
        self.reset_buffers()
        dropped = 0
        if not all(ok is True for ok in oks):
            keep = torch.stack([torch.as_tensor(ok) for ok in oks]).cpu()
            if not bool(keep.all()):
                dropped = int((~keep).sum())
                idx = torch.nonzero(keep).reshape(-1).to(x.device, non_blocking=True)
                x, y = x[idx], y[idx]
                steps = [s for s, kp in zip(steps, keep.tolist()) if kp]
                sig = [s for s, kp in zip(sig, keep.tolist()) if kp]
        if y.numel():  # spread at the non-canary coordinate, summed once per chunk
            self.y_sum += y.sum()
            self.y_sumsq += (y * y).sum()
            self.y_count += int(y.numel())
        return x, y, steps, sig, dropped

    # ------------------------------------------------------------------ per check
    def advance(self) -> Evidence | None:
        """Feed the buffered pairs to the testers, step by step; the per-step log e-values.

        ``Evidence.extra`` carries each tester's log-wealth and the sequential lower bound after
        each step, and ``dropped`` steps (non-finite, ``on_nonfinite="skip"``) are counted in
        :attr:`dropped_last`."""
        x, y, steps, sigmas, self.dropped_last = self._drain()
        if not steps:
            return None
        log_e, extra = [], {t: [] for t in self.tests}
        extra["epsilon_lower_bound"] = []
        i = 0
        while i < len(steps):  # split the chunk where the noise multiplier changed
            if sigmas[i] != self.segment.sigma:
                self._rotate(sigmas[i], steps[i])
            j = i + 1
            while j < len(steps) and sigmas[j] == sigmas[i]:
                j += 1
            feed = self._feed_host if self.placement == "host" else self._feed_device
            comb, per_test, bounds = feed(x[i:j], y[i:j])
            log_e.append(comb)
            for t in self.tests:
                extra[t].append(per_test[t])
            extra["epsilon_lower_bound"].append(bounds)
            i = j
        return Evidence(steps=list(steps), log_e=np.concatenate(log_e),
                        extra={k: np.concatenate(v) for k, v in extra.items()})

    def _feed_host(self, x: torch.Tensor, y: torch.Tensor
                   ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """:meth:`_feed` with the testers on the host, fed host tensors (what happens inside
        is host work on every device: ``testing.host_sync.HOST_SIDE_CALLS``)."""
        return self._feed(x, y)

    def _feed_device(self, x: torch.Tensor, y: torch.Tensor
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """:meth:`_feed` with the testers on the audit's device, fed its tensors (their reads
        of the device are the check's own)."""
        return self._feed(x, y)

    def _feed(self, x: torch.Tensor, y: torch.Tensor
              ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """One update per tester for a run of steps [n, k] (pairs in step order, then pair
        order); per-step combined log-wealth, per-tester log-wealth and lower bound, read back
        from the testers' per-pair trajectories."""
        seg = self.segment
        n, k = int(x.shape[0]), int(x.shape[1])
        per_test: dict[str, np.ndarray] = {}
        bound_steps: list[np.ndarray] = []
        xf, yf = x.reshape(-1), y.reshape(-1)
        for name, t in seg.testers.items():
            before = int(t.n_pairs)
            per_test[name] = t.update_with_trajectory(xf, yf)[k - 1::k]
            if not t.grid_rejected.any():  # no grid point rejected: the bound stays 0
                continue
            rej = np.array([np.inf if r is None else r for r in t.grid_rejected_at])
            pairs_after = before + k * np.arange(1, n + 1)
            hit = rej[None, :] <= pairs_after[:, None]  # [n, G]
            bound_steps.append(np.where(hit, t.epsilons[None, :], 0.0).max(axis=1))
        prev = max([0.0] + [s.bound() for s in self.segments[:-1]])
        bounds = np.maximum.reduce(bound_steps + [np.full(n, prev)])
        if per_test:
            stack = np.stack(list(per_test.values()))  # [n_tests, n]
            top = stack.max(axis=0)
            comb = self._offset + top + np.log(np.mean(np.exp(stack - top), axis=0))
        else:
            comb = np.full(n, self.log_wealth)
        tests_lw = {t: (self._test_offset[t] + per_test[t] if t in per_test
                        else np.full(n, self.test_log_wealth[t])) for t in self.tests}
        self.log_wealth = float(comb[-1])
        self.max_log_wealth = max(self.max_log_wealth, float(comb.max()))
        self.test_log_wealth = {t: float(v[-1]) for t, v in tests_lw.items()}
        self.bound = float(bounds[-1])
        return comb, tests_lw, bounds

    def sequential_bound(self) -> float:
        """The anytime per-step lower bound: the largest grid epsilon rejected in any segment."""
        return max([0.0] + [s.bound() for s in self.segments])

    def findings(self) -> list[Finding]:
        if self.max_log_wealth < math.log(1.0 / self.config.alpha):
            return []
        return [Finding(self.name, "violation",
                        f"the canary pairs: a training step leaks more than the per-step null "
                        f"({self.segment.null_text()}) allows: {causes_text(_CAUSES)} "
                        f"(anytime-valid tests at level {self.config.alpha:g})",
                        "the canary pairs' coordinates", scope=ONE_STEP, causes=_CAUSES)]

    def check_section(self) -> CheckSection:
        """Each sequential test on the canary pairs; the whole run is the bounds' matter."""
        sec = CheckSection("Canary pairs (sequential tests)")
        for name, summ in self.report_section()["sequential"]["tests"].items():
            label = TESTERS[name].label if name in TESTERS else name
            sec.check(f"{label}: one step leaks no more than the per-step null allows"
                      f" ({summ.get('n_pairs', 0)} pairs fed)",
                      outcome_of(summ, "pair"))
        sec.measure("canary pairs per step", self.k)
        sec.measure("per-step ε lower bound", self.sequential_bound())
        sec.measure("log-wealth (its e-process in the decision)", self.log_wealth)
        return sec.skip("the whole run's ε", "these tests are about one step; the whole-run "
                        "bounds are in the bounds table")

    def contribution(self) -> Contribution:
        """The per-step bound (``sequential``), the testers' section (``sequential``; the
        engine adds the decision's fields) and the interference that was removed."""
        sec = self.report_section()
        sigma = self.ctx.fact_or(NOISE_MULTIPLIER)
        sigma = float(sigma) if sigma is not None and sigma > 0 else None
        return Contribution(bounds={"sequential": (sec["bound"], sec["details"])},
                            fields={"sequential": sec["sequential"],
                                    "interference": self.interference_summary(sigma)})

    # ------------------------------------------------------------------ report
    def report_section(self) -> dict[str, Any]:
        """``epsilon_lower_bounds.sequential`` with its details, the ``sequential`` section
        (the decision's fields are added by the engine) and the ``interference`` section."""
        seg = self.segment
        return {
            "bound": self.sequential_bound(),
            "details": {
                "level": self.config.alpha, "simultaneous": True,
                "grid_epsilons": list(seg.epsilons), "grid_deltas": list(seg.deltas),
                "null": seg.null_text(),
                "note": "per-step bound, not the whole-run epsilon: a lower bound on the epsilon "
                        "of ONE training step at the grid point's delta (each test at alpha / "
                        f"{len(self.tests)}, Bonferroni over its grid)",
            },
            "sequential": {
                "tests": {n: (seg.testers[n].summary() if n in seg.testers else {})
                          for n in self.tests},
                "per_step_null": seg.null,
                "pairs_per_step": self.k,
                "tester_placement": {"setting": self.config.tester_placement,
                                     "placement": self.placement,
                                     "device": str(self.tester_device),
                                     "reason": self.placement_reason},
                "segments": [{"start_step": s.start_step, "noise_multiplier": s.sigma,
                              "null": s.null} for s in self.segments],
            },
        }

    def interference_summary(self, sigma: float | None) -> dict[str, Any]:
        """The real-data gradient W at the pair coordinates, removed from every observation,
        and the spread of the observation at the non-canary coordinate, in units of C (host
        sync)."""
        self._flush_interference()
        out: dict[str, Any] = {"units": "C (clipping bound)",
                               "coordinates": "both coordinates of each sequential pair",
                               "read_every_steps": 1, "removed": True}
        y_sum, y_sumsq, n_y = float(self.y_sum), float(self.y_sumsq), self.y_count
        if self.buffer_y:  # steps not drained yet
            yb = torch.stack([torch.as_tensor(v, device=self.device) for v in self.buffer_y])
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
            out.update({"source": "p.summed_grad of the real examples, read before the "
                                  "canaries and the noise (subtracted)", "mean": wm,
                        "std": math.sqrt(wv), "rms": math.sqrt(float(self.w_sumsq) / self.w_count),
                        "max_abs": float(self.w_maxabs), "n": self.w_count})
        else:
            out["source"] = "none read (no audited step)"
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        self._flush_interference()

        def stack(b: list[torch.Tensor]) -> torch.Tensor:
            return (torch.stack([torch.as_tensor(v) for v in b]).detach().cpu() if b
                    else torch.zeros((0, self.k), dtype=torch.float64))

        return {
            "segments": [{"sigma": s.sigma, "start_step": s.start_step,
                          "testers": {n: plain_state(t.state_dict())
                                      for n, t in s.testers.items()}}
                         for s in self.segments],
            "offset": self._offset, "test_offset": dict(self._test_offset),
            "log_wealth": self.log_wealth, "test_log_wealth": dict(self.test_log_wealth),
            "max_log_wealth": self.max_log_wealth,
            "bound": self.bound,
            "buffer_x": stack(self.buffer_x), "buffer_y": stack(self.buffer_y),
            "buffer_ok": torch.tensor([bool(torch.as_tensor(o)) for o in self.buffer_ok],
                                      dtype=torch.bool),
            "buffer_steps": list(self.buffer_steps), "buffer_sigma": list(self.buffer_sigma),
            **{n: getattr(self, n).detach().cpu().clone() for n in self._STATS},
            "w_count": self.w_count, "y_count": self.y_count,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Validates everything first; on error this monitor is unchanged."""
        if sd["buffer_x"].numel() and sd["buffer_x"].shape[1] != self.k:
            raise ValueError(f"sequential pairs state for {tuple(sd['buffer_x'].shape)} buffered "
                             f"pairs does not fit k={self.k}")
        segments: list[Segment] = []
        for seg_sd in sd["segments"]:
            seg = self._new_segment(float(seg_sd["sigma"]), int(seg_sd["start_step"]),
                                    saved=seg_sd["testers"])
            if set(seg.testers) != set(seg_sd["testers"]):
                raise ValueError(f"PrivacyAuditor state_dict: segment testers "
                                 f"{sorted(seg_sd['testers'])} vs {sorted(seg.testers)}")
            for name, t in seg.testers.items():
                t.load_state_dict(seg_sd["testers"][name])
            segments.append(seg)
        if not segments:
            raise ValueError("PrivacyAuditor state_dict has no tester segments")
        dev = self.device
        self.segments = segments
        self._offset = float(sd["offset"])
        self._test_offset = {k: float(v) for k, v in sd["test_offset"].items()}
        self.log_wealth = float(sd["log_wealth"])
        # states written before the maximum was kept: the wealth when they were written
        self.max_log_wealth = float(sd.get("max_log_wealth", self.log_wealth))
        self.test_log_wealth = {k: float(v) for k, v in sd["test_log_wealth"].items()}
        self.bound = float(sd["bound"])
        n = len(sd["buffer_steps"])
        self._copy_at_check = self._copy_at_check or dev.type != "cpu"
        self.buffer_x = [sd["buffer_x"][i].to(dev) for i in range(n)]
        self.buffer_y = [sd["buffer_y"][i].to(dev) for i in range(n)]
        self.buffer_ok = [bool(v) for v in sd["buffer_ok"].tolist()]
        self.buffer_steps = [int(v) for v in sd["buffer_steps"]]
        self.buffer_sigma = [float(v) for v in sd["buffer_sigma"]]
        for name in self._STATS:
            setattr(self, name, sd[name].to(dev, torch.float64).clone())
        self.w_count = int(sd["w_count"])
        self.y_count = int(sd["y_count"])
