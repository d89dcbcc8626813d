"""Readable labels of the Training and Interference keys (dpaudit_torch/report/labels.py)."""

from __future__ import annotations

import re

from dpaudit_torch.report.labels import INTERFERENCE_LABELS, TRAINING_LABELS, labelled


def test_a_known_key_is_headed_by_its_label_and_an_unknown_one_by_itself() -> None:
    page = labelled({"std_from_observation_minus_noise": 0.0, "new_key": "x"},
                    INTERFERENCE_LABELS)
    known = re.search(r'<tr data-key="std_from_observation_minus_noise"><th>(.*?)</th>', page)
    assert known is not None
    assert known.group(1).startswith("Part of it not explained by the noise")
    assert "<small><code>std_from_observation_minus_noise</code></small>" in known.group(1)
    assert '<tr data-key="new_key"><th>new_key</th>' in page


def test_labels_are_words_not_keys() -> None:
    for labels in (TRAINING_LABELS, INTERFERENCE_LABELS):
        for key, label in labels.items():
            assert "_" not in label and label != key, key
