"""Registries: the one place that names the sequential testers and the lower-bound methods.

Every other module (the auditor, the experiments, the report, the command line) reads these
tables instead of repeating lists of names, so a new tester or bound method is one entry here plus
its own module. The rule that decides which bounds may refute a privacy claim lives here too
(:func:`refuting_methods`).

This module imports neither torch nor Opacus: the classes are imported lazily by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TesterSpec",
    "BoundMethod",
    "TESTERS",
    "BOUND_METHODS",
    "tester_class",
    "tester_names",
    "bound_method",
    "methods_of",
    "refuting_methods",
    "WHOLE_RUN",
    "ONE_STEP",
]

#: scope of a bound that speaks about the whole training run (the accountant's claim)
WHOLE_RUN = "whole run"
#: scope of a bound that speaks about one training step at its own delta
ONE_STEP = "one step"


@dataclass(frozen=True)
class TesterSpec:
    """A sequential tester the auditor and the experiments can run.

    Attributes:
        name: the key users pass (``tests=("mmd", "hockey_stick")``).
        module, attr: where the class lives (imported on first use).
        label: how the report and the plots name it.
        color: its colour in the report's plots.
        citation: the paper (or docs page) that defines it.
    """

    name: str
    module: str
    attr: str
    label: str
    color: str
    citation: str

    def load(self) -> type:
        """The tester class (imports its module)."""
        return getattr(importlib.import_module(self.module), self.attr)


@dataclass(frozen=True)
class BoundMethod:
    """An epsilon lower-bound method that can appear in a report.

    Attributes:
        name: key in ``AuditReport.epsilon_lower_bounds``.
        label: how the report names it.
        scope: :data:`WHOLE_RUN` or :data:`ONE_STEP`.
        family_free: True when the bound holds for every mechanism (no assumed trade-off family).
        citation: the paper that defines it.
        family: for a bound that is not family-free, the trade-off family it assumes, as the
            report names it ("Gaussian": "assumes the Gaussian family").
        monitor: the monitor that computes it (:mod:`dpaudit_torch.audit.monitors`).
        refutes_if_verified: a family bound that may refute the claim in a run whose data
            passed the method's own check of the family (its detail's ``family_verified`` is
            True): the white-box release bound, whose family is the release DP-SGD specifies
            and whose check is run on the canaries' own values (docs/design.md section 13).
    """

    name: str
    label: str
    scope: str
    family_free: bool
    citation: str
    family: str = ""
    monitor: str = ""
    refutes_if_verified: bool = False

    @property
    def may_refute(self) -> bool:
        """Whether the bound can refute the accountant's (eps, delta) claim at all: a family-free
        bound on the whole run always can; a per-step bound speaks of another mechanism (one
        step) and never can; a bound within a trade-off family can only where its family is
        verified on the run's data (:meth:`refutes_with`), which the Gaussian f-DP test never
        is."""
        return self.scope == WHOLE_RUN and (self.family_free or self.refutes_if_verified)

    def refutes_with(self, detail: Any) -> bool:
        """Whether the bound, with its recorded ``detail``, may refute the claim: a family-free
        whole-run bound always; a family bound only when ``detail["family_verified"]`` is
        True."""
        if self.scope != WHOLE_RUN:
            return False
        if self.family_free:
            return True
        return (self.refutes_if_verified and isinstance(detail, dict)
                and detail.get("family_verified") is True)


TESTERS: dict[str, TesterSpec] = {
    spec.name: spec
    for spec in (
        TesterSpec("mmd", "dpaudit_torch.stats.mmd", "SequentialMMDTest",
                   "MMD (González et al. 2025)", "#1f77b4",
                   "González, Dulce-Rubio, Ramdas & Ribero, NeurIPS 2025 (arXiv 2509.07055)"),
        TesterSpec("hockey_stick", "dpaudit_torch.stats.hockey_stick", "HockeyStickTest",
                   "hockey-stick", "#ff7f0e", "docs/statistics.md (event-based betting test)"),
    )
}

BOUND_METHODS: dict[str, BoundMethod] = {
    b.name: b
    for b in (
        BoundMethod("whitebox", "white-box release, DP-SGD family (exact law of the traces)",
                    WHOLE_RUN, False,
                    "docs/design.md section 13 (after Agrawal et al., arXiv 2606.12733)",
                    family="DP-SGD white-box release", monitor="one_run",
                    refutes_if_verified=True),
        BoundMethod("steinke", "Steinke et al. one-run (2023)", WHOLE_RUN, True,
                    "Steinke, Nasr & Jagielski, NeurIPS 2023", monitor="one_run"),
        BoundMethod("fdp", "f-DP one-run, Gaussian family (Mahloujifar et al.)", WHOLE_RUN, False,
                    "Mahloujifar, Melis & Chaudhuri, ICML 2025", family="Gaussian",
                    monitor="one_run"),
        BoundMethod("sequential", "sequential tests by betting", ONE_STEP, True,
                    "docs/design.md section 4 (grid of sequential tests)",
                    monitor="sequential_pairs"),
    )
}


def tester_names() -> tuple[str, ...]:
    """Names of the registered testers, in registration order."""
    return tuple(TESTERS)


def tester_class(name: str) -> type:
    """The class of tester ``name``; ValueError naming the choices for an unknown name."""
    spec = TESTERS.get(name)
    if spec is None:
        raise ValueError(f"unknown sequential tester {name!r}; choose from {sorted(TESTERS)}")
    return spec.load()


def methods_of(monitor: str) -> tuple[str, ...]:
    """The bound methods computed by ``monitor``, in registry order."""
    return tuple(n for n, b in BOUND_METHODS.items() if b.monitor == monitor)


def bound_method(name: str) -> BoundMethod | None:
    """The registered bound method ``name`` (None for a name a report may carry but this version
    does not know, e.g. from a newer writer)."""
    return BOUND_METHODS.get(name)


def refuting_methods(bounds: dict[str, Any], claimed: float | None,
                     details: dict[str, Any] | None = None) -> list[str]:
    """The methods whose bound exceeds ``claimed`` and that may refute a claim with their
    recorded ``details`` (:meth:`BoundMethod.refutes_with`), in registry order. ``claimed`` None
    or not finite refutes nothing."""
    import math

    if claimed is None or not isinstance(claimed, (int, float)) or not math.isfinite(claimed):
        return []
    out = []
    for name, spec in BOUND_METHODS.items():
        v = bounds.get(name)
        if (spec.refutes_with((details or {}).get(name)) and isinstance(v, (int, float))
                and v > claimed):
            out.append(name)
    return out
