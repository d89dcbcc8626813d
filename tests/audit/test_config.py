"""``AuditConfig`` (dpaudit_torch/audit/config.py): every setting validated once with an error
naming the value, the normalised frozen values, ``replace`` / ``from_kwargs``, sizing for a
model, the checkpoint fingerprint (which leaves out the user's model and dataset names), the
report's ``config`` section and the testers' options."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import numpy as np
import pytest
import torch

from dpaudit_torch.audit.config import (
    DEFAULT_M_CANARIES,
    DEFAULT_NOISE_COORDINATES_TOTAL,
    DEFAULT_TEST_OPTIONS,
    AuditConfig,
    default_m_canaries,
)

FIELDS = {f.name for f in dataclasses.fields(AuditConfig)}


# ------------------------------------------------------------------ validation
_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    (dict(delta=0.0), ValueError, "delta must lie in (0, 1), got 0.0"),
    (dict(delta=1.0), ValueError, "delta must lie in (0, 1), got 1.0"),
    (dict(delta="1e-5"), TypeError, "delta must be a real number, got '1e-5'"),
    (dict(alpha=1.5), ValueError, "alpha must lie in (0, 1), got 1.5"),
    (dict(alpha=float("nan")), ValueError, "alpha must lie in (0, 1), got nan"),
    (dict(alpha=True), TypeError, "alpha must be a real number, got True"),
    (dict(alpha_warn=0.0), ValueError, "alpha_warn must lie in (0, 1), got 0.0"),
    (dict(alpha_warn="0.05"), TypeError, "alpha_warn must be a real number, got '0.05'"),
    (dict(alpha_warn=5e-4), ValueError, "alpha_warn must lie in [alpha, 1) = [0.001, 1), "
                                        "got 0.0005"),
    (dict(alpha=0.01, alpha_warn=0.005), ValueError, "alpha_warn must lie in [alpha, 1) = "
                                                     "[0.01, 1), got 0.005"),
    (dict(stop_on="warning"), ValueError, "stop_on must be one of ('proof', 'evidence'), got "
                                          "'warning'"),
    (dict(level_split="none"), ValueError, "level_split must be one of ('union', 'per_path'), "
                                           "got 'none'"),
    (dict(k_pairs=0), ValueError, "k_pairs must be >= 1, got 0"),
    (dict(k_pairs=2.0), TypeError, "k_pairs must be an integer, got 2.0"),
    (dict(k_pairs=True), TypeError, "k_pairs must be an integer, got True"),
    (dict(m_canaries=-1), ValueError, "m_canaries must be >= 0, got -1"),
    (dict(m_canaries="8"), TypeError, "m_canaries must be an integer, got '8'"),
    (dict(canary_norm=1.0), ValueError, "canary_norm must exceed 1"),
    (dict(canary_norm=0.5), ValueError, "got 0.5"),
    (dict(canary_norm=float("inf")), ValueError, "canary_norm must be a finite number > 0, "
                                                 "got inf"),
    (dict(per_step_null=1.0), TypeError, "per_step_null must be None or a pair (epsilon, "
                                         "delta), got 1.0"),
    (dict(per_step_null=(1.0, 0.1, 0.2)), TypeError, "got (1.0, 0.1, 0.2)"),
    (dict(per_step_null=(0.0, 1e-5)), ValueError, "per_step_null epsilon must be a finite "
                                                  "number > 0, got 0.0"),
    (dict(per_step_null=(1.0, 1.0)), ValueError, "per_step_null delta must lie in [0, 1), got "
                                                 "(1.0, 1.0)"),
    (dict(per_step_null=(1.0, -0.1)), ValueError, "got (1.0, -0.1)"),
    (dict(tests=()), ValueError, "tests must be a non-empty subset of ['hockey_stick', 'mmd'], "
                                 "got ()"),
    (dict(tests=("mmd", "bogus")), ValueError, "got ('mmd', 'bogus')"),
    (dict(tests=("mmd", "mmd")), ValueError, "got ('mmd', 'mmd')"),
    (dict(check_every=0), ValueError, "check_every must be >= 1, got 0"),
    (dict(claimed_every=-2), ValueError, "claimed_every must be >= 1, got -2"),
    (dict(on_violation="explode"), ValueError, "on_violation must be one of ('stop', 'raise', "
                                               "'warn'), got 'explode'"),
    (dict(on_nonfinite="ignore"), ValueError, "on_nonfinite must be one of ('raise', 'skip'), "
                                              "got 'ignore'"),
    (dict(seed=1.5), TypeError, "seed must be an int or None, got 1.5"),
    (dict(seed=True), TypeError, "seed must be an int or None, got True"),
    (dict(history_stride=0), ValueError, "history_stride must be >= 1, got 0"),
    (dict(test_options={"nope": {}}), ValueError, "test_options keys must be among "
                                                  "['hockey_stick', 'mmd'], got ['nope']"),
    (dict(test_options={"mmd": 3}), TypeError, "test_options must map a test name to a dict "
                                               "of options, got {'mmd': 3}"),
    (dict(test_options=[("mmd", {})]), TypeError, "got [('mmd', {})]"),
    (dict(noise_coordinates_per_tensor=-1), ValueError, "noise_coordinates_per_tensor must be "
                                                        ">= 0, got -1"),
    (dict(noise_coordinates_total=0), ValueError, "noise_coordinates_total must be >= 1, "
                                                  "got 0"),
    (dict(compiled_kernels="yes"), TypeError, "compiled_kernels must be True, False or None "
                                              "(by the model's size), got 'yes'"),
    (dict(spread_pairs=-1), ValueError, "spread_pairs must be >= 0, got -1"),
    (dict(k_pairs=4, spread_pairs=5), ValueError, "spread_pairs (5) cannot exceed k_pairs (4)"),
    (dict(spread_tensors=1), ValueError, "spread_tensors must be >= 2, got 1"),
    (dict(monitors=3), TypeError, "monitors must be a sequence of monitor names, got 3"),
    (dict(monitors=("noise", 1)), TypeError, "got ('noise', 1)"),
    (dict(disable_monitors=None), TypeError, "disable_monitors must be a sequence of monitor "
                                             "names, got None"),
    (dict(monitor_options={"noise": 3}), TypeError, "monitor_options must map a monitor name "
                                                    "to a dict of options, got {'noise': 3}"),
    (dict(monitor_options={1: {}}), TypeError, "got {1: {}}"),
    (dict(one_run_score="median"), ValueError, "one_run_score must be one of ('llr', 'sum'), "
                                               "got 'median'"),
    (dict(model_name=3), TypeError, "model_name must be a string or None, got 3"),
    (dict(dataset_name="  "), ValueError, "dataset_name must be a non-empty name of at most "
                                          "200 characters on one line, got '  '"),
    (dict(model_name="a\nb"), ValueError, "got 'a\\nb'"),
    (dict(model_name="x" * 201), ValueError, "model_name must be a non-empty name"),
    (dict(tester_placement="gpu"), ValueError, "tester_placement must be one of ('auto', "
                                               "'host', 'device'), got 'gpu'"),
    (dict(tester_placement=None), ValueError, "tester_placement must be one of ('auto', "
                                              "'host', 'device'), got None"),
]


@pytest.mark.parametrize("kwargs,exc,message", _BAD, ids=[str(c[0]) for c in _BAD])
def test_every_bad_setting_is_refused_naming_the_value(kwargs: dict[str, Any],
                                                       exc: type[Exception],
                                                       message: str) -> None:
    with pytest.raises(exc, match=re.escape(message)):
        AuditConfig(**kwargs)


def test_defaults() -> None:
    cfg = AuditConfig()
    assert (cfg.delta, cfg.alpha, cfg.k_pairs, cfg.m_canaries) == (1e-5, 1e-3, 16, None)
    assert (cfg.alpha_warn, cfg.stop_on, cfg.level_split) == (0.05, "proof", "union")
    assert cfg.tests == ("mmd", "hockey_stick") and cfg.spread_pairs == cfg.k_pairs == 16
    assert cfg.noise_coordinates_total == DEFAULT_NOISE_COORDINATES_TOTAL
    assert cfg.tester_placement == "auto"  # the stored rule: the host until measured
    assert cfg.monitors is None and cfg.disable_monitors == () and cfg.monitor_options == {}
    assert cfg.test_options == {} and cfg.compiled_kernels is None and cfg.seed is None
    # the decision's share of alpha (half: docs/design.md, "Two levels of evidence")
    assert cfg.decision_threshold_log == pytest.approx(math.log(2000.0))
    assert cfg.evidence_threshold_log == pytest.approx(math.log(20.0))


def test_values_are_normalised() -> None:
    cfg = AuditConfig(delta=np.float32(0.5), alpha=torch.tensor(0.1), k_pairs=np.int64(4),
                      m_canaries=np.int32(0), canary_norm=2, per_step_null=[1, 0],
                      tests="hockey_stick", device=torch.device("cpu"), spread_pairs=0,
                      noise_coordinates_per_tensor=0, noise_coordinates_total=None,
                      monitors="noise", disable_monitors=["sampling"], seed=-3)
    assert type(cfg.delta) is float and cfg.delta == 0.5
    assert type(cfg.alpha) is float and cfg.alpha == pytest.approx(0.1)
    assert type(cfg.k_pairs) is int and cfg.k_pairs == 4
    assert type(cfg.m_canaries) is int and cfg.m_canaries == 0
    assert type(cfg.canary_norm) is float and cfg.canary_norm == 2.0
    assert cfg.per_step_null == (1.0, 0.0) and type(cfg.per_step_null[1]) is float
    assert cfg.tests == ("hockey_stick",) and cfg.device == "cpu"
    assert cfg.monitors == ("noise",) and cfg.disable_monitors == ("sampling",)
    assert cfg.spread_pairs == 0 and cfg.noise_coordinates_per_tensor == 0
    assert cfg.noise_coordinates_total is None and cfg.seed == -3


def test_option_mappings_are_copied_and_the_config_is_frozen() -> None:
    opts = {"mmd": {"max_witness_points": 64}}
    mons = {"noise": {"alpha": 0.01}}
    cfg = AuditConfig(test_options=opts, monitor_options=mons)
    opts["mmd"]["max_witness_points"] = 1
    mons["noise"]["alpha"] = 0.5
    opts["hockey_stick"] = {}
    assert cfg.test_options == {"mmd": {"max_witness_points": 64}}
    assert cfg.monitor_options == {"noise": {"alpha": 0.01}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.k_pairs = 3  # type: ignore[misc]


# ------------------------------------------------------------------ replace / from_kwargs
def test_replace_validates_again_and_leaves_the_original() -> None:
    cfg = AuditConfig(k_pairs=4, alpha=0.1)
    new = cfg.replace(alpha=0.01, check_every=2)
    assert (new.alpha, new.check_every, new.k_pairs) == (0.01, 2, 4)
    assert (cfg.alpha, cfg.check_every) == (0.1, 5)
    with pytest.raises(ValueError, match=re.escape("alpha must lie in (0, 1), got 2")):
        cfg.replace(alpha=2)
    with pytest.raises(TypeError):
        cfg.replace(bogus=1)


def test_replace_k_pairs_keeps_the_default_spread_pairs() -> None:
    assert AuditConfig().replace(k_pairs=32).spread_pairs == AuditConfig(k_pairs=32).spread_pairs
    assert AuditConfig(k_pairs=8).replace(k_pairs=4).spread_pairs == 4


def test_from_kwargs() -> None:
    cfg = AuditConfig.from_kwargs(k_pairs=3, alpha=0.1)
    assert cfg == AuditConfig(k_pairs=3, alpha=0.1)
    assert AuditConfig.from_kwargs() == AuditConfig()
    assert AuditConfig.from_kwargs(cfg) is cfg  # nothing to change: the same object
    changed = AuditConfig.from_kwargs(cfg, check_every=7)
    assert changed.check_every == 7 and changed.k_pairs == 3 and cfg.check_every == 5
    with pytest.raises(TypeError, match=re.escape("unknown audit setting(s) ['k_paris', "
                                                  "'zeta']; known: ")) as info:
        AuditConfig.from_kwargs(cfg, k_paris=3, zeta=1, alpha=0.2)
    assert "'k_pairs'" in str(info.value)
    with pytest.raises(TypeError, match="config must be an AuditConfig, got dict"):
        AuditConfig.from_kwargs({"k_pairs": 3}, alpha=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k_pairs must be >= 1, got 0"):
        AuditConfig.from_kwargs(cfg, k_pairs=0)


# ------------------------------------------------------------------ sizing for a model
def test_default_m_canaries() -> None:
    assert default_m_canaries(610, 4) == (610 - 8) // 2 == 301
    assert default_m_canaries(10**6, 16) == DEFAULT_M_CANARIES == 20000
    assert default_m_canaries(2 * 16 + 2 * 20000, 16) == 20000
    assert default_m_canaries(2 * 16 + 2 * 20000 - 2, 16) == 19999
    assert default_m_canaries(8, 4) == 0 and default_m_canaries(5, 4) == 0  # never negative


def test_sized_for_fills_the_default_canaries_and_the_kernel_mode() -> None:
    cfg = AuditConfig(k_pairs=4)
    small = cfg.sized_for(610, compiled_below=1000)
    assert small.m_canaries == 301 and small.compiled_kernels is True
    assert cfg.m_canaries is None and cfg.compiled_kernels is None  # the original is kept
    assert cfg.sized_for(610, compiled_below=610).compiled_kernels is False
    assert cfg.sized_for(10**7, compiled_below=1000).m_canaries == DEFAULT_M_CANARIES
    # settings given explicitly are kept
    fixed = AuditConfig(k_pairs=4, m_canaries=12, compiled_kernels=False)
    sized = fixed.sized_for(610, compiled_below=1000)
    assert (sized.m_canaries, sized.compiled_kernels) == (12, False)
    assert AuditConfig(compiled_kernels=True).sized_for(10**7, 10).compiled_kernels is True
    # exactly the coordinates needed is enough
    assert AuditConfig(k_pairs=4, m_canaries=602).sized_for(610, 1000).m_canaries == 602


def test_sized_for_refuses_canaries_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "the model has 610 trainable coordinates, fewer than the 611 canary coordinates "
            "requested (2 * k_pairs + m_canaries); lower k_pairs or m_canaries")):
        AuditConfig(k_pairs=4, m_canaries=603).sized_for(610, 1000)
    # the default canaries cannot help when the pairs alone do not fit
    with pytest.raises(ValueError, match="fewer than the 8 canary coordinates"):
        AuditConfig(k_pairs=4).sized_for(7, 1000)


# ------------------------------------------------------------------ records
FINGERPRINT_KEYS = {"k_pairs", "m_canaries", "canary_norm", "delta", "alpha", "null", "tests",
                    "check_every", "claimed_every", "on_violation", "on_nonfinite",
                    "history_stride", "test_options", "noise_coordinates_per_tensor",
                    "alpha_warn", "stop_on", "level_split",
                    "noise_coordinates_total", "spread_pairs", "spread_tensors"}


def test_fingerprint_keys_and_plain_values() -> None:
    cfg = AuditConfig(k_pairs=4, m_canaries=10, per_step_null=(1.0, 1e-6),
                      test_options={"mmd": {"max_witness_points": 64}})
    fp = cfg.fingerprint()
    assert set(fp) == FINGERPRINT_KEYS
    assert fp["null"] == [1.0, 1e-6] and fp["tests"] == ["mmd", "hockey_stick"]
    assert AuditConfig().fingerprint()["null"] is None
    assert json.loads(json.dumps(fp)) == fp  # plain types


def test_fingerprint_leaves_out_seed_device_kernels_and_the_monitor_set() -> None:
    base = AuditConfig(k_pairs=4, m_canaries=10)
    other = base.replace(seed=7, device="cuda:1", compiled_kernels=False,
                         monitors=("noise",), disable_monitors=("sampling",),
                         monitor_options={"noise": {"alpha": 0.01}},
                         model_name="resnet18-v3", dataset_name="cifar10-train",
                         tester_placement="device")
    assert other.fingerprint() == base.fingerprint()


@pytest.mark.parametrize("change", [
    dict(k_pairs=5), dict(m_canaries=11), dict(canary_norm=30.0), dict(delta=1e-6),
    dict(alpha=0.01), dict(per_step_null=(1.0, 0.0)), dict(tests=("mmd",)),
    dict(check_every=3), dict(claimed_every=10), dict(on_violation="warn"),
    dict(on_nonfinite="skip"), dict(history_stride=2),
    dict(test_options={"mmd": {"max_witness_points": 64}}),
    dict(noise_coordinates_per_tensor=16), dict(noise_coordinates_total=None),
    dict(spread_pairs=2), dict(spread_tensors=3),
], ids=lambda c: next(iter(c)))
def test_fingerprint_changes_with_every_setting_it_holds(change: dict[str, Any]) -> None:
    base = AuditConfig(k_pairs=4, m_canaries=10)
    assert base.replace(**change).fingerprint() != base.fingerprint()


def test_fingerprint_of_test_options_ignores_their_order() -> None:
    a = AuditConfig(test_options={"mmd": {"max_witness_points": 64, "burn_in": 3},
                                  "hockey_stick": {}})
    b = AuditConfig(test_options={"hockey_stick": {},
                                  "mmd": {"burn_in": 3, "max_witness_points": 64}})
    assert a.fingerprint() == b.fingerprint()


def test_to_dict_is_every_setting_but_the_seed() -> None:
    cfg = AuditConfig(k_pairs=4, m_canaries=10, seed=123, device=torch.device("cpu"),
                      per_step_null=(1.0, 0.0), monitors=("noise", "sampling"),
                      disable_monitors="sampling", monitor_options={"noise": {"alpha": 0.01}},
                      test_options={"mmd": {"max_witness_points": 64}})
    d = cfg.to_dict()
    assert set(d) == FIELDS - {"seed"} and "123" not in json.dumps(d)
    assert d["per_step_null"] == [1.0, 0.0] and d["tests"] == ["mmd", "hockey_stick"]
    assert d["monitors"] == ["noise", "sampling"] and d["disable_monitors"] == ["sampling"]
    assert d["device"] == "cpu" and d["compiled_kernels"] is None
    assert AuditConfig().to_dict()["monitors"] is None
    assert d["model_name"] is None and d["dataset_name"] is None
    named = AuditConfig(model_name="resnet18-v3", dataset_name="cifar10-train").to_dict()
    assert (named["model_name"], named["dataset_name"]) == ("resnet18-v3", "cifar10-train")
    assert json.loads(json.dumps(d)) == d
    for name in FIELDS - {"seed", "per_step_null", "tests", "monitors", "disable_monitors"}:
        assert d[name] == getattr(cfg, name), name
    # copies: changing the report's section does not change the configuration
    d["test_options"]["mmd"]["max_witness_points"] = 1
    d["monitor_options"]["noise"]["alpha"] = 0.5
    assert cfg.test_options["mmd"]["max_witness_points"] == 64
    assert cfg.monitor_options["noise"]["alpha"] == 0.01


def test_tester_options_are_the_defaults_then_the_users() -> None:
    assert AuditConfig().tester_options("mmd") == {"max_witness_points": 128}
    # the hook bets by ONS (docs/statistics.md, "In the training hook")
    assert AuditConfig().tester_options("hockey_stick") == {"bet": "ons", "eta": 2.0}
    cfg = AuditConfig(test_options={"mmd": {"max_witness_points": 64, "burn_in": 3},
                                    "hockey_stick": {"burn_in": 2, "bet": "mixture"}})
    assert cfg.tester_options("mmd") == {"max_witness_points": 64, "burn_in": 3}
    assert cfg.tester_options("hockey_stick") == {"bet": "mixture", "eta": 2.0, "burn_in": 2}
    got = AuditConfig().tester_options("mmd")
    got["max_witness_points"] = 1  # a fresh dict each time: the defaults are never changed
    assert DEFAULT_TEST_OPTIONS["mmd"] == {"max_witness_points": 128}
    assert AuditConfig().tester_options("mmd") == {"max_witness_points": 128}
