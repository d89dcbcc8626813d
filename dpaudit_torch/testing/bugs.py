"""Deliberately broken DP optimizers, for tests and demos of the audit.

Each bug is applied to an Opacus optimizer *instance* (``apply_bug(optimizer, name)``) by
swapping the instance's class for a subclass that overrides one method, so the bug lives inside
the optimizer's own code path exactly where a real implementation mistake would be (and an
auditor attached before or after sees it). Every bug is *silent*: the optimizer's
``noise_multiplier`` and ``max_grad_norm`` attributes, which the accountant's step hook reads,
are left unchanged, so the claimed epsilon is exactly the one of a correct run.

Bugs (``names()``):

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

``remove_bug(optimizer)`` restores the original class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Bug", "BUGS", "names", "apply_bug", "remove_bug", "applied_bug"]

_BUG_ATTR = "_dpaudit_bug"


@dataclass(frozen=True)
class Bug:
    """A named broken DP optimizer: ``make(base_class)`` returns the method overrides."""

    name: str
    description: str
    make: Callable[[type], dict[str, Any]]
    ghost_ok: bool = True


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


def _noise_divided_by_batch(base: type) -> dict[str, Any]:
    def add_noise(self: Any) -> None:
        base.add_noise(self)
        b = float(self.expected_batch_size)
        for p in self.params:
            noise = p.grad - p.summed_grad.view_as(p)
            p.grad = (p.summed_grad.view_as(p) + noise / b).view_as(p)

    return {"add_noise": add_noise}


def _bias_no_noise(base: type) -> dict[str, Any]:
    def add_noise(self: Any) -> None:
        base.add_noise(self)
        for p in self.params:
            if p.dim() == 1:  # biases and norm scales: the noise is dropped again
                p.grad = p.summed_grad.view_as(p).clone()

    return {"add_noise": add_noise}


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


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("no-noise", "no Gaussian noise is added to the clipped sum",
            _scaled_noise(lambda opt: 0.0)),
        Bug("noise-divided-by-batch",
            "the noise is divided by the expected batch size a second time",
            lambda base: _noise_divided_by_batch(base)),
        Bug("noise-halved",
            "the noise is drawn with half the noise multiplier; the accountant sees the original",
            _scaled_noise(lambda opt: 0.5)),
        Bug("no-clipping", "per-sample gradients are summed without clipping",
            lambda base: _no_clipping(base), ghost_ok=False),
        Bug("bias-no-noise", "one-dimensional tensors (biases, norm scales) get no noise",
            lambda base: _bias_no_noise(base)),
    )
}


def names() -> list[str]:
    """The registered bug names."""
    return list(BUGS)


def applied_bug(optimizer: Any) -> str | None:
    """The name of the bug applied to ``optimizer``, or None."""
    return getattr(optimizer, _BUG_ATTR, None)


def apply_bug(optimizer: Any, name: str) -> Any:
    """Make ``optimizer`` (an Opacus ``DPOptimizer`` instance) silently broken; returns it.

    Raises:
        TypeError: ``optimizer`` is not an Opacus DP optimizer.
        ValueError: unknown ``name``, a bug already applied, or a bug that does not apply to
            this optimizer (``no-clipping`` under ghost clipping).
    """
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"apply_bug needs an Opacus DPOptimizer instance, got "
                        f"{type(optimizer).__name__}")
    if not isinstance(name, str) or name not in BUGS:
        raise ValueError(f"unknown bug {name!r}; known bugs: {', '.join(BUGS)}")
    if applied_bug(optimizer) is not None:
        raise ValueError(f"bug {applied_bug(optimizer)!r} is already applied to this optimizer")
    bug = BUGS[name]
    base = type(optimizer)
    if not bug.ghost_ok and isinstance(optimizer, DPOptimizerFastGradientClipping):
        raise ValueError(f"bug {name!r} cannot be applied under ghost clipping: clipping happens "
                         f"in the loss's backward pass, not in the optimizer")
    cls = type(f"Buggy_{name.replace('-', '_')}_{base.__name__}", (base,), bug.make(base))
    optimizer.__class__ = cls
    setattr(optimizer, _BUG_ATTR, name)
    optimizer._dpaudit_bug_base = base
    return optimizer


def remove_bug(optimizer: Any) -> Any:
    """Undo :func:`apply_bug` (restores the original class); a no-op without a bug."""
    if applied_bug(optimizer) is None:
        return optimizer
    optimizer.__class__ = optimizer._dpaudit_bug_base
    del optimizer._dpaudit_bug_base
    delattr(optimizer, _BUG_ATTR)
    return optimizer
