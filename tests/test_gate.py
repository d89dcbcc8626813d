"""The release gate (dpaudit_torch/gate.py, ``dpaudit gate``, docs/release_gate.md): each pass,
each fail condition (L above the claim, no baseline, a weaker or incomparable audit, a stronger
audit whose L jumps), the impossible comparisons (threat model, subject, no claim), the warning
of a large rise of L with the claim unchanged, ``--first-release``, the 1.3 report written by
the previous release (tests/data/report_v1_3.json) read as a baseline, and bad input: one line,
exit 2.

The reports are the 1.3 fixture, a real audit of a short correct run, read by this release, with
fields edited the way a release would change them (every edited report passes
:func:`dpaudit_torch.report.validate`)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpaudit_torch.cli import main
from dpaudit_torch.gate import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_PASS,
    FAIL,
    GATE_HTML,
    IMPOSSIBLE,
    JUMP_MARGIN,
    PASS,
    AuditInput,
    GateInputError,
    gate,
    read_audit,
    render_html,
)
from dpaudit_torch.report import AuditReport, validate
from dpaudit_torch.report.fingerprint import fingerprint_of
from dpaudit_torch.report.schema import ReportData

DATA = Path(__file__).resolve().parent / "data"
V13 = DATA / "report_v1_3.json"
RAW = json.loads(V13.read_text(encoding="utf-8"))
CLAIM = RAW["claimed_epsilon"]  # 5.88 (30 steps of sigma 1, q 0.125)
MARGIN = JUMP_MARGIN * CLAIM  # 1.47


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    for key in head:
        d = d[key]
    d[last] = value


def _doc(edits: dict[str, Any] | None = None, bounds: dict[str, float] | None = None,
         claim: float | None = None) -> dict[str, Any]:
    """The 1.3 fixture as this release reads it (a 1.4 document), with ``edits`` (dotted paths),
    ``bounds`` (method -> L, details kept in step) and ``claim``; its fingerprint filled from
    the fields, as build_report does."""
    d = ReportData.from_dict(copy.deepcopy(RAW)).to_dict()
    for path, value in (edits or {}).items():
        _set(d, path, value)
    if claim is not None:
        d["claimed_epsilon"] = d["power"]["claimed_epsilon"] = claim
    for m, v in (bounds or {}).items():
        d["epsilon_lower_bounds"][m] = v
        det = d["lower_bound_details"][m]
        det["bound"] = v
        det["ceiling"] = max(det.get("ceiling", v), v)
    d["fingerprint"] = fingerprint_of(d).to_dict()
    validate(ReportData.from_dict(d))
    return d


def _audit(d: dict[str, Any], path: str = "new.json") -> AuditInput:
    return AuditInput.of(ReportData.from_dict(d), path)


def _stronger() -> dict[str, Any]:
    """More one-run canaries than the fixture (80 instead of 40): a strictly stronger audit."""
    return {"canaries.m_one_run": 80, "config.m_canaries": 80}


@pytest.fixture(scope="module")
def baseline() -> AuditInput:
    return read_audit(V13, "baseline")


# ---------------------------------------------------------------- the previous release's report
def test_a_1_3_report_of_the_previous_release_is_read_as_a_baseline(baseline: AuditInput) -> None:
    assert baseline.written_schema == "1.3" and baseline.report.schema_version == "1.6"
    assert baseline.report.fingerprint == {}  # 1.3 had none: computed from its fields instead
    fp = baseline.fingerprint
    assert (fp.threat_model, fp.one_run_canaries, fp.canary_pairs) == ("white box", 40, 8)
    assert set(fp.not_recorded) == {"model_name", "dataset_name", "architecture_hash"}
    res = gate(_audit(_doc({"config.model_name": "mlp", "config.dataset_name": "synthetic",
                            "training.architecture_hash": "sha256:0123456789abcdef"})),
               baseline)
    assert res.outcome == PASS and res.exit_code == EXIT_PASS, res.reason
    assert "as strong as the baseline's" in res.reason and "proves no epsilon" in res.reason
    # what it lacks is named, not guessed
    assert any("not recorded in the baseline (schema 1.3)" in w and "model" in w
               for w in res.warnings), res.warnings
    # the 1.2 report of tests/data is readable too (and its own verdict is mentioned)
    old = read_audit(DATA / "report_v2.json", "baseline")
    assert old.written_schema == "1.2"
    res = gate(_audit(_doc()), old)
    assert any("baseline's own verdict was 'violation proven" in w for w in res.warnings)


def test_a_real_report_of_this_release_against_the_1_3_baseline(baseline: AuditInput,
                                                                 tmp_path: Path) -> None:
    """A real audit of this release, saved with its fingerprint, passes against the previous
    release's report of the same audit settings (the fixture's script)."""
    sys.path.insert(0, str(DATA))
    try:
        import make_report_v1_3 as script
    finally:
        sys.path.remove(str(DATA))
    import torch
    from conftest import make_private_setup

    from dpaudit_torch.audit import PrivacyAuditor

    torch.set_num_threads(1)
    s = make_private_setup(sigma=1.0, noise_seed=11)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, model=s.model,
                         model_name="mlp-16-32-2", dataset_name="synthetic-256",
                         **script.CONFIG)
    s.train(script.STEPS, auditor=aud)
    out = aud.finalize().save(tmp_path / "release-2")
    new = read_audit(out, "new report")
    assert new.written_schema == "1.6" and new.report.fingerprint["model_name"] == "mlp-16-32-2"
    res = gate(new, baseline)
    assert res.outcome == PASS, res.reason
    # and the other way round: the new report as the baseline of a copy of itself
    assert gate(new, new).outcome == PASS


# ---------------------------------------------------------------- passes
def test_pass_same_strength_and_stronger(baseline: AuditInput) -> None:
    res = gate(_audit(_doc(bounds={"steinke": 0.4})), baseline)
    assert res.outcome == PASS and not res.comparison.strictly_stronger
    res = gate(_audit(_doc(_stronger(), bounds={"steinke": 0.4})), baseline)
    assert res.outcome == PASS and res.comparison.strictly_stronger
    assert "stronger than the baseline's" in res.reason
    assert "one-run canaries (m): 40 -> 80" in res.text()


def test_first_release_must_be_explicit() -> None:
    new = _audit(_doc())
    res = gate(new)
    assert res.outcome == FAIL and res.exit_code == EXIT_FAIL
    assert res.reason.startswith("there is no audit baseline")
    res = gate(new, first_release=True)
    assert res.outcome == PASS and res.reason.startswith("first release")
    assert res.comparison is None and "(first release: no baseline)" in res.text()
    with pytest.raises(ValueError, match="first release has no baseline"):
        gate(new, new, first_release=True)


# ---------------------------------------------------------------- failures
def _refuted() -> dict[str, Any]:
    """The claim 1.0 and a Steinke bound 1.5 above it: the report refutes its claim."""
    return _doc({"claim_refuted": True,
                 "findings": [{"monitor": "one_run", "level": "refuted", "where": "the whole "
                               "training run", "message": "the Steinke et al. one-run (2023) "
                               "lower bound 1.5 on the whole run's epsilon exceeds the claimed "
                               "epsilon 1"}]},
                bounds={"steinke": 1.5}, claim=1.0)


def test_fail_when_L_exceeds_the_claim_even_on_a_first_release(baseline: AuditInput) -> None:
    new = _audit(_refuted())
    for res in (gate(new, baseline), gate(new, first_release=True)):
        assert res.outcome == FAIL, res.reason
        assert res.reason.startswith("L exceeds the claim: the Steinke et al. one-run (2023) "
                                     "lower bound 1.5")


def test_fail_on_a_proven_violation_or_an_inconsistent_claim(baseline: AuditInput) -> None:
    d = _doc({"violation": True, "violation_step": 9, "stopped_early": True,
              "sequential.crossed_at_step": 7,
              "findings": [{"monitor": "sampling", "level": "violation", "where": "data loader",
                            "message": "the batch sizes are not Poisson samples"}]})
    res = gate(_audit(d), baseline)
    assert res.outcome == FAIL and "'violation proven at step 9'" in res.reason
    assert "sampling (batch sizes not Poisson)" in res.reason  # named by the report's labels
    d = _doc({"claim_inconsistent": True,
              "findings": [{"monitor": "accounting", "level": "inconsistent", "where": None,
                            "message": "recomputed epsilon exceeds the claim"}],
              "audits.accounting.inconsistent": True})
    res = gate(_audit(d), baseline)
    assert res.outcome == FAIL and "'claim inconsistent'" in res.reason


def test_fail_when_the_new_audit_is_weaker(baseline: AuditInput) -> None:
    fewer = _doc({"canaries.m_one_run": 20, "config.m_canaries": 20})
    res = gate(_audit(fewer), baseline)
    assert res.outcome == FAIL and res.exit_code == EXIT_FAIL
    assert res.reason == ("the new audit is not at least as strong as the baseline's (one-run "
                          "canaries (m): 40 -> 20), so its bounds are not comparable")
    # weaker judge: a method dropped, a weaker score
    no_fdp = _doc()
    del no_fdp["epsilon_lower_bounds"]["fdp"], no_fdp["lower_bound_details"]["fdp"]
    no_fdp["fingerprint"] = fingerprint_of(no_fdp).to_dict()
    res = gate(_audit(no_fdp), baseline)
    assert res.outcome == FAIL and "bound methods: drops fdp" in res.reason
    res = gate(_audit(_doc({"lower_bound_details.steinke.score": "sum"})), baseline)
    assert res.outcome == FAIL and "steinke: llr -> sum" in res.reason
    # every step no longer observed
    res = gate(_audit(_doc({"threat_model.every_step_observed": False})), baseline)
    assert res.outcome == FAIL and "every step observed: yes -> no" in res.reason


def test_fail_when_neither_audit_is_at_least_as_strong(baseline: AuditInput) -> None:
    mixed = _doc({**_stronger(), "canaries.k_pairs": 4, "config.k_pairs": 4})
    res = gate(_audit(mixed), baseline)
    assert res.outcome == FAIL and "canary pairs per step (k): 8 -> 4" in res.reason
    assert not res.comparison.baseline_at_least_as_strong  # incomparable, not just weaker
    # proofs at a larger level are weaker (the two levels, docs/design.md section 14)
    other_level = _doc({"alpha": 0.1, "config.alpha": 0.1})
    res = gate(_audit(other_level), baseline)
    assert res.outcome == FAIL and "alpha (proofs): 0.05 -> 0.1" in res.reason
    own_level = _doc({"lower_bound_details.steinke.alpha": 0.1})  # a method's own level
    res = gate(_audit(own_level), baseline)
    assert res.outcome == FAIL and "levels of the bound methods: steinke: 0.05 -> 0.1" in \
        res.reason
    # one method smaller and another larger: incomparable
    mixed_levels = _doc({"lower_bound_details.steinke.alpha": 0.01,
                         "lower_bound_details.fdp.alpha": 0.1})
    res = gate(_audit(mixed_levels), baseline)
    assert res.outcome == FAIL and "not comparable" in res.reason


def test_a_new_audit_at_a_smaller_alpha_is_compared_with_a_baseline_at_005(
        baseline: AuditInput) -> None:
    """The migration to proofs at 1e-3 (docs/design.md section 14): a new release audited at a
    smaller alpha, its bounds at smaller levels, is at least as strong as a baseline made at
    0.05, so the gate compares them (and says why it is stronger) instead of refusing."""
    smaller = _doc({"alpha": 1e-3, "config.alpha": 1e-3,
                    "lower_bound_details.steinke.alpha": 1.25e-4,
                    "lower_bound_details.fdp.alpha": 1.25e-4})
    res = gate(_audit(smaller), baseline)
    assert res.outcome == PASS, res.reason
    assert res.comparison.relations["alpha"] == res.comparison.relations["levels"] == \
        "stronger"
    assert "alpha (proofs): 0.05 -> 0.001 (proofs at a smaller level)" in res.strength_text()


def test_fail_when_a_stronger_audit_makes_L_jump(baseline: AuditInput) -> None:
    """Twice as many canaries and a Steinke bound 0 -> 1.6, more than 0.25 x the claim 5.88:
    the baseline's audit was too weak to be trusted."""
    res = gate(_audit(_doc(_stronger(), bounds={"steinke": 1.6})), baseline)
    assert res.outcome == FAIL, res.reason
    assert res.reason.startswith("with a stronger audit (one-run canaries (m): 40 -> 80) the "
                                 "Steinke et al. one-run (2023) bound rose from 0 to 1.6")
    assert "too weak to be trusted" in res.reason and "0.25 x the claim 5.882" in res.reason
    # a rise within the margin passes; so does a wider margin
    assert gate(_audit(_doc(_stronger(), bounds={"steinke": MARGIN * 0.9})),
                baseline).outcome == PASS
    assert gate(_audit(_doc(_stronger(), bounds={"steinke": 1.6})), baseline,
                jump_margin=0.5).outcome == PASS
    # a per-step bound (another scope) is never a jump
    assert gate(_audit(_doc(_stronger(), bounds={"sequential": 3.0})), baseline).outcome == PASS


