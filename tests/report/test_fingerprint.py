"""The audit fingerprint (dpaudit_torch/report/fingerprint.py): what it reads from a report (a
real one of this release, and the 1.3 and 1.2 fixtures written by earlier releases), the
strength order of docs/auditor.md "How strong an audit is" aspect by aspect (reflexive, each
aspect stronger / weaker / incomparable, mixed aspects incomparable, not recorded never
stronger), the architecture hash, and the stored fingerprint's consistency with the report."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_private_setup
from torch import nn

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.report import AuditReport, contradictions, validate
from dpaudit_torch.report.fingerprint import (
    BLACK_BOX,
    SCORES,
    STRENGTH_ASPECTS,
    SUBJECT_KEYS,
    THREAT_MODELS,
    WHITE_BOX,
    Fingerprint,
    architecture_hash,
    at_least_as_strong,
    compare,
    fingerprint_of,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def real() -> AuditReport:
    """A real audit of this release, with the model and the user's names."""
    torch.manual_seed(0)
    s = make_private_setup(sigma=1.0, noise_seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, model=s.model, delta=1e-5,
                             k_pairs=8, m_canaries=40, check_every=3, claimed_every=4,
                             model_name="mlp-16-32-2", dataset_name="synthetic-256")
        s.train(8, auditor=aud)
    return aud.finalize()


# ---------------------------------------------------------------- reading a report
def test_a_real_report_carries_its_fingerprint(real: AuditReport, tmp_path: Path) -> None:
    fp = fingerprint_of(real)
    assert real.fingerprint == fp.to_dict() and real.fingerprint["version"] == 2
    assert (fp.threat_model, fp.every_step_observed, fp.canary_design) == (WHITE_BOX, True,
                                                                            "dirac")
    assert (fp.one_run_canaries, fp.canary_pairs) == (40, 8)
    assert {"steinke", "fdp", "sequential"} <= set(fp.methods)  # and any method added since
    assert dict(fp.scores)["steinke"] == dict(fp.scores)["fdp"] == "llr"
    # the default alpha 1e-3 split among the proof paths (docs/design.md section 14): the
    # Steinke bound at an eighth, the sequential grid at the decision's half
    assert dict(fp.levels)["steinke"] == pytest.approx(1e-3 / 8)
    assert dict(fp.levels)["sequential"] == pytest.approx(1e-3 / 2)
    assert fp.sequential_tests == ("hockey_stick", "mmd")
    assert (fp.alpha, fp.delta, fp.steps_observed) == (1e-3, 1e-5, 8)
    assert fp.alpha_warn == 0.05
    assert fp.expected_bound == real.power["expected_bound"]
    assert fp.accountant == "RDPAccountant" and fp.package_version == real.versions[
        "dpaudit_torch"]
    assert (fp.model_name, fp.dataset_name) == ("mlp-16-32-2", "synthetic-256")
    assert fp.architecture_hash == real.training["architecture_hash"]
    assert fp.architecture_hash.startswith("sha256:") and fp.not_recorded == ()
    # written, read back, the same; the stored fingerprint agrees with the fields
    back = AuditReport.load(real.save(tmp_path))
    assert back.fingerprint == real.fingerprint and fingerprint_of(back) == fp
    assert contradictions(back) == []


def test_a_1_3_report_is_read_with_what_it_lacks_named() -> None:
    """tests/data/report_v1_3.json (written by the 1.3 release, tests/data/make_report_v1_3.py)
    has everything of the strength order; the subject was not recorded by that schema."""
    raw = _fixture("report_v1_3.json")
    fp = fingerprint_of(AuditReport.from_dict(raw))
    assert fp == fingerprint_of(raw)  # the dict as written, or the report read from it
    assert set(fp.not_recorded) == set(SUBJECT_KEYS)
    assert fp.model_name is fp.dataset_name is fp.architecture_hash is None
    assert (fp.threat_model, fp.one_run_canaries, fp.canary_pairs) == (WHITE_BOX, 40, 8)
    assert fp.methods == ("steinke", "fdp", "sequential")
    assert fp.scores == (("steinke", "llr"), ("fdp", "llr"))
    assert fp.levels == (("steinke", 0.05), ("fdp", 0.05), ("sequential", 0.05))
    assert fp.steps_observed == 30 and fp.min_refutable_epsilon is None
    # the 1.2 fixture, too (written before monitor labels)
    old = fingerprint_of(AuditReport.from_dict(_fixture("report_v2.json")))
    assert old.steps_observed == 12 and old.methods == fp.methods


