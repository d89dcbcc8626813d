"""The self-contained HTML page of an audit report (``report.html``).

One file, no network access (a Content-Security-Policy forbids any load; the plots are inline
PNG), the verdict first, then the claimed epsilon beside the audited lower bounds, the sequential
tests, the plots, the threat model and the provenance; the report's JSON is embedded as a data
block. How to read it: docs/report.md, "Reading the report".

This module writes the page skeleton and the verdict (naming the deciding monitors of a proven
violation as the report's ``monitor_labels`` does, :mod:`dpaudit_torch.report.wording`); the
bounds (the whole-run claim and its bounds, and apart from them the per-step bound) are in
:mod:`dpaudit_torch.report.bounds`, the other sections in :mod:`dpaudit_torch.report.sections`,
the building blocks in :mod:`dpaudit_torch.report.markup` and the page's view of the report in
:mod:`dpaudit_torch.report.view`.
What each bound method may prove (its scope, whether it may refute the claim) is read from
:mod:`dpaudit_torch.registry`: only a family-free bound on the whole run, the one-run bound of
Steinke, Nasr & Jagielski (NeurIPS 2023), refutes an (eps, delta) claim; the f-DP one-run test of
Mahloujifar, Melis & Chaudhuri (ICML 2025) assumes the Gaussian trade-off family, and the bound of
the sequential tests (docs/design.md section 4) is about one training step.
"""

from __future__ import annotations

from .bounds import bounds_section
from .checks import checks_section
from .formatting import (
    NO_STEPS_SENTENCE,
    bound_alpha,
    decision_alpha,
    evidence_sentence,
    levels_sentence,
    pairs_sentence,
    power_sentence,
)
from .labels import TRAINING_LABELS, labelled
from .markup import esc, json_for_script, kv_section, method_label, num
from .schema import JSON_NAME, ReportData, no_steps_audited
from .sections import plots_section, provenance_section, sequential_section, strength_section
from .summary import family_promise
from .view import ReportView
from .wording import decided_per_step, deciding_findings, monitor_label

__all__ = ["render_html", "render_page", "verdict_section", "findings_text", "power_text",
           "meaning_text", "violation_text", "config_shown", "training_section"]

# the HTML page
# ----------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif;
       color: #1d2128; background: #fff; margin: 0; line-height: 1.45; }