def test_warn_when_L_rises_a_lot_with_the_claim_unchanged(baseline: AuditInput) -> None:
    res = gate(_audit(_doc(bounds={"steinke": 1.6})), baseline)  # same strength, same claim
    assert res.outcome == PASS, res.reason
    rose = [w for w in res.warnings if w.startswith("L rose a lot with the claim unchanged")]
    assert len(rose) == 1 and "rose from 0 to 1.6 (+1.6, more than 0.25 x the claim 5.882 = " \
                               "1.47)" in rose[0]
    assert not any("rose" in w for w in gate(_audit(_doc(bounds={"steinke": 1.0})),
                                             baseline).warnings)
    # another claim: not this warning, the claim's change instead
    other = gate(_audit(_doc(bounds={"steinke": 1.6}, claim=6.5)), baseline)
    assert not any("rose a lot" in w for w in other.warnings)
    assert any("claim changed from 5.882 to 6.5" in w for w in other.warnings)


def test_fail_on_a_new_audit_that_observed_nothing(baseline: AuditInput) -> None:
    res = gate(_audit(_doc({"training.audited_steps": 0})), baseline)
    assert res.outcome == FAIL and "observed no training step" in res.reason
    res = gate(_audit(_doc()), _audit(_doc({"training.audited_steps": 0}), "old.json"))
    assert res.outcome == FAIL and "no audit baseline to compare with" in res.reason


