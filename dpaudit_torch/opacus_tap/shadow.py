"""The canaries' clipping on a shadow of the optimizer (per-sample modes): the strategy object
:class:`ShadowClipper`, composed by :class:`~.injection.PerSampleInjection`.

The step's canaries are R *compact* rows, holding per parameter tensor only the coordinates
this step's canaries occupy in it, written into one persistent all-zero buffer; they are clipped
by the optimizer class's own ``clip_and_accumulate`` run on a shadow of the optimizer whose
parameters are those compact tensors (one concatenated tensor where the clipping is Opacus's own
joint-norm code), and the clipped sums are added to ``p.summed_grad`` at the canary coordinates
(docs/design.md section 5, "Compact canary rows"). Where that joint-norm code applies, on the CPU
with compiled kernels, a compiled replica computes the same sums (docs/design.md section 5, "The
compiled replica"), checked against Opacus's own call periodically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from .._compiled import compiled
from ._step_kernels import add_columns, add_joint, clip_joint
from ._step_kernels import write_rows as write_rows_kernel
from .forms import ClippingNotRunError
from .observation import host_views
from .plan import OPACUS_NORM_EPS, StepPlan, joint_norm_clipping
from .recovery import add_at

__all__ = ["ShadowClipper", "WrappedClipping", "REPLICA_CHECK_EVERY"]

_NO_WEIGHT = np.zeros(0)  # write_rows: no per-entry weights

logger = logging.getLogger(__name__)

#: the compiled replica of Opacus's joint-norm clipping is checked against Opacus's own call at
#: its first step and then at every this many steps (docs/design.md section 5)
REPLICA_CHECK_EVERY = 64


class WrappedClipping(Protocol):
    """What the shadow clipping needs of the injector: the optimizer's clipping method that the
    injector's wrapper stands in front of (run by the shadow on the canaries)."""

    @property
    def method_name(self) -> str:
        """The wrapped method's name (``clip_and_accumulate``)."""

    @property
    def method_on_instance(self) -> bool:
        """Whether the wrapped method was an instance attribute of the optimizer at attach
        (a user's or a test's patch: never clipped as Opacus's joint-norm code)."""

    def method_bound_to(self, target: Any) -> Callable[[], Any]:
        """The wrapped method made to run on ``target`` (the shadow): bound to it, or run on
        the optimizer whose state is, for that call, the shadow's (:mod:`.forms`)."""


