"""The release gate: is a new release's audit consistent with its claim, and comparable with the
previous release's? (``dpaudit gate``, docs/release_gate.md.)

A release of a DP training pipeline is audited with a fixed set of canaries; the gate compares
the audited lower bound L of each whole-run method (Steinke, Nasr & Jagielski, NeurIPS 2023, and
the methods the report holds besides) with the accountant's claimed epsilon, and the audit's
fingerprint with the previous release's (:mod:`dpaudit_torch.report.fingerprint`: the strength
order of docs/auditor.md, "How strong an audit is").

* **pass** (exit 0): the new audit refutes nothing (no valid whole-run L above the claim, no
  proven violation, no inconsistent claim), and it is at least as strong as the baseline's (its
  power included), so the L values of the two releases are comparable; or it is weaker in power
  only and ``accept_weaker`` says why; or ``first_release`` was declared.
* **fail** (exit 1): L exceeds the claim (or the audit proved a violation, or found the claim
  inconsistent with the training that ran); there is no baseline (and no ``first_release``); the
  new audit observed no step; the new audit is not at least as strong as the baseline's (less
  power without ``accept_weaker``); or it is strictly stronger and L, relative to the claim, rose
  by more than ``jump_margin`` beyond what its added power explains, which shows that the
  baseline's audit was too weak to be trusted.
* **impossible** (exit 2): the comparison means nothing: the new report holds no claim, the two
  audits have different threat models, or a different model, dataset or architecture (unless
  ``allow_change``). Unreadable, incomplete or hostile input (:func:`read_audit`,
  :mod:`dpaudit_torch.gate_input`) is exit 2 too.

A pass shows only that no counterexample was found; it never proves the claimed epsilon, whose
upper bound still comes from the accountant. This module prints nothing: :func:`gate` returns a
:class:`GateResult` with its exit code, its text (:meth:`GateResult.text`) and its page
(:func:`render_html`); the command line prints them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gate_input import AuditInput, GateInputError, read_audit
from .registry import BOUND_METHODS, WHOLE_RUN, bound_method
from .report.fingerprint import (
    LABELS,
    SAME,
    STRONGER,
    UNKNOWN,
    WEAKER,
    Comparison,
    compare,
)
from .report.formatting import format_number
from .report.markup import esc, method_label
from .report.power_order import POWER_ASPECTS
from .report.schema import (
    VERDICT_INCONSISTENT,
    VERDICT_NOTHING,
    VERDICT_REFUTED,
    VERDICT_VIOLATION,
    ReportData,
    no_steps_audited,
    verdict_phrase,
)

logger = logging.getLogger(__name__)

__all__ = ["EXIT_PASS", "EXIT_FAIL", "EXIT_BAD_INPUT", "PASS", "FAIL", "IMPOSSIBLE",
           "JUMP_MARGIN", "CLAIM_RTOL", "GATE_HTML", "ACCEPTABLE_WEAKER", "GateInputError",
           "check_reason",
           "AuditInput",
           "BoundRow", "GateResult", "read_audit", "gate", "render_html", "html_path_for"]

#: exit codes of ``dpaudit gate``
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
PASS, FAIL, IMPOSSIBLE = "pass", "fail", "impossible"
_EXIT = {PASS: EXIT_PASS, FAIL: EXIT_FAIL, IMPOSSIBLE: EXIT_BAD_INPUT}
#: a whole-run L that rises by more than this fraction of the claim between two releases is a
#: jump: a failure when the new audit is strictly stronger, a warning when the claim is unchanged
JUMP_MARGIN = 0.25
#: two claims within this relative tolerance are the same claim
CLAIM_RTOL = 1e-6
#: the comparison page's file name, next to the new report
GATE_HTML = "gate.html"
#: the aspects in which a release may be weaker on purpose (``accept_weaker``): they follow from
#: the training and the claim (fewer steps, another sample rate, a smaller claimed epsilon), not
#: from the audit's settings, which the release keeps
ACCEPTABLE_WEAKER = POWER_ASPECTS
#: the longest reason ``accept_weaker`` takes
_REASON_MAX = 500
#: verdicts of the new audit that fail the gate: each shows the claim does not hold
_FAILING_VERDICTS = (VERDICT_REFUTED, VERDICT_VIOLATION, VERDICT_INCONSISTENT)


@dataclass(frozen=True)
class BoundRow:
    """One bound method of either report: its L in the baseline (``old``) and the new audit."""

    method: str
    old: float | None
    new: float | None

    @property
    def label(self) -> str:
        return method_label(self.method)

    @property
    def scope(self) -> str | None:
        spec = bound_method(self.method)
        return spec.scope if spec is not None else None


def _bounds(new: ReportData, old: ReportData | None) -> tuple[BoundRow, ...]:
    a, b = new.epsilon_lower_bounds, (old.epsilon_lower_bounds if old is not None else {})
    names = [m for m in BOUND_METHODS if m in a or m in b]
    names += sorted(m for m in {*a, *b} if m not in BOUND_METHODS)
    return tuple(BoundRow(m, b.get(m), a.get(m)) for m in names)


@dataclass(frozen=True)
class GateResult:
    """What the gate decided and why (docs/release_gate.md).

    Attributes:
        outcome: :data:`PASS`, :data:`FAIL` or :data:`IMPOSSIBLE`.
        exit_code: 0, 1 or 2 (:data:`EXIT_PASS`, :data:`EXIT_FAIL`, :data:`EXIT_BAD_INPUT`).
        reason: one sentence.
        new, baseline: the two audits (``baseline`` None on a first release or without one).
        comparison: the fingerprints compared (None without a baseline).
        bounds: L per method, side by side.
        warnings: what the gate noticed without failing (a large rise of L with the claim
            unchanged, a subject it could not check, a changed accountant, ...).
        accepted_weaker: the reason given for accepting a weaker audit (``--accept-weaker``),
            or None.
    """

    outcome: str
    reason: str
    new: AuditInput
    baseline: AuditInput | None
    comparison: Comparison | None
    bounds: tuple[BoundRow, ...]
    warnings: tuple[str, ...]
    first_release: bool = False
    jump_margin: float = JUMP_MARGIN
    accepted_weaker: str | None = None

    @property
    def exit_code(self) -> int:
        return _EXIT[self.outcome]

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    def headline(self) -> str:
        """The outcome and its reason, one line: ``"PASS: ..."``, ``"FAIL: ..."`` or
        ``"CANNOT COMPARE: ..."``."""
        word = {PASS: "PASS", FAIL: "FAIL", IMPOSSIBLE: "CANNOT COMPARE"}[self.outcome]
        return f"{word}: {self.reason}"

    def rows(self) -> list[tuple[str, str, str, bool]]:
        """(label, baseline, new, changed) of the side-by-side table."""
        new, old = self.new, self.baseline
        rows: list[tuple[str, str, str, bool]] = []

        def add(label: str, a: Any, b: Any) -> None:
            oa = "" if old is None else _cell(a)
            rows.append((label, oa, _cell(b), old is not None and _cell(a) != _cell(b)))

        add("verdict", old.report.verdict if old else None, new.report.verdict)
        add("claimed epsilon", old.report.claimed_epsilon if old else None,
            new.report.claimed_epsilon)
        for row in self.bounds:
            scope = {WHOLE_RUN: "whole run"}.get(row.scope or "", row.scope or "unknown scope")
            add(f"L {row.method} ({scope})", row.old, row.new)
        add("schema version (as written)", old.written_schema if old else None,
            new.written_schema)
        for key, label in LABELS.items():
            add(label, old.fingerprint.value(key) if old else None, new.fingerprint.value(key))
        return rows

    def strength_text(self) -> str:
        """The comparison of strength in words (empty without a baseline)."""
        c = self.comparison
        if c is None:
            return ""
        if c.at_least_as_strong and not c.strictly_stronger:
            return "strength: the new audit is as strong as the baseline's"
        if c.strictly_stronger:
            return "strength: the new audit is stronger (" + "; ".join(c.stronger) + ")"
        return "strength: the new audit is NOT at least as strong (" + "; ".join(c.weaker) + ")"

    def text(self) -> str:
        """The comparison as plain text: both audits side by side, the strength, what changed,
        the warnings, and the outcome's line last."""
        head = (f"new: {self.new.path}" + (f"    baseline: {self.baseline.path}"
                                             if self.baseline else
                                             "    (first release: no baseline)"
                                             if self.first_release else "    (no baseline)"))
        rows = self.rows()
        w = max(len(r[0]) for r in rows) + 2
        v = max([len("baseline")] + [len(r[1]) for r in rows]) + 2
        lines = [head, f"{'':<{w}}{'baseline':<{v}}new"]
        for label, a, b, changed in rows:
            lines.append(f"{label:<{w}}{a:<{v}}{b}" + ("   *" if changed else ""))
        if self.comparison is not None:
            lines.append(self.strength_text())
            changes = [c.sentence() for c in self.comparison.changes if c.shows_change]
            lines.append("changed: " + ("; ".join(changes) if changes else "nothing"))
        if self.accepted_weaker is not None:
            lines.append(f"accepted weaker: {self.accepted_weaker}")
        lines += [f"warning: {x}" for x in self.warnings]
        lines.append(self.headline())
        return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) for x in v):
        return ", ".join(f"{a} {b}" for a, b in v)  # (method, score) pairs
    if isinstance(v, (tuple, list)):
        return ", ".join(map(str, v)) if v else "none"
    if isinstance(v, str):
        return v
    if v is None:
        return "n/a"
    return format_number(v)


