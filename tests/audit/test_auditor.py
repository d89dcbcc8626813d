"""PrivacyAuditor: injection, observation, decisions, detach, bad input.

Every test uses the 610-parameter MLP of conftest.py and a few steps, so the file runs in well
under a minute on two cores.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
import torch
from conftest import capture_released as _capture
from conftest import expected_presence, make_private_setup
from conftest import optimizer_untouched as _untouched

from dpaudit_torch.audit import PrivacyAuditor, PrivacyViolationError
from dpaudit_torch.opacus_tap import OWNER_ATTR
from dpaudit_torch.testing import bugs

# ------------------------------------------------------------------ exactness of the canary
CASES = [
    ("hooks", "flat", 1.0, {}),
    ("hooks", "flat", 2.5, {}),
    ("functorch", "flat", 1.0, {}),
    ("ew", "flat", 1.0, {}),
    ("hooks", "per_layer", [0.5, 1.0, 1.5, 2.0], {}),
    ("hooks", "adaptive", 1.0, dict(target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                                    max_clipbound=10.0, min_clipbound=0.1,
                                    unclipped_num_std=1.0)),
]


@pytest.mark.parametrize("mode,clipping,C,extra", CASES)
def test_sigma0_canary_contributes_exactly_C(mode, clipping, C, extra):
    """At sigma = 0 a present canary adds exactly C_i (1e-6 relative) at its coordinate and an
    absent one 0: the difference to an unaudited twin run on the same batches is compared."""
    a = make_private_setup(mode=mode, clipping=clipping, sigma=0.0, max_grad_norm=C, lr=0.0,
                           **extra)
    b = make_private_setup(mode=mode, clipping=clipping, sigma=0.0, max_grad_norm=C, lr=0.0,
                           **extra)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=3, k_pairs=8, m_canaries=96)
    recs = []
    aud.tap.injector.on_inject = recs.append
    cap_a, cap_b = _capture(a, aud.design), _capture(b, aud.design)
    pidx, _ = aud.design.coordinates()
    for x, y in a.batches(3, batch=24):
        a.step(x, y)
        b.step(x, y)
        rec = recs[-1]
        clip = torch.tensor(rec.clip, dtype=torch.float64)[pidx]
        diff = (cap_a[-1] - cap_b[-1]) / clip  # the canary's contribution in units of C_i
        expected = expected_presence(rec, aud.design)
        assert rec.included.numel() > 0  # the one-run path is exercised too
        assert torch.allclose(diff, expected, rtol=0.0, atol=1e-6), (diff - expected).abs().max()
        # the auditor's observation has the real data's sum removed: at sigma = 0 it is
        # exactly the canary's presence (the twin's gradient, the real data, is not in it)
        proj = aud.tap.reader.last_values.cpu()
        assert torch.allclose(proj, expected, rtol=0.0, atol=1e-6)
        assert float((cap_b[-1] / clip).abs().max()) > 1e-3  # there was real data to remove
        if clipping == "adaptive":
            # canaries do not bias adaptive clipping's bound update (sample count corrected)
            assert float(a.optimizer.max_grad_norm) == pytest.approx(
                float(b.optimizer.max_grad_norm), rel=1e-6)
    assert aud.step == 3 and aud.tap.injector.steps_injected == 3
    aud.detach()


def test_hooks_ghost_functorch_same_projections():
    """Same seeds, same batches: per-sample modes and ghost clipping observe the same values."""
    runs = {}
    for mode in ("hooks", "functorch", "ghost"):
        s = make_private_setup(mode=mode, sigma=1.0, lr=0.1, noise_seed=5)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=11, k_pairs=8, m_canaries=64)
        projs = []
        for x, y in s.batches(3, batch=24):
            s.step(x, y)
            projs.append(aud.tap.reader.last_values.clone())
        runs[mode] = (torch.stack(projs), s, aud)
    ref = runs["hooks"][0]
    for mode in ("functorch", "ghost"):
        assert torch.allclose(runs[mode][0], ref, atol=1e-4), (mode, (runs[mode][0] - ref).abs()
                                                               .max())
    rep = runs["ghost"][2].finalize()
    assert rep.threat_model["clipping_exercised"] is False
    assert runs["hooks"][2].finalize().threat_model["clipping_exercised"] is True


# ------------------------------------------------------------------ the accountant is untouched
def test_accountant_epsilon_unchanged_and_hook_slot_kept():
    a = make_private_setup(seed=4)
    b = make_private_setup(seed=4)
    slot = a.optimizer.step_hook
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=0, m_canaries=64,
                         claimed_every=3)
    assert a.optimizer.step_hook is slot
    a.train(7)
    b.train(7)
    assert a.engine.accountant.history == b.engine.accountant.history
    assert a.engine.get_epsilon(1e-5) == b.engine.get_epsilon(1e-5)
    rep = aud.finalize()
    assert rep.claimed_epsilon == b.engine.accountant.get_epsilon(delta=1e-5)
    assert rep.training["steps"] == 7 and rep.accountant == "RDPAccountant"
    # read at the first step, every claimed_every steps, and at finalize
    assert [s for s, _ in rep.training["claimed_epsilon_history"]] == [1, 3, 6, 7]


def test_auditor_randomness_never_touches_opacus_noise_or_global_rng():
    a = make_private_setup(sigma=1.0, noise_seed=9)
    b = make_private_setup(sigma=1.0, noise_seed=9)
    state = torch.get_rng_state()
    PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=0, m_canaries=64)
    for x, y in a.batches(2):
        a.step(x, y)
    for x, y in b.batches(2):
        b.step(x, y)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.optimizer.generator.get_state(), b.optimizer.generator.get_state())


def test_check_skip_next_step_peek_does_not_pop():
    """Guard for the private Opacus method the injection relies on."""
    s = make_private_setup()
    opt = s.optimizer
    opt.signal_skip_step(True)
    assert opt._check_skip_next_step(pop_next=False) is True
    assert opt._step_skip_queue == [True]
    assert opt._check_skip_next_step() is True
    assert opt._check_skip_next_step(pop_next=False) is False


def test_batch_memory_manager_injects_once_per_logical_step():
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    a = make_private_setup(sigma=0.0, lr=0.0, batch_size=64, seed=2)
    b = make_private_setup(sigma=0.0, lr=0.0, batch_size=64, seed=2)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=1, k_pairs=4, m_canaries=64)
    recs = []
    aud.tap.injector.on_inject = recs.append
    cap_a, cap_b = _capture(a, aud.design), _capture(b, aud.design)
    physical = 0
    for s in (a, b):
        with BatchMemoryManager(data_loader=s.loader, max_physical_batch_size=8,
                                optimizer=s.optimizer) as dl:
            for x, y in dl:
                s.step(x, y)
                physical += s is a
    logical = sum(n for _, _, n in a.engine.accountant.history)
    assert physical > 2 * logical >= 2
    assert aud.tap.injector.steps_injected == aud.step == len(recs) == logical == len(cap_a)
    for rec, va, vb in zip(recs, cap_a, cap_b):
        assert torch.allclose(va - vb, expected_presence(rec, aud.design), atol=1e-6)


def test_empty_poisson_batch():
    s = make_private_setup(sigma=0.0, lr=0.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, k_pairs=4, m_canaries=64)
    recs = []
    aud.tap.injector.on_inject = recs.append
    s.step(s.X[:0], s.Y[:0])
    assert aud.step == 1
    # no real data: the projection is exactly the canaries
    assert torch.allclose(aud.tap.reader.last_values.cpu(),
                          expected_presence(recs[-1], aud.design), atol=1e-6)


# ------------------------------------------------------------------ detach
def test_detach_restores_everything_and_behaves_like_untouched():
    a = make_private_setup(seed=6)
    b = make_private_setup(seed=6)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=0, m_canaries=64)
    assert not _untouched(a.optimizer)
    aud.detach()
    aud.detach()  # idempotent
    assert _untouched(a.optimizer)
    a.train(4)
    b.train(4)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_detach_after_audited_steps_then_identical_to_fresh_optimizer():
    a = make_private_setup(seed=8)
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=0, m_canaries=64)
    batches = list(a.batches(6, seed=3))
    for x, y in batches[:3]:
        a.step(x, y)
    aud.detach()
    b = make_private_setup(seed=8)
    b.model.load_state_dict(a.model.state_dict())
    b.optimizer.generator.set_state(a.optimizer.generator.get_state())
    for x, y in batches[3:]:
        a.step(x, y)
        b.step(x, y)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    # a new auditor may attach once the first one is detached
    PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=1, m_canaries=64).detach()


# ------------------------------------------------------------------ violation handling
def test_raise_mode_keeps_last_good_parameters():
    s = make_private_setup(seed=1)
    bugs.apply_bug(s.optimizer, "no-noise")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         on_violation="raise")
    params = list(s.model.parameters())
    with pytest.raises(PrivacyViolationError) as err:
        for x, y in s.batches(40):
            before = [p.detach().clone() for p in params]
            s.step(x, y)
    for p, q in zip(params, before):
        assert torch.equal(p, q)
    assert err.value.step == aud.violation_step and aud.violation and aud.should_stop
    with pytest.raises(PrivacyViolationError):  # it does not let training continue
        s.step(*next(s.batches(1)))
    rep = aud.finalize()
    assert rep.violation and rep.violation_step == err.value.step and rep.stopped_early


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_host_thread_keeps_the_training_threads_view(mode):
    """Python-mode kernels on the CPU (the default for large models) run the auditor's part of
    each step on its host thread: the ``on_step`` callbacks still run on the training thread,
    a proven violation with ``on_violation="raise"`` raises there before the update (the
    parameters of the last good step kept), the decision step is the one of the in-place run,
    and the thread ends with ``finalize()``."""
    runs = []
    for compiled in (True, False):
        s = make_private_setup(seed=1, mode=mode)
        bugs.apply_bug(s.optimizer, "no-noise")
        where: list[threading.Thread] = []
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                             on_violation="raise", compiled_kernels=compiled,
                             on_step=lambda _m, w=where: w.append(threading.current_thread()))
        thread = aud.tap.host_thread
        assert (thread is None) == compiled
        params = list(s.model.parameters())
        with pytest.raises(PrivacyViolationError) as err:
            for x, y in s.batches(40):
                before = [p.detach().clone() for p in params]
                s.step(x, y)
        assert all(torch.equal(p, q) for p, q in zip(params, before))
        assert where and set(where) == {threading.current_thread()}
        rep = aud.finalize()
        assert aud.tap.host_thread is None and (thread is None or not thread.alive)
        runs.append((err.value.step, rep.violation_step, len(where)))
    assert runs[0] == runs[1]


def test_detach_and_attach_again_restore_the_audits_kernel_mode_and_host_thread():
    """detach() gives the process its kernel mode back and ends the host thread; attach() makes
    the mode this audit's again (here Python mode) and starts a new host thread."""
    from dpaudit_torch._compiled import compiled

    s = make_private_setup(seed=2)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         compiled_kernels=False)
    first = aud.tap.host_thread
    assert first is not None and first.alive and not compiled()
    s.train(2)
    aud.detach()
    assert aud.tap.host_thread is None and not first.alive and compiled()
    s.train(1)
    aud.attach()
    assert aud.tap.host_thread is not None and aud.tap.host_thread is not first
    assert not compiled()
    s.train(2)
    assert aud.step == 4
    aud.finalize()
    assert aud.tap.host_thread is None and compiled()


