"""The one-run membership game on the canaries (docs/design.md sections 5, 6 and 9).

Each of the m one-run canaries is IN with probability 1/2 (a secret coin, revealed only at
finalize) and an IN canary is included at every step with the data loader's Poisson rate q, so the
audited mechanism is the one the accountant describes. Two running scores per canary, from its
interference-free values Z (units of C): the plain sum of Z, and the sum of the per-step
log-likelihood ratio of the claimed per-step mechanism,
``log(1 - q + q exp((Z - 1/2) / sigma^2))`` (:func:`~dpaudit_torch.stats.one_run_scores.
llr_step_score`). Neither uses the coins, so both are valid scores for the game; the
configured one (``one_run_score``) gives the reported bounds. At finalize the secret is revealed
and the whole-run lower bounds registered for this monitor
(:func:`dpaudit_torch.registry.methods_of`) are computed: Steinke, Nasr & Jagielski (NeurIPS
2023) and the Gaussian-family f-DP test of Mahloujifar, Melis & Chaudhuri (ICML 2025), by
:class:`~dpaudit_torch.stats.one_run.OneRunAudit`; and the audit's power: the bound a correct
implementation would give with this run's settings, and the smallest true epsilon it would
refute (:func:`~dpaudit_torch.stats.one_run_power.one_run_power`).

It also keeps each canary's sums of Z^2 and Z^4, for the default bound: the white-box release
bound of :mod:`dpaudit_torch.stats.whitebox` (docs/design.md section 13), which uses every
observation's value through the exact law of the canaries' sums, the known inclusion rate and the
noise measured on the OUT canaries, and reports only when those canaries' per-step values pass
its family check. Its power statement (exact, no simulation) is the report's ``power``.

Under per-layer clipping the canaries are layered (:mod:`dpaudit_torch.canary_layers`): each
step's member values are combined into one value per canary, in units of C, and the scores, the
bounds and the power statement are those of a canary contributing c = C_S / C.

Under a noise schedule (Opacus's noise schedulers) it keeps each canary's sum weighted by
w_t = (sigma_0 / sigma_t)^2, the moments and trace of Z_t / b_t (b_t = sigma_t / sigma_0) and the
steps per multiplier, and the bound is the schedule's (docs/design.md section 13, "Schedules");
a clipping schedule needs nothing (the values are in units of each step's C_t) and is logged
once when first seen and summed up at finalize.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..._buffers import host_zeros
from ...contract import EPSILON_OF_SIGMA, NOISE_MULTIPLIER, SAMPLE_RATE, StepRecord
from ...registry import methods_of
from ...stats.one_run_power import stopped_wording
from ...stats.whitebox import WHITEBOX_ALPHA
from .base import Contribution, Evidence, Monitor, MonitorConfig, MonitorContext, register_monitor
from .checks import CheckSection

logger = logging.getLogger(__name__)

__all__ = ["OneRunMonitor", "POWER_REPLICATES", "POWER_SEARCH_REPLICATES"]

#: simulated games for the expected bound, and per step of the search for the smallest
#: refutable epsilon: a few seconds at finalize with 5,000 canaries (docs/one_run.md)
POWER_REPLICATES = 100
POWER_SEARCH_REPLICATES = 40
#: at most this many values of pending steps are kept for the next scoring pass (CPU)
PENDING_VALUES = 1 << 18
#: at most this many per-step canary values (float32: 64 MiB) are kept for the white-box
#: family check's whole-null tests: every step while m T fits, else the first steps
TRACE_VALUES = 1 << 24
#: steps per block of the kept trace
TRACE_BLOCK = 256


def _host_f64(*tensors: torch.Tensor) -> bool:
    """Whether every tensor is a contiguous float64 CPU tensor (updated in place as NumPy)."""
    return all(t.device.type == "cpu" and t.dtype == torch.float64 and t.is_contiguous()
               for t in tensors)


def _positive_or_zero(value: Any) -> float:
    """``value`` as a float if it is a finite positive number, else 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if v > 0 and math.isfinite(v) else 0.0