def _verdict_failure(r: ReportData) -> str | None:
    """Why the new audit's own verdict fails the gate, or None."""
    phrase = verdict_phrase(r.verdict)
    if phrase not in _FAILING_VERDICTS:
        return None
    claim = format_number(r.claimed_epsilon)
    if phrase == VERDICT_REFUTED:  # the report's rule (the registry's) decided which bound
        said = [str(f.get("message")) for f in r.findings if f.get("level") == "refuted"]
        return "L exceeds the claim: " + (said[0] if said else
                                          f"a lower bound exceeds the claimed epsilon {claim}")
    labels = r.monitor_labels
    who = sorted({labels.get(str(f.get("monitor")), str(f.get("monitor")))
                  for f in r.findings if f.get("level") in ("violation", "inconsistent")})
    by = f" (by {', '.join(who)})" if who else ""
    if phrase == VERDICT_VIOLATION:
        return (f"the new audit says '{r.verdict}'{by}: the training breaks what the claimed "
                f"epsilon {claim} assumes")
    return (f"the new audit says '{r.verdict}'{by}: the claimed epsilon {claim} does not match "
            f"the training that ran")


def _same_claim(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=CLAIM_RTOL)


def _rises(bounds: tuple[BoundRow, ...], claim: float, margin: float) -> list[BoundRow]:
    """The whole-run bounds that rose by more than ``margin`` x ``claim``."""
    return [b for b in bounds if b.scope == WHOLE_RUN and b.old is not None
            and b.new is not None and b.new - b.old > margin * claim]


