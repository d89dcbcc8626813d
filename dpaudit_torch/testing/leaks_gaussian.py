"""Contract bugs of the gaussian clause (:mod:`dpaudit_torch.testing.training`).

Each class replaces the optimizer's ``add_noise`` (Opacus's ``DPOptimizer``; the instance's
class is swapped for a subclass, as :mod:`dpaudit_torch.testing.bugs` does) with noise code
that keeps the exact claimed variance sigma^2 C^2 of every coordinate, so that no variance test
can see it, but breaks the rest of the null "iid N(0, sigma^2 C^2)": coordinates or tensors
dependent within a step, or another shape than the Gaussian. Every draw comes from the
optimizer's own noise generator (seeded runs are reproducible). The audit's test of the whole
null (docs/design.md section 11, "The whole null") is what finds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .training import ContractBug, Training

__all__ = ["CLASSES"]

#: draws the noise of parameter tensor i (flat, float, on the tensor's device) from the
#: optimizer, the tensor's summed gradient, the noise standard deviation, the generator and a
#: per-step scratch dict shared by the tensors of the step
NoiseMaker = Callable[[Any, int, torch.Tensor, float, Any, dict[str, Any]], torch.Tensor]


def _normal(n: int, like: torch.Tensor, gen: Any) -> torch.Tensor:
    return torch.randn(n, generator=gen, device=like.device, dtype=like.dtype)


def _uniform(n: int, like: torch.Tensor, gen: Any) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=like.device, dtype=like.dtype)


def _row_broadcast(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                   step: dict[str, Any]) -> torch.Tensor:
    # one value per output row (the first dimension), repeated over the row
    shape = s.shape
    if len(shape) < 2:
        return _normal(s.numel(), s, gen) * std
    z = _normal(shape[0], s, gen) * std
    return z[:, None].expand(shape[0], s.numel() // shape[0]).reshape(-1)


def _reseeded_per_tensor(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                         step: dict[str, Any]) -> torch.Tensor:
    # a generator re-seeded with the step's seed before every tensor: every tensor starts with
    # the same noise values
    if "seed" not in step:
        step["seed"] = int(torch.randint(0, 2 ** 62, (1,), generator=gen).item())
    g = torch.Generator(device=s.device)
    g.manual_seed(step["seed"])
    return _normal(s.numel(), s, g) * std


def _shared_same_shape(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                       step: dict[str, Any]) -> torch.Tensor:
    # one noise vector per shape: tensors of one shape (a norm layer's weight and bias, ...)
    # get the same noise
    key = tuple(s.shape)
    if key not in step:
        step[key] = _normal(s.numel(), s, gen) * std
    return step[key]


def _pairwise_averaged(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                       step: dict[str, Any]) -> torch.Tensor:
    # coordinates 2j and 2j + 1 both get (z_2j + z_2j+1) / sqrt(2)
    n = s.numel()
    z = _normal(n + n % 2, s, gen).view(-1, 2)
    pair = (z.sum(dim=1) / math.sqrt(2.0)) * std
    return pair.repeat_interleave(2)[:n]


def _neighbour_correlated(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                          step: dict[str, Any]) -> torch.Tensor:
    # smoothed noise: (z_j + z_j+1) / sqrt(2), correlation 1/2 between neighbours
    n = s.numel()
    z = _normal(n + 1, s, gen)
    return (z[:-1] + z[1:]) / math.sqrt(2.0) * std


def _laplace(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
             step: dict[str, Any]) -> torch.Tensor:
    # Laplace noise of scale std / sqrt(2) (variance std^2)
    u = _uniform(s.numel(), s, gen).clamp_min(torch.finfo(s.dtype).tiny)
    sign = torch.where(_uniform(s.numel(), s, gen) < 0.5, -1.0, 1.0).to(s.dtype)
    return -torch.log(u) * sign * (std / math.sqrt(2.0))


def _uniform_noise(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                   step: dict[str, Any]) -> torch.Tensor:
    # uniform on [-sqrt(3) std, sqrt(3) std] (variance std^2)
    return (2.0 * _uniform(s.numel(), s, gen) - 1.0) * (math.sqrt(3.0) * std)


def _rademacher(opt: Any, i: int, s: torch.Tensor, std: float, gen: Any,
                step: dict[str, Any]) -> torch.Tensor:
    # +-std with probability 1/2 each (variance std^2)
    return torch.where(_uniform(s.numel(), s, gen) < 0.5, -std, std).to(s.dtype)


def _noise_bug(name: str, make: NoiseMaker) -> Callable[[Training], Training]:
    """``apply`` of a class: the optimizer's ``add_noise`` draws every tensor's noise with
    ``make`` instead of Opacus's Gaussian (the rest of Opacus's step is unchanged)."""

    def apply(tr: Training) -> Training:
        from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

        opt = tr.optimizer
        base = type(opt)

        def add_noise(self: Any) -> None:
            std = float(self.noise_multiplier * self.max_grad_norm)
            step: dict[str, Any] = {}
            with torch.no_grad():
                for i, p in enumerate(self.params):
                    _check_processed_flag(p.summed_grad)
                    s = p.summed_grad
                    noise = make(self, i, s, std, self.generator, step)
                    p.grad = (s + noise.view_as(s)).view_as(p)
                    _mark_as_processed(p.summed_grad)

        opt.__class__ = type(f"Leak_{name.replace('-', '_')}_{base.__name__}", (base,),
                             {"add_noise": add_noise})
        return tr

    return apply


def _bug(name: str, description: str, make: NoiseMaker) -> ContractBug:
    return ContractBug(name, "gaussian", description, _noise_bug(name, make), per_step=True)


#: name -> bug, in the order the detection benchmark runs them
CLASSES: dict[str, ContractBug] = {b.name: b for b in (
    _bug("noise-row-broadcast",
         "one Gaussian value per output row of a weight, broadcast over the row (the claimed "
         "variance at every coordinate, but the coordinates of a row are equal)",
         _row_broadcast),
    _bug("noise-reseeded-per-tensor",
         "the noise generator is re-seeded with the step's seed before every parameter tensor, "
         "so every tensor starts with the same noise values",
         _reseeded_per_tensor),
    _bug("noise-shared-same-shape",
         "one noise vector per tensor shape: tensors of one shape (a norm layer's weight and "
         "bias, the biases of equal width) receive the same noise",
         _shared_same_shape),
    _bug("noise-pairwise-averaged",
         "coordinates 2j and 2j+1 of every tensor both receive the average (z_2j + z_2j+1) / "
         "sqrt(2) of two Gaussian draws",
         _pairwise_averaged),
    _bug("noise-neighbour-correlated",
         "smoothed noise: coordinate j receives (z_j + z_j+1) / sqrt(2), correlation 1/2 "
         "between neighbouring coordinates",
         _neighbour_correlated),
    _bug("noise-laplace",
         "Laplace noise scaled to the Gaussian's variance (heavier tails, more mass near 0)",
         _laplace),
    _bug("noise-uniform",
         "uniform noise on [-sqrt(3) sigma C, sqrt(3) sigma C] (the Gaussian's variance, "
         "bounded)",
         _uniform_noise),
    _bug("noise-rademacher",
         "+-sigma C with probability 1/2 each (the Gaussian's variance, two values)",
         _rademacher),
)}
