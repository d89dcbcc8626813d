"""Numba set-up shared by the compiled kernels (``stats/_kernels.py``,
``opacus_tap/_step_kernels.py``).

Three things, all decided before the first kernel is compiled:

* **Where the machine code is cached.** Numba's on-disk cache (``cache=True``) normally lives in
  ``__pycache__`` next to the kernel's source file. A package installed into a read-only
  location (a system site-packages, a shared environment, a container image) cannot be written
  there, so the kernels are then cached per user, in ``$XDG_CACHE_HOME/dpaudit_torch/numba`` (or
  ``~/.cache/dpaudit_torch/numba``). A user's own ``NUMBA_CACHE_DIR`` always wins, and so does a
  user's ``NUMBA_CACHE_LOCATOR_CLASSES``. Without any writable place the kernels are compiled
  in memory, in every process (nothing breaks; the first audited steps are slower).
* **One message when they compile** (:data:`COMPILE_MESSAGE`, ``"compiling the audit kernels,
  once ..."``, INFO on this module's logger; the ``dpaudit`` command shows it, and only it of
  the INFO records, as a line of its own without ``-v``; where nobody configured logging it is
  logged at WARNING instead, so that Python's last-resort handler prints it and a script's
  first seconds are not silent). Loading them from the cache is silent.
* **Compiling before training** (:func:`dpaudit_torch._warmup.warm_up`, with
  :func:`compile_all`): the auditor compiles, or loads, every kernel for the argument types
  that the audit will pass, when it is attached, so that the first training steps are not the
  ones that wait for the compiler.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
from numba.core import event as numba_event

logger = logging.getLogger(__name__)

__all__ = ["CacheChoice", "cache_choice", "choose_cache", "njit_kernel", "user_cache_dir",
           "compile_all", "host_grads_type", "COMPILE_MESSAGE"]

#: the one message logged when the kernels compile (its argument: where they are cached)
COMPILE_MESSAGE = "compiling the audit kernels, once (%s)"

#: the package directory and the directories holding compiled kernels
PACKAGE_DIR = Path(__file__).resolve().parent
KERNEL_DIRS = (PACKAGE_DIR / "stats", PACKAGE_DIR / "opacus_tap")


@dataclass(frozen=True)
class CacheChoice:
    """Where the kernels' machine code is cached.

    ``where``: ``"NUMBA_CACHE_DIR"`` (the user's setting), ``"package"`` (``__pycache__`` next
    to the sources, Numba's default), ``"user"`` (the per-user cache directory, when the package
    is read-only) or ``"none"`` (nothing writable: compiled in every process). ``path``: the
    directory (None for ``"none"``)."""

    where: str
    path: Path | None

    @property
    def enabled(self) -> bool:
        return self.where != "none"

    def describe(self) -> str:
        if self.where == "none":
            return ("no writable cache directory, so they compile again in every process; set "
                    "NUMBA_CACHE_DIR to a writable directory to keep them")
        if self.path is None:
            return "Numba caches them in its per-user cache directory"
        if self.where == "package":
            return f"Numba caches them in __pycache__ next to the sources, under {self.path}"
        return f"Numba caches them in {self.path}"


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$XDG_CACHE_HOME/dpaudit_torch/numba``, else ``~/.cache/dpaudit_torch/numba`` (None if
    there is no home directory). A relative ``XDG_CACHE_HOME`` is ignored, as the XDG base
    directory specification requires."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME", "")
    if base and os.path.isabs(base):
        return Path(base) / "dpaudit_torch" / "numba"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return None
    return home / ".cache" / "dpaudit_torch" / "numba"


def _writable(directory: Path) -> bool:
    """Whether files can be created in ``directory`` (created if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


def choose_cache(numba_cache_dir: str | None, kernel_dirs: Sequence[Path],
                 user_dir: Path | None) -> CacheChoice:
    """The cache location: the user's ``NUMBA_CACHE_DIR`` if set; else ``__pycache__`` next to
    the kernels if every one of those is writable; else ``user_dir`` if writable; else none."""
    if numba_cache_dir:
        return CacheChoice("NUMBA_CACHE_DIR", Path(numba_cache_dir))
    pycache = [Path(d) / "__pycache__" for d in kernel_dirs]
    if all(_writable(p) for p in pycache):
        return CacheChoice("package", pycache[0].parent.parent)
    if user_dir is not None and _writable(user_dir):
        return CacheChoice("user", user_dir)
    return CacheChoice("none", None)


def _in_package(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(PACKAGE_DIR)
    except (OSError, ValueError):
        return False


def _install_locator(choice: CacheChoice) -> bool:
    """Put a cache locator for this package's kernels (and no other code) first in Numba's
    list, pointing at ``choice.path``. False if this Numba has no such hook: its own per-user
    fallback (``~/.cache/numba``) then applies."""
    try:
        from numba.core import caching
        mixin = caching._SourceFileBackedLocatorMixin
        base = caching._CacheLocator
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # newer / older Numba
        locators = impl._locator_classes
    except (ImportError, AttributeError):
        return False
    root = choice.path
    assert root is not None

    class UserCacheLocator(mixin, base):  # type: ignore[misc, valid-type]
        """This package's kernels, cached under the per-user directory."""

        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(root / self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if numba.config.CACHE_DIR or not _in_package(py_file):
                return None
            return super().from_function(py_func, py_file)

    if not any(getattr(c, "__name__", "") == "UserCacheLocator" for c in locators):
        impl._locator_classes = [UserCacheLocator, *locators]
    return True


_CHOICE: CacheChoice | None = None


def cache_choice() -> CacheChoice:
    """The cache location of this process (decided once, at the first kernel definition)."""
    global _CHOICE
    if _CHOICE is None:
        choice = choose_cache(numba.config.CACHE_DIR, KERNEL_DIRS, user_cache_dir())
        if choice.where == "user" and not _install_locator(choice):
            choice = CacheChoice("user", None)  # Numba's own per-user directory
        _CHOICE = choice
        logger.debug("Numba kernel cache: %s (%s)", choice.where, choice.path)
    return _CHOICE


# ---------------------------------------------------------------------------- the message
_KERNELS: list[Any] = []
_state = {"announced": False, "compiled": 0}


def _ours(event: Any) -> Any:
    disp = event.data.get("dispatcher") if isinstance(event.data, dict) else None
    return disp if any(disp is k for k in _KERNELS) else None


class _CompileListener(numba_event.Listener):
    """Logs once per process when one of this package's kernels is compiled (not when it is
    loaded from the cache: Numba fires ``numba:compile`` only for a real compilation)."""

    def __init__(self) -> None:
        self._started: list[float] = []

    def on_start(self, event: Any) -> None:
        if _ours(event) is None:
            return
        if not _state["announced"]:
            _state["announced"] = True
            # nobody configured logging: WARNING, which Python's last-resort handler prints
            level = logging.INFO if logger.hasHandlers() else logging.WARNING
            logger.log(level, COMPILE_MESSAGE, cache_choice().describe())
        self._started.append(time.perf_counter())

    def on_end(self, event: Any) -> None:
        disp = _ours(event)
        if disp is None or not self._started:
            return
        _state["compiled"] += 1
        logger.debug("compiled %s in %.2f s", disp.py_func.__name__,
                     time.perf_counter() - self._started.pop())


numba_event.register("numba:compile", _CompileListener())


def njit_kernel(fn: Callable[..., Any], options: dict[str, Any]) -> Any:
    """``numba.njit(cache=..., **options)(fn)`` for one of this package's kernels (see
    :class:`dpaudit_torch._compiled.Kernel`): cached where :func:`cache_choice` says, announced
    when compiled."""
    disp = numba.njit(cache=cache_choice().enabled, **options)(fn)
    _KERNELS.append(disp)
    return disp


# ---------------------------------------------------------------------------- warm-up
def compile_all(jobs: Sequence[tuple[Any, Any]]) -> int:
    """Compile (or load from the cache) each ``(dispatcher, signature)`` of ``jobs``; returns
    how many kernels were compiled (0: all loaded from the cache, or ready). The jobs of an
    audit are listed by :func:`dpaudit_torch._warmup.warm_up`."""
    before = _state["compiled"]
    start = time.perf_counter()
    for disp, sig in jobs:
        disp.compile(sig)
    compiled = _state["compiled"] - before
    if compiled:
        logger.info("audit kernels compiled in %.1f s", time.perf_counter() - start)
    return compiled


def host_grads_type(params: Sequence[Any]) -> Any:
    """The NumPy dtype of the parameters' gradients if the compiled CPU observation reads them
    (every tensor on the CPU, one float dtype NumPy knows), else None."""
    import torch

    dtypes = {getattr(p, "dtype", None) for p in params}
    if not params or len(dtypes) != 1:
        return None
    if any(getattr(getattr(p, "device", None), "type", None) != "cpu" for p in params):
        return None
    (dt,) = dtypes
    if dt not in (torch.float32, torch.float64, torch.float16):
        return None
    return numba.from_dtype(torch.empty(0, dtype=dt).numpy().dtype)
