"""One-run canaries for per-layer clipping: each canary spans a set of parameter tensors
(docs/design.md section 5, "Per-layer clipping").

Opacus's ``DPPerLayerOptimizer`` (``make_private(clipping="per_layer", max_grad_norm=[C_l ...])``)
clips tensor l of every per-sample gradient to its own bound C_l and adds noise of standard
deviation sigma C to every coordinate, C^2 = sum_l C_l^2. A Dirac canary in tensor l contributes
C_l, so its release is DP-SGD at noise multiplier sigma C / C_l: a fraction C_l / C of the power
the claim's worst-case example has (about 1 / sqrt(#tensors) with equal bounds).

A *layered* canary has one Dirac coordinate in each tensor of a set S. Its component in tensor l
has raw value ``canary_norm * C_l`` and is clipped to C_l by the optimizer's own per-layer
clipping, so the canary contributes C_S = sqrt(sum over S of C_l^2). Projecting the release on
the canary's unit direction (weight C_l / C_S on its coordinate in tensor l) gives, per step and
in units of C,

    Z = (C_S / C) B + N(0, sigma^2)

(the noise is iid N(0, sigma^2 C^2) on every coordinate, and the weights have unit norm): the
white-box DP-SGD family with contribution c = C_S / C (docs/design.md section 13). Each
observed component is in units of its own C_l (z_l = g_l / C_l), so Z = sum_l C_l^2 / (C_S C) z_l.

Per-layer clipping clips every tensor of a row separately, so a row with components in several
tensors gives the same clipped sum as one row per component: the injector adds a layered canary
as |S| Dirac rows that share one Poisson inclusion draw and one secret coin. In the design the
one-run coordinates are tensor-major: member l of canary j (j < G canaries) is Dirac canary
``l G + j``.

Which S: canaries in S need a fresh coordinate each in every tensor of S, so G is at most the
free coordinates of the smallest tensor in S (Dirac coordinates; orthogonal components would not
do better: a tensor of n coordinates holds at most n orthogonal ones). Larger S raise c and lower
G. For a fixed smallest tensor every tensor with at least as many free coordinates belongs in S
(it only raises C_S), so the candidates are nested; :func:`choose_layout` takes the one whose
median white-box lower confidence bound on rho = c / sigma is the largest under the exact law
(the bound on epsilon is increasing in it), at the claimed sigma and q and a planning horizon of
:func:`planning_steps` steps (the run's length is not known when the canaries are drawn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .canaries import CanaryDesign, SecretCoins, draw_design, draw_noise_coordinates

__all__ = ["LayerLayout", "choose_layout", "draw_layered_canaries", "planning_steps", "layout_of",
           "draw_canaries_for", "reached_contribution",
           "PLAN_EPOCHS", "PLAN_MIN_STEPS", "MIN_GROUPS"]

#: the planning horizon of the layout's choice: this many epochs (1 / q steps each) ...
PLAN_EPOCHS = 5
#: ... but at least this many steps
PLAN_MIN_STEPS = 100
#: a layout needs at least this many canaries (the white-box law needs 1 IN and 2 OUT)
MIN_GROUPS = 8


def planning_steps(q: float) -> int:
    """The steps the layout is chosen for: ``max(PLAN_MIN_STEPS, PLAN_EPOCHS / q)``."""
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sample rate q must be in (0, 1], got {q!r}")
    return max(PLAN_MIN_STEPS, int(math.ceil(PLAN_EPOCHS / q)))


@dataclass(frozen=True)
class LayerLayout:
    """Where the layered canaries live and what they contribute.

    Attributes:
        tensors: S, the parameter indices (ascending) every canary spans.
        clips: C_l of each tensor of S (the optimizer's per-layer bounds at attach).
        total_clip: C, the norm of all per-layer bounds (the noise is sigma C).
        groups: G, the layered canaries (the design holds G |S| Dirac coordinates).
    """

    tensors: tuple[int, ...]
    clips: tuple[float, ...]
    total_clip: float
    groups: int

    def __post_init__(self) -> None:
        if len(self.tensors) != len(self.clips) or not self.tensors:
            raise ValueError(f"a layout needs one bound per tensor, got tensors {self.tensors} "
                             f"and bounds {self.clips}")
        if not all(c > 0 and math.isfinite(c) for c in self.clips) or not (
                self.total_clip > 0 and math.isfinite(self.total_clip)):
            raise ValueError(f"per-layer bounds must be finite and > 0, got {self.clips} "
                             f"(total {self.total_clip!r})")
        if self.groups < 1:
            raise ValueError(f"a layout needs at least one canary, got {self.groups!r}")

    @property
    def width(self) -> int:
        """|S|: the Dirac rows of one layered canary."""
        return len(self.tensors)

    @property
    def span_clip(self) -> float:
        """C_S = sqrt(sum over S of C_l^2): what one canary contributes (raw units)."""
        return math.sqrt(sum(c * c for c in self.clips))

    @property
    def contribution(self) -> float:
        """c = C_S / C: the canary's contribution in units of C (1: the claim's full C)."""
        return min(1.0, self.span_clip / self.total_clip)

    def weights(self) -> np.ndarray:
        """[|S|] the weight of each member's value (units of its C_l) in the canary's value
        (units of C): C_l^2 / (C_S C)."""
        c = np.asarray(self.clips, dtype=np.float64)
        return c * c / (self.span_clip * self.total_clip)

    def combine(self, z: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """The G canaries' values (units of C) from the G |S| members' values, tensor-major
        (each in units of its own C_l): one matrix product."""
        if isinstance(z, torch.Tensor):
            # the weights copied to z's device once per (device, dtype), not at every step
            key = (str(z.device), z.dtype)
            cache = self.__dict__.setdefault("_device_weights", {})
            wt = cache.get(key)
            if wt is None:
                wt = cache[key] = torch.as_tensor(self.weights(), dtype=z.dtype,
                                                  device=z.device)
            return wt @ z.reshape(self.width, self.groups)
        return self.weights() @ np.asarray(z).reshape(self.width, self.groups)

    def group_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The canaries' IN mask [G] from the members' [G |S|] (a canary's members share it)."""
        return mask[:self.groups]

    def to_dict(self) -> dict[str, Any]:
        """Plain types for the report."""
        return {"tensors": list(self.tensors), "clips": list(self.clips),
                "total_clip": self.total_clip, "canaries": self.groups, "width": self.width,
                "contribution": self.contribution}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerLayout:
        """Inverse of :meth:`to_dict` (checkpoints)."""
        return cls(tuple(int(t) for t in d["tensors"]), tuple(float(c) for c in d["clips"]),
                   float(d["total_clip"]), int(d["canaries"]))


