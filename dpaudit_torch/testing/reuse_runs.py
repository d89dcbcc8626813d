"""Runs of the digits CNN under each noise-reuse form of :mod:`dpaudit_torch.testing.bugs`
(for ``benchmarks/reuse.py`` and the slow tests): proven within 10 steps of the first reuse by
the noise monitor's reuse test (docs/design.md section 11, "Reuse by near-equality")."""

from __future__ import annotations

import time
import warnings
from typing import Any

from torch import nn

__all__ = ["FORMS", "run_form"]

#: the reuse forms of :mod:`dpaudit_torch.testing.bugs` and their first reusing release on the
#: digits CNN (None: the loader's epoch length + 1)
FORMS: dict[str, int | None] = {
    "noise-reused": 2, "noise-reseeded": 11, "noise-flat-sliced": 1, "noise-rolled": 2,
    "noise-reused-subset": 2, "noise-reseeded-each-epoch": None, "manual-seed-each-epoch": None,
}


def run_form(form: str, seed: int, after: int) -> dict[str, Any]:
    """One audited run of the digits CNN (:func:`~dpaudit_torch.testing.harness.
    digits_training`, the auditor's defaults) broken by the reuse form ``form``, stopped at
    ``should_stop`` or ``after`` steps after the first reuse: the first reusing release, the
    decision step (None: none), the step at which the reuse test crossed, whether the noise
    monitor's findings name reuse, and the CPU seconds."""
    from ..audit import PrivacyAuditor
    from . import bugs
    from .harness import digits_training

    tr = digits_training(seed)
    opt, dl = bugs.apply_to_training(tr.engine, tr.optimizer, tr.data_loader, form)
    first = FORMS[form] or len(dl) + 1
    aud = PrivacyAuditor(tr.engine, opt, dl, delta=1e-5, seed=seed, model=tr.model)
    crit = nn.CrossEntropyLoss(reduction="sum")  # an empty Poisson batch gives a zero loss
    done, limit = 0, first + after
    t0 = time.process_time()
    while done < limit and not aud.should_stop:
        for x, y in dl:
            opt.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (crit(tr.model(x), y) / 64.0).backward()
            opt.step()
            done += 1
            if aud.should_stop or done >= limit:
                break
    rep = aud.finalize()
    reuse = rep.audits.get("noise", {}).get("reuse") or {}
    where = [str(f.get("where") or "") for f in rep.findings
             if f["level"] == "violation"]
    return {"first": first, "step": rep.violation_step if rep.violation else None,
            "reuse_at": reuse.get("rejected_at"),
            "reuse_found": any("(reuse)" in w for w in where),
            "cpu_s": time.process_time() - t0}
