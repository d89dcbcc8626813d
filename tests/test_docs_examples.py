"""Every Python example of CONTRIBUTING.md and docs/auditor.md runs: the fenced ``python`` blocks
of one document run in order, in one namespace that provides a small Opacus run (the names the
documents say they assume: ``privacy_engine``, ``model``, ``optimizer``, ``data_loader``,
``criterion``, ``train(steps)``, ``path``). A monitor an example registers is removed after."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import make_private_setup

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["CONTRIBUTING.md", "docs/auditor.md"]


def _blocks(doc: str) -> list[str]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _namespace(tmp_path: Path) -> dict[str, Any]:
    s = make_private_setup(sigma=1.0, n=256, batch_size=32)

    def train(steps: int = 5) -> None:
        s.train(steps)

    return {"privacy_engine": s.engine, "model": s.model, "optimizer": s.optimizer,
            "data_loader": s.loader, "criterion": s.criterion, "train": train,
            "path": str(tmp_path / "checkpoint.pt")}


@pytest.fixture
def registry_restored():
    from dpaudit_torch.audit.monitors import base

    before, default = dict(base.MONITORS), list(base._DEFAULT)
    yield
    base.MONITORS.clear()
    base.MONITORS.update(before)
    base._DEFAULT[:] = default


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_example_runs(doc: str, tmp_path: Path, registry_restored: None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(doc)
    assert blocks, f"{doc} has no python example"
    module = types.ModuleType("doc_example")  # a real module: dataclasses look their class up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    ns.update(_namespace(tmp_path))
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{doc}[python block {i}]", "exec"), ns)
        except Exception as e:  # pragma: no cover - the message names the block
            raise AssertionError(f"{doc}, python block {i} failed: {e!r}\n{code}") from e
    auditor = ns.get("auditor")
    if auditor is not None and auditor.attached:
        auditor.detach()


def _doc_texts() -> dict[str, str]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in docs}


def test_the_docs_say_what_the_public_classes_have() -> None:
    """What the documents say about the package's public classes holds: no "`X` has no `m`" for
    a method X has (docs/examples.md said `PrivacyAuditor` had no `state_dict` long after it
    had one), and every ``X.m(`` they name exists."""
    import dpaudit_torch

    found: list[str] = []
    for doc, text in _doc_texts().items():
        flat = " ".join(text.split())  # sentences wrap across lines
        for cls, attr in re.findall(r"`(\w+)` has no `(\w+)`", flat):
            if hasattr(getattr(dpaudit_torch, cls, None), attr):
                found.append(f"{doc}: `{cls}` has no `{attr}`, but it has")
        for cls, attr in re.findall(r"`(\w+)\.(\w+)\(", flat):
            obj = getattr(dpaudit_torch, cls, None)
            if isinstance(obj, type) and not hasattr(obj, attr):
                found.append(f"{doc}: `{cls}.{attr}(` does not exist")
    assert found == []
    examples = " ".join(_doc_texts()["docs/examples.md"].split())
    assert "`PrivacyAuditor.state_dict()` / `load_state_dict()`" in examples


def test_the_check_of_what_the_classes_have_sees_a_false_denial() -> None:
    import dpaudit_torch

    text = "`PrivacyAuditor` has no `state_dict` yet"
    (cls, attr), = re.findall(r"`(\w+)` has no `(\w+)`", text)
    assert hasattr(getattr(dpaudit_torch, cls), attr)
