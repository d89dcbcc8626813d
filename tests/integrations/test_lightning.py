"""The Lightning callback: attach on train start, stop on a violation, save the report, detach.

A tiny LightningModule (8 -> 16 -> 2 MLP) that makes its optimizer private with Opacus in
``configure_optimizers`` (the pattern of Opacus's examples/mnist_lightning.py), trained on CPU
for a few steps with a Poisson-sampled loader.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as L  # noqa: N812 (the `lightning` extra, installed by `make test`)
import pytest
import pytorch_lightning as pl  # a dependency of `lightning`; opacus.lightning is built on it
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch import AuditReport
from dpaudit_torch.integrations.lightning import PrivacyAuditCallback
from dpaudit_torch.testing.bugs import apply_bug

ROOT = Path(__file__).resolve().parents[2]
# torch warns that Opacus's full backward hooks fire on a first layer whose input needs no grad
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook")

# small and fast: the auditor needs 2 * k_pairs + m_canaries <= 178 parameters of the MLP
AUDIT = {"k_pairs": 8, "m_canaries": 64, "seed": 0, "check_every": 5, "claimed_every": 1000}


class _TinyDPMixin:
    """The model; mixed into a LightningModule of either Lightning package."""

    def __init__(self, bug: str | None = None, sigma: float = 1.0,
                 fail_at_step: int | None = None, private: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.privacy_engine = PrivacyEngine(accountant="rdp")
        self.bug = bug
        self.sigma = sigma
        self.fail_at_step = fail_at_step
        self.private = private
        self.dp: dict[str, nn.Module] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        if self.fail_at_step is not None and self.trainer.global_step >= self.fail_at_step:
            raise RuntimeError("boom in training_step")
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.private:
            return optimizer
        self.trainer.fit_loop.setup_data()
        loader = self.trainer.train_dataloader
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dp_model, optimizer, _ = self.privacy_engine.make_private(
                module=self, optimizer=optimizer, data_loader=loader,
                noise_multiplier=self.sigma, max_grad_norm=1.0,
                poisson_sampling=isinstance(loader, DPDataLoader),
            )
        self.dp = {"model": dp_model}  # keep the GradSampleModule (not as a submodule)
        if self.bug is not None:
            apply_bug(optimizer, self.bug)
        return optimizer


class TinyDP(_TinyDPMixin, L.LightningModule):
    pass


def _loader(poisson: bool = True, n: int = 512, batch: int = 32) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
    return DPDataLoader.from_data_loader(loader, generator=g) if poisson else loader


def _trainer(root: Path, max_steps: int, callback: PrivacyAuditCallback) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1,
        enable_checkpointing=False, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(root),
        callbacks=[callback],
    )


def _is_wrapped(optimizer) -> bool:
    """Does a PrivacyAuditor still hold hooks in the optimizer (pre-hook or owner mark)?"""
    from dpaudit_torch.opacus_tap import OWNER_ATTR

    owner = getattr(optimizer, OWNER_ATTR, None)
    return bool(optimizer.original_optimizer._optimizer_step_pre_hooks) or owner is not None


# ------------------------------------------------------------------------------------------------


class _Probe(PrivacyAuditCallback):
    """Records, after every batch, whether the auditor's hooks are in the optimizer."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.wrapped: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.wrapped.append(_is_wrapped(trainer.optimizers[0]))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def test_report_saved_in_default_dir_and_auditor_detached(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cb = _Probe(delta=1e-5, **AUDIT)
    model = TinyDP()
    trainer = _trainer(tmp_path, 20, cb)
    trainer.fit(model, train_dataloaders=_loader())
    assert trainer.global_step == 20
    assert not trainer.should_stop
    out = tmp_path / "dpaudit"
    assert cb.report_dir == out
    assert (out / "audit.json").is_file() and (out / "report.html").is_file()
    loaded = AuditReport.load(out)
    assert loaded.to_dict() == cb.report.to_dict()
    assert loaded.training["steps"] == 20
    assert loaded.claimed_epsilon is not None and loaded.claimed_epsilon > 0
    assert loaded.verdict == "nothing found" and not loaded.violation
    assert cb.wrapped == [True] * 20  # attached during training ...
    assert cb.auditor is None and not _is_wrapped(trainer.optimizers[0])  # ... detached after