def test_values_come_from_fallbacks_and_unknown_methods_are_kept() -> None:
    d = AuditReport.from_dict(_fixture("report_v1_3.json")).to_dict()
    del d["canaries"]["m_one_run"], d["canaries"]["k_pairs"]  # from the config instead
    d["lower_bound_details"]["fdp"].pop("score")
    d["epsilon_lower_bounds"]["newer_method"] = 0.0  # a method of a newer writer
    d["lower_bound_details"]["newer_method"] = {"bound": 0.0, "score": "a newer score"}
    fp = fingerprint_of(d)
    assert (fp.one_run_canaries, fp.canary_pairs) == (40, 8)
    assert fp.methods[-1] == "newer_method" and "fdp" in fp.methods
    assert dict(fp.scores) == {"steinke": "llr", "newer_method": "a newer score"}
    assert fp.to_dict()["scores"] == {"steinke": "llr", "newer_method": "a newer score"}
    # a hand-built report says little: None where it says nothing, named in not_recorded
    bare = fingerprint_of(AuditReport())
    assert bare.threat_model is None and "threat_model" in bare.not_recorded
    assert bare.methods == () and bare.one_run_canaries is None


def test_a_stored_fingerprint_that_contradicts_the_report_is_refused(real: AuditReport) -> None:
    d = real.to_dict()
    d["fingerprint"]["one_run_canaries"] = 5000
    bad = AuditReport.from_dict(d)
    assert contradictions(bad) == ["fingerprint.one_run_canaries is 5000 but the report's own "
                                   "fields say 40"]
    with pytest.raises(ValueError, match="fingerprint.one_run_canaries"):
        validate(bad)
    # a key of a newer fingerprint layout is not checked
    d = real.to_dict()
    d["fingerprint"]["from_the_future"] = 1
    assert contradictions(AuditReport.from_dict(d)) == []


# ---------------------------------------------------------------- the strength order
BASE = Fingerprint(threat_model=WHITE_BOX, every_step_observed=True, canary_design="dirac",
                   one_run_canaries=1000, canary_pairs=16,
                   methods=("steinke", "fdp", "sequential"),
                   scores=(("steinke", "llr"), ("fdp", "llr")),
                   levels=(("steinke", 0.05), ("fdp", 0.05)),
                   sequential_tests=("hockey_stick", "mmd"), alpha=0.05, delta=1e-5,
                   steps_observed=300, mean_inclusions=3.0, expected_ratio=0.5,
                   expected_ratio_se=0.0, refutable_ratio=1.5)

#: (aspect, a stronger value, a weaker value) than BASE's
STRONGER_WEAKER = [
    ("threat_model", WHITE_BOX, BLACK_BOX),  # BASE is white box: nothing stronger
    ("every_step_observed", True, False),
    ("one_run_canaries", 2000, 999),
    ("canary_pairs", 32, 8),
    # power (report/power_order.py): just outside the tolerances (0.05 x the claim, 10 %)
    ("steps_observed", 301, 299),
    ("mean_inclusions", 3.1, 2.9),
    ("expected_ratio", 0.56, 0.44),
    ("refutable_ratio", 1.3, 1.7),
    ("scores", (("steinke", "llr"), ("fdp", "llr")), (("steinke", "sum"), ("fdp", "llr"))),
    ("methods", ("steinke", "fdp", "sequential", "newer"), ("steinke", "sequential")),
    ("sequential_tests", ("hockey_stick", "mmd", "newer"), ("mmd",)),
    # proofs at a smaller level are at least as strong (the two levels, docs/design.md s. 14)
    ("alpha", 1e-3, 0.1),
    ("levels", (("steinke", 1.25e-4), ("fdp", 1.25e-4)), (("steinke", 0.1), ("fdp", 0.05))),
]


