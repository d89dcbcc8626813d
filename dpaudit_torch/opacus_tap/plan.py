"""Facts about an Opacus DP optimizer that the adapter reads at each step, and the step's
injection plan (:class:`StepPlan`).

Opacus 1.6 (``optimizers/``): flat, per-layer (``max_grad_norms``), adaptive
(``AdaClipDPOptimizer``, its noise multiplier adjusted as in Andrew et al., NeurIPS 2021,
Theorem 1) and ghost (``DPOptimizerFastGradientClipping``) clipping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["StepPlan", "is_ghost", "is_adaclip", "per_param_clip", "effective_noise_multiplier",
           "opacus_clipped_value", "OPACUS_NORM_EPS", "joint_norm_clipping"]


#: the constant Opacus adds to per-sample norms before dividing (``optimizers/optimizer.py``)
OPACUS_NORM_EPS = 1e-6


def is_ghost(optimizer: Any) -> bool:
    from opacus.optimizers import DPOptimizerFastGradientClipping

    return isinstance(optimizer, DPOptimizerFastGradientClipping)


def per_param_clip(optimizer: Any, n_params: int) -> list[float]:
    """The clipping bound C_i that applies to each parameter tensor right now.

    Flat (and adaptive) clipping: one joint bound ``max_grad_norm`` (adaptive clipping changes it
    every step, so it is read at injection time). Per-layer clipping: ``max_grad_norms[i]``.
    """
    norms = getattr(optimizer, "max_grad_norms", None)
    if norms is not None:
        vals = [float(c) for c in norms]
        if len(vals) != n_params:
            raise RuntimeError(f"per-layer clipping has {len(vals)} bounds for {n_params} "
                               f"parameter tensors")
        return vals
    return [float(optimizer.max_grad_norm)] * n_params


#: what Opacus's own flat clipping (``DPOptimizer.clip_and_accumulate``) calls on ``self``
_STOCK_MEMBERS = ("clip_and_accumulate", "_get_flat_grad_sample", "grad_samples", "params",
                  "param_groups")
_stock: list[tuple[Any, ...]] = []


def _stock_members() -> tuple[Any, ...]:
    """Opacus's own functions behind :data:`_STOCK_MEMBERS` (empty when the class attribute is
    not code from Opacus's ``optimizers/optimizer.py``, e.g. patched before this import)."""
    if not _stock:
        from opacus.optimizers import optimizer as mod

        fns: list[Any] = []
        for name in _STOCK_MEMBERS:
            f = mod.DPOptimizer.__dict__.get(name)
            f = f.fget if isinstance(f, property) else f
            code = getattr(f, "__code__", None)
            if code is None or code.co_filename != mod.__file__ or (
                    f.__qualname__ != f"DPOptimizer.{name}"):
                fns = []
                break
            fns.append(f)
        _stock.append(tuple(fns))
    return _stock[0]


def joint_norm_clipping(optimizer: Any) -> bool:
    """True when the optimizer clips with Opacus's own ``DPOptimizer.clip_and_accumulate``:
    the class attribute and everything that method calls on ``self`` are Opacus's code (not an
    override, a subclass's or a patch), with one flat bound ``max_grad_norm``. That code clips
    each sample by the norm of the concatenation of its per-tensor gradients and treats every
    tensor alike, so clipping the canaries as one concatenated tensor gives the same sums
    (docs/design.md section 5, "Compact canary rows")."""
    stock = _stock_members()
    if not stock:
        return False
    cls = type(optimizer)
    for name, fn in zip(_STOCK_MEMBERS, stock):
        f = getattr(cls, name, None)
        if (f.fget if isinstance(f, property) else f) is not fn:
            return False
    return getattr(optimizer, "max_grad_norms", None) is None and isinstance(
        optimizer.max_grad_norm, (int, float))


def is_adaclip(optimizer: Any) -> bool:
    from opacus.optimizers import AdaClipDPOptimizer

    return isinstance(optimizer, AdaClipDPOptimizer)


