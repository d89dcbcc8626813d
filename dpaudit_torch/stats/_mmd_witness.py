"""Kernel witness of the sequential MMD test (docs/design.md section 2).

The witness of :class:`~dpaudit_torch.stats.mmd.SequentialMMDTest` (González, Dulce-Rubio, Ramdas
& Ribero, "Sequentially auditing differential privacy", NeurIPS 2025, arXiv 2509.07055):
``f_t = sum_{i<t} c_i (k(x_i, .) - k(y_i, .))``, learned by online gradient ascent (AdaGrad step,
projection onto the ball of radius R) in the RKHS of a Gaussian kernel whose bandwidth is the
median burn-in distance.  This module holds that machinery: bandwidth fit, stored points, kernel
blocks, the host recursion and the FIFO-capped witness (``max_witness_points``; its validity
argument is in the docstring of :class:`~dpaudit_torch.stats.mmd.SequentialMMDTest`).

Implementation notes (performance design):

* Pairs are processed in chunks of at most ``chunk_size`` pairs. For a chunk, the kernel block
  between the new points and ALL stored past points is computed on the device, blocked over past
  points so memory stays bounded, and reduced against the stored witness coefficients. Together
  with the in-chunk ``n x n`` block and the gradient norms, this is brought to the host in ONE
  copy; the scalar recursion (value, AdaGrad step, projection, new coefficient) then runs in
  float64 on the host, pair by pair, and the new coefficients are written back to the device.
  There is no Python loop over past pairs and no host synchronisation per pair.
* The witness does not depend on epsilon, so one witness serves the whole grid: K = G
  components, component g betting on ``v_t - tau_g``.
* Stored points are standardised once, ``z = (x - c) / bw`` with the burn-in mean ``c``, so that
  ``k(x, x') = exp(-||z - z'||^2 / 2)``; this is exact algebra and keeps the matmul form of the
  squared distances well conditioned.
* One-dimensional pairs (the auditor's) in a chunk that drops stored pairs, on the CPU with
  compiled kernels: one compiled pass writes the exponents of every kernel value the chunk
  needs, one NumPy exponential evaluates them, and one compiled pass forms what the recursion
  reads (``_witness_values_capped_1d``), instead of a few dozen small array operations.
* The witness coefficients are ``c_i = S * a_i`` with ONE global scale factor S (the product of
  the projection factors); the stored ``a_i`` are rescaled only when S falls below 1e-30.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from ._kernels import mmd_recursion_capped
from ._mmd_host import HostWitness, _stored_blocks

# the messages read as the MMD test's: users configure the logger "dpaudit_torch.stats.mmd"
logger = logging.getLogger("dpaudit_torch.stats.mmd")

__all__ = ["KernelWitness", "RENORM_BELOW", "NORM_TOL", "REFRESH_FACTOR"]

#: fold the global scale into the stored coefficients when it falls below this
RENORM_BELOW = 1e-30
#: capped witness: a squared norm below -NORM_TOL * (size of its terms) after dropping a pair is
#: not rounding but a bug; above it, a negative value is rounding and is clamped to 0
NORM_TOL = 1e-9
#: capped witness: ||f||^2 is recomputed from scratch (float64 Gram form) after every
#: REFRESH_FACTOR * max_witness_points evictions, so rounding cannot accumulate over long runs
#: (one update adds ~1e-16 relative error; 16 * cap updates stay far below NORM_TOL, and the
#: O(cap^2) recomputation is then ~1% of the test's work)
REFRESH_FACTOR = 16


class KernelWitness(HostWitness):
    """Mixin of :class:`~dpaudit_torch.stats.mmd.SequentialMMDTest`: the OGA kernel witness.

    It owns the witness state (``bandwidth``, ``bandwidth_source`` and the stored pairs, set by
    :meth:`_reset_witness`) and reads the test's ``dtype``, ``witness_radius``,
    ``max_witness_points`` and output device.  ``_witness_values(x, y)`` returns the values
    ``v_t = f_t(x_t) - f_t(y_t)`` of a chunk, each predictable (``f_t`` depends on pairs < t
    only), and then stores the chunk's pairs.
    """

    # supplied by the test class (SequentialTest and SequentialMMDTest)
    dtype: torch.dtype
    witness_radius: float
    max_witness_points: int | None
    force_torch: bool
    _out_dev: torch.device

    def _reset_witness(self) -> None:
        """Empty witness, no bandwidth (before the burn-in)."""
        self.bandwidth: float | None = None
        self.bandwidth_source: str | None = None
        self._center: torch.Tensor | None = None
        self._T = 0  # pairs stored in the witness (= pairs bet on, unless capped)
        self._head = 0  # capped ring buffer: physical slot of the oldest stored pair
        self._n_evicted = 0  # pairs dropped from the witness (capped only)
        self._since_refresh = 0  # drops since ||f||^2 was last recomputed from scratch
        self._n_norm_refreshes = 0
        self._X: torch.Tensor | None = None  # [cap, d] standardised x_i
        self._Y: torch.Tensor | None = None
        self._Xn: torch.Tensor | None = None  # [cap] squared norms
        self._Yn: torch.Tensor | None = None
        self._a: torch.Tensor | None = None  # [cap] coefficients in units of self._scale
        # capped witness only: fwd_i = sum over stored pairs l no older than i of a_l <g_l, g_i>
        # (the witness at pair i from the pairs that outlive it; see _witness_values_capped)
        self._fwd: torch.Tensor | None = None
        self._scale = 1.0  # global factor: c_i = scale * a_i
        self._m = 0.0  # AdaGrad sum of ||g_i||^2
        self._s = 0.0  # ||f||^2, tracked recursively

    def _fit_bandwidth(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Median heuristic on the pooled burn-in pairs; also fixes the centring of the points."""
        pooled = torch.cat([x, y])
        center = pooled.mean(dim=0)
        # distances are computed on data rescaled by their largest deviation, so that scales
        # like 1e160 or 1e-170 neither overflow nor underflow when squared inside pdist
        span = float((pooled - center).abs().max())
        if not math.isfinite(span):
            raise ValueError(
                f"burn-in pairs span {span!r}: too wide for {self.dtype} kernel computations; "
                "rescale the outputs before testing"
            )
        unit = span if span > 0.0 else 1.0
        # torch.pdist computes the differences directly (no matmul trick): atoms give exact 0s
        dist = torch.pdist((pooled - center) / unit).detach().to("cpu", torch.float64).numpy()
        dist = dist * unit
        med = float(np.median(dist)) if dist.size else 0.0
        if med > 0.0 and math.isfinite(med):
            bw, source = med, "median"
        else:
            nonzero = dist[dist > 0.0]
            if nonzero.size:
                bw, source = float(nonzero.mean()), "mean_nonzero"
            else:
                bw, source = 1.0, "default"
            logger.info(
                "SequentialMMDTest: median burn-in distance is 0 (atoms); bandwidth falls back "
                "to %s = %g", source, bw
            )
        if not (math.isfinite(bw) and bw > 0.0):
            raise ValueError(f"kernel bandwidth {bw!r} from the burn-in is not a finite number > 0")
        self.bandwidth = bw
        self.bandwidth_source = source
        self._center = center
        logger.info("SequentialMMDTest: bandwidth %g (%s)", bw, source)

    def _ensure_capacity(self, needed: int, d: int, dev: torch.device) -> None:
        cap = 0 if self._X is None else int(self._X.shape[0])
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap, 1024)
        if self.max_witness_points is not None:
            new_cap = min(new_cap, self.max_witness_points)
        assert self._head == 0 or needed <= cap  # a wrapped ring is full and never grows
        kw = {"device": dev, "dtype": self.dtype}
        X, Y = torch.empty(new_cap, d, **kw), torch.empty(new_cap, d, **kw)
        Xn, Yn, a = (torch.empty(new_cap, **kw) for _ in range(3))
        fwd = torch.empty(new_cap, **kw) if self.max_witness_points is not None else None
        T = self._T
        if T and self._X is not None:
            assert self._Y is not None and self._Xn is not None and self._Yn is not None
            assert self._a is not None
            X[:T], Y[:T] = self._X[:T], self._Y[:T]
            Xn[:T], Yn[:T], a[:T] = self._Xn[:T], self._Yn[:T], self._a[:T]
            if fwd is not None and self._fwd is not None:
                fwd[:T] = self._fwd[:T]
        self._X, self._Y, self._Xn, self._Yn, self._a = X, Y, Xn, Yn, a
        self._fwd = fwd

    def _block_rows(self, n_new: int) -> int:
        # one [B, 2n] kernel block: ~2^23 elements (64 MiB in float64) on accelerators; on the
        # CPU ~2^17 elements (1 MiB), which stays in cache: large blocks made the CPU path
        # memory-bound (2-3x slower, same numbers; see docs/benchmarks.md "throughput")
        budget = 1 << (17 if self._out_dev.type == "cpu" else 23)
        return int(min(1 << 16, max(128, budget // max(1, 2 * n_new))))

    def _kernel(
        self, P: torch.Tensor, Pn: torch.Tensor, Q: torch.Tensor, Qn: torch.Tensor
    ) -> torch.Tensor:
        """exp(-||p - q||^2 / 2) for standardised points, [len(P), len(Q)]."""
        if P.shape[1] == 1:
            sq = (P[:, 0:1] - Q[:, 0].unsqueeze(0)).square_()
        else:
            sq = torch.addmm(Pn.unsqueeze(1) + Qn.unsqueeze(0), P, Q.T, alpha=-2.0)
            sq.clamp_min_(0.0)
        return sq.mul_(-0.5).exp_()

    def _host_path(self, x: torch.Tensor) -> bool:
        """CPU float64 chunks run in NumPy (:meth:`_witness_values_host`): the same algebra
        as the torch code, without its per-operation overhead (and NumPy's exponential is the
        faster one on the CPU); ``force_torch`` keeps the torch code (tests compare both)."""
        return x.device.type == "cpu" and self.dtype == torch.float64 and not self.force_torch

    @torch.no_grad()
    def _witness_values(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Witness values v_t [n] of a chunk (predictable pair by pair); stores the pairs."""
        assert self.bandwidth is not None and self._center is not None
        if self._host_path(x):
            return self._witness_values_host(x.numpy(), y.numpy())
        n, d = int(x.shape[0]), int(x.shape[1])
        dev = x.device
        cap = self.max_witness_points
        if cap is not None and self._T + n > cap:
            return self._witness_values_capped(x, y)
        inv_bw = 1.0 / self.bandwidth
        zx = (x - self._center) * inv_bw
        zy = (y - self._center) * inv_bw
        Q = torch.cat([zx, zy])  # [2n, d]
        Qn = (Q * Q).sum(dim=1)

        # old part: r_j = sum_{i < T} a_i (k(x_i, q_j) - k(y_i, q_j)), blocked over past points
        T = self._T
        track = cap is not None  # keep fwd for the FIFO drops that start once the cap is hit
        r, gram = self._stored_part(Q, Qn, n, T, track)
        old = r[:n] - r[n:]
        # in-chunk block: Ht[j, i] = h_i(j) = k(x_i,x_j) - k(x_i,y_j) - k(y_i,x_j) + k(y_i,y_j)
        K = self._kernel(Q, Qn, Q, Qn)
        H = K[:n, :n] - K[:n, n:] - K[n:, :n] + K[n:, n:]
        Ht = H.T
        # ||g_j||^2 = 2 - 2 k(x_j, y_j), from the exact difference (0 exactly when x_j == y_j)
        g2 = 2.0 - 2.0 * torch.exp(-0.5 * (zx - zy).square().sum(dim=1))
        host = torch.cat([old.unsqueeze(1), g2.unsqueeze(1), Ht], dim=1)
        host_np = host.to("cpu", torch.float64).numpy()  # the ONE device-to-host copy

        v, a_new, pending = self._recursion(host_np[:, 0], host_np[:, 1], host_np[:, 2:])

        # write back: new points and coefficients, and any rescaling of the old coefficients
        self._ensure_capacity(T + n, d, dev)
        assert self._X is not None and self._Y is not None and self._a is not None
        assert self._Xn is not None and self._Yn is not None
        if pending != 1.0 and T:
            self._a[:T].mul_(pending)
        self._X[T : T + n] = zx
        self._Y[T : T + n] = zy
        self._Xn[T : T + n] = Qn[:n]
        self._Yn[T : T + n] = Qn[n:]
        a_dev = torch.from_numpy(a_new).to(device=dev, dtype=self.dtype)
        self._a[T : T + n] = a_dev
        if track:
            assert self._fwd is not None
            self._update_fwd(T, gram, a_dev, pending, torch.arange(T, T + n, device=dev),
                             host_np[:, 2:], a_new)
        self._T = T + n
        return v

    # ------------------------------------------------------------------ capped witness
    def _advance_ring(self, E: int, buf: int, cap: int) -> None:
        """After a chunk that dropped its E oldest pairs: the ring's head, the counts, and the
        periodic recomputation of ||f||^2."""
        self._head = (self._head + E) % buf
        self._T = cap
        self._n_evicted += E
        self._since_refresh += E
        if self._since_refresh >= REFRESH_FACTOR * cap:
            self._refresh_norm()

    def _logical_order(self) -> torch.Tensor | None:
        """Physical slots of the stored pairs, oldest first (None: slots 0..T-1 in order)."""
        if self._head == 0 or self._X is None:
            return None
        cap = int(self._X.shape[0])
        return (self._head + torch.arange(self._T, device=self._X.device)) % cap

    def _exact_norm2(self) -> float:
        """S^2 a^T H a over the stored pairs, computed in float64, blocked over rows."""
        T = self._T
        if T == 0 or self._X is None:
            return 0.0
        assert self._Y is not None and self._a is not None
        f64 = torch.float64
        X, Y, a = self._X[:T].to(f64), self._Y[:T].to(f64), self._a[:T].to(f64)
        Xn, Yn = (X * X).sum(dim=1), (Y * Y).sum(dim=1)
        P, Pn = torch.cat([X, Y]), torch.cat([Xn, Yn])
        w = torch.cat([a, -a])  # f = S * sum_k w_k k(p_k, .)
        total = torch.zeros((), dtype=f64, device=X.device)
        # a [B, 2T] block: ~2^17 elements (cache-resident) on the CPU, ~2^22 on accelerators
        budget = 1 << (17 if X.device.type == "cpu" else 22)
        B = max(16, budget // (2 * T))
        for b0 in range(0, 2 * T, B):
            b1 = min(2 * T, b0 + B)
            total += w[b0:b1] @ (self._kernel(P[b0:b1], Pn[b0:b1], P, Pn) @ w)
        return float(total) * self._scale * self._scale

    def _refresh_norm(self) -> None:
        """Replace the tracked ||f||^2 by its value recomputed from scratch; re-project."""
        R = self.witness_radius
        exact = self._exact_norm2()
        logger.debug(
            "SequentialMMDTest: witness norm refresh after %d drops: tracked %.17g, exact %.17g",
            self._since_refresh, self._s, exact,
        )
        self._s = max(exact, 0.0)
        if self._s > R * R:
            gamma = R / math.sqrt(self._s)
            self._scale *= gamma
            self._s = gamma * gamma * self._s
        self._since_refresh = 0
        self._n_norm_refreshes += 1

    @torch.no_grad()
    def _witness_values_capped(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Like ``_witness_values`` for a chunk that drops the E oldest stored pairs (FIFO)."""
        cap = self.max_witness_points
        assert cap is not None and self.bandwidth is not None and self._center is not None
        n, d = int(x.shape[0]), int(x.shape[1])
        dev = x.device
        T = self._T
        E = T + n - cap  # 1 <= E <= n <= T (chunks hold at most cap pairs)
        assert 1 <= E <= n <= cap and E <= T
        self._ensure_capacity(min(T + n, cap), d, dev)
        assert self._X is not None and self._Y is not None and self._a is not None
        assert self._Xn is not None and self._Yn is not None
        buf = int(self._X.shape[0])
        assert buf == cap or T + n <= buf
        inv_bw = 1.0 / self.bandwidth
        zx = (x - self._center) * inv_bw
        zy = (y - self._center) * inv_bw
        # the E oldest stored pairs, in the order they will be dropped
        ev = (self._head + torch.arange(E, device=dev)) % max(buf, 1)
        ex, ey = self._X[ev], self._Y[ev]
        N = n + E
        # stored part, against the NEW points only: r_q = sum_{i stored} a_i (k(x_i,q)-k(y_i,q))
        # and the Gram block <g_i, g_j> (stored i, new j) that updates fwd afterwards
        Qs = torch.cat([zx, zy])
        Qsn = (Qs * Qs).sum(dim=1)
        r, gram = self._stored_part(Qs, Qsn, n, T, True)
        old = r[:n] - r[n:]  # f_start(x_j) - f_start(y_j) of new pair j, units of S
        # in-chunk block over [new pairs, dropped pairs]: H[i, j] = <g_i, g_j>
        Q = torch.cat([zx, ex, zy, ey])  # [2N, d]: x parts (new, dropped), then y parts
        Qn = (Q * Q).sum(dim=1)
        K = self._kernel(Q, Qn, Q, Qn)
        H = K[:N, :N] - K[:N, N:] - K[N:, :N] + K[N:, N:]
        g2 = 2.0 - 2.0 * torch.exp(-0.5 * (zx - zy).square().sum(dim=1))
        g2e = 2.0 - 2.0 * torch.exp(-0.5 * (ex - ey).square().sum(dim=1))
        assert self._fwd is not None
        flat = torch.cat([old, g2, self._fwd[ev], g2e, self._a[ev], H.reshape(-1)])
        host = flat.to("cpu", torch.float64).numpy()  # the ONE device-to-host copy
        o = 0
        parts = []
        for size in (n, n, E, E, E):
            parts.append(host[o : o + size])
            o += size
        Hh = host[o:].reshape(n + E, n + E)
        # f_start at dropped pair e: the pairs that outlive it (fwd) plus the older stored pairs,
        # which are exactly the dropped pairs e' < e of this chunk (FIFO)
        Hee = Hh[n:, n:]
        parts[2] = parts[2] + np.triu(Hee, 1).T @ parts[4]

        v, a_new, pending = self._recursion_capped(*parts, Hh, n, E)

        if pending != 1.0:
            self._a[:T].mul_(pending)
        pos = (self._head + T + torch.arange(n, device=dev)) % buf
        self._X[pos] = zx
        self._Y[pos] = zy
        self._Xn[pos] = Qn[:n]
        self._Yn[pos] = Qn[N : N + n]
        a_dev = torch.from_numpy(a_new).to(device=dev, dtype=self.dtype)
        self._a[pos] = a_dev
        self._update_fwd(T, gram, a_dev, pending, pos, Hh[:n, :n], a_new)
        self._advance_ring(E, buf, cap)
        return v

    def _stored_part(self, Q: torch.Tensor, Qn: torch.Tensor, n: int, T: int, gram: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Witness of the T stored pairs (physical slots 0..T-1) at the 2n query points
        ``Q = [x parts; y parts]``: ``r_q = sum_i a_i (k(x_i, q) - k(y_i, q))`` (units of S),
        blocked over stored pairs. With ``gram`` also the block ``<g_i, g_j>`` [T, n] (stored
        pair i, new pair j), which the kernel values give for free."""
        dev = Q.device
        r = torch.zeros(2 * n, device=dev, dtype=self.dtype)
        G = torch.empty(T, n, device=dev, dtype=self.dtype) if gram and T else None
        if T:
            assert self._X is not None and self._Y is not None and self._a is not None
            assert self._Xn is not None and self._Yn is not None
            _stored_blocks(self._a, self._X, self._Y, self._Xn, self._Yn, Q, Qn, n, T,
                           self._block_rows(n), self._kernel, torch.sub, r, G)
        return r, G

    def _update_fwd(self, T: int, gram: torch.Tensor | None, a_new: torch.Tensor,
                    pending: float, pos: torch.Tensor, H_new: np.ndarray,
                    a_new_host: np.ndarray) -> None:
        """Maintain ``fwd_i = sum_{l stored, l no older than i} a_l <g_l, g_i>`` after a chunk:
        the stored pairs gain the new pairs' terms (their coefficients rescaled by ``pending``
        first), the new pair j gets the in-chunk terms of pairs j' >= j. Pairs dropped later
        never enter it, so FIFO drops need no update; each value lives at most
        ``max_witness_points`` pairs, so its rounding stays bounded."""
        assert self._fwd is not None
        if T:
            f = self._fwd[:T]
            if pending != 1.0:
                f.mul_(pending)
            if gram is not None:
                f.add_(gram @ a_new)
        fwd_new = np.triu(H_new) @ a_new_host  # H is symmetric
        self._fwd[pos] = torch.from_numpy(fwd_new).to(device=self._fwd.device,
                                                      dtype=self.dtype)

    def _recompute_fwd(self) -> None:
        """fwd from scratch over the stored pairs (logical order), blocked over rows: for
        states saved without it."""
        T = self._T
        if T == 0 or self._X is None:
            return
        assert self._Y is not None and self._a is not None and self._fwd is not None
        assert self._Xn is not None and self._Yn is not None
        order = self._logical_order()
        idx = torch.arange(T, device=self._X.device) if order is None else order
        X, Y, a = self._X[idx], self._Y[idx], self._a[idx]
        Xn, Yn = self._Xn[idx], self._Yn[idx]
        Q, Qn = torch.cat([X, Y]), torch.cat([Xn, Yn])
        out = torch.empty(T, dtype=self.dtype, device=X.device)
        cols = torch.arange(T, device=X.device)
        B = max(16, (1 << 20) // (2 * T))
        for b0 in range(0, T, B):
            b1 = min(T, b0 + B)
            kx = self._kernel(X[b0:b1], Xn[b0:b1], Q, Qn)
            kx -= self._kernel(Y[b0:b1], Yn[b0:b1], Q, Qn)
            h = kx[:, :T] - kx[:, T:]  # <g_i, g_l>, rows i in [b0, b1), all l
            keep = cols.unsqueeze(0) >= torch.arange(b0, b1, device=X.device).unsqueeze(1)
            out[b0:b1] = (h * keep) @ a
        self._fwd[idx] = out

    def _recursion_capped(
        self,
        old: np.ndarray,
        g2: np.ndarray,
        u: np.ndarray,
        g2e: np.ndarray,
        a_ev: np.ndarray,
        H: np.ndarray,
        n: int,
        E: int,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Host float64 OGA recursion over a chunk that drops E stored pairs (FIFO).

        ``old[j]``, ``u[e]``: witness at the chunk start (units of the scale S) evaluated on new
        pair j / dropped pair e; ``H``: Gram block <g_., g_.> of [new pairs, dropped pairs];
        ``a_ev``: the dropped pairs' coefficients. Pair e is dropped right after new pair
        ``j = n - E + e`` has been added, before the projection of that step.
        """
        old = np.array(old, dtype=np.float64)
        u = np.array(u, dtype=np.float64)
        a_ev = np.array(a_ev, dtype=np.float64)
        v_out, a_c, bad = np.empty(n), np.zeros(n), np.zeros(3)
        S, m, s, pending, status = mmd_recursion_capped(
            old, np.ascontiguousarray(g2, dtype=np.float64), u,
            np.ascontiguousarray(g2e, dtype=np.float64), a_ev,
            np.ascontiguousarray(H, dtype=np.float64), n, E, self.witness_radius, self._scale,
            self._m, self._s, RENORM_BELOW, NORM_TOL, v_out, a_c, bad)
        if status:
            n2, cross, sq = bad.tolist()
            raise RuntimeError(
                f"SequentialMMDTest: witness norm^2 {n2 - cross + sq!r} < 0 after dropping a "
                f"pair (terms {n2!r}, {cross!r}, {sq!r}); this is a bug, please report it"
            )
        if pending != 1.0:
            logger.debug("SequentialMMDTest: renormalised the witness coefficients")
        self._scale, self._m, self._s = S, m, s
        return v_out, a_c, pending

    def _recursion(
        self, old: np.ndarray, g2: np.ndarray, Ht: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Host float64 OGA recursion over one chunk.

        ``old[j]``: sum over stored pairs of a_i h_i(j); ``Ht[j, i] = h_i(j)`` in the chunk.
        Returns (values v [n], new coefficients a [n] in units of the final scale, factor by
        which the stored coefficients must be multiplied).
        """
        # the capped recursion with nothing dropped (E = 0); it reads H[j, i] for i < j, which
        # is exactly Ht[j, i]
        empty = np.empty(0)
        return self._recursion_capped(old, g2, empty, empty, empty, Ht, old.shape[0], 0)
