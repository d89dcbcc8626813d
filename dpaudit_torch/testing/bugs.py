"""Deliberately broken DP-SGD training, for tests, demos and benchmarks of the audit.

Two kinds of bug, each *silent*: nothing warns, and the accountant computes its epsilon from the
settings the user asked for, so the claimed epsilon is that of a correct run.

**Optimizer bugs** (``apply_bug(optimizer, name)``) are applied to an Opacus optimizer *instance*
by swapping the instance's class for a subclass that overrides one method, so the bug lives
inside the optimizer's own code path exactly where a real implementation mistake would be (and
an auditor attached before or after sees it). The optimizer's ``noise_multiplier`` and
``max_grad_norm`` attributes, which the accountant's step hook reads, are left unchanged.

* ``"no-noise"``: no Gaussian noise is added (``add_noise`` runs with noise multiplier 0).
* ``"noise-divided-by-batch"``: the noise is divided by the expected batch size a second time
  (a classic "average then add noise then average again" mistake): the gradient is
  ``(sum + N(0, (sigma C)^2) / B) / B``.
* ``"noise-halved"``: the noise draw uses half the noise multiplier while the accountant still
  sees the original one.
* ``"no-clipping"``: per-sample gradients are summed without clipping (the clipping bound is
  treated as infinite in ``clip_and_accumulate``; the noise still uses the real bound). Not
  available under ghost clipping, whose clipping happens in the loss's backward pass.
* ``"bias-no-noise"``: the noise is dropped again on one-dimensional tensors (biases, norm
  scales), which often carry the largest real gradients.
* ``"noise-reused"``: the noise drawn at release t is added again at release t + 1 for every odd
  t (releases 1, 3, 5, ... draw fresh noise; 2, 4, 6, ... repeat it). DP-SGD's analysis needs
  fresh noise at every step (Abadi et al., "Deep learning with differential privacy", CCS 2016).
* ``"noise-reseeded"``: the optimizer's noise generator is reset to the same seed every 10
  releases (at releases 1, 11, 21, ...), so the noise of releases 11-20 repeats that of 1-10.
  The seed is the generator's ``initial_seed()``; an optimizer without a generator (noise from
  the global RNG) gets its own, seeded with ``torch.initial_seed()``.
* ``"noise-bf16"``: the noise is drawn, cast to bfloat16 and back: it keeps 8 significant bits,
  and the low-order bits of the release reveal the value the noise was added to (Mironov, "On
  significance of the least significant bits for differential privacy", CCS 2012).
* ``"noise-0.8"``: the noise draw uses 0.8 times the noise multiplier.
* ``"noise-divided-one-tensor"``: like ``"noise-divided-by-batch"``, on one tensor only (the
  first of ``optimizer.params``).
* ``"per-tensor-clipping"``: every parameter tensor of a per-sample gradient is clipped to C
  separately (one clip factor per tensor and sample), so a sample moves the sum by up to
  ``C sqrt(number of tensors)`` instead of C. Opacus's per-layer optimizer is a legitimate mode
  with per-layer bounds whose squares sum to C^2; this bug is the *flat* optimizer doing it with C
  for every tensor. Flat clipping only (refused under ghost, per-layer and adaptive clipping).
  A Dirac canary lies in one tensor and cannot see it; the auditor's spread canaries can.
* ``"noise-flat-sliced"``: one flat noise draw per release, sliced for each tensor at
  overlapping offsets (tensor i takes ``flat[16 i : 16 i + d_i]``): consecutive tensors share
  most of their noise, shifted.
* ``"noise-rolled"``: every other release adds the previous release's noise rolled by one
  position within each tensor (a shifted copy of an earlier step's noise).
* ``"noise-reused-subset"``: every other release repeats the previous release's noise on a
  subset of the tensors (the first, and every third after it); the others draw fresh noise.

**Setup bugs** (``apply_setup_bug(engine, optimizer, data_loader, name) -> (optimizer,
data_loader)``) break the training *setup* around a correct optimizer: what the accountant is
told. Every step is then a correct Gaussian step; only the whole run is wrong. Use the returned
optimizer and data loader for training (and give them to the auditor). Single process only
(``ValueError`` under DDP), not removable.

* ``"accountant-rate-4x"``: the accountant's step hook is told a sample rate 4x smaller than the
  data loader's (``optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(
  sample_rate=q / 4))``).
* ``"accumulation-counted-per-micro-step"``: gradient accumulation over k = 4 loader batches per
  release (the returned loader signals ``optimizer.signal_skip_step`` on 3 of every 4 batches,
  as ``BatchMemoryManager`` does for micro-batches), while the accountant's hook fires at every
  micro-step at the loader's rate: the accountant counts 4 steps at rate q where one step at
  rate about 4q was released. Train with the usual loop (``zero_grad``, backward, ``step`` on
  every batch).
* ``"fixed-size-batches"``: the data loader is replaced by a shuffled loader of fixed-size
  batches with the same number of batches per epoch, as ``make_private(...,
  poisson_sampling=False)`` with a shuffled ``DataLoader`` gives, while the accountant assumes
  Poisson sampling at rate 1 / len(loader) (Chua et al., "How private are DP-SGD
  implementations?", ICML 2024).
* ``"noise-reseeded-each-epoch"``: the optimizer's noise generator is reset to its seed when
  each epoch of the returned loader starts: the noise of every epoch repeats the first's, at
  the lag of the epoch's length (the steps themselves are correct Gaussian steps).
* ``"manual-seed-each-epoch"``: ``torch.manual_seed`` is called when each epoch starts, with the
  loader's Poisson sampling and the noise both on the global generator (the optimizer's and
  the sampler's own generators dropped): the batches and the noise of every epoch repeat.
* ``"loader-reseeded"``, ``"loader-reseeded-every-3-epochs"``,
  ``"loader-reseeded-other-epoch-length"``, ``"loader-global-seed"``: Opacus's Poisson loader
  whose random generator is reset at the start of an epoch (every epoch, every 3 epochs, with
  epochs of 1.5 ``len(loader)`` batches; or ``torch.manual_seed`` at every epoch with the
  sampler on the global generator and the noise on its own), so the same Poisson batches come
  back every epoch while the noise is fresh (:mod:`dpaudit_torch.testing.bugs_loader`).

``apply_to_training(engine, optimizer, data_loader, name)`` applies a bug of either kind (what
``dpaudit demo --bug`` uses). ``remove_bug(optimizer)`` undoes an optimizer bug.

The registry (``BUGS``, ``SETUP_BUGS``, :func:`names`) imports no torch: ``dpaudit --help`` lists
the names, and a bug imports torch (and Opacus) when it is applied or runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import bugs_loader, reuse_bugs

if TYPE_CHECKING:  # the registry imports no torch (``dpaudit --help`` lists the names)
    import torch

__all__ = ["Bug", "SetupBug", "BUGS", "SETUP_BUGS", "ACCUMULATION_STEPS", "RESEED_EVERY",
           "names", "apply_bug", "remove_bug", "applied_bug", "apply_setup_bug",
           "apply_to_training"]

_BUG_ATTR = "_dpaudit_bug"
#: per-instance state of a stateful bug (counters, stored noise), removed by remove_bug
_STATE_ATTR = "_dpaudit_bug_state"
#: loader batches per release in ``"accumulation-counted-per-micro-step"``
ACCUMULATION_STEPS = 4
#: releases between two resets of the noise generator in ``"noise-reseeded"``
RESEED_EVERY = 10


@dataclass(frozen=True)
class Bug:
    """A named broken DP optimizer: ``make(base_class)`` returns the method overrides."""

    name: str
    description: str
    make: Callable[[type], dict[str, Any]]
    ghost_ok: bool = True
    #: only Opacus's flat per-sample clipping (not per-layer, adaptive or ghost)
    flat_only: bool = False


@dataclass(frozen=True)
class SetupBug:
    """A named broken training setup: ``apply(engine, optimizer, data_loader)`` returns the
    optimizer and data loader to train with."""

    name: str
    description: str
    apply: Callable[[Any, Any, Any], tuple[Any, Any]]


def _state(opt: Any) -> dict[str, Any]:
    """The bug's per-instance state (created on first use)."""
    st = opt.__dict__.get(_STATE_ATTR)
    if st is None:
        st = {}
        opt.__dict__[_STATE_ATTR] = st
    return st


