"""Tests of dpaudit_torch/report/markup.py: the HTML building blocks (escaping, tagged numbers,
generic tables, JSON for attributes and data blocks, names of methods and testers)."""

from __future__ import annotations

import json
import math

from dpaudit_torch.report import markup
from dpaudit_torch.report.markup import (
    esc,
    generic,
    json_attr,
    json_for_script,
    kv_section,
    method_label,
    num,
    scalar,
)


def test_esc() -> None:
    assert esc('<a href="x">&\'</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;&lt;/a&gt;"
    assert esc(3) == "3" and esc(None) == "None"


def test_json_attr_and_json_for_script() -> None:
    assert json_attr({"a": math.inf}) == "{&quot;a&quot;: &quot;Infinity&quot;}"
    block = json_for_script({"s": "</script><b>&", "x": math.nan})
    assert "<" not in block and ">" not in block and "&" not in block
    assert json.loads(block) == {"s": "</script><b>&", "x": "NaN"}  # the same JSON


def test_num_tags_report_fields() -> None:
    assert num(0.98765) == "0.9877" and num(None) == "n/a"
    assert num(math.inf, "claimed_epsilon") == (
        '<span class="num" data-field="claimed_epsilon" data-value="&quot;Infinity&quot;">'
        "∞</span>")
    assert num(1e-5, "delta") == ('<span class="num" data-field="delta" data-value="1e-05">'
                                  "1e-05</span>")


def test_scalar() -> None:
    assert scalar(True) == "yes" and scalar(None) == "n/a" and scalar(2) == "2"
    assert scalar("<b>") == "&lt;b&gt;"


def test_generic_tables_and_lists() -> None:
    assert generic({}) == "<em>empty</em>" and generic([]) == "<em>none</em>"
    assert generic({"a": 1, "<k>": "v"}) == (
        '<table class="kv"><tr><th>a</th><td>1</td></tr>'
        "<tr><th>&lt;k&gt;</th><td>v</td></tr></table>")
    assert generic([1, 2.5]) == "1, 2.5"
    assert generic(list(range(20)) + [math.inf]) == "21 values, from 0 to 19"
    assert generic([math.nan] * 13) == "13 values, none finite"
    records = generic([{"a": 1}, {"b": 2}])
    assert records == ('<table class="records"><tr><th>a</th><th>b</th></tr>'
                       "<tr><td>1</td><td></td></tr><tr><td></td><td>2</td></tr></table>")
    assert generic(["x", None]) == "x<br>n/a"
    assert generic([[1], [2]]) == "<div>1</div><div>2</div>"
    assert generic([[i] for i in range(13)]) == "13 entries"
    deep = generic({"a": {"b": {"c": {"d": math.inf}}}})
    assert "<code>{&quot;d&quot;: &quot;Infinity&quot;}</code>" in deep


def test_kv_section() -> None:
    assert kv_section("Training", "training", {}, "Nothing <here>.") == (
        '<section id="training"><h2>Training</h2><p><em>Nothing &lt;here&gt;.</em></p>'
        "</section>")
    assert '<table class="kv">' in kv_section("T", "t", {"a": 1}, "none")


def test_labels_come_from_the_registry() -> None:
    assert method_label("steinke") == "Steinke et al. one-run (2023)"
    assert method_label("newer") == "newer"
    # (imported through the module: pytest would collect a name starting with "test")
    assert markup.tester_label("hockey_stick") == "hockey-stick"
    assert markup.tester_label("newer") == "newer"
