"""Sampling monitor: are the real batches Poisson samples at the loader's rate?
(docs/design.md section 10).

The accountant assumes that every record is included in a step independently with probability
q (Poisson sampling). A loader that draws fixed-size batches (shuffling, ``drop_last``, a user's
own sampler) breaks that assumption while every step still looks like a correct Gaussian step.
Under Poisson sampling the number of real examples of a logical step is n_t ~ Binomial(N, q);
:class:`~dpaudit_torch.stats.sampling.PoissonBatchTest` bets against that law step by step
(anytime-valid), so fixed-size batches are decided within tens of steps; its e-process is
averaged with the other monitors' in the decision.

It needs N (the loader's dataset length) and the real batch sizes (the per-sample rows, or
under ghost clipping the per-sample norms, of every micro-batch; under sharded ghost clipping
only where the model was handed to the audit): without them it says which and why, and does
not bet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...contract import N_REAL_NOT_OBSERVED, N_RECORDS, SAMPLE_RATE, StepRecord
from ._sampling_repeats import RepeatWatch
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

__all__ = ["SamplingMonitor"]


@dataclass(frozen=True)
class SamplingConfig(MonitorConfig):
    """Settings of the sampling monitor: the level of its test and of its rate interval."""

    alpha: float = 0.05


@register_monitor("sampling")
class SamplingMonitor(Monitor):
    """Tests n_t ~ Binomial(N, q) at every step; a confidence interval for q at the end."""

    label = "sampling (batch sizes not Poisson)"
    config_class = SamplingConfig
    needs = (SAMPLE_RATE, N_RECORDS)

    def __init__(self, ctx: MonitorContext) -> None:
        from ...stats.sampling import PoissonBatchTest

        super().__init__(ctx)
        self.config = self.settings
        self.rate = float(ctx.fact_or(SAMPLE_RATE, 1.0))
        self.n_records = ctx.fact_or(N_RECORDS)
        self.reason_off: str | None = None
        self.test: Any = None
        if self.n_records is None:
            self.reason_off = (f"the number of records N that Poisson sampling draws from is "
                               f"unknown: {ctx.why_not(N_RECORDS)}")
        else:
            self.test = PoissonBatchTest(self.n_records, self.rate, self.config.alpha)
        #: the test of fresh batches (repeats of the sizes at any lag; docs/design.md s. 10)
        self.repeats: RepeatWatch | None = (None if self.test is None else RepeatWatch(
            self.n_records, self.rate, self.config.alpha))
        self._buffer: list[tuple[int, int]] = []
        self._flags: list[bool | Any] = []
        self._first = True
        #: the training step whose batch size made the test cross 1/alpha (None before)
        self.rejected_step: int | None = None

    def observe(self, record: StepRecord) -> None:
        if self._first:
            self._first = False
            if record.n_real is None and self.test is not None:
                self.test = self.repeats = None
                self.reason_off = N_REAL_NOT_OBSERVED
        if self.test is not None:
            self._buffer.append((record.step, int(record.n_real or 0)))
            self._flags.append(record.finite)

    def pending_tensors(self) -> list[Any]:
        """The accelerator's path: the buffered steps' finiteness flags (device tensors)."""
        return [f for f in self._flags if not isinstance(f, bool)]

    def take_host_copies(self, arrays: list[np.ndarray]) -> None:
        it = iter(arrays)
        self._flags = [f if isinstance(f, bool) else bool(next(it)) for f in self._flags]

    def advance(self) -> Evidence | None:
        if self.test is None or not self._buffer:
            return None
        self.fetch_pending()  # nothing left after the engine's check
        keep = host_flags(self._flags)  # drop steps flagged non-finite
        steps = [s for (s, _), k in zip(self._buffer, keep) if k]
        sizes = np.asarray([n for (_, n), k in zip(self._buffer, keep) if k], dtype=np.int64)
        self._buffer, self._flags = [], []
        if not steps:
            return None
        seen, was = self.test.n_steps, self.test.rejected
        log_e = self.test.update_with_trajectory(sizes)  # the wealth after each step
        if self.test.rejected and not was:  # the test's own count, as a training step
            self.rejected_step = steps[self.test.rejected_at - seen - 1]
        if self.repeats is not None:  # the average of both tests' e-processes (the same steps
            # as on the host path, which never buffers a step it dropped as non-finite)
            log_e = RepeatWatch.combine(log_e, self.repeats.update(steps, sizes.tolist()))
        return Evidence(steps=steps, log_e=log_e, extra={})

    def findings(self) -> list[Finding]:
        found = [] if self.repeats is None else self.repeats.findings(self.name)
        if self.test is None or not self.test.rejected:
            return found
        n, step = self.test.rejected_at, self.rejected_step
        # its own test's crossing; the verdict's step is another one: the check at which the
        # audit's decision, averaging every monitor's evidence, crossed
        if step is None:  # restored from a state that did not keep the training step
            at = f"its own anytime-valid test crossed 1/alpha after {n} steps"
        else:
            seen = "" if step == n else f", the {_ordinal(n)} step it saw"
            at = f"its own anytime-valid test crossed 1/alpha at training step {step}{seen}"
        at += ("; the audit decides at its checks, on every monitor's evidence together, so "
               "the verdict's step may differ")
        return [Finding(self.name, "violation",
                        f"the real batch sizes are not Poisson samples at the loader's rate "
                        f"q = {self.rate:.4g} over N = {self.n_records} records ({at}): the "
                        f"accountant's sampling assumption does not hold (fixed-size or "
                        f"otherwise non-Poisson batches)", "data loader")] + found

    def rate_interval(self, alpha: float) -> tuple[float, float] | None:
        """Exact interval for the per-step rate from every batch size seen (None when off)."""
        if self.test is None or self.test.n_steps == 0:
            return None
        return self.test.rate_interval(alpha)

    def contribution(self) -> Contribution:
        return Contribution(section=self.report_section())

    #: the named tests of its ``audits`` section shown in its check section (key -> what)
    CHECKS = {"poisson_batch": "real batch sizes Binomial(N, q): Poisson sampling at the "
                               "loader's rate"}

    def check_section(self) -> CheckSection:
        """The batch-size test, the rate measured; what the batch sizes cannot show."""
        sec = CheckSection("Sampling", ran=self.test is not None,
                           reason_not_run=self.reason_off)
        data = self.report_section()
        for key, what in self.CHECKS.items():
            if data.get("test") == key:
                sec.check(what, outcome_of(data))
        sec.measure("loader's rate q", data.get("rate"))
        sec.measure("records N", data.get("n_records"))
        sec.measure("mean batch size (expected N q)",
                    [data["mean_batch_size"], data["expected_batch_size"]]
                    if data.get("mean_batch_size") is not None else None)
        sec.measure(f"interval for the rate really used ({100 * (1 - self.config.alpha):g}% "
                    "confidence)", data.get("rate_interval"))
        sec.skip("which records each batch holds", "the auditor sees batch sizes, not record "
                 "identities: a sampler that picks records unfairly at the right rate is not "
                 "seen")
        return sec

    def report_section(self) -> dict[str, Any]:
        """This monitor's ``audits`` section."""
        out: dict[str, Any] = {"rate": self.rate, "n_records": self.n_records,
                               "run": self.test is not None, "reason_not_run": self.reason_off}
        if self.test is not None:
            out.update(self.test.summary())
            ci = self.rate_interval(self.config.alpha)
            out["rate_interval"] = None if ci is None else list(ci)
        if self.repeats is not None:
            out["repeats"] = self.repeats.summary()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [list(b) for b in self._buffer], "first": self._first,
                "reason_off": self.reason_off, "rejected_step": self.rejected_step,
                "test": None if self.test is None else self.test.state_dict(),
                "repeats": None if self.repeats is None else self.repeats.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if (sd["test"] is None) != (self.test is None) and sd["test"] is not None:
            raise ValueError("sampling monitor state has a test this auditor cannot build "
                             "(dataset size unknown)")
        if sd["test"] is None:
            self.test = self.repeats = None
        else:
            self.test.load_state_dict(sd["test"])
            if sd.get("repeats") is None:  # written before the repeat test: switching it on
                self.repeats = None  # mid-run would change the e-process the decision averages
            elif self.repeats is not None:
                self.repeats.load_state_dict(sd["repeats"])
        self._buffer = [(int(s), int(n)) for s, n in sd["buffer"]]
        self._flags = [True] * len(self._buffer)
        self._first = bool(sd["first"])
        self.reason_off = sd["reason_off"]
        step = sd.get("rejected_step")  # absent from states written before it was kept
        self.rejected_step = None if step is None else int(step)


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
