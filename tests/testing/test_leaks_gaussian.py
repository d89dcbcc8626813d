"""testing.leaks_gaussian: each class breaks the noise clause, keeps the claimed variance, and the
audit decides a violation within 50 steps (the detection benchmark's criterion; one seed per
class here, 5 seeds in the session that added them); a correct run does not alarm."""

from __future__ import annotations

import math

import pytest
import torch

from dpaudit_torch.testing import leaks_gaussian
from dpaudit_torch.testing.harness import run_bug
from dpaudit_torch.testing.leaks_gaussian import CLASSES


def test_classes_name_their_clause():
    for name, bug in CLASSES.items():
        assert bug.name == name and bug.clause == "gaussian" and bug.per_step


_MAKERS = {
    "noise-row-broadcast": leaks_gaussian._row_broadcast,
    "noise-reseeded-per-tensor": leaks_gaussian._reseeded_per_tensor,
    "noise-shared-same-shape": leaks_gaussian._shared_same_shape,
    "noise-pairwise-averaged": leaks_gaussian._pairwise_averaged,
    "noise-neighbour-correlated": leaks_gaussian._neighbour_correlated,
    "noise-laplace": leaks_gaussian._laplace,
    "noise-uniform": leaks_gaussian._uniform_noise,
    "noise-rademacher": leaks_gaussian._rademacher,
}


@pytest.mark.parametrize("name", list(_MAKERS))
def test_each_class_keeps_the_claimed_variance_per_coordinate(name: str) -> None:
    assert set(_MAKERS) == set(CLASSES)
    gen = torch.Generator().manual_seed(0)
    s = torch.zeros(6, 5)
    std, reps = 1.7, 4000
    draws = torch.stack([_MAKERS[name](None, 0, s, std, gen, {}).reshape(-1)
                         for _ in range(reps)])
    assert draws.shape == (reps, 30)
    var = (draws.double() ** 2).mean(dim=0) / std ** 2  # per coordinate, mean 0 by symmetry
    # a 5-sigma band of a mean of `reps` squares (kurtosis at most 6: Laplace)
    assert torch.all((var - 1).abs() < 5 * math.sqrt(5 / reps)), var


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_is_decided_within_50_steps(name: str) -> None:
    report = run_bug(CLASSES[name], 0, 50)
    assert report.violation and report.violation_step <= 50
    noise = report.audits["noise"]
    assert noise["whole_null"]["rejected"]


def test_a_correct_run_does_not_alarm() -> None:
    report = run_bug(None, 1, 25)
    assert not report.violation
    assert not report.audits["noise"]["whole_null"]["rejected"]
