"""Plots of the audit report, rendered off-screen (matplotlib Agg) to inline base64 PNG.

No pyplot and no global backend switch: each plot is a :class:`matplotlib.figure.Figure` drawn on
its own Agg canvas, so rendering is safe inside a training process or a notebook. Every function
returns a :class:`Plot`: either ``png`` (base64 text) or ``None`` with ``reason``, one sentence
saying why there is nothing to plot (e.g. a per-step bound that stayed 0); ``notes`` lists what
was dropped (non-finite values, length mismatches).

Each sequential tester's curve is named and coloured as :data:`dpaudit_torch.registry.TESTERS`
says; a series this version does not know (a report from a newer writer) is drawn under its own
name in matplotlib's next colour.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..registry import TESTERS

__all__ = ["Plot", "plot_log_wealth", "plot_epsilon_lower_bound", "plot_score_histograms"]

_WIDTH_IN, _HEIGHT_IN, _DPI = 7.2, 3.3, 100
# series of wealth_history that are NOT log-wealths
_NOT_WEALTH = ("step", "epsilon_lower_bound")
# the decision's e-process: the average of the betting monitors' e-values, not a tester
_COMBINED = "combined"
_COMBINED_COLOR = "black"
# a betting monitor's own term of that average: "monitor." + its name (the writer's
# ``MONITOR_COLUMN``); the report's ``monitor_labels`` name it
_MONITOR = "monitor."
_STEP_AXIS, _INDEX_AXIS = "training step", "record index"


@dataclass
class Plot:
    """One rendered plot (``png`` base64, or ``None`` with ``reason``); ``legend`` and ``xticks``
    are the legend's entries and the x-axis tick labels as drawn (the page writes them beside
    the image, so that what the plot shows can be read as text)."""

    png: str | None
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    xticks: list[str] = field(default_factory=list)


def _figure() -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _to_png(fig: Any) -> str:
    buf = io.BytesIO()
    # no Software / date metadata: same report -> same bytes
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _finite_xy(
    steps: Sequence[float], values: Sequence[float], name: str, notes: list[str]
) -> tuple[list[float], list[float]]:
    n = min(len(steps), len(values))
    if len(steps) != len(values):
        notes.append(
            f"{name}: {len(values)} values for {len(steps)} steps; the first {n} are plotted"
        )
    xs, ys = [], []
    dropped = 0
    for x, y in zip(steps[:n], values[:n]):
        if math.isfinite(float(x)) and math.isfinite(float(y)):
            xs.append(float(x))
            ys.append(float(y))
        else:
            dropped += 1
    if dropped:
        notes.append(f"{name}: {dropped} non-finite value(s) not plotted")
    return xs, ys


def _steps(history: dict[str, list], length: int) -> tuple[list[float], str]:
    steps = history.get("step")
    if steps:
        return [float(s) for s in steps], _STEP_AXIS
    return [float(i) for i in range(length)], _INDEX_AXIS


def _series_style(name: str, labels: dict[str, str], by_monitor: bool
                  ) -> tuple[str, str | None, dict[str, Any]]:
    """Legend label, colour and line style of a log-wealth series: the decision's average
    (thick, black), a betting monitor's term (by the report's label of it), a sequential
    tester's (the registry's label and colour; thin and dashed where the monitors' terms are
    drawn, as it is a part of one of them)."""
    if name == _COMBINED:
        what = ("the decision: log of the average of the monitors' e-values" if by_monitor else
                "the decision: log of the average of every monitor's e-value (not all drawn)")
        return what, _COMBINED_COLOR, {"linewidth": 2.2}
    if name.startswith(_MONITOR):
        mon = name[len(_MONITOR):]
        label = labels.get(mon, mon).split(" (")[0]
        return f"monitor: {label}", None, {"linewidth": 1.6}
    spec = TESTERS.get(name)
    label, color = (spec.label, spec.color) if spec is not None else (name, None)
    if by_monitor:
        return (f"{label} (a sequential test of the canary pairs)", color,
                {"linewidth": 1.0, "linestyle": "--", "alpha": 0.8})
    return label, color, {"linewidth": 1.3, "alpha": 0.85}


def _mark_step(ax: Any, step: int | None, label: str) -> None:
    if step is not None:
        ax.axvline(step, color="#d62728", linestyle=":", linewidth=1.2, label=label)


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, notes: list[str]
            ) -> Plot:
    """Labels, grid and legend of a report plot; the figure as a :class:`Plot`."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if xlabel in (_STEP_AXIS, _INDEX_AXIS):  # steps are whole numbers: so are the ticks
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend = ax.legend(loc="best", fontsize="small")
    png = _to_png(fig)  # draws the figure: the tick labels below are those drawn
    lo, hi = sorted(ax.get_xlim())
    ticks = [t.get_text() for t in ax.get_xticklabels()
             if lo - 1e-9 <= t.get_position()[0] <= hi + 1e-9 and t.get_text()]
    return Plot(png, notes=notes, legend=[t.get_text() for t in legend.get_texts()],
                xticks=ticks)


