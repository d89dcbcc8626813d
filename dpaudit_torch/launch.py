"""``dpaudit run``: audit an unmodified Opacus training script (docs/auditor.md, "Auditing an
unmodified script: dpaudit run").

Two halves, one per process:

* **the launcher** (:func:`run_script`, called by ``dpaudit run``) starts the script with
  ``dpaudit_torch/_bootstrap`` first on its ``PYTHONPATH`` and the run's settings in the
  environment variable ``DPAUDIT_RUN_CONFIG`` (JSON), waits for it, then reads what each of its
  Python processes wrote (a status file per process, in a temporary directory, and the reports
  in ``--out``) and turns it into an exit code (:class:`RunResult`);
* **the hook** (:func:`install`), run inside every Python process of the script that imports
  Opacus (the bootstrap's ``sitecustomize`` imports this module on the first ``import opacus``,
  so ``torchrun``'s workers are reached too). It wraps every ``PrivacyEngine.make_private*``
  method: each call's DP optimizer gets a :class:`~dpaudit_torch.audit.PrivacyAuditor`, built
  at the optimizer's first ``step()`` with the run's settings (or, when the script builds its
  own auditor on that optimizer before its first step, that auditor is used and left as the
  script set it up). At interpreter exit, also after an uncaught exception, every audit is
  finalized and rank 0 saves its report.

Reports: with one ``make_private*`` call in the process, ``audit.json`` and ``report.html`` go
into ``--out`` itself; with several, into ``--out/audit-<i>`` (i: the call's index, from 0).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_ENV", "EXIT_BAD_RUN", "bootstrap_dir", "load_settings", "audit_settings",
           "run_script", "RunResult", "install", "record_hook_failure"]

#: the environment variable that carries a run's settings to the script's processes (JSON)
CONFIG_ENV = "DPAUDIT_RUN_CONFIG"
#: the exit code of a run that audited nothing or whose script failed (as the CLI's usage error)
EXIT_BAD_RUN = 2
_STATUS_PREFIX = "status-"


def bootstrap_dir() -> Path:
    """The directory ``dpaudit run`` puts first on the script's ``PYTHONPATH``."""
    return Path(__file__).resolve().parent / "_bootstrap"


# ================================================================== the launcher
def load_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The auditor's keyword settings in a JSON file, or a TOML file (``*.toml``; Python 3.11's
    ``tomllib``, or ``tomli``): one table of :class:`~dpaudit_torch.audit.AuditConfig` field
    names. ValueError (or OSError) with a one-line reason."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".toml":
        try:
            import tomllib as toml
        except ImportError:  # Python 3.10
            try:
                import tomli as toml  # type: ignore[no-redef]
            except ImportError:
                raise ValueError("reading TOML needs Python >= 3.11 (or the tomli package); "
                                 "give the settings as JSON") from None
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise ValueError(f"not valid TOML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"must hold one table (object) of auditor settings, got "
                         f"{type(data).__name__}")
    return data


def audit_settings(settings: Mapping[str, Any] | None = None, *, delta: float | None = None,
                   stop_on_violation: bool = False) -> dict[str, Any]:
    """The keyword settings every auditor of a run is built with: ``settings`` (a config file's),
    then ``delta``; ``on_violation`` is ``"raise"`` with ``stop_on_violation``, else the file's
    or ``"warn"`` (an unmodified script never reads ``should_stop``). Validated here
    (:class:`~dpaudit_torch.audit.AuditConfig`): TypeError / ValueError naming the setting."""
    from .audit.config import AuditConfig

    out = dict(settings or {})
    if delta is not None:
        out["delta"] = delta
    if stop_on_violation:
        out["on_violation"] = "raise"
    else:
        out.setdefault("on_violation", "warn")
    AuditConfig.from_kwargs(None, **out)
    try:
        json.dumps(out)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"settings must be plain JSON values ({exc})") from None
    return out