def test_benchmarks_switch_runs_the_audit_as_attach_does():
    """benchmarks/overhead.py's Switch (also benchmarks/scale.py's) turns the hooks on through
    the tap: the audited blocks must run as a user's attached auditor does, in the audit's
    kernel mode with its host thread. (It once re-attached in the process's compiled mode, so
    the 100M rows of the scale table loaded Numba in the middle of the audited steps.)"""
    import sys
    from pathlib import Path

    from dpaudit_torch._compiled import compiled

    where = str(Path(__file__).resolve().parents[2] / "benchmarks")
    sys.path.insert(0, where)
    try:
        from overhead import Switch
    finally:
        sys.path.remove(where)
    s = make_private_setup(seed=2)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         compiled_kernels=False)
    sw = Switch(aud)  # detaches the auditor (the process's mode back), then turns on
    assert sw.on and not compiled() and aud.tap.host_thread is not None
    s.train(2)
    sw.turn_off()
    assert aud.tap.host_thread is None
    s.train(1)
    sw.turn_on()
    assert not compiled() and aud.tap.host_thread is not None and aud.tap.host_thread.alive
    s.train(2)
    assert aud.step == 4
    sw.turn_off()
    aud.finalize()
    assert compiled()


def test_warn_mode_logs_and_continues(caplog):
    s = make_private_setup(seed=1)
    bugs.apply_bug(s.optimizer, "no-noise")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         on_violation="warn")
    with caplog.at_level("WARNING", logger="dpaudit_torch"):
        for x, y in s.batches(12):
            s.step(x, y)
    assert aud.violation and not aud.should_stop and aud.step == 12
    # with more evidence the per-step lower bound (Bonferroni over tests and grid) follows
    assert aud.finalize().epsilon_lower_bounds["sequential"] > 0
    assert any("violation proven" in r.getMessage() for r in caplog.records)


