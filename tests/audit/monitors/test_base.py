"""What a monitor is, and the registry (dpaudit_torch/audit/monitors/base.py): registering,
choosing and building monitors with their own settings, the facts a monitor may ask for, and the
plain types of findings, settings and states.

A test that registers a throwaway monitor does it through the ``registry`` fixture, which puts
the registry back as it was (other tests see the normal monitors)."""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.audit import AuditConfig, StepRecord
from dpaudit_torch.audit.monitors import base
from dpaudit_torch.audit.monitors.base import (
    FINDING_LEVELS,
    MONITORS,
    Contribution,
    Evidence,
    Finding,
    Monitor,
    MonitorConfig,
    MonitorContext,
    build_monitors,
    monitor_names,
    plain_state,
    register_monitor,
)
from dpaudit_torch.contract import (
    MODEL,
    N_RECORDS,
    SAMPLE_RATE,
    FactUnavailable,
    StaticFacts,
)


@pytest.fixture
def registry() -> Iterator[None]:
    """The registry and its defaults as they were before the test, whatever it registered."""
    monitors, defaults = dict(MONITORS), list(base._DEFAULT)
    try:
        yield
    finally:
        for name in [n for n in MONITORS if n not in monitors]:
            MONITORS.pop(name)
        base._DEFAULT[:] = defaults
        assert MONITORS == monitors


@dataclass(frozen=True)
class ProbeConfig(MonitorConfig):
    alpha: float = 0.5  # also an audit setting: taken from the audit unless given
    check_every: int = 1
    knob: int = 3  # this monitor's own
    names: tuple[str, ...] = ("a", "b")

    def __post_init__(self) -> None:
        if self.knob < 0:
            raise ValueError(f"knob must be >= 0, got {self.knob!r}")


def _probe_class(label: str = "") -> type[Monitor]:
    class Probe(Monitor):
        config_class = ProbeConfig
        needs = (SAMPLE_RATE,)
        history_columns = ("probe_column",)

    Probe.label = label
    return Probe


def _ctx(cfg: AuditConfig | None = None, **kw: Any) -> MonitorContext:
    return MonitorContext(config=cfg or AuditConfig(k_pairs=2, m_canaries=4), k_pairs=2,
                          m_canaries=4, device="cpu", warn=lambda _m: None, **kw)


# ------------------------------------------------------------------ register_monitor
def test_register_monitor_names_labels_and_runs_it_by_default(registry: None) -> None:
    cls = register_monitor("probe_one")(_probe_class())
    assert MONITORS["probe_one"] is cls and cls.name == "probe_one"
    assert cls.label == "probe one"  # default label: the name in words
    assert list(MONITORS)[-1] == "probe_one" and monitor_names()[-1] == "probe_one"
    labelled = register_monitor("probe_two")(_probe_class("my probe (what it finds)"))
    assert labelled.label == "my probe (what it finds)"


def test_register_monitor_not_by_default(registry: None) -> None:
    before = monitor_names()
    register_monitor("probe_opt_in", default=False)(_probe_class())
    assert "probe_opt_in" in MONITORS and "probe_opt_in" not in monitor_names()
    assert monitor_names() == before
    assert monitor_names(AuditConfig(monitors=("probe_opt_in", "noise"))) == (
        "noise", "probe_opt_in")


def test_register_monitor_refuses_a_duplicate_or_a_non_monitor(registry: None) -> None:
    first = register_monitor("probe_dup")(_probe_class())
    with pytest.raises(ValueError, match="a monitor named 'probe_dup' is already registered"):
        register_monitor("probe_dup")(_probe_class())
    assert MONITORS["probe_dup"] is first and base._DEFAULT.count("probe_dup") == 1
    with pytest.raises(ValueError, match="'noise' is already registered"):
        register_monitor("noise")(_probe_class())

    class NotAMonitor:
        pass

    with pytest.raises(TypeError, match="monitor 'probe_bad' must subclass "
                                        "audit.monitors.Monitor"):
        register_monitor("probe_bad")(NotAMonitor)
    with pytest.raises(TypeError, match="probe_fn"):
        register_monitor("probe_fn")(lambda ctx: None)  # type: ignore[arg-type]
    assert "probe_bad" not in MONITORS and "probe_bad" not in base._DEFAULT


def test_the_registry_fixture_put_everything_back() -> None:
    assert not any(n.startswith("probe") for n in MONITORS)
    assert not any(n.startswith("probe") for n in base._DEFAULT)


