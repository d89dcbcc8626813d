"""``OpacusTap`` (dpaudit_torch/opacus_tap/tap.py): what it refuses, every fact of the contract
answered against the Opacus objects, the accountant's claim, its checkpoint state, the DDP hooks
without DDP, and the Opacus side of the report."""

from __future__ import annotations

import math
import re
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import make_private_setup, optimizer_untouched
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch import contract
from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.contract import FACTS, Fact, FactUnavailable
from dpaudit_torch.opacus_tap import OWNER_ATTR, OpacusTap

DELTA = 1e-5
SHAPES = [(32, 16), (32,), (2, 32), (2,)]
CFG = dict(k_pairs=4, m_canaries=32)


def _tap(s: Any, warned: list[str] | None = None, **kw: Any) -> OpacusTap:
    return OpacusTap(s.engine, s.optimizer, s.loader,
                     warn=(warned if warned is not None else []).append, **kw)


# ------------------------------------------------------------------ refusals
def test_refuses_an_optimizer_that_is_not_opacus_dp() -> None:
    s = make_private_setup()
    with pytest.raises(TypeError, match="an opacus DPOptimizer\\), got torch.optim.sgd.SGD"):
        OpacusTap(s.engine, s.optimizer.original_optimizer, s.loader, warn=print)


@pytest.mark.parametrize("engine,name", [
    (object(), "object"), (SimpleNamespace(accountant=None), "SimpleNamespace"),
    (SimpleNamespace(accountant=object()), "SimpleNamespace"),
])
def test_refuses_an_engine_without_an_accountant(engine: Any, name: str) -> None:
    s = make_private_setup()
    with pytest.raises(TypeError, match=f"privacy_engine must be an opacus PrivacyEngine \\(with "
                                        f"an accountant\\), got {name}"):
        OpacusTap(engine, s.optimizer, s.loader, warn=print)
    assert optimizer_untouched(s.optimizer)


class NoLength:
    pass


@pytest.mark.parametrize("loader,exc,message", [
    (NoLength(), ValueError, "data_loader (NoLength) has neither a sample_rate nor a length, "
                             "and the optimizer's step hook does not say the accountant's rate"),
    (SimpleNamespace(sample_rate="fast"), TypeError,
     "data_loader.sample_rate must be a number, got 'fast'"),
    (SimpleNamespace(sample_rate=0.0), ValueError,
     "data_loader.sample_rate must lie in (0, 1], got 0.0"),
    (SimpleNamespace(sample_rate=1.5), ValueError,
     "data_loader.sample_rate must lie in (0, 1], got 1.5"),
    ([], ValueError, "data_loader (list) has neither a sample_rate nor a length"),
])
def test_refuses_a_loader_without_a_usable_rate(loader: Any, exc: type[Exception],
                                                message: str) -> None:
    s = make_private_setup()
    s.optimizer.step_hook = None  # no accountant's rate to fall back on (opacus_tap/setup.py)
    with pytest.raises(exc, match=re.escape(message)):
        OpacusTap(s.engine, s.optimizer, loader, warn=print)
    assert optimizer_untouched(s.optimizer)


def test_refuses_a_model_that_is_not_a_module() -> None:
    s = make_private_setup()
    with pytest.raises(TypeError, match=re.escape("model must be the torch.nn.Module being "
                                                 "trained (or None), got str")):
        _tap(s, model="the model")
    with pytest.raises(TypeError, match="got list"):
        _tap(s, model=list(s.model.parameters()))


def test_refuses_an_optimizer_another_auditor_holds() -> None:
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **CFG)
    with pytest.raises(ValueError, match="already has a PrivacyAuditor attached"):
        _tap(s)
    aud.detach()
    assert _tap(s).optimizer is s.optimizer  # free again once detached


def test_a_loader_that_is_not_poisson_is_taken_at_one_over_its_length() -> None:
    s = make_private_setup(poisson=False)
    warned: list[str] = []
    tap = _tap(s, warned)
    assert not tap.poisson_loader and tap.sample_rate == pytest.approx(1.0 / len(s.loader))
    assert len(warned) == 1 and "is not Opacus's Poisson loader" in warned[0]
    assert f"1 / len(loader) = {1.0 / len(s.loader):.4g}" in warned[0]
    # fixed-size batches: what make_private was given, and the warning says that is what it got
    assert "(DataLoader, fixed batches of 32)" in warned[0]
    assert "it is the loader from before make_private" in warned[0]
    poisson = _tap(make_private_setup(), warned)
    assert poisson.poisson_loader and len(warned) == 1


