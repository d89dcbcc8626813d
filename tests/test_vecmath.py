"""The in-place exp / log1p of dpaudit_torch._vecmath: the same numbers as NumPy's, to the last
few bits, whichever library evaluates them."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit_torch import _vecmath


@pytest.mark.parametrize("torch_path", [False, True])
@pytest.mark.parametrize("n", [10, 1 << 15])
def test_same_values_as_numpy(monkeypatch, torch_path, n):
    monkeypatch.setattr(_vecmath, "uses_torch", torch_path)
    rng = np.random.default_rng(0)
    x = rng.normal(scale=20.0, size=(n // 2, 2))
    for fn, ref, arg in ((_vecmath.exp_, np.exp, x), (_vecmath.log1p_, np.log1p, np.abs(x))):
        a = arg.copy()
        out = fn(a)
        assert out is a  # in place
        np.testing.assert_allclose(a, ref(arg), rtol=4e-16 * 8, atol=0)
    # non-contiguous, read-only and float32 arrays take NumPy's own loops
    v = x.copy()[:, 0]  # a strided view
    expected = np.exp(v)
    _vecmath.exp_(v)
    assert np.array_equal(v, expected)  # NumPy's own result, bit for bit
    ro = np.abs(x).copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        _vecmath.log1p_(ro)  # NumPy refuses to write into it, as it should


def test_special_values(monkeypatch):
    monkeypatch.setattr(_vecmath, "uses_torch", True)
    a = np.full(1 << 15, -np.inf)
    a[:4] = [0.0, np.inf, np.nan, 800.0]
    _vecmath.exp_(a)
    assert a[0] == 1.0 and a[1] == np.inf and np.isnan(a[2]) and a[3] == np.inf
    assert np.all(a[4:] == 0.0)