@dataclass
class RunResult:
    """What a ``dpaudit run`` found: the script's exit status, each process's status file, and
    the reports rank 0 wrote (path, :class:`~dpaudit_torch.report.AuditReport`)."""

    returncode: int
    statuses: list[dict[str, Any]]
    reports: list[tuple[Path, Any]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every ``make_private*`` call of every process (each rank's under DDP)."""
        return [c for s in self.statuses for c in s.get("calls", [])]

    @property
    def stopped_by_audit(self) -> bool:
        """Did the script end on the audit's exception (``--stop-on-violation``)?"""
        return any(s.get("stopped_by_audit") for s in self.statuses)

    @property
    def script_failed(self) -> bool:
        return self.returncode != 0 and not self.stopped_by_audit

    def _failure(self) -> str:
        exc = next((s["exception"] for s in self.statuses if s.get("exception")), None)
        how = (f"killed by signal {-self.returncode}" if self.returncode < 0
               else f"exit code {self.returncode}")
        return f"{how}: {exc}" if exc else how

    @property
    def problem(self) -> str | None:
        """One line saying why the run is not a verdict (exit code 2), or None."""
        hook = [s["hook_error"] for s in self.statuses if s.get("hook_error")]
        if hook:
            exe = next(s.get("executable") for s in self.statuses if s.get("hook_error"))
            return (f"the audit hook could not be installed in {exe} ({hook[0]}); run the "
                    f"script with the Python that dpaudit_torch is installed in")
        if not self.calls:
            if self.returncode != 0:
                return (f"the script failed ({self._failure()}) before any "
                        f"PrivacyEngine.make_private call: nothing was audited, no report")
            return ("the script never called PrivacyEngine.make_private (or "
                    "make_private_with_epsilon): nothing was audited (a Python started with "
                    "-E, -I or -S ignores PYTHONPATH and is not reached)")
        written = ", ".join(str(p) for p, _ in self.reports)
        if self.script_failed:
            what = (f"the report of what ran was written: {written}" if self.reports else
                    "no report could be written" + self._why_no_report())
            return f"the script failed ({self._failure()}); {what}"
        if not self.reports:
            return "nothing was audited" + self._why_no_report()
        errors = [c["error"] for c in self.calls if c.get("error")]
        if errors:  # another call's audit is missing: the verdict would not cover it
            return f"not every make_private call was audited: {errors[0]}"
        if self.unreadable:
            return f"a report could not be read: {self.unreadable[0]}"
        return None

    def _why_no_report(self) -> str:
        reasons = [c["error"] for c in self.calls if c.get("error")]
        if reasons:
            return f" ({reasons[0]})"
        if not any(c.get("steps") for c in self.calls):
            return " (the DP optimizer never stepped)"
        return ""

    @property
    def exit_code(self) -> int:
        """The strongest verdict's exit code (:data:`~dpaudit_torch.report.schema.
        VERDICT_EXIT_CODES`: 0, 3, 4, 5, 6); :data:`EXIT_BAD_RUN` when :attr:`problem` is set."""
        from .report.schema import VERDICT_EXIT_CODES, VERDICTS, verdict_phrase

        if self.problem is not None:
            return EXIT_BAD_RUN
        phrases = {verdict_phrase(r.verdict) for _, r in self.reports}
        strongest = next(v for v in VERDICTS if v in phrases)
        return VERDICT_EXIT_CODES[strongest]


def run_script(command: Sequence[str], out: str | os.PathLike[str],
               settings: Mapping[str, Any], *, inject_bug: str | None = None,
               env: Mapping[str, str] | None = None,
               popen: Callable[..., Any] = subprocess.Popen) -> RunResult:
    """Run ``command`` (the script, as one would type it) with every ``make_private*`` call of
    its Python processes audited with ``settings`` (:func:`audit_settings`); wait for it; read
    the reports written into ``out``. ``inject_bug``: apply that ``dpaudit_torch.testing.bugs``
    bug at every ``make_private*`` call (testing only). FileNotFoundError / PermissionError when
    the command cannot be started."""
    out = Path(out).resolve()
    base = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="dpaudit-run-") as status_dir:
        config = {"version": 1, "out": str(out), "status_dir": status_dir,
                  "settings": dict(settings), "inject_bug": inject_bug,
                  "stop_on_violation": settings.get("on_violation") == "raise"}
        path = base.get("PYTHONPATH")
        base["PYTHONPATH"] = str(bootstrap_dir()) + (os.pathsep + path if path else "")
        base[CONFIG_ENV] = json.dumps(config)
        proc = popen(list(command), env=base)
        while True:
            try:
                returncode = proc.wait()
                break
            except KeyboardInterrupt:  # the script gets it too (same process group): wait
                logger.warning("interrupted: waiting for the script to write its report")
        statuses = []
        for f in sorted(Path(status_dir).glob(_STATUS_PREFIX + "*.json")):
            try:
                statuses.append(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, ValueError) as exc:
                logger.warning("unreadable status file %s: %s", f.name, exc)
    return _collect(returncode, statuses)


def _collect(returncode: int, statuses: list[dict[str, Any]]) -> RunResult:
    from .report import AuditReport

    result = RunResult(returncode, statuses)
    seen = set()
    for call in result.calls:
        where = call.get("report_dir")
        if where is None or where in seen:
            continue
        seen.add(where)
        try:
            result.reports.append((Path(where), AuditReport.load(where)))
        except (OSError, ValueError) as exc:
            result.unreadable.append(f"{where}: {exc}")
    return result


# ================================================================== the hook (script side)
@dataclass
class _Call:
    """One ``make_private*`` call and its audit."""

    index: int
    method: str
    engine: Any
    module: Any
    optimizer: Any
    loader: Any
    auditor: Any = None
    adopted: bool = False
    started: bool = False
    error: str | None = None
    report_dir: str | None = None
    verdict: str | None = None

    def status(self) -> dict[str, Any]:
        steps = int(self.auditor.step) if self.auditor is not None else 0
        return {"index": self.index, "method": self.method, "adopted": self.adopted,
                "audited": self.auditor is not None, "steps": steps, "error": self.error,
                "report_dir": self.report_dir, "verdict": self.verdict}


class _Launch:
    """The hook's state in one process of the script."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.out = Path(config["out"])
        self.status_dir = Path(config["status_dir"])
        self.settings: dict[str, Any] = dict(config.get("settings") or {})
        self.inject_bug: str | None = config.get("inject_bug")
        self.stop = bool(config.get("stop_on_violation"))
        self.calls: list[_Call] = []
        self.hook_error: str | None = None
        self.local = threading.local()

    # ------------------------------------------------------------------ make_private
    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def make_private(engine: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1  # make_private_with_epsilon calls make_private
            try:
                out = method(engine, *args, **kwargs)
            finally:
                self.local.depth = depth
            return out if depth else self.made_private(name, engine, out)

        make_private._dpaudit_wrapped = True  # type: ignore[attr-defined]
        return make_private

    def made_private(self, method: str, engine: Any, out: Any) -> Any:
        from opacus.optimizers import DPOptimizer

        if not (isinstance(out, tuple) and len(out) >= 3 and isinstance(out[1], DPOptimizer)):
            logger.warning("dpaudit run: PrivacyEngine.%s returned no DP optimizer where "
                           "expected; this call is not audited", method)
            return out
        module, optimizer, loader = out[0], out[1], out[-1]
        if self.inject_bug:
            from .testing.bugs import apply_to_training

            optimizer, loader = apply_to_training(engine, optimizer, loader, self.inject_bug)
            out = (module, optimizer, *out[2:-1], loader)
            logger.warning("dpaudit run --inject-bug: the deliberate bug %r is applied to the "
                           "optimizer of make_private call %d", self.inject_bug, len(self.calls))
        call = _Call(len(self.calls), method, engine, module, optimizer, loader)
        self.calls.append(call)
        self.wrap_step(call)
        return out

    def wrap_step(self, call: _Call) -> None:
        """The optimizer's ``step`` (a bound method of the instance, as an LR scheduler's own
        wrapper expects) builds the audit at the first call; with ``--stop-on-violation`` an
        audit the script built itself raises from the step after a proven violation."""
        opt = call.optimizer
        inner = opt.__dict__.get("step")  # an instance attribute set before us, if any

        def step(this: Any, *args: Any, **kwargs: Any) -> Any:
            if not call.started:
                call.started = True
                self.attach(call)
            elif call.adopted and self.stop and call.auditor.violation:
                from .audit.engine import PrivacyViolationError

                raise PrivacyViolationError(
                    "dpaudit run --stop-on-violation: " + call.auditor.engine.violation_message(),
                    call.auditor.violation_step)
            try:
                if inner is not None:
                    return inner(*args, **kwargs)
                return type(this).step(this, *args, **kwargs)
            except Exception as exc:
                if call.auditor is not None and self.stop:
                    from .audit.engine import PrivacyViolationError

                    if isinstance(exc, PrivacyViolationError):
                        _add_note(exc, f"raised by dpaudit run --stop-on-violation; the report "
                                       f"is written to {self.out} when the script exits")
                raise

        functools.update_wrapper(step, type(opt).step)
        opt.step = types.MethodType(step, opt)

    def attach(self, call: _Call) -> None:
        from .audit.auditor import PrivacyAuditor
        from .opacus_tap.tap import OWNER_ATTR

        owner = getattr(call.optimizer, OWNER_ATTR, None)
        if owner is not None and owner.attached:  # the script audits this optimizer itself
            call.auditor, call.adopted = owner, True
            logger.warning("dpaudit run: the script attached its own PrivacyAuditor to the "
                           "optimizer of make_private call %d; its report (with the script's "
                           "settings) is written to %s", call.index, self.out)
            return
        try:
            call.auditor = PrivacyAuditor(call.engine, call.optimizer, call.loader,
                                          model=call.module, **self.settings)
        except Exception as exc:  # noqa: BLE001 - the script trains on, unaudited
            call.error = (f"the auditor could not be attached to the optimizer of "
                          f"make_private call {call.index}: {type(exc).__name__}: {exc}")
            logger.error("dpaudit run: %s; training goes on unaudited", call.error)

    # ------------------------------------------------------------------ exit
    def at_exit(self) -> None:
        """Finalize every audit, save rank 0's reports, write this process's status."""
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        engine_module = sys.modules.get("dpaudit_torch.audit.engine")
        stopped = engine_module is not None and isinstance(
            exc, engine_module.PrivacyViolationError)
        ended = None if exc is None else f"{type(exc).__name__}: {_first_line(exc)}"
        several = len(self.calls) > 1
        for call in self.calls:
            if call.auditor is None:
                continue
            try:
                self.finish(call, ended if not stopped else None, several)
            except Exception as e:  # noqa: BLE001 - the other calls' reports still go out
                call.error = f"the report could not be written: {type(e).__name__}: {e}"
                logger.error("dpaudit run: make_private call %d: %s", call.index, call.error)
        self.write_status({"exception": ended, "stopped_by_audit": stopped})

    def finish(self, call: _Call, ended: str | None, several: bool) -> None:
        aud = call.auditor
        if ended is not None and not call.adopted:
            aud.warn(f"the training script ended with an exception ({ended}) after "
                     f"{aud.step} audited step(s): this report covers the steps before it")
        # Every rank finalizes on its own: a rank that failed cannot join a collective at exit,
        # and rank 0's decision is the one it broadcast during training
        # (dpaudit_torch/opacus_tap/ddp.py); no collective runs here.
        aud.engine._share = None
        report = aud.finalize()
        if aud.is_main_process and _process_rank() == 0:
            target = self.out / f"audit-{call.index}" if several else self.out
            report.save(target)
            call.report_dir, call.verdict = str(target), report.verdict

    def write_status(self, extra: Mapping[str, Any]) -> None:
        status = {"pid": os.getpid(), "rank": _process_rank(), "executable": sys.executable,
                  "calls": [c.status() for c in self.calls], "hook_error": self.hook_error,
                  **extra}
        path = self.status_dir / f"{_STATUS_PREFIX}{os.getpid()}.json"
        try:
            path.write_text(json.dumps(status), encoding="utf-8")
        except OSError as exc:  # the launcher is gone, or its directory
            logger.error("dpaudit run: cannot write the run's status to %s: %s", path, exc)


_STATE: _Launch | None = None


def _process_rank() -> int:
    """This process's rank: torch.distributed's when initialised, else ``$RANK``, else 0."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001, S110 - a torn-down process group: fall back to $RANK
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def install(opacus: types.ModuleType) -> None:
    """Wrap every ``make_private*`` method of ``opacus.PrivacyEngine`` with the run's settings
    (``$DPAUDIT_RUN_CONFIG``) and register the exit handler; once per process (the bootstrap's
    ``sitecustomize`` calls it right after ``import opacus``)."""
    global _STATE
    if _STATE is not None:
        return
    state = _Launch(json.loads(os.environ[CONFIG_ENV]))
    engine_cls = opacus.PrivacyEngine
    for name in sorted(vars(engine_cls)):
        method = vars(engine_cls)[name]
        if name.startswith("make_private") and callable(method) and \
                not getattr(method, "_dpaudit_wrapped", False):
            setattr(engine_cls, name, state.wrap(name, method))
    _STATE = state
    atexit.register(state.at_exit)  # after torch's own exit handlers are registered: runs first


def record_hook_failure(reason: str) -> None:
    """Say, in this process's status file, that the hook could not be installed."""
    state = _STATE or _Launch(json.loads(os.environ[CONFIG_ENV]))
    state.hook_error = reason
    state.write_status({"exception": None, "stopped_by_audit": False})
