"""The compiled replica of Opacus's joint-norm clipping (``ShadowClipper.clip``): the same
column sums as Opacus's own call on the shadow, checked against that call at its first step and
every ``REPLICA_CHECK_EVERY`` steps, switched off for good when the two disagree, and never used
for clipping code that is not Opacus's. (Ghost clipping's compiled addition: test_ghost.py.)"""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import make_private_setup

from dpaudit_torch._compiled import compiled, set_compiled
from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.opacus_tap import shadow
from dpaudit_torch.opacus_tap.shadow import ShadowClipper
from dpaudit_torch.testing.bugs import apply_bug


def _spy_opacus_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the canaries' calls of Opacus's clipping on the shadow (one entry per call)."""
    calls: list[int] = []
    orig = ShadowClipper.clip_rows

    def spy(self, views, rec, joint=False):
        calls.append(1)
        return orig(self, views, rec, joint)

    monkeypatch.setattr(ShadowClipper, "clip_rows", spy)
    return calls


def _run(replica: bool, dtype: torch.dtype, steps: int = 9) -> tuple[torch.Tensor, ...]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        s = make_private_setup(seed=3)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, k_pairs=8,
                             m_canaries=96, check_every=3)
        clipper = aud.tap.injector.shadow
        clipper.replica_clip = replica
        projections = []
        for x, y in s.batches(steps, batch=24):
            s.step(x, y)
            projections.append(aud.tap.reader.last_values.clone())
        assert (clipper.replica_steps > 0) == replica
        assert aud.design.n_spread  # spread rows (several entries per row) are covered
        return (torch.stack(projections), aud.monitors["one_run"].scores["llr"].clone(),
                torch.tensor(aud.combined_log_wealth),
                *[p.detach().clone() for p in s.model.parameters()])
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_replica_gives_opacus_sums_exactly(dtype):
    """Twin runs (same model, data, noise, auditor seed), the canaries clipped by the replica
    and by Opacus's own call: the same projections, one-run scores, wealth and trained
    parameters, bit for bit (every operation is rounded to the rows' dtype as Opacus's is)."""
    assert compiled()
    for u, v in zip(_run(True, dtype), _run(False, dtype)):
        assert torch.equal(u, v)


def test_replica_checked_against_opacus_at_first_step_and_periodically(monkeypatch):
    monkeypatch.setattr(shadow, "REPLICA_CHECK_EVERY", 4)
    calls = _spy_opacus_calls(monkeypatch)
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    s.train(9)
    clipper = aud.tap.injector.shadow
    assert clipper.replica_steps == 9 and clipper.replica_ok
    assert len(calls) == 3  # steps 1, 5 and 9


def test_disagreement_switches_the_replica_off(monkeypatch, caplog):
    """A change below Opacus's code that the replica does not share (here ``Tensor.norm``
    patched after attach, halving every norm) shows at the next check: a warning, and every
    later step clips the canaries with Opacus's call, whose behaviour the audit then sees."""
    monkeypatch.setattr(shadow, "REPLICA_CHECK_EVERY", 3)
    calls = _spy_opacus_calls(monkeypatch)
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    s.train(2)  # step 1 checked (agreement), step 2 replica only
    assert len(calls) == 1 and aud.tap.injector.shadow.replica_ok
    norm = torch.Tensor.norm
    monkeypatch.setattr(torch.Tensor, "norm", lambda self, *a, **k: 0.5 * norm(self, *a, **k))
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch.opacus_tap.shadow"):
        s.train(4)  # step 3: replica still on, not checked; step 4 checked: disagreement
    assert not aud.tap.injector.shadow.replica_ok
    assert any("disagrees with Opacus's own call" in r.getMessage() for r in caplog.records)
    assert len(calls) == 1 + 1 + 2  # the check at step 4, then steps 5 and 6 by Opacus
    assert aud.tap.injector.shadow.replica_steps == 4  # steps 1-4 (the checked ones included)


def test_replica_only_for_opacus_own_code_and_compiled_kernels():
    s = make_private_setup()
    apply_bug(s.optimizer, "per-tensor-clipping")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    s.train(2)
    assert aud.tap.injector.shadow.replica_steps == 0
    aud.finalize()
    was = compiled()
    try:
        set_compiled(False)
        s = make_private_setup()
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                             compiled_kernels=False)
        s.train(2)
        assert aud.step == 2 and aud.tap.injector.shadow.replica_steps == 0
    finally:
        set_compiled(was)