def _median_rho_lower(c: float, sigma: float, q: float, steps: int, groups: int,
                      alpha: float) -> float:
    """The median of the white-box lower confidence bound on rho for G canaries of contribution
    c (exact law; the IN count at its mean)."""
    from .stats.whitebox import ReleaseLaw

    n_in = groups // 2
    law = ReleaseLaw(n_in, groups - n_in, steps, q)
    rho = c / sigma if sigma > 0 else 1e6
    return law.rho_lower_bound(law.quantile(0.5, rho), alpha)


def choose_layout(free: list[int], clips: list[float], budget: int, sigma: float, q: float,
                  steps: int | None = None, alpha: float = 1e-3) -> LayerLayout | None:
    """The layout of the largest median white-box bound (module docstring).

    Args:
        free: coordinates each tensor has for one-run canaries (its size less the pairs').
        clips: the per-layer bounds C_l (every tensor's).
        budget: at most this many Dirac coordinates in all (G |S| <= budget).
        sigma, q: the claimed noise multiplier and sample rate.
        steps: the planning horizon (None: :func:`planning_steps`).
        alpha: the white-box bound's level.

    Returns None when no layout has :data:`MIN_GROUPS` canaries. Ties go to the wider S.
    """
    if len(free) != len(clips):
        raise ValueError(f"{len(free)} tensors but {len(clips)} per-layer bounds")
    if any(not (c >= 0 and math.isfinite(c)) for c in clips):
        raise ValueError(f"per-layer bounds must be finite and >= 0, got {clips}")
    total = math.sqrt(sum(float(c) ** 2 for c in clips))
    if not total > 0:
        raise ValueError(f"the per-layer bounds are all zero: {clips}")
    horizon = planning_steps(q) if steps is None else int(steps)
    usable = [i for i, (f, c) in enumerate(zip(free, clips)) if f >= 1 and c > 0]
    best: tuple[float, float, LayerLayout] | None = None
    for level in sorted({int(free[i]) for i in usable}):
        span = sorted(i for i in usable if free[i] >= level)
        groups = min(level, int(budget) // len(span))
        if groups < MIN_GROUPS:
            continue
        lay = LayerLayout(tuple(span), tuple(float(clips[i]) for i in span), total, groups)
        score = _median_rho_lower(lay.contribution, float(sigma), float(q), horizon, groups,
                                  alpha)
        key = (score, lay.contribution)
        if best is None or key > best[:2]:
            best = (score, lay.contribution, lay)
    return None if best is None else best[2]


def draw_layered_canaries(shapes: list[tuple[int, ...]], k_pairs: int, budget: int,
                          clips: list[float], sigma: float, q: float, seeds: dict[str, int],
                          noise_per_tensor: int, noise_total: int | None, alpha: float = 1e-3
                          ) -> tuple[CanaryDesign, tuple[torch.Tensor, torch.Tensor],
                                     SecretCoins, LayerLayout] | None:
    """The per-layer counterpart of :func:`~dpaudit_torch.canaries.draw_audit_canaries`: the
    pairs as there, then the layered one-run canaries of :func:`choose_layout` (their
    coordinates tensor-major, uniformly at random among each tensor's free ones), the
    noise-audit coordinates, and secret coins shared by each canary's members. None when no
    layout fits (the caller keeps the Dirac design)."""
    gen = torch.Generator().manual_seed(seeds["design"])
    base = draw_design(shapes, k_pairs, 0, gen)
    numels = [int(np.prod(s)) if len(s) else 1 for s in shapes]
    taken: dict[int, set[int]] = {}
    for i, f in zip(*(t.tolist() for t in base.coordinates())):
        taken.setdefault(i, set()).add(f)
    free = [n - len(taken.get(i, ())) for i, n in enumerate(numels)]
    layout = choose_layout(free, clips, budget, sigma, q, alpha=alpha)
    if layout is None:
        return None
    params, flats = [], []
    for i in layout.tensors:
        busy = taken.get(i, set())
        perm = torch.randperm(numels[i], generator=gen).tolist() if numels[i] <= 1 << 22 \
            else None
        if perm is not None:
            chosen = [c for c in perm if c not in busy][:layout.groups]
        else:  # a huge tensor: rejection sampling, no O(n) permutation
            chosen, seen = [], set(busy)
            while len(chosen) < layout.groups:
                for c in torch.randint(0, numels[i], (2 * layout.groups,),
                                       generator=gen).tolist():
                    if c not in seen and len(chosen) < layout.groups:
                        seen.add(c)
                        chosen.append(c)
        params.append(torch.full((layout.groups,), i, dtype=torch.long))
        flats.append(torch.tensor(chosen, dtype=torch.long))
    design = CanaryDesign(shapes=base.shapes, pair_param=base.pair_param, pair_a=base.pair_a,
                          pair_b=base.pair_b, one_param=torch.cat(params),
                          one_flat=torch.cat(flats), kind="layered",
                          extra={"layers": layout.to_dict()})
    noise = draw_noise_coordinates(design, noise_per_tensor, gen, noise_total)
    group_coins = SecretCoins(layout.groups, torch.Generator().manual_seed(seeds["secret"]))
    mask, _ = group_coins.state()
    coins = SecretCoins.from_state(mask.repeat(layout.width), False)
    return design, noise, coins, layout


def layout_of(design: CanaryDesign) -> LayerLayout | None:
    """The layout of a layered design (None for Dirac one-run canaries)."""
    lay = design.extra.get("layers")
    return LayerLayout.from_dict(lay) if lay else None


def reached_contribution(power: dict[str, Any], layout: LayerLayout, sigma: float, q: float,
                         steps: int, delta: float) -> dict[str, Any]:
    """Complete a white-box power statement computed at the canaries' noise multiplier
    sigma / c (``whitebox_power(sigma / c, ...)``) for a layered design, in place: the
    contribution ``c`` they reach, the layout, the refutable noise multiplier in the claim's
    units (c times the canaries'), and ``release_epsilon``: the epsilon of the canaries' own
    release at the claimed sigma (the PRV estimate at sigma / c), which a correct run's bound
    approaches with many canaries and cannot exceed at the bound's level, below the claim when
    c < 1. Returns ``power``."""
    from .stats.whitebox import dpsgd_epsilon

    c = layout.contribution
    power["c"] = c
    power["layers"] = layout.to_dict()
    if power.get("min_refutable_sigma") is not None:
        power["min_refutable_sigma"] = float(power["min_refutable_sigma"]) * c
    power["release_epsilon"] = (dpsgd_epsilon(sigma / c, q, int(steps), delta, "estimate")
                                if sigma > 0 and steps > 0 else None)
    if c < 1.0 and power["release_epsilon"] is not None:
        power["contribution_note"] = (
            f"per-layer clipping: the one-run canaries span {layout.width} parameter tensors "
            f"and contribute {c:.3g} C, not the claim's full C; a correct run's white-box bound "
            f"stays near the epsilon of their release ({power['release_epsilon']:.3g})")
    return power


def draw_canaries_for(tap: Any, config: Any, seeds: dict[str, int]
                      ) -> tuple[CanaryDesign, tuple[torch.Tensor, torch.Tensor], SecretCoins,
                                 Any]:
    """What the auditor draws before the first step for the run behind ``tap`` (an
    :class:`~dpaudit_torch.opacus_tap.OpacusTap`): under per-layer clipping (per-sample modes)
    the layered one-run canaries of :func:`draw_layered_canaries`, the configuration's
    ``m_canaries`` then the coordinates they use; else, or when no layout fits (or the sample
    rate is not in (0, 1]), the Dirac
    design of :func:`~dpaudit_torch.canaries.draw_audit_canaries` (spread pairs except under
    per-layer clipping). Returns (design, noise-audit coordinates, coins, configuration)."""
    from .canaries import draw_audit_canaries

    per_layer = bool(tap.clipping()[1])
    q = tap.sample_rate
    if per_layer and not tap.ghost and isinstance(q, (int, float)) and 0.0 < q <= 1.0:
        from .opacus_tap.plan import per_param_clip

        layered = draw_layered_canaries(
            tap.shapes, config.k_pairs, config.m_canaries,
            per_param_clip(tap.optimizer, len(tap.shapes)), tap.noise_multiplier(),
            float(q), seeds, config.noise_coordinates_per_tensor,
            config.noise_coordinates_total)
        if layered is not None:
            design, noise, coins, _ = layered
            return design, noise, coins, config.replace(m_canaries=design.m_canaries)
    design, noise, coins = draw_audit_canaries(
        tap.shapes, config.k_pairs, config.m_canaries, seeds,
        None if per_layer else (config.spread_pairs, config.spread_tensors),
        config.noise_coordinates_per_tensor, config.noise_coordinates_total)
    return design, noise, coins, config
