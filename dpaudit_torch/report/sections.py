"""Sections of the report page after the bounds table: the sequential tests, the plots, the
threat model and audit strength, and the provenance (seed policy, versions, warnings).

The sequential tests by betting are those of González, Dulce-Rubio, Ramdas & Ribero (NeurIPS 2025)
and the event-based hockey-stick test (docs/design.md sections 1-3); their decision compares the
combined log-wealth with log(1/alpha) (Ville's inequality). The testers' names come from
:mod:`dpaudit_torch.registry`.
"""

from __future__ import annotations

import json

from . import plots
from .formatting import pairs_sentence
from .labels import INTERFERENCE_LABELS, labelled
from .markup import esc, generic, method_label, num, scalar, tester_label
from .schema import is_num
from .view import ReportView

__all__ = ["sequential_section", "plots_section", "strength_section", "provenance_section"]


def sequential_section(v: ReportView) -> str:
    """Per-step null, decision rule and one row per sequential tester."""
    seq = v.d["sequential"]
    tests = seq.get("tests") or {}
    if not tests and not seq:
        return (
            '<section id="sequential"><h2>Sequential tests</h2>'
            "<p><em>No sequential test was run.</em></p></section>"
        )
    rows = []
    for name, s in tests.items():
        s = s if isinstance(s, dict) else {}
        eps = s.get("epsilons")
        grid = len(eps) if isinstance(eps, list) else None
        rows.append(
            f"<tr><td>{esc(tester_label(name))}</td>"
            f"<td>{scalar(s.get('rejected'))}</td>"
            f"<td class=\"n\">{scalar(s.get('rejected_at'))}</td>"
            f"<td class=\"n\">{scalar(s.get('n_pairs'))}</td>"
            f"<td class=\"n\">{scalar(s.get('combined_log_wealth'))}</td>"
            f"<td class=\"n\">{num(grid)}</td>"
            f"<td class=\"n\">{scalar(s.get('epsilon_lower_bound'))}</td></tr>"
        )
    table = (
        "<table id=\"sequential-table\"><thead><tr><th>Test</th><th>Rejected</th>"
        "<th class=\"n\">Rejected after (pairs fed)</th>"
        "<th class=\"n\">Pairs fed over the run</th>"
        "<th class=\"n\">Log-wealth</th><th class=\"n\">Grid points</th>"
        "<th class=\"n\">Per-step ε lower bound</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>" if rows else ""
    )
    comb = seq.get("combined_log_wealth")
    decision = (
        f"<p>Decision: the combined log-wealth "
        f"{num(comb, 'sequential.combined_log_wealth') if is_num(comb) else num(None)} "
        f"is compared with log(1/α) = "
        f"{num(v.threshold_log())}; the tests reject when it is reached (Ville's "
        "inequality bounds the chance that a true null ever gets there by α, however long "
        "training runs).</p>"
    )
    crossed, every = seq.get("crossed_at_step"), seq.get("check_every")
    vstep = v.d["violation_step"]
    if is_num(crossed) and vstep is not None and crossed != vstep:
        cadence = (
            f" (the decision is checked every {num(every)} steps)" if is_num(every) else ""
        )
        decision += (
            f"<p>The combined log-wealth first reached the threshold at step "
            f"{num(crossed)}; the violation was declared at step {num(vstep)}"
            f"{cadence}.</p>"
        )
    others = {k: val for k, val in seq.items()
              if k not in ("tests", "combined_log_wealth", "decision_threshold_log",
                           "per_step_null", "tester_placement")}
    extra = (
        f"<details><summary>Other sequential settings</summary>{generic(others)}</details>"
        if others else ""
    )
    full = "".join(
        f"<details><summary>Full summary: {esc(name)}</summary>{generic(s)}</details>"
        for name, s in tests.items()
    )
    pairs = pairs_sentence(v.d["canaries"], seq, v.d["training"], number=num)
    counts = f'<p id="pair-counts">Canary pairs: {pairs}</p>' if pairs and rows else ""
    return (
        '<section id="sequential"><h2>Sequential tests (during training)</h2>'
        f"<p>{v.per_step_null_text()}</p>{decision}{table}{counts}"
        f"{_placement(seq.get('tester_placement'))}{extra}{full}</section>"
    )


