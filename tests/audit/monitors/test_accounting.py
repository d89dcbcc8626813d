"""The accounting monitor (dpaudit_torch/audit/monitors/accounting.py): releases, real examples
and standardized noise of hand-made step records against what the accountant was told; the
epsilon recomputed from what was observed; what it says when a fact it needs is unavailable."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, MonitorContext, StepRecord, build_monitors
from dpaudit_torch.audit.monitors import AccountingMonitor
from dpaudit_torch.contract import (
    ACCOUNTANT_HISTORY,
    EPSILON_LOWER_OF_HISTORY,
    EPSILON_OF_HISTORY,
    N_REAL_NOT_OBSERVED,
    N_RECORDS,
    SAMPLE_RATE,
)
from dpaudit_torch.stats.sampling import rate_interval

K, M, U = 2, 4, 200  # U: noise-audit coordinates per step
#: the accounting intervals' total level: their share of the audit's alpha (docs/design.md
#: section 14: an eighth of 1e-3), split in two (Bonferroni)
LEVEL = AuditConfig().level_of("consistency")
N, Q, T = 256, 0.125, 40


def eps_of_history(history: list[tuple[float, float, int]]) -> float:
    """A stand-in accountant: increasing in the rate and the steps, decreasing in sigma."""
    return sum(n * q / s for s, q, n in history)


def _facts(history: list[tuple[float, float, int]] | None = None, **drop: bool) -> dict:
    hist = [(1.0, Q, T)] if history is None else history
    facts: dict[Any, Any] = {SAMPLE_RATE: Q, N_RECORDS: N, ACCOUNTANT_HISTORY: lambda: hist,
                             EPSILON_OF_HISTORY: eps_of_history}
    return {f: v for f, v in facts.items() if not drop.get(f.name)}


def _monitor(facts: dict | None = None, **options: Any) -> AccountingMonitor:
    cfg = AuditConfig(k_pairs=K, m_canaries=M, monitor_options={"accounting": options})
    ctx = MonitorContext(config=cfg, k_pairs=K, m_canaries=M, device="cpu",
                         warn=lambda _m: None, facts=_facts() if facts is None else facts)
    mon = build_monitors(ctx, ("accounting",))["accounting"]
    assert isinstance(mon, AccountingMonitor)
    return mon


def _records(seed: int, steps: int = T, rate: float = Q, std: float = 1.0, sigma: float = 1.0,
             uncounted: bool = False, noise: bool = True, sumsq: bool = False,
             finite: Any = True) -> list[StepRecord]:
    """Steps of a run whose real batches are Binomial(N, rate) and whose standardized noise has
    standard deviation ``std`` (1: the noise the optimizer claims)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    out = []
    for t in range(1, steps + 1):
        v = torch.zeros(2 * K + M, dtype=torch.float64)
        xi = std * torch.randn(U, generator=g, dtype=torch.float64)
        out.append(StepRecord(
            step=t, values=v, x=v[:K], y=v[K:2 * K], coins=torch.tensor([True, False]),
            sigma=sigma, sigma_claimed=sigma,
            n_real=None if uncounted else int(rng.binomial(N, rate)),
            noise=xi if noise else None,
            noise_sumsq=float((xi * xi).sum()) if sumsq else None,
            finite=finite() if callable(finite) else finite))
    return out


def _run(facts: dict | None = None, claimed: float | None = None,
         **kw: Any) -> AccountingMonitor:
    mon = _monitor(facts)
    for r in _records(1, **kw):
        mon.observe(r)
    hist = [(1.0, Q, T)]
    mon.finalize(eps_of_history(hist) if claimed is None else claimed)
    return mon


def test_counts_what_it_observes() -> None:
    mon = _monitor()
    assert AccountingMonitor.observes_nonfinite  # a dropped step was still a release
    recs = _records(2, steps=3)
    recs[1].micro_steps = 4
    recs[2].sigma = 1.5
    for r in recs:
        mon.observe(r)
    assert mon.releases == 3 and mon.micro_steps == 6 and mon.sigmas == {1.0, 1.5}
    assert mon.examples == sum(r.n_real for r in recs) and mon.examples_known
    assert mon.advance() is None and mon.findings() == []  # it never bets


