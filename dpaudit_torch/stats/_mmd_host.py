"""The NumPy host path of the MMD test's kernel witness (CPU, float64): a mixin of
:class:`~dpaudit_torch.stats._mmd_witness.KernelWitness`.

The same algebra as the witness's torch code (docs/design.md section 2), on NumPy views of the
stored state (the state stays in the test's torch tensors), without torch's per-operation
overhead; for one-dimensional pairs in a chunk that drops stored pairs, two compiled passes
around one NumPy exponential (:func:`~._kernels.mmd_args_1d`, :func:`~._kernels.mmd_blocks_1d`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._compiled import compiled
from .._vecmath import exp_
from ._kernels import mmd_args_1d, mmd_blocks_1d, mmd_fwd_update

__all__ = ["HostWitness"]


def _stored_blocks(A: Any, X: Any, Y: Any, Xn: Any, Yn: Any, Q: Any, Qn: Any, n: int, T: int,
                   B: int, kernel: Callable[..., Any], sub: Callable[..., Any], r: Any,
                   G: Any) -> None:
    """The stored pairs' part of the witness at the query points ``Q = [x parts; y parts]``,
    in blocks of B stored pairs, accumulated into ``r`` (and their Gram block into ``G``): the
    same loop for NumPy arrays and torch tensors (``kernel`` and ``sub`` of that library)."""
    for b0 in range(0, T, B):
        b1 = min(T, b0 + B)
        a = A[b0:b1]
        kx = kernel(X[b0:b1], Xn[b0:b1], Q, Qn)
        ky = kernel(Y[b0:b1], Yn[b0:b1], Q, Qn)
        r += a @ kx
        r -= a @ ky
        if G is not None:
            kx -= ky  # k(x_i, q) - k(y_i, q)
            sub(kx[:, :n], kx[:, n:], out=G[b0:b1])


class HostWitness:
    """The NumPy host path of the kernel witness (its state and recursions are the witness's)."""

    # supplied by KernelWitness and the test class
    bandwidth: float | None
    max_witness_points: int | None
    _center: torch.Tensor | None
    _T: int
    _head: int
    _X: torch.Tensor | None
    _Y: torch.Tensor | None
    _Xn: torch.Tensor | None
    _Yn: torch.Tensor | None
    _a: torch.Tensor | None
    _fwd: torch.Tensor | None
    _ensure_capacity: Callable[..., None]
    _block_rows: Callable[[int], int]
    _recursion: Callable[..., tuple[np.ndarray, np.ndarray, float]]
    _recursion_capped: Callable[..., tuple[np.ndarray, np.ndarray, float]]
    _advance_ring: Callable[[int, int, int], None]

    def _state_np(self) -> tuple[np.ndarray, ...]:
        """NumPy views of (centre, X, Y, Xn, Yn, a, fwd) (CPU state; fwd may be absent),
        cached while the state tensors stay the same objects."""
        objs = (self._center, self._X, self._Y, self._Xn, self._Yn, self._a, self._fwd)
        hit = self.__dict__.get("_np_views")
        if hit is None or any(a is not b for a, b in zip(hit[0], objs)):
            views = tuple(np.empty(0) if t is None else t.numpy() for t in objs)
            hit = (objs, views)
            self._np_views = hit
        return hit[1]

    @staticmethod
    def _kernel_host(P: np.ndarray, Pn: np.ndarray, Q: np.ndarray, Qn: np.ndarray
                     ) -> np.ndarray:
        """:meth:`_kernel` in NumPy (float64): exp(-||p - q||^2 / 2), [len(P), len(Q)]."""
        if P.shape[1] == 1:
            sq = np.subtract.outer(P[:, 0], Q[:, 0])
            np.square(sq, out=sq)
        else:
            sq = P @ Q.T
            sq *= -2.0
            sq += Pn[:, None]
            sq += Qn[None, :]
            np.maximum(sq, 0.0, out=sq)
        sq *= -0.5
        return exp_(sq)

    @classmethod
    def _gram_host(cls, X: np.ndarray, Xn: np.ndarray, Y: np.ndarray, Yn: np.ndarray
                   ) -> np.ndarray:
        """``H[i, j] = <g_i, g_j> = k(x_i, x_j) - k(x_i, y_j) - k(y_i, x_j) + k(y_i, y_j)`` for
        the pairs (X, Y) [N, d], from three N x N kernel blocks (``k(y_i, x_j)`` is the
        transpose of the x-y block; the same terms, added in the same order, as the blocks of
        the 2N x 2N kernel matrix of the stacked points)."""
        Kxy = cls._kernel_host(X, Xn, Y, Yn)
        H = cls._kernel_host(X, Xn, X, Xn)
        H -= Kxy
        H -= Kxy.T
        H += cls._kernel_host(Y, Yn, Y, Yn)
        return H

    def _stored_part_host(self, Q: np.ndarray, Qn: np.ndarray, n: int, T: int, gram: bool
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`_stored_part` in NumPy, on views of the stored state."""
        r = np.zeros(2 * n)
        G = np.empty((T, n)) if gram and T else None
        if T:
            assert self._X is not None and self._Y is not None and self._a is not None
            assert self._Xn is not None and self._Yn is not None
            _, X, Y, Xn, Yn, A, _ = self._state_np()
            _stored_blocks(A, X, Y, Xn, Yn, Q, Qn, n, T, self._block_rows(n),
                           self._kernel_host, np.subtract, r, G)
        return r, G

    def _witness_values_host(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """:meth:`_witness_values` (and its capped form) for CPU float64 chunks, in NumPy on
        views of the stored state (the state stays in the test's torch tensors)."""
        assert self.bandwidth is not None and self._center is not None
        n, d = int(x.shape[0]), int(x.shape[1])
        cap = self.max_witness_points
        T = self._T
        dropping = cap is not None and T + n > cap
        E = T + n - cap if dropping and cap is not None else 0
        if dropping:
            assert cap is not None and 1 <= E <= n <= cap and E <= T
            if d == 1 and compiled() and (T == cap or self._head == 0):
                return self._witness_values_capped_1d(x, y, T, E, cap)
        inv_bw = 1.0 / self.bandwidth
        center = self._state_np()[0]
        zx = (x - center) * inv_bw
        zy = (y - center) * inv_bw
        Qs = np.concatenate([zx, zy])  # [2n, d]: the new points
        Qsn = (Qs * Qs).sum(axis=1)
        track = cap is not None  # keep fwd for the FIFO drops
        r, gram = self._stored_part_host(Qs, Qsn, n, T, track)
        old = r[:n] - r[n:]
        g2 = 2.0 - 2.0 * np.exp(-0.5 * np.square(zx - zy).sum(axis=1))
        self._ensure_capacity(min(T + n, cap) if dropping and cap is not None else T + n, d,
                              torch.device("cpu"))
        assert self._X is not None and self._Y is not None and self._a is not None
        assert self._Xn is not None and self._Yn is not None
        _, X, Y, Xn, Yn, A, fwd = self._state_np()
        if not dropping:
            # in-chunk block: Ht[j, i] = h_i(j) = k(x_i,x_j) - k(x_i,y_j) - k(y_i,x_j) + k(y_i,y_j)
            H = self._gram_host(zx, Qsn[:n], zy, Qsn[n:])
            Ht = np.ascontiguousarray(H.T)
            v, a_new, pending = self._recursion(old, g2, Ht)
            if pending != 1.0 and T:
                A[:T] *= pending
            X[T:T + n] = zx
            Y[T:T + n] = zy
            Xn[T:T + n] = Qsn[:n]
            Yn[T:T + n] = Qsn[n:]
            A[T:T + n] = a_new
            if track:
                self._update_fwd_host(T, gram, pending, np.arange(T, T + n), Ht, a_new)
            self._T = T + n
            return v
        assert cap is not None and self._fwd is not None
        buf = int(X.shape[0])
        assert buf == cap or T + n <= buf
        ev = (self._head + np.arange(E)) % max(buf, 1)
        ex, ey = X[ev], Y[ev]
        N = n + E
        if gram is not None and (T == buf or self._head == 0):
            # <g_i, g_j> over [new, dropped]: the new-dropped block is the stored part's Gram
            # rows of the dropped pairs (the stored pairs' rows are their ring slots); only the
            # new-new and dropped-dropped blocks need kernels
            Hh = np.empty((N, N))
            Hh[:n, :n] = self._gram_host(zx, Qsn[:n], zy, Qsn[n:])
            Hh[n:, n:] = self._gram_host(ex, Xn[ev], ey, Yn[ev])
            Hh[n:, :n] = gram[ev]
            Hh[:n, n:] = gram[ev].T
        else:
            Q = np.concatenate([zx, ex, zy, ey])  # [2N, d]: x parts (new, dropped), y parts
            Qn = (Q * Q).sum(axis=1)
            Hh = self._gram_host(Q[:N], Qn[:N], Q[N:], Qn[N:])
        g2e = 2.0 - 2.0 * np.exp(-0.5 * np.square(ex - ey).sum(axis=1))
        a_ev = A[ev].copy()
        u = fwd[ev] + np.triu(Hh[n:, n:], 1).T @ a_ev
        v, a_new, pending = self._recursion_capped(old, g2, u, g2e, a_ev, Hh, n, E)
        pos = self._write_ring(T, buf, zx, zy, Qsn[:n], Qsn[n:], a_new, pending)
        self._update_fwd_host(T, gram, pending, pos, Hh, a_new)
        self._advance_ring(E, buf, cap)
        return v

    def _witness_values_capped_1d(self, x: np.ndarray, y: np.ndarray, T: int, E: int,
                                  cap: int) -> np.ndarray:
        """The dropping branch of :meth:`_witness_values_host` for one-dimensional pairs (the
        auditor's), in three calls instead of a few dozen array operations: one compiled pass
        writes the exponents of every kernel value the chunk needs, one NumPy exponential, one
        compiled pass forms the stored witness at the new pairs, the Gram blocks, the norms
        and the dropped pairs' terms (:func:`~._kernels.mmd_args_1d`,
        :func:`~._kernels.mmd_blocks_1d`: the same values as the NumPy path, up to the order
        of the sums over the stored pairs)."""
        assert self.bandwidth is not None
        n = int(x.shape[0])
        self._ensure_capacity(cap, 1, torch.device("cpu"))
        center, X, Y, _, _, A, fwd = self._state_np()
        buf = int(X.shape[0])
        assert buf == cap and self._fwd is not None
        ev = (self._head + np.arange(E)) % buf
        zx, zy = np.empty((n, 1)), np.empty((n, 1))
        need = 4 * T * n + 3 * n * n + 3 * E * E + n + E
        D = self.__dict__.get("_args_1d")
        if D is None or D.shape[0] < need:
            D = self._args_1d = np.empty(need)
        used = mmd_args_1d(np.ascontiguousarray(x[:, 0]), np.ascontiguousarray(y[:, 0]),
                           float(center[0]), 1.0 / self.bandwidth, X[:, 0], Y[:, 0], T, ev,
                           zx[:, 0], zy[:, 0], D)
        K = exp_(D[:used])
        N = n + E
        old, G, Hh = np.empty(n), np.empty((T, n)), np.empty((N, N))
        g2, g2e, a_ev, u = np.empty(n), np.empty(E), np.empty(E), np.empty(E)
        mmd_blocks_1d(K, T, n, ev, A, fwd, old, G, Hh, g2, g2e, a_ev, u)
        v, a_new, pending = self._recursion_capped(old, g2, u, g2e, a_ev, Hh, n, E)
        pos = self._write_ring(T, buf, zx, zy, zx[:, 0] * zx[:, 0], zy[:, 0] * zy[:, 0], a_new,
                               pending)
        self._update_fwd_host(T, G, pending, pos, Hh, a_new)
        self._advance_ring(E, buf, cap)
        return v

    def _write_ring(self, T: int, buf: int, zx: np.ndarray, zy: np.ndarray, zxn: np.ndarray,
                    zyn: np.ndarray, a_new: np.ndarray, pending: float) -> np.ndarray:
        """After a capped chunk's recursion: the stored coefficients rescaled by ``pending``
        and the new pairs (points, squared norms, coefficients) written into the ring slots
        after the T stored ones; returns those slots."""
        _, X, Y, Xn, Yn, A, _ = self._state_np()
        if pending != 1.0:
            A[:T] *= pending
        pos = (self._head + T + np.arange(zx.shape[0])) % buf
        X[pos] = zx
        Y[pos] = zy
        Xn[pos] = zxn
        Yn[pos] = zyn
        A[pos] = a_new
        return pos

    def _update_fwd_host(self, T: int, gram: np.ndarray | None, pending: float,
                         pos: np.ndarray, H: np.ndarray, a_new: np.ndarray) -> None:
        """:meth:`_update_fwd` on a view of the stored state (``H``: a C-ordered Gram block
        whose first n rows and columns are the new pairs'): one compiled pass
        (:func:`~._kernels.mmd_fwd_update`), or NumPy in Python mode."""
        assert self._fwd is not None
        fwd = self._state_np()[6]
        n = int(a_new.shape[0])
        if compiled() and H.flags.c_contiguous and (gram is None or gram.flags.c_contiguous):
            mmd_fwd_update(fwd, T, np.empty((0, n)) if gram is None else gram, pending,
                           np.ascontiguousarray(pos, dtype=np.int64), H, a_new)
            return
        if T:
            f = fwd[:T]
            if pending != 1.0:
                f *= pending
            if gram is not None:
                f += gram @ a_new
        fwd[pos] = np.triu(H[:n, :n]) @ a_new  # H is symmetric
