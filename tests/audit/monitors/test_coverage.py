"""The coverage monitor: trainable parameters of the model that the DP optimizer does not hold
(docs/monitors/coverage.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_private_setup
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.audit import AuditConfig, MonitorContext, PrivacyAuditor, build_monitors
from dpaudit_torch.audit.monitors.coverage import CoverageMonitor, module_path
from dpaudit_torch.contract import MODEL, OPTIMIZER_PARAMS

CFG = dict(k_pairs=4, m_canaries=32, seed=1)


def _coverage(report) -> list[dict]:
    return [f for f in report.findings if f["monitor"] == "coverage"]


def _partly_private(freeze: bool = False):
    """A model whose head is trained by the DP optimizer and whose extra layer is left out of
    it (``requires_grad`` True unless ``freeze``)."""
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    extra = nn.Linear(2, 2)
    if freeze:
        extra.requires_grad_(False)
    model.add_module("extra", extra)
    head = [p for n, p in model.named_parameters() if not n.startswith("extra")]
    opt = torch.optim.SGD(head, lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    dl = DataLoader(TensorDataset(x, y), batch_size=16)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=1.0,
            max_grad_norm=1.0)
    return engine, model, opt, dl


def _train(model, opt, dl, aud, steps: int) -> None:
    done = 0
    while done < steps:
        for x, y in dl:
            opt.zero_grad()
            model.zero_grad()  # the layer outside the optimizer collects per-sample rows too
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
            if done == steps:
                return


def test_names_a_trainable_layer_the_dp_optimizer_does_not_hold():
    engine, model, opt, dl = _partly_private()
    aud = PrivacyAuditor(engine, opt, dl, model=model, **CFG)
    _train(model, opt, dl, aud, 3)
    rep = aud.finalize()
    sec = rep.audits["coverage"]
    assert sec["run"] is True and sec["held_tensors"] == 4 and sec["trainable_tensors"] == 6
    assert [u["name"] for u in sec["uncovered"]] == ["extra.weight", "extra.bias"]
    assert sec["uncovered"][0]["shape"] == [2, 2] and sec["uncovered_coordinates"] == 6
    found = _coverage(rep)
    assert len(found) == 1 and found[0]["level"] == "finding"
    assert "extra.weight (2x2)" in found[0]["message"] and "extra.bias (2)" in found[0]["message"]
    assert not rep.violation  # a finding, not a statistical proof
    assert rep.monitor_labels["coverage"].startswith("coverage")


def test_frozen_layers_and_a_fully_private_model_are_fine():
    engine, model, opt, dl = _partly_private(freeze=True)
    aud = PrivacyAuditor(engine, opt, dl, model=model, **CFG)
    _train(model, opt, dl, aud, 2)
    rep = aud.finalize()
    assert rep.audits["coverage"]["uncovered"] == [] and _coverage(rep) == []
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    s.train(2)
    rep = aud.finalize()
    assert rep.audits["coverage"]["run"] and _coverage(rep) == []


def test_a_layer_unfrozen_during_training_is_found_at_finalize():
    engine, model, opt, dl = _partly_private(freeze=True)
    aud = PrivacyAuditor(engine, opt, dl, model=model, **CFG)
    _train(model, opt, dl, aud, 2)
    model._module.extra.weight.requires_grad_(True)
    rep = aud.finalize()
    assert [u["name"] for u in rep.audits["coverage"]["uncovered"]] == ["extra.weight"]


def test_without_a_model_it_says_why_it_did_not_run():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, **CFG)
    s.train(2)
    rep = aud.finalize()
    assert rep.audits["coverage"]["run"] is False
    assert "no model was handed" in rep.audits["coverage"]["reason_not_run"]
    assert [f["level"] for f in _coverage(rep)] == ["note"]


def test_another_model_than_the_trained_one_is_named():
    s = make_private_setup(sigma=1.0)
    other = make_private_setup(sigma=1.0, seed=3).model
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=other, **CFG)
    rep = aud.finalize()
    msgs = " ".join(f["message"] for f in _coverage(rep))
    assert "not parameters of the model handed to the auditor" in msgs
    assert rep.audits["coverage"]["held_not_in_model"] == 4


def test_state_round_trip_and_disable_by_name():
    model = nn.Sequential(nn.Linear(3, 2))
    extra = nn.Linear(2, 2)
    model.add_module("extra", extra)
    cfg = AuditConfig(k_pairs=1, m_canaries=2)
    ctx = MonitorContext(config=cfg, k_pairs=1, m_canaries=2, device="cpu", warn=print,
                         facts={MODEL: model, OPTIMIZER_PARAMS: list(model[0].parameters())})
    mon = build_monitors(ctx, ("coverage",))["coverage"]
    assert isinstance(mon, CoverageMonitor)
    assert mon.at_start == [("extra.weight", (2, 2)), ("extra.bias", (2,))]
    again = build_monitors(ctx, ("coverage",))["coverage"]
    again.load_state_dict(mon.state_dict())
    assert again.at_start == mon.at_start
    names = build_monitors(MonitorContext(
        config=AuditConfig(k_pairs=1, m_canaries=2, disable_monitors=("coverage",)), k_pairs=1,
        m_canaries=2, device="cpu", warn=print))
    assert "coverage" not in names
    with pytest.raises(ValueError, match="unknown monitor"):
        build_monitors(MonitorContext(config=AuditConfig(k_pairs=1, m_canaries=2,
                                                         disable_monitors=("coverge",)),
                                      k_pairs=1, m_canaries=2, device="cpu", warn=print))


def test_module_path_strips_wrappers():
    assert module_path("_module.module.fc.weight") == "fc.weight"
    assert module_path("fc.module_x.weight") == "fc.module_x.weight"
