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

Opacus's own accountants (RDP, PRV, GDP) are functions of their ``history`` and ``delta``: the
epsilons they give are memoised per process (:func:`_memo_key`), so the finalize, which reads the
claim again and recomputes the same history for the accounting check, and many short runs with
the same settings in one process pay for one computation. An accountant of another class, or one
whose ``get_epsilon`` was replaced, is always asked.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["AccountantView", "prv_epsilon_bounds"]

#: memoised epsilons: (class, history, delta) -> (epsilon, the warnings its computation raised)
#: for Opacus's accountants; ("prv-bounds", history, delta) -> (lower, upper)
_MEMO: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()
_MEMO_SIZE = 256
_MEMO_LOCK = threading.Lock()


def _memo_key(accountant: Any, delta: float) -> tuple[Any, ...] | None:
    """The memo key of ``accountant.get_epsilon(delta)``: None unless the accountant is one of
    Opacus's own classes with its own ``get_epsilon`` (not replaced on the class or the
    instance) and a history of plain ``(sigma, q, steps)`` numbers."""
    cls = type(accountant)
    if not cls.__module__.startswith("opacus.accountants") or "get_epsilon" in vars(accountant):
        return None
    fn = getattr(cls, "get_epsilon", None)
    if not getattr(fn, "__module__", "").startswith("opacus.accountants"):
        return None
    try:
        hist = tuple((float(h[0]), float(h[1]), int(h[2]))
                     for h in (getattr(accountant, "history", None) or []))
    except (TypeError, ValueError, IndexError):
        return None
    return (cls, hist, float(delta))


def _memo_get(key: tuple[Any, ...]) -> tuple[Any, Any] | None:
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
        if hit is not None:
            _MEMO.move_to_end(key)
        return hit


def _memo_put(key: tuple[Any, ...], value: tuple[Any, Any]) -> None:
    with _MEMO_LOCK:
        _MEMO[key] = value
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)


def _epsilon(accountant: Any, delta: float) -> float:
    """``accountant.get_epsilon(delta)``, memoised where :func:`_memo_key` allows; the warnings
    the computation raised are raised again on every read, memoised or not."""
    key = _memo_key(accountant, delta)
    hit = None if key is None else _memo_get(key)
    if hit is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            eps = float(accountant.get_epsilon(delta=delta))
        hit = (eps, tuple((w.category, str(w.message)) for w in caught))
        if key is not None:
            _memo_put(key, hit)
    for category, message in hit[1]:
        warnings.warn(message, category, stacklevel=2)
    return hit[0]


def prv_epsilon_bounds(history: list[tuple[float, float, int]] | tuple[Any, ...],
                       delta: float) -> tuple[float, float]:
    """(lower, upper) bounds on the true epsilon at ``delta`` of ``history`` ((sigma, q, steps)
    entries of Poisson-subsampled Gaussian steps): the PRV accountant's numerical composition
    of the privacy-loss distributions with its error bounds (Gopi, Lee & Wutschitz, NeurIPS
    2021; eps error 0.01, delta error delta / 1000; Opacus's ``PRVAccountant`` claims the upper
    one). Memoised per (history, delta)."""
    from opacus.accountants import PRVAccountant

    hist = tuple((float(s), float(q), int(n)) for s, q, n in history)
    key = ("prv-bounds", hist, float(delta))
    hit = _memo_get(key)
    if hit is None:
        acc = PRVAccountant()
        acc.history = list(hist)
        eps_error, delta_error = 0.01, delta / 1000.0
        dprv = acc._get_dprv(eps_error=eps_error, delta_error=delta_error)
        lower, _, upper = dprv.compute_epsilon(delta, delta_error, eps_error)
        hit = (float(lower), float(upper))
        _memo_put(key, hit)
    return hit


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
            return _epsilon(acc, delta)

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
            return _epsilon(acc, delta)

    #: Opacus's accountants whose epsilon is a proven upper bound for Poisson-subsampled
    #: Gaussian steps (RDP: Mironov, Talwar & Zhang 2019; PRV: the upper end of its error
    #: bounds, Gopi, Lee & Wutschitz 2021); the GDP accountant's central-limit approximation is not
    UPPER_BOUND_ACCOUNTANTS = ("opacus.accountants.rdp.RDPAccountant",
                               "opacus.accountants.prv.PRVAccountant")

    def epsilon_lower_of_history(self, history: list[tuple[float, float, int]],
                                 delta: float) -> float | None:
        """A lower bound on the true epsilon at ``delta`` of ``history`` (Poisson-subsampled
        Gaussian steps): the lower end of the PRV accountant's error bounds (Gopi, Lee &
        Wutschitz, NeurIPS 2021: the numerical composition of the privacy-loss distributions,
        with eps error 0.01 and delta error delta / 1000). None where the claim's accountant is
        one of :attr:`UPPER_BOUND_ACCOUNTANTS`, whose claim cannot be below it."""
        cls = type(self.accountant)
        if f"{cls.__module__}.{cls.__qualname__}" in self.UPPER_BOUND_ACCOUNTANTS \
                and "get_epsilon" not in vars(self.accountant):
            return None
        with _warnings_logged("PRV lower bound of the accountant's history", logging.DEBUG):
            return prv_epsilon_bounds(history, delta)[0]

    def epsilon(self, delta: float) -> float | None:
        """The claimed epsilon at ``delta`` (None before the first step, or if the read
        failed: the failure is reported through ``warn``)."""
        if self.steps() == 0:
            return None
        try:
            with _warnings_logged(f"{self.name}.get_epsilon(delta={delta})", logging.INFO):
                return _epsilon(self.accountant, delta)
        except Exception as e:  # noqa: BLE001 - an accountant failure must not stop training
            self._warn(f"accountant.get_epsilon(delta={delta}) failed: {e!r}")
            return None
