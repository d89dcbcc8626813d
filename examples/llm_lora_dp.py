#!/usr/bin/env python3
"""DP fine-tuning of a GPT-2-style language model with LoRA, audited while the Trainer trains.

A causal language model built from a ``GPT2Config`` (random weights: nothing is downloaded, so
this runs offline; with a real checkpoint use ``from_pretrained``) gets LoRA adapters from
``peft`` on GPT-2's attention and MLP projections (``c_attn``, ``c_proj``, ``c_fc``); every base
weight is frozen, so DP-SGD trains the adapters only (4 layers: 16 adapted projections, 32
trainable tensors). It is fine-tuned with Opacus (per-sample gradients by hooks) under the
Hugging Face ``Trainer`` on synthetic token sequences (a fixed random bigram chain; from a random
base the loss stays near that of a uniform guess: the example is about the audit, not about
learning), and audited by one callback,
``dpaudit_torch.integrations.transformers.PrivacyAuditCallback``. The privacy unit is one
sequence: its loss is the mean over its tokens, and every sequence has the same length.

The callback hands the Trainer's model to the auditor, so its coverage monitor watches every
parameter and buffer, the frozen base weights included, at every step: the example prints
whether any of them moved outside the DP release (none should: only the adapters train).

    python examples/llm_lora_dp.py --out lora_audit
    python examples/llm_lora_dp.py --bug no-noise        # violation proven, stopped, exit 3

Ghost clipping (``--grad-sample-mode ghost``) works for these adapters (``nn.Linear``: Opacus has
a ghost norm for them; the frozen base layers get no hook) but needs a per-sequence loss, which
the model's own ``labels=`` loss is not (one scalar for the batch): given that scalar, Opacus
runs a single backward pass and clips nothing, silently. The ``Trainer`` subclass below computes
the loss with the criterion ``make_private`` returns, on the logits, per sequence (in hooks mode
with a plain ``nn.CrossEntropyLoss``: the same value).

``build_model``, ``token_dataset``, ``make_private_lora`` and ``causal_lm_loss`` are importable
(``benchmarks/overhead.py --model lora`` reuses them).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

#: GPT-2's projections that get LoRA adapters (attention: c_attn, c_proj; MLP: c_fc, c_proj)
TARGET_MODULES = ("c_attn", "c_proj", "c_fc")


def build_model(n_layer: int = 4, n_embd: int = 64, n_head: int = 4, vocab_size: int = 256,
                n_positions: int = 64, rank: int = 4, seed: int = 0) -> nn.Module:
    """A GPT-2-style causal LM from a ``GPT2Config`` (random initialisation, nothing downloaded)
    with LoRA adapters of rank ``rank`` on ``c_attn``, ``c_proj`` and ``c_fc`` of every block;
    the base weights are frozen (``peft``). Dropout is off (the audit does not need it, and a
    deterministic forward keeps the example reproducible)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    base = GPT2LMHeadModel(config)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGET_MODULES),
                      lora_dropout=0.0, bias="none", fan_in_fan_out=True,  # GPT-2's Conv1D
                      task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


class TokenSequences(Dataset):
    """``n`` synthetic sequences of ``length`` tokens from a fixed random bigram chain (each token
    has 4 likely successors), as the dicts a causal LM takes (``labels`` = ``input_ids``)."""

    def __init__(self, n: int, length: int, vocab_size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, vocab_size, (vocab_size, 4), generator=g)
        ids = torch.empty(n, length, dtype=torch.long)
        ids[:, 0] = torch.randint(0, vocab_size, (n,), generator=g)
        for t in range(1, length):
            pick = torch.randint(0, 4, (n,), generator=g)
            ids[:, t] = successors[ids[:, t - 1], pick]
        self.ids = ids

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def token_dataset(n: int = 2048, length: int = 32, vocab_size: int = 256,
                  seed: int = 0) -> TokenSequences:
    """The example's training set (see :class:`TokenSequences`)."""
    return TokenSequences(n, length, vocab_size, seed)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, criterion: Any) -> Any:
    """Next-token cross-entropy of ``logits`` (B, T, V) against ``labels`` (B, T), the mean over
    each sequence's tokens, then over the batch. ``criterion``: ``nn.CrossEntropyLoss()`` (hooks
    mode), or the ``DPLossFastGradientClipping`` that ``make_private`` returns under ghost
    clipping, which is given the logits' shape so that it reduces per sequence first."""
    shifted = logits[:, :-1, :]
    flat = shifted.reshape(-1, shifted.shape[-1])
    target = labels[:, 1:].reshape(-1)
    if isinstance(criterion, nn.Module):
        return criterion(flat, target)
    return criterion(flat, target, shape=shifted.shape)