def test_check_every_delays_the_decision_honestly():
    s = make_private_setup(seed=1)
    bugs.apply_bug(s.optimizer, "no-noise")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64, check_every=7)
    for x, y in s.batches(14):
        s.step(x, y)
        if aud.should_stop:
            break
    assert aud.crossed_at_step is not None and aud.crossed_at_step <= aud.violation_step
    assert aud.violation_step % 7 == 0 and aud.step == aud.violation_step


# ------------------------------------------------------------------ bad input
def _bad_cases():
    return [
        (dict(delta=0.0), ValueError, "delta"),
        (dict(delta=1.0), ValueError, "delta"),
        (dict(delta=float("nan")), ValueError, "delta"),
        (dict(delta="1e-5"), TypeError, "delta"),
        (dict(alpha=1.5), ValueError, "alpha"),
        (dict(k_pairs=0), ValueError, "k_pairs"),
        (dict(m_canaries=-1), ValueError, "m_canaries"),
        (dict(canary_norm=0.5), ValueError, "canary_norm"),
        (dict(tests=("mmd", "bogus")), ValueError, "tests"),
        (dict(on_violation="explode"), ValueError, "on_violation"),
        (dict(per_step_null=(0.0, 1e-5)), ValueError, "epsilon"),
        (dict(per_step_null=1.0), TypeError, "per_step_null"),
        (dict(check_every=0), ValueError, "check_every"),
        (dict(m_canaries=10_000), ValueError, "coordinates"),
        (dict(seed=-3), ValueError, "seed"),
        (dict(on_step=3), TypeError, "on_step"),
    ]


