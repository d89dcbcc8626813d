"""Noise-reuse bugs of :mod:`dpaudit_torch.testing.bugs` (registered there; kept apart for the
module size limit). Each reuses Gaussian draws in another pattern; DP-SGD's analysis needs a
fresh draw on every coordinate of every step (Abadi et al., CCS 2016).

Optimizer bugs (``make(base_class)`` returns the overrides of ``add_noise``):

* :func:`flat_sliced`: one flat draw per release, tensor i takes ``flat[i s : i s + d_i]``
  (s = :data:`FLAT_STRIDE`): consecutive tensors share most of their noise, at an offset.
* :func:`rolled`: every other release adds the previous release's noise rolled by
  :data:`ROLL_SHIFT` positions within each tensor.
* :func:`subset_reused`: every other release repeats the previous release's noise on a subset
  of the tensors (the first, and every third after it).

Setup bugs (``apply(engine, optimizer, data_loader)``), which need the epochs:

* :func:`reseeded_each_epoch`: the optimizer's noise generator is reset to its seed when each
  epoch starts.
* :func:`manual_seed_each_epoch`: ``torch.manual_seed`` at each epoch's start, with the loader's
  sampling and the noise both on the global generator: the batches and the noise of every epoch
  repeat those of the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FLAT_STRIDE", "ROLL_SHIFT", "EPOCH_SEED", "flat_sliced", "rolled", "subset_reused",
           "reseeded_each_epoch", "manual_seed_each_epoch", "opacus_release"]

#: offset between consecutive tensors' slices of the flat draw in ``flat_sliced``
FLAT_STRIDE = 16
#: positions the copy is rolled by in ``rolled``
ROLL_SHIFT = 1
#: the seed ``manual_seed_each_epoch`` sets at each epoch
EPOCH_SEED = 1234

_STATE_ATTR = "_dpaudit_bug_state"


def _state(opt: Any) -> dict[str, Any]:
    st = opt.__dict__.get(_STATE_ATTR)
    if st is None:
        st = opt.__dict__[_STATE_ATTR] = {}
    return st


def _std(opt: Any) -> float:
    return float(opt.noise_multiplier) * float(opt.max_grad_norm)


def flat_sliced(base: type) -> dict[str, Any]:
    def add_noise(self: Any) -> None:
        import torch

        base.add_noise(self)  # (Opacus's bookkeeping; its noise is replaced)
        sizes = [p.numel() for p in self.params]
        if not sizes:
            return
        n = max(FLAT_STRIDE * i + d for i, d in enumerate(sizes))
        p0 = self.params[0]
        flat = torch.normal(0.0, _std(self), (n,), device=p0.device, generator=self.generator)
        with torch.no_grad():
            for i, p in enumerate(self.params):
                s = p.summed_grad.view_as(p)
                piece = flat[FLAT_STRIDE * i:FLAT_STRIDE * i + sizes[i]].to(s.dtype)
                p.grad = (s + piece.view_as(p)).view_as(p)

    return {"add_noise": add_noise}


def _every_other(transform: Callable[[int, Any], Any | None]) -> Callable[[type], dict[str, Any]]:
    """Odd releases draw fresh noise (kept); even ones add ``transform(i, kept noise of tensor
    i)`` instead of their own draw (None: their own draw is kept)."""

    def make(base: type) -> dict[str, Any]:
        def add_noise(self: Any) -> None:
            import torch

            st = _state(self)
            st["releases"] = st.get("releases", 0) + 1
            base.add_noise(self)
            with torch.no_grad():
                if st["releases"] % 2 == 1:
                    st["last_noise"] = [(p.grad - p.summed_grad.view_as(p)).clone()
                                        for p in self.params]
                    return
                for i, (p, n) in enumerate(zip(self.params, st.pop("last_noise"))):
                    new = transform(i, n)
                    if new is not None:
                        p.grad = (p.summed_grad.view_as(p) + new).view_as(p)

        return {"add_noise": add_noise}

    return make


def _rolled(i: int, noise: Any) -> Any:
    import torch

    return torch.roll(noise.reshape(-1), ROLL_SHIFT).view_as(noise)


def _subset(i: int, noise: Any) -> Any | None:
    return noise if i % 3 == 0 else None


rolled = _every_other(_rolled)
subset_reused = _every_other(_subset)


class _EpochStartSampler:
    """Yields the wrapped batch sampler's batches, calling ``at_start()`` when each epoch (each
    pass over the sampler) begins."""

    def __init__(self, sampler: Any, at_start: Callable[[], None]) -> None:
        self.sampler = sampler
        self.at_start = at_start

    def __iter__(self) -> Iterator[list[int]]:
        self.at_start()
        yield from self.sampler

    def __len__(self) -> int:
        return len(self.sampler)


def _wrap_loader(data_loader: Any, at_start: Callable[[], None]) -> Any:
    from torch.utils.data import DataLoader

    q = getattr(data_loader, "sample_rate", None)
    loader = DataLoader(
        data_loader.dataset, batch_sampler=_EpochStartSampler(data_loader.batch_sampler,
                                                             at_start),
        num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn,
        pin_memory=data_loader.pin_memory, generator=data_loader.generator)
    loader.sample_rate = q if q is not None else 1.0 / len(data_loader)
    return loader


def reseeded_each_epoch(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    import torch

    if optimizer.generator is None:  # noise from the global RNG: the optimizer gets its own
        dev = optimizer.params[0].device if optimizer.params else torch.device("cpu")
        optimizer.generator = torch.Generator(device=dev)
        optimizer.generator.manual_seed(torch.initial_seed())
    gen = optimizer.generator
    seed = gen.initial_seed()
    return optimizer, _wrap_loader(data_loader, lambda: gen.manual_seed(seed))


def manual_seed_each_epoch(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    import torch

    optimizer.generator = None  # the noise on the global generator
    sampler = data_loader.batch_sampler
    if hasattr(sampler, "generator"):
        sampler.generator = None  # the Poisson sampling too
    return optimizer, _wrap_loader(data_loader, lambda: torch.manual_seed(EPOCH_SEED))


def opacus_release(clipped_sum: Any, noise: Any, batch: float, dtype: Any) -> tuple[Any, Any]:
    """What Opacus releases and what the auditor recovers, for simulations (NumPy float64
    arrays in, out): the gradient fl(fl(s + n) / B) in ``dtype`` (a torch dtype), returned as
    (release x B, release x B - s) in float64, with s and n first rounded to ``dtype``."""
    import numpy as np
    import torch

    s = torch.as_tensor(np.asarray(clipped_sum, dtype=np.float64)).to(dtype)
    n = torch.as_tensor(np.asarray(noise, dtype=np.float64)).to(dtype)
    rel = ((s + n) / batch).double().numpy() * float(batch)
    return rel, rel - s.double().numpy()

