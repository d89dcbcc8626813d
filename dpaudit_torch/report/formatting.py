"""How the report writes numbers, scopes and its recurring sentences in words: one place, so that
the HTML page, the plain-text summary and the tests agree.

Shared by both renderers: a function whose words hold numbers takes a ``number`` writer (the page
passes one that tags each number with its field, :func:`dpaudit_torch.report.markup.num`) and a
``text`` writer for recorded strings (the page escapes them); the defaults write plain text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

from ..registry import ONE_STEP, WHOLE_RUN, bound_method
from .schema import is_num

__all__ = ["format_number", "scope_text", "power_sentence", "pairs_sentence", "bound_alpha",
           "NO_STEPS_SENTENCE", "levels_sentence", "evidence_sentence", "decision_alpha"]

#: what the report says when the auditor saw no training step
NO_STEPS_SENTENCE = ("No training step was audited (finalize() was called after 0 audited "
                     "steps), so this report holds no evidence about the run.")



def bound_alpha(details: dict[str, Any], alpha: float) -> float:
    """The level a bound was computed at: its own ``alpha`` in its details where it records one
    in (0, 1) (the white-box bound has its own), else the audit's ``alpha``."""
    own = details.get("alpha")
    if is_num(own) and 0.0 < own < 1.0:
        return float(own)
    return alpha


def decision_alpha(sequential: dict[str, Any], alpha: float) -> float:
    """The level of the sequential decision's proof: exp(-threshold) of the proof threshold it
    recorded (``sequential.decision_threshold_log``: its share of alpha, schema 1.5), else
    ``alpha`` (a report without it)."""
    t = sequential.get("decision_threshold_log")
    if is_num(t) and math.isfinite(t) and t > 0:
        return math.exp(-float(t))
    return alpha


def levels_sentence(alpha: float, alpha_warn: Any, proof_levels: dict[str, Any],
                    number: Callable[[Any, str], str] | None = None) -> str | None:
    """The two levels in words (schema 1.5; None for a report without ``proof_levels``): every
    proof at ``alpha`` in total, split among its paths (the union bound), and evidence at
    ``alpha_warn``, which is not a proof."""
    if not proof_levels:
        return None
    num = number or (lambda v, _field: format_number(v))
    parts = ", ".join(f"{k.replace('_', ' ')} {num(v, f'proof_levels.{k}')}"
                      for k, v in proof_levels.items())
    total = sum(float(v) for v in proof_levels.values() if is_num(v))
    union = ("" if math.isclose(total, alpha, rel_tol=1e-9)
             else f" (these add up to {format_number(total)}: a checkpoint of an earlier "
                  f"release, each path at its own level)")
    warn = ("" if alpha_warn is None else
            f" Evidence of a violation is reported at alpha_warn = "
            f"{num(alpha_warn, 'alpha_warn')}; evidence is not a proof.")
    return (f"Levels: every proof (violation proven, claim refuted, claim inconsistent) at "
            f"alpha = {num(alpha, 'alpha')} in total, split among its paths ({parts}; a correct "
            f"run gets any false proof with probability at most their sum){union}.{warn}")


def evidence_sentence(step: Any, alpha_warn: Any, violation: bool, stopped: bool,
                      number: Callable[[Any, str], str] | None = None) -> str:
    """What evidence of a violation means, where there is evidence and no proof."""
    num = number or (lambda v, _field: format_number(v))
    at = "" if step is None else f" at training step {num(step, 'evidence_step')}"
    lvl = "" if alpha_warn is None else f" at level alpha_warn = {num(alpha_warn, 'alpha_warn')}"
    stop = (" Training was stopped on it (stop_on='evidence')." if stopped and not violation
            else " It stops nothing by itself.")
    return (f"Evidence of a per-step privacy violation{at}{lvl} (the decision's e-process "
            f"reached 1/alpha_warn; a correct run shows this with probability at most "
            f"alpha_warn). It is not a proof: the proof's threshold was not reached.{stop}")


_SCOPE_NAMES = {WHOLE_RUN: "whole training run", ONE_STEP: "one training step"}


def format_number(value: Any) -> str:
    """The one way the report writes a number (HTML, summary text); tests compare against it.

    ``None`` -> ``"n/a"``; booleans -> ``"yes"``/``"no"``; integers as is; floats with 4
    significant digits (``inf`` -> ``"∞"``, ``nan`` -> ``"NaN"``).
    """
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        return f"{v:.4g}"
    return str(value)


