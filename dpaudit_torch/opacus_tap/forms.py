"""The forms in which an optimizer's clipping method can be installed, and how the canaries'
clipping runs each of them (docs/auditor.md, "Clipping installed in other forms").

The injector stands in front of the optimizer's ``clip_and_accumulate`` (``accumulate`` under
ghost clipping) and runs what was installed there twice: on the real examples, exactly as
Python would call it, and on the canaries, on a shadow of the optimizer
(:mod:`.shadow`). How it reaches the shadow depends on the form:

* **bound to the shadow** (:data:`BIND`): a plain function on the optimizer's class (Opacus's
  own method, a subclass's override, a decorator on the class that returns a function) is bound
  to the shadow object, an object of the same class whose state holds the canary tensors;
* **run on the optimizer, its state swapped** (:data:`SWAP`): anything that cannot be bound to
  another object -- a function, closure or lambda stored on the instance (called without
  ``self``), a ``types.MethodType`` on the instance, a ``functools.partial`` (of Opacus's
  method with the optimizer, or of the user's function), a decorator around the instance's
  method, a class attribute that does not bind (a ``partial``, a ``staticmethod``, a callable
  object) -- is called exactly as installed while the optimizer object's ``__dict__`` is, for
  that call only, the shadow's state (:func:`run_swapped`). Whatever the code reaches through
  the optimizer object (``self``, a closure's captured optimizer, a bound method of it) then
  sees the canary tensors. The real parameters' per-sample gradients are hidden during that call,
  so code that reaches them by another route (a captured parameter list) fails instead of
  clipping the real examples twice.

Where the code cannot be run on the canaries (it raises on them, or leaves no clipped sum on the
canary tensors) the call raises :class:`ClippingNotRunError`; the per-sample strategy then adds
that step's canaries already clipped, as a correct clipper would (as under ghost clipping), and
the report says so.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ClippingNotRunError", "BIND", "SWAP", "resolve", "describe", "run_swapped",
           "bound_to"]

#: the installed method is bound to the shadow object
BIND = "bind"
#: the installed callable runs on the optimizer object whose state is the shadow's
SWAP = "swap"


class ClippingNotRunError(Exception):
    """The optimizer's clipping code could not be run on the canaries (``reason``, in words)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def resolve(optimizer: Any, name: str, instance_attr: Any, on_instance: bool) -> Callable[[], Any]:
    """What ``optimizer.<name>()`` calls: the instance attribute as stored (``on_instance``),
    else the class attribute through the descriptor protocol (a function binds, a
    ``staticmethod`` gives its function, a ``partial`` or a callable object is returned as
    is)."""
    if on_instance:
        return instance_attr
    attr = getattr(type(optimizer), name)
    get = getattr(type(attr), "__get__", None)
    return attr if get is None else get(attr, optimizer, type(optimizer))


def bound_to(optimizer: Any, name: str, target: Any) -> Callable[[], Any] | None:
    """The class's ``name`` bound to ``target`` (the shadow), or None when the class attribute
    does not bind to the object it is looked up on (it must then run :data:`SWAP`)."""
    attr = getattr(type(optimizer), name, None)
    get = getattr(type(attr), "__get__", None)
    if get is None:
        return None
    bound = get(attr, target, type(target))
    return bound if getattr(bound, "__self__", None) is target else None


def describe(fn: Any, on_instance: bool) -> str:
    """The form of an installed clipping method, in words (for the report)."""
    where = "on the optimizer instance" if on_instance else "on the optimizer's class"
    if isinstance(fn, functools.partial):
        inner = getattr(fn.func, "__qualname__", type(fn.func).__name__)
        return f"a functools.partial of {inner} {where}"
    if isinstance(fn, types.MethodType):
        return f"a method {getattr(fn, '__qualname__', '?')} bound {where}"
    if isinstance(fn, types.FunctionType):
        kind = "a lambda" if fn.__name__ == "<lambda>" else f"the function {fn.__qualname__}"
        return f"{kind} {where}"
    return f"a callable {type(fn).__name__} {where}"


def run_swapped(optimizer: Any, fn: Callable[[], Any], state: dict[str, Any],
                hidden: list[torch.nn.Parameter]) -> None:
    """Call ``fn()`` (as installed) while ``optimizer.__dict__`` is ``state`` (the shadow's) and
    the per-sample gradients of ``hidden`` (the real parameters) are None; both are put back
    whatever happens. Raises :class:`ClippingNotRunError` when ``fn`` raises."""
    own = optimizer.__dict__
    kept = [getattr(p, "grad_sample", None) for p in hidden]
    for p in hidden:
        p.grad_sample = None
    optimizer.__dict__ = state
    try:
        fn()
    except Exception as e:
        raise ClippingNotRunError(
            f"it raised {type(e).__name__}: {e} when run on the canaries") from e
    finally:
        optimizer.__dict__ = own
        for p, g in zip(hidden, kept):
            p.grad_sample = g
