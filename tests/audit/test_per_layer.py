"""Per-layer and adaptive clipping through the auditor: a correct run finds nothing, its
white-box statistic falls in the exact law of the contribution its canaries reach, and the
power statement is computed for that contribution (docs/design.md section 5, "Per-layer
clipping"; issue 37 part 7)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.canary_layers import layout_of
from dpaudit_torch.report.formatting import power_sentence
from dpaudit_torch.report.sections import strength_section
from dpaudit_torch.report.view import ReportView
from dpaudit_torch.stats.whitebox import ReleaseLaw, whitebox_power

SIGMA, STEPS = 0.7, 25


def test_per_layer_correct_run_reaches_its_contribution():
    s = make_private_setup(clipping="per_layer", sigma=SIGMA, max_grad_norm=[0.6, 0.1, 0.78, 0.1],
                           noise_seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, delta=1e-5)
    lay = layout_of(aud.design)
    assert lay is not None and lay.width >= 2 and lay.contribution < 1.0
    # every member's coordinate is in its own tensor of S, tensor-major
    assert aud.design.one_param.view(lay.width, lay.groups)[:, 0].tolist() == list(lay.tensors)
    state = aud.state_dict()
    s.train(STEPS, aud)
    rep = aud.finalize()
    assert not rep.violation and not rep.claim_refuted
    wb = rep.lower_bound_details["whitebox"]
    assert wb["family_verified"] and wb["contribution"] == pytest.approx(lay.contribution,
                                                                         rel=1e-12)
    assert rep.canaries["m_one_run"] == lay.groups == wb["m"]
    # the statistic lies inside the exact law at rho = c / sigma (not in its outer 0.1 %)
    rho = lay.contribution / SIGMA
    law = ReleaseLaw(wb["n_in"], wb["n_out"], wb["steps"], wb["q"])
    pct = 1.0 - law.tail(wb["statistic"], rho, conservative=False)
    assert 1e-3 < pct < 1 - 1e-3, pct
    # the power statement: the exact law at the canaries' noise multiplier sigma / c
    pw = rep.power
    want = whitebox_power(SIGMA / lay.contribution, wb["q"], wb["steps"], lay.groups,
                          delta=1e-5, n_in=wb["n_in"],
                          alpha=aud.monitors["one_run"].config.whitebox_alpha)  # its share
    assert pw["c"] == pytest.approx(lay.contribution, rel=1e-12)
    assert pw["expected_bound"] == pytest.approx(want["expected_bound"], rel=1e-9)
    assert pw["release_epsilon"] < rep.claimed_epsilon
    assert "per-layer clipping" in power_sentence(pw)
    assert rep.canaries["layers"]["contribution"] == pytest.approx(lay.contribution, rel=1e-12)
    assert f"spans {lay.width} parameter tensor" in strength_section(ReportView(rep))
    # a checkpoint taken at attach resumes with the same layout
    aud2 = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, delta=1e-5)
    aud2.load_state_dict(state)
    assert layout_of(aud2.design) == lay and aud2.monitors["one_run"].m == lay.groups
    assert torch.equal(aud2.coins.state()[0], aud.coins.state()[0])
    aud2.detach()


def test_adaptive_clipping_stays_full_power():
    s = make_private_setup(clipping="adaptive", sigma=SIGMA, max_grad_norm=1.0, noise_seed=4,
                           target_unclipped_quantile=0.5, clipbound_learning_rate=0.2,
                           max_clipbound=10.0, min_clipbound=0.1, unclipped_num_std=20.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=6, delta=1e-5)
    assert layout_of(aud.design) is None and aud.design.layer_width == 1
    s.train(STEPS, aud)
    rep = aud.finalize()
    assert not rep.violation and not rep.claim_refuted
    assert rep.power["c"] == 1.0 and "release_epsilon" not in rep.power
    wb = rep.lower_bound_details["whitebox"]
    assert wb["family_verified"] and "contribution" not in wb
    law = ReleaseLaw(wb["n_in"], wb["n_out"], wb["steps"], wb["q"])
    pct = 1.0 - law.tail(wb["statistic"], 1.0 / rep.power["sigma"], conservative=False)
    assert 1e-3 < pct < 1 - 1e-3, pct
