"""PrivacyAuditor checkpoint / resume.

A run checkpointed at step t (model, optimizer, accountant, Opacus's noise generator, auditor)
and resumed in a NEW PROCESS ends with exactly the same report as the uninterrupted run. The
resumed process builds its auditor with ``seed=None``: the design and the secret coins must come
from the checkpoint, not from the new auditor's own draws.

This file is also the worker of the resumed process: ``python tests/test_checkpoint.py resume
CKPT OUT``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import make_private_setup  # noqa: E402
from float_tolerance import U32, Tol, assert_tree_close, random_walk_rel, solver_tol, sum_rel  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.testing import bugs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOTAL, CUT = 12, 2  # CUT is not a multiple of check_every: pairs are still buffered there
CONFIG: dict[str, Any] = dict(delta=1e-5, k_pairs=8, m_canaries=40, check_every=3,
                              claimed_every=4)


def _setup():
    s = make_private_setup(sigma=1.0, noise_seed=11)
    # a bug, so that the wealth moves and the violation is proven after the checkpoint (step 3)
    bugs.apply_bug(s.optimizer, "noise-divided-by-batch")
    return s


def _batches():
    """The same fixed batches in every process (conftest's data, seeded index draws)."""
    return list(make_private_setup(sigma=1.0).batches(TOTAL, batch=24, seed=3))


def _strip(d: Any) -> Any:
    """The report dict without creation times."""
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in ("created_at", "timestamp")}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def _report_json(aud: PrivacyAuditor) -> str:
    return json.dumps(_strip(aud.finalize().to_dict()), sort_keys=True, default=str)


def _train(s, aud, batches) -> None:
    for x, y in batches:
        s.step(x, y)  # the loop goes on after a violation (on_violation="stop" sets a flag)


def _checkpoint(s, aud) -> dict[str, Any]:
    return {
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "accountant": s.engine.accountant.state_dict(),
        "noise_rng": s.optimizer.generator.get_state(),
        "auditor": aud.state_dict(),
    }


def _restored(ck: dict[str, Any], **settings: Any) -> tuple[Any, PrivacyAuditor]:
    """A new setup and auditor (same configuration, unseeded, ``settings`` added) with the
    checkpoint's states."""
    s = _setup()
    s.model.load_state_dict(ck["model"])
    s.optimizer.load_state_dict(ck["optimizer"])
    s.engine.accountant.load_state_dict(ck["accountant"])
    s.optimizer.generator.set_state(ck["noise_rng"])
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=None, **settings, **CONFIG)
    aud.load_state_dict(ck["auditor"])
    return s, aud


def _resume(ckpt_path: str, out_path: str) -> None:
    """The resumed process: same configuration, state from the checkpoint, finish, report."""
    s, aud = _restored(torch.load(ckpt_path, weights_only=False))
    _train(s, aud, _batches()[CUT:])
    Path(out_path).write_text(_report_json(aud))


def test_resume_in_new_process_gives_the_same_report(tmp_path):
    batches = _batches()
    # uninterrupted run
    s = _setup()
    full = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, **CONFIG)
    _train(s, full, batches)
    expected = _report_json(full)
    # interrupted run: checkpoint at CUT, finish in a new process
    s2 = _setup()
    aud = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=5, **CONFIG)
    _train(s2, aud, batches[:CUT])
    assert aud.monitors["sequential_pairs"].buffer_x, \
        "the checkpoint must hold buffered, not yet fed pairs"
    ckpt = tmp_path / "ckpt.pt"
    torch.save(_checkpoint(s2, aud), ckpt)
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, __file__, "resume", str(ckpt), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = out.read_text()
    exp_d, got_d = json.loads(expected), json.loads(got)
    assert exp_d["violation"] and exp_d["violation_step"] > CUT
    assert exp_d["training"]["audited_steps"] == TOTAL
    assert exp_d["training"]["steps"] == TOTAL
    for key in exp_d:
        assert got_d[key] == exp_d[key], key
    assert got == expected