def _scaled_noise(factor: Callable[[Any], float]) -> Callable[[type], dict[str, Any]]:
    """Overrides ``add_noise`` so the noise is drawn with ``noise_multiplier * factor(opt)``."""

    def make(base: type) -> dict[str, Any]:
        def add_noise(self: Any) -> None:
            nm = self.noise_multiplier
            adj = self.__dict__.get("_adjusted_noise_multiplier")
            f = factor(self)
            self.noise_multiplier = nm * f
            if adj is not None:
                self._adjusted_noise_multiplier = adj * f
            try:
                base.add_noise(self)
            finally:  # the accountant's hook (called after add_noise) sees the original value
                self.noise_multiplier = nm
                if adj is not None:
                    self._adjusted_noise_multiplier = adj

        return {"add_noise": add_noise}

    return make


def _replace_noise(transform: Callable[[Any, int, torch.Tensor], torch.Tensor | None]
                   ) -> Callable[[type], dict[str, Any]]:
    """Overrides ``add_noise``: Opacus adds its noise, then the noise of parameter tensor i is
    replaced by ``transform(opt, i, noise)`` (None: kept as drawn)."""

    def make(base: type) -> dict[str, Any]:
        def add_noise(self: Any) -> None:
            import torch

            base.add_noise(self)
            with torch.no_grad():
                for i, p in enumerate(self.params):
                    s = p.summed_grad.view_as(p)
                    new = transform(self, i, p.grad - s)
                    if new is not None:
                        p.grad = (s + new).view_as(p)

        return {"add_noise": add_noise}

    return make


