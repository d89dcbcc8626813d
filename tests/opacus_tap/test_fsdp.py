"""PrivacyAuditor on sharded parameters: Opacus FSDP2 (``FSDP2Wrapper`` +
``make_private(..., grad_sample_mode="ghost_fsdp")``), 2 gloo processes on CPU.

The comparison: at every step one global batch of 32 examples is split 16 / 16 over the two
ranks, against one process running Opacus's ghost clipping on the whole batch, with the same
initial weights (``torch.manual_seed(0)`` before the model is built, FSDP2 shards those
weights), the same auditor seed and the same noise generator seed. The data and the batches are
therefore identical (the Poisson loader is bypassed with fixed index draws, in both runs; the
inclusion rate the auditor uses is the loader's 1/8 in both). FSDP's reduce-scatter averages
the ranks' clipped sums and Opacus divides the noise by the world size, so the released gradient
is ``(sum of the 32 clipped rows + canaries + noise) / 32`` in both runs; every rank draws the
full noise tensor from its generator (seeded like the single process's) and keeps its shard, so
the noise is the same draw. Only the summation order of the clipped rows differs (two partial
sums averaged vs one sum, in float32), hence the tolerance of the DDP test: 1e-5 relative on the
one-run scores and the parameters, 1e-4 on the wealth history.

Checked: the report says FSDP and the world size; both ranks inject (each the canaries of its
shard) and observe the same values; identical decisions (``should_stop`` at every step,
violation and crossing steps) and scores on both ranks and, within the tolerance, equal to the
single process, for a correct run (not flagged), a run with no noise (decided at the same
step on both ranks and as one process, also with ``on_violation="raise"``) and a run with half
the noise under ``on_violation="warn"`` (the sequential, noise and accounting monitors' findings);
for the correct and the half-noise runs the whole report equals one process's, number by number;
no parameter is ever unsharded by the auditor (FSDP2's own unshards are as many with it as
without, no DTensor is made whole, the parameters keep their shard shapes); Partial placements,
uneven splits and a partly unsharded FSDP model are refused; a checkpoint written by both
ranks at step 1 (pairs still buffered; the "noise-halved" run's violation comes after it) and
resumed in two NEW processes gives the report of the uninterrupted run; ShardLayout maps uneven
Shard(0) / Shard(1) splits like DTensor does and refuses what it cannot map; tensor-parallel ghost
clipping (``GradSampleModuleFastGradientClippingTP``, ``loss_reduction="sum"``) against one
process as well, and with ``loss_reduction="mean"`` the audit proves the under-noising of Opacus
1.6's FSDP optimizer there (it divides the noise by the world size although tensor-parallel
gradients are not averaged over the ranks).
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit_torch.audit import PrivacyAuditor, PrivacyViolationError
from dpaudit_torch.testing import bugs

N, GLOBAL_BATCH, WORLD = 256, 32, 2
CONFIG: dict[str, Any] = dict(k_pairs=8, m_canaries=40, check_every=2, claimed_every=4, seed=5,
                              noise_coordinates_per_tensor=64)
#: (name, bug, steps, on_violation)
RUNS = [("correct", None, 6, "stop"), ("no-noise", "no-noise", 6, "stop"),
        ("no-noise-raise", "no-noise", 6, "raise"), ("noise-halved-warn", "noise-halved", 6,
                                                     "warn")]
#: report paths that differ between FSDP and one process by construction (the world size, the
#: optimizer class, the per-rank expected batch size, the sharding, who injects, how the seed
#: reached every rank), or that are timestamps
SHARDING_PATHS = ("training.world_size", "training.sharding", "training.optimizer",
                  "training.expected_batch_size", "audits.setup.expected_batch_size",
                  "created_at", "configuration.optimizer",
                  "canaries.injecting_rank", "canaries.seed_policy", "seed_policy")
#: absolute tolerances of report values that count float32 coincidences: the share of noise
#: values that happen to lie on a low-precision grid moves by a value or two when the summation
#: order changes (a few in a thousand here, against the 99% a finding needs)
ABS_TOL = {"audits.noise.precision.float16": 0.01, "audits.noise.precision.bfloat16": 0.01}
RESUME_BUG, RESUME_STEPS, CUT = "noise-halved", 6, 1
TOL = 1e-5


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    X = torch.randn(N, 16, generator=g)
    Y = (X @ torch.randn(16, generator=g) > 0).long()
    return X, Y


def _batches(steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, N, (GLOBAL_BATCH,), generator=g) for _ in range(steps)]


def _build(sharded: bool):
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    X, Y = _data()
    model: nn.Module = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 2))
    if sharded:
        from opacus.utils.fsdp_utils import FSDP2Wrapper

        model = FSDP2Wrapper(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dl = DataLoader(TensorDataset(X, Y), batch_size=GLOBAL_BATCH)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, crit, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=1.0,
            max_grad_norm=1.0, noise_generator=torch.Generator().manual_seed(11),
            grad_sample_mode="ghost_fsdp" if sharded else "ghost",
            criterion=nn.CrossEntropyLoss())
    return engine, model, opt, dl, X, Y, crit


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _step(model, opt, crit, X, Y, idx, rank: int, world: int) -> None:
    per = GLOBAL_BATCH // world
    mine = idx[rank * per:(rank + 1) * per]
    opt.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        crit(model(X[mine]), Y[mine]).backward()
    opt.step()


def _full_params(model, world: int) -> list[list[float]]:
    """The parameters as full tensors (gathered for the comparison only, after training)."""
    out = []
    for p in model.parameters():
        if world > 1:
            p = p.full_tensor()
        out.append(p.detach().reshape(-1).tolist())
    return out


class _GatherCounter:
    """Counts, while active, every call that materialises a whole parameter from its shards:
    ``DTensor.full_tensor`` / ``redistribute`` and FSDP2's own ``unshard`` of a parameter group
    (which every forward and backward makes; the auditor must add none)."""

    def __init__(self) -> None:
        from torch.distributed.tensor import DTensor

        targets = [(DTensor, "full_tensor"), (DTensor, "redistribute")]
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

            targets.append((FSDPParamGroup, "unshard"))
        except ImportError:  # another torch layout: the DTensor counts still apply
            pass
        self.targets = targets
        self.calls = {f"{c.__name__}.{n}": 0 for c, n in targets}
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> _GatherCounter:
        for cls, name in self.targets:
            orig = getattr(cls, name)
            key = f"{cls.__name__}.{name}"

            def counted(*a: Any, _orig: Any = orig, _key: str = key, **k: Any) -> Any:
                self.calls[_key] += 1
                return _orig(*a, **k)

            self._saved.append((cls, name, orig))
            setattr(cls, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, name, orig in self._saved:
            setattr(cls, name, orig)
        self._saved = []


def _unshard_calls(steps: int, rank: int, world: int, audit: bool) -> dict[str, int]:
    """Whole-parameter gathers during ``steps`` training steps of the correct run, with or
    without the auditor."""
    engine, model, opt, dl, X, Y, crit = _build(sharded=True)
    aud = PrivacyAuditor(engine, opt, dl, **CONFIG) if audit else None
    with _GatherCounter() as counter:
        for idx in _batches(steps):
            _step(model, opt, crit, X, Y, idx, rank, world)
    if aud is not None:
        assert aud.step == steps
        aud.finalize()
    return counter.calls


def _run(name: str, bug: str | None, steps: int, on_violation: str, rank: int, world: int,
         out_dir: Path | None) -> dict[str, Any]:
    engine, model, opt, dl, X, Y, crit = _build(sharded=world > 1)
    if bug:
        bugs.apply_bug(opt, bug)
    # the model too: under FSDP the real examples are counted from its per-sample norms
    aud = PrivacyAuditor(engine, opt, dl, on_violation=on_violation, model=model, **CONFIG)
    rows: list[int] = []
    aud.tap.injector.on_inject = lambda rec: rows.append(rec.n_rows)
    stops: list[bool] = []
    raised_at = None
    shard_shapes = [tuple(_local(p).shape) for p in model.parameters()]
    for t, idx in enumerate(_batches(steps), start=1):
        try:
            _step(model, opt, crit, X, Y, idx, rank, world)
        except PrivacyViolationError:
            raised_at = t
            break
        stops.append(bool(aud.should_stop))
    # the auditor never unsharded a parameter
    assert [tuple(_local(p).shape) for p in model.parameters()] == shard_shapes
    rep = aud.finalize()
    if out_dir is not None and aud.is_main_process:
        rep.save(out_dir / f"report_{name}")
    return {
        "type": type(opt).__name__, "sample_rate": aud.tap.sample_rate,
        "expected_batch_size": float(opt.expected_batch_size),
        "injected_rows": sum(rows), "steps_injected": aud.tap.injector.steps_injected,
        "stops": stops, "raised_at": raised_at, "violation": rep.violation,
        "violation_step": rep.violation_step, "crossed_at": rep.sequential["crossed_at_step"],
        "history": rep.wealth_history, "scores": rep.one_run_scores,
        "params": _full_params(model, world), "training": rep.training,
        "verdict": rep.verdict, "seed_policy": rep.seed_policy,
        "warnings": [w for w in rep.warnings if "internal auditor failure" in w],
        "report": _strip(rep.to_dict()),
    }


# ----------------------------------------------------------------------------- checkpoints
def _strip(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in ("created_at", "timestamp")}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def _resume_run(rank: int, world: int, ckpt: Path | None, save_to: Path | None) -> str:
    """The run of RESUME_BUG: uninterrupted (neither path), or up to step CUT and checkpointed to
    ``save_to`` (this rank's shards, its Opacus and auditor states), or resumed from ``ckpt``."""
    engine, model, opt, dl, X, Y, crit = _build(sharded=True)
    bugs.apply_bug(opt, RESUME_BUG)
    aud = PrivacyAuditor(engine, opt, dl, **{**CONFIG, "seed": None if ckpt else 5})
    batches = _batches(RESUME_STEPS)
    if ckpt is not None:
        ck = torch.load(ckpt, weights_only=False)
        with torch.no_grad():
            for p, v in zip(model.parameters(), ck["shards"]):
                _local(p).copy_(v)
        engine.accountant.load_state_dict(ck["accountant"])
        opt.generator.set_state(ck["noise_rng"])
        aud.load_state_dict(ck["auditor"])
        batches = batches[CUT:]
    for t, idx in enumerate(batches, start=1):
        _step(model, opt, crit, X, Y, idx, rank, world)
        if save_to is not None and t == CUT:
            assert aud.monitors["sequential_pairs"].buffer_x, "pairs must still be buffered"
            torch.save({"shards": [_local(p).detach().clone() for p in model.parameters()],
                        "accountant": engine.accountant.state_dict(),
                        "noise_rng": opt.generator.get_state(),
                        "auditor": aud.state_dict()}, save_to)
            return ""
    return json.dumps(_strip(aud.finalize().to_dict()), sort_keys=True, default=str)


# ----------------------------------------------------------------------------- tensor parallel
def _tp_run(rank: int, world: int, steps: int, reduction: str = "sum") -> dict[str, Any]:
    """Tensor-parallel ghost clipping (Opacus's own recipe: GradSampleModuleFastGradientClippingTP
    + FSDPOptimizerFastGradientClipping + DPLossFastGradientClipping; the accountant's hook and a
    Poisson loader from a PrivacyEngine), or with world == 1 the same model under plain ghost
    clipping. Every rank sees the whole batch."""
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizerFastGradientClipping, FSDPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    torch.manual_seed(0)
    X, Y = _data()
    model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2, bias=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if world > 1:
            from opacus.grad_sample import GradSampleModuleFastGradientClippingTP
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )

            mesh = init_device_mesh("cpu", (world,))
            model = parallelize_module(model, mesh, {"0": ColwiseParallel(),
                                                     "2": RowwiseParallel()})
            gsm = GradSampleModuleFastGradientClippingTP(model, loss_reduction=reduction)
            cls = FSDPOptimizerFastGradientClipping
        else:
            from opacus.grad_sample import GradSampleModuleFastGradientClipping

            gsm = GradSampleModuleFastGradientClipping(model, loss_reduction=reduction,
                                                       max_grad_norm=1.0, use_ghost_clipping=True)
            cls = DPOptimizerFastGradientClipping
        opt = cls(torch.optim.SGD(gsm.parameters(), lr=0.1), noise_multiplier=1.0,
                  max_grad_norm=1.0, expected_batch_size=GLOBAL_BATCH, loss_reduction=reduction,
                  generator=torch.Generator().manual_seed(11))
        crit = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(reduction=reduction),
                                          loss_reduction=reduction)
    engine = PrivacyEngine()
    dl = DPDataLoader.from_data_loader(DataLoader(TensorDataset(X, Y), batch_size=GLOBAL_BATCH))
    opt.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=dl.sample_rate))
    aud = PrivacyAuditor(engine, opt, dl, **CONFIG)
    for idx in _batches(steps):
        opt.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            crit(gsm(X[idx]), Y[idx]).backward()
        opt.step()
    rep = aud.finalize()
    return {"violation": rep.violation, "violation_step": rep.violation_step,
            "scores": rep.one_run_scores,
            "findings": [f["monitor"] for f in rep.to_dict()["findings"]],
            "history": rep.wealth_history, "training": rep.training,
            "params": _full_params(gsm, world)}


