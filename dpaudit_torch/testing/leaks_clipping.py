"""Contract bugs of the clipping clause (:mod:`dpaudit_torch.testing.training`): each class
installs the user's own clipping on the optimizer in one of the forms real code takes, with a
silent bug inside. The accountant still sees the claimed noise multiplier sigma and bound C
(every bug restores ``max_grad_norm`` before the noise, which Opacus scales by it), so the noise
is sigma C while one example moves the release by more than C.

The forms (docs/auditor.md, "Clipping installed in other forms"; the auditor runs each on its
canaries, :mod:`dpaudit_torch.opacus_tap.forms`):

* ``closure-warmup-bound``: a closure assigned to the optimizer instance (called without
  ``self``) that "warms up" clipping: it raises ``max_grad_norm`` to 4 C around Opacus's own
  ``clip_and_accumulate`` (a bound method it captured) and puts C back, so the per-example
  sensitivity is 4 C;
* ``lambda-own-bound``: a lambda on the instance calling the user's own clipping function with
  the bound of the training script's arguments (10, in units where the engine was given 1): the
  sensitivity is 10 C;
* ``partial-no-clip``: a ``functools.partial`` of the user's clipping function with the
  optimizer and a bound left at None, which that function takes as "no clipping": each example
  enters the sum unclipped;
* ``partial-per-tensor``: a ``functools.partial`` of the user's function that clips every
  parameter tensor of a sample to C separately (per-layer clipping with the flat bound) and
  lets Opacus sum them: a sample's norm reaches sqrt(L) C over L tensors;
* ``decorator-rescale``: a decorator (``functools.wraps``) around the instance's Opacus method
  that multiplies the clipped sum by 2 afterwards (a gradient-accumulation correction the loss
  already made): the sensitivity is 2 C;
* ``class-decorator-rescale``: the same kind of decorator, without ``functools.wraps``, applied
  to Opacus's method on a subclass (a mixed-precision optimizer that re-applies a loss scale of 2
  after clipping);
* ``method-first-tensor-norm``: a ``types.MethodType`` bound to the instance whose per-sample
  norm is taken over the first parameter tensor only (an indexing slip): a sample's gradient in
  any other tensor is never clipped;
* ``method-mean-norm``: a ``types.MethodType`` whose per-sample norm is the mean of the
  per-tensor norms instead of their Euclidean norm (divides by L for a gradient in one tensor):
  such a sample is clipped to L C.

Every class breaks every step (``per_step``); none applies under ghost clipping (its optimizer
clips inside the loss, not in ``clip_and_accumulate``).
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from typing import Any

import torch

from .training import ContractBug, Training

__all__ = ["CLASSES"]


def _scale_rows(opt: Any, factor: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Multiply every per-sample gradient of ``opt`` by ``factor(per-sample norm)`` (the
    per-sample norm as the user's code computes it is the argument's business)."""
    with torch.no_grad():
        for p in opt.params:
            gs = p.grad_sample
            parts = gs if isinstance(gs, list) else [gs]
            out = [g * factor(g).to(g.dtype).view(-1, *([1] * (g.dim() - 1))) for g in parts]
            p.grad_sample = out if isinstance(gs, list) else out[0]


def _sum_only(opt: Any, opacus_clip: Callable[[], None]) -> None:
    """Opacus's own clipping and summing with the bound lifted (the rows are clipped already):
    what users call to "just accumulate"."""
    c = opt.max_grad_norm
    opt.max_grad_norm = math.inf
    try:
        opacus_clip()
    finally:
        opt.max_grad_norm = c


