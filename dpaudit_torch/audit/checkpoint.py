"""The checkpoint of a :class:`~dpaudit_torch.audit.auditor.PrivacyAuditor`: its layout, its
versions and the migration of older ones (docs/auditor.md, "Checkpoints").

Layout version 3 (this release)::

    {"version": 3,
     "config": the settings a resumed audit must share (AuditConfig + adapter fingerprint),
     "seed_policy": ..., "design": the canary design, "coins": the secret IN/OUT coins,
     "noise_coords": the noise-audit coordinates,
     "tap": the adapter's state (OpacusTap.state_dict: the mechanics' generator position,
            the injector's counters, reads, the accountant's steps at attach),
     "engine": {"monitors": {name: state}, "monitor_settings": {name: settings},
                "decision": ..., "counters": ..., "claimed": ...},
     "warnings": [...]}

Version 2 (the previous release) kept the adapter's and the engine's entries at the top level;
it is migrated on load. Version 1 (before the engine was split into monitors) is refused with a
message naming it.

Resuming with another set of monitors: the monitors both share are resumed (each checked
against its own settings); a monitor the checkpoint lacks starts fresh, reports from the
resume on and does not bet in the decision (a process that joins the average mid-run would
void its level); a monitor the checkpoint has and this audit does not run keeps its last
e-value in the decision's average (a constant e-process), so the average stays one
e-process over the same monitors. Each case gets a note in the report's warnings.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..canaries import CanaryDesign, SecretCoins
from ..canary_layers import layout_of
from .config import DEFAULT_NOISE_COORDINATES_TOTAL, AuditConfig
from .engine import AuditEngine
from .levels import DEFAULT_ALPHA, DEFAULT_ALPHA_WARN, PER_PATH
from .monitors import Monitor, build_monitors

if TYPE_CHECKING:  # pragma: no cover
    from .auditor import PrivacyAuditor

logger = logging.getLogger(__name__)

__all__ = ["STATE_VERSION", "READS", "write_state", "load_state", "migrate"]

#: the layout this release writes
STATE_VERSION = 3
#: the layouts this release reads
READS = (2, 3)


def write_state(aud: PrivacyAuditor) -> dict[str, Any]:
    """The checkpoint of ``aud`` (tensors and plain types; ``torch.save``-able), between
    steps only."""
    inj = aud.tap.injector
    if inj is not None and inj.in_step:
        raise RuntimeError("state_dict() called inside an optimizer step; call it between steps")
    mask, revealed = aud.coins.state()
    return {
        "version": STATE_VERSION,
        "config": fingerprint(aud.config, aud),
        "seed_policy": aud.seed_policy,
        "design": aud.design.to_state(),
        "coins": {"in": mask, "revealed": revealed},
        "noise_coords": {"param": aud.noise_coords[0].clone(),
                         "flat": aud.noise_coords[1].clone()},
        "tap": aud.tap.state_dict(),
        "engine": aud.engine.state_dict(),
        "warnings": list(aud.warnings),
    }


def fingerprint(config: AuditConfig, aud: PrivacyAuditor) -> dict[str, Any]:
    """What a checkpoint's run must share with the auditor that loads it."""
    return {**config.fingerprint(), **aud.tap.fingerprint()}


