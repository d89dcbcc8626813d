"""The auditor's accelerator code path reads nothing back to the host between two checks, and
makes one host read at a check (docs/auditor.md, "On a GPU").

On a GPU, a host read of a tensor waits for the device's queued work; on the CPU it does not, so
these tests count the reads themselves: ``force_device_path`` makes an auditor on the CPU take
the code path it takes on an accelerator (torch gathers, finiteness as a tensor flag checked at
the next check, the canaries' rows written and added by torch, the noise rows, pairs and flags
kept as tensor copies until the check, which copies them all to the host in one transfer:
``monitors.base.host_copies``), and ``HostReadCounter`` records every ``.item()``, ``.cpu()``,
``.tolist()``, ``.numpy()``, ``bool()``, ``float()``, ``int()`` and ``__index__`` of a tensor
made inside ``optimizer.step()`` (where everything the auditor does happens), together with
what a training loop reads after it (``should_stop``, ``latest_metrics``, an ``on_step``
callback). Reads of tensors that are host tensors on every device are marked ``host_side`` and
not counted: the auditor's CPU generator's uniforms, and the work of the sequential testers the
hook feeds placed on the host (``tester_placement``: built on the host, fed the check's host
copies; placed on the device, their reads are counted). Blocking host-to-device copies are
no-ops on the CPU: ``benchmarks/gpu_check.py`` counts those on a GPU (CUDA's sync debug mode).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import make_private_setup

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.testing.host_sync import HostRead, HostReadCounter, force_device_path

pytestmark = pytest.mark.usefixtures("one_thread")

CHECK_EVERY = 10
STEPS = 3 * CHECK_EVERY
#: host reads at one check: the one transfer of everything buffered on the device since the last
#: check (finiteness flags, pairs, noise rows, the precision check's values); the monitors and
#: the decision then work on its host copies
AT_CHECK = 1
SMALL = {"k_pairs": 4, "m_canaries": 50}


def _run(mode: str, clipping: str = "flat", force: bool = True, steps: int = STEPS,
         **settings: Any) -> tuple[PrivacyAuditor, list[list[HostRead]]]:
    """``steps`` audited steps (fixed-size batches, no violation to act on); per step, the host
    reads of ``optimizer.step()`` and of what a training loop reads after it."""
    s = make_private_setup(mode=mode, sigma=1.0, clipping=clipping,
                           max_grad_norm=[1.0, 0.5, 2.0, 1.0] if clipping == "per_layer"
                           else 1.0)
    seen: list[dict[str, Any]] = []
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, check_every=CHECK_EVERY,
                         on_violation="warn", on_step=seen.append, **SMALL, **settings)
    if force:
        force_device_path(aud)
    per_step: list[list[HostRead]] = []
    with HostReadCounter() as counter:
        for x, y in s.batches(steps, batch=16):
            s.optimizer.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Opacus's hooks on the first layer
                s.criterion(s.model(x), y).backward()
            with counter.counting() as reads:
                s.optimizer.step()
                _ = aud.should_stop, aud.latest_metrics
            per_step.append(reads)
    assert len(seen) == steps
    return aud, per_step


def _device_reads(reads: list[HostRead]) -> list[str]:
    return [str(r) for r in reads if not r.host_side]


@pytest.mark.parametrize("mode,clipping", [("hooks", "flat"), ("ghost", "flat"),
                                           ("hooks", "per_layer")])
def test_no_host_read_between_checks(mode: str, clipping: str) -> None:
    aud, per_step = _run(mode, clipping)
    between = {i: _device_reads(r) for i, r in enumerate(per_step, 1) if i % CHECK_EVERY}
    assert {i: r for i, r in between.items() if r} == {}
    at_check = [len(_device_reads(per_step[i - 1])) for i in range(CHECK_EVERY, STEPS + 1,
                                                                     CHECK_EVERY)]
    assert all(0 < n <= AT_CHECK for n in at_check), (at_check, [
        _device_reads(per_step[i - 1]) for i in range(CHECK_EVERY, STEPS + 1, CHECK_EVERY)])
    # the host-side reads: none between checks (the canary mechanics' uniforms are drawn into
    # a host buffer, not read from a tensor), and at the checks the hook's sequential testers,
    # which run on the host copies
    host_side = {(i, r.site.split(":")[0]) for i, rs in enumerate(per_step, 1) for r in rs
                 if r.host_side}
    assert {(i, f) for i, f in host_side if i % CHECK_EVERY} == set()
    assert {f.split("/")[1] for i, f in host_side if not i % CHECK_EVERY} <= {
        "stats", "_validation.py"}
    # and the accelerator's path did run: no compiled host pass anywhere
    reader, inj = aud.tap.reader, aud.tap.injector
    assert reader.reads == STEPS and reader.compiled_reads == 0
    assert inj.compiled_adds == 0
    if inj.shadow is not None:
        assert inj.shadow.replica_steps == 0
    assert aud.engine.step == STEPS


def test_the_host_path_reads_views_at_every_step() -> None:
    """Without ``force_device_path`` the CPU takes its compiled host path, which reads NumPy
    views of the gradients at every step by design (free on the CPU): the instrument sees
    them, so the test above is not vacuous."""
    aud, per_step = _run("hooks", force=False, steps=3)
    assert aud.tap.reader.compiled_reads == 3
    assert all(_device_reads(r) for r in per_step)


def test_the_device_path_gives_the_host_paths_report() -> None:
    """The accelerator's path computes what the CPU's host path computes: the same decision
    history, bounds and one-run scores (to rounding)."""
    reports = [_run("hooks", force=f, steps=2 * CHECK_EVERY)[0].finalize() for f in (False, True)]
    a, b = reports
    assert a.wealth_history.keys() == b.wealth_history.keys()
    for key, values in a.wealth_history.items():
        np.testing.assert_allclose(values, b.wealth_history[key], rtol=1e-9, atol=1e-12,
                                   err_msg=key)
    for name, bound in a.epsilon_lower_bounds.items():
        assert math.isclose(bound, b.epsilon_lower_bounds[name], rel_tol=1e-9, abs_tol=1e-12)
    for side in ("in", "out"):
        np.testing.assert_allclose(a.one_run_scores[side], b.one_run_scores[side], rtol=1e-9,
                                   atol=1e-12)
    assert a.violation == b.violation


def _nan_steps(force: bool, on_nonfinite: str, bad: tuple[int, ...], steps: int
               ) -> tuple[PrivacyAuditor, list[BaseException | None]]:
    """``steps`` steps whose batches ``bad`` (0-based) hold a NaN; what each step raised."""
    s = make_private_setup(sigma=1.0)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=1, check_every=CHECK_EVERY,
                         on_violation="warn", on_nonfinite=on_nonfinite, **SMALL)
    if force:
        force_device_path(aud)

    def sanitize(_o: Any, _a: Any, _k: Any) -> None:  # keep the parameters finite
        for p in s.optimizer.params:
            if p.grad is not None:
                p.grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    s.optimizer.original_optimizer.register_step_pre_hook(sanitize)
    raised: list[BaseException | None] = []
    for i, (x, y) in enumerate(s.batches(steps, batch=16)):
        if i in bad:
            x = x.clone()
            x[0, 0] = float("nan")
        try:
            s.step(x, y)
            raised.append(None)
        except ValueError as e:
            raised.append(e)
    return aud, raised


def test_a_nonfinite_step_is_skipped_as_on_the_host_path() -> None:
    """Deferred finiteness flags, read back in the check's one transfer: the steps flagged
    non-finite are dropped by every monitor, as the host path drops them at their step."""
    reports = []
    for force in (False, True):
        aud, raised = _nan_steps(force, "skip", (3, 14), 2 * CHECK_EVERY)
        assert raised == [None] * (2 * CHECK_EVERY)
        reports.append(aud.finalize())
    a, b = reports
    assert a.training["nonfinite_steps_skipped"] == b.training["nonfinite_steps_skipped"] == 2
    for key, values in a.wealth_history.items():
        np.testing.assert_allclose(values, b.wealth_history[key], rtol=1e-9, atol=1e-12,
                                   err_msg=key)


def test_a_nonfinite_step_is_refused_at_the_check() -> None:
    """The accelerator's path finds the bad step at the check (its flag comes back with the
    one transfer): the check's step is refused, naming the steps whose observations are
    discarded, and training goes on."""
    aud, raised = _nan_steps(True, "raise", (3,), CHECK_EVERY + 2)
    errors = [(i, e) for i, e in enumerate(raised, 1) if e is not None]
    assert [i for i, _ in errors] == [CHECK_EVERY]
    assert f"during steps 1..{CHECK_EVERY}" in str(errors[0][1])
    # the steps up to the check were discarded; the next ones are buffered on the device again
    seq = aud.monitors["sequential_pairs"]
    assert seq.pending_steps == [CHECK_EVERY + 1, CHECK_EVERY + 2] and seq.pending_tensors()


def test_a_resume_keeps_the_readers_packed_gathers() -> None:
    """A checkpoint resume rebuilds the reader: it keeps how the reader was set to read
    (packed gathers, as the finiteness check and the compiled pass)."""
    aud, _ = _run("hooks", steps=3)
    assert aud.tap.reader.pack_gathers is True
    before = aud.tap.reader
    aud.load_state_dict(aud.state_dict())
    assert aud.tap.reader is not before and aud.tap.reader.pack_gathers is True


def _same_audit(a: Any, b: Any) -> None:
    """Two reports with the same decision history, bounds, rejections (to 1e-9)."""
    assert a.wealth_history.keys() == b.wealth_history.keys()
    for key, values in a.wealth_history.items():
        np.testing.assert_allclose(values, b.wealth_history[key], rtol=0, atol=1e-9,
                                   err_msg=key)
    assert a.epsilon_lower_bounds.keys() == b.epsilon_lower_bounds.keys()
    for name, bound in a.epsilon_lower_bounds.items():
        assert math.isclose(bound, b.epsilon_lower_bounds[name], rel_tol=0, abs_tol=1e-9)
    ta, tb = a.sequential["tests"], b.sequential["tests"]
    assert ta.keys() == tb.keys()
    for name in ta:
        for key in ("rejected", "rejected_at", "n_pairs"):
            assert ta[name][key] == tb[name][key], (name, key)
        assert math.isclose(ta[name]["combined_log_wealth"], tb[name]["combined_log_wealth"],
                            rel_tol=0, abs_tol=1e-9)
    assert math.isclose(a.sequential["combined_log_wealth"], b.sequential["combined_log_wealth"],
                        rel_tol=0, abs_tol=1e-9)
    assert (a.violation, a.violation_step) == (b.violation, b.violation_step)


def test_the_testers_on_the_device_give_the_host_placements_audit() -> None:
    """``tester_placement="device"`` on the accelerator's path: the testers are fed the buffered
    device tensors (running the torch code an accelerator runs: ``TESTER_DEVICE_CODE``) and
    the check's transfer brings the finiteness flags only; the audit is the host placement's
    (log-wealth, rejections, bounds within 1e-9), and the report says where the testers ran.
    A run where the noise is too small, so that the tests reject."""
    reports, reads = {}, {}
    for placement in ("host", "device"):
        aud, per_step = _run("hooks", steps=3 * CHECK_EVERY, tester_placement=placement,
                             per_step_null=(0.05, 0.0))
        seq = aud.monitors["sequential_pairs"]
        assert seq.placement == placement
        if placement == "device":
            assert all(t.force_torch if n == "mmd" else t.force_vectorised
                       for n, t in seq.segment.testers.items())
        reads[placement] = per_step
        reports[placement] = aud.finalize()
    h, d = reports["host"], reports["device"]
    assert h.sequential["tests"]["hockey_stick"]["rejected"]  # the comparison is not vacuous
    _same_audit(h, d)
    assert h.sequential["tester_placement"] == {
        "setting": "host", "placement": "host", "device": "cpu", "reason": "set by the user"}
    assert d.sequential["tester_placement"]["placement"] == "device"
    assert d.sequential["tester_placement"]["device"] == "cpu"  # a CPU run
    assert h.config["tester_placement"] == "host" and d.config["tester_placement"] == "device"
    html = d.to_html()
    assert 'id="tester-placement"' in html and "tester_placement=&#x27;device&#x27;" in html
    # between checks nothing is read either way; at a check the device placement's testers
    # read their own results back (counted as the device's reads: not host-side)
    for placement, per_step in reads.items():
        between = [_device_reads(r) for i, r in enumerate(per_step, 1) if i % CHECK_EVERY]
        assert not any(between), placement
    at = {p: [len(_device_reads(r)) for i, r in enumerate(per_step, 1) if not i % CHECK_EVERY]
          for p, per_step in reads.items()}
    assert all(n == AT_CHECK for n in at["host"]) and all(n > AT_CHECK for n in at["device"])


def test_the_placement_is_kept_in_checkpoints_and_compared_on_resume() -> None:
    aud, _ = _run("hooks", steps=CHECK_EVERY + 3, tester_placement="device")
    sd = aud.state_dict()
    assert sd["engine"]["monitor_settings"]["sequential_pairs"]["tester_placement"] == "device"
    before = aud.finalize()
    # the same setting resumes (into a fresh auditor on the same training)
    again, _ = _run("hooks", steps=0, tester_placement="device")
    again.load_state_dict(sd)
    assert again.monitors["sequential_pairs"].placement == "device"
    resumed = again.finalize()
    _same_audit(before, resumed)
    # another setting is refused, naming it
    other, _ = _run("hooks", steps=0, tester_placement="host")
    with pytest.raises(ValueError, match=r"monitor 'sequential_pairs' was run with settings "
                                         r".*'tester_placement': 'device'"):
        other.load_state_dict(sd)
    # a checkpoint written before the setting existed resumes into the default ("auto")
    del sd["engine"]["monitor_settings"]["sequential_pairs"]["tester_placement"]
    fresh, _ = _run("hooks", steps=0)
    fresh.load_state_dict(sd)
    assert fresh.config.tester_placement == "auto"
    with pytest.raises(ValueError, match="tester_placement"):
        other.load_state_dict(sd)  # but not into a setting that is not the default
