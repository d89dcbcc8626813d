"""What the Opacus accountant was told, and what it claims.

``len(accountant)`` counts history segments, not steps (Opacus 1.6): the step count is the
sum of the steps of every ``(noise_multiplier, sample_rate, steps)`` entry of its history. A read
of the claimed epsilon costs 0.02 s (RDP) to 0.5 s (PRV) on a CPU, so the auditor reads it every
``claimed_every`` steps and at finalize; a failing read is reported, never raised into training.

The warnings Opacus and NumPy raise during a read (RDP's "Optimal order is the smallest alpha"
when its orders do not reach the bound's optimum, NumPy's overflow inside the PRV of a run with
almost no noise) are logged, not printed: at INFO for the claim, at DEBUG for the hypothetical
runs the monitors recompute (e.g. with the noise multiplier measured on a run without noise, far
outside the accountant's usual range, where they are expected).
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["AccountantView"]


@contextmanager
def _warnings_logged(what: str, level: int) -> Iterator[None]:
    """The warnings raised inside the block, logged at ``level`` (each distinct one once, with
    its count) instead of going to Python's warning machinery."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            seen = Counter(f"{w.category.__name__}: {w.message}" for w in caught)
            for text, n in seen.items():
                logger.log(level, "%s: %s%s", what, text, f" (x{n})" if n > 1 else "")


class AccountantView:
    """Read-only view of an Opacus accountant.

    Args:
        accountant: the ``PrivacyEngine``'s accountant (anything with ``get_epsilon(delta)`` and
            a ``history`` of ``(sigma, q, steps)`` entries).
        warn: receives the message of a failed read.
    """

    def __init__(self, accountant: Any, warn: Callable[[str], None]) -> None:
        self.accountant = accountant
        self._warn = warn

    @property
    def name(self) -> str:
        """The accountant's class name (e.g. ``PRVAccountant``)."""
        return type(self.accountant).__name__

    def steps(self) -> int:
        """Steps the accountant has counted."""
        hist = getattr(self.accountant, "history", None) or []
        try:
            return int(sum(int(h[-1]) for h in hist))
        except (TypeError, ValueError, IndexError):
            return len(hist)

    def epsilon_for(self, sigma: float, sample_rate: float, steps: int, delta: float) -> float:
        """Epsilon of a hypothetical run (``steps`` steps of noise multiplier ``sigma`` at
        ``sample_rate``) computed by a fresh accountant of the same class."""
        acc = type(self.accountant)()
        acc.history = [(float(sigma), float(sample_rate), int(steps))]
        with _warnings_logged(f"{self.name} of a hypothetical run", logging.DEBUG):
            return float(acc.get_epsilon(delta=delta))

    def history_since(self, steps_before: int) -> list[tuple[float, float, int]] | None:
        """The accountant's (noise multiplier, sample rate, steps) entries for the steps after
        the first ``steps_before`` (None if it keeps no such history)."""
        hist = getattr(self.accountant, "history", None)
        if hist is None:
            return None
        try:
            entries = [(float(h[0]), float(h[1]), int(h[2])) for h in hist]
        except (TypeError, ValueError, IndexError):
            return None
        out, skip = [], int(steps_before)
        for s, q, n in entries:
            drop = min(skip, n)
            skip -= drop
            if n - drop:
                out.append((s, q, n - drop))
        return out

    def epsilon_of_history(self, history: list[tuple[float, float, int]], delta: float) -> float:
        """Epsilon of ``history`` by a fresh accountant of the same class."""
        acc = type(self.accountant)()
        acc.history = [(float(s), float(q), int(n)) for s, q, n in history]
        with _warnings_logged(f"{self.name} of a recomputed history", logging.DEBUG):
            return float(acc.get_epsilon(delta=delta))

    def epsilon(self, delta: float) -> float | None:
        """The claimed epsilon at ``delta`` (None before the first step, or if the read
        failed: the failure is reported through ``warn``)."""
        if self.steps() == 0:
            return None
        try:
            with _warnings_logged(f"{self.name}.get_epsilon(delta={delta})", logging.INFO):
                return float(self.accountant.get_epsilon(delta=delta))
        except Exception as e:  # noqa: BLE001 - an accountant failure must not stop training
            self._warn(f"accountant.get_epsilon(delta={delta}) failed: {e!r}")
            return None