@pytest.mark.parametrize("kwargs,exc,word", _bad_cases())
def test_bad_arguments_leave_everything_untouched(kwargs, exc, word):
    s = make_private_setup()
    before = [p.detach().clone() for p in s.model.parameters()]
    kw = {"m_canaries": 64, **kwargs}
    with pytest.raises(exc, match=word):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, **kw)
    assert _untouched(s.optimizer)
    assert all(torch.equal(p, q) for p, q in zip(s.model.parameters(), before))


def test_rejects_non_opacus_optimizer_loader_without_rate_and_second_auditor():
    s = make_private_setup()
    with pytest.raises(TypeError, match="SGD"):
        PrivacyAuditor(s.engine, s.optimizer.original_optimizer, s.loader)
    plain = make_private_setup(poisson=False)
    # a loader that is not Opacus's Poisson loader: audited at the rate make_private gives the
    # accountant (1 / len(loader)), with a warning; its sampling is what the audit checks
    aud = PrivacyAuditor(plain.engine, plain.optimizer, plain.loader, seed=0, m_canaries=64)
    assert aud.tap.sample_rate == pytest.approx(1.0 / len(plain.loader))
    assert any("not Opacus's Poisson loader" in w for w in aud.warnings)
    aud.detach()

    class NoLength:
        pass

    # the accountant's step hook gives the rate; the loader is named as not the training's
    aud = PrivacyAuditor(plain.engine, plain.optimizer, NoLength(), seed=0, m_canaries=64)
    assert aud.tap.sample_rate == pytest.approx(1.0 / len(plain.loader))
    assert any("NoLength" in p.message and "cannot be checked against the training" in p.message
               for p in aud.tap.setup.problems)
    aud.detach()
    plain.optimizer.step_hook = None  # and without a hook, nothing gives a rate: refused
    with pytest.raises(ValueError, match="neither a sample_rate nor a length"):
        PrivacyAuditor(plain.engine, plain.optimizer, NoLength())
    assert _untouched(plain.optimizer)
    with pytest.raises(TypeError, match="PrivacyEngine"):
        PrivacyAuditor(object(), s.optimizer, s.loader)
    first = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    with pytest.raises(ValueError, match="already"):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, m_canaries=64)
    assert getattr(s.optimizer, OWNER_ATTR) is first
    s.step(*next(s.batches(1)))
    assert first.step == 1


