"""The README's headline numbers are the benchmark tables' numbers.

docs/benchmarks.md is written by the benchmark scripts, one section each between
``<!-- BEGIN name -->`` and ``<!-- END name -->`` (benchmarks/_common.py ``write_section``); the
README's "Headline numbers" quote them. This test reads the tables as they are now (a re-run of a
benchmark rewrites its section), derives every number the README quotes (counts, intervals,
medians, ratios, ranges), and checks that the README says exactly that: a re-run that changes a
table fails here until the README is brought up to date. Nothing of the tables is written down
in this file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

Row = dict[str, str]
Table = list[Row]


# ------------------------------------------------------------------ reading the documents
def sections(text: str) -> dict[str, str]:
    """Each ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` section of docs/benchmarks.md."""
    return dict(re.findall(r"<!-- BEGIN (\S+) -->\n(.*?)\n<!-- END \1 -->", text, flags=re.S))


def tables(section: str) -> list[Table]:
    """The Markdown tables of a section, each a list of rows (column header -> cell text)."""
    out: list[Table] = []
    block: list[str] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", block[1].strip()):
            cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block]
            out.append([dict(zip(cells[0], r, strict=True)) for r in cells[2:]])
        block = []
    return out


def table_with(section: str, column: str) -> Table:
    """The first table of ``section`` that has ``column``."""
    for t in tables(section):
        if t and column in t[0]:
            return t
    raise LookupError(f"no table with a column {column!r}")


def row(table: Table, **match: str) -> Row:
    """The one row whose cells equal ``match`` (keys: column headers, spaces as given)."""
    found = [r for r in table if all(r.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows match {match}")
    return found[0]


def headline(readme: str) -> str:
    """The README's "Headline numbers" section, whitespace collapsed (sentences wrap)."""
    part = readme.split("## Headline numbers", 1)[1].split("\n## ", 1)[0]
    return " ".join(part.split())


# ------------------------------------------------------------------ number formats
def _mean(cell: str) -> str:
    """``"0.91 ± 0.10 [0.83, 1.08]"`` -> ``"0.91"``."""
    return cell.split("±")[0].strip()


def _rate_pairs(cell: str) -> tuple[float, float | None]:
    """A Table-1 cell ``"1.00 / 264"`` -> (1.0, 264.0); ``"0.00 / -"`` -> (0.0, None)."""
    rate, pairs = (c.strip() for c in cell.split("/"))
    return float(rate), None if pairs == "-" else float(pairs)


def _sig2(x: float) -> str:
    """Two significant digits, trailing zero kept: 0.598 -> 0.60, 0.0077 -> 0.0077."""
    return f"{x:#.2g}".rstrip(".")


def _n(x: float) -> str:
    """An integer count as a plain number."""
    return f"{x:.0f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fraction(cell: str) -> tuple[int, int]:
    a, b = cell.split("/")
    return int(a), int(b)


def _prose(section: str, pattern: str) -> re.Match[str]:
    """A number in a section's prose (whitespace collapsed)."""
    m = re.search(pattern, " ".join(section.split()))
    if m is None:
        raise LookupError(f"no {pattern!r} in the section's text")
    return m


# ------------------------------------------------------------------ what the README quotes
#: how the README names the bug classes it quotes one by one (testing/bugs.py names otherwise)
BUG_WORDS = {"per-tensor-clipping": "per-tensor clipping",
             "noise-reseeded": "the re-seeded noise"}


def _detection(s: str) -> list[str]:
    t = [r for r in table_with(s, "bug") if "diagnostic" not in r["bug"]]
    seeds = {_fraction(r["detected"]) for r in t}
    (k, n), = seeds if len(seeds) == 1 else {(-1, -1)}  # every class in every seed, or fail
    out = [f"{n} seeds per bug, the {len(t)} bug classes",
           f"detected in {k}/{n} seeds for every class"]
    proven = [r for r in t if r["kind"] == "per-step" and r["criterion"].startswith("violation")]
    medians = {r["bug"]: float(r["median decision step"]) for r in proven}
    first = min(medians.values())
    at_first = [b for b, m in medians.items() if m == first]
    later = [f"{_n(m)} for {BUG_WORDS.get(b, b)}"
             for b, m in sorted(medians.items(), key=lambda bm: bm[1]) if m != first]
    listed = " and ".join([", ".join(later[:-1]), later[-1]] if len(later) > 1 else later)
    out.append(f"median decision step {_n(first)} (the first check) for {len(at_first)} of "
               f"these {len(proven)} classes" + (f", {listed}" if later else ""))
    largest = max(float(r["max decision step"]) for r in proven)
    out.append(f"the largest decision step in any seed is {_n(largest)}")
    bf16 = row(t, bug="noise-bf16")
    if bf16["violation"] == "0" and "finding" in bf16["criterion"]:
        out.append("Noise drawn in bfloat16 is reported as a finding")
    rate = row(t, bug="accountant-rate-4x")
    acc = row(t, bug="accumulation-counted-per-micro-step")
    fixed = row(t, bug="fixed-size-batches")
    if _fraction(rate["detected"])[0] == int(rate["claim inconsistent"]):
        out.append("The accountant told a 4x smaller rate (claim inconsistent)")
    if acc["median decision step"] == acc["max decision step"]:
        inconsistent = ", and claim inconsistent" if _fraction(acc["detected"])[0] == int(
            acc["claim inconsistent"]) else ""
        out.append(f"(non-Poisson batches proven at step {acc['median decision step']}"
                   f"{inconsistent})")
    if fixed["median decision step"] == fixed["max decision step"]:
        out.append(f"(non-Poisson batches proven, median and largest decision step "
                   f"{fixed['median decision step']})")
    else:
        out.append(f"(non-Poisson batches proven, median decision step "
                   f"{fixed['median decision step']}, largest {fixed['max decision step']})")
    flagged = {_fraction(r["detected"]) for r in (rate, acc, fixed)}
    (a, b), = flagged if len(flagged) == 1 else {(-1, -1)}
    out.append(f"are flagged in {a} of {b} seeds each")
    return out


def _false_alarms(s: str) -> list[str]:
    total = row(table_with(s, "configuration"), configuration="**total**")
    alarms = int(total["false alarms"])
    ev = int(total["evidence at alpha_warn"])
    out = [f"{_plural(alarms, 'false alarm')} in {total['runs']} runs (exact 95% "
           f"Clopper-Pearson interval {total['95% CP interval']}",
           f"evidence of a violation (not a proof) in {ev} ({ev / int(total['runs']):.3f}, "
           f"{total['evidence 95% CP interval']})"]
    under = next(v for k, v in total.items() if k.startswith("claim below the true epsilon"))
    if under != "-":  # "55 (claim 1.57 < 2.33); refuted in 2"
        m = re.fullmatch(r"(\d+) \(claim ([\d.]+) < ([\d.]+)\); refuted in (\d+)", under)
        assert m, under
        flagged = next(int(n) for name, n in (x.rsplit(" ", 1) for x in
                                              total["runs with a finding, per monitor"]
                                              .split(", ")) if name == "accounting")
        out += [f"(claim {m[2]}, true epsilon at least {m[3]})",
                f"says so in {flagged} of its {m[1]} runs",
                f"refuted that claim in {m[4]}"]
    return out


def _validity(s: str) -> list[str]:
    r = row(table_with(s, "correct runs"), model="all")
    return [f"{r['false alarms']} in {r['correct runs']} runs of {r['steps each']} steps "
            f"({r['rate']}, {r['95% Clopper-Pearson']})"]


def _one_run_real(s: str) -> list[str]:
    ref = table_with(s, "q told to the accountant")[0]

    def span(col: str) -> tuple[str, str]:
        vals = [b.strip() for b in ref[col].split(",")]
        return min(vals, key=float), max(vals, key=float)

    (wlow, whigh), (low, high) = span("white-box bounds"), span("Steinke bounds")
    done, seeds = _fraction(ref["claim refuted"])
    shrink = float(ref["real q"]) / float(ref["q told to the accountant"])
    real = table_with(s, "ratio real / simulated")
    mlp = next(r for r in real if r["model"].startswith("MLP"))
    cnn = next(r for r in real if r["model"] == "digits CNN")
    wb = "ratio real / idealized (white-box)"
    return [f"the accountant told a {shrink:.0f}x smaller sample rate (MLP, sigma {ref['sigma']}, "
            f"q {ref['real q']}, {ref['steps']} steps; claimed eps {ref['claimed eps (PRV)']}, "
            f"true {ref['true eps (PRV, real q)']}): claim refuted in {done} of {seeds} seeds "
            f"(white-box bounds {wlow} to {whigh}, Steinke {low} to {high})",
            f"(ratio real / idealized {mlp[wb]} for the MLP, {cnn[wb]} for the digits CNN; "
            f"Steinke {mlp['ratio real / simulated']} and {cnn['ratio real / simulated']})"]


def _one_run_whitebox(s: str, false_alarms: str) -> list[str]:
    t = table_with(s, "best / claim: median (seeds)")
    med = {r["eps"]: r["best / claim: median (seeds)"].split(" ")[0] for r in t}
    fin = sorted(float(r["finalize s (median)"]) for r in t)[len(t) // 2]
    total = row(table_with(false_alarms, "configuration"), configuration="**total**")
    cell = next(v for k, v in total.items() if k.startswith("white-box bound / claim"))
    median, largest = cell.split(";")[0].split(" / ")
    counts = cell.split(";")[1]
    above = int(counts.split()[0])
    above_truth = int(counts.split(",")[1].split()[0])
    runs = total["runs"]
    return [f"the median best whole-run bound is {med['8']} / {med['4']} / {med['2']} of the "
            f"claimed eps 8 / 4 / 2",
            f"finalize() takes {fin:g} s",
            f"On the {runs} correct runs of the false-alarm benchmark the white-box bound",
            f"at most {largest.strip()} of the claim (median {median.strip()})"
            + (", never above it" if above == 0 else f": above it in {above} runs"),
            "never above the true epsilon" if above_truth == 0
            else f"above the true epsilon in {above_truth}"]


def _table1(s: str) -> list[str]:
    t = table_with(s, "paper (MMD R=1/2)")
    runs = _prose(s, r"(\d+) runs per cell, budget (\d+) pairs")
    out = [f"(section \"Table 1\", `dpaudit table1`, {runs[1]} runs, budget {runs[2]})"]
    strong = [r for r in t if _rate_pairs(r["paper (MMD R=1/2)"])[0] >= 0.85]
    close, far = [], []
    for r in strong:
        paper = _rate_pairs(r["paper (MMD R=1/2)"])[1]
        ours = _rate_pairs(r["MMD R=1/2"])[1]
        assert paper is not None
        if ours is not None and abs(ours / paper - 1) <= 0.25:
            close.append(r)
        else:
            far.append(f"{r['mechanism']} at eps {r['eps']}: {_n(ours) if ours else 'no'} "
                       f"pairs against their {_n(paper)}")
    out.append(f"our MMD test with the authors' radius R = 1/2 needs within 25% of their pairs "
               f"to reject on {len(close)} of the {len(strong)} cells where they reject at rate "
               f">= 0.85")
    out += far
    r1 = [_rate_pairs(r["MMD R=1"])[1] / _rate_pairs(r["paper (MMD R=1/2)"])[1]  # type: ignore
          for r in strong]
    out.append(f"with R = 1 it needs {_sig2(min(r1))}-{_sig2(max(r1))}x their pairs")
    nondp = [r for r in t if r["mechanism"].startswith("NonDP")]
    hs = [_rate_pairs(r["hockey-stick"]) for r in nondp]
    if all(rate == 1.0 for rate, _ in hs):
        pairs = [p for _, p in hs if p is not None]
        vs_paper = [_rate_pairs(r["hockey-stick"])[1] / _rate_pairs(r["paper (MMD R=1/2)"])[1]
                    for r in nondp if _rate_pairs(r["paper (MMD R=1/2)"])[1] is not None]
        out.append(f"the hockey-stick test rejects every non-DP cell in {_n(min(pairs))}-"
                   f"{_n(max(pairs))} mean pairs ({_sig2(min(vs_paper))}-{_sig2(max(vs_paper))}x "
                   f"the paper)")
    many = [tb for tb in tables(s) if "mean pairs +- SE (many runs)" in tb[0]]
    if many:  # the many-run comparison on Kutta et al.'s cells (benchmarks/table1.py)
        kt = many[0]
        runs_k = {r["runs"] for r in kt}
        assert len(runs_k) == 1
        fewer = [f"{r['mean pairs +- SE (many runs)']} vs {r['Kutta et al.']}" for r in kt
                 if r["fewer (mean + 2 SE < Kutta)"] == "yes"]
        more = [f"{r['mean pairs +- SE (many runs)']} vs {r['Kutta et al.']}" for r in kt
                if r["fewer (mean + 2 SE < Kutta)"] != "yes"]
        out.append(f"needs fewer pairs than the best published sequential auditor (Kutta et al. "
                   f"2026) on {len(fewer)} of the {len(kt)} cells both report, by more than two "
                   f"standard errors over {runs_k.pop()} runs per cell ({', '.join(fewer)}"
                   + (f"; not on {', '.join(more)})" if more else ")"))
        return out
    kutta = [(_rate_pairs(r["hockey-stick"])[1], float(r["Kutta et al."]))
             for r in t if r["Kutta et al."] != "-"]
    fewer = [f"{_n(a)} vs {_n(b)}" for a, b in kutta if a is not None and a < b]
    more = [f"{_n(a)} vs {_n(b)}" for a, b in kutta if a is None or a >= b]
    out.append(f"needs fewer pairs than the best published sequential auditor (Kutta et al. "
               f"2026) on {len(fewer)} of the {len(kutta)} cells both report "
               f"({', '.join(fewer)}; {', '.join(more)})")
    return out


def _type1(s: str, tightness: str) -> list[str]:
    t = table_with(s, "false rejections")
    runs = {r["runs"] for r in t}
    pairs = {r["pairs/run"] for r in t}
    (n_runs,), (n_pairs,) = runs, pairs
    largest = max(float(r["rate"]) for r in t)
    ok = sum(r["<= alpha"] == "yes" for r in t)
    coverage = table_with(tightness, "P[bound > true]")
    games = _prose(tightness, r"\((\d+) runs per row")[1]
    worst = max(float(r["P[bound > true]"]) for r in coverage)
    return [f"`benchmarks/type1.py`, {n_runs} runs x {n_pairs} pairs per row",
            f"both tests reject at most {100 * largest:.1f}% of the time at alpha = 5% "
            f"({ok}/{len(t)} rows within their 95% interval)",
            f"one-run bounds exceed the true epsilon in at most {100 * worst:.1f}% of {games} "
            f"simulated games per row"]


def _one_run_tightness(s: str) -> list[str]:
    t = table_with(s, "default two-sided")
    eps = list(dict.fromkeys(r["eps (accountant)"].split()[0] for r in t))

    def bounds(score: str, method: str) -> str:  # at each eps, in the table's order
        return " / ".join(_mean(r["default two-sided"]) for r in t
                          if r["score"] == score and r["method"] == method)

    size = _prose(s, r"n = ([\d,]+), expected batch (\d+)")
    steps = _prose(s, r"T = (\d+) steps")[1]
    seeds = _prose(s, r"(\d+) seeds per eps")[1]
    sd = _prose(s, r"within ([\d.]+) seed sd")[1]
    return [f"n = {size[1]}, expected batch {size[2]}, {steps} steps, {seeds} seeds",
            f"at claimed eps {' / '.join(eps)}, valid Steinke bounds {bounds('sum', 'steinke')} "
            f"and f-DP {bounds('sum', 'fdp')}",
            f"with the auditor's default likelihood-ratio score {bounds('lr', 'steinke')} and "
            f"{bounds('lr', 'fdp')}",
            f"within {sd} seed standard deviations of the published targets"]


def _throughput(s: str) -> list[str]:
    t = table_with(s, "ours / naive")
    mmd = row(t, tester="MMD (R = 1)", T="10000")["ours / naive"]
    hs = row(t, tester="hockey-stick", T="10000")["ours / naive"]
    return [f"{mmd} the pairs/s of a naive one-tester-per-epsilon MMD baseline, {hs} for the "
            f"hockey-stick test"]


def _overhead(s: str, cifar: str) -> list[str]:
    col = "ratio from optimizer.step() (median)"
    t = table_with(s, col)

    def ratio(table: Table, mode: str, batch: str) -> str:
        return f"{float(row(table, mode=mode, batch=batch)[col]):.3f}"

    trials = [float(x) for x in row(t, mode="hooks", batch="64")["per trial"].split(",")]
    params = {int(r["params"]) for r in t}
    (n_params,) = params
    c = table_with(cifar, col)
    met = "met" if float(ratio(t, "hooks", "64")) <= 1.05 else "NOT met"
    return [f"on the {n_params:,}-parameter CNN, {ratio(t, 'hooks', '64')} at batch 64 in "
            f"per-sample (`hooks`) mode (trials {min(trials):.3f}-{max(trials):.3f}) and "
            f"{ratio(t, 'ghost', '64')} with ghost clipping, {ratio(t, 'hooks', '256')} (hooks) "
            f"and {ratio(t, 'ghost', '256')} (ghost) at batch 256",
            f"on the CNN of Opacus's CIFAR-10 example, {ratio(c, 'hooks', '64')} (hooks) and "
            f"{ratio(c, 'ghost', '64')} (ghost) at batch 64",
            f"The target of 1.05 at batch 64 in hooks mode is {met}"]


def _overhead_guard(s: str) -> list[str]:
    t = table_with(s, "added top-level ops/step")

    def r(model: str) -> dict[str, str]:
        return row(t, model=model)

    ratio = "whole-step ratio (median)"
    within = all(x["within"] == "yes" for x in t)
    return [f"{r('stack')['added top-level ops/step']} added top-level ops per step on the "
            f"162-tensor stack ({r('stack')['per watched tensor']} per tensor), "
            f"{r('mlp')['added top-level ops/step']} on the 4-tensor MLP, "
            f"{r('small')['added top-level ops/step']} on the small CNN and "
            f"{r('lora')['added top-level ops/step']} on the LoRA model",
            "all within the budget of 100 + 2 per watched tensor" if within
            else "NOT all within the budget of 100 + 2 per watched tensor",
            f"step time x{float(r('stack')[ratio]):.3f} (stack, batch {r('stack')['batch']}), "
            f"x{float(r('mlp')[ratio]):.3f} (MLP, {float(r('mlp')['CPU ms/step, off']):.1f} ms "
            f"steps), x{float(r('small')[ratio]):.3f} (small CNN, batch {r('small')['batch']}), "
            f"x{float(r('lora')[ratio]):.3f} (LoRA, batch {r('lora')['batch']})"]


def _overhead_check_every(s: str) -> list[str]:
    col = "ratio from optimizer.step() (median)"
    t = table_with(s, col)
    first, last = t[0], t[-1]
    return [f"{float(first[col]):.3f} at `check_every` {first['check_every']}, "
            f"{float(last[col]):.3f} at {last['check_every']};"]


def _scale(s: str) -> list[str]:
    col = "peak RSS ratio: median of pairs (min-max)"
    t = table_with(s, col)

    def peak(size: str, mode: str) -> tuple[str, str]:
        m = re.fullmatch(r"([\d.]+) \(([\d.]+-[\d.]+)\)", row(t, size=size, mode=mode)[col])
        assert m is not None
        return m[1], m[2]

    (h, h_pairs), (g, g_pairs) = peak("100M", "hooks"), peak("100M", "ghost")
    small = [float(peak(size, mode)[0]) for size in ("1M", "10M") for mode in ("hooks", "ghost")]
    big = [r for r in t if r["size"] == "100M"]
    own = max(float(r["1 + own / unaudited step"]) for r in big)
    met = all(r["memory <= 1.05 (median)"] == "yes" for r in big)
    return [f"{h} (hooks, pairs {h_pairs}) and {g} (ghost, pairs {g_pairs}) at 100M parameters, "
            f"{min(small):.2f}-{max(small):.2f} at 1M and 10M",
            "The target of 1.05 is " + ("met at 100M in both modes" if met else "NOT met"),
            f"the auditor's own code is {100 * (own - 1):.1f}% of a step at 100M"]


def _gpu_check(s: str) -> list[str]:
    t = table_with(s, "met")
    gpu = re.search(r"^Machine: .*?, ([^,]*(?:NVIDIA|GPU)[^,]*), Python", s, flags=re.M)
    assert gpu is not None
    checks = [r for r in t if r["met"] != "-"]
    met = sum(r["met"] == "yes" for r in checks)
    ratios: dict[str, list[float]] = {}
    memory: list[float] = []
    for r in t:
        if r["check"] == "auditor: cost against the unaudited step":
            step = re.search(r"step time x([\d.]+)", r["measured"])
            peak = re.search(r"peak memory x([\d.]+)", r["measured"])
            assert step is not None and peak is not None
            ratios.setdefault(r["setting"].split(" ")[0], []).append(float(step[1]))
            memory.append(float(peak[1]))
    spans = [f"x{min(v):.3f}-{max(v):.3f} on {k}" for k, v in ratios.items()]
    return [f"one {gpu[1]}", f"{met} of {len(checks)} checks met",
            f"Step time with the auditor {' and '.join(spans)}",
            f"peak device memory x{min(memory):.3f}-{max(memory):.3f}"]


#: section -> what the README quotes from it (some read a second section)
QUOTES: dict[str, Callable[[dict[str, str]], list[str]]] = {
    "detection": lambda d: _detection(d["detection"]),
    "false_alarms": lambda d: _false_alarms(d["false_alarms"]),
    "validity": lambda d: _validity(d["validity"]),
    "one_run_real": lambda d: _one_run_real(d["one_run_real"]),
    "one_run_whitebox": lambda d: _one_run_whitebox(d["one_run_whitebox"], d["false_alarms"]),
    "table1": lambda d: _table1(d["table1"]),
    "type1": lambda d: _type1(d["type1"], d["one_run_tightness"]),
    "one_run_tightness": lambda d: _one_run_tightness(d["one_run_tightness"]),
    "throughput": lambda d: _throughput(d["throughput"]),
    "overhead": lambda d: _overhead(d["overhead"], d["overhead_cifar"]),
    "overhead_check_every": lambda d: _overhead_check_every(d["overhead_check_every"]),
    "overhead_guard": lambda d: _overhead_guard(d["overhead_guard"]),
    "scale": lambda d: _scale(d["scale"]),
    "gpu_check": lambda d: _gpu_check(d["gpu_check"]),
}


def problems(readme: str, benchmarks: str) -> list[str]:
    """Every number the README's headline section should quote and does not, one line each
    (empty: the README agrees with the tables)."""
    said = headline(readme)
    docs = sections(benchmarks)
    found: list[str] = []
    for name, quote in QUOTES.items():
        try:
            phrases = quote(docs)
        except (LookupError, ValueError, AssertionError) as e:
            found.append(f"{name}: the section's tables cannot be read ({e!r})")
            continue
        found += [f"{name}: the README does not say {p!r}" for p in phrases
                  if " ".join(p.split()) not in said]
    return found


def _read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------ tests
def test_every_headline_number_is_the_tables() -> None:
    assert problems(_read("README.md"), _read("docs/benchmarks.md")) == []


def test_every_section_the_headline_names_exists() -> None:
    """Each bullet names its section by its heading: ``(section "Detection of silent DP
    bugs", ...)``; every such heading is one of docs/benchmarks.md."""
    named = re.findall(r'section "([^"]+)"', headline(_read("README.md")))
    headings = re.findall(r"^## (.+)$", _read("docs/benchmarks.md"), flags=re.M)
    assert len(named) >= 8
    assert [n for n in named if not any(h.startswith(n) for h in headings)] == []


def test_the_check_sees_a_number_that_is_not_the_tables() -> None:
    """The README of before this test (0 false alarms in 280 runs, [0.000, 0.013], a largest
    decision step of 15, where the tables said 1, [0.000, 0.020] and 20) fails it."""
    readme, bench = _read("README.md"), _read("docs/benchmarks.md")
    total = row(table_with(sections(bench)["false_alarms"], "configuration"),
                configuration="**total**")
    wrong = readme.replace(total["95% CP interval"], "[0.000, 0.013]")
    assert any("false_alarms: the README does not say" in p for p in problems(wrong, bench))
    det = [r for r in table_with(sections(bench)["detection"], "bug")
           if "diagnostic" not in r["bug"] and r["kind"] == "per-step"
           and r["criterion"].startswith("violation")]
    largest = max(int(r["max decision step"]) for r in det)
    wrong = readme.replace(f"largest decision step in any seed is {largest}",
                           f"largest decision step in any seed is {largest + 1}")
    assert any("detection" in p for p in problems(wrong, bench))
    assert any("cannot be read" in p
               for p in problems(readme, bench.replace("| **total** |", "| total |")))


def test_tables_and_sections_are_read_as_written() -> None:
    text = ("intro\n<!-- BEGIN a -->\n## A\n\n| x | y z |\n|---|---|\n| 1 | 2 / 3 |\n| 4 | - |\n"
            "\nafter\n<!-- END a -->\n<!-- BEGIN b -->\nno table\n<!-- END b -->\n")
    got = sections(text)
    assert set(got) == {"a", "b"} and tables(got["b"]) == []
    (t,) = tables(got["a"])
    assert t == [{"x": "1", "y z": "2 / 3"}, {"x": "4", "y z": "-"}]
    assert row(t, x="4") == {"x": "4", "y z": "-"}
    with pytest.raises(LookupError):
        table_with(got["a"], "w")
    assert _mean("0.91 ± 0.10 [0.83, 1.08]") == "0.91"
    assert _rate_pairs("0.00 / -") == (0.0, None) and _rate_pairs("1.00 / 264") == (1.0, 264.0)
    assert [_sig2(x) for x in (0.598, 0.0077, 0.2296, 0.192)] == ["0.60", "0.0077", "0.23",
                                                                   "0.19"]