# ------------------------------------------------------------------ monitor_names
def test_monitor_names_choose_in_registry_order() -> None:
    every = tuple(MONITORS)
    assert monitor_names() == monitor_names(None) == monitor_names(AuditConfig()) == every
    chosen = monitor_names(AuditConfig(monitors=("sampling", "sequential_pairs")))
    assert chosen == ("sequential_pairs", "sampling")  # registry order, not the given one
    assert monitor_names(AuditConfig(monitors="noise")) == ("noise",)
    assert monitor_names(AuditConfig(monitors=())) == ()
    off = monitor_names(AuditConfig(disable_monitors=("noise", "one_run")))
    assert off == tuple(n for n in every if n not in ("noise", "one_run"))
    both = AuditConfig(monitors=("noise", "sampling"), disable_monitors="noise")
    assert monitor_names(both) == ("sampling",)


@pytest.mark.parametrize("cfg,unknown", [
    (dict(monitors=("noise", "nosie")), "['nosie']"),
    (dict(disable_monitors=("zz", "aa")), "['aa', 'zz']"),
    (dict(monitor_options={"samplng": {"alpha": 0.1}}), "['samplng']"),
    (dict(monitors=("x",), disable_monitors=("y",), monitor_options={"z": {}}),
     "['x', 'y', 'z']"),
])
def test_monitor_names_refuse_unknown_names(cfg: dict[str, Any], unknown: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"unknown monitor(s) {unknown}; "
                                                   f"registered: {sorted(MONITORS)}")):
        monitor_names(AuditConfig(**cfg))


# ------------------------------------------------------------------ build_monitors
def test_build_monitors_gives_each_its_own_settings(registry: None) -> None:
    register_monitor("probe_build")(_probe_class())
    cfg = AuditConfig(k_pairs=2, m_canaries=4, alpha=0.01, check_every=7,
                      monitors=("probe_build", "sampling"),
                      monitor_options={"probe_build": {"knob": 9},
                                       "sampling": {"alpha": 0.2}})
    ctx = _ctx(cfg, facts={SAMPLE_RATE: 0.1, N_RECORDS: 100})
    mons = build_monitors(ctx)
    assert list(mons) == ["sampling", "probe_build"]
    probe = mons["probe_build"]
    # options first, then the audit's setting of the same name, then the default; alpha: the
    # audit's level for the monitor's proof path (the decision's share, docs/design.md s. 14)
    assert probe.settings == ProbeConfig(alpha=0.005, check_every=7, knob=9, names=("a", "b"))
    assert probe.ctx.options is probe.settings and probe.ctx.needs == (SAMPLE_RATE,)
    assert mons["sampling"].settings.alpha == 0.2
    assert mons["sampling"].ctx.needs == (SAMPLE_RATE, N_RECORDS)
    assert ctx.options is None and ctx.needs is None  # the caller's context is not changed
    # explicit names win over the configuration's choice
    only = build_monitors(ctx, ("probe_build",))
    assert list(only) == ["probe_build"] and only["probe_build"].settings.knob == 9
    assert build_monitors(ctx, ()) == {}


def test_build_monitors_refuses_unknown_names_and_options(registry: None) -> None:
    register_monitor("probe_opts")(_probe_class())
    with pytest.raises(ValueError, match=re.escape("unknown monitor(s) ['nope']")):
        build_monitors(_ctx(), ("noise", "nope"))
    bad = AuditConfig(k_pairs=2, m_canaries=4,
                      monitor_options={"probe_opts": {"knob": 1, "bogus": 2}})
    with pytest.raises(ValueError, match=re.escape(
            "unknown option(s) ['bogus'] for ProbeConfig; known: ['alpha', 'check_every', "
            "'knob', 'names']")):
        build_monitors(_ctx(bad), ("probe_opts",))
    # the monitor's own validation runs on its settings
    neg = AuditConfig(monitor_options={"probe_opts": {"knob": -1}})
    with pytest.raises(ValueError, match="knob must be >= 0, got -1"):
        build_monitors(_ctx(neg), ("probe_opts",))


