"""Building an :class:`~dpaudit_torch.report.AuditReport` from the parts of an audit.

The engine hands over what each part produced (the monitors' bounds and sections, the decision,
the adapter's facts about the training); this module applies the rules that turn them into a
verdict, which live in :mod:`dpaudit_torch.registry`: only a bound whose method may refute (a
family-free bound on the whole run) can make ``claim_refuted`` true, and a bound above the claim
that may not refute is explained in the warnings instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..registry import BOUND_METHODS, WHOLE_RUN, refuting_methods
from .audit_report import AuditReport
from .checks import with_status
from .fingerprint import fingerprint_of

__all__ = ["BoundResult", "build_report", "THREAT_MODEL_NOTES"]

#: what every white-box audit report says about its threat model
THREAT_MODEL_NOTES = (
    "white-box: the auditor inserts gradient canaries and reads every step's noisy gradient "
    "before the update (the DP-SGD threat model of the accountant)",
    "sequential audit: per-step pairs with randomized roles; valid whatever the real-data "
    "gradients (interference costs power, not validity)",
)

#: (bound, details) of one method
BoundResult = tuple[float, dict[str, Any]]


def _order(bounds: Mapping[str, BoundResult]) -> list[str]:
    known = [m for m in BOUND_METHODS if m in bounds]
    return known + [m for m in bounds if m not in BOUND_METHODS]


def build_report(*, claimed_epsilon: float | None, bounds: Mapping[str, BoundResult],
                 warnings: list[str], threat_notes: list[str], every_step_observed: bool,
                 clipping_exercised: bool, findings: list[dict[str, Any]] | None = None,
                 **fields: Any) -> AuditReport:
    """The report of one audit.

    Args:
        claimed_epsilon: the accountant's epsilon at the report's delta (None if unknown).
        bounds: method -> (lower bound, details), for every method computed.
        warnings: the audit's warnings so far (a copy is extended and stored).
        threat_notes: notes on what the canaries exercise (added after the standard ones).
        every_step_observed, clipping_exercised: the threat model's flags.
        findings: the monitors' findings (dicts with monitor, level, message, where, and
            optionally scope); a "refuted" finding is added for every bound that refutes the
            claim.
        **fields: every other :class:`AuditReport` field, as is (e.g. ``monitor_labels``: how
            the report names each monitor). The ``fingerprint`` is read from the others
            (:func:`~dpaudit_torch.report.fingerprint.fingerprint_of`) unless given.
    """
    order = _order(bounds)
    eps = {m: float(bounds[m][0]) for m in order}
    refuting = refuting_methods(eps, claimed_epsilon, {m: bounds[m][1] for m in order})
    notes = list(warnings)
    if claimed_epsilon is not None and not refuting:
        for m in order:
            spec = BOUND_METHODS.get(m)
            if (spec is not None and spec.scope == WHOLE_RUN and not spec.family_free
                    and eps[m] > claimed_epsilon):
                why = (f"it assumes the {spec.family} family, which this run's data did not "
                       f"verify" if spec.refutes_if_verified
                       else f"it assumes the {spec.family} trade-off family")
                notes.append(
                    f"the {spec.label} bound {eps[m]:.4g} exceeds the claimed epsilon "
                    f"{claimed_epsilon:.4g}; {why}, so it is not used to refute the claim")
    found = list(findings or [])
    for m in refuting:
        spec = BOUND_METHODS[m]
        found.insert(0, {"monitor": spec.monitor or m, "level": "refuted",
                         "message": f"the {spec.label} lower bound {eps[m]:.4g} on the whole "
                                    f"run's epsilon exceeds the claimed epsilon "
                                    f"{claimed_epsilon:.4g}", "where": "the whole training run"})
    if "checks" in fields:  # each monitor's section, with its status from the findings
        fields["checks"] = with_status(fields["checks"], found)
    report = AuditReport(
        findings=found,
        claimed_epsilon=claimed_epsilon,
        epsilon_lower_bounds=eps,
        lower_bound_details={m: bounds[m][1] for m in order},
        claim_refuted=bool(refuting),
        threat_model={"white_box": True, "every_step_observed": every_step_observed,
                      "clipping_exercised": clipping_exercised,
                      "notes": [*THREAT_MODEL_NOTES, *threat_notes]},
        warnings=notes,
        **fields,
    )
    if not report.fingerprint:  # what the audit was, read from the fields just set
        report.fingerprint = fingerprint_of(report).to_dict()
    return report
