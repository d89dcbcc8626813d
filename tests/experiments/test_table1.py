"""Tests of dpaudit_torch/experiments/table1.py: the Table-1 protocol of Gonzalez, Dulce-Rubio,
Ramdas & Ribero (NeurIPS 2025), its formatting and its acceptance checks.

A tiny run of :func:`run_table1` (two runs of 200 pairs per cell, seconds): the shape of its rows,
determinism, common random numbers across methods, independence of the batch size; the
:class:`Table1Row` statistics by hand; the paper's numbers; the Markdown tables; the checks'
logic; bad input naming the value.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from dpaudit_torch import experiments as ex
from dpaudit_torch import mechanisms as mech
from dpaudit_torch.experiments import table1


def _small_table1(**kw: object) -> list[ex.Table1Row]:
    args = dict(epsilons=(0.01,), runs=2, budget=200, progress=False,
                mechanisms=("NonDPLaplace2", "DPGaussian"), seed=3)
    args.update(kw)
    return ex.run_table1(**args)  # type: ignore[arg-type]


def test_run_table1_structure_and_determinism() -> None:
    rows = _small_table1()
    assert [(r.mechanism, r.method) for r in rows] == [
        (n, m) for n in ("NonDPLaplace2", "DPGaussian")
        for m in ("mmd_r0.5", "mmd_r1", "hockey_stick")
    ]
    for r in rows:
        assert r.runs == 2 and r.budget == 200 and r.variant == "dp_auditorium"
        assert len(r.rejected_at) == 2
        assert r.delta == (1e-5 if "Gaussian" in r.mechanism else 0.0)
        for v in r.rejected_at:
            # a rejection needs at least one pair beyond the burn-in, and stays within budget
            assert v is None or 2 < v <= 200
        assert 0.0 <= r.rate <= 1.0
        d = r.to_dict()
        assert d["rate"] == r.rate and d["rejected_at"] == list(r.rejected_at)
    again = _small_table1()
    assert [r.rejected_at for r in rows] == [r.rejected_at for r in again]
    other = _small_table1(seed=4)
    assert [r.rejected_at for r in rows] != [r.rejected_at for r in other]


def test_methods_see_the_same_stream() -> None:
    """Common random numbers: a method's result does not depend on which others run with it."""
    both = _small_table1(methods=("mmd_r1", "hockey_stick"))
    alone = _small_table1(methods=("hockey_stick",))
    hs_both = [r.rejected_at for r in both if r.method == "hockey_stick"]
    assert hs_both == [r.rejected_at for r in alone]


def test_hockey_stick_detects_dp_auditorium_leak_quickly() -> None:
    """The dp_auditorium DP rows are not DP (atom at 0, delta ~ 1/2): caught within 200 pairs."""
    rows = ex.run_table1(epsilons=(0.1,), runs=3, budget=200, methods=("hockey_stick",),
                         mechanisms=("DPLaplace",), progress=False)
    assert rows[0].rate == 1.0


def test_format_table1_and_paper_numbers() -> None:
    rows = _small_table1()
    md = ex.format_table1(rows)
    assert "| NonDPLaplace2 | 0.01 | 1.00 / 192 |" in md
    assert "| DPGaussian | 0.01 | 0.00 / - |" in md
    assert "MMD R=1/2" in md and "hockey-stick" in md and "Kutta" in md
    assert ex.format_table1([]) == "(no rows)"
    assert len(ex.PAPER_TABLE1) == 12
    assert ex.KUTTA_TABLE1[("NonDPGaussian1", 0.01)] == 59.0


def _row(name: str, eps: float, method: str, hits: list[int | None]) -> ex.Table1Row:
    return ex.Table1Row(name, eps, 1e-5, "dp_auditorium", method, len(hits), 5000, 0.05,
                        tuple(hits))