def test_non_finite_gradient_is_refused_before_the_update():
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    x, y = next(s.batches(1))
    x = x.clone()
    x[0, 0] = float("nan")
    before = [p.detach().clone() for p in s.model.parameters()]
    with pytest.raises(ValueError, match="non-finite"):
        s.step(x, y)
    assert all(torch.equal(p, q) for p, q in zip(s.model.parameters(), before))
    assert aud.step == 0 and not aud.monitors["sequential_pairs"].buffer_x
    assert float(aud.monitors["one_run"].stacked_scores().abs().sum()) == 0.0
    s.step(*next(s.batches(1, seed=5)))  # training (and the audit) go on with good data
    assert aud.step == 1


# ------------------------------------------------------------------ detection and false alarms
@pytest.mark.parametrize("bug", ["no-noise", "noise-divided-by-batch", "no-clipping",
                                 "noise-halved"])
def test_each_bug_is_detected_quickly(bug):
    """Each of these bugs is decided at the first check (step check_every = 5), the earliest
    possible: one step already carries evidence far above log(1/alpha) = 3. No, divided or halved
    noise: the noise monitor's variance test on n >= 100 coordinates of a tensor gains about
    n (log(1/r) - (1/r - 1) s^2) / 2 per step at a grid ratio r for a true variance ratio s^2
    (s^2 = 1/4, r = 0.5: 0.22 n), decided at step 1. Disabled clipping: the canaries pass at
    25 C, 25 noise standard deviations, and the hockey-stick test's log-wealth grows by about
    log(1 + lambda_max) per pair, 16 pairs a step, once its 20 burn-in pairs are in (step 2)."""
    s = make_private_setup(seed=2)
    if bug != "no-clipping":
        bugs.apply_bug(s.optimizer, bug)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, m_canaries=64)
    if bug == "no-clipping":  # a bug applied after attaching is seen too
        bugs.apply_bug(s.optimizer, bug)
    first_check = aud.config.check_every
    s.train(first_check + 10, auditor=aud)
    assert aud.violation and aud.should_stop
    assert aud.violation_step == first_check, aud.violation_step
    rep = aud.finalize()
    assert rep.violation and rep.sequential["crossed_at_step"] <= rep.violation_step
    # 0 or a point of the per-step null's grid (Bonferroni over the grid: may lag the decision)
    lb = rep.epsilon_lower_bounds["sequential"]
    assert lb == 0.0 or lb in rep.lower_bound_details["sequential"]["grid_epsilons"], lb
    assert rep.claimed_epsilon == s.engine.accountant.get_epsilon(delta=1e-5)  # silent bug


