"""The bounds section of the report page: the whole-run claim beside its lower bounds, and, in a
table of its own, the per-step bound.

The two speak about different things and are never in the same table: the claim and the one-run
bounds (Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis & Chaudhuri, ICML 2025) are
about the epsilon of the *whole training run* at the claim's delta; the bound of the sequential
tests (docs/design.md section 4) is about *one training step*, at the delta of its own grid point
of the per-step null, and is never compared with the claim. What each method may prove is read
from :mod:`dpaudit_torch.registry`.
"""

from __future__ import annotations

from ..registry import bound_method
from .formatting import scope_text
from .markup import esc, generic, json_attr, method_label, num, scalar
from .schema import is_num, per_step_delta
from .view import ReportView

__all__ = ["bounds_section"]


def _exceeds(method: str, bound: float | None, claim: float | None, may_refute: bool) -> str:
    """The "Exceeds claim" cell of a whole-run bound."""
    if bound is None or claim is None:
        return num(None)
    if not bound > claim:
        return '<span class="ok">no</span>'
    if may_refute:
        return '<span class="bad">yes: claim refuted</span>'
    spec = bound_method(method)
    if spec is None:
        return (
            '<span class="bad">yes</span>, but this version of dpaudit_torch does not know '
            "this method, so it does not count it as refuting the claim"
        )
    family = f"the {esc(spec.family)} family" if spec.family else "a trade-off family"
    if spec.refutes_if_verified:
        return (
            f'<span class="bad">yes</span>, but this test assumes {family}, which its check '
            "on this run's data did not verify, so it does not refute the claim"
        )
    return (
        f'<span class="bad">yes</span>, but this test assumes {family}, so it does not '
        "refute the claim on its own"
    )


def _level(det: dict, key: str, alpha: float) -> str:
    lvl = det.get(key, alpha)
    text = (f"α = {num(lvl)} ({num(100.0 * (1.0 - lvl))}% confidence)" if is_num(lvl)
            else scalar(lvl))
    per_test = det.get("alpha_per_test")
    if is_num(per_test) and is_num(lvl) and per_test != lvl:
        n_cand = det.get("n_candidates")
        over = f" over {num(n_cand)} candidates" if is_num(n_cand) else ""
        text += f"; {num(per_test)} per candidate (Bonferroni{over})"
    return text


def _notes(v: ReportView, m: str) -> list[str]:
    det, notes = v.detail(m), []
    for key, label in (("family", "family"), ("note", ""), ("null", "null"),
                       ("uncorrected_best_note", "uncorrected best")):
        if det.get(key) and isinstance(det[key], str):
            label_html = f" {esc(label)}" if label else ""
            notes.append(f"<li><strong>{esc(m)}</strong>{label_html}: {esc(det[key])}</li>")
    return notes


def withheld(det: dict, bound: object) -> bool:
    """Whether a recorded bound of 0 stands for no bound at all: withheld (its family check
    failed, ``family_verified`` false) or not computed (a note saying "no ... bound")."""
    if bound != 0:
        return False
    note = det.get("note")
    return det.get("family_verified") is False or (
        isinstance(note, str) and note.startswith("no ") and " bound" in note)


def _bound_cell(v: ReportView, m: str) -> str:
    bound = v.d["epsilon_lower_bounds"].get(m)
    if bound is not None and withheld(v.detail(m), bound):  # not a bound of 0: none at all
        return (f'<span class="num" data-field="epsilon_lower_bounds.{esc(m)}" data-value="'
                f'{json_attr(bound)}">withheld: no bound</span>')
    return num(bound, f"epsilon_lower_bounds.{m}") if bound is not None else num(None)


def _ceiling_cell(v: ReportView, m: str) -> str:
    c = v.ceiling(m)
    return num(c, f"lower_bound_details.{m}.ceiling") if "ceiling" in v.detail(m) else num(c)


def _whole_run_row(v: ReportView, m: str) -> str:
    d, det = v.d, v.detail(m)
    scope = esc(scope_text(m) or "not known to this version of dpaudit_torch")
    exceeds = _exceeds(m, d["epsilon_lower_bounds"].get(m), d["claimed_epsilon"],
                       v.may_refute(m))
    strategy = esc(det["strategy"]) if "strategy" in det else num(None)
    if "rho_lower" in det:  # the white-box bound makes no guesses: it uses every value
        strategy = "none: every observation's value (exact law of the canaries' sums)"
    if "guesses" in det and not isinstance(det["guesses"], (dict, list)):
        strategy += f" ({scalar(det['guesses'])})"
    unc = det.get("uncorrected_best")
    return (
        f'<tr data-method="{esc(m)}"><td>{esc(method_label(m))}</td><td>{scope}</td>'
        f'<td class="n">{_bound_cell(v, m)}</td><td>{exceeds}</td>'
        f"<td>{_level(det, 'alpha', d['alpha'])}</td><td>{strategy}</td>"
        f'<td class="n">{v.canary_count(m)}</td>'
        f'<td class="n">{num(det.get("r"))} / {num(det.get("v"))}</td>'
        f'<td class="n">{_ceiling_cell(v, m)}</td>'
        f"<td class=\"n\">{scalar(unc) if not isinstance(unc, (dict, list)) else ''}</td></tr>"
    )


