"""The Hugging Face Trainer callback: attach at train begin, stop on a violation, save the report.

A tiny BERT classifier built from a ``BertConfig`` (random weights, nothing downloaded), its
embeddings frozen (Opacus computes no per-sample gradient for BERT's position embeddings), made
private with Opacus and trained by a ``Trainer`` subclass on the Poisson-sampled loader of
``make_private``, on CPU, on synthetic tokens.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

from dpaudit_torch import AuditReport, PrivacyViolationError
from dpaudit_torch.integrations.transformers import PrivacyAuditCallback, find_dp_optimizer
from dpaudit_torch.testing.bugs import apply_bug

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook",
                                        "ignore:Secure RNG turned off")

N, LENGTH, VOCAB, BATCH = 256, 8, 64, 32
AUDIT: dict[str, Any] = {"seed": 0, "claimed_every": 1000}


class _Tokens(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(4, VOCAB, (N, LENGTH), generator=g)
        self.labels = self.ids[:, 0] % 2

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


def _setup(bug: str | None = None, poisson: bool = True) -> tuple[Any, Any, Any, Any]:
    """(engine, GradSampleModule, DP optimizer, loader) of the tiny BERT classifier."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    model.bert.embeddings.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, dp_optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=DataLoader(_Tokens(), batch_size=BATCH),
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=poisson,
            noise_generator=torch.Generator().manual_seed(1))
    if bug is not None:
        apply_bug(dp_optimizer, bug)
    return engine, dp_model, dp_optimizer, loader


def _trainer(tmp_path: Path, steps: int, callback: Any, model: Any, optimizer: Any,
             loader: Any, accumulation: int = 1) -> Trainer:
    class DPTrainer(Trainer):
        def get_train_dataloader(self) -> DataLoader:
            return loader

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulation, max_grad_norm=0.0,
        lr_scheduler_type="constant", logging_steps=5, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, seed=0)
    return DPTrainer(model=model, args=args, optimizers=(optimizer, None), callbacks=[callback])


def _epsilon_after(engine: Any, steps: int, delta: float = 1e-5) -> float:
    """The epsilon of the engine's accountant class after ``steps`` steps of its (one) noise
    multiplier and sample rate: what the accountant said at that step."""
    (sigma, q, _), = {(s, q, 0) for s, q, _ in engine.accountant.history}
    fresh = type(engine.accountant)()
    fresh.history = [(sigma, q, steps)]
    return float(fresh.get_epsilon(delta=delta))


def _is_wrapped(optimizer: Any) -> bool:
    from dpaudit_torch.opacus_tap import OWNER_ATTR

    owner = getattr(optimizer, OWNER_ATTR, None)
    return bool(optimizer.original_optimizer._optimizer_step_pre_hooks) or owner is not None


# ------------------------------------------------------------------------------------------------


def test_correct_run_nothing_found_report_saved_and_detached(tmp_path: Path, caplog) -> None:
    engine, model, optimizer, loader = _setup()
    cb = PrivacyAuditCallback(engine, delta=1e-5, **AUDIT)
    trainer = _trainer(tmp_path, 20, cb, model, optimizer, loader)
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch"):
        trainer.train()
    assert trainer.state.global_step == 20
    out = tmp_path / "out" / "dpaudit"
    assert cb.report_dir == out
    report = AuditReport.load(out)
    assert report.to_dict() == cb.report.to_dict()
    assert report.training["steps"] == 20
    assert report.claimed_epsilon is not None and report.claimed_epsilon > 0
    # a correct run: nothing found (a false alarm has probability <= alpha; the seeds are fixed)
    assert report.verdict == "nothing found"
    assert not report.violation and not report.claim_refuted and not report.claim_inconsistent
    assert cb.auditor is None and not _is_wrapped(optimizer)
    # the verdict and the report's path, at WARNING (visible without logging configuration)
    msgs = [r for r in caplog.records if "privacy audit: nothing found" in r.getMessage()]
    assert msgs and msgs[0].levelno == logging.WARNING
    assert str(out / "report.html") in msgs[0].getMessage()
    # the audit metrics reach the Trainer's log history
    logged = [h for h in trainer.state.log_history if "dpaudit/audited_steps" in h]
    assert logged and logged[-1]["dpaudit/audited_steps"] == 20
    # the claim logged at each logging step is the accountant's at that step, although the
    # auditor itself reads the accountant only at step 1 (claimed_every=1000)
    claims = [(int(h["dpaudit/step"]), h["dpaudit/claimed_epsilon"]) for h in logged]
    assert [s for s, _ in claims] == [5, 10, 15, 20, 20]  # the last: the end-of-run summary
    assert claims == [(s, _epsilon_after(engine, s)) for s, _ in claims]
    assert len({e for _, e in claims}) == 4  # growing: not the step-1 read repeated