def effective_noise_multiplier(optimizer: Any, adaclip: bool | None = None) -> float:
    """The noise multiplier the optimizer really uses for the gradient noise this step.

    Adaptive clipping (Andrew et al. 2021, Theorem 1) draws the gradient noise with
    ``(sigma^-2 - (2 sigma_u)^-2)^(-1/2)``; ghost clipping may carry an
    ``_adjusted_noise_multiplier``; otherwise it is ``noise_multiplier`` (what the accountant is
    told).
    """
    sigma = float(optimizer.noise_multiplier)
    if adaclip is None:
        adaclip = is_adaclip(optimizer)
    if adaclip and sigma > 0:
        return float((sigma ** -2 - (2.0 * float(optimizer.unclipped_num_std)) ** -2) ** -0.5)
    adj = getattr(optimizer, "_adjusted_noise_multiplier", None)
    if adj is not None:
        return float(adj)
    return sigma


def opacus_clipped_value(raw: float, clip: float) -> float:
    """What Opacus's flat clipping makes of a one-coordinate row of value ``raw``."""
    return raw * min(1.0, clip / (abs(raw) + OPACUS_NORM_EPS))


@dataclass
class StepPlan:
    """This step's injection plan: what the observer needs to read it (all small; tensors on
    the device)."""

    coins: torch.Tensor  # [k] bool on device: True -> the canary went to coordinate a_j
    coins_cpu: torch.Tensor  # [k] bool on host (same values)
    clip: list[float]  # C_i per parameter tensor at injection time
    unit_scale: list[float]  # per parameter: multiply p.grad by this to get units of C_i
    sigma: float  # effective noise multiplier of this step
    sigma_claimed: float  # the optimizer's noise_multiplier (what the accountant is told)
    n_rows: int  # canary rows (or clipped canaries, ghost) added this step
    n_one_run: int  # one-run canaries included this step
    injected: bool  # False on DDP ranks other than 0
    #: [k] the coins as a NumPy array (the memory ``coins_cpu`` views), None if not given
    coins_np: np.ndarray | None = None
    #: [n] one-run canaries included (host; private): :attr:`included` as a tensor
    included_np: np.ndarray | None = None
    #: [E] the parameter tensor of each canary entry (a row's entry; a spread row has L)
    entry_param: np.ndarray | None = None
    #: [E] each entry's flat index in its (real) tensor
    entry_flat: np.ndarray | None = None
    #: [E] each entry's position in the step's compact rows buffer (per-sample modes)
    entry_index: np.ndarray | None = None
    pair_order: np.ndarray | None = None  # [2k] positions of (x_j), then (y_j), in [a, b]
    #: [E] the weight of each entry (1 / sqrt(L) on spread rows), None when all are 1
    entry_weight: np.ndarray | None = None
    #: [n_params] entries per parameter tensor: the widths of its compact rows this step
    entry_counts: np.ndarray | None = None
    #: [E] the flat index of each column of the compact rows, tensor by tensor
    column_flat: np.ndarray | None = None
    #: [2k + m] the real examples' clipped sum / C at every canary coordinate, read before the
    #: canaries and the noise (summed over DDP ranks by the adapter before the observation)
    real_sum: torch.Tensor | None = None
    #: real examples clipped in this logical step, over all its micro-batches (per-sample
    #: modes: rows of ``p.grad_sample``; None under ghost clipping, whose optimizer never sees
    #: them)
    n_real: int | None = None
    #: micro-batches (clipping calls) that made up this logical step
    micro_steps: int = 1
    #: standard deviation of the Gaussian noise the optimizer should add, in the gradient's raw
    #: units: effective noise multiplier x the bound the noise is scaled with (``max_grad_norm``;
    #: per-layer clipping: the norm of the per-layer bounds)
    noise_std: float = 0.0
    #: [u] the real examples' raw sum at the noise-audit coordinates (snapshot)
    noise_real_sum: torch.Tensor | None = None
    #: (every tensor's ``summed_grad``, their flat NumPy views) as the snapshot read them
    #: (compiled CPU path only; None otherwise): the canaries' clipped sums are added through
    #: the views while the tensors are still the optimizer's
    summed_host: tuple[list[Any], tuple[np.ndarray, ...]] | None = None

    @property
    def included(self) -> torch.Tensor | None:
        """[n] int64 the one-run canaries included this step (host; a view of
        :attr:`included_np`, made when asked: the step itself reads the NumPy array)."""
        return None if self.included_np is None else torch.from_numpy(self.included_np)
