"""Sequential kernel-MMD test of differential privacy (ALGORITHMS.md section 2).

Reference: J. González, M. Dulce-Rubio, A. Ramdas, M. Ribero, "Sequentially auditing differential
privacy", NeurIPS 2025 (arXiv 2509.07055). The witness is learned by online gradient ascent in the
RKHS of a Gaussian kernel, the bet by Online Newton Step (Shekhar & Ramdas, IEEE Trans. IT 2023).

Threshold (their Theorem 3.1): an (eps, delta)-DP mechanism has, in any Gaussian-kernel RKHS,
``MMD(P, Q) <= tau(eps, delta) = sqrt(2) (1 - 2 (1 - delta) / (1 + e^eps))``
(:func:`~dpaudit_torch.stats.thresholds.mmd_tau`). For a witness f with ``||f|| <= R <= 1``,
``E[f(X) - f(Y)] <= ||f|| MMD <= tau`` under H0, so the payoff ``v_t - tau`` has conditional
mean <= 0 and the ONS wealth is a test supermartingale (Ville's inequality).

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
* The witness coefficients are ``c_i = S * a_i`` with ONE global scale factor S (the product of
  the projection factors); the stored ``a_i`` are rescaled only when S falls below 1e-30.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np
import torch

from .base import CannotRejectWarning, SequentialTest
from .thresholds import mmd_tau

logger = logging.getLogger(__name__)

__all__ = ["SequentialMMDTest"]

_PRESETS: dict[str, float] = {"paper": 0.5}

#: fold the global scale into the stored coefficients when it falls below this
_RENORM_BELOW = 1e-30
#: payoff suprema within this of 0 count as 0 (R sqrt(2) == tau up to rounding)
_CEILING_TOL = 1e-12


class SequentialMMDTest(SequentialTest):
    """Anytime-valid sequential test of (eps, delta)-DP by kernel MMD (González et al., 2025).

    H0: MMD(P, Q) <= tau(eps, delta) (implied by (eps, delta)-DP) versus H1: MMD > tau, for each
    epsilon of the grid; the combined decision ``rejected`` averages the grid's e-processes
    (ALGORITHMS.md sections 1, 2 and 4).

    Algorithm (exactly ALGORITHMS.md section 2):

    * Gaussian kernel ``k(x, y) = exp(-||x - y||^2 / (2 bw^2))``; ``bw`` is the median of the
      pairwise Euclidean distances among the pooled ``2 * burn_in`` burn-in points (fallback:
      mean nonzero distance, else 1.0; see ``bandwidth`` and ``bandwidth_source``).
    * Witness by online gradient ascent in the RKHS,
      ``f_t = sum_{i<t} c_i (k(x_i, .) - k(y_i, .))``, value ``v_t = f_t(x_t) - f_t(y_t)``,
      gradient norm ``||g_t||^2 = 2 - 2 k(x_t, y_t)``, AdaGrad step
      ``eta_t = 1 / (2 sqrt(m_t))`` with ``m_t = sum_{i<=t} ||g_i||^2`` (0 if ``m_t = 0``),
      projection onto the ball of radius R with ``||f||^2`` tracked recursively.
    * Bet: payoff ``v_t - tau``, Online Newton Step with ``lambda_max = 1 / (8 + 4 tau)``.

    **Burn-in and the witness.** The burn-in pairs only fit the bandwidth (and the centring of
    the stored points); they do NOT seed the witness: the first pair after the burn-in has
    ``f = 0``. This follows the authors' released code (google-research ``dp_sequential_test``
    notebook, ``empirical_epsilon``: the bandwidth is the median over the first 20 samples of
    each law and the testers are stepped on samples 20, 21, ... only). Seeding would also be
    valid (the burn-in pairs are past data); ALGORITHMS.md leaves the choice open.

    **Radius.** ``witness_radius`` R must lie in (0, 1]: Theorem 3.1 bounds ``<f, mu_P - mu_Q>``
    for ``||f|| <= 1``. R = 1 (default) is the sample-efficient choice; ``preset="paper"``
    (R = 1/2) reproduces the authors' code and their Table 1. Since ``|v_t| <= R sqrt(2)``,
    a grid point with ``tau >= R sqrt(2)`` can never be rejected (R = 1/2: eps >= ln 3 at
    delta ~ 0); the base class then warns (:class:`~dpaudit_torch.stats.base.CannotRejectWarning`)
    and flags it in ``cannot_reject``.

    Args:
        epsilons: one epsilon or a grid; each finite and > 0.
        delta: one delta, or one per epsilon; each in [0, 1).
        alpha: level of the test, in (0, 1).
        burn_in: pairs used to fit the bandwidth (>= 2), never bet on; counted in ``rejected_at``.
        witness_radius: R in (0, 1]; default 1.0 (0.5 with ``preset="paper"``).
        simultaneous: Bonferroni form of the epsilon lower bound (see the base class).
        device: where the kernel work runs; default: the device of the first pairs.
        dtype: floating type of the device kernel computations (the scalar recursion and the
            bets always run in float64 on the host).
        preset: ``None`` or ``"paper"`` (R = 1/2, the authors' radius).
        chunk_size: most pairs processed per device round trip (memory ~ chunk_size^2; the
            results do not depend on it beyond floating-point rounding).

    Attributes:
        tau: thresholds, array [len(epsilons)].
        bandwidth: fitted kernel bandwidth (None before the burn-in is complete).
        bandwidth_source: ``"median"``, ``"mean_nonzero"`` or ``"default"`` (None before).
    """

    kind = "mmd"

    def __init__(
        self,
        epsilons: float | list[float] | np.ndarray | torch.Tensor,
        delta: float | list[float] | np.ndarray | torch.Tensor = 0.0,
        alpha: float = 0.05,
        burn_in: int = 20,
        witness_radius: float | None = None,
        *,
        simultaneous: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
        preset: str | None = None,
        chunk_size: int = 512,
    ) -> None:
        self.witness_radius = _resolve_radius(witness_radius, preset)
        self.preset = preset
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
            raise TypeError(f"chunk_size must be an integer, got {chunk_size!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
        self.chunk_size = int(chunk_size)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CannotRejectWarning)
            super().__init__(
                epsilons,
                delta,
                alpha,
                burn_in,
                simultaneous=simultaneous,
                device=device,
                dtype=dtype,
            )
        for w in caught:  # re-emit so that the warning points at the caller's line
            warnings.warn(w.message, w.category, stacklevel=2)

    # ------------------------------------------------------------------ subclass interface
    @property
    def tau(self) -> np.ndarray:
        """The paper's threshold tau(eps, delta) per grid point, array [len(epsilons)]."""
        return np.asarray(mmd_tau(self.epsilons, self.deltas), dtype=np.float64)

    def _component_groups(self) -> np.ndarray:
        return np.arange(self.grid_size, dtype=np.int64)

    def _lambda_max(self) -> np.ndarray:
        # 1 + lambda p > 0 needs lambda (R sqrt(2) + tau) < 1; 1 / (8 + 4 tau) guarantees it
        # for every R <= 1 (R sqrt(2) + tau < 8 + 4 tau).
        return 1.0 / (8.0 + 4.0 * self.tau)

    def _payoff_upper_bound(self) -> np.ndarray:
        ub = self.witness_radius * math.sqrt(2.0) - self.tau
        # R sqrt(2) == tau exactly (e.g. R = 1/2, eps = ln 3, delta = 0) must read as 0, not as
        # a rounding residue of either sign; the supremum is not attained anyway (||g||^2 < 2).
        return np.where(np.abs(ub) <= _CEILING_TOL, 0.0, ub)

    def _chunk_limit(self) -> int:
        return self.chunk_size

    def _config(self) -> dict[str, Any]:
        return {"witness_radius": self.witness_radius}

    def _reset_extra(self) -> None:
        self.bandwidth: float | None = None
        self.bandwidth_source: str | None = None
        self._center: torch.Tensor | None = None
        self._T = 0  # pairs stored in the witness (= pairs bet on)
        self._X: torch.Tensor | None = None  # [cap, d] standardised x_i
        self._Y: torch.Tensor | None = None
        self._Xn: torch.Tensor | None = None  # [cap] squared norms
        self._Yn: torch.Tensor | None = None
        self._a: torch.Tensor | None = None  # [cap] coefficients in units of self._scale
        self._scale = 1.0  # global factor: c_i = scale * a_i
        self._m = 0.0  # AdaGrad sum of ||g_i||^2
        self._s = 0.0  # ||f||^2, tracked recursively

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
        pooled = torch.cat([x, y])
        # torch.pdist computes the differences directly (no matmul trick): atoms give exact 0s
        dist = torch.pdist(pooled).detach().to("cpu", torch.float64).numpy()
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
        self.bandwidth = bw
        self.bandwidth_source = source
        self._center = pooled.mean(dim=0)
        logger.info("SequentialMMDTest: bandwidth %g (%s)", bw, source)

    def _payoffs(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        v = self._witness_values(x, y)
        return v[:, None] - self.tau[None, :]

    def _extra_state(self) -> dict[str, Any]:
        T = self._T

        def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:T].detach().cpu().clone()

        return {
            "bandwidth": self.bandwidth,
            "bandwidth_source": self.bandwidth_source,
            "center": None if self._center is None else self._center.detach().cpu().clone(),
            "n_stored": T,
            "x": cpu(self._X),
            "y": cpu(self._Y),
            "coef": cpu(self._a),
            "scale": self._scale,
            "m": self._m,
            "s": self._s,
        }

    def _load_extra_state(self, sd: dict[str, Any]) -> None:
        self._reset_extra()
        dev = self._device or torch.device("cpu")
        self.bandwidth = None if sd["bandwidth"] is None else float(sd["bandwidth"])
        self.bandwidth_source = sd["bandwidth_source"]
        if sd["center"] is not None:
            self._center = sd["center"].to(device=dev, dtype=self.dtype)
        T = int(sd["n_stored"])
        if T > 0:
            x = sd["x"].to(device=dev, dtype=self.dtype)
            y = sd["y"].to(device=dev, dtype=self.dtype)
            a = sd["coef"].to(device=dev, dtype=self.dtype)
            if x.shape != y.shape or x.ndim != 2 or x.shape[0] != T or a.shape != (T,):
                raise ValueError(
                    f"corrupt MMD state: x {tuple(x.shape)}, y {tuple(y.shape)}, "
                    f"coef {tuple(a.shape)} for {T} stored pairs"
                )
            if self._dim is not None and x.shape[1] != self._dim:
                raise ValueError(f"corrupt MMD state: stored points have dimension "
                                 f"{x.shape[1]}, state says {self._dim}")
            self._ensure_capacity(T, int(x.shape[1]), dev)
            assert self._X is not None and self._Y is not None and self._a is not None
            self._X[:T] = x
            self._Y[:T] = y
            self._a[:T] = a
            assert self._Xn is not None and self._Yn is not None
            self._Xn[:T] = (x * x).sum(dim=1)
            self._Yn[:T] = (y * y).sum(dim=1)
            self._T = T
        self._scale = float(sd["scale"])
        self._m = float(sd["m"])
        self._s = float(sd["s"])

    # ------------------------------------------------------------------ public extras
    @property
    def witness_norm(self) -> float:
        """Current RKHS norm ||f_t|| of the witness (<= witness_radius)."""
        return math.sqrt(max(self._s, 0.0))

    @property
    def n_stored(self) -> int:
        """Pairs held in the witness (pairs bet on so far)."""
        return self._T

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the test's device buffers (allocated capacity; linear in T)."""
        total = 0
        for t in (self._X, self._Y, self._Xn, self._Yn, self._a, self._center):
            if t is not None:
                total += t.numel() * t.element_size()
        return total

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(
            {
                "witness_radius": self.witness_radius,
                "preset": self.preset,
                "tau": self.tau.tolist(),
                "bandwidth": self.bandwidth,
                "bandwidth_source": self.bandwidth_source,
                "witness_norm": self.witness_norm,
            }
        )
        return out

    # ------------------------------------------------------------------ internals
    def _ensure_capacity(self, needed: int, d: int, dev: torch.device) -> None:
        cap = 0 if self._X is None else int(self._X.shape[0])
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap, 1024)
        kw = {"device": dev, "dtype": self.dtype}
        X, Y = torch.empty(new_cap, d, **kw), torch.empty(new_cap, d, **kw)
        Xn, Yn, a = (torch.empty(new_cap, **kw) for _ in range(3))
        T = self._T
        if T and self._X is not None:
            assert self._Y is not None and self._Xn is not None and self._Yn is not None
            assert self._a is not None
            X[:T], Y[:T] = self._X[:T], self._Y[:T]
            Xn[:T], Yn[:T], a[:T] = self._Xn[:T], self._Yn[:T], self._a[:T]
        self._X, self._Y, self._Xn, self._Yn, self._a = X, Y, Xn, Yn, a

    def _block_rows(self, n_new: int) -> int:
        # one [B, 2n] kernel block of at most ~2^23 elements (64 MiB in float64)
        return int(min(1 << 16, max(1024, (1 << 23) // max(1, 2 * n_new))))

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

    @torch.no_grad()
    def _witness_values(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Witness values v_t [n] of a chunk (predictable pair by pair); stores the pairs."""
        assert self.bandwidth is not None and self._center is not None
        n, d = int(x.shape[0]), int(x.shape[1])
        dev = x.device
        inv_bw = 1.0 / self.bandwidth
        zx = (x - self._center) * inv_bw
        zy = (y - self._center) * inv_bw
        Q = torch.cat([zx, zy])  # [2n, d]
        Qn = (Q * Q).sum(dim=1)

        # old part: r_j = sum_{i < T} a_i (k(x_i, q_j) - k(y_i, q_j)), blocked over past points
        T = self._T
        r = torch.zeros(2 * n, device=dev, dtype=self.dtype)
        if T:
            assert self._X is not None and self._Y is not None and self._a is not None
            assert self._Xn is not None and self._Yn is not None
            B = self._block_rows(n)
            for b0 in range(0, T, B):
                b1 = min(T, b0 + B)
                a = self._a[b0:b1]
                r += a @ self._kernel(self._X[b0:b1], self._Xn[b0:b1], Q, Qn)
                r -= a @ self._kernel(self._Y[b0:b1], self._Yn[b0:b1], Q, Qn)
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
        self._a[T : T + n] = torch.from_numpy(a_new).to(device=dev, dtype=self.dtype)
        self._T = T + n
        return v

    def _recursion(
        self, old: np.ndarray, g2: np.ndarray, Ht: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Host float64 OGA recursion over one chunk.

        ``old[j]``: sum over stored pairs of a_i h_i(j); ``Ht[j, i] = h_i(j)`` in the chunk.
        Returns (values v [n], new coefficients a [n] in units of the final scale, factor by
        which the stored coefficients must be multiplied).
        """
        n = old.shape[0]
        R = self.witness_radius
        S, m, s = self._scale, self._m, self._s
        old = old.copy()
        a_c = np.zeros(n)
        v_out = np.empty(n)
        pending = 1.0
        for j in range(n):
            inner = old[j]
            if j:
                inner += float(a_c[:j] @ Ht[j, :j])
            v = S * inner
            gj = float(g2[j])
            m += gj
            eta = 0.5 / math.sqrt(m) if m > 0.0 else 0.0
            n2 = s + 2.0 * eta * v + eta * eta * gj
            if n2 < 0.0:  # rounding only: ||f + eta g||^2 >= 0
                n2 = 0.0
            gamma = R / math.sqrt(n2) if n2 > R * R else 1.0
            a_c[j] = eta / S
            S *= gamma
            s = gamma * gamma * n2
            v_out[j] = v
            if S < _RENORM_BELOW:
                # fold the scale into every coefficient (host part now, stored part later)
                a_c[: j + 1] *= S
                old[j + 1 :] *= S
                pending *= S
                S = 1.0
        if pending != 1.0:
            logger.debug("SequentialMMDTest: renormalised the witness coefficients")
        self._scale, self._m, self._s = S, m, s
        return v_out, a_c, pending


def _resolve_radius(witness_radius: float | None, preset: str | None) -> float:
    if preset is not None:
        if preset not in _PRESETS:
            raise ValueError(f"preset must be None or one of {sorted(_PRESETS)}, got {preset!r}")
        R = _PRESETS[preset]
        if witness_radius is not None and float(witness_radius) != R:
            raise ValueError(
                f"preset={preset!r} sets witness_radius={R}, but witness_radius="
                f"{witness_radius!r} was also given"
            )
        return R
    if witness_radius is None:
        return 1.0
    if isinstance(witness_radius, bool) or not isinstance(
        witness_radius, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"witness_radius must be a real number, got {witness_radius!r}")
    R = float(witness_radius)
    if not (0.0 < R <= 1.0) or not math.isfinite(R):
        raise ValueError(
            f"witness_radius must lie in (0, 1] (Theorem 3.1 of Gonzalez et al. needs "
            f"||f|| <= 1), got {witness_radius!r}"
        )
    return R
