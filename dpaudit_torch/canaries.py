"""Canary design for the white-box DP-SGD audit: Dirac coordinates and the secret coins.

A *Dirac canary* is a per-sample gradient with one non-zero coordinate (parameter tensor ``i``,
flat index ``j``). Projecting the optimizer's final gradient on it is an index gather, so the
audit costs microseconds per step (docs/design.md section 5; the "Dirac canary" of Nasr et al.,
"Adversary instantiation: lower bounds for differentially private machine learning", IEEE S&P
2021, and of Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run", NeurIPS
2023).

Two disjoint pools are drawn from the auditor's own generator:

* ``k`` **sequential pairs** (a_j, b_j), both coordinates inside the same parameter tensor. At
  every step a fresh fair coin chooses which of the two receives the canary (randomized roles,
  docs/design.md section 5);
* ``m`` **one-run canaries**, each IN with probability 1/2 (a secret coin drawn from a separate
  generator), an IN canary being included at each step with the data loader's Poisson rate
  (docs/design.md section 6).

Coordinates are spread over every trainable parameter tensor in proportion to its size, with at
least one pair and one one-run canary per tensor where the counts allow it (a bug may affect
only some tensors), and never collide.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["CanaryDesign", "allocate", "draw_design", "derive_seeds", "SecretCoins",
           "draw_noise_coordinates", "noise_allotment", "NOISE_COORDINATES_FLOOR",
           "add_spread_pairs"]

#: under a cap on the noise-audit coordinates (``noise_coordinates_total``) every tensor still
#: gets at least this many (or all it has): at 256 coordinates a tensor whose noise std is 0.8
#: of the claimed one gives its variance test about 11 nats of evidence per step
NOISE_COORDINATES_FLOOR = 256


def derive_seeds(seed: int | None) -> tuple[dict[str, int], str]:
    """Independent 63-bit seeds for the auditor's three streams, and the seed policy in words.

    Streams: ``"design"`` (canary coordinates), ``"mechanics"`` (role coins and Poisson inclusion
    of IN canaries, drawn every step) and ``"secret"`` (the IN/OUT coins). With ``seed=None`` each
    stream is seeded from OS entropy (:mod:`secrets`), so two unseeded auditors differ.
    """
    names = ("design", "mechanics", "secret")
    if seed is None:
        return {n: secrets.randbits(63) for n in names}, "os-entropy"
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {seed!r} ({type(seed).__name__})")
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed!r}")
    states = np.random.SeedSequence(int(seed)).spawn(len(names))
    out = {n: int(s.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
           for n, s in zip(names, states)}
    return out, f"seeded ({int(seed)})"


def allocate(total: int, sizes: list[int], minimum: int = 1) -> list[int]:
    """Split ``total`` items over tensors of the given capacities, proportionally to capacity.

    Every tensor with capacity gets at least ``minimum`` when ``total`` allows it (largest tensors
    first), the rest is distributed by the largest-remainder method; no tensor exceeds its
    capacity. Raises ValueError if the capacities cannot hold ``total``.
    """
    cap = np.asarray(sizes, dtype=np.int64)
    if total > int(cap.sum()):
        raise ValueError(f"cannot place {total} canary slots in parameter tensors holding only "
                         f"{int(cap.sum())}; use fewer canaries (k_pairs / m_canaries)")
    out = np.zeros_like(cap)
    order = np.argsort(-cap, kind="stable")
    eligible = [i for i in order if cap[i] >= minimum]
    base = min(minimum, total // max(len(eligible), 1)) if eligible else 0
    if base > 0:
        for i in eligible:
            out[i] = base
    remaining = total - int(out.sum())
    while remaining > 0:
        free = cap - out
        w = np.where(free > 0, cap.astype(np.float64), 0.0)
        share = w / w.sum() * remaining
        add = np.minimum(np.floor(share).astype(np.int64), free)
        if add.sum() == 0:  # hand out one by one, largest remainder first
            frac = np.where(free > 0, share - np.floor(share), -1.0)
            for i in np.argsort(-frac, kind="stable")[:remaining]:
                if free[i] > 0:
                    add[i] += 1
        out += add
        remaining = total - int(out.sum())
    return out.tolist()


@dataclass
class CanaryDesign:
    """Where the canaries live. Coordinates are (parameter index, flat index) in ``params`` order.

    Attributes:
        shapes: shape of every trainable parameter tensor (the optimizer's ``params`` order).
        pair_param, pair_a, pair_b: [k] parameter index and the two flat indices of each pair.
        one_param, one_flat: [m] parameter index and flat index of each one-run canary, sorted by
            parameter index (so the canaries of one tensor are contiguous).
        spread_pair: [s] which pairs are *spread*: their canary has equal mass 1/sqrt(L) on L
            coordinates in L different tensors (docs/design.md section 11), the pair's own
            coordinate (in ``pair_param``) and L - 1 extra ones per side.
        spread_param, spread_a, spread_b: [s, L - 1] tensor and flat index of the extra
            coordinates of each spread pair's side a and side b.
    """

    shapes: list[tuple[int, ...]]
    pair_param: torch.Tensor
    pair_a: torch.Tensor
    pair_b: torch.Tensor
    one_param: torch.Tensor
    one_flat: torch.Tensor
    kind: str = "dirac"
    extra: dict[str, Any] = field(default_factory=dict)
    spread_pair: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    spread_param: torch.Tensor = field(
        default_factory=lambda: torch.zeros((0, 0), dtype=torch.long))
    spread_a: torch.Tensor = field(default_factory=lambda: torch.zeros((0, 0), dtype=torch.long))
    spread_b: torch.Tensor = field(default_factory=lambda: torch.zeros((0, 0), dtype=torch.long))

    @property
    def n_spread(self) -> int:
        """Spread pairs (s)."""
        return int(self.spread_pair.numel())

    @property
    def spread_width(self) -> int:
        """L, the tensors a spread canary covers (1 without spread pairs)."""
        return int(self.spread_param.shape[1]) + 1 if self.n_spread else 1

    @property
    def n_extra(self) -> int:
        """Extra coordinates of the spread pairs, both sides: 2 s (L - 1)."""
        return int(2 * self.spread_param.numel())

    @property
    def layer_width(self) -> int:
        """|S|: the tensors each one-run canary spans (a layered design under per-layer
        clipping, :mod:`dpaudit_torch.canary_layers`); 1 for Dirac one-run canaries."""
        lay = self.extra.get("layers")
        return int(lay["width"]) if lay else 1

    @property
    def k_pairs(self) -> int:
        return int(self.pair_param.numel())

    @property
    def m_canaries(self) -> int:
        return int(self.one_param.numel())

    @property
    def n_params(self) -> int:
        return len(self.shapes)

    def coordinates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All canary coordinates in the order [pair a (k), pair b (k), one-run (m), spread
        extras of side a (s (L - 1)), spread extras of side b (s (L - 1))]."""
        params = torch.cat([self.pair_param, self.pair_param, self.one_param,
                            self.spread_param.reshape(-1), self.spread_param.reshape(-1)])
        flats = torch.cat([self.pair_a, self.pair_b, self.one_flat, self.spread_a.reshape(-1),
                           self.spread_b.reshape(-1)])
        return params, flats

    def spread_sides(self) -> tuple[np.ndarray, np.ndarray]:
        """[s, L] design-order positions of every coordinate of each spread pair's side a and
        side b (the pair's own coordinate first)."""
        k, m, s = self.k_pairs, self.m_canaries, self.n_spread
        if not s:
            return np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.int64)
        L1 = self.spread_width - 1
        base = 2 * k + m
        j = self.spread_pair.numpy().astype(np.int64)
        extra = np.arange(s * L1, dtype=np.int64).reshape(s, L1)
        side_a = np.concatenate([j[:, None], base + extra], axis=1)
        side_b = np.concatenate([(k + j)[:, None], base + s * L1 + extra], axis=1)
        return side_a, side_b

    def summary(self) -> dict[str, Any]:
        """Per-tensor counts (plain types) for the report."""
        per = []
        for i, shape in enumerate(self.shapes):
            per.append({
                "param_index": i,
                "shape": list(shape),
                "numel": int(np.prod(shape)) if shape else 1,
                "pairs": int((self.pair_param == i).sum()),
                "one_run": int((self.one_param == i).sum()),
            })
        out = {"design": self.kind, "k_pairs": self.k_pairs, "m_one_run": self.m_canaries,
               "spread_pairs": self.n_spread, "spread_tensors": self.spread_width,
               "per_parameter": per}
        if self.extra.get("layers"):
            # a layered design: m_one_run counts canaries, each of layer_width coordinates
            lay = dict(self.extra["layers"])
            out.update(m_one_run=int(lay["canaries"]), one_run_coordinates=self.m_canaries,
                       layers=lay)
        return out

    def to_state(self) -> dict[str, Any]:
        return {"shapes": [list(s) for s in self.shapes], "kind": self.kind,
                "pair_param": self.pair_param.clone(), "pair_a": self.pair_a.clone(),
                "pair_b": self.pair_b.clone(), "one_param": self.one_param.clone(),
                "one_flat": self.one_flat.clone(), "spread_pair": self.spread_pair.clone(),
                "spread_param": self.spread_param.clone(), "spread_a": self.spread_a.clone(),
                "spread_b": self.spread_b.clone(), "extra": dict(self.extra)}

    @classmethod
    def from_state(cls, sd: dict[str, Any]) -> CanaryDesign:
        """Inverse of :meth:`to_state` (checkpoints)."""
        return cls(shapes=[tuple(int(v) for v in s) for s in sd["shapes"]],
                   pair_param=sd["pair_param"].long().cpu(), pair_a=sd["pair_a"].long().cpu(),
                   pair_b=sd["pair_b"].long().cpu(), one_param=sd["one_param"].long().cpu(),
                   one_flat=sd["one_flat"].long().cpu(), kind=str(sd.get("kind", "dirac")),
                   spread_pair=sd["spread_pair"].long().cpu(),
                   spread_param=sd["spread_param"].long().cpu(),
                   spread_a=sd["spread_a"].long().cpu(), spread_b=sd["spread_b"].long().cpu(),
                   extra=dict(sd.get("extra") or {}))


