"""testing.op_count, and the cost it pins: the auditor's added top-level dispatcher operations
per step stay within 100 + 2 per watched tensor on a model of over 100 tensors, on the CPU's
path and on the accelerator's (docs/auditor.md, "Cost")."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.testing.host_sync import force_device_path
from dpaudit_torch.testing.op_count import added_ops_per_step, layer_stack, top_level_ops

BLOCKS = 25  # 102 parameter tensors
CHECK_EVERY = 5  # the default: the budget is per step averaged over whole check intervals


def test_top_level_ops_counts_what_the_caller_dispatches() -> None:
    a, b = torch.ones(3), torch.ones(3)
    got = top_level_ops(lambda: (a + b, torch.stack([a, b]).sum(), a.numpy()))
    # numpy() dispatches four operations of its own; a composite counts once, not its parts
    assert got["aten::add"] == 1 and got["aten::stack"] == 1 and got["aten::sum"] == 1
    assert got["aten::detach"] == 1 and got["aten::resolve_conj"] == 1
    assert "aten::cat" not in got  # (stack's own cat is nested in it)


def test_layer_stack_has_four_tensors_a_block_and_a_head() -> None:
    assert len(list(layer_stack(40).parameters())) == 162
    assert len(list(layer_stack(BLOCKS).parameters())) == 4 * BLOCKS + 2


def _twin(mode: str, device_path: bool) -> Callable[[bool], Callable[[int], None]]:
    def run(audited: bool) -> Callable[[int], None]:
        from opacus import PrivacyEngine

        torch.manual_seed(0)
        model = layer_stack(BLOCKS)
        g = torch.Generator().manual_seed(1)
        X, Y = torch.randn(512, 16, generator=g), torch.randint(0, 10, (512,), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        dl = DataLoader(TensorDataset(X, Y), batch_size=32,
                        generator=torch.Generator().manual_seed(2))
        engine, crit = PrivacyEngine(accountant="rdp"), nn.CrossEntropyLoss()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = engine.make_private(module=model, optimizer=opt, data_loader=dl,
                                      noise_multiplier=1.0, max_grad_norm=1.0,
                                      grad_sample_mode=mode, criterion=crit,
                                      noise_generator=torch.Generator().manual_seed(3))
        model, opt, *rest = out
        crit, dl = (rest[0], rest[1]) if mode == "ghost" else (crit, rest[0])
        if audited:
            aud = PrivacyAuditor(engine, opt, dl, delta=1e-5, model=model, seed=0,
                                 check_every=CHECK_EVERY)
            if device_path:
                force_device_path(aud)
        it = iter(dl)

        def train(n: int) -> None:
            nonlocal it
            for _ in range(n):
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(dl)
                    x, y = next(it)
                opt.zero_grad()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    crit(model(x), y).backward()
                opt.step()

        return train

    return run


@pytest.mark.parametrize("mode,device_path", [("hooks", False), ("hooks", True),
                                              ("ghost", False), ("ghost", True)])
def test_the_added_operations_per_step_do_not_grow_with_the_tensors(mode: str,
                                                                    device_path: bool) -> None:
    """The budget of docs/auditor.md "Cost": 100 + 2 per watched tensor (parameters and
    buffers: 102 here, no buffers), averaged over two whole check intervals."""
    got = added_ops_per_step(_twin(mode, device_path), steps=2 * CHECK_EVERY,
                             warmup=10)  # past the first steps' one-time work (8 steps)
    watched = 4 * BLOCKS + 2
    assert got.per_step <= 100 + 2 * watched, got.top()
