"""The canaries clipped as one concatenated shadow tensor (Opacus's own joint-norm clipping
only) give the same sums as one shadow tensor per real tensor; any other clipping code keeps
the per-tensor shadow."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup
from opacus.optimizers import DPOptimizer

from dpaudit_torch.audit import PrivacyAuditor
from dpaudit_torch.opacus_tap.plan import joint_norm_clipping
from dpaudit_torch.testing.bugs import apply_bug


def _twin(joint: bool, compiled_add: bool, host_rows: bool = True) -> tuple[torch.Tensor, ...]:
    s = make_private_setup(seed=3)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=2, k_pairs=8, m_canaries=96,
                         check_every=3)
    inj = aud.tap.injector
    clipper = inj.shadow
    clipper.joint_shadow, clipper.compiled_add = joint, compiled_add
    clipper.host_rows = host_rows
    assert clipper.joint() == joint
    projections = []
    for x, y in s.batches(7, batch=24):
        s.step(x, y)
        projections.append(aud.tap.reader.last_values.clone())
    assert bool(inj.compiled_adds) == compiled_add
    return (torch.stack(projections), aud.monitors["one_run"].scores["llr"].clone(),
            torch.tensor(aud.combined_log_wealth),
            *[p.detach().clone() for p in s.model.parameters()])


@pytest.mark.parametrize("compiled_add", [True, False])
def test_joint_shadow_gives_the_per_tensor_sums(compiled_add):
    """Twin runs (same model, data, noise, auditor seed): the joint shadow and the per-tensor
    shadow give the same projections, one-run scores, wealth and trained parameters, up to the
    rounding of one norm taken over the concatenation instead of per tensor."""
    a, b = _twin(True, compiled_add), _twin(False, compiled_add)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-6, atol=1e-6)


class _OwnClip(DPOptimizer):
    def clip_and_accumulate(self) -> None:
        super().clip_and_accumulate()


class _OwnFlat(DPOptimizer):
    def _get_flat_grad_sample(self, p: torch.Tensor) -> torch.Tensor:
        return super()._get_flat_grad_sample(p)


class _OwnSamples(DPOptimizer):
    @property
    def grad_samples(self) -> list[torch.Tensor]:
        return list(super().grad_samples)


class _OwnGroups(DPOptimizer):
    @property
    def param_groups(self) -> list[dict]:
        return self.original_optimizer.param_groups


def test_joint_only_for_opacus_own_joint_norm_clipping(monkeypatch):
    s = make_private_setup()
    assert joint_norm_clipping(s.optimizer)
    for cls in (_OwnClip, _OwnFlat, _OwnSamples, _OwnGroups):
        s.optimizer.__class__ = cls
        assert not joint_norm_clipping(s.optimizer), cls
    s.optimizer.__class__ = DPOptimizer
    # a class-level patch of Opacus's method is not Opacus's code
    monkeypatch.setattr(DPOptimizer, "clip_and_accumulate",
                        lambda self: _OwnClip.clip_and_accumulate(self))
    assert not joint_norm_clipping(s.optimizer)
    monkeypatch.undo()
    assert joint_norm_clipping(s.optimizer)
    for clipping, norm in (("per_layer", [1.0] * 4), ("adaptive", 1.0)):
        kw = ({"target_unclipped_quantile": 0.5, "clipbound_learning_rate": 0.2,
               "max_clipbound": 10.0, "min_clipbound": 0.1, "unclipped_num_std": 1.0}
              if clipping == "adaptive" else {})
        o = make_private_setup(clipping=clipping, max_grad_norm=norm, **kw).optimizer
        assert not joint_norm_clipping(o), clipping
    assert not joint_norm_clipping(make_private_setup(mode="ghost").optimizer)


def test_per_tensor_clipping_bug_keeps_the_per_tensor_shadow():
    """A clipping implementation that is not Opacus's (here the bug that clips every tensor to C
    separately) is run on one shadow tensor per real tensor, where its behaviour shows."""
    s = make_private_setup()
    apply_bug(s.optimizer, "per-tensor-clipping")
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=0, m_canaries=64)
    assert not aud.tap.injector.shadow.joint()
    s.train(2)
    assert aud.step == 2


def test_rows_written_by_torch_equal_rows_written_by_numpy():
    """The rows buffer is written through its NumPy view on the CPU and by ``index_copy_``
    elsewhere (accelerators, dtypes NumPy lacks): forcing the latter on a twin run
    (``host_rows`` off) gives the same run exactly, for the joint and the per-tensor shadow."""
    for j in (True, False):
        for u, v in zip(_twin(j, True), _twin(j, True, host_rows=False)):
            assert torch.equal(u, v)
