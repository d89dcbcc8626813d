"""The contract between a framework adapter and the audit engine (the package's ground floor).

Two things cross it, and both are defined here so that neither side imports the other:

* :class:`StepRecord`: what the monitors see of one audited training step. The Opacus adapter
  (:mod:`dpaudit_torch.opacus_tap`) reads the released gradient at every canary coordinate and
  hands the engine one record per logical step; monitors never touch the optimizer. Anything
  that can produce these records (another DP library, a simulation in a test) can drive the
  engine.
* **facts** (:class:`Fact`): typed requests a monitor declares for what it needs to know about
  the training besides the records (the model, the optimizer's parameters and groups, the data
  loader, the accountant's view). The adapter answers each with a value or says it cannot
  (:class:`FactUnavailable`, with the reason the report gives).

Values of a record are in units of the clipping bound C, with the real data's clipped sum at that
coordinate subtracted: for a correct implementation the value at a canary coordinate is
``1{canary present} + N(0, sigma^2)`` (docs/design.md sections 5 and 8).

A record's tensors may be views of the adapter's own buffers, which the next step overwrites
(the compiled CPU path allocates nothing per step): a monitor reads them in ``observe`` and
copies whatever it keeps.

Imports nothing of the package but the standard library and torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

__all__ = ["StepRecord", "StepRefused", "Fact", "FactUnavailable", "FactSource", "StaticFacts",
           "FACTS", "SETUP_CHECK", "SAMPLE_RATE", "N_RECORDS", "NOISE_MULTIPLIER", "TENSOR_NAMES",
           "TENSOR_GROUPS", "GROUP_NAMES", "EPSILON_OF_SIGMA", "ACCOUNTANT_HISTORY",
           "EPSILON_OF_HISTORY", "EPSILON_LOWER_OF_HISTORY", "MODEL", "OPTIMIZER_PARAMS",
           "PARAM_GROUPS", "DATA_LOADER", "ACCOUNTANT_NAME", "N_REAL_NOT_OBSERVED", "module_path"]


#: why a step record's ``n_real`` is None (the Opacus adapter counts the per-sample rows, or under
#: ghost clipping the per-sample norms, of every micro-batch: on the parameters, or under sharded
#: ghost clipping on the wrapped model, which the audit then needs)
N_REAL_NOT_OBSERVED = ("the real batch sizes were not observed (no per-sample norms on the "
                       "optimizer's parameters; sharded ghost clipping keeps them on the model: "
                       "pass model=... to PrivacyAuditor)")


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
    #: real examples clipped in this logical step (None where the adapter cannot see them:
    #: :data:`N_REAL_NOT_OBSERVED` says where)
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


class StepRefused(ValueError):  # noqa: N818 - a refusal (a decision), not an internal error
    """The audit refuses a training step before its update (a non-finite observation with
    ``on_nonfinite="raise"``, trainable parameters changed after attach): a decision that leaves
    the audit consistent and the auditor attached, raised from ``optimizer.step()``. Any other
    exception of the auditor's own code is an internal error (docs/auditor.md, "Faults")."""