def _placement(p: object) -> str:
    """Where the sequential testers ran (``sequential.tester_placement``), in one sentence;
    nothing for a report that does not record it."""
    if not isinstance(p, dict) or not isinstance(p.get("device"), str):
        return ""
    how = {"host": "on the host, fed the check's one copy of the pairs",
           "device": "on the audit's device, fed its tensors"}.get(str(p.get("placement")), "")
    setting = p.get("setting")
    reason = p.get("reason")
    return (f'<p id="tester-placement">The sequential tests ran on <code>{esc(p["device"])}'
            f"</code>{' (' + esc(how) + ')' if how else ''}; setting "
            f"<code>tester_placement={esc(repr(setting))}</code>"
            f"{': ' + esc(str(reason)) if reason else ''}.</p>")


def plots_section(v: ReportView) -> str:
    """The three inline plots (or, in place of each, one sentence saying why there is nothing
    to plot)."""
    d = v.d
    wh = d["wealth_history"]
    # the per-step bound's grid (docs/design.md section 4): its largest epsilon is the ceiling
    det = next((v.detail(m) for m in v.methods() if v.one_step(m)), {})
    crossed = d["sequential"].get("crossed_at_step")
    grid = det.get("grid_epsilons")
    grid_max = (
        float(max(grid)) if isinstance(grid, list) and grid and all(is_num(g) for g in grid)
        else None
    )
    figs = [
        ("plot-wealth", plots.plot_log_wealth(wh, v.threshold_log(), d["violation_step"],
                                              crossed if is_num(crossed) else None,
                                              d["monitor_labels"]),
         "Log-wealth over training steps: one line per monitor that bets in the decision, "
         "the decision itself (black: the log of the average of the monitors' e-values) and "
         "each sequential test of the canary pairs (dashed). The audit proves a violation "
         "when the decision's line reaches the dashed line log(1/α); under a true null it "
         "stays below it with probability at least 1 − α."),
        ("plot-epsilon", plots.plot_epsilon_lower_bound(wh, grid_max, d["violation_step"]),
         "Sequential ε lower bound for ONE training step (anytime form: once a grid point "
         "is rejected it stays rejected). It is not a bound on the whole run's ε."),
        ("plot-scores", plots.plot_score_histograms(d["one_run_scores"]),
         "One-run audit: scores of the canaries that were secretly inserted (IN) and of "
         "those that were not (OUT). The more the two separate, the more the training run "
         "reveals about single examples."),
    ]
    out = ['<section id="plots"><h2>Plots</h2>']
    for anchor, plot, caption in figs:
        notes = (
            f'<div class="notes">{"; ".join(esc(n) for n in plot.notes)}</div>'
            if plot.notes else ""
        )
        if plot.png is None:  # one sentence saying why there is nothing to plot
            out.append(f'<figure id="{anchor}"><div class="nodata">{esc(plot.reason)}</div>'
                       f"{notes}</figure>")
            continue
        body = (
            f'<img src="data:image/png;base64,{plot.png}" '
            f'alt="{esc(caption.split(".")[0])}">'
        )
        drawn = (f'<p class="notes" data-part="legend">Lines: {esc("; ".join(plot.legend))}.'
                 f'</p>' if plot.legend else "")
        out.append(
            f'<figure id="{anchor}" data-xticks="{esc(json.dumps(plot.xticks))}">{body}'
            f"<figcaption>{esc(caption)}</figcaption>{drawn}{notes}</figure>"
        )
    out.append("</section>")
    return "".join(out)