def test_the_loader_from_before_make_private_is_named_as_such() -> None:
    """Training iterates the Poisson loader make_private returned; the auditor is handed the
    loader make_private was given: the warning says that is what it got."""
    s = make_private_setup()
    before = DataLoader(TensorDataset(s.X, s.Y), batch_size=32)
    warned: list[str] = []
    OpacusTap(s.engine, s.optimizer, before, warn=warned.append)
    assert len(warned) == 1
    assert warned[0].startswith("the data loader handed to the auditor (DataLoader, fixed "
                                "batches of 32) is not Opacus's Poisson loader: it is the "
                                "loader from before make_private")
    assert "pass that one" in warned[0]


# ------------------------------------------------------------------ facts
def test_the_run_it_reads() -> None:
    s = make_private_setup()
    tap = _tap(s, delta=1e-6)
    assert tap.shapes == SHAPES and tap.n_coordinates == 610 == sum(
        p.numel() for p in s.model.parameters())
    assert tap.params == list(s.optimizer.params) and tap.param_device == torch.device("cpu")
    assert tap.n_records == 256 and tap.sample_rate == s.loader.sample_rate == 32 / 256
    assert tap.delta == 1e-6 and tap.steps_at_attach == 0
    assert (tap.rank, tap.world_size, tap.layout, tap.ghost) == (0, 1, None, False)
    assert tap.injector is None and tap.reader is None and not tap.attached


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_fact_of_the_contract_is_answered(name: str) -> None:
    s = make_private_setup()
    tap = _tap(s, model=s.model)
    assert tap.answer(FACTS[name]) is not None


def test_rate_records_and_noise_multiplier() -> None:
    s = make_private_setup(sigma=1.3)
    tap = _tap(s)
    assert tap.answer(contract.SAMPLE_RATE) == s.loader.sample_rate
    assert tap.answer(contract.N_RECORDS) == len(s.loader.dataset) == 256
    assert tap.answer(contract.NOISE_MULTIPLIER) == 1.3 == s.optimizer.noise_multiplier
    s.optimizer.noise_multiplier = 0.7  # read when asked, not at construction
    assert tap.answer(contract.NOISE_MULTIPLIER) == 0.7 == tap.noise_multiplier()
    nolen = OpacusTap(s.engine, s.optimizer, SimpleNamespace(sample_rate=0.5, dataset=object()),
                      warn=print)
    with pytest.raises(FactUnavailable, match="the data loader's dataset has no length") as info:
        nolen.answer(contract.N_RECORDS)
    assert info.value.fact == contract.N_RECORDS and nolen.n_records is None


def test_optimizer_model_and_loader_facts() -> None:
    s = make_private_setup()
    tap = _tap(s, model=s.model)
    params = tap.answer(contract.OPTIMIZER_PARAMS)
    assert all(p is q for p, q in zip(params, s.optimizer.params)) and len(params) == 4
    params.clear()  # a copy: the tap keeps its own
    assert len(tap.answer(contract.OPTIMIZER_PARAMS)) == 4
    groups = tap.answer(contract.PARAM_GROUPS)
    assert len(groups) == 1 and groups[0] is s.optimizer.param_groups[0]
    assert tap.answer(contract.DATA_LOADER) is s.loader
    assert tap.answer(contract.MODEL) is s.model
    assert tap.answer(contract.ACCOUNTANT_NAME) == "RDPAccountant"
    assert tap.answer(contract.TENSOR_NAMES) == [
        "0.weight (group 0, shape 32x16)", "0.bias (group 0, shape 32)",
        "2.weight (group 0, shape 2x32)", "2.bias (group 0, shape 2)"]
    # without the model: by index
    assert _tap(s).answer(contract.TENSOR_NAMES)[2] == "tensor 2 (group 0, shape 2x32)"
    assert tap.answer(contract.TENSOR_GROUPS) == [0, 0, 0, 0]
    assert tap.answer(contract.GROUP_NAMES) == ["group 0"]


def test_model_unavailable_without_a_model() -> None:
    tap = _tap(make_private_setup())
    with pytest.raises(FactUnavailable) as info:
        tap.answer(contract.MODEL)
    assert info.value.fact == contract.MODEL
    assert info.value.reason == ("no model was handed to the auditor (pass model=... to "
                                 "PrivacyAuditor)")