def plot_log_wealth(
    history: dict[str, list],
    threshold_log: float,
    violation_step: int | None = None,
    crossed_step: float | None = None,
    labels: dict[str, str] | None = None,
) -> Plot:
    """Log-wealth over training steps, with the log(1/alpha) line: one line per monitor that
    bets in the decision (``monitor.<name>`` series, named by ``labels``, the report's
    ``monitor_labels``), the decision itself (``combined``, the log of their average, labelled
    as such), and each sequential test.

    ``crossed_step``: step at which the combined wealth first reached the threshold, marked when
    it differs from ``violation_step`` (the decision may be checked only every few steps).

    A test rejects (proves a violation) when its wealth reaches 1/alpha, i.e. its log-wealth
    reaches log(1/alpha); by Ville's inequality a valid null reaches it with probability <= alpha.
    """
    names = [k for k in history if k not in _NOT_WEALTH and history.get(k)]
    if not names:
        return Plot(None, "Nothing to plot: no sequential log-wealth was recorded (no sequential "
                    "test ran, or no step was audited).")
    notes: list[str] = []
    longest = max(len(history[k]) for k in names)
    steps, xlabel = _steps(history, longest)
    series = []
    for k in names:
        xs, ys = _finite_xy(steps, history[k], k, notes)
        if xs:
            series.append((k, xs, ys))
    if not series:
        return Plot(None, "Nothing to plot: every recorded log-wealth is non-finite.", notes)
    fig, ax = _figure()
    by_monitor = any(k.startswith(_MONITOR) for k, _, _ in series)
    for k, xs, ys in series:
        marker = "o" if len(xs) == 1 else None
        label, color, style = _series_style(k, labels or {}, by_monitor)
        ax.plot(xs, ys, label=label, color=color, marker=marker, **style)
    if math.isfinite(threshold_log):
        ax.axhline(threshold_log, color="black", linestyle="--", linewidth=1.0,
                   label=f"log(1/α) = {threshold_log:.3g}")
    if crossed_step is not None and crossed_step != violation_step:
        ax.axvline(crossed_step, color="grey", linestyle=":", linewidth=1.2,
                   label=f"threshold first reached (step {crossed_step:g})")
    _mark_step(ax, violation_step, f"violation proven (step {violation_step})")
    return _finish(fig, ax, xlabel, "log-wealth",
                   "Log-wealth of the decision and its monitors (rejects at the dashed line)",
                   notes)


def plot_epsilon_lower_bound(
    history: dict[str, list],
    grid_max: float | None = None,
    violation_step: int | None = None,
) -> Plot:
    """Sequential (per-step) epsilon lower bound over training steps (anytime form)."""
    values = history.get("epsilon_lower_bound") or []
    if not values:
        return Plot(None, "Nothing to plot: no per-step ε lower bound was recorded (no "
                    "sequential test ran, or no step was audited).")
    notes: list[str] = []
    steps, xlabel = _steps(history, len(values))
    xs, ys = _finite_xy(steps, values, "epsilon_lower_bound", notes)
    if not xs:
        return Plot(None, "Nothing to plot: every recorded per-step bound is non-finite.", notes)
    if all(y == 0.0 for y in ys):
        return Plot(None, f"Nothing to plot: no point of the per-step null's grid was rejected "
                          f"in the {len(ys)} recorded step(s), so the per-step ε lower bound "
                          f"is 0 throughout.", notes)
    fig, ax = _figure()
    marker = "o" if len(xs) == 1 else None
    ax.plot(xs, ys, drawstyle="steps-post", color="#9467bd", linewidth=2.0, marker=marker,
            label="per-step ε lower bound")
    if grid_max is not None and math.isfinite(grid_max):
        ax.axhline(grid_max, color="grey", linestyle="--", linewidth=1.0,
                   label=f"largest grid ε = {grid_max:.3g} (ceiling)")
    _mark_step(ax, violation_step, f"violation proven (step {violation_step})")
    ax.set_ylim(bottom=0.0)
    return _finish(fig, ax, xlabel, "ε lower bound (one step)",
                   "Sequential ε lower bound for one training step", notes)


def plot_score_histograms(scores: dict[str, list[float]]) -> Plot:
    """Histograms of the one-run canary scores, IN (inserted) vs OUT (never inserted)."""
    import numpy as np

    notes: list[str] = []
    data = {}
    for key in ("in", "out"):
        raw = np.asarray(scores.get(key) or [], dtype=np.float64)
        finite = raw[np.isfinite(raw)]
        if finite.size < raw.size:
            notes.append(f"{key.upper()}: {raw.size - finite.size} non-finite score(s) not plotted")
        data[key] = finite
    if data["in"].size == 0 and data["out"].size == 0:
        return Plot(None, "Nothing to plot: no one-run canary scores were recorded (they are "
                    "revealed at finalize).", notes)
    for key in ("in", "out"):
        if data[key].size == 0:
            notes.append(f"no {key.upper()} scores")
    both = np.concatenate([data["in"], data["out"]])
    n_bins = int(min(60, max(5, math.ceil(math.sqrt(both.size)))))
    edges = np.histogram_bin_edges(both, bins=n_bins)
    fig, ax = _figure()
    for key, color, label in (("out", "#7f7f7f", "OUT (not inserted)"),
                              ("in", "#d62728", "IN (inserted)")):
        if data[key].size:
            ax.hist(data[key], bins=edges, alpha=0.5, color=color, histtype="stepfilled",
                    label=f"{label}, n = {data[key].size}")
    return _finish(fig, ax, "canary score (sum of projections over steps)", "canaries",
                   "One-run audit: canary scores, IN vs OUT", notes)
