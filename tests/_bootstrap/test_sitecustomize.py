"""The bootstrap of ``dpaudit run`` (dpaudit_torch/_bootstrap/sitecustomize.py): in a process
started with its directory first on ``PYTHONPATH`` and ``DPAUDIT_RUN_CONFIG`` set, it imports
nothing heavy until Opacus is imported, then wraps ``PrivacyEngine.make_private*``; it runs the
``sitecustomize`` it shadows. The end-to-end runs are in tests/test_launch.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dpaudit_torch import launch

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_bootstrap_imports_nothing_heavy_and_chains_to_the_shadowed_sitecustomize(
        tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n",
                                            encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(launch.bootstrap_dir()), str(other), str(ROOT)]),
        **{launch.CONFIG_ENV: json.dumps({"out": str(tmp_path), "status_dir": str(tmp_path)})})
    proc = _python("import os, sys; print(os.environ.get('CHAINED'), "
                   "sorted(m for m in sys.modules if m.split('.')[0] in "
                   "('torch', 'dpaudit_torch', 'opacus')))", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "[]"]  # chained; neither torch nor dpaudit imported
    assert not list(tmp_path.glob("status-*.json"))  # no Opacus: nothing to say


def test_bootstrap_wraps_make_private_on_import_of_opacus(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(launch.bootstrap_dir()), str(ROOT)]),
               **{launch.CONFIG_ENV: json.dumps({"out": str(tmp_path),
                                                  "status_dir": str(tmp_path)})})
    proc = _python("from opacus.privacy_engine import PrivacyEngine as P; "
                   "print(sorted(n for n in vars(P) if n.startswith('make_private') "
                   "and getattr(vars(P)[n], '_dpaudit_wrapped', False)))", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['make_private', 'make_private_with_epsilon']"
    (status,) = tmp_path.glob("status-*.json")  # an Opacus process says what it saw
    assert json.loads(status.read_text(encoding="utf-8"))["calls"] == []
    # without the variable the bootstrap does nothing
    env.pop(launch.CONFIG_ENV)
    proc = _python("import sys, opacus; print('dpaudit_torch.launch' in sys.modules)", env)
    assert proc.stdout.strip() == "False", proc.stderr
