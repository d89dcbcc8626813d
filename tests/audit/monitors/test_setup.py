"""The setup monitor: wrong inputs found at attach reach the report as findings naming them; an
accountant that counted fewer steps than were released makes the claim inconsistent
(docs/monitors/setup.md)."""

from __future__ import annotations

from conftest import make_private_setup
from torch.utils.data import DataLoader

from dpaudit_torch.audit import AuditConfig, MonitorContext, PrivacyAuditor, build_monitors
from dpaudit_torch.contract import ACCOUNTANT_HISTORY, SETUP_CHECK, StaticFacts

CFG = dict(k_pairs=4, m_canaries=32, seed=1)


def _monitor(facts: dict):
    ctx = MonitorContext(config=AuditConfig(monitors=("setup",)), k_pairs=4, m_canaries=32,
                         device=None, warn=lambda m: None, coins=None, noise_tensor=None,
                         facts=StaticFacts(facts))
    return build_monitors(ctx)["setup"]


class _Rec:
    step = 1


def test_problems_become_findings_and_counts_are_compared():
    problems = [{"level": "finding", "scope": "data loader", "message": "loader X is wrong"}]
    m = _monitor({SETUP_CHECK: {"rate": 0.1, "problems": problems},
                  ACCOUNTANT_HISTORY: lambda: [(1.0, 0.1, 3)]})
    for _ in range(5):
        m.observe(_Rec())
    m.finalize(None)
    levels = [(f.level, f.where) for f in m.findings()]
    assert levels == [("finding", "data loader"), ("inconsistent", "accountant")]
    assert "counted 3 step(s) while the optimizer released 5" in m.findings()[1].message
    c = m.contribution()
    assert c.verdict == "inconsistent" and c.section["accountant_steps"] == 3
    m2 = _monitor({SETUP_CHECK: {"problems": []}, ACCOUNTANT_HISTORY: lambda: [(1.0, 0.1, 5)]})
    m2.load_state_dict(m.state_dict())
    m2.finalize(None)
    assert m2.findings() == [] and m2.contribution().verdict is None


def test_no_history_is_a_note():
    m = _monitor({SETUP_CHECK: {"problems": []}, ACCOUNTANT_HISTORY: lambda: None})
    m.observe(_Rec())
    m.finalize(None)
    [f] = m.findings()
    assert f.level == "note" and "keeps no history" in f.message


def _train(s, aud, steps: int = 6) -> None:
    for x, y in s.batches(steps):
        s.step(x, y)


def test_correct_training_handed_another_loader_gives_a_finding_not_a_proof():
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, DataLoader(s.loader.dataset, batch_size=128),
                         model=s.model, **CFG)
    _train(s, aud)
    rep = aud.finalize()
    assert not rep.violation and not rep.claim_refuted and not rep.claim_inconsistent
    f = [f for f in rep.findings if f["monitor"] == "setup"]
    assert [x["where"] for x in f] == ["data loader"]
    assert rep.audits["sampling"]["run"] is False
    assert "not the training's" in rep.audits["sampling"]["reason_not_run"]
    assert rep.audits["setup"]["rate_source"] == "accountant"


def test_an_accountant_that_never_steps_makes_the_claim_inconsistent():
    s = make_private_setup()
    s.optimizer.step_hook = None
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    assert any("no step hook" in w for w in aud.warnings)
    done = 0  # the Poisson loader's batches: fixed-size ones repeat, a sampling violation
    while done < 6:
        for x, y in s.loader:
            s.step(x, y)
            done += 1
            if done == 6:
                break
    rep = aud.finalize()
    assert rep.claim_inconsistent and not rep.violation and not rep.claim_refuted
    msgs = [f["message"] for f in rep.findings if f["monitor"] == "setup"]
    assert any("counted 0 step(s) while the optimizer released 6" in m for m in msgs)