# ------------------------------------------------------------------ MonitorConfig
def test_monitor_config_build_and_to_dict() -> None:
    audit = AuditConfig(alpha=0.02, check_every=4)
    assert ProbeConfig.build(audit) == ProbeConfig(alpha=0.01, check_every=4)  # its share
    assert ProbeConfig.build(audit, {"alpha": 0.3, "names": ("x",)}) == ProbeConfig(
        alpha=0.3, check_every=4, names=("x",))
    assert ProbeConfig.build(audit, None).knob == 3
    with pytest.raises(ValueError, match=re.escape("unknown option(s) ['k', 'z']")):
        ProbeConfig.build(audit, {"z": 1, "k": 2})
    assert ProbeConfig.build(audit).to_dict() == {"alpha": 0.01, "check_every": 4, "knob": 3,
                                                  "names": ["a", "b"]}
    assert MonitorConfig.build(audit) == MonitorConfig() and MonitorConfig().to_dict() == {}

    @dataclass(frozen=True)
    class Nested(MonitorConfig):
        table: dict[Any, Any] = dataclasses.field(
            default_factory=lambda: {1: ((2, 3), [4]), "k": {"n": (5,)}})

    assert Nested().to_dict() == {"table": {"1": [[2, 3], [4]], "k": {"n": [5]}}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProbeConfig().knob = 4  # type: ignore[misc]


# ------------------------------------------------------------------ MonitorContext facts
def test_context_answers_declared_facts_only() -> None:
    ctx = dataclasses.replace(_ctx(facts={SAMPLE_RATE: 0.25}), needs=(SAMPLE_RATE, N_RECORDS))
    assert ctx.fact(SAMPLE_RATE) == 0.25
    with pytest.raises(KeyError, match=re.escape("Fact('model') was not declared")):
        ctx.fact(MODEL)
    with pytest.raises(KeyError):
        ctx.fact_or(MODEL, 1)  # a programming error, not an unavailable fact
    with pytest.raises(FactUnavailable) as info:
        ctx.fact(N_RECORDS)
    assert info.value.fact == N_RECORDS and "not given to this audit" in info.value.reason
    assert ctx.fact_or(N_RECORDS) is None and ctx.fact_or(N_RECORDS, 7) == 7
    assert ctx.fact_or(SAMPLE_RATE, 7) == 0.25
    assert ctx.why_not(SAMPLE_RATE) is None
    assert ctx.why_not(N_RECORDS) == f"{N_RECORDS.meaning}: not given to this audit"


def test_context_without_an_adapter_or_with_a_fact_source() -> None:
    bare = _ctx()  # needs None: any fact may be asked for
    with pytest.raises(FactUnavailable, match="no framework adapter answers it") as info:
        bare.fact(MODEL)
    assert info.value.fact == MODEL
    assert bare.why_not(MODEL) == "the model being trained: no framework adapter answers it"
    src = _ctx(facts=StaticFacts({MODEL: "m"}, reason="not here"))
    assert src.fact(MODEL) == "m" and src.why_not(SAMPLE_RATE).endswith(": not here")


# ------------------------------------------------------------------ plain types
def test_finding_to_dict_has_scope_only_when_set() -> None:
    f = Finding("noise", "violation", "too little noise", "fc.weight")
    assert f.to_dict() == {"monitor": "noise", "level": "violation",
                           "message": "too little noise", "where": "fc.weight"}
    scoped = Finding("seq", "note", "m", scope="one step").to_dict()
    assert scoped == {"monitor": "seq", "level": "note", "message": "m", "where": None,
                      "scope": "one step"}
    assert FINDING_LEVELS == ("violation", "refuted", "inconsistent", "finding", "note")


def test_evidence_and_contribution_defaults() -> None:
    ev = Evidence(steps=[1], log_e=np.zeros(1))
    assert ev.extra == {}
    c = Contribution()
    assert (c.section, c.bounds, c.fields, c.canaries, c.verdict) == (None, {}, {}, {}, None)
    assert Contribution().bounds is not c.bounds  # fresh dicts per instance


def test_plain_state_converts_numpy_recursively_and_loads_weights_only() -> None:
    arr = np.arange(3, dtype=np.int64)
    state = {"a": np.float64(1.5), "b": [np.int32(2), (np.bool_(True), arr)],
             "c": {"d": np.ones((2, 2), dtype=np.float32)}, "e": "text", "f": None,
             "t": torch.tensor([1.0])}
    out = plain_state(state)
    assert type(out["a"]) is float and out["a"] == 1.5
    assert type(out["b"][0]) is int and type(out["b"][1]) is tuple
    assert out["b"][1][0] is True
    assert isinstance(out["b"][1][1], torch.Tensor) and out["b"][1][1].dtype == torch.int64
    assert out["b"][1][1].tolist() == [0, 1, 2]
    arr[0] = 9  # a copy: the tensor does not share the array's memory
    assert out["b"][1][1][0] == 0
    assert out["c"]["d"].dtype == torch.float32 and out["c"]["d"].shape == (2, 2)
    assert out["e"] == "text" and out["f"] is None and out["t"] is state["t"]
    buf = io.BytesIO()
    torch.save(out, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=True)
    assert again["a"] == 1.5 and again["b"][1][1].tolist() == [0, 1, 2]


# ------------------------------------------------------------------ the base class
def test_base_class_hooks_do_nothing() -> None:
    class Quiet(Monitor):
        config_class = ProbeConfig
        history_columns = ("c1", "c2")

    cfg = AuditConfig(alpha=0.01)
    m = Quiet(_ctx(cfg))  # built outside build_monitors: settings from the configuration
    assert m.settings == ProbeConfig(alpha=0.005, check_every=5)  # its share
    assert m.columns() == ("c1", "c2") and m.metric_name("c1") == "c1"
    v = torch.zeros(8, dtype=torch.float64)
    rec = StepRecord(step=1, values=v, x=v[:2], y=v[2:4], coins=torch.tensor([True, False]),
                     sigma=1.0, sigma_claimed=1.0)
    assert m.observe(rec) is None and m.advance() is None
    assert m.discard_pending() == [] and m.finalize(1.0) is None and m.findings() == []
    assert m.contribution() == Contribution()
    assert m.state_dict() == {} and m.load_state_dict({"x": 1}) is None
    given = dataclasses.replace(_ctx(), options=ProbeConfig(knob=0))
    assert Quiet(given).settings == ProbeConfig(knob=0)  # the context's settings are used
    assert Monitor.name == "" and Monitor.needs == () and Monitor.observes_nonfinite is False


def test_host_flags_reads_the_device_flags_once() -> None:
    """The buffered finiteness flags: bools pass through, device flags are read back in one
    transfer (docs/auditor.md, "On a GPU"), not one host read per flag."""
    import torch

    from dpaudit_torch.audit.monitors.base import host_flags
    from dpaudit_torch.testing.host_sync import HostReadCounter

    assert host_flags([True, False]) == [True, False] and host_flags([]) == []
    flags = [True, torch.tensor(False), torch.tensor([True]), False, torch.tensor(True)]
    with HostReadCounter() as counter:
        with counter.counting() as reads:
            got = host_flags(flags)
    assert got == [True, False, True, False, True]
    assert len(reads) == 1 and reads[0].method == "tolist"


def test_host_copies_copies_every_tensor_in_one_read() -> None:
    """The check's one transfer: float64 host copies of tensors of any shape and dtype, in
    their order, a tensor listed twice copied once, one host read for all (one per device)."""
    import torch

    from dpaudit_torch.audit.monitors.base import host_copies
    from dpaudit_torch.testing.host_sync import HostReadCounter

    flag = torch.tensor(False)
    tensors = [flag, torch.arange(6, dtype=torch.int64).reshape(2, 3),
               torch.tensor([0.1, -2.5], dtype=torch.float32), flag,
               torch.tensor([1.0 / 3.0], dtype=torch.float64), torch.zeros(0), torch.tensor(True)]
    with HostReadCounter() as counter:
        with counter.counting() as reads:
            got = host_copies(tensors)
    assert len(reads) == 1 and reads[0].method == "numpy"
    assert all(a.dtype == np.float64 for a in got)
    assert [a.shape for a in got] == [tuple(t.shape) for t in tensors]
    for a, t in zip(got, tensors):
        np.testing.assert_array_equal(a, t.to(torch.float64).numpy())  # exact
    assert host_copies([]) == []


def test_a_monitor_takes_its_host_copies_before_advance() -> None:
    """``fetch_pending``: what ``pending_tensors`` lists goes to ``take_host_copies`` in one
    transfer (what the engine does for every monitor at once); nothing pending: no call."""
    import torch

    from dpaudit_torch.audit.monitors.base import Monitor

    class Held(Monitor):
        def __init__(self) -> None:
            self.held: list = [torch.tensor([1.0, 2.0]), 3.0, torch.tensor(True)]
            self.calls = 0

        def pending_tensors(self) -> list:
            return [v for v in self.held if isinstance(v, torch.Tensor)]

        def take_host_copies(self, arrays: list) -> None:
            self.calls += 1
            it = iter(arrays)
            self.held = [next(it) if isinstance(v, torch.Tensor) else v for v in self.held]

    m = Held()
    m.fetch_pending()
    assert m.calls == 1 and m.pending_tensors() == []
    np.testing.assert_array_equal(m.held[0], [1.0, 2.0])
    assert m.held[1] == 3.0 and m.held[2] == 1.0
    m.fetch_pending()
    assert m.calls == 1