# ---------------------------------------------------------------- impossible comparisons
def test_a_different_threat_model_cannot_be_compared(baseline: AuditInput) -> None:
    res = gate(_audit(_doc({"threat_model.white_box": False})), baseline)
    assert res.outcome == IMPOSSIBLE and res.exit_code == EXIT_BAD_INPUT
    assert res.reason.startswith("the threat models differ (white box -> black box)")
    res = gate(_audit(_doc({"threat_model": {}})), baseline, allow_change=True)
    assert res.outcome == IMPOSSIBLE and "not recorded in the new report" in res.reason


def test_another_model_or_dataset_needs_allow_change() -> None:
    named = {"config.model_name": "resnet18", "config.dataset_name": "cifar10",
             "training.architecture_hash": "sha256:0123456789abcdef"}
    old = _audit(_doc(named), "old.json")
    for key, value in (("config.model_name", "resnet50"), ("config.dataset_name", "cifar100"),
                       ("training.architecture_hash", "sha256:fedcba9876543210")):
        new = _audit(_doc({**named, key: value}))
        res = gate(new, old)
        assert res.outcome == IMPOSSIBLE and "--allow-change" in res.reason, res.reason
        assert value in res.reason
        allowed = gate(new, old, allow_change=True)
        assert allowed.outcome == PASS
        assert any("allowed by --allow-change" in w for w in allowed.warnings)
    # a name given in one release only cannot be checked: a warning, not a refusal
    res = gate(_audit(_doc({**named, "config.model_name": None})), old)
    assert res.outcome == PASS and any("model not recorded" in w for w in res.warnings)


