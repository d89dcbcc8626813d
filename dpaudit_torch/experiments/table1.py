"""Table 1 of Gonzalez, Dulce-Rubio, Ramdas & Ribero, "Sequentially auditing differential
privacy" (NeurIPS 2025, arXiv 2509.07055): the protocol, its formatting and its checks.

The protocol: level alpha = 0.05, 20 runs per cell, a budget of 5000 pairs, a run stops at its
first rejection; the rejection rate and the mean number of pairs to reject (burn-in included,
over the rejecting runs) per cell. Pairs come from the reference mechanisms of
:mod:`dpaudit_torch.mechanisms` (docs/design.md section 7). Within one run every method sees the
*same* stream of pairs (common random numbers), so the comparison between methods is paired.
Each run has its own seeded ``torch.Generator``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .. import mechanisms as mech
from .._validation import check_alpha, check_epsilons, check_positive_int
from .common import (
    EXPERIMENT_METHODS,
    check_methods,
    feed,
    make_tester,
    method_label,
    progress_bar,
    run_seed,
)

logger = logging.getLogger(__name__)

__all__ = [
    "PAPER_TABLE1",
    "KUTTA_TABLE1",
    "Table1Row",
    "run_table1",
    "format_table1",
    "format_table1_detail",
    "table1_checks",
    "format_table1_checks",
    "run_kutta_cells",
    "format_kutta_cells",
]

#: Table 1 of the paper (MMD test, authors' code: R = 1/2): (rejection rate, mean pairs to reject)
PAPER_TABLE1: dict[tuple[str, float], tuple[float, float | None]] = {
    ("DPGaussian", 0.01): (0.0, None),
    ("DPGaussian", 0.1): (0.0, None),
    ("NonDPGaussian1", 0.01): (1.0, 264.0),
    ("NonDPGaussian1", 0.1): (1.0, 562.0),
    ("NonDPGaussian2", 0.01): (0.85, 1139.0),
    ("NonDPGaussian2", 0.1): (0.05, 4776.0),
    ("DPLaplace", 0.01): (0.0, None),
    ("DPLaplace", 0.1): (0.0, None),
    ("NonDPLaplace1", 0.01): (1.0, 331.0),
    ("NonDPLaplace1", 0.1): (1.0, 920.0),
    ("NonDPLaplace2", 0.01): (1.0, 192.0),
    ("NonDPLaplace2", 0.1): (0.95, 770.0),
}

#: best published sequential auditor (Kutta et al., "Sequential auditing for f-DP",
#: arXiv 2602.06518): mean pairs to reject
KUTTA_TABLE1: dict[tuple[str, float], float] = {
    ("NonDPGaussian1", 0.01): 59.0,
    ("NonDPGaussian1", 0.1): 68.0,
    ("NonDPLaplace1", 0.01): 86.0,
    ("NonDPLaplace1", 0.1): 114.0,
}

#: the paper's "reliably rejects" rate: where it rejects at least this often, mean pairs compare
_RELIABLE_RATE = 0.85
#: a method in the paper's configuration reproduces its mean pairs within this relative error ...
_REPRODUCE_PAIRS = 0.25
#: ... and its rejection rate within this absolute error where the paper rarely rejects
_REPRODUCE_RATE = 0.2


@dataclass(frozen=True)
class Table1Row:
    """One (mechanism, epsilon, method) cell of Table 1.

    ``rejected_at[r]`` is the number of pairs (burn-in included) run r needed to reject, or None
    if it did not reject within ``budget``.
    """

    mechanism: str
    epsilon: float
    delta: float
    variant: str
    method: str
    runs: int
    budget: int
    alpha: float
    rejected_at: tuple[int | None, ...]
    seconds: float = field(default=0.0, compare=False)

    @property
    def rejections(self) -> int:
        return sum(r is not None for r in self.rejected_at)

    @property
    def rate(self) -> float:
        return self.rejections / self.runs

    @property
    def mean_pairs(self) -> float | None:
        """Mean pairs to reject over the rejecting runs (the paper's statistic), or None."""
        v = [r for r in self.rejected_at if r is not None]
        return float(np.mean(v)) if v else None

    @property
    def se_pairs(self) -> float | None:
        """Standard error of :attr:`mean_pairs` (None with fewer than 2 rejecting runs)."""
        v = [r for r in self.rejected_at if r is not None]
        return float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) >= 2 else None

    @property
    def median_pairs(self) -> float | None:
        v = [r for r in self.rejected_at if r is not None]
        return float(np.median(v)) if v else None

    @property
    def paper(self) -> tuple[float, float | None] | None:
        return PAPER_TABLE1.get((self.mechanism, self.epsilon))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rejected_at"] = list(self.rejected_at)
        d.update(rejections=self.rejections, rate=self.rate, mean_pairs=self.mean_pairs,
                 se_pairs=self.se_pairs, median_pairs=self.median_pairs)
        return d