def _divided(only_first: bool) -> Callable[[Any, int, torch.Tensor], torch.Tensor | None]:
    def transform(opt: Any, i: int, noise: torch.Tensor) -> torch.Tensor | None:
        if only_first and i != 0:
            return None
        return noise / float(opt.expected_batch_size)

    return transform


def _bias_no_noise(opt: Any, i: int, noise: torch.Tensor) -> torch.Tensor | None:
    import torch

    # biases and norm scales: the noise is dropped again
    return torch.zeros_like(noise) if noise.dim() == 1 else None


def _bf16(opt: Any, i: int, noise: torch.Tensor) -> torch.Tensor | None:
    import torch

    return noise.to(torch.bfloat16).to(noise.dtype)


def _noise_reused(base: type) -> dict[str, Any]:
    def add_noise(self: Any) -> None:
        import torch

        st = _state(self)
        st["releases"] = st.get("releases", 0) + 1
        base.add_noise(self)
        with torch.no_grad():
            if st["releases"] % 2 == 1:  # odd release: fresh noise, kept for the next one
                st["last_noise"] = [(p.grad - p.summed_grad.view_as(p)).clone()
                               for p in self.params]
            else:  # even release: the previous release's noise again
                for p, n in zip(self.params, st.pop("last_noise")):
                    p.grad = (p.summed_grad.view_as(p) + n).view_as(p)

    return {"add_noise": add_noise}


def _noise_reseeded(base: type) -> dict[str, Any]:
    def add_noise(self: Any) -> None:
        st = _state(self)
        n = st.get("releases", 0)
        if n % RESEED_EVERY == 0:
            if self.generator is None:  # noise from the global RNG: the optimizer gets its own
                import torch

                st["own_generator"] = True
                dev = self.params[0].device if self.params else torch.device("cpu")
                self.generator = torch.Generator(device=dev)
                self.generator.manual_seed(torch.initial_seed())
            self.generator.manual_seed(self.generator.initial_seed())
        st["releases"] = n + 1
        base.add_noise(self)

    return {"add_noise": add_noise}


def _per_tensor_clipping(base: type) -> dict[str, Any]:
    def clip_and_accumulate(self: Any) -> None:
        import torch

        c = float(self.max_grad_norm)
        with torch.no_grad():
            for p in self.params:
                gs = getattr(p, "grad_sample", None)
                if gs is None:
                    continue
                parts = gs if isinstance(gs, list) else [gs]
                out = []
                for g in parts:
                    if g.shape[0] == 0:
                        out.append(g)
                        continue
                    norm = g.reshape(g.shape[0], -1).norm(2, dim=1)
                    f = (c / (norm + 1e-6)).clamp(max=1.0).to(g.dtype)
                    out.append(g * f.view(-1, *([1] * (g.dim() - 1))))
                p.grad_sample = out if isinstance(gs, list) else out[0]
        # the rows are clipped per tensor already: Opacus only sums them now
        self.max_grad_norm = math.inf
        try:
            base.clip_and_accumulate(self)
        finally:
            self.max_grad_norm = c

    return {"clip_and_accumulate": clip_and_accumulate}