def test_table1_checks_logic() -> None:
    rows = [
        _row("NonDPGaussian1", 0.01, "mmd_r0.5", [264 * 1.2] * 4),       # +20%: pass
        _row("NonDPGaussian1", 0.1, "mmd_r0.5", [562 * 1.3] * 4),        # +30%: fail
        _row("NonDPGaussian2", 0.1, "mmd_r0.5", [None] * 4),             # rate 0 vs 0.05: pass
        _row("DPGaussian", 0.01, "mmd_r0.5", [100, None, None, None]),   # 0.25 vs 0: fail
        _row("NonDPGaussian1", 0.01, "mmd_r1", [0.69 * 264] * 4),        # 0.69x: pass
        _row("NonDPLaplace1", 0.1, "mmd_r1", [None] * 4),                # no rejection: fail
        _row("NonDPGaussian1", 0.01, "hockey_stick", [50] * 4),          # 0.19x, beats Kutta
        _row("NonDPGaussian2", 0.1, "hockey_stick", [100, 100, None, 100]),  # rate < 1: fail
        _row("DPGaussian", 0.1, "hockey_stick", [30] * 4),               # not a NonDP row
    ]
    checks = ex.table1_checks(rows)
    by = {(c["check"], c["cell"]): c["passed"] for c in checks}
    assert by[("MMD R=1/2 mean pairs within 25% of paper", "NonDPGaussian1 eps=0.01")]
    assert not by[("MMD R=1/2 mean pairs within 25% of paper", "NonDPGaussian1 eps=0.1")]
    assert by[("MMD R=1/2 rejection rate within 0.2 of paper", "NonDPGaussian2 eps=0.1")]
    assert not by[("MMD R=1/2 rejection rate within 0.2 of paper", "DPGaussian eps=0.01")]
    assert by[("MMD R=1 mean pairs <= 0.7x paper", "NonDPGaussian1 eps=0.01")]
    assert not by[("MMD R=1 mean pairs <= 0.7x paper", "NonDPLaplace1 eps=0.1")]
    assert by[("hockey-stick rate 1.0 and mean pairs <= 0.25x paper", "NonDPGaussian1 eps=0.01")]
    assert not by[("hockey-stick rate 1.0 and mean pairs <= 0.25x paper",
                   "NonDPGaussian2 eps=0.1")]
    assert by[("goal: hockey-stick fewer pairs than Kutta et al.", "NonDPGaussian1 eps=0.01")]
    assert not by[("goal: MMD R=1 fewer pairs than Kutta et al.", "NonDPLaplace1 eps=0.1")]
    assert not any(c["cell"] == "DPGaussian eps=0.1" for c in checks)
    md = ex.format_table1_checks(checks)
    assert md.count("\n") == len(checks) + 1 and "NO" in md and "yes" in md


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"methods": ("mmd_r2",)}, "mmd_r2"),
        ({"methods": ()}, "empty"),
        ({"variant": "exact"}, "exact"),
        ({"mechanisms": ("Gaussian",)}, "Gaussian"),
        ({"runs": 0}, "0"),
        ({"budget": -5}, "-5"),
        ({"alpha": 1.5}, "1.5"),
        ({"epsilons": (0.1, -0.2)}, "-0.2"),
    ],
)
def test_run_table1_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ex.run_table1(progress=False, **kwargs)


def test_table1_checks_read_the_method_entry() -> None:
    """Checks follow the registry entry: an unregistered method gets none."""
    rows = [_row("NonDPGaussian1", 0.01, "somebody_else", [10] * 4)]
    assert ex.table1_checks(rows) == []
    entry = ex.EXPERIMENT_METHODS["hockey_stick"]
    assert entry.detects_all and entry.pairs_target == 0.25 and not entry.paper_config
    assert ex.EXPERIMENT_METHODS["mmd_r0.5"].paper_config


def test_package_reexports_the_module() -> None:
    for name in table1.__all__:
        assert getattr(ex, name) is getattr(table1, name)


class _Replay:
    """A Table-1 mechanism whose stream does not depend on how it is cut into batches: the pairs
    of a run are drawn at once (from the run's seed) and handed out in order.  (The mechanisms'
    own streams depend on the batch sizes they are drawn in.)"""

    def __init__(self, inner: mech.Mechanism, budget: int) -> None:
        self.inner, self.budget = inner, budget
        self.epsilon, self.delta = inner.epsilon, inner.delta
        self.streams: dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seed = generator.initial_seed()
        if seed not in self.streams:
            x, y = self.inner.sample(self.budget, generator=torch.Generator().manual_seed(seed))
            self.streams[seed] = (x, y, [0])
        x, y, pos = self.streams[seed]
        i = pos[0]
        pos[0] += n
        return x[i:i + n], y[i:i + n]


