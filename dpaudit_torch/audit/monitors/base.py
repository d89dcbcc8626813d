"""What a monitor is, and the monitor registry.

A monitor watches the stream of :class:`~dpaudit_torch.contract.StepRecord` and contributes
evidence, findings and its part of the report. It is **one module plus one registry entry**: a
subclass of :class:`Monitor` decorated with :func:`register_monitor`, imported once in
``audit/monitors/__init__.py``. It declares, as class attributes:

* ``config_class``: its own frozen dataclass of settings (:class:`MonitorConfig`), built from the
  audit's settings and the user's ``AuditConfig(monitor_options={name: {...}})``;
* ``needs``: the facts it asks of the framework adapter (:mod:`dpaudit_torch.contract`), which
  answers each or says why it cannot (:meth:`MonitorContext.fact` raises
  :class:`~dpaudit_torch.contract.FactUnavailable` with that reason; asking for a fact that is
  not declared is a programming error, ``KeyError``);
* ``label``: how the report names it; ``history_columns``: the per-step diagnostics its
  evidence carries (columns of the report's wealth history);
* ``observes_nonfinite``: whether it sees the steps whose values were dropped as non-finite
  (a monitor that counts releases does; it must not use their values).

The engine (:mod:`dpaudit_torch.audit.engine`) calls, in this order:

* :meth:`Monitor.observe` at every audited step (cheap: buffer or add on the device, no host
  synchronisation), before the step's update;
* :meth:`Monitor.after_release` after every update of the DP optimizer (its step post-hook; same
  rules as ``observe``), and once with ``None`` when the audit attaches or attaches again (what
  happened before is not comparable with what follows);
* :meth:`Monitor.pending_tensors` and :meth:`Monitor.take_host_copies` at every check, before
  ``advance``: the device tensors it buffered since the last check, copied to the host with every
  other monitor's in one transfer (:func:`host_copies`: the check's one host synchronisation on
  an accelerator) and handed back as NumPy arrays, which replace them in its buffers;
* :meth:`Monitor.advance` at every check (every ``check_every`` steps, and at finalize): process
  what was buffered (on the host copies: no further host read of a device tensor); a monitor
  that bets returns an :class:`Evidence` with the log of its e-process after each step it
  processed, which the decision averages with the other monitors' (an average of e-processes on
  the same filtration is an e-process, docs/design.md section 1);
* :meth:`Monitor.finalize` once at the end (whole-run statistics, e.g. the one-run bounds);
* :meth:`Monitor.findings` and :meth:`Monitor.contribution` to fill the report (bounds, its
  section, report fields it owns, a verdict level), and :meth:`Monitor.check_section` for its
  section of the report's ``checks`` (what it checked, measured, and did not check and why);
  :meth:`Monitor.state_dict` / :meth:`Monitor.load_state_dict` for checkpoints (stored under
  the monitor's name).

Nothing outside ``audit/monitors/`` spells a monitor's name: the engine, the decision, the
report and the page loop over what is registered. See CONTRIBUTING.md, "A new monitor".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from ...contract import Fact, FactSource, FactUnavailable, StaticFacts, StepRecord
from ..config import AuditConfig
from .checks import CheckSection

__all__ = ["Monitor", "MonitorConfig", "MonitorContext", "Evidence", "Finding", "Contribution",
           "MONITORS", "register_monitor", "build_monitors", "monitor_names", "plain_state",
           "FINDING_LEVELS", "host_flags", "host_copies"]

T = TypeVar("T")

#: the levels a finding may have: "violation" (proven at level alpha by an anytime-valid test),
#: "refuted" (a valid whole-run bound above the claim), "inconsistent" (the claim does not follow
#: from what ran), "finding" (established, not a statistical proof), "note" (information)
FINDING_LEVELS = ("violation", "refuted", "inconsistent", "finding", "note")


@dataclass(frozen=True)
class Finding:
    """Something a monitor established (``level`` in :data:`FINDING_LEVELS`). ``scope`` is
    :data:`~dpaudit_torch.registry.ONE_STEP` for a finding about the per-step guarantee (the
    report then states the per-step null it was tested against), else None."""

    monitor: str
    level: str
    message: str
    where: str | None = None
    scope: str | None = None
    #: the possible causes the message names with :func:`~.checks.causes_text` (e.g.
    #: ``("noise", "clipping", "scaling")``); the report's assembly words those another
    #: monitor's passed checks rule out as passed (not written to the report)
    causes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"monitor": self.monitor, "level": self.level, "message": self.message,
               "where": self.where}
        if self.scope is not None:
            out["scope"] = self.scope
        return out


@dataclass
class Evidence:
    """A monitor's betting evidence for the steps it processed at one check.

    ``log_e[s]`` is the log of its e-process after ``steps[s]``; ``extra`` holds per-step
    diagnostics of the same length that the wealth history records (the monitor's
    ``history_columns``, e.g. each tester's log-wealth, the sequential lower bound)."""

    steps: list[int]
    log_e: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Contribution:
    """A monitor's part of the report (after finalize).

    Attributes:
        section: its section ``audits[name]`` (plain types), or None for no section.
        bounds: epsilon lower bounds it computed, method (registered in
            :data:`dpaudit_torch.registry.BOUND_METHODS`) -> (bound, details).
        fields: top-level report fields it owns (e.g. the sequential tests' section, the
            one-run scores); two monitors owning one field is an error.
        canaries: entries it adds to the report's ``canaries`` section.
        verdict: ``"inconsistent"`` when it shows the claim does not follow from the training
            that ran; None otherwise (violations come from the decision, refutations from the
            bounds).
    """

    section: dict[str, Any] | None = None
    bounds: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    canaries: dict[str, Any] = field(default_factory=dict)
    verdict: str | None = None


@dataclass(frozen=True)
class MonitorConfig:
    """The base of every monitor's settings: frozen, built by :meth:`build`.

    A subclass lists its own fields with defaults. :meth:`build` fills a field from the user's
    options for this monitor first, then from the audit's setting of the same name (``alpha``,
    ``delta``, ``check_every``, ...), then the default; an unknown option is a ValueError naming
    it; an option whose default is a bool must be a bool (TypeError naming it). Validation goes
    in ``__post_init__``.

    A field ``alpha`` is filled with the audit's level for the monitor's proof path
    (``alpha_path``, :mod:`dpaudit_torch.audit.levels`: the sequential decision's share of the
    audit's ``alpha`` by default), and a field named ``<path>_alpha`` with that path's level,
    so that every proof the audit makes is within its share of ``alpha``."""

    #: the proof path (:data:`dpaudit_torch.audit.levels.PROOF_PATHS`) whose level fills
    #: ``alpha``
    alpha_path: ClassVar[str] = "decision"

    @classmethod
    def build(cls, audit: AuditConfig, options: Mapping[str, Any] | None = None
              ) -> MonitorConfig:
        from ..levels import PROOF_PATHS

        options = dict(options or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for {cls.__name__}; known: "
                             f"{sorted(names)}")
        for f in dataclasses.fields(cls):  # a switch takes True or False, not 0 / "no"
            if isinstance(f.default, bool) and f.name in options \
                    and not isinstance(options[f.name], bool):
                raise TypeError(f"option {f.name!r} of {cls.__name__} must be True or False, "
                                f"got {options[f.name]!r}")
        values = {n: getattr(audit, n) for n in names if n not in options and hasattr(audit, n)}
        if "alpha" in values:
            values["alpha"] = audit.level_of(cls.alpha_path)
        for path in PROOF_PATHS:
            if f"{path}_alpha" in names and f"{path}_alpha" not in options:
                values[f"{path}_alpha"] = audit.level_of(path)
        return cls(**values, **options)

    def to_dict(self) -> dict[str, Any]:
        """Plain types (lists for tuples), for checkpoints and the report."""

        def plain(v: Any) -> Any:
            if isinstance(v, (tuple, list)):
                return [plain(x) for x in v]
            if isinstance(v, Mapping):
                return {str(k): plain(x) for k, x in v.items()}
            return v

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass
class MonitorContext:
    """What a monitor is built with: the audit's configuration, the canary counts, the device,
    a way to warn, what the engine drew for the audit (the secret coins, the noise-audit
    coordinates) and the facts of the adapter.

    ``options`` is the monitor's own :class:`MonitorConfig` (set by :func:`build_monitors`);
    ``needs`` the facts it declared (set likewise); :meth:`fact` answers only those."""

    config: AuditConfig
    k_pairs: int
    m_canaries: int
    device: Any
    #: records a warning in the report (and logs it); repeated messages are kept once
    warn: Callable[[str], None]
    #: the secret IN/OUT coins of the one-run canaries (revealed at finalize)
    coins: Any = None
    #: per noise-audit coordinate: the index of its parameter tensor
    noise_tensor: Any = None
    #: per noise-audit coordinate: its flat index in that tensor
    noise_flat: Any = None
    #: the adapter's answers (or a mapping fact -> value); None: no adapter
    facts: FactSource | Mapping[Fact[Any], Any] | None = None
    options: Any = None
    needs: tuple[Fact[Any], ...] | None = None
    #: the one-run canaries' layout under per-layer clipping
    #: (:class:`~dpaudit_torch.canary_layers.LayerLayout`: m_canaries values of its members
    #: make its ``groups`` canaries); None: each one-run canary is one coordinate
    layout: Any = None
    #: whether the audit itself stopped training on a proven violation (``should_stop``; set by
    #: the engine, read at finalize, e.g. so that no warning advises training longer)
    stopped_training: Callable[[], bool] = lambda: False

    def fact(self, fact: Fact[T]) -> T:
        """The adapter's answer; :class:`~dpaudit_torch.contract.FactUnavailable` with the
        reason where it cannot answer; KeyError for a fact the monitor did not declare."""
        if self.needs is not None and fact not in self.needs:
            raise KeyError(f"{fact!r} was not declared in the monitor's needs")
        src = self.facts
        if src is None:
            raise FactUnavailable(fact, f"{fact.meaning}: no framework adapter answers it")
        if isinstance(src, Mapping):
            src = StaticFacts(src)
        return src.answer(fact)

    def fact_or(self, fact: Fact[T], default: Any = None) -> Any:
        """The adapter's answer, or ``default`` where it cannot answer."""
        try:
            return self.fact(fact)
        except FactUnavailable:
            return default

    def why_not(self, fact: Fact[Any]) -> str | None:
        """None where the fact is answered, else the reason it is not."""
        try:
            self.fact(fact)
        except FactUnavailable as e:
            return e.reason
        return None


class Monitor:
    """The base of every monitor (see the module docstring); every hook has a do-nothing
    default, so a monitor implements only what it uses."""

    #: set by :func:`register_monitor`
    name: ClassVar[str] = ""
    #: how the report names this monitor (with what its violation is about)
    label: ClassVar[str] = ""
    #: this monitor's settings
    config_class: ClassVar[type[MonitorConfig]] = MonitorConfig
    #: the facts it asks of the adapter
    needs: ClassVar[tuple[Fact[Any], ...]] = ()
    #: the per-step diagnostics its evidence carries (wealth-history columns)
    history_columns: ClassVar[tuple[str, ...]] = ()
    #: whether it sees steps whose values were dropped as non-finite
    observes_nonfinite: ClassVar[bool] = False

    def __init__(self, ctx: MonitorContext) -> None:
        self.ctx = ctx
        self.settings = ctx.options if ctx.options is not None else \
            self.config_class.build(ctx.config)

    def columns(self) -> tuple[str, ...]:
        """The history columns of this instance (a monitor whose columns depend on its settings
        overrides this)."""
        return tuple(self.history_columns)

    def metric_name(self, column: str) -> str:
        """The key under which a history column's latest value appears in the step metrics
        (``PrivacyAuditor.latest_metrics``, the trainer integrations' logs)."""
        return column

    def observe(self, record: StepRecord) -> None:
        return None

    def after_release(self, step: int | None) -> None:
        """The DP optimizer's update of training step ``step`` was applied (``None``: the audit
        (re)attaches here)."""
        return None

    def pending_tensors(self) -> list[torch.Tensor]:
        """The device tensors buffered since the last check that :meth:`advance` will read (the
        accelerator's path: finiteness flags, pairs, noise rows, ...; none on the CPU's host
        path). The engine copies every monitor's to the host in one transfer and hands them to
        :meth:`take_host_copies` before calling :meth:`advance`."""
        return []

    def take_host_copies(self, arrays: list[np.ndarray]) -> None:
        """Host copies (float64 NumPy arrays of the same shapes) of :meth:`pending_tensors`, in
        its order: the monitor puts them in place of those tensors in its buffers."""
        return None

    def fetch_pending(self) -> None:
        """Copy what :meth:`pending_tensors` still lists to the host (one transfer) and take
        the copies: the start of ``advance`` where the engine did not already (a monitor driven
        by hand; nothing to do after the engine's check)."""
        pending = self.pending_tensors()
        if pending:
            self.take_host_copies(host_copies(pending))

    def advance(self) -> Evidence | None:
        return None

    def discard_pending(self) -> list[int]:
        """Drop what was buffered since the last check (a non-finite step was found there);
        returns the steps dropped."""
        return []

    def finalize(self, claimed_epsilon: float | None) -> None:
        return None

    def findings(self) -> list[Finding]:
        return []

    def contribution(self) -> Contribution:
        return Contribution()

    def check_section(self) -> CheckSection:
        """This monitor's section of the report's ``checks`` (after :meth:`finalize`): what it
        checked, what it measured, and what it did not check and why (docs/report.md, "Checks
        by monitor"); its status and findings are added by the report's assembly. The default
        says only that the monitor ran; every registered monitor overrides it."""
        return CheckSection(self.label or self.name)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        return None


def host_flags(flags: list[Any]) -> list[bool]:
    """The buffered steps' finiteness flags as bools (docs/auditor.md, "On a GPU"): a flag is a
    bool on the host path and a device tensor on the accelerator path; the tensors are stacked
    and read back in one transfer, not one host read per flag."""
    tensors = [f.reshape(()) for f in flags if isinstance(f, torch.Tensor)]
    if not tensors:
        return [bool(f) for f in flags]
    read = iter(torch.stack(tensors).tolist())
    return [bool(next(read)) if isinstance(f, torch.Tensor) else bool(f) for f in flags]


def host_copies(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Float64 host copies (NumPy arrays, the tensors' shapes) of ``tensors``, in one transfer
    per device that holds any (one on an accelerator: the check's one host synchronisation;
    docs/auditor.md, "On a GPU"): every tensor is flattened and converted to float64 on its
    device (booleans, integer counts up to 2^53, float16/bfloat16/float32 values are exact in
    float64), concatenated, and the whole is copied once. A tensor listed twice (the same
    finiteness flag buffered by several monitors) is copied once."""
    out: list[np.ndarray | None] = [None] * len(tensors)
    first: dict[int, int] = {}  # id(tensor) -> its first position
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        j = first.setdefault(id(t), i)
        if j == i:
            by_device.setdefault(t.device, []).append(i)
    for idx in by_device.values():
        flat = torch.cat([tensors[i].detach().reshape(-1).to(torch.float64) for i in idx])
        host = flat.numpy(force=True)  # the one device-to-host copy (a wait on a device)
        pos = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = host[pos:pos + n].reshape(tuple(tensors[i].shape))
            pos += n
    return [out[first[id(t)]] for t in tensors]  # type: ignore[misc]


def plain_state(obj: Any) -> Any:
    """Numpy scalars -> Python numbers, numpy arrays -> tensors (lossless), recursively, so that
    a state loads with ``torch.load(weights_only=True)``."""
    if isinstance(obj, dict):
        return {k: plain_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain_state(v) for v in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


#: name -> class of every monitor the engine knows, in the order they run
MONITORS: dict[str, type[Monitor]] = {}
#: the names that run unless the configuration says otherwise
_DEFAULT: list[str] = []


def register_monitor(name: str, *, default: bool = True) -> Callable[[type], type]:
    """Class decorator: register a :class:`Monitor` subclass under ``name`` (it runs by default
    unless ``default=False``; users add or disable monitors by name in ``AuditConfig``)."""

    def deco(cls: type) -> type:
        if name in MONITORS:
            raise ValueError(f"a monitor named {name!r} is already registered")
        if not (isinstance(cls, type) and issubclass(cls, Monitor)):
            raise TypeError(f"monitor {name!r} must subclass audit.monitors.Monitor")
        cls.name = name
        if not cls.label:
            cls.label = name.replace("_", " ")
        MONITORS[name] = cls
        if default:
            _DEFAULT.append(name)
        return cls

    return deco


def monitor_names(config: AuditConfig | None = None) -> tuple[str, ...]:
    """The monitors an audit with ``config`` runs, in registry order: ``config.monitors`` (or
    every default one), with ``config.disable_monitors`` taken out. ValueError naming an
    unknown monitor."""
    chosen = list(_DEFAULT) if config is None or config.monitors is None else \
        list(config.monitors)
    disabled = () if config is None else config.disable_monitors
    options = {} if config is None else config.monitor_options
    unknown = sorted({*chosen, *disabled, *options} - set(MONITORS))
    if unknown:
        raise ValueError(f"unknown monitor(s) {unknown}; registered: {sorted(MONITORS)}")
    return tuple(n for n in MONITORS if n in chosen and n not in disabled)


def build_monitors(ctx: MonitorContext, names: tuple[str, ...] | None = None
                   ) -> dict[str, Monitor]:
    """Instances of the monitors ``names`` (default: :func:`monitor_names` of the context's
    configuration), in registry order, each with its own settings and declared facts."""
    chosen = monitor_names(ctx.config) if names is None else tuple(names)
    unknown = [n for n in chosen if n not in MONITORS]
    if unknown:
        raise ValueError(f"unknown monitor(s) {unknown}; registered: {sorted(MONITORS)}")
    out: dict[str, Monitor] = {}
    for n in MONITORS:
        if n not in chosen:
            continue
        cls = MONITORS[n]
        own = cls.config_class.build(ctx.config, ctx.config.monitor_options.get(n))
        out[n] = cls(dataclasses.replace(ctx, options=own, needs=tuple(cls.needs)))
    return out
