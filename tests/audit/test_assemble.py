"""``assemble_report`` (dpaudit_torch/audit/assemble.py): the report of a finalized audit gathers
every monitor's contribution (bounds, ``audits`` sections, report fields, canaries entries, the
"inconsistent" verdict) and findings, and words a monitor's own violation by the decision.

One tiny real audit for the module, with a throwaway monitor ("probe") registered for it: each
test sets what the probe contributes and assembles the report again. The probe is removed from
the registry when the module's tests are done."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from conftest import make_private_setup

from dpaudit_torch.audit import MONITORS, PrivacyAuditor
from dpaudit_torch.audit.assemble import assemble_report
from dpaudit_torch.audit.monitors import Contribution, Finding, Monitor, base, register_monitor
from dpaudit_torch.registry import ONE_STEP
from dpaudit_torch.report import AuditReport
from dpaudit_torch.report.validate import contradictions

PROBE = "probe"


class Probe(Monitor):
    """A monitor that observes nothing and contributes what the test put in ``plan``."""

    label = "probe (a test's monitor)"
    plan: ClassVar[dict[str, Any]] = {}

    def findings(self) -> list[Finding]:
        return list(self.plan.get("findings", []))

    def contribution(self) -> Contribution:
        return self.plan.get("contribution", Contribution())


@dataclass
class Audited:
    aud: PrivacyAuditor
    report: AuditReport


@pytest.fixture(scope="module")
def audited() -> Iterator[Audited]:
    """A 10-step audit of the tiny MLP with the probe among its monitors (finalized)."""
    monitors, defaults = dict(MONITORS), list(base._DEFAULT)
    try:
        register_monitor(PROBE)(Probe)
        s = make_private_setup(sigma=1.0, seed=2)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, k_pairs=4, m_canaries=32, seed=1)
        s.train(10)
        yield Audited(aud, aud.finalize())
    finally:
        MONITORS.pop(PROBE, None)
        base._DEFAULT[:] = defaults
        assert MONITORS == monitors


@pytest.fixture
def probe(audited: Audited) -> Iterator[type[Probe]]:
    """The probe, with an empty plan again after the test."""
    Probe.plan = {}
    try:
        yield Probe
    finally:
        Probe.plan = {}


def _again(audited: Audited) -> AuditReport:
    return assemble_report(audited.aud, audited.report.claimed_epsilon)


def _without(audited: Audited, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The engine's monitors but ``names``, for one test (the engine's own dict, in its order,
    is put back afterwards)."""
    eng = audited.aud.engine
    monkeypatch.setattr(eng, "monitors",
                        {n: m for n, m in eng.monitors.items() if n not in names})


# ------------------------------------------------------------------ a real audit
def test_the_probe_ran_in_the_audit(audited: Audited) -> None:
    eng = audited.aud.engine
    assert PROBE in eng.monitors and list(eng.monitors)[-1] == PROBE
    assert audited.report.monitor_labels[PROBE] == "probe (a test's monitor)"
    assert PROBE not in audited.report.audits  # no section: none in the report


def test_every_monitors_contribution_is_in_the_report(audited: Audited) -> None:
    aud, rep = audited.aud, audited.report
    contributions = {n: m.contribution() for n, m in aud.engine.monitors.items()}
    sections = {n: c.section for n, c in contributions.items() if c.section is not None}
    assert rep.audits == sections and {"sampling", "accounting", "noise"} <= set(sections)
    bounds = {b: v for c in contributions.values() for b, v in c.bounds.items()}
    assert set(rep.epsilon_lower_bounds) == set(bounds) == {"whitebox", "steinke", "fdp",
                                                            "sequential"}
    for b, (value, details) in bounds.items():
        assert rep.epsilon_lower_bounds[b] == value and rep.lower_bound_details[b] == details
    fields = {f: v for c in contributions.values() for f, v in c.fields.items()}
    assert rep.one_run_scores == fields["one_run_scores"] and rep.power == fields["power"]
    assert rep.interference == fields["interference"]
    for key, value in fields["sequential"].items():
        assert rep.sequential[key] == value
    for c in contributions.values():
        for key, value in c.canaries.items():
            assert rep.canaries[key] == value
    assert rep.canaries["one_run_in"] == len(rep.one_run_scores["in"])
    assert rep.claim_inconsistent is False and not any(c.verdict for c in contributions.values())