def test_pairs_to_reject_do_not_depend_on_the_batch_size(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # the testers report the pair at which they crossed: on the same stream of pairs, the count
    # is the same for every batch size (not rounded up to the end of a batch)
    real_get = mech.get
    monkeypatch.setattr(mech, "get", lambda *a, **k: _Replay(real_get(*a, **k), 200))
    rows = [_small_table1(batch=b, methods=("hockey_stick", "mmd_r1")) for b in (7, 50, 200)]
    hits = [[r.rejected_at for r in rs] for rs in rows]
    assert hits[0] == hits[1] == hits[2]
    found = [v for r in hits[0] for v in r if v is not None]
    assert found and any(v % 50 for v in found)  # some rejections, inside a batch of 50
    assert all(r.seconds >= 0.0 for r in rows[0])


def test_clipped_variant_and_default_methods() -> None:
    rows = ex.run_table1(epsilons=(0.1,), runs=1, budget=100, variant="clipped",
                         mechanisms=("DPLaplace",), progress=False)
    assert [r.method for r in rows] == list(ex.EXPERIMENT_METHODS)
    assert all(r.variant == "clipped" and r.delta == 0.0 and r.epsilon == 0.1 for r in rows)


def test_row_statistics_by_hand() -> None:
    r = _row("NonDPGaussian1", 0.01, "hockey_stick", [100, None, 300, 200])
    assert (r.rejections, r.rate, r.mean_pairs, r.median_pairs) == (3, 0.75, 200.0, 200.0)
    # sample standard deviation of (100, 300, 200) is 100, over sqrt(3)
    assert r.se_pairs == pytest.approx(100.0 / math.sqrt(3.0), rel=1e-12)
    assert r.paper == (1.0, 264.0)
    one = _row("DPGaussian", 0.5, "mmd_r1", [None, 42])
    assert (one.rate, one.mean_pairs, one.se_pairs, one.median_pairs) == (0.5, 42.0, None, 42.0)
    assert one.paper is None  # not a cell of the paper
    none = _row("DPGaussian", 0.01, "mmd_r1", [None, None])
    assert (none.rate, none.mean_pairs, none.se_pairs, none.median_pairs) == (0.0, None, None,
                                                                              None)
    d = r.to_dict()
    assert d["rejected_at"] == [100, None, 300, 200] and d["rejections"] == 3
    assert d["mean_pairs"] == 200.0 and d["method"] == "hockey_stick" and d["budget"] == 5000
    json.dumps(d)
    # the time spent is not part of a row's identity
    assert r == ex.Table1Row(*[getattr(r, f) for f in ("mechanism", "epsilon", "delta",
                                                       "variant", "method", "runs", "budget",
                                                       "alpha", "rejected_at")], seconds=9.0)


def test_paper_tables_cover_the_protocol() -> None:
    assert set(ex.PAPER_TABLE1) == {(n, e) for n in mech.TABLE1_NAMES for e in (0.01, 0.1)}
    for rate, mean in ex.PAPER_TABLE1.values():
        assert 0.0 <= rate <= 1.0 and (mean is None) == (rate == 0.0)
    assert set(ex.KUTTA_TABLE1) <= set(ex.PAPER_TABLE1)
    for key, pairs in ex.KUTTA_TABLE1.items():  # the best published auditor needs fewer pairs
        assert pairs < ex.PAPER_TABLE1[key][1]


def test_format_table1_detail_and_unknown_cells() -> None:
    rows = [_row("NonDPGaussian1", 0.01, "hockey_stick", [100, None, 300, 200]),
            _row("DPGaussian", 0.5, "somebody_else", [None, 42]),
            _row("DPGaussian", 0.01, "mmd_r1", [None, None])]
    lines = ex.format_table1_detail(rows).splitlines()
    assert lines[0] == ("| mechanism | eps | method | rejections | mean pairs +- SE "
                        "| median pairs |")
    assert lines[2:] == [
        "| NonDPGaussian1 | 0.01 | hockey-stick | 3 / 4 | 200 +- 58 | 200 |",
        "| DPGaussian | 0.5 | somebody_else | 1 / 2 | 42 | 42 |",
        "| DPGaussian | 0.01 | MMD R=1 | 0 / 2 | - | - |",
    ]
    md = ex.format_table1(rows)
    assert "| DPGaussian | 0.5 | n/a |" in md  # a cell the paper does not have
    assert "| NonDPGaussian1 | 0.01 | 1.00 / 264 | 0.75 / 200 |" in md
    assert md.splitlines()[-1].startswith("Each cell: rejection rate / mean pairs to reject")


def test_format_table1_checks_by_hand() -> None:
    checks = [{"check": "c", "cell": "X eps=0.1", "measured": 12.345, "target": 10,
               "ratio": None, "rate": 1.0, "passed": False}]
    assert ex.format_table1_checks(checks).splitlines()[2] == \
        "| c | X eps=0.1 | 12.3 | 10 | - | 1.00 | NO |"
    assert ex.format_table1_checks([]).count("\n") == 1  # the header alone


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch": 0}, ValueError, "batch must be >= 1, got 0"),
        ({"runs": True}, TypeError, "runs must be an integer, got True"),
        ({"epsilons": ()}, ValueError, "epsilons must not be empty"),
        ({"alpha": 0.0}, ValueError, "alpha must lie in \\(0, 1\\), got 0.0"),
        ({"mechanisms": ("DPGaussian", "Nope")}, ValueError, "'Nope'"),
    ],
)
def test_more_bad_input(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ex.run_table1(progress=False, **kwargs)
