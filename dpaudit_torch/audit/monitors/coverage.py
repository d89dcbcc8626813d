"""Coverage monitor: does the DP optimizer hold every trainable parameter of the model?
(docs/monitors/coverage.md).

DP-SGD's guarantee covers what its release covers: a parameter that trains (``requires_grad``)
but is not in the DP optimizer is clipped by nothing and noised by nothing, so if anything
updates it (a second optimizer, a manual update), it moves outside the DP release. This monitor
compares, when the audit starts and again at finalize, the model's trainable parameters with
the tensors the DP optimizer holds (by identity), and names every trainable tensor the optimizer
does not hold (module path and shape), and every tensor the optimizer holds that is not in the
model handed to the auditor (the wrong model was handed over).

It needs the model (``PrivacyAuditor(..., model=model)``); without it, it says so and checks
nothing. It costs nothing per step.
"""

from __future__ import annotations

from typing import Any

import torch

from ...contract import MODEL, OPTIMIZER_PARAMS
from .base import Contribution, Finding, Monitor, MonitorContext, register_monitor

__all__ = ["CoverageMonitor", "module_path"]

#: wrapper prefixes removed from a parameter's name (Opacus's GradSampleModule, DDP, DPDDP)
_WRAPPERS = ("_module.", "module.")


def module_path(name: str) -> str:
    """A parameter's name in the user's model: wrapper prefixes removed."""
    stripped = True
    while stripped:
        stripped = False
        for w in _WRAPPERS:
            if name.startswith(w):
                name, stripped = name[len(w):], True
    return name


@register_monitor("coverage")
class CoverageMonitor(Monitor):
    """Trainable parameters of the model that the DP optimizer does not hold."""

    label = "coverage (parameters outside the DP optimizer)"
    needs = (MODEL, OPTIMIZER_PARAMS)

    def __init__(self, ctx: MonitorContext) -> None:
        super().__init__(ctx)
        self.model = ctx.fact_or(MODEL)
        self.reason_off = ctx.why_not(MODEL)
        params = ctx.fact_or(OPTIMIZER_PARAMS, [])
        self._held = {id(p) for p in params}
        self._n_held = len(params)
        #: (name, shape) of the uncovered trainable tensors, at the start and at finalize
        self.at_start = self._uncovered() if self.reason_off is None else []
        self.at_end: list[tuple[str, tuple[int, ...]]] = []
        self.not_in_model = self._not_in_model() if self.reason_off is None else 0

    def _named(self) -> list[tuple[str, torch.nn.Parameter]]:
        assert self.model is not None
        return [(module_path(n), p) for n, p in self.model.named_parameters()]

    def _uncovered(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, tuple(p.shape)) for n, p in self._named()
                if p.requires_grad and id(p) not in self._held]

    def _not_in_model(self) -> int:
        in_model = {id(p) for _, p in self._named()}
        return sum(1 for i in self._held if i not in in_model)

    def finalize(self, claimed_epsilon: float | None) -> None:
        if self.reason_off is None:
            self.at_end = self._uncovered()

    def uncovered(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor found uncovered at the start or at the end, once, in model order."""
        seen: dict[str, tuple[int, ...]] = {}
        for name, shape in [*self.at_start, *self.at_end]:
            seen.setdefault(name, shape)
        return list(seen.items())

    def findings(self) -> list[Finding]:
        if self.reason_off is not None:
            return [Finding(self.name, "note", f"check not run: {self.reason_off}", "the model")]
        out = []
        missing = self.uncovered()
        if missing:
            names = ", ".join(f"{n} ({'x'.join(map(str, s)) or 'scalar'})"
                              for n, s in missing[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            out.append(Finding(
                self.name, "finding",
                f"{len(missing)} trainable tensor(s) of the model are not held by the DP "
                f"optimizer: {names}{more}. Nothing of DP-SGD clips or noises them; if anything "
                f"updates them, that update is outside the DP release. Freeze them "
                f"(requires_grad=False) or give them to the DP optimizer", names))
        if self.not_in_model:
            out.append(Finding(
                self.name, "finding",
                f"the DP optimizer holds {self.not_in_model} of its {self._n_held} tensors that "
                f"are not parameters of the model handed to the auditor: the model is not the "
                f"one being trained", "the model"))
        return out

    def contribution(self) -> Contribution:
        missing = self.uncovered()
        section: dict[str, Any] = {
            "run": self.reason_off is None, "reason_not_run": self.reason_off,
            "held_tensors": self._n_held,
            "uncovered": [{"name": n, "shape": list(s), "numel": int(torch.Size(s).numel())}
                          for n, s in missing],
            "uncovered_coordinates": int(sum(torch.Size(s).numel() for _, s in missing)),
            "held_not_in_model": self.not_in_model,
        }
        if self.model is not None:
            section["trainable_tensors"] = sum(1 for _, p in self._named() if p.requires_grad)
        return Contribution(section=section)

    def state_dict(self) -> dict[str, Any]:
        return {"at_start": [[n, list(s)] for n, s in self.at_start]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.at_start = [(str(n), tuple(int(x) for x in s)) for n, s in sd["at_start"]]