def draw_design(shapes: list[tuple[int, ...]], k_pairs: int, m_canaries: int,
                generator: torch.Generator) -> CanaryDesign:
    """Draw k disjoint coordinate pairs and m one-run coordinates, none colliding.

    Pairs are allocated over tensors in proportion to ``numel // 2`` (each pair lives inside one
    tensor), the one-run canaries in proportion to what remains; inside each tensor the
    coordinates are one uniformly random permutation prefix (``torch.randperm`` on ``generator``).
    """
    numels = [int(np.prod(s)) if len(s) else 1 for s in shapes]
    if not numels:
        raise ValueError("the optimizer has no trainable parameters to place canaries in")
    pairs_per = allocate(k_pairs, [n // 2 for n in numels]) if k_pairs else [0] * len(numels)
    left = [n - 2 * p for n, p in zip(numels, pairs_per)]
    ones_per = allocate(m_canaries, left) if m_canaries else [0] * len(numels)
    pp, pa, pb, op, of = [], [], [], [], []
    for i, n in enumerate(numels):
        need = 2 * pairs_per[i] + ones_per[i]
        if need == 0:
            continue
        if n <= 4 * need or n <= 1 << 16:
            idx = torch.randperm(n, generator=generator)[:need]
        else:  # sample without replacement by rejection, without an O(n) permutation
            chosen: list[int] = []
            seen: set[int] = set()
            while len(chosen) < need:
                cand = torch.randint(0, n, (2 * (need - len(chosen)),), generator=generator)
                for c in cand.tolist():
                    if c not in seen:
                        seen.add(c)
                        chosen.append(c)
                        if len(chosen) == need:
                            break
            idx = torch.tensor(chosen, dtype=torch.long)
        k_i = pairs_per[i]
        pp.append(torch.full((k_i,), i, dtype=torch.long))
        pa.append(idx[:k_i])
        pb.append(idx[k_i:2 * k_i])
        op.append(torch.full((ones_per[i],), i, dtype=torch.long))
        of.append(idx[2 * k_i:])

    def cat(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs).long() if xs else torch.zeros(0, dtype=torch.long)

    return CanaryDesign(shapes=[tuple(s) for s in shapes], pair_param=cat(pp), pair_a=cat(pa),
                        pair_b=cat(pb), one_param=cat(op), one_flat=cat(of))


def noise_allotment(available: list[int], per_tensor: int, total: int | None) -> list[int]:
    """How many noise-audit coordinates each tensor gets: ``min(per_tensor, available[i])``,
    unless these add up to more than ``total``; then every tensor gets at most a common level,
    the largest one whose sum stays within ``total`` (small tensors keep all they have, the
    others are cut to the level), but never fewer than :data:`NOISE_COORDINATES_FLOOR` (or all
    it has): a model with more than ``total / NOISE_COORDINATES_FLOOR`` tensors exceeds
    ``total``. ``total`` None: no cap."""
    avail = [max(0, min(int(per_tensor), int(a))) for a in available]
    if total is None or sum(avail) <= total:
        return avail
    lo, hi = 0, max(avail)  # the largest level L with sum(min(a, L)) <= total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(a, mid) for a in avail) <= total:
            lo = mid
        else:
            hi = mid - 1
    level = max(lo, min(NOISE_COORDINATES_FLOOR, int(per_tensor)))
    return [min(a, level) for a in avail]


def draw_noise_coordinates(design: CanaryDesign, per_tensor: int, generator: torch.Generator,
                           total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random subset U of coordinates of every tensor for the noise audit
    (docs/design.md section 11): up to ``per_tensor`` coordinates of each tensor, and at most
    ``total`` in all (:func:`noise_allotment`), none of them a canary coordinate, at random
    from ``generator``: uniformly where they are at least a quarter of a tensor's free
    coordinates (a uniform draw then has about want / 4 adjacent pairs),
    else structured (:func:`_structured_coordinates`: neighbours and aligned positions, so
    that the whole-null test's pairs are observed on large tensors too). Returns (param, flat)
    int64 tensors, tensor-major. Where the cap does not bind the draw is the uncapped one (same
    coordinates from the same generator)."""
    coord_param, coord_flat = design.coordinates()
    taken: dict[int, set[int]] = {}
    for i, f in zip(coord_param.tolist(), coord_flat.tolist()):
        taken.setdefault(i, set()).add(f)
    numels = [int(np.prod(shape)) if len(shape) else 1 for shape in design.shapes]
    wants = noise_allotment([n - len(taken.get(i, ())) for i, n in enumerate(numels)],
                            per_tensor, total)
    params, flats = [], []
    previous: list[int] = []  # the previous tensor's coordinates, in draw order
    for i, n in enumerate(numels):
        busy = taken.get(i, set())
        want = wants[i]
        if want <= 0:
            continue
        shape = design.shapes[i]
        if 4 * want < n - len(busy):  # a small share: structured, so pairs of U are observed
            stride = n // int(shape[0]) if len(shape) >= 2 and int(shape[0]) >= 2 else 0
            chosen = _structured_coordinates(n, want, busy, stride, previous, generator)
            previous = list(chosen)
            chosen.sort()
            params.append(torch.full((len(chosen),), i, dtype=torch.long))
            flats.append(torch.tensor(chosen, dtype=torch.long))
            continue
        if n <= 4 * (want + len(busy)) or n <= 1 << 16:
            perm = torch.randperm(n, generator=generator).tolist()
            chosen = [c for c in perm if c not in busy][:want]
        else:  # rejection sampling without an O(n) permutation
            chosen, seen = [], set(busy)
            while len(chosen) < want:
                for c in torch.randint(0, n, (2 * (want - len(chosen)),),
                                       generator=generator).tolist():
                    if c not in seen:
                        seen.add(c)
                        chosen.append(c)
                        if len(chosen) == want:
                            break
        previous = list(chosen)
        chosen.sort()
        params.append(torch.full((len(chosen),), i, dtype=torch.long))
        flats.append(torch.tensor(chosen, dtype=torch.long))
    if not params:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(params), torch.cat(flats)


def _structured_coordinates(n: int, want: int, busy: set[int], stride: int,
                            previous: list[int], generator: torch.Generator) -> list[int]:
    """``want`` distinct coordinates of a tensor of ``n`` (none in ``busy``) of which a useful
    share come in the pairs the whole-null noise test bets on (docs/design.md section 11): a
    quarter at the previous tensor's positions (the same flat index in two tensors), the rest
    as random anchors a with their neighbours a + 1 (the next element) and a + ``stride`` (the
    same position of the next output row; 0: none). Drawn from ``generator`` only, before any
    noise is seen."""
    seen = set(busy)
    chosen: list[int] = []

    def take(c: int) -> None:
        if len(chosen) < want and 0 <= c < n and c not in seen:
            seen.add(c)
            chosen.append(c)

    for c in previous[:want // 4]:
        take(c)
    while len(chosen) < want:
        for a in torch.randint(0, n, (max(8, want - len(chosen)),), generator=generator).tolist():
            take(a)
            take(a + 1)
            if stride:
                take(a + stride)
            if len(chosen) >= want:
                break
    return chosen


def add_spread_pairs(design: CanaryDesign, n_spread: int, width: int,
                     generator: torch.Generator) -> CanaryDesign:
    """Make ``n_spread`` of the design's pairs spread canaries over ``width`` tensors: the pairs
    whose own tensor is among the largest are chosen, and each side gets one fresh coordinate
    (never a canary coordinate) in each of the ``width - 1`` largest other tensors. Returns the
    design unchanged when fewer than two tensors exist or ``n_spread`` is 0."""
    numels = [int(np.prod(sh)) if len(sh) else 1 for sh in design.shapes]
    L = min(int(width), len(numels))
    s = min(int(n_spread), design.k_pairs)
    if L < 2 or s < 1:
        return design
    taken: dict[int, set[int]] = {}
    cp, cf = design.coordinates()
    for i, f in zip(cp.tolist(), cf.tolist()):
        taken.setdefault(i, set()).add(f)
    order = sorted(range(len(numels)), key=lambda i: -numels[i])
    pairs = sorted(range(design.k_pairs),
                   key=lambda j: -numels[int(design.pair_param[j])])[:s]
    # tensors with room for two fresh coordinates per spread pair (a small tensor full of
    # canaries is skipped); every spread pair covers the same number L of tensors
    need = 2 * s
    room = [i for i in order if numels[i] - len(taken.get(i, set())) >= need]
    L = min(L, 1 + min(len([i for i in room if i != int(design.pair_param[j])])
                       for j in pairs))
    if L < 2:
        return design
    sp, sa, sb = [], [], []
    for j in pairs:
        own = int(design.pair_param[j])
        others = [i for i in room if i != own][:L - 1]
        row_p, row_a, row_b = [], [], []
        for i in others:
            busy = taken.setdefault(i, set())
            picks: list[int] = []
            while len(picks) < 2:
                c = int(torch.randint(0, numels[i], (1,), generator=generator))
                if c not in busy:
                    busy.add(c)
                    picks.append(c)
            row_p.append(i)
            row_a.append(picks[0])
            row_b.append(picks[1])
        sp.append(row_p)
        sa.append(row_a)
        sb.append(row_b)
    return dataclasses.replace(
        design, spread_pair=torch.tensor(pairs, dtype=torch.long),
        spread_param=torch.tensor(sp, dtype=torch.long),
        spread_a=torch.tensor(sa, dtype=torch.long), spread_b=torch.tensor(sb, dtype=torch.long))


class SecretCoins:
    """The IN/OUT coins of the one-run canaries (IN with probability 1/2).

    Drawn once from their own generator; the coins are kept private and are only handed out by
    :meth:`reveal` (called by ``PrivacyAuditor.finalize``). ``repr`` and ``str`` never show them.
    """

    __slots__ = ("_in", "_revealed")

    def __init__(self, m: int, generator: torch.Generator) -> None:
        self._in = torch.rand(m, generator=generator, dtype=torch.float64) < 0.5
        self._revealed = False

    def __repr__(self) -> str:
        return f"SecretCoins(m={self._in.numel()}, revealed={self._revealed})"

    __str__ = __repr__

    @classmethod
    def from_state(cls, mask: torch.Tensor, revealed: bool) -> SecretCoins:
        """Rebuild from :meth:`state` (a checkpoint); ValueError if ``mask`` is not a 1-d
        tensor."""
        if not isinstance(mask, torch.Tensor) or mask.dim() != 1:
            raise ValueError(f"secret coins must be a 1-d tensor, got {mask!r:.80}")
        obj = cls.__new__(cls)
        obj._in = mask.detach().to(device="cpu", dtype=torch.bool).clone()
        obj._revealed = bool(revealed)
        return obj

    def state(self) -> tuple[torch.Tensor, bool]:
        """(IN mask, revealed) for a checkpoint, without marking the coins revealed. A
        checkpoint holds the secret: keep it as private as the model's weights."""
        return self._in.clone(), self._revealed

    @property
    def revealed(self) -> bool:
        return self._revealed

    @property
    def m(self) -> int:
        """Number of coins (one-run canaries)."""
        return int(self._in.numel())

    def sampling_mask(self) -> torch.Tensor:
        """The IN mask for the injector, which includes IN canaries at each step (shares memory
        with the coins; does not mark them revealed). Nothing the training reads may use it."""
        return self._in

    def reveal(self) -> torch.Tensor:
        """The IN mask (bool [m]); marks the coins as revealed."""
        self._revealed = True
        return self._in.clone()


def draw_audit_canaries(shapes: list[tuple[int, ...]], k_pairs: int, m_canaries: int,
                        seeds: dict[str, int], spread: tuple[int, int] | None,
                        noise_per_tensor: int, noise_total: int | None
                        ) -> tuple[CanaryDesign, tuple[torch.Tensor, torch.Tensor], SecretCoins]:
    """Everything an audit draws before its first step, from the seeds of
    :func:`derive_seeds`: the canary design (with ``spread = (pairs, width)`` spread pairs, or
    None), then the noise-audit coordinates from the same stream, and the secret coins."""
    gen = torch.Generator().manual_seed(seeds["design"])
    design = draw_design(shapes, k_pairs, m_canaries, gen)
    if spread is not None:
        design = add_spread_pairs(design, spread[0], spread[1], gen)
    noise = draw_noise_coordinates(design, noise_per_tensor, gen, noise_total)
    return design, noise, SecretCoins(m_canaries, torch.Generator().manual_seed(seeds["secret"]))