# ----------------------------------------------------------------------------- layout
def _layout_checks(rank: int, world: int) -> dict[str, Any]:
    """ShardLayout against DTensor's own sharding: tensors whose value is their global flat
    index, sharded unevenly along dim 0 and dim 1 (and a dimension smaller than the world);
    every held coordinate's local entry must be its global index, and every coordinate must be
    owned by exactly one rank. Unsupported meshes and optimizers are refused with ValueError."""
    import numpy as np
    from opacus.optimizers import DPOptimizer
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dpaudit_torch.opacus_tap.fsdp import ShardLayout, detect_layout

    mesh = init_device_mesh("cpu", (world,))
    shapes = [((5, 3), 0), ((3, 5), 1), ((1, 4), 0), ((7,), 0)]
    params = [distribute_tensor(torch.arange(float(np.prod(sh))).reshape(sh), mesh, [Shard(d)])
              for sh, d in shapes]
    layout = ShardLayout(params, rank, world, data_parallel=world, kind="fsdp")
    ok, owned_count = True, []
    for i, p in enumerate(params):
        flat = np.arange(p.numel())
        local, held, owned = layout.localize(np.full(flat.size, i), flat)
        vals = p.to_local().reshape(-1)
        ok &= bool(all(int(vals[j]) == f for j, f in zip(local[held], flat[held])))
        ok &= bool((held == owned).all())
        owned_count.append(torch.from_numpy(owned.astype(np.int64)))
    counts = torch.cat(owned_count)
    dist.all_reduce(counts)
    from opacus.optimizers import FSDPOptimizerFastGradientClipping
    from torch.distributed.tensor import DTensor, Partial

    refused = []
    opt = DPOptimizer(torch.optim.SGD([nn.Parameter(p) for p in params[:1]], lr=0.1),
                      noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8)
    for what in ("optimizer", "mesh", "partial", "uneven", "partly unsharded"):
        try:
            if what == "optimizer":
                detect_layout(opt, opt.params, rank, world)
            elif what == "mesh":
                mesh2 = init_device_mesh("cpu", (1, world))
                p2 = distribute_tensor(torch.zeros(4, 4), mesh2, [Shard(0), Shard(1)])
                ShardLayout([p2], rank, world, data_parallel=world, kind="fsdp")
            elif what == "partial":
                p3 = DTensor.from_local(torch.zeros(4, 4), mesh, [Partial()], run_check=False)
                ShardLayout([p3], rank, world, data_parallel=world, kind="fsdp")
            elif what == "uneven":  # rows 1 / 4 of 5: not the torch.chunk split (3 / 2)
                rows = 1 if rank == 0 else 4
                p4 = DTensor.from_local(torch.zeros(rows, 4), mesh, [Shard(0)], run_check=False,
                                        shape=torch.Size([5, 4]), stride=(4, 1))
                ShardLayout([p4], rank, world, data_parallel=world, kind="fsdp")
            else:
                mixed = [nn.Parameter(distribute_tensor(torch.zeros(4, 4), mesh, [Shard(0)])),
                         nn.Parameter(torch.zeros(3))]
                fopt = FSDPOptimizerFastGradientClipping(
                    torch.optim.SGD(mixed, lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                    expected_batch_size=8)
                detect_layout(fopt, fopt.params, rank, world)
        except ValueError as e:
            refused.append(str(e))
    return {"ok": ok, "owned_once": bool((counts == 1).all()), "refused": refused}


# ----------------------------------------------------------------------------- workers
def _init(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    _init(rank, world, port)
    try:
        out_dir = Path(out) / f"rank{rank}"
        out_dir.mkdir(parents=True, exist_ok=True)
        res: dict[str, Any] = {"layout": _layout_checks(rank, world),
                               "gathers": {"audited": _unshard_calls(4, rank, world, True),
                                           "unaudited": _unshard_calls(4, rank, world, False)}}
        for name, bug, steps, on_violation in RUNS:
            res[name] = _run(name, bug, steps, on_violation, rank, world, out_dir)
        res["resume_full"] = _resume_run(rank, world, None, None)
        _resume_run(rank, world, None, out_dir / "ckpt.pt")
        res["tp"] = _tp_run(rank, world, 4)
        res["tp_mean"] = _tp_run(rank, world, 4, reduction="mean")
        (out_dir / "result.json").write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def _resume_worker(rank: int, world: int, port: int, out: str) -> None:
    _init(rank, world, port)
    try:
        out_dir = Path(out) / f"rank{rank}"
        got = _resume_run(rank, world, out_dir / "ckpt.pt", None)
        (out_dir / "resumed.json").write_text(got)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _monitors(report: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((f["monitor"], f["level"]) for f in report["findings"])


def _report_diff(a: Any, b: Any, path: str = "", tol: float = 1e-4) -> list[str]:
    """Paths where two reports differ: numbers beyond ``tol`` (relative, floor 1), anything
    else exactly; SHARDING_PATHS are skipped."""
    if path in SHARDING_PATHS:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        out = []
        for k in keys:
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if sub not in SHARDING_PATHS:
                    out.append(f"{sub} (missing)")
                continue
            out += _report_diff(a[k], b[k], sub, tol)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path} (length {len(a)} vs {len(b)})"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _report_diff(x, y, f"{path}[{i}]",
                                                                             tol)]
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        if a == b or abs(a - b) <= max(tol * max(1.0, abs(b)), ABS_TOL.get(path, 0.0)):
            return []
        return [f"{path} ({a!r} vs {b!r})"]
    return [] if a == b else [f"{path} ({a!r} vs {b!r})"]