def test_false_alarms_within_the_binomial_limit_in_30_seeded_runs():
    """Correct DP-SGD through the real Opacus hook, 30 fixed seeds x 10 steps x 16 pairs. Under
    H0 Ville's inequality bounds each run's false-alarm probability by alpha = 0.05, so the
    number of alarms is stochastically below Binomial(30, 0.05); the limit 6 is its 0.999
    quantile (P[Bin(30, 0.05) > 6] = 5.7e-4). The seeds are fixed, so the outcome is
    deterministic. The tight check of the decision's level is tests/test_decision_validity.py
    (many long simulated streams, which a null 25% too strict fails); benchmarks/false_alarms.py
    measures the rate on 280 real runs."""
    alarms, top = 0, -math.inf
    for seed in range(30):
        s = make_private_setup(seed=100 + seed, noise_seed=200 + seed)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=seed, m_canaries=64)
        s.train(10, auditor=aud)
        alarms += aud.violation
        top = max(top, aud.combined_log_wealth)
        aud.detach()
    assert alarms <= 6, (alarms, top)


# ------------------------------------------------------------------ the report
def test_finalize_builds_a_complete_report():
    s = make_private_setup(seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=128,
                         history_stride=2)
    coins = aud.monitors["one_run"].coins
    assert "True" not in repr(coins) and "revealed=False" in repr(coins)
    s.train(12)
    rep = aud.finalize()
    assert aud.finalize() is rep and not aud.attached and _untouched(s.optimizer)
    assert set(rep.epsilon_lower_bounds) == {"whitebox", "steinke", "fdp", "sequential"}
    # a correct run (seeded): no per-step null rejected, no whole-run bound above the claim
    assert rep.epsilon_lower_bounds["sequential"] == 0.0
    assert rep.epsilon_lower_bounds["steinke"] <= rep.claimed_epsilon
    assert rep.epsilon_lower_bounds["whitebox"] <= rep.claimed_epsilon
    assert rep.lower_bound_details["whitebox"]["family_verified"] is True
    assert rep.power["method"] == "whitebox" and not rep.claim_refuted
    assert "per-step" in rep.lower_bound_details["sequential"]["note"]
    assert len(rep.one_run_scores["in"]) + len(rep.one_run_scores["out"]) == 128
    assert len(rep.one_run_scores["in"]) == rep.canaries["one_run_in"]
    assert rep.canaries["insertions"] == 12 * 16 + rep.canaries["one_run_insertions"]
    h = rep.wealth_history
    assert h["step"] == [2, 4, 6, 8, 10, 12]
    assert all(len(h[k]) == len(h["step"]) for k in h)
    assert rep.sequential["per_step_null"]["type"] == "gaussian_profile"
    assert rep.training["sample_rate"] == s.loader.sample_rate and rep.training["steps"] == 12
    assert rep.training["noise_multiplier"] == 1.0 and rep.threat_model["white_box"] is True
    # W, the real data's sum that was removed, at both coordinates of the 16 pairs, every step
    assert rep.interference["n"] == 12 * 32 and rep.interference["std"] > 0
    assert rep.interference["removed"] is True and rep.interference["read_every_steps"] == 1
    # the power statement of the one-run audit: the white-box bound's, from its exact law
    assert rep.power["mode"] == "law" and rep.power["mean_inclusions"] == pytest.approx(
        12 * s.loader.sample_rate)
    assert rep.lower_bound_details["steinke"]["score"] == aud.config.one_run_score
    assert not rep.violation and not rep.claim_refuted and rep.seed_policy == "seeded (0)"
    json.dumps(rep.to_dict())