def test_a_fact_the_adapter_does_not_know() -> None:
    tap = _tap(make_private_setup())
    odd = Fact("weather", "the weather outside")
    with pytest.raises(FactUnavailable, match="the weather outside: the Opacus adapter does not "
                                              "know it") as info:
        tap.answer(odd)
    assert info.value.fact is odd


def test_tensor_groups_of_several_parameter_groups() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.SGD([{"params": model[0].parameters()},
                           {"params": model[2].parameters(), "lr": 0.01}], lr=0.1)
    dl = DataLoader(TensorDataset(torch.randn(20, 4), torch.randint(0, 2, (20,))),
                    batch_size=5)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(module=model, optimizer=opt, data_loader=dl,
                                             noise_multiplier=1.0, max_grad_norm=1.0)
    tap = OpacusTap(engine, opt, dl, warn=print)
    assert tap.answer(contract.TENSOR_GROUPS) == [0, 0, 1, 1]
    assert tap.answer(contract.GROUP_NAMES) == ["group 0", "group 1"]
    assert tap.answer(contract.TENSOR_NAMES)[2] == "tensor 2 (group 1, shape 2x3)"
    assert [g["lr"] for g in tap.answer(contract.PARAM_GROUPS)] == [0.1, 0.01]


def test_the_accountant_callables_against_the_engines_accountant() -> None:
    s = make_private_setup(sigma=1.1)
    s.train(3)  # before the tap: its history starts after these
    tap = _tap(s, delta=DELTA)
    assert tap.steps_at_attach == 3
    history = tap.answer(contract.ACCOUNTANT_HISTORY)
    eps_of_history = tap.answer(contract.EPSILON_OF_HISTORY)
    eps_of_sigma = tap.answer(contract.EPSILON_OF_SIGMA)
    q = s.loader.sample_rate
    assert history() == []
    s.train(4)
    assert history() == [(1.1, q, 4)]  # read when called
    acc = s.engine.accountant
    assert acc.history == [(1.1, q, 7)]
    assert eps_of_history(acc.history) == pytest.approx(acc.get_epsilon(delta=DELTA), rel=1e-12)
    ref = RDPAccountant()
    ref.history = [(0.8, q, 50)]
    assert eps_of_sigma(0.8, 50) == ref.get_epsilon(delta=DELTA)
    assert eps_of_sigma(1.1, 7) == pytest.approx(s.engine.get_epsilon(DELTA), rel=1e-12)
    assert eps_of_sigma(2.0, 7) < eps_of_sigma(1.1, 7) < eps_of_sigma(1.1, 70)
    assert acc.history == [(1.1, q, 7)]  # fresh accountants: the engine's is untouched
    # the tap's delta is the one the callables use
    strict = _tap(s, delta=1e-8).answer(contract.EPSILON_OF_SIGMA)
    assert strict(1.1, 7) > eps_of_sigma(1.1, 7)


def test_accountant_name_of_another_accountant() -> None:
    s = make_private_setup(accountant="prv")
    tap = _tap(s)
    assert tap.answer(contract.ACCOUNTANT_NAME) == "PRVAccountant"
    assert isinstance(s.engine.accountant, PRVAccountant)


def test_read_claim() -> None:
    s = make_private_setup()
    tap = _tap(s, delta=DELTA)
    assert tap.read_claim() is None  # before the first step
    s.train(5)
    steps, eps = tap.read_claim()
    assert steps == 5 and eps == s.engine.get_epsilon(DELTA) and math.isfinite(eps)


# ------------------------------------------------------------------ without DDP
def test_seeds_and_decisions_are_not_shared_without_ddp() -> None:
    tap = _tap(make_private_setup())
    seeds = {"design": 1, "secret": 2, "mechanics": 3}
    warned: list[str] = []
    got, policy = tap.share_seeds(seeds, "seeded (1)", 1, warned.append)
    assert got is seeds and policy == "seeded (1)" and not warned
    assert tap.decision_sharer() is None


