"""opacus_tap.setup: the engine and the loader are checked against the optimizer; a wrong input
gets a refusal or a finding that names it, and the rate and N come from the training
(docs/design.md, "Setup coherence")."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.opacus_tap.setup import check_setup, step_hook_of
from dpaudit_torch.testing import bugs


def _other_set(n: int = 100) -> TensorDataset:
    return TensorDataset(torch.randn(n, 16), torch.randint(0, 2, (n,)))


def test_the_step_hook_names_the_accountant_and_its_rate():
    s = make_private_setup()
    kind, acc, q = step_hook_of(s.optimizer)
    assert kind == "opacus" and acc is s.engine.accountant and q == pytest.approx(1 / 8)
    s.optimizer.step_hook = None
    assert step_hook_of(s.optimizer) == ("none", None, None)
    s.optimizer.attach_step_hook(lambda opt: None)
    assert step_hook_of(s.optimizer) == ("custom", None, None)


def test_a_coherent_setup_has_no_problem():
    s = make_private_setup()
    c = check_setup(s.engine, s.optimizer, s.loader)
    assert (c.rate, c.rate_source, c.n_records, c.loader_verified) == (
        pytest.approx(1 / 8), "accountant", 256, True)
    assert c.problems == [] and c.n_reason is None
    assert c.summary()["problems"] == []


def test_another_engine_is_refused():
    s = make_private_setup()
    with pytest.raises(ValueError, match="privacy_engine is not the engine that made this "
                                         "optimizer private"):
        check_setup(PrivacyEngine(), s.optimizer, s.loader)
    # an engine that made another optimizer private (its accountant never steps here)
    t = make_private_setup(seed=3)
    with pytest.raises(ValueError, match="feeds another accountant"):
        check_setup(t.engine, s.optimizer, s.loader)


@pytest.mark.parametrize("wrong,name", [
    (lambda s: DataLoader(_other_set(), batch_size=50), "DataLoader (over 100 records, batch "
                                                        "size 50, rate 0.5)"),
    (lambda s: DataLoader(s.loader.dataset, batch_size=128), "DataLoader (over 256 records, "
                                                             "batch size 128, rate 0.5)"),
    (lambda s: list(DataLoader(s.loader.dataset, batch_size=64)), "list (of 4 items, rate "
                                                                  "0.25)"),
])
def test_a_loader_that_is_not_the_trainings_is_named_and_not_used(wrong, name):
    s = make_private_setup()
    c = check_setup(s.engine, s.optimizer, wrong(s))
    # the rate is the accountant's (the training's), N unknown: no test is built on the loader
    assert c.rate == pytest.approx(1 / 8) and c.rate_source == "accountant"
    assert c.n_records is None and not c.loader_verified
    assert "not the training's" in c.n_reason or "a list was handed over" in c.n_reason
    [p] = c.problems
    assert p.level == "finding" and p.scope == "data loader"
    assert name in p.message and "is not the one whose batches training releases" in p.message


def test_the_same_loader_at_another_size_is_still_the_training():
    # the training set's own plain loader at the batch size make_private saw: same N and rate
    s = make_private_setup()
    c = check_setup(s.engine, s.optimizer, DataLoader(s.loader.dataset, batch_size=32))
    assert c.loader_verified and c.n_records == 256 and c.problems == []


def test_accountant_told_another_rate_than_the_verified_loader():
    s = make_private_setup()
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "accountant-rate-4x")
    c = check_setup(s.engine, opt, dl)
    # the loader is the one make_private returned (N and rate give the expected batch size):
    # the records really see its rate, so the canaries do too
    assert c.loader_verified and c.rate == pytest.approx(1 / 8)
    assert c.rate_source == "data loader" and c.accountant_rate == pytest.approx(1 / 32)
    [p] = c.problems
    assert p.scope == "accountant" and "sample rate 0.03125" in p.message


def test_no_step_hook_is_a_finding_and_the_loader_gives_the_rate():
    s = make_private_setup()
    s.optimizer.step_hook = None
    c = check_setup(s.engine, s.optimizer, s.loader)
    assert c.hook == "none" and c.rate == pytest.approx(1 / 8) and c.n_records == 256
    [p] = c.problems
    assert p.level == "finding" and "no step hook" in p.message
    s.optimizer.attach_step_hook(lambda opt: None)
    [p] = check_setup(s.engine, s.optimizer, s.loader).problems
    assert p.level == "note" and "not an Opacus accountant's" in p.message


def test_ddp_expected_batch_size_is_per_rank():
    s = make_private_setup()
    s.optimizer.expected_batch_size = 32 / 2  # make_private under DDP with 2 ranks
    assert check_setup(s.engine, s.optimizer, s.loader, world_size=2).loader_verified
    s.optimizer.expected_batch_size = 7
    c = check_setup(s.engine, s.optimizer, s.loader, world_size=2)
    assert not c.loader_verified and "optimizer expects 7" in c.problems[0].message