def test_every_aspect_is_compared() -> None:
    assert set(STRENGTH_ASPECTS) == {a for a, _, _ in STRENGTH_ASPECTS_CASES}


STRENGTH_ASPECTS_CASES = [*STRONGER_WEAKER, ("canary_design", None, None),
                          ("delta", None, None)]


def test_the_order_is_reflexive_and_names_nothing_changed() -> None:
    c = compare(BASE, BASE)
    assert c.at_least_as_strong and c.baseline_at_least_as_strong and not c.strictly_stronger
    assert c.weaker == c.stronger == c.changes == ()
    assert THREAT_MODELS.index(WHITE_BOX) > THREAT_MODELS.index(BLACK_BOX)
    assert SCORES.index("llr") > SCORES.index("sum")


@pytest.mark.parametrize("aspect,strong,weak", STRONGER_WEAKER, ids=lambda v: str(v)[:20])
def test_each_aspect_orders_the_audits(aspect: str, strong: Any, weak: Any) -> None:
    up = dataclasses.replace(BASE, **{aspect: strong})
    down = dataclasses.replace(BASE, **{aspect: weak})
    if up != BASE:
        c = compare(up, BASE)
        assert c.strictly_stronger and c.relations[aspect] == "stronger", c
        assert at_least_as_strong(up, BASE) and not at_least_as_strong(BASE, up)
    c = compare(down, BASE)
    assert not c.at_least_as_strong and c.baseline_at_least_as_strong
    assert c.relations[aspect] == "weaker" and len(c.weaker) == 1
    assert c.weaker[0].startswith(
        {"threat_model": "threat model", "every_step_observed": "every step observed",
         "one_run_canaries": "one-run canaries (m): 1000 -> 999",
         "canary_pairs": "canary pairs per step (k): 16 -> 8",
         "scores": "scores of the bound methods: steinke: llr -> sum",
         "methods": "bound methods: drops fdp", "sequential_tests": "sequential tests: drops "
         "hockey_stick", "alpha": "alpha (proofs): 0.05 -> 0.1 (proofs at a larger level)",
         "levels": "levels of the bound methods: steinke: 0.05 -> 0.1",
         "steps_observed": "steps observed: 300 -> 299",
         "mean_inclusions": "IN inclusions per canary (q T): 3 -> 2.9",
         "expected_ratio": "expected bound (power): 0.5 x the claim -> 0.44 x the claim "
         "(tolerance 0.05 x the claim plus 3 simulation standard errors)",
         "refutable_ratio": "smallest refutable epsilon (power): 1.5 x the claim -> 1.7 x the "
         "claim (tolerance 10 %)"}[aspect])
    # transitive along a chain weak < BASE < strong
    assert at_least_as_strong(up, down)


@pytest.mark.parametrize("aspect,other", [
    ("delta", 1e-6), ("canary_design", "spread"),
    ("methods", ("steinke", "fdp", "other")), ("scores", (("steinke", "a newer score"),)),
    ("scores", (("steinke", "sum"), ("fdp", "a newer score"))),
    ("levels", (("steinke", 0.1), ("fdp", 0.01)))])
def test_different_levels_designs_or_method_sets_are_incomparable(aspect: str,
                                                                  other: Any) -> None:
    o = dataclasses.replace(BASE, **{aspect: other})
    for a, b in ((o, BASE), (BASE, o)):
        c = compare(a, b)
        assert not c.at_least_as_strong and not c.baseline_at_least_as_strong
        assert c.relations[aspect] == "incomparable"
    if aspect in ("delta", "levels"):
        assert "not comparable" in compare(o, BASE).weaker[0]
    # a method with a level of its own, recorded by one audit only: no difference of levels
    extra = dataclasses.replace(BASE, levels=(*BASE.levels, ("newer", 0.001)))
    assert compare(extra, BASE).relations["levels"] == "same"


