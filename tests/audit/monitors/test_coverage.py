"""The coverage monitor: trainable parameters of the model that the DP optimizer does not hold,
and tensors of the model that change outside the DP release (docs/monitors/coverage.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_private_setup
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.audit import AuditConfig, MonitorContext, PrivacyAuditor, build_monitors
from dpaudit_torch.audit.monitors.coverage import CoverageConfig, CoverageMonitor, module_path
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


# ---------------------------------------------------------------- the per-step watch
def _changed(report) -> dict[str, dict]:
    return {c["name"]: c for c in report.audits["coverage"]["changed_outside_release"]}


def _private_run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int = 4,
                 opt: str = "sgd", mode: str = "hooks", between=(), bmm: bool = False,
                 before_aud=None, **aud_kw):
    """Train ``model`` privately for ``steps`` logical steps with an auditor attached (``between``:
    callables of the model run after backward, before the DP step); returns the report."""
    from opacus import PrivacyEngine

    params = [p for p in model.parameters() if p.requires_grad]
    base = (torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3) if opt == "adam"
            else torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3))
    dl = DataLoader(TensorDataset(x, y), batch_size=16,
                    generator=torch.Generator().manual_seed(0))
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(module=model, optimizer=base, data_loader=dl,
                                  noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode,
                                  criterion=nn.CrossEntropyLoss(),
                                  noise_generator=torch.Generator().manual_seed(1))
    if mode == "ghost":
        model, dp_opt, crit, dl = out
    else:
        (model, dp_opt, dl), crit = out, nn.CrossEntropyLoss()
    if before_aud is not None:
        before_aud(model, dp_opt)
    aud = PrivacyAuditor(engine, dp_opt, dl, model=model, **{**CFG, **aud_kw})

    def one(xb, yb):
        dp_opt.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            crit(model(xb), yb).backward()
        for f in between:
            f(model)
        dp_opt.step()

    done = 0
    while done < steps:
        if bmm:
            from opacus.utils.batch_memory_manager import BatchMemoryManager

            with BatchMemoryManager(data_loader=dl, max_physical_batch_size=4,
                                    optimizer=dp_opt) as mdl:
                for xb, yb in mdl:
                    one(xb, yb)
                    done += not dp_opt._is_last_step_skipped
                    if done >= steps:
                        break
        else:
            for xb, yb in dl:
                one(xb, yb)
                done += 1
                if done >= steps:
                    break
    return aud.finalize()


class _EmbedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.emb(x)).mean(1))


class _LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from opacus.layers import DPLSTM

        self.emb = nn.Embedding(20, 6)
        self.lstm = DPLSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(x))
        return self.fc(out[:, -1])


def _conv_net(freeze_first: bool) -> nn.Module:
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    if freeze_first:
        net[0].requires_grad_(False)
    return net


def _tokens(n: int = 64):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 20, (n, 5), generator=g), torch.randint(0, 2, (n,), generator=g)


def _images(n: int = 64):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 2, (n,), generator=g)


@pytest.mark.parametrize("kind", ["embedding-layernorm", "lstm", "frozen-conv", "adam",
                                  "ghost", "batch-memory-manager"])
def test_correct_runs_change_nothing_outside_the_release(kind):
    torch.manual_seed(0)
    if kind in ("embedding-layernorm", "adam"):
        rep = _private_run(_EmbedNet(), *_tokens(), opt="adam" if kind == "adam" else "sgd")
    elif kind == "lstm":
        rep = _private_run(_LSTMNet(), *_tokens())
    elif kind == "ghost":
        rep = _private_run(_conv_net(False), *_images(), mode="ghost")
    else:
        rep = _private_run(_conv_net(kind == "frozen-conv"), *_images(),
                           bmm=kind == "batch-memory-manager")
    sec = rep.audits["coverage"]
    assert sec["watched"] and sec["watched_tensors"] >= 4
    assert sec["changed_outside_release"] == [] and sec["any_changed"] is False
    assert not rep.claim_inconsistent and _coverage(rep) == []


def test_equal_values_written_again_are_not_a_change():
    def rewrite(model):  # in-place no-ops, a broadcast of equal values, a new equal storage
        with torch.no_grad():
            model._module[0].weight.mul_(1.0)
            model._module[4].bias.data = model._module[4].bias.data.clone()
            model._module.register_buffer("mask", torch.ones(3)) if not hasattr(
                model._module, "mask") else model._module.mask.copy_(torch.ones(3))

    rep = _private_run(_conv_net(False), *_images(), between=[rewrite])
    assert rep.audits["coverage"]["changed_outside_release"] == []


def test_a_second_optimizer_and_an_update_by_hand_are_named():
    extra: list[torch.optim.Optimizer] = []

    def second(model):
        if not extra:
            extra.append(torch.optim.SGD(model._module[4].parameters(), lr=0.1))
        extra[0].step()

    def by_hand(model):
        w = model._module[0].weight
        w.data.add_(w.grad, alpha=-0.1)  # .data: no version counter moves

    rep = _private_run(_conv_net(False), *_images(), steps=5, between=[second, by_hand])
    got = _changed(rep)
    assert set(got) == {"0.weight", "4.weight", "4.bias"}
    assert got["4.weight"] == {"name": "4.weight", "module": "4", "tensor": "weight",
                               "kind": "parameter held by the DP optimizer", "first_step": 1,
                               "steps": 5}
    # a finding, not "claim inconsistent": a change is seen, not whether it depends on the data
    assert not rep.claim_inconsistent and rep.verdict == "finding (not a proof)"
    found = [f for f in _coverage(rep) if f["level"] == "finding"]
    assert len(found) == 1 and "4.bias (parameter held by the DP optimizer; first at step 1, " \
        "5 step(s))" in found[0]["message"]


class _Stats(nn.Module):
    def __init__(self, reassign: bool) -> None:
        super().__init__()
        self.reassign = reassign
        self.register_buffer("running_mean", torch.zeros(6, 6))
        self.register_buffer("frozen_stat", torch.ones(2))  # never updated: fine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.reassign:
                self.running_mean = 0.9 * self.running_mean + 0.1 * x.mean((0, 1))
            else:
                self.running_mean.mul_(0.9).add_(0.1 * x.mean((0, 1)))
        return x


@pytest.mark.parametrize("reassign", [False, True])
def test_a_buffer_updated_in_forward_from_the_data_is_named(reassign):
    net = nn.Sequential(_Stats(reassign), *_conv_net(False))
    rep = _private_run(net, *_images(), steps=3)
    assert list(_changed(rep)) == ["0.running_mean"]
    assert _changed(rep)["0.running_mean"]["kind"] == "buffer"
    assert _changed(rep)["0.running_mean"]["steps"] == 3
    rep = _private_run(nn.Sequential(_Stats(reassign), *_conv_net(False)), *_images(), steps=3,
                       monitor_options={"coverage": {"ignore": ("0.running_mean",)}})
    assert _changed(rep) == {} and not rep.claim_inconsistent


def test_a_direct_step_of_the_inner_optimizer_is_outside_the_release():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    s.train(2)
    s.optimizer.original_optimizer.step()  # the inner optimizer, without clipping or noise
    s.train(1)
    rep = aud.finalize()
    assert rep.audits["coverage"]["unaudited_updates"] == 1
    assert {c["first_step"] for c in rep.audits["coverage"]["changed_outside_release"]} == {3}


def test_training_while_detached_is_not_compared():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    s.train(2)
    aud.detach()
    s.train(2)
    aud.attach()
    s.train(2)
    assert aud.finalize().audits["coverage"]["changed_outside_release"] == []


def test_a_failure_of_the_watch_detaches_and_training_goes_on(monkeypatch):
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    s.train(1)

    def boom(step):
        raise RuntimeError("watch failed")

    monkeypatch.setattr(aud.monitors["coverage"], "after_release", boom)
    before = [p.detach().clone() for p in s.model.parameters()]
    s.train(1)
    assert not aud.attached
    assert any(not torch.equal(a, b) for a, b in zip(before, s.model.parameters()))
    s.train(1)  # unaudited, no error
    rep = aud.finalize()
    assert any("watch failed" in w for w in rep.warnings)


def test_changes_survive_a_checkpoint():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    s.train(2)
    with torch.no_grad():
        s.model._module[2].bias.add_(1.0)
    s.train(1)
    sd = aud.state_dict()
    assert sd["engine"]["monitors"]["coverage"]["changed"] == [
        ["2.bias", "parameter held by the DP optimizer", 1, 3]]
    aud.finalize()
    again = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model, **CFG)
    again.load_state_dict(sd)
    s.train(1)
    assert _changed(again.finalize())["2.bias"]["steps"] == 1


def test_the_watch_can_be_switched_off_and_its_settings_are_checked():
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, model=s.model,
                         monitor_options={"coverage": {"watch": False}}, **CFG)
    with torch.no_grad():
        s.model._module[2].bias.add_(1.0)
    s.train(2)
    sec = aud.finalize().audits["coverage"]
    assert sec["watched"] is False and sec["changed_outside_release"] == []
    with pytest.raises(ValueError, match="sample_coordinates"):
        CoverageConfig(sample_coordinates=0)
    with pytest.raises(ValueError, match="ignore"):
        CoverageConfig(ignore="ema.shadow")
    assert CoverageConfig(ignore=["ema."]).ignore == ("ema.",)


@pytest.mark.parametrize("big", [False, True])
def test_the_cpu_host_watch_sees_what_the_torch_watch_sees(big: bool) -> None:
    """On the CPU the watch fingerprints with compiled passes over NumPy views (no dispatcher
    operation; sums of squares in place of norms, torch's fused norms past HOST_NORM_MAX
    elements); the torch path (packed gathers, as on an accelerator) records the same changes
    at the same steps: a coordinate the sample misses (whole-tensor part), a sampled one, an
    integer buffer, and a write of equal values (no change)."""
    from dpaudit_torch.audit.monitors._tensor_watch import HOST_NORM_MAX, TensorWatch

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n = HOST_NORM_MAX + 10 if big else 4096
            self.big = nn.Parameter(torch.randn(n))
            self.small = nn.Parameter(torch.randn(5))
            self.register_buffer("count", torch.zeros(3, dtype=torch.int64))

    got = {}
    for host in (True, False):
        torch.manual_seed(0)
        net = Net()
        watch = TensorWatch(net, held=set(), sample=8)
        if not host:
            watch.set_pack(True)
        before = watch.fingerprint(0)
        assert (type(before.vectors[0]).__module__ == "numpy") is host
        with torch.no_grad():
            sampled = set(watch._groups[0].take[0].tolist())
            j = next(i for i in range(net.big.numel()) if i not in sampled)
            net.big[j] += 1.0  # not a sampled coordinate: the whole-tensor part sees it
        now = watch.fingerprint(1)
        watch.compare(now, before, 1, held_too=True)
        with torch.no_grad():
            net.small[2] = -net.small[2]  # every coordinate of a small tensor is sampled
            net.count += 1
            net.big.mul_(1.0)  # equal values written again
        later = watch.fingerprint(2)
        watch.compare(later, now, 2, held_too=True)
        got[host] = watch.changes()
    names = [w.path for w in TensorWatch(Net(), held=set()).tensors]
    assert {names[i]: v for i, v in got[True].items()} == {
        "big": (1, 1), "small": (1, 2), "count": (1, 2)}
    assert got[True] == got[False]


# ---------------------------------------------------------------- weight averages, ignore
def _buffer_copy(net: nn.Module) -> nn.Module:
    """A copy of ``net`` whose parameters are buffers (an EMA kept inside the model)."""
    import copy

    m = copy.deepcopy(net)
    for mod in m.modules():
        for n, p in list(mod._parameters.items()):
            if p is not None:
                del mod._parameters[n]
                mod.register_buffer(n, p.detach().clone())
    return m


class _WithAverage(nn.Module):
    """A conv net and a copy of its weights as buffers under ``ema`` (paired by name with
    ``net.*``) or under ``copy`` (paired only where declared)."""

    def __init__(self, under: str = "ema") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = _conv_net(False)
        self.under = under
        self.add_module(under, _buffer_copy(self.net))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def pairs(self):
        return zip(self.net.named_parameters(), getattr(self, self.under).named_buffers())


def _ema(beta: float, data: float = 0.0, lerp: bool = False):
    """One EMA update of every buffer towards its released parameter (``data``: plus that
    multiple of the parameter's non-private gradient); run after the DP step of the previous
    iteration, before this one's."""
    def update(model):
        with torch.no_grad():
            for (_, p), (_, b) in model._module.pairs():
                if lerp:
                    b.lerp_(p, beta)
                else:
                    b.mul_(1 - beta).add_(p, alpha=beta)
                if data:
                    b.add_(p.grad, alpha=data)
    return update


def _swa():
    """A running (SWA) average: b <- b + (p - b) / (n + 1), n the averages so far."""
    n = [0]

    def update(model):
        with torch.no_grad():
            for (_, p), (_, b) in model._module.pairs():
                b.add_((p - b) / (n[0] + 1))
        n[0] += 1
    return update


@pytest.mark.parametrize("how", ["ema", "lerp", "swa"])
def test_a_weight_average_of_the_released_parameters_is_post_processing(how):
    update = _swa() if how == "swa" else _ema(0.1, lerp=how == "lerp")
    rep = _private_run(_WithAverage(), *_images(), steps=4, between=[update])
    sec = rep.audits["coverage"]
    assert sec["changed_outside_release"] == [] and sec["any_changed"] is False
    assert rep.verdict != "finding (not a proof)"
    avg = {a["name"]: a for a in sec["averaged_buffers"]}
    assert set(avg) == {"ema.0.weight", "ema.0.bias", "ema.1.weight", "ema.1.bias",
                        "ema.4.weight", "ema.4.bias"}
    w = avg["ema.4.weight"]
    assert w["parameter"] == "net.4.weight" and w["paired_by"] == "name"
    # the first update meets a copy equal to its parameter: it moves by rounding only
    # (b * 0.9 + 0.1 * p; lerp and SWA leave it as it is), its beta undetermined
    assert (w["steps"], w["first_step"]) == ((4, 1) if how == "ema" else (3, 2))
    # the fitted beta: within the feasible interval's width (the float32 tolerance over
    # |p - b|) of the beta used: 0.1, or 1/(n+1) for n = 1..3 (SWA)
    lo, hi = (0.1, 0.1) if how != "swa" else (1 / 4, 1 / 2)
    assert lo - 1e-4 <= w["beta_min"] <= w["beta_max"] <= hi + 1e-4
    notes = [f for f in _coverage(rep) if f["level"] == "note"]
    assert len(notes) == 1 and notes[0]["message"].startswith(
        "6 buffer(s) changed only as weight averages of the released parameters, "
        "b <- (1 - beta) b + beta p at the sampled coordinates: ema.0.weight (of net.0.weight; "
        f"{w['steps']} step(s), beta ")
    assert [f for f in _coverage(rep) if f["level"] == "finding"] == []


@pytest.mark.parametrize("data", ["gradient", "input-mean"])
def test_a_weight_average_mixed_with_data_is_still_found(data):
    if data == "gradient":  # an EMA plus a (small) step along the non-private gradient
        update = _ema(0.1, data=1e-3)
    else:  # an EMA of the weights plus a running mean of the inputs in the bias
        def update(model):
            _ema(0.1)(model)
            with torch.no_grad():
                model._module.ema[4].bias.add_(1e-4 * model._module.net[0].weight.grad.sum())
    rep = _private_run(_WithAverage(), *_images(), steps=3, between=[update])
    got = _changed(rep)
    if data == "gradient":
        assert set(got) == {"ema.0.weight", "ema.0.bias", "ema.1.weight", "ema.1.bias",
                            "ema.4.weight", "ema.4.bias"}
    else:
        assert set(got) == {"ema.4.bias"}
    assert all(c["steps"] == 3 and c["kind"] == "buffer" for c in got.values())
    assert rep.verdict == "finding (not a proof)"


def test_a_change_outside_the_sampled_coordinates_of_an_average_is_found():
    """A paired buffer whose norm changed while no sampled coordinate moved is a finding."""
    from dpaudit_torch.audit.monitors._tensor_watch import TensorWatch

    net = _WithAverage()
    watch = TensorWatch(net, held={id(p) for p in net.net.parameters()}, sample=8)
    k = [w.path for w in watch.tensors].index("ema.4.weight")
    assert [(watch.tensors[p.buffer].path, watch.tensors[p.parameter].path)
            for p in watch.pairs][4] == ("ema.4.weight", "net.4.weight")
    first = watch.fingerprint(None)
    with torch.no_grad():
        g = next(g for g in watch._groups if k in g.idx)
        sampled = set(g.take[g.idx.index(k)].tolist())
        j = next(i for i in range(net.ema[4].weight.numel()) if i not in sampled)
        net.ema[4].weight.view(-1)[j] += 1.0
    watch.compare(watch.fingerprint(1), first, 1, held_too=True)
    assert watch.changes() == {k: (1, 1)} and watch.averages() == {}


def test_declared_averages_and_the_pairing_rule():
    from dpaudit_torch.audit.monitors._tensor_watch import TensorWatch, average_stems

    assert average_stems("ema.fc.weight") == ["fc.weight"]
    assert average_stems("model_ema.fc.weight") == ["fc.weight", "model.fc.weight"]
    assert average_stems("fc.weight_ema") == ["fc.weight"]
    assert average_stems("fc.swa_weight") == ["fc.weight"]
    assert average_stems("bn.running_mean") == []
    # "copy" is no marker: not paired unless declared
    rep = _private_run(_WithAverage("copy"), *_images(), steps=2, between=[_ema(0.1)])
    assert "copy.4.weight" in _changed(rep) and rep.audits["coverage"]["averaged_buffers"] == []
    declared = {f"copy.{n}": f"net.{n}" for n, _ in _conv_net(False).named_parameters()}
    rep = _private_run(_WithAverage("copy"), *_images(), steps=2, between=[_ema(0.1)],
                       monitor_options={"coverage": {"averages": declared}})
    assert _changed(rep) == {}
    assert {a["paired_by"] for a in rep.audits["coverage"]["averaged_buffers"]} == {"declared"}
    net = _WithAverage("copy")
    with pytest.raises(ValueError, match="'copy.9.weight' is not a watched buffer"):
        TensorWatch(net, set(), averages=(("copy.9.weight", "net.0.weight"),))
    with pytest.raises(ValueError, match=r"'copy.4.weight' cannot be the average of "
                                         r"'net.0.weight': their shapes differ"):
        TensorWatch(net, set(), averages=(("copy.4.weight", "net.0.weight"),))
    with pytest.raises(ValueError, match="averages must map buffer paths"):
        CoverageConfig(averages=("copy.4.weight",))
    assert CoverageConfig(averages={"a.w": "w"}).averages == (("a.w", "w"),)


def test_ignore_patterns_and_a_warning_for_an_entry_that_matches_nothing(caplog):
    from dpaudit_torch.audit.monitors._tensor_watch import TensorWatch, ignore_matches

    assert ignore_matches("ema.0.weight", "ema.*") and ignore_matches("ema.0.weight", "ema.")
    assert ignore_matches("bn.running_mean", "*.running_*")
    assert not ignore_matches("net.0.weight", "ema.*")
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    paths = [w.path for w in TensorWatch(net, set(), ignore=("*.running_*", "0.")).tensors]
    assert paths == ["1.weight", "1.bias", "1.num_batches_tracked"]
    with caplog.at_level("WARNING"):
        rep = _private_run(nn.Sequential(_Stats(False), *_conv_net(False)), *_images(),
                           steps=2, monitor_options={"coverage": {
                               "ignore": ("*.running_*", "emma.*")}})
    assert _changed(rep) == {}
    msg = ("coverage: the ignore entry 'emma.*' matches no parameter or buffer of the model, "
           "so it leaves nothing out (entries are tensor paths in the model, wrapper prefixes "
           "removed, such as '0.frozen_stat'; prefixes ending in '.'; or shell-style patterns "
           "such as 'ema.*')")
    assert [w for w in rep.warnings if "ignore entry" in w] == [msg]
    assert msg in caplog.text


def test_averages_survive_a_checkpoint():
    s = _WithAverage()
    rep1 = _private_run(s, *_images(), steps=2, between=[_ema(0.1)])
    a = rep1.audits["coverage"]["averaged_buffers"]
    assert a[0]["steps"] == 2
    mon = CoverageMonitor.__new__(CoverageMonitor)
    mon.load_state_dict({"at_start": [], "averaged": [[x["name"], x["steps"], x["first_step"],
                                                       x["beta_min"], x["beta_max"]]
                                                      for x in a]})
    assert mon._resumed_avg["ema.4.weight"][:2] == (2, 1)


def test_the_torch_path_fits_averages_as_the_host_path_does():
    """The watch's torch path (an accelerator's; the CPU's packed gathers) checks weight
    averages as the compiled host pass does: an EMA step towards the parameter fits, a step
    with a data term does not, a release-interval update uses the parameter after it."""
    from dpaudit_torch.audit.monitors._tensor_watch import TensorWatch

    got = {}
    for host in (True, False):
        net = _WithAverage()
        watch = TensorWatch(net, held={id(p) for p in net.net.parameters()}, sample=8)
        if not host:
            watch.set_pack(True)
        g = torch.Generator().manual_seed(5)
        after = watch.fingerprint(None)
        for step in (1, 2, 3):
            before = watch.fingerprint(step)
            watch.compare(before, after, step, held_too=True, post_now=False)
            with torch.no_grad():
                for p in net.net.parameters():  # the release
                    p.add_(torch.randn(p.shape, generator=g), alpha=0.1)
                # in the release interval: an EMA towards the released values
                net.ema[0].weight.lerp_(net.net[0].weight, 0.2)
            after = watch.fingerprint(step)
            watch.compare(after, before, step, held_too=False, post_now=True)
            with torch.no_grad():  # between releases: an EMA, and one with a data term
                net.ema[4].weight.mul_(0.9).add_(net.net[4].weight, alpha=0.1)
                net.ema[4].bias.mul_(0.9).add_(net.net[4].bias, alpha=0.1).add_(1e-3 * step)
        assert (type(after.vectors[0]).__module__ == "numpy") is host
        names = [w.path for w in watch.tensors]
        got[host] = ({names[i]: v for i, v in watch.changes().items()},
                     {names[watch.pairs[k].buffer]: v[:2] for k, v in watch.averages().items()})
        betas = {names[watch.pairs[k].buffer]: v[2:] for k, v in watch.averages().items()}
        assert betas["ema.0.weight"] == pytest.approx((0.2, 0.2), abs=1e-5)
        assert betas["ema.4.weight"] == pytest.approx((0.1, 0.1), abs=1e-5)
    assert got[True] == got[False]
    # the updates between releases are seen at the next step's start: steps 2 and 3
    assert got[True][0] == {"ema.4.bias": (2, 2)}
    assert got[True][1] == {"ema.0.weight": (3, 1), "ema.4.weight": (2, 2)}
