"""The ``dpaudit`` command line: ``demo``, ``table1``, ``report``, ``run``, ``gate``.

Exit codes follow the report's verdict: 0 nothing found, 3 violation proven or claim refuted,
4 claim inconsistent (the accountant's inputs contradict the training that ran), 5 a finding that
is not a proof (e.g. noise on a low-precision grid), 6 evidence of a violation that is not a
proof (the decision's e-process at 1/alpha_warn); 2 usage error (one line on stderr, never a
traceback), 1 unexpected internal error. ``gate`` has its own: 0 pass, 1 fail, 2 bad input or a
comparison that is impossible (docs/release_gate.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def verdict_exit_code(report: Any) -> int:
    """The exit code of a report's verdict (:data:`~dpaudit_torch.report.schema.
    VERDICT_EXIT_CODES`)."""
    from .report.schema import VERDICT_EXIT_CODES, verdict_phrase

    return VERDICT_EXIT_CODES[verdict_phrase(report.verdict)]


class UsageError(Exception):
    """A bad command-line input: reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise UsageError(message)


def _writable_dir(path: str) -> Path:
    """``path`` as a writable directory (created if missing); a UsageError saying what is wrong
    otherwise (an existing file where the directory or one of its parents should be, no
    permission, ...)."""
    p = Path(path)
    for q in (p, *p.parents):  # the nearest existing path must be a directory
        if q.exists() or q.is_symlink():
            if not q.is_dir():
                if q == p:
                    raise UsageError(f"--out {path!r} is an existing file, not a directory: "
                                     f"give a directory (it is created if missing)")
                raise UsageError(f"--out {path!r} cannot be a directory: {str(q)!r} is an "
                                 f"existing file, not a directory")
            break
    import tempfile  # here: --help, argument errors and gate write no directory

    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".dpaudit-write-test-"):
            pass
    except OSError as exc:
        raise UsageError(f"output directory {path!r} is not writable ({exc.strerror or exc})") \
            from None
    return p


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """The command's ``warnings.showwarning``: the command shows its own output, so a Python
    warning becomes a log record (logger ``py.warnings``): at WARNING for this package's own
    warnings (e.g. a tester that cannot reject its null), at INFO, shown with ``-v``, for other
    libraries' (Opacus, NumPy, torch)."""
    ours = category.__module__.split(".")[0] == __package__
    logging.getLogger("py.warnings").log(
        logging.WARNING if ours else logging.INFO, "%s: %s (%s:%d)", category.__name__,
        message, filename, lineno)


#: the logger of the kernels' compile message (dpaudit_torch/_numba.py)
KERNELS_LOGGER = "dpaudit_torch._numba"


class _Formatter(logging.Formatter):
    """``LEVEL logger: message``; the kernels' compile notice as a line of the command's own."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "dpaudit_notice", False):
            return f"dpaudit: {record.getMessage()}"
        return super().format(record)


def _compile_notice_only(record: logging.LogRecord) -> bool:
    """Without ``-v``: of the kernel module's records below WARNING only the compile message
    passes (a first run waits for the compiler, the line says why), marked as the command's
    own line."""
    from ._numba import COMPILE_MESSAGE

    if record.levelno >= logging.WARNING:
        return True
    if record.msg == COMPILE_MESSAGE:
        record.dpaudit_notice = True
        return True
    return False


def _configure_logging(verbose: bool) -> None:
    """Log records to stderr: WARNING and above, with ``-v`` INFO too; without ``-v`` the one
    INFO record shown is the kernels' compile message, as ``dpaudit: compiling ...``."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    kernels = logging.getLogger(KERNELS_LOGGER)
    kernels.removeFilter(_compile_notice_only)
    if not verbose:
        kernels.setLevel(logging.INFO)
        kernels.addFilter(_compile_notice_only)


def _seed(text: str) -> int | None:
    if text.lower() in ("none", "random", "os"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be an integer or 'none', got {text!r}") \
            from None


def _build_parser() -> _Parser:
    from .testing.bugs import names as bug_names

    parser = _Parser(prog="dpaudit", description="Audit differential privacy while training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="train a small CNN with Opacus on bundled digits, audited; write a report",
        description="DP-SGD (Opacus) on scikit-learn's bundled 8x8 digits with the auditor "
                    "attached. Writes audit.json and report.html to --out. Exit 3 if a "
                    "violation is proven or the claim refuted, 4 if the claim is inconsistent "
                    "with the training that ran, 6 for evidence of a violation that is not a "
                    "proof, 5 for a finding that is not a proof, else 0.")
    demo.add_argument("--out", default="audit_out", help="report directory (default audit_out)")
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--seed", type=_seed, default=0,
                      help="integer seed, or 'none' for OS entropy (default 0)")
    demo.add_argument("--device", default="cpu", help="torch device (default cpu)")
    demo.add_argument("--bug", default=None,
                      help=f"apply a deliberate DP bug: one of {', '.join(bug_names())}")
    demo.add_argument("--grad-sample-mode", default="hooks", choices=["hooks", "ghost"],
                      help="Opacus per-sample gradient mode (default hooks)")
    demo.add_argument("--noise-multiplier", type=float, default=1.0)
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--threads", type=int, default=1,
                      help="torch threads while the demo trains (default 1: the tiny model "
                           "trains fastest on one; more threads only wait for each other)")

    t1 = sub.add_parser("table1", help="reproduce Table 1 of Gonzalez et al. (2025)",
                        description="Rejection rate / mean pairs to reject for the paper's "
                                    "mechanisms: MMD (R=1/2, R=1) and the hockey-stick test.")
    t1.add_argument("--runs", type=int, default=20)
    t1.add_argument("--budget", type=int, default=5000)
    t1.add_argument("--quick", action="store_true", help="3 runs, budget 1000")
    t1.add_argument("--seed", type=int, default=0)
    t1.add_argument("--no-progress", action="store_true")

    run = sub.add_parser(
        "run", help="audit an unmodified Opacus training script: dpaudit run -- python train.py",
        description="Run a training script with an auditor on every PrivacyEngine.make_private* "
                    "call of its Python processes (DDP launchers such as torchrun included); "
                    "rank 0 writes the report(s) when the script ends, also after an error. Exit "
                    "code: the strongest verdict's (0, 3, 4, 5, 6 as for demo); 2 when nothing was "
                    "audited or the script failed (what report could be written is written).")
    run.add_argument("--out", default="audit_out", help="report directory (default audit_out; "
                     "several make_private calls: DIR/audit-<i>)")
    run.add_argument("--delta", type=float, default=None,
                     help="delta of the claim and of the bounds (default: the config's, 1e-5)")
    run.add_argument("--config", default=None, metavar="FILE",
                     help="PrivacyAuditor settings, a JSON or TOML table (k_pairs, seed, ...)")
    run.add_argument("--stop-on-violation", action="store_true",
                     help="raise PrivacyViolationError from optimizer.step() once a violation is "
                          "proven (default: log it and let training go on)")
    run.add_argument("--inject-bug", default=None, metavar="BUG",
                     help=f"testing only: apply a deliberate DP bug at every make_private call: "
                          f"one of {', '.join(bug_names())}")
    run.add_argument("script", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="the script's command line, after --")

    rep = sub.add_parser("report", help="re-render report.html from an audit.json",
                         description="Load audit.json (file or its directory) and write "
                                     "report.html next to it, or into --out.")
    rep.add_argument("path", help="audit.json or the directory holding it")
    rep.add_argument("--out", default=None, help="directory for the re-rendered report")
    _add_gate_parser(sub)
    return parser


def _add_gate_parser(sub: Any) -> None:
    from .gate import JUMP_MARGIN

    g = sub.add_parser(
        "gate", help="compare a release's audit with the previous release's (a release gate)",
        description="Compare NEW's audit with the baseline's: the audited lower bounds against "
                    "the claim, and the audits' strength. Prints both side by side and writes "
                    "gate.html next to NEW. Exit 0 pass, 1 fail, 2 bad input or impossible "
                    "comparison (docs/release_gate.md).")
    g.add_argument("new", metavar="NEW",
                   help="the new release's audit.json, or the directory holding it")
    base = g.add_mutually_exclusive_group()
    base.add_argument("--baseline", default=None, metavar="OLD",
                      help="the previous release's audit.json (or its directory)")
    base.add_argument("--first-release", action="store_true",
                      help="there is no previous audit: this one becomes the baseline")
    g.add_argument("--allow-change", action="store_true",
                   help="compare although the model, dataset or architecture changed")
    g.add_argument("--html", default=None, metavar="PATH",
                   help="where to write the comparison page (default: gate.html next to NEW)")
    g.add_argument("--jump-margin", type=float, default=JUMP_MARGIN, metavar="FRACTION",
                   help=f"a rise of a whole-run bound by more than this fraction of the claim "
                        f"is a jump (default {JUMP_MARGIN})")
    g.add_argument("--accept-weaker", default=None, metavar="REASON",
                   help="pass although the new audit has less power than the baseline's "
                        "(fewer steps, a smaller q T or claimed epsilon) because the release "
                        "is weaker on purpose; REASON is printed and recorded in gate.html")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo
    from .testing.bugs import names as bug_names

    if args.bug is not None and args.bug not in bug_names():
        raise UsageError(f"unknown bug {args.bug!r}; choose one of: {', '.join(bug_names())}")
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if not args.noise_multiplier > 0:
        raise UsageError(f"--noise-multiplier must be > 0, got {args.noise_multiplier}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    try:
        import torch

        torch.device(args.device)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"--device {args.device!r}: CUDA is not available here")
    except RuntimeError as exc:
        raise UsageError(f"bad --device {args.device!r}: {exc}") from None
    out = _writable_dir(args.out)
    config = DemoConfig(steps=args.steps, seed=args.seed, device=args.device, bug=args.bug,
                        grad_sample_mode=args.grad_sample_mode,
                        noise_multiplier=args.noise_multiplier)
    bar = None
    on_step = on_start = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, desc="setting up", unit="step", file=sys.stderr)

        def on_start() -> None:  # the bar's clock starts with training, not with the set-up
            bar.set_description("DP-SGD (audited)", refresh=False)
            bar.reset()

        def on_step(m: dict[str, Any]) -> None:
            post = {"loss": f"{m.get('loss', float('nan')):.3f}"}
            if m.get("claimed_epsilon") is not None:
                post["eps"] = f"{m['claimed_epsilon']:.2f}"
            if m.get("combined_log_wealth") is not None:
                # the sequential e-process, beside the level it must reach (log 1/alpha)
                post["logK"] = (f"{m['combined_log_wealth']:.2f}/"
                                f"{m.get('decision_threshold_log', float('nan')):.2f}")
            bar.set_postfix(post, refresh=False)
            bar.update(1)

    from tqdm.contrib.logging import logging_redirect_tqdm

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            result = run_demo(config, out, on_step=on_step, on_start=on_start)
    finally:
        torch.set_num_threads(threads)  # as it was, for in-process callers
        if bar is not None:
            bar.close()
    report = result.report
    print(f"trained {result.steps_run} steps; test accuracy {result.test_accuracy:.3f}")
    print(report.summary_text())
    print(f"report: {result.report_dir / 'report.html'}")
    print(f"data:   {result.report_dir / 'audit.json'}")
    return verdict_exit_code(report)


def _cmd_table1(args: argparse.Namespace) -> int:
    from .experiments import format_table1, run_table1

    runs, budget = (3, 1000) if args.quick else (args.runs, args.budget)
    if runs < 1 or budget < 50:
        raise UsageError(f"need --runs >= 1 and --budget >= 50, got {runs} and {budget}")
    rows = run_table1(runs=runs, budget=budget, seed=args.seed, progress=not args.no_progress)
    print(format_table1(rows))
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import AuditReport, validate

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"no such file or directory: {args.path!r}")
    try:
        report = AuditReport.load(path)
        validate(report)  # fields that contradict each other, or no results at all
    except (ValueError, OSError) as exc:
        raise UsageError(f"cannot read audit report {args.path!r}: {exc}") from None
    target = _writable_dir(args.out) if args.out else (path if path.is_dir() else path.parent)
    try:
        report.save(target)
    except OSError as exc:
        raise UsageError(str(exc)) from None
    print(report.summary_text())
    print(f"report: {target / 'report.html'}")
    return verdict_exit_code(report)


def _cmd_run(args: argparse.Namespace) -> int:
    from . import launch
    from .testing.bugs import names as bug_names

    command = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not command:
        raise UsageError("no script given: dpaudit run [--out DIR] -- python train.py ARGS")
    if args.inject_bug is not None and args.inject_bug not in bug_names():
        raise UsageError(f"unknown bug {args.inject_bug!r}; choose one of: "
                         f"{', '.join(bug_names())}")
    settings: dict[str, Any] = {}
    if args.config is not None:
        try:
            settings = launch.load_settings(args.config)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--config {args.config!r}: {exc}") from None
    try:
        settings = launch.audit_settings(settings, delta=args.delta,
                                         stop_on_violation=args.stop_on_violation)
    except (TypeError, ValueError) as exc:
        where = f"--config {args.config!r}" if args.config else "--delta"
        raise UsageError(f"{where}: {exc}") from None
    out = _writable_dir(args.out)
    try:
        result = launch.run_script(command, out, settings, inject_bug=args.inject_bug)
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    for path, report in result.reports:
        print(report.summary_text())
        print(f"report: {path / 'report.html'}")
    if result.problem is not None:
        print(f"dpaudit: error: {result.problem}", file=sys.stderr)
    return result.exit_code


def _cmd_gate(args: argparse.Namespace) -> int:
    import math

    from .gate import (
        GateInputError,
        check_reason,
        gate,
        html_path_for,
        read_audit,
        render_html,
    )

    if not (math.isfinite(args.jump_margin) and args.jump_margin >= 0):
        raise UsageError(f"--jump-margin must be a finite number >= 0, got {args.jump_margin}")
    if args.accept_weaker is not None:
        try:
            check_reason(args.accept_weaker)
        except ValueError as exc:
            raise UsageError(f"--accept-weaker: {exc}") from None
    try:
        new = read_audit(args.new, "new report")
        baseline = read_audit(args.baseline, "baseline") if args.baseline else None
    except GateInputError as exc:
        raise UsageError(str(exc)) from None
    result = gate(new, baseline, first_release=args.first_release,
                  allow_change=args.allow_change, jump_margin=args.jump_margin,
                  accept_weaker=args.accept_weaker)
    page = Path(args.html) if args.html else html_path_for(args.new)
    try:
        page.write_text(render_html(result), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the comparison page {str(page)!r}: "
                         f"{exc.strerror or exc}") from None
    text = result.text().splitlines()
    print("\n".join(text[:-1]))
    print(f"comparison: {page}")
    print(text[-1])  # the outcome, one sentence
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dpaudit`` command; returns the exit code."""
    shown = warnings.showwarning
    warnings.showwarning = _log_warning  # the command's output is its own (see _log_warning)
    kernels = logging.getLogger(KERNELS_LOGGER)
    level, filters = kernels.level, list(kernels.filters)
    try:
        return _main(argv)
    finally:  # in-process callers (tests) get the logging they had
        warnings.showwarning = shown
        kernels.setLevel(level)
        kernels.filters[:] = filters


def _main(argv: list[str] | None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        _configure_logging(args.verbose)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        handler = {"demo": _cmd_demo, "table1": _cmd_table1, "report": _cmd_report,
                   "run": _cmd_run, "gate": _cmd_gate}
        return handler[args.command](args)
    except UsageError as exc:
        print(f"dpaudit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dpaudit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line never shows a raw traceback
        if os.environ.get("DPAUDIT_DEBUG"):
            raise
        print(f"dpaudit: internal error: {type(exc).__name__}: {exc} "
              f"(set DPAUDIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
