"""Shared machinery of the experiments: the registry of experiment methods, seeding, the feeding
loop and exact binomial intervals.

An *experiment method* is a registered sequential tester (:data:`dpaudit_torch.registry.TESTERS`)
in one configuration, under the key the experiment tables print (``"mmd_r0.5"``, ``"mmd_r1"``,
``"hockey_stick"``). Everything the experiments need to know about a method -- how to build it,
how to name it, which of Table 1's targets it is held to -- is a field of its
:class:`ExperimentMethod` entry in :data:`EXPERIMENT_METHODS`, never a comparison of its key.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats as sps

from .. import mechanisms as mech
from ..registry import TESTERS, tester_class
from ..stats.base import SequentialTest

__all__ = [
    "ExperimentMethod",
    "EXPERIMENT_METHODS",
    "LIBRARY_DEFAULT_METHODS",
    "METHODS",
    "METHOD_LABELS",
    "TesterFactory",
    "experiment_method",
    "make_tester",
    "run_seed",
    "clopper_pearson",
]

TesterFactory = Callable[..., SequentialTest]


@dataclass(frozen=True)
class ExperimentMethod:
    """A registered tester in one configuration, as the experiments run and name it.

    Attributes:
        key: the name the experiment tables and ``methods=`` arguments use.
        tester: key of the tester in :data:`dpaudit_torch.registry.TESTERS`.
        options: keyword arguments of the tester's constructor, as (name, value) pairs; every
            other argument keeps the library default.
        label: how the tables name the method.
        paper_config: the configuration of the paper's own code (Gonzalez, Dulce-Rubio, Ramdas &
            Ribero, NeurIPS 2025, arXiv 2509.07055: MMD with witness radius R = 1/2), so Table 1
            checks that it *reproduces* the paper's numbers.
        pairs_target: Table-1 target for a method meant to *improve* on the paper: its mean
            pairs to reject at most this fraction of the paper's (None: no such target).
        detects_all: the improvement target also demands rejection in every run on every
            NonDP row of Table 1 (otherwise it applies where the paper rejects at rate >= 0.85).
        library_default: the configuration the auditor runs by default; these are the methods
            the type-I simulations measure by default and that Table 1 races against Kutta et
            al.'s published sequential auditor (arXiv 2602.06518).
    """

    key: str
    tester: str
    options: tuple[tuple[str, Any], ...]
    label: str
    paper_config: bool = False
    pairs_target: float | None = None
    detects_all: bool = False
    library_default: bool = False

    def __post_init__(self) -> None:
        if self.tester not in TESTERS:
            raise ValueError(f"experiment method {self.key!r}: unknown tester {self.tester!r}; "
                             f"choose from {sorted(TESTERS)}")

    def build(self, epsilons: Any, delta: Any, alpha: float) -> SequentialTest:
        """The tester for the null (epsilons, delta) at level alpha (imports its module)."""
        return tester_class(self.tester)(epsilons, delta, alpha, **dict(self.options))


#: the experiment methods, in the order the tables list them
EXPERIMENT_METHODS: dict[str, ExperimentMethod] = {
    m.key: m
    for m in (
        ExperimentMethod("mmd_r0.5", "mmd", (("witness_radius", 0.5),), "MMD R=1/2",
                         paper_config=True),
        ExperimentMethod("mmd_r1", "mmd", (("witness_radius", 1.0),), "MMD R=1",
                         pairs_target=0.7, library_default=True),
        ExperimentMethod("hockey_stick", "hockey_stick", (), TESTERS["hockey_stick"].label,
                         pairs_target=0.25, detects_all=True, library_default=True),
    )
}

#: keys of the configurations the auditor runs by default (``library_default``), in table order
LIBRARY_DEFAULT_METHODS: tuple[str, ...] = tuple(
    k for k, m in EXPERIMENT_METHODS.items() if m.library_default)

#: method key -> factory(epsilons, delta, alpha) (kept for callers of the former module)
METHODS: dict[str, TesterFactory] = {k: m.build for k, m in EXPERIMENT_METHODS.items()}

#: method key -> label in the tables
METHOD_LABELS: dict[str, str] = {k: m.label for k, m in EXPERIMENT_METHODS.items()}


def experiment_method(key: str) -> ExperimentMethod:
    """The entry of method ``key``; ValueError naming the choices for an unknown key."""
    m = EXPERIMENT_METHODS.get(key)
    if m is None:
        raise ValueError(f"unknown method {key!r}; choose from {sorted(EXPERIMENT_METHODS)}")
    return m


def method_label(key: str) -> str:
    """The label of method ``key`` (the key itself for an unregistered one)."""
    m = EXPERIMENT_METHODS.get(key)
    return key if m is None else m.label


def make_tester(method: str, epsilons: Any, delta: Any, alpha: float) -> SequentialTest:
    """Build the tester ``method`` (a key of :data:`EXPERIMENT_METHODS`) for the null
    (epsilons, delta)."""
    return experiment_method(method).build(epsilons, delta, alpha)


def run_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one run, derived from (seed, *keys) by numpy's SeedSequence hashing,
    so that runs, cells and experiments get independent streams."""
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *[int(k) for k in keys]])
    a, b = words.generate_state(2, dtype=np.uint32)
    return int((int(a) << 31) ^ int(b)) & ((1 << 63) - 1)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval for a binomial proportion k / n (Clopper &
    Pearson, Biometrika 1934)."""
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(sps.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def check_methods(methods: Sequence[str] | str) -> tuple[str, ...]:
    """``methods`` as a non-empty tuple of distinct registered keys (ValueError otherwise)."""
    if isinstance(methods, str):
        methods = (methods,)
    methods = tuple(methods)
    if not methods:
        raise ValueError("methods must not be empty")
    for m in methods:
        experiment_method(m)
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must be distinct, got {methods!r}")
    return methods


def progress_bar(total: int, enabled: bool, desc: str) -> Any:
    """A tqdm bar on stderr, or None when disabled (or tqdm is missing)."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True)


def feed(
    mechanism: mech.Mechanism,
    testers: Sequence[SequentialTest],
    budget: int,
    batch: int,
    generator: torch.Generator,
    stop_at_rejection: bool,
) -> list[int | None]:
    """Feed up to ``budget`` pairs of one stream to every tester (same pairs for all), in
    batches processed in order; a tester stops receiving pairs once it has rejected if
    ``stop_at_rejection``. Returns each tester's ``rejected_at`` (None if it never rejected)."""
    for t in testers:
        t.reset()
    active = list(range(len(testers)))
    used = 0
    while used < budget and active:
        n = min(batch, budget - used)
        x, y = mechanism.sample(n, generator=generator)
        used += n
        still = []
        for i in active:
            testers[i].update(x, y)
            if not (stop_at_rejection and testers[i].rejected):
                still.append(i)
        active = still
    return [t.rejected_at for t in testers]