def _rise_text(rows: list[BoundRow], claim: float, margin: float) -> str:
    return "; ".join(f"the {b.label} bound rose from {format_number(b.old)} to "
                     f"{format_number(b.new)} (+{format_number(b.new - b.old)}, more than "
                     f"{format_number(margin)} x the claim {format_number(claim)} = "
                     f"{format_number(margin * claim)})" for b in rows)


def _jumps(bounds: tuple[BoundRow, ...], new: AuditInput, old: AuditInput,
           margin: float) -> str | None:
    """The whole-run bounds that rose, as a fraction of each audit's own claim, by more than
    ``margin`` beyond what the new audit's added power explains (the rise of the expected bound
    over its claim, docs/release_gate.md), in words; None when none did. With the same claim
    and the same power this is a rise of L by more than ``margin`` x the claim."""
    c_new, c_old = new.report.claimed_epsilon, old.report.claimed_epsilon
    if c_new is None or c_old is None or not (c_new > 0 and c_old > 0):
        return None
    e_new, e_old = new.fingerprint.expected_ratio, old.fingerprint.expected_ratio
    allow = max(0.0, e_new - e_old) if e_new is not None and e_old is not None else 0.0
    if _same_claim(c_new, c_old) and allow == 0.0:
        rose = _rises(bounds, c_new, margin)
        return _rise_text(rose, c_new, margin) if rose else None
    parts = []
    for b in bounds:
        if b.scope != WHOLE_RUN or b.old is None or b.new is None:
            continue
        rise = b.new / c_new - b.old / c_old
        if rise - allow > margin:
            parts.append(
                f"the {b.label} bound rose from {format_number(b.old)} "
                f"({format_number(b.old / c_old)} x its claim {format_number(c_old)}) to "
                f"{format_number(b.new)} "
                f"({format_number(b.new / c_new)} x its claim {format_number(c_new)}): "
                f"+{format_number(rise)} x the claim, of which the added power explains "
                f"{format_number(allow)} (the rise of the expected bound over the claim), "
                f"more than {format_number(margin)} beyond it")
    return "; ".join(parts) or None


