"""The two levels of evidence (dpaudit_torch/audit/levels.py; docs/design.md section 14): the
split of alpha among the proof paths, each monitor's share, and evidence in a training run
(the callbacks, the metrics, the report, ``stop_on``)."""

from __future__ import annotations

import logging

import pytest
from conftest import make_private_setup

from dpaudit_torch.audit import AuditConfig, MonitorContext, PrivacyAuditor, build_monitors
from dpaudit_torch.audit.levels import (
    LEGACY_WHITEBOX_ALPHA,
    PROOF_PATHS,
    PROOF_SHARES,
    path_level,
    path_levels,
    total_level,
)
from dpaudit_torch.canaries import SecretCoins
from dpaudit_torch.report import validate


def test_the_shares_split_alpha_by_the_union_bound() -> None:
    assert sum(PROOF_SHARES.values()) == pytest.approx(1.0)
    levels = path_levels(1e-3)
    assert set(levels) == set(PROOF_PATHS) and total_level(levels) == pytest.approx(1e-3)
    assert levels["decision"] == pytest.approx(5e-4)
    # before the two levels: every path at alpha, the white-box bound at its fixed level
    legacy = path_levels(0.05, "per_path")
    assert legacy["whitebox"] == LEGACY_WHITEBOX_ALPHA and legacy["steinke"] == 0.05
    with pytest.raises(ValueError, match="proof path must be one of"):
        path_level(1e-3, "sampling")
    with pytest.raises(ValueError, match="level_split must be one of"):
        path_level(1e-3, "decision", "halves")


def test_every_monitor_decides_at_its_share() -> None:
    """The monitors that bet run their own tests at the decision's share (their crossing of
    "1/alpha" is the decision's threshold), the one-run bounds at the Steinke and white-box
    shares, the accounting intervals at theirs; an explicit monitor option still wins."""
    cfg = AuditConfig(k_pairs=2, m_canaries=8,
                      monitor_options={"noise": {"alpha": 0.01}})
    mons = build_monitors(MonitorContext(config=cfg, k_pairs=2, m_canaries=8, device="cpu",
                                         warn=lambda _m: None,
                                         coins=SecretCoins(8, __import__("torch").Generator())))
    settings = {n: m.settings.to_dict() for n, m in mons.items()}
    lv = cfg.proof_levels
    assert settings["sequential_pairs"]["alpha"] == settings["sampling"]["alpha"] == \
        lv["decision"]
    assert settings["one_run"]["alpha"] == lv["steinke"]
    assert settings["one_run"]["whitebox_alpha"] == lv["whitebox"]
    assert settings["accounting"]["alpha"] == lv["consistency"]
    assert settings["noise"]["alpha"] == 0.01


def test_alpha_warn_follows_alpha_and_is_validated() -> None:
    assert AuditConfig(alpha=0.1).alpha_warn == 0.1  # no separate level above 0.05
    assert AuditConfig().replace(alpha=0.2).alpha_warn == 0.2  # the default follows
    assert AuditConfig(alpha_warn=0.1).replace(alpha=0.01).alpha_warn == 0.1
    with pytest.raises(ValueError, match=r"alpha_warn must lie in \[alpha, 1\)"):
        AuditConfig(alpha=0.05, alpha_warn=0.01)


def _train(stop_on: str, steps: int = 20) -> tuple[PrivacyAuditor, list[int], int]:
    """The tests' MLP with fixed-size batches (not Poisson: the sampling monitor's e-process
    grows), checked at every step: evidence first, the proof later (measured: evidence at
    step 7, the proof at step 13). Without the one-run monitor: its bounds at finalize cost
    seconds and are not what is tested here."""
    s = make_private_setup(sigma=1.0, noise_seed=11)
    told: list[int] = []
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=4, k_pairs=8, m_canaries=40,
                         check_every=1, stop_on=stop_on, disable_monitors=("one_run",),
                         on_evidence=lambda m: told.append(m["evidence_step"]))
    ran = 0
    for x, y in s.batches(steps, batch=24, seed=3):
        s.step(x, y)
        ran += 1
        if aud.should_stop:
            break
    return aud, told, ran


def test_evidence_is_reported_and_stops_nothing_by_default(caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch"):
        aud, told, ran = _train("proof")
    ev, proof = aud.evidence_step, aud.violation_step
    assert ev is not None and proof is not None and ev < proof, (ev, proof)
    assert told == [ev]  # once
    assert aud.latest_metrics["evidence"] and aud.latest_metrics["evidence_step"] == ev
    assert ran == proof  # stopped at the proof, not at the evidence
    assert sum("evidence of a violation (not a proof)" in r.getMessage()
               for r in caplog.records) == 1
    aud.detach()  # (the report of such a run: the next test, and tests/audit/test_checkpoint)


def test_stop_on_evidence_stops_at_the_evidence() -> None:
    aud, told, ran = _train("evidence")
    ev = aud.evidence_step
    assert ev is not None and told == [ev] and ran == ev and aud.should_stop
    assert not aud.violation
    r = aud.finalize()
    assert r.evidence and r.evidence_step == ev and r.alpha_warn == 0.05
    assert r.proof_levels == AuditConfig().proof_levels
    assert r.sequential["evidence_at_step"] <= ev
    assert r.verdict == f"evidence of a violation (not a proof) at step {ev}"
    assert r.stopped_early and not r.violation
    validate(r)  # stopped early on evidence is consistent
    text = r.summary_text()
    assert f"Evidence of a per-step privacy violation at training step {ev}" in text
    assert "stop_on='evidence'" in text and "Levels: every proof" in text
    html = r.to_html()
    assert 'id="evidence"' in html and 'id="levels"' in html


def test_stop_on_evidence_with_raise_refuses_the_next_steps() -> None:
    from dpaudit_torch.audit import PrivacyViolationError

    s = make_private_setup(sigma=1.0, noise_seed=11)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=4, k_pairs=8, m_canaries=40,
                         check_every=1, stop_on="evidence", on_violation="raise",
                         disable_monitors=("one_run",))
    with pytest.raises(PrivacyViolationError, match="evidence of a per-step privacy violation"
                       ) as err:
        for x, y in s.batches(20, batch=24, seed=3):
            s.step(x, y)
    assert err.value.step == aud.evidence_step and not aud.violation
