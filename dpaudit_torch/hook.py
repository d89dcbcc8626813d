"""``PrivacyAuditor``: audits Opacus DP-SGD while it trains, and stops it on a proven violation.

Two lines in a training loop that already uses Opacus::

    auditor = PrivacyAuditor(privacy_engine, optimizer, data_loader, delta=1e-5)
    for x, y in data_loader:
        ...; optimizer.step(); optimizer.zero_grad()
        if auditor.should_stop:
            break
    report = auditor.finalize()

How it works (ALGORITHMS.md sections 5 and 6; docs/auditor.md):

1. **Canaries** (:mod:`.canaries`): Dirac coordinates drawn from the auditor's own generator:
   ``k_pairs`` sequential pairs and ``m_canaries`` one-run canaries (IN with probability 1/2,
   a secret revealed only by :meth:`PrivacyAuditor.finalize`).
2. **Injection** (:mod:`.injection`): canary rows of raw norm ``canary_norm * C`` enter
   ``p.grad_sample`` before Opacus clips them (ghost mode: the clipped canary enters
   ``p.summed_grad``). At each step, every pair puts one canary on a coordinate chosen by a fresh
   fair coin; every IN one-run canary is included with the data loader's Poisson rate.
3. **Observation** (:mod:`.observation`): after noise and scaling, before the update (a step
   pre-hook on ``optimizer.original_optimizer``), the gradient at every canary coordinate in units
   of C. Pair j gives (X, Y) = (chosen coordinate, other coordinate): under a correct
   implementation a neighbouring pair of the per-step Gaussian mechanism whatever the real-data
   gradients are (randomized roles). One-run scores are running sums on the device.
4. **Sequential audit**: every ``check_every`` steps the buffered pairs go, step by step and pair
   by pair in order, to the sequential testers (:class:`~dpaudit_torch.stats.mmd.SequentialMMDTest`,
   González et al., NeurIPS 2025; :class:`~dpaudit_torch.stats.hockey_stick.HockeyStickTest`),
   each testing the per-step null "Gaussian mechanism of the optimizer's current noise
   multiplier" at a grid of points of its privacy profile (or an explicit (eps, delta)). The
   violation decision averages their e-processes (an average of e-processes is one) and compares
   with 1/alpha: anytime-valid by Ville's inequality, so a correct implementation is flagged with
   probability at most alpha over the whole run.
5. **One-run audit** at :meth:`finalize`: Steinke, Nasr & Jagielski (NeurIPS 2023) and the f-DP
   test of Mahloujifar, Melis & Chaudhuri (ICML 2025) on the one-run scores
   (:mod:`dpaudit_torch.stats.one_run`), next to the accountant's claimed epsilon.

The accountant's step-hook slot is never touched (Opacus has only one, and replacing it would
silently switch off accounting).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ._validation import check_alpha, check_epsilon, check_positive_int
from .canaries import CanaryDesign, SecretCoins, derive_seeds, draw_design
from .injection import Injector, effective_noise_multiplier, is_ghost
from .observation import Observer

logger = logging.getLogger(__name__)

__all__ = ["PrivacyAuditor", "PrivacyViolationError", "per_step_null_grid", "DEFAULT_NULL_GRID"]

#: default grid of the per-step Gaussian null: eps_i = c_i * mu, mu = 1 / sigma. Small eps give the
#: betting tests the most growth per pair against every bug of testing.bugs (their bet cap is
#: 1 / (2 (e^eps + delta))); the larger points let the per-step lower bound reach higher.
DEFAULT_NULL_GRID: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 3.0)

_TESTS = {
    "mmd": ("dpaudit_torch.stats.mmd", "SequentialMMDTest"),
    "hockey_stick": ("dpaudit_torch.stats.hockey_stick", "HockeyStickTest"),
}
_MODES = ("stop", "raise", "warn")
_NONFINITE = ("raise", "skip")
#: version of the layout of :meth:`PrivacyAuditor.state_dict`
STATE_VERSION = 1
#: tester options the auditor uses unless ``test_options`` overrides them. A training run feeds
#: k_pairs pairs per step (10^5 to 10^6 pairs in a long run); the uncapped MMD witness costs
#: O(t) per pair, so the auditor caps its support (FIFO, still a valid e-process: see
#: stats/mmd.py), which bounds its cost per pair and its memory. On per-step Gaussian
#: violations the cap 256 rejects within a few pairs of 1024 and of the uncapped test wherever
#: the MMD test rejects within ~1,500 pairs, and the hockey-stick test rejects 4-10x sooner in
#: every case, for a quarter of 1024's kernel work (benchmarks/witness_cap.py).
DEFAULT_TEST_OPTIONS: dict[str, dict[str, Any]] = {"mmd": {"max_witness_points": 256}}
_OWNER_ATTR = "_dpaudit_auditor"


class PrivacyViolationError(RuntimeError):
    """Raised (``on_violation="raise"``) before the update of the step at which the sequential
    audit proved that the per-step privacy guarantee does not hold."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def per_step_null_grid(sigma: float, grid: Sequence[float] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Grid points (eps_i, delta_sigma(eps_i)) of the Gaussian mechanism's privacy profile.

    With mu = 1 / sigma, eps_i = c_i mu (``grid`` = the c_i, default :data:`DEFAULT_NULL_GRID`).
    ALGORITHMS.md section 5: a correct DP-SGD step with the canary present is the Gaussian
    mechanism with sensitivity C and noise sigma C, i.e. mu-GDP (Dong, Roth & Su 2019).
    """
    from .stats.thresholds import gaussian_profile_grid

    if not (sigma > 0) or not math.isfinite(sigma):
        raise ValueError(f"noise multiplier must be a finite number > 0, got {sigma!r}")
    mu = 1.0 / sigma
    eps = np.array([c * mu for c in (DEFAULT_NULL_GRID if grid is None else grid)],
                   dtype=np.float64)
    return eps, gaussian_profile_grid(sigma, eps)


def _import_test(name: str) -> type:
    import importlib

    mod, attr = _TESTS[name]
    return getattr(importlib.import_module(mod), attr)


class _Segment:
    """Sequential testers for a stretch of steps with one per-step null (one noise multiplier)."""

    def __init__(self, sigma: float, start_step: int, testers: dict[str, Any],
                 epsilons: list[float], deltas: list[float], null: dict[str, Any]) -> None:
        self.sigma = sigma
        self.start_step = start_step
        self.testers = testers
        self.epsilons = epsilons
        self.deltas = deltas
        self.null = null


class PrivacyAuditor:
    """Audit an Opacus DP-SGD run while it trains (white-box, every step observed).

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` whose ``make_private`` built the optimizer
            (its accountant gives the claimed epsilon).
        optimizer: the optimizer ``make_private`` returned (an Opacus ``DPOptimizer``; flat,
            per-layer, adaptive or ghost clipping).
        data_loader: the data loader ``make_private`` returned; its ``sample_rate`` is the Poisson
            rate really used, whatever the accountant was told.
        delta: the delta of the claimed (eps, delta) and of the one-run bounds, in (0, 1).
        alpha: level of every test, in (0, 1): a correct run is flagged with probability <= alpha.
        k_pairs: sequential canary pairs (each gives one test pair per step).
        m_canaries: one-run canaries (IN with probability 1/2, secret until ``finalize``).
        canary_norm: raw canary norm as a multiple of the clipping bound C (> 1, so that clipping
            is exercised). A correct optimizer clips the canary to C whatever this is; a missing
            or broken clipping lets ``canary_norm * C`` through, so a large value makes clipping
            bugs stand out above the (then unclipped, large) real-data gradients. Default 25
            (4 needed about twice as many steps to detect disabled clipping, see
            docs/benchmarks.md).
        per_step_null: None (default: the Gaussian mechanism of the optimizer's current noise
            multiplier, tested at the grid :func:`per_step_null_grid`; a change of the noise
            multiplier starts new testers whose wealth multiplies the old one) or an explicit
            per-step ``(epsilon, delta)``.
        tests: sequential testers to run, among ``"mmd"`` and ``"hockey_stick"``.
        check_every: steps between host synchronisations, where the buffered pairs are fed to the
            testers (one call per test, which amortises their per-call cost) and the decision is
            taken. A violation is acted on at the first check at or after the step whose
            observation crossed the threshold
            (``violation_step`` is the step at which the decision was available;
            ``crossed_at_step`` is also reported).
        claimed_every: steps between calls of the accountant's ``get_epsilon`` (and at finalize;
            an RDP or PRV read costs 0.02-0.5 s, so frequent reads dominate the overhead).
        on_violation: ``"stop"`` (set :attr:`should_stop`), ``"raise"`` (raise
            :class:`PrivacyViolationError` before that step's update is applied) or ``"warn"``
            (log a warning and continue).
        on_nonfinite: what to do when the gradient at a canary coordinate is not finite:
            ``"raise"`` (default: ``ValueError`` before the update, the audit state untouched) or
            ``"skip"`` (drop that step's observation, count it in the report; the statistics never
            see a NaN).
        seed: seed of the auditor's own random streams (canary design, role coins, Poisson
            inclusion, secret coins); None: OS entropy (secure default). Under DDP (Opacus's
            distributed optimizers) rank 0's seeds are broadcast to every rank, and rank 0's
            decision at every check; construct the auditor and call ``finalize`` on every rank.
        history_stride: keep every ``history_stride``-th step in the log-wealth history.
        device: where the audit's buffers and testers live (default: the parameters' device).
        test_options: optional extra keyword arguments per test, e.g.
            ``{"mmd": {"witness_radius": 0.5}, "hockey_stick": {"burn_in": 32}}``; they override
            :data:`DEFAULT_TEST_OPTIONS` (the MMD witness is capped at 256 pairs).
        on_step: a callable (or a sequence of callables) receiving :attr:`latest_metrics` after
            every audited step (for TensorBoard and the like); its exceptions are logged, never
            raised into training.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (exact resume, also in a new
    process; see docs/auditor.md). Faults: ``on_nonfinite``; an exception inside the auditor
    detaches it (optimizer restored) before the step's update; parameters added or frozen after
    attach are refused at the next step (ValueError).

    Raises:
        TypeError: the optimizer is not an Opacus DP optimizer, or an argument has a wrong type.
        ValueError: a value is out of range, the data loader has no sample rate, the model is too
            small for the canaries, or another auditor is already attached to the optimizer.
        On any error the model and the optimizer are left untouched.
    """

    def __init__(
        self,
        privacy_engine: Any,
        optimizer: Any,
        data_loader: Any,
        delta: float = 1e-5,
        alpha: float = 0.05,
        *,
        k_pairs: int = 16,
        m_canaries: int = 1000,
        canary_norm: float = 25.0,
        per_step_null: tuple[float, float] | None = None,
        tests: Sequence[str] = ("mmd", "hockey_stick"),
        check_every: int = 5,
        claimed_every: int = 1000,
        on_violation: str = "stop",
        on_nonfinite: str = "raise",
        seed: int | None = None,
        history_stride: int = 1,
        device: torch.device | str | None = None,
        test_options: dict[str, dict[str, Any]] | None = None,
        on_step: Callable[[dict[str, Any]], Any] | Sequence[Callable[[dict[str, Any]], Any]]
        | None = None,
    ) -> None:
        # ---------------------------------------------------------------- validation only
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                f"optimizer must be the DP optimizer returned by PrivacyEngine.make_private "
                f"(an opacus DPOptimizer), got {type(optimizer).__module__}."
                f"{type(optimizer).__name__}")
        if any(c.__name__ == "DistributedPerLayerOptimizer" for c in type(optimizer).__mro__):
            raise TypeError("DistributedPerLayerOptimizer clips inside backward hooks and is not "
                            "supported by the auditor")
        accountant = getattr(privacy_engine, "accountant", None)
        if accountant is None or not callable(getattr(accountant, "get_epsilon", None)):
            raise TypeError(f"privacy_engine must be an opacus PrivacyEngine (with an accountant),"
                            f" got {type(privacy_engine).__name__}")
        sample_rate = getattr(data_loader, "sample_rate", None)
        if sample_rate is None:
            raise ValueError(
                f"data_loader ({type(data_loader).__name__}) has no sample_rate: pass the "
                f"DPDataLoader returned by make_private (poisson_sampling=True); the audit needs "
                f"the Poisson rate really used")
        try:
            sample_rate = float(sample_rate)
        except (TypeError, ValueError):
            raise TypeError(f"data_loader.sample_rate must be a number, got "
                            f"{sample_rate!r}") from None
        if not (0.0 < sample_rate <= 1.0):
            raise ValueError(f"data_loader.sample_rate must lie in (0, 1], got {sample_rate!r}")
        self.delta = check_alpha(delta, "delta")  # open interval (0, 1)
        self.alpha = check_alpha(alpha, "alpha")
        self.k_pairs = check_positive_int(k_pairs, "k_pairs")
        self.m_canaries = check_positive_int(m_canaries, "m_canaries", minimum=0)
        self.canary_norm = check_epsilon(canary_norm, "canary_norm")
        if self.canary_norm <= 1.0:
            raise ValueError(f"canary_norm must exceed 1 (a multiple of the clipping bound, so "
                             f"that clipping is exercised), got {canary_norm!r}")
        if per_step_null is not None:
            if (not isinstance(per_step_null, (tuple, list)) or len(per_step_null) != 2):
                raise TypeError(f"per_step_null must be None or a pair (epsilon, delta), got "
                                f"{per_step_null!r}")
            e0 = check_epsilon(per_step_null[0], "per_step_null epsilon")
            d0 = float(per_step_null[1])
            if not (0.0 <= d0 < 1.0):
                raise ValueError(f"per_step_null delta must lie in [0, 1), got {per_step_null!r}")
            self._explicit_null: tuple[float, float] | None = (e0, d0)
        else:
            self._explicit_null = None
        if isinstance(tests, str):
            tests = (tests,)
        tests = tuple(tests)
        if not tests or any(t not in _TESTS for t in tests) or len(set(tests)) != len(tests):
            raise ValueError(f"tests must be a non-empty subset of {sorted(_TESTS)}, got "
                             f"{tests!r}")
        self.tests = tests
        self.check_every = check_positive_int(check_every, "check_every")
        self.claimed_every = check_positive_int(claimed_every, "claimed_every")
        if on_violation not in _MODES:
            raise ValueError(f"on_violation must be one of {_MODES}, got {on_violation!r}")
        self.on_violation = on_violation
        if on_nonfinite not in _NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {_NONFINITE}, got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        self.history_stride = check_positive_int(history_stride, "history_stride")
        self.test_options = {k: dict(v) for k, v in (test_options or {}).items()}
        if any(k not in _TESTS for k in self.test_options):
            raise ValueError(f"test_options keys must be among {sorted(_TESTS)}, got "
                             f"{sorted(self.test_options)}")
        if on_step is None:
            callbacks: list[Callable[[dict[str, Any]], Any]] = []
        elif callable(on_step):
            callbacks = [on_step]
        elif isinstance(on_step, Sequence) and all(callable(f) for f in on_step):
            callbacks = list(on_step)
        else:
            raise TypeError(f"on_step must be a callable or a sequence of callables, got "
                            f"{on_step!r}")
        self._callbacks = callbacks
        other = getattr(optimizer, _OWNER_ATTR, None)
        if other is not None and other.attached:
            raise ValueError("this optimizer already has a PrivacyAuditor attached; call its "
                             "detach() (or finalize()) before attaching another")
        params = list(optimizer.params)
        if not params:
            raise ValueError("the optimizer has no trainable parameters")
        try:
            dev = torch.device(device) if device is not None else params[0].device
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must name a torch device, got {device!r} ({e})") from None
        seeds, self.seed_policy = derive_seeds(seed)
        self.rank = int(getattr(optimizer, "rank", 0))
        self.world_size = int(getattr(optimizer, "world_size", 1))
        shapes = [tuple(p.shape) for p in params]
        total = sum(p.numel() for p in params)
        if 2 * self.k_pairs + self.m_canaries > total:
            raise ValueError(
                f"the model has {total} trainable coordinates, fewer than the "
                f"{2 * self.k_pairs + self.m_canaries} canary coordinates requested "
                f"(2 * k_pairs + m_canaries); lower k_pairs or m_canaries")
        # first segment's testers (validates the null and imports the statistics)
        self._warnings: list[str] = []
        if self.world_size > 1:  # after all validation: a collective every rank reaches
            seeds, self.seed_policy = _shared_seeds(seeds, self.seed_policy, seed, self.rank,
                                                    params[0].device, self._warnings)
        self.privacy_engine = privacy_engine
        self.accountant = accountant
        self.optimizer = optimizer
        self.data_loader = data_loader
        self.sample_rate = sample_rate
        self.device = dev
        self.params = params
        self._segments: list[_Segment] = []
        sigma0 = effective_noise_multiplier(optimizer)
        first = self._new_segment(sigma0, start_step=0)

        design_gen = torch.Generator().manual_seed(seeds["design"])
        self.design: CanaryDesign = draw_design(shapes, self.k_pairs, self.m_canaries,
                                                design_gen)
        self._mechanics = torch.Generator().manual_seed(seeds["mechanics"])
        self._coins = SecretCoins(self.m_canaries, torch.Generator().manual_seed(seeds["secret"]))
        self.ghost = is_ghost(optimizer)
        self._injector = self._make_injector()
        self._observer = Observer(params, self.design, dev,
                                  check_finite_every_step=(dev.type == "cpu"),
                                  interference_every=self.check_every)
        self._segments.append(first)

        # ---------------------------------------------------------------- state
        self._step = 0  # audited (observed) logical steps
        self._steps_at_attach = self._accountant_steps()
        self._combined_offset = 0.0  # log-wealth carried over from earlier segments
        self._test_offset = {t: 0.0 for t in self.tests}
        self._combined_lw = 0.0
        self._test_lw = {t: 0.0 for t in self.tests}
        self._crossed_at: int | None = None
        self._violation_step: int | None = None
        self._violation = False
        self.should_stop = False
        self._raised = False
        self._history: dict[str, list] = {"step": [], "combined": [], "epsilon_lower_bound": [],
                                          **{t: [] for t in self.tests}}
        self._claimed: list[tuple[int, float | None]] = []
        self._seq_bound_cache = 0.0
        self._unobserved_steps = 0
        self._failure: str | None = None
        self._sigma_claimed_seen: set[float] = {float(optimizer.noise_multiplier)}
        self._report: Any = None
        self._finalized = False
        self._handle: Any = None
        self.attached = False

        # ---------------------------------------------------------------- attach (last)
        try:
            self._injector.attach()
            self._handle = optimizer.original_optimizer.register_step_pre_hook(self._pre_hook)
            setattr(optimizer, _OWNER_ATTR, self)
        except BaseException:
            self._injector.detach()
            if self._handle is not None:
                self._handle.remove()
            if getattr(optimizer, _OWNER_ATTR, None) is self:
                delattr(optimizer, _OWNER_ATTR)
            raise
        self.attached = True
        logger.info("PrivacyAuditor attached: %d pairs, %d one-run canaries, sample rate %.4g, "
                    "noise multiplier %.4g, %s", self.k_pairs, self.m_canaries, sample_rate,
                    sigma0, "ghost clipping" if self.ghost else "per-sample clipping")

    # ------------------------------------------------------------------ public state
    @property
    def is_main_process(self) -> bool:
        """True on the rank that writes the report (rank 0; always True without DDP)."""
        return self.rank == 0

    @property
    def step(self) -> int:
        """Logical steps observed so far."""
        return self._step

    @property
    def violation(self) -> bool:
        """Has the sequential audit proved a violation (at level alpha)?"""
        return self._violation

    @property
    def violation_step(self) -> int | None:
        """Training step at which the violation decision was available, or None."""
        return self._violation_step

    @property
    def crossed_at_step(self) -> int | None:
        """Training step whose observation first pushed the combined wealth over 1/alpha."""
        return self._crossed_at

    @property
    def combined_log_wealth(self) -> float:
        """Log of the decision's e-process (as of the last check)."""
        return self._combined_lw

    @property
    def decision_threshold_log(self) -> float:
        return math.log(1.0 / self.alpha)

    @property
    def claimed_epsilon(self) -> float | None:
        """The last claimed epsilon read from the accountant (None before the first read)."""
        return self._claimed[-1][1] if self._claimed else None

    @property
    def insertions(self) -> int:
        return self._injector.insertions

    @property
    def latest_metrics(self) -> dict[str, Any]:
        """Host-side audit metrics (no device synchronisation): the wealth is as of the last
        check, the claimed epsilon as of the last accountant read."""
        out: dict[str, Any] = {
            "step": self._steps_at_attach + self._step,
            "audited_steps": self._step,
            "combined_log_wealth": float(self._combined_lw),
            "decision_threshold_log": self.decision_threshold_log,
            "violation": self._violation,
            "epsilon_lower_bound_sequential": self._seq_bound_cache,
            "claimed_epsilon": self.claimed_epsilon,
        }
        for t in self.tests:
            out[f"log_wealth_{t}"] = float(self._test_lw[t])
        return out

    # ------------------------------------------------------------------ segments / testers
    def _null_points(self, sigma: float) -> tuple[list[float], list[float], dict[str, Any]] | None:
        if self._explicit_null is not None:
            e, d = self._explicit_null
            return [e], [d], {"type": "explicit", "epsilon": e, "delta": d}
        if not (sigma > 0) or not math.isfinite(sigma):
            return None
        eps, dels = per_step_null_grid(sigma)
        return eps.tolist(), dels.tolist(), {
            "type": "gaussian_profile", "noise_multiplier": sigma,
            "grid_over_mu": list(DEFAULT_NULL_GRID),
            "epsilons": eps.tolist(), "deltas": dels.tolist()}

    def _new_segment(self, sigma: float, start_step: int) -> _Segment:
        pts = self._null_points(sigma)
        if pts is None:
            msg = (f"noise multiplier {sigma!r}: no per-step Gaussian null to test (no privacy "
                   f"is claimed); the sequential audit is off until it changes")
            logger.warning(msg)
            self._warnings.append(msg)
            return _Segment(sigma, start_step, {}, [], [], {"type": "none", "noise_multiplier":
                                                             sigma})
        eps, dels, null = pts
        testers: dict[str, Any] = {}
        # each test's own grid bound is at alpha / len(tests) and simultaneous over its grid,
        # so that the reported sequential bound (max over tests and grid) has level alpha
        per_test_alpha = self.alpha / len(self.tests)
        for name in self.tests:
            cls = _import_test(name)
            opts = {"simultaneous": True, "device": self.device,
                    **DEFAULT_TEST_OPTIONS.get(name, {}), **self.test_options.get(name, {})}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                testers[name] = cls(eps, dels, per_test_alpha, **opts)
            for w in caught:
                msg = f"{name}: {w.message}"
                if msg not in self._warnings:
                    self._warnings.append(msg)
        return _Segment(sigma, start_step, testers, eps, dels, null)

    @property
    def _segment(self) -> _Segment:
        return self._segments[-1]

    def _rotate(self, sigma: float, step: int) -> None:
        """The noise multiplier changed: freeze the current wealth as a factor, start anew."""
        self._combined_offset = self._combined_lw
        for t in self.tests:
            self._test_offset[t] = self._test_lw[t]
        msg = (f"noise multiplier changed from {self._segment.sigma:.6g} to {sigma:.6g} at step "
               f"{step}: new per-step null; the sequential wealth carries over as a factor")
        logger.info(msg)
        self._warnings.append(msg)
        self._segments.append(self._new_segment(sigma, step))

    def _make_injector(self) -> Injector:
        inj = Injector(self.optimizer, self.params, self.design, self._coins, self._mechanics,
                       self.sample_rate, self.canary_norm, self.device)
        inj.on_failure = self._on_internal_failure
        return inj

    def _on_internal_failure(self, exc: BaseException) -> None:
        """The auditor's own code failed inside a step: detach (every wrapped attribute back,
        the pre-hook removed) so that training can go on unaudited; the step raises before its
        update, so the parameters keep their values."""
        msg = (f"internal auditor failure ({exc!r}); the auditor detached itself and restored "
               f"the optimizer; this step's update was not applied")
        logger.error(msg)
        self._failure = msg
        if msg not in self._warnings:
            self._warnings.append(msg)
        self.detach()

    # ------------------------------------------------------------------ the hook
    def _pre_hook(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        try:
            return self._pre_hook_inner()
        except (PrivacyViolationError, ValueError):
            raise  # decisions and refused observations: the audit state is consistent
        except Exception as e:
            self._on_internal_failure(e)
            raise

    def _pre_hook_inner(self) -> None:
        rec = self._injector.pop_record()
        if rec is None:
            self._unobserved_steps += 1
            if self._unobserved_steps == 1:
                msg = ("an optimizer step ran without passing through the DP optimizer's "
                       "clipping (e.g. original_optimizer.step() called directly); it is not "
                       "audited")
                logger.warning(msg)
                self._warnings.append(msg)
            return None
        if self._violation and self.on_violation == "raise":
            raise PrivacyViolationError(self._violation_message(), self._violation_step)
        step = self._step + 1
        # may raise ValueError (on_nonfinite="raise"; the audit state untouched)
        self._observer.observe(rec, self._steps_at_attach + step,
                               skip_nonfinite=self.on_nonfinite == "skip")
        self._step = step
        self._sigma_claimed_seen.add(rec.sigma_claimed)
        if step % self.check_every == 0:
            self._decide()
        if step % self.claimed_every == 0:
            self._read_claimed()
        if self._callbacks:
            self._notify()
        if self._violation and not self._raised:
            self._act()
        return None

    def _notify(self) -> None:
        metrics = self.latest_metrics
        for fn in self._callbacks:
            try:
                fn(dict(metrics))
            except Exception as e:  # noqa: BLE001 - a logging callback must not break training
                logger.warning("on_step callback %r failed: %r", fn, e)

    def _violation_message(self) -> str:
        return (f"privacy violation proven at training step {self._violation_step} "
                f"(sequential audit at level alpha={self.alpha:g}: the per-step guarantee of "
                f"the claimed noise multiplier does not hold; wealth exp({self._combined_lw:.3g})"
                f" >= 1/alpha)")

    def _act(self) -> None:
        self._raised = True
        msg = self._violation_message()
        if self.on_violation == "stop":
            self.should_stop = True
            logger.warning(msg + "; should_stop is set")
        elif self.on_violation == "warn":
            logger.warning(msg)
        else:
            self.should_stop = True
            logger.error(msg + "; raising before this step's update")
            raise PrivacyViolationError(msg, self._violation_step)

    def _decide(self) -> None:
        """Feed the buffered pairs to the testers, step by step; update the decision."""
        obs = self._observer
        if not obs.check_finite_every_step and obs.buffer_x and bool(obs.nonfinite):
            # accelerators: the finiteness of the buffered steps is checked here, at the one
            # synchronisation per check interval, so the statistics never see a NaN
            steps = list(obs.buffer_steps)
            obs.drain(record=False)
            obs.nonfinite.zero_()
            raise ValueError(f"non-finite gradient at canary coordinates during steps "
                             f"{steps[0]}..{steps[-1]}: those observations are discarded and this "
                             f"step's update was not applied")
        x, y, steps, sigmas = obs.drain(skip_nonfinite=self.on_nonfinite == "skip")
        i = 0
        while i < len(steps):  # split the chunk where the noise multiplier changed
            if sigmas[i] != self._segment.sigma:
                self._rotate(sigmas[i], steps[i])
            j = i + 1
            while j < len(steps) and sigmas[j] == sigmas[i]:
                j += 1
            self._feed(x[i:j], y[i:j], steps[i:j])
            i = j
        if self._crossed_at is not None and not self._violation:
            self._violation = True
            self._violation_step = self._steps_at_attach + self._step
            logger.info("sequential audit: violation crossed at step %d, decided at step %d",
                        self._crossed_at, self._violation_step)
        if self.world_size > 1:
            self._sync_decision()

    def _sync_decision(self) -> None:
        """DDP: every rank observes the same all-reduced gradients, so its testers agree with
        rank 0's; rank 0's decision is broadcast anyway (one small collective per check), so that
        every rank stops at the same step whatever the floating-point details."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        dev = self.params[0].device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([int(self._violation), -1 if self._violation_step is None
                          else self._violation_step, -1 if self._crossed_at is None
                          else self._crossed_at], dtype=torch.int64, device=dev)
        dist.broadcast(t, src=0)
        v, vs, ca = (int(a) for a in t.cpu().tolist())
        if bool(v) != self._violation or (v and (vs, ca) != (self._violation_step,
                                                            self._crossed_at)):
            msg = (f"rank {self.rank}: sequential decision differed from rank 0's; rank 0's "
                   f"decision is used")
            logger.warning(msg)
            if msg not in self._warnings:
                self._warnings.append(msg)
        self._violation = bool(v)
        self._violation_step = None if vs < 0 else vs
        self._crossed_at = None if ca < 0 else ca

    def _feed(self, x: torch.Tensor, y: torch.Tensor, steps: list[int]) -> None:
        """One update per tester for a run of steps [n, k] (pairs in step order, then pair order);
        the per-step wealth is read back from the testers' per-pair trajectories."""
        seg = self._segment
        n, k = int(x.shape[0]), int(x.shape[1])
        thr = self.decision_threshold_log
        per_test: dict[str, np.ndarray] = {}
        bound_steps: list[np.ndarray] = []
        for name, t in seg.testers.items():
            before = int(t.n_pairs)
            per_test[name] = _update_tracked(t, x.reshape(-1), y.reshape(-1), k)
            rej = np.array([np.inf if r is None else r for r in t.grid_rejected_at])
            pairs_after = before + k * np.arange(1, n + 1)
            hit = rej[None, :] <= pairs_after[:, None]  # [n, G]
            bound_steps.append(np.where(hit, t.epsilons[None, :], 0.0).max(axis=1))
        prev_bound = self._bound_before_segment()
        bounds = (np.maximum.reduce(bound_steps + [np.full(n, prev_bound)]) if bound_steps
                  else np.full(n, prev_bound))
        if per_test:
            stack = np.stack(list(per_test.values()))  # [n_tests, n]
            top = stack.max(axis=0)
            comb = self._combined_offset + top + np.log(np.mean(np.exp(stack - top), axis=0))
        else:
            comb = np.full(n, self._combined_lw)
        for s in range(n):
            self._combined_lw = float(comb[s])
            for name in per_test:
                self._test_lw[name] = self._test_offset[name] + float(per_test[name][s])
            self._seq_bound_cache = float(bounds[s])
            st = steps[s]
            if self._combined_lw >= thr and self._crossed_at is None:
                self._crossed_at = st
            if st % self.history_stride == 0:
                self._record_history(st)

    def _record_history(self, step: int) -> None:
        h = self._history
        if h["step"] and h["step"][-1] == step:
            return
        h["step"].append(int(step))
        h["combined"].append(float(self._combined_lw))
        for t in self.tests:
            h[t].append(float(self._test_lw[t]))
        h["epsilon_lower_bound"].append(self._seq_bound_cache)

    def _bound_before_segment(self) -> float:
        best = 0.0
        for seg in self._segments[:-1]:
            for t in seg.testers.values():
                best = max(best, float(t.epsilon_lower_bound))
        return best

    def _sequential_bound(self) -> float:
        best = 0.0
        for seg in self._segments:
            for t in seg.testers.values():
                best = max(best, float(t.epsilon_lower_bound))
        return best

    def _accountant_steps(self) -> int:
        hist = getattr(self.accountant, "history", None) or []
        try:
            return int(sum(int(h[-1]) for h in hist))
        except (TypeError, ValueError, IndexError):
            return len(hist)

    def _read_claimed(self) -> float | None:
        steps = self._accountant_steps()
        if steps == 0:
            return None
        try:
            eps = float(self.accountant.get_epsilon(delta=self.delta))
        except Exception as e:  # noqa: BLE001 - an accountant failure must not stop training
            msg = f"accountant.get_epsilon(delta={self.delta}) failed: {e!r}"
            logger.warning(msg)
            if msg not in self._warnings:
                self._warnings.append(msg)
            eps = None
        self._claimed.append((steps, eps))
        return eps

    # ------------------------------------------------------------------ checkpoint / resume
    def _config_fingerprint(self) -> dict[str, Any]:
        """What must be equal between the auditor that saved a state and the one loading it."""
        return {
            "parameter_shapes": [list(p.shape) for p in self.params],
            "k_pairs": self.k_pairs, "m_canaries": self.m_canaries,
            "canary_norm": self.canary_norm, "delta": self.delta, "alpha": self.alpha,
            "null": list(self._explicit_null) if self._explicit_null else None,
            "tests": list(self.tests), "check_every": self.check_every,
            "claimed_every": self.claimed_every, "on_violation": self.on_violation,
            "on_nonfinite": self.on_nonfinite, "history_stride": self.history_stride,
            "test_options": repr(sorted((k, sorted(v.items())) for k, v in
                                        self.test_options.items())),
            "ghost": self.ghost, "sample_rate": self.sample_rate,
            "optimizer": type(self.optimizer).__name__,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the audit (tensors and plain types; ``torch.save``-able).

        Holds the canary design, the secret IN/OUT coins, the one-run scores, the buffered pairs
        not yet fed, every segment's tester states, the auditor's generator state, the step
        counters, the wealth history, the claimed-epsilon bookkeeping and the warnings. **The
        checkpoint contains the secret coins**: keep it as private as the model's weights.

        Call it between steps (after ``optimizer.step()``). To resume: build a new auditor with
        the same configuration on the resumed model / optimizer / data loader, then
        :meth:`load_state_dict`.
        """
        if self._injector._pending is not None:
            raise RuntimeError("state_dict() called inside an optimizer step; call it between "
                               "steps")
        if self._finalized:
            raise RuntimeError("state_dict() of a finalized auditor; checkpoint before "
                               "finalize()")
        mask, revealed = self._coins._state()
        return {
            "version": STATE_VERSION,
            "config": self._config_fingerprint(),
            "seed_policy": self.seed_policy,
            "design": self.design.to_state(),
            "coins": {"in": mask, "revealed": revealed},
            # the role coins and inclusions are drawn in blocks of steps: the generator state
            # at the current block's start and the position in it resume them exactly
            "mechanics_rng": self._injector.draw_position()[0],
            "mechanics_pos": self._injector.draw_position()[1],
            "observer": self._observer.state_dict(),
            "injector": {"insertions": self._injector.insertions,
                         "one_run_insertions": self._injector.one_run_insertions,
                         "steps_injected": self._injector.steps_injected},
            "segments": [{"sigma": seg.sigma, "start_step": seg.start_step,
                          "testers": {n: _plain(t.state_dict())
                                      for n, t in seg.testers.items()}}
                         for seg in self._segments],
            "counters": {
                "step": self._step, "steps_at_attach": self._steps_at_attach,
                "combined_offset": self._combined_offset,
                "test_offset": dict(self._test_offset), "combined_lw": self._combined_lw,
                "test_lw": dict(self._test_lw), "crossed_at": self._crossed_at,
                "violation_step": self._violation_step, "violation": self._violation,
                "should_stop": self.should_stop, "raised": self._raised,
                "seq_bound_cache": self._seq_bound_cache,
                "unobserved_steps": self._unobserved_steps,
                "sigma_claimed_seen": sorted(self._sigma_claimed_seen),
            },
            "history": {k: list(v) for k, v in self._history.items()},
            "claimed": [[s, e] for s, e in self._claimed],
            "warnings": list(self._warnings),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of an auditor with the same configuration.

        Validates everything before changing anything: a state of another model (parameter
        shapes) or configuration (k_pairs, m_canaries, null, tests, ...) raises ValueError naming
        what differs, and leaves this auditor as it was. The design and the coins of the state
        replace this auditor's own (so ``seed=None`` resumes correctly).
        """
        if not isinstance(sd, dict) or "config" not in sd or "version" not in sd:
            raise ValueError("not a PrivacyAuditor state_dict (no 'config'/'version' entries)")
        if sd["version"] != STATE_VERSION:
            raise ValueError(f"PrivacyAuditor state_dict version {sd['version']!r} is not "
                             f"supported (this version reads {STATE_VERSION})")
        if self._finalized:
            raise RuntimeError("load_state_dict() into a finalized auditor")
        mine, theirs = self._config_fingerprint(), sd["config"]
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            raise ValueError(
                "PrivacyAuditor state_dict was made for a different model or configuration; "
                "differs in " + ", ".join(f"{k} (state: {theirs.get(k)!r}, this auditor: "
                                          f"{mine.get(k)!r})" for k in diff))
        # ---- build everything new first (any error leaves this auditor untouched)
        design = CanaryDesign.from_state(sd["design"])
        if [list(s) for s in design.shapes] != mine["parameter_shapes"] or (
                design.k_pairs, design.m_canaries) != (self.k_pairs, self.m_canaries):
            raise ValueError("PrivacyAuditor state_dict: its canary design does not fit this "
                             "model's parameters / canary counts")
        coins = SecretCoins._from_state(sd["coins"]["in"], sd["coins"]["revealed"])
        if coins._mask().numel() != self.m_canaries:
            raise ValueError(f"PrivacyAuditor state_dict: {coins._mask().numel()} secret coins "
                             f"for m_canaries={self.m_canaries}")
        mechanics = torch.Generator()
        mechanics.set_state(sd["mechanics_rng"])
        observer = Observer(self.params, design, self.device,
                            check_finite_every_step=self._observer.check_finite_every_step,
                            interference_every=self.check_every)
        observer.load_state_dict(sd["observer"])
        segments: list[_Segment] = []
        saved_warnings = list(self._warnings)
        try:
            for seg_sd in sd["segments"]:
                seg = self._new_segment(float(seg_sd["sigma"]), int(seg_sd["start_step"]))
                if set(seg.testers) != set(seg_sd["testers"]):
                    raise ValueError(f"PrivacyAuditor state_dict: segment testers "
                                     f"{sorted(seg_sd['testers'])} vs {sorted(seg.testers)}")
                for name, t in seg.testers.items():
                    t.load_state_dict(seg_sd["testers"][name])
                segments.append(seg)
        finally:
            self._warnings = saved_warnings  # _new_segment may append; restored below
        if not segments:
            raise ValueError("PrivacyAuditor state_dict has no tester segments")
        c = sd["counters"]
        # ---- commit
        was_attached = self.attached and self._injector._attached
        if was_attached:
            self._injector.detach()
        self.design, self._coins, self._mechanics = design, coins, mechanics
        self.seed_policy = str(sd["seed_policy"])
        self._injector = self._make_injector()
        self._injector.resume_draws(int(sd.get("mechanics_pos", 0)))
        if was_attached:
            self._injector.attach()
        inj = sd["injector"]
        self._injector.insertions = int(inj["insertions"])
        self._injector.one_run_insertions = int(inj["one_run_insertions"])
        self._injector.steps_injected = int(inj["steps_injected"])
        self._observer = observer
        self._segments = segments
        self._step = int(c["step"])
        self._steps_at_attach = int(c["steps_at_attach"])
        self._combined_offset = float(c["combined_offset"])
        self._test_offset = {k: float(v) for k, v in c["test_offset"].items()}
        self._combined_lw = float(c["combined_lw"])
        self._test_lw = {k: float(v) for k, v in c["test_lw"].items()}
        self._crossed_at = None if c["crossed_at"] is None else int(c["crossed_at"])
        self._violation_step = (None if c["violation_step"] is None
                                else int(c["violation_step"]))
        self._violation = bool(c["violation"])
        self.should_stop = bool(c["should_stop"])
        self._raised = bool(c["raised"])
        self._seq_bound_cache = float(c["seq_bound_cache"])
        self._unobserved_steps = int(c["unobserved_steps"])
        self._sigma_claimed_seen = {float(v) for v in c["sigma_claimed_seen"]}
        self._history = {k: list(v) for k, v in sd["history"].items()}
        self._claimed = [(int(s), None if e is None else float(e)) for s, e in sd["claimed"]]
        self._warnings = list(sd["warnings"])
        logger.info("PrivacyAuditor resumed at audited step %d", self._step)

    # ------------------------------------------------------------------ detach / finalize
    def detach(self) -> None:
        """Restore every wrapped optimizer attribute and remove the step pre-hook (idempotent).

        Observations buffered since the last check are kept; ``finalize`` still works after."""
        if not self.attached:
            return
        self._injector.detach()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if getattr(self.optimizer, _OWNER_ATTR, None) is self:
            delattr(self.optimizer, _OWNER_ATTR)
        self.attached = False
        logger.info("PrivacyAuditor detached after %d audited steps", self._step)

    def finalize(self, detach: bool = True) -> Any:
        """Finish the audit and return an :class:`~dpaudit_torch.report.AuditReport`.

        Feeds the remaining buffered pairs, reads the claimed epsilon, reveals the secret coins
        and computes the one-run bounds. Calling it again returns the same report. With
        ``detach=True`` (default) the auditor is detached first.
        """
        if self._report is not None:
            return self._report
        if detach:
            self.detach()
        self._decide()
        if self._violation and not self._raised:
            self._raised = True
            if self.on_violation in ("stop", "raise"):
                self.should_stop = True
            logger.warning(self._violation_message())
        if self._step and (not self._history["step"]
                           or self._history["step"][-1] != self._steps_at_attach + self._step):
            self._record_history(self._steps_at_attach + self._step)  # the final point
        claimed = self._read_claimed()
        self._report = self._build_report(claimed)
        self._finalized = True
        return self._report

    def _one_run(self, in_mask: torch.Tensor, scores: torch.Tensor
                 ) -> tuple[dict[str, float], dict[str, dict]]:
        bounds: dict[str, float] = {}
        details: dict[str, dict] = {}
        ins, outs = scores[in_mask], scores[~in_mask]
        if self._step == 0 or ins.numel() == 0 or outs.numel() == 0:
            note = "no one-run bound: no audited steps or an empty IN/OUT group"
            for method in ("steinke", "fdp"):
                bounds[method] = 0.0
                details[method] = {"bound": 0.0, "method": method, "note": note}
            return bounds, details
        from .stats.one_run import OneRunAudit

        audit = OneRunAudit(ins, outs)
        for method in ("steinke", "fdp"):
            try:
                res = audit.epsilon_lower_bound(delta=self.delta, alpha=self.alpha, method=method)
                bounds[method] = float(res.bound)
                details[method] = dict(res.to_dict())
            except Exception as e:  # noqa: BLE001 - report, never crash the end of training
                msg = f"one-run {method} bound failed: {e!r}"
                logger.warning(msg)
                self._warnings.append(msg)
                bounds[method] = 0.0
                details[method] = {"bound": 0.0, "method": method, "note": msg}
        return bounds, details

    def _build_report(self, claimed: float | None) -> Any:
        from .report import AuditReport

        opt = self.optimizer
        in_mask = self._coins.reveal()
        scores = self._observer.scores.detach().cpu()
        bounds, details = self._one_run(in_mask, scores)
        seq_bound = self._sequential_bound()
        seg = self._segment
        bounds["sequential"] = seq_bound
        details["sequential"] = {
            "level": self.alpha, "simultaneous": True,
            "grid_epsilons": list(seg.epsilons), "grid_deltas": list(seg.deltas),
            "null": self._null_text(seg),
            "note": "per-step bound, not the whole-run epsilon: a lower bound on the epsilon of "
                    "ONE training step at the grid point's delta (each test at alpha / "
                    f"{len(self.tests)}, Bonferroni over its grid)",
        }
        # only family-free whole-run bounds may refute the accountant's (eps, delta) claim:
        # Steinke et al.'s bound; the f-DP one assumes the Gaussian trade-off family
        refuted = bool(claimed is not None and math.isfinite(claimed)
                       and bounds.get("steinke", 0.0) > claimed)
        if claimed is not None and bounds.get("fdp", 0.0) > claimed and not refuted:
            self._warnings.append(
                f"the f-DP (Gaussian family) one-run bound {bounds['fdp']:.4g} exceeds the "
                f"claimed epsilon {claimed:.4g}; it assumes a Gaussian trade-off curve, so it is "
                f"not used to refute the claim")
        obs = self._observer
        if obs.skipped_nonfinite:
            msg = (f"{obs.skipped_nonfinite} step(s) had a non-finite gradient at a canary "
                   f"coordinate; their observations were dropped (on_nonfinite='skip')")
            if msg not in self._warnings:
                self._warnings.append(msg)
        summaries = {}
        for name in self.tests:
            t = seg.testers.get(name)
            summaries[name] = t.summary() if t is not None else {}
        per_layer = getattr(opt, "max_grad_norms", None) is not None
        from opacus.optimizers import AdaClipDPOptimizer

        clipping = ("ghost (flat)" if self.ghost else "adaptive" if isinstance(
            opt, AdaClipDPOptimizer) else "per_layer" if per_layer else "flat")
        sigma_eff = effective_noise_multiplier(opt)
        notes = [
            "white-box: the auditor inserts gradient canaries and reads every step's noisy "
            "gradient before the update (the DP-SGD threat model of the accountant)",
            "sequential audit: per-step pairs with randomized roles; valid whatever the "
            "real-data gradients (interference costs power, not validity)",
        ]
        if self.ghost:
            notes.append("ghost clipping: the clipped canary is added after clipping, so the "
                         "clipping code is NOT exercised by the canaries")
        if per_layer:
            notes.append("per-layer clipping: a canary in tensor i contributes C_i while the "
                         "noise has std sigma * ||C||; the per-step null of sigma is then "
                         "conservative")
        interference = obs.interference_summary(sigma_eff if sigma_eff > 0 else None)
        fields = {
            "claimed_epsilon": claimed,
            "delta": self.delta,
            "alpha": self.alpha,
            "accountant": type(self.accountant).__name__,
            "epsilon_lower_bounds": bounds,
            "lower_bound_details": details,
            "claim_refuted": refuted,
            "violation": self._violation,
            "violation_step": self._violation_step,
            "stopped_early": bool(self.should_stop),
            "sequential": {
                "tests": summaries,
                "combined_log_wealth": float(self._combined_lw),
                "decision_threshold_log": self.decision_threshold_log,
                "per_step_null": seg.null,
                "crossed_at_step": self._crossed_at,
                "check_every": self.check_every,
                "pairs_per_step": self.k_pairs,
                "segments": [{"start_step": s.start_step, "noise_multiplier": s.sigma,
                              "null": s.null} for s in self._segments],
                "decision": "average of the tests' e-processes >= 1/alpha (Ville)",
            },
            "wealth_history": {k: list(v) for k, v in self._history.items()},
            "one_run_scores": {"in": scores[in_mask].tolist(), "out": scores[~in_mask].tolist()},
            "canaries": {
                **self.design.summary(),
                "norm_multiplier": self.canary_norm,
                "insertions": self._injector.insertions,
                "one_run_insertions": self._injector.one_run_insertions,
                "one_run_in": int(in_mask.sum()),
                "steps_injected": self._injector.steps_injected,
                "inclusion_rate": self.sample_rate,
                "injecting_rank": 0,
                "seed_policy": self.seed_policy,
            },
            "training": {
                "noise_multiplier": float(opt.noise_multiplier),
                "effective_noise_multiplier": sigma_eff,
                "max_grad_norm": (list(map(float, opt.max_grad_norms)) if per_layer
                                  else float(opt.max_grad_norm)),
                "sample_rate": self.sample_rate,
                "expected_batch_size": float(opt.expected_batch_size)
                if opt.expected_batch_size is not None else None,
                "steps": self._accountant_steps(),
                "audited_steps": self._step,
                "world_size": self.world_size,
                "nonfinite_steps_skipped": obs.skipped_nonfinite,
                "steps_at_attach": self._steps_at_attach,
                "optimizer": type(opt).__name__,
                "grad_sample_mode": "ghost" if self.ghost else "per-sample",
                "clipping": clipping,
                "loss_reduction": opt.loss_reduction,
                "claimed_epsilon_history": [[s, e] for s, e in self._claimed],
            },
            "threat_model": {"white_box": True,
                             "every_step_observed": (self._unobserved_steps == 0
                                                     and obs.skipped_nonfinite == 0),
                             "clipping_exercised": not self.ghost, "notes": notes},
            "interference": interference,
            "config": {
                "delta": self.delta, "alpha": self.alpha, "k_pairs": self.k_pairs,
                "m_canaries": self.m_canaries, "canary_norm": self.canary_norm,
                "per_step_null": list(self._explicit_null) if self._explicit_null else None,
                "tests": list(self.tests), "check_every": self.check_every,
                "claimed_every": self.claimed_every, "on_violation": self.on_violation,
                "on_nonfinite": self.on_nonfinite, "history_stride": self.history_stride,
                "device": str(self.device),
                "test_options": self.test_options,
            },
            "seed_policy": self.seed_policy,
            "warnings": list(self._warnings),
        }
        return AuditReport(**fields)

    def _null_text(self, seg: _Segment) -> str:
        if seg.null.get("type") == "explicit":
            return f"explicit per-step ({seg.null['epsilon']}, {seg.null['delta']})-DP"
        if seg.null.get("type") == "gaussian_profile":
            return (f"Gaussian mechanism, noise multiplier {seg.sigma:.6g} (sensitivity C), at "
                    f"{len(seg.epsilons)} points of its privacy profile")
        return "none (no noise claimed)"

    def __repr__(self) -> str:
        return (f"PrivacyAuditor(step={self._step}, k_pairs={self.k_pairs}, "
                f"m_canaries={self.m_canaries}, violation={self._violation}, "
                f"attached={self.attached})")


def _shared_seeds(seeds: dict[str, int], policy: str, seed: int | None, rank: int,
                  device: torch.device, notes: list[str]) -> tuple[dict[str, int], str]:
    """DDP: every rank uses rank 0's stream seeds (broadcast), so that all ranks share the canary
    design, the role coins and the secret coins; with ``seed=None`` they come from rank 0's OS
    entropy. The seed itself is never logged or reported."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("distributed DP optimizer (world_size > 1) but torch.distributed is not "
                         "initialised: the auditor must share its seeds across ranks")
    names = ("design", "mechanics", "secret")
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([seeds[n] for n in names] + [int(seed is None)], dtype=torch.int64,
                     device=dev)
    dist.broadcast(t, src=0)
    vals = t.cpu().tolist()
    shared = dict(zip(names, (int(v) for v in vals[:3])))
    if rank != 0 and ((seed is None) != bool(vals[3])
                      or (seed is not None and shared != seeds)):
        msg = (f"rank {rank}: its seed differs from rank 0's; rank 0's canary design and coins "
               f"are used on every rank")
        logger.warning(msg)
        notes.append(msg)
    shared_policy = ("os-entropy (rank 0, shared with every rank)" if vals[3]
                     else "seeded (rank 0's seed, shared with every rank)")
    return shared, shared_policy


def _plain(obj: Any) -> Any:
    """Numpy scalars -> Python numbers, numpy arrays -> tensors (lossless), recursively, so that
    a state loads with ``torch.load(weights_only=True)``."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_plain(v) for v in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


def _update_tracked(tester: Any, x: torch.Tensor, y: torch.Tensor, k: int) -> np.ndarray:
    """Feed a run of steps (k pairs each) in one call; combined log-wealth after each step."""
    return tester.update_with_trajectory(x, y)[k - 1 :: k]
