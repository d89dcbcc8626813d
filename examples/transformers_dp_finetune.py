#!/usr/bin/env python3
"""DP fine-tuning with the Hugging Face Trainer and Opacus, audited while it trains.

A small BERT classifier built from a ``BertConfig`` (random weights: nothing is downloaded, so this
runs offline; with a real checkpoint use ``from_pretrained``) is fine-tuned with DP-SGD on
synthetic token sequences whose label is the parity of their first token. The Opacus part is the
usual one: freeze what Opacus cannot compute per-sample gradients for (BERT's embeddings),
``make_private`` the model, optimizer and loader, and let a ``Trainer`` subclass train on the
Poisson-sampled loader. The audit is one callback,
``dpaudit_torch.integrations.transformers.PrivacyAuditCallback``; it logs the verdict and the
report's path at the end of training. ``--bug no-noise`` (or any name of
``dpaudit_torch.testing.bugs.names()`` that breaks the optimizer) shows the early stop.

    python examples/transformers_dp_finetune.py --steps 60 --out hf_audit
    python examples/transformers_dp_finetune.py --steps 60 --bug no-noise
"""

import argparse
import sys
import warnings

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, Dataset

from dpaudit_torch._requires import require

require("examples/transformers_dp_finetune.py", "transformers", "accelerate")
# after the check of the extra:
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

from dpaudit_torch.integrations.transformers import PrivacyAuditCallback  # noqa: E402
from dpaudit_torch.testing.bugs import BUGS, apply_bug  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=60, help="DP-SGD steps (default 60)")
parser.add_argument("--out", default="hf_audit", help="Trainer output_dir; the report goes to "
                    "OUT/dpaudit (default hf_audit)")
parser.add_argument("--bug", default=None, choices=sorted(BUGS),
                    help="apply a deliberate DP bug to the optimizer (for the demonstration)")
parser.add_argument("--seed", type=int, default=0, help="seed of data, model and audit")
args = parser.parse_args()
if args.steps < 1:
    parser.error(f"--steps must be >= 1, got {args.steps}")
warnings.filterwarnings("ignore", module="opacus")  # "secure RNG turned off"
warnings.filterwarnings("ignore", message="Full backward hook")  # torch, about Opacus's hooks


class Tokens(Dataset):
    """Synthetic sequences of token ids; the label is the parity of the first token."""

    def __init__(self, n: int, length: int, vocab: int, generator: torch.Generator) -> None:
        self.ids = torch.randint(4, vocab, (n, length), generator=generator)
        self.labels = self.ids[:, 0] % 2

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


# --- an ordinary Opacus + Trainer setup -----------------------------------------------------------
torch.manual_seed(args.seed)
config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
# Opacus computes no per-sample gradient for BERT's position embeddings (looked up with a batch
# dimension of 1): freeze the embeddings, as Opacus's BERT tutorial does
model.bert.embeddings.requires_grad_(False)
train_set = Tokens(2000, 16, config.vocab_size, torch.Generator().manual_seed(args.seed))
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
engine = PrivacyEngine(accountant="prv")
dp_model, dp_optimizer, dp_loader = engine.make_private(
    module=model, optimizer=optimizer, data_loader=DataLoader(train_set, batch_size=64),
    noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True,
)
if args.bug is not None:
    apply_bug(dp_optimizer, args.bug)


class DPTrainer(Trainer):
    def get_train_dataloader(self) -> DataLoader:
        return dp_loader  # Poisson sampling at the rate the accountant was told


training_args = TrainingArguments(
    output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=64,
    max_grad_norm=0.0,  # Opacus clips per sample; the Trainer's clipping would be wasted work
    lr_scheduler_type="constant", logging_steps=10, save_strategy="no", report_to="none",
    use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=args.seed,
)
audit = PrivacyAuditCallback(engine, delta=1e-5, seed=args.seed)  # the audit: one callback
trainer = DPTrainer(model=dp_model, args=training_args, optimizers=(dp_optimizer, None),
                    callbacks=[audit])
trainer.train()

# --- the audit's result ---------------------------------------------------------------------------
report = audit.report
assert report is not None
print(report.summary_text())
print(f"{trainer.state.global_step} steps; report written to {audit.report_dir}")
sys.exit(3 if report.violation or report.claim_refuted else 0)