def test_state_dict_is_torch_saveable_plain(tmp_path):
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **CONFIG)
    _train(s, aud, _batches()[:4])
    sd = aud.state_dict()
    torch.save(sd, tmp_path / "a.pt")
    back = torch.load(tmp_path / "a.pt", weights_only=True)  # tensors and plain types only
    assert set(back) == set(sd)
    # loading into a fresh auditor in this process reproduces the state
    s2 = _setup()
    s2.model.load_state_dict(s.model.state_dict())
    other = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=99, **CONFIG)
    other.load_state_dict(back)
    assert torch.equal(other.design.one_flat, aud.design.one_flat)
    assert torch.equal(other.monitors["one_run"].coins.state()[0],
                       aud.monitors["one_run"].coins.state()[0])
    assert other.step == aud.step == 4
    assert torch.equal(other.monitors["one_run"].stacked_scores(),
                       aud.monitors["one_run"].stacked_scores())
    # the coming role coins and inclusions are the same (drawn in blocks of uniforms)
    for _ in range(70):
        mine, theirs = aud.tap.injector.plan_next(), other.tap.injector.plan_next()
        assert torch.equal(mine.coins_cpu, theirs.coins_cpu)
        assert torch.equal(mine.included, theirs.included)


@pytest.mark.parametrize("change,needle", [
    (dict(k_pairs=5), "k_pairs"),
    (dict(m_canaries=41), "m_canaries"),
    (dict(per_step_null=(0.5, 1e-6)), "null"),
    (dict(tests=("mmd",)), "tests"),
    (dict(check_every=2), "check_every"),
    (dict(alpha=0.01), "alpha"),
])
def test_load_into_other_configuration_fails_clearly(change, needle):
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **CONFIG)
    _train(s, aud, _batches()[:2])
    sd = aud.state_dict()
    aud.detach()
    other = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, **{**CONFIG, **change})
    before = (other.design.one_flat.clone(), other.step,
              other.monitors["one_run"].coins.state()[0].clone())
    with pytest.raises(ValueError, match=needle):
        other.load_state_dict(sd)
    assert torch.equal(other.design.one_flat, before[0]) and other.step == before[1]
    assert torch.equal(other.monitors["one_run"].coins.state()[0], before[2])


def test_load_into_other_model_fails_clearly():
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, **CONFIG)
    sd = aud.state_dict()
    s2 = make_private_setup(sigma=1.0, hidden=16)
    other = PrivacyAuditor(s2.engine, s2.optimizer, s2.loader, seed=1, **CONFIG)
    with pytest.raises(ValueError, match="parameter_shapes"):
        other.load_state_dict(sd)
    with pytest.raises(ValueError, match="not a PrivacyAuditor state_dict"):
        other.load_state_dict({"foo": 1})


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "resume":
        torch.set_num_threads(1)
        _resume(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: test_checkpoint.py resume CKPT OUT")


def test_checkpoint_written_under_an_earlier_default_resumes_with_it(monkeypatch):
    """A release that changes a default tester option (the MMD witness cap: 256, then 128)
    still resumes the checkpoints of the earlier one, with the option they were written with,
    and the resumed run's report equals the uninterrupted one's."""
    import copy

    from dpaudit_torch.audit import config as config_mod

    batches = _batches()
    monkeypatch.setitem(config_mod.DEFAULT_TEST_OPTIONS, "mmd", {"max_witness_points": 24})
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=4, **CONFIG)
    _train(s, aud, batches[:CUT])
    ck = copy.deepcopy(_checkpoint(s, aud))
    _train(s, aud, batches[CUT:])
    full = _report_json(aud)
    monkeypatch.setitem(config_mod.DEFAULT_TEST_OPTIONS, "mmd", {"max_witness_points": 128})
    r, resumed = _restored(ck)
    assert resumed.monitors["sequential_pairs"].segment.testers["mmd"].max_witness_points == 24
    _train(r, resumed, batches[CUT:])
    assert _report_json(resumed) == full


