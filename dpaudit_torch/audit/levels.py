"""Two levels of evidence: the proof level ``alpha`` split among the proof paths, and the
evidence level ``alpha_warn`` (docs/design.md, "Two levels of evidence").

A **proof** ("violation proven", "claim refuted", "claim inconsistent") is made at ``alpha``
(default 1e-3) in total: the probability that a correct run gets ANY false proof, by any path,
is at most ``alpha``. The paths are:

* ``decision``: the sequential decision's e-process (the average of every betting monitor's
  e-process) against 1/alpha_decision, Ville's inequality;
* ``whitebox``: the white-box release bound above the claim (its own level);
* ``steinke``: the Steinke-Nasr-Jagielski one-run bound above the claim;
* ``consistency``: the accounting monitor's confidence intervals (rate and noise multiplier),
  whose conservative ends give an epsilon above the claim.

Every other verdict is either deterministic (the setup monitor's step count) or not a proof
(the f-DP and per-step bounds never refute; a monitor's own crossing is not the decision). By
the union bound (Bonferroni), P(any false proof) <= sum of the paths' levels = alpha x sum of
:data:`PROOF_SHARES` = alpha. The shares are fixed, not data-dependent, so the split is valid
whatever the run shows.

**Evidence** of a violation is the same decision e-process at the lower threshold
1/alpha_warn (default 0.05): by Ville's inequality, P(a correct run ever shows evidence) <=
alpha_warn. It is reported, never acted on unless ``stop_on="evidence"``.

Checkpoints written before the two levels (``level_split`` absent from their fingerprint)
resume with :data:`PER_PATH`: each proof path at the checkpoint's own alpha, the white-box bound
at its own fixed level :data:`LEGACY_WHITEBOX_ALPHA`, as that release decided.
"""

from __future__ import annotations

__all__ = ["PROOF_SHARES", "PROOF_PATHS", "UNION", "PER_PATH", "LEVEL_SPLITS",
           "LEGACY_WHITEBOX_ALPHA", "DEFAULT_ALPHA", "DEFAULT_ALPHA_WARN", "STOP_ON",
           "path_level", "path_levels", "total_level"]

#: the proof level of a new audit (every proof path together)
DEFAULT_ALPHA = 1e-3
#: the level of "evidence of a violation" (the decision's e-process at 1/alpha_warn)
DEFAULT_ALPHA_WARN = 0.05
#: alpha split among the paths (the union bound): the sequential decision gets half (it is
#: the path that decides during training, and its threshold only grows as log(1/level): half
#: of alpha costs log(2) = 0.69 of log-wealth on top of log(1/alpha) = 6.9); the white-box
#: bound a quarter (the default bound); the Steinke bound and the consistency intervals an
#: eighth each
PROOF_SHARES: dict[str, float] = {"decision": 0.5, "whitebox": 0.25, "steinke": 0.125,
                                  "consistency": 0.125}
PROOF_PATHS = tuple(PROOF_SHARES)
#: the split of this release: alpha divided among the paths by :data:`PROOF_SHARES`
UNION = "union"
#: the checkpoints of the release before the two levels: every path at alpha (the white-box
#: bound at :data:`LEGACY_WHITEBOX_ALPHA`), as that release made its proofs
PER_PATH = "per_path"
LEVEL_SPLITS = (UNION, PER_PATH)
#: the white-box bound's fixed level before the two levels
LEGACY_WHITEBOX_ALPHA = 1e-3
#: which level acts (``on_violation``'s stop / raise / warn): the proof (default) or evidence
STOP_ON = ("proof", "evidence")


def path_level(alpha: float, path: str, split: str = UNION) -> float:
    """The level proof path ``path`` is decided at, for an audit at total level ``alpha``.

    Raises:
        ValueError: an unknown path or split (naming it).
    """
    if path not in PROOF_SHARES:
        raise ValueError(f"proof path must be one of {PROOF_PATHS}, got {path!r}")
    if split == UNION:
        return float(alpha) * PROOF_SHARES[path]
    if split == PER_PATH:
        return LEGACY_WHITEBOX_ALPHA if path == "whitebox" else float(alpha)
    raise ValueError(f"level_split must be one of {LEVEL_SPLITS}, got {split!r}")


def path_levels(alpha: float, split: str = UNION) -> dict[str, float]:
    """Every proof path's level (:func:`path_level`)."""
    return {p: path_level(alpha, p, split) for p in PROOF_PATHS}


def total_level(levels: dict[str, float]) -> float:
    """The union bound on P(any false proof): the sum of the paths' levels."""
    return float(sum(levels.values()))