# ------------------------------------------------------------------ checkpoint
def test_state_round_trip_through_the_auditors_state() -> None:
    s1, s2 = make_private_setup(sigma=1.0), make_private_setup(sigma=1.0)
    a1 = PrivacyAuditor(s1.engine, s1.optimizer, s1.loader, seed=1, **CFG)
    s1.train(6)
    sd = a1.state_dict()
    tap_sd = sd["tap"]
    assert set(tap_sd) == {"mechanics_rng", "mechanics_pos", "mechanics_unit", "injector",
                           "reads", "steps_at_attach"}
    assert tap_sd["mechanics_unit"] == "uniforms" and tap_sd["reads"] == 6
    assert tap_sd["injector"] == a1.tap.injector.counters()
    assert tap_sd["injector"]["steps_injected"] == 6
    assert torch.equal(OpacusTap.mechanics_of_state(tap_sd).get_state(),
                       tap_sd["mechanics_rng"])
    a2 = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=2, **CFG)
    a2.load_state_dict(sd)
    mine = a2.tap.state_dict()
    assert torch.equal(mine.pop("mechanics_rng"), tap_sd["mechanics_rng"])
    assert mine == {k: v for k, v in tap_sd.items() if k != "mechanics_rng"}
    # the same draws from there on: the same plans, counters and positions after more steps
    for s in (s1, s2):
        s.train(4)
    t1, t2 = a1.tap.state_dict(), a2.tap.state_dict()
    assert torch.equal(t1.pop("mechanics_rng"), t2.pop("mechanics_rng"))
    assert t1 == t2 and t1["reads"] == 10 and t1["injector"]["steps_injected"] == 10


def test_steps_at_attach_come_back_from_the_state() -> None:
    s1, s2 = make_private_setup(), make_private_setup()
    s1.train(2)
    a1 = PrivacyAuditor(s1.engine, s1.optimizer, s1.loader, seed=1, **CFG)
    s1.train(3)
    a2 = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=1, **CFG)
    assert (a1.tap.steps_at_attach, a2.tap.steps_at_attach) == (2, 0)
    a2.load_state_dict(a1.state_dict())
    assert a2.tap.steps_at_attach == 2 and a2.tap.reader.reads == 3


# ------------------------------------------------------------------ the report
def test_fingerprint() -> None:
    s = make_private_setup()
    assert _tap(s).fingerprint() == {"parameter_shapes": [list(x) for x in SHAPES],
                                     "ghost": False, "sample_rate": s.loader.sample_rate,
                                     "optimizer": "DPOptimizer"}
    assert _tap(make_private_setup(mode="ghost")).fingerprint()["ghost"] is True


def test_training_info_and_threat_notes_of_flat_clipping() -> None:
    s = make_private_setup(sigma=1.2)
    tap = _tap(s)
    s.train(2)
    assert tap.training_info() == {
        "noise_multiplier": 1.2, "effective_noise_multiplier": 1.2, "max_grad_norm": 1.0,
        "sample_rate": s.loader.sample_rate, "expected_batch_size": 32.0, "steps": 2,
        "world_size": 1, "sharding": "none", "optimizer": "DPOptimizer",
        "grad_sample_mode": "per-sample", "clipping": "flat", "loss_reduction": "mean"}
    assert tap.clipping() == ("flat", False) and tap.threat_notes() == []


def test_training_info_and_threat_notes_of_per_layer_clipping() -> None:
    s = make_private_setup(clipping="per_layer", max_grad_norm=[1.0, 0.5, 2.0, 0.25])
    tap = _tap(s)
    info = tap.training_info()
    assert info["max_grad_norm"] == [1.0, 0.5, 2.0, 0.25] and info["clipping"] == "per_layer"
    assert tap.clipping() == ("per_layer", True)
    (note,) = tap.threat_notes()
    assert note.startswith("per-layer clipping:") and "conservative" in note


def test_ghost_mode() -> None:
    s = make_private_setup(mode="ghost")
    tap = _tap(s)
    assert tap.ghost
    info = tap.training_info()
    assert info["grad_sample_mode"] == "ghost" and info["clipping"] == "ghost (flat)"
    assert info["optimizer"] == type(s.optimizer).__name__ != "DPOptimizer"
    (note,) = tap.threat_notes()
    assert note.startswith("ghost clipping:") and "NOT exercised" in note
    s.optimizer._adjusted_noise_multiplier = 0.9  # what ghost clipping may use
    assert tap.answer(contract.NOISE_MULTIPLIER) == 0.9
    assert tap.training_info()["effective_noise_multiplier"] == 0.9


def test_the_auditor_owns_the_optimizer_while_attached() -> None:
    s = make_private_setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **CFG)
    tap = aud.tap
    assert tap.attached and getattr(s.optimizer, OWNER_ATTR) is aud
    tap.detach()
    assert not tap.attached and optimizer_untouched(s.optimizer)
    tap.detach()  # idempotent
    tap.attach(aud, aud.observe_hook, compiled=bool(aud.config.compiled_kernels))
    assert tap.attached and getattr(s.optimizer, OWNER_ATTR) is aud
    aud.detach()