def test_checkpoint_written_before_the_noise_cap_resumes_uncapped():
    """A checkpoint written before ``noise_coordinates_total`` existed (its fingerprint lacks
    the key; its noise-audit coordinates were drawn uncapped) resumes into an auditor with the
    default cap: it continues with the checkpoint's coordinates and reports the setting it was
    written with (None), and the resumed report equals the uninterrupted one's. A cap set to
    another value is refused, naming the setting."""
    import copy

    batches = _batches()
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=6, noise_coordinates_total=None,
                         **CONFIG)
    _train(s, aud, batches[:CUT])
    ck = copy.deepcopy(_checkpoint(s, aud))
    del ck["auditor"]["config"]["noise_coordinates_total"]  # as the earlier release wrote it
    _train(s, aud, batches[CUT:])
    full = _report_json(aud)
    r, resumed = _restored(copy.deepcopy(ck))
    assert resumed.config.noise_coordinates_total is None
    assert torch.equal(resumed.noise_coords[1], ck["auditor"]["noise_coords"]["flat"])
    _train(r, resumed, batches[CUT:])
    assert _report_json(resumed) == full
    other_s = _setup()
    other = PrivacyAuditor(other_s.engine, other_s.optimizer, other_s.loader, seed=None,
                           noise_coordinates_total=1000, **CONFIG)
    with pytest.raises(ValueError, match="noise_coordinates_total"):
        other.load_state_dict(ck["auditor"])
    assert other.config.noise_coordinates_total == 1000


def test_checkpoint_of_the_first_state_layout_is_refused_by_version():
    """A checkpoint written by the auditor before the engine was split into monitors (state
    layout version 1, tests/data/auditor_state_v1.pt, made with that release) is refused with a
    message naming its version; the auditor is left as it was."""
    data = Path(__file__).resolve().parents[1] / "data"
    sd = torch.load(data / "auditor_state_v1.pt", weights_only=True)
    assert sd["version"] == 1
    s = make_private_setup(seed=0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, k_pairs=2, m_canaries=8,
                         check_every=2)
    before = aud.state_dict()
    with pytest.raises(ValueError,
                       match=r"version 1 is not supported \(this version reads 2 and 3\)"):
        aud.load_state_dict(sd)
    after = aud.state_dict()
    assert after["engine"]["counters"] == before["engine"]["counters"]
    assert torch.equal(after["coins"]["in"], before["coins"]["in"])
    for x, y in s.batches(2, batch=16):  # still audits
        s.step(x, y)
    assert aud.step == 2


#: the sampling finding's step: "rejected after 6 steps" then, "at training step 6; ..." now
_NOISE_RATIO = re.compile(r"was about \S+ x the claimed one (?:over the \d+ steps up to the "
                          r"test's crossing|at the first step, where the test crossed) "
                          r"\((\S+) over all \d+ steps\)")
_SAMPLING_STEP = re.compile(r"\((?:anytime-valid test rejected after|its own anytime-valid test "
                            r"crossed 1/alpha at training step) (\d+)[^)]*\)")


#: the few-inclusions warning after the audit stopped training, worded since without advice
_STOPPED_FEW = re.compile(r"^(IN canaries were included only \S+ times on average \(q T\)): "
                          r"the audit stopped training after \d+ step\(s\) on a proven "
                          r"violation, so the one-run bound had almost no power; the violation "
                          r"does not depend on it$")


