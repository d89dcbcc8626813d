"""Reusable experiment runners: Table 1 of Gonzalez et al. (2025) and type-I error simulations.

Used by ``benchmarks/table1.py``, ``benchmarks/type1.py``, the ``dpaudit table1`` command and the
test suite. Everything here is black-box: it samples pairs from the reference mechanisms of
:mod:`dpaudit_torch.mechanisms` (ALGORITHMS.md section 7) and feeds them, in batches processed in
order, to the sequential testers of :mod:`dpaudit_torch.stats`.

* :func:`run_table1` -- the paper's protocol (Gonzalez, Dulce-Rubio, Ramdas & Ribero, "Sequentially
  auditing differential privacy", NeurIPS 2025, arXiv 2509.07055, Table 1): level alpha = 0.05,
  20 runs per cell, a budget of 5000 pairs, a run stops at its first rejection; the rejection rate
  and the mean number of pairs to reject (burn-in included, over the rejecting runs) per cell.
  Within one run every method sees the *same* stream of pairs (common random numbers), so the
  comparison between methods is paired. Each run has its own seeded ``torch.Generator``.
* :func:`run_type1` -- false-rejection rates on truly DP mechanisms (exact Gaussian at points of
  its own privacy profile, exact Laplace, the ``clipped`` DP rows of Table 1), with exact
  Clopper-Pearson intervals (Clopper & Pearson, Biometrika 1934).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats as sps

from . import mechanisms as mech
from ._validation import check_alpha, check_epsilons, check_positive_int
from .stats.base import SequentialTest
from .stats.thresholds import gaussian_profile_grid

logger = logging.getLogger(__name__)

__all__ = [
    "METHODS",
    "METHOD_LABELS",
    "PAPER_TABLE1",
    "KUTTA_TABLE1",
    "NullCase",
    "Table1Row",
    "Type1Row",
    "make_tester",
    "run_table1",
    "format_table1",
    "format_table1_detail",
    "table1_checks",
    "format_table1_checks",
    "default_type1_cases",
    "run_type1",
    "format_type1",
    "clopper_pearson",
    "run_seed",
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

TesterFactory = Callable[..., SequentialTest]


def _mmd(radius: float) -> TesterFactory:
    def make(epsilons: Any, delta: Any, alpha: float) -> SequentialTest:
        from .stats.mmd import SequentialMMDTest

        return SequentialMMDTest(epsilons, delta, alpha, witness_radius=radius)

    return make


def _hockey_stick(epsilons: Any, delta: Any, alpha: float) -> SequentialTest:
    from .stats.hockey_stick import HockeyStickTest

    return HockeyStickTest(epsilons, delta, alpha)


#: method name -> factory(epsilons, delta, alpha) with the library defaults otherwise
METHODS: dict[str, TesterFactory] = {
    "mmd_r0.5": _mmd(0.5),
    "mmd_r1": _mmd(1.0),
    "hockey_stick": _hockey_stick,
}

METHOD_LABELS: dict[str, str] = {
    "mmd_r0.5": "MMD R=1/2",
    "mmd_r1": "MMD R=1",
    "hockey_stick": "hockey-stick",
}


def make_tester(method: str, epsilons: Any, delta: Any, alpha: float) -> SequentialTest:
    """Build the tester ``method`` (a key of :data:`METHODS`) for the null (epsilons, delta)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {sorted(METHODS)}")
    return METHODS[method](epsilons, delta, alpha)


def run_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one run, derived from (seed, *keys) by numpy's SeedSequence hashing,
    so that runs, cells and experiments get independent streams."""
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *[int(k) for k in keys]])
    a, b = words.generate_state(2, dtype=np.uint32)
    return int((int(a) << 31) ^ int(b)) & ((1 << 63) - 1)


def _check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    if isinstance(methods, str):
        methods = (methods,)
    methods = tuple(methods)
    if not methods:
        raise ValueError("methods must not be empty")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {sorted(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must be distinct, got {methods!r}")
    return methods


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True)


def _feed(
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


# ------------------------------------------------------------------------------- Table 1
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
    methods: Sequence[str] = ("mmd_r0.5", "mmd_r1", "hockey_stick"),
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
    batches of ``batch`` pairs; every method tests the mechanism's claimed null (eps, delta) on
    the same stream and stops at its first rejection. Gaussian-noise mechanisms claim
    delta = 1e-5, Laplace-noise ones delta = 0. The number of pairs to reject counts the
    burn-in and is exact whatever the batch size (testers report the pair at which they crossed).
    """
    eps_grid = [float(e) for e in check_epsilons(epsilons)]
    runs = check_positive_int(runs, "runs")
    budget = check_positive_int(budget, "budget")
    batch = check_positive_int(batch, "batch")
    alpha = check_alpha(alpha)
    methods = _check_methods(methods)
    if variant not in mech.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(mech.VARIANTS)}")
    names = list(mechanisms)
    for n in names:
        if n not in mech.TABLE1_NAMES:
            raise ValueError(f"unknown Table-1 mechanism {n!r}; choose from "
                             f"{list(mech.TABLE1_NAMES)}")
    bar = _progress(len(names) * len(eps_grid) * runs, progress, "table1")
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
                    res = _feed(m, testers, budget, batch, gen, stop_at_rejection=True)
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
    head = ["mechanism", "eps", "paper (MMD R=1/2)"] + [METHOD_LABELS.get(m, m) for m in methods]
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
        lines.append(f"| {r.mechanism} | {r.epsilon:g} | {METHOD_LABELS.get(r.method, r.method)}"
                     f" | {r.rejections} / {r.runs} | {mean} | {med} |")
    return "\n".join(lines)


