"""Accounting monitor: was the accountant told what the optimizer did?
(docs/design.md section 10).

An accounting bug (gradient accumulation counted per micro-step, a wrong sample rate given to
the accountant, a noise multiplier that is not the one used) leaves every step a correct
Gaussian step: only the whole run shows it. This monitor records, per released step, the real
examples clipped and the micro-batches, and at finalize compares them with the accountant's
history: steps, sample rate (exact Clopper-Pearson interval from the batch sizes, Poisson
sampling assumed) and noise multiplier (chi-square interval from the noise audit). It then
recomputes epsilon with the claim's own accountant class from what was observed, at the
conservative ends of the intervals (rate: lower end; noise multiplier: upper end; Bonferroni, total
level alpha). When that exceeds the claim, the claim is **inconsistent with the training that
ran**: a statement about the accountant's inputs, separate from "refuted" (a lower bound on the
true epsilon).

It also checks the accountant's arithmetic on its own inputs: the claim against a numerical
lower bound on the true epsilon of the history the accountant counted (the adapter's
``EPSILON_LOWER_OF_HISTORY``; docs/design.md section 10, "An accountant that under-reports").
A claim below it is a finding: the formula under-reports for that history, as Opacus's GDP
accountant (a central-limit approximation) does at short horizons. Deterministic, so it spends
no level.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ...contract import (
    ACCOUNTANT_HISTORY,
    EPSILON_LOWER_OF_HISTORY,
    EPSILON_OF_HISTORY,
    N_REAL_NOT_OBSERVED,
    N_RECORDS,
    SAMPLE_RATE,
    StepRecord,
)
from .base import Contribution, Finding, Monitor, MonitorConfig, MonitorContext, register_monitor
from .checks import CheckSection

logger = logging.getLogger(__name__)

__all__ = ["AccountingMonitor", "sigma_ratio_interval"]


def sigma_ratio_interval(ss: float, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided level-``alpha`` interval for the ratio of the noise's std to the claimed one,
    from ``ss`` = sum of n squared noise values in units of the claimed std (ss ~ ratio^2
    chi2(n)): sqrt(ss / chi2 quantiles at 1 - alpha/2 and alpha/2)."""
    from scipy import stats as sps

    lo = math.sqrt(ss / sps.chi2.ppf(1.0 - alpha / 2.0, n))
    hi = math.sqrt(ss / sps.chi2.ppf(alpha / 2.0, n))
    return lo, hi


@dataclass(frozen=True)
class AccountingConfig(MonitorConfig):
    """Settings of the accounting monitor: the total level of its two intervals."""

    #: its intervals make the "claim inconsistent" proof: the "consistency" share of alpha
    alpha_path: ClassVar[str] = "consistency"
    alpha: float = 0.05


