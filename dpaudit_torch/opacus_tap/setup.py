"""Setup coherence: do the engine, optimizer, data loader and accountant belong together?
(docs/design.md, "Setup coherence").

The auditor is handed a ``PrivacyEngine``, the DP optimizer and a data loader. Only the optimizer
is certainly the training's (its step releases the gradients the audit reads). The rest is
checked against it, from what the optimizer itself holds:

* **the accountant.** ``make_private`` attaches to the optimizer a *step hook*, a closure of the
  engine's accountant (``get_optimizer_hook_fn``) over the sample rate it computed from the
  training loader; the optimizer calls it at every release. The hook names the accountant that
  really counts this training and the rate it is told. An engine whose accountant is not the
  hook's is certainly the wrong engine: refused at attach. No hook: nothing counts the
  releases (a finding; the count is compared with the releases at the end).
* **the data loader.** ``make_private`` sets the optimizer's ``expected_batch_size`` to
  ``int(N q)`` (divided by the world size under DDP) from the loader it returned, of N records
  sampled at rate q. A loader whose own N and rate give another expected batch size, or whose
  rate is not the accountant's while the optimizer's batch size cannot vouch for it, or which has
  no dataset (a list), is not the one whose batches are released: a finding names it.

What the audit then uses: the canaries' inclusion rate and every test's null come from the
training, never from an unverified input. The rate is the accountant hook's (the rate the claim
is computed with) unless the loader is verified to be the training's and samples at another
rate (then the loader's, the rate the records really see, and a finding says the accountant is
told another one). N, which the batch-size test and the rate interval need, is the loader's only
when the loader is verified; otherwise those checks do not run and say why. So a wrong input
can silence a check, never turn a correct run into a proof.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SetupProblem", "SetupCheck", "check_setup", "step_hook_of", "RATE_RTOL"]

#: relative tolerance when comparing two sample rates (both come from 1 / len(loader))
RATE_RTOL = 1e-6


@dataclass(frozen=True)
class SetupProblem:
    """A setup mismatch found at attach: the report's finding (level, scope, message)."""

    level: str
    scope: str
    message: str


@dataclass
class SetupCheck:
    """What the audit takes from the setup, and what it found wrong with it."""

    #: the rate at which records (and the IN canaries) are included in a release
    rate: float
    #: where the rate comes from: "accountant" (its step hook) or "data loader"
    rate_source: str
    #: N when the loader is verified to be the training's, else None
    n_records: int | None
    #: why N is not known (None when it is)
    n_reason: str | None
    #: "opacus" (an accountant's hook), "none" or "custom"
    hook: str
    accountant_rate: float | None
    loader_rate: float | None
    loader_records: int | None
    loader_verified: bool
    expected_batch_size: float | None
    problems: list[SetupProblem] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The report's ``audits.setup`` fields of the inputs."""
        return {"rate": self.rate, "rate_source": self.rate_source,
                "n_records": self.n_records, "n_records_unknown_because": self.n_reason,
                "step_hook": self.hook, "accountant_rate": self.accountant_rate,
                "loader_rate": self.loader_rate, "loader_records": self.loader_records,
                "loader_verified": self.loader_verified,
                "expected_batch_size": self.expected_batch_size,
                "problems": [{"level": p.level, "scope": p.scope, "message": p.message}
                             for p in self.problems]}


def step_hook_of(optimizer: Any) -> tuple[str, Any, float | None]:
    """(kind, accountant, rate) of the optimizer's step hook: ``("opacus", accountant, q)`` for
    an Opacus accountant's hook (``get_optimizer_hook_fn(sample_rate=q)``), ``("none", None,
    None)`` without a hook, ``("custom", None, None)`` for any other callable."""
    hook = getattr(optimizer, "step_hook", None)
    if hook is None:
        return "none", None, None
    if not inspect.isfunction(hook) or not hook.__qualname__.endswith(
            "get_optimizer_hook_fn.<locals>.hook_fn"):
        return "custom", None, None
    try:
        free = inspect.getclosurevars(hook).nonlocals
    except (TypeError, ValueError):
        return "custom", None, None
    acc, q = free.get("self"), free.get("sample_rate")
    if acc is None or not callable(getattr(acc, "step", None)) or isinstance(q, bool) \
            or not isinstance(q, (int, float)) or not (0.0 < float(q) <= 1.0):
        return "custom", None, None
    return "opacus", acc, float(q)


def _same_rate(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RATE_RTOL, abs_tol=0.0)


def _describe_loader(dl: Any, n: int | None, rate: float | None) -> str:
    parts = [type(dl).__name__]
    if isinstance(dl, (list, tuple)):
        parts.append(f"of {len(dl)} items")
    if n is not None:
        parts.append(f"over {n} records")
    bs = getattr(dl, "batch_size", None)
    if isinstance(bs, int):
        parts.append(f"batch size {bs}")
    if rate is not None:
        parts.append(f"rate {rate:.4g}")
    return parts[0] + (" (" + ", ".join(parts[1:]) + ")" if len(parts) > 1 else "")


def _loader_facts(dl: Any) -> tuple[float | None, int | None, str | None]:
    """(rate, N, why N is unknown) of what was handed over as the data loader."""
    rate = getattr(dl, "sample_rate", None)
    if rate is None:
        try:
            rate = 1.0 / len(dl)
        except (TypeError, ZeroDivisionError):
            rate = None
    else:
        try:
            rate = float(rate)
        except (TypeError, ValueError):
            raise TypeError(f"data_loader.sample_rate must be a number, got {rate!r}") from None
        if not (0.0 < rate <= 1.0):
            raise ValueError(f"data_loader.sample_rate must lie in (0, 1], got {rate!r}")
    if isinstance(dl, (list, tuple)):
        return rate, None, "a list was handed over as the data loader: it has no dataset"
    try:
        n = int(len(dl.dataset))
    except (AttributeError, TypeError):
        return rate, None, "the data loader's dataset has no length"
    return rate, n, None