def test_violation_sets_should_stop_and_saves_report(tmp_path: Path, caplog) -> None:
    torch.manual_seed(0)
    out = tmp_path / "custom"
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=out, **AUDIT)
    trainer = _trainer(tmp_path, 200, cb)
    with caplog.at_level(logging.WARNING, logger="dpaudit_torch"):
        trainer.fit(TinyDP(bug="no-noise"), train_dataloaders=_loader())
    # without noise the canary pairs separate perfectly: the hockey-stick test bets on that and
    # crosses 1/alpha within a few steps of k_pairs = 8 pairs each (docs/statistics.md measures
    # about 29 pairs for "no noise" at sigma = 1); the decision is taken at the first check
    # (every 5 steps) after that
    assert trainer.should_stop
    assert trainer.global_step < 200
    report = cb.report
    assert report is not None and report.violation
    assert report.violation_step is not None and report.violation_step <= trainer.global_step
    assert report.verdict.startswith("violation proven") or report.verdict == "claim refuted"
    assert (out / "audit.json").is_file() and (out / "report.html").is_file()
    assert AuditReport.load(out).violation
    assert any("stopping training" in r.getMessage() for r in caplog.records)
    assert cb.auditor is None and not _is_wrapped(trainer.optimizers[0])


def test_verdict_and_report_path_logged_at_warning(tmp_path: Path, caplog) -> None:
    """Whatever the verdict, it is logged with the report's path at WARNING, the level Python
    shows when nothing configured logging (no caplog.at_level here: the default threshold)."""
    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=tmp_path / "r", **AUDIT)
    _trainer(tmp_path, 5, cb).fit(TinyDP(), train_dataloaders=_loader())
    assert cb.report is not None and cb.report.verdict == "nothing found"
    records = [r for r in caplog.records if r.getMessage().startswith("privacy audit: ")]
    assert records, [r.getMessage() for r in caplog.records]
    assert records[0].levelno == logging.WARNING
    assert "nothing found" in records[0].getMessage()
    assert str(tmp_path / "r" / "report.html") in records[0].getMessage()


