"""The package's shape (CONTRIBUTING.md, "Package layout"): no module over 650 lines, no import
circle (imports under ``if TYPE_CHECKING:`` aside; imports inside functions count), no code
outside ``audit/monitors/`` that names a monitor, and a test file for every public module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dpaudit_torch"
MAX_LINES = 650


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _target(name: str, path: Path, node: ast.ImportFrom) -> str:
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        base = pkg[:len(pkg) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere (functions included), except under
    ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for n in nodes:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse)
                continue
            if isinstance(n, ast.ImportFrom):
                t = _target(name, path, n)
                for a in n.names:
                    sub = f"{t}.{a.name}"
                    found.add(sub if sub in MODULES else t)
            elif isinstance(n, ast.Import):
                found.update(a.name for a in n.names)
            for child in ast.iter_child_nodes(n):
                if isinstance(child, ast.stmt):
                    visit([child])
                elif hasattr(child, "body") and isinstance(child.body, list):
                    visit(child.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return {m for m in found if m in MODULES and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_module_over_the_size_limit() -> None:
    long = {n: len(p.read_text(encoding="utf-8").splitlines()) for n, p in MODULES.items()}
    assert not {n: k for n, k in long.items() if k > MAX_LINES}


def test_the_facade_stays_thin() -> None:
    lines = (PKG / "audit" / "auditor.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 270


def test_no_import_circle() -> None:
    graph = {n: _imports(n, p) for n, p in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_monitors_name_a_monitor() -> None:
    """Outside ``audit/monitors/`` (and the registry of bound methods, which says which monitor
    computes each), no string literal of the package is a monitor's name: the engine, the
    decision, the report and the page loop over the registry."""
    from dpaudit_torch.audit import MONITORS

    names = set(MONITORS)
    allowed = {PKG / "registry.py"}
    # the same words meaning something else: the public module ``dpaudit_torch.one_run``, and
    # the design's count of one-run canaries per tensor (a report field)
    other_meaning = {("__init__.py", "one_run"), ("canaries.py", "one_run")}
    offenders = []
    for f in sorted(PKG.rglob("*.py")):
        if (PKG / "audit" / "monitors") in f.parents or f in allowed:
            continue
        if (PKG / "testing") in f.parents:  # deliberately broken optimizers, not the engine
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names and (
                    str(f.relative_to(PKG)), node.value) not in other_meaning:
                offenders.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert offenders == []


def _public_modules() -> list[tuple[str, Path]]:
    out = []
    for name, path in MODULES.items():
        leaf = path.stem
        if leaf.startswith("_"):
            continue
        rel = path.relative_to(PKG).parent
        out.append((name, ROOT / "tests" / rel / f"test_{leaf}.py"))
    return out


@pytest.mark.parametrize("name,test_file", _public_modules(), ids=lambda v: str(v))
def test_every_public_module_has_its_test_file(name: str, test_file: Path) -> None:
    assert test_file.is_file(), f"{name} has no {test_file.relative_to(ROOT)}"


#: what each layer may not import (docs/auditor.md, "How it is built"): the statistics, the
#: contract and the registries are the ground floor; the adapter and the report sit on them; the
#: engine on those; integrations and the command line on top
FORBIDDEN = {
    "dpaudit_torch.contract": ("dpaudit_torch.",),
    "dpaudit_torch.stats": ("dpaudit_torch.audit", "dpaudit_torch.opacus_tap",
                            "dpaudit_torch.report", "dpaudit_torch.integrations"),
    "dpaudit_torch.registry": ("dpaudit_torch.audit", "dpaudit_torch.opacus_tap",
                               "dpaudit_torch.report"),
    "dpaudit_torch.opacus_tap": ("dpaudit_torch.audit", "dpaudit_torch.report",
                                 "dpaudit_torch.integrations"),
    "dpaudit_torch.report": ("dpaudit_torch.audit", "dpaudit_torch.opacus_tap",
                             "dpaudit_torch.integrations"),
    "dpaudit_torch.audit": ("dpaudit_torch.integrations",),
}


def test_layers_import_only_downward() -> None:
    wrong = []
    for name, path in MODULES.items():
        for layer, banned in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                for dep in _imports(name, path):
                    if any(dep == b.rstrip(".") or dep.startswith(b if b.endswith(".") else b + ".")
                           or dep == b for b in banned):
                        wrong.append(f"{name} imports {dep}")
    assert wrong == []
