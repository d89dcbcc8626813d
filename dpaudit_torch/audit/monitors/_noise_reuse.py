"""The noise monitor's reuse check (docs/design.md section 11, "Reuse by near-equality"): the
released values at the noise-audit coordinates, kept per step beside the monitor's noise rows,
and :class:`~dpaudit_torch.stats.reuse.NoiseReuseTest` fed at each check.

Per step this adds one copy of the released values at the sampled coordinates (a NumPy copy on
the host path; one tensor copy, no host synchronisation, on the accelerator's path); the sort,
the search in the kept signatures and the bet run at the check.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ...contract import StepRecord
from ...stats.reuse import NoiseReuseTest, unit_roundoff

logger = logging.getLogger(__name__)

__all__ = ["ReuseWatch"]

class ReuseWatch:
    """Released values per buffered step, and the reuse test they feed."""

    def __init__(self, tensor_of: np.ndarray, params: list[Any] | None, alpha: float,
                 capacity: int, rows_class: Any) -> None:
        """``rows_class(capacity)``: the monitor's per-step row buffer (its ``append``,
        ``pending``, ``take_host_copies``, ``take`` and ``copy_rows``)."""
        self._rows_class = rows_class
        self.capacity = capacity
        t = np.asarray(tensor_of, dtype=np.int64)
        if params is not None and t.size and int(t.max()) < len(params):
            u_t = np.array([unit_roundoff(p.dtype) for p in params])
            # (at least 2^-50: the monitor's rows are standardized and scaled back, two
            # float64 roundings of the noise value)
            self.u = np.maximum(u_t[t], 2.0 ** -50)
        else:  # dtypes unknown: float32's roundoff (a coarser release would only lose power)
            self.u = np.full(t.size, unit_roundoff("float32"))
        # the signature's strata: the tensors, where the coordinates are tensor-major
        strata = (np.r_[0, np.flatnonzero(np.diff(t)) + 1, t.size]
                  if t.size and np.all(np.diff(t) >= 0) else None)
        self.test = NoiseReuseTest(alpha=alpha, strata=strata)
        self._rel = rows_class(capacity)
        self._stds: list[float] = []
        #: why the check does not run (None: it runs)
        self.reason_off: str | None = None if t.size else "no noise-audit coordinates"

    def observe(self, record: StepRecord, host_rows: bool) -> None:
        if self.reason_off is not None:
            return
        rel, std = record.release_raw, float(record.noise_std)
        if rel is None or not std > 0:
            self.reason_off = "the released values at the noise-audit coordinates were not read"
            self._rel = self._rows_class(self.capacity)
            self._stds = []
            return
        hv = record.host
        self._rel.append(record.step, rel, True, None if hv is None else hv.rel, host_rows)
        self._stds.append(std)

    def pending(self) -> list[torch.Tensor]:
        return [] if self.reason_off is not None else self._rel.pending()

    def take_host_copies(self, arrays: Any) -> None:
        if self.reason_off is None:
            self._rel.take_host_copies(arrays)

    def take(self) -> tuple[np.ndarray | None, np.ndarray]:
        """(released rows [n, U] or None, claimed stds [n]) of the buffered steps; clears."""
        if self.reason_off is not None:
            return None, np.zeros(0)
        _, _, rows = self._rel.take()
        stds, self._stds = np.asarray(self._stds, dtype=np.float64), []
        return (None if rows is None else np.array(rows, dtype=np.float64)), stds

    def update(self, xi: np.ndarray, rel: np.ndarray, stds: np.ndarray, steps: list[int]
               ) -> np.ndarray:
        """Feed the test: standardized noise rows ``xi`` [S, U] and their released rows."""
        noise = xi * stds[:, None]
        return self.test.update_steps(noise, rel, self.u, stds, steps)

    def finding_text(self) -> str:
        s = self.test.summary()
        lags = s["common_lags"]
        across, within = s["matched_across_steps"], s["matched_within_step"]
        where = []
        if across:
            where.append(f"{across} equal a value drawn at an earlier step (most often "
                         f"{', '.join(str(v) for v in lags)} step(s) earlier)")
        if within:
            where.append(f"{within} equal another value of the same step (one draw shared "
                         f"by several coordinates or tensors)")
        return (f"the noise is reused: of the sampled noise values, {' and '.join(where)}, to "
                f"the release's rounding, where fresh draws give about "
                f"{s['null_bound_matches']:.3g} such coincidences at most (anytime-valid test at "
                f"level {self.test.alpha:g}, crossed at step {s['rejected_at']})")

    def state_dict(self) -> dict[str, Any]:
        return {"test": self.test.state_dict(), "reason_off": self.reason_off,
                "steps": list(self._rel.steps), "rows": self._rel.copy_rows(),
                "stds": list(self._stds)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.test.load_state_dict(sd["test"])
        self.reason_off = sd["reason_off"]
        self._rel = self._rows_class(self.capacity)
        for i, step in enumerate(sd["steps"]):
            self._rel.append(int(step), sd["rows"][i], True)
        self._stds = [float(v) for v in sd["stds"]]
