"""Sharded parameters (``torch.distributed`` DTensors): Opacus FSDP2 and tensor-parallel ghost
clipping.

Opacus 1.6 trains a model sharded with FSDP2 (``opacus.utils.fsdp_utils.FSDP2Wrapper`` and
``make_private(..., grad_sample_mode="ghost_fsdp")``) or with tensor parallelism
(``GradSampleModuleFastGradientClippingTP``) through ``FSDPOptimizerFastGradientClipping``: every
trainable parameter is a DTensor of which a rank holds one shard, and the optimizer keeps its
clipped sum in ``optimizer.grad_state[p]["summed_grad"]`` (a DTensor like ``p``).

The auditor works on the shards, never on a gathered parameter:

* the canary design is drawn over the full (global) shapes, identically on every rank (rank 0's
  seeds, as under DDP);
* :class:`ShardLayout` says, for every canary coordinate, which rank *holds* it (the shard that
  contains it, found from the DTensor's placements and the ``torch.chunk`` split that DTensor
  sharding uses, checked against ``p.to_local()``'s shape) and which rank *owns* it (the holder;
  for a tensor held whole by every rank, rank 0);
* a canary is added by every rank that holds its coordinate, to its local shard of the summed
  gradient (:class:`ShardedInjection`), and a coordinate is read on its owner only;
* :class:`ShardedGradientReader` reads the local shards into zero-filled vectors in design order
  (a rank fills the coordinates it owns), and one ``all_reduce`` (sum) per step makes the whole
  vectors (real-data sums, released values, noise-audit values) known to every rank, so every
  rank runs the same statistics and takes the same decision, as under DDP.

Scales. FSDP's reduce-scatter averages the ranks' gradients, so the summed gradient a rank holds
is the sum over every rank's clipped examples divided by the data-parallel degree D (the world
size), and Opacus divides its noise by D as well (``loss_reduction="mean"``). A canary is one more
example of the global batch: it is added as ``C / D`` and the real-data sum is read as
``summed_grad * D / C``; the released value is then ``c 1{canary} + N(0, sigma^2)`` in units of C
exactly as in a single process. Under tensor parallelism every rank sees the same batch and holds
the complete gradient of its shard, so D = 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..canaries import CanaryDesign
from .observation import CoordinateSet, GradientReader
from .plan import StepPlan
from .recovery import add_at

logger = logging.getLogger(__name__)

__all__ = ["ShardLayout", "ShardedGradientReader", "ShardedInjection", "detect_layout",
           "summed_grad_of", "local_tensor"]


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support
        return None
    return DTensor


def local_tensor(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's shard of ``t`` (a DTensor's local tensor, which aliases its storage), or ``t``
    itself when it is a plain tensor."""
    dt = _dtensor_type()
    if t is not None and dt is not None and isinstance(t, dt):
        return t.to_local()
    return t


def summed_grad_of(optimizer: Any, p: torch.Tensor) -> torch.Tensor | None:
    """The clipped sum Opacus accumulated for ``p``: ``optimizer.grad_state[p]["summed_grad"]``
    for the FSDP optimizer, else ``p.summed_grad``."""
    state = getattr(optimizer, "grad_state", None)
    if isinstance(state, dict) and p in state:
        return state[p].get("summed_grad")
    return getattr(p, "summed_grad", None)


@dataclass(frozen=True)
class _TensorShard:
    """Where this rank's shard of one parameter tensor lies: ``dim`` is the sharded dimension
    (None: the rank holds the whole tensor), rows ``[offset, offset + length)`` of it."""

    shape: tuple[int, ...]
    dim: int | None
    offset: int
    length: int


