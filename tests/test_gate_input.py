"""Hostile and broken audit files (dpaudit_torch/gate_input.py, issue 38 part 8): the gate
reads files that a CI job, a person or an attacker may have written. Each refusal is exit 2 with
one line naming the problem; none is an internal error; nothing passes with a non-finite number
among the verdict's inputs. The fuzz test mutates a real ``audit.json`` (tests/data/
gate_30_steps.json, a 30-step audit of this release, tests/data/make_gate_power.py)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaudit_torch import gate_input
from dpaudit_torch.cli import main
from dpaudit_torch.gate import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS, GateInputError, read_audit

DATA = Path(__file__).resolve().parent / "data"
REAL_TEXT = (DATA / "gate_30_steps.json").read_text(encoding="utf-8")
REAL = json.loads(REAL_TEXT)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _gate_itself(path: Path) -> tuple[int, str, str]:
    """The document gated against itself, the page written beside it."""
    return _run("gate", str(path), "--baseline", str(path), "--html",
                str(path.parent / "gate.html"))


def _refused(result: tuple[int, str, str], *needles: str) -> str:
    code, _, err = result
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == EXIT_BAD_INPUT and len(lines) == 1, (code, err)
    assert lines[0].startswith("dpaudit: error:") and "internal error" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _write(tmp_path: Path, doc: Any, name: str = "audit.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc), encoding="utf-8")  # allow_nan: NaN, Infinity as JSON tokens
    return p


def test_the_real_document_passes_against_itself(tmp_path: Path) -> None:
    code, out, err = _gate_itself(_write(tmp_path, REAL))
    assert code == EXIT_PASS and out.splitlines()[-1].startswith("PASS"), err


def test_the_issues_nan_claim_and_infinite_bound_are_refused(tmp_path: Path) -> None:
    """Issue 38: this document, gated against itself, passed ('no bound exceeds the claimed
    epsilon NaN'). It lacks every other field; with them, the NaN claim is named."""
    text = ('{"schema_version": "1.4", "claimed_epsilon": NaN, '
            '"epsilon_lower_bounds": {"steinke": Infinity}}')
    p = tmp_path / "audit.json"
    p.write_text(text, encoding="utf-8")
    line = _refused(_gate_itself(p), "is not a complete audit report", "lower_bound_details")
    assert "created_at" in line
    for value, key in ((math.nan, "claimed_epsilon is nan"),
                       (math.inf, "claimed_epsilon is inf"),
                       ("NaN", "claimed_epsilon is nan")):  # the schema's string encoding too
        doc = copy.deepcopy(REAL)
        doc["claimed_epsilon"] = doc["power"]["claimed_epsilon"] = value
        _refused(_gate_itself(_write(tmp_path, doc)), "non-finite number", key)
    doc = copy.deepcopy(REAL)
    doc["epsilon_lower_bounds"]["fdp"] = "Infinity"  # may not refute: would pass with a warning
    doc["lower_bound_details"]["fdp"]["bound"] = math.inf
    _refused(_gate_itself(_write(tmp_path, doc)), "epsilon_lower_bounds.fdp is inf")
    doc = copy.deepcopy(REAL)
    doc["power"]["min_refutable_epsilon"] = math.nan  # an input of the strength order
    _refused(_gate_itself(_write(tmp_path, doc)), "power.min_refutable_epsilon is nan")
    doc = copy.deepcopy(REAL)
    doc["canaries"]["m_one_run"] = doc["config"]["m_canaries"] = math.nan
    _refused(_gate_itself(_write(tmp_path, doc)), "canaries.m_one_run is nan")


def test_deep_nesting_huge_numbers_and_huge_files_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")  # issue: RecursionError
    _refused(_gate_itself(p), "nested too deeply")
    nested: list[Any] = []
    for _ in range(70):  # parsed by json, but deeper than any report
        nested = [nested]
    p.write_text(json.dumps({**REAL, "config": {**REAL["config"], "x": nested}}),
                 encoding="utf-8")
    _refused(_gate_itself(p), "nested too deeply (more than 64 levels)")
    doc = copy.deepcopy(REAL)
    doc["training"]["audited_steps"] = 10 ** 400  # a float would overflow
    _refused(_gate_itself(_write(tmp_path, doc)), "training.audited_steps", "too large")
    p = tmp_path / "digits.json"
    p.write_text(REAL_TEXT.replace('"k_pairs": 8', '"k_pairs": ' + "9" * 5000, 1),
                 encoding="utf-8")
    _refused(_gate_itself(p), "not valid JSON")
    monkeypatch.setattr(gate_input, "MAX_BYTES", 1000)
    _refused(_gate_itself(_write(tmp_path, REAL, "big.json")), "is larger than")
    monkeypatch.undo()
    _refused(_run("gate", "/dev/zero", "--first-release"), "not a regular file")


def test_missing_fields_are_refused_and_older_versions_need_only_theirs(
        tmp_path: Path) -> None:
    for key in ("claimed_epsilon", "epsilon_lower_bounds", "power", "fingerprint", "training"):
        doc = {k: v for k, v in REAL.items() if k != key}
        _refused(_gate_itself(_write(tmp_path, doc)), "not a complete audit report", key)
    # a 1.3 document has no fingerprint field: complete without it (tests/data/report_v1_3.json)
    assert read_audit(DATA / "report_v1_3.json").written_schema == "1.3"
    with pytest.raises(GateInputError, match="not a complete audit report.*monitor_labels"):
        old = json.loads((DATA / "report_v1_3.json").read_text(encoding="utf-8"))
        del old["monitor_labels"]
        read_audit(_write(tmp_path, old))


# ---------------------------------------------------------------- fuzzing the loader
def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (the first 3 items of each list only)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(REAL)
#: the paths of the verdict's inputs, named here independently of the code under test
VERDICT_PATHS = [p for p in PATHS if p[0] in ("claimed_epsilon", "epsilon_lower_bounds")
                 or p[:2] in (("power", "expected_bound"), ("power", "min_refutable_epsilon"),
                              ("power", "claimed_epsilon"), ("training", "audited_steps"))]
ODD = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, "NaN", "Infinity", "-Infinity", None, True,
                     0, -1, 10 ** 30, 1e308, "", "x" * 300, [], {}, [[[[]]]], {"a": {"b": 1}},
                     "1.4", "2.0"]),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.text(max_size=20))


