"""Hugging Face ``transformers`` integration: :class:`PrivacyAuditCallback` for the ``Trainer``.

Opacus has no ``Trainer`` integration of its own; the usual way to fine-tune with DP-SGD under the
``Trainer`` is to make the model, optimizer and data loader private first and hand them to a
``Trainer`` subclass that trains on the private loader::

    from opacus import PrivacyEngine
    from transformers import Trainer, TrainingArguments
    from dpaudit_torch.integrations.transformers import PrivacyAuditCallback

    model = BertForSequenceClassification(config)        # or from_pretrained(...)
    model.bert.embeddings.requires_grad_(False)           # see "Which models" below
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    engine = PrivacyEngine()
    dp_model, dp_optimizer, dp_loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(train_set, batch_size=64),
        noise_multiplier=1.0, max_grad_norm=1.0)          # Poisson sampling (the default)

    class DPTrainer(Trainer):
        def get_train_dataloader(self):                   # the Poisson-sampled loader
            return dp_loader

    args = TrainingArguments(output_dir="out", max_steps=500, max_grad_norm=0.0,
                             gradient_accumulation_steps=1, report_to="none")
    trainer = DPTrainer(model=dp_model, args=args, optimizers=(dp_optimizer, None),
                        callbacks=[PrivacyAuditCallback(engine, delta=1e-5)])
    trainer.train()                                       # the report lands in out/dpaudit/

What the callback does, hook by hook:

* ``on_train_begin``: finds the Opacus ``DPOptimizer`` (inside the ``AcceleratedOptimizer`` the
  Trainer wraps it in) and the training loader the Trainer really iterates, checks that the
  loader is Poisson-sampled (the audit needs the rate really used) and that
  ``gradient_accumulation_steps`` is 1 (one release per Poisson batch, as the accountant
  counts), and attaches a :class:`~dpaudit_torch.audit.PrivacyAuditor`;
* ``on_step_end`` (after every optimizer step): clears the DP optimizer's accumulated state with
  ``DPOptimizer.zero_grad`` -- the Trainer only calls ``model.zero_grad()``, while Opacus keeps
  each step's clipped sum until its optimizer's ``zero_grad`` and refuses the next step
  otherwise ("Gradients haven't been cleared since the last optimizer step") -- and sets
  ``control.should_training_stop`` once the sequential audit has proven a violation
  (``on_violation="stop"``, the default);
* ``on_log``: adds the audit's numeric metrics (``dpaudit/...``) to the Trainer's log entry
  (``trainer.state.log_history``, ``trainer_state.json``) and to what later callbacks see; the
  claimed epsilon is the accountant's at that step (read at the Trainer's ``logging_steps``,
  not only every ``claimed_every`` steps as the auditor does);
* ``on_train_end`` (also after an early stop): finalizes the audit, saves the report
  (``audit.json`` + ``report.html``, default ``<output_dir>/dpaudit``) on the main process,
  logs the verdict and the report's path at WARNING (visible without any logging
  configuration), and detaches the auditor.

``on_violation="raise"`` raises :class:`~dpaudit_torch.PrivacyViolationError` out of
``trainer.train()`` before the offending step's update; the Trainer then calls no further hook,
so call :meth:`PrivacyAuditCallback.close` yourself (``try: trainer.train() finally:
callback.close()``) to save the report.

Which models: Opacus must compute a per-sample gradient for every trainable module. BERT looks
its position embeddings up with a batch dimension of 1, which Opacus's per-sample gradient of
``nn.Embedding`` cannot split (the first step fails with "stack expects each tensor to be equal
size"): freeze at least ``bert.embeddings.position_embeddings``, or all of the embeddings as
Opacus's BERT tutorial does.

The audit itself (canaries through Opacus's clipping, the anytime-valid sequential tests, the
one-run bounds of Steinke, Nasr and Jagielski, NeurIPS 2023) is the auditor's; this module only
wires it to the Trainer. ``transformers`` is an optional extra (``pip install
'dpaudit-torch[transformers]'``); ``import dpaudit_torch`` never imports it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "dpaudit_torch.integrations.transformers needs Hugging Face transformers, which is not "
        "installed: pip install 'dpaudit-torch[transformers]'"
    ) from None

from .._validation import check_alpha
from ..audit.config import AuditConfig
from ._claim import current_claim

if TYPE_CHECKING:  # pragma: no cover
    from ..audit import PrivacyAuditor
    from ..report import AuditReport

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditCallback", "find_dp_optimizer"]

#: name of the report directory under ``args.output_dir`` when ``out_dir`` is None
DEFAULT_SUBDIR = "dpaudit"


def find_dp_optimizer(optimizer: Any) -> Any:
    """The Opacus ``DPOptimizer`` inside ``optimizer`` (the optimizer itself, or the one that
    ``accelerate``'s ``AcceleratedOptimizer`` and similar wrappers hold as ``.optimizer``).

    Raises:
        ValueError: no Opacus DP optimizer is found (the name of each wrapper is given).
    """
    from opacus.optimizers import DPOptimizer

    seen: list[str] = []
    current = optimizer
    for _ in range(8):  # wrappers nest a few levels at most
        if isinstance(current, DPOptimizer):
            return current
        if current is None:
            break
        seen.append(type(current).__name__)
        current = getattr(current, "optimizer", None)
    raise ValueError(
        "PrivacyAuditCallback: the Trainer's optimizer is not an Opacus DP optimizer (found "
        f"{' -> '.join(seen) or 'None'}); pass the optimizer returned by "
        "privacy_engine.make_private(...) as Trainer(optimizers=(dp_optimizer, None)) or return "
        "it from create_optimizer()"
    )


class PrivacyAuditCallback(_TrainerCallback):
    """Audit the differential privacy of a Hugging Face ``Trainer`` run while it trains.

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer
            and the data loader (its accountant gives the claimed epsilon).
        delta: the delta of the privacy claim being audited, in (0, 1).
        out_dir: where the report is saved; default ``<args.output_dir>/dpaudit``. ``False``
            disables saving (the report is still available as :attr:`report`).
        log_metrics: add the auditor's latest numeric metrics (prefix ``dpaudit/``) to every
            log entry of the Trainer.
        **auditor_kwargs: settings of :class:`~dpaudit_torch.audit.AuditConfig`, validated here
            (a bad one raises at construction, before training starts), ``on_step`` and
            ``on_evidence``;
            passed to :class:`~dpaudit_torch.audit.PrivacyAuditor` (``alpha``, ``k_pairs``,
            ``m_canaries``, ``seed``, ``on_violation``, ``check_every``, ...).

    Attributes:
        report: the :class:`~dpaudit_torch.report.AuditReport` of the last finished run, or None.
        report_dir: the directory the report was saved to, or None.
        auditor: the attached :class:`~dpaudit_torch.audit.PrivacyAuditor` while training runs.

    Raises (at ``trainer.train()``, before the first step): ValueError when the Trainer's
    optimizer is not an Opacus DP optimizer, its training loader is not Poisson-sampled (it has
    no ``sample_rate``), or ``gradient_accumulation_steps > 1`` (one release per loader batch is
    what the accountant counts; Opacus's hooks refuse accumulation under Poisson sampling).
    TypeError (at construction) when ``privacy_engine`` is not an Opacus ``PrivacyEngine``.
    """

    def __init__(
        self,
        privacy_engine: Any,
        delta: float = 1e-5,
        out_dir: str | os.PathLike[str] | None | bool = None,
        *,
        log_metrics: bool = True,
        **auditor_kwargs: Any,
    ) -> None:
        from opacus import PrivacyEngine

        if not isinstance(privacy_engine, PrivacyEngine):
            raise TypeError("privacy_engine must be the opacus.PrivacyEngine that made the "
                            f"optimizer private, got {type(privacy_engine).__name__}")
        self.engine = privacy_engine
        self.delta = check_alpha(delta, "delta")  # the open interval (0, 1)
        if out_dir is True:
            raise TypeError("out_dir must be a path, None (default location) or False (no saving)")
        if out_dir is not None and out_dir is not False and not isinstance(
            out_dir, (str, os.PathLike)
        ):
            raise TypeError(f"out_dir must be a path, None or False, got {out_dir!r}")
        self.out_dir = out_dir
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
        self._dp_optimizer: Any = None
        self._output_dir: str | None = None
        self._is_main = True
        self._stop_logged = False

    # -- Trainer hooks -----------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Find the DP optimizer and the training loader; attach the auditor."""
        from ..audit import PrivacyAuditor

        if self.auditor is not None:  # a previous run that never reached its end
            self._close(reason="a new training run started")
        optimizer = find_dp_optimizer(kwargs.get("optimizer"))
        loader = self._find_loader(kwargs.get("train_dataloader"))
        accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        if accumulation > 1:
            # one optimizer step per k loader batches would release k Poisson batches at once
            # while the accountant counts one step at the loader's rate (Opacus's per-sample
            # hooks refuse it at the second backward pass); refused before anything runs
            raise ValueError(
                f"PrivacyAuditCallback: gradient_accumulation_steps={accumulation}, but DP-SGD "
                f"with Poisson sampling releases one noised step per loader batch (the "
                f"accountant counts one step at the loader's rate). Use "
                f"gradient_accumulation_steps=1 and set the expected batch size with the "
                f"loader's batch_size in make_private; for memory, split the Poisson batches "
                f"with opacus.utils.batch_memory_manager.BatchMemoryManager")
        self.report = None
        self.report_dir = None
        self._stop_logged = False
        self._output_dir = getattr(args, "output_dir", None)
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        self._dp_optimizer = optimizer
        model = kwargs.get("model")
        self.auditor = PrivacyAuditor(self.engine, optimizer, loader, config=self.config,
                                      on_step=self._on_step,
                                      on_evidence=self._on_evidence,
                                      model=model if hasattr(model, "named_parameters") else None)
        if float(getattr(args, "max_grad_norm", 0.0) or 0.0) > 0:
            logger.info("TrainingArguments.max_grad_norm=%s clips the non-private gradient, which "
                        "Opacus replaces at the step; set max_grad_norm=0 to skip that work",
                        args.max_grad_norm)
        logger.info("privacy auditor attached to %s (delta=%g)", type(optimizer).__name__,
                    self.delta)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Clear Opacus's per-step state; stop training once a violation is proven."""
        if self._dp_optimizer is not None:
            # the Trainer calls model.zero_grad() only; Opacus keeps the step's clipped sum
            # (p.summed_grad) until DPOptimizer.zero_grad and refuses the next step otherwise
            self._dp_optimizer.zero_grad(set_to_none=True)
        auditor = self.auditor
        if auditor is not None and auditor.should_stop:
            # the auditor broadcasts rank 0's decision, so every rank stops at the same step
            control.should_training_stop = True
            if not self._stop_logged:
                self._stop_logged = True
                logger.warning("privacy audit: violation proven at global step %d; stopping "
                               "training", state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        """Add the audit's numeric metrics to the Trainer's log entry."""
        auditor = self.auditor
        if not self.log_metrics or auditor is None or not isinstance(logs, dict):
            return
        values = _numeric_metrics(auditor.latest_metrics)
        # the claim of this step, not of the auditor's last periodic read (claimed_every)
        claim = current_claim(auditor)
        if claim is not None and math.isfinite(claim):
            values["dpaudit/claimed_epsilon"] = float(claim)
        logs.update(values)
        history = getattr(state, "log_history", None)
        if history and isinstance(history[-1], dict):
            history[-1].update(values)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finalize the audit, save the report, detach the auditor."""
        self._close(reason=None)

    # -- public ----------------------------------------------------------------------------------

    def close(self) -> AuditReport | None:
        """Finalize, save and detach now (idempotent; for training that ended with an exception,
        e.g. ``on_violation="raise"``, which the Trainer reports to no callback). Returns the
        report, or None if no audit was running."""
        if self.auditor is not None:
            self._close(reason="training ended without the Trainer's on_train_end (an "
                               "exception, or close() called during training)")
        return self.report

    # -- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _find_loader(loader: Any) -> Any:
        if loader is None:
            raise ValueError("PrivacyAuditCallback: the Trainer passed no training DataLoader to "
                             "on_train_begin")
        if getattr(loader, "sample_rate", None) is None:
            raise ValueError(
                "PrivacyAuditCallback: the Trainer's training DataLoader "
                f"({type(loader).__name__}) is not Poisson-sampled (it has no sample_rate), "
                "while Opacus's accountant assumes Poisson sampling and the audit needs the rate "
                "really used. Override Trainer.get_train_dataloader to return the DPDataLoader "
                "that privacy_engine.make_private(...) returned"
            )
        return loader

    def _target_dir(self) -> Path | None:
        if self.out_dir is False:
            return None
        if self.out_dir is not None:
            return Path(self.out_dir)
        return Path(self._output_dir or os.getcwd()) / DEFAULT_SUBDIR

    def _close(self, reason: str | None) -> None:
        auditor = self.auditor
        if auditor is None:
            return
        try:
            report = auditor.finalize()
            if reason is not None:
                report.warnings.append(f"training did not end normally: {reason}")
            self.report = report
            target = self._target_dir()
            main = self._is_main and auditor.is_main_process
            # the verdict and where the report is, at WARNING on the main process whatever the
            # verdict, so that a user sees them without configuring logging
            level = logging.WARNING if main else logging.INFO
            if target is not None and main:
                self.report_dir = Path(report.save(target))
                logger.log(level, "privacy audit: %s; report saved to %s", report.verdict,
                           self.report_dir / "report.html")
            else:
                logger.log(level, "privacy audit: %s (report not saved%s)", report.verdict,
                           "" if main else " on this rank")
            for f in report.findings:
                if f.get("level") != "note":
                    logger.log(level, "privacy audit finding (%s, %s): %s", f.get("monitor"),
                               f.get("level"), f.get("message"))
        except Exception:
            if reason is None:
                raise
            logger.exception("privacy audit: could not finalize the interrupted audit")
        finally:
            self._detach()

    def _detach(self) -> None:
        auditor, self.auditor = self.auditor, None
        self._dp_optimizer = None
        if auditor is not None:
            try:
                auditor.detach()
            except Exception:  # pragma: no cover - defensive
                logger.exception("privacy audit: detaching the auditor failed")


def _numeric_metrics(metrics: Any) -> dict[str, float]:
    """The finite numeric entries of ``auditor.latest_metrics``, prefixed ``dpaudit/``."""
    out: dict[str, float] = {}
    if not isinstance(metrics, Mapping):
        return out
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(float(value)):
            out[f"dpaudit/{key}"] = float(value)
    return out
