"""Coverage monitor: does everything training changes change only through the DP release?
(docs/monitors/coverage.md).

DP-SGD's guarantee covers what its release covers. Two checks:

* **Who holds what** (at the start and at finalize): the model's trainable parameters against
  the tensors the DP optimizer holds (by identity). A trainable tensor the optimizer does not
  hold is clipped and noised by nothing (level ``finding``: if anything updates it, that update
  is outside the release); a tensor the optimizer holds that is not in the model handed over
  means the wrong model was handed over.
* **What changes where** (every step): every parameter and buffer of the model is watched
  (:mod:`._tensor_watch`: norms and sampled coordinates compared on the device). The DP
  release of step t is applied by the inner optimizer's step, between the step pre-hook (where
  the engine calls :meth:`CoverageMonitor.observe`) and the step post-hook
  (:meth:`CoverageMonitor.after_release`). A tensor the DP optimizer holds that changes between
  the end of one update and the start of the next, and any other tensor (a buffer, a parameter
  the DP optimizer does not hold) that changes at all, changed outside the DP release: level
  ``finding``, naming the tensor, the first step it was seen and at how many steps (the monitor
  sees that a tensor changed, not whether the change depends on the data: post-processing of
  the released parameters, such as a projection, is private). A buffer paired with a parameter
  (declared in ``averages`` or by the name rule, ``ema.fc.weight`` -> ``fc.weight``) whose
  change fits one weight-average update ``b <- (1 - beta) b + beta p`` towards the released
  parameter at the sampled coordinates is post-processing: counted and reported
  (``averaged_buffers``, a note), not a finding (docs/monitors/coverage.md, "Weight averages").

``ignore`` entries (paths, prefixes ending in ".", shell-style patterns) that match no tensor of
the model are warned about.

It needs the model (``PrivacyAuditor(..., model=model)``); without it, it says so and checks
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...contract import MODEL, OPTIMIZER_PARAMS, StepRecord
from ._tensor_watch import Fingerprint, TensorWatch, module_path
from .base import Contribution, Finding, Monitor, MonitorConfig, MonitorContext, register_monitor
from .checks import CheckSection

__all__ = ["CoverageMonitor", "CoverageConfig", "module_path"]

#: what each kind of watched tensor is called in findings
_KINDS = {(True, "parameter"): "parameter held by the DP optimizer",
          (False, "parameter"): "parameter not held by the DP optimizer",
          (False, "buffer"): "buffer"}


def _span(lo: float | None, hi: float | None) -> str:
    """A range of fitted betas in words: one number where they agree to three digits."""
    if lo is None or hi is None:
        return "not determined (equal to its parameter where sampled)"
    a, b = f"{lo:.3g}", f"{hi:.3g}"
    return a if a == b else f"{a} to {b}"


@dataclass(frozen=True)
class CoverageConfig(MonitorConfig):
    """Settings of the coverage monitor.

    Attributes:
        watch: watch every parameter and buffer at every step (False: the start/finalize
            comparison of what the DP optimizer holds only).
        sample_coordinates: coordinates of each tensor compared exactly at every point (every
            coordinate of a smaller tensor), besides its norm.
        ignore: tensors not watched: paths (``"ema.shadow"``), prefixes ending in ``"."``
            (``"ema."``) or shell-style patterns (``"ema.*"``, ``"*.running_*"``): tensors
            that are functions of the released parameters only (a projection of the weights),
            which are post-processing of the release. An entry that matches nothing is warned
            about.
        averages: weight averages kept as buffers, buffer path -> parameter path
            (``{"ema.fc.weight": "fc.weight"}``, or a sequence of such pairs): each buffer's
            changes are checked as weight-average updates towards its parameter, besides the
            pairs the name rule makes (docs/monitors/coverage.md, "Weight averages").
    """

    watch: bool = True
    sample_coordinates: int = 8
    ignore: tuple[str, ...] = ()
    averages: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if int(self.sample_coordinates) < 1:
            raise ValueError(f"sample_coordinates must be >= 1, got {self.sample_coordinates!r}")
        if isinstance(self.ignore, str) or not all(isinstance(i, str) for i in self.ignore):
            raise ValueError(f"ignore must be a sequence of tensor paths or patterns, got "
                             f"{self.ignore!r}")
        if any(not i for i in self.ignore):
            raise ValueError(f"ignore holds an empty entry: {self.ignore!r}")
        object.__setattr__(self, "ignore", tuple(self.ignore))
        av = self.averages
        pairs = list(av.items()) if isinstance(av, Mapping) else av
        if isinstance(pairs, str) or not all(
                isinstance(x, (tuple, list)) and len(x) == 2
                and all(isinstance(y, str) and y for y in x) for x in pairs):
            raise ValueError(f"averages must map buffer paths to parameter paths, got {av!r}")
        object.__setattr__(self, "averages", tuple((str(b), str(p)) for b, p in pairs))


@register_monitor("coverage")
class CoverageMonitor(Monitor):
    """Tensors of the model that change outside the DP release, and trainable parameters the
    DP optimizer does not hold."""

    label = "coverage (tensors changed outside the DP release)"
    config_class = CoverageConfig
    needs = (MODEL, OPTIMIZER_PARAMS)
    #: every release counts (its values are not used)
    observes_nonfinite = True

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
        on = self.reason_off is None and self.settings.watch
        self.watch = TensorWatch(self.model, self._held, self.settings.sample_coordinates,
                                 self.settings.ignore, self.settings.averages) if on else None
        if self.watch is not None:
            example = next((w.path for w in self.watch.tensors), "")
            for entry in self.watch.unmatched_ignore:
                ctx.warn(f"coverage: the ignore entry {entry!r} matches no parameter or buffer "
                         f"of the model, so it leaves nothing out (entries are tensor paths in "
                         f"the model, wrapper prefixes removed, such as {example!r}; prefixes "
                         f"ending in '.'; or shell-style patterns such as 'ema.*')")
        self._after: Fingerprint | None = None  # after the last update (or attach)
        self._before: Fingerprint | None = None  # before the update being released
        self._before_step = 0
        #: updates of the inner optimizer that no audited release preceded
        self.unaudited_updates = 0
        #: path -> (kind, steps with a change, first step) of earlier sessions (checkpoints)
        self._resumed: dict[str, tuple[str, int, int]] = {}
        #: buffer path -> (steps, first step, beta min, beta max) of earlier sessions
        self._resumed_avg: dict[str, tuple[int, int, float, float]] = {}
        self._changed: list[dict[str, Any]] | None = None
        self._averaged: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ the watch
    def observe(self, record: StepRecord) -> None:
        """Before the update of ``record.step``: every tensor that changed since the last
        update changed outside the DP release."""
        w = self.watch
        if w is None:
            return
        now = w.fingerprint(record.step)
        w.compare(now, self._after, record.step, held_too=True, post_now=False)
        self._before, self._before_step = now, record.step

    def after_release(self, step: int | None) -> None:
        """After the update of ``step`` (None: the audit attaches): the tensors the DP
        optimizer does not hold must not have changed during it; an update that no audited
        release preceded changed every tensor it changed outside the release."""
        w = self.watch
        if w is None:
            return
        now = w.fingerprint(step)
        if step is not None:
            if self._before is not None:
                w.compare(now, self._before, self._before_step, held_too=False, post_now=True)
            elif self._after is not None:
                self.unaudited_updates += 1
                w.compare(now, self._after, step + 1, held_too=True, post_now=True)
        self._after, self._before = now, None

    def changed(self) -> list[dict[str, Any]]:
        """Every watched tensor that changed outside the release: ``name``, ``module``,
        ``tensor``, ``kind``, ``first_step``, ``steps`` (model order; read once at
        finalize, else now)."""
        if self._changed is not None:
            return self._changed
        found = dict(self._resumed)
        if self.watch is not None:
            for i, (steps, first) in self.watch.changes().items():
                w = self.watch.tensors[i]
                kind = _KINDS.get((w.held, w.kind), w.kind)
                if w.path in found:
                    _, s0, f0 = found[w.path]
                    steps, first = steps + s0, min(first, f0)
                found[w.path] = (kind, steps, first)
        order = {w.path: i for i, w in enumerate(self.watch.tensors)} if self.watch else {}
        out = []
        for path in sorted(found, key=lambda n: order.get(n, len(order))):
            kind, steps, first = found[path]
            mod, _, attr = path.rpartition(".")
            out.append({"name": path, "module": mod or "(the model)", "tensor": attr,
                        "kind": kind, "first_step": int(first), "steps": int(steps)})
        return out

    def averaged(self) -> list[dict[str, Any]]:
        """Every buffer watched as a weight average: ``name``, ``parameter``, ``paired_by``
        ("declared" or "name"), ``steps`` (training steps at which it changed as a weight
        average of the released parameter), ``first_step`` and the fitted ``beta_min`` /
        ``beta_max`` (null before any such step, or where no sampled coordinate determined
        beta)."""
        if self.watch is None:
            return []
        got = self.watch.averages()
        out = []
        for k, pr in enumerate(self.watch.pairs):
            name = self.watch.tensors[pr.buffer].path
            steps, first, lo, hi = got.get(k, (0, -1, float("inf"), float("-inf")))
            if name in self._resumed_avg:
                s0, f0, l0, h0 = self._resumed_avg[name]
                steps, first = steps + s0, f0 if first < 0 else min(first, f0)
                lo, hi = min(lo, l0), max(hi, h0)
            out.append({"name": name, "parameter": self.watch.tensors[pr.parameter].path,
                        "paired_by": pr.paired_by, "steps": int(steps),
                        "first_step": int(first) if steps else None,
                        "beta_min": float(lo) if steps and lo <= hi else None,
                        "beta_max": float(hi) if steps and lo <= hi else None})
        return out

    # ------------------------------------------------------------------ who holds what
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
        self._changed = None
        self._changed = self.changed()
        self._averaged = self.averaged()

    def uncovered(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor found uncovered at the start or at the end, once, in model order."""
        seen: dict[str, tuple[int, ...]] = {}
        for name, shape in [*self.at_start, *self.at_end]:
            seen.setdefault(name, shape)
        return list(seen.items())

    # ------------------------------------------------------------------ report
    def findings(self) -> list[Finding]:
        if self.reason_off is not None:
            return [Finding(self.name, "note", f"check not run: {self.reason_off}", "the model")]
        out = []
        changed = self.changed()
        if changed:
            names = ", ".join(
                f"{c['name']} ({c['kind']}; first at step {c['first_step']}, "
                f"{c['steps']} step(s))" for c in changed[:8])
            more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
            out.append(Finding(
                self.name, "finding",
                f"{len(changed)} tensor(s) of the model changed outside the DP release: "
                f"{names}{more}. DP-SGD clips and noises only what its optimizer's step applies: "
                f"where these changes depend on the data (a second optimizer, an update by hand, "
                f"a buffer updated in forward from the inputs), the claimed epsilon does not "
                f"cover this training; where they are post-processing of the released "
                f"parameters only (a projection, a weight average), leave them out with "
                f"monitor_options={{'coverage': {{'ignore': (...)}}}} (a weight average kept as "
                f"a buffer is checked as one when paired with its parameter: 'averages')",
                ", ".join(c["name"] for c in changed[:8])))
        avg = [a for a in self._averaged_now() if a["steps"]]
        if avg:
            names = ", ".join(f"{a['name']} (of {a['parameter']}; {a['steps']} step(s), beta "
                              f"{_span(a['beta_min'], a['beta_max'])})" for a in avg[:8])
            more = f" and {len(avg) - 8} more" if len(avg) > 8 else ""
            out.append(Finding(
                self.name, "note",
                f"{len(avg)} buffer(s) changed only as weight averages of the released "
                f"parameters, b <- (1 - beta) b + beta p at the sampled coordinates: {names}"
                f"{more}. Post-processing of the release, not a finding",
                ", ".join(a["name"] for a in avg[:8])))
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
        changed = self.changed() if self.reason_off is None else []
        section: dict[str, Any] = {
            "run": self.reason_off is None, "reason_not_run": self.reason_off,
            "held_tensors": self._n_held,
            "uncovered": [{"name": n, "shape": list(s), "numel": int(torch.Size(s).numel())}
                          for n, s in missing],
            "uncovered_coordinates": int(sum(torch.Size(s).numel() for _, s in missing)),
            "held_not_in_model": self.not_in_model,
            "watched": self.watch is not None,
            "watched_tensors": len(self.watch.tensors) if self.watch is not None else 0,
            "changed_outside_release": changed,
            "averaged_buffers": self._averaged_now() if self.reason_off is None else [],
            "unaudited_updates": self.unaudited_updates,
            "any_changed": bool(changed),
        }
        if self.model is not None:
            section["trainable_tensors"] = sum(1 for _, p in self._named() if p.requires_grad)
        return Contribution(section=section)

    def check_section(self) -> CheckSection:
        """Who holds what, what changed outside the release; what a model-less audit and the
        watch's sampled coordinates leave out."""
        sec = CheckSection("Coverage", ran=self.reason_off is None,
                           reason_not_run=self.reason_off)
        c = self.contribution().section or {}
        if sec.ran:
            n_unc = len(c.get("uncovered", []))
            sec.check("every trainable tensor of the model is held by the DP optimizer",
                      "passed" if not n_unc else f"{n_unc} tensor(s) not held")
            sec.check("every tensor the DP optimizer holds is a parameter of the model",
                      "passed" if not c.get("held_not_in_model") else
                      f"{c['held_not_in_model']} held tensor(s) not in the model")
            if c.get("watched"):
                n_ch = len(c.get("changed_outside_release", []))
                sec.check("no parameter or buffer changes outside the DP release",
                          "passed" if not n_ch else f"{n_ch} tensor(s) changed outside it")
            else:
                sec.skip("changes outside the DP release", "the watch is turned off in this "
                         "audit's settings")
        sec.measure("tensors the DP optimizer holds", c.get("held_tensors"))
        sec.measure("trainable tensors of the model", c.get("trainable_tensors"))
        sec.measure("tensors watched for changes", c.get("watched_tensors") or None)
        sec.measure("updates while the audit was not attached", c.get("unaudited_updates")
                    or None)
        if c.get("watched"):
            sec.skip("every coordinate of every tensor", "the watch compares a sample of "
                     "coordinates per tensor (and each tensor's sum of squares) between steps")
        return sec

    def state_dict(self) -> dict[str, Any]:
        return {"at_start": [[n, list(s)] for n, s in self.at_start],
                "changed": [[c["name"], c["kind"], c["steps"], c["first_step"]]
                            for c in self.changed()],
                "averaged": [[a["name"], a["steps"], a["first_step"], a["beta_min"],
                              a["beta_max"]] for a in self._averaged_now() if a["steps"]],
                "unaudited_updates": self.unaudited_updates}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.at_start = [(str(n), tuple(int(x) for x in s)) for n, s in sd["at_start"]]
        self._resumed = {str(n): (str(k), int(s), int(f))
                         for n, k, s, f in sd.get("changed", [])}  # absent before the watch
        self.unaudited_updates = int(sd.get("unaudited_updates", 0))
        inf = float("inf")
        self._resumed_avg = {  # absent before the weight averages were checked
            str(n): (int(s), int(f), inf if lo is None else float(lo),
                     -inf if hi is None else float(hi))
            for n, s, f, lo, hi in sd.get("averaged", [])}

    def _averaged_now(self) -> list[dict[str, Any]]:
        """:meth:`averaged`, as read at finalize (else now)."""
        return self._averaged if self._averaged is not None else self.averaged()