def test_no_noise_bug_stops_training_within_10_steps(tmp_path: Path, caplog) -> None:
    engine, model, optimizer, loader = _setup(bug="no-noise")
    cb = PrivacyAuditCallback(engine, delta=1e-5, out_dir=tmp_path / "r", **AUDIT)
    trainer = _trainer(tmp_path, 200, cb, model, optimizer, loader)
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch"):
        trainer.train()
    # without noise the canary pairs and the noise-audit coordinates separate at once; the
    # decision is taken at the first check (check_every = 5 steps) after the crossing
    assert trainer.state.global_step <= 10
    report = cb.report
    assert report is not None and report.violation
    assert report.violation_step is not None and report.violation_step <= 10
    assert report.verdict.startswith("violation proven") or report.verdict == "claim refuted"
    assert AuditReport.load(tmp_path / "r").violation
    assert any("stopping training" in r.getMessage() for r in caplog.records)
    assert any(r.levelno == logging.WARNING and str(tmp_path / "r") in r.getMessage()
               for r in caplog.records)
    assert cb.auditor is None and not _is_wrapped(optimizer)


def test_on_violation_raise_then_close_saves_the_report(tmp_path: Path) -> None:
    engine, model, optimizer, loader = _setup(bug="no-noise")
    cb = PrivacyAuditCallback(engine, delta=1e-5, out_dir=tmp_path / "r", on_violation="raise",
                              **AUDIT)
    trainer = _trainer(tmp_path, 200, cb, model, optimizer, loader)
    try:
        with pytest.raises(PrivacyViolationError):
            trainer.train()
    finally:
        report = cb.close()
    assert trainer.state.global_step < 10
    assert report is not None and report.violation
    assert any("did not end normally" in w for w in report.warnings)
    assert AuditReport.load(tmp_path / "r").violation
    assert cb.auditor is None and not _is_wrapped(optimizer)
    assert cb.close() is report  # idempotent


def test_gradient_accumulation_is_refused_before_the_first_step(tmp_path: Path) -> None:
    """k loader batches per release while the accountant counts one step at the loader's rate:
    refused at train begin, with the remedy, before any step or attachment."""
    engine, model, optimizer, loader = _setup()
    before = [p.detach().clone() for p in optimizer.params]
    cb = PrivacyAuditCallback(engine, delta=1e-5, out_dir=False, **AUDIT)
    trainer = _trainer(tmp_path, 20, cb, model, optimizer, loader, accumulation=4)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4.*BatchMemoryManager"):
        trainer.train()
    assert cb.auditor is None and not _is_wrapped(optimizer)
    assert all(torch.equal(a, p) for a, p in zip(before, optimizer.params))
    assert engine.accountant.history == []


def test_clear_errors_on_misconfiguration(tmp_path: Path) -> None:
    # a loader that is not Poisson-sampled
    engine, model, optimizer, loader = _setup(poisson=False)
    cb = PrivacyAuditCallback(engine, delta=1e-5, out_dir=False, **AUDIT)
    with pytest.raises(ValueError, match="not Poisson-sampled"):
        _trainer(tmp_path, 3, cb, model, optimizer, loader).train()
    # an optimizer that was not made private
    engine, model, optimizer, loader = _setup()
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    cb = PrivacyAuditCallback(engine, delta=1e-5, out_dir=False, **AUDIT)
    with pytest.raises(ValueError, match="not an Opacus DP optimizer"):
        _trainer(tmp_path, 3, cb, model, plain, loader).train()
    with pytest.raises(ValueError, match="SGD"):
        find_dp_optimizer(plain)
    assert find_dp_optimizer(optimizer) is optimizer


def test_bad_arguments() -> None:
    engine = PrivacyEngine()
    with pytest.raises(TypeError, match="PrivacyEngine"):
        PrivacyAuditCallback(object())
    with pytest.raises(ValueError, match="delta"):
        PrivacyAuditCallback(engine, delta=1.5)
    with pytest.raises(TypeError, match="out_dir"):
        PrivacyAuditCallback(engine, out_dir=True)
    with pytest.raises(TypeError, match="out_dir"):
        PrivacyAuditCallback(engine, out_dir=3)
    with pytest.raises(TypeError, match="log_metrics"):
        PrivacyAuditCallback(engine, log_metrics="yes")
    with pytest.raises(ValueError):  # an AuditConfig setting, validated at construction
        PrivacyAuditCallback(engine, alpha=2.0)


def _python(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_importing_dpaudit_torch_never_imports_transformers(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import dpaudit_torch, dpaudit_torch.integrations, dpaudit_torch.cli\n"
        "from dpaudit_torch import PrivacyAuditor, AuditReport\n"
        "bad = sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in ('transformers', 'accelerate'))\n"
        "assert not bad, bad\n"
        "sys.modules['transformers'] = None  # now an import of it raises ImportError\n"
        "try:\n"
        "    import dpaudit_torch.integrations.transformers\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    proc = _python(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'dpaudit-torch[transformers]'" in proc.stdout, proc.stdout


def test_example_runs_offline_and_prints_the_verdict_without_logging_config(
        tmp_path: Path) -> None:
    """The example, as a user runs it (no logging configured): the verdict and the report's path
    reach stderr through the callback's WARNING record."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    out = tmp_path / "ex"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transformers_dp_finetune.py"),
         "--steps", "12", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "dpaudit" / "audit.json").is_file()
    assert (out / "dpaudit" / "report.html").is_file()
    assert "Verdict:" in proc.stdout
    line = [s for s in proc.stderr.splitlines() if "privacy audit: " in s]
    assert line and str(out / "dpaudit" / "report.html") in line[-1], proc.stderr[-4000:]