def _weaker_reason(c: Comparison, accept_weaker: str | None) -> str | None:
    """Why a weaker audit fails the gate, or None when ``accept_weaker`` accepts it."""
    weak = [a for a, r in c.relations.items() if r not in (SAME, STRONGER)]
    if accept_weaker is not None and all(
            a in ACCEPTABLE_WEAKER and c.relations[a] == WEAKER for a in weak):
        return None
    reason = ("the new audit is not at least as strong as the baseline's ("
              + "; ".join(c.weaker) + "), so its bounds are not comparable")
    if all(a in ACCEPTABLE_WEAKER and c.relations[a] == WEAKER for a in weak):
        return reason + ("; if this release trains fewer steps or claims a smaller epsilon on "
                         "purpose, pass --accept-weaker REASON")
    if accept_weaker is not None:
        return reason + ("; --accept-weaker accepts a weaker power only (steps, q T, expected "
                         "bound, refutable epsilon), not weaker audit settings")
    return reason


def _warnings(new: AuditInput, old: AuditInput | None, c: Comparison | None,
              bounds: tuple[BoundRow, ...], margin: float, allow_change: bool) -> list[str]:
    out: list[str] = []
    r = new.report
    claim = r.claimed_epsilon
    for b in bounds:
        if (not r.claim_refuted and b.scope == WHOLE_RUN and claim is not None
                and b.new is not None and b.new > claim):
            out.append(f"the {b.label} bound {format_number(b.new)} exceeds the claim "
                       f"{format_number(claim)}, but the report does not count it as refuting "
                       f"the claim (it assumes a trade-off family, docs/report.md), so it does "
                       f"not fail the gate on its own")
    if r.evidence and not r.violation:  # the two levels (docs/design.md): evidence is no proof
        lvl = "" if r.alpha_warn is None else f" at alpha_warn = {format_number(r.alpha_warn)}"
        out.append(f"the new audit shows evidence of a per-step violation{lvl} (not a proof: "
                   f"proofs are at alpha = {format_number(r.alpha)}); it does not fail the gate "
                   f"on its own; read its report")
    elif verdict_phrase(r.verdict) not in (*_FAILING_VERDICTS, VERDICT_NOTHING):
        out.append(f"the new audit's verdict is '{r.verdict}': read its report's findings")
    if old is None or c is None:
        return out
    if verdict_phrase(old.report.verdict) != VERDICT_NOTHING:
        out.append(f"the baseline's own verdict was '{old.report.verdict}'")
    old_claim = old.report.claimed_epsilon
    if not _same_claim(claim, old_claim):
        out.append(f"the claim changed from {format_number(old_claim)} to "
                   f"{format_number(claim)}")
    elif claim is not None and math.isfinite(claim) and not c.strictly_stronger:
        rose = _rises(bounds, claim, margin)
        if rose:
            # "still under the claim" only where it is: not beside a failing verdict or a
            # bound above the claim
            under = _verdict_failure(r) is None and all(
                b.new is not None and b.new <= claim for b in rose)
            tail = ("; still under the claim, but look for what changed in the training"
                    if under else "; look for what changed in the training")
            out.append(f"L rose a lot with the claim unchanged: "
                       f"{_rise_text(rose, claim, margin)}{tail}")
    if c.subject_unchecked:
        where = ("the baseline (schema " + old.written_schema + ")"
                 if any(k in old.fingerprint.not_recorded for k in c.subject_unchecked)
                 else "one of the two reports")
        out.append(f"{', '.join(LABELS[k] for k in c.subject_unchecked)} not recorded in "
                   f"{where}: the gate cannot check that both audits are about the same "
                   f"model and data (set model_name / dataset_name and pass model=)")
    if allow_change and c.subject_changes:
        out.append("the subject changed (allowed by --allow-change): "
                   + "; ".join(ch.sentence() for ch in c.subject_changes))
    if new.fingerprint.accountant != old.fingerprint.accountant:
        out.append(f"the accountant changed ({old.fingerprint.accountant} -> "
                   f"{new.fingerprint.accountant}): the two claims are computed differently")
    return out