def test_noise_multiplier_change_starts_a_new_segment_and_explicit_null():
    s = make_private_setup(seed=3)
    seen = []
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         tests=("hockey_stick",), on_step=seen.append)
    s.train(3)
    s.optimizer.noise_multiplier = 2.0
    s.train(3)
    rep = aud.finalize()
    segs = rep.sequential["segments"]
    assert [g["noise_multiplier"] for g in segs] == [1.0, 2.0] and segs[1]["start_step"] == 4
    assert [m["step"] for m in seen] == list(range(1, 7))
    t = make_private_setup(seed=3)
    aud2 = PrivacyAuditor(t.engine, t.optimizer, t.loader, seed=0, m_canaries=64,
                          per_step_null=(1.5, 1e-3), tests="hockey_stick")
    t.train(2)
    null = aud2.finalize().sequential["per_step_null"]
    assert null == {"type": "explicit", "epsilon": 1.5, "delta": 1e-3}


def test_unseeded_auditors_differ():
    a, b = make_private_setup(), make_private_setup()
    da = PrivacyAuditor(a.engine, a.optimizer, a.loader, m_canaries=200).design
    db = PrivacyAuditor(b.engine, b.optimizer, b.loader, m_canaries=200).design
    assert not torch.equal(da.one_flat, db.one_flat) or not torch.equal(da.pair_a, db.pair_a)


def test_chunked_decisions_match_step_by_step():
    """check_every only changes when the testers are called, not what they compute: the per-step
    wealth history read back from one call per check equals one call per step."""
    hist = {}
    for every in (1, 5):
        s = make_private_setup(seed=12)
        bugs.apply_bug(s.optimizer, "noise-halved")
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, m_canaries=64,
                             check_every=every, on_violation="warn")
        for x, y in s.batches(10):
            s.step(x, y)
        hist[every] = aud.finalize().wealth_history
    assert hist[1]["step"] == hist[5]["step"] == list(range(1, 11))
    for key in ("combined", "mmd", "hockey_stick", "epsilon_lower_bound"):
        assert hist[1][key] == pytest.approx(hist[5][key], abs=1e-9), key


def test_non_injecting_rank_observes_without_injecting():
    """DDP design: a rank other than 0 draws the same coins but adds no canary."""
    a = make_private_setup(sigma=0.0, lr=0.0)
    b = make_private_setup(sigma=0.0, lr=0.0)
    a.optimizer.rank = 1
    aud = PrivacyAuditor(a.engine, a.optimizer, a.loader, seed=0, k_pairs=4, m_canaries=64)
    cap_b = _capture(b, aud.design)
    x, y = next(a.batches(1))
    a.step(x, y)
    b.step(x, y)
    assert aud.step == 1 and aud.tap.injector.insertions == 0
    # this rank's own real-data sum is removed; no canary and no noise: nothing remains
    assert float(cap_b[-1].abs().max()) > 1e-3
    assert torch.allclose(aud.tap.reader.last_values.cpu(), torch.zeros_like(cap_b[-1]),
                          atol=1e-6)


def test_on_step_callback_errors_never_break_training():
    s = make_private_setup()

    def bad(_m):
        raise RuntimeError("boom")

    seen = []
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                         on_step=[bad, seen.append])
    s.train(3)
    assert [m["audited_steps"] for m in seen] == [1, 2, 3]
    assert set(aud.latest_metrics) >= {"step", "combined_log_wealth", "violation",
                                       "claimed_epsilon", "log_wealth_mmd",
                                       "log_wealth_hockey_stick"}