def _drop_new(d: Any, new: set[str]) -> Any:
    """A report dict without what this release adds to a run of the release that wrote the
    layout-2 checkpoint: the sections and findings of monitors it did not have, the labels,
    the schema version, the fingerprint, the monitor settings, on_internal_error, the model
    and dataset names and the tester placement in the config, where the sequential testers
    ran, and the training's audit_incomplete_from_step and
    architecture_hash, the white-box bound and the power statement, the accountant's formula
    check."""
    d = _strip(d)
    d.pop("monitor_labels", None)
    d.pop("schema_version", None)
    d.pop("versions", None)
    d["audits"] = {k: v for k, v in d["audits"].items() if k not in new}
    d["findings"] = [f for f in d["findings"] if f.get("monitor") not in new]
    d["warnings"] = [w for w in d["warnings"] if not any(repr(n) in w for n in new)
                     and "before the two levels of evidence" not in w]
    # the two levels of evidence (schema 1.5): the evidence fields, the proof levels, the
    # settings of the levels and the sequential decision's evidence entries
    for k in ("alpha_warn", "evidence", "evidence_step", "proof_levels"):
        d.pop(k, None)
    for k in ("alpha_warn", "stop_on", "level_split"):
        d["config"].pop(k, None)
    for k in ("evidence_at_step", "evidence_threshold_log", "decision"):
        d["sequential"].pop(k, None)
    for f in d["findings"]:
        f.pop("scope", None)
        if f.get("monitor") == "sampling":  # reworded since: it names the training step
            f["message"] = _SAMPLING_STEP.sub(r"(rejected at \1)", f["message"])
        if f.get("monitor") == "noise":  # reworded since: the ratio up to the crossing first
            f["message"] = _NOISE_RATIO.sub(r"is about \1 x the claimed one", f["message"])
    for test in ("by_tensor", "by_group"):  # which group crossed, kept since
        for k in ("rejected_group", "rejected_ratio"):
            d["audits"].get("noise", {}).get(test, {}).pop(k, None)
    for k in ("monitors", "disable_monitors", "monitor_options", "on_internal_error",
              "model_name", "dataset_name", "tester_placement"):
        d["config"].pop(k, None)
    d["sequential"].pop("tester_placement", None)
    d["training"].pop("audit_incomplete_from_step", None)
    d["training"].pop("architecture_hash", None)
    # the accountant's formula checked since (the run's RDP accountant: a proven upper bound)
    for k in ("formula_check", "epsilon_lower_of_history", "under_reported"):
        d["audits"].get("accounting", {}).pop(k, None)
    d.pop("fingerprint", None)
    d.pop("checks", None)  # the monitors' check sections (schema 1.5)
    # each betting monitor's term of the decision, kept in the history since
    d["wealth_history"] = {k: v for k, v in d["wealth_history"].items()
                           if not k.startswith("monitor.")}
    # reworded since: after the audit itself stopped training, no advice to train longer
    d["warnings"] = [_STOPPED_FEW.sub(r"\1; the one-run bound has almost no power: raise the "
                                      r"number of steps or the sample rate", w)
                     for w in d["warnings"]]
    # the white-box release bound and its power statement (the report's power is the default
    # bound's), added since; the resumed run has no per-step moments before the resume, so it
    # gets no white-box bound (tested in tests/audit/monitors/test_one_run.py)
    d["epsilon_lower_bounds"].pop("whitebox", None)
    d["lower_bound_details"].pop("whitebox", None)
    d.pop("power", None)
    # the guess-based ceilings are the reachable ones since (each candidate's most correct
    # guesses given the IN / OUT counts), tested in tests/stats/test_one_run_bounds.py
    for det in d["lower_bound_details"].values():
        det.pop("ceiling", None)
    return d