def test_verdict_reaches_stderr_without_logging_configuration(tmp_path: Path) -> None:
    """A user's script that configures no logging still sees the verdict and the report's path
    on stderr (Python's last-resort handler, or whatever a library installed)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import torch\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        f"sys.path.insert(0, {str(ROOT / 'tests' / 'integrations')!r})\n"
        "import test_lightning as t\n"
        "torch.manual_seed(0)\n"
        f"cb = t.PrivacyAuditCallback(delta=1e-5, out_dir={str(tmp_path / 'r')!r}, **t.AUDIT)\n"
        f"t._trainer(Path({str(tmp_path)!r}), 5, cb).fit(t.TinyDP(), "
        "train_dataloaders=t._loader())\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [s for s in proc.stderr.splitlines() if "privacy audit: " in s]
    assert lines, proc.stderr[-4000:]
    assert "nothing found" in lines[-1]
    assert str(tmp_path / "r" / "report.html") in lines[-1]


def test_on_violation_raise_propagates_and_saves_report(tmp_path: Path) -> None:
    from dpaudit_torch import PrivacyViolationError

    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=tmp_path / "r", on_violation="raise", **AUDIT)
    trainer = _trainer(tmp_path, 200, cb)
    with pytest.raises(PrivacyViolationError):
        trainer.fit(TinyDP(bug="no-noise"), train_dataloaders=_loader())
    assert trainer.global_step < 200
    report = AuditReport.load(tmp_path / "r")
    assert report.violation and report.violation_step is not None
    assert any("PrivacyViolationError" in w for w in report.warnings)
    assert cb.auditor is None and not _is_wrapped(trainer.optimizers[0])


def test_exception_still_saves_report_and_detaches(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=tmp_path / "r", **AUDIT)
    trainer = _trainer(tmp_path, 50, cb)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        trainer.fit(TinyDP(fail_at_step=6), train_dataloaders=_loader())
    assert cb.auditor is None and not _is_wrapped(trainer.optimizers[0])
    report = AuditReport.load(tmp_path / "r")
    assert report.training["steps"] == 6
    assert any("did not end normally" in w and "boom" in w for w in report.warnings)


def test_out_dir_false_keeps_report_in_memory_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, log_metrics=False, **AUDIT)
    trainer = _trainer(tmp_path, 5, cb)
    trainer.fit(TinyDP(), train_dataloaders=_loader())
    assert cb.report is not None and cb.report_dir is None
    assert not (tmp_path / "dpaudit").exists()


def test_audit_metrics_reach_the_lightning_logger(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, **AUDIT)
    trainer = _trainer(tmp_path, 10, cb)
    trainer.fit(TinyDP(), train_dataloaders=_loader())
    logged = trainer.callback_metrics
    assert "dpaudit/combined_log_wealth" in logged
    assert "dpaudit/audited_steps" in logged and float(logged["dpaudit/audited_steps"]) == 10


def test_logged_claim_is_the_accountants_at_each_logging_step(tmp_path: Path) -> None:
    """With claimed_every=1000 the auditor reads the accountant at step 1 only; what the
    Trainer's logger writes every log_every_n_steps is still the accountant's claim at that
    step."""
    from lightning.pytorch.loggers import Logger

    class MemoryLogger(Logger):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, float]] = []

        @property
        def name(self) -> str:
            return "memory"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.rows.append(dict(metrics))

        def log_hyperparams(self, params: object, *args: object, **kwargs: object) -> None:
            pass

    torch.manual_seed(0)
    memory = MemoryLogger()
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, **AUDIT)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=20, max_epochs=-1, enable_checkpointing=False,
        logger=memory, log_every_n_steps=5, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
        callbacks=[cb])
    model = TinyDP()
    trainer.fit(model, train_dataloaders=_loader())
    accountant = model.privacy_engine.accountant
    (sigma, q), = {(s, q) for s, q, _ in accountant.history}

    def epsilon_after(steps: int) -> float:
        fresh = type(accountant)()
        fresh.history = [(sigma, q, steps)]
        return float(fresh.get_epsilon(delta=1e-5))

    claims = [(int(r["dpaudit/step"]), r["dpaudit/claimed_epsilon"]) for r in memory.rows
              if "dpaudit/claimed_epsilon" in r]
    assert [s for s, _ in claims] == [5, 10, 15, 20]
    # Lightning logs float32 values
    assert claims == [(s, pytest.approx(epsilon_after(s), rel=1e-6)) for s, _ in claims]
    assert len({e for _, e in claims}) == 4  # growing: not the step-1 read repeated
    # the accountant was read at step 1 and at the logging steps only, as the report records
    assert [s for s, _ in cb.report.training["claimed_epsilon_history"]] == [1, 5, 10, 15, 20]


def test_clear_errors_on_misconfiguration(tmp_path: Path) -> None:
    # no Poisson sampling: the audit needs the rate really used
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, **AUDIT)
    with pytest.raises(ValueError, match="not Poisson-sampled"):
        _trainer(tmp_path, 3, cb).fit(TinyDP(), train_dataloaders=_loader(poisson=False))
    # the optimizer was not made private
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, **AUDIT)
    with pytest.raises(ValueError, match="no Opacus DP optimizer"):
        _trainer(tmp_path, 3, cb).fit(TinyDP(private=False), train_dataloaders=_loader())
    # the engine lives under another attribute name
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=False, engine_attr="engine", **AUDIT)
    with pytest.raises(ValueError, match="no attribute 'engine'"):
        _trainer(tmp_path, 3, cb).fit(TinyDP(), train_dataloaders=_loader())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="delta"):
        PrivacyAuditCallback(delta=1.5)
    with pytest.raises(ValueError, match="delta"):
        PrivacyAuditCallback(delta=0.0)
    with pytest.raises(TypeError, match="out_dir"):
        PrivacyAuditCallback(out_dir=True)
    with pytest.raises(TypeError, match="out_dir"):
        PrivacyAuditCallback(out_dir=3)
    with pytest.raises(TypeError, match="engine_attr"):
        PrivacyAuditCallback(engine_attr="")


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def test_importing_dpaudit_torch_never_imports_lightning() -> None:
    code = (
        "import sys\n"
        "import dpaudit_torch\n"
        "from dpaudit_torch import PrivacyAuditor, AuditReport, SequentialMMDTest, "
        "HockeyStickTest, mechanisms\n"
        "import dpaudit_torch.integrations, dpaudit_torch.cli, dpaudit_torch.testing.bugs\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_missing_lightning_gives_install_hint() -> None:
    code = (
        "import sys\n"
        "for name in ('lightning', 'lightning.pytorch', 'lightning.pytorch.callbacks',\n"
        "             'pytorch_lightning', 'pytorch_lightning.callbacks'):\n"
        "    sys.modules[name] = None  # import of these now raises ImportError\n"
        "try:\n"
        "    import dpaudit_torch.integrations.lightning\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    print('imported')\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'dpaudit-torch[lightning]'" in proc.stdout, proc.stdout


def test_standalone_pytorch_lightning_with_opacus_datamodule(tmp_path: Path) -> None:
    """The standalone ``pytorch_lightning`` package and ``opacus.lightning.DPLightningDataModule``
    (which is built on it) work too: the Trainer calls the callback's hooks by name."""
    from opacus.lightning import DPLightningDataModule

    class Data(pl.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return _loader(poisson=False)

    class TinyPL(_TinyDPMixin, pl.LightningModule):
        pass

    torch.manual_seed(0)
    cb = PrivacyAuditCallback(delta=1e-5, out_dir=tmp_path / "pl", **AUDIT)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=10, max_epochs=-1, enable_checkpointing=False,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=str(tmp_path), callbacks=[cb],
    )
    trainer.fit(TinyPL(), datamodule=DPLightningDataModule(Data()))
    assert isinstance(trainer.train_dataloader, DPDataLoader)
    assert AuditReport.load(tmp_path / "pl").training["steps"] == 10
    assert cb.auditor is None and not _is_wrapped(trainer.optimizers[0])