def check_setup(privacy_engine: Any, optimizer: Any, data_loader: Any,
                world_size: int = 1) -> SetupCheck:
    """Check the handed-over engine and loader against the optimizer (module docstring).

    Raises:
        ValueError: the engine is certainly not the one whose accountant counts this
            optimizer's releases, or no rate can be found at all.
        TypeError: the loader's ``sample_rate`` is not a number.
    """
    hook, hook_acc, acc_rate = step_hook_of(optimizer)
    engine_acc = getattr(privacy_engine, "accountant", None)
    if hook == "opacus" and hook_acc is not engine_acc:
        raise ValueError(
            "privacy_engine is not the engine that made this optimizer private: the "
            "optimizer's step hook feeds another accountant, so this engine's epsilon does not "
            "count this training (pass the PrivacyEngine whose make_private returned the "
            "optimizer)")
    loader_rate, n_loader, n_reason = _loader_facts(data_loader)
    ebs_raw = getattr(optimizer, "expected_batch_size", None)
    ebs = float(ebs_raw) if isinstance(ebs_raw, (int, float)) else None
    problems: list[SetupProblem] = []
    desc = _describe_loader(data_loader, n_loader, loader_rate)

    # does the loader's own N and rate give the batch size make_private set from the
    # training loader?
    size_ok: bool | None = None
    if n_loader is not None and loader_rate is not None and ebs is not None:
        expected = int(n_loader * loader_rate)
        size_ok = any(abs(ebs - e) <= 1e-6 * max(1.0, e)
                      for e in (expected, expected / max(1, world_size)))
    rates_agree = (acc_rate is None or loader_rate is None
                   or _same_rate(acc_rate, loader_rate))
    verified = (n_loader is not None and loader_rate is not None and size_ok is not False
                and (rates_agree or size_ok is True))
    why_not = ""
    if not verified:
        if n_reason is not None:
            why_not = n_reason
        elif loader_rate is None:
            why_not = "it has neither a sample rate nor a length"
        elif size_ok is False:
            why_not = (f"its {n_loader} records at rate {loader_rate:.4g} give batches of "
                       f"{int(n_loader * loader_rate)} records, while the optimizer expects "
                       f"{ebs:g} (the expected batch size make_private set from the training "
                       f"loader)")
        else:
            why_not = (f"its rate {loader_rate:.4g} is not the rate {acc_rate:.4g} the "
                       f"accountant's step hook is given, and the optimizer has no expected "
                       f"batch size to tell which one training uses")

    if hook == "opacus":
        assert acc_rate is not None
        if verified and not rates_agree:
            assert loader_rate is not None
            rate, source = loader_rate, "data loader"
            problems.append(SetupProblem(
                "finding", "accountant",
                f"the accountant's step hook is given sample rate {acc_rate:.4g}, but the "
                f"data loader that training iterates ({desc}; its size and rate agree with the "
                f"optimizer's expected batch size) samples at {loader_rate:.4g}: the canaries "
                f"are included at the loader's rate"))
        else:
            rate, source = acc_rate, "accountant"
        if not verified and (n_reason is None or isinstance(data_loader, (list, tuple))):
            problems.append(SetupProblem(
                "finding", "data loader",
                f"the data loader handed to the auditor, {desc}, is not the one whose batches "
                f"training releases: {why_not}; the audit uses the accountant's rate "
                f"{acc_rate:.4g} and does not test the batch sizes (pass the data loader "
                f"make_private returned)"))
        elif not verified:  # nothing shows it is wrong; it cannot be checked
            problems.append(SetupProblem(
                "note", "data loader",
                f"the data loader handed to the auditor, {desc}, cannot be checked against the "
                f"training: {why_not}; the audit uses the accountant's rate {acc_rate:.4g} and "
                f"does not test the batch sizes"))
    else:
        if loader_rate is None:
            raise ValueError(
                f"data_loader ({type(data_loader).__name__}) has neither a sample_rate nor a "
                f"length, and the optimizer's step hook does not say the accountant's rate: "
                f"the audit needs the rate at which records are sampled (pass the loader "
                f"make_private returned)")
        rate, source = loader_rate, "data loader"
        if hook == "none":
            problems.append(SetupProblem(
                "finding", "accountant",
                "the optimizer has no step hook, so no accountant counts its releases "
                "(make_private attaches one; a DP optimizer built by hand needs "
                "optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn("
                "sample_rate))): the claimed epsilon covers only the steps the accountant is "
                "told by other code"))
        else:
            problems.append(SetupProblem(
                "note", "accountant",
                "the optimizer's step hook is not an Opacus accountant's: the audit cannot "
                "check which accountant it feeds or at which rate; the rate is the data "
                "loader's"))
        if not verified:
            problems.append(SetupProblem(
                "finding", "data loader",
                f"the data loader handed to the auditor, {desc}, cannot be verified to be the "
                f"one whose batches training releases: {why_not}; without an accountant's "
                f"rate to check it against, the audit uses its rate {loader_rate:.4g} and does "
                f"not test the batch sizes"))
    if verified:
        n_records, reason = n_loader, None
    else:
        n_records = None
        reason = n_reason or ("the data loader handed to the auditor is not the training's "
                              f"({why_not})")
    return SetupCheck(rate=float(rate), rate_source=source, n_records=n_records,
                      n_reason=reason, hook=hook, accountant_rate=acc_rate,
                      loader_rate=loader_rate, loader_records=n_loader, loader_verified=verified,
                      expected_batch_size=ebs, problems=problems)