main { max-width: 72rem; margin: 0 auto; padding: 1.2rem 1.5rem 3rem; }
h1 { font-size: 1.6rem; margin: 0.2rem 0; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #d8dde3;
     padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
.meta { color: #5a6270; font-size: 0.9rem; margin: 0; }
.verdict { border-radius: 6px; padding: 0.8rem 1.1rem; margin: 1.2rem 0; border: 2px solid; }
.verdict h2 { border: none; margin: 0 0 0.4rem; font-size: 1.45rem; }
.verdict-refuted, .verdict-violation { background: #fdecea; border-color: #c62828; }
.verdict-nothing { background: #eef3f8; border-color: #51667d; }
.verdict-evidence { background: #fff6e0; border-color: #b26a00; }
.callout { background: #fff8e1; border-left: 4px solid #f0a500; padding: 0.5rem 0.8rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.92rem; }
th, td { border: 1px solid #d8dde3; padding: 0.3rem 0.55rem; text-align: left;
         vertical-align: top; }
th { background: #f3f5f7; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { width: 14rem; }
table.kv table { margin: 0; }
.wide { overflow-x: auto; }
.bad { color: #b71c1c; font-weight: 600; }
.ok { color: #2e7d32; }
figure { margin: 1rem 0 1.5rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6ea; }
figcaption { font-size: 0.9rem; color: #3b4250; margin-top: 0.3rem; }
.nodata { border: 1px dashed #9aa3ad; color: #5a6270; padding: 1.2rem; text-align: center;
          background: #fafbfc; }
.notes { font-size: 0.85rem; color: #6b4f00; }
ul.warnings li { color: #6b4f00; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.86rem; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; }
footer { margin-top: 2.5rem; font-size: 0.85rem; color: #5a6270; }
@media print { .verdict { break-inside: avoid; } figure { break-inside: avoid; } }
"""


def render_html(report: ReportData) -> str:
    """The page of ``report`` (validated first: ValueError names a bad field)."""
    return render_page(ReportView(report))


def render_page(v: ReportView) -> str:
    """The whole page, sections in reading order (verdict first)."""
    d = v.d
    title = f"Privacy audit report: {v.r.verdict}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # nothing may be loaded from anywhere: only inline styles and data: images
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">",
        '<link rel="icon" href="data:,">',
        f"<title>{esc(title)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<header><h1>Differential-privacy audit report</h1>",
        f'<p class="meta">Created {esc(d["created_at"])} · dpaudit_torch '
        f'{esc(d["versions"].get("dpaudit_torch", "?"))} · report schema '
        f'<span data-field="schema_version">{esc(d["schema_version"])}</span></p></header>',
        verdict_section(v),
        bounds_section(v),
        checks_section(v),
        sequential_section(v),
        plots_section(v),
        strength_section(v),
        training_section(v),
        kv_section("Canaries", "canaries", d["canaries"],
                   "No canary information was recorded.", canaries_intro(v)),
        kv_section("Configuration", "configuration", config_shown(v),
                   "No configuration was recorded."),
        provenance_section(v),
        '<footer><p>Every ε in this report is a statistical lower bound, valid with the '
        "stated confidence over the audit's own randomness. The machine-readable record is "
        f"<code>{JSON_NAME}</code> next to this file (schema {esc(d['schema_version'])}, "
        "documented in docs/report.md of dpaudit_torch); a copy is embedded in this page."
        "</p></footer>",
        '<script type="application/json" id="audit-data">',
        # a JSON data block, never executed
        json_for_script(d),
        "</script>",
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"


def verdict_section(v: ReportView) -> str:
    """The verdict box: the verdict in plain words, the findings, the power sentence and what
    the verdict does and does not mean."""
    d, r = v.d, v.r
    claim = num(d["claimed_epsilon"], "claimed_epsilon")
    delta = num(d["delta"], "delta")
    alpha = num(d["alpha"], "alpha")
    if d["claim_refuted"]:
        css = "verdict-refuted"
        refuting = v.refuting()
        def level(m: str) -> str:  # each bound's own level (the white-box bound has its own)
            a = bound_alpha(v.detail(m), d["alpha"])
            if a == d["alpha"]:
                return f"{v.level_pct}% confidence, α = {alpha}"
            return (f"{num(100.0 * (1.0 - a))}% confidence, α = "
                    f"{num(a, f'lower_bound_details.{m}.alpha')}")

        which = (
            "; ".join(
                f"{esc(method_label(m))}: ε ≥ "
                f"{num(d['epsilon_lower_bounds'][m], f'epsilon_lower_bounds.{m}')} "
                f"({level(m)})"
                for m in refuting
            )
            or "see the table below"
        )
        text = (
            f"<p>The privacy claim is <strong>false</strong>. The training run claims ε = "
            f"{claim} at δ = {delta}, but the audit certified a larger ε for the whole run "
            f"({which}). The implementation or its accounting does not deliver the privacy "
            "it states.</p>"
        )
        promises = [family_promise(m) for m in refuting]
        if refuting and all(promises):  # only family bounds refute: say what they prove
            text += "".join(f"<p>{esc(method_label(m))}: {esc(p)}</p>"
                            for m, p in zip(refuting, promises) if p)
        if d["violation"]:  # the proof during training as well, with its deciding monitors
            text += violation_text(v)
    elif d["violation"]:
        css = "verdict-violation"
        text = violation_text(v)
    elif d.get("claim_inconsistent"):
        css = "verdict-violation"
        why = [f"<li>{esc(f.get('message', ''))}</li>" for f in d.get("findings", [])
               if f.get("level") == "inconsistent"]
        text = (
            f"<p>The claimed ε = {claim} (δ = {delta}) is <strong>inconsistent with the "
            "training that ran</strong>: what the optimizer, the model or the accountant "
            "really did contradicts what the claim assumes. This is a statement about what "
            "ran, not a lower bound on the true ε.</p>"
            + (f"<ul>{''.join(why)}</ul>" if why else "")
        )
    elif d.get("evidence"):
        css = "verdict-evidence"
        said = evidence_sentence(d.get("evidence_step"), d.get("alpha_warn"), False,
                                 d["stopped_early"], num)
        text = f'<p id="evidence">{said}</p>'
    elif any(f.get("level") == "finding" for f in d.get("findings", [])):
        css = "verdict-nothing"
        text = ("<p>No test rejected, but the audit made a finding that is not a statistical "
                "proof (below).</p>")
    else:
        css = "verdict-nothing"
        claim_part = (
            f"no audited lower bound exceeds the claimed ε = {claim} (δ = {delta})"
            if d["claimed_epsilon"] is not None
            else f"no claimed ε was recorded (δ = {delta}), so no claim could be refuted"
        )
        text = (
            f"<p>No test rejected: {claim_part}, and the sequential tests proved no "
            f"per-step violation at level α = {alpha}.</p>"
        )
    meaning = meaning_text(v)
    if no_steps_audited(d["training"]):
        text = f'<p id="no-steps"><strong>{esc(NO_STEPS_SENTENCE)}</strong></p>' + text
    return (
        f'<section id="verdict" class="verdict {css}">'
        f'<h2>Verdict: <span id="verdict-text" data-field="verdict">{esc(r.verdict)}</span>'
        f"</h2>{text}{findings_text(v)}{power_text(v)}{meaning}{levels_text(v)}</section>"
    )


def levels_text(v: ReportView) -> str:
    """The two levels of the report (schema 1.5): every proof at alpha in total, its split,
    and the evidence level; nothing for an older report."""
    d = v.d
    sentence = levels_sentence(d["alpha"], d.get("alpha_warn"), d.get("proof_levels") or {},
                               num)
    return f'<p id="levels">{sentence}</p>' if sentence else ""


def findings_text(v: ReportView) -> str:
    """Every finding of the monitors (what failed and where), as a list."""
    found = v.d.get("findings", [])
    # the deciding monitors' findings are written in the verdict itself
    shown = deciding_findings(found) if v.d["violation"] else []
    items = [f for f in found if f.get("level") != "note" and f not in shown]
    notes = [f for f in found if f.get("level") == "note"]
    if not items and not notes:
        return ""
    li = "".join(
        f'<li data-level="{esc(f.get("level"))}"><strong>{esc(f.get("level"))}</strong> '
        f'({esc(f.get("monitor"))}'
        + (f', {esc(f.get("where"))}' if f.get("where") else "")
        + f"): {esc(f.get('message'))}</li>" for f in items + notes)
    return f'<ul id="findings">{li}</ul>'


def training_section(v: ReportView) -> str:
    """The training as observed, each key under its readable label."""
    tr = v.d["training"]
    body = (labelled(tr, TRAINING_LABELS) if tr
            else "<p><em>No training information was recorded.</em></p>")
    return f'<section id="training"><h2>Training (as observed by the auditor)</h2>{body}</section>'


def canaries_intro(v: ReportView) -> str:
    """What ``k_pairs`` counts (the pairs of one step), beside the pairs fed over the run, and
    why the spread pairs cover fewer tensors than the configuration asked, where they do."""
    d = v.d
    sentence = pairs_sentence(d["canaries"], d["sequential"], d["training"], number=num)
    out = f"<p>Canary pairs: {sentence}</p>" if sentence else ""
    got, asked = d["canaries"].get("spread_tensors"), d["config"].get("spread_tensors")
    if (isinstance(got, int) and isinstance(asked, int) and got < asked
            and d["canaries"].get("spread_pairs")):
        out += (f'<p id="spread-tensors">Each spread pair covers {num(got)} tensors '
                f"(<code>spread_tensors</code> here), not the {num(asked)} the configuration "
                "asks for: every spread pair covers the same tensors' count, each needs two "
                "fresh coordinates per spread pair away from the other canaries, and this "
                "model has only that many tensors with room for them (or only that many "
                "tensors).</p>")
    return out


def power_text(v: ReportView) -> str:
    """One sentence on what the one-run audit could have found (the report's ``power``, from
    simulated runs of a correct implementation with the run's settings), or nothing."""
    sentence = power_sentence(v.d["power"], number=num, eps="ε", text=esc)
    return f'<p id="power">{sentence}</p>' if sentence else ""


def meaning_text(v: ReportView) -> str:
    """What the verdict means: a rejection is a proof at level alpha; "nothing found" is not a
    proof of privacy (with the largest epsilon the audit could have certified)."""
    d = v.d
    if d["claim_refuted"] or d["violation"]:
        extra = ""
        if d["violation"] and not d["claim_refuted"]:
            extra = (
                " The whole-run lower bounds below do not exceed the claim: the proof "
                "concerns what the claim rests on (the steps, the noise or the sampling that "
                "the accountant assumes; see the deciding monitors above)."
            )
        return (
            '<p class="callout">A rejection is a proof at the stated level: if the '
            "implementation were as private as claimed, the chance of seeing evidence this "
            f"strong is at most α = {num(d['alpha'])}.{extra}</p>"
        )
    best = v.best_ceiling()
    if best and "rho_lower" in v.detail(best[0]):  # the white-box bound: a family, no guesses
        ceiling = (
            f" The largest ε this audit could have certified for the whole run is "
            f"{num(best[1])} ({esc(method_label(best[0]))}, what a noise-free release "
            "gives, within the DP-SGD family its check verified).")
    else:
        ceiling = (
            f" The largest ε this audit could have certified for the whole run, whatever the "
            f"mechanism, is {num(best[1])} ({esc(method_label(best[0]))}), even "
            "with every guess right." if best else ""
        )
    return (
        '<p class="callout"><strong>"Nothing found" is not a proof of privacy.</strong> '
        "Every number in this report is a lower bound: an audit can show that a privacy "
        "claim is false, never that it is true. It means this audit, with its strength, "
        f"found no evidence against the claim.{ceiling} The true ε may lie anywhere "
        "between the lower bounds and the claim, or above the claim through a leak these "
        "tests cannot see (see the threat model below).</p>"
    )


def violation_text(v: ReportView) -> str:
    """The verdict of a proven violation: the step, the deciding monitor(s) and what each
    found (their violation findings), and what it means for the claim."""
    d = v.d
    step = d["violation_step"]
    at = f" at training step {num(step, 'violation_step')}" if step is not None else ""
    stop = " Training was stopped early." if d["stopped_early"] else " Training was not stopped."
    found = deciding_findings(d["findings"])
    if found:
        items = "".join(
            f'<li data-monitor="{esc(f.get("monitor"))}"><strong>'
            f'{esc(monitor_label(f.get("monitor"), d["monitor_labels"]))}</strong>'
            + (f" ({esc(f['where'])})" if f.get("where") else "")
            + f": {esc(f.get('message'))}</li>" for f in found)
        who = f'<p>Deciding monitor(s):</p><ul id="deciding-monitors">{items}</ul>'
    else:
        who = "<p>The deciding monitor was not recorded in this report.</p>"
    # a deciding finding about the per-step guarantee: say which per-step null it rejected
    null = f"<p>{v.per_step_null_text()}</p>" if decided_per_step(found) else ""
    level = decision_alpha(d["sequential"], d["alpha"])  # the decision's share of alpha
    at_level = (num(d["alpha"], "alpha") if level == d["alpha"] else
                f"{num(level)} (its share of α = {num(d['alpha'], 'alpha')})")
    return (
        f"<p>The audit proved{at}, at level α = {at_level} (an anytime-valid "
        "decision over every monitor's evidence), that the training is less private than the "
        f"accountant assumes.</p>{who}{null}<p>The claimed ε = "
        f"{num(d['claimed_epsilon'], 'claimed_epsilon')} (δ = {num(d['delta'], 'delta')}) is "
        f"computed from assumptions this proves false, so it cannot be trusted.{stop}</p>"
    )


def config_shown(v: ReportView) -> dict:
    """The configuration as recorded, with ``per_step_null`` written out as the null that was
    used (the recorded value is null when the default was used)."""
    cfg = dict(v.d["config"])
    used = v.per_step_null_words()
    if "per_step_null" in cfg and used is not None:
        default = " (the default: the optimizer's noise multiplier)" if (
            cfg["per_step_null"] is None) else ""
        cfg["per_step_null"] = used + default
    return cfg
