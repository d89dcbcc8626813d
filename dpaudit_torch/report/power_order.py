"""The power aspects of the strength order: how much evidence an audit gathered and how much it
could refute, each relative to its own claim (docs/auditor.md, "How strong an audit is").

An audit is at least as strong as another only if it can also refute as much. Four aspects,
read from a report's own fields (:func:`power_fields`) and compared by :func:`power_relation`:

* **steps observed** (``training.audited_steps``): more steps are more evidence;
* **q T** (``mean_inclusions``: how often an IN canary was included on average, the sample rate
  times the steps; ``power.mean_inclusions``, else ``training.sample_rate`` times the steps
  observed): the one-run bounds' signal grows with it;
* **expected bound / claim** (``power.expected_bound`` over the claim): the median bound a
  correct implementation with the run's settings gives, as a fraction of what it claims;
  larger is stronger;
* **smallest refutable epsilon / claim** (``power.min_refutable_epsilon`` over the claim): the
  smallest true epsilon the audit refutes with the target power, as a multiple of the claim;
  smaller is stronger, and an audit that cannot refute the claim at any epsilon it searched
  (``min_refutable_epsilon`` null in a power statement that was made) has ratio infinity.

The two power numbers carry their own error, so a difference within a stated tolerance is no
difference (:data:`EXPECTED_ATOL`, :data:`SE_FACTOR`, :data:`REFUTABLE_RTOL`):

* the white-box statement (``mode`` ``"law"``) is exact given the number of IN canaries, which
  the coins draw afresh every run: over +-3 standard deviations of that count the expected bound
  moves by at most 0.014 of the claim and the refutable epsilon by at most 7 % (measured at
  m = 200 to 1000 canaries, T = 30 to 300 steps, q = 0.05 to 0.125); the root finders add 0.2 %
  in sigma and the accountant its 0.01 in epsilon;
* a simulated statement (``"exact"``, ``"approx"``) adds the Monte Carlo error of a median of
  ``replicates`` games, estimated from its own 10 % and 90 % quantiles (a normal law's median
  has standard error 1.2533 s / sqrt(n), and s = (q90 - q10) / 2.5631); its search for the
  refutable epsilon uses the same seed at every sigma, so two audits of the same settings give
  the same numbers.

Pure functions of plain values; no torch, no NumPy (``dpaudit gate`` imports neither).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["POWER_ASPECTS", "POWER_LABELS", "EXPECTED_ATOL", "SE_FACTOR", "REFUTABLE_RTOL",
           "power_fields", "power_relation", "power_sentence"]

#: the power aspects of the strength order, in the order they are compared and reported
POWER_ASPECTS = ("steps_observed", "mean_inclusions", "expected_ratio", "refutable_ratio")
#: how the power keys of the fingerprint are named in words
POWER_LABELS = {
    "mean_inclusions": "IN inclusions per canary (q T)",
    "expected_ratio": "expected bound / claim (power)",
    "expected_ratio_se": "simulation error of expected bound / claim",
    "refutable_ratio": "smallest refutable epsilon / claim (power)",
}
#: two expected bounds whose ratios to their claims differ by at most this (plus the simulation
#: error) are the same power
EXPECTED_ATOL = 0.05
#: standard errors of a simulated expected bound allowed on top of :data:`EXPECTED_ATOL`
SE_FACTOR = 3.0
#: two smallest refutable epsilons whose ratios to their claims differ by at most this factor
#: (1 + rtol) are the same power
REFUTABLE_RTOL = 0.10
#: a normal law's median: standard error 1.2533 s / sqrt(n); s = (q90 - q10) / 2.5631
_MEDIAN_SE, _Q10_Q90_WIDTH = 1.2533, 2.5631

SAME, STRONGER, WEAKER = "same", "stronger", "weaker"


def _number(v: Any) -> float | None:
    """A finite number, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _claim(d: Mapping[str, Any], power: Mapping[str, Any]) -> float | None:
    c = _number(power.get("claimed_epsilon"))
    if c is None:
        c = _number(d.get("claimed_epsilon"))
    return c if c is not None and c > 0 else None