def test_checkpoint_of_the_previous_layout_resumes_to_the_same_report():
    """A checkpoint written by the release whose state layout is version 2
    (tests/data/auditor_state_v2.pt, by tests/data/make_state_v2.py with that release) resumes
    in this release, and the run ends with that release's uninterrupted report
    (tests/data/report_v2.json), everything it had equal: strings, flags and counts exactly,
    floats within the tolerances of the float arithmetic that computed them on another CPU
    (``_V2_RUN`` and the fields below it); a monitor this release adds starts fresh at the
    resume, with a note naming it."""
    import dpaudit_torch.audit.monitors as monitors_pkg

    data = Path(__file__).resolve().parents[1] / "data"
    ck = torch.load(data / "auditor_state_v2.pt", weights_only=False)
    assert ck["auditor"]["version"] == 2
    expected = json.loads((data / "report_v2.json").read_text())
    s, aud = _restored(ck)
    _train(s, aud, _batches()[CUT:])
    got = json.loads(json.dumps(aud.finalize().to_dict(), default=str))
    new = set(monitors_pkg.monitor_names()) - set(ck["auditor"]["monitors"])
    for name in new:
        assert any(repr(name) in w and "started fresh" in w for w in got["warnings"]), name
    # written before the two levels: it resumes at its own alpha, each proof path at 0.05 as
    # that release decided, with a note
    assert got["alpha"] == 0.05 and got["proof_levels"] == {
        "decision": 0.05, "whitebox": 1e-3, "steinke": 0.05, "consistency": 0.05}
    assert sum("before the two levels of evidence" in w for w in got["warnings"]) == 1
    assert got["evidence"] and got["evidence_step"] <= got["violation_step"]
    got_d, exp_d = _drop_new(got, new), _drop_new(expected, new)
    # settings this release adds to the hockey-stick summary (the stake mixture's); the resumed
    # test bets by ONS as that release did, so every number below is still equal (to rounding)
    hs = got_d["sequential"]["tests"]["hockey_stick"]
    assert hs.pop("config_bet") == "ons"
    for key in ("config_stakes", "config_stake_weights", "config_max_stake"):
        hs.pop(key)
    assert exp_d["violation"] and exp_d["violation_step"] > CUT
    assert_tree_close(got_d, exp_d, _V2_RUN, _v2_fields(exp_d))


#: The stored report was computed on another CPU. Its floats of the float32 training run (the
#: model's gradients and the released values: noise statistics, wealths, one-run scores,
#: interference, the noise multiplier's interval) differ by the rounding of torch's float32
#: kernels (their blocking and vector width are chosen per CPU): independent roundings over the
#: reductions of the run (the hidden layer's width 32, the 12 steps) differ by about
#: sqrt(32 * 12) u32 = 1.2e-6 relative (float_tolerance.random_walk_rel), for a statistic whose
#: condition number is at most 1 (sums of same-signed terms, maxima, roots, quantile intervals).
_V2_RUN = Tol(rel=random_walk_rel(32 * TOTAL, U32), why="float32 run: sqrt(32 * 12) u32")
#: float64 from the same inputs (the accountant's RDP series, the null's Gaussian profile,
#: intervals of integer counts): at most 1024 terms of at most 4 ulp each
_V2_FLOAT64 = Tol(rel=sum_rel(1024), why="float64 from the same inputs: (4 + 1024) u64")
#: the one-run bounds and the power's (steinke.py / fdp.py: brentq xtol = rtol = 1e-12) of
#: integer counts
_V2_SOLVED = solver_tol(1e-12, 1e-12)


def _v2_fields(exp_d: dict[str, Any]) -> dict[str, Tol]:
    """Per-field tolerances of the layout-2 comparison (first matching pattern wins)."""
    rms = exp_d["interference"]["rms"]
    return {
        # a mean of values of both signs: its error is the values' (rms) times the run's u
        "interference.mean": Tol(rel=_V2_RUN.rel, abs=_V2_RUN.rel * rms,
                                 why="mean with cancellation: abs = rel * rms"),
        # epsilon ~ sigma^-2 at these sigmas (RDP of the Gaussian): condition number 2
        "audits.accounting.recomputed_epsilon": _V2_RUN.scaled(2.0, "epsilon ~ sigma^-2"),
        "claimed_epsilon": _V2_FLOAT64,
        "training.*": _V2_FLOAT64,
        "config.*": _V2_FLOAT64,
        "audits.accounting.claimed_epsilon": _V2_FLOAT64,
        "audits.accounting.accountant_history*": _V2_FLOAT64,
        "audits.accounting.rate_*": _V2_FLOAT64,
        "audits.accounting.loader_rate": _V2_FLOAT64,
        "audits.sampling.*": _V2_FLOAT64,
        "sequential.per_step_null.*": _V2_FLOAT64,
        "sequential.segments*": _V2_FLOAT64,
        "epsilon_lower_bounds.*": _V2_SOLVED,
        "lower_bound_details.*": _V2_SOLVED,
        "power.*": _V2_SOLVED,
    }


