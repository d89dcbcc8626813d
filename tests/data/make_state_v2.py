"""Writes ``auditor_state_v2.pt`` and ``report_v2.json``: a checkpoint of a run audited by the
release whose state layout is version 2 (one checkpoint entry per monitor, five monitors), and
the report that run ends with when it goes on uninterrupted. Kept so that later releases are
tested to resume it (tests/audit/test_checkpoint.py, which compares the report's floats within
the tolerances of tests/float_tolerance.py: another CPU computes them to other last digits). Run
from the repository root with that release installed: ``python tests/data/make_state_v2.py``."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import make_private_setup  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.testing import bugs  # noqa: E402

TOTAL, CUT = 12, 2
CONFIG = dict(delta=1e-5, k_pairs=8, m_canaries=40, check_every=3, claimed_every=4)


def setup():
    s = make_private_setup(sigma=1.0, noise_seed=11)
    bugs.apply_bug(s.optimizer, "noise-divided-by-batch")
    return s


def batches():
    return list(make_private_setup(sigma=1.0).batches(TOTAL, batch=24, seed=3))


def main() -> None:
    torch.set_num_threads(1)
    s = setup()
    aud = PrivacyAuditor(s.engine, s.optimizer, s.loader, seed=7, **CONFIG)
    b = batches()
    for x, y in b[:CUT]:
        s.step(x, y)
    ck = copy.deepcopy({"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(),
                        "accountant": s.engine.accountant.state_dict(),
                        "noise_rng": s.optimizer.generator.get_state(),
                        "auditor": aud.state_dict()})
    for x, y in b[CUT:]:
        s.step(x, y)
    report = aud.finalize().to_dict()
    torch.save(ck, HERE / "auditor_state_v2.pt")
    (HERE / "report_v2.json").write_text(json.dumps(report, indent=1, sort_keys=True,
                                                     default=str))


if __name__ == "__main__":
    main()