def _no_clipping(base: type) -> dict[str, Any]:
    def clip_and_accumulate(self: Any) -> None:
        has_layers = "max_grad_norms" in self.__dict__
        saved = self.max_grad_norms if has_layers else self.max_grad_norm
        if has_layers:
            self.max_grad_norms = [math.inf] * len(saved)
        else:
            self.max_grad_norm = math.inf
        try:
            base.clip_and_accumulate(self)
        finally:
            if has_layers:
                self.max_grad_norms = saved
            else:
                self.max_grad_norm = saved

    return {"clip_and_accumulate": clip_and_accumulate}


def _counted_per_micro_step(base: type) -> dict[str, Any]:
    def pre_step(self: Any, closure: Callable[[], Any] | None = None) -> Any:
        released = base.pre_step(self, closure)
        if not released and self.step_hook is not None:
            self.step_hook(self)  # a skipped micro-step is counted as a step at the loader's rate
        return released

    return {"pre_step": pre_step}


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("no-noise", "no Gaussian noise is added to the clipped sum",
            _scaled_noise(lambda opt: 0.0)),
        Bug("noise-divided-by-batch",
            "the noise is divided by the expected batch size a second time",
            _replace_noise(_divided(only_first=False))),
        Bug("noise-halved",
            "the noise is drawn with half the noise multiplier; the accountant sees the original",
            _scaled_noise(lambda opt: 0.5)),
        Bug("no-clipping", "per-sample gradients are summed without clipping",
            lambda base: _no_clipping(base), ghost_ok=False),
        Bug("bias-no-noise", "one-dimensional tensors (biases, norm scales) get no noise",
            _replace_noise(_bias_no_noise)),
        Bug("noise-reused",
            "the noise of every odd release is added again at the next release",
            _noise_reused),
        Bug("noise-reseeded",
            f"the noise generator is reset to the same seed every {RESEED_EVERY} releases",
            _noise_reseeded),
        Bug("noise-bf16", "the noise is drawn, cast to bfloat16 and back to the gradient's dtype",
            _replace_noise(_bf16)),
        Bug("noise-0.8",
            "the noise is drawn with 0.8 times the noise multiplier; the accountant sees the "
            "original", _scaled_noise(lambda opt: 0.8)),
        Bug("noise-divided-one-tensor",
            "the noise of the first parameter tensor is divided by the expected batch size "
            "a second time", _replace_noise(_divided(only_first=True))),
        Bug("per-tensor-clipping",
            "the flat optimizer clips every parameter tensor of a sample to C separately",
            _per_tensor_clipping, ghost_ok=False, flat_only=True),
        Bug("noise-flat-sliced",
            "one flat noise draw per release, sliced for each tensor at overlapping offsets",
            reuse_bugs.flat_sliced),
        Bug("noise-rolled",
            "every other release adds the previous release's noise rolled by one position",
            reuse_bugs.rolled),
        Bug("noise-reused-subset",
            "every other release repeats the previous release's noise on a subset of tensors",
            reuse_bugs.subset_reused),
    )
}


# ---------------------------------------------------------------------- setup bugs
def _loader_rate(data_loader: Any) -> float:
    """The sample rate ``make_private`` gave the accountant: the Poisson loader's, else
    1 / len(loader)."""
    q = getattr(data_loader, "sample_rate", None)
    return float(q) if q is not None else 1.0 / len(data_loader)


def _rate_4x(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    q = _loader_rate(data_loader)
    optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=q / 4.0))
    return optimizer, data_loader


class _AccumulatingBatchSampler:
    """Yields the wrapped batch sampler's batches and tells the optimizer that only every
    ``k``-th one ends a release (``signal_skip_step``), like Opacus's ``BatchSplittingSampler``;
    the count runs on across epochs."""

    def __init__(self, sampler: Any, optimizer: Any, k: int) -> None:
        self.sampler = sampler
        self.optimizer = optimizer
        self.k = int(k)
        self.count = 0

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.sampler:
            self.count += 1
            self.optimizer.signal_skip_step(do_skip=self.count % self.k != 0)
            yield batch

    def __len__(self) -> int:
        return len(self.sampler)


