"""Type-I error simulations: false-rejection rates of the sequential testers on truly DP
mechanisms.

The cases: the exact Gaussian mechanism at points of its own privacy profile, the exact Laplace
mechanism, and the ``clipped`` DP rows of Table 1 (reference mechanisms: docs/design.md
section 7). A run is a false rejection if the tester's decision fires anywhere within its pairs,
the probability that Ville's inequality bounds by alpha (docs/design.md section 1). Rates come
with exact Clopper-Pearson intervals (Clopper & Pearson, Biometrika 1934).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import mechanisms as mech
from .._validation import check_alpha, check_positive_int
from ..stats.thresholds import gaussian_profile_grid
from . import common
from .common import LIBRARY_DEFAULT_METHODS, clopper_pearson

logger = logging.getLogger(__name__)

__all__ = [
    "NullCase",
    "Type1Row",
    "default_type1_cases",
    "run_type1",
    "format_type1",
]

#: the modules whose source determines a type-I result (testers, betting, mechanisms); their
#: bytes key the blocks of a ``run_type1`` cache
_FINGERPRINT_MODULES = (
    "dpaudit_torch.stats.base",
    "dpaudit_torch.stats.betting",
    "dpaudit_torch.stats.mmd",
    "dpaudit_torch.stats.hockey_stick",
    "dpaudit_torch.stats.thresholds",
    "dpaudit_torch.mechanisms",
)


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
      16-point profile grid eps in [0.05, 4] as one combined test (average of e-processes,
      docs/design.md section 1);
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


def type1_chunk(args: tuple[Any, ...]) -> tuple[int, list[int], float]:
    """Worker: runs [start, stop) of one case; returns (case index, rejections per method, s)."""
    ci, case, methods, start, stop, pairs, alpha, seed, batch = args
    torch.set_num_threads(1)
    testers = [common.make_tester(m, list(case.epsilons), list(case.deltas), alpha)
               for m in methods]
    counts = [0] * len(methods)
    t0 = time.perf_counter()
    for r in range(start, stop):
        gen = torch.Generator().manual_seed(common.run_seed(seed, 7919, ci, r))
        res = common.feed(case.mechanism, testers, pairs, batch, gen, stop_at_rejection=True)
        for i, v in enumerate(res):
            counts[i] += v is not None
    return ci, counts, time.perf_counter() - t0


def _module_bytes(name: str) -> bytes:
    """The source of module ``name`` (b"" if it cannot be found), without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return b""
    if spec is None or not spec.origin:
        return b""
    f = Path(spec.origin)
    return f.read_bytes() if f.exists() else b""


def _code_fingerprint() -> str:
    """Hash of the sources that determine a type-I result (testers, betting, mechanisms)."""
    h = hashlib.sha1()
    for name in _FINGERPRINT_MODULES:
        h.update(_module_bytes(name))
    return h.hexdigest()[:16]


def run_type1(
    cases: Sequence[NullCase] | None = None,
    methods: Sequence[str] = LIBRARY_DEFAULT_METHODS,
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
    by alpha). By default the methods are the configurations the auditor runs
    (:data:`~dpaudit_torch.experiments.common.LIBRARY_DEFAULT_METHODS`). Each run has its own
    seeded generator (derived from ``seed``, the case index and the run index), shared by the
    methods. Runs are processed in blocks of ``chunk_runs``, all cases' first blocks before any
    second block; ``workers`` > 1 spreads the blocks over processes. Results depend on neither.
    With ``cache`` (a JSON-lines file) every finished block is recorded with its configuration
    and a hash of the testers' source code, and blocks already recorded are reused, so a long
    benchmark can be resumed or extended.
    """
    cases = list(default_type1_cases() if cases is None else cases)
    if not cases:
        raise ValueError("cases must not be empty")
    methods = common.check_methods(methods)
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
    bar = common.progress_bar(runs * len(cases), progress, "type1")

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
                book(type1_chunk(job), job, fresh=True)
        elif todo:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            ctx = mp.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
                futs = [(ex.submit(type1_chunk, job), job) for job in todo]
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
    """Markdown table of :func:`run_type1`'s rows with 95% Clopper-Pearson intervals."""
    lines = ["| case | method | runs | pairs/run | false rejections | rate | 95% CI | <= alpha |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r.ci
        lines.append(f"| {r.case} | {common.method_label(r.method)} | {r.runs} | "
                     f"{r.pairs} | {r.rejections} | {r.rate:.4f} | [{lo:.4f}, {hi:.4f}] | "
                     f"{'yes' if r.passed else 'NO'} |")
    return "\n".join(lines)
