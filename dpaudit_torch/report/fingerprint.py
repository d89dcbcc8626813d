"""The audit fingerprint: what an audit was (its threat model, canaries, judge, power, subject),
read from a report, and how two audits compare in strength.

A release gate (``dpaudit gate``, :mod:`dpaudit_torch.gate`, docs/release_gate.md) compares the
audited lower bounds L of two releases of a training pipeline. L values are comparable only when
the new audit is **at least as strong** as the previous one, a partial order defined here, in one
place, and in docs/auditor.md ("How strong an audit is"):

* **threat model**: white box (the auditor reads every step's released gradient) is stronger than
  black box (the final model only), :data:`THREAT_MODELS`; an audit that observed every step is
  stronger than one that missed some;
* **canaries**: the same design, and at least as many one-run canaries (m) and canary pairs per
  step (k);
* **power** (:mod:`dpaudit_torch.report.power_order`): at least as many steps observed and as
  large a q T, an expected bound at least as large and a smallest refutable epsilon at least as
  small, each relative to its own claim and within the tolerance of its own error: an audit is
  at least as strong as another only if it can also refute as much;
* **judge**: the same or a superset of the bound methods and of the sequential tests; for every
  bound method both record a score for, a per-canary score at least as strong (:data:`SCORES`,
  weakest first: the sum, then the likelihood ratio, which ranks canaries by the Neyman-Pearson
  most powerful statistic of the idealized game, docs/one_run.md "Why the llr"); the same
  delta (bounds at another delta are other statements); and proofs at the same or a smaller
  level: a smaller ``alpha``, and for every bound method both record a level for, the same or a
  smaller one, is at least as strong (a proof at 1e-3 is a proof at 0.05 too: the two levels of
  evidence, docs/design.md), while a mix of smaller and larger levels is incomparable.

Every aspect must hold; where one audit is stronger in one aspect and weaker in another, neither
is at least as strong as the other. The accountant, the subject (model, dataset, architecture
hash) and the package version are part of the fingerprint and of what changed, not of the order.

Pure functions of a report's fields (:func:`fingerprint_of`, :func:`compare`); the bound methods
are read from the report itself (any method it holds), their scope from
:mod:`dpaudit_torch.registry`. The report never proves a claim: a fingerprint says how hard the
audit looked, not that the claim holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..registry import BOUND_METHODS
from .power_order import (
    POWER_ASPECTS,
    POWER_LABELS,
    power_fields,
    power_relation,
    power_sentence,
)
from .schema import ReportData, is_num

__all__ = ["FINGERPRINT_VERSION", "WHITE_BOX", "BLACK_BOX", "THREAT_MODELS", "SCORES",
           "STRENGTH_ASPECTS", "SUBJECT_KEYS", "Fingerprint", "Change", "Comparison",
           "fingerprint_of", "compare", "at_least_as_strong", "architecture_hash",
           "stored_fingerprint_contradictions"]

#: version of the fingerprint's layout (its ``version`` key in ``audit.json``)
FINGERPRINT_VERSION = 2
WHITE_BOX, BLACK_BOX = "white box", "black box"
#: threat models, weakest first
THREAT_MODELS = (BLACK_BOX, WHITE_BOX)
#: one-run per-canary scores, weakest first (docs/one_run.md, "Why the llr")
SCORES = ("sum", "llr")
#: the aspects of the strength order, in the order they are compared and reported
STRENGTH_ASPECTS = ("threat_model", "every_step_observed", "canary_design", "one_run_canaries",
                    "canary_pairs", "methods", "scores", "levels", "sequential_tests", "alpha",
                    "delta") + POWER_ASPECTS
#: what the audit is about: two audits of different subjects are not compared
SUBJECT_KEYS = ("model_name", "dataset_name", "architecture_hash")

#: how each fingerprint key is named in words (the gate's tables and sentences)
LABELS = {
    "threat_model": "threat model", "every_step_observed": "every step observed",
    "canary_design": "canary design", "one_run_canaries": "one-run canaries (m)",
    "canary_pairs": "canary pairs per step (k)", "methods": "bound methods",
    "scores": "scores of the bound methods", "levels": "levels of the bound methods",
    "sequential_tests": "sequential tests",
    "alpha": "alpha (proofs)", "delta": "delta", "expected_bound": "expected bound (power)",
    "alpha_warn": "alpha_warn (evidence)",
    "min_refutable_epsilon": "minimum refutable epsilon (power)",
    "steps_observed": "steps observed", "accountant": "accountant", "model_name": "model",
    "dataset_name": "dataset", "architecture_hash": "architecture hash",
    "package_version": "dpaudit_torch version",
    **POWER_LABELS,
}


@dataclass(frozen=True)
class Fingerprint:
    """What an audit was, read from its report (docs/report.md, field ``fingerprint``).

    A value is None where the report does not say it; ``not_recorded`` names the keys whose
    source the report lacks altogether (e.g. the model's name in a report of schema 1.3, which
    had no such field), as opposed to a value that was recorded as unknown (a model name the user
    did not give).
    """

    threat_model: str | None = None
    every_step_observed: bool | None = None
    canary_design: str | None = None
    one_run_canaries: int | None = None
    canary_pairs: int | None = None
    methods: tuple[str, ...] = ()
    scores: tuple[tuple[str, str], ...] = ()
    levels: tuple[tuple[str, float], ...] = ()
    sequential_tests: tuple[str, ...] = ()
    alpha: float | None = None
    delta: float | None = None
    alpha_warn: float | None = None
    expected_bound: float | None = None
    min_refutable_epsilon: float | None = None
    steps_observed: int | None = None
    accountant: str | None = None
    model_name: str | None = None
    dataset_name: str | None = None
    architecture_hash: str | None = None
    package_version: str | None = None
    #: (version 2) the power aspects, relative to the claim (:func:`power_fields`)
    mean_inclusions: float | None = None
    expected_ratio: float | None = None
    expected_ratio_se: float | None = None
    refutable_ratio: float | None = None
    not_recorded: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The ``fingerprint`` object of ``audit.json`` (lists for tuples, ``version`` first)."""
        out: dict[str, Any] = {"version": FINGERPRINT_VERSION}
        for key in LABELS:
            v = getattr(self, key)
            out[key] = (dict(v) if key in ("scores", "levels")
                        else list(v) if isinstance(v, tuple) else v)
        return out

    def value(self, key: str) -> Any:
        return getattr(self, key)


