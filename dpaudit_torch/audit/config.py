"""``AuditConfig``: every setting of a white-box audit, validated once, frozen.

The auditor (:class:`~dpaudit_torch.audit.auditor.PrivacyAuditor`), the Lightning callback and
the demo all build one, so a bad setting is refused with the same message wherever it is given,
before anything is attached. :meth:`AuditConfig.fingerprint` is what a checkpoint must match to be
resumed; :meth:`AuditConfig.to_dict` is the report's ``config`` section.

Framework-free: imports neither Opacus nor the statistics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._validation import check_alpha, check_epsilon, check_positive_int
from ..registry import TESTERS
from .levels import (
    DEFAULT_ALPHA,
    DEFAULT_ALPHA_WARN,
    LEVEL_SPLITS,
    STOP_ON,
    UNION,
    path_level,
    path_levels,
)

__all__ = ["AuditConfig", "ON_VIOLATION", "ON_NONFINITE", "ON_INTERNAL_ERROR",
           "DEFAULT_TEST_OPTIONS", "DEFAULT_NULL_GRID", "DEFAULT_M_CANARIES", "default_m_canaries",
           "DEFAULT_NOISE_COORDINATES_TOTAL", "TESTER_PLACEMENTS"]

#: what the auditor does once a violation is proven
ON_VIOLATION = ("stop", "raise", "warn")
#: what the auditor does with a non-finite observation
ON_NONFINITE = ("raise", "skip")
#: what the auditor does when its own code fails inside a training step (docs/auditor.md,
#: "Faults"): detach and let the step go on exactly as without the auditor, or detach and raise
#: before the step's update
ON_INTERNAL_ERROR = ("continue", "raise")
#: where the sequential testers the hook feeds run (docs/auditor.md, "On a GPU"): "host" (on the
#: CPU, fed the check's one host copy of the pairs), "device" (on the audit's device, fed the
#: buffered device tensors; on a CPU-only run the same as "host"), or "auto" (the stored rule of
#: :func:`dpaudit_torch.audit.placement.auto_placement`, by device type, ``check_every`` and
#: ``k_pairs``)
TESTER_PLACEMENTS = ("auto", "host", "device")

#: one-run canaries by default, where the model has room (see :func:`default_m_canaries`). The
#: white-box bound has no ceiling below its noise-free value and tightens as 1 / sqrt(m): in the
#: idealized game at q = 0.082, T = 2500 its expected bound over the claim goes from 0.91 / 0.87
#: / 0.79 (claimed eps 8 / 4 / 2) with 5,000 canaries to 0.95 / 0.93 / 0.89 with 20,000, for
#: O(m) work per step on the host (a gather and a few additions; docs/one_run.md, "How many
#: canaries and steps")
DEFAULT_M_CANARIES = 20000


#: at most this many noise-audit coordinates in all by default (``noise_coordinates_total``): a
#: model whose allotment of ``noise_coordinates_per_tensor`` adds up to no more (at most 32
#: tensors of 2,048 coordinates or more) keeps it exactly; a 150-tensor
#: transformer gets about 440 per tensor instead of 2,048 (about 65,000 coordinates instead of
#: 300,000, 4-5x less memory for the noise audit), still far more than a variance shortfall on
#: one tensor needs to be decided at the first check (docs/auditor.md, "Memory")
DEFAULT_NOISE_COORDINATES_TOTAL = 1 << 16


def default_m_canaries(n_coordinates: int, k_pairs: int) -> int:
    """The default number of one-run canaries for a model with ``n_coordinates`` trainable
    coordinates: :data:`DEFAULT_M_CANARIES`, but at most half of the coordinates the pairs leave
    free (a small model keeps most of its coordinates canary-free)."""
    return max(0, min(DEFAULT_M_CANARIES, (n_coordinates - 2 * k_pairs) // 2))


#: default grid of the per-step Gaussian null: eps_i = c_i * mu, mu = 1 / sigma. Small eps give the
#: betting tests the most growth per pair against every bug of testing.bugs (their bet cap is
#: 1 / (2 (e^eps + delta))); the larger points let the per-step lower bound reach higher.
DEFAULT_NULL_GRID: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 3.0)

#: tester options the auditor uses unless ``test_options`` overrides them. A training run feeds
#: k_pairs pairs per step (10^5 to 10^6 pairs in a long run); the uncapped MMD witness costs
#: O(t) per pair, so the auditor caps its support (FIFO, still a valid e-process: see
#: docs/design.md section 2), which bounds its cost per pair and its memory. On per-step Gaussian
#: violations the cap 128 rejects within a few percent of the pairs of 256, 1024 and the
#: uncapped test wherever the MMD test rejects within ~1,500 pairs, and the hockey-stick test
#: rejects 4-10x sooner in every case, for half of 256's kernel work and an eighth of 1024's
#: (benchmarks/witness_cap.py). (Resuming a checkpoint written with another cap: pass that cap in
#: ``test_options``.)
#: The hook's hockey-stick test bets by Online Newton Step (``bet="ons"``, ``eta=2``), not by the
#: stake mixture that is the test's own default: on the hook's chunks of 80 pairs over a 5-point
#: grid the mixture costs 2.7x more per pair (34 against 12.5 us, docs/statistics.md), a cost paid
#: inside every training step, and the detection, false-alarm and overhead tables of
#: docs/benchmarks.md were measured with ONS (the former test bit for bit). ``test_options=
#: {"hockey_stick": {"bet": "mixture", "eta": 1.5}}`` selects the mixture (fewer pairs to a
#: proof: "sigma halved" 79 -> 59).
DEFAULT_TEST_OPTIONS: dict[str, dict[str, Any]] = {"mmd": {"max_witness_points": 128},
                                                   "hockey_stick": {"bet": "ons", "eta": 2.0}}


def _freeze_options(opts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    if opts is None:
        return {}
    if not isinstance(opts, Mapping) or not all(isinstance(v, Mapping) for v in opts.values()):
        raise TypeError(f"test_options must map a test name to a dict of options, got {opts!r}")
    out = {str(k): dict(v) for k, v in opts.items()}
    if any(k not in TESTERS for k in out):
        raise ValueError(f"test_options keys must be among {sorted(TESTERS)}, got {sorted(out)}")
    return out


def _names(value: Any, what: str, none_ok: bool = False) -> tuple[str, ...] | None:
    """A tuple of monitor names (a single name is one name); the names themselves are checked
    against the registry when the monitors are built."""
    if value is None and none_ok:
        return None
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what} must be a sequence of monitor names, got {value!r}")
    return tuple(names)


def _label(value: Any, what: str) -> str | None:
    """A user-given name (``model_name``, ``dataset_name``): None, or a non-empty string of at
    most 200 characters on one line, kept as given."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string or None, got {value!r}")
    if not value.strip() or len(value) > 200 or "\n" in value or "\r" in value:
        raise ValueError(f"{what} must be a non-empty name of at most 200 characters on one "
                         f"line, got {value!r}")
    return value


