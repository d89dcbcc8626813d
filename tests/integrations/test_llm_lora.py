"""examples/llm_lora_dp.py: DP fine-tuning of a GPT-2-style LM with LoRA under the Trainer callback.

The example's ``main`` runs in this process (transformers and peft are imported once for the
file) with a small data set and short sequences; the model keeps the example's 4 blocks, so the
DP optimizer holds the 32 LoRA tensors and the 52 frozen base tensors are watched. Also the
ghost-clipping finding the example documents: with the per-sequence criterion ``make_private``
returns, ghost clipping gives the hooks mode's clipped sum; with the model's own scalar loss it
clips nothing.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from dpaudit_torch import AuditReport  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook",
                                        "ignore:Secure RNG turned off",
                                        "ignore:.*is_gradient_checkpointing:FutureWarning")
#: the test's size: 512 sequences of 16 tokens (the example's defaults: 2048 of 32)
SMALL = ["--n", "512", "--seq-len", "16"]
N_LORA, N_BASE = 32, 52  # 4 blocks x 4 projections x (A, B); embeddings, norms, base weights


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_llm_lora_dp",
                                                  ROOT / "examples" / "llm_lora_dp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _coverage_says_no_base_weight_moved(report: AuditReport) -> None:
    cov = report.audits["coverage"]
    assert cov["run"] and cov["watched"]  # the Trainer's model reached the auditor
    assert cov["held_tensors"] == N_LORA and cov["trainable_tensors"] == N_LORA
    assert cov["uncovered"] == [] and cov["held_not_in_model"] == 0
    assert cov["watched_tensors"] == N_LORA + N_BASE  # the frozen base weights included
    assert cov["changed_outside_release"] == [] and not cov["any_changed"]
    assert cov["unaudited_updates"] == 0


def test_correct_run_nothing_found_no_base_weight_moved(tmp_path: Path, capsys) -> None:
    rc = _example().main(["--steps", "8", *SMALL, "--out", str(tmp_path / "ok")])
    assert rc == 0
    report = AuditReport.load(tmp_path / "ok" / "dpaudit")
    assert report.training["steps"] == 8 and report.training["grad_sample_mode"] == "per-sample"
    assert report.verdict == "nothing found"  # fixed seeds; a false alarm has prob. <= alpha
    assert not report.violation and not report.claim_refuted and not report.claim_inconsistent
    _coverage_says_no_base_weight_moved(report)
    out = capsys.readouterr().out
    assert (f"coverage: {N_LORA} LoRA tensors held by the DP optimizer ({N_LORA} trainable), "
            f"{N_LORA + N_BASE} tensors watched at every step; frozen base weights moved: 0 of "
            f"{N_BASE}") in out


def test_no_noise_bug_is_proven_by_step_10(tmp_path: Path) -> None:
    rc = _example().main(["--steps", "40", *SMALL, "--bug", "no-noise",
                          "--out", str(tmp_path / "bug")])
    assert rc == 3
    report = AuditReport.load(tmp_path / "bug" / "dpaudit")
    assert report.violation and report.violation_step is not None
    assert report.violation_step <= 10 and report.training["steps"] <= 10  # stopped there
    _coverage_says_no_base_weight_moved(report)


def test_ghost_clipping_needs_the_per_sequence_loss() -> None:
    """One batch without noise, clipping bound 1e-3: under ghost clipping the per-sequence
    criterion gives the hooks mode's clipped sum; the model's own ``labels=`` loss (a scalar)
    gives one backward pass and an unclipped sum, far above batch x C."""
    ex = _example()
    data = ex.token_dataset(64, 16)
    batch, c = data.ids[:8], 1e-3
    sums = {}
    for mode, loss_kind in (("hooks", "criterion"), ("ghost", "criterion"), ("ghost", "model")):
        model = ex.build_model(n_layer=2)
        _, dp_model, opt, _, criterion = ex.make_private_lora(
            model, data, batch_size=8, grad_sample_mode=mode, noise_multiplier=0.0,
            max_grad_norm=c)
        opt.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if loss_kind == "criterion":
                loss = ex.causal_lm_loss(dp_model(input_ids=batch).logits, batch, criterion)
            else:
                loss = dp_model(input_ids=batch, labels=batch).loss
            loss.backward()
        opt.pre_step()
        sums[mode, loss_kind] = torch.cat([p.summed_grad.flatten() for p in opt.params])
    assert float(sums["hooks", "criterion"].norm()) <= 8 * c
    torch.testing.assert_close(sums["ghost", "criterion"], sums["hooks", "criterion"])
    assert float(sums["ghost", "model"].norm()) > 10 * 8 * c  # nothing was clipped