def _get(d: Mapping[str, Any], *path: str) -> tuple[bool, Any]:
    """(found, value) at ``d[path[0]][path[1]]...``."""
    cur: Any = d
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return False, None
        cur = cur[p]
    return True, cur


def _first(d: Mapping[str, Any], *paths: tuple[str, ...]) -> tuple[bool, Any]:
    """The first of ``paths`` the report holds with a value that is not None."""
    found_any = False
    for path in paths:
        found, v = _get(d, *path)
        found_any = found_any or found
        if found and v is not None:
            return True, v
    return found_any, None


def _int(v: Any) -> int | None:
    return int(v) if is_num(v) and math.isfinite(v) else None


def _num(v: Any) -> float | None:
    return float(v) if is_num(v) else None


def _method_order(methods: Any) -> tuple[str, ...]:
    names = [m for m in methods if isinstance(m, str)]
    return tuple([m for m in BOUND_METHODS if m in names]
                 + sorted(m for m in names if m not in BOUND_METHODS))


def _per_method(d: Mapping[str, Any], methods: tuple[str, ...],
                pick: Callable[[Mapping[str, Any]], Any]) -> tuple[tuple[str, Any], ...]:
    """(method, value) for every bound method whose recorded details give ``pick`` a value
    (not None), in the methods' order."""
    details = d.get("lower_bound_details")
    if not isinstance(details, Mapping):
        return ()
    out = []
    for m in methods:
        det = details.get(m)
        value = pick(det) if isinstance(det, Mapping) else None
        if value is not None:
            out.append((m, value))
    return tuple(out)


