"""Tests of dpaudit_torch/report/formatting.py: how the report writes numbers, scopes, the power
sentence and the no-steps sentence (shared by the page and the summary)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from conftest import power_dict

from dpaudit_torch.report.formatting import (
    NO_STEPS_SENTENCE,
    format_number,
    power_sentence,
    scope_text,
)


def test_format_number() -> None:
    assert format_number(None) == "n/a"
    assert format_number(True) == "yes" and format_number(False) == "no"
    assert format_number(12) == "12" and format_number(np.int64(3)) == "3"
    assert format_number(0.98765) == "0.9877" and format_number(1e-5) == "1e-05"
    assert format_number(np.float32(0.5)) == "0.5"
    assert format_number(math.inf) == "∞" and format_number(-math.inf) == "-∞"
    assert format_number(math.nan) == "NaN"
    assert format_number("text") == "text"


def test_scope_text() -> None:
    assert scope_text("steinke") == "whole training run"
    assert scope_text("steinke", article=True) == "the whole training run"
    assert scope_text("steinke", with_family=True) == "whole training run"  # family-free
    assert scope_text("fdp", article=True, with_family=True) == (
        "the whole training run, Gaussian family")
    assert scope_text("sequential", article=True) == "one training step"
    assert scope_text("a_method_from_the_future") is None


def test_power_sentence_in_plain_text() -> None:
    assert power_sentence({}) is None
    assert power_sentence(power_dict()) == (
        "A correct implementation with this run's settings would give a Steinke bound of about "
        "0.4123 (median of 200 simulated runs); this audit refutes a true epsilon of 4.567 or "
        "more with probability 80%.")
    cannot = power_dict(min_refutable_epsilon=None, note="this audit cannot refute the claim")
    assert power_sentence(cannot).endswith(
        "; this audit cannot refute the claim with this many canaries and steps, even for a "
        "true epsilon far above it.")
    assert power_sentence(power_dict(min_refutable_epsilon=None)).endswith(
        "(median of 200 simulated runs).")
    assert power_sentence(power_dict(method="fdp", replicates=None)).startswith(
        "A correct implementation with this run's settings would give a f-DP bound of about "
        "0.4123 (median of simulated runs)")
    assert power_sentence(power_dict(expected_bound=None)) is None
    assert power_sentence(power_dict(no_power=True, note="no steps")) == (
        "The one-run audit had no power to detect a leak (no steps).")


def test_power_sentence_with_the_page_writers() -> None:
    seen: list[tuple[Any, str]] = []

    def number(value: Any, path: str) -> str:
        seen.append((value, path))
        return f"<{format_number(value)}>"

    text = power_sentence(power_dict(), number=number, eps="ε", text=str.upper)
    assert text is not None and "about <0.4123>" in text and "a true ε of <4.567>" in text
    assert [p for _, p in seen] == ["power.replicates", "power.expected_bound",
                                    "power.min_refutable_epsilon"]
    assert power_sentence(power_dict(no_power=True, note="x<y"), text=str.upper) == (
        "The one-run audit had no power to detect a leak (X<Y).")


def test_no_steps_sentence() -> None:
    assert NO_STEPS_SENTENCE.startswith("No training step was audited")
    assert "no evidence" in NO_STEPS_SENTENCE


def test_bound_alpha_is_the_bounds_own_level_else_the_audits() -> None:
    from dpaudit_torch.report.formatting import bound_alpha

    assert bound_alpha({"alpha": 1e-3}, 0.05) == 1e-3  # the white-box bound's own level
    assert bound_alpha({}, 0.05) == 0.05
    for bad in (True, 0.0, 1.0, "0.01", None):  # not a level: the audit's own is used
        assert bound_alpha({"alpha": bad}, 0.05) == 0.05