@register_monitor("accounting")
class AccountingMonitor(Monitor):
    """Releases, examples and noise observed vs the accountant's history; recomputed epsilon."""

    label = "accounting"
    config_class = AccountingConfig
    needs = (SAMPLE_RATE, N_RECORDS, ACCOUNTANT_HISTORY, EPSILON_OF_HISTORY,
             EPSILON_LOWER_OF_HISTORY)
    #: releases are counted even when a step's observation was dropped as non-finite
    observes_nonfinite = True

    def __init__(self, ctx: MonitorContext) -> None:
        super().__init__(ctx)
        self.config = self.settings
        self.rate = float(ctx.fact_or(SAMPLE_RATE, 1.0))
        self.n_records = ctx.fact_or(N_RECORDS)
        self._n_reason = ctx.why_not(N_RECORDS)
        self._history = ctx.fact_or(ACCOUNTANT_HISTORY)
        self._epsilon_of_history = ctx.fact_or(EPSILON_OF_HISTORY)
        self._epsilon_lower = ctx.fact_or(EPSILON_LOWER_OF_HISTORY)
        self.releases = 0
        self.examples = 0
        self.examples_known = True
        self.micro_steps = 0
        self.sigmas: set[float] = set()
        self._xi_sumsq: torch.Tensor | float = 0.0
        self._xi_count = 0
        self._xi_flags: list[tuple[torch.Tensor, int]] = []
        self.result: dict[str, Any] = {}

    def observe(self, record: StepRecord) -> None:
        self.releases += 1
        self.micro_steps += int(record.micro_steps)
        if record.n_real is None:
            self.examples_known = False
        else:
            self.examples += int(record.n_real)
        self.sigmas.add(float(record.sigma))
        if record.noise is not None and record.finite is not False:
            # device sums: no synchronisation per step; a step flagged non-finite on the device
            # adds nothing (its count is corrected at finalize from the flags)
            sq: torch.Tensor | float = (record.noise_sumsq if record.noise_sumsq is not None
                                        else torch.dot(record.noise, record.noise))
            if isinstance(record.finite, torch.Tensor):
                sq = torch.where(record.finite & torch.isfinite(sq), sq, torch.zeros_like(sq))
                self._xi_flags.append((record.finite, int(record.noise.numel())))
            else:
                self._xi_count += int(record.noise.numel())
            self._xi_sumsq = self._xi_sumsq + sq

    # ------------------------------------------------------------------ finalize
    def _sigma_ratio_interval(self, alpha: float) -> tuple[float, float] | None:
        """Interval for (measured noise std) / (claimed), from sum xi^2 ~ chi2(n) x ratio^2."""
        self._count_deferred()  # deferred finiteness: count the finite steps only
        n = self._xi_count
        if n < 2:
            return None
        return sigma_ratio_interval(float(self._xi_sumsq), n, alpha)

    def finalize(self, claimed_epsilon: float | None) -> None:
        from ...stats.sampling import rate_interval

        alpha = self.config.alpha
        out: dict[str, Any] = {"releases": self.releases, "micro_steps": self.micro_steps,
                               "examples": self.examples if self.examples_known else None,
                               "n_records": self.n_records, "loader_rate": self.rate,
                               "checks_not_run": []}
        not_run: list[str] = out["checks_not_run"]
        history = self._history() if self._history is not None else None
        if history is None:
            not_run.append("steps and rate against the accountant: the accountant keeps no "
                           "history of (noise multiplier, sample rate, steps)")
        else:
            out["accountant_steps"] = int(sum(h[2] for h in history))
            out["accountant_history"] = [[float(s), float(q), int(n)] for s, q, n in history]
        # the intervals, Bonferroni over the two (total level alpha)
        q_ci = None
        if not self.examples_known:
            not_run.append(f"sample rate: {N_REAL_NOT_OBSERVED}")
        elif self.n_records is None:
            not_run.append(f"sample rate: N is unknown ({self._n_reason})")
        elif self.releases:
            q_ci = rate_interval(self.examples, self.n_records, self.releases, alpha / 2.0)
            out["rate_interval"] = list(q_ci)
            out["rate_estimate"] = self.examples / (self.n_records * self.releases)
        s_ci = self._sigma_ratio_interval(alpha / 2.0)
        sigma_claimed = max(self.sigmas) if self.sigmas else None
        if s_ci is None:
            not_run.append("noise multiplier: no noise was read (noise audit off or no steps)")
        elif sigma_claimed is not None:
            out["noise_multiplier_interval"] = [s_ci[0] * sigma_claimed,
                                                s_ci[1] * sigma_claimed]
        self.result = out
        if history is not None and claimed_epsilon is not None:
            out["claimed_epsilon"] = claimed_epsilon
            self._check_formula(out, history, claimed_epsilon)
        if history is None or self._epsilon_of_history is None or not self.releases:
            return
        q_acc = max((h[1] for h in history), default=self.rate)
        sigma_acc = min((h[0] for h in history), default=sigma_claimed or 0.0)
        q_use = q_acc if q_ci is None else q_ci[0]
        sig_use = sigma_acc if s_ci is None or sigma_claimed is None else s_ci[1] * sigma_claimed
        if not (q_use > 0 and sig_use > 0):
            return
        try:
            eps = float(self._epsilon_of_history([(sig_use, min(q_use, 1.0), self.releases)]))
        except Exception as e:  # noqa: BLE001 - report, never crash the end of training
            not_run.append(f"recomputed epsilon: the accountant failed ({e!r})")
            return
        out["recomputed_epsilon"] = eps
        out["recomputed_from"] = {"noise_multiplier": sig_use, "sample_rate": q_use,
                                  "steps": self.releases}
        out["claimed_epsilon"] = claimed_epsilon
        out["inconsistent"] = bool(claimed_epsilon is not None and math.isfinite(eps)
                                   and eps > claimed_epsilon)
        out["explanation"] = self._explain(out, q_acc, sigma_acc)

    #: histories longer than this (a schedule changing sigma or q at every step) are not
    #: composed numerically at finalize: the cost grows with the number of entries
    MAX_FORMULA_ENTRIES = 64

    def _check_formula(self, out: dict[str, Any], history: list[tuple[float, float, int]],
                       claimed: float) -> None:
        """The claim against a numerical lower bound on the epsilon of the accountant's own
        history: ``out["under_reported"]`` when the claim is below it."""
        not_run: list[str] = out["checks_not_run"]
        entries = [(float(s), float(q), int(n)) for s, q, n in history if int(n) > 0]
        if self._epsilon_lower is None or not entries or not math.isfinite(claimed):
            return
        if len(entries) > self.MAX_FORMULA_ENTRIES:
            not_run.append(f"the accountant's formula: its history has {len(entries)} entries "
                           f"(more than {self.MAX_FORMULA_ENTRIES} are not composed at "
                           "finalize)")
            return
        try:
            lower = self._epsilon_lower(entries)
        except Exception as e:  # noqa: BLE001 - report, never crash the end of training
            not_run.append(f"the accountant's formula: the lower bound failed ({e!r})")
            return
        if lower is None:  # the accountant's epsilon is a proven upper bound
            out["formula_check"] = "proven upper bound"
            return
        if not math.isfinite(lower):
            not_run.append(f"the accountant's formula: the lower bound is {lower!r}")
            return
        out["formula_check"] = "checked"
        out["epsilon_lower_of_history"] = lower
        out["under_reported"] = bool(claimed < lower)

    def _explain(self, out: dict[str, Any], q_acc: float, sigma_acc: float) -> str:
        parts = []
        acc_steps = out.get("accountant_steps")
        if acc_steps is not None and acc_steps != self.releases:
            parts.append(f"the accountant counted {acc_steps} steps; noise was released "
                         f"{self.releases} times")
        est = out.get("rate_estimate")
        if est is not None and q_acc > 0:
            ratio = est / q_acc
            if abs(ratio - 1.0) > 0.1:
                parts.append(f"each release was over about {ratio:.3g}x the examples the "
                             f"accountant's sample rate {q_acc:.4g} implies (observed rate "
                             f"{est:.4g})")
        ni = out.get("noise_multiplier_interval")
        if ni is not None and ni[1] < sigma_acc:
            parts.append(f"the noise multiplier measured lies in [{ni[0]:.4g}, {ni[1]:.4g}], "
                         f"below the accountant's {sigma_acc:.4g}")
        if not parts:
            parts.append("the inputs agree with the accountant's within the intervals")
        return "; ".join(parts)

    def findings(self) -> list[Finding]:
        r = self.result
        out = []
        if r.get("inconsistent"):
            out.append(Finding(
                self.name, "inconsistent",
                f"the claimed epsilon {r['claimed_epsilon']:.4g} is inconsistent with the "
                f"training that ran: {r['explanation']}; recomputed from what was observed (at "
                f"the conservative ends of the {100 * (1 - self.config.alpha):.6g}% intervals), "
                f"epsilon >= {r['recomputed_epsilon']:.4g}", "accountant"))
        if r.get("under_reported"):
            out.append(Finding(
                self.name, "finding",
                f"the accountant under-reports: it claims epsilon {r['claimed_epsilon']:.4g}"
                f" for the steps it counted, whose epsilon is at least "
                f"{r['epsilon_lower_of_history']:.4g} (numerical composition of the "
                "Poisson-subsampled Gaussian steps in its own history, Gopi, Lee & Wutschitz "
                "2021); its formula does not bound this run (e.g. the GDP accountant's "
                "central-limit approximation at a short horizon): use the PRV or RDP "
                "accountant", "accountant"))
        for why in r.get("checks_not_run", []):
            out.append(Finding(self.name, "note", f"check not run: {why}", "accountant"))
        return out

    def contribution(self) -> Contribution:
        return Contribution(section=dict(self.result),
                            verdict="inconsistent" if self.result.get("inconsistent") else None)

    def check_section(self) -> CheckSection:
        """The recomputed epsilon against the claim, the steps against the accountant's, and
        the inputs it was recomputed from; the checks that could not run, and why."""
        r = self.result
        sec = CheckSection("Accounting")
        if "accountant_steps" in r:
            sec.check("steps counted by the accountant = noisy releases",
                      "passed" if r["accountant_steps"] == r["releases"] else
                      f"{r['accountant_steps']} counted, {r['releases']} released")
        if "recomputed_epsilon" in r:
            sec.check("claimed ε at least the ε recomputed from what ran (conservative ends of "
                      "the intervals)", "inconsistent" if r.get("inconsistent") else "passed")
        if r.get("formula_check") == "checked":
            sec.check("claimed ε at least a numerical lower bound on the ε of the accountant's "
                      "own history", "under-reported" if r.get("under_reported") else "passed")
            sec.measure("lower bound on the ε of the accountant's history",
                        r.get("epsilon_lower_of_history"))
        elif r.get("formula_check") == "proven upper bound":
            sec.skip("the accountant's formula", "its ε is a proven upper bound for the "
                     "Poisson-subsampled Gaussian steps it counted")
        sec.measure("recomputed ε", r.get("recomputed_epsilon"))
        sec.measure("claimed ε", r.get("claimed_epsilon"))
        sec.measure("noisy releases, and optimizer steps (micro-batches included)",
                    [r.get("releases"), r.get("micro_steps")])
        sec.measure("steps the accountant counted", r.get("accountant_steps"))
        each = f"{100 * (1 - self.config.alpha / 2):g}% confidence each, Bonferroni"
        sec.measure(f"interval for the rate really used ({each})", r.get("rate_interval"))
        sec.measure(f"interval for the noise multiplier measured ({each})",
                    r.get("noise_multiplier_interval"))
        sec.measure("explanation", r.get("explanation"))
        for why in r.get("checks_not_run", []):
            what, _, reason = why.partition(": ")
            sec.skip(what, reason or why)
        if "recomputed_epsilon" not in r and not r.get("checks_not_run"):
            sec.skip("recomputed ε", "no release was observed, or the accountant has no "
                     "history or formula for it")
        return sec

    def _count_deferred(self) -> None:
        """Add the noise values of the steps whose finiteness was deferred (device flags) to
        the count, once (a host synchronisation: at finalize or a checkpoint only)."""
        for flag, k in self._xi_flags:
            self._xi_count += k * int(bool(flag))
        self._xi_flags = []

    def state_dict(self) -> dict[str, Any]:
        self._count_deferred()  # the sum of squares already holds those steps
        return {"releases": self.releases, "examples": self.examples,
                "examples_known": self.examples_known, "micro_steps": self.micro_steps,
                "sigmas": sorted(self.sigmas), "xi_sumsq": float(self._xi_sumsq),
                "xi_count": self._xi_count}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.releases = int(sd["releases"])
        self.examples = int(sd["examples"])
        self.examples_known = bool(sd["examples_known"])
        self.micro_steps = int(sd["micro_steps"])
        self.sigmas = {float(s) for s in sd["sigmas"]}
        self._xi_sumsq = float(sd["xi_sumsq"])
        self._xi_count = int(sd["xi_count"])
