"""Writes ``report_v1_3.json``: the ``audit.json`` of a short correct run (verdict "nothing
found"), written by the release whose report schema is 1.3 (before the audit fingerprint of
schema 1.4 existed). Kept so that later releases are tested to read it as a release gate's
baseline (tests/test_gate.py). Run from the repository root with that release installed:
``python tests/data/make_report_v1_3.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.report import SCHEMA_VERSION  # noqa: E402

STEPS = 30
CONFIG = dict(delta=1e-5, k_pairs=8, m_canaries=40, check_every=3, claimed_every=4)


def main() -> None:
    assert SCHEMA_VERSION == "1.3", f"run with the 1.3 release (this one writes {SCHEMA_VERSION})"
    torch.set_num_threads(1)
    s = make_private_setup(sigma=1.0, noise_seed=11)
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, model=s.model, **CONFIG)
    s.train(STEPS, auditor=aud)  # the Poisson loader make_private returned
    report = aud.finalize()
    (HERE / "report_v1_3.json").write_text(report.to_json(indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