class _NoBoundError(Exception):
    """The white-box bound does not apply to this run (the reason is reported)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class OneRunConfig(MonitorConfig):
    """Settings of the one-run game: the bounds' delta and level (the Steinke share of alpha,
    docs/design.md section 14), the score, the check period and the white-box bound's level
    (``whitebox_alpha``: its share; it decides how often a correct run's bound exceeds it)."""

    alpha_path: ClassVar[str] = "steinke"
    delta: float = 1e-5
    alpha: float = 0.05
    one_run_score: str = "llr"
    check_every: int = 5
    whitebox_alpha: float = WHITEBOX_ALPHA

    def __post_init__(self) -> None:
        a = self.whitebox_alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not (0.0 < a < 1.0):
            raise ValueError(f"whitebox_alpha must be in (0, 1), got {a!r}")


@register_monitor("one_run")
class OneRunMonitor(Monitor):
    """Running scores of the one-run canaries; whole-run bounds and power at finalize."""

    label = "one-run"
    config_class = OneRunConfig
    needs = (SAMPLE_RATE, EPSILON_OF_SIGMA, NOISE_MULTIPLIER)

    def __init__(self, ctx: MonitorContext) -> None:
        super().__init__(ctx)
        self.config = self.settings
        # per-layer clipping: layered canaries (dpaudit_torch.canary_layers), each the
        # weighted sum of its members' values, in units of C; else one value per canary
        self._layout = ctx.layout
        self._members = ctx.m_canaries
        self.m = ctx.m_canaries if self._layout is None else int(self._layout.groups)
        self._weights = None if self._layout is None else self._layout.weights()
        # the canary's contribution in units of C (the likelihood-ratio score's shift)
        self._c = 1.0 if self._layout is None else float(self._layout.contribution)
        self.device = torch.device(ctx.device)
        self.coins = ctx.coins
        self.sample_rate = float(ctx.fact_or(SAMPLE_RATE, 1.0))
        self._epsilon_of_sigma = ctx.fact_or(EPSILON_OF_SIGMA)
        self._warn = ctx.warn
        self.methods = methods_of(self.name)
        self.steps = 0
        self._scores = {s: torch.zeros(self.m, dtype=torch.float64, device=self.device)
                        for s in ("sum", "llr")}
        # per canary: sum of Z^2 and of Z^4 over the steps (the white-box family check)
        self._moments = torch.zeros(2, self.m, dtype=torch.float64, device=self.device)
        self._moments_ok = True  # False after loading a checkpoint that lacks them
        # every canary's per-step values (float32, blocks of TRACE_BLOCK steps) up to
        # TRACE_VALUES: the OUT canaries' rows feed the family check's whole-null tests
        self._trace: list[torch.Tensor] = []
        self._trace_n = 0
        self._trace_np: np.ndarray | None = None  # the last CPU block's NumPy view
        self._trace_cap = TRACE_VALUES // max(self.m, 1)
        self.sigmas: set[float] = set()  # noise multipliers of the observed steps
        # the schedule of noise multipliers (docs/design.md section 13, "Schedules"): steps per
        # multiplier, the first step's (the reference of the weights w_t = (sigma_0 /
        # sigma_t)^2), and per canary the sum of w_t Z_t; the moments and the trace hold
        # Z_t / b_t, b_t = sigma_t / sigma_0 (all 1 without a schedule)
        self._sigma_counts: dict[float, int] = {}
        self._sigma_ref: float | None = None
        self._wsum = torch.zeros(self.m, dtype=torch.float64, device=self.device)
        self._schedule_ok = True  # False after loading a checkpoint that lacks the schedule
        self._row_tmp: np.ndarray | None = None
        # the clipping bound C_t of each step (noise_std / sigma): a clipping schedule is
        # followed (the values are in units of C_t), said once and summed up at finalize
        self.clip_bounds: dict[str, Any] = {"changes": 0}
        self.score_used: str | None = None
        self.bounds: dict[str, float] = {}
        self.details: dict[str, dict[str, Any]] = {}
        self.power: dict[str, Any] = {}
        self._in_mask: torch.Tensor | None = None
        # CPU: the values of the steps since the last check, scored together at the check (or
        # whenever the scores are read): one vectorised pass over a few steps instead of one per
        # step, the same additions in the same order (docs/auditor.md, "Costs")
        self._rows = max(1, min(int(self.config.check_every), PENDING_VALUES // max(self.m, 1)))
        self._pending: np.ndarray | None = None
        self._pending_sigma: list[float] = []
        self._scratch: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def scores(self) -> dict[str, torch.Tensor]:
        """The running scores, ``{"sum": [m], "llr": [m]}`` (float64), up to the last step
        observed."""
        self._flush()
        return self._scores

    @scores.setter
    def scores(self, value: dict[str, torch.Tensor]) -> None:
        self._pending_sigma = []
        self._scores = value

    def _host_scores(self) -> bool:
        """Whether the running scores are contiguous float64 CPU tensors (checked once per
        pair of score tensors)."""
        total, llr = self._scores["sum"], self._scores["llr"]
        hit = self.__dict__.get("_host_scores_of")
        if hit is None or hit[0] is not total or hit[1] is not llr:  # the tensors themselves
            hit = (total, llr, _host_f64(total, llr))
            self._host_scores_of = hit
        return hit[2]

    def _flush(self) -> None:
        """Score the pending steps: the sum, and the likelihood-ratio score of each run of
        steps with the same sigma in one vectorised pass, each step added in its order."""
        n = len(self._pending_sigma)
        if not n:
            return
        from ...stats.one_run_scores import accumulate_llr

        assert self._pending is not None and self._scratch is not None
        total, llr = self._scores["sum"].numpy(), self._scores["llr"].numpy()
        sig = self._pending_sigma
        self._pending_sigma = []
        mom = self._moments.numpy()
        wsum = self._wsum.numpy()
        sq = self._scratch[0][:1]
        if self._row_tmp is None:
            self._row_tmp = host_zeros((2, self.m))
        for row, s in zip(self._pending[:n], sig):
            b = self._shape(s)
            x = row
            if b != 1.0:  # a schedule: the value in units of the reference noise
                x = self._row_tmp[0]
                np.multiply(row, 1.0 / b, out=x)
            self._keep(x)
            np.add(total, row, out=total)
            if b != 1.0:
                np.multiply(x, 1.0 / b, out=self._row_tmp[1])
                np.add(wsum, self._row_tmp[1], out=wsum)
            else:
                np.add(wsum, row, out=wsum)
            np.multiply(x, x, out=sq[0])
            np.add(mom[0], sq[0], out=mom[0])
            np.multiply(sq[0], sq[0], out=sq[0])
            np.add(mom[1], sq[0], out=mom[1])
        i = 0
        while i < n:
            j = i + 1
            while j < n and sig[j] == sig[i]:
                j += 1
            accumulate_llr(self._pending[i:j], llr, self.sample_rate, sig[i], self._c,
                           scratch=(self._scratch[0][:j - i], self._scratch[1][:j - i]))
            i = j

    def _track_clip(self, clip: float, step: int) -> None:
        """Follow the clipping bound; one line at its first change (a schedule)."""
        cb = self.clip_bounds
        last = cb.get("last")
        if last is None:
            cb.update(first=clip, last=clip, min=clip, max=clip)
            return
        if math.isclose(clip, last, rel_tol=1e-9):
            return
        cb["changes"] += 1
        cb.update(last=clip, last_step=step, min=min(cb["min"], clip), max=max(cb["max"], clip))
        if cb["changes"] == 1:
            logger.info("clipping bound changed from %.6g to %.6g at step %d (a clipping "
                        "schedule): the canaries' values are read in units of each step's "
                        "bound, so the audit follows it (summed up at finalize)", last, clip,
                        step)

    def _shape(self, sigma: float) -> float:
        """b_t = sigma_t / sigma_0 of a step (1 for a step without a finite positive
        multiplier: the schedule then has no bound, :meth:`_schedule`)."""
        ref = self._sigma_ref
        if ref is None or not (sigma > 0 and math.isfinite(sigma)):
            return 1.0
        return sigma / ref

    def _schedule(self) -> Any:
        """The run's :class:`~dpaudit_torch.stats._whitebox_schedule.NoiseSchedule` (None
        with one multiplier); _NoBoundError where a schedule has no white-box law."""
        if len(self._sigma_counts) <= 1 and len(self.sigmas) <= 1:
            return None
        from ...stats._whitebox_schedule import NoiseSchedule

        if not self._schedule_ok:
            raise _NoBoundError("the noise multiplier changed during the run and the "
                                "checkpoint this audit resumed from lacks its schedule")
        bad = [s for s in self._sigma_counts if not (s > 0 and math.isfinite(s))]
        if bad or self._sigma_ref is None:
            raise _NoBoundError(f"the noise multiplier changed during the run and a step had "
                                f"none (finite and positive): {bad[:3]}")
        vals = sorted(self._sigma_counts)
        return NoiseSchedule(self._sigma_ref, tuple(vals),
                             tuple(self._sigma_counts[v] for v in vals))

    def _keep(self, z: np.ndarray | torch.Tensor) -> None:
        """Keep one step's canary values [m] in the trace (float32), while it has room."""
        if self._trace_n >= self._trace_cap:
            return
        i = self._trace_n % TRACE_BLOCK
        if i == 0:
            rows = min(TRACE_BLOCK, self._trace_cap - self._trace_n)
            if self.device.type == "cpu":  # mapped pages, off the training heap (_buffers)
                arr = host_zeros((rows, self.m), np.float32)
                self._trace.append(torch.from_numpy(arr))
                self._trace_np = arr
            else:
                self._trace.append(torch.empty(rows, self.m, dtype=torch.float32,
                                               device=self.device))
        if isinstance(z, np.ndarray) and self._trace_np is not None \
                and self._trace_np.shape[0] > i and self.device.type == "cpu":
            self._trace_np[i] = z  # (the CPU path: a NumPy row, no torch call)
        else:
            self._trace[-1][i].copy_(torch.as_tensor(z))
        self._trace_n += 1

    def trace(self) -> np.ndarray:
        """The kept per-step values of every canary, [steps kept, m] float32 (host)."""
        self._flush()
        if not self._trace_n:
            return np.zeros((0, self.m), dtype=np.float32)
        full = torch.cat([b.detach().cpu() for b in self._trace])[:self._trace_n]
        return full.numpy()

    def observe(self, record: StepRecord) -> None:
        sig = float(record.sigma)
        if self._sigma_ref is None and sig > 0 and math.isfinite(sig):
            self._sigma_ref = sig
        if self.m:
            from ...stats.one_run_scores import llr_step_score

            scored = record.sigma > 0 and math.isfinite(record.sigma)
            hv = record.host  # the compiled CPU path's NumPy buffers (no torch call needed)
            if (scored and hv is not None and isinstance(record.finite, bool)
                    and self._host_scores() and self._moments.device.type == "cpu"):
                z_np = hv.vals[2 * hv.k:2 * hv.k + self._members]
                members = self._weights is not None  # (combined below, into its row)
            else:
                members = False
                z = record.one_run
                if self._layout is not None:
                    z = self._layout.combine(z)
                total, llr = self._scores["sum"], self._scores["llr"]
                z_np = (z.numpy() if scored and isinstance(record.finite, bool)
                        and _host_f64(z, total, llr, self._moments) else None)
            if z_np is not None:
                # CPU: kept for the next flush, in arrays allocated once (nothing of m's size
                # per step)
                if self._pending is None or self._scratch is None:
                    # mapped pages of their own, off the training loop's heap (allocated at
                    # the first step, among training's tensors: _buffers.host_zeros)
                    self._pending = host_zeros((self._rows, self.m))
                    self._scratch = (host_zeros((self._rows, self.m)),
                                     host_zeros((self._rows, self.m)))
                if len(self._pending_sigma) == self._rows:
                    self._flush()
                if members:
                    np.matmul(self._weights, z_np.reshape(self._weights.shape[0], self.m),
                              out=self._pending[len(self._pending_sigma)])
                else:
                    self._pending[len(self._pending_sigma)] = z_np
                self._pending_sigma.append(float(record.sigma))
            else:
                self._flush()
                b = self._shape(sig)
                x = z if b == 1.0 else z * (1.0 / b)
                self._keep(x)
                total += z
                self._wsum += z if b == 1.0 else x * (1.0 / b)
                sq = x * x
                if not isinstance(record.finite, bool):
                    sq = torch.where(record.finite, sq, torch.zeros_like(sq))
                self._moments[0] += sq
                self._moments[1] += sq * sq
                if scored:
                    inc = llr_step_score(z, self.sample_rate, record.sigma, self._c)
                    if not isinstance(record.finite, bool):  # a dropped step adds nothing
                        inc = torch.where(record.finite, inc, torch.zeros_like(inc))
                    llr += inc
        self.sigmas.add(sig)
        self._sigma_counts[sig] = self._sigma_counts.get(sig, 0) + 1
        std = float(record.noise_std)
        if sig > 0 and std > 0 and math.isfinite(std / sig):
            self._track_clip(std / sig, int(record.step))
        self.steps += 1

    def stacked_scores(self) -> torch.Tensor:
        """Every running score, ``[2, m]`` (the sum, then the likelihood-ratio score): a copy."""
        return torch.stack([self.scores["sum"], self.scores["llr"]]).clone()

    def advance(self) -> Evidence | None:
        self._flush()
        return None  # no evidence during training: the game is played once, at the end

    def _score(self) -> str:
        """The configured score, or the sum when the likelihood ratio is undefined (a step with
        no noise claimed)."""
        score = self.config.one_run_score
        if score == "llr" and any(not (s > 0 and math.isfinite(s)) for s in self.sigmas):
            self._warn("one-run score: a step had no (finite) noise multiplier, so the "
                       "likelihood-ratio score is undefined; the plain sum was used")
            return "sum"
        return score

    def finalize(self, claimed_epsilon: float | None) -> None:
        """Reveal the secret coins, compute every whole-run bound of this monitor and the
        power statement."""
        self.claimed = claimed_epsilon
        self._in_mask = self.coins.reveal()
        if self._layout is not None:  # a canary's members share its coin
            self._in_mask = self._layout.group_mask(self._in_mask)
        self.score_used = score = self._score()
        scores = self.scores[score].detach().cpu()
        ins, outs = scores[self._in_mask], scores[~self._in_mask]
        if self.steps == 0 or ins.numel() == 0 or outs.numel() == 0:
            note = "no one-run bound: no audited steps or an empty IN/OUT group"
            for method in self.methods:
                self.bounds[method] = 0.0
                self.details[method] = {"bound": 0.0, "method": method, "note": note}
        else:
            from ...stats.one_run import OneRunAudit

            audit = OneRunAudit(ins, outs)
            for method in self.methods:
                if method == "whitebox":
                    self._whitebox()
                    continue
                try:
                    res = audit.epsilon_lower_bound(delta=self.config.delta,
                                                    alpha=self.config.alpha, method=method)
                    self.bounds[method] = float(res.bound)
                    self.details[method] = {**res.to_dict(), "score": score}
                except Exception as e:  # noqa: BLE001 - report, never crash the end of training
                    msg = f"one-run {method} bound failed: {e!r}"
                    self._warn(msg)
                    self.bounds[method] = 0.0
                    self.details[method] = {"bound": 0.0, "method": method, "note": msg}
        self.power = self._power(claimed_epsilon, score)
        cb = self.clip_bounds
        if cb["changes"] > 1:
            logger.info("clipping bound changed %d times (a schedule), from %.6g at the start "
                        "to %.6g from step %d (range %.6g to %.6g); each step's values were "
                        "read in units of its own bound", cb["changes"], cb["first"],
                        cb["last"], cb["last_step"], cb["min"], cb["max"])

    def _whitebox(self) -> None:
        """The white-box release bound (docs/design.md section 13); never raises."""
        from ...stats.whitebox import release_moments, whitebox_bound

        method = "whitebox"
        t0 = time.perf_counter()
        try:
            sched = self._schedule()
            if not self._moments_ok:
                raise _NoBoundError("the per-step moments were not in the checkpoint this "
                                    "audit resumed from")
            assert self._in_mask is not None
            mask = self._in_mask.cpu().numpy()
            sums = self.scores["sum"] if sched is None else self._wsum
            mom = release_moments(sums.detach().cpu().numpy(), mask, self.steps,
                                  self._moments[0].detach().cpu().numpy(),
                                  self._moments[1].detach().cpu().numpy(),
                                  weight_sum=None if sched is None else sched.weight_sum)
            res = whitebox_bound(mom, self.sample_rate, self.config.delta,
                                 alpha=float(self.config.whitebox_alpha),
                                 out_values=self.trace()[:, ~mask], schedule=sched)
            det = res.to_dict()
            det["score"] = "sum"
            if self._layout is not None:  # what the canaries contribute, in units of C
                det["contribution"] = float(self._layout.contribution)
            if res.bound is None:
                self._warn(f"one-run white-box bound: {res.note}")
            self.bounds[method] = float(res.bound) if res.bound is not None else 0.0
            det["bound"] = self.bounds[method]
            self.details[method] = det
        except Exception as e:  # noqa: BLE001 - report, never crash the end of training
            msg = (f"no white-box bound: {e.reason}" if isinstance(e, _NoBoundError)
                   else f"one-run whitebox bound failed: {e!r}")
            if not isinstance(e, _NoBoundError):
                self._warn(msg)
            self.bounds[method] = 0.0
            self.details[method] = {"bound": 0.0, "method": method, "note": msg,
                                    "family_verified": False}
        logger.info("white-box bound took %.2f s", time.perf_counter() - t0)

    def _power(self, claimed: float | None, score: str) -> dict[str, Any]:
        """What this audit could have found (docs/one_run.md): never raises."""
        from ...stats.one_run_power import one_run_power

        if self.sigmas:  # the smallest noise multiplier of the observed steps
            sigma = min(self.sigmas)
        else:  # no step observed: the optimizer's noise multiplier, as claimed now
            sigma = _positive_or_zero(self.ctx.fact_or(NOISE_MULTIPLIER, 0.0))
        t0 = time.perf_counter()
        if "whitebox" in self.methods and self.steps > 0 and sigma > 0:
            return self._whitebox_power(sigma, claimed)
        try:
            eps_of = self._epsilon_of_sigma
            res = one_run_power(
                sigma if sigma > 0 else 1.0, self.sample_rate, self.steps, self.m,
                score=score, delta=self.config.delta, alpha=self.config.alpha,
                claimed_epsilon=claimed, c=self._c,
                epsilon_of_sigma=(None if eps_of is None
                                  else (lambda s, _t=self.steps: eps_of(s, _t))),
                replicates=POWER_REPLICATES, search_replicates=POWER_SEARCH_REPLICATES, seed=0)
            out = res.to_dict()
        except Exception as e:  # noqa: BLE001 - a power statement must not break finalize
            self._warn(f"one-run power simulation failed: {e!r}")
            return {"note": f"no power statement: the simulation failed ({e!r})"}
        if self.steps == 0:
            out["note"] = "no training step was audited: the power statement is not defined"
        elif not (sigma > 0):
            out["note"] = "no noise multiplier was claimed: the power statement is not defined"
        if self.steps == 0 or not (sigma > 0):
            for key in ("expected_bound", "expected_bound_quantiles", "min_refutable_epsilon",
                        "min_refutable_sigma"):
                if key in out:
                    out[key] = None
        if self.ctx.stopped_training():  # no advice to train longer
            out["warnings"] = stopped_wording(out.get("warnings", []), self.sample_rate,
                                              self.steps)
        for w in out.get("warnings", []):
            self._warn(w)
        # the report holds what the audit could find, not how long the simulation took
        out.pop("seconds", None)
        logger.info("one-run power simulation took %.2f s", time.perf_counter() - t0)
        return out

    def _whitebox_power(self, sigma: float, claimed: float | None) -> dict[str, Any]:
        """The default bound's power statement: exact, from the law of its statistic."""
        from ...stats.whitebox import whitebox_power

        t0 = time.perf_counter()
        eps_of = self._epsilon_of_sigma
        n_in = int(self._in_mask.sum()) if self._in_mask is not None else None
        # the contribution the canaries reach (per-layer clipping: C_S / C, else 1): their
        # release is the family's at noise multiplier sigma / c (docs/design.md section 5)
        c = 1.0 if self._layout is None else float(self._layout.contribution)
        try:
            out = whitebox_power(
                sigma / c, self.sample_rate, self.steps, self.m, delta=self.config.delta,
                alpha=float(self.config.whitebox_alpha), claimed_epsilon=claimed, n_in=n_in,
                epsilon_of_sigma=(None if eps_of is None
                                  else (lambda s, _t=self.steps: float(eps_of(s * c, _t)))))
            if self._layout is not None:
                from ...canary_layers import reached_contribution

                reached_contribution(out, self._layout, sigma, self.sample_rate, self.steps,
                                     self.config.delta)
        except Exception as e:  # noqa: BLE001 - a power statement must not break finalize
            self._warn(f"one-run white-box power failed: {e!r}")
            return {"note": f"no power statement: the computation failed ({e!r})"}
        out["claimed_epsilon"] = claimed
        out["sigma"] = sigma
        if len(self._sigma_counts) > 1:  # the law of a schedule is the bound's, not this one's
            out["note"] = " ".join(filter(None, (out.get("note"), (
                f"a noise schedule ({len(self._sigma_counts)} multipliers): the power is "
                f"computed as for a run at the smallest, {sigma:.4g}, at every step (an upper "
                f"end of the power under the schedule)"))))
        if self.ctx.stopped_training():  # no advice to train longer
            out["warnings"] = stopped_wording(out.get("warnings", []), self.sample_rate,
                                              self.steps)
        for w in out.get("warnings", []):
            self._warn(w)
        logger.info("white-box power took %.2f s", time.perf_counter() - t0)
        return out

    def contribution(self) -> Contribution:
        """Its whole-run bounds, the scores split by the revealed coins (``one_run_scores``),
        the power statement (``power``) and the IN count (in ``canaries``)."""
        sec = self.report_section()
        return Contribution(
            bounds={m: (sec["bounds"][m], sec["details"][m]) for m in sec["bounds"]},
            fields={"one_run_scores": sec["scores"], "power": sec["power"]},
            canaries={"one_run_in": sec["n_in"]})

    def check_section(self) -> CheckSection:
        """The whole-run bounds against the claim, the power; a withheld bound says why."""
        sec = CheckSection("One-run canaries (whole-run bounds)")
        claim = getattr(self, "claimed", None)
        for m in self.methods:
            det = self.details.get(m) or {}
            if m not in self.bounds or det.get("family_verified") is False or (
                    self.bounds[m] == 0 and str(det.get("note")).startswith("no ")):
                sec.skip(f"{m} lower bound", det.get("note") or "withheld or not computed")
                continue
            b = self.bounds[m]
            sec.check(f"{m} lower bound on the whole run's ε at most the claimed ε",
                      "no claim to compare" if claim is None else
                      f"{b:.4g} {'>' if b > claim else '≤'} {claim:.4g} (whether a bound "
                      f"above the claim refutes it: the bounds table)")
            sec.measure(f"{m} lower bound", b)
        sec.measure("audited steps", self.steps)
        sec.measure("expected bound of a correct implementation", self.power.get(
            "expected_bound"))
        return sec.measure("smallest refutable ε", self.power.get("min_refutable_epsilon"))

    def report_section(self) -> dict[str, Any]:
        """The bounds, their details, the scores split by the revealed coins and the power
        (after :meth:`finalize`)."""
        if self._in_mask is None or self.score_used is None:
            raise RuntimeError("the one-run report section exists only after finalize()")
        scores = self.scores[self.score_used].detach().cpu()
        return {
            "bounds": dict(self.bounds), "details": dict(self.details),
            "scores": {"in": scores[self._in_mask].tolist(),
                       "out": scores[~self._in_mask].tolist()},
            "n_in": int(self._in_mask.sum()), "score": self.score_used,
            "power": dict(self.power),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "sigmas": sorted(self.sigmas),
                "scores": {k: v.detach().cpu().clone() for k, v in self.scores.items()},
                "moments": (self._moments.detach().cpu().clone() if self._moments_ok
                            else None),
                "schedule": ({"ref": self._sigma_ref,
                              "counts": [[s, c] for s, c in self._sigma_counts.items()],
                              "wsum": self._wsum.detach().cpu().clone()}
                             if self._schedule_ok else None),
                "clip_bounds": dict(self.clip_bounds),
                "trace": torch.from_numpy(self.trace().copy())}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        scores = sd["scores"]
        if set(scores) != set(self.scores) or any(
                tuple(v.shape) != (self.m,) for v in scores.values()):
            raise ValueError(f"one-run state with scores {sorted(scores)} of shapes "
                             f"{[tuple(v.shape) for v in scores.values()]} does not fit "
                             f"m={self.m}")
        self.steps = int(sd["steps"])
        self.sigmas = {float(s) for s in sd["sigmas"]}
        self.scores = {k: v.to(self.device, torch.float64).clone() for k, v in scores.items()}
        mom = sd.get("moments")  # absent in checkpoints written before the white-box bound
        if isinstance(mom, torch.Tensor) and tuple(mom.shape) == (2, self.m):
            self._moments = mom.to(self.device, torch.float64).clone()
            self._moments_ok = True
        else:
            self._moments = torch.zeros(2, self.m, dtype=torch.float64, device=self.device)
            self._moments_ok = self.steps == 0
        self.clip_bounds = dict(sd.get("clip_bounds") or {"changes": 0})
        # the schedule (absent in older checkpoints: rebuilt where there was one multiplier)
        sch = sd.get("schedule")
        self._wsum = torch.zeros(self.m, dtype=torch.float64, device=self.device)
        if isinstance(sch, dict) and tuple(sch["wsum"].shape) == (self.m,):
            self._sigma_ref = None if sch["ref"] is None else float(sch["ref"])
            self._sigma_counts = {float(s): int(c) for s, c in sch["counts"]}
            self._wsum = sch["wsum"].to(self.device, torch.float64).clone()
            self._schedule_ok = True
        else:
            one = next(iter(self.sigmas)) if len(self.sigmas) == 1 else None
            self._sigma_counts = {one: self.steps} if one is not None and self.steps else {}
            self._sigma_ref = one if one is not None and one > 0 and math.isfinite(one) else None
            self._wsum = self._scores["sum"].clone()
            self._schedule_ok = len(self.sigmas) <= 1
        # the kept per-step values (absent in older checkpoints: the trace then holds the
        # steps after the resume, a window fixed before they were seen)
        tr = sd.get("trace")
        self._trace, self._trace_n, self._trace_np = [], 0, None
        if isinstance(tr, torch.Tensor) and tr.dim() == 2 and tr.shape[1] == self.m:
            for row in tr.to(torch.float32):
                self._keep(row.to(self.device))
