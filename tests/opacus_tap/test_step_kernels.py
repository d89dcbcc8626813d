"""The role coins and Poisson inclusions of the canaries (``plan_step``'s geometric gaps).

An IN one-run canary must be included at every step independently with the data loader's rate q,
and an OUT canary never: that is the mechanism the accountant describes, and the one-run bound is
valid only for it. The plan draws the gaps between included canaries (geometric), so a step uses
k + 1 + (inclusions) uniforms. Tolerances: binomial standard errors (4 SE, two-sided, about
6e-5 per check).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.opacus_tap import plan  # noqa: E402
from dpaudit_torch.opacus_tap._step_kernels import plan_step  # noqa: E402


def _plans(q: float, m: int, n_steps: int, seed: int = 0, k: int = 4):
    """n_steps plans of one stream; returns (IN mask, [steps, m] inclusion indicators, coins
    [steps, k])."""
    rng = np.random.default_rng(seed)
    in_mask = rng.random(m) < 0.5
    in_index = np.flatnonzero(in_mask).astype(np.int64)
    consts = np.concatenate([np.zeros(k), np.arange(k), np.arange(k) + k, np.zeros(m),
                             np.arange(m)]).astype(np.int64)
    empty = np.zeros((0, 2, 0), dtype=np.int64)
    draws = rng.random(n_steps * (k + 1 + int(2 * q * m) + 50))
    inc = np.zeros((n_steps, m), dtype=bool)
    coins = np.zeros((n_steps, k), dtype=bool)
    at = 0
    scratch = np.empty(m, dtype=np.int64)
    log1m_q = math.log1p(-q) if q < 1 else -math.inf
    for t in range(n_steps):
        out = plan_step(draws, at, in_index, log1m_q, consts, k, m, 1, np.zeros(0, np.int64),
                        empty, empty, 1.0, scratch, 1)
        assert out[0] >= 0, "the test's draws ran out"
        included = out[2]
        assert np.all(np.diff(included) > 0)  # index order
        assert out[0] == at + k + 1 + included.size  # k coins, one gap per inclusion, one more
        at = out[0]
        inc[t, included] = True
        coins[t] = out[1]
    return in_mask, inc, coins


@pytest.mark.parametrize("q", [0.01, 0.2])
def test_in_canaries_included_independently_at_rate_q(q):
    m, T = 400, 2000
    in_mask, inc, coins = _plans(q, m, T)
    assert not inc[:, ~in_mask].any()  # an OUT canary is never included
    x = inc[:, in_mask]
    n = x.size
    se = math.sqrt(q * (1 - q) / n)
    assert abs(x.mean() - q) < 4 * se
    # each canary's own rate (Binomial(T, q)): none further than 5 SE (about 3e-7 each)
    per = x.mean(axis=0)
    assert np.all(np.abs(per - q) < 5 * math.sqrt(q * (1 - q) / T))
    # independence of neighbours in the gap walk and across steps: P(both) = q^2
    both = (x[:, 1:] & x[:, :-1]).mean()
    se2 = math.sqrt(q * q * (1 - q * q) / x[:, 1:].size)
    assert abs(both - q * q) < 4 * se2 + 1e-12
    lag = (x[1:] & x[:-1]).mean()
    assert abs(lag - q * q) < 4 * math.sqrt(q * q * (1 - q * q) / x[1:].size)
    # the number included per step: Binomial(n_in, q)
    counts = x.sum(axis=1)
    n_in = int(in_mask.sum())
    var = n_in * q * (1 - q)
    assert abs(counts.mean() - n_in * q) < 4 * math.sqrt(var / T)
    assert 0.85 < counts.var() / var < 1.15  # chi2 with T - 1 dof: sd about 0.03
    # role coins: fair
    assert abs(coins.mean() - 0.5) < 4 * math.sqrt(0.25 / coins.size)


def test_rate_one_includes_every_in_canary():
    in_mask, inc, _ = _plans(1.0, 50, 20)
    assert inc[:, in_mask].all() and not inc[:, ~in_mask].any()


def test_plan_says_when_the_draws_run_out():
    in_index = np.arange(100, dtype=np.int64)
    consts = np.zeros(3 * 2 + 2 * 100, dtype=np.int64)
    empty = np.zeros((0, 2, 0), dtype=np.int64)
    draws = np.full(10, 0.5)
    out = plan_step(draws, 0, in_index, math.log1p(-0.999), consts, 2, 100, 1,
                    np.zeros(0, np.int64), empty, empty, 1.0, np.empty(100, np.int64), 1)
    assert out[0] == -1


def test_stream_crosses_blocks_and_resumes_exactly(monkeypatch):
    """Blocks of 97 uniforms (so that steps cross block ends): the plans of an auditor restored
    from a state_dict taken at any step are those of the original run."""
    monkeypatch.setattr(plan, "DRAW_BLOCK", 97)
    cfg = dict(k_pairs=4, m_canaries=300, check_every=3)

    def auditor(seed):
        s = make_private_setup(sigma=1.0)
        return PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=seed, **cfg)

    aud = auditor(5)
    inj = aud.tap.injector
    plans, states = [], []
    for _ in range(60):
        states.append(aud.state_dict())
        p = inj.plan_next()
        plans.append((p.coins_cpu.clone(), p.included.clone()))
    assert inj.planner.block_crossings >= 10  # about 24 uniforms per step here
    for t in (0, 1, 17, 31, 59):
        other = auditor(99)
        other.load_state_dict(states[t])
        for coins, inc in plans[t:t + 5]:
            p = other.tap.injector.plan_next()
            assert torch.equal(p.coins_cpu, coins) and torch.equal(p.included, inc)


def test_state_of_the_step_counted_stream_resumes_at_its_uniform():
    """A state written before the geometric inclusions ("mechanics_pos" counted steps of k + m
    uniforms, no "mechanics_unit" in the adapter's part of the state) resumes at the same uniform
    of the same stream."""
    cfg = dict(k_pairs=4, m_canaries=30, check_every=3)
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, **cfg)
    sd = aud.state_dict()
    tap = sd["tap"]
    tap.pop("mechanics_unit")
    tap["mechanics_pos"] = 3  # three old steps of 4 + 30 uniforms
    s2 = make_private_setup(sigma=1.0)
    other = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=9, **cfg)
    other.load_state_dict(sd)
    state, used = other.tap.injector.draw_position()
    assert used == 3 * 34 and torch.equal(state, tap["mechanics_rng"])
    g = torch.Generator()
    g.set_state(tap["mechanics_rng"])
    stream = torch.rand(200, generator=g, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(other.tap.injector.next_uniforms(), stream[102:102 + 5])
