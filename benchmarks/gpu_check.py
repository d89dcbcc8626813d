"""GPU readiness of the auditor: statistics, host synchronisations, overhead, memory, detection.

One command on one GPU (a few minutes; parts not started within ``--budget-s`` seconds are
skipped, so that it stays under 8), one table in docs/benchmarks.md (section "gpu_check"):

    python benchmarks/gpu_check.py [--model resnet18|wrn16-4] [--batches 256,1024]
                                   [--modes hooks,ghost] [--lora] [--budget-s 390] [--no-write]
    python benchmarks/gpu_check.py --smoke   # the same logic on the CPU at tiny sizes

What it checks, on CUDA:

1. **Statistics, CUDA = CPU.** Every sequential tester of ``dpaudit_torch.registry.TESTERS``
   (the auditor's options: per-step Gaussian null of noise multiplier 1, its grid, level
   alpha / 2, the capped MMD witness) fed the same seeded pairs, a correct stream and one with
   half the noise, by check-sized chunks, on CUDA and on the CPU: the log-wealth after every
   pair agrees within 1e-9 (absolute; float64), and so do the rejection and the bound. The
   noise monitor's tests, the sampling monitor's test and the one-run scores, fed the same
   seeded step records on CUDA (finiteness as a device flag, as the adapter gives it there)
   and on the CPU: the evidence within 1e-12, the scores within 1e-9 (relative).
2. **The auditor on CUDA**, default settings, on the digits CNN (``dpaudit_torch.demo``,
   scikit-learn's bundled digits, tiled to 8,192 images) and on a ResNet-18 (torchvision's, with
   GroupNorm from Opacus's ``ModuleValidator.fix``) or a WideResNet-16-4
   (``examples/cifar10_wrn.py``) on ``torchvision.datasets.FakeData`` (8,192 images 3x32x32,
   nothing downloaded), Poisson batches of expected size 256 and 1024 (q = 1/32, 1/8), hooks
   and ghost clipping:

   * host synchronisations inside ``optimizer.step()`` (where everything the auditor does
     happens) at each of its first 15 audited steps (3 checks), counted with
     ``torch.cuda.set_sync_debug_mode("warn")``, which warns at every synchronising call
     (``.item()``, ``.cpu()``, a blocking copy, ...): the target is 0 between checks and at
     most 1 per check; the unaudited step's own count is given beside them;
   * the audited / unaudited step time (blocks of whole training steps with the auditor's hooks
     detached and attached again, alternated; ``torch.cuda.synchronize()`` around each block;
     a third block per round times the auditor with its gathers unpacked, one take per tensor,
     against the packed gathers it runs on an accelerator, ``dpaudit_torch/_gather.py``)
     and peak memory (``torch.cuda.max_memory_allocated()`` over unaudited steps before the
     auditor exists, and over audited steps after a check);
   * ``finalize()`` and the report;
   * the always-on guard's step-time targets (``STEP_TARGETS``, reported rows, not hard): at
     most x1.05 for ResNet-18 and WRN-16-4 at batch 256, x1.15 for the digits CNN, x1.10 for
     the LoRA model of ``examples/llm_lora_dp.py`` (``--lora``: hooks mode, the first batch
     size; GPT-2-style LM from a config, token ids as data, the example's per-sequence loss).
3. **Detection**: the ``no-noise`` and ``noise-halved`` bugs (``dpaudit_torch.testing.bugs``)
   are proven at the first check (step ``check_every``), on both models and modes at the first
   batch size.
4. **Tester placement** (``tester_placement``, ``dpaudit_torch/audit/placement.py``): the
   sequential monitor fed the same seeded pairs (a correct stream, sigma 1) with its testers on
   the host (the check's one transfer brings the pairs) and on CUDA (fed the device tensors),
   at ``check_every`` 5 and 50 with 16 and 64 pairs per step (``k_pairs``): the same log
   e-values (within 1e-9), decision and bound (hard), and the check's median time and host
   synchronisations for each placement (reported). The faster placement of each setting is
   printed as the entries of ``MEASURED_PLACEMENTS``, the table ``tester_placement="auto"``
   reads (copy them there to re-derive the rule; a few seconds of the budget).

Exit code 0 when every hard check holds (1 and 3, no synchronisation between checks and at
most 1 per check: a check copies everything buffered on the device since the last one to the
host in one transfer, docs/auditor.md "On a GPU"). Without a CUDA device it prints "no CUDA
device" and exits 0.

``--smoke`` runs the same code on the CPU at tiny sizes and writes nothing (about 20 s;
tests/test_gpu_check.py runs it): batch 8, check_every 2, 200 one-run canaries, a few steps,
data sets of 64 images, and a WideResNet-10-1 in place of the larger model, whose builder it
checks with one unaudited DP-SGD step per mode (a ResNet-18 step takes seconds on a CPU);
the placement part runs at check_every 2 and 5 with 4 pairs per step, the "device"
placement's testers running their accelerator code on the CPU (``TESTER_DEVICE_CODE``).
"CUDA" is then the accelerator's code path forced on the CPU (the testers' torch code,
``force_torch`` / ``force_vectorised``; the monitors fed device flags; the auditor through
``dpaudit_torch.testing.host_sync.force_device_path``), and the synchronisation count is the CPU
instrument of tests/audit/test_device_path.py: every host read of a tensor (``.item()``,
``.cpu()``, ``.tolist()``, ``.numpy()``, ``bool()``, ``float()``, ``int()``) inside
``optimizer.step()``; memory is not measured.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    command,
    machine,
    make_private_sgd,
    markdown_table,
    write_section,
)

ROOT = Path(__file__).resolve().parent.parent
from dpaudit_torch.testing.host_sync import TESTER_DEVICE_CODE  # noqa: E402

#: tolerances of the CUDA = CPU comparisons (float64)
TOL_WEALTH = 1e-9  # absolute, on a tester's log-wealth after each pair
TOL_MONITOR = 1e-12  # absolute, on the noise and sampling monitors' log e-values
TOL_SCORES = 1e-9  # relative, on the one-run scores
#: per tester: the options that make it run, on the CPU, the code an accelerator runs (--smoke)
DEVICE_PATH_OPTIONS: dict[str, dict[str, Any]] = TESTER_DEVICE_CODE
BUGS = ("no-noise", "noise-halved")
HEADERS = ["check", "setting", "measured", "criterion", "met"]


@dataclass(frozen=True)
class Sizes:
    """How much each part runs (the GPU run, or --smoke)."""

    batches: tuple[int, ...]
    n_images: int  # the data set (q = batch / n_images)
    check_every: int  # the auditor's check period (5 is its default)
    warmup: int  # unaudited steps before anything is measured
    mem_steps: int  # steps of each peak-memory block
    counted: int  # audited steps whose synchronisations are counted (from the first)
    reps: int  # triples of timing blocks (auditor detached / attached / gathers unpacked)
    block: int  # steps per timing block
    stat_steps: int  # steps of pairs / records for the statistics comparison
    stat_k: int  # pairs per step there
    m_canaries: int | None  # the auditor's one-run canaries (None: its default)
    placement_every: tuple[int, ...]  # check periods of the tester-placement timing
    placement_k: tuple[int, ...]  # pairs per step (k_pairs) there
    placement_checks: int  # checks per setting: 1 warm-up, 1 counted, the rest timed


GPU = Sizes(batches=(256, 1024), n_images=8192, check_every=5, warmup=3, mem_steps=5,
            counted=15, reps=3, block=10, stat_steps=60, stat_k=16, m_canaries=None,
            placement_every=(5, 50), placement_k=(16, 64), placement_checks=10)
SMOKE = Sizes(batches=(8,), n_images=64, check_every=2, warmup=1, mem_steps=1, counted=6,
              reps=1, block=1, stat_steps=20, stat_k=8, m_canaries=200,
              placement_every=(2, 5), placement_k=(4,), placement_checks=3)
#: --smoke trains this small WideResNet in place of the larger model
SMOKE_STAND_IN = "wrn10-1"


#: the always-on guard's step-time targets on a GPU (audited over unaudited, reported rows):
#: the larger models at batch 256, the digits CNN at every batch
STEP_TARGETS = {"digits": 1.15, "resnet18": 1.05, "wrn16-4": 1.05, "lora": 1.10}


@dataclass
class Row:
    check: str
    setting: str
    measured: str
    criterion: str
    met: str  # "yes", "no", "-" (reported only) or "error"
    hard: bool = True  # a "no" here fails the run

    def cells(self) -> list[object]:
        return [self.check, self.setting, self.measured, self.criterion, self.met]


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _side(device: torch.device) -> str:
    """How the rows name the accelerator's side of a comparison."""
    return "CUDA" if device.type == "cuda" else "accelerator path (on the CPU)"