def test_the_decision_and_the_adapter_parts(audited: Audited) -> None:
    aud, rep = audited.aud, audited.report
    eng, dec = aud.engine, aud.engine.decision
    assert rep.monitor_labels == eng.labels()
    assert rep.monitor_labels["decision"] == "combined decision (no single monitor on its own)"
    assert set(rep.monitor_labels) == {*eng.monitors, "decision"}
    seq = rep.sequential
    assert seq["combined_log_wealth"] == dec.log_wealth
    assert seq["decision_threshold_log"] == dec.threshold_log
    assert seq["crossed_at_step"] == dec.crossed_at and seq["check_every"] == 5
    assert seq["decision"].startswith("average of the tests' e-processes")
    assert rep.wealth_history == {k: list(v) for k, v in dec.history.items()}
    assert rep.violation is False and rep.violation_step is None and rep.stopped_early is False
    assert rep.claimed_epsilon == eng.claimed_epsilon and rep.claimed_epsilon > 0
    assert rep.accountant == aud.tap.accountant.name == "RDPAccountant"
    assert rep.training["audited_steps"] == eng.step == 10
    assert rep.training["nonfinite_steps_skipped"] == 0 and rep.training["steps_at_attach"] == 0
    assert rep.training["claimed_epsilon_history"] == [[s, e] for s, e in eng.claimed_history]
    for key, value in aud.tap.training_info().items():
        assert rep.training[key] == value
    assert rep.config == {**aud.config.to_dict(), "device": "cpu"}
    c = rep.canaries
    assert c["inclusion_rate"] == aud.tap.sample_rate and c["injecting_rank"] == 0
    assert c["norm_multiplier"] == aud.config.canary_norm
    assert c["seed_policy"] == rep.seed_policy == aud.seed_policy
    for key, value in {**aud.design.summary(), **aud.tap.injector.counters()}.items():
        assert c[key] == value
    assert rep.threat_model["every_step_observed"] is True
    assert rep.threat_model["clipping_exercised"] is True
    assert contradictions(rep) == []


def test_findings_are_the_monitors_own(audited: Audited) -> None:
    eng = audited.aud.engine
    mine = [f.to_dict() for m in eng.monitors.values() for f in m.findings()]
    assert audited.report.findings == mine  # a correct run: nothing refuted, nothing decided
    assert not any(f["level"] == "violation" for f in mine)


def test_assembling_again_gives_the_same_report(audited: Audited) -> None:
    first, again = audited.report.to_dict(), _again(audited).to_dict()
    first.pop("created_at")
    again.pop("created_at")
    assert again == first


