"""The one-run canaries' IN/OUT coins stay secret until finalize().

What is checked: no log record (DEBUG and up, any logger) and no Python warning emitted during a
run carries the coins or the IN index list; no tensor equal to them is reachable through plain
attributes (``__dict__``), containers and bound methods from the optimizer, the model or the data
loader (the coins live only inside the ``__slots__`` object ``SecretCoins``, which has no public
accessor but ``reveal()``), nor in their state_dicts; ``repr`` shows nothing; ``seed=None`` draws
from OS entropy, so two unseeded auditors differ.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from conftest import make_private_setup

import dpaudit_torch.canaries as canaries
from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.testing import bugs

M = 40


def _secret(aud: PrivacyAuditor) -> tuple[torch.Tensor, list[int]]:
    # test-only peek (does not mark the coins revealed)
    mask = aud.monitors["one_run"].coins.state()[0].clone()
    return mask, torch.nonzero(mask).reshape(-1).tolist()


def _reachable_tensors(roots: list[Any], limit: int = 200_000) -> list[torch.Tensor]:
    """Every tensor reachable from ``roots`` through __dict__ attributes, dict / list / tuple /
    set items and bound methods' __self__."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    stack = list(roots)
    while stack and len(seen) < limit:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, (str, bytes, int, float, bool)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            out.append(o)
            stack.extend(vars(o).values())  # attributes set on tensors (p.grad_sample, ...)
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
            continue
        if isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
            continue
        if hasattr(o, "__self__") and hasattr(o, "__func__"):  # bound method
            stack.append(o.__self__)
            continue
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict):
            stack.extend(d.values())
    return out


def _leaks(t: torch.Tensor, mask: torch.Tensor, idx: list[int]) -> bool:
    if t.dtype == torch.bool and t.shape == mask.shape and torch.equal(t.cpu(), mask):
        return True
    if t.dtype in (torch.int64, torch.int32) and t.numel() == len(idx) and len(idx) > 3:
        return t.reshape(-1).cpu().tolist() == idx
    return False


def test_coins_never_in_logs_or_warnings(caplog):
    s = make_private_setup(sigma=1.0)
    bugs.apply_bug(s.optimizer, "no-noise")  # a violation: the auditor logs more
    caplog.set_level(logging.DEBUG)
    logging.getLogger().setLevel(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, k_pairs=8, m_canaries=M,
                             check_every=2, claimed_every=2, on_violation="warn",
                             on_step=lambda m: logging.getLogger("user").debug("%s", m))
        mask, idx = _secret(aud)
        for x, y in s.batches(8, batch=16):
            s.step(x, y)
        assert aud.violation  # the run did log its warnings
        text_parts = []
        for r in caplog.records:
            text_parts.append(r.getMessage())
            text_parts.append(repr(r.args))
            if isinstance(r.args, tuple):
                for a in r.args:
                    assert not (isinstance(a, torch.Tensor) and _leaks(a, mask, idx))
        text_parts += [str(w.message) for w in caught]
    text = "\n".join(text_parts)
    assert len(caplog.records) > 0
    for needle in (str(idx), str(mask.tolist()), repr(mask), str(mask.int().tolist()),
                   ", ".join(map(str, idx))):
        assert needle not in text
    assert not aud.monitors["one_run"].coins.revealed
    rep = aud.finalize()  # revealed only now
    assert aud.monitors["one_run"].coins.revealed and len(rep.one_run_scores["in"]) == len(idx)


def test_coins_not_reachable_from_optimizer_model_data():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, k_pairs=8, m_canaries=M,
                         check_every=3)
    mask, idx = _secret(aud)
    for x, y in s.batches(4, batch=16):
        s.step(x, y)
    roots = [s.optimizer, s.model, s.loader, s.optimizer.state_dict(), s.model.state_dict(),
             list(s.model.parameters())]
    tensors = _reachable_tensors(roots)
    assert len(tensors) > 10  # the walk does reach the parameters, grads, per-sample grads
    assert not any(_leaks(t, mask, idx) for t in tensors)
    # the auditor's own attributes (outside SecretCoins) do not hold them either
    assert not any(_leaks(t, mask, idx) for t in _reachable_tensors([vars(aud)]))
    coins = aud.monitors["one_run"].coins
    for r in (repr(aud), str(aud), repr(coins), str(coins)):
        assert str(idx) not in r and "True" not in r.replace("attached=True", "")
    assert "tensor" not in repr(aud.monitors["one_run"].coins)


def test_seed_none_uses_os_entropy_and_two_auditors_differ(monkeypatch):
    calls: list[int] = []
    real = canaries.secrets.randbits

    def counting(k: int) -> int:
        calls.append(k)
        return real(k)

    monkeypatch.setattr(canaries.secrets, "randbits", counting)
    a_setup, b_setup = make_private_setup(sigma=1.0), make_private_setup(sigma=1.0)
    state = torch.get_rng_state()  # the auditor must not draw from the global generator
    a = PrivacyAuditor(a_setup.engine, a_setup.optimizer, a_setup.loader, seed=None,
                       k_pairs=8, m_canaries=M)
    b = PrivacyAuditor(b_setup.engine, b_setup.optimizer, b_setup.loader, seed=None,
                       k_pairs=8, m_canaries=M)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(calls) == 6  # three streams per auditor (design, mechanics, secret)
    assert a.seed_policy == b.seed_policy == "os-entropy"
    da, db = a.design, b.design
    assert not (torch.equal(da.one_flat, db.one_flat) and torch.equal(da.pair_a, db.pair_a))
    # the coins: equal by chance with probability 2^-40
    assert not torch.equal(a.monitors["one_run"].coins.reveal(),
                           b.monitors["one_run"].coins.reveal())
    # a seeded auditor is reproducible (and does not use OS entropy)
    n = len(calls)
    c_setup = make_private_setup(sigma=1.0)
    c = PrivacyAuditor(c_setup.engine, c_setup.optimizer, c_setup.loader, seed=3, k_pairs=8,
                       m_canaries=M)
    c.detach()
    d = PrivacyAuditor(c_setup.engine, c_setup.optimizer, c_setup.loader, seed=3, k_pairs=8,
                       m_canaries=M)
    assert len(calls) == n
    assert torch.equal(c.design.one_flat, d.design.one_flat)
    assert torch.equal(c.monitors["one_run"].coins.reveal(), d.monitors["one_run"].coins.reveal())