def table1_checks(rows: Iterable[Table1Row]) -> list[dict[str, Any]]:
    """The "Done means" checks of issue 2 on a Table-1 run, one dict per check.

    * MMD R=1/2: within 25% of the paper's mean pairs on each cell the paper rejects at rate
      >= 0.85, within 0.2 of its rejection rate elsewhere;
    * MMD R=1: at most 0.7x the paper's mean pairs on the cells the paper rejects at >= 0.85;
    * hockey-stick: every NonDP cell rejected at rate 1.0 with at most 0.25x the paper's pairs;
    * goal (not a requirement): fewer mean pairs than Kutta et al. where they published.
    """
    out: list[dict[str, Any]] = []
    for r in rows:
        paper = r.paper
        if paper is None:
            continue
        p_rate, p_mean = paper
        name = f"{r.mechanism} eps={r.epsilon:g}"
        if r.method == "mmd_r0.5":
            if p_rate >= 0.85 and p_mean is not None:
                ok = r.mean_pairs is not None and abs(r.mean_pairs / p_mean - 1.0) <= 0.25
                out.append(dict(check="MMD R=1/2 mean pairs within 25% of paper", cell=name,
                                measured=r.mean_pairs, target=p_mean,
                                ratio=None if r.mean_pairs is None else r.mean_pairs / p_mean,
                                rate=r.rate, passed=bool(ok)))
            else:
                ok = abs(r.rate - p_rate) <= 0.2
                out.append(dict(check="MMD R=1/2 rejection rate within 0.2 of paper", cell=name,
                                measured=r.rate, target=p_rate, ratio=None, rate=r.rate,
                                passed=bool(ok)))
        elif r.method == "mmd_r1" and p_rate >= 0.85 and p_mean is not None:
            ratio = None if r.mean_pairs is None else r.mean_pairs / p_mean
            out.append(dict(check="MMD R=1 mean pairs <= 0.7x paper", cell=name,
                            measured=r.mean_pairs, target=0.7 * p_mean, ratio=ratio,
                            rate=r.rate, passed=ratio is not None and ratio <= 0.7))
        elif r.method == "hockey_stick" and r.mechanism.startswith("NonDP") and p_mean:
            ratio = None if r.mean_pairs is None else r.mean_pairs / p_mean
            ok = r.rate == 1.0 and ratio is not None and ratio <= 0.25
            out.append(dict(check="hockey-stick rate 1.0 and mean pairs <= 0.25x paper",
                            cell=name, measured=r.mean_pairs, target=0.25 * p_mean, ratio=ratio,
                            rate=r.rate, passed=bool(ok)))
        k = KUTTA_TABLE1.get((r.mechanism, r.epsilon))
        if k is not None and r.method in ("mmd_r1", "hockey_stick"):
            ok = r.mean_pairs is not None and r.rate == 1.0 and r.mean_pairs < k
            out.append(dict(check=f"goal: {METHOD_LABELS[r.method]} fewer pairs than Kutta et al.",
                            cell=name, measured=r.mean_pairs, target=k,
                            ratio=None if r.mean_pairs is None else r.mean_pairs / k,
                            rate=r.rate, passed=bool(ok)))
    return out


