"""testing.reuse_runs: every reuse form of testing.bugs on the digits CNN is proven by the noise
monitor's reuse test within 10 steps of the first reuse (slow: about 10 s a form)."""

from __future__ import annotations

import pytest

from dpaudit_torch.testing.reuse_runs import FORMS, run_form


def test_the_forms_are_the_reuse_bugs():
    from dpaudit_torch.testing import bugs

    assert set(FORMS) <= set(bugs.names())


@pytest.mark.slow
@pytest.mark.parametrize("form", list(FORMS))
def test_every_reuse_form_is_proven_within_ten_steps_on_the_digits_cnn(form):
    r = run_form(form, seed=0, after=12)
    assert r["step"] is not None and r["step"] - r["first"] < 10, r
    assert r["reuse_found"] and r["first"] <= r["reuse_at"] < r["first"] + 10