def run_table1(
    epsilons: Sequence[float] = (0.01, 0.1),
    runs: int = 20,
    budget: int = 5000,
    alpha: float = 0.05,
    methods: Sequence[str] = tuple(EXPERIMENT_METHODS),
    variant: str = "dp_auditorium",
    seed: int = 0,
    progress: bool = True,
    *,
    mechanisms: Sequence[str] = mech.TABLE1_NAMES,
    batch: int = 50,
) -> list[Table1Row]:
    """Run the paper's Table-1 protocol; one :class:`Table1Row` per (mechanism, eps, method).

    For each mechanism and epsilon, ``runs`` independent streams (seeded generators derived from
    ``seed``, the mechanism, epsilon and the run index) of at most ``budget`` pairs are drawn in
    batches of ``batch`` pairs; every method (by default every one of
    :data:`~dpaudit_torch.experiments.common.EXPERIMENT_METHODS`) tests the mechanism's claimed
    null (eps, delta) on the same stream and stops at its first rejection. Gaussian-noise
    mechanisms claim delta = 1e-5, Laplace-noise ones delta = 0. The number of pairs to reject
    counts the burn-in and is exact whatever the batch size (testers report the pair at which
    they crossed).
    """
    eps_grid = [float(e) for e in check_epsilons(epsilons)]
    runs = check_positive_int(runs, "runs")
    budget = check_positive_int(budget, "budget")
    batch = check_positive_int(batch, "batch")
    alpha = check_alpha(alpha)
    methods = check_methods(methods)
    if variant not in mech.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(mech.VARIANTS)}")
    names = list(mechanisms)
    for n in names:
        if n not in mech.TABLE1_NAMES:
            raise ValueError(f"unknown Table-1 mechanism {n!r}; choose from "
                             f"{list(mech.TABLE1_NAMES)}")
    bar = progress_bar(len(names) * len(eps_grid) * runs, progress, "table1")
    rows: list[Table1Row] = []
    try:
        for name in names:
            for eps in eps_grid:
                m = mech.get(name, epsilon=eps, variant=variant)
                testers = [make_tester(meth, m.epsilon, m.delta, alpha) for meth in methods]
                hits: list[list[int | None]] = [[] for _ in methods]
                secs = 0.0
                if bar is not None:
                    bar.set_postfix_str(f"{name} eps={eps:g}")
                for r in range(runs):
                    gen = torch.Generator().manual_seed(
                        run_seed(seed, mech.TABLE1_NAMES.index(name), round(eps * 1e6), r))
                    t0 = time.perf_counter()
                    res = feed(m, testers, budget, batch, gen, stop_at_rejection=True)
                    secs += time.perf_counter() - t0
                    for i, v in enumerate(res):
                        hits[i].append(v)
                    if bar is not None:
                        bar.update(1)
                for i, meth in enumerate(methods):
                    rows.append(Table1Row(name, eps, m.delta, variant, meth, runs, budget, alpha,
                                          tuple(hits[i]), secs / len(methods)))
                logger.info("table1 %s eps=%g: %s", name, eps,
                            {meth: (rows[-len(methods) + i].rate,
                                    rows[-len(methods) + i].mean_pairs)
                             for i, meth in enumerate(methods)})
    finally:
        if bar is not None:
            bar.close()
    return rows


def _fmt_cell(rate: float, mean: float | None) -> str:
    return f"{rate:.2f} / {'-' if mean is None else f'{mean:.0f}'}"


