"""The auditor's per-step host work on a thread of its own, run synchronously.

glibc's allocator gives every thread an arena of its own. A large model's per-step tensors on
the CPU are carved from the main thread's heap (its mmap threshold rises to 32 MiB after large
frees), and the auditor's own small allocations of a step (a step's plan, index and value
arrays, the testers' state at a check) land among them: blocks that outlive a training tensor
keep the heap from reusing and returning the memory around them, and the process's resident
memory grows by far more than the auditor allocates (measured for a 100M-parameter model in
per-sample mode on the CPU: up to 1 GB more resident between steps, docs/benchmarks.md,
"scale"). Run on another thread, the same work allocates from that thread's arena and leaves
the training thread's heap as training alone shapes it.

The training thread hands each piece of work over and waits for it (:meth:`HostThread.call`):
nothing runs concurrently with training, results and exceptions come back as if the call were
made in place, and the order of every operation is unchanged. PyTorch's grad mode, which is
per thread, is carried over. A hand-over costs tens of microseconds, so the auditor uses the
thread only where steps are long (docs/auditor.md, "Memory").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["HostThread", "run_here"]

T = TypeVar("T")


def run_here(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the calling thread (what the auditor does without a host thread)."""
    return fn()


class HostThread:
    """One daemon thread that runs the calls handed to it, one at a time, while the caller
    waits. Started at construction; :meth:`close` ends it (idempotent)."""

    def __init__(self, name: str = "dpaudit-host") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, grad, box, done = job
            try:
                with torch.set_grad_enabled(grad):
                    box.append((True, fn()))
            except BaseException as e:  # handed back to the caller, raised there
                box.append((False, e))
            finally:
                done.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the host thread; returns its result or raises its exception here.
        Called from the host thread itself (a nested call), it runs in place."""
        if threading.current_thread() is self._thread:
            return fn()
        if not self._thread.is_alive():
            raise RuntimeError("the auditor's host thread has ended")
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._jobs.put((fn, torch.is_grad_enabled(), box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        """End the thread once the work handed over so far is done (idempotent)."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