def _accumulation(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    from torch.utils.data import DataLoader

    q = _loader_rate(data_loader)
    _swap_class(optimizer, "accumulation-counted-per-micro-step", _counted_per_micro_step)
    loader = DataLoader(
        data_loader.dataset,
        batch_sampler=_AccumulatingBatchSampler(data_loader.batch_sampler, optimizer,
                                                ACCUMULATION_STEPS),
        num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn,
        pin_memory=data_loader.pin_memory, generator=data_loader.generator)
    loader.sample_rate = q  # each loader batch is still a Poisson sample at rate q
    return optimizer, loader


def _fixed_size(engine: Any, optimizer: Any, data_loader: Any) -> tuple[Any, Any]:
    from torch.utils.data import DataLoader

    n = len(data_loader.dataset)
    steps = len(data_loader)  # the accountant's rate is 1 / steps: keep it
    batch = math.ceil(n / steps)
    loader = DataLoader(data_loader.dataset, batch_size=batch, shuffle=True,
                        collate_fn=getattr(data_loader, "collate_fn", None),
                        generator=getattr(data_loader, "generator", None))
    if len(loader) != steps:
        raise ValueError(f"fixed-size-batches: {n} records in {steps} batches per epoch cannot "
                         f"keep the accountant's rate 1 / {steps}")
    return optimizer, loader


SETUP_BUGS: dict[str, SetupBug] = {
    b.name: b
    for b in (
        SetupBug("accountant-rate-4x",
                 "the accountant is told a sample rate 4x smaller than the data loader's",
                 _rate_4x),
        SetupBug("accumulation-counted-per-micro-step",
                 f"gradients are accumulated over {ACCUMULATION_STEPS} loader batches per "
                 f"release; the accountant counts every batch as a step at the loader's rate",
                 _accumulation),
        SetupBug("fixed-size-batches",
                 "shuffled fixed-size batches; the accountant assumes Poisson sampling",
                 _fixed_size),
        SetupBug("noise-reseeded-each-epoch",
                 "the optimizer's noise generator is reset to its seed at each epoch's start",
                 reuse_bugs.reseeded_each_epoch),
        SetupBug("manual-seed-each-epoch",
                 "torch.manual_seed at each epoch's start, the loader's sampling and the noise "
                 "on the global generator", reuse_bugs.manual_seed_each_epoch),

        SetupBug("loader-reseeded",
                 "the Poisson loader's generator is reset at every epoch: the same batches "
                 "every epoch, fresh noise", bugs_loader.reseeded),
        SetupBug("loader-reseeded-every-3-epochs",
                 f"the Poisson loader's generator is reset every "
                 f"{bugs_loader.RESEED_EVERY_EPOCHS} epochs: the batches repeat with that "
                 f"period", bugs_loader.reseeded_every),
        SetupBug("loader-reseeded-other-epoch-length",
                 "the Poisson loader's generator is reset at every epoch of 1.5 len(loader) "
                 "batches: the batches repeat with a period the rate does not imply",
                 bugs_loader.reseeded_other_length),
        SetupBug("loader-global-seed",
                 "torch.manual_seed at every epoch with the Poisson sampler on the global "
                 "generator; the noise has its own: the same batches every epoch",
                 bugs_loader.global_seed),
    )
}


def names(kind: str | None = None) -> list[str]:
    """The registered bug names: ``kind="optimizer"`` (:func:`apply_bug`), ``"setup"``
    (:func:`apply_setup_bug`) or None (both, optimizer bugs first)."""
    if kind not in (None, "optimizer", "setup"):
        raise ValueError(f"kind must be None, 'optimizer' or 'setup', got {kind!r}")
    out: list[str] = []
    if kind in (None, "optimizer"):
        out += list(BUGS)
    if kind in (None, "setup"):
        out += list(SETUP_BUGS)
    return out


def applied_bug(optimizer: Any) -> str | None:
    """The name of the bug applied to ``optimizer``, or None."""
    return getattr(optimizer, _BUG_ATTR, None)


def _check_dp_optimizer(optimizer: Any, fn: str) -> None:
    from opacus.optimizers import DPOptimizer

    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"{fn} needs an Opacus DPOptimizer instance, got "
                        f"{type(optimizer).__name__}")


def _check_not_applied(optimizer: Any) -> None:
    if applied_bug(optimizer) is not None:
        raise ValueError(f"bug {applied_bug(optimizer)!r} is already applied to this optimizer")


def _swap_class(optimizer: Any, name: str, make: Callable[[type], dict[str, Any]]) -> None:
    base = type(optimizer)
    cls = type(f"Buggy_{name.replace('-', '_').replace('.', '_')}_{base.__name__}", (base,),
               make(base))
    optimizer.__class__ = cls
    setattr(optimizer, _BUG_ATTR, name)
    optimizer._dpaudit_bug_base = base