def format_table1(rows: Iterable[Table1Row]) -> str:
    """Markdown table: one line per (mechanism, eps); "rate / mean pairs" per method, beside the
    paper's numbers (and Kutta et al.'s where published)."""
    rows = list(rows)
    if not rows:
        return "(no rows)"
    methods: list[str] = []
    for r in rows:
        if r.method not in methods:
            methods.append(r.method)
    cells: dict[tuple[str, float], dict[str, Table1Row]] = {}
    for r in rows:
        cells.setdefault((r.mechanism, r.epsilon), {})[r.method] = r
    head = ["mechanism", "eps", "paper (MMD R=1/2)"] + [method_label(m) for m in methods]
    head.append("Kutta et al.")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (name, eps), by in cells.items():
        paper = PAPER_TABLE1.get((name, eps))
        line = [name, f"{eps:g}", "n/a" if paper is None else _fmt_cell(*paper)]
        for m in methods:
            line.append(_fmt_cell(by[m].rate, by[m].mean_pairs) if m in by else "")
        k = KUTTA_TABLE1.get((name, eps))
        line.append("-" if k is None else f"{k:.0f}")
        lines.append("| " + " | ".join(line) + " |")
    any_row = rows[0]
    lines.append("")
    lines.append(
        f"Each cell: rejection rate / mean pairs to reject (burn-in included, over rejecting "
        f"runs); {any_row.runs} runs per cell, budget {any_row.budget} pairs, alpha "
        f"{any_row.alpha:g}, variant `{any_row.variant}`."
    )
    return "\n".join(lines)