# ------------------------------------------------------------------------------ synchronisation
class SyncCounter:
    """Host synchronisations of a block: CUDA's sync debug mode on a GPU (one warning per
    synchronising call, with the Python line that made it); in --smoke, the CPU instrument
    (every host read of a tensor on the accelerator's code path)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host: Any = None
        if not self.cuda:
            from dpaudit_torch.testing.host_sync import HostReadCounter

            self._host = HostReadCounter().__enter__()

    def close(self) -> None:
        if self._host is not None:
            self._host.__exit__(None, None, None)
            self._host = None

    def run(self, fn: Callable[[], Any]) -> list[str]:
        """Run ``fn``; return where each synchronisation (host read) happened. (A warning
        raised inside a ``warnings.catch_warnings(record=True)`` of the code itself is its
        own: the accountant's reads log theirs; they touch no CUDA tensor.)"""
        if not self.cuda:
            with self._host.counting() as reads:
                fn()
            return [str(r) for r in reads if not r.host_side]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return [f"{Path(w.filename).name}:{w.lineno}" for w in caught
                if "synchroniz" in str(w.message)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------ 1. statistics
def _pair_stream(steps: int, k: int, noise: float, seed: int) -> tuple[torch.Tensor, ...]:
    """[steps, k] pairs of a per-step Gaussian mechanism (canary 1 at x, noise std ``noise``,
    units of C), float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    x = 1.0 + noise * torch.randn(steps, k, generator=g, dtype=torch.float64)
    y = noise * torch.randn(steps, k, generator=g, dtype=torch.float64)
    return x, y


def check_testers(device: torch.device, smoke: bool, sz: Sizes) -> list[Row]:
    from dpaudit_torch.audit import DEFAULT_TEST_OPTIONS
    from dpaudit_torch.audit.monitors import per_step_null_grid
    from dpaudit_torch.registry import TESTERS, tester_class

    eps, dels = per_step_null_grid(1.0)
    rows = []
    for name in TESTERS:
        for label, noise in (("correct (sigma 1)", 1.0), ("half the noise", 0.5)):
            x, y = _pair_stream(sz.stat_steps, sz.stat_k, noise, seed=11)
            runs = []
            for dev, accel in ((torch.device("cpu"), False), (device, True)):
                opts = {"simultaneous": True, "device": dev,
                        **DEFAULT_TEST_OPTIONS.get(name, {})}
                if accel and smoke:
                    opts.update(DEVICE_PATH_OPTIONS.get(name, {}))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t = tester_class(name)(eps, dels, 0.05 / len(TESTERS), **opts)
                traj = []
                for i in range(0, sz.stat_steps, sz.check_every):  # one update per check
                    xs = x[i:i + sz.check_every].reshape(-1).to(dev)
                    ys = y[i:i + sz.check_every].reshape(-1).to(dev)
                    traj.append(t.update_with_trajectory(xs, ys))
                runs.append((np.concatenate(traj), t))
            (a, ta), (b, tb) = runs
            diff = float(np.max(np.abs(a - b)))
            same = (ta.rejected_at == tb.rejected_at
                    and ta.epsilon_lower_bound == tb.epsilon_lower_bound)
            rows.append(Row(
                f"tester {name}: {_side(device)} = CPU",
                f"{a.size} pairs, {label}, {len(eps)} grid points",
                f"max abs diff of log-wealth {diff:.2e}; rejected at pair {tb.rejected_at} / "
                f"{ta.rejected_at}; bound {tb.epsilon_lower_bound:.4g} / "
                f"{ta.epsilon_lower_bound:.4g}",
                f"<= {TOL_WEALTH:g}, same decision and bound", _yes(diff <= TOL_WEALTH and same)))
    return rows


def _records(device: torch.device, deferred: bool, sz: Sizes, u_sizes: tuple[int, ...],
             m: int) -> list[Any]:
    """Seeded step records on ``device``; ``deferred``: finiteness as a device flag (the
    accelerator's form), else a host bool."""
    from dpaudit_torch.contract import StepRecord

    g = torch.Generator().manual_seed(5)
    k, u = sz.stat_k, sum(u_sizes)
    scale = torch.cat([torch.full((n,), 0.8 if i == 0 else 1.0, dtype=torch.float64)
                       for i, n in enumerate(u_sizes)])  # tensor 0: too little noise
    out = []
    for t in range(1, sz.stat_steps + 1):
        coins = torch.rand(k, generator=g) < 0.5
        vals = torch.randn(2 * k + m, generator=g, dtype=torch.float64)
        xi = scale * torch.randn(u, generator=g, dtype=torch.float64)
        std = 1e-3
        real = 1e-4 * torch.randn(u, generator=g, dtype=torch.float64)
        n_real = int(torch.binomial(torch.tensor(1000.0), torch.tensor(0.12), generator=g))
        finite: Any = torch.tensor(True, device=device) if deferred else True
        out.append(StepRecord(
            step=t, values=vals.to(device), x=vals[:k].to(device), y=vals[k:2 * k].to(device),
            coins=coins.to(device), sigma=1.0, sigma_claimed=1.0, finite=finite, n_real=n_real,
            noise=xi.to(device), noise_raw=(xi * std).to(device),
            release_raw=(real + xi * std).to(device), noise_std=std))
    return out


def check_monitors(device: torch.device, smoke: bool, sz: Sizes) -> list[Row]:
    """The noise and sampling monitors' evidence and the one-run scores: the accelerator's
    records (device tensors, deferred finiteness) against the CPU's."""
    from dpaudit_torch.audit import AuditConfig, MonitorContext
    from dpaudit_torch.audit.monitors import NoiseMonitor, OneRunMonitor, SamplingMonitor
    from dpaudit_torch.contract import (
        GROUP_NAMES,
        N_RECORDS,
        NOISE_MULTIPLIER,
        SAMPLE_RATE,
        TENSOR_GROUPS,
        TENSOR_NAMES,
    )

    u_sizes, m = (400, 300, 200), 300
    tensor_of = np.repeat(np.arange(len(u_sizes)), u_sizes)
    cfg = AuditConfig(k_pairs=sz.stat_k, m_canaries=m, check_every=sz.check_every)
    facts = {TENSOR_NAMES: [f"t{i}" for i in range(len(u_sizes))], TENSOR_GROUPS: [0, 0, 1],
             GROUP_NAMES: ["g0", "g1"], SAMPLE_RATE: 0.1, N_RECORDS: 1000,
             NOISE_MULTIPLIER: 1.0}

    def feed(dev: torch.device, accel: bool) -> dict[str, Any]:
        ctx = MonitorContext(config=cfg, k_pairs=sz.stat_k, m_canaries=m, device=dev,
                             warn=lambda _m: None, noise_tensor=tensor_of, facts=facts)
        mons = {"noise": NoiseMonitor(ctx), "sampling": SamplingMonitor(ctx),
                "one_run": OneRunMonitor(ctx)}
        if accel:
            mons["noise"].host_rows = False  # the accelerator's path (on the CPU in --smoke)
        log_e: dict[str, list[np.ndarray]] = {n: [] for n in mons}
        for rec in _records(dev, accel, sz, u_sizes, m):
            for mon in mons.values():
                mon.observe(rec)
            if rec.step % sz.check_every == 0:
                for n, mon in mons.items():
                    ev = mon.advance()
                    if ev is not None:
                        log_e[n].append(np.asarray(ev.log_e, dtype=np.float64))
        mons["noise"].finalize(None)
        return {"noise": np.concatenate(log_e["noise"]),
                "sampling": np.concatenate(log_e["sampling"]),
                "precision": mons["noise"].report_section()["precision"],
                "scores": mons["one_run"].stacked_scores().cpu().numpy()}

    ref, acc = feed(torch.device("cpu"), False), feed(device, True)
    rows = []
    for name in ("noise", "sampling"):
        diff = float(np.max(np.abs(ref[name] - acc[name])))
        extra = ""
        ok = diff <= TOL_MONITOR
        if name == "noise":
            same = ref["precision"] == acc["precision"]
            extra = f"; floating-point check {'identical' if same else 'DIFFERENT'}"
            ok = ok and same
        rows.append(Row(
            f"{name} monitor: {_side(device)} = CPU",
            f"{sz.stat_steps} steps, {sum(u_sizes)} noise coordinates on 3 tensors"
            if name == "noise" else f"{sz.stat_steps} steps, N 1000, q 0.1 (batches at 0.12)",
            f"max abs diff of log e-values {diff:.2e} (final {acc[name][-1]:.4g}){extra}",
            f"<= {TOL_MONITOR:g}", _yes(ok)))
    rel = float(np.max(np.abs(ref["scores"] - acc["scores"])
                       / np.maximum(1.0, np.abs(ref["scores"]))))
    rows.append(Row(f"one-run scores: {_side(device)} = CPU",
                    f"{sz.stat_steps} steps, {m} canaries, sum and likelihood-ratio scores",
                    f"max relative diff {rel:.2e}", f"<= {TOL_SCORES:g}",
                    _yes(rel <= TOL_SCORES)))
    return rows


# ------------------------------------------------------------------------------ tester placement
def _pair_records(device: torch.device, steps: int, k: int) -> list[Any]:
    """Step records of a correct per-step Gaussian mechanism (sigma 1) on ``device``, with
    finiteness as a device flag (the accelerator's form)."""
    from dpaudit_torch.contract import StepRecord

    x, y = _pair_stream(steps, k, 1.0, seed=13)
    coins = torch.ones(k, dtype=torch.bool, device=device)
    return [StepRecord(step=t + 1, values=torch.cat((x[t], y[t])).to(device), x=x[t].to(device),
                       y=y[t].to(device), coins=coins, sigma=1.0, sigma_claimed=1.0,
                       finite=torch.tensor(True, device=device)) for t in range(steps)]


def _time_placement(placement: str, device: torch.device, smoke: bool, every: int, k: int,
                    sz: Sizes, counter: SyncCounter) -> dict[str, Any]:
    """The sequential monitor with its testers at ``placement``, fed the same records: its
    check (the engine's transfer of what it buffered, then ``advance``) timed after one
    warm-up check and one counted check (host synchronisations, or host reads in --smoke)."""
    from dpaudit_torch.audit import AuditConfig, MonitorContext
    from dpaudit_torch.audit.monitors import SequentialPairsMonitor
    from dpaudit_torch.contract import NOISE_MULTIPLIER

    cfg = AuditConfig(k_pairs=k, m_canaries=0, check_every=every, tester_placement=placement)
    ctx = MonitorContext(config=cfg, k_pairs=k, m_canaries=0, device=device,
                         warn=lambda _m: None, facts={NOISE_MULTIPLIER: 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = SequentialPairsMonitor(ctx)
    if smoke:  # the testers' accelerator code, on the CPU (force_device_path does this)
        mon.force_device_code(TESTER_DEVICE_CODE)
    records = _pair_records(device, every * sz.placement_checks, k)
    log_e: list[np.ndarray] = []

    def check() -> None:
        mon.fetch_pending()  # the engine's one transfer (flags; with the testers on the
        ev = mon.advance()  # host, the pairs too), then the testers
        if ev is not None:
            log_e.append(np.asarray(ev.log_e, dtype=np.float64))

    times: list[float] = []
    reads = 0
    for c in range(sz.placement_checks):
        for rec in records[c * every:(c + 1) * every]:
            mon.observe(rec)
        if c == 1:
            reads = len(counter.run(check))
            continue
        _sync(device)
        t0 = time.perf_counter()
        check()
        _sync(device)
        if c:
            times.append(time.perf_counter() - t0)
    return {"time": statistics.median(times), "reads": reads, "log_e": np.concatenate(log_e),
            "bound": mon.sequential_bound(), "max": mon.max_log_wealth,
            "rejected": {n: t.rejected_at for n, t in mon.segment.testers.items()},
            "where": mon.report_section()["sequential"]["tester_placement"]}


def check_placement(device: torch.device, smoke: bool, sz: Sizes, counter: SyncCounter,
                    measured: dict[tuple[str, int, int], str]) -> list[Row]:
    """Where the sequential testers are fastest (``tester_placement``,
    ``dpaudit_torch/audit/placement.py``): their check with the testers on the host and on the
    device side by side, at each check period and pairs per step, with the same numbers either
    way; ``measured`` gets the faster placement of each setting (the rule's table)."""
    rows = []
    for every in sz.placement_every:
        for k in sz.placement_k:
            r = {p: _time_placement(p, device, smoke, every, k, sz, counter)
                 for p in ("host", "device")}
            h, d = r["host"], r["device"]
            setting = f"check_every {every}, {k} pairs per step ({every * k} pairs per check)"
            diff = float(np.max(np.abs(h["log_e"] - d["log_e"])))
            same = (h["rejected"] == d["rejected"] and abs(h["bound"] - d["bound"]) <= TOL_WEALTH
                    and abs(h["max"] - d["max"]) <= TOL_WEALTH)
            rows.append(Row(
                "tester placement: device = host", setting,
                f"max abs diff of log e-values {diff:.2e}; rejected at {d['rejected']} / "
                f"{h['rejected']}; testers ran on {d['where']['device']} / "
                f"{h['where']['device']}", f"<= {TOL_WEALTH:g}, same decision and bound",
                _yes(diff <= TOL_WEALTH and same)))
            faster = "device" if d["time"] < h["time"] else "host"
            measured[(device.type, every, k)] = faster
            what = "host reads of tensors" if smoke else "host synchronisations"
            rows.append(Row(
                "tester placement: time per check, host / device", setting,
                f"{1e3 * h['time']:.3f} / {1e3 * d['time']:.3f} ms (median of "
                f"{sz.placement_checks - 2} checks); faster: {faster}; {what} per check "
                f"{h['reads']} / {d['reads']}", "reported", "-", hard=False))
    return rows


# ------------------------------------------------------------------------------ models and data
def _resnet18() -> nn.Module:
    """torchvision's ResNet-18 (10 classes), BatchNorm replaced by GroupNorm
    (``ModuleValidator.fix``). Its blocks add the shortcut in place (``out += identity``) and
    use in-place ReLUs, which Opacus's full backward hooks refuse on current torch ("Output 0 of
    BackwardHookFunction is a view and is being modified inplace"): each basic block gets the
    same forward without the in-place operations."""
    import torchvision
    from opacus.validators import ModuleValidator
    from torchvision.models.resnet import BasicBlock

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ModuleValidator.fix(torchvision.models.resnet18(num_classes=10))
    for mod in model.modules():
        if isinstance(mod, nn.ReLU):
            mod.inplace = False
        if isinstance(mod, BasicBlock):
            mod.forward = types.MethodType(forward, mod)
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise RuntimeError(f"ResNet-18 is not Opacus-compatible after fix: {errors}")
    return model


#: --model lora: tokens per sequence
LORA_SEQ_LEN = 32


def _lora_example() -> Any:
    """examples/llm_lora_dp.py as a module (its model, data and loss builders)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import llm_lora_dp

    return llm_lora_dp


class _LogitsOnly(nn.Module):
    """A causal LM whose forward takes token ids and returns the logits only."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits


def build_model(name: str) -> nn.Module:
    if name == "digits":
        from dpaudit_torch.demo import DigitsCNN

        return DigitsCNN()
    if name == "resnet18":
        return _resnet18()
    if name == "lora":  # examples/llm_lora_dp.py: GPT-2-style LM from a config, LoRA adapters
        return _LogitsOnly(_lora_example().build_model())
    if name.startswith("wrn"):  # wrn<depth>-<width>: examples/cifar10_wrn.py
        sys.path.insert(0, str(ROOT / "examples"))
        from cifar10_wrn import WideResNet

        depth, width = name[3:].split("-")
        return WideResNet(depth=int(depth), width=int(width))
    raise ValueError(f"unknown model {name!r}")


_DATA: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}


def build_data(name: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) on the CPU: the digits tiled to ``n``, or FakeData 3x32x32."""
    key = (name if name in ("digits", "lora") else "fake", n)
    if key not in _DATA:
        if name == "lora":  # token ids; each sequence is its own next-token target
            ids = _lora_example().token_dataset(n, LORA_SEQ_LEN, seed=0).ids
            _DATA[key] = (ids, ids)
        elif name == "digits":
            from dpaudit_torch.demo import load_digits_tensors

            X, Y = load_digits_tensors(seed=0)[0].tensors
            idx = torch.arange(n) % X.shape[0]
            _DATA[key] = (X[idx].contiguous(), Y[idx].contiguous())
        else:
            from torchvision.datasets import FakeData
            from torchvision.transforms import ToTensor

            data = FakeData(size=n, image_size=(3, 32, 32), num_classes=10,
                            transform=ToTensor())
            xs, ys = zip(*(data[i] for i in range(n)))
            _DATA[key] = (torch.stack(xs), torch.as_tensor(ys, dtype=torch.long))
    return _DATA[key]


@dataclass
class Setup:
    model: nn.Module
    opt: Any
    crit: Any
    engine: Any
    dl: Any
    X: torch.Tensor
    Y: torch.Tensor
    batches: Iterator[torch.Tensor]
    device: torch.device
    n_params: int


def make_setup(model_name: str, mode: str, batch: int, device: torch.device, sz: Sizes,
               seed: int = 0) -> Setup:
    """The model made private with Opacus on ``device`` (sigma 1, C 1, q = batch / n), its
    data on the device, and an endless stream of Poisson index batches (drawn as Opacus's
    sampler draws them: every record independently with probability q)."""
    torch.manual_seed(seed)
    X, Y = build_data(model_name, sz.n_images)
    X, Y = X.to(device), Y.to(device)
    model = build_model(model_name).to(device)
    engine, model, opt, dl, crit = make_private_sgd(  # make_private: q = 1 / len(dl)
        model, X, Y, batch, mode, torch.Generator(device=device).manual_seed(1))

    def stream() -> Iterator[torch.Tensor]:
        g = torch.Generator().manual_seed(seed + 7)
        while True:
            mask = torch.rand(X.shape[0], generator=g) < dl.sample_rate
            yield mask.nonzero().reshape(-1).to(device)

    return Setup(model, opt, crit, engine, dl, X, Y, stream(), device,
                 sum(p.numel() for p in model.parameters()))


def forward_backward(s: Setup) -> None:
    idx = next(s.batches)
    s.opt.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's hooks on the first layer, secure RNG off
        out = s.model(s.X[idx])
        if out.dim() == 3:  # a causal LM's logits: next-token loss, per sequence
            loss = _lora_example().causal_lm_loss(out, s.Y[idx], s.crit)
        else:
            loss = s.crit(out, s.Y[idx])
        loss.backward()


def run_steps(s: Setup, steps: int) -> None:
    for _ in range(steps):
        forward_backward(s)
        s.opt.step()


def timed(s: Setup, steps: int) -> float:
    """Seconds per whole training step over a block (synchronised around it)."""
    _sync(s.device)
    t0 = time.perf_counter()
    run_steps(s, steps)
    _sync(s.device)
    return (time.perf_counter() - t0) / steps


def peak(s: Setup, steps: int) -> int | None:
    """Peak allocated device memory over ``steps`` steps (None on the CPU)."""
    if s.device.type != "cuda":
        run_steps(s, steps)
        return None
    _sync(s.device)
    torch.cuda.reset_peak_memory_stats(s.device)
    run_steps(s, steps)
    _sync(s.device)
    return int(torch.cuda.max_memory_allocated(s.device))


def _auditor(s: Setup, sz: Sizes, smoke: bool) -> Any:
    from dpaudit_torch.audit import PrivacyAuditor

    aud = PrivacyAuditor(s.engine, s.opt, s.dl, model=s.model, seed=1,
                         check_every=sz.check_every, m_canaries=sz.m_canaries)
    if smoke:  # the accelerator's code path, on the CPU
        from dpaudit_torch.testing.host_sync import force_device_path

        force_device_path(aud)
    return aud


# ------------------------------------------------------------------------------ 2. the auditor
def check_auditor(model_name: str, mode: str, batch: int, device: torch.device, sz: Sizes,
                  smoke: bool, counter: SyncCounter) -> list[Row]:
    s = make_setup(model_name, mode, batch, device, sz)
    setting = (f"{model_name} ({s.n_params:,} parameters), {mode}, batch {batch} "
               f"(q {s.dl.sample_rate:.4g})")
    run_steps(s, sz.warmup)
    base_syncs = []
    for _ in range(sz.mem_steps):  # the unaudited step's own synchronisations
        forward_backward(s)
        base_syncs.append(len(counter.run(s.opt.step)))
    peak_off = peak(s, sz.mem_steps)
    aud = _auditor(s, sz, smoke)
    between: list[int] = []
    at_check: list[int] = []
    sites: Counter[str] = Counter()
    check_sites: Counter[str] = Counter()
    for _ in range(sz.counted):
        forward_backward(s)

        def step() -> None:
            s.opt.step()
            _ = aud.should_stop, aud.latest_metrics  # what a training loop reads

        found = counter.run(step)
        if aud.step % aud.config.check_every == 0:
            at_check.append(len(found))
            check_sites.update(found)
        else:
            between.append(len(found))
            sites.update(found)
    peak_on = peak(s, sz.mem_steps)
    from dpaudit_torch.testing.host_sync import pack_gathers

    times: dict[str, list[float]] = {"off": [], "on": [], "unpacked": []}
    # the same setup with the auditor's hooks detached / attached (its gathers packed, as it
    # runs on an accelerator) / attached with one take per tensor; the order alternates
    for r in range(sz.reps):
        for variant in (("off", "on", "unpacked") if r % 2 == 0 else ("unpacked", "on", "off")):
            if variant == "off":
                aud.detach()
            else:
                aud.attach()
                pack_gathers(aud, variant == "on")
            times[variant].append(timed(s, sz.block))
    aud.attach()
    pack_gathers(aud, True)
    off, on, unpacked = times["off"], times["on"], times["unpacked"]
    t0 = time.perf_counter()
    report = aud.finalize()
    t_final = time.perf_counter() - t0
    print(f"  {setting}: finalize {t_final:.1f} s, verdict {report.verdict}", flush=True)
    what = "host reads of tensors (CPU instrument)" if smoke else "host synchronisations"
    where = "; at " + ", ".join(f"{k} x{v}" for k, v in sites.most_common(4)) if sites else ""
    if check_sites:  # where a check waits (most frequent first)
        where_check = " (" + ", ".join(f"{k} x{v}" for k, v in check_sites.most_common(4)) + ")"
    else:
        where_check = ""
    rows = [Row(
        f"auditor: {what} per step, between checks / at checks", setting,
        f"between: max {max(between, default=0)} over {len(between)} steps{where}; at checks: "
        f"{', '.join(map(str, at_check))}{where_check}; unaudited step: max "
        f"{max(base_syncs, default=0)}",
        "0 between checks, at most 1 per check",
        _yes(max(between, default=0) == 0 and max(at_check, default=0) <= 1))]
    t_off, t_on, t_un = statistics.fmean(off), statistics.fmean(on), statistics.fmean(unpacked)
    mem = ("memory not measured (CPU)" if peak_off is None or peak_on is None else
           f"peak memory x{peak_on / peak_off:.3f} ({peak_off / 2**20:,.0f} -> "
           f"{peak_on / 2**20:,.0f} MiB)")
    target = STEP_TARGETS.get(model_name)
    applies = target is not None and not smoke and (model_name == "digits" or batch == 256)
    rows.append(Row("auditor: cost against the unaudited step", setting,
                    f"step time x{t_on / t_off:.3f} ({1e3 * t_off:.2f} -> {1e3 * t_on:.2f} ms, "
                    f"{sz.reps} rounds of off / on / unpacked {sz.block}-step blocks; gathers "
                    f"one take per tensor instead of packed: x{t_un / t_off:.3f}); {mem}",
                    f"step time <= x{target:.2f} (reported)" if applies else "reported",
                    _yes(t_on / t_off <= target) if applies and target is not None else "-",
                    hard=False))
    aud.detach()
    return rows


# ------------------------------------------------------------------------------ 3. detection
def check_bug(model_name: str, mode: str, batch: int, bug: str, device: torch.device, sz: Sizes,
              smoke: bool) -> Row:
    from dpaudit_torch.testing.bugs import apply_bug

    s = make_setup(model_name, mode, batch, device, sz)
    apply_bug(s.opt, bug)
    aud = _auditor(s, sz, smoke)
    first = aud.steps_at_attach + aud.config.check_every
    steps = 0
    while not aud.should_stop and steps < 3 * aud.config.check_every:
        run_steps(s, 1)
        steps += 1
    deciding = sorted({f.monitor for f in aud.engine.findings() if f.level == "violation"})
    ok = aud.violation and aud.decision.violation_step == first
    measured = (f"violation at step {aud.decision.violation_step} (evidence crossed 1/alpha at "
                f"step {aud.decision.crossed_at}); deciding: {', '.join(deciding) or 'none'}"
                if aud.violation else f"no violation in {steps} steps")
    aud.detach()
    return Row(f"detection: {bug}",
               f"{model_name}, {mode}, batch {batch}", measured,
               f"proven at the first check (step {first})", _yes(ok))


def check_model(model_name: str, modes: tuple[str, ...], device: torch.device, sz: Sizes
                ) -> Row:
    """--smoke: the larger model's builder, and one unaudited DP-SGD step of it per mode."""
    done = []
    for mode in modes:
        s = make_setup(model_name, mode, 2, device, sz)
        run_steps(s, 1)
        done.append(mode)
        n_params = s.n_params
    return Row("model: builds and takes a DP-SGD step (unaudited)", model_name,
               f"{n_params:,} parameters; one step in {', '.join(done)}", "no error", "yes")


# ------------------------------------------------------------------------------ main
def _guarded(rows: list[Row], what: str, setting: str, fn: Callable[[], Any],
             deadline: float | None) -> None:
    """Run one part; an exception or the time budget becomes a row instead of ending the run."""
    if deadline is not None and time.monotonic() > deadline:
        rows.append(Row(what, setting, "skipped: the time budget is spent", "-", "no"))
        return
    t0 = time.perf_counter()
    n_before = len(rows)
    try:
        out = fn()
        rows.extend(out if isinstance(out, list) else [out])
    except Exception as e:  # noqa: BLE001 - a failing part is a row of the table
        traceback.print_exc()
        text = " ".join(f"error: {type(e).__name__}: {e}".split()).replace("|", "/")
        rows.append(Row(what, setting, text[:300], "-", "error"))
    finally:
        if torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()
    print(f"{what} [{setting}]: {time.perf_counter() - t0:.1f} s", flush=True)
    for r in rows[n_before:]:  # each part's rows as they come (the log keeps them if cut short)
        print("  " + " | ".join(map(str, r.cells())), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="the whole logic on the CPU at tiny sizes; writes nothing")
    ap.add_argument("--model", default="resnet18", choices=("resnet18", "wrn16-4"),
                    help="the larger model (besides the digits CNN)")
    ap.add_argument("--lora", action="store_true",
                    help="also the LoRA model of examples/llm_lora_dp.py (hooks mode; its "
                         "target step time x1.10)")
    ap.add_argument("--batches", default=None, help="expected batch sizes (default 256,1024)")
    ap.add_argument("--modes", default="hooks,ghost")
    ap.add_argument("--budget-s", type=float, default=390.0,
                    help="parts not started within this many seconds are skipped (a row says "
                         "so)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    sz = SMOKE if args.smoke else GPU
    if args.batches:
        sz = Sizes(**{**sz.__dict__, "batches": tuple(int(b) for b in args.batches.split(","))})
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:  # on a shared machine more threads only contend
        torch.set_num_threads(1)
    modes = tuple(args.modes.split(","))
    models: tuple[str, ...] = ("digits", SMOKE_STAND_IN if args.smoke else args.model)
    deadline = None if args.smoke else time.monotonic() + args.budget_s
    counter = SyncCounter(device)
    rows: list[Row] = []
    measured: dict[tuple[str, int, int], str] = {}  # the tester placement's table
    t_start = time.perf_counter()
    try:
        _guarded(rows, "statistics: testers", device.type,
                 lambda: check_testers(device, args.smoke, sz), deadline)
        _guarded(rows, "statistics: monitors", device.type,
                 lambda: check_monitors(device, args.smoke, sz), deadline)
        _guarded(rows, "tester placement", device.type,
                 lambda: check_placement(device, args.smoke, sz, counter, measured), deadline)
        if args.smoke:
            _guarded(rows, "model", args.model,
                     lambda: check_model(args.model, modes, device, sz), deadline)
        for model_name in models:
            for batch in sz.batches:
                for mode in modes:
                    _guarded(rows, "auditor", f"{model_name}, {mode}, batch {batch}",
                             lambda m=model_name, b=batch, g=mode: check_auditor(
                                 m, g, b, device, sz, args.smoke, counter), deadline)
        if args.lora:  # hooks mode (ghost clipping needs the example's per-sequence loss)
            for batch in sz.batches[:1]:
                _guarded(rows, "auditor", f"lora, hooks, batch {batch}",
                         lambda b=batch: check_auditor("lora", "hooks", b, device, sz,
                                                       args.smoke, counter), deadline)
        for model_name in (("digits",) if args.smoke else models):
            for mode in modes:
                for bug in BUGS:
                    _guarded(rows, f"detection: {bug}", f"{model_name}, {mode}",
                             lambda m=model_name, g=mode, b=bug: check_bug(
                                 m, g, sz.batches[0], b, device, sz, args.smoke), deadline)
    finally:
        counter.close()
    elapsed = time.perf_counter() - t_start
    table = markdown_table(HEADERS, [r.cells() for r in rows])
    failed = [r for r in rows if r.hard and not r.met.startswith("yes")]
    print(table)
    if measured:  # the stored rule's table (dpaudit_torch/audit/placement.py)
        print("MEASURED_PLACEMENTS entries (dpaudit_torch/audit/placement.py): "
              + ", ".join(f"{key!r}: {p!r}" for key, p in sorted(measured.items())))
    print(f"{len(rows) - len(failed)} of {len(rows)} rows pass ({elapsed:.0f} s)"
          + ("" if not failed else "; failing: " + "; ".join(
              f"{r.check} [{r.setting}]" for r in failed)))
    if not args.smoke and not args.no_write:
        body = (
            "## GPU readiness (benchmarks/gpu_check.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "What runs on CUDA, against the CPU and against the unaudited step (the script's "
            "docstring has the details): every registered sequential tester and the noise, "
            "sampling and one-run statistics fed the same seeded input on CUDA and on the CPU "
            f"(float64: log-wealth within {TOL_WEALTH:g}, monitor evidence within "
            f"{TOL_MONITOR:g}, scores within {TOL_SCORES:g} relative); the auditor (default "
            f"settings, check_every {sz.check_every}) on the digits CNN and on "
            f"{args.model} (FakeData 3x32x32) at expected batches "
            f"{', '.join(map(str, sz.batches))} in {', '.join(modes)} modes: host "
            "synchronisations inside optimizer.step() at each of its first "
            f"{sz.counted} audited steps (torch.cuda.set_sync_debug_mode(\"warn\")), step "
            "time and peak memory against the unaudited step; the no-noise and noise-halved "
            f"bugs proven at the first check; the sequential testers' check with the testers on "
            f"the host and on the device (tester_placement) side by side at check_every "
            f"{', '.join(map(str, sz.placement_every))} with "
            f"{', '.join(map(str, sz.placement_k))} pairs per step (the same numbers either "
            f"way; the faster one per setting is the table of "
            f"dpaudit_torch/audit/placement.py, which tester_placement=\"auto\" reads: "
            + ", ".join(f"{key!r}: {p!r}" for key, p in sorted(measured.items()))
            + f"). Total {elapsed:.0f} s.\n\n" + table + "\n")
        write_section("gpu_check", body)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