class ShadowClipper:
    """Clips a step's canaries with the optimizer's own clipping code, on a shadow of the
    optimizer, and adds their clipped sums to the real ``summed_grad``.

    Public interface: :meth:`joint` (this step's shadow layout), :meth:`clip` (the canaries'
    clipped sums: the compiled replica where it applies, else :meth:`write_rows` then
    :meth:`clip_rows`), :meth:`add` (the sums added at the canary coordinates), the persistent
    :attr:`rows_buffer`, the switches :attr:`joint_shadow`, :attr:`replica_clip`,
    :attr:`compiled_add`, :attr:`host_rows` and the counters :attr:`compiled_adds`,
    :attr:`replica_steps`, :attr:`replica_ok`.

    Args:
        optimizer: the Opacus ``DPOptimizer`` whose clipping runs on the shadow.
        params: its trainable parameters, in ``optimizer.params`` order.
        device: the parameters' device (where the rows buffer lives).
        canary_norm: raw canary norm as a multiple of the clipping bound.
        method: the clipping method the injector wraps (:class:`WrappedClipping`).
        joint_shadow: allow one concatenated shadow tensor (Opacus's joint-norm code only).
    """

    def __init__(self, optimizer: Any, params: list[torch.nn.Parameter], device: torch.device,
                 canary_norm: float, method: WrappedClipping, joint_shadow: bool) -> None:
        self.optimizer = optimizer
        self.params = params
        self.device = device
        self.canary_norm = float(canary_norm)
        self._method = method
        #: clip the canaries as one concatenated shadow tensor where the optimizer's clipping is
        #: Opacus's own joint-norm code (:func:`~.plan.joint_norm_clipping`; tests switch it off
        #: to compare with one shadow tensor per real one)
        self.joint_shadow = joint_shadow
        #: clip the canaries with the compiled replica of Opacus's joint-norm clipping where it
        #: applies (tests switch it off to compare with Opacus's call)
        self.replica_clip = True
        #: add the canaries' clipped sums in one compiled pass where it can (tests switch it off
        #: to compare with the torch path)
        self.compiled_add = True
        #: write the rows through the buffer's NumPy view where it has one (CPU; tests switch it
        #: off, before the first step, to compare with torch's ``index_copy_``)
        self.host_rows = True
        self.compiled_adds = 0  # steps whose canary sums the compiled pass added
        self._zero_buf: torch.Tensor | None = None
        self._zero_np: np.ndarray | None = None  # its NumPy view (CPU)
        self._joint_width = 0  # columns of the joint shadow tensor (only grows)
        self._clip_cache: dict[Any, Any] = {}  # the bounds as an array (write_rows)
        # shadow parameters: one per real tensor (False) or one for all (True, joint clipping)
        self._shadow_params: dict[bool, list[torch.nn.Parameter]] = {}
        self._shadow_base: torch.Tensor | None = None  # zeros the shadow parameters view
        # the base's views by size, and the size each shadow parameter holds now
        self._shadow_views: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None
        self._shadow_sizes: dict[bool, list[int]] = {}
        self._replica_ok = True  # no disagreement with Opacus's own call seen
        self._replica_steps = 0  # steps clipped by the replica (every 64th also by Opacus)
        self._replica_buf: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def rows_buffer(self) -> torch.Tensor | None:
        """The persistent canary-rows buffer (all zeros between steps), None before the first
        step that wrote rows."""
        return self._zero_buf

    @property
    def replica_ok(self) -> bool:
        """False once the compiled replica disagreed with Opacus's own call (it is then off for
        good)."""
        return self._replica_ok

    @property
    def replica_steps(self) -> int:
        """Steps whose canaries the compiled replica clipped (the checked ones included)."""
        return self._replica_steps

    def joint(self) -> bool:
        """Whether this step clips the canaries as one concatenated shadow tensor."""
        return (self.joint_shadow and not self._method.method_on_instance
                and joint_norm_clipping(self.optimizer))

    def clip(self, rec: StepPlan, dtype: torch.dtype, joint: bool) -> list[torch.Tensor | None]:
        """This step's canaries clipped as the optimizer would (rows of ``dtype``, the real
        per-sample gradients' dtype; ``joint``: :meth:`joint`): their clipped sums, for
        :meth:`add` once the real examples are clipped. The compiled replica where it applies,
        else the rows written into the buffer, clipped on the shadow (:meth:`clip_rows`), and
        the buffer set back to all zeros (even when the clipping raised)."""
        if self._replica_applies(joint, dtype):
            return self._replica(rec, dtype)
        views, undo = self.write_rows(rec, dtype, joint)
        try:
            try:
                return self.clip_rows(views, rec, joint)
            except ClippingNotRunError as e:  # this step's canaries: as a correct clipper
                rec.clip_fallback = e.reason
                return self.reference_clip(views, rec, joint)
        finally:
            undo()

    def reference_clip(self, views: list[torch.Tensor], rec: StepPlan, joint: bool = False
                       ) -> list[torch.Tensor | None]:
        """The rows' clipped sums as Opacus's own clipping computes them (the fallback where
        the optimizer's clipping cannot be run on the canaries, :mod:`.forms`): each row scaled
        by ``min(1, C / (norm + 1e-6))``, its norm over every tensor with the flat bound, or
        tensor by tensor with that tensor's bound under per-layer clipping."""
        if getattr(self.optimizer, "max_grad_norms", None) is not None and not joint:
            return [(c / (v.norm(2, dim=1) + OPACUS_NORM_EPS)).clamp(max=1.0) @ v
                    for v, c in zip(views, rec.clip)]
        norms = torch.stack([v.norm(2, dim=1) for v in views], dim=1).norm(2, dim=1)
        factor = (rec.clip[0] / (norms + OPACUS_NORM_EPS)).clamp(max=1.0)
        return [factor @ v for v in views]

    def _rows_buffer(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A persistent all-zero buffer of at least ``size`` elements (and, on the CPU, its
        NumPy view in ``_zero_np``).

        Each step writes its few canary entries and sets exactly those back to zero after
        Opacus has read the rows, so no step pays for zeroing the whole buffer. It grows (with
        some room: the row count varies with the Poisson inclusions) only when a step needs
        more."""
        buf = self._zero_buf
        if buf is None or buf.dtype != dtype or buf.numel() < size:
            buf = torch.zeros(size + size // 2 + 64, dtype=dtype, device=self.device)
            self._zero_buf = buf
            self._zero_np = (buf.numpy() if self.host_rows and buf.device.type == "cpu"
                             and buf.dtype in (torch.float32, torch.float64) else None)
        return buf

    def write_rows(self, rec: StepPlan, dtype: torch.dtype, joint: bool = False
                   ) -> tuple[list[torch.Tensor], Callable[[], None]]:
        """Write this step's canary entries into the rows buffer; return the rows, per parameter
        tensor the ``[R, counts[p]]`` view holding this step's entries in it (one column per
        entry: one ``[R, E]`` matrix with the columns grouped by tensor, see ``plan_step``,
        split once), and the function that sets those entries back to zero.

        ``joint``: one ``[R, W]`` matrix, the E columns followed by W - E zero columns (W only
        grows, so that the one shadow tensor keeps its size from step to step; zero columns
        change no norm and no sum)."""
        counts, col_flat = rec.entry_counts, rec.column_flat
        index, which = rec.entry_index, rec.entry_param
        assert counts is not None and col_flat is not None
        assert index is not None and which is not None
        R = rec.n_rows
        E = W = col_flat.shape[0]  # one column per entry
        if joint:
            if self._joint_width < E:
                self._joint_width = max(64, 2 * E)
            W = self._joint_width
        buf = self._rows_buffer(R * W, dtype)
        host = self._zero_np
        if joint:  # one fresh view (Opacus marks the rows it clipped as processed)
            views = [buf.as_strided((R, W), (W, 1))]
        else:
            views = list(buf[:R * W].view(R, W).split(counts.tolist(), dim=1))
        if host is not None and compiled():
            # one compiled pass writes the entries (and one sets them back to zero)
            clip_arr = self._clip_array(rec.clip)
            weight = _NO_WEIGHT if rec.entry_weight is None else rec.entry_weight
            write_rows_kernel(host, rec.entry_index, E, W, which, clip_arr, weight,
                              self.canary_norm)

            def undo_compiled() -> None:
                write_rows_kernel(host, rec.entry_index, E, W, which, clip_arr, weight, 0.0)
            return views, undo_compiled
        if E and W != E:
            index = index + (index // E) * (W - E)
        clip = rec.clip
        uniform = all(c == clip[0] for c in clip)
        v: float | np.ndarray = self.canary_norm * (clip[0] if uniform
                                                    else np.asarray(clip)[which])
        if rec.entry_weight is not None:
            v = v * rec.entry_weight
        if host is not None:
            host[index] = v  # in the buffer's dtype, rounded as torch's copy would

            def undo() -> None:
                host[index] = 0.0
        else:
            written = torch.from_numpy(index)
            if written.device != buf.device:
                written = written.to(buf.device, non_blocking=True)
            if isinstance(v, float):
                buf.index_fill_(0, written, v)
            else:
                buf.index_copy_(0, written, torch.from_numpy(v).to(
                    device=buf.device, dtype=buf.dtype, non_blocking=True))

            def undo() -> None:
                buf.index_fill_(0, written, 0.0)
        return views, undo

    def _clip_array(self, clip: list[float]) -> np.ndarray:
        """The per-tensor bounds as a float64 array (rebuilt only when they change)."""
        key = tuple(clip)
        hit = self._clip_cache.get("clip")
        if hit is None or hit[0] != key:
            hit = self._clip_cache["clip"] = (key, np.asarray(clip, dtype=np.float64))
        return hit[1]

    # ------------------------------------------------------------------ the compiled replica
    def _replica_applies(self, joint: bool, dtype: torch.dtype) -> bool:
        """Whether this step's canaries may be clipped by :func:`._step_kernels.clip_joint`:
        Opacus's own joint-norm code (``joint``), on the CPU with compiled kernels, rows of the
        parameters' float32 or float64 dtype, and no disagreement with Opacus's call seen."""
        return (joint and self.replica_clip and self._replica_ok and compiled()
                and self.device.type == "cpu" and dtype in (torch.float32, torch.float64)
                and self.params[0].dtype == dtype)

    def _replica(self, rec: StepPlan, dtype: torch.dtype) -> list[torch.Tensor | None]:
        """The canaries' clipped column sums of Opacus's joint-norm clipping, computed from the
        step's entries in one compiled pass instead of Opacus's call on the shadow (the same
        operations, rounded to the rows' dtype; docs/design.md section 5, "The compiled
        replica"). At the first step and every :data:`REPLICA_CHECK_EVERY` steps Opacus's own
        call runs as well and its sums are the ones used: if they differ from the replica's
        beyond the rounding of a few operations, the replica is switched off for good (a
        warning says so) and every later step calls Opacus's code."""
        counts, col_flat = rec.entry_counts, rec.column_flat
        assert counts is not None and col_flat is not None and rec.entry_index is not None
        E, R = int(col_flat.shape[0]), int(rec.n_rows)
        np_dtype = np.float32 if dtype == torch.float32 else np.float64
        buf = self._replica_buf
        if buf is None or buf[0].dtype != np_dtype or buf[0].shape[0] < E or (
                buf[1].shape[0] < R):
            buf = self._replica_buf = (np.zeros(2 * E + 64, dtype=np_dtype),
                                       np.zeros(2 * R + 64), np.zeros(1, dtype=np_dtype))
        out, norm2, tmp = buf
        weight = _NO_WEIGHT if rec.entry_weight is None else rec.entry_weight
        clip_joint(rec.entry_index, E, rec.entry_param, self._clip_array(rec.clip), weight,
                   self.canary_norm, float(self.optimizer.max_grad_norm), OPACUS_NORM_EPS,
                   out, norm2[:R], tmp)
        mine = torch.from_numpy(out[:E])
        self._replica_steps += 1
        if (self._replica_steps - 1) % REPLICA_CHECK_EVERY:
            return [mine]
        views, undo = self.write_rows(rec, dtype, True)
        try:
            theirs = self.clip_rows(views, rec, True)
        finally:
            undo()
        got = theirs[0]
        if got is None or not torch.allclose(
                got.reshape(-1)[:E].to(torch.float64), mine.to(torch.float64),
                rtol=16 * torch.finfo(dtype).eps, atol=0.0):
            self._replica_ok = False
            logger.warning(
                "the compiled replica of Opacus's joint-norm clipping disagrees with Opacus's "
                "own call on this step's canaries; the canaries are clipped by Opacus's code "
                "from now on")
        return theirs

    # ------------------------------------------------------------------ the shadow
    def _shadow(self, counts: list[int], dtype: torch.dtype, joint: bool = False
                ) -> tuple[Any, list[torch.nn.Parameter]]:
        """A shadow of the optimizer for one clipping call, and its parameters: an object of the
        optimizer's own class with a copy of its attributes (tensors cloned, so that counters
        such as adaptive clipping's stay untouched), whose parameters are the compact canary
        tensors (one per real parameter tensor, in the same order, of the real tensor's dtype
        and device; tensor p holds ``counts[p]`` zeros: this step's canary entries in it).
        ``joint``: one parameter for all of them (``counts`` then has one entry)."""
        opt = self.optimizer
        like = self.params[:1] if joint else self.params
        sparams = self._shadow_params.get(joint)
        if sparams is None:
            sparams = self._shadow_params[joint] = [
                torch.nn.Parameter(torch.zeros(0, dtype=p.dtype, device=p.device))
                for p in like]
        need = max(counts, default=0)
        base = self._shadow_base
        if base is None or base.numel() < need or base.dtype != dtype:
            base = self._shadow_base = torch.zeros(max(need, 64), dtype=dtype,
                                                   device=self.device)
        views = self._shadow_views
        if views is None or views[0] is not base:  # (re)built: every size set again
            views = self._shadow_views = (base, {})
            self._shadow_sizes = {}
        sizes = self._shadow_sizes.setdefault(joint, [-1] * len(like))
        for i, (sp, p, c) in enumerate(zip(sparams, like, counts)):
            if sizes[i] == c:  # still c zeros of the shared base: nothing to do
                continue
            z = views[1].get(c)
            if z is None:
                z = views[1][c] = base[:c]
            sp.data = z if (z.dtype, z.device) == (p.dtype, p.device) else z.to(p.device,
                                                                               p.dtype)
            sizes[i] = c
        state = dict(vars(opt))
        state.pop(self._method.method_name, None)
        for k in [k for k, v in state.items() if isinstance(v, torch.Tensor)]:
            state[k] = state[k].clone()
        state["original_optimizer"] = _ParamGroups([{"params": sparams}])
        shadow = object.__new__(type(opt))
        shadow.__dict__ = state
        return shadow, sparams

    def clip_rows(self, views: list[torch.Tensor], rec: StepPlan, joint: bool = False
                  ) -> list[torch.Tensor | None]:
        """Clip the compact canary rows (:meth:`write_rows`) with the optimizer's clipping code;
        return the clipped sums it left on the shadow tensors (for :meth:`add`, which adds them to
        ``p.summed_grad`` at the canary coordinates once the real examples are clipped).

        What this exercises of the implementation under audit: its class's
        ``clip_and_accumulate`` (a subclass's override included), with its current bounds
        (``max_grad_norm``, per-layer ``max_grad_norms``, adaptive clipping's current bound),
        its per-sample norm over all parameter tensors (one shadow tensor per real one, in the
        same order), its clip factor and its accumulation into ``summed_grad``, on the rows'
        dtype. Each canary is one sample of that call, so a bug in how one sample is clipped
        shows in the canaries. Not exercised: what a clipping method does differently with the
        real tensors' shapes or identities (the shadow tensors are 1-d and hold only this
        step's canary coordinates), and the final addition to the real ``summed_grad``
        (:meth:`add`'s). ``joint`` (Opacus's own joint-norm clipping only, which treats the tensors
        as one concatenated vector): the rows are one shadow tensor of all the step's entries,
        the same sums in one call instead of a norm and a contraction per tensor."""
        counts, col_flat = rec.entry_counts, rec.column_flat
        assert counts is not None and col_flat is not None
        dtype = views[0].dtype if views else torch.float32
        shadow, sparams = self._shadow(
            [int(views[0].shape[1])] if joint else counts.tolist(), dtype, joint)
        for sp, rows in zip(sparams, views):
            sp.grad_sample = rows if rows.device == sp.device else rows.to(sp.device)
            sp.summed_grad = None
        try:
            call = self._method.method_bound_to(shadow)
            try:
                call()
            except ClippingNotRunError:
                raise
            except Exception as e:  # the code under audit failed on the canaries
                raise ClippingNotRunError(
                    f"it raised {type(e).__name__}: {e} when run on the canaries") from e
        finally:
            for sp in sparams:
                sp.grad_sample = None
        adds = [sp.summed_grad for sp in sparams]
        for sp in sparams:
            sp.summed_grad = None
        widths = [int(v.shape[1]) for v in views]
        if any(w and (a is None or a.numel() != w) for a, w in zip(adds, widths)):
            raise ClippingNotRunError(
                "it left no clipped sum of the canaries on the parameters it was given (it "
                "does not reach the per-sample gradients through the optimizer object)")
        return adds

    def add(self, rec: StepPlan, adds: list[torch.Tensor | None], joint: bool = False) -> None:
        """Add the canaries' clipped sums (:meth:`clip`) to ``p.summed_grad`` at the canary
        coordinates: one compiled pass on the CPU, else one ``index_add_`` per tensor. Where
        ``rec.added`` is set (:class:`~.recovery.Added`), the values each addition changes are
        kept in it first."""
        counts, col_flat = rec.entry_counts, rec.column_flat
        assert counts is not None and col_flat is not None
        if self._add_compiled(rec, adds, counts, col_flat, joint):
            return
        if joint:
            adds = ([None] * len(self.params) if adds[0] is None
                    else list(adds[0].reshape(-1)[:col_flat.shape[0]].split(counts.tolist())))
        self._add_torch(adds, counts, col_flat, rec.added)

    def _add_torch(self, adds: list[torch.Tensor | None], counts: np.ndarray,
                   col_flat: np.ndarray, added: Any = None) -> None:
        """The clipped column sums of every tensor added to ``p.summed_grad`` (torch): the
        step's flat indices copied to the device and split once, then per tensor holding
        canaries one ``put_`` (and, where ``added`` keeps the old values, one ``take``)."""
        flats = torch.from_numpy(col_flat)
        if flats.device != self.device:  # one small copy per step, not one per tensor
            flats = flats.to(self.device, non_blocking=True)
        parts = flats.split(counts.tolist())
        for i, (p, add) in enumerate(zip(self.params, adds)):
            if not counts[i]:
                continue
            if add is None:
                raise RuntimeError("the optimizer's clipping left no summed_grad on a canary "
                                   "tensor")
            sg = getattr(p, "summed_grad", None)
            if sg is None:
                sg = torch.zeros_like(p)
                p.summed_grad = sg
                if added is not None:
                    added.created(p)
            index = parts[i] if parts[i].device == sg.device else parts[i].to(sg.device)
            add_at(sg, index, add, added, i)

    def _add_compiled(self, rec: StepPlan, adds: list[torch.Tensor], counts: np.ndarray,
                      col_flat: np.ndarray, joint: bool = False) -> bool:
        """The final addition of :meth:`add` in one compiled pass (CPU, one dtype)
        through the snapshot's views of the real ``summed_grad``; False where that path does
        not apply (the torch path then does the same additions)."""
        if rec.summed_host is None or not self.compiled_add or not compiled():
            return False
        sums, dst = rec.summed_host
        if any(a is None for a in adds):
            return False
        for p, t in zip(self.params, sums):
            # the views must still be those of the tensors the optimizer will use
            if getattr(p, "summed_grad", None) is not t:
                return False
        src = host_views(adds)
        if src is None or src[0].dtype != dst[0].dtype:
            return False
        if rec.added is not None:
            rec.added.keep_host(dst, counts, col_flat)
        if joint:
            add_joint(dst, src[0], counts, col_flat)
        else:
            add_columns(dst, src, counts, col_flat)
        self.compiled_adds += 1
        return True


class _ParamGroups:
    """Stands in for the shadow's ``original_optimizer``: Opacus's optimizers reach their
    parameters through ``self.original_optimizer.param_groups``."""

    def __init__(self, param_groups: list[dict[str, Any]]) -> None:
        self.param_groups = param_groups
