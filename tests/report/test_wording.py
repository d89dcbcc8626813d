"""Tests of dpaudit_torch/report/wording.py: the words for a proven violation, with monitors named
by the labels the report carries (a monitor without a label under its own name)."""

from __future__ import annotations

import html

import pytest
from conftest import MONITOR_LABELS

from dpaudit_torch.registry import ONE_STEP
from dpaudit_torch.report import wording
from dpaudit_torch.report.wording import (
    decided_per_step,
    deciders_text,
    deciding_findings,
    monitor_label,
    violation_message,
)

NOTE = {"monitor": "accounting", "level": "note", "message": "check not run: x", "where": None}


def test_monitor_label_comes_from_the_labels() -> None:
    labels = {"pairs": "canary pairs (per-step guarantee violated)"}
    assert monitor_label("pairs", labels) == "canary pairs (per-step guarantee violated)"
    assert monitor_label("pairs") == "pairs"  # an older report: no labels
    assert monitor_label("other", labels) == "other"
    assert monitor_label(None, labels) == "None"
    assert not hasattr(wording, "MONITOR_LABELS")  # no table of its own


def test_deciding_findings_and_per_step_scope() -> None:
    deciding = {"monitor": "x", "level": "violation", "message": "m", "where": None}
    per_step = dict(deciding, scope=ONE_STEP)
    assert deciding_findings([NOTE, deciding, "not a finding"]) == [deciding]  # type: ignore[list-item]
    assert not decided_per_step([NOTE, deciding])
    assert decided_per_step([NOTE, per_step])
    # only a deciding finding counts
    assert not decided_per_step([dict(per_step, level="note")])


def test_deciders_text() -> None:
    found = [{"monitor": "noise", "level": "violation", "where": "tensor <w>",
              "message": "too little noise"}, NOTE,
             {"monitor": "sampling", "level": "violation", "where": None,
              "message": "not Poisson"}]
    assert deciders_text(found) == ("noise [tensor <w>]: too little noise; "
                                    "sampling: not Poisson")
    assert deciders_text(found, labels=MONITOR_LABELS) == (
        "noise [tensor <w>]: too little noise; sampling (batch sizes not Poisson): not Poisson")
    assert deciders_text(found, html.escape, MONITOR_LABELS).startswith(
        "noise [tensor &lt;w&gt;]: too little noise")
    assert deciders_text([NOTE]) == "the deciding monitor was not recorded in this report"


@pytest.mark.parametrize(("finding", "needles"), [
    ({"monitor": "sampling", "level": "violation", "where": "data loader",
      "message": "the real batch sizes are not Poisson samples at the loader's rate"},
     ["by the sampling monitor", "sampling (batch sizes not Poisson) [data loader]"]),
    ({"monitor": "noise", "level": "violation", "where": "tensor fc.weight",
      "message": "too little noise: on fc.weight the noise variance is about 0.25 x"},
     ["by the noise monitor", "noise [tensor fc.weight]: too little noise: on fc.weight"]),
    ({"monitor": "sequential_pairs", "level": "violation", "where": None, "scope": ONE_STEP,
      "message": "the canary pairs: a training step leaks more than the per-step null"},
     ["by the sequential_pairs monitor", "sequential pairs (per-step guarantee violated)"]),
])
def test_violation_message_follows_the_monitor(finding: dict, needles: list[str]) -> None:
    msg = violation_message([finding, NOTE], 12, 0.05, labels=MONITOR_LABELS)
    assert msg.startswith("privacy violation proven at training step 12 by ")
    for needle in needles:
        assert needle in msg
    assert finding["message"] in msg
    assert "noise multiplier" not in msg and "check not run" not in msg


def test_violation_message_without_labels_names_the_monitor() -> None:
    finding = {"monitor": "sampling", "level": "violation", "where": None, "message": "m"}
    msg = violation_message([finding], None, 0.05)  # the engine's call before labels existed
    assert msg == ("privacy violation proven by the sampling monitor (anytime-valid decision "
                   "at level alpha=0.05): sampling: m")


def test_two_deciding_monitors_and_none_recorded() -> None:
    two = [{"monitor": "noise", "level": "violation", "message": "too little noise", "where": None},
           {"monitor": "sampling", "level": "violation", "message": "not Poisson", "where": None}]
    msg = violation_message(two, 3, 0.05, log_wealth=4.2, labels=MONITOR_LABELS)
    assert "by the noise and sampling monitors" in msg and "exp(4.2)" in msg
    assert "noise: too little noise; sampling (batch sizes not Poisson): not Poisson" in msg
    three = two + [dict(two[0], monitor="decision")]
    assert "by the noise, sampling and decision monitors" in violation_message(three, 3, 0.05)
    assert violation_message([NOTE], None, 0.01).startswith(
        "privacy violation proven by the audit (anytime-valid decision at level alpha=0.01)")
