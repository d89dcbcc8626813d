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

Memory (issue 6, long runs): the witness keeps every pair it has bet on, so the state is O(T d).
Each stored pair holds ``x_i``, ``y_i`` (d numbers each), their two squared norms and one
coefficient: ``(2 d + 3) * itemsize`` bytes, i.e. ``16 d + 24`` bytes in float64 and ``8 d + 12``
in float32 (a 10^6-pair scalar stream: 40 MB in float64); buffers grow by doubling, so the
allocation is at most twice that (``memory_bytes``). ``max_witness_points`` caps the support
(FIFO); see :class:`SequentialMMDTest` for why the capped witness is still valid.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np
import torch

from ._kernels import mmd_recursion_capped
from .base import CannotRejectWarning, SequentialTest
from .thresholds import mmd_tau

logger = logging.getLogger(__name__)

__all__ = ["SequentialMMDTest"]

_PRESETS: dict[str, float] = {"paper": 0.5}

#: fold the global scale into the stored coefficients when it falls below this
_RENORM_BELOW = 1e-30
#: payoff suprema within this of 0 count as 0 (R sqrt(2) == tau up to rounding)
_CEILING_TOL = 1e-12
#: capped witness: a squared norm below -_NORM_TOL * (size of its terms) after dropping a pair is
#: not rounding but a bug; above it, a negative value is rounding and is clamped to 0
_NORM_TOL = 1e-9
#: capped witness: ||f||^2 is recomputed from scratch (float64 Gram form) after every
#: _REFRESH_FACTOR * max_witness_points evictions, so rounding cannot accumulate over long runs
#: (one update adds ~1e-16 relative error; 16 * cap updates stay far below _NORM_TOL, and the
#: O(cap^2) recomputation is then ~1% of the test's work)
_REFRESH_FACTOR = 16
#: capped witness, once full: smallest chunk (pairs per device round trip)
_MIN_DROP_CHUNK = 128


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

    **Memory and the witness cap.** Uncapped (``max_witness_points=None``, the default and the
    exact algorithm of the paper) the witness stores every pair bet on: ``(2 d + 3) * itemsize``
    bytes per pair (``16 d + 24`` in float64, ``8 d + 12`` in float32; ``memory_bytes`` reports
    the allocation, at most twice that because buffers grow by doubling), and pair t costs
    O(t d) kernel work, O(T^2 d) in total. With ``max_witness_points=M`` the support is capped
    at M pairs, memory is at most ``M * (2 d + 3) * itemsize`` plus the burn-in centre, and a
    pair costs O(M d). Once M pairs are stored, each new pair t is handled as follows:

    1. bet with ``f_t`` as usual (value ``v_t``, payoff ``v_t - tau``);
    2. gradient step ``f' = f_t + eta_t g_t`` (norm tracked as above);
    3. drop the OLDEST support pair j (FIFO): ``f'' = f' - c_j g_j`` with the exact norm update
       ``||f''||^2 = ||f'||^2 - 2 c_j (f'(x_j) - f'(y_j)) + c_j^2 ||g_j||^2``; the kernel row of
       pair j against the support is computed with the chunk's kernel block (O(M d), the same
       order as a new pair's row);
    4. project ``f_{t+1} = min(1, R / ||f''||) f''``.

    Validity: ``f_{t+1}`` is a function of pairs <= t only (steps 2-4 use pair t and stored
    pairs), so the payoff of pair t + 1 is still predictable, and ``||f_{t+1}|| <= R <= 1``
    because of the projection in step 4, whatever was dropped. Those are the only two properties
    the argument uses: ``E[v_{t+1} - tau | past] = <f_{t+1}, mu_P - mu_Q> - tau
    <= ||f_{t+1}|| MMD(P, Q) - tau <= 0`` under H0 (Theorem 3.1), and ``|v_{t+1}| <= R sqrt(2)``
    keeps ``1 + lambda p > 0`` for ``lambda <= 1 / (8 + 4 tau)``; so the wealth is still a test
    supermartingale and Ville's inequality still gives level alpha. Dropping old pairs only
    changes *which* bounded predictable witness is used (it forgets the distant past; power on
    a stationary stream is essentially unchanged once M is a few hundred pairs). Rounding: the
    tracked ``||f||^2`` could drift from the true norm over 10^6 drops; a negative value after a
    drop is clamped to 0 if it is within a relative 1e-9 of the size of the terms (rounding)
    and raises ``RuntimeError`` otherwise (a bug), and every ``4 M`` drops ``||f||^2`` is
    recomputed from scratch in float64 from the stored support (the Gram form, O(M^2 d), i.e.
    O(M d / 4) per pair amortised) and the witness re-projected if it exceeds R. While fewer
    than M pairs have been stored nothing is dropped and the trajectory is exactly the uncapped
    one (chunks stop at the cap; once it is reached they hold at most min(M, max(64, M / 8))
    pairs, so that a chunk only ever drops stored pairs, and the kernel work per pair, about
    8 M + 16 n for chunks of n pairs, stays near its minimum).

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
        max_witness_points: ``None`` (default: exact, unbounded O(T d) memory) or the largest
            number of pairs the witness keeps (>= 1); the oldest are dropped first (see above).

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
        max_witness_points: int | None = None,
    ) -> None:
        self.witness_radius = _resolve_radius(witness_radius, preset)
        self.preset = preset
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
            raise TypeError(f"chunk_size must be an integer, got {chunk_size!r}")
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
        self.chunk_size = int(chunk_size)
        if max_witness_points is not None:
            if isinstance(max_witness_points, bool) or not isinstance(
                max_witness_points, (int, np.integer)
            ):
                raise TypeError(
                    f"max_witness_points must be None or an integer, got {max_witness_points!r}"
                )
            if int(max_witness_points) < 1:
                raise ValueError(f"max_witness_points must be >= 1, got {max_witness_points!r}")
            max_witness_points = int(max_witness_points)
        self.max_witness_points: int | None = max_witness_points
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
        """The paper's threshold tau(eps, delta) per grid point, array [len(epsilons)]
        (computed once; read-only)."""
        tau = self.__dict__.get("_tau")
        if tau is None:
            tau = np.asarray(mmd_tau(self.epsilons, self.deltas), dtype=np.float64).copy()
            tau.setflags(write=False)
            self._tau = tau
        return tau

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
        cap = self.max_witness_points
        if cap is None:
            return self.chunk_size
        if self._T < cap:
            # fill up to the cap without dropping (while T <= cap the chunks, hence the
            # rounding, are exactly those of the uncapped test)
            return min(self.chunk_size, cap - self._T)
        # full: a chunk of n pairs drops n stored ones, never pairs of the same chunk; its kernel
        # work is ~ (8 cap + 16 n) per pair, so smaller chunks are cheaper (down to where the
        # per-chunk overhead dominates)
        return min(self.chunk_size, cap, max(_MIN_DROP_CHUNK, cap // 8))

    def _config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"witness_radius": self.witness_radius}
        if self.max_witness_points is not None:  # uncapped states keep their old fingerprint
            cfg["max_witness_points"] = self.max_witness_points
        return cfg

    def _reset_extra(self) -> None:
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

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
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

    def _payoffs(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        v = self._witness_values(x, y)
        return v[:, None] - self.tau[None, :]

    def _extra_state(self) -> dict[str, Any]:
        T = self._T
        order = self._logical_order()

        def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return (t[:T] if order is None else t[order]).detach().cpu().clone()

        return {
            "bandwidth": self.bandwidth,
            "bandwidth_source": self.bandwidth_source,
            "center": None if self._center is None else self._center.detach().cpu().clone(),
            "n_stored": T,
            "x": cpu(self._X),
            "y": cpu(self._Y),
            "coef": cpu(self._a),
            "fwd": cpu(self._fwd),
            "scale": self._scale,
            "m": self._m,
            "s": self._s,
            "n_evicted": self._n_evicted,
            "since_refresh": self._since_refresh,
            "n_norm_refreshes": self._n_norm_refreshes,
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
            if self._fwd is not None:
                fwd = sd.get("fwd")
                if fwd is not None and tuple(fwd.shape) == (T,):
                    self._fwd[:T] = fwd.to(device=dev, dtype=self.dtype)
                else:  # a state saved without it (older versions)
                    self._recompute_fwd()
        self._scale = float(sd["scale"])
        self._m = float(sd["m"])
        self._s = float(sd["s"])
        self._n_evicted = int(sd.get("n_evicted", 0))
        self._since_refresh = int(sd.get("since_refresh", 0))
        self._n_norm_refreshes = int(sd.get("n_norm_refreshes", 0))

    # ------------------------------------------------------------------ public extras
    @property
    def witness_norm(self) -> float:
        """Current RKHS norm ||f_t|| of the witness (<= witness_radius)."""
        return math.sqrt(max(self._s, 0.0))

    @property
    def n_stored(self) -> int:
        """Pairs held in the witness (pairs bet on so far, at most ``max_witness_points``)."""
        return self._T

    @property
    def n_evicted(self) -> int:
        """Pairs dropped from the witness so far (always 0 without ``max_witness_points``)."""
        return self._n_evicted

    @property
    def n_norm_refreshes(self) -> int:
        """How many times the capped witness's ||f||^2 was recomputed from scratch."""
        return self._n_norm_refreshes

    def witness_coefficients(self) -> np.ndarray:
        """Coefficients c_i of the stored pairs, oldest first, float64 array [n_stored].

        The witness is ``f = sum_i c_i (k(x_i, .) - k(y_i, .))`` over the last ``n_stored``
        pairs bet on (all of them when uncapped), in the order they were given.
        """
        if self._T == 0 or self._a is None:
            return np.zeros(0)
        order = self._logical_order()
        a = self._a[: self._T] if order is None else self._a[order]
        return a.detach().to("cpu", torch.float64).numpy() * self._scale

    @torch.no_grad()
    def exact_witness_norm(self) -> float:
        """||f|| recomputed from scratch: sqrt(c^T H c) over the stored pairs, in float64.

        ``H[i, k] = <g_i, g_k>`` (the Gram form of the differences of kernel sections). Costs
        O(n_stored^2 d) (blocked); ``witness_norm`` is the O(1) tracked value.
        """
        return math.sqrt(max(self._exact_norm2(), 0.0))

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
                "max_witness_points": self.max_witness_points,
                "n_evicted": self._n_evicted,
            }
        )
        return out

    # ------------------------------------------------------------------ internals
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

    @torch.no_grad()
    def _witness_values(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """Witness values v_t [n] of a chunk (predictable pair by pair); stores the pairs."""
        assert self.bandwidth is not None and self._center is not None
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
        self._head = (self._head + E) % buf
        self._T = cap
        self._n_evicted += E
        self._since_refresh += E
        if self._since_refresh >= _REFRESH_FACTOR * cap:
            self._refresh_norm()
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
            B = self._block_rows(n)
            for b0 in range(0, T, B):
                b1 = min(T, b0 + B)
                a = self._a[b0:b1]
                kx = self._kernel(self._X[b0:b1], self._Xn[b0:b1], Q, Qn)
                ky = self._kernel(self._Y[b0:b1], self._Yn[b0:b1], Q, Qn)
                r += a @ kx
                r -= a @ ky
                if G is not None:
                    kx -= ky  # k(x_i, q) - k(y_i, q)
                    torch.sub(kx[:, :n], kx[:, n:], out=G[b0:b1])
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
            self._m, self._s, _RENORM_BELOW, _NORM_TOL, v_out, a_c, bad)
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
