"""The page's view of one report: :class:`ReportView`, the validated plain data and the facts the
HTML sections derive from it.

It holds :meth:`~dpaudit_torch.report.schema.ReportData.to_dict` (the page shows exactly these
values) and answers what the sections ask: the order of the bound methods, their ceilings, which
bounds may refute the claim, the per-step null in words. What a bound method is and may prove is
read from :mod:`dpaudit_torch.registry`; a method this version does not know (a report from a
newer writer) is shown under its own name and never counted as refuting. Its answers that hold
numbers are HTML (numbers written by :func:`~dpaudit_torch.report.markup.num`).
"""

from __future__ import annotations

import math

from ..registry import BOUND_METHODS, bound_method, refuting_methods
from .formatting import format_number
from .markup import num
from .schema import ReportData, is_num, is_one_step

__all__ = ["ReportView"]


class ReportView:
    """The validated plain data of one report and the facts the page derives from it."""

    def __init__(self, report: ReportData) -> None:
        self.r = report
        self.d = report.to_dict()  # validated plain data; the page shows exactly these values
        self.level_pct = format_number(100.0 * (1.0 - self.d["alpha"]))

    def methods(self) -> list[str]:
        """Methods with a bound or details: registry order first, unknown ones by name."""
        names = list(self.d["epsilon_lower_bounds"]) + [
            k for k in self.d["lower_bound_details"] if k not in self.d["epsilon_lower_bounds"]
        ]
        order = {m: i for i, m in enumerate(BOUND_METHODS)}
        return sorted(names, key=lambda m: (order.get(m, len(order)), m))

    def detail(self, method: str) -> dict:
        """The recorded details of ``method``'s bound (``{}`` when none)."""
        return self.d["lower_bound_details"].get(method, {})

    def one_step(self, method: str) -> bool:
        """Does the bound of ``method`` speak about one training step (the grid of sequential
        tests of docs/design.md section 4) rather than the whole run?"""
        return is_one_step(method)

    def may_refute(self, method: str) -> bool:
        """Can this method's bound refute the (eps, delta) claim in this report? A family-free
        bound on the whole run can; a family bound only where its recorded detail says its family
        was verified on the run's data (the registry's rule,
        :meth:`~dpaudit_torch.registry.BoundMethod.refutes_with`): the white-box release bound
        can, the Gaussian f-DP test (Mahloujifar, Melis & Chaudhuri, ICML 2025) never, and the
        sequential bound is about one step. A method this version does not know never counts."""
        spec = bound_method(method)
        return spec is not None and spec.refutes_with(self.detail(method))

    def ceiling(self, method: str) -> float | None:
        """The largest epsilon the method could have certified (its recorded ``ceiling``; for
        a per-step bound, the largest grid epsilon)."""
        det = self.detail(method)
        c = det.get("ceiling")
        if is_num(c):
            return float(c)
        grid = det.get("grid_epsilons")
        if self.one_step(method) and isinstance(grid, list) and grid and all(
            is_num(g) for g in grid
        ):
            return float(max(grid))
        return None

    def canary_count(self, method: str) -> str:
        """The canaries behind ``method``'s bound (HTML): pairs for a per-step bound, else the
        one-run canaries used ("m of m_total" when only some were)."""
        det, can = self.detail(method), self.d["canaries"]
        if self.one_step(method):
            k = can.get("k_pairs")
            return f"{num(k)} pairs per step" if k is not None else num(None)
        m = det.get("m", can.get("m_one_run"))
        total = det.get("m_total")
        if is_num(total) and is_num(m) and total != m:
            return f"{num(m)} of {num(total)}"
        return num(m)

    def threshold_log(self) -> float:
        """log(1/alpha), or the decision threshold the sequential tests recorded."""
        t = self.d["sequential"].get("decision_threshold_log")
        return float(t) if is_num(t) else math.log(1.0 / self.d["alpha"])

    def refuting(self) -> list[str]:
        """Methods whose bound exceeds a finite claimed epsilon and that may refute it."""
        return refuting_methods(self.d["epsilon_lower_bounds"], self.d["claimed_epsilon"],
                                self.d["lower_bound_details"])

    def best_ceiling(self) -> tuple[str, float] | None:
        """The highest ceiling among the methods that could refute the claim."""
        best = None
        for m in self.methods():
            if not self.may_refute(m):
                continue
            c = self.ceiling(m)
            if c is not None and (best is None or c > best[1]):
                best = (m, c)
        return best

    def per_step_null_text(self) -> str:
        """The per-step null hypothesis (``sequential.per_step_null``) as a sentence of the page
        (HTML, numbers tagged), or that none was recorded."""
        null = self.d["sequential"].get("per_step_null") or {}
        kind = null.get("type")
        if kind == "gaussian_profile":
            eps = null.get("epsilons") or []
            grid = (
                f" It was tested at {len(eps)} points of that profile (ε from "
                f"{num(min(eps))} to {num(max(eps))})."
                if eps and all(is_num(x) for x in eps) else ""
            )
            return (
                "Per-step null hypothesis: each training step is the Gaussian mechanism with "
                f"noise multiplier σ = {num(null.get('noise_multiplier'))} relative to the "
                "clipping norm, i.e. its privacy profile is that of a correct DP-SGD step."
                + grid
            )
        if kind == "explicit":
            return (
                "Per-step null hypothesis: each training step is "
                f"(ε = {num(null.get('epsilon'))}, δ = {num(null.get('delta'))})-DP."
            )
        return "No per-step null hypothesis was recorded."

    def per_step_null_words(self) -> str | None:
        """The per-step null hypothesis in plain words (the value of the configuration's
        ``per_step_null`` row), or None when none was recorded."""
        null = self.d["sequential"].get("per_step_null")
        if not isinstance(null, dict):
            return None
        kind = null.get("type")
        if kind == "gaussian_profile":
            eps = null.get("epsilons")
            grid = (
                f", tested at {len(eps)} points of its privacy profile (epsilon from "
                f"{format_number(min(eps))} to {format_number(max(eps))})"
                if isinstance(eps, list) and eps and all(is_num(x) for x in eps) else ""
            )
            return (f"each step is the Gaussian mechanism with noise multiplier "
                    f"{format_number(null.get('noise_multiplier'))} (sensitivity C){grid}")
        if kind == "explicit":
            return (f"each step is (epsilon = {format_number(null.get('epsilon'))}, delta = "
                    f"{format_number(null.get('delta'))})-DP")
        return None
