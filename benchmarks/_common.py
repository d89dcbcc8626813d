"""Shared helpers for benchmark scripts: machine description and docs/benchmarks.md sections.

Each benchmark owns one section of ``docs/benchmarks.md`` delimited by
``<!-- BEGIN name -->`` / ``<!-- END name -->`` and rewrites only that section, so that
benchmarks can be re-run independently.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"

HEADER = (
    "# Benchmarks\n\n"
    "Every table below is written by the script named in its section, together with the exact "
    "command and the machine it ran on. Ratios measured within one run are the figures of merit; "
    "absolute times on shared machines are noise.\n"
)


def machine() -> str:
    """One line describing where the benchmark ran."""
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.system()} {platform.machine()} ({cpu}), {os.cpu_count()} CPUs visible, "
        f"torch {torch.__version__} with {threads} thread(s), {gpu}, Python "
        f"{sys.version.split()[0]}"
    )


def command() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of docs/benchmarks.md with ``body``."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else HEADER
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def make_private_sgd(model: Any, X: torch.Tensor, Y: torch.Tensor, batch: int, mode: str,
                     noise_generator: torch.Generator,
                     loader_generator: torch.Generator | None = None,
                     lr: float = 0.05) -> tuple[Any, Any, Any, Any, Any]:
    """The benchmarks' DP-SGD set-up: SGD (``lr``), a loader of ``batch`` (Opacus makes it a
    Poisson loader at q = 1 / len(loader)), RDP accountant, sigma 1, C 1, cross-entropy, in
    grad-sample ``mode``; returns (engine, model, optimizer, loader, criterion)."""
    import warnings

    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    dl = DataLoader(TensorDataset(X, Y), batch_size=batch, generator=loader_generator)
    engine = PrivacyEngine(accountant="rdp")
    crit = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(module=model, optimizer=opt, data_loader=dl,
                                  noise_multiplier=1.0, max_grad_norm=1.0,
                                  grad_sample_mode=mode, criterion=crit,
                                  noise_generator=noise_generator)
    if mode == "ghost":
        model, opt, crit, dl = out
    else:
        model, opt, dl = out
    return engine, model, opt, dl, crit

