"""Experiment runners (dpaudit_torch.experiments.common and the type-I runner): the method
registry, seeds, intervals, the type-I protocol.  Table 1's runner, formatting and checks are
tested in test_table1.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as sps

from dpaudit_torch import experiments as ex
from dpaudit_torch import mechanisms as mech
from dpaudit_torch.stats.thresholds import gaussian_delta


def test_clopper_pearson_matches_scipy_and_closed_forms() -> None:
    # k = 0: the upper end solves (1 - p)^n = 0.025
    lo, hi = ex.clopper_pearson(0, 200)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 200), rel=1e-10)
    lo, hi = ex.clopper_pearson(200, 200)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 200), rel=1e-10)
    for k, n in ((3, 200), (50, 1000), (1, 7)):
        ref = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert ex.clopper_pearson(k, n) == pytest.approx((ref.low, ref.high), rel=1e-9)


def test_type1_row_pass_rule() -> None:
    # 60 / 1000 = 0.06 > alpha, but the 95% interval [0.046, 0.077] reaches below 0.05
    r = ex.Type1Row("c", "d", "mmd_r1", 1000, 2000, 0.05, 60)
    assert r.rate == 0.06 and r.ci[0] < 0.05 and r.passed
    bad = ex.Type1Row("c", "d", "mmd_r1", 1000, 2000, 0.05, 80)
    assert bad.ci[0] > 0.05 and not bad.passed
    assert "NO" in ex.format_type1([bad]) and bad.to_dict()["passed"] is False


def test_default_type1_cases_are_truly_dp_nulls() -> None:
    cases = ex.default_type1_cases()
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels)) == 10
    for c in cases:
        m = c.mechanism
        assert m.is_dp
        if m.name in ("DPGaussian", "DPLaplace"):
            assert m.variant == "clipped" and c.epsilons == (m.epsilon,)
            assert c.deltas == (m.delta,) and m.true_delta <= m.delta
        if m.name == "Gaussian":
            # every grid point lies ON the profile: the null is tight
            mu = 1.0 / m.sigma  # type: ignore[attr-defined]
            np.testing.assert_allclose(c.deltas, gaussian_delta(np.array(c.epsilons), mu),
                                       rtol=1e-12)
    grid = [c for c in cases if len(c.epsilons) > 1]
    assert len(grid) == 1 and len(grid[0].epsilons) == 16


def test_run_type1_small() -> None:
    case = ex.NullCase("Laplace eps=1", mech.get("Laplace", epsilon=1.0), (1.0,), (0.0,))
    rows = ex.run_type1([case], runs=5, pairs=100, progress=False)
    assert [r.method for r in rows] == ["mmd_r1", "hockey_stick"]
    for r in rows:
        assert r.runs == 5 and r.pairs == 100 and 0 <= r.rejections <= 5
    # a NOT-DP "case" is rejected: the runner measures what the testers decide
    leak = ex.NullCase("leak", mech.get("DPLaplace", epsilon=0.1), (0.1,), (0.0,))
    hs = ex.run_type1([leak], methods=("hockey_stick",), runs=3, pairs=300, progress=False)
    assert hs[0].rejections == 3


def test_misc_bad_input() -> None:
    with pytest.raises(ValueError, match="nope"):
        ex.make_tester("nope", 0.1, 0.0, 0.05)
    with pytest.raises(ValueError, match="empty"):
        ex.run_type1([], progress=False)
    with pytest.raises(ValueError, match="equal"):
        ex.NullCase("x", mech.get("Laplace", epsilon=1.0), (1.0, 2.0), (0.0,))
    with pytest.raises(ValueError, match="0"):
        ex.run_type1(runs=0, progress=False)


def test_run_seed_independent_streams() -> None:
    seeds = {ex.run_seed(0, a, b) for a in range(20) for b in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    g1 = torch.Generator().manual_seed(ex.run_seed(0, 1, 2))
    g2 = torch.Generator().manual_seed(ex.run_seed(0, 1, 2))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    assert not math.isnan(ex.run_seed(2**40, 1))


def test_run_type1_blocks_and_cache(tmp_path: Path) -> None:
    """Counts do not depend on the block size; a cache file is reused (and keyed by config)."""
    case = ex.NullCase("leaky", mech.get("DPLaplace", epsilon=0.1), (0.1,), (0.0,))
    a = ex.run_type1([case], methods=("hockey_stick",), runs=4, pairs=60, progress=False,
                     chunk_runs=1)
    b = ex.run_type1([case], methods=("hockey_stick",), runs=4, pairs=60, progress=False,
                     chunk_runs=3)
    assert a[0].rejections == b[0].rejections
    cache = tmp_path / "c.jsonl"
    c1 = ex.run_type1([case], methods=("hockey_stick",), runs=4, pairs=60, progress=False,
                      chunk_runs=2, cache=str(cache))
    assert c1[0].rejections == a[0].rejections
    lines = cache.read_text().splitlines()
    assert len(lines) == 2
    # forge the cached counts: a second call must read them instead of recomputing
    forged = [json.dumps({**json.loads(line), "counts": [2]}) for line in lines]
    cache.write_text("\n".join(forged) + "\n")
    c2 = ex.run_type1([case], methods=("hockey_stick",), runs=4, pairs=60, progress=False,
                      chunk_runs=2, cache=str(cache))
    assert c2[0].rejections == 4
    # another configuration (pairs) is not served from the cache
    c3 = ex.run_type1([case], methods=("hockey_stick",), runs=4, pairs=61, progress=False,
                      chunk_runs=2, cache=str(cache))
    assert len(cache.read_text().splitlines()) == 4 and c3[0].runs == 4


def test_experiment_methods_come_from_the_tester_registry() -> None:
    """One registry of experiment methods, built on dpaudit_torch.registry; the old names agree."""
    from dpaudit_torch import registry

    assert list(ex.EXPERIMENT_METHODS) == ["mmd_r0.5", "mmd_r1", "hockey_stick"]
    assert list(ex.METHODS) == list(ex.METHOD_LABELS) == list(ex.EXPERIMENT_METHODS)
    assert ex.LIBRARY_DEFAULT_METHODS == ("mmd_r1", "hockey_stick")
    assert ex.METHOD_LABELS["hockey_stick"] == registry.TESTERS["hockey_stick"].label
    for key, m in ex.EXPERIMENT_METHODS.items():
        assert m.key == key and ex.experiment_method(key) is m
        t = ex.make_tester(key, 0.5, 1e-5, 0.05)
        assert isinstance(t, registry.tester_class(m.tester))
        assert type(ex.METHODS[key](0.5, 1e-5, 0.05)) is type(t)
    assert ex.make_tester("mmd_r0.5", 0.5, 0.0, 0.05).witness_radius == 0.5
    assert ex.make_tester("mmd_r1", 0.5, 0.0, 0.05).witness_radius == 1.0
    with pytest.raises(ValueError, match="unknown tester"):
        ex.ExperimentMethod("x", "nope", (), "x")
    for name in ex.__all__:
        assert getattr(ex, name) is not None
