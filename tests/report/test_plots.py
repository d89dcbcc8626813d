"""Tests of dpaudit_torch/report/plots.py: off-screen plots as base64 PNG, or one sentence saying
why there is nothing to plot, with notes on what was dropped (fixed data, no randomness)."""

from __future__ import annotations

import base64
import math

from dpaudit_torch.report.plots import (
    Plot,
    plot_epsilon_lower_bound,
    plot_log_wealth,
    plot_score_histograms,
)


def _is_png(plot: Plot) -> bool:
    return plot.png is not None and base64.b64decode(plot.png)[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_wealth() -> None:
    history = {"step": [0, 2, 4, 6], "mmd": [0.0, 0.5, 1.5, 3.2], "combined": [0.0, 0.3, 1.0, 3.1],
               "newer_tester": [0.0, 0.1, 0.2, 0.3], "epsilon_lower_bound": [0, 0, 0.2, 0.5]}
    plot = plot_log_wealth(history, math.log(20.0), violation_step=6, crossed_step=4)
    assert _is_png(plot) and plot.notes == [] and plot.reason == ""
    # the same data give the same bytes (no date or software metadata)
    assert plot_log_wealth(history, math.log(20.0), 6, 4).png == plot.png


def test_log_wealth_without_data_or_with_bad_values() -> None:
    none = plot_log_wealth({"step": [1], "epsilon_lower_bound": [0.0]}, 3.0)
    assert none.png is None and none.reason.startswith("Nothing to plot: no sequential log-wealth")
    nan = plot_log_wealth({"mmd": [math.nan, math.inf]}, 3.0)
    assert nan.png is None and "every recorded log-wealth is non-finite" in nan.reason
    assert nan.notes == ["mmd: 2 non-finite value(s) not plotted"]
    short = plot_log_wealth({"step": [0, 1, 2], "mmd": [0.1, 0.2]}, math.inf)
    assert _is_png(short)
    assert short.notes == ["mmd: 2 values for 3 steps; the first 2 are plotted"]


def test_epsilon_lower_bound() -> None:
    plot = plot_epsilon_lower_bound({"step": [0, 1, 2], "epsilon_lower_bound": [0.0, 0.2, 0.5]},
                                    grid_max=1.0, violation_step=2)
    assert _is_png(plot)
    zero = plot_epsilon_lower_bound({"step": [0, 1], "epsilon_lower_bound": [0.0, 0.0]})
    assert zero.png is None and zero.reason == (
        "Nothing to plot: no point of the per-step null's grid was rejected in the 2 recorded "
        "step(s), so the per-step ε lower bound is 0 throughout.")
    assert plot_epsilon_lower_bound({}).reason.startswith("Nothing to plot: no per-step")
    bad = plot_epsilon_lower_bound({"epsilon_lower_bound": [math.nan]})
    assert "every recorded per-step bound is non-finite" in bad.reason


def test_score_histograms() -> None:
    scores = {"in": [0.1 * i for i in range(40)], "out": [0.05 * i for i in range(40)]}
    assert _is_png(plot_score_histograms(scores))
    only_in = plot_score_histograms({"in": [1.0, math.nan, 2.0]})
    assert _is_png(only_in)
    assert only_in.notes == ["IN: 1 non-finite score(s) not plotted", "no OUT scores"]
    empty = plot_score_histograms({})
    assert empty.png is None and "no one-run canary scores were recorded" in empty.reason