@pytest.mark.parametrize("skip", [False, True])
def test_compiled_observation_matches_torch_path(skip):
    """On the CPU a step is observed by one compiled pass (and the canaries' clipped sums are
    added by one); forcing the torch path on a twin run (same model, data, noise and auditor
    seed) gives the same projections, pairs, one-run scores, interference statistics,
    decisions and trained parameters, exactly."""
    runs = []
    for compiled in (True, False):
        s = make_private_setup(seed=6)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, k_pairs=8,
                             m_canaries=96, check_every=3,
                             on_nonfinite="skip" if skip else "raise")
        if not compiled:
            aud.tap.reader.compiled = False
        projections = []
        for x, y in s.batches(7, batch=24):
            s.step(x, y)
            projections.append(aud.tap.reader.last_values.clone())
        assert bool(aud.tap.reader.compiled_reads) == compiled
        assert bool(aud.tap.injector.compiled_adds) == compiled
        pairs = aud.monitors["sequential_pairs"]
        runs.append((torch.stack(projections), aud.monitors["one_run"].scores["sum"].clone(),
                     aud.monitors["one_run"].scores["llr"].clone(),
                     torch.stack(pairs.buffer_x), float(pairs.w_sum), float(pairs.w_sumsq),
                     pairs.w_count, aud.combined_log_wealth,
                     *[p.detach().clone() for p in s.model.parameters()]))
    a, b = runs
    for u, v in zip(a, b):
        if isinstance(u, torch.Tensor):
            assert torch.equal(u, v)
        else:
            assert u == v


def test_python_kernels_match_compiled():
    """The kernels run as their Python source (``compiled_kernels=False``, the default for
    large models) on a twin run: the one-pass CPU read is then its vectorised NumPy version
    (observation._VectorPass), which gives the same projections, pairs (spread pairs
    included), released values and noise at the noise-audit coordinates, bit for bit; the
    same one-run scores and wealth to rounding, the same decision and trained parameters."""
    runs = []
    for compiled in (True, False):
        s = make_private_setup(seed=6)
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, k_pairs=8,
                             m_canaries=96, check_every=3, compiled_kernels=compiled,
                             spread_pairs=2, spread_tensors=2)
        projections, reads = [], []
        for x, y in s.batches(12, batch=24):
            s.step(x, y)
            projections.append(aud.tap.reader.last_values.clone())
            b = aud.tap.reader._buffers()
            reads.append(np.concatenate([b.snap, b.xy, b.rel, b.noise_raw, b.noise]))
        # both modes read each step in one pass (no torch gathers, nothing of the
        # coordinates' size allocated per step)
        assert aud.tap.reader.compiled_reads == 12
        assert aud.tap.reader._buffers().n_noise > 0
        runs.append((torch.stack(projections), np.stack(reads),
                     aud.monitors["one_run"].scores["llr"].clone(),
                     aud.combined_log_wealth, aud.violation,
                     [p.detach().clone() for p in s.model.parameters()]))
    (pa, ra, sa, wa, va, ma), (pb, rb, sb, wb, vb, mb) = runs
    assert torch.equal(pa, pb) and va == vb
    assert np.array_equal(ra, rb)
    torch.testing.assert_close(sa, sb, rtol=1e-12, atol=1e-12)
    assert wa == pytest.approx(wb, rel=1e-9, abs=1e-9)
    assert all(torch.equal(u, v) for u, v in zip(ma, mb))


def test_the_facade_exposes_the_objects_it_wires():
    """The public attributes users and the benchmarks read stay where they were."""
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=4, m_canaries=32)
    s.train(2)
    assert aud.optimizer is s.optimizer and aud.tap.optimizer is s.optimizer
    assert aud.step == aud.engine.step == 2 and aud.decision is aud.engine.decision
    assert aud.monitors is aud.engine.monitors and aud.config.m_canaries == 32
    assert aud.latest_metrics["audited_steps"] == 2
    aud.finalize()