def format_table1_detail(rows: Iterable[Table1Row]) -> str:
    """Markdown: per cell and method, rejections, mean pairs +- standard error, median."""
    lines = ["| mechanism | eps | method | rejections | mean pairs +- SE | median pairs |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r.mean_pairs is None:
            mean = "-"
        else:
            se = r.se_pairs
            mean = f"{r.mean_pairs:.0f}" + ("" if se is None else f" +- {se:.0f}")
        med = "-" if r.median_pairs is None else f"{r.median_pairs:.0f}"
        lines.append(f"| {r.mechanism} | {r.epsilon:g} | {method_label(r.method)}"
                     f" | {r.rejections} / {r.runs} | {mean} | {med} |")
    return "\n".join(lines)


def _check(check: str, cell: str, measured: float | None, target: float, ratio: float | None,
           rate: float, passed: bool) -> dict[str, Any]:
    return dict(check=check, cell=cell, measured=measured, target=target, ratio=ratio,
                rate=rate, passed=bool(passed))


def table1_checks(rows: Iterable[Table1Row],
                  goal_rows: Iterable[Table1Row] | None = None) -> list[dict[str, Any]]:
    """The acceptance checks of a Table-1 run (the paper's numbers reproduced, and the targets
    beyond them), one dict per check.

    Which checks a row gets is read from its method's
    :class:`~dpaudit_torch.experiments.common.ExperimentMethod` entry:

    * ``paper_config`` (MMD R=1/2): within 25% of the paper's mean pairs on each cell the paper
      rejects at rate >= 0.85, within 0.2 of its rejection rate elsewhere;
    * ``pairs_target`` (MMD R=1: 0.7): at most that fraction of the paper's mean pairs on the
      cells the paper rejects at >= 0.85; with ``detects_all`` (hockey-stick: 0.25) on every
      NonDP cell instead, and at rejection rate 1.0;
    * ``library_default`` -- goal (not a requirement): fewer mean pairs than Kutta et al. where
      they published. With ``goal_rows`` (e.g. :func:`run_kutta_cells`' many-seed rows) the goal
      is judged on those rows instead, for the methods and cells they contain, and demands the
      mean plus two standard errors below Kutta et al.'s mean (a 20-run mean is too noisy).

    Rows of methods that are not registered get no checks.
    """
    goals = {(g.mechanism, g.epsilon, g.method): g for g in (goal_rows or ())}
    out: list[dict[str, Any]] = []
    for r in rows:
        paper = r.paper
        meth = EXPERIMENT_METHODS.get(r.method)
        if paper is None or meth is None:
            continue
        p_rate, p_mean = paper
        name = f"{r.mechanism} eps={r.epsilon:g}"
        mean = r.mean_pairs
        if meth.paper_config:
            if p_rate >= _RELIABLE_RATE and p_mean is not None:
                ok = mean is not None and abs(mean / p_mean - 1.0) <= _REPRODUCE_PAIRS
                out.append(_check(f"{meth.label} mean pairs within "
                                  f"{_REPRODUCE_PAIRS * 100:g}% of paper", name, mean, p_mean,
                                  None if mean is None else mean / p_mean, r.rate, ok))
            else:
                ok = abs(r.rate - p_rate) <= _REPRODUCE_RATE
                out.append(_check(f"{meth.label} rejection rate within {_REPRODUCE_RATE:g} of "
                                  f"paper", name, r.rate, p_rate, None, r.rate, ok))
        elif meth.pairs_target is not None:
            target = meth.pairs_target
            if meth.detects_all:
                if r.mechanism.startswith("NonDP") and p_mean:
                    ratio = None if mean is None else mean / p_mean
                    ok = r.rate == 1.0 and ratio is not None and ratio <= target
                    out.append(_check(f"{meth.label} rate 1.0 and mean pairs <= {target:g}x "
                                      f"paper", name, mean, target * p_mean, ratio, r.rate, ok))
            elif p_rate >= _RELIABLE_RATE and p_mean is not None:
                ratio = None if mean is None else mean / p_mean
                out.append(_check(f"{meth.label} mean pairs <= {target:g}x paper", name, mean,
                                  target * p_mean, ratio, r.rate,
                                  ratio is not None and ratio <= target))
        k = KUTTA_TABLE1.get((r.mechanism, r.epsilon))
        if k is not None and meth.library_default:
            g = goals.get((r.mechanism, r.epsilon, r.method))
            if g is None:
                ok = mean is not None and r.rate == 1.0 and mean < k
                out.append(_check(f"goal: {meth.label} fewer pairs than Kutta et al.", name,
                                  mean, k, None if mean is None else mean / k, r.rate, ok))
            else:
                gm, se = g.mean_pairs, g.se_pairs
                ok = gm is not None and se is not None and g.rate == 1.0 and gm + 2 * se < k
                out.append(_check(f"goal: {meth.label} fewer pairs than Kutta et al. ({g.runs} "
                                  f"runs, mean + 2 SE)", name, gm, k,
                                  None if gm is None else gm / k, g.rate, ok))
    return out


def format_table1_checks(checks: Iterable[dict[str, Any]]) -> str:
    """Markdown table of :func:`table1_checks`' output, one line per check."""
    lines = ["| check | cell | measured | target | ratio | rate | pass |",
             "|---|---|---|---|---|---|---|"]

    def f(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    for c in checks:
        lines.append(f"| {c['check']} | {c['cell']} | {f(c['measured'])} | {f(c['target'])} | "
                     f"{f(c['ratio'])} | {c['rate']:.2f} | {'yes' if c['passed'] else 'NO'} |")
    return "\n".join(lines)



def run_kutta_cells(runs: int = 200, budget: int = 5000, alpha: float = 0.05,
                    methods: Sequence[str] = ("hockey_stick",), variant: str = "dp_auditorium",
                    seed: int = 0, progress: bool = True, *, batch: int = 50
                    ) -> list[Table1Row]:
    """The Table-1 protocol on the cells where Kutta et al. (arXiv 2602.06518) published mean
    pairs, with many runs (default 200), so that a comparison with their numbers is not lost in
    the noise of a 20-run mean (its standard error is about 5-10% of it). Runs 0..runs-1 use the
    seeds of :func:`run_table1` (the first 20 are its runs)."""
    rows: list[Table1Row] = []
    for name, eps in KUTTA_TABLE1:
        rows += run_table1((eps,), runs, budget, alpha, methods, variant, seed, progress,
                           mechanisms=(name,), batch=batch)
    return rows


def format_kutta_cells(rows: Iterable[Table1Row]) -> str:
    """Markdown: per Kutta cell and method, runs, rejection rate, mean pairs +- standard error
    beside Kutta et al.'s mean, and whether the mean plus two standard errors is below it."""
    lines = ["| mechanism | eps | method | runs | rate | mean pairs +- SE (many runs) | median |"
             " Kutta et al. | fewer (mean + 2 SE < Kutta) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        k = KUTTA_TABLE1.get((r.mechanism, r.epsilon))
        mean, se = r.mean_pairs, r.se_pairs
        cell = "-" if mean is None else f"{mean:.1f}" + ("" if se is None else f" +- {se:.1f}")
        med = "-" if r.median_pairs is None else f"{r.median_pairs:.0f}"
        fewer = ("-" if k is None or mean is None or se is None
                 else ("yes" if r.rate == 1.0 and mean + 2 * se < k else "no"))
        lines.append(f"| {r.mechanism} | {r.epsilon:g} | {method_label(r.method)} | {r.runs} | "
                     f"{r.rate:.2f} | {cell} | {med} | {'-' if k is None else f'{k:.0f}'} | "
                     f"{fewer} |")
    return "\n".join(lines)