def format_table1_checks(checks: Iterable[dict[str, Any]]) -> str:
    lines = ["| check | cell | measured | target | ratio | rate | pass |",
             "|---|---|---|---|---|---|---|"]
    for c in checks:
        def f(v: Any) -> str:
            if v is None:
                return "-"
            return f"{v:.3g}" if isinstance(v, float) else str(v)

        lines.append(f"| {c['check']} | {c['cell']} | {f(c['measured'])} | {f(c['target'])} | "
                     f"{f(c['ratio'])} | {c['rate']:.2f} | {'yes' if c['passed'] else 'NO'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- type I
@dataclass(frozen=True)
class NullCase:
    """A truly DP mechanism and a null (epsilons, deltas) it satisfies at every grid point."""

    label: str
    mechanism: mech.Mechanism
    epsilons: tuple[float, ...]
    deltas: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.epsilons) != len(self.deltas) or not self.epsilons:
            raise ValueError(f"{self.label}: epsilons and deltas must be non-empty and of equal "
                             f"length, got {self.epsilons!r} and {self.deltas!r}")


def default_type1_cases() -> list[NullCase]:
    """Every truly DP mechanism of the project, each tested at a null it satisfies:

    * the ``clipped`` DP rows of Table 1 (DPGaussian at its claimed (eps, 1e-5), DPLaplace at
      (eps, 0)), eps in {0.01, 0.1};
    * the exact Gaussian mechanism, sigma = 1, at points of its own privacy profile
      (eps, delta_sigma(eps)), eps in {0.5, 1, 2} (tight nulls: no slack at all), and at the full
      16-point profile grid eps in [0.05, 4] as one combined test (average of e-processes);
    * the exact Laplace mechanism (scale 1 / eps) at (eps, 0), eps in {0.1, 1}.
    """
    cases: list[NullCase] = []
    for name in ("DPGaussian", "DPLaplace"):
        for eps in (0.01, 0.1):
            m = mech.get(name, epsilon=eps, variant="clipped")
            cases.append(NullCase(f"{name} clipped eps={eps:g}", m, (m.epsilon,), (m.delta,)))
    for eps in (0.5, 1.0, 2.0):
        m = mech.get("Gaussian", epsilon=eps, sigma=1.0)
        cases.append(NullCase(f"Gaussian sigma=1 at (eps={eps:g}, delta_sigma={m.delta:.3g})",
                              m, (m.epsilon,), (m.delta,)))
    grid = np.geomspace(0.05, 4.0, 16)
    deltas = gaussian_profile_grid(1.0, grid)
    m = mech.get("Gaussian", epsilon=float(grid[0]), sigma=1.0)
    cases.append(NullCase("Gaussian sigma=1, 16-point profile grid eps in [0.05, 4]", m,
                          tuple(float(e) for e in grid), tuple(float(d) for d in deltas)))
    for eps in (0.1, 1.0):
        m = mech.get("Laplace", epsilon=eps)
        cases.append(NullCase(f"Laplace scale=1/eps at (eps={eps:g}, 0)", m, (m.epsilon,),
                              (m.delta,)))
    for c in cases:
        if not c.mechanism.is_dp:  # pragma: no cover - guards the definitions above
            raise RuntimeError(f"type-I case {c.label} is not DP")
    return cases


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval for a binomial proportion k / n."""
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(sps.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class Type1Row:
    """False rejections of one method on one truly DP case."""

    case: str
    description: str
    method: str
    runs: int
    pairs: int
    alpha: float
    rejections: int
    seconds: float = field(default=0.0, compare=False)
    grid_size: int = 1

    @property
    def rate(self) -> float:
        return self.rejections / self.runs

    @property
    def ci(self) -> tuple[float, float]:
        return clopper_pearson(self.rejections, self.runs)

    @property
    def passed(self) -> bool:
        """At or below alpha within the 95% interval (the interval's lower end <= alpha)."""
        return self.ci[0] <= self.alpha

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(rate=self.rate, ci=list(self.ci), passed=self.passed)
        return d


def _type1_chunk(args: tuple[Any, ...]) -> tuple[int, list[int], float]:
    """Worker: runs [start, stop) of one case; returns (case index, rejections per method, s)."""
    ci, case, methods, start, stop, pairs, alpha, seed, batch = args
    torch.set_num_threads(1)
    testers = [make_tester(m, list(case.epsilons), list(case.deltas), alpha) for m in methods]
    counts = [0] * len(methods)
    t0 = time.perf_counter()
    for r in range(start, stop):
        gen = torch.Generator().manual_seed(run_seed(seed, 7919, ci, r))
        res = _feed(case.mechanism, testers, pairs, batch, gen, stop_at_rejection=True)
        for i, v in enumerate(res):
            counts[i] += v is not None
    return ci, counts, time.perf_counter() - t0


def _code_fingerprint() -> str:
    """Hash of the sources that determine a type-I result (testers, betting, mechanisms)."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parent
    h = hashlib.sha1()
    for rel in ("stats/base.py", "stats/betting.py", "stats/mmd.py", "stats/hockey_stick.py",
                "stats/thresholds.py", "mechanisms.py"):
        f = root / rel
        h.update(f.read_bytes() if f.exists() else b"")
    return h.hexdigest()[:16]


def run_type1(
    cases: Sequence[NullCase] | None = None,
    methods: Sequence[str] = ("mmd_r1", "hockey_stick"),
    runs: int = 1000,
    pairs: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
    progress: bool = True,
    *,
    batch: int = 500,
    workers: int = 1,
    chunk_runs: int = 50,
    cache: str | None = None,
) -> list[Type1Row]:
    """False-rejection rate of each method on each truly DP case over ``runs`` streams.

    A run counts as a false rejection if the method's combined decision (``rejected``) fires
    at any point within ``pairs`` pairs (the anytime guarantee bounds exactly this probability
    by alpha). Each run has its own seeded generator (derived from ``seed``, the case index and
    the run index), shared by the methods. Runs are processed in blocks of ``chunk_runs``,
    all cases' first blocks before any second block; ``workers`` > 1 spreads the blocks over
    processes. Results depend on neither. With ``cache`` (a JSON-lines file) every finished
    block is recorded with its configuration and a hash of the testers' source code, and
    blocks already recorded are reused, so a long benchmark can be resumed or extended.
    """
    cases = list(default_type1_cases() if cases is None else cases)
    if not cases:
        raise ValueError("cases must not be empty")
    methods = _check_methods(methods)
    runs = check_positive_int(runs, "runs")
    pairs = check_positive_int(pairs, "pairs")
    batch = check_positive_int(batch, "batch")
    workers = check_positive_int(workers, "workers")
    chunk_runs = check_positive_int(chunk_runs, "chunk_runs")
    alpha = check_alpha(alpha)
    starts = list(range(0, runs, chunk_runs))
    jobs = [(ci, case, methods, st, min(runs, st + chunk_runs), pairs, alpha, seed, batch)
            for st in starts for ci, case in enumerate(cases)]
    code = _code_fingerprint()

    def key(job: tuple[Any, ...]) -> str:
        ci, case, meths, st, sp, pr, al, sd, bt = job
        return json.dumps([code, ci, case.label, list(case.epsilons), list(case.deltas),
                           list(meths), st, sp, pr, al, sd, bt])

    done: dict[str, tuple[list[int], float]] = {}
    if cache is not None and os.path.exists(cache):
        with open(cache) as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    done[rec["key"]] = (rec["counts"], rec["seconds"])
    counts = [[0] * len(methods) for _ in cases]
    secs = [0.0] * len(cases)
    bar = _progress(runs * len(cases), progress, "type1")

    def book(res: tuple[int, list[int], float], job: tuple[Any, ...], fresh: bool) -> None:
        ci, c, s = res
        for i, v in enumerate(c):
            counts[ci][i] += v
        secs[ci] += s
        if fresh and cache is not None:
            with open(cache, "a") as fh:
                fh.write(json.dumps({"key": key(job), "counts": c, "seconds": s}) + "\n")
        if bar is not None:
            bar.update(job[4] - job[3])

    todo = []
    for job in jobs:
        k = key(job)
        if k in done:
            book((job[0], *done[k]), job, fresh=False)
        else:
            todo.append(job)
    if len(todo) < len(jobs):
        logger.info("run_type1: %d of %d blocks reused from %s", len(jobs) - len(todo),
                    len(jobs), cache)
    try:
        if workers == 1:
            for job in todo:
                book(_type1_chunk(job), job, fresh=True)
        elif todo:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
                futs = [(ex.submit(_type1_chunk, job), job) for job in todo]
                for fut, job in futs:
                    book(fut.result(), job, fresh=True)
    finally:
        if bar is not None:
            bar.close()
    rows = []
    for ci, case in enumerate(cases):
        for i, meth in enumerate(methods):
            rows.append(Type1Row(case.label, case.mechanism.description, meth, runs, pairs,
                                 alpha, counts[ci][i], secs[ci] / len(methods),
                                 len(case.epsilons)))
    return rows


def format_type1(rows: Iterable[Type1Row]) -> str:
    lines = ["| case | method | runs | pairs/run | false rejections | rate | 95% CI | <= alpha |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r.ci
        lines.append(f"| {r.case} | {METHOD_LABELS.get(r.method, r.method)} | {r.runs} | "
                     f"{r.pairs} | {r.rejections} | {r.rate:.4f} | [{lo:.4f}, {hi:.4f}] | "
                     f"{'yes' if r.passed else 'NO'} |")
    return "\n".join(lines)
