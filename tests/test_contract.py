"""The contract between a framework adapter and the audit engine (dpaudit_torch/contract.py):
facts (typed requests compared by name), their answers or the reason they are unavailable, the
step record's views, and the module's ground-floor imports."""

from __future__ import annotations

import pytest
import torch
from conftest import loads_in_fresh_process

from dpaudit_torch import contract
from dpaudit_torch.contract import (
    ACCOUNTANT_HISTORY,
    FACTS,
    MODEL,
    N_RECORDS,
    SAMPLE_RATE,
    Fact,
    FactUnavailable,
    StaticFacts,
    StepRecord,
)


def _module_facts() -> dict[str, Fact]:
    """Every module-level Fact of the contract, by its attribute name."""
    return {n: v for n, v in vars(contract).items() if isinstance(v, Fact)}


# ------------------------------------------------------------------ Fact
def test_facts_compare_and_hash_by_name() -> None:
    same = Fact("sample_rate", "another wording of the meaning")
    assert same == SAMPLE_RATE and hash(same) == hash(SAMPLE_RATE)
    assert Fact("n_records", SAMPLE_RATE.meaning) != SAMPLE_RATE
    assert {SAMPLE_RATE: 1}[same] == 1  # usable as a mapping key by name


def test_fact_repr_names_it_only() -> None:
    assert repr(SAMPLE_RATE) == "Fact('sample_rate')"
    assert repr(Fact("x y", "z")) == "Fact('x y')"
    assert SAMPLE_RATE.meaning not in repr(SAMPLE_RATE)


def test_fact_is_frozen() -> None:
    with pytest.raises(AttributeError):
        SAMPLE_RATE.name = "other"  # type: ignore[misc]


def test_facts_registry_has_every_fact_once() -> None:
    defined = _module_facts()
    assert len(defined) == len(FACTS)
    assert set(FACTS.values()) == set(defined.values())
    # keyed by the fact's own name, which is unique
    assert all(f.name == name for name, f in FACTS.items())
    assert sorted(FACTS) == sorted(f.name for f in defined.values())
    # each attribute is the upper-case of its name, and is exported
    for attr, f in defined.items():
        assert attr == f.name.upper() and attr in contract.__all__
        assert f.meaning and isinstance(f.meaning, str)


# ------------------------------------------------------------------ answers
def test_static_facts_answer_the_given_values() -> None:
    values = {SAMPLE_RATE: 0.25, N_RECORDS: 1000}
    src = StaticFacts(values)
    values[MODEL] = "added later"  # the mapping is copied at construction
    assert src.answer(SAMPLE_RATE) == 0.25 and src.answer(N_RECORDS) == 1000
    assert src.answer(Fact("sample_rate", "anything")) == 0.25
    with pytest.raises(FactUnavailable):
        src.answer(MODEL)


def test_unavailable_fact_carries_the_fact_and_the_reason() -> None:
    with pytest.raises(FactUnavailable) as info:
        StaticFacts().answer(ACCOUNTANT_HISTORY)
    e = info.value
    assert e.fact is ACCOUNTANT_HISTORY
    assert e.reason == f"{ACCOUNTANT_HISTORY.meaning}: not given to this audit"
    assert str(e) == e.reason
    assert isinstance(e, LookupError)  # callers may catch it as a lookup failure
    with pytest.raises(FactUnavailable, match="the model being trained: no adapter here"):
        StaticFacts(None, reason="no adapter here").answer(MODEL)


def test_fact_unavailable_built_directly() -> None:
    e = FactUnavailable(N_RECORDS, "the loader has no length")
    assert (e.fact, e.reason, e.args) == (N_RECORDS, "the loader has no length",
                                          ("the loader has no length",))


def test_static_facts_satisfy_the_source_protocol() -> None:
    def read(src: contract.FactSource) -> float:
        return src.answer(SAMPLE_RATE)

    assert read(StaticFacts({SAMPLE_RATE: 0.5})) == 0.5


# ------------------------------------------------------------------ StepRecord
def _record(k: int, m: int, n_extra: int = 0) -> StepRecord:
    vals = torch.arange(2 * k + m + n_extra, dtype=torch.float64)
    return StepRecord(step=3, values=vals, x=vals[:k].clone(), y=vals[k:2 * k].clone(),
                      coins=torch.ones(k, dtype=torch.bool), sigma=1.0, sigma_claimed=1.0,
                      n_extra=n_extra)


def test_step_record_k_and_one_run_view() -> None:
    rec = _record(k=3, m=5)
    assert rec.k == 3
    assert rec.one_run.tolist() == [6.0, 7.0, 8.0, 9.0, 10.0]
    # a view of the values, not a copy
    assert rec.one_run.data_ptr() == rec.values[6:].data_ptr()
    rec.values[6] = -1.0
    assert rec.one_run[0] == -1.0


def test_step_record_one_run_leaves_out_the_spread_extras() -> None:
    rec = _record(k=2, m=4, n_extra=3)
    assert rec.values.shape[0] == 11
    assert rec.one_run.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert _record(k=2, m=0, n_extra=3).one_run.numel() == 0
    assert _record(k=0, m=4).one_run.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_step_record_defaults() -> None:
    rec = _record(k=1, m=1)
    assert rec.finite is True and rec.real_sums is None and rec.n_real is None
    assert rec.micro_steps == 1 and rec.noise is None and rec.noise_raw is None
    assert rec.release_raw is None and rec.noise_std == 0.0 and rec.noise_sumsq is None
    assert rec.n_extra == 0 and rec.host is None


# ------------------------------------------------------------------ the ground floor
def test_contract_imports_neither_opacus_nor_the_engine() -> None:
    assert not loads_in_fresh_process("import dpaudit_torch.contract", "opacus")
    assert not loads_in_fresh_process("import dpaudit_torch.contract", "dpaudit_torch.audit")
