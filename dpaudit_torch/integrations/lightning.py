"""PyTorch Lightning integration: :class:`PrivacyAuditCallback`.

For a ``LightningModule`` that makes its optimizer private with Opacus in
``configure_optimizers`` (the pattern of Opacus's ``examples/mnist_lightning.py``, usually with the
training data wrapped by ``opacus.lightning.DPLightningDataModule`` for Poisson sampling)::

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = ...
            self.privacy_engine = PrivacyEngine()

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            self.trainer.fit_loop.setup_data()
            loader = self.trainer.train_dataloader
            _, optimizer, _ = self.privacy_engine.make_private(
                module=self, optimizer=optimizer, data_loader=loader,
                noise_multiplier=1.0, max_grad_norm=1.0,
                poisson_sampling=isinstance(loader, DPDataLoader))
            return optimizer

    trainer = L.Trainer(callbacks=[PrivacyAuditCallback(delta=1e-5)], ...)
    trainer.fit(Model(), datamodule=DPLightningDataModule(my_datamodule))

The callback attaches a :class:`~dpaudit_torch.audit.PrivacyAuditor` when training starts, stops
training (``trainer.should_stop``) when the sequential audit proves a violation, and at the end of
training (also when training is interrupted by an exception) finalizes the audit, saves the report
(``audit.json`` + ``report.html``), logs the verdict and the report's path at WARNING on rank zero
(visible without any logging configuration) and detaches the auditor. The audit itself --
canaries in the per-sample gradients before Opacus clips them, the anytime-valid sequential tests
of Gonzalez et al. (2025) and Kutta et al. (2026), the one-run bounds of Steinke, Nasr and
Jagielski (2023) and Mahloujifar, Melis and Chaudhuri (2025) -- is the auditor's; this module only
wires it to the Trainer.

Lightning is an optional extra (``pip install 'dpaudit-torch[lightning]'``); ``import
dpaudit_torch`` never imports it. Both the ``lightning`` package (``lightning.pytorch``) and the
standalone ``pytorch_lightning`` package work: the Trainer calls callback hooks by name.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - exercised in a subprocess test
    try:
        from pytorch_lightning.callbacks import Callback as _Callback
    except ImportError:
        raise ImportError(
            "dpaudit_torch.integrations.lightning needs PyTorch Lightning, which is not "
            "installed: pip install 'dpaudit-torch[lightning]'"
        ) from None

from .._validation import check_alpha
from ..audit.config import AuditConfig
from ._claim import current_claim

if TYPE_CHECKING:  # pragma: no cover
    from ..audit import PrivacyAuditor
    from ..report import AuditReport

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditCallback"]

#: name of the report directory under ``trainer.default_root_dir`` when ``out_dir`` is None
DEFAULT_SUBDIR = "dpaudit"


class PrivacyAuditCallback(_Callback):
    """Audit the differential privacy of a Lightning training run while it trains.

    Args:
        delta: the delta of the privacy claim being audited (the claimed epsilon is read from the
            engine's accountant at this delta), in (0, 1).
        out_dir: where the report is saved; default ``<trainer.default_root_dir>/dpaudit``.
            ``False`` disables saving (the report is still available as :attr:`report`).
        engine_attr: name of the attribute of the LightningModule that holds the Opacus
            ``PrivacyEngine`` (default ``"privacy_engine"``, as in Opacus's Lightning example).
        log_metrics: log the auditor's latest numeric metrics with ``pl_module.log`` (prefix
            ``dpaudit/``) after each training batch, so they reach the Trainer's loggers; the
            claimed epsilon is the accountant's at the steps where the loggers write (every
            ``log_every_n_steps``), not only every ``claimed_every`` steps as the auditor reads
            it.
        **auditor_kwargs: settings of :class:`~dpaudit_torch.audit.AuditConfig`, validated here
            (a bad one raises at construction, before training starts), ``on_step`` and
            ``on_evidence``;
            passed to :class:`~dpaudit_torch.audit.PrivacyAuditor` (``alpha``,
            ``k_pairs``, ``m_canaries``, ``seed``, ``on_violation``, ``check_every``, ...).

    Attributes:
        report: the :class:`~dpaudit_torch.report.AuditReport` of the last finished training
            run, or None.
        report_dir: the directory the report was saved to, or None.
        auditor: the attached :class:`~dpaudit_torch.audit.PrivacyAuditor` while training runs.

    Which data loader is audited: the training loader the Trainer really iterates
    (``trainer.train_dataloader``), not the one ``make_private`` returned (which Lightning does not
    use); its sample rate is the one really used, whatever the accountant was told. Wrap the data
    with ``opacus.lightning.DPLightningDataModule`` so that it is Poisson-sampled, as the
    accountant assumes (the callback raises a ValueError saying so when it is not).
    """

    def __init__(
        self,
        delta: float = 1e-5,
        out_dir: str | os.PathLike[str] | None | bool = None,
        engine_attr: str = "privacy_engine",
        *,
        log_metrics: bool = True,
        **auditor_kwargs: Any,
    ) -> None:
        super().__init__()
        self.delta = check_alpha(delta, "delta")  # the open interval (0, 1)
        if out_dir is True:
            raise TypeError("out_dir must be a path, None (default location) or False (no saving)")
        if out_dir is not None and out_dir is not False and not isinstance(
            out_dir, (str, os.PathLike)
        ):
            raise TypeError(f"out_dir must be a path, None or False, got {out_dir!r}")
        self.out_dir = out_dir
        if not isinstance(engine_attr, str) or not engine_attr:
            raise TypeError(f"engine_attr must be a non-empty attribute name, got {engine_attr!r}")
        self.engine_attr = engine_attr
        if not isinstance(log_metrics, bool):
            raise TypeError(f"log_metrics must be a bool, got {log_metrics!r}")
        self.log_metrics = log_metrics
        kwargs = dict(auditor_kwargs)
        self._on_step = kwargs.pop("on_step", None)
        self._on_evidence = kwargs.pop("on_evidence", None)
        #: the audit's settings (validated once, here)
        self.config = AuditConfig.from_kwargs(kwargs.pop("config", None), delta=self.delta,
                                              **kwargs)
        self.auditor: PrivacyAuditor | None = None
        self.report: AuditReport | None = None
        self.report_dir: Path | None = None
        self._stop_logged = False

    # -- Lightning hooks ---------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Find the engine, the DP optimizer and the training loader; attach the auditor."""
        from ..audit import PrivacyAuditor

        if self.auditor is not None:  # a previous run that never reached its end
            self._close(trainer, reason="a new training run started")
        engine = self._find_engine(pl_module)
        optimizer = self._find_optimizer(trainer)
        loader = self._find_loader(trainer)
        self.report = None
        self.report_dir = None
        self._stop_logged = False
        self.auditor = PrivacyAuditor(engine, optimizer, loader, config=self.config,
                                      on_step=self._on_step,
                                      on_evidence=self._on_evidence, model=pl_module)
        logger.info("privacy auditor attached to %s (delta=%g)", type(optimizer).__name__,
                    self.delta)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the audit metrics; stop training once the auditor has proven a violation."""
        auditor = self.auditor
        if auditor is None:
            return
        if self.log_metrics:
            self._log(trainer, pl_module, auditor)
        stop = bool(auditor.should_stop)
        strategy = getattr(trainer, "strategy", None)
        if getattr(trainer, "world_size", 1) > 1 and strategy is not None:
            # every rank must stop together (as Lightning's EarlyStopping does)
            stop = bool(strategy.reduce_boolean_decision(stop, all=False))
        if stop:
            trainer.should_stop = True
            if not self._stop_logged:
                self._stop_logged = True
                logger.warning(
                    "privacy audit: violation proven at global step %d; stopping training",
                    trainer.global_step,
                )

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Finalize the audit, save the report, detach the auditor."""
        self._close(trainer, reason=None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Training was interrupted: still finalize, save what was audited, and detach."""
        if self.auditor is not None:
            logger.warning("training interrupted (%s: %s); saving the audit so far",
                           type(exception).__name__, exception)
            self._close(trainer, reason=f"{type(exception).__name__}: {exception}")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Never leave the optimizer wrapped, whatever happened before."""
        if self.auditor is not None:
            self._detach()

    # -- helpers -----------------------------------------------------------------------------------

    def _find_engine(self, pl_module: Any) -> Any:
        from opacus import PrivacyEngine

        engine = getattr(pl_module, self.engine_attr, None)
        if engine is None:
            raise ValueError(
                f"PrivacyAuditCallback: the LightningModule {type(pl_module).__name__} has no "
                f"attribute {self.engine_attr!r} holding the Opacus PrivacyEngine (set "
                f"engine_attr= to the attribute's name)"
            )
        if not isinstance(engine, PrivacyEngine):
            raise TypeError(
                f"PrivacyAuditCallback: {type(pl_module).__name__}.{self.engine_attr} must be an "
                f"opacus.PrivacyEngine, got {type(engine).__name__}"
            )
        return engine

    @staticmethod
    def _find_optimizer(trainer: Any) -> Any:
        from opacus.optimizers import DPOptimizer

        optimizers = list(getattr(trainer, "optimizers", []) or [])
        dp = [o for o in optimizers if isinstance(o, DPOptimizer)]
        if not dp:
            names = [type(o).__name__ for o in optimizers]
            raise ValueError(
                "PrivacyAuditCallback: no Opacus DP optimizer among trainer.optimizers "
                f"{names}; return the optimizer made private by "
                "privacy_engine.make_private(...) from configure_optimizers"
            )
        if len(dp) > 1:
            raise ValueError(
                f"PrivacyAuditCallback: {len(dp)} DP optimizers found; the callback audits one"
            )
        return dp[0]

    @staticmethod
    def _find_loader(trainer: Any) -> Any:
        loader = getattr(trainer, "train_dataloader", None)
        if isinstance(loader, Mapping) and len(loader) == 1:
            loader = next(iter(loader.values()))
        elif isinstance(loader, (list, tuple)) and len(loader) == 1:
            loader = loader[0]
        if loader is None or isinstance(loader, (Mapping, list, tuple)):
            raise ValueError(
                "PrivacyAuditCallback: the Trainer must train on exactly one DataLoader (the one "
                f"whose sample rate the audit uses), got {type(loader).__name__}"
            )
        if getattr(loader, "sample_rate", None) is None:
            raise ValueError(
                "PrivacyAuditCallback: the Trainer's training DataLoader "
                f"({type(loader).__name__}) is not Poisson-sampled (it has no sample_rate), "
                "while Opacus's accountant assumes Poisson sampling and the audit needs the rate "
                "really used. Wrap the data with opacus.lightning.DPLightningDataModule, or pass "
                "opacus.data_loader.DPDataLoader.from_data_loader(loader) to trainer.fit"
            )
        return loader

    def _log(self, trainer: Any, pl_module: Any, auditor: Any) -> None:
        metrics = getattr(auditor, "latest_metrics", None)
        if not isinstance(metrics, Mapping):
            return
        metrics = dict(metrics)
        if _logger_writes_now(trainer):
            # the claim of this step, not of the auditor's last periodic read (claimed_every):
            # read where the Trainer's loggers write, every log_every_n_steps
            try:
                metrics["claimed_epsilon"] = current_claim(auditor)
            except Exception as exc:  # logging must never break training
                logger.debug("could not read the claimed epsilon: %s", exc)
        values = {}
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(float(value)):
                values[f"dpaudit/{key}"] = float(value)
        if values:
            try:
                # to the Trainer's loggers if any; always to trainer.callback_metrics
                pl_module.log_dict(values, on_step=True, on_epoch=False, prog_bar=False,
                                   logger=bool(getattr(trainer, "loggers", None)))
            except Exception as exc:  # logging must never break training
                logger.debug("could not log audit metrics: %s", exc)

    def _target_dir(self, trainer: Any) -> Path | None:
        if self.out_dir is False:
            return None
        if self.out_dir is not None:
            return Path(self.out_dir)
        root = getattr(trainer, "default_root_dir", None) or os.getcwd()
        return Path(root) / DEFAULT_SUBDIR

    def _close(self, trainer: Any, reason: str | None) -> None:
        auditor = self.auditor
        if auditor is None:
            return
        try:
            report = auditor.finalize()
            if reason is not None:
                report.warnings.append(f"training did not end normally: {reason}")
            self.report = report
            is_zero = bool(getattr(trainer, "is_global_zero", True))
            target = self._target_dir(trainer)
            # the verdict (whatever it is), the report's path and every finding at WARNING on
            # rank zero, so that a user sees them without configuring logging (Python's
            # last-resort handler prints WARNING records when no handler is configured); the
            # other ranks log at INFO
            level = logging.WARNING if is_zero else logging.INFO
            if target is not None and is_zero:
                self.report_dir = Path(report.save(target))
                logger.log(level, "privacy audit: %s; report saved to %s", report.verdict,
                           self.report_dir / "report.html")
            else:
                logger.log(level, "privacy audit: %s (report not saved%s)", report.verdict,
                           "" if is_zero else " on this rank")
            for f in report.findings:
                if f.get("level") != "note":
                    logger.log(level, "privacy audit finding (%s, %s): %s", f.get("monitor"),
                               f.get("level"), f.get("message"))
        except Exception:
            if reason is None:
                raise
            # already handling a training exception: do not mask it
            logger.exception("privacy audit: could not finalize the interrupted audit")
        finally:
            self._detach()

    def _detach(self) -> None:
        auditor, self.auditor = self.auditor, None
        if auditor is not None:
            try:
                auditor.detach()
            except Exception:  # pragma: no cover - defensive
                logger.exception("privacy audit: detaching the auditor failed")


def _logger_writes_now(trainer: Any) -> bool:
    """Whether the Trainer's loggers write this training batch's metrics: at
    ``on_train_batch_end`` of the k-th optimizer step, when k is a multiple of
    ``log_every_n_steps`` (Lightning's rule), or when training stops."""
    every = int(getattr(trainer, "log_every_n_steps", 50) or 0)
    step = int(getattr(trainer, "global_step", 0) or 0)
    return bool(getattr(trainer, "should_stop", False)) or (every > 0 and step % every == 0)