def apply_bug(optimizer: Any, name: str) -> Any:
    """Make ``optimizer`` (an Opacus ``DPOptimizer`` instance) silently broken; returns it.

    Raises:
        TypeError: ``optimizer`` is not an Opacus DP optimizer.
        ValueError: unknown ``name`` (a setup bug: use :func:`apply_setup_bug`), a bug already
            applied, or a bug that does not apply to this optimizer (``no-clipping`` under ghost
            clipping, ``per-tensor-clipping`` outside flat clipping).
    """
    from opacus.optimizers import AdaClipDPOptimizer, DPOptimizerFastGradientClipping

    if isinstance(name, str) and name in SETUP_BUGS:
        raise ValueError(f"{name!r} is a setup bug: apply it with apply_setup_bug(engine, "
                         f"optimizer, data_loader, {name!r})")
    _check_dp_optimizer(optimizer, "apply_bug")
    if not isinstance(name, str) or name not in BUGS:
        raise ValueError(f"unknown bug {name!r}; known bugs: {', '.join(names())}")
    _check_not_applied(optimizer)
    bug = BUGS[name]
    ghost = isinstance(optimizer, DPOptimizerFastGradientClipping)
    if not bug.ghost_ok and ghost:
        raise ValueError(f"bug {name!r} cannot be applied under ghost clipping: clipping happens "
                         f"in the loss's backward pass, not in the optimizer")
    if bug.flat_only and ("max_grad_norms" in vars(optimizer)
                          or isinstance(optimizer, AdaClipDPOptimizer)):
        raise ValueError(f"bug {name!r} is a flat-clipping bug; this optimizer uses per-layer or "
                         f"adaptive clipping")
    _swap_class(optimizer, name, bug.make)
    return optimizer


def apply_setup_bug(engine: Any, optimizer: Any, data_loader: Any, name: str
                    ) -> tuple[Any, Any]:
    """Break the training setup of ``make_private``'s (engine, optimizer, data loader) with the
    setup bug ``name``; returns the (optimizer, data loader) to train with.

    Raises:
        TypeError: ``optimizer`` is not an Opacus DP optimizer.
        ValueError: unknown ``name`` (an optimizer bug: use :func:`apply_bug`), a bug already
            applied, or a distributed optimizer.
    """
    if isinstance(name, str) and name in BUGS:
        raise ValueError(f"{name!r} is an optimizer bug: apply it with apply_bug(optimizer, "
                         f"{name!r})")
    _check_dp_optimizer(optimizer, "apply_setup_bug")
    if not isinstance(name, str) or name not in SETUP_BUGS:
        raise ValueError(f"unknown bug {name!r}; known bugs: {', '.join(names())}")
    _check_not_applied(optimizer)
    if int(getattr(optimizer, "world_size", 1)) > 1:
        raise ValueError(f"setup bug {name!r} is single-process only")
    optimizer, data_loader = SETUP_BUGS[name].apply(engine, optimizer, data_loader)
    if applied_bug(optimizer) is None:
        setattr(optimizer, _BUG_ATTR, name)
    return optimizer, data_loader


def apply_to_training(engine: Any, optimizer: Any, data_loader: Any, name: str
                      ) -> tuple[Any, Any]:
    """Apply the bug ``name`` of either kind; returns the (optimizer, data loader) to train
    with (unchanged objects for an optimizer bug)."""
    if isinstance(name, str) and name in SETUP_BUGS:
        return apply_setup_bug(engine, optimizer, data_loader, name)
    return apply_bug(optimizer, name), data_loader


def remove_bug(optimizer: Any) -> Any:
    """Undo :func:`apply_bug` (restores the original class, and the noise generator a
    ``noise-reseeded`` bug gave an optimizer that had none); a no-op without a bug.

    Raises:
        ValueError: the bug is a setup bug (it changed the accountant's hook or the loader).
    """
    name = applied_bug(optimizer)
    if name is None:
        return optimizer
    if name in SETUP_BUGS:
        raise ValueError(f"setup bug {name!r} cannot be removed; build a new training setup")
    st = optimizer.__dict__.pop(_STATE_ATTR, None) or {}
    if st.get("own_generator"):
        optimizer.generator = None
    optimizer.__class__ = optimizer._dpaudit_bug_base
    del optimizer._dpaudit_bug_base
    delattr(optimizer, _BUG_ATTR)
    return optimizer
