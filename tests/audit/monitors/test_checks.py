"""A monitor's check section (dpaudit_torch/audit/monitors/checks.py): its building blocks, the
wording of causes ruled out by checks that passed, and the outcome of a test's summary."""

from __future__ import annotations

from dpaudit_torch.audit.monitors import DEFAULT_MONITORS, MONITORS
from dpaudit_torch.audit.monitors.base import Monitor
from dpaudit_torch.audit.monitors.checks import (
    CheckSection,
    causes_text,
    outcome_of,
    section_dict,
)


def test_causes_text_names_what_passed() -> None:
    causes = ("noise", "clipping", "scaling")
    assert causes_text(causes) == "bad noise, clipping or scaling"
    assert causes_text(causes, ["noise"]) == "noise check passed: clipping or scaling"
    assert causes_text(causes, ["noise", "scaling"]) == "noise and scaling checks passed: clipping"
    # every cause ruled out: nothing left to blame but the list as it was
    assert causes_text(causes, causes) == "bad noise, clipping or scaling"
    assert causes_text(causes, ["sampling"]) == "bad noise, clipping or scaling"


def test_outcome_of_a_test_summary() -> None:
    assert outcome_of(None) == "not run"
    assert outcome_of({"rejected": True, "rejected_at": 7}) == "rejected (after 7 steps)"
    assert outcome_of({"rejected": True, "rejected_at": 40}, "pair") == \
        "rejected (after 40 pairs)"
    assert outcome_of({"rejected": False, "n_steps": 25, "log_wealth": -1.25,
                       "max_log_wealth": 0.5}) == \
        "not rejected (25 steps, log-wealth -1.25, largest 0.5)"
    assert outcome_of({"rejected": False}) == "not rejected"


def test_section_dict_keeps_what_the_monitor_said() -> None:
    sec = CheckSection("Thing").check("a", "passed").measure("x", 1.5).measure("none", None)
    sec.skip("b", "out of sight")
    d = section_dict("thing", sec)
    assert d == {"monitor": "thing", "title": "Thing", "ran": True, "reason_not_run": None,
                 "checked": [{"check": "a", "outcome": "passed"}],
                 "measured": [{"quantity": "x", "value": 1.5}],  # None is not a measurement
                 "not_checked": [{"check": "b", "why": "out of sight"}]}
    off = section_dict("off", CheckSection("Off", ran=False, reason_not_run="no model"))
    assert off["ran"] is False and off["reason_not_run"] == "no model"


def test_every_registered_monitor_describes_its_checks() -> None:
    """The base class's default says only that the monitor ran: each monitor overrides it."""
    for name in DEFAULT_MONITORS:
        assert MONITORS[name].check_section is not Monitor.check_section, name
