"""Every contract bug (:mod:`dpaudit_torch.testing.training`), by clause.

``contract_bugs()`` maps name -> :class:`~dpaudit_torch.testing.training.ContractBug` for every
clause (inputs, release, gaussian, clipping: :data:`~dpaudit_torch.testing.training.CLAUSES`;
``contract_bugs("gaussian")`` for one); each clause's
classes live in ``testing/leaks_<clause>.py``.
"""

from __future__ import annotations

from . import leaks_clipping, leaks_gaussian, leaks_inputs, leaks_release
from .training import CLAUSES, ContractBug

__all__ = ["contract_bugs"]

_MODULES = {"inputs": leaks_inputs, "release": leaks_release, "gaussian": leaks_gaussian,
            "clipping": leaks_clipping}


def contract_bugs(clause: str | None = None) -> dict[str, ContractBug]:
    """name -> bug of one clause (or every clause, in the order of ``CLAUSES``)."""
    if clause is not None and clause not in CLAUSES:
        raise ValueError(f"clause must be one of {CLAUSES} or None, got {clause!r}")
    out: dict[str, ContractBug] = {}
    for c in CLAUSES if clause is None else (clause,):
        for name, bug in _MODULES[c].CLASSES.items():
            if name in out:
                raise ValueError(f"contract bug {name!r} is defined twice")
            out[name] = bug
    return out