def check_reason(reason: Any) -> str:
    """``accept_weaker``'s reason: a non-empty line of at most 500 characters, stripped.

    Raises:
        TypeError: not a string.
        ValueError: empty, several lines or longer than 500 characters.
    """
    if not isinstance(reason, str):
        raise TypeError(f"accept_weaker must be a string (the reason), got {reason!r}")
    text = reason.strip()
    if not text or "\n" in text or "\r" in text or len(text) > _REASON_MAX:
        raise ValueError(f"accept_weaker must be one non-empty line of at most {_REASON_MAX} "
                         f"characters saying why the release is weaker, got {reason[:80]!r}")
    return text


def gate(new: AuditInput, baseline: AuditInput | None = None, *, first_release: bool = False,
         allow_change: bool = False, jump_margin: float = JUMP_MARGIN,
         accept_weaker: str | None = None) -> GateResult:
    """Decide the release gate for ``new`` against ``baseline`` (docs/release_gate.md).

    Args:
        new: the new release's audit (:func:`read_audit`, or :meth:`AuditInput.of`).
        baseline: the previous release's audit, or None.
        first_release: there is no previous audit, declared explicitly (exclusive with a
            baseline); the new audit must still not contradict its claim.
        allow_change: compare although the model, dataset or architecture changed.
        jump_margin: the rise of a whole-run L, as a fraction of the claim, that counts as a
            jump (:data:`JUMP_MARGIN`).
        accept_weaker: why this release is weaker on purpose (it trains fewer steps or claims
            a smaller epsilon): a new audit weaker than the baseline's only in the power
            aspects (:data:`ACCEPTABLE_WEAKER`) then passes, the reason printed and recorded.

    Raises:
        ValueError: both a baseline and ``first_release``, a negative / non-finite margin, or
            a reason that is empty, several lines or too long (TypeError: not a string).
    """
    if first_release and baseline is not None:
        raise ValueError("a first release has no baseline: give one or the other")
    if not (isinstance(jump_margin, (int, float)) and math.isfinite(jump_margin)
            and jump_margin >= 0):
        raise ValueError(f"jump_margin must be a finite number >= 0, got {jump_margin!r}")
    if accept_weaker is not None:
        accept_weaker = check_reason(accept_weaker)
    r = new.report
    c = compare(new.fingerprint, baseline.fingerprint) if baseline is not None else None
    bounds = _bounds(r, baseline.report if baseline is not None else None)
    warnings = tuple(_warnings(new, baseline, c, bounds, jump_margin, allow_change))

    def result(outcome: str, reason: str) -> GateResult:
        logger.info("release gate: %s: %s", outcome, reason)
        accepted = (accept_weaker if c is not None and outcome == PASS
                    and not c.at_least_as_strong else None)
        return GateResult(outcome, reason, new, baseline, c, bounds, warnings, first_release,
                          jump_margin, accepted)

    claim = r.claimed_epsilon
    if claim is None:
        return result(IMPOSSIBLE, "the new report records no claimed epsilon, so its lower "
                                  "bounds cannot be compared with a claim")
    if no_steps_audited(r.training):
        return result(FAIL, "the new audit observed no training step, so it holds no evidence")
    failure = _verdict_failure(r)
    if failure is not None:
        return result(FAIL, failure)
    if baseline is None:
        if first_release:
            return result(PASS, f"first release: no bound exceeds the claimed epsilon "
                                f"{format_number(claim)}; this audit is the baseline of the "
                                f"next release (a pass proves no epsilon: the accountant's "
                                f"claim remains its only upper bound)")
        return result(FAIL, "there is no audit baseline: give the previous release's audit "
                            "(--baseline), or declare the first release (--first-release)")
    assert c is not None
    if no_steps_audited(baseline.report.training):
        return result(FAIL, "the baseline audit observed no training step, so there is no "
                            "audit baseline to compare with")
    if c.relations["threat_model"] == UNKNOWN:
        which = "baseline" if baseline.fingerprint.threat_model is None else "new report"
        return result(IMPOSSIBLE, f"the threat model is not recorded in the {which}, so the "
                                  f"two audits' bounds cannot be compared")
    if not c.same_threat_model:
        return result(IMPOSSIBLE, f"the threat models differ ("
                                  f"{_cell(baseline.fingerprint.threat_model)} -> "
                                  f"{_cell(new.fingerprint.threat_model)}): bounds under "
                                  f"different threat models are not comparable")
    if c.subject_changes and not allow_change:
        return result(IMPOSSIBLE, "the audits are about different subjects ("
                      + "; ".join(ch.sentence() for ch in c.subject_changes)
                      + "): pass --allow-change if this release is meant to change them")
    if not c.at_least_as_strong:
        weaker = _weaker_reason(c, accept_weaker)
        if weaker is not None:
            return result(FAIL, weaker)
        return result(PASS, f"no bound exceeds the claimed epsilon {format_number(claim)}; the "
                            f"audit is weaker than the baseline's ({'; '.join(c.weaker)}), "
                            f"accepted on purpose: {accept_weaker} (a pass proves no epsilon: "
                            f"the accountant's claim remains its only upper bound)")
    if c.strictly_stronger and math.isfinite(claim):
        jumped = _jumps(bounds, new, baseline, jump_margin)
        if jumped:
            return result(FAIL, f"with a stronger audit ({'; '.join(c.stronger)}) {jumped}: "
                                f"the baseline's audit was too weak to be trusted")
    strength = "stronger than" if c.strictly_stronger else "as strong as"
    return result(PASS, f"no bound exceeds the claimed epsilon {format_number(claim)} and the "
                        f"audit is {strength} the baseline's (a pass proves no epsilon: the "
                        f"accountant's claim remains its only upper bound)")