def test_a_consistent_run() -> None:
    mon = _run()
    r = mon.result
    assert (r["releases"], r["micro_steps"], r["n_records"], r["loader_rate"]) == (T, T, N, Q)
    assert r["accountant_steps"] == T and r["accountant_history"] == [[1.0, Q, T]]
    assert r["checks_not_run"] == []
    assert r["rate_interval"] == pytest.approx(list(rate_interval(r["examples"], N, T,
                                                                  LEVEL / 2)))
    assert r["rate_interval"][0] < Q < r["rate_interval"][1]
    assert r["rate_estimate"] == r["examples"] / (N * T)
    lo, hi = r["noise_multiplier_interval"]
    assert lo < 1.0 < hi and hi - lo < 0.1
    # recomputed at the conservative ends: the lower rate, the upper noise multiplier
    assert r["recomputed_from"] == {"noise_multiplier": hi, "sample_rate": r["rate_interval"][0],
                                    "steps": T}
    assert r["recomputed_epsilon"] == pytest.approx(eps_of_history([(hi, r["rate_interval"][0],
                                                                      T)]))
    assert r["recomputed_epsilon"] < r["claimed_epsilon"] == eps_of_history([(1.0, Q, T)])
    assert r["inconsistent"] is False
    assert r["explanation"] == "the inputs agree with the accountant's within the intervals"
    assert mon.findings() == []
    c = mon.contribution()
    assert c.section == r and c.section is not r and c.verdict is None
    assert c.bounds == {} and c.fields == {} and c.canaries == {}