def test_resume_with_another_set_of_monitors_notes_each_and_keeps_the_decision_valid():
    """Resumed without a monitor the checkpoint has (``disable_monitors``): its last e-value
    stays in the decision's average (frozen), with a note. Resumed with a monitor the
    checkpoint lacks: it starts fresh, reports, and does not bet, with a note. A monitor's own
    settings that differ are refused, naming it."""
    import copy

    batches = _batches()
    s = _setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=3,
                         disable_monitors=("coverage",), **CONFIG)
    _train(s, aud, batches[:4])  # past a check: the noise monitor has bet
    ck = copy.deepcopy(_checkpoint(s, aud))
    last_noise = aud.decision.state_dict()["last"]["noise"]
    assert last_noise != 0.0
    # without the noise monitor: frozen in the average
    r, fewer = _restored(ck, disable_monitors=("noise", "coverage"))
    assert "noise" not in fewer.monitors and fewer.decision.frozen == {"noise": last_noise}
    assert any("'noise'" in w and "frozen" in w for w in fewer.warnings)
    _train(r, fewer, batches[4:])
    assert fewer.finalize().audits.get("noise") is None
    # with the coverage monitor the checkpoint lacks: fresh, excluded from the decision
    r2, more = _restored(ck)
    assert "coverage" in more.monitors and more.decision.excluded == {"coverage"}
    assert any("'coverage'" in w and "started fresh" in w for w in more.warnings)
    _train(r2, more, batches[4:])
    assert more.finalize().audits["coverage"]["run"] is False  # no model was handed over
    # a monitor's own settings differ: refused, naming it
    s3 = _setup()
    other = PrivacyAuditor(s3.engine, s3.optimizer, s3.loader, seed=None,
                           disable_monitors=("coverage",),
                           monitor_options={"sampling": {"alpha": 0.01}}, **CONFIG)
    with pytest.raises(ValueError, match="monitor 'sampling' was run with settings"):
        other.load_state_dict(ck["auditor"])


def test_checkpoint_written_before_the_two_levels_resumes_at_its_own_alpha():
    """A checkpoint of this layout written before the two levels of evidence (its fingerprint
    lacks alpha_warn, stop_on and level_split; its proofs were each at the default alpha of
    0.05 then, as ``level_split="per_path"`` makes them) resumes into an auditor with the new
    defaults at its own alpha, with a note, and the resumed report equals the uninterrupted
    one's. An alpha set to another value is refused, naming it."""
    import copy

    batches = _batches()
    s = _setup()
    old = dict(alpha=0.05, alpha_warn=0.05, level_split="per_path")
    quick = dict(disable_monitors=("one_run",))  # its bounds at finalize cost seconds
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=5, **old, **quick, **CONFIG)
    _train(s, aud, batches[:CUT])
    ck = copy.deepcopy(_checkpoint(s, aud))
    for key in ("alpha_warn", "stop_on", "level_split"):  # as the earlier release wrote it
        del ck["auditor"]["config"][key]
    _train(s, aud, batches[CUT:])
    full = json.loads(_report_json(aud))
    r, resumed = _restored(copy.deepcopy(ck), **quick)
    assert (resumed.config.alpha, resumed.config.level_split) == (0.05, "per_path")
    assert resumed.decision.threshold_log == pytest.approx(math.log(20.0))
    _train(r, resumed, batches[CUT:])
    got = json.loads(_report_json(resumed))
    note = [w for w in got["warnings"] if "before the two levels of evidence" in w]
    assert len(note) == 1 and "alpha = 0.05" in note[0]
    got["warnings"].remove(note[0])
    assert got == full
    other_s = _setup()
    other = PrivacyAuditor(other_s.engine, other_s.optimizer, other_s.loader, seed=None,
                           alpha=0.01, **quick, **CONFIG)
    with pytest.raises(ValueError, match=r"alpha \(state: 0.05, this auditor: 0.01\)"):
        other.load_state_dict(ck["auditor"])