def migrate(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` in this release's layout (a copy where it was older); ValueError for a state that
    is not an auditor's or whose version this release does not read."""
    if not isinstance(sd, dict) or "config" not in sd or "version" not in sd:
        raise ValueError("not a PrivacyAuditor state_dict (no 'config'/'version' entries)")
    version = sd["version"]
    if version not in READS:
        raise ValueError(f"PrivacyAuditor state_dict version {version!r} is not supported (this "
                         f"version reads {' and '.join(map(str, READS))}); resume it with the "
                         f"dpaudit_torch release that wrote it, or start a new audit")
    if version == 3:
        return sd
    c = sd["counters"]
    return {
        "version": 3, "config": sd["config"], "seed_policy": sd["seed_policy"],
        "design": sd["design"], "coins": sd["coins"], "noise_coords": sd["noise_coords"],
        "tap": {"mechanics_rng": sd["mechanics_rng"], "mechanics_pos": sd["mechanics_pos"],
                "mechanics_unit": sd.get("mechanics_unit"), "injector": sd["injector"],
                "reads": c["reads"], "steps_at_attach": c["steps_at_attach"]},
        "engine": {"monitors": sd["monitors"], "monitor_settings": {},
                   "decision": sd["decision"], "counters": c, "claimed": sd["claimed"]},
        "warnings": sd["warnings"],
    }


def _config_of_state(cfg: AuditConfig, theirs: dict[str, Any]) -> AuditConfig:
    """This auditor's configuration as a checkpoint's fingerprint ``theirs`` needs it: a
    checkpoint written before ``noise_coordinates_total`` existed drew its noise-audit
    coordinates uncapped; where this auditor has the default cap, it resumes with None (the
    coordinates themselves come from the checkpoint), so that a later default does not orphan
    the checkpoints of an earlier release. A cap set to another value is compared as any other
    setting."""
    if "noise_coordinates_total" not in theirs and \
            cfg.noise_coordinates_total == DEFAULT_NOISE_COORDINATES_TOTAL:
        return cfg.replace(noise_coordinates_total=None)
    return cfg


def _levels_of_state(cfg: AuditConfig, theirs: dict[str, Any]
                     ) -> tuple[AuditConfig, dict[str, Any], str | None]:
    """A checkpoint written before the two levels of evidence (its fingerprint lacks
    ``level_split``) resumes at its own level, as that release made its proofs: every proof
    path at the checkpoint's alpha (the white-box bound at its fixed 1e-3), evidence at that
    same level (:data:`~dpaudit_torch.audit.levels.PER_PATH`). Where this auditor has the
    default levels, it takes the checkpoint's alpha; an alpha set to another value is compared
    as any other setting. Returns the configuration, the checkpoint's fingerprint completed
    with the new settings, and a note for the report (None for a checkpoint of this
    release)."""
    if "level_split" in theirs:
        return cfg, theirs, None
    alpha = cfg.alpha
    if (cfg.alpha, cfg.alpha_warn, cfg.level_split) == (DEFAULT_ALPHA, DEFAULT_ALPHA_WARN,
                                                        "union") and "alpha" in theirs:
        alpha = float(theirs["alpha"])
    new = cfg.replace(alpha=alpha, alpha_warn=max(cfg.alpha_warn, alpha), level_split=PER_PATH)
    theirs = {**theirs, "alpha_warn": new.alpha_warn, "stop_on": new.stop_on,
              "level_split": PER_PATH}
    note = (f"this checkpoint was written before the two levels of evidence: the audit "
            f"resumes at its own level, alpha = {alpha:g} for each proof path as that release "
            f"decided (the white-box bound at {new.level_of('whitebox'):g}), evidence at "
            f"alpha_warn = {new.alpha_warn:g}; a new audit makes its proofs at alpha = "
            f"{DEFAULT_ALPHA:g} in total")
    return new, theirs, note


def _settings_of_state(theirs: dict[str, Any], m: Monitor) -> dict[str, Any]:
    """A checkpoint's settings of monitor ``m`` as this auditor compares them with its own: a
    setting the checkpoint lacks (written before the setting existed, e.g. the sequential
    monitor's ``tester_placement``) is taken as this auditor's where this auditor has the
    setting's default, so that a new setting does not orphan the checkpoints of an earlier
    release; one set to another value is compared as any other."""
    out = dict(theirs)
    for f in dataclasses.fields(m.settings):
        if f.name in out:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        if getattr(m.settings, f.name) == default:
            out[f.name] = m.settings.to_dict()[f.name]
    return out


def load_state(aud: PrivacyAuditor, sd: dict[str, Any]) -> None:
    """Resume ``aud`` from ``sd``: validates and builds everything first (an error leaves the
    auditor as it was), then swaps the parts in."""
    sd = migrate(sd)
    config, theirs, level_note = _levels_of_state(aud.config, sd["config"])
    config = _config_of_state(config, theirs)
    mine = fingerprint(config, aud)
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if diff:
        raise ValueError(
            "PrivacyAuditor state_dict was made for a different model or configuration; "
            "differs in " + ", ".join(f"{k} (state: {theirs.get(k)!r}, this auditor: "
                                      f"{mine.get(k)!r})" for k in diff))
    design = CanaryDesign.from_state(sd["design"])
    if [list(s) for s in design.shapes] != [list(s) for s in aud.tap.shapes] or (
            design.k_pairs, design.m_canaries) != (config.k_pairs, config.m_canaries):
        raise ValueError("PrivacyAuditor state_dict: its canary design does not fit this "
                         "model's parameters / canary counts")
    coins = SecretCoins.from_state(sd["coins"]["in"], sd["coins"]["revealed"])
    if coins.m != config.m_canaries:
        raise ValueError(f"PrivacyAuditor state_dict: {coins.m} secret coins for "
                         f"m_canaries={config.m_canaries}")
    mechanics = aud.tap.mechanics_of_state(sd["tap"])
    noise_coords = (sd["noise_coords"]["param"], sd["noise_coords"]["flat"])
    esd = sd["engine"]
    notes: list[str] = [] if level_note is None else [level_note]
    saved_warnings = list(aud.warnings)
    try:  # building testers may warn; the state's own warnings replace them below
        ctx = aud.monitor_context(coins, noise_coords, config)
        ctx.layout = layout_of(design)  # the checkpoint's layered canaries, if any
        monitors = build_monitors(ctx)
        saved, settings = esd["monitors"], esd.get("monitor_settings", {})
        for name, m in monitors.items():
            if name not in saved:
                continue
            if name in settings and _settings_of_state(settings[name], m) != \
                    m.settings.to_dict():
                raise ValueError(f"PrivacyAuditor state_dict: monitor {name!r} was run with "
                                 f"settings {settings[name]}, this auditor's are "
                                 f"{m.settings.to_dict()}")
            m.load_state_dict(saved[name])
        engine = AuditEngine(config, monitors, aud.warn)
        decision = engine.decision
        decision.load_state_dict(esd["decision"], lenient=True)
        step = int(esd["counters"]["step"])
        for name in monitors:
            if name not in saved:
                decision.excluded.add(name)
                notes.append(f"monitor {name!r} is not in the checkpoint: it started fresh at "
                             f"the resume (audited step {step}); its findings cover the steps "
                             f"from there, and it does not bet in the decision")
        for name in saved:
            if name not in monitors:
                if name not in decision.excluded:  # one that never bet stays out
                    decision.freeze(name)
                notes.append(f"monitor {name!r} of the checkpoint is not run by this audit: "
                             f"its evidence up to audited step {step} stays in the decision "
                             f"(frozen), its findings are not reported")
    finally:
        aud.warnings = saved_warnings
    # ---- commit
    was_attached = aud.attached
    aud.tap.detach()
    aud.config = config
    aud.design, aud.coins, aud.noise_coords = design, coins, noise_coords
    aud.seed_policy = str(sd["seed_policy"])
    aud.engine.restore(config, monitors, decision, esd)
    aud.tap.build(design, coins, mechanics, config.canary_norm, aud.device,
                  aud.on_internal_failure, noise_coords)
    aud.tap.load_state_dict(sd["tap"], draws_per_step=config.k_pairs + config.m_canaries)
    if was_attached:
        aud.tap.attach(aud, aud.observe_hook, post_hook=aud.engine.after_release,
                       compiled=bool(aud.config.compiled_kernels))
    aud.warnings = list(sd["warnings"])
    for note in notes:
        aud.warn(note)
    logger.info("PrivacyAuditor resumed at audited step %d", aud.engine.step)
