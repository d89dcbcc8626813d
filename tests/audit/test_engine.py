"""The audit engine on its own: configuration, monitors and decision driven by synthetic step
records, with Opacus made unimportable (as if it were not installed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import gaussian_step_records, loads_in_fresh_process, make_private_setup

from dpaudit_torch.audit import (
    MONITORS,
    AuditConfig,
    Decision,
    MonitorContext,
    PrivacyAuditor,
    StepRecord,
    build_monitors,
    monitor_names,
)
from dpaudit_torch.canaries import SecretCoins
from dpaudit_torch.registry import BOUND_METHODS, TESTERS, methods_of, refuting_methods

K, M = 4, 40


def _records(n: int, sigma: float, noise: float, seed: int, start: int = 1) -> list[StepRecord]:
    """n steps of a per-step Gaussian mechanism (conftest's ``gaussian_step_records``)."""
    return gaussian_step_records(n, K, M, sigma, noise, seed, start)


def _engine(cfg: AuditConfig, sigma: float) -> tuple[dict, Decision, list[str]]:
    warnings: list[str] = []
    coins = SecretCoins(M, torch.Generator().manual_seed(0))
    mons = build_monitors(MonitorContext(config=cfg, k_pairs=K, m_canaries=M, device="cpu",
                                         warn=warnings.append, coins=coins))
    mons["sequential_pairs"].start(sigma)
    return mons, Decision(cfg.alpha, cfg.history_stride, ["epsilon_lower_bound", *cfg.tests]), \
        warnings


def _run(cfg: AuditConfig, recs: list[StepRecord]) -> tuple[dict, Decision]:
    mons, dec, _ = _engine(cfg, recs[0].sigma)
    for r in recs:
        for m in mons.values():
            m.observe(r)
        if r.step % cfg.check_every == 0:
            dec.update([e for e in (m.advance() for m in mons.values()) if e], now=r.step)
    return mons, dec


def test_engine_imports_without_opacus():
    """Importing the engine, building a configuration, the monitors and the decision and feeding
    them records works with every ``opacus`` import refused."""
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "opacus" or name.startswith("opacus."):
                    raise ModuleNotFoundError("No module named 'opacus' (blocked)")
                return None
        sys.meta_path.insert(0, Block())
        import torch
        from dpaudit_torch.audit import AuditConfig, Decision, MonitorContext, StepRecord
        from dpaudit_torch.audit import build_monitors
        from dpaudit_torch.canaries import SecretCoins
        cfg = AuditConfig(k_pairs=2, m_canaries=4, check_every=1)
        mons = build_monitors(MonitorContext(config=cfg, k_pairs=2, m_canaries=4, device="cpu",
                                             warn=print, coins=SecretCoins(4, torch.Generator())))
        mons["sequential_pairs"].start(1.0)
        dec = Decision(cfg.alpha, 1, ["epsilon_lower_bound", *cfg.tests])
        c = torch.tensor([True, False])
        for t in range(1, 6):
            v = torch.zeros(8, dtype=torch.float64) + 5.0 * t
            r = StepRecord(step=t, values=v, x=v[:2], y=v[2:4], coins=c, sigma=1.0,
                           sigma_claimed=1.0)
            for m in mons.values():
                m.observe(r)
            dec.update([e for e in (m.advance() for m in mons.values()) if e], now=t)
        assert "opacus" not in sys.modules
        print("OK", sorted(mons), len(dec.history["step"]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"OK {sorted(monitor_names())} 5" in out.stdout


def test_importing_the_engine_does_not_load_numba():
    """Numba (about 100 MB with its compiled kernels) loads with the first kernel, not with the
    package: a process that imports the engine without auditing does not pay for it
    (benchmarks/scale.py counts it in the audited process)."""
    assert not loads_in_fresh_process(
        "import dpaudit_torch, dpaudit_torch.audit, dpaudit_torch.report", "numba")


def test_registries_name_every_part():
    # the engine's own monitors are registered (a later one is added by its module alone)
    assert {"sequential_pairs", "one_run", "noise", "sampling", "accounting"} <= set(MONITORS)
    assert monitor_names() == tuple(MONITORS)  # every registered monitor runs by default
    assert set(TESTERS) == {"mmd", "hockey_stick"}
    assert methods_of("one_run") == ("whitebox", "steinke", "fdp")
    assert methods_of("sequential_pairs") == ("sequential",)
    # the refutation rule: only family-free whole-run bounds refute
    assert [n for n, b in BOUND_METHODS.items() if b.may_refute] == ["whitebox", "steinke"]
    assert refuting_methods({"steinke": 2.0, "fdp": 9.0, "sequential": 9.0}, 1.0) == ["steinke"]
    assert refuting_methods({"steinke": 0.5, "fdp": 9.0, "sequential": 9.0}, 1.0) == []
    assert refuting_methods({"steinke": 2.0}, None) == []
    assert refuting_methods({"steinke": 2.0}, float("inf")) == []


def test_config_validates_and_fingerprints():
    cfg = AuditConfig(k_pairs=4, tests="hockey_stick")
    assert cfg.tests == ("hockey_stick",)
    assert cfg.to_dict()["tests"] == ["hockey_stick"] and "seed" not in cfg.to_dict()
    assert cfg.fingerprint() == AuditConfig(k_pairs=4, tests=("hockey_stick",),
                                            seed=3).fingerprint()
    assert cfg.fingerprint() != AuditConfig(k_pairs=5, tests="hockey_stick").fingerprint()
    with pytest.raises(ValueError, match="alpha"):
        AuditConfig(alpha=1.5)
    with pytest.raises(ValueError, match="canary_norm"):
        AuditConfig(canary_norm=0.5)
    with pytest.raises(ValueError, match="tests"):
        AuditConfig(tests=("mmd", "nope"))
    with pytest.raises(ValueError, match="on_violation"):
        AuditConfig(on_violation="explode")
    with pytest.raises(TypeError, match="seed"):
        AuditConfig(seed=1.5)
    with pytest.raises(TypeError, match="unknown audit setting"):
        AuditConfig.from_kwargs(k_paris=3)
    with pytest.raises(ValueError, match="test_options"):
        AuditConfig(test_options={"nope": {}})
    assert AuditConfig.from_kwargs(cfg, k_pairs=6).k_pairs == 6


def test_no_noise_stream_is_decided_and_correct_stream_is_not():
    """Synthetic records through the same monitors and decision as training: a stream without
    noise (the claimed sigma = 1 not delivered) is decided within a few checks; a correct stream
    is not decided in 200 steps (seeded)."""
    cfg = AuditConfig(k_pairs=K, m_canaries=M, check_every=5)
    _, dec = _run(cfg, _records(60, sigma=1.0, noise=0.05, seed=1))
    assert dec.violation and dec.crossed_at is not None and dec.crossed_at <= 20
    assert dec.violation_step is not None and dec.violation_step >= dec.crossed_at
    assert dec.violation_step % cfg.check_every == 0
    mons, dec = _run(cfg, _records(200, sigma=1.0, noise=1.0, seed=2))
    assert not dec.violation and dec.log_wealth < dec.threshold_log
    assert len(dec.history["step"]) == 200 and dec.history["step"][-1] == 200
    assert mons["one_run"].steps == 200


def test_decision_averages_monitors():
    """Two monitors' evidence for the same steps: the decision's e-process is their average."""
    from dpaudit_torch.audit import Evidence

    dec = Decision(0.05, 1, [])
    a = Evidence(steps=[1, 2], log_e=np.log([2.0, 40.0]))
    b = Evidence(steps=[1, 2], log_e=np.log([4.0, 2.0]))
    assert dec.update([a, b], now=2)
    assert dec.history["combined"] == pytest.approx(np.log([3.0, 21.0]).tolist())
    assert dec.crossed_at == 2 and dec.violation_step == 2
    # a monitor without a value at a step keeps its last one there (factor 1)
    dec2 = Decision(0.05, 1, [])
    dec2.update({"a": a, "b": Evidence(steps=[1], log_e=np.log([4.0]))}, now=2)
    assert dec2.history["combined"] == pytest.approx(np.log([3.0, 22.0]).tolist())


def test_monitor_states_round_trip():
    """Every monitor's and the decision's state reloads into fresh ones and gives the same
    evidence afterwards."""
    cfg = AuditConfig(k_pairs=K, m_canaries=M, check_every=4)
    recs = _records(30, sigma=1.0, noise=0.4, seed=3)
    mons, dec = _run(cfg, recs[:18])  # 2 steps still buffered
    sd = {n: m.state_dict() for n, m in mons.items()}
    mons2, dec2, _ = _engine(cfg, 1.0)
    for n, m in mons2.items():
        m.load_state_dict(sd[n])
    dec2.load_state_dict(dec.state_dict())
    for r in recs[18:]:
        for ms in (mons, mons2):
            for m in ms.values():
                m.observe(r)
    ev1 = [e for e in (m.advance() for m in mons.values()) if e]
    ev2 = [e for e in (m.advance() for m in mons2.values()) if e]
    assert ev1[0].steps == ev2[0].steps == list(range(17, 31))
    np.testing.assert_array_equal(ev1[0].log_e, ev2[0].log_e)
    assert torch.equal(mons["one_run"].stacked_scores(), mons2["one_run"].stacked_scores())
    bigger = build_monitors(MonitorContext(
        config=AuditConfig(k_pairs=K, m_canaries=M + 1), k_pairs=K, m_canaries=M + 1,
        device="cpu", warn=print, coins=SecretCoins(M + 1, torch.Generator())))
    with pytest.raises(ValueError, match="does not fit"):
        bigger["one_run"].load_state_dict(sd["one_run"])


def test_python_kernels_never_load_numba():
    """In Python-kernel mode (``compiled_kernels=False``, the default from 2^25 coordinates) a
    whole audit (attach, steps through the first check, finalize) runs without importing Numba:
    its ~100 MB stay out of the process."""
    statement = (
        "import warnings; warnings.simplefilter('ignore'); "
        "sys.path.insert(0, 'tests'); from conftest import make_private_setup; "
        "from dpaudit_torch.audit import PrivacyAuditor; s = make_private_setup(seed=1); "
        "a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64, "
        "compiled_kernels=False); s.train(12); r = a.finalize(); "
        "assert a.step >= 10 and r.config['compiled_kernels'] is False")
    assert not loads_in_fresh_process(statement, "numba")


def test_kernel_mode_by_model_size(monkeypatch):
    """``compiled_kernels=None``: compiled below COMPILED_BELOW trainable coordinates, Python
    from there on; an explicit value wins; detach() and finalize() put the process's mode
    back."""
    import dpaudit_torch._compiled as comp

    s = make_private_setup(seed=1)
    a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    assert a.config.compiled_kernels is True and comp.compiled()
    a.detach()
    monkeypatch.setattr(comp, "COMPILED_BELOW", 10)
    a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    assert a.config.compiled_kernels is False and not comp.compiled()
    s.train(6)
    a.finalize()
    assert comp.compiled()  # the process's mode is back once the audit is over
    a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    assert not comp.compiled()
    a.detach()
    assert comp.compiled()
    a = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64,
                       compiled_kernels=True)
    assert a.config.compiled_kernels is True and comp.compiled()
    a.detach()
    with pytest.raises(TypeError, match="compiled_kernels"):
        PrivacyAuditor(s.engine, s.optimizer, s.loader, compiled_kernels="yes")
