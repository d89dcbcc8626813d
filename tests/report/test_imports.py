"""The layering of dpaudit_torch/report/: no import circle between its modules (function-level
imports count, imports under ``if TYPE_CHECKING:`` do not), the schema imports none of its
renderers, and no module spells a monitor's name (monitors are named by the report's data)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpaudit_torch.report

PACKAGE = Path(dpaudit_torch.report.__file__).parent
#: the monitors of the engine today: the report package must work whatever they are called
MONITOR_NAMES = {"sequential_pairs", "one_run", "noise", "sampling", "accounting", "coverage",
                 "decision"}


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(path: Path) -> set[str]:
    """Modules of this package that ``path`` imports, wherever (not under TYPE_CHECKING)."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
            elif node.level == 0 and (node.module or "").startswith("dpaudit_torch.report."):
                found.add((node.module or "").split(".")[2])

        def visit_Import(self, node: ast.Import) -> None:
            for a in node.names:
                if a.name.startswith("dpaudit_torch.report."):
                    found.add(a.name.split(".")[2])

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p) for p in sorted(PACKAGE.glob("*.py"))}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in graph.get(stack.pop(), set()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_no_import_circle() -> None:
    graph = _graph()
    assert {"schema", "html", "audit_report"} <= set(graph)
    circles = {m: sorted(_reachable(graph, m)) for m in graph if m in _reachable(graph, m)}
    assert circles == {}


def test_the_schema_imports_no_renderer() -> None:
    graph = _graph()
    assert graph["schema"] == set()
    # the renderers and the checks read the data layer, never the class above them
    for module in ("html", "sections", "bounds", "markup", "view", "summary", "wording",
                   "formatting", "validate", "plots"):
        assert "audit_report" not in _reachable(graph, module), module
    assert {"schema", "html", "summary"} <= graph["audit_report"]


def test_no_monitor_is_named_in_the_package() -> None:
    spelled = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in MONITOR_NAMES:
                spelled.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert spelled == []
