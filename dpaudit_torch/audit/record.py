"""``StepRecord``: what the monitors see of one audited training step.

The Opacus adapter (:mod:`dpaudit_torch.opacus_tap`) reads the released gradient at every canary
coordinate and hands the engine one record per logical step; monitors never touch the optimizer.
Anything that can produce these records (another DP library, a simulation in a test) can drive
the engine.

Values are in units of the clipping bound C, with the real data's clipped sum at that coordinate
subtracted: for a correct implementation the value at a canary coordinate is
``1{canary present} + N(0, sigma^2)`` (docs/design.md sections 5 and 8).

A record's tensors may be views of the adapter's own buffers, which the next step overwrites
(the compiled CPU path allocates nothing per step): a monitor reads them in ``observe`` and
copies whatever it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StepRecord"]


@dataclass
class StepRecord:
    """One audited logical step.

    Attributes:
        step: the training step (the accountant's step count, counted from the start of
            training, of this release).
        values: ``[2k + m]`` float64 on the audit device, design order: pair coordinates a_j,
            then b_j, then the m one-run canaries.
        x: ``[k]`` the value at the coordinate of each pair that received its canary.
        y: ``[k]`` the value at the other coordinate of each pair.
        coins: ``[k]`` bool, True when pair j's canary went to a_j (device).
        sigma: the noise multiplier the optimizer used for this release.
        sigma_claimed: the noise multiplier the accountant is told.
        finite: whether every value is finite: a Python bool where it was checked on the host
            at once, a 0-d bool tensor on the device where the check is deferred.
        real_sums: ``[2k + m]`` the real data's clipped pre-noise sum / C at every canary
            coordinate, design order (already subtracted from ``values``; kept to report the
            interference that was removed), or None where it was not read.
    """

    step: int
    values: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    coins: torch.Tensor
    sigma: float
    sigma_claimed: float
    finite: bool | torch.Tensor = True
    real_sums: torch.Tensor | None = None
    #: real examples clipped in this logical step (None where the adapter cannot see them)
    n_real: int | None = None
    #: micro-batches that made up this logical step
    micro_steps: int = 1
    #: [u] the released noise at the noise-audit coordinates, standardized: divided by the
    #: standard deviation a correct implementation uses (N(0, 1) iid then); None if not read
    noise: torch.Tensor | None = None
    #: [u] the same noise in the gradient's raw units, and [u] the raw released values it was
    #: reconstructed from (for the floating-point check)
    noise_raw: torch.Tensor | None = None
    release_raw: torch.Tensor | None = None
    #: the noise standard deviation of a correct implementation, raw units
    noise_std: float = 0.0
    #: sum of ``noise ** 2`` where the adapter computed it in its pass (else None)
    noise_sumsq: float | None = None
    #: trailing entries of ``values`` that are the spread pairs' extra coordinates
    n_extra: int = 0
    #: the compiled CPU path's host buffers that ``values``, ``x``, ``y`` and the noise are
    #: views of (NumPy arrays ``vals``, ``xy``, ``noise``; valid until the next step), so that a
    #: monitor can copy what it keeps without torch calls; None on the other paths
    host: Any = None

    @property
    def k(self) -> int:
        """Sequential pairs in this record."""
        return int(self.x.shape[0])

    @property
    def one_run(self) -> torch.Tensor:
        """``[m]`` the one-run canaries' values (a view of :attr:`values`)."""
        return self.values[2 * self.k:self.values.shape[0] - self.n_extra]