def strength_section(v: ReportView) -> str:
    """What the auditor observes, and how strong this audit could be (canaries, ceilings)."""
    d = v.d
    tm = d["threat_model"]
    can = d["canaries"]

    def flag(key: str, yes: str, no: str) -> str:
        val = tm.get(key)
        if val is None:
            return "not recorded"
        return esc(yes) if val else f'<span class="bad">{esc(no)}</span>'

    rows = [
        ("White-box (gradients observed)", flag(
            "white_box", "yes: the auditor reads the privatised gradient of every step",
            "no: only the final model is observed")),
        ("Every step observed", flag(
            "every_step_observed", "yes", "no: some steps were not observed")),
        ("Clipping exercised", flag(
            "clipping_exercised", "yes: the canaries go through the library's own clipping",
            "no: the canaries bypass the clipping code, so a clipping bug is invisible to "
            "them")),
    ]
    table = "".join(f"<tr><th>{esc(k)}</th><td>{cell}</td></tr>" for k, cell in rows)
    other_tm = {k: val for k, val in tm.items()
                if k not in ("white_box", "every_step_observed", "clipping_exercised",
                             "notes")}
    if other_tm:
        table += "".join(
            f"<tr><th>{esc(k)}</th><td>{generic(val)}</td></tr>" for k, val in other_tm.items()
        )
    tm_notes = tm.get("notes") or []
    notes = (
        "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in tm_notes) + "</ul>" if tm_notes else ""
    )
    strength = []
    if can:
        strength.append(
            f"<li>{num(can.get('k_pairs'))} canary pairs feed the sequential tests and "
            f"{num(can.get('m_one_run'))} canaries the one-run audit (design "
            f"{esc(can.get('design', 'n/a'))}, canary norm {num(can.get('norm_multiplier'))}"
            " × clipping norm).</li>"
        )
        lay = can.get("layers")
        if isinstance(lay, dict) and is_num(lay.get("contribution")):
            # per-layer clipping: what the layered one-run canaries reach (docs/design.md 5)
            strength.append(
                f"<li>Per-layer clipping: each one-run canary spans {num(lay.get('width'))} "
                f"parameter tensor(s) and contributes {num(lay['contribution'])} of the "
                f"clipping norm C ({num(can.get('one_run_coordinates'))} coordinates); the "
                "power statement is computed for that contribution, while a ceiling (a "
                "noise-free release) does not depend on it.</li>"
            )
    for m in v.methods():
        c = v.ceiling(m)
        if c is not None:
            strength.append(
                f"<li>{esc(method_label(m))}: ceiling ε = {num(c)}"
                f"{' (per step)' if v.one_step(m) else ''}.</li>"
            )
    inter = d["interference"]
    inter_html = (
        "<h3>Interference from real data</h3><p>Spread of the real-data gradient at the "
        "canary coordinates, in units of the clipping norm C. Interference costs power "
        "(weaker bounds), not validity.</p>" + labelled(inter, INTERFERENCE_LABELS)
        if inter else ""
    )
    power = d["power"]
    for w in power.get("warnings") or []:
        strength.append(f'<li class="notes">{esc(w)}</li>')
    strength_html = (
        "<h3>Strength of this audit</h3><ul>" + "".join(strength) + "</ul>"
        if strength else ""
    )
    power_html = (
        "<details><summary>Power of the one-run audit (simulated runs of a correct "
        f"implementation with this run's settings)</summary>{generic(power)}</details>"
        if power else ""
    )
    return (
        '<section id="threat-model"><h2>Threat model and audit strength</h2>'
        "<p>The auditor inserts data-independent canary gradients before clipping and "
        "reads the privatised gradient at their coordinates. It tests the privacy of what "
        "it observes; leaks it does not observe (e.g. through data-dependent choices "
        "outside the optimizer step) are out of its sight.</p>"
        f'<table class="kv">{table}</table>{notes}{strength_html}{power_html}{inter_html}'
        "</section>"
    )


def provenance_section(v: ReportView) -> str:
    """Seed policy, library versions and warnings."""
    d = v.d
    seed = d["seed_policy"] or "not recorded"
    versions = generic(d["versions"]) if d["versions"] else "<em>not recorded</em>"
    warns = d["warnings"]
    warn_html = (
        '<ul class="warnings">' + "".join(f"<li>{esc(w)}</li>" for w in warns) + "</ul>"
        if warns else "<p>None.</p>"
    )
    return (
        '<section id="provenance"><h2>Seed policy, versions, warnings</h2>'
        f'<h3>Seed policy</h3><p id="seed-policy">{esc(seed)}</p>'
        f"<h3>Library versions</h3>{versions}"
        f'<h3>Warnings</h3><div id="warnings">{warn_html}</div></section>'
    )
