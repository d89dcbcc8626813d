"""Detection benchmark of the PrivacyAuditor: every bug class of testing.bugs.

Setting (small, so that it runs in minutes on one CPU thread): the demo's DigitsCNN (two 3x3
convolutions with GroupNorm and a linear head, 6,186 parameters in 10 tensors) on scikit-learn's
bundled 8x8 digits (1,437 real training images, nothing downloaded), Opacus ``hooks`` mode,
Poisson sampling with expected batch 64 (q = 1/23), lr 0.5, sigma = 1, C = 1, RDP accountant,
delta = 1e-5. The auditor runs with its defaults (every monitor; 16 pairs, each a spread canary
over 4 tensors, the default number of one-run canaries, canary norm 25 C, both sequential tests,
check_every 5, proofs at alpha 0.001 in total: the decision at its share 5e-4; evidence at
alpha_warn 0.05). ``--seeds`` runs per bug (default 20); seed s fixes the model, the
data order, the noise generator and the auditor's streams.

* **Per-step bugs** (the optimizer bugs of :mod:`dpaudit_torch.testing.bugs`): at most
  ``--max-steps`` training steps (default 50), stopped at ``should_stop``, then ``finalize()``.
  *Decided* = ``report.violation`` and ``violation_step <= max_steps``. Target: decided in at
  least 19 of 20 seeds. ``noise-bf16`` changes the noise's distribution by a relative 2^-9, which
  no betting test sees in 50 steps; what the audit reports for it is the low-precision finding of
  the noise monitor at ``finalize()`` (docs/design.md section 11, "Low-precision noise"): *found*
  = a finding of level ``"finding"`` from the noise monitor, and the row's criterion says so.
* **Accounting bugs** (the setup bugs: every step is a correct Gaussian step): ``--setup-steps``
  loader batches (default 100; for ``accumulation-counted-per-micro-step`` that is 25 releases),
  not stopped early, then ``finalize()``. *Flagged* = ``claim_inconsistent`` or ``claim_refuted``
  or a violation. Target: flagged in at least 19 of 20 seeds.
* **Replayed batches** (the ``loader-*`` setup bugs of :mod:`dpaudit_torch.testing.bugs_loader`:
  Opacus's Poisson loader re-seeded so that the same batches come back): stopped at
  ``should_stop`` or at the end of the first replayed epoch (step 46 for a loader re-seeded at
  every epoch: within 2 epochs), then ``finalize()``; *decided* = ``report.violation`` by then.
  ``--section detection-replay`` writes their own section, one per level (``--alpha``, default
  the auditor's).

Printed per bug: the count, the decision / crossing steps (``violation_step``, the check step at
which the decision was available, a multiple of check_every; ``crossed_at_step``, the step whose
observations pushed the averaged e-process over 1/alpha), the evidence (``evidence``,
``evidence_step``: the same e-process over 1/alpha_warn, not a proof), the monitor of the first
finding
(``report.findings[0]["monitor"]``, notes excluded) and how often each monitor made a finding.
``--spread-diagnostic 2,4,8`` adds rows for ``per-tensor-clipping`` with that many spread pairs
(fewer than the default, every pair; a diagnosis of how many the bug needs). False alarms on
correct runs: ``benchmarks/false_alarms.py``.

    python benchmarks/detection.py [--seeds 20] [--max-steps 50] [--setup-steps 100]
        [--spread-diagnostic 2,4,8] [--alpha A] [--section S] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, machine, markdown_table, write_section  # noqa: E402

from dpaudit_torch.audit import PrivacyAuditor  # noqa: E402
from dpaudit_torch.demo import DigitsCNN, load_digits_tensors  # noqa: E402
from dpaudit_torch.testing import bugs, bugs_loader  # noqa: E402
from dpaudit_torch.testing.contract_bugs import contract_bugs  # noqa: E402
from dpaudit_torch.testing.harness import digits_training, run_audited, run_bug  # noqa: E402
from dpaudit_torch.testing.leaks_inputs import WRONG_INPUTS  # noqa: E402

#: bugs whose target is a finding at finalize, not a sequential decision
FINDING_BUGS = {"noise-bf16": "finding"}
#: the digits loader's epoch: len(loader) = 1/q = 23 batches
EPOCH = 23
#: loaders that replay the same Poisson batches (testing.bugs_loader): the step of the first
#: replayed batch and the period; the target is a decision before the first replayed epoch ends
REPLAY_BUGS = {
    "loader-reseeded": (EPOCH + 1, EPOCH),
    "loader-global-seed": (EPOCH + 1, EPOCH),
    "loader-reseeded-every-3-epochs": (bugs_loader.RESEED_EVERY_EPOCHS * EPOCH + 1,
                                       bugs_loader.RESEED_EVERY_EPOCHS * EPOCH),
    "loader-reseeded-other-epoch-length": (EPOCH + EPOCH // 2 + 1, EPOCH + EPOCH // 2)}


def replay_deadline(bug: str) -> int:
    """The last step at which a replayed-batches bug counts as found: the end of the first
    replayed epoch (step 46, the end of epoch 2, for a loader re-seeded at every epoch)."""
    first, _ = REPLAY_BUGS[bug]
    return first - 1 + EPOCH
#: decided / flagged in at least this many of 20 seeds
TARGET = 19
#: how each class is seen, and why per-tensor clipping needs more spread pairs (written below
#: the table)
NOTES = (
    "How each class is seen. Noise bugs: the noise monitor's variance test (per tensor and per "
    "parameter group: `noise-0.8`, `noise-halved`, the divided noise, `bias-no-noise`) or "
    "its independence test across steps (`noise-reused` from release 2; `noise-reseeded` at "
    "release 11, the first repeat, decided at the check of step 15), and for the large ones "
    "also the canary pairs, the one-run bound (claim refuted) and the accounting check (the "
    "measured noise multiplier below the claimed one: claim inconsistent). `noise-bf16`: "
    "the low-precision check only (a finding; a relative change of 2^-9 in the noise is "
    "invisible to the betting tests). `no-clipping`: the canaries pass unclipped (25 C). "
    "Accounting bugs: `fixed-size-batches` by the Poisson batch-size test (sampling); "
    "`accumulation-counted-per-micro-step` by the same test (each release holds about 4x the "
    "examples of a Poisson batch at the loader's rate) and by the accounting check (steps and "
    "rate); `accountant-rate-4x` by the accounting check only (the observed rate is 4x the "
    "accountant's; the batches themselves are correct Poisson samples at the loader's rate). "
    "`per-tensor-clipping`: a Dirac canary lies in one tensor and is clipped exactly as by a "
    "correct optimizer; only a spread canary (mass 1/sqrt(L) on each of L = 4 tensors) shows "
    "it, with a contribution of sqrt(L) = 2 instead of 1 (per-step mu = 2 against the claimed "
    "1 at sigma = 1). With fewer spread pairs (diagnostic rows) the pairs fed to the testers "
    "are a mixture in which the Dirac pairs are exactly null, and the decision averages the "
    "pairs' e-process with the noise and sampling monitors', so 50 steps are not enough: "
    "hence every pair is spread by default.")
#: finding levels that count (a "note" says what could not be checked)
FOUND_LEVELS = ("violation", "refuted", "inconsistent", "finding")


def train_audited(train: Any, seed: int, bug: str | None, steps: int, stop: bool,
                  batch: int = 64, lr: float = 0.5, sigma: float = 1.0,
                  auditor_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """One audited run of the digits CNN; returns the report's outcome and the time taken."""
    from opacus import PrivacyEngine

    t0 = time.process_time()
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    dl = DataLoader(train, batch_size=batch, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = engine.make_private(
            module=model, optimizer=opt, data_loader=dl, noise_multiplier=sigma,
            max_grad_norm=1.0, noise_generator=torch.Generator().manual_seed(10_000 + seed))
    if bug is not None:
        opt, dl = bugs.apply_to_training(engine, opt, dl, bug)
    aud = PrivacyAuditor(engine, opt, dl, delta=1e-5, seed=seed, **(auditor_kw or {}))
    crit = nn.CrossEntropyLoss(reduction="sum")  # an empty Poisson batch gives a zero loss
    done = 0
    while done < steps and not (stop and aud.should_stop):
        for x, y in dl:
            opt.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (crit(model(x), y) / batch).backward()
            opt.step()
            done += 1
            if (stop and aud.should_stop) or done >= steps:
                break
    t1 = time.process_time()
    rep = aud.finalize()
    found = [f for f in rep.findings if f["level"] in FOUND_LEVELS]
    return {"violation": rep.violation, "step": rep.violation_step,
            "evidence": rep.evidence, "evidence_step": rep.evidence_step,
            "crossed": rep.sequential.get("crossed_at_step"), "steps": done,
            "refuted": rep.claim_refuted, "inconsistent": rep.claim_inconsistent,
            "findings": [(f["monitor"], f["level"]) for f in found],
            "first": found[0]["monitor"] if found else None, "verdict": rep.verdict,
            "train_s": t1 - t0, "finalize_s": time.process_time() - t1}


def _outcome(rep: Any, steps: int, t0: float, t1: float) -> dict[str, Any]:
    found = [f for f in rep.findings if f["level"] in FOUND_LEVELS]
    return {"violation": rep.violation, "step": rep.violation_step,
            "evidence": rep.evidence, "evidence_step": rep.evidence_step,
            "crossed": rep.sequential.get("crossed_at_step"), "steps": steps,
            "refuted": rep.claim_refuted, "inconsistent": rep.claim_inconsistent,
            "findings": [(f["monitor"], f["level"]) for f in found],
            "where": [f.get("where") for f in found],
            "first": found[0]["monitor"] if found else None, "verdict": rep.verdict,
            "train_s": t1 - t0, "finalize_s": time.process_time() - t1}


def train_contract(seed: int, name: str, steps: int, auditor_kw: dict[str, Any] | None
                   ) -> dict[str, Any]:
    """One audited run of the digits CNN broken by a contract bug (testing.harness)."""
    bug = contract_bugs()[name]
    t0 = time.process_time()
    rep = run_bug(bug, seed, steps, auditor_kw=auditor_kw)
    t1 = time.process_time()
    return _outcome(rep, rep.training.get("audited_steps", steps), t0, t1)


def wrong_input(seed: int, name: str, steps: int) -> dict[str, Any]:
    """A correct run handed a wrong input: "refused" or the report's outcome."""
    tr = WRONG_INPUTS[name](digits_training(seed))
    t0 = time.process_time()
    try:
        rep = run_audited(tr, steps, stop=False, seed=seed)
    except (ValueError, TypeError) as e:
        return {"refused": str(e)}
    out = _outcome(rep, steps, t0, time.process_time())
    out["refused"] = None
    return out


def run_wrong_inputs(seeds: int, steps: int) -> tuple[str, str]:
    """Correct runs handed each wrong input: refusals, findings naming it, and proofs (none
    may be)."""
    rows, proofs = [], 0
    for name in WRONG_INPUTS:
        res = [wrong_input(s, name, steps) for s in range(seeds)]
        refused = [r for r in res if r["refused"]]
        ran = [r for r in res if not r["refused"]]
        named = sum(1 for r in ran if any(w in ("data loader", "accountant", "privacy engine")
                                          for w in r["where"]))
        bad = sum(1 for r in ran if r["violation"] or r["refuted"])
        proofs += bad
        ok = bad == 0 and len(refused) + named == len(res)
        rows.append([name, len(res), len(refused), named, sum(r["violation"] for r in ran),
                     sum(r["refuted"] for r in ran), sum(r["inconsistent"] for r in ran),
                     (refused[0]["refused"][:90] + "...") if refused else "-",
                     "yes" if ok else "NO"])
        print(f"wrong input {name}: {rows[-1]}", flush=True)
    table = markdown_table(["wrong input", "runs", "refused at attach", "ran, with a finding "
                            "naming the input", "violation proven", "claim refuted",
                            "claim inconsistent", "refusal (first words)", "met"], rows)
    summary = (f"Wrong inputs with correct training: {proofs} proof(s) (violation proven or "
               f"claim refuted) in {seeds * len(WRONG_INPUTS)} runs; target 0, each run "
               f"refused or named.")
    return table, summary


def _median(xs: list[float]) -> float | str:
    return statistics.median(xs) if xs else "-"


def _tally(res: list[dict[str, Any]]) -> str:
    """How many runs each monitor made a finding in (levels in brackets)."""
    runs: collections.Counter[str] = collections.Counter()
    levels: dict[str, set[str]] = collections.defaultdict(set)
    for r in res:
        for m in {m for m, _ in r["findings"]}:
            runs[m] += 1
        for m, lv in r["findings"]:
            levels[m].add(lv)
    return ", ".join(f"{m} {n} ({'/'.join(sorted(levels[m]))})" for m, n in runs.most_common())


def evaluate(bug: str, res: list[dict[str, Any]], max_steps: int, label: str | None = None
             ) -> tuple[list[Any], bool]:
    """The table row of one bug class and whether its target is met."""
    n = len(res)
    contract = contract_bugs().get(bug)
    setup = bug in bugs.SETUP_BUGS or (contract is not None and not contract.per_step)
    kind = ("accounting" if bug in bugs.SETUP_BUGS else "per-step" if contract is None
            else f"{contract.clause} ({'per-step' if contract.per_step else 'whole run'})")
    if bug in REPLAY_BUGS:
        kind = "sampling (replayed batches)"
        last = replay_deadline(bug)
        hit = [bool(r["violation"]) and r["step"] is not None and r["step"] <= last
               for r in res]
        first, period = REPLAY_BUGS[bug]
        criterion = (f"violation decided by step {last} (period {period}; the first replayed "
                     f"epoch is steps {first}-{last})")
    elif contract is not None and not contract.per_step:
        hit = [r["inconsistent"] or r["refuted"] or r["violation"]
               or any(lv == "finding" for _, lv in r["findings"]) for r in res]
        criterion = "flagged at finalize (inconsistent / refuted / violation / finding)"
        need = n
    elif setup:
        hit = [r["inconsistent"] or r["refuted"] or r["violation"] for r in res]
        criterion = "flagged at finalize (inconsistent / refuted / violation)"
    elif bug in FINDING_BUGS:
        hit = [("noise", FINDING_BUGS[bug]) in r["findings"] for r in res]
        criterion = f"low-precision finding at finalize after {max_steps} steps"
    else:
        hit = [bool(r["violation"]) and r["step"] is not None and r["step"] <= max_steps
               for r in res]
        criterion = f"violation decided by step {max_steps}"
    if not (contract is not None and not contract.per_step):
        need = round(TARGET * n / 20)
    ok = sum(hit) >= need
    dec = [r["step"] for r in res if r["violation"] and r["step"] is not None]
    cro = [r["crossed"] for r in res if r["violation"] and r["crossed"] is not None]
    first = collections.Counter(r["first"] for r in res if r["first"] is not None)
    ev = [r["evidence_step"] for r in res if r["evidence"] and r["evidence_step"] is not None]
    row = [label or bug, kind, criterion, f"{sum(hit)}/{n}",
           f"{len(ev)}/{n}", _median(ev),
           sum(r["violation"] for r in res), sum(r["inconsistent"] for r in res),
           sum(r["refuted"] for r in res), _median(dec), max(dec) if dec else "-",
           _median(cro), ", ".join(f"{m} {c}" for m, c in first.most_common()) or "-",
           _tally(res) or "-", f">= {need}/{n}", "yes" if ok else "NO",
           f"{statistics.mean(r['train_s'] + r['finalize_s'] for r in res):.1f}"]
    return row, ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--setup-steps", type=int, default=100)
    ap.add_argument("--bugs", default=",".join(bugs.names()),
                    help="comma-separated classes: testing.bugs names and contract bug names "
                         "(testing.contract_bugs); 'contract' = every contract bug")
    ap.add_argument("--wrong-inputs", action="store_true",
                    help="also run correct trainings handed a wrong input "
                         "(testing.leaks_inputs.WRONG_INPUTS): refusal or finding, never a proof")
    ap.add_argument("--section", default="detection",
                    help="the docs/benchmarks.md section written (the contract bugs' run "
                         "writes 'detection-contract')")
    ap.add_argument("--spread-diagnostic", default="",
                    help="comma-separated spread_pairs values for extra per-tensor-clipping "
                         "rows, e.g. 2,4,8 (the diagnostic rows of docs/benchmarks.md)")
    ap.add_argument("--auditor-kw", default="{}",
                    help="JSON of auditor settings for every run (a diagnosis; not written)")
    ap.add_argument("--alpha", type=float, default=None,
                    help="the audit's level (default: the auditor's); written in the section")
    ap.add_argument("--quick", action="store_true", help="2 seeds, no diagnostic, no write")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    base_kw = json.loads(args.auditor_kw)
    if args.quick or base_kw:
        args.no_write = True
    if args.alpha is not None:
        base_kw["alpha"] = args.alpha
    if args.quick:
        args.seeds, args.spread_diagnostic = 2, ""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("dpaudit_torch").setLevel(logging.ERROR)
    train, _ = load_digits_tensors(0)
    t0 = time.time()
    cpu0 = time.process_time()
    rows, met = [], {}
    names = [n for b in args.bugs.split(",")
             for n in (list(contract_bugs()) if b == "contract" else [b])]
    plan: list[tuple[str, str, dict[str, Any]]] = [(b, b, dict(base_kw)) for b in names]
    for v in filter(None, args.spread_diagnostic.split(",")):
        plan.append(("per-tensor-clipping", f"per-tensor-clipping (diagnostic: spread_pairs={v})",
                     {**base_kw, "spread_pairs": int(v)}))
    for bug, label, kw in plan:
        contract = contract_bugs().get(bug)
        setup = bug in bugs.SETUP_BUGS or (contract is not None and not contract.per_step)
        steps = args.setup_steps if setup else args.max_steps
        if bug in REPLAY_BUGS:  # decided within the first replayed epoch: stopped then
            setup, steps = False, replay_deadline(bug)
        if contract is not None:
            res = [train_contract(s, bug, steps, kw) for s in range(args.seeds)]
        else:
            res = [train_audited(train, s, bug, steps, stop=not setup, auditor_kw=kw)
                   for s in range(args.seeds)]
        row, ok = evaluate(bug, res, args.max_steps, label)
        rows.append(row)
        if label == bug:
            met[bug] = ok
        print(f"{label}: {row[3]} {row[2]}; evidence {row[4]} (median step {row[5]}); "
              f"violations {row[6]}, inconsistent {row[7]}, refuted {row[8]}; decision step "
              f"median {row[9]} max {row[10]}, crossing median {row[11]}; first finding by "
              f"{row[12]}; findings: {row[13]}; target {row[14]}: {row[15]} "
              f"({time.time() - t0:.0f}s)", flush=True)
    headers = ["bug", "kind", "criterion", "detected", "evidence at alpha_warn",
               "median evidence step", "violation", "claim inconsistent",
               "claim refuted", "median decision step", "max decision step",
               "median crossing step", "first finding (findings[0] monitor)",
               "runs with a finding, per monitor (levels)", "target", "met",
               "CPU s per run"]
    table = markdown_table(headers, rows)
    wall, cpu = time.time() - t0, time.process_time() - cpu0
    missed = [b for b, ok in met.items() if not ok]
    summary = (f"Targets met for {sum(met.values())} of {len(met)} bug classes"
               + (f"; not met: {', '.join(missed)}." if missed else ".")
               + f" Total {wall:.0f} s wall, {cpu:.0f} s CPU (one thread).")
    print(table)
    print(summary)
    wrong_table, wrong_summary = "", ""
    if args.wrong_inputs:
        wrong_table, wrong_summary = run_wrong_inputs(args.seeds, args.setup_steps)
        print(wrong_table)
        print(wrong_summary)
    if not args.no_write and args.section == "detection-replay":
        from dpaudit_torch.audit import AuditConfig

        alpha = args.alpha if args.alpha is not None else AuditConfig().alpha
        level = f"alpha {alpha:g}"
        body = (
            f"## Detection of replayed batches, {level} (benchmarks/detection.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "The setting of \"Detection of silent DP bugs\" (DigitsCNN on the bundled digits, "
            "Opacus hooks mode, Poisson sampling with expected batch 64, q = 1/23 so 23 steps "
            "per epoch, sigma 1, C 1, RDP, auditor defaults except the level) with Opacus's "
            "Poisson loader replaying the same batches (`dpaudit_torch/testing/bugs_loader.py`): "
            "its generator reset at every epoch (`loader-reseeded`), every 3 epochs, at every "
            "epoch of 34 batches instead of 23, or `torch.manual_seed` at every epoch with the "
            "sampler on the global generator and the noise on its own. The noise is fresh and "
            "every batch is a Poisson sample: only the sampling monitor's repeat test "
            "(docs/design.md section 10, \"Fresh batches\") can see it. Detected = "
            "`report.violation` with `violation_step` by the end of the first replayed epoch "
            "(step 46 for `loader-reseeded`: within 2 epochs); stopped at `should_stop`. "
            f"{args.seeds} seeds per bug.\n\n"
            + table + "\n\n" + summary + "\n")
        write_section(f"detection-replay-alpha-{alpha:g}", body)
    elif not args.no_write and args.section != "detection":
        body = (
            "## Detection of contract bugs (benchmarks/detection.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "The setting of the section above (DigitsCNN on the bundled digits, Opacus hooks "
            "mode, expected batch 64, sigma 1, C 1, RDP, auditor defaults), trained by "
            "`dpaudit_torch.testing.harness.run_bug`. Classes: "
            "`dpaudit_torch/testing/leaks_<clause>.py` (module docstrings), one clause of the "
            "DP-SGD contract each (docs/design.md, \"The DP-SGD contract\"). *Per-step* "
            f"classes: at most {args.max_steps} steps, stopped at `should_stop`; detected = "
            f"a violation decided by step {args.max_steps}; target >= 19/20. *Whole-run* "
            f"classes (setup, coverage): {args.setup_steps} steps, then `finalize()`; flagged "
            "= claim inconsistent / refuted / a violation / a finding; target 20/20. "
            f"{args.seeds} seeds per class.\n\n"
            + table + "\n\n" + summary + "\n"
            + ("\n### Correct training, wrong inputs\n\n" + wrong_table + "\n\n"
               + wrong_summary + "\n" if wrong_table else ""))
        write_section(args.section, body)
    elif not args.no_write:
        body = (
            "## Detection of silent DP bugs (benchmarks/detection.py)\n\n"
            f"Command: `{command()}`  \nMachine: {machine()}\n\n"
            "DigitsCNN (6,186 parameters in 10 tensors) on scikit-learn's bundled 8x8 digits "
            "(1,437 training images), Opacus hooks mode, Poisson sampling with expected batch 64 "
            "(q = 1/23), lr 0.5, sigma 1, C 1, RDP accountant; auditor defaults (every monitor; "
            "16 pairs/step, each a spread canary over 4 tensors, the default one-run canaries, "
            "canary norm 25 C, MMD + hockey-stick tests at 5 points of the per-step Gaussian "
            "profile, "
            "check_every 5; two levels: proofs (violation proven, claim refuted, claim "
            "inconsistent) at alpha 0.001 in total, the decision at its share 5e-4; evidence "
            f"at alpha_warn 0.05, reported, not acted on). {args.seeds} seeds per bug (model, "
            "data order, noise "
            "generator and auditor streams). Bugs: `dpaudit_torch/testing/bugs.py` (module "
            f"docstring). *Per-step* bugs: at most {args.max_steps} steps, stopped at "
            "`should_stop`, then `finalize()`; detected = `report.violation` with "
            f"`violation_step <= {args.max_steps}` (for `noise-bf16`: the noise monitor's "
            "low-precision finding at `finalize()`, which is a finding, not a statistical "
            f"proof). *Accounting* bugs: {args.setup_steps} loader batches, not stopped, then "
            "`finalize()`; detected = `claim_inconsistent` or `claim_refuted` or a violation "
            "(`accumulation-counted-per-micro-step`: 4 loader batches per release, so "
            f"{args.setup_steps // bugs.ACCUMULATION_STEPS} releases, and its steps are "
            "releases). *Decision step* = `violation_step` (a check step, a multiple of "
            "check_every = 5); *crossing step* = the step whose observations first pushed the "
            "averaged e-process over 1/alpha; *evidence* = the runs whose e-process reached "
            "1/alpha_warn (`report.evidence`; every proven violation is evidence too), at "
            "`evidence_step`. *First finding* = the monitor of "
            "`report.findings[0]` (notes excluded; a refuted claim is listed first); the next "
            "column counts the runs in which each monitor made a finding. Rows marked "
            "*diagnostic* lower `spread_pairs` from its default (every pair) to show what "
            "`per-tensor-clipping` needs; they have no target.\n\n"
            + table + "\n\n" + summary + "\n\n" + NOTES + "\n")
        write_section("detection", body)


if __name__ == "__main__":
    main()