def _simulation_se(power: Mapping[str, Any], claim: float) -> float:
    """Standard error of the simulated expected bound over the claim (0 for the exact law)."""
    n = power.get("replicates")
    qs = power.get("expected_bound_quantiles")
    if power.get("mode") == "law" or not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return 0.0
    if not (isinstance(qs, list) and len(qs) == 2):
        return 0.0
    lo, hi = _number(qs[0]), _number(qs[1])
    if lo is None or hi is None:
        return 0.0
    return _MEDIAN_SE * abs(hi - lo) / _Q10_Q90_WIDTH / math.sqrt(n) / claim


def power_fields(d: Mapping[str, Any]) -> dict[str, float | None]:
    """The fingerprint's power values of a report dict: ``mean_inclusions``,
    ``expected_ratio``, ``expected_ratio_se`` and ``refutable_ratio`` (None where the report
    does not say; module docstring)."""
    power = d.get("power")
    power = power if isinstance(power, Mapping) else {}
    training = d.get("training")
    training = training if isinstance(training, Mapping) else {}
    qt = _number(power.get("mean_inclusions"))
    if qt is None:
        q, steps = _number(training.get("sample_rate")), _number(training.get("audited_steps"))
        qt = q * steps if q is not None and steps is not None else None
    out: dict[str, float | None] = {"mean_inclusions": qt, "expected_ratio": None,
                                    "expected_ratio_se": None, "refutable_ratio": None}
    claim = _claim(d, power)
    if claim is None or not power:
        return out
    no_power = power.get("no_power") is True
    eb = _number(power.get("expected_bound"))
    if no_power:
        out["expected_ratio"], out["expected_ratio_se"] = 0.0, 0.0
    elif eb is not None:
        out["expected_ratio"] = eb / claim
        out["expected_ratio_se"] = _simulation_se(power, claim)
    mre = _number(power.get("min_refutable_epsilon"))
    if mre is not None and not no_power:
        out["refutable_ratio"] = mre / claim
    elif no_power or eb is not None:  # a statement was made and found no refutable epsilon
        out["refutable_ratio"] = math.inf
    return out


def _ordered(new: float, old: float, larger_is_stronger: bool = True) -> str:
    if new == old:
        return SAME
    return STRONGER if (new > old) == larger_is_stronger else WEAKER


def power_relation(aspect: str, new: Any, old: Any, new_se: Any = None,
                   old_se: Any = None) -> str:
    """The relation of the new audit's value to the old one's in a power aspect (both not
    None): ``"same"``, ``"stronger"`` or ``"weaker"``, within the tolerances of the module."""
    if aspect == "steps_observed":
        return _ordered(int(new), int(old))
    if aspect == "mean_inclusions":
        if math.isclose(new, old, rel_tol=1e-9, abs_tol=1e-12):
            return SAME
        return _ordered(new, old)
    if aspect == "expected_ratio":
        tol = EXPECTED_ATOL + SE_FACTOR * math.hypot(_number(new_se) or 0.0,
                                                     _number(old_se) or 0.0)
        if abs(new - old) <= tol:
            return SAME
        return _ordered(new, old)
    if aspect == "refutable_ratio":
        if new == old:  # both infinite included
            return SAME
        if math.isinf(new) or math.isinf(old):
            return _ordered(new, old, larger_is_stronger=False)
        if new <= old * (1.0 + REFUTABLE_RTOL) and old <= new * (1.0 + REFUTABLE_RTOL):
            return SAME
        return _ordered(new, old, larger_is_stronger=False)
    raise ValueError(f"not a power aspect: {aspect!r}")


def _ratio(v: float, unit: str) -> str:
    return "cannot refute the claim" if math.isinf(v) else f"{v:.3g}{unit}"


def power_sentence(aspect: str, new: Any, old: Any) -> str:
    """The power aspect's change in words, with both numbers and the tolerance."""
    if aspect == "steps_observed":
        return f"steps observed: {old} -> {new}"
    if aspect == "mean_inclusions":
        return f"IN inclusions per canary (q T): {old:.4g} -> {new:.4g}"
    if aspect == "expected_ratio":
        return (f"expected bound (power): {_ratio(old, ' x the claim')} -> "
                f"{_ratio(new, ' x the claim')} (tolerance {EXPECTED_ATOL:g} x the claim plus "
                f"{SE_FACTOR:g} simulation standard errors)")
    return (f"smallest refutable epsilon (power): {_ratio(old, ' x the claim')} -> "
            f"{_ratio(new, ' x the claim')} (tolerance {100 * REFUTABLE_RTOL:g} %)")