def _scores(d: Mapping[str, Any], methods: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(method, score) for every bound method whose details record the per-canary score its
    bound was computed with (``lower_bound_details.<method>.score``: what was used, e.g. the
    sum where the likelihood ratio was undefined), in the methods' order."""
    return _per_method(d, methods,
                       lambda det: det["score"] if isinstance(det.get("score"), str) else None)


def _levels(d: Mapping[str, Any], methods: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """(method, alpha) for every bound method whose details record the level its bound holds
    at (``alpha``, or ``level`` for the sequential grid), e.g. a method with a level of its
    own, in the methods' order."""

    def level(det: Mapping[str, Any]) -> float | None:
        value = det.get("alpha", det.get("level"))
        return float(value) if is_num(value) else None

    return _per_method(d, methods, level)


def _alpha_warn(d: Mapping[str, Any], take: Callable[[str, tuple[bool, Any]], Any]
                ) -> float | None:
    """The evidence level (schema 1.5, ``alpha_warn``); not recorded before it, and None in a
    report that records no evidence level."""
    return _num(take("alpha_warn", _get(d, "alpha_warn")))


def _level_relation(new: Mapping[str, float] | float, old: Mapping[str, float] | float) -> str:
    """Levels compared (a number each, or per method for the methods both record): proofs at
    the same or smaller levels are at least as strong (a proof at a smaller alpha is one at a
    larger alpha too); smaller in some and larger in others is incomparable."""
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        new, old = {"": float(new)}, {"": float(old)}  # type: ignore[arg-type]
    rel = set()
    for m in set(new) & set(old):
        a, b = float(new[m]), float(old[m])
        rel.add(SAME if math.isclose(a, b, rel_tol=1e-9) else STRONGER if a < b else WEAKER)
    rel -= {SAME}
    if not rel:
        return SAME
    return rel.pop() if len(rel) == 1 else INCOMPARABLE


def fingerprint_of(report: ReportData | Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of a report (a :class:`ReportData` or its :meth:`~ReportData.to_dict`),
    read from its own fields (docs/report.md, field ``fingerprint``, says where each comes
    from). A report of an older schema gets None where it lacks the source, listed in
    ``not_recorded``; nothing is guessed."""
    d: Mapping[str, Any] = report.to_dict() if isinstance(report, ReportData) else report
    missing: list[str] = []

    def take(key: str, found_value: tuple[bool, Any]) -> Any:
        found, v = found_value
        if not found:
            missing.append(key)
        return v

    wb = take("threat_model", _get(d, "threat_model", "white_box"))
    every = take("every_step_observed", _get(d, "threat_model", "every_step_observed"))
    design = take("canary_design", _get(d, "canaries", "design"))
    m = take("one_run_canaries", _first(d, ("canaries", "m_one_run"), ("config", "m_canaries")))
    k = take("canary_pairs", _first(d, ("canaries", "k_pairs"), ("config", "k_pairs")))
    found, tests = _get(d, "sequential", "tests")
    if not (found and isinstance(tests, Mapping) and tests):
        found, tests = _get(d, "config", "tests")
    if not found:
        missing.append("sequential_tests")
    bounds = d.get("epsilon_lower_bounds")
    if not isinstance(bounds, Mapping):
        missing.append("methods")
    methods = _method_order(bounds) if isinstance(bounds, Mapping) else ()
    return Fingerprint(
        threat_model=(WHITE_BOX if wb is True else BLACK_BOX if wb is False else None),
        every_step_observed=every if isinstance(every, bool) else None,
        canary_design=design if isinstance(design, str) else None,
        one_run_canaries=_int(m),
        canary_pairs=_int(k),
        methods=methods,
        scores=_scores(d, methods),
        levels=_levels(d, methods),
        sequential_tests=tuple(sorted(t for t in (tests or ()) if isinstance(t, str))),
        alpha=_num(take("alpha", _get(d, "alpha"))),
        delta=_num(take("delta", _get(d, "delta"))),
        alpha_warn=_alpha_warn(d, take),
        expected_bound=_num(take("expected_bound", _get(d, "power", "expected_bound"))),
        min_refutable_epsilon=_num(take("min_refutable_epsilon",
                                        _get(d, "power", "min_refutable_epsilon"))),
        steps_observed=_int(take("steps_observed", _get(d, "training", "audited_steps"))),
        accountant=take("accountant", _get(d, "accountant")),
        model_name=take("model_name", _get(d, "config", "model_name")),
        dataset_name=take("dataset_name", _get(d, "config", "dataset_name")),
        architecture_hash=take("architecture_hash", _get(d, "training", "architecture_hash")),
        package_version=take("package_version", _get(d, "versions", "dpaudit_torch")),
        **power_fields(d),
        not_recorded=tuple(missing),
    )


def stored_fingerprint_contradictions(d: Mapping[str, Any]) -> list[str]:
    """Where a report's stored ``fingerprint`` disagrees with what its own fields say (keys
    both hold; a key of a newer fingerprint layout is not checked)."""
    stored = d.get("fingerprint")
    if not isinstance(stored, Mapping) or not stored:
        return []
    fresh = fingerprint_of(d).to_dict()
    out = []
    for key, v in fresh.items():
        if key == "version" or key not in stored:
            continue
        s = stored[key]
        same = (s == v or (is_num(s) and is_num(v) and math.isclose(s, v, rel_tol=1e-9))
                or (is_num(s) and is_num(v) and math.isnan(s) and math.isnan(v)))
        if not same:
            out.append(f"fingerprint.{key} is {s!r} but the report's own fields say {v!r}")
    return out


# ----------------------------------------------------------------------------------------------
# the strength order
# ----------------------------------------------------------------------------------------------

#: the relation of the new audit to the old one in one aspect
SAME, STRONGER, WEAKER, INCOMPARABLE, UNKNOWN = ("same", "stronger", "weaker", "incomparable",
                                                 "not recorded")


def _fmt(v: Any) -> str:
    if v is None:
        return "not recorded"
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) for x in v):
        return ", ".join(f"{a} {b}" for a, b in v)
    if isinstance(v, tuple):
        return ", ".join(v) if v else "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _ranked(order: tuple[Any, ...], new: Any, old: Any) -> str:
    if new == old:
        return SAME
    if new in order and old in order:
        return STRONGER if order.index(new) > order.index(old) else WEAKER
    return INCOMPARABLE


def _scores_relation(new: dict[str, str], old: dict[str, str]) -> str:
    """The scores of the methods both audits have, compared method by method (a method only one
    of them has is the ``methods`` aspect's business)."""
    rel = {_ranked(SCORES, new[m], old[m]) for m in set(new) & set(old)} - {SAME}
    if not rel:
        return SAME
    return rel.pop() if len(rel) == 1 else INCOMPARABLE


def _relation(aspect: str, new: Any, old: Any) -> str:
    if new is None and old is None:
        return SAME
    if new is None or old is None:
        return UNKNOWN
    if aspect in POWER_ASPECTS:
        return power_relation(aspect, new, old)
    if aspect == "threat_model":
        return _ranked(THREAT_MODELS, new, old)
    if aspect == "every_step_observed":
        return _ranked((False, True), new, old)
    if aspect == "scores":
        return _scores_relation(dict(new), dict(old))
    if aspect == "levels":
        return _level_relation(dict(new), dict(old))
    if aspect == "alpha":
        return _level_relation(new, old)
    if aspect in ("one_run_canaries", "canary_pairs"):
        return SAME if new == old else STRONGER if new > old else WEAKER
    if aspect in ("methods", "sequential_tests"):
        a, b = set(new), set(old)
        return SAME if a == b else STRONGER if a > b else WEAKER if a < b else INCOMPARABLE
    if aspect == "delta":
        return SAME if math.isclose(new, old, rel_tol=1e-9) else INCOMPARABLE
    return SAME if new == old else INCOMPARABLE  # canary_design


def _sentence(aspect: str, relation: str, new: Any, old: Any) -> str:
    label = LABELS[aspect]
    if relation == UNKNOWN:
        which = "the baseline" if old is None else "the new report"
        return f"{label}: not recorded in {which}"
    if aspect in POWER_ASPECTS:
        return power_sentence(aspect, new, old)
    if aspect in ("scores", "levels"):
        a, b = dict(new), dict(old)
        diff = [f"{m}: {_fmt(b[m])} -> {_fmt(a[m])}" for m in a if m in b and a[m] != b[m]]
        tail = ("" if aspect != "levels" or relation != INCOMPARABLE
                else " (smaller for some methods and larger for others: not comparable)")
        return f"{label}: {'; '.join(diff)}{tail}"
    if aspect in ("methods", "sequential_tests") and relation != SAME:
        gained, lost = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        parts = ([f"adds {', '.join(gained)}"] if gained else []) + \
                ([f"drops {', '.join(lost)}"] if lost else [])
        return f"{label}: {'; '.join(parts)} ({_fmt(old)} -> {_fmt(new)})"
    if aspect == "alpha" and relation in (STRONGER, WEAKER):
        return (f"{label}: {_fmt(old)} -> {_fmt(new)} (proofs at a "
                f"{'smaller' if relation == STRONGER else 'larger'} level)")
    if aspect == "delta" and relation == INCOMPARABLE:
        return (f"{label}: {_fmt(old)} -> {_fmt(new)} (bounds at another {label} are other "
                f"statements, not comparable)")
    return f"{label}: {_fmt(old)} -> {_fmt(new)}"


@dataclass(frozen=True)
class Change:
    """One fingerprint key that differs between the baseline (``old``) and the new audit."""

    key: str
    old: Any
    new: Any

    @property
    def label(self) -> str:
        return LABELS.get(self.key, self.key)

    def shown(self) -> tuple[str, str]:
        """(old, new) as written: numbers with as many significant digits as it takes to
        show that they differ (4 at least, 17 at most)."""
        a, b = _fmt(self.old), _fmt(self.new)
        if a == b and isinstance(self.old, float) and isinstance(self.new, float):
            for digits in range(5, 18):
                a, b = f"{self.old:.{digits}g}", f"{self.new:.{digits}g}"
                if a != b:
                    break
        return a, b

    @property
    def shows_change(self) -> bool:
        """Whether the two values, as written, differ (NaN against NaN does not)."""
        a, b = self.shown()
        return a != b

    def sentence(self) -> str:
        a, b = self.shown()
        return f"{self.label}: {a} -> {b}"


@dataclass(frozen=True)
class Comparison:
    """How a new audit compares with a baseline (:func:`compare`).

    Attributes:
        relations: aspect -> relation of the new audit to the baseline (``"same"``,
            ``"stronger"``, ``"weaker"``, ``"incomparable"`` or ``"not recorded"``), for
            every aspect of :data:`STRENGTH_ASPECTS`.
        weaker: a sentence per aspect that keeps the new audit from being at least as strong.
        stronger: a sentence per aspect in which the new audit is stronger.
        changes: every fingerprint key outside the order that differs (the power statement's
            raw numbers, the accountant, the subject, the version).
        subject_changes: the subject keys (:data:`SUBJECT_KEYS`) both audits record, with
            different values.
        subject_unchecked: the subject keys one of the two audits does not record (not
            recorded by its schema, or not given by the user), which cannot be compared.
    """

    relations: dict[str, str]
    weaker: tuple[str, ...]
    stronger: tuple[str, ...]
    changes: tuple[Change, ...]
    subject_changes: tuple[Change, ...]
    subject_unchecked: tuple[str, ...]

    @property
    def at_least_as_strong(self) -> bool:
        """The new audit is at least as strong as the baseline in every aspect."""
        return not self.weaker

    @property
    def baseline_at_least_as_strong(self) -> bool:
        """The baseline is at least as strong as the new audit in every aspect."""
        return all(r in (SAME, WEAKER) for r in self.relations.values())

    @property
    def strictly_stronger(self) -> bool:
        """At least as strong, and stronger in some aspect."""
        return self.at_least_as_strong and not self.baseline_at_least_as_strong

    @property
    def same_threat_model(self) -> bool:
        return self.relations["threat_model"] == SAME


def compare(new: Fingerprint, old: Fingerprint) -> Comparison:
    """Compare the new audit's fingerprint with the baseline's (docs/auditor.md, "How strong an
    audit is")."""
    relations: dict[str, str] = {}
    weaker: list[str] = []
    stronger: list[str] = []
    for aspect in STRENGTH_ASPECTS:
        a, b = new.value(aspect), old.value(aspect)
        r = relations[aspect] = (_expected_relation(new, old) if aspect == "expected_ratio"
                                 else _relation(aspect, a, b))
        if r == STRONGER:
            stronger.append(_sentence(aspect, r, a, b))
        elif r != SAME:
            weaker.append(_sentence(aspect, r, a, b))
    # the aspects of the order speak in the strength sentences; "what changed" is the rest
    changes = tuple(Change(k, old.value(k), new.value(k)) for k in LABELS
                    if k not in STRENGTH_ASPECTS and new.value(k) != old.value(k))
    subject = tuple(c for c in changes if c.key in SUBJECT_KEYS
                    and c.old is not None and c.new is not None)
    unchecked = tuple(k for k in SUBJECT_KEYS
                      if new.value(k) is None or old.value(k) is None)
    return Comparison(relations, tuple(weaker), tuple(stronger), changes, subject, unchecked)


def _expected_relation(new: Fingerprint, old: Fingerprint) -> str:
    """The expected bound's relation, within the simulation error both fingerprints record."""
    a, b = new.expected_ratio, old.expected_ratio
    if a is None or b is None:
        return _relation("expected_ratio", a, b)
    return power_relation("expected_ratio", a, b, new.expected_ratio_se, old.expected_ratio_se)


def at_least_as_strong(a: Fingerprint, b: Fingerprint) -> bool:
    """Is the audit ``a`` at least as strong as ``b`` (the partial order of this module)?"""
    return compare(a, b).at_least_as_strong


# ----------------------------------------------------------------------------------------------
# the subject: the model's architecture
# ----------------------------------------------------------------------------------------------

def _unwrap(model: Any) -> Any:
    """The user's module inside the wrappers that keep it as an attribute: Opacus's
    ``GradSampleModule`` (``_module``), ``DistributedDataParallel`` / Opacus's ``DPDDP``
    (``module``) and ``torch.compile`` (``_orig_mod``)."""
    for _ in range(8):
        inner = None
        for attr in ("_module", "_orig_mod"):
            cand = getattr(model, attr, None)
            if cand is not None and hasattr(cand, "named_parameters"):
                inner = cand
                break
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DPDDP"):
            inner = getattr(model, "module", None)
        if inner is None:
            return model
        model = inner
    return model


def _class_name(module: Any) -> str:
    """A module's class, without the class FSDP2's ``fully_shard`` derives from it
    (``FSDP<Name>``), so that sharding does not change the architecture."""
    cls = type(module)
    bases = cls.__bases__
    if cls.__name__.startswith("FSDP") and bases and cls.__name__ == f"FSDP{bases[-1].__name__}":
        cls = bases[-1]
    return f"{cls.__module__}.{cls.__qualname__}"


def architecture_hash(model: Any) -> str | None:
    """A hash of a model's architecture: every submodule's path and class, and every
    parameter's name and shape (not its values, dtype or device), after the wrappers of
    :func:`_unwrap`; ``"sha256:"`` and 16 hex digits. None for no model. Two models with the
    same modules and parameter shapes get the same hash, whatever their weights."""
    if model is None:
        return None
    inner = _unwrap(model)
    items: list[list[Any]] = [["module", name, _class_name(mod)]
                              for name, mod in inner.named_modules()]
    items += [["parameter", name, [int(n) for n in p.shape]]
              for name, p in inner.named_parameters()]
    text = json.dumps(items, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
