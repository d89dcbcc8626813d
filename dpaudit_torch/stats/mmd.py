"""Sequential kernel-MMD test of differential privacy (docs/design.md section 2).

Reference: J. González, M. Dulce-Rubio, A. Ramdas, M. Ribero, "Sequentially auditing differential
privacy", NeurIPS 2025 (arXiv 2509.07055). The witness is learned by online gradient ascent in the
RKHS of a Gaussian kernel, the bet by Online Newton Step (Shekhar & Ramdas, IEEE Trans. IT 2023).

Threshold (their Theorem 3.1): an (eps, delta)-DP mechanism has, in any Gaussian-kernel RKHS,
``MMD(P, Q) <= tau(eps, delta) = sqrt(2) (1 - 2 (1 - delta) / (1 + e^eps))``
(:func:`~dpaudit_torch.stats.thresholds.mmd_tau`). For a witness f with ``||f|| <= R <= 1``,
``E[f(X) - f(Y)] <= ||f|| MMD <= tau`` under H0, so the payoff ``v_t - tau`` has conditional
mean <= 0 and the ONS wealth is a test supermartingale (Ville's inequality).

The witness machinery (bandwidth fit, kernel blocks, the host recursion, the FIFO-capped
witness) lives in :mod:`dpaudit_torch.stats._mmd_witness`, with its performance notes; its
constant ``REFRESH_FACTOR`` (the capped witness recomputes ||f||^2 from scratch after every
``REFRESH_FACTOR * max_witness_points`` drops) is re-exported here.

Memory (long runs): the witness keeps every pair it has bet on, so the state is O(T d).
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

from ._mmd_witness import REFRESH_FACTOR, KernelWitness
from .base import CannotRejectWarning, SequentialTest
from .thresholds import mmd_tau

logger = logging.getLogger(__name__)

__all__ = ["SequentialMMDTest", "REFRESH_FACTOR"]

_PRESETS: dict[str, float] = {"paper": 0.5}

#: payoff suprema within this of 0 count as 0 (R sqrt(2) == tau up to rounding)
_CEILING_TOL = 1e-12
#: capped witness, once full: smallest chunk (pairs per device round trip)
_MIN_DROP_CHUNK = 128


class SequentialMMDTest(KernelWitness, SequentialTest):
    """Anytime-valid sequential test of (eps, delta)-DP by kernel MMD (González et al., 2025).

    H0: MMD(P, Q) <= tau(eps, delta) (implied by (eps, delta)-DP) versus H1: MMD > tau, for each
    epsilon of the grid; the combined decision ``rejected`` averages the grid's e-processes
    (docs/design.md sections 1, 2 and 4).

    Algorithm (exactly docs/design.md section 2):

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
    valid (the burn-in pairs are past data); docs/design.md section 2 leaves the choice open.

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
    and raises ``RuntimeError`` otherwise (a bug), and every ``REFRESH_FACTOR * M`` (16 M) drops
    ``||f||^2`` is recomputed from scratch in float64 from the stored support (the Gram form,
    O(M^2 d), i.e. O(M d / 16) per pair amortised) and the witness re-projected if it exceeds
    R. While fewer than M pairs have been stored nothing is dropped and the trajectory is
    exactly the uncapped one (chunks stop at the cap; once it is reached they hold at most
    min(M, max(128, M / 8)) pairs, so that a chunk only ever drops stored pairs, and the kernel
    work per pair, about 8 M + 16 n for chunks of n pairs, stays near its minimum).

    Args:
        epsilons: one epsilon or a grid; each finite and > 0.
        delta: one delta, or one per epsilon; each in [0, 1).
        alpha: level of the test, in (0, 1).
        burn_in: pairs used to fit the bandwidth (>= 2), never bet on; counted in ``rejected_at``.
        witness_radius: R in (0, 1]; default 1.0 (0.5 with ``preset="paper"``).
        simultaneous: True (default): the epsilon lower bound is Bonferroni over the grid,
            valid at level alpha; False: per grid point (see the base class).
        device: where the kernel work runs; default: the device of the first pairs.
        dtype: floating type of the device kernel computations (the scalar recursion and the
            bets always run in float64 on the host).
        preset: ``None`` or ``"paper"`` (R = 1/2, the authors' radius).
        chunk_size: most pairs processed per device round trip (memory ~ chunk_size^2; the
            results do not depend on it beyond floating-point rounding).
        max_witness_points: ``None`` (default: exact, unbounded O(T d) memory) or the largest
            number of pairs the witness keeps (>= 1); the oldest are dropped first (see above).
        force_torch: CPU float64 chunks normally run in NumPy on views of the stored state (the
            same algebra, without torch's per-operation overhead); True keeps the torch code
            that accelerators run (tests compare both paths).

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
        simultaneous: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
        preset: str | None = None,
        chunk_size: int = 512,
        max_witness_points: int | None = None,
        force_torch: bool = False,
    ) -> None:
        if not isinstance(force_torch, bool):
            raise TypeError(f"force_torch must be a bool, got {force_torch!r}")
        self.force_torch = force_torch
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
        self._reset_witness()

    def _fit_burn_in(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self._fit_bandwidth(x, y)

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

    def diagnostics(self) -> dict[str, Any]:
        """The witness state, as copies (white-box tests; reading it does not change the test).

        Keys: ``capacity`` (rows allocated per buffer: grows by doubling, at most
        ``max_witness_points``), ``ring_head`` (capped witness: physical slot of the oldest
        stored pair, 0 until the ring buffer wraps), ``scale`` (the global factor S of the
        coefficients, c_i = S a_i), ``adagrad_sum`` (m_t), ``norm2`` (the tracked ||f||^2), and
        tensors on the test's device in its dtype, the stored pairs oldest first (``None`` while
        empty): ``x``, ``y`` [n_stored, d] (standardised points), ``x_sqnorm``, ``y_sqnorm``
        [n_stored], ``coef`` [n_stored] (a_i, in units of S), ``forward_sums`` [n_stored]
        (capped witness only: the witness at stored pair i from the pairs no older than i) and
        ``center`` [d] (the burn-in mean).
        """
        T = self._T
        order = self._logical_order()

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or T == 0:
                return None
            return t[:T].clone() if order is None else t[order]

        return {
            "capacity": 0 if self._X is None else int(self._X.shape[0]),
            "ring_head": self._head,
            "scale": self._scale,
            "adagrad_sum": self._m,
            "norm2": self._s,
            "x": rows(self._X),
            "y": rows(self._Y),
            "x_sqnorm": rows(self._Xn),
            "y_sqnorm": rows(self._Yn),
            "coef": rows(self._a),
            "forward_sums": rows(self._fwd),
            "center": None if self._center is None else self._center.clone(),
        }

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
