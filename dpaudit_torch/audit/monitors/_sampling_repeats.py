"""The sampling monitor's second test: are the batches drawn afresh at every step?
(docs/design.md section 10, "Fresh batches").

A loader whose generator is re-seeded at every epoch replays the same Poisson batches every
epoch: each step's batch size is still Binomial(N, q), so the batch-size test passes, but the
sequence of sizes repeats with the epoch's period.
:class:`~dpaudit_torch.stats.sampling_repeats.BatchRepeatTest` bets on those repeats at every
lag. :class:`RepeatWatch` runs it on every step's real batch size (the per-logical-step count the
monitor already keeps: summed over the micro-batches of ``BatchMemoryManager`` and over the DDP
ranks), and averages its e-process with the batch-size test's, weights 1/4 and 3/4 (an average
of e-processes on the same filtration is one), so the monitor's evidence stays one e-process.
1/4 costs the repeat test log 4 = 1.4 nats, less than one replayed step brings (about 2.3 on the
demo's digits), and the batch-size test only log(4/3) = 0.3 nats: with 1/2 each, the gradient
accumulation bug of the detection benchmark was decided one check later.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...stats.sampling_repeats import BatchRepeatTest
from .base import Finding

__all__ = ["RepeatWatch", "REPEAT_WEIGHT"]

#: weight of the repeat test in the sampling monitor's e-process (the batch-size test has the
#: rest)
REPEAT_WEIGHT = 0.25


class RepeatWatch:
    """The repeat test of one sampling monitor: its steps, its crossing, its finding."""

    def __init__(self, n_records: int, rate: float, alpha: float) -> None:
        self.test = BatchRepeatTest(n_records, rate, alpha)
        #: the training step whose batch size made the test cross 1/alpha (None before)
        self.rejected_step: int | None = None

    def update(self, steps: list[int], sizes: list[int]) -> np.ndarray:
        """Bet on the kept steps' sizes (a step dropped as non-finite is left out, as by the
        batch-size test and on every path; it shifts the period by one for one period);
        log-wealth after each."""
        seen, was = self.test.n_steps, self.test.rejected
        traj = self.test.update_with_trajectory(np.asarray(sizes, dtype=np.int64))
        if self.test.rejected and not was:
            self.rejected_step = steps[self.test.rejected_at - seen - 1]
        return traj

    @staticmethod
    def combine(log_poisson: np.ndarray, log_repeat: np.ndarray) -> np.ndarray:
        """log((1 - w) e^poisson + w e^repeat), w = :data:`REPEAT_WEIGHT`."""
        return np.logaddexp(math.log1p(-REPEAT_WEIGHT) + np.asarray(log_poisson),
                            math.log(REPEAT_WEIGHT) + np.asarray(log_repeat))

    def findings(self, monitor: str) -> list[Finding]:
        """The finding of a crossing of the repeat test's own 1/alpha (none before)."""
        t = self.test
        best = t.best_lag()
        if not t.rejected or best is None:
            return []
        lag = best["lag"]
        epochs = [p for p in t.epoch_lengths if lag % p == 0]
        period = f"{lag} steps"
        if epochs:
            k = lag // epochs[0]
            period += (f", {'one epoch' if k == 1 else f'{k} epochs'} of {epochs[0]} steps "
                       f"at the rate q = {t.rate:.4g}")
        at = (f"its own anytime-valid test crossed 1/alpha at training step "
              f"{self.rejected_step}" if self.rejected_step is not None else
              f"its own anytime-valid test crossed 1/alpha after {t.rejected_at} steps")
        return [Finding(monitor, "violation",
                        f"the batches are not drawn afresh at every step: the real batch sizes "
                        f"repeat with a period of {period} (the size of a step equalled the size "
                        f"{lag} steps before at {best['matches']} of {best['bets']} steps, "
                        f"about {best['expected_matches']:.1f} expected for independent "
                        f"Poisson batches over N = {t.n_records} records; {at}; the audit "
                        f"decides at its checks, on every monitor's evidence together, so the "
                        f"verdict's step may differ): a data loader whose generator is re-seeded "
                        f"replays the same batches, which the accountant's Poisson sampling "
                        f"does not allow (fixed-size batches also repeat, at every lag)",
                        "data loader")]

    def summary(self) -> dict[str, Any]:
        return {**self.test.summary(), "weight": REPEAT_WEIGHT}

    def state_dict(self) -> dict[str, Any]:
        return {"test": self.test.state_dict(), "rejected_step": self.rejected_step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.test.load_state_dict(sd["test"])
        step = sd.get("rejected_step")
        self.rejected_step = None if step is None else int(step)
