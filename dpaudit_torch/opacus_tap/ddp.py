"""Distributed data parallel (Opacus's distributed optimizers): what the ranks share.

Every rank observes the same all-reduced gradient, so the ranks need the same canary design, role
coins and secret coins (rank 0's seeds, broadcast once at attach), and they take the same
decision at the same step (rank 0's, broadcast at every check: one small collective).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

__all__ = ["share_seeds", "broadcast_decision", "all_reduce_sum"]

_SEED_NAMES = ("design", "mechanics", "secret")


def _dist():  # noqa: ANN202 - the torch.distributed module
    import torch.distributed as dist

    return dist


def _comm_device(device: torch.device) -> torch.device:
    return device if _dist().get_backend() == "nccl" else torch.device("cpu")


def share_seeds(seeds: dict[str, int], policy: str, seeded: bool, rank: int,
                device: torch.device, warn: Callable[[str], None]) -> tuple[dict[str, int], str]:
    """Every rank uses rank 0's stream seeds (broadcast); with no seed they come from rank 0's
    OS entropy. The seed itself is never logged or reported."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("distributed DP optimizer (world_size > 1) but torch.distributed is not "
                         "initialised: the auditor must share its seeds across ranks")
    t = torch.tensor([seeds[n] for n in _SEED_NAMES] + [int(not seeded)], dtype=torch.int64,
                     device=_comm_device(device))
    dist.broadcast(t, src=0)
    vals = t.cpu().tolist()
    shared = dict(zip(_SEED_NAMES, (int(v) for v in vals[:3])))
    if rank != 0 and ((not seeded) != bool(vals[3]) or (seeded and shared != seeds)):
        warn(f"rank {rank}: its seed differs from rank 0's; rank 0's canary design and coins "
             f"are used on every rank")
    shared_policy = ("os-entropy (rank 0, shared with every rank)" if vals[3]
                     else "seeded (rank 0's seed, shared with every rank)")
    return shared, shared_policy


def broadcast_decision(violation: bool, violation_step: int | None, crossed_at: int | None,
                       device: torch.device) -> tuple[bool, int | None, int | None]:
    """Rank 0's (violation, violation_step, crossed_at), on every rank (unchanged when
    torch.distributed is not initialised)."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return violation, violation_step, crossed_at
    t = torch.tensor([int(violation), -1 if violation_step is None else violation_step,
                      -1 if crossed_at is None else crossed_at], dtype=torch.int64,
                     device=_comm_device(device))
    dist.broadcast(t, src=0)
    v, vs, ca = (int(a) for a in t.tolist())  # one read back (a wait on a device)
    return bool(v), (None if vs < 0 else vs), (None if ca < 0 else ca)


def all_reduce_sum(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The sum of ``t`` over the ranks (a new tensor on ``t``'s device; ``t`` unchanged when
    torch.distributed is not initialised)."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return t
    buf = t.to(_comm_device(device), copy=True)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf.to(t.device)
