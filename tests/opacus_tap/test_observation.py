"""Interference-free observations (docs/design.md section 8): the real examples' clipped sum is
read right after clipping, before the canaries and the noise, and subtracted; the one-run scores
and the power statement built on them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import expected_presence, make_private_setup

from dpaudit_torch.audit import PrivacyAuditor


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_batch_memory_manager_sum_over_micro_batches_is_removed(mode):
    """With BatchMemoryManager (several micro-batches per logical step) and real gradients that
    change every step (lr > 0), the observation at sigma = 0 is exactly the canary's presence:
    the real sum of every micro-batch of the step is removed, in per-sample and ghost modes."""
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    s = make_private_setup(mode=mode, sigma=0.0, lr=0.2, batch_size=64, seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=4, k_pairs=4, m_canaries=48)
    recs, seen = [], []
    aud.tap.injector.on_inject = recs.append
    with BatchMemoryManager(data_loader=s.loader, max_physical_batch_size=8,
                            optimizer=s.optimizer) as dl:
        for x, y in dl:
            s.step(x, y)
            if len(recs) > len(seen):
                seen.append(aud.tap.reader.last_values.clone())
    assert len(recs) == len(seen) == aud.step >= 2
    for rec, vals in zip(recs, seen):
        assert torch.allclose(vals, expected_presence(rec, aud.design), rtol=0.0, atol=1e-5)
    rep = aud.finalize()
    assert rep.interference["removed"] and rep.interference["std"] > 1e-3


def test_noise_written_into_the_summed_gradient_is_not_subtracted_away():
    """An implementation that adds its noise into ``p.summed_grad`` in place (then releases it)
    is read before that happens: its observations keep their noise, so a correct in-place noiser
    is not flagged and its observations have spread sigma."""
    s = make_private_setup(sigma=1.0, lr=0.1, noise_seed=None, seed=5)
    base = type(s.optimizer)

    class InPlaceNoise(base):  # type: ignore[misc, valid-type]
        def add_noise(self) -> None:
            for p in self.params:
                noise = torch.normal(0.0, self.noise_multiplier * self.max_grad_norm,
                                     size=p.summed_grad.shape)
                p.summed_grad.add_(noise)  # in place
                p.grad = p.summed_grad.view_as(p)

    s.optimizer.__class__ = InPlaceNoise
    torch.manual_seed(0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=6, k_pairs=8, m_canaries=64,
                         check_every=5)
    ys = []
    for _ in range(40):
        s.train(1)
        ys.append(aud.monitors["sequential_pairs"].buffer_y[-1].clone()
                  if aud.monitors["sequential_pairs"].buffer_y else None)
    y = torch.cat([v for v in ys if v is not None])
    # 8 non-canary observations per step without its check: N(0, 1) draws
    assert y.numel() >= 200 and 0.8 < float(y.std()) < 1.2
    assert not aud.violation


def test_power_statement_and_no_power_cases():
    """finalize() reports what the audit could have found; after 0 steps it says there is no
    power instead of failing."""
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, k_pairs=4, m_canaries=64)
    rep = aud.finalize()
    assert rep.power["no_power"] is True and rep.power["expected_bound"] is None
    assert rep.epsilon_lower_bounds["steinke"] == 0.0
    s2 = make_private_setup(sigma=1.0)
    aud2 = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=7, k_pairs=4, m_canaries=200)
    s2.train(20)
    rep2 = aud2.finalize()
    p = rep2.power
    # the default (white-box) bound's power statement: from the exact law of its statistic
    assert p["no_power"] is False and p["method"] == "whitebox" and p["mode"] == "law"
    lo, hi = p["expected_bound_quantiles"]  # the median lies between the 10 % and 90 % ones
    assert p["expected_bound"] is not None and lo <= p["expected_bound"] <= hi
    assert p["mean_inclusions"] == pytest.approx(20 * s2.loader.sample_rate)
    assert p["score"] == "sum" and aud2.config.one_run_score == "llr"
    eps = p["min_refutable_epsilon"]
    assert eps is None or (math.isfinite(eps) and eps > rep2.claimed_epsilon)
    assert rep2.lower_bound_details["steinke"]["score"] == "llr"
    assert p["ceiling"] == pytest.approx(rep2.lower_bound_details["whitebox"]["ceiling"])


def test_one_run_score_setting_is_validated_and_used():
    s = make_private_setup(sigma=1.0)
    with pytest.raises(ValueError, match="one_run_score"):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, one_run_score="best")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=4, m_canaries=64,
                         one_run_score="sum")
    s.train(6)
    rep = aud.finalize()
    assert rep.config["one_run_score"] == "sum"
    assert rep.lower_bound_details["steinke"]["score"] == "sum"
    # the reported scores are the running sums of the observations
    scores = aud.monitors["one_run"].stacked_scores()[0]
    assert sorted(rep.one_run_scores["in"] + rep.one_run_scores["out"]) == pytest.approx(
        sorted(scores.tolist()))


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_spread_canaries_see_per_tensor_clipping(mode):
    """A spread canary (mass 1/sqrt(L) on L tensors) observes exactly 1 under a correct flat
    clipper (per-sample and ghost modes) and sqrt(L) when every tensor is clipped to C
    separately, which a Dirac canary cannot see."""
    def run(per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor, PrivacyAuditor]:
        s = make_private_setup(mode=mode, sigma=0.0, lr=0.0)
        if per_tensor:
            base = type(s.optimizer)

            class PerTensor(base):  # type: ignore[misc, valid-type]
                def clip_and_accumulate(self) -> None:
                    for p in self.params:
                        gs = p.grad_sample
                        f = (self.max_grad_norm / (gs.reshape(len(gs), -1).norm(2, dim=-1)
                                                   + 1e-6)).clamp(max=1.0)
                        g = torch.einsum("i,i...", f, gs)
                        p.summed_grad = g if p.summed_grad is None else p.summed_grad + g
                        p.grad_sample._processed = True

            s.optimizer.__class__ = PerTensor
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=8,
                             m_canaries=32, check_every=10)
        s.train(3)
        pm = aud.monitors["sequential_pairs"]
        return torch.stack(pm.buffer_x), torch.stack(pm.buffer_y), aud

    x, y, aud = run(False)
    d = aud.design
    assert d.n_spread == 8 and d.spread_width == 3  # every pair, by default
    assert torch.allclose(x, torch.ones_like(x), atol=1e-5) and float(y.abs().max()) < 1e-5
    assert aud.finalize().canaries["spread_pairs"] == 8
    if mode == "hooks":  # ghost clipping does not run the optimizer's clipping on canaries
        xb, _, _ = run(True)
        sp = d.spread_pair
        assert torch.allclose(xb[:, sp], torch.full_like(xb[:, sp], 3 ** 0.5), atol=1e-5)
        dirac = [j for j in range(8) if j not in sp.tolist()]
        assert torch.allclose(xb[:, dirac], torch.ones_like(xb[:, dirac]), atol=1e-5)


def test_no_spread_canaries_under_per_layer_clipping():
    s = make_private_setup(clipping="per_layer", max_grad_norm=[1.0, 0.5, 2.0, 1.0])
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=8, m_canaries=32)
    assert aud.design.n_spread == 0