T = TypeVar("T")


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A typed request for one fact about the training: ``name`` identifies it, ``meaning`` says
    what the value is. Facts compare by name."""

    name: str
    meaning: str = field(compare=False)

    def __repr__(self) -> str:
        return f"Fact({self.name!r})"


class FactUnavailable(LookupError):  # noqa: N818 - a fact is unavailable, not an error
    """The adapter cannot answer a fact; the message says why, in words for the report."""

    def __init__(self, fact: Fact[Any], reason: str) -> None:
        super().__init__(reason)
        self.fact = fact
        self.reason = reason


class FactSource(Protocol):
    """Whatever answers facts (the Opacus adapter, a test's :class:`StaticFacts`)."""

    def answer(self, fact: Fact[T]) -> T:
        """The fact's value, or :class:`FactUnavailable` with the reason."""
        ...


class StaticFacts:
    """Facts given as a mapping (tests, or an adapter that knows everything up front)."""

    def __init__(self, values: Mapping[Fact[Any], Any] | None = None,
                 reason: str = "not given to this audit") -> None:
        self._values = dict(values or {})
        self._reason = reason

    def answer(self, fact: Fact[T]) -> T:
        if fact in self._values:
            return self._values[fact]
        raise FactUnavailable(fact, f"{fact.meaning}: {self._reason}")


#: the sampling rate at which records (and so the IN canaries) are included in a step
SAMPLE_RATE: Fact[float] = Fact(
    "sample_rate", "the rate at which training samples records (the accountant's, checked "
    "against the data loader)")
#: N, the number of records training samples from (known where the loader is verified)
N_RECORDS: Fact[int] = Fact("n_records", "the number of records training samples from")
#: the setup check of the engine, loader and accountant against the optimizer: a dict with
#: the rate used and its source, N, the step hook's kind and rate, and ``problems`` (a list of
#: {"level", "scope", "message"})
SETUP_CHECK: Fact[dict[str, Any]] = Fact("setup_check",
                                         "the check of the setup against the optimizer")
#: the noise multiplier the optimizer uses now (adaptive / ghost adjusted)
NOISE_MULTIPLIER: Fact[float] = Fact("noise_multiplier", "the optimizer's noise multiplier")
#: a name per parameter tensor the DP optimizer holds (its order), for findings
TENSOR_NAMES: Fact[list[str]] = Fact("tensor_names", "the names of the parameter tensors")
#: the optimizer parameter group of each parameter tensor
TENSOR_GROUPS: Fact[list[int]] = Fact("tensor_groups", "the parameter group of each tensor")
#: a name per parameter group, for findings
GROUP_NAMES: Fact[list[str]] = Fact("group_names", "the names of the parameter groups")
#: epsilon(sigma, steps) of the claim's accountant class at the run's sample rate and delta
EPSILON_OF_SIGMA: Fact[Callable[[float, int], float]] = Fact(
    "epsilon_of_sigma", "the claim's accountant as a function of sigma and steps")
#: a callable giving what the accountant was told since attach: (sigma, q, steps) entries, or
#: None where it keeps no history (read at finalize)
ACCOUNTANT_HISTORY: Fact[Callable[[], list[tuple[float, float, int]] | None]] = Fact(
    "accountant_history", "the accountant's history since the audit started")
#: epsilon of a history of (sigma, q, steps) entries by the claim's accountant class
EPSILON_OF_HISTORY: Fact[Callable[[list[tuple[float, float, int]]], float]] = Fact(
    "epsilon_of_history", "the claim's accountant applied to a history")
#: a numerical lower bound on the true epsilon, at the audit's delta, of a history of
#: Poisson-subsampled Gaussian steps ((sigma, q, steps) entries); None where the claim's
#: accountant is itself a proven upper bound for that family (the check cannot fire there)
EPSILON_LOWER_OF_HISTORY: Fact[Callable[[list[tuple[float, float, int]]], float | None]] = Fact(
    "epsilon_lower_of_history", "a lower bound on the true epsilon of a history")
#: the torch.nn.Module being trained (as handed to the auditor)
MODEL: Fact[torch.nn.Module] = Fact("model", "the model being trained")
#: the parameter tensors the DP optimizer holds (its clipping and noise cover exactly these)
OPTIMIZER_PARAMS: Fact[list[torch.Tensor]] = Fact(
    "optimizer_params", "the parameters the DP optimizer holds")
#: the DP optimizer's parameter groups (dicts with "params" and the group's settings)
PARAM_GROUPS: Fact[list[dict[str, Any]]] = Fact("param_groups",
                                                "the DP optimizer's parameter groups")
#: the data loader handed to the audit
DATA_LOADER: Fact[Any] = Fact("data_loader", "the data loader")
#: the name of the accountant the claim comes from ("rdp", "prv", "gdp", ...)
ACCOUNTANT_NAME: Fact[str] = Fact("accountant_name", "the accountant's name")

#: every fact this contract defines, by name
FACTS: dict[str, Fact[Any]] = {f.name: f for f in (
    SAMPLE_RATE, N_RECORDS, NOISE_MULTIPLIER, TENSOR_NAMES, TENSOR_GROUPS, GROUP_NAMES,
    EPSILON_OF_SIGMA, ACCOUNTANT_HISTORY, EPSILON_OF_HISTORY, EPSILON_LOWER_OF_HISTORY, MODEL,
    OPTIMIZER_PARAMS, PARAM_GROUPS, DATA_LOADER, ACCOUNTANT_NAME, SETUP_CHECK)}


#: wrapper prefixes removed from a tensor's name (Opacus's GradSampleModule, DDP, DPDDP)
_WRAPPERS = ("_module.", "module.")


def module_path(name: str) -> str:
    """A tensor's name in the user's model: wrapper prefixes removed (the name under which the
    adapter's ``TENSOR_NAMES`` and the coverage monitor report it)."""
    stripped = True
    while stripped:
        stripped = False
        for w in _WRAPPERS:
            if name.startswith(w):
                name, stripped = name[len(w):], True
    return name
