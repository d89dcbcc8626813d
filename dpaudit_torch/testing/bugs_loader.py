"""Setup bugs of the data loader that replay the same batches: Poisson batches that are not
drawn afresh (registered in :data:`dpaudit_torch.testing.bugs.SETUP_BUGS`).

Each wraps the batch sampler of Opacus's Poisson loader (``DPDataLoader``'s
``UniformWithReplacementSampler``) so that its random generator is reset at the start of an
epoch: every batch is still a Poisson sample at the loader's rate, the noise is fresh, and the
accountant computes the epsilon of fresh batches, but the batches of one epoch are those of an
earlier one. A record's inclusions across epochs are then one coin drawn once, not independent
coins, which the analysis of Poisson subsampling needs (Abadi et al., "Deep learning with
differential privacy", CCS 2016). The returned loader keeps the Poisson loader's
``sample_rate``, dataset and collate function; single process only.

* ``"loader-reseeded"``: the sampler's generator is reset to its seed at the start of every
  epoch (the same batches every epoch).
* ``"loader-reseeded-every-3-epochs"``: reset every :data:`RESEED_EVERY_EPOCHS` epochs (epochs
  1-3 fresh, 4-6 repeat them, ...).
* ``"loader-reseeded-other-epoch-length"``: reset at every epoch, and an epoch is
  ``len(loader) + len(loader) // 2`` batches instead of the ``len(loader)`` = 1/q the rate
  implies (a loop that ends its epochs elsewhere, a sampler built with another ``steps``).
* ``"loader-global-seed"``: ``torch.manual_seed`` at the start of every epoch, with the sampler
  on the global generator and the noise on the optimizer's own generator (given one seeded from
  the global seed where it had none), so that only the batches repeat.

The module imports no torch (the registry lists names without it); torch is imported when a bug
is applied or runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["RESEED_EVERY_EPOCHS", "ReseedingBatchSampler", "reseeded", "reseeded_every",
           "reseeded_other_length", "global_seed"]

#: epochs between two resets in ``"loader-reseeded-every-3-epochs"``
RESEED_EVERY_EPOCHS = 3


class ReseedingBatchSampler:
    """Yields the batches of ``sampler`` (a batch sampler with a ``generator`` attribute),
    resetting the random state at the start of every ``every``-th epoch.

    Args:
        sampler: the Poisson loader's batch sampler.
        every: epochs between two resets (1: every epoch).
        epoch_steps: batches per epoch (None: ``len(sampler)``); more than the sampler gives in
            one pass continues with its next pass.
        global_seed: reset the global generator (``torch.manual_seed``) instead of the
            sampler's own; the sampler then draws from the global generator.
    """

    def __init__(self, sampler: Any, every: int = 1, epoch_steps: int | None = None,
                 global_seed: bool = False) -> None:
        import torch

        self.sampler = sampler
        self.every = int(every)
        self.epoch_steps = int(epoch_steps) if epoch_steps is not None else len(sampler)
        self.global_seed = bool(global_seed)
        self.epoch = 0
        if self.global_seed:
            self.seed = int(torch.initial_seed())
            sampler.generator = None
        else:
            if getattr(sampler, "generator", None) is None:  # the global RNG: give it its own
                sampler.generator = torch.Generator().manual_seed(int(torch.initial_seed()))
            self.seed = int(sampler.generator.initial_seed())

    def __iter__(self) -> Iterator[list[int]]:
        import torch

        if self.epoch % self.every == 0:
            if self.global_seed:
                torch.manual_seed(self.seed)
            else:
                self.sampler.generator.manual_seed(self.seed)
        self.epoch += 1
        done = 0
        while done < self.epoch_steps:
            for batch in self.sampler:
                yield batch
                done += 1
                if done >= self.epoch_steps:
                    return

    def __len__(self) -> int:
        return self.epoch_steps


def _wrap(data_loader: Any, batch_sampler: ReseedingBatchSampler) -> Any:
    from torch.utils.data import DataLoader

    q = data_loader.sample_rate
    loader = DataLoader(data_loader.dataset, batch_sampler=batch_sampler,
                        num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn,
                        pin_memory=data_loader.pin_memory)
    loader.sample_rate = q  # each batch is still a Poisson sample at rate q
    return loader


def _check_poisson(data_loader: Any) -> None:
    if getattr(data_loader, "sample_rate", None) is None or not hasattr(
            getattr(data_loader, "batch_sampler", None), "generator"):
        raise ValueError(f"a re-seeded loader bug needs Opacus's Poisson loader (a DPDataLoader "
                         f"from make_private), got {type(data_loader).__name__}")


def reseeded(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    """``"loader-reseeded"``."""
    _check_poisson(data_loader)
    return optimizer, _wrap(data_loader, ReseedingBatchSampler(data_loader.batch_sampler))


def reseeded_every(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    """``"loader-reseeded-every-3-epochs"``."""
    _check_poisson(data_loader)
    return optimizer, _wrap(data_loader, ReseedingBatchSampler(data_loader.batch_sampler,
                                                               every=RESEED_EVERY_EPOCHS))


def reseeded_other_length(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    """``"loader-reseeded-other-epoch-length"``."""
    _check_poisson(data_loader)
    n = len(data_loader)
    return optimizer, _wrap(data_loader, ReseedingBatchSampler(data_loader.batch_sampler,
                                                               epoch_steps=n + n // 2))


def global_seed(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    """``"loader-global-seed"``."""
    import torch

    _check_poisson(data_loader)
    if getattr(optimizer, "generator", None) is None:  # the noise keeps drawing afresh
        dev = optimizer.params[0].device if optimizer.params else torch.device("cpu")
        optimizer.generator = torch.Generator(device=dev)
        optimizer.generator.manual_seed(int(torch.initial_seed()) + 1)
    return optimizer, _wrap(data_loader, ReseedingBatchSampler(data_loader.batch_sampler,
                                                               global_seed=True))
