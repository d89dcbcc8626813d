"""The noise, sampling and accounting monitors on inputs they cannot fully use: each says which
check it cannot run and why, and the rest of the audit runs."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup
from torch.utils.data import DataLoader

from dpaudit_torch.audit import PrivacyAuditor


def _notes(report) -> list[str]:
    return [f["message"] for f in report.findings if f["level"] == "note"]


def test_accountant_without_history_skips_the_accounting_comparison():
    s = make_private_setup(sigma=1.0)

    class Opaque:  # an accountant that gives epsilon but keeps no history
        def __init__(self, inner):
            self._inner = inner

        def get_epsilon(self, delta):
            return self._inner.get_epsilon(delta=delta)

    real = s.engine.accountant
    s.engine.accountant = Opaque(real)
    # the step hook must feed the engine's accountant (another one is refused at attach):
    # accounting by the user's own hook, which steps the wrapped accountant
    s.optimizer.attach_step_hook(
        lambda opt: real.step(noise_multiplier=opt.noise_multiplier, sample_rate=1 / 8))
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=4, m_canaries=32)
    s.train(8)
    rep = aud.finalize()
    assert any("keeps no history" in n for n in _notes(rep))
    assert rep.audits["sampling"]["run"] is True and rep.audits["noise"]["run"] is True
    assert not rep.claim_inconsistent and not rep.violation


def test_loader_without_dataset_length_skips_sampling_and_rate():
    s = make_private_setup(sigma=1.0)

    class NoLenLoader:  # iterates like the Poisson loader, but its dataset has no length
        def __init__(self, loader):
            self.sample_rate = loader.sample_rate
            self.dataset = object()
            self._loader = loader

        def __iter__(self):
            return iter(self._loader)

    loader = NoLenLoader(s.loader)
    aud = PrivacyAuditor(s.engine, s.optimizer, loader, seed=1, k_pairs=4, m_canaries=32)
    for _ in range(8):
        x, y = next(iter(loader))
        s.step(x, y)
    rep = aud.finalize()
    assert rep.audits["sampling"]["run"] is False
    assert "no length" in rep.audits["sampling"]["reason_not_run"]
    assert any("N is unknown" in n for n in _notes(rep))
    # the loader cannot be checked against the training: a note, the accountant's rate used
    assert any("cannot be checked against the training" in n for n in _notes(rep))
    assert rep.audits["noise"]["run"] is True and rep.training["audited_steps"] == 8


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_users_own_sampler_is_audited_at_one_over_len_and_caught_if_fixed_size(mode: str):
    """A user's own loader (fixed-size shuffled batches while the accountant assumes Poisson
    sampling at 1 / len(loader)): audited at that rate, with a warning, and its batches are
    found not to be Poisson samples, also under ghost clipping (the real examples counted from
    Opacus's per-sample norms)."""
    s = make_private_setup(sigma=1.0, poisson=False, batch_size=32, mode=mode)
    assert not hasattr(s.loader, "sample_rate")
    loader = DataLoader(s.loader.dataset, batch_size=32, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    aud = PrivacyAuditor(s.engine, s.optimizer, loader, seed=1, k_pairs=4, m_canaries=32)
    steps = 0
    while steps < 60 and not aud.should_stop:
        for x, y in loader:
            s.step(x, y)
            steps += 1
            if steps >= 60 or aud.should_stop:
                break
    rep = aud.finalize()
    assert any("not Opacus's Poisson loader" in w for w in rep.warnings)
    assert rep.violation and any(f["monitor"] == "sampling" and f["level"] == "violation"
                                 for f in rep.findings)


def test_custom_optimizer_subclass_is_audited():
    s = make_private_setup(sigma=1.0)
    base = type(s.optimizer)
    calls = {"n": 0}

    class Logged(base):  # type: ignore[misc, valid-type]
        def add_noise(self) -> None:
            calls["n"] += 1
            super().add_noise()

    s.optimizer.__class__ = Logged
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, k_pairs=4, m_canaries=32)
    s.train(10)
    rep = aud.finalize()
    assert calls["n"] == 10 and rep.training["optimizer"] == "Logged"
    assert not rep.violation and not rep.claim_inconsistent
    assert rep.audits["accounting"]["releases"] == 10


@pytest.mark.parametrize("ghost", [False, True])
def test_accounting_agrees_on_correct_runs(ghost):
    s = make_private_setup(sigma=1.0, mode="ghost" if ghost else "hooks")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=3, k_pairs=4, m_canaries=32)
    s.train(20)
    rep = aud.finalize()
    acc = rep.audits["accounting"]
    assert acc["releases"] == acc["accountant_steps"] == 20
    assert acc["recomputed_epsilon"] <= rep.claimed_epsilon
    assert not rep.claim_inconsistent
    # ghost clipping too: the real examples are counted (Opacus's per-sample norms), so the
    # sample rate is checked in both modes
    lo, hi = acc["rate_interval"]
    assert lo <= s.loader.sample_rate <= hi
    assert not any("not observed" in n for n in _notes(rep))
    assert rep.audits["sampling"]["run"] is True