# ------------------------------------------------------------------ what a monitor contributes
def test_a_monitors_section_bounds_fields_and_canaries(audited: Audited, probe: type[Probe],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe owns the one-run fields while the one-run monitor is not in this report
    _without(audited, monkeypatch, "one_run")
    probe.plan = {"contribution": Contribution(
        section={"checked": 3}, bounds={"probe_bound": (0.25, {"how": "by hand"})},
        fields={"power": {"note": "the probe's"}, "one_run_scores": {"in": [1.0], "out": []}},
        canaries={"probe_canaries": 7})}
    rep = _again(audited)
    assert rep.audits[PROBE] == {"checked": 3}
    assert rep.epsilon_lower_bounds["probe_bound"] == 0.25
    assert rep.lower_bound_details["probe_bound"] == {"how": "by hand"}
    assert "steinke" not in rep.epsilon_lower_bounds  # only the monitors that ran
    assert rep.power == {"note": "the probe's"}
    assert rep.one_run_scores == {"in": [1.0], "out": []}
    assert rep.canaries["probe_canaries"] == 7 and "one_run_in" not in rep.canaries
    assert rep.claim_inconsistent is False


def test_fields_nobody_reported_get_their_empty_defaults(
        audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    _without(audited, monkeypatch, "one_run", "sequential_pairs")
    rep = _again(audited)
    assert rep.one_run_scores == {"in": [], "out": []} and rep.power == {}
    assert rep.interference == {}
    assert set(rep.sequential) == {"combined_log_wealth", "decision_threshold_log",
                                   "evidence_threshold_log", "crossed_at_step",
                                   "evidence_at_step", "check_every", "decision"}


def test_an_inconsistent_verdict_makes_the_claim_inconsistent(audited: Audited,
                                                              probe: type[Probe]) -> None:
    probe.plan = {"contribution": Contribution(verdict="inconsistent")}
    assert _again(audited).claim_inconsistent is True
    probe.plan = {"contribution": Contribution(verdict=None)}
    assert _again(audited).claim_inconsistent is False


@pytest.mark.parametrize("contribution,clash", [
    (Contribution(bounds={"steinke": (9.0, {})}), "['steinke']"),
    (Contribution(bounds={"sequential": (0.0, {}), "mine": (1.0, {})}), "['sequential']"),
    (Contribution(fields={"power": {}, "interference": {}}), "['interference', 'power']"),
])
def test_two_monitors_reporting_the_same_bound_or_field_is_an_error(
        audited: Audited, probe: type[Probe], contribution: Contribution, clash: str) -> None:
    probe.plan = {"contribution": contribution}
    with pytest.raises(RuntimeError, match=re.escape(
            f"monitor 'probe' reports {clash}, which another monitor already reported")):
        _again(audited)


# ------------------------------------------------------------------ findings and the decision
def test_a_monitors_own_violation_is_a_note_when_the_decision_did_not_cross(
        audited: Audited, probe: type[Probe]) -> None:
    probe.plan = {"findings": [
        Finding(PROBE, "violation", "the probe's own test crossed", "somewhere", scope=ONE_STEP),
        Finding(PROBE, "finding", "an established fact")]}
    rep = _again(audited)
    mine = [f for f in rep.findings if f["monitor"] == PROBE]
    assert mine[0]["level"] == "note" and mine[0]["where"] == "somewhere"
    assert mine[0]["scope"] == ONE_STEP
    assert mine[0]["message"].startswith("not decided: this monitor's own test crossed 1/alpha "
                                         "but the audit's decision")
    assert mine[0]["message"].endswith(": the probe's own test crossed")
    assert mine[1] == {"monitor": PROBE, "level": "finding", "message": "an established fact",
                       "where": None}
    assert not any(f["monitor"] == "decision" for f in rep.findings)
    assert rep.violation is False
    # the monitor's own finding is left as it was
    assert probe.plan["findings"][0].level == "violation"


def test_a_monitors_violation_stays_when_the_decision_crossed(
        audited: Audited, probe: type[Probe], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audited.aud.engine.decision, "violation", True)
    probe.plan = {"findings": [Finding(PROBE, "violation", "the probe's own test crossed")]}
    rep = _again(audited)
    (mine,) = [f for f in rep.findings if f["monitor"] == PROBE]
    assert mine["level"] == "violation" and mine["message"] == "the probe's own test crossed"
    assert not any(f["monitor"] == "decision" for f in rep.findings)
    assert rep.violation is True


def test_a_decision_without_any_monitors_violation_gets_its_own_finding(
        audited: Audited, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audited.aud.engine.decision, "violation", True)
    rep = _again(audited)
    assert rep.findings[0] == {
        "monitor": "decision", "level": "violation",
        "message": "the average of the monitors' e-processes crossed 1/alpha (no single "
                   "monitor did on its own)", "where": None}
    assert rep.findings[1:] == audited.report.findings
    assert rep.monitor_labels["decision"].startswith("combined decision")


# ------------------------------------------------------------------ steps not observed
def test_skipped_and_unobserved_steps_are_reported(audited: Audited,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    eng = audited.aud.engine
    monkeypatch.setattr(eng, "skipped_nonfinite", 2)
    rep = _again(audited)
    msg = ("2 step(s) had a non-finite gradient at a canary coordinate; their observations "
           "were dropped (on_nonfinite='skip')")
    assert rep.warnings.count(msg) == 1 and msg not in audited.aud.warnings
    assert rep.threat_model["every_step_observed"] is False
    assert rep.training["nonfinite_steps_skipped"] == 2
    monkeypatch.setattr(eng, "skipped_nonfinite", 0)
    monkeypatch.setattr(eng, "unobserved_steps", 1)
    assert _again(audited).threat_model["every_step_observed"] is False