@st.composite
def _mutation(draw: st.DrawFn) -> tuple[str, Any]:
    doc = copy.deepcopy(REAL)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(VERDICT_PATHS if draw(st.booleans()) else PATHS))
        parent: Any = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            op = draw(st.sampled_from(["set", "set", "delete"]))
            if op == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(ODD)
        except (KeyError, IndexError, TypeError):  # an earlier mutation removed the way
            continue
    text = json.dumps(doc)
    if draw(st.integers(0, 9)) == 0:  # now and then, damage the text itself
        cut = draw(st.integers(0, len(text) - 1))
        text = text[:cut] + draw(st.sampled_from(["", "}", "NaN", "\x00", "[" * 100]))
    return text, doc


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(_mutation())
def test_fuzz_every_mutation_validates_or_is_refused(tmp_path: Path,
                                                     mutated: tuple[str, Any]) -> None:
    text, doc = mutated
    p = tmp_path / "audit.json"
    p.write_text(text, encoding="utf-8")
    code, out, err = _gate_itself(p)
    assert "internal error" not in err and "Traceback" not in err, err
    assert code in (EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT), (code, err)
    if code == EXIT_BAD_INPUT and err:
        _refused((code, out, err))
    if code == EXIT_PASS:
        parsed = json.loads(text)
        for path in VERDICT_PATHS:
            value: Any = parsed
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
                value = float(value.replace("Infinity", "inf"))
            assert not (isinstance(value, float) and not math.isfinite(value)), (path, value)
