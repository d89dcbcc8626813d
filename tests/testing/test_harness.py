"""testing.harness: the detection benchmark's loop trains, audits and reports."""

from __future__ import annotations

from dpaudit_torch.testing.harness import digits_training, run_audited, run_bug
from dpaudit_torch.testing.training import ContractBug


def test_correct_run_and_between_hooks_run():
    calls = []

    def apply(tr):
        tr.between.append(lambda: calls.append(1))
        return tr

    rep = run_bug(ContractBug("count", "release", "counts the loop's steps", apply,
                              per_step=False), seed=0, steps=6)
    assert len(calls) == 6
    assert rep.training["audited_steps"] == 6 and not rep.violation and not rep.claim_refuted


def test_run_audited_stops_at_steps():
    tr = digits_training(1, batch=32)
    rep = run_audited(tr, 3, seed=1, batch=32.0)
    assert rep.training["audited_steps"] == 3