def _chunk_span(size: int, world: int, rank: int) -> tuple[int, int]:
    """(offset, length) of ``rank``'s part of a dimension of ``size`` split by ``torch.chunk``
    into ``world`` parts (what DTensor's ``Shard`` placement does; trailing ranks may be empty)."""
    step = -(-size // world) if size else 0
    start = min(rank * step, size)
    return start, max(0, min(size, (rank + 1) * step) - start)


class ShardLayout:
    """Which rank holds and which owns each coordinate of the (global) parameter tensors.

    Args:
        params: the optimizer's trainable parameters (DTensors, plain tensors held whole).
        rank, world: this process's rank and the world size.
        data_parallel: D, the number of ranks whose clipped sums a shard's gradient averages
            (FSDP: the world size; tensor parallelism: 1).
        kind: ``"fsdp"`` or ``"tensor-parallel"`` (the report's words).

    Raises:
        ValueError: a placement the auditor cannot map (a device mesh of more than one
            dimension, a mesh not spanning the world, ``Partial``), or a local shard whose shape
            is not the ``torch.chunk`` split of the global one.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world: int, data_parallel: int,
                 kind: str) -> None:
        dt = _dtensor_type()
        self.rank, self.world = int(rank), int(world)
        self.data_parallel = int(data_parallel)
        self.kind = kind
        self.shards: list[_TensorShard] = []
        for i, p in enumerate(params):
            shape = tuple(int(s) for s in p.shape)
            if dt is None or not isinstance(p, dt):
                self.shards.append(_TensorShard(shape, None, 0, shape[0] if shape else 1))
                continue
            mesh = p.device_mesh
            if mesh.ndim != 1 or mesh.size() != self.world:
                raise ValueError(
                    f"parameter tensor {i} (shape {list(shape)}) is a DTensor on a device mesh of "
                    f"shape {tuple(mesh.shape)}; the auditor supports a one-dimensional mesh over "
                    f"all {self.world} ranks (FSDP2 or tensor parallelism, not HSDP or 2-D "
                    f"parallelism)")
            pl = p.placements[0]
            if pl.is_replicate():
                self.shards.append(_TensorShard(shape, None, 0, shape[0] if shape else 1))
                continue
            if not pl.is_shard():
                raise ValueError(f"parameter tensor {i} has placement {type(pl).__name__} "
                                 f"({pl}); the auditor reads Shard and Replicate placements "
                                 f"only")
            d = int(pl.dim) % len(shape)
            off, length = _chunk_span(shape[d], self.world, self.rank)
            want = shape[:d] + (length,) + shape[d + 1:]
            got = tuple(int(s) for s in p.to_local().shape)
            if got != want:
                raise ValueError(
                    f"parameter tensor {i} (shape {list(shape)}, {pl}): rank {self.rank}'s local "
                    f"shard has shape {list(got)}, not the torch.chunk split {list(want)}; the "
                    f"auditor cannot place canaries in an uneven sharding")
            self.shards.append(_TensorShard(shape, d, off, length))

    @property
    def sharded(self) -> bool:
        return any(s.dim is not None for s in self.shards)

    def describe(self) -> str:
        """The report's words for the sharding."""
        how = ("FSDP2: every parameter sharded over the ranks, gradients averaged by "
               "reduce-scatter" if self.kind == "fsdp" else
               "tensor parallelism: every rank sees the whole batch and holds a shard of the "
               "parameters")
        return (f"{how}; world size {self.world}; each canary injected and read on the rank "
                f"holding its shard, per-step vectors summed over the ranks (one all_reduce)")

    def localize(self, param: np.ndarray, flat: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For coordinates (tensor, global flat index): (local flat index, held, owned). The
        local index is meaningful where held; owned marks the one rank that reads it."""
        param = np.asarray(param, dtype=np.int64)
        flat = np.asarray(flat, dtype=np.int64)
        local = np.zeros_like(flat)
        held = np.zeros(flat.shape, dtype=bool)
        owned = np.zeros(flat.shape, dtype=bool)
        for i, s in enumerate(self.shards):
            sel = np.nonzero(param == i)[0]
            if not sel.size:
                continue
            if s.dim is None:
                local[sel], held[sel], owned[sel] = flat[sel], True, self.rank == 0
                continue
            multi = list(np.unravel_index(flat[sel], s.shape))
            row = multi[s.dim]
            inside = (row >= s.offset) & (row < s.offset + s.length)
            multi[s.dim] = row - s.offset
            lshape = s.shape[:s.dim] + (s.length,) + s.shape[s.dim + 1:]
            idx = np.zeros(sel.size, dtype=np.int64)
            if inside.any():
                idx[inside] = np.ravel_multi_index(tuple(m[inside] for m in multi), lshape)
            local[sel], held[sel], owned[sel] = idx, inside, inside
        return local, held, owned


def detect_layout(optimizer: Any, params: list[torch.Tensor], rank: int, world: int
                  ) -> ShardLayout | None:
    """The :class:`ShardLayout` of sharded (DTensor) parameters, None when no parameter is a
    DTensor. ValueError when DTensor parameters come with an optimizer other than Opacus's
    ``FSDPOptimizerFastGradientClipping`` (the only one Opacus shards), or under FSDP with some
    parameters left unsharded (their gradients are not averaged like the others)."""
    dt = _dtensor_type()
    if dt is None or not any(isinstance(p, dt) for p in params):
        return None
    from opacus.optimizers import FSDPOptimizerFastGradientClipping

    if not isinstance(optimizer, FSDPOptimizerFastGradientClipping):
        raise ValueError(
            f"the parameters are DTensors (sharded) but the optimizer is "
            f"{type(optimizer).__name__}, not Opacus's FSDPOptimizerFastGradientClipping "
            f"(make_private(..., grad_sample_mode=\"ghost_fsdp\") on an FSDP2 model)")
    # Opacus's tensor-parallel ghost clipping marks every trainable parameter with merge_flag
    # (GradSampleHooksFastGradientClippingTP.set_pattern_param_sample_norm_sum)
    tp = any(hasattr(p, "merge_flag") for p in params)
    if not tp and not all(isinstance(p, dt) for p in params):
        plain = [i for i, p in enumerate(params) if not isinstance(p, dt)]
        raise ValueError(f"FSDP: parameter tensors {plain} are not sharded (plain tensors) while "
                         f"the others are DTensors; shard the whole model (FSDP2Wrapper)")
    return ShardLayout(params, rank, world, data_parallel=1 if tp else world,
                       kind="tensor-parallel" if tp else "fsdp")


class _LocalCoords:
    """The coordinates of one set (design order) that this rank owns: per tensor their local flat
    indices and their positions in the set."""

    def __init__(self, coord_param: torch.Tensor, coord_flat: torch.Tensor, layout: ShardLayout,
                 device: torch.device) -> None:
        param = coord_param.numpy().astype(np.int64)
        local, _, owned = layout.localize(param, coord_flat.numpy())
        self.n = int(param.size)
        self.parts: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        for i in range(len(layout.shards)):
            sel = np.nonzero((param == i) & owned)[0]
            if sel.size:
                self.parts.append((i, torch.from_numpy(local[sel]).to(device),
                                   torch.from_numpy(sel).to(device)))

    def gather(self, tensors: list[torch.Tensor | None], what: str,
               factors: list[float] | None = None) -> torch.Tensor:
        """float64 [n]: ``tensors[i]`` (local shards) at the owned coordinates, times
        ``factors[i]``; zeros at the coordinates other ranks own."""
        out: torch.Tensor | None = None
        for i, flat, pos in self.parts:
            t = tensors[i]
            if t is None:
                raise ValueError(f"parameter tensor {i} has no {what} at the optimizer step; "
                                 f"the audit cannot observe it")
            if out is None:
                out = torch.zeros(self.n, dtype=torch.float64, device=t.device)
            v = torch.take(t, flat if flat.device == t.device else flat.to(t.device))
            v = v.to(torch.float64)
            if factors is not None:
                v = v * factors[i]
            out.index_copy_(0, pos if pos.device == out.device else pos.to(out.device), v)
        return out if out is not None else torch.zeros(self.n, dtype=torch.float64)


class ShardedGradientReader(GradientReader):
    """:class:`~.observation.GradientReader` on sharded parameters.

    The snapshot reads this rank's shard of the summed gradient at the coordinates it owns
    (zeros elsewhere, scaled by D / C); at the release one ``all_reduce`` sums, over the ranks,
    [real-data sums, noise-audit real sums, released values at the canary coordinates, released
    values at the noise-audit coordinates], after which the record is computed exactly as in one
    process (every rank gets the same record)."""

    def __init__(self, params: list[torch.nn.Parameter], design: CanaryDesign,
                 device: torch.device, check_finite_every_step: bool, compiled: bool,
                 noise_coords: tuple[torch.Tensor, torch.Tensor] | None, layout: ShardLayout,
                 summed: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        super().__init__(params, design, device, check_finite_every_step, compiled=compiled,
                         noise_coords=noise_coords)
        self.layout = layout
        self._summed = summed
        self._loc = _LocalCoords(*design.coordinates(), layout, device)
        self._loc_noise = (None if self._noise is None or noise_coords is None
                           else _LocalCoords(noise_coords[0], noise_coords[1], layout, device))
        #: the step's released values gathered over the ranks, per coordinate set (design order)
        self._stash: dict[int, torch.Tensor] = {}

    host_path = False  # the compiled pass reads whole local tensors; shards go through _gather

    def _host_arrays(self, tensors: list[torch.Tensor | None]) -> tuple[np.ndarray, ...] | None:
        return None

    @torch.no_grad()
    def snapshot(self, plan: StepPlan) -> torch.Tensor:
        sums = [local_tensor(self._summed(p)) for p in self.params]
        dp = float(self.layout.data_parallel)
        if self._loc_noise is not None:
            plan.noise_real_sum = self._loc_noise.gather(sums, "summed_grad",
                                                         [dp] * len(sums))
        return self._loc.gather(sums, "summed_grad",
                                [dp / c if c else float("inf") for c in plan.clip])

    @torch.no_grad()
    def read(self, plan: StepPlan, step: int) -> Any:
        from .ddp import all_reduce_sum

        real = plan.real_sum
        if real is None:
            raise RuntimeError("no real-data snapshot for this step")
        grads = [local_tensor(p.grad) for p in self.params]
        parts = [real.reshape(-1), self._loc.gather(grads, "gradient").to(real.device)]
        noise = self._loc_noise is not None and plan.noise_real_sum is not None
        if noise:
            assert self._loc_noise is not None and plan.noise_real_sum is not None
            parts += [plan.noise_real_sum.to(real.device),
                      self._loc_noise.gather(grads, "gradient").to(real.device)]
        if plan.n_real is not None:  # this rank's real examples (None on every rank or none)
            parts.append(torch.tensor([float(plan.n_real)], dtype=real.dtype,
                                      device=real.device))
        total = all_reduce_sum(torch.cat(parts), self.device)
        if plan.n_real is not None:
            # every rank of a data-parallel replica clipped the replica's batch: the sum over
            # the world counts each replica's examples world / D times (FSDP: D = world, once)
            layout = self.layout
            plan.n_real = int(round(float(total[-1]) * layout.data_parallel / layout.world))
        n, off = self._loc.n, 0
        plan.real_sum, off = total[:n], n
        self._stash[id(self._coords)], off = total[off:off + n], off + n
        if noise:
            assert self._loc_noise is not None and self._noise is not None
            u = self._loc_noise.n
            plan.noise_real_sum = total[off:off + u]
            self._stash[id(self._noise)] = total[off + u:off + 2 * u]
        try:
            return super().read(plan, step)
        finally:
            self._stash.clear()

    @torch.no_grad()
    def _gather(self, get: Callable[[int], torch.Tensor | None], scale: torch.Tensor,
                what: str, cs: CoordinateSet | None = None) -> torch.Tensor:
        cs = self._coords if cs is None else cs
        raw = self._stash.get(id(cs))
        if raw is None:
            raise RuntimeError(f"sharded read of the {what} outside a step's release")
        return raw.to(self.device) * scale[cs.perm]


class ShardedInjection:
    """The sharded injection strategy (ghost clipping on DTensor parameters), composed by
    :class:`~.ghost.GhostInjection`: adds the step's clipped canaries to this rank's shard of the
    summed gradient, at the entries whose coordinate it holds, as ``value / D`` (the summed
    gradient of a shard is the ranks' average; see the module docstring).

    Public interface: :meth:`inject` and :attr:`layout`.

    Args:
        optimizer: Opacus's ``FSDPOptimizerFastGradientClipping`` (its ``grad_state`` holds the
            summed gradients).
        params: its trainable parameters, in ``optimizer.params`` order.
        layout: where the shards lie.
        value: the clipped canary of a bound in a tensor's dtype and device (0-d;
            :meth:`~.ghost.GhostInjection.canary_value`).
    """

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter], layout: ShardLayout,
                 value: Callable[[float, torch.Tensor], torch.Tensor]) -> None:
        self.optimizer = optimizer
        self.params = params
        self.layout = layout
        self._value = value

    @torch.no_grad()
    def inject(self, rec: StepPlan) -> None:
        """Add the step's clipped canaries held by this rank (``rec``: the step's plan)."""
        params, flats = rec.entry_param, rec.entry_flat
        assert params is not None and flats is not None
        layout = self.layout
        local, held, _ = layout.localize(params, flats)
        dp = float(layout.data_parallel)
        opt = self.optimizer
        for i in np.unique(params[held]).tolist():
            sel = np.nonzero(held & (params == i))[0]
            p = self.params[i]
            sg = local_tensor(summed_grad_of(opt, p))
            if sg is None:
                raise RuntimeError(f"no summed gradient for parameter tensor {i} after Opacus's "
                                   f"accumulation")
            val = self._value(rec.clip[i], sg) / dp
            vals = val.expand(sel.size)
            if rec.entry_weight is not None:  # spread canaries: 1 / sqrt(L) per coordinate
                vals = vals * torch.from_numpy(rec.entry_weight[sel]).to(sg.device, sg.dtype)
            index = torch.from_numpy(local[sel]).to(sg.device)
            # the values changed kept first, to be put back on a failure
            add_at(sg, index, vals, rec.added, i)