def _per_sample_norms(opt: Any, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """[B] per-sample norms from the [B, L] per-tensor norms by ``reduce`` (dim 1)."""
    norms = [g.reshape(len(g), -1).norm(2, dim=-1) for g in opt.grad_samples]
    return reduce(torch.stack(norms, dim=1))


def _clip_by(opt: Any, norms: torch.Tensor, bound: float) -> None:
    """Scale every sample by ``min(1, bound / (norm + 1e-6))`` of the given norms, then sum."""
    factor = (bound / (norms + 1e-6)).clamp(max=1.0)
    with torch.no_grad():
        for p in opt.params:
            gs = p.grad_sample
            if isinstance(gs, list):
                sizes = [len(g) for g in gs]
                p.grad_sample = [g * f.to(g.dtype).view(-1, *([1] * (g.dim() - 1)))
                                 for g, f in zip(gs, factor.split(sizes))]
            else:
                p.grad_sample = gs * factor.to(gs.dtype).view(-1, *([1] * (gs.dim() - 1)))
    _sum_only(opt, functools.partial(type(opt).clip_and_accumulate, opt))


# ------------------------------------------------------------------ a closure, a lambda
def _closure_warmup_bound(tr: Training) -> Training:
    opt = tr.optimizer
    opacus_clip = opt.clip_and_accumulate  # the bound method, captured

    def clip_and_accumulate() -> None:
        c = opt.max_grad_norm
        opt.max_grad_norm = 4.0 * c  # "warm-up": a looser bound early in training
        try:
            opacus_clip()
        finally:
            opt.max_grad_norm = c

    opt.clip_and_accumulate = clip_and_accumulate
    return tr


def _clip_with(opt: Any, max_norm: float | None) -> None:
    """The user's own clipping: every sample to ``max_norm`` (None: not clipped), then summed."""
    norms = _per_sample_norms(opt, lambda n: n.norm(2, dim=1))
    _clip_by(opt, norms, math.inf if max_norm is None else float(max_norm))


def _lambda_own_bound(tr: Training) -> Training:
    opt = tr.optimizer
    script_max_norm = 10.0  # the script's argument, in other units than the engine's C = 1
    opt.clip_and_accumulate = lambda: _clip_with(opt, script_max_norm)
    return tr


# ------------------------------------------------------------------ functools.partial
def _partial_no_clip(tr: Training) -> Training:
    opt = tr.optimizer
    opt.clip_and_accumulate = functools.partial(_clip_with, opt, None)  # a config left unset
    return tr


def _clip_each_tensor(opt: Any, max_norm: float) -> None:
    """The user's clipping: every tensor of a sample to ``max_norm`` on its own, then summed."""
    _scale_rows(opt, lambda g: (max_norm / (g.reshape(len(g), -1).norm(2, dim=1) + 1e-6))
                .clamp(max=1.0))
    _sum_only(opt, functools.partial(type(opt).clip_and_accumulate, opt))


def _partial_per_tensor(tr: Training) -> Training:
    opt = tr.optimizer
    opt.clip_and_accumulate = functools.partial(_clip_each_tensor, opt,
                                                float(opt.max_grad_norm))
    return tr


# ------------------------------------------------------------------ decorators
def _rescaled_after(factor: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator (functools.wraps) that multiplies the clipped sum by ``factor`` afterwards;
    ``opt``: the optimizer whose parameters it reaches (a method's ``self`` when None)."""
    def deco(fn: Callable[..., Any], opt: Any = None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            out = fn(*args)
            with torch.no_grad():
                for p in (opt if opt is not None else args[0]).params:
                    if p.summed_grad is not None:
                        p.summed_grad.mul_(factor)
            return out
        return wrapper
    return deco


def _decorator_rescale(tr: Training) -> Training:
    opt = tr.optimizer
    # "the loss was averaged over 2 accumulation steps: undo it" -- it was never averaged
    opt.clip_and_accumulate = _rescaled_after(2.0)(opt.clip_and_accumulate, opt)
    return tr


def _with_loss_scale(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """A decorator without functools.wraps: re-applies a loss scale of 2 after clipping."""
    def clip_and_accumulate(self: Any) -> None:
        fn(self)
        with torch.no_grad():
            for p in self.params:
                if p.summed_grad is not None:
                    p.summed_grad.mul_(2.0)
    return clip_and_accumulate


def _class_decorator_rescale(tr: Training) -> Training:
    opt = tr.optimizer
    base = type(opt)
    opt.__class__ = type(f"LossScaled{base.__name__}", (base,), {
        "clip_and_accumulate": _with_loss_scale(base.clip_and_accumulate)})
    return tr


# ------------------------------------------------------------------ types.MethodType
def _first_tensor_norm(self: Any) -> None:
    norms = self.grad_samples[0].reshape(len(self.grad_samples[0]), -1).norm(2, dim=-1)
    _clip_by(self, norms, float(self.max_grad_norm))


def _mean_norm(self: Any) -> None:
    _clip_by(self, _per_sample_norms(self, lambda n: n.mean(dim=1)), float(self.max_grad_norm))


def _bound_method(fn: Callable[[Any], None]) -> Callable[[Training], Training]:
    def apply(tr: Training) -> Training:
        tr.optimizer.clip_and_accumulate = types.MethodType(fn, tr.optimizer)
        return tr
    return apply


def _bug(name: str, description: str, apply: Callable[[Training], Training]) -> ContractBug:
    return ContractBug(name, "clipping", description, apply, per_step=True, ghost_ok=False)


#: name -> bug, in the order the detection benchmark runs them
CLASSES: dict[str, ContractBug] = {b.name: b for b in (
    _bug("closure-warmup-bound", "a closure on the optimizer instance runs Opacus's clipping "
         "with max_grad_norm raised to 4 C (a warm-up) and puts C back before the noise",
         _closure_warmup_bound),
    _bug("lambda-own-bound", "a lambda on the instance calls the user's clipping with the "
         "script's bound, 10 in units where the engine was given C = 1", _lambda_own_bound),
    _bug("partial-no-clip", "a functools.partial of the user's clipping function with the bound "
         "left at None, which it takes as no clipping", _partial_no_clip),
    _bug("partial-per-tensor", "a functools.partial of the user's function that clips each "
         "parameter tensor of a sample to C separately (sqrt(L) C per sample)",
         _partial_per_tensor),
    _bug("decorator-rescale", "a functools.wraps decorator around the instance's Opacus method "
         "multiplies the clipped sum by 2 afterwards", _decorator_rescale),
    _bug("class-decorator-rescale", "a decorator (no functools.wraps) around Opacus's method on "
         "a subclass re-applies a loss scale of 2 after clipping", _class_decorator_rescale),
    _bug("method-first-tensor-norm", "a types.MethodType on the instance takes each sample's "
         "norm over the first parameter tensor only", _bound_method(_first_tensor_norm)),
    _bug("method-mean-norm", "a types.MethodType on the instance takes each sample's norm as the "
         "mean of its per-tensor norms (L C for a gradient in one tensor)",
         _bound_method(_mean_norm)),
)}