def make_private_lora(model: nn.Module, dataset: Dataset, batch_size: int = 32,
                      noise_multiplier: float = 1.0, max_grad_norm: float = 1.0,
                      grad_sample_mode: str = "hooks", lr: float = 0.5, accountant: str = "prv",
                      seed: int = 0) -> tuple[Any, nn.Module, Any, DataLoader, Any]:
    """Opacus's ``make_private`` of the LoRA model: SGD over the trainable (adapter) tensors,
    Poisson sampling at expected batch ``batch_size``, seeded noise. Returns (engine, private
    model, DP optimizer, Poisson loader, criterion): the criterion is ``nn.CrossEntropyLoss()``
    in hooks mode, Opacus's per-sequence wrapper of it under ghost clipping."""
    from opacus import PrivacyEngine

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    engine = PrivacyEngine(accountant=accountant)
    criterion = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "secure RNG turned off"
        out = engine.make_private(
            module=model, optimizer=optimizer,
            data_loader=DataLoader(dataset, batch_size=batch_size,
                                   generator=torch.Generator().manual_seed(seed + 1)),
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
            poisson_sampling=True, grad_sample_mode=grad_sample_mode, criterion=criterion,
            noise_generator=torch.Generator().manual_seed(seed + 2))
    if grad_sample_mode == "ghost":
        dp_model, dp_optimizer, criterion, loader = out
    else:
        dp_model, dp_optimizer, loader = out
    return engine, dp_model, dp_optimizer, loader, criterion


def base_weights(model: nn.Module) -> list[str]:
    """Names of the frozen tensors of the model (the base weights), Opacus's prefix removed."""
    return [n.removeprefix("_module.") for n, p in model.named_parameters()
            if not p.requires_grad]


def main(argv: list[str] | None = None) -> int:
    from dpaudit_torch._requires import require

    require("examples/llm_lora_dp.py", "transformers", "peft", "accelerate")
    from transformers import Trainer, TrainingArguments

    from dpaudit_torch.integrations.transformers import PrivacyAuditCallback
    from dpaudit_torch.testing.bugs import BUGS, apply_bug

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="DP-SGD steps (default 60)")
    parser.add_argument("--out", default="lora_audit", help="Trainer output_dir; the report "
                        "goes to OUT/dpaudit (default lora_audit)")
    parser.add_argument("--bug", default=None, choices=sorted(BUGS),
                        help="apply a deliberate DP bug to the optimizer (the demonstration)")
    parser.add_argument("--grad-sample-mode", default="hooks", choices=("hooks", "ghost"),
                        help="Opacus's per-sample gradients (hooks) or ghost clipping")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="expected (Poisson) batch size (default 32)")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--n", type=int, default=2048, help="training sequences (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, model and audit")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    warnings.filterwarnings("ignore", module="opacus")  # "secure RNG turned off"
    warnings.filterwarnings("ignore", message="Full backward hook")  # torch, Opacus's hooks
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)

    # --- an ordinary Opacus + LoRA + Trainer setup ---------------------------------------------
    model = build_model(n_layer=args.layers, n_positions=max(64, args.seq_len), seed=args.seed)
    n_trainable = sum(p.requires_grad for p in model.parameters())
    train_set = token_dataset(args.n, args.seq_len, seed=args.seed)
    engine, dp_model, dp_optimizer, dp_loader, criterion = make_private_lora(
        model, train_set, batch_size=args.batch_size, grad_sample_mode=args.grad_sample_mode,
        seed=args.seed)
    if args.bug is not None:
        apply_bug(dp_optimizer, args.bug)

    class DPTrainer(Trainer):
        def get_train_dataloader(self) -> DataLoader:
            return dp_loader  # Poisson sampling at the rate the accountant was told

        def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor],
                         return_outputs: bool = False, **kwargs: Any) -> Any:
            # the loss per sequence (ghost clipping needs it; in hooks mode the same value)
            outputs = model(input_ids=inputs["input_ids"])
            loss = causal_lm_loss(outputs.logits, inputs["labels"], criterion)
            return (loss, outputs) if return_outputs else loss

    training_args = TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        max_grad_norm=0.0,  # Opacus clips per sample; the Trainer's clipping is wasted work
        lr_scheduler_type="constant", logging_steps=10, save_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=args.seed,
    )
    audit = PrivacyAuditCallback(engine, delta=1e-5, seed=args.seed)  # the audit: one callback
    trainer = DPTrainer(model=dp_model, args=training_args, optimizers=(dp_optimizer, None),
                        callbacks=[audit])
    trainer.train()

    # --- the audit's result -------------------------------------------------------------------
    report = audit.report
    assert report is not None
    print(report.summary_text())
    coverage = report.audits.get("coverage", {})
    moved = [c["name"] for c in coverage.get("changed_outside_release", [])]
    frozen = base_weights(dp_model)
    moved_base = sorted(set(moved) & set(frozen))
    print(f"coverage: {coverage.get('held_tensors')} LoRA tensors held by the DP optimizer "
          f"({n_trainable} trainable), {coverage.get('watched_tensors')} tensors watched at every "
          f"step; frozen base weights moved: {len(moved_base)} of {len(frozen)}"
          + (f" ({', '.join(moved_base)})" if moved_base else "")
          + (f"; changed outside the release: {', '.join(moved)}" if moved else ""))
    print(f"{trainer.state.global_step} steps; report written to {audit.report_dir}")
    return 3 if report.violation or report.claim_refuted else 0


if __name__ == "__main__":
    sys.exit(main())
