"""The accountant view (``opacus_tap/accountant.py``): steps, history and epsilon read off
Opacus's own accountant, against that accountant; fresh accountants of the same class for
hypothetical runs; a failing read reported, never raised."""

from __future__ import annotations

import pytest
from conftest import make_private_setup
from opacus.accountants import PRVAccountant, RDPAccountant

from dpaudit_torch.opacus_tap import accountant as memo
from dpaudit_torch.opacus_tap.accountant import AccountantView

DELTA = 1e-5


def _trained(accountant: str = "rdp"):
    """Three steps at sigma = 1, then four at sigma = 1.5: two history entries, seven steps."""
    s = make_private_setup(accountant=accountant, sigma=1.0)
    s.train(3)
    s.optimizer.noise_multiplier = 1.5
    s.train(4)
    return s


@pytest.mark.parametrize("accountant,cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_steps_history_and_epsilon_against_opacus(accountant, cls):
    s = _trained(accountant)
    acc = s.engine.accountant
    warned: list[str] = []
    view = AccountantView(acc, warned.append)
    assert view.name == cls.__name__
    # len(accountant) counts history segments, not steps
    assert len(acc) == len(acc.history) == 2
    assert view.steps() == 7 == sum(n for _, _, n in acc.history)
    q = s.loader.sample_rate
    assert view.history_since(0) == [(1.0, q, 3), (1.5, q, 4)]
    assert view.history_since(2) == [(1.0, q, 1), (1.5, q, 4)]
    assert view.history_since(5) == [(1.5, q, 2)]
    assert view.history_since(7) == []
    eps = view.epsilon(DELTA)
    assert eps == acc.get_epsilon(delta=DELTA) == s.engine.get_epsilon(DELTA)
    assert view.epsilon_of_history(view.history_since(0), DELTA) == pytest.approx(eps, rel=1e-12)
    assert not warned


def test_epsilon_of_a_hypothetical_run_by_a_fresh_accountant():
    s = make_private_setup(sigma=1.2)
    s.train(5)
    view = AccountantView(s.engine.accountant, lambda _m: None)
    q = s.loader.sample_rate
    ref = RDPAccountant()
    ref.history = [(1.2, q, 5)]
    assert view.epsilon_for(1.2, q, 5, DELTA) == ref.get_epsilon(delta=DELTA)
    assert view.epsilon_for(1.2, q, 5, DELTA) == pytest.approx(view.epsilon(DELTA), rel=1e-12)
    assert view.epsilon_for(1.2, q, 50, DELTA) > view.epsilon_for(1.2, q, 5, DELTA)
    assert view.epsilon_for(2.4, q, 5, DELTA) < view.epsilon_for(1.2, q, 5, DELTA)
    assert len(s.engine.accountant.history) == 1  # the real accountant untouched


def test_no_epsilon_before_the_first_step():
    s = make_private_setup()
    view = AccountantView(s.engine.accountant, lambda _m: None)
    assert view.steps() == 0 and view.epsilon(DELTA) is None and view.history_since(0) == []


class _Broken:
    history = [(1.0, 0.1, 2)]

    def get_epsilon(self, delta: float) -> float:
        raise ArithmeticError("no epsilon today")


def test_failing_read_is_reported_not_raised():
    warned: list[str] = []
    view = AccountantView(_Broken(), warned.append)
    assert view.steps() == 2 and view.name == "_Broken"
    assert view.epsilon(DELTA) is None
    assert len(warned) == 1 and "no epsilon today" in warned[0] and "get_epsilon" in warned[0]


class _Odd:
    def __init__(self, history: object) -> None:
        self.history = history

    def get_epsilon(self, delta: float) -> float:
        return 0.0


def test_histories_it_cannot_read():
    assert AccountantView(_Odd(None), print).history_since(0) is None
    bad = AccountantView(_Odd([(1.0, 0.1, "two"), (1.0, 0.1, 3)]), print)
    assert bad.history_since(0) is None
    assert bad.steps() == 2  # unreadable step counts: one step per entry


def test_accountant_warnings_are_logged_not_printed(caplog):
    """A run with almost no noise makes Opacus's RDP analysis warn ("Optimal order is the
    smallest alpha"): no warning leaves the view's reads; each is logged once, at DEBUG for the
    hypothetical runs the monitors recompute, at INFO for the claim."""
    import logging
    import warnings

    acc = RDPAccountant()
    acc.history = [(0.03, 0.1, 100)]
    warned: list[str] = []
    view = AccountantView(acc, warned.append)
    with warnings.catch_warnings(record=True) as escaped, \
            caplog.at_level(logging.DEBUG, logger="dpaudit_torch.opacus_tap.accountant"):
        warnings.simplefilter("always")
        claim = view.epsilon(DELTA)
        again = view.epsilon_of_history([(0.03, 0.1, 100)], DELTA)
        hypo = view.epsilon_for(0.03, 0.1, 100, DELTA)
    assert [str(w.message) for w in escaped] == []
    assert claim == again == hypo > 100 and warned == []
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    optimal = "UserWarning: Optimal order is the smallest alpha"
    assert [lv for lv, m in records if optimal in m] == [logging.INFO, logging.DEBUG,
                                                          logging.DEBUG]
    assert any(m.startswith("RDPAccountant.get_epsilon(delta=1e-05): UserWarning")
               for _, m in records)


def test_opacus_epsilons_are_memoised_and_replaced_ones_are_not(monkeypatch):
    """Opacus's own accountants are functions of (history, delta): a second read of the same
    history (the finalize's claim, the accounting check's recomputation, another run with the
    same settings) is not computed again. A ``get_epsilon`` replaced on the instance or on the
    class is asked every time."""
    calls: list[float] = []
    real = PRVAccountant.get_epsilon

    def counted(self, delta, **kw):
        calls.append(delta)
        return real(self, delta, **kw)

    acc = PRVAccountant()
    acc.history = [(1.1, 0.013, 37)]
    view = AccountantView(acc, lambda _m: None)
    first = view.epsilon(DELTA)
    key = (PRVAccountant, ((1.1, 0.013, 37),), DELTA)
    assert memo._MEMO[key][0] == first
    entries = len(memo._MEMO)
    # a fresh accountant of the same class with the same history: the same memo entry
    assert view.epsilon_of_history([(1.1, 0.013, 37)], DELTA) == first
    assert view.epsilon_for(1.1, 0.013, 37, DELTA) == first
    assert len(memo._MEMO) == entries
    fresh = PRVAccountant()
    fresh.history = [(1.1, 0.013, 37)]
    assert first == fresh.get_epsilon(delta=DELTA)
    # replaced on the class: not memoised (its module is not Opacus's)
    monkeypatch.setattr(PRVAccountant, "get_epsilon", counted)
    assert view.epsilon(DELTA) == first and view.epsilon(DELTA) == first
    assert calls == [DELTA, DELTA]
    monkeypatch.undo()
    # replaced on the instance: asked every time, its own answer
    acc.get_epsilon = lambda delta: 123.0
    assert view.epsilon(DELTA) == 123.0
    # another history or delta: another entry
    acc2 = PRVAccountant()
    acc2.history = [(1.1, 0.013, 38)]
    assert AccountantView(acc2, lambda _m: None).epsilon(DELTA) > first
    assert AccountantView(acc2, lambda _m: None).epsilon(1e-6) > first


def test_gdp_under_reports_and_the_audit_says_so():
    """Opacus's GDP accountant (a central-limit approximation; Opacus warns it "can
    underestimate privacy expenditure") claims less than the true epsilon of a short run: the
    accounting monitor's formula check makes it a finding, with the PRV composition's lower
    bound; under RDP the check is not needed (a proven upper bound) and nothing is found."""
    from dpaudit_torch.audit import PrivacyAuditor

    out = {}
    for name in ("gdp", "rdp"):
        s = make_private_setup(accountant=name, sigma=1.0)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1)
        s.train(20)
        rep = aud.finalize()
        out[name] = (rep, rep.to_dict()["audits"]["accounting"], s)
    rep, acc, s = out["gdp"]
    q = s.loader.sample_rate
    truth = PRVAccountant()
    truth.history = [(1.0, q, 20)]
    assert acc["formula_check"] == "checked" and acc["under_reported"] is True
    # the lower bound sits just below the PRV claim (its upper bound) for the same history
    upper = truth.get_epsilon(delta=DELTA)
    assert upper - 0.1 < acc["epsilon_lower_of_history"] < upper
    assert rep.claimed_epsilon < acc["epsilon_lower_of_history"]
    (f,) = [f for f in rep.findings if f["monitor"] == "accounting" and f["level"] == "finding"]
    assert "the accountant under-reports" in f["message"]
    assert rep.verdict.startswith("finding") and not rep.claim_inconsistent
    rep, acc, s = out["rdp"]
    assert acc["formula_check"] == "proven upper bound" and "under_reported" not in acc
    view = AccountantView(s.engine.accountant, lambda _m: None)
    assert view.epsilon_lower_of_history([(1.0, q, 20)], DELTA) is None
    assert not [f for f in rep.findings if f["monitor"] == "accounting"
                and f["level"] != "note"]


def test_prv_bounds_bracket_the_prv_claim():
    """The PRV composition's bounds on the true epsilon: the upper one is what Opacus's PRV
    accountant claims for the same history (the same computation), the lower one at most
    2 eps_error + the delta error's effect below it."""
    from dpaudit_torch.opacus_tap.accountant import prv_epsilon_bounds

    hist = [(1.0, 1 / 23, 50)]
    lower, upper = prv_epsilon_bounds(hist, DELTA)
    acc = PRVAccountant()
    acc.history = list(hist)
    assert upper == acc.get_epsilon(delta=DELTA)
    assert upper - 0.1 < lower < upper
    assert prv_epsilon_bounds(tuple(hist), DELTA) == (lower, upper)  # memoised, same values