@dataclass(frozen=True)
class AuditConfig:
    """The settings of one audit (see :class:`~dpaudit_torch.audit.auditor.PrivacyAuditor` for
    the meaning of each). Validated at construction: TypeError / ValueError naming the value.

    ``seed``, ``device``, ``compiled_kernels`` and ``tester_placement`` are part of the
    configuration but not of :meth:`fingerprint` (a resumed audit takes its streams from the
    checkpoint and may live on another device; the kernels' implementation and the testers'
    placement never change a result; the placement is one of the sequential monitor's settings,
    which a checkpoint stores and a resume compares), and neither is the set
    of monitors (``monitors``: None for every default one, or the names to run;
    ``disable_monitors``; ``monitor_options``: per monitor name, its own settings): a checkpoint
    resumes the monitors both sets share, each checked against its own settings, and starts the
    others fresh.

    The two levels of evidence (docs/design.md, "Two levels of evidence";
    :mod:`dpaudit_torch.audit.levels`): ``alpha`` (default 1e-3) is the level of every proof
    together ("violation proven", "claim refuted", "claim inconsistent"), split among the proof
    paths by ``level_split`` (``"union"``; ``"per_path"`` only resumes a checkpoint written
    before the two levels); ``alpha_warn`` (default 0.05, or ``alpha`` where that is larger;
    it must lie in [alpha, 1)) is the level of "evidence of a violation", the decision's
    e-process at 1/alpha_warn, reported and never acted on unless ``stop_on="evidence"``
    (default ``"proof"``: ``on_violation`` acts on the proof only).

    ``model_name`` and ``dataset_name`` are the user's names for what is trained and on what
    (e.g. ``"resnet18-v3"``, ``"cifar10-train"``); they are recorded in the report's ``config``
    and its ``fingerprint``, where the release gate (``dpaudit gate``, docs/release_gate.md)
    checks that two audits are about the same model and data. They change no statistic and are
    not part of :meth:`fingerprint`.
    """

    delta: float = 1e-5
    alpha: float = DEFAULT_ALPHA
    alpha_warn: float | None = None
    stop_on: str = "proof"
    level_split: str = UNION
    k_pairs: int = 16
    m_canaries: int | None = None
    canary_norm: float = 25.0
    per_step_null: tuple[float, float] | None = None
    tests: tuple[str, ...] = ("mmd", "hockey_stick")
    check_every: int = 5
    claimed_every: int = 1000
    on_violation: str = "stop"
    on_nonfinite: str = "raise"
    on_internal_error: str = "continue"
    seed: int | None = None
    history_stride: int = 1
    device: str | None = None
    test_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    one_run_score: str = "llr"
    noise_coordinates_per_tensor: int = 2048
    noise_coordinates_total: int | None = DEFAULT_NOISE_COORDINATES_TOTAL
    spread_pairs: int | None = None
    spread_tensors: int = 4
    compiled_kernels: bool | None = None
    monitors: tuple[str, ...] | None = None
    disable_monitors: tuple[str, ...] = ()
    monitor_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_name: str | None = None
    dataset_name: str | None = None
    tester_placement: str = "auto"

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise the values once, here
        put(self, "delta", check_alpha(self.delta, "delta"))  # the open interval (0, 1)
        put(self, "alpha", check_alpha(self.alpha, "alpha"))
        if self.level_split not in LEVEL_SPLITS:
            raise ValueError(f"level_split must be one of {LEVEL_SPLITS}, got "
                             f"{self.level_split!r}")
        if self.alpha_warn is None:  # the default: 0.05, or alpha where alpha is larger
            put(self, "alpha_warn", max(DEFAULT_ALPHA_WARN, self.alpha))
        else:
            put(self, "alpha_warn", check_alpha(self.alpha_warn, "alpha_warn"))
            # evidence is weaker than proof: its level is not below alpha (equal: no separate
            # evidence level; the decision's e-process still shows evidence at 1/alpha, below
            # its proof threshold, 1 / its share of alpha)
            assert self.alpha_warn is not None
            if self.alpha_warn < self.alpha:
                raise ValueError(f"alpha_warn must lie in [alpha, 1) = [{self.alpha:g}, 1), "
                                 f"got {self.alpha_warn!r}")
        if self.stop_on not in STOP_ON:
            raise ValueError(f"stop_on must be one of {STOP_ON}, got {self.stop_on!r}")
        put(self, "k_pairs", check_positive_int(self.k_pairs, "k_pairs"))
        if self.m_canaries is not None:
            put(self, "m_canaries", check_positive_int(self.m_canaries, "m_canaries",
                                                       minimum=0))
        norm = check_epsilon(self.canary_norm, "canary_norm")
        if norm <= 1.0:
            raise ValueError(f"canary_norm must exceed 1 (a multiple of the clipping bound, so "
                             f"that clipping is exercised), got {self.canary_norm!r}")
        put(self, "canary_norm", norm)
        null = self.per_step_null
        if null is not None:
            if not isinstance(null, (tuple, list)) or len(null) != 2:
                raise TypeError(f"per_step_null must be None or a pair (epsilon, delta), got "
                                f"{null!r}")
            e0 = check_epsilon(null[0], "per_step_null epsilon")
            d0 = float(null[1])
            if not (0.0 <= d0 < 1.0):
                raise ValueError(f"per_step_null delta must lie in [0, 1), got {null!r}")
            put(self, "per_step_null", (e0, d0))
        tests = (self.tests,) if isinstance(self.tests, str) else tuple(self.tests)
        if not tests or any(t not in TESTERS for t in tests) or len(set(tests)) != len(tests):
            raise ValueError(f"tests must be a non-empty subset of {sorted(TESTERS)}, got "
                             f"{self.tests!r}")
        put(self, "tests", tests)
        put(self, "check_every", check_positive_int(self.check_every, "check_every"))
        put(self, "claimed_every", check_positive_int(self.claimed_every, "claimed_every"))
        if self.on_violation not in ON_VIOLATION:
            raise ValueError(f"on_violation must be one of {ON_VIOLATION}, got "
                             f"{self.on_violation!r}")
        if self.on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got "
                             f"{self.on_nonfinite!r}")
        if self.on_internal_error not in ON_INTERNAL_ERROR:
            raise ValueError(f"on_internal_error must be one of {ON_INTERNAL_ERROR}, got "
                             f"{self.on_internal_error!r}")
        if self.tester_placement not in TESTER_PLACEMENTS:
            raise ValueError(f"tester_placement must be one of {TESTER_PLACEMENTS}, got "
                             f"{self.tester_placement!r}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        put(self, "history_stride", check_positive_int(self.history_stride, "history_stride"))
        if self.device is not None:
            put(self, "device", str(self.device))
        put(self, "test_options", _freeze_options(self.test_options))
        put(self, "noise_coordinates_per_tensor", check_positive_int(
            self.noise_coordinates_per_tensor, "noise_coordinates_per_tensor", minimum=0))
        if self.noise_coordinates_total is not None:
            put(self, "noise_coordinates_total", check_positive_int(
                self.noise_coordinates_total, "noise_coordinates_total"))
        if self.compiled_kernels is not None and not isinstance(self.compiled_kernels, bool):
            raise TypeError(f"compiled_kernels must be True, False or None (by the model's "
                            f"size), got {self.compiled_kernels!r}")
        if self.spread_pairs is None:  # default: every pair is a spread canary
            put(self, "spread_pairs", self.k_pairs)
        put(self, "spread_pairs", check_positive_int(self.spread_pairs, "spread_pairs",
                                                     minimum=0))
        put(self, "spread_tensors", check_positive_int(self.spread_tensors, "spread_tensors",
                                                       minimum=2))
        if self.spread_pairs > self.k_pairs:
            raise ValueError(f"spread_pairs ({self.spread_pairs}) cannot exceed k_pairs "
                             f"({self.k_pairs})")
        put(self, "monitors", _names(self.monitors, "monitors", none_ok=True))
        put(self, "disable_monitors", _names(self.disable_monitors, "disable_monitors"))
        opts = self.monitor_options
        if not isinstance(opts, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Mapping) for k, v in opts.items()):
            raise TypeError(f"monitor_options must map a monitor name to a dict of options, "
                            f"got {opts!r}")
        put(self, "monitor_options", {k: dict(v) for k, v in opts.items()})
        for name in ("model_name", "dataset_name"):
            put(self, name, _label(getattr(self, name), name))
        from ..stats.one_run_scores import SCORES

        if self.one_run_score not in SCORES:
            raise ValueError(f"one_run_score must be one of {SCORES}, got "
                             f"{self.one_run_score!r}")

    # ------------------------------------------------------------------ derived
    def level_of(self, path: str) -> float:
        """The level proof path ``path`` is decided at (:mod:`dpaudit_torch.audit.levels`)."""
        return path_level(self.alpha, path, self.level_split)

    @property
    def proof_levels(self) -> dict[str, float]:
        """Every proof path's level; their sum bounds P(any false proof) (the union bound)."""
        return path_levels(self.alpha, self.level_split)

    @property
    def decision_alpha(self) -> float:
        """The sequential decision's share of ``alpha``."""
        return self.level_of("decision")

    @property
    def decision_threshold_log(self) -> float:
        """log(1 / decision_alpha): the decision's e-process proves a violation at this."""
        return math.log(1.0 / self.decision_alpha)

    @property
    def evidence_threshold_log(self) -> float:
        """log(1 / alpha_warn): the decision's e-process shows evidence at this."""
        return math.log(1.0 / self.alpha_warn)

    def tester_options(self, name: str) -> dict[str, Any]:
        """The keyword options tester ``name`` is built with (defaults, then the user's)."""
        return {**DEFAULT_TEST_OPTIONS.get(name, {}), **self.test_options.get(name, {})}

    def sized_for(self, n_coordinates: int, compiled_below: int) -> AuditConfig:
        """This configuration for a model of ``n_coordinates`` trainable coordinates: the
        default ``m_canaries`` sized to it (:func:`default_m_canaries`), the kernels compiled
        below ``compiled_below`` coordinates where not set; ValueError when the canaries do not
        fit in the model."""
        cfg = self
        if cfg.m_canaries is None:
            cfg = cfg.replace(m_canaries=default_m_canaries(n_coordinates, cfg.k_pairs))
        assert cfg.m_canaries is not None
        need = 2 * cfg.k_pairs + cfg.m_canaries
        if need > n_coordinates:
            raise ValueError(
                f"the model has {n_coordinates} trainable coordinates, fewer than the {need} "
                f"canary coordinates requested (2 * k_pairs + m_canaries); lower k_pairs or "
                f"m_canaries")
        if cfg.compiled_kernels is None:  # by the model's size (dpaudit_torch/_compiled.py)
            cfg = cfg.replace(compiled_kernels=n_coordinates < compiled_below)
        return cfg

    def replace(self, **changes: Any) -> AuditConfig:
        """A copy with some settings changed (validated again). A ``spread_pairs`` that is the
        default (every pair, ``k_pairs``) follows a new ``k_pairs``, an ``alpha_warn`` that is
        the default a new ``alpha``."""
        if "k_pairs" in changes and "spread_pairs" not in changes and \
                self.spread_pairs == self.k_pairs:
            changes["spread_pairs"] = None
        if "alpha" in changes and "alpha_warn" not in changes and \
                self.alpha_warn == max(DEFAULT_ALPHA_WARN, self.alpha):
            changes["alpha_warn"] = None  # the default follows a new alpha
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_kwargs(cls, config: AuditConfig | None = None, **kwargs: Any) -> AuditConfig:
        """``config`` with ``kwargs`` applied, or a new config from ``kwargs``; TypeError naming
        an unknown setting."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown audit setting(s) {unknown}; known: {sorted(names)}")
        if config is None:
            return cls(**kwargs)
        if not isinstance(config, AuditConfig):
            raise TypeError(f"config must be an AuditConfig, got {type(config).__name__}")
        return config.replace(**kwargs) if kwargs else config

    # ------------------------------------------------------------------ records
    def fingerprint(self) -> dict[str, Any]:
        """The settings a checkpoint must share with the auditor that loads it."""
        return {
            "k_pairs": self.k_pairs, "m_canaries": self.m_canaries,
            "canary_norm": self.canary_norm, "delta": self.delta, "alpha": self.alpha,
            "alpha_warn": self.alpha_warn, "stop_on": self.stop_on,
            "level_split": self.level_split,
            "null": list(self.per_step_null) if self.per_step_null else None,
            "tests": list(self.tests), "check_every": self.check_every,
            "claimed_every": self.claimed_every, "on_violation": self.on_violation,
            "on_nonfinite": self.on_nonfinite, "history_stride": self.history_stride,
            "test_options": repr(sorted((k, sorted(v.items()))
                                        for k, v in self.test_options.items())),
            "noise_coordinates_per_tensor": self.noise_coordinates_per_tensor,
            "noise_coordinates_total": self.noise_coordinates_total,
            "spread_pairs": self.spread_pairs, "spread_tensors": self.spread_tensors,
        }

    def to_dict(self) -> dict[str, Any]:
        """The report's ``config`` section (the seed itself is never reported)."""
        return {
            "delta": self.delta, "alpha": self.alpha, "alpha_warn": self.alpha_warn,
            "stop_on": self.stop_on, "level_split": self.level_split, "k_pairs": self.k_pairs,
            "m_canaries": self.m_canaries, "canary_norm": self.canary_norm,
            "per_step_null": list(self.per_step_null) if self.per_step_null else None,
            "tests": list(self.tests), "check_every": self.check_every,
            "claimed_every": self.claimed_every, "on_violation": self.on_violation,
            "on_nonfinite": self.on_nonfinite, "on_internal_error": self.on_internal_error,
            "history_stride": self.history_stride, "device": self.device,
            "test_options": {k: dict(v) for k, v in self.test_options.items()},
            "one_run_score": self.one_run_score,
            "noise_coordinates_per_tensor": self.noise_coordinates_per_tensor,
            "noise_coordinates_total": self.noise_coordinates_total,
            "spread_pairs": self.spread_pairs, "spread_tensors": self.spread_tensors,
            "compiled_kernels": self.compiled_kernels,
            "monitors": None if self.monitors is None else list(self.monitors),
            "disable_monitors": list(self.disable_monitors),
            "monitor_options": {k: dict(v) for k, v in self.monitor_options.items()},
            "model_name": self.model_name, "dataset_name": self.dataset_name,
            "tester_placement": self.tester_placement,
        }

