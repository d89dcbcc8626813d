"""``dpaudit_torch.audit.record``: the step record, re-exported from the contract so that code
importing it from the engine's package keeps working."""

from __future__ import annotations

import torch

from dpaudit_torch import contract
from dpaudit_torch.audit import StepRecord as FromPackage
from dpaudit_torch.audit import record
from dpaudit_torch.audit.record import StepRecord


def test_re_exports_the_contract_record_itself() -> None:
    assert StepRecord is contract.StepRecord is FromPackage
    assert record.__all__ == ["StepRecord"]


def test_record_from_here_has_the_contract_properties() -> None:
    k, m, extra = 2, 3, 4
    vals = torch.arange(2 * k + m + extra, dtype=torch.float64)
    coins = torch.tensor([True, False])
    rec = StepRecord(step=1, values=vals, x=torch.stack([vals[0], vals[3]]),
                     y=torch.stack([vals[2], vals[1]]), coins=coins, sigma=0.8,
                     sigma_claimed=1.0, n_extra=extra)
    assert rec.k == k
    assert rec.one_run.tolist() == [4.0, 5.0, 6.0]
    assert isinstance(rec, contract.StepRecord)
    no_extra = StepRecord(step=1, values=vals, x=vals[:k], y=vals[k:2 * k], coins=coins,
                          sigma=0.8, sigma_claimed=1.0)
    assert no_extra.one_run.numel() == m + extra