# ----------------------------------------------------------------------------------------------
# the comparison page
# ----------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif;
       color: #1d2128; margin: 0; line-height: 1.45; }
main { max-width: 64rem; margin: 0 auto; padding: 1.2rem 1.5rem 3rem; }
.outcome { border: 2px solid; border-radius: 6px; padding: 0.7rem 1rem; margin: 1rem 0; }
.pass { background: #edf7ee; border-color: #2e7d32; }
.fail, .impossible { background: #fdecea; border-color: #c62828; }
table { border-collapse: collapse; font-size: 0.92rem; }
th, td { border: 1px solid #d8dde3; padding: 0.3rem 0.55rem; text-align: left; }
th { background: #f3f5f7; }
tr.changed td { background: #fff8e1; }
ul.warnings li { color: #6b4f00; }
"""


def render_html(result: GateResult) -> str:
    """The comparison as one self-contained page (no script, nothing loaded)."""
    r = result
    word = {PASS: "Pass", FAIL: "Fail", IMPOSSIBLE: "Cannot compare"}[r.outcome]
    body = "".join(
        f'<tr{" class=changed" if changed else ""}><th>{esc(label)}</th><td>{esc(a)}</td>'
        f"<td>{esc(b)}</td></tr>" for label, a, b, changed in r.rows())
    base = esc(r.baseline.path) if r.baseline else ("none (first release)" if r.first_release
                                                    else "none")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">",
        f"<title>Release gate: {esc(word)}</title><style>{_CSS}</style></head><body><main>",
        "<h1>Release gate: audit comparison</h1>",
        f"<p>New: <code>{esc(r.new.path)}</code> · baseline: <code>{base}</code></p>",
        f'<div class="outcome {esc(r.outcome)}" id="outcome" data-outcome="{esc(r.outcome)}" '
        f'data-exit-code="{r.exit_code}"><strong>{esc(word)}</strong>: {esc(r.reason)}</div>',
        '<table id="comparison"><tr><th></th><th>baseline</th><th>new</th></tr>'
        f"{body}</table>",
    ]
    if r.comparison is not None:
        changes = [c.sentence() for c in r.comparison.changes if c.shows_change] or ["nothing"]
        parts.append(f"<p>{esc(r.strength_text())}</p><p>Changed:</p><ul>"
                     + "".join(f"<li>{esc(x)}</li>" for x in changes) + "</ul>")
    if r.accepted_weaker is not None:
        parts.append('<p id="accepted-weaker"><strong>Weaker audit accepted on purpose:</strong> '
                     f"{esc(r.accepted_weaker)}</p>")
    if r.warnings:
        parts.append('<h2>Warnings</h2><ul class="warnings">'
                     + "".join(f"<li>{esc(w)}</li>" for w in r.warnings) + "</ul>")
    parts.append("<p>A pass shows only that the audit found no counterexample to the claim; it "
                 "never proves the claimed epsilon, whose upper bound comes from the "
                 "accountant (docs/release_gate.md).</p></main></body></html>")
    return "\n".join(parts)


def html_path_for(new_path: str | Path) -> Path:
    """Where the comparison page goes by default: ``gate.html`` next to the new report (in its
    directory when the path is one)."""
    p = Path(new_path)
    return (p if p.is_dir() else p.parent) / GATE_HTML
