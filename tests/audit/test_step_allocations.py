"""A step allocates nothing of the canaries' size (docs/auditor.md, "Memory").

On the CPU the auditor reads every step into buffers it allocated before training (one pass:
compiled kernels, or their vectorised NumPy version in Python mode, the default for large
models, where that work also runs on a thread of its own), so that its per-step work leaves
the heap that training allocates from as training shapes it. A torch dispatch mode sees every
tensor the auditor's code allocates during audited steps (checks included); none may have as
many elements as the one-run canaries or the noise-audit coordinates, the counts that grow
with the model. The sequential testers (``dpaudit_torch/stats``) are not counted: their
per-check work arrays are temporaries sized by the pairs of a check and the tests' grids, not
by the model.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch
from conftest import make_private_setup
from torch.utils._python_dispatch import TorchDispatchMode

from dpaudit_torch.audit import PrivacyAuditor

M = 4096


def _storages(obj: Any) -> set[int]:
    items = obj if isinstance(obj, (tuple, list)) else [obj]
    out = set()
    for t in items:
        if isinstance(t, (tuple, list)):
            out |= _storages(t)
        elif isinstance(t, torch.Tensor):
            out.add(t.untyped_storage().data_ptr())
    return out


class _Allocations(TorchDispatchMode):
    """Records (op, numel, auditor frame) of every new tensor (no view or in-place result of an
    input) that an operation called from the auditor's own code returns (Opacus's code, which
    the auditor's wrappers call through ``errors.call_theirs``, is not the auditor's)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = _storages(list(args) + list((kwargs or {}).values()))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:
                frames = [f for f in traceback.extract_stack()
                          if "/dpaudit_torch/" in f.filename]
                if frames and not any(f.name == "call_theirs" for f in frames):
                    f = frames[-1]
                    self.seen.append((str(func), o.numel(),
                                      f"{f.filename.split('/dpaudit_torch/')[-1]}:{f.lineno}"))
        return out


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("compiled", [True, False])
def test_audited_steps_allocate_nothing_of_the_canaries_size(mode: str, compiled: bool) -> None:
    s = make_private_setup(mode=mode, d_in=64, hidden=128, n=512, seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, m_canaries=M, check_every=3,
                         compiled_kernels=compiled)
    assert aud.config.m_canaries == M
    batches = list(s.batches(9, batch=48))
    for x, y in batches[:3]:  # the first steps and check build what is built once
        s.step(x, y)
    # Python mode on the CPU: the auditor's part of each step runs on its host thread
    # (dpaudit_torch/_host_thread.py); a dispatch mode is per thread, so one watches each
    thread = aud.tap.host_thread
    assert (thread is None) == compiled
    spy, spy_host = _Allocations(), _Allocations()
    if thread is not None:
        thread.call(spy_host.__enter__)
    with spy:
        for x, y in batches[3:]:  # six audited steps, two checks
            s.step(x, y)
    if thread is not None:
        thread.call(lambda: spy_host.__exit__(None, None, None))
        assert spy_host.seen  # it saw the auditor's work there
    spy.seen += spy_host.seen
    assert aud.engine.step == 9 and aud.tap.reader.compiled_reads == 9
    u = aud.tap.reader._buffers().n_noise
    assert u >= 2048  # (so that the bound below means something)
    big = [a for a in spy.seen if a[1] >= min(M, u) and not a[2].startswith("stats/")]
    assert big == [], big[:5]
