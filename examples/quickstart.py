#!/usr/bin/env python3
"""Quickstart: audit an Opacus DP-SGD training run with two added lines.

An ordinary Opacus training loop (a tiny classifier on synthetic data) plus two lines: build a
``PrivacyAuditor`` after ``make_private``, and check ``auditor.should_stop`` in the loop. At the
end, ``finalize()`` gives the report: the claimed epsilon (from Opacus's accountant) beside the
audited lower bounds. The audit can prove a claim false; it can never prove it true.

    python examples/quickstart.py --steps 300 --out quickstart_audit
"""

import argparse
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch import PrivacyAuditor

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=300, help="DP-SGD steps (default 300)")
parser.add_argument("--out", default="quickstart_audit", help="report directory")
args = parser.parse_args()
if args.steps < 1:
    parser.error(f"--steps must be >= 1, got {args.steps}")
warnings.filterwarnings("ignore", module="opacus")  # "secure RNG turned off"
warnings.filterwarnings("ignore", message="Full backward hook")  # torch, about Opacus's hooks

# --- an ordinary Opacus setup -------------------------------------------------------------------
torch.manual_seed(0)
x = torch.randn(2000, 20)
y = (x[:, :5].sum(dim=1) > 0).long()
model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 2))  # room for the canaries
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
engine = PrivacyEngine()
model, optimizer, loader = engine.make_private(
    module=model, optimizer=optimizer, data_loader=loader,
    noise_multiplier=1.0, max_grad_norm=1.0,
)

auditor = PrivacyAuditor(engine, optimizer, loader, delta=1e-5, model=model)  # added line 1

step = 0
while step < args.steps and not auditor.should_stop:
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
        step += 1
        if auditor.should_stop or step >= args.steps:  # added line 2 (the early stop)
            break

# --- the audit's result ---------------------------------------------------------------------------
report = auditor.finalize()
auditor.detach()
out = report.save(args.out)  # audit.json + report.html
print(report.summary_text())
print(f"{step} steps; report written to {out}")