def _close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def test_fsdp_two_ranks_match_single_process(tmp_path):
    mp.spawn(_worker, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    r0 = json.loads((tmp_path / "rank0" / "result.json").read_text())
    r1 = json.loads((tmp_path / "rank1" / "result.json").read_text())
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        singles = {name: _run(name, bug, steps, ov, 0, 1, None)
                   for name, bug, steps, ov in RUNS}
        tp_single = _tp_run(0, 1, 4)
    finally:
        torch.set_num_threads(n)
    for name, bug, _steps, _ in RUNS:
        a, b, single = r0[name], r1[name], singles[name]
        assert a["type"].split("_")[-1] == "FSDPOptimizerFastGradientClipping"
        assert single["type"].split("_")[-1] == "DPOptimizerFastGradientClipping"
        assert a["expected_batch_size"] == single["expected_batch_size"] / WORLD
        assert a["sample_rate"] == single["sample_rate"]
        assert not a["warnings"] and not b["warnings"], (name, a["warnings"], b["warnings"])
        # both ranks inject (the canaries of their shards) at every step, as many rows as one
        # process
        assert a["injected_rows"] == b["injected_rows"] == single["injected_rows"] > 0
        assert a["training"]["world_size"] == WORLD
        assert a["training"]["sharding"].startswith("FSDP2")
        assert a["training"]["grad_sample_mode"] == "ghost"
        assert "world size 2" in a["training"]["sharding"]
        # identical decisions and observations on both ranks
        for key in ("stops", "raised_at", "violation", "violation_step", "crossed_at",
                    "history", "scores", "params", "verdict"):
            assert a[key] == b[key], (name, key)
        assert a["report"]["training"]["world_size"] == WORLD
        if bug == "no-noise":
            # without noise the observations are atoms (0 and 1) up to float32 rounding, which
            # differs between one process and two (partial sums averaged): both decide, at the
            # same check, and name the same monitors
            assert a["violation"] and single["violation"], name
            assert a["violation_step"] == single["violation_step"], name
            assert _monitors(a["report"]) == _monitors(single["report"]), name
        else:
            # the whole report equals one process's, number by number within the tolerance
            diff = _report_diff(a["report"], single["report"])
            assert not diff, (name, diff[:10])
            # the real examples counted on both sides (FSDP: the model's per-sample norms, summed
            # over the ranks), so the sampling and accounting checks ran on both
            audits = a["report"]["audits"]
            assert audits["accounting"]["examples"] > 0 and audits["sampling"]["run"] is True
            for key in ("stops", "violation", "violation_step", "crossed_at", "verdict"):
                assert a[key] == single[key], (name, key)
            for key in single["history"]:
                assert _close(a["history"][key], single["history"][key], 1e-4), (name, key)
            for side in ("in", "out"):
                assert a["scores"][side]
                assert _close(a["scores"][side], single["scores"][side]), (name, side)
            for pa, ps in zip(a["params"], single["params"]):
                assert _close(pa, ps)
    assert not r0["correct"]["violation"] and r0["no-noise"]["violation"]
    for r in (r0, r1):
        lay = r["layout"]
        assert lay["ok"] and lay["owned_once"], lay
        assert len(lay["refused"]) == 5, lay
        assert "FSDPOptimizerFastGradientClipping" in lay["refused"][0]
        assert "device mesh of shape (1, 2)" in lay["refused"][1]
        assert "Partial" in lay["refused"][2] and "Shard and Replicate" in lay["refused"][2]
        assert "uneven sharding" in lay["refused"][3] and "shape [5, 4]" in lay["refused"][3]
        assert "[1] are not sharded" in lay["refused"][4]
        # the auditor gathers no parameter: FSDP's own unshards (forward, backward) are as
        # many with the auditor as without, and no DTensor is ever made whole
        g = r["gathers"]
        assert g["audited"] == g["unaudited"], g
        assert g["audited"]["DTensor.full_tensor"] == g["audited"]["DTensor.redistribute"] == 0
    # on_violation="raise": both ranks raise at the same step, the decision step of "stop"
    assert r0["no-noise-raise"]["raised_at"] == r0["no-noise"]["violation_step"] is not None
    # resume in new processes: the uninterrupted run's report on both ranks
    mp.spawn(_resume_worker, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for r in (0, 1):
        full = json.loads(r0["resume_full"] if r == 0 else r1["resume_full"])
        got = json.loads((tmp_path / f"rank{r}" / "resumed.json").read_text())
        assert full["training"]["audited_steps"] == RESUME_STEPS
        assert full["violation"] and full["violation_step"] > CUT
        for key in full:
            assert got[key] == full[key], (r, key)
    assert r0["resume_full"] == r1["resume_full"]
    # tensor parallelism: both ranks equal, and equal to one process within the tolerance
    ta, tb = r0["tp"], r1["tp"]
    assert ta == tb
    assert ta["training"]["sharding"].startswith("tensor parallelism")
    assert not ta["violation"] and not tp_single["violation"]
    assert ta["scores"]["in"] and ta["scores"]["out"]
    for side in ("in", "out"):
        assert _close(ta["scores"][side], tp_single["scores"][side]), side
    for pa, ps in zip(ta["params"], tp_single["params"]):
        assert _close(pa, ps)
    # Opacus 1.6's FSDP optimizer divides the noise by the world size under
    # loss_reduction="mean", assuming the ranks' gradients are averaged; under tensor parallelism
    # they are not (every rank holds the whole batch's gradient of its shard), so the noise is
    # sigma C / 2 for a sensitivity C: the audit proves it on both ranks at the same step
    tm0, tm1 = r0["tp_mean"], r1["tp_mean"]
    assert tm0 == tm1 and tm0["violation"] and "noise" in tm0["findings"]
    # the report written by rank 0 only
    assert (tmp_path / "rank0" / "report_correct").exists()
    assert not (tmp_path / "rank1" / "report_correct").exists()
