"""Writes ``gate_30_steps.json`` and ``gate_300_steps.json``: the ``audit.json`` of two short
correct runs with the same audit settings (1000 one-run canaries, 8 canary pairs, sigma 1,
q 0.125) that differ only in how long they train, 30 and 300 steps. The 30-step audit is the
weaker one (its IN canaries were included 3.75 times on average, against 37.5, and its smallest
refutable epsilon is about 2.2 times its claim, against 1.5): the release gate must refuse it
against the 300-step baseline (tests/test_gate_power.py, issue 38). Run from the repository root:
``python tests/data/make_gate_power.py``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402

CONFIG = dict(delta=1e-5, k_pairs=8, m_canaries=1000, check_every=3, model_name="mlp-16-128-2",
              dataset_name="synthetic-256")


def audit(steps: int, seed: int | None = 7) -> Any:
    """The report of a run of ``steps`` steps audited with ``CONFIG`` (``seed``: the canaries'
    coins; the data, model and noise are the same for every seed)."""
    torch.set_num_threads(1)
    s = make_private_setup(sigma=1.0, noise_seed=11, hidden=128)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=seed, model=s.model, **CONFIG)
    s.train(steps, auditor=aud)
    return aud.finalize()


def main() -> None:
    for steps in (30, 300):
        (HERE / f"gate_{steps}_steps.json").write_text(audit(steps).to_json(indent=None) + "\n",
                                                       encoding="utf-8")


if __name__ == "__main__":
    main()
