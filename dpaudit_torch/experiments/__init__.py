"""Reusable experiment runners: Table 1 of Gonzalez et al. (2025) and type-I error simulations.

Used by ``benchmarks/table1.py``, ``benchmarks/type1.py``, the ``dpaudit table1`` command and the
test suite. Everything here is black-box: it samples pairs from the reference mechanisms of
:mod:`dpaudit_torch.mechanisms` (docs/design.md section 7) and feeds them, in batches processed
in order, to the sequential testers of :mod:`dpaudit_torch.stats` (docs/design.md sections 2
and 3), built from :data:`dpaudit_torch.registry.TESTERS`.

* :mod:`.common` -- the registry of experiment methods (:data:`EXPERIMENT_METHODS`: a registered
  tester in one configuration, under the key the tables print), seeding, the feeding loop,
  Clopper-Pearson intervals.
* :mod:`.table1` -- :func:`run_table1`, the paper's protocol (Gonzalez, Dulce-Rubio, Ramdas &
  Ribero, "Sequentially auditing differential privacy", NeurIPS 2025, arXiv 2509.07055,
  Table 1): level alpha = 0.05, 20 runs per cell, a budget of 5000 pairs, a run stops at its
  first rejection; the rejection rate and the mean number of pairs to reject (burn-in included,
  over the rejecting runs) per cell. Within one run every method sees the *same* stream of pairs
  (common random numbers), so the comparison between methods is paired.
* :mod:`.type1` -- :func:`run_type1`, false-rejection rates on truly DP mechanisms (exact
  Gaussian at points of its own privacy profile, exact Laplace, the ``clipped`` DP rows of
  Table 1), with exact Clopper-Pearson intervals (Clopper & Pearson, Biometrika 1934).
"""

from __future__ import annotations

from .common import (
    EXPERIMENT_METHODS,
    LIBRARY_DEFAULT_METHODS,
    METHOD_LABELS,
    METHODS,
    ExperimentMethod,
    TesterFactory,
    clopper_pearson,
    experiment_method,
    make_tester,
    run_seed,
)
from .table1 import (
    KUTTA_TABLE1,
    PAPER_TABLE1,
    Table1Row,
    format_kutta_cells,
    format_table1,
    format_table1_checks,
    format_table1_detail,
    run_kutta_cells,
    run_table1,
    table1_checks,
)

# the type-I worker, imported by benchmarks/type1.py for its run-time estimate
from .type1 import (
    NullCase,
    Type1Row,
    default_type1_cases,
    format_type1,
    run_type1,
    type1_chunk,
)

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
    "format_kutta_cells",
    "run_kutta_cells",
    "format_table1_detail",
    "table1_checks",
    "format_table1_checks",
    "default_type1_cases",
    "run_type1",
    "format_type1",
    "type1_chunk",
    "clopper_pearson",
    "run_seed",
    "ExperimentMethod",
    "EXPERIMENT_METHODS",
    "LIBRARY_DEFAULT_METHODS",
    "TesterFactory",
    "experiment_method",
]