def scope_text(method: str, article: bool = False, with_family: bool = False) -> str | None:
    """What the bound of ``method`` speaks about, as the report writes it: "whole training run"
    (``article``: "the whole training run") or "one training step"; ``with_family`` appends the
    trade-off family a bound assumes (", Gaussian family"). None for a method this version does
    not know (a report from a newer writer)."""
    spec = bound_method(method)
    if spec is None:
        return None
    text = _SCOPE_NAMES.get(spec.scope, spec.scope)
    if spec.scope == WHOLE_RUN and article:
        text = "the " + text
    if with_family and not spec.family_free and spec.family:
        text += f", {spec.family} family"
    return text


#: how the power sentence names a one-run method (the registry's label for any other)
_SHORT_METHOD = {"whitebox": "white-box", "steinke": "Steinke", "fdp": "f-DP"}


def power_sentence(power: dict[str, Any], number: Callable[[Any, str], str] | None = None,
                   eps: str = "epsilon", text: Callable[[str], str] = str) -> str | None:
    """One sentence saying what the audit could have found, from the report's ``power`` object
    (schema 1.1; :func:`dpaudit_torch.stats.one_run_power.one_run_power`), or None when no power
    was computed.  ``number(value, field_path)`` writes a number (default: :func:`format_number`;
    the HTML page tags it), ``text`` writes the recorded note (the page escapes it), ``eps``
    names epsilon ("ε" on the page)."""
    if not power:
        return None

    def fmt(value: Any, path: str) -> str:
        return number(value, path) if number is not None else format_number(value)

    note = power.get("note")
    if power.get("no_power"):
        why = f" ({text(note)})" if isinstance(note, str) and note else ""
        return f"The one-run audit had no power to detect a leak{why}."
    expected = power.get("expected_bound")
    if not is_num(expected):
        return None
    method = power.get("method")
    spec = bound_method(method) if isinstance(method, str) else None
    label = _SHORT_METHOD.get(str(method), spec.label if spec is not None else "one-run")
    n = power.get("replicates")
    if power.get("mode") == "law":  # the white-box bound: from the exact law, no simulation
        how = "the median of its exact law"
    else:
        runs = f"median of {fmt(n, 'power.replicates')}" if is_num(n) else "median of"
        how = f"{runs} simulated runs"
    first = (
        f"A correct implementation with this run's settings would give a {label} bound of "
        f"about {fmt(expected, 'power.expected_bound')} ({how})"
    )
    c, rel = power.get("c"), power.get("release_epsilon")
    if is_num(c) and c < 1.0 and is_num(rel):  # per-layer clipping: the reached contribution
        first += (
            f", for canaries that contribute {fmt(c, 'power.c')} of the clipping norm C "
            f"(per-layer clipping), whose own release has {eps} "
            f"{fmt(rel, 'power.release_epsilon')}"
        )
    mre, tp = power.get("min_refutable_epsilon"), power.get("target_power")
    if is_num(mre):
        pct = format_number(100.0 * tp) if is_num(tp) else "n/a"
        return (
            f"{first}; this audit refutes a true {eps} of "
            f"{fmt(mre, 'power.min_refutable_epsilon')} or more with probability {pct}%."
        )
    if isinstance(note, str) and "cannot refute" in note:
        return (
            f"{first}; this audit cannot refute the claim with this many canaries and steps, "
            f"even for a true {eps} far above it."
        )
    return first + "."


def pairs_sentence(canaries: dict[str, Any], sequential: dict[str, Any],
                   training: dict[str, Any],
                   number: Callable[[Any, str], str] | None = None) -> str | None:
    """What the report's two pair counts count: the canary pairs of every step (``k_pairs``,
    e.g. 16) and the pairs fed to each sequential test over the whole run (its ``n_pairs``,
    e.g. 4800 = 16 x 300 audited steps), or None when the report has no ``k_pairs``.
    ``number(value, field_path)`` writes a number (default :func:`format_number`)."""
    k = canaries.get("k_pairs")
    if not is_num(k):
        return None

    def fmt(value: Any, path: str) -> str:
        return number(value, path) if number is not None else format_number(value)

    out = f"{fmt(k, 'canaries.k_pairs')} canary pairs per step (k_pairs)"
    tests = sequential.get("tests") if isinstance(sequential.get("tests"), dict) else {}
    fed = {name: t["n_pairs"] for name, t in tests.items()
           if isinstance(t, dict) and is_num(t.get("n_pairs"))}
    if fed:
        name = max(fed, key=lambda n: fed[n])
        n = fed[name]
        out += (f"; each sequential test was fed "
                f"{fmt(n, f'sequential.tests.{name}.n_pairs')} pairs over the run")
        key = "audited_steps" if is_num(training.get("audited_steps")) else "steps"
        steps = training.get(key)
        if is_num(steps) and steps * k == n:
            out += f" ({fmt(steps, f'training.{key}')} audited steps x {format_number(k)})"
    return out + "."