def _per_step_row(v: ReportView, m: str) -> str:
    d, det = v.d, v.detail(m)
    bound = d["epsilon_lower_bounds"].get(m)
    delta = per_step_delta(bound, det)
    delta_html = (num(delta) if delta is not None
                  else "none: no grid point rejected" if bound == 0 else num(None))
    simul = det.get("simultaneous")
    grid = (
        "simultaneous (Bonferroni over the grid)" if simul is True
        else "each point at level α (not simultaneous)" if simul is False else "grid"
    )
    points = det.get("grid_epsilons")
    if isinstance(points, list):
        grid += f", {len(points)} points"
    return (
        f'<tr data-method="{esc(m)}"><td>{esc(method_label(m))}</td>'
        f'<td class="n">{_bound_cell(v, m)}</td><td class="n">{delta_html}</td>'
        f"<td>{_level(det, 'level', d['alpha'])}</td><td>{grid}</td>"
        f'<td class="n">{v.canary_count(m)}</td><td class="n">{_ceiling_cell(v, m)}</td></tr>'
    )


def _whole_run_table(v: ReportView, methods: list[str]) -> tuple[str, list[str]]:
    d = v.d
    notes: list[str] = []
    rows = []
    for m in methods:
        rows.append(_whole_run_row(v, m))
        notes += _notes(v, m)
        ceiling, claim = v.ceiling(m), d["claimed_epsilon"]
        if v.may_refute(m) and ceiling is not None and claim is not None and ceiling <= claim:
            best_case = ("even for a noise-free release" if "rho_lower" in v.detail(m)
                         else "even with every guess right; more canaries raise the ceiling")
            notes.append(
                f"<li><strong>{esc(m)}</strong>: its ceiling ε = {num(ceiling)} is not above "
                f"the claimed ε = {num(claim)}, so this method could not have refuted the "
                f"claim {best_case}.</li>")
    if not rows:
        return "<p><em>No lower bound on the whole run's ε was computed.</em></p>", notes
    head = (
        "<tr><th>Method</th><th>Scope</th><th class=\"n\">Lower bound ε (whole run)</th>"
        "<th>Exceeds the claim</th><th>Level</th><th>Guess strategy</th>"
        "<th class=\"n\">Canaries</th><th class=\"n\">Guesses / correct</th>"
        "<th class=\"n\">Ceiling ε</th><th class=\"n\">Uncorrected best (diagnostic)</th></tr>"
    )
    return (f'<div class="wide"><table id="bounds-table"><thead>{head}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'), notes


def _per_step_part(v: ReportView, methods: list[str]) -> str:
    if not methods:
        return ""
    rows = "".join(_per_step_row(v, m) for m in methods)
    notes = [n for m in methods for n in _notes(v, m)]
    head = (
        "<tr><th>Method</th><th class=\"n\">Lower bound ε (one step)</th>"
        "<th class=\"n\">At δ (of that step)</th><th>Level</th><th>Grid of the per-step "
        "null</th><th class=\"n\">Canaries</th><th class=\"n\">Ceiling ε (largest grid ε)"
        "</th></tr>"
    )
    note_html = f'<ul class="notes">{"".join(notes)}</ul>' if notes else ""
    return (
        '<div id="per-step-bound"><h3>Per-step bound: a statement about one training step'
        "</h3><p>This bound is about a <strong>single training step</strong>, at the δ of the "
        "grid point of the per-step null it rejected, not about the whole run: it is not "
        "comparable with the claimed ε and never refutes it. A bound above 0 shows that a "
        f"step leaks more than the per-step null allows. {v.per_step_null_text()}</p>"
        f'<div class="wide"><table id="per-step-bound-table"><thead>{head}</thead>'
        f"<tbody>{rows}</tbody></table></div>{note_html}</div>"
    )


def bounds_section(v: ReportView) -> str:
    """The whole-run claim and its lower bounds (one table), then the per-step bound (another
    table, under its own heading), then every method's recorded details."""
    d = v.d
    methods = v.methods()
    whole = [m for m in methods if not v.one_step(m)]
    step = [m for m in methods if v.one_step(m)]
    acc = esc(d["accountant"]) if d["accountant"] else "not recorded"
    intro = (
        f"<p>Claimed for the <strong>whole training run</strong>: ε = "
        f"{num(d['claimed_epsilon'], 'claimed_epsilon')} at δ = {num(d['delta'], 'delta')}, "
        f"from the accountant <strong>{acc}</strong>. Each bound in this table is a lower "
        "bound on the whole run's ε at the same δ: it holds with the confidence shown. The "
        "ceiling is the largest ε the method could have certified with these canaries: with "
        "every guess right for the guessing tests, for a noise-free release for the white-box "
        "bound. The uncorrected best is a diagnostic (the best "
        "threshold chosen after seeing the answers) and is <em>not</em> a valid bound.</p>"
    )
    if not methods:
        table, notes = "<p><em>No lower bound was computed.</em></p>", []
    else:
        table, notes = _whole_run_table(v, whole)
    note_html = f'<ul class="notes">{"".join(notes)}</ul>' if notes else ""
    details = "".join(
        f"<details><summary>All recorded details: {esc(m)}</summary>"
        f"{generic(v.detail(m))}</details>"
        for m in methods if v.detail(m)
    )
    return (
        '<section id="bounds"><h2>The whole-run claim and its audited lower bounds</h2>'
        f"{intro}{table}{note_html}{_per_step_part(v, step)}{details}</section>"
    )
