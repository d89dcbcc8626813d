"""Readable labels for the keys of the report's record sections (``training``,
``interference``), as the page shows them: the label, with the key beside it in small code so
that it can be found in ``audit.json`` (docs/report.md documents each key). A key this version
has no label for is shown as it is."""

from __future__ import annotations

from typing import Any

from .markup import esc, generic

__all__ = ["TRAINING_LABELS", "INTERFERENCE_LABELS", "labelled"]

#: ``training`` key -> label
TRAINING_LABELS = {
    "noise_multiplier": "Noise multiplier σ (what the accountant is told)",
    "effective_noise_multiplier": "Noise multiplier of the noise actually added",
    "max_grad_norm": "Clipping norm C",
    "sample_rate": "Sample rate q",
    "expected_batch_size": "Expected batch size",
    "steps": "Steps the accountant counted",
    "world_size": "Processes (world size)",
    "sharding": "Parameter sharding",
    "optimizer": "Optimizer",
    "grad_sample_mode": "Per-sample gradients",
    "clipping": "Clipping",
    "loss_reduction": "Loss reduction",
    "audited_steps": "Steps the auditor observed",
    "nonfinite_steps_skipped": "Steps dropped as non-finite",
    "audit_incomplete_from_step": "Audit incomplete from step",
    "steps_at_attach": "Accountant steps before the auditor attached",
    "claimed_epsilon_history": "Claimed ε over training [accountant steps, ε]",
    "architecture_hash": "Model architecture hash",
}

#: ``interference`` key -> label
INTERFERENCE_LABELS = {
    "units": "Units",
    "coordinates": "Coordinates summarised",
    "read_every_steps": "Read every (steps)",
    "removed": "Subtracted from the observations",
    "source": "Read from",
    "observation_std": "Standard deviation of the observation (non-canary coordinate)",
    "std_from_observation_minus_noise": "Part of it not explained by the noise "
                                        "(√max(variance − σ², 0))",
    "mean": "Mean of the real-data gradient",
    "std": "Standard deviation of the real-data gradient",
    "rms": "Root mean square of the real-data gradient",
    "max_abs": "Largest magnitude of the real-data gradient",
    "n": "Values read",
}


def labelled(data: dict[str, Any], labels: dict[str, str]) -> str:
    """``data`` as a key-value table whose rows are headed by their labels (the key beside
    each, in small code)."""
    rows = "".join(
        f'<tr data-key="{esc(k)}"><th>{esc(labels[k])} <small><code>{esc(k)}</code></small>'
        f"</th><td>{generic(v, 1)}</td></tr>" if k in labels else
        f'<tr data-key="{esc(k)}"><th>{esc(k)}</th><td>{generic(v, 1)}</td></tr>'
        for k, v in data.items())
    return f'<table class="kv">{rows}</table>'
