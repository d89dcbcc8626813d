"""The README's command-line synopsis matches the command line: every flag of every ``dpaudit``
subcommand (read from the argparse parser the CLI builds) and every bug name of
``dpaudit_torch.testing.bugs`` appears in it, and every flag it shows exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dpaudit_torch.cli import _build_parser
from dpaudit_torch.testing.bugs import names as bug_names

ROOT = Path(__file__).resolve().parents[1]


def _synopsis() -> str:
    """The first fenced block of the README's "The command line" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The command line", 1)
    assert len(section) == 2, "README.md has no '## The command line' section"
    match = re.search(r"```[^\n]*\n(.*?)```", section[1], flags=re.S)
    assert match, "no code block in the README's command-line section"
    return match.group(1)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_lines(synopsis: str, command: str | None) -> str:
    """The synopsis lines of one subcommand (its ``dpaudit <command>`` line and the lines that
    continue it), or of the top-level line (``command=None``); comments after ``#`` removed."""
    out: list[str] = []
    taking = False
    for line in synopsis.splitlines():
        line = line.split("#", 1)[0]
        if line.startswith("dpaudit "):
            word = line.split()[1]
            taking = word == command or (command is None and word.startswith("["))
        if taking:
            out.append(line)
    return "\n".join(out)


def _has(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", text) is not None


def problems(synopsis: str, parser: argparse.ArgumentParser, bugs: list[str]) -> list[str]:
    """Everything the synopsis lacks or shows wrongly, one line each (empty: it matches)."""
    found: list[str] = []
    top = _command_lines(synopsis, None)
    found += [f"top-level flag {f} missing" for f in sorted(_flags(parser)) if not _has(top, f)]
    subs = _subparsers(parser)
    if not subs:
        found.append("the CLI parser has no subcommands")
    for command, sub in subs.items():
        lines = _command_lines(synopsis, command)
        if not lines:
            found.append(f"subcommand {command!r} missing")
            continue
        found += [f"`dpaudit {command} {f}` missing" for f in sorted(_flags(sub))
                  if not _has(lines, f)]
        shown = set(re.findall(r"(?<![\w.-])(--?[a-z][\w-]*)", lines))
        found += [f"`dpaudit {command}` has no flag {f}" for f in sorted(shown - _flags(sub))]
    demo = _command_lines(synopsis, "demo")
    found += [f"bug {b!r} missing from `dpaudit demo`" for b in bugs if not _has(demo, b)]
    return found


def test_readme_synopsis_lists_every_flag_and_every_bug() -> None:
    bugs = bug_names()
    assert len(bugs) >= 14
    assert problems(_synopsis(), _build_parser(), bugs) == []


def test_the_check_sees_what_is_missing_or_wrong() -> None:
    synopsis = _synopsis()
    parser = _build_parser()
    bugs = bug_names()
    broken = (synopsis.replace("[--no-progress]\n", "[--no-progres]\n", 1)
              .replace("fixed-size-batches", "", 1))
    found = problems(broken, parser, bugs)
    assert "`dpaudit demo --no-progress` missing" in found
    assert "`dpaudit demo` has no flag --no-progres" in found
    assert "bug 'fixed-size-batches' missing from `dpaudit demo`" in found
    assert "subcommand 'report' missing" in problems(
        "\n".join(ln for ln in synopsis.splitlines() if not ln.startswith("dpaudit report")),
        parser, bugs)


def test_the_cpu_only_install_keeps_the_packages_torch_range() -> None:
    """The README's CPU-only route installs torch from PyTorch's CPU index within the range of
    pyproject.toml's dependency (else installing the package would fetch another torch, CUDA
    libraries and all); `make demo` keeps a torch already in .venv (it only creates .venv when
    there is none)."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    deps = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]  # the runtime ones
    (torch_req,) = re.findall(r'"(torch(?![\w-])[^"]*)"', deps)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    line = f"pip install '{torch_req}' --index-url https://download.pytorch.org/whl/cpu"
    assert line in quickstart, torch_req
    assert "make demo" in quickstart.split(line, 1)[1]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^\$\(PY\):", makefile, flags=re.M)  # .venv made only when missing
