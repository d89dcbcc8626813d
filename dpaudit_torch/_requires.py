"""One-line errors for the examples' optional dependencies (docs/examples.md, "Installing the
examples' dependencies").

The package itself needs torch, Opacus, NumPy and SciPy only. The examples also use torchvision,
tqdm, transformers, accelerate and peft, which the ``examples`` extra installs. An example calls
:func:`require` before importing any of them, so that a missing one ends the script with one line
that names the command installing it, not with a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

EXTRA = "examples"
INSTALL_HINT = (f"pip install 'dpaudit-torch[{EXTRA}]' (from a clone of the repository: "
                f".venv/bin/pip install -e '.[{EXTRA}]')")


def missing(modules: tuple[str, ...]) -> list[str]:
    """The names among ``modules`` that cannot be imported here."""
    absent = []
    for name in modules:
        if name in sys.modules and sys.modules[name] is None:  # blocked on purpose
            absent.append(name)
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            absent.append(name)
    return absent


def require(script: str, *modules: str) -> None:
    """Exit with status 2 and one line on stderr if any of ``modules`` is not installed (for
    scripts: the examples call it at start-up, as a command line would)."""
    absent = missing(modules)
    if absent:
        sys.stderr.write(f"{script} needs {', '.join(absent)}, not installed here: "
                         f"{INSTALL_HINT}\n")
        raise SystemExit(2)