@pytest.mark.parametrize("case,run,explains", [
    ("steps counted per micro-batch", dict(facts=_facts([(1.0, Q, T // 2)]),
                                           claimed=eps_of_history([(1.0, Q, T // 2)])),
     f"the accountant counted {T // 2} steps; noise was released {T} times"),
    ("a wrong sample rate", dict(rate=2 * Q),
     "each release was over about 2x the examples the accountant's sample rate 0.125 implies"),
    ("half the noise", dict(std=0.5), "below the accountant's 1"),
])
def test_an_inconsistent_claim(case: str, run: dict[str, Any], explains: str) -> None:
    mon = _run(**run)
    r = mon.result
    assert r["inconsistent"] is True and r["recomputed_epsilon"] > r["claimed_epsilon"], case
    assert explains in r["explanation"]
    (f,) = mon.findings()
    assert f.monitor == "accounting" and f.level == "inconsistent" and f.where == "accountant"
    assert f"the claimed epsilon {r['claimed_epsilon']:.4g} is inconsistent" in f.message
    assert explains in f.message and f"{100 * (1 - LEVEL):.6g}% intervals" in f.message
    assert f"epsilon >= {r['recomputed_epsilon']:.4g}" in f.message
    assert mon.contribution().verdict == "inconsistent"


def test_without_a_claim_nothing_is_inconsistent() -> None:
    mon = _monitor()
    for r in _records(1, std=0.5):
        mon.observe(r)
    mon.finalize(None)
    assert mon.result["claimed_epsilon"] is None and mon.result["inconsistent"] is False
    assert mon.result["recomputed_epsilon"] > 0 and mon.contribution().verdict is None


def _notes(mon: AccountingMonitor) -> list[str]:
    assert all(f.level == "note" and f.where == "accountant" for f in mon.findings())
    return [f.message for f in mon.findings()]


def test_without_the_accountant_history_the_check_is_not_run() -> None:
    mon = _run(_facts(accountant_history=True))
    note = ("check not run: steps and rate against the accountant: the accountant keeps no "
            "history of (noise multiplier, sample rate, steps)")
    assert _notes(mon) == [note]
    assert "accountant_steps" not in mon.result and "recomputed_epsilon" not in mon.result
    assert mon.result["rate_interval"] and mon.result["noise_multiplier_interval"]
    assert mon.contribution().verdict is None
    # an accountant whose history cannot be read (the callable answers None) is the same
    none = _run({**_facts(), ACCOUNTANT_HISTORY: lambda: None})
    assert _notes(none) == [note]
    # without the accountant's epsilon of a history: the intervals, no recomputed epsilon
    no_eps = _run(_facts(epsilon_of_history=True))
    assert no_eps.findings() == [] and "recomputed_epsilon" not in no_eps.result
    assert no_eps.result["accountant_steps"] == T


def test_without_the_dataset_size_the_rate_is_not_checked() -> None:
    mon = _run(_facts(n_records=True))
    assert _notes(mon) == ["check not run: sample rate: N is unknown (the number of records "
                           "training samples from: not given to this audit)"]
    assert "rate_interval" not in mon.result and mon.result["n_records"] is None
    # the accountant's own rate is used for the recomputed epsilon
    assert mon.result["recomputed_from"]["sample_rate"] == Q


def test_without_batch_sizes_or_noise_those_checks_are_not_run() -> None:
    uncounted = _run(uncounted=True)
    assert uncounted.result["examples"] is None and not uncounted.examples_known
    assert _notes(uncounted) == [f"check not run: sample rate: {N_REAL_NOT_OBSERVED}"]
    quiet = _run(noise=False)
    assert _notes(quiet) == ["check not run: noise multiplier: no noise was read (noise audit "
                             "off or no steps)"]
    # the accountant's own sigma is used
    assert quiet.result["recomputed_from"]["noise_multiplier"] == 1.0
    empty = _monitor()
    empty.finalize(1.0)
    assert empty.result["releases"] == 0 and "recomputed_epsilon" not in empty.result


def test_a_failing_accountant_is_a_note() -> None:
    def broken(_h: list) -> float:
        raise ArithmeticError("cannot compose")

    mon = _run({**_facts(), EPSILON_OF_HISTORY: broken})
    (msg,) = _notes(mon)
    assert msg.startswith("check not run: recomputed epsilon: the accountant failed (")
    assert "cannot compose" in msg and "recomputed_epsilon" not in mon.result


def test_the_adapters_sum_of_squares_gives_the_same_interval() -> None:
    a, b = _run(), _run(sumsq=True)
    assert a.result["noise_multiplier_interval"] == pytest.approx(
        b.result["noise_multiplier_interval"], rel=1e-12)


def test_noise_of_steps_flagged_non_finite_is_left_out() -> None:
    """Host flags (False: the engine shows the step only to monitors that count releases) and
    device flags (0-d tensors, resolved at finalize) give the same interval as leaving the
    steps out."""
    keep = _run(steps=20)
    flags = iter([True, False] * 20)
    for finite in (False, lambda: torch.tensor(next(flags))):
        mon = _monitor()
        recs = _records(1, steps=20)
        bad = _records(9, steps=20, std=5.0, finite=finite)
        for good, worse in zip(recs, bad):
            mon.observe(good)
            if finite is False or not bool(worse.finite):
                mon.observe(worse)
        mon.finalize(1.0)
        assert mon.releases > 20
        assert mon.result["noise_multiplier_interval"] == pytest.approx(
            keep.result["noise_multiplier_interval"], rel=1e-12)


@pytest.mark.parametrize("deferred", [False, True])
def test_state_round_trip_gives_the_same_result(deferred: bool) -> None:
    """A checkpoint mid-run resumes to the same result, also where finiteness is deferred to
    the device's flags (the accelerator path: their noise counts are part of the state)."""
    recs = (_records(4, finite=lambda: torch.tensor(True)) if deferred
            else _records(4, rate=2 * Q))
    mon = _monitor()
    for r in recs[:15]:
        mon.observe(r)
    again = _monitor()
    again.load_state_dict(mon.state_dict())
    for m in (mon, again):
        for r in recs[15:]:
            m.observe(r)
        m.finalize(3.0)
    assert again.result["noise_multiplier_interval"] == pytest.approx(
        mon.result["noise_multiplier_interval"])
    if not deferred:
        assert mon.result == again.result and mon.result["inconsistent"] is True
        assert mon.findings() == again.findings()


def test_alpha_from_the_options_widens_the_intervals() -> None:
    wide = _monitor(alpha=1e-6)
    assert wide.settings.alpha == 1e-6
    for r in _records(1):
        wide.observe(r)
    wide.finalize(1.0)
    narrow = _run()
    w, n = wide.result["rate_interval"], narrow.result["rate_interval"]
    assert w[0] < n[0] and w[1] > n[1]
    assert math.isfinite(wide.result["recomputed_epsilon"])


@pytest.mark.parametrize("lower,under", [(eps_of_history([(1.0, Q, T)]) * 1.5, True),
                                         (eps_of_history([(1.0, Q, T)]) * 0.5, False)])
def test_the_claim_against_a_lower_bound_on_its_own_history(lower: float, under: bool) -> None:
    """The accountant's arithmetic on its own inputs: a claim below a lower bound on the
    epsilon of the history it counted is a finding (deterministic: no level spent), whatever
    the intervals say; the bound is asked for the history's entries."""
    asked: list[list[tuple[float, float, int]]] = []

    def lower_of(h: list[tuple[float, float, int]]) -> float:
        asked.append(h)
        return lower

    mon = _run({**_facts(), EPSILON_LOWER_OF_HISTORY: lower_of})
    r = mon.result
    claim = eps_of_history([(1.0, Q, T)])
    assert asked == [[(1.0, Q, T)]]
    assert r["formula_check"] == "checked" and r["epsilon_lower_of_history"] == lower
    assert r["under_reported"] is under and r["inconsistent"] is False
    found = [f for f in mon.findings() if f.level == "finding"]
    if under:
        (f,) = found
        assert f.where == "accountant" and "the accountant under-reports" in f.message
        assert f"claims epsilon {claim:.4g}" in f.message and f"at least {lower:.4g}" in f.message
    else:
        assert found == []
    assert mon.contribution().verdict is None  # not a proof path
    sec = mon.check_section()
    check = ("claimed ε at least a numerical lower bound on the ε of the accountant's own "
             "history")
    assert (check, "under-reported" if under else "passed") in sec.checked
    assert ("lower bound on the ε of the accountant's history", lower) in sec.measured


def test_the_lower_bound_not_needed_failing_or_too_long() -> None:
    # None: the accountant's epsilon is a proven upper bound (RDP, PRV); nothing to compare
    mon = _run({**_facts(), EPSILON_LOWER_OF_HISTORY: lambda _h: None})
    assert mon.result["formula_check"] == "proven upper bound"
    assert "under_reported" not in mon.result and mon.findings() == []
    assert [w for w, _ in mon.check_section().not_checked] == ["the accountant's formula"]

    def broken(_h: list) -> float:
        raise ArithmeticError("no domain")

    mon = _run({**_facts(), EPSILON_LOWER_OF_HISTORY: broken})
    (msg,) = _notes(mon)
    assert "the accountant's formula: the lower bound failed" in msg and "no domain" in msg
    # a schedule changing at every step: too many entries to compose at finalize
    hist = [(1.0 + 0.01 * t, Q, 1) for t in range(T)]
    long = {**_facts(hist), EPSILON_LOWER_OF_HISTORY: lambda _h: 1e9}
    mon = _monitor(long)
    assert T > AccountingMonitor.MAX_FORMULA_ENTRIES // 2
    mon.MAX_FORMULA_ENTRIES = T - 1
    for r in _records(1):
        mon.observe(r)
    mon.finalize(1.0)
    assert any(f"its history has {T} entries" in m for m in
               [f.message for f in mon.findings() if f.level == "note"])
    assert "under_reported" not in mon.result