def test_stronger_in_one_aspect_and_weaker_in_another_is_neither() -> None:
    mixed = dataclasses.replace(BASE, one_run_canaries=5000,
                                scores=(("steinke", "sum"), ("fdp", "llr")))
    c = compare(mixed, BASE)
    assert not c.at_least_as_strong and not c.baseline_at_least_as_strong
    assert c.stronger == ("one-run canaries (m): 1000 -> 5000",)
    assert c.weaker == ("scores of the bound methods: steinke: llr -> sum",)
    # a method with the sum score added beside the others: the judge only grows
    more = dataclasses.replace(BASE, methods=(*BASE.methods, "newer"),
                               scores=(*BASE.scores, ("newer", "sum")))
    assert compare(more, BASE).strictly_stronger


def test_an_aspect_recorded_by_one_audit_only_is_never_stronger() -> None:
    unknown = dataclasses.replace(BASE, one_run_canaries=None)
    for a, b in ((unknown, BASE), (BASE, unknown)):
        c = compare(a, b)
        assert not c.at_least_as_strong and not c.baseline_at_least_as_strong
        assert c.relations["one_run_canaries"] == "not recorded"
    assert compare(unknown, BASE).weaker == ("one-run canaries (m): not recorded in the new "
                                             "report",)


def test_subject_versions_and_raw_power_numbers_are_changes_not_strength() -> None:
    """The accountant, the subject, the version and the power statement's raw numbers are
    listed as what changed; the aspects of the order (the steps, q T and the power relative to
    the claim included) are not, they speak in the strength sentences."""
    new = dataclasses.replace(BASE, expected_bound=0.4, min_refutable_epsilon=3.0,
                              accountant="PRVAccountant", package_version="0.2.0",
                              model_name="b", dataset_name="d2", architecture_hash="sha256:2",
                              steps_observed=500, expected_ratio=0.52)
    old = dataclasses.replace(BASE, expected_bound=0.3, min_refutable_epsilon=4.0,
                              accountant="RDPAccountant", package_version="0.1.0",
                              model_name="a", dataset_name=None, architecture_hash="sha256:1")
    c = compare(new, old)
    assert c.strictly_stronger and c.relations["steps_observed"] == "stronger"
    assert c.relations["expected_ratio"] == "same"  # 0.5 -> 0.52: within 0.05 x the claim
    assert c.stronger == ("steps observed: 300 -> 500",)
    assert [ch.key for ch in c.changes] == ["expected_bound", "min_refutable_epsilon",
                                            "accountant", "model_name", "dataset_name",
                                            "architecture_hash", "package_version"]
    assert [ch.key for ch in c.subject_changes] == ["model_name", "architecture_hash"]
    assert c.subject_unchecked == ("dataset_name",)
    assert c.changes[0].sentence() == "expected bound (power): 0.3 -> 0.4"


# ---------------------------------------------------------------- the architecture hash
def _mlp(hidden: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def test_architecture_hash_sees_modules_and_shapes_not_values() -> None:
    torch.manual_seed(0)
    a, b = _mlp(), _mlp()
    assert architecture_hash(a) == architecture_hash(b) != architecture_hash(_mlp(33))
    with torch.no_grad():
        b[0].weight.mul_(3.0)
    assert architecture_hash(a) == architecture_hash(b.double())  # values and dtype: no
    other = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
    assert architecture_hash(other) != architecture_hash(a)  # a module's class: yes
    assert architecture_hash(None) is None


def test_architecture_hash_sees_through_the_wrappers() -> None:
    """Opacus's GradSampleModule (what make_private returns), torch.compile's module and a
    class derived as FSDP2's fully_shard derives one keep the model's hash."""
    s = make_private_setup()
    assert type(s.model).__name__ == "GradSampleModule"
    assert architecture_hash(s.model) == architecture_hash(_mlp())

    class Wrapped(nn.Module):  # torch.compile's OptimizedModule keeps it as _orig_mod
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

    assert architecture_hash(Wrapped(_mlp())) == architecture_hash(_mlp())
    class FSDPModule:  # fully_shard: type(f"FSDP{cls.__name__}", (FSDPModule, cls), ...)
        pass

    sharded = _mlp()
    sharded[0].__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
    assert architecture_hash(sharded) == architecture_hash(_mlp())
