"""Start-up hook of the processes that ``dpaudit run`` launches (docs/auditor.md, "Auditing an
unmodified script: dpaudit run").

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that has
one; ``dpaudit run`` puts this file's directory first on ``PYTHONPATH``. When the environment
variable ``DPAUDIT_RUN_CONFIG`` is set, it installs a one-shot import hook that waits for the
first ``import opacus``; only then is :mod:`dpaudit_torch.launch` imported, which wraps
``PrivacyEngine.make_private*``. A process that never imports Opacus (``torchrun``'s own agent,
a tokenizer's helper) imports neither torch nor dpaudit_torch because of this file. Then it runs
the ``sitecustomize`` this one shadows, if there is one further down ``sys.path``.

Standard library only, and nothing may raise out of this module: a failure is one line on
stderr and the process goes on unaudited (``dpaudit run`` then says that nothing was audited).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

CONFIG_ENV = "DPAUDIT_RUN_CONFIG"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _on_opacus(module: ModuleType) -> None:
    try:
        from dpaudit_torch import launch

        launch.install(module)
    except Exception as exc:  # noqa: BLE001 - never break the user's import of opacus
        print(f"dpaudit run: the audit hook could not be installed in {sys.executable} "
              f"({type(exc).__name__}: {exc}); this process is not audited", file=sys.stderr)
        try:
            from dpaudit_torch import launch

            launch.record_hook_failure(f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001, S110 - dpaudit_torch itself is not importable
            _record_without_package(f"{type(exc).__name__}: {exc}")


def _record_without_package(reason: str) -> None:
    """A status file saying that this interpreter cannot import dpaudit_torch (read by the
    ``dpaudit run`` process; the format of :func:`dpaudit_torch.launch.record_hook_failure`)."""
    import json

    try:
        status_dir = json.loads(os.environ[CONFIG_ENV])["status_dir"]
        path = os.path.join(status_dir, f"status-{os.getpid()}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "executable": sys.executable, "calls": [],
                       "hook_error": reason}, f)
    except Exception:  # noqa: BLE001, S110 - nothing more can be said
        pass


class _OpacusImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; on the first ``import opacus`` it lets the other finders find the
    package and runs :func:`_on_opacus` right after the package's ``__init__`` has run."""

    done = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "opacus" or self.done:
            return None
        self.done = True  # one shot (it stays in sys.meta_path: the import is iterating it)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _on_opacus(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    if not os.environ.get(CONFIG_ENV):
        return
    if "opacus" in sys.modules:  # cannot happen at start-up; a re-import of this module
        _on_opacus(sys.modules["opacus"])
    elif not any(isinstance(f, _OpacusImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _OpacusImportHook())


def _chain() -> None:
    """Run the ``sitecustomize`` this module shadows (the next one on ``sys.path``), as Python
    would have; an error in it is reported the way ``site`` reports one."""
    here = os.path.normcase(_HERE)
    rest = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as site.execsitecustomize does
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return
    sys.modules["_dpaudit_chained_sitecustomize"] = module


try:
    _install()
except Exception as _exc:  # noqa: BLE001 - a start-up hook never stops the interpreter
    print(f"dpaudit run: start-up hook failed ({type(_exc).__name__}: {_exc}); this process is "
          f"not audited", file=sys.stderr)
_chain()