def test_a_report_without_a_claim_cannot_be_gated(baseline: AuditInput) -> None:
    d = _doc()
    d["claimed_epsilon"] = d["power"]["claimed_epsilon"] = None
    d["fingerprint"] = fingerprint_of(d).to_dict()
    res = gate(_audit(d), baseline)
    assert res.outcome == IMPOSSIBLE and "no claimed epsilon" in res.reason


# ---------------------------------------------------------------- the command line
def _write(tmp_path: Path, name: str, d: dict[str, Any]) -> Path:
    p = tmp_path / name / "audit.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(d), encoding="utf-8")
    return p


def test_cli_prints_both_audits_writes_the_page_and_exits(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    new = _write(tmp_path, "r2", _doc(bounds={"steinke": 0.4}))
    assert main(["gate", str(new), "--baseline", str(V13)]) == EXIT_PASS
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("PASS: no bound exceeds the claimed epsilon 5.882")
    assert out[-2] == f"comparison: {new.parent / GATE_HTML}"
    table = "\n".join(out)
    for needle in ("verdict", "claimed epsilon", "L steinke (whole run)", "threat model",
                   "one-run canaries (m)", "strength: the new audit is as strong",
                   "changed: nothing"):
        assert needle in table, needle
    page = (new.parent / GATE_HTML).read_text(encoding="utf-8")
    assert 'data-outcome="pass"' in page and 'data-exit-code="0"' in page
    assert "default-src 'none'" in page and "<script" not in page
    assert "://" not in page and " src=" not in page and "<link" not in page  # loads nothing
    # fail: exit 1, the reason as the last line; --html elsewhere
    refuted = _write(tmp_path, "r3", _refuted())
    target = tmp_path / "pages" / "x.html"
    target.parent.mkdir()
    assert main(["gate", str(refuted.parent), "--baseline", str(V13),
                 "--html", str(target)]) == EXIT_FAIL
    assert capsys.readouterr().out.splitlines()[-1].startswith("FAIL: L exceeds the claim")
    assert 'data-outcome="fail"' in target.read_text(encoding="utf-8")
    # no baseline: fail, unless --first-release
    assert main(["gate", str(new)]) == EXIT_FAIL
    assert "FAIL: there is no audit baseline" in capsys.readouterr().out
    assert main(["gate", str(new), "--first-release"]) == EXIT_PASS
    # impossible: exit 2 with the sentence
    black = _write(tmp_path, "r4", _doc({"threat_model.white_box": False}))
    assert main(["gate", str(black), "--baseline", str(V13)]) == EXIT_BAD_INPUT
    assert "CANNOT COMPARE: the threat models differ" in capsys.readouterr().out


def _one_line(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> None:
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dpaudit: error:"), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    new = str(_write(tmp_path, "new", _doc()))
    cases = {
        "not an audit": (json.dumps({"name": "a training config"}), "is not an audit report"),
        "a list": (json.dumps([1, 2]), "is not an audit report"),
        "schema 2": (json.dumps({**RAW, "schema_version": "2.0"}),
                     "has audit schema '2.0': this dpaudit_torch reads schema 1.x"),
        "not json": ("{not json", "not valid JSON (line 1"),
        "bad field": (json.dumps({**RAW, "alpha": 7}), "is not a valid audit report"),
        "inconsistent": (json.dumps({**RAW, "claim_refuted": True}),
                         "is not a valid audit report: audit report is inconsistent"),
    }
    for name, (text, needle) in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_text(text, encoding="utf-8")
        _one_line(capsys, main(["gate", new, "--baseline", str(p)]),
                  f"the baseline {str(p)!r}", needle)
    p = tmp_path / "binary.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    _one_line(capsys, main(["gate", new, "--baseline", str(p)]), "not UTF-8")
    _one_line(capsys, main(["gate", new, "--baseline", str(tmp_path / "missing.json")]),
              "no such file")
    (tmp_path / "empty").mkdir()
    _one_line(capsys, main(["gate", new, "--baseline", str(tmp_path / "empty")]),
              "no such file")
    _one_line(capsys, main(["gate", str(tmp_path / "nope.json"), "--first-release"]),
              "the new report", "no such file")
    _one_line(capsys, main(["gate", new, "--baseline", str(V13), "--first-release"]),
              "not allowed with argument")
    _one_line(capsys, main(["gate", new, "--first-release", "--jump-margin", "-1"]),
              "--jump-margin")
    blocker = tmp_path / "blocker"
    blocker.write_text("x", encoding="utf-8")
    _one_line(capsys, main(["gate", new, "--first-release", "--html",
                            str(blocker / "gate.html")]), "cannot write the comparison page")
    with pytest.raises(GateInputError, match="is not an audit report"):
        read_audit(tmp_path / "a list.json")


def test_the_command_runs_as_a_process(tmp_path: Path) -> None:
    new = _write(tmp_path, "r2", _doc())
    proc = subprocess.run([sys.executable, "-m", "dpaudit_torch.cli", "gate", str(new),
                           "--baseline", str(V13)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("PASS:") and "Traceback" not in proc.stderr


def test_the_page_escapes_what_the_reports_hold(baseline: AuditInput) -> None:
    res = gate(_audit(_doc({"config.model_name": "<script>alert(1)</script>"}),
                      "<b>new</b>.json"), baseline)
    page = render_html(res)
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;" in page


def test_reports_loaded_by_audit_report_are_gated_alike(baseline: AuditInput,
                                                        tmp_path: Path) -> None:
    """AuditReport.load and read_audit see the same report."""
    p = _write(tmp_path, "r", _doc())
    a = gate(AuditInput.of(AuditReport.load(p)), baseline)
    b = gate(read_audit(p), baseline)
    assert (a.outcome, a.reason, a.warnings) == (b.outcome, b.reason, b.warnings)


def test_a_failing_gate_never_says_still_under_the_claim(baseline: AuditInput) -> None:
    """Issue: on a buggy release the gate printed 'L rose a lot ... still under the claim' and
    then 'FAIL: L exceeds the claim'. The rise is still reported; the reassurance is not."""
    refuted = _doc({"claim_refuted": True,
                    "findings": [{"monitor": "one_run", "level": "refuted",
                                  "where": "the whole training run",
                                  "message": "the Steinke et al. one-run (2023) lower bound 7 on "
                                             "the whole run's epsilon exceeds the claimed "
                                             "epsilon 5.882"}]},
                   bounds={"steinke": 7.0})
    res = gate(_audit(refuted), baseline)
    assert res.outcome == FAIL and res.reason.startswith("L exceeds the claim"), res.reason
    rose = [w for w in res.warnings if w.startswith("L rose a lot")]
    assert len(rose) == 1 and "rose from 0 to 7" in rose[0]
    assert "still under the claim" not in res.text() and "still under" not in rose[0]
    # a passing rise keeps its reassurance
    ok = gate(_audit(_doc(bounds={"steinke": 1.6})), baseline)
    assert ok.outcome == PASS and "still under the claim" in ok.text()


def test_a_changed_line_shows_the_change_or_is_left_out(baseline: AuditInput) -> None:
    """Issue: 'changed' lines showed values that print the same (3.001 -> 3.001). Numbers get
    the digits that show their difference; values equal as written are not listed."""
    from dpaudit_torch.report.fingerprint import Change

    c = Change("expected_bound", 3.00112, 3.00114)  # both 3.001 at 4 digits
    assert c.shows_change and c.shown() == ("3.00112", "3.00114")
    assert c.sentence() == "expected bound (power): 3.00112 -> 3.00114"
    assert Change("expected_bound", 1.5, 2.25).shown() == ("1.5", "2.25")  # 4 digits suffice
    assert not Change("expected_bound", float("nan"), float("nan")).shows_change
    old_audit = _audit(_doc({"power.expected_bound": 3.00112}), "old.json")
    res = gate(_audit(_doc({"power.expected_bound": 3.00114})), old_audit)
    line = next(ln for ln in res.text().splitlines() if ln.startswith("changed: "))
    assert "expected bound (power): 3.00112 -> 3.00114" in line
    for sentence in line[len("changed: "):].split("; "):
        if " -> " in sentence:
            old, new_v = sentence.split(": ", 1)[1].split(" -> ")
            assert old != new_v, sentence
