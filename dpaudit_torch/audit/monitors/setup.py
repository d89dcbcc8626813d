"""Setup monitor: do the engine, optimizer, data loader and accountant belong together, and
does the accountant count every release? (docs/monitors/setup.md; docs/design.md,
"Setup coherence").

The checks made when the audit attaches (:mod:`dpaudit_torch.opacus_tap.setup`: the accountant
the optimizer's step hook feeds, the rate it is told, whether the loader handed over is the one
whose batches are released) reach the report here as findings naming the wrong input. At
finalize this monitor adds one count: the releases the optimizer made while the audit was
attached against the steps the accountant counted over the same span. An accountant that counted
fewer steps than were released (no step hook, a hook that skips steps, accounting done by hand
and forgotten) claims an epsilon for a shorter training than the one that ran: the claim is
*inconsistent* with the training, a certain statement (a count, not a statistical test).

Costs one integer per step.
"""

from __future__ import annotations

from typing import Any

from ...contract import ACCOUNTANT_HISTORY, SETUP_CHECK, StepRecord
from .base import Contribution, Finding, Monitor, MonitorContext, register_monitor
from .checks import CheckSection

__all__ = ["SetupMonitor"]


@register_monitor("setup")
class SetupMonitor(Monitor):
    """Wrong inputs found at attach; releases against the accountant's count at finalize."""

    label = "setup (engine, loader and accountant)"
    needs = (SETUP_CHECK, ACCOUNTANT_HISTORY)
    #: every release counts, also those whose observation was dropped as non-finite
    observes_nonfinite = True

    def __init__(self, ctx: MonitorContext) -> None:
        super().__init__(ctx)
        self.setup: dict[str, Any] | None = ctx.fact_or(SETUP_CHECK)
        self.reason_off = ctx.why_not(SETUP_CHECK)
        self._history = ctx.fact_or(ACCOUNTANT_HISTORY)
        self.releases = 0
        self.accountant_steps: int | None = None
        self.history_reason: str | None = None

    def observe(self, record: StepRecord) -> None:
        self.releases += 1

    def finalize(self, claimed_epsilon: float | None) -> None:
        if self._history is None:
            self.history_reason = "the adapter does not read the accountant's history"
            return
        try:
            history = self._history()
        except Exception as e:  # noqa: BLE001 - the end of training never fails on this
            self.history_reason = f"reading the accountant's history failed ({e!r})"
            return
        if history is None:
            self.history_reason = "the accountant keeps no history of its steps"
            return
        self.accountant_steps = int(sum(int(h[2]) for h in history))

    @property
    def undercounted(self) -> bool:
        """Did the accountant count fewer steps than the optimizer released?"""
        return self.accountant_steps is not None and self.accountant_steps < self.releases

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        if self.reason_off is not None:
            out.append(Finding(self.name, "note", f"check not run: {self.reason_off}",
                               "setup"))
        for p in (self.setup or {}).get("problems", []):
            out.append(Finding(self.name, p["level"], p["message"], p["scope"]))
        if self.undercounted:
            out.append(Finding(
                self.name, "inconsistent",
                f"the accountant counted {self.accountant_steps} step(s) while the optimizer "
                f"released {self.releases} noisy gradient(s) during the audit: the claimed "
                f"epsilon accounts for a shorter training than the one that ran (is the "
                f"accountant's step hook attached to this optimizer?)", "accountant"))
        elif self.history_reason is not None and self.releases:
            out.append(Finding(self.name, "note", f"releases not compared with the "
                               f"accountant's count: {self.history_reason}", "accountant"))
        return out

    def contribution(self) -> Contribution:
        section: dict[str, Any] = {**(self.setup or {}), "run": self.reason_off is None,
                                   "reason_not_run": self.reason_off,
                                   "releases": self.releases,
                                   "accountant_steps": self.accountant_steps,
                                   "accountant_undercounted": self.undercounted}
        return Contribution(section=section,
                            verdict="inconsistent" if self.undercounted else None)

    def check_section(self) -> CheckSection:
        """The engine, loader and accountant checked at attach; the releases against the
        accountant's count at finalize."""
        st = self.setup or {}
        sec = CheckSection("Setup", ran=self.reason_off is None,
                           reason_not_run=self.reason_off)
        problems = st.get("problems", [])
        if sec.ran:
            sec.check("the engine's accountant is the one the optimizer's step hook feeds",
                      "passed" if st.get("step_hook") == "opacus" else
                      f"step hook: {st.get('step_hook')}")
            sec.check("the data loader handed over is the one whose batches are released",
                      "passed" if st.get("loader_verified") else "not verified")
            sec.check("problems found at attach",
                      "none" if not problems else f"{len(problems)} (see the findings)")
        if self.accountant_steps is not None:
            sec.check("the accountant counted every release",
                      "passed" if not self.undercounted else
                      f"{self.accountant_steps} counted, {self.releases} released")
        else:
            sec.skip("the accountant counted every release",
                     self.history_reason or "no release was observed")
        sec.measure("sample rate used (its source)",
                    f"{st['rate']:.4g} ({st.get('rate_source')})" if "rate" in st else None)
        sec.measure("records N", st.get("n_records"))
        sec.measure("N unknown because", st.get("n_records_unknown_because"))
        sec.measure("releases observed", self.releases)
        sec.measure("steps the accountant counted", self.accountant_steps)
        return sec

    def state_dict(self) -> dict[str, Any]:
        return {"releases": self.releases}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.releases = int(sd["releases"])
