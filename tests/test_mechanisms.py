"""Reference mechanisms (docs/design.md section 7): laws, atoms, privacy metadata, validation.

Tolerances (all randomised checks use fixed seeds):
* Means: |mean_N - mu| <= 5 SE with SE = sd / sqrt(N) (two-sided normal tail at 5 SE: 5.7e-7).
* Variances: SE of the sample variance is sqrt((mu4 - sigma^4) / N): sigma^2 sqrt(2 / N) for a
  Gaussian (kurtosis 3), sigma^2 sqrt(5 / N) for a Laplace (kurtosis 6); tolerance 5 SE.
* Whole laws: the Dvoretzky-Kiefer-Wolfowitz inequality (Massart's constant) gives
  P(sup_t |F_N(t) - F(t)| > e) <= 2 exp(-2 N e^2) for ANY law (atoms included); with N = 40,000
  and e = sqrt(ln(2 / 1e-6) / (2 N)) = 0.0135 each check fails with probability <= 1e-6. F is
  computed independently of the sampler by numerical integration over the noisy count (midpoint
  rule on its quantile function with 2^15 nodes: error <= ~2 jumps x 2^-15 ~ 6e-5, negligible).
* Atom frequencies: Binomial(N, p), tolerance 5 SE = 5 sqrt(p (1 - p) / N).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special

from dpaudit_torch import mechanisms as mech
from dpaudit_torch.stats.thresholds import gaussian_delta

N_LAW = 40_000
DKW_EPS = math.sqrt(math.log(2.0 / 1e-6) / (2.0 * N_LAW))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- independent laws
def _laplace_cdf(z: np.ndarray) -> np.ndarray:
    """CDF of the standard Laplace law Lap(0, 1)."""
    return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0)))


def _laplace_quantile(u: np.ndarray, scale: float) -> np.ndarray:
    return -scale * np.sign(u - 0.5) * np.log1p(-2.0 * np.abs(u - 0.5))


_SPEC = {  # name -> (noise, noisy count for mean, noisy count for scale); written from the docs
    "DPGaussian": ("gaussian", True, True),
    "NonDPGaussian1": ("gaussian", False, False),
    "NonDPGaussian2": ("gaussian", False, True),
    "DPLaplace": ("laplace", True, True),
    "NonDPLaplace1": ("laplace", False, False),
    "NonDPLaplace2": ("laplace", False, True),
}


def _table1_cdf(name: str, variant: str, eps: float, delta: float, n: int, total: float,
                t: np.ndarray) -> np.ndarray:
    """P[A(D) <= t] for data D with n records summing to ``total`` (docs/design.md section 7)."""
    noise, for_mean, for_scale = _SPEC[name]
    nf = 1.0 if noise == "laplace" else math.sqrt(2.0 * math.log(1.25 / delta))
    b = 0.5 if (for_mean or for_scale) else 1.0
    if for_mean or for_scale:
        m = 2**15
        u = (np.arange(m) + 0.5) / m
        noisy = n + _laplace_quantile(u, 1.0 / (b * eps))
        if variant == "clipped":
            noisy = np.maximum(noisy, 1e-12)
    else:
        noisy = np.array([float(n)])
    cm = noisy if for_mean else np.full_like(noisy, n)
    cs = noisy if for_scale else np.full_like(noisy, n)
    scale = np.maximum(nf / b / eps / cs, 1e-12)
    z = (t[:, None] - total / cm[None, :]) / scale[None, :]
    g = special.ndtr(z) if noise == "gaussian" else _laplace_cdf(z)
    return g.mean(axis=1)


def _ecdf(sample: torch.Tensor, t: np.ndarray) -> np.ndarray:
    s = np.sort(sample.numpy())
    return np.searchsorted(s, t, side="right") / s.size


_T_GRID = np.unique(np.concatenate([
    -np.logspace(-4, 6, 31), [0.0], np.logspace(-4, 6, 31), 0.5 + np.linspace(-0.1, 0.1, 9),
]))


@pytest.mark.parametrize("variant", mech.VARIANTS)
@pytest.mark.parametrize("name", mech.TABLE1_NAMES)
@pytest.mark.parametrize("eps", [0.01, 0.1])
def test_table1_laws_match_definition(name: str, variant: str, eps: float) -> None:
    """DKW check of both output laws (S = (0) and S' = (0, 1)) against the integrated CDF."""
    m = mech.get(name, epsilon=eps, variant=variant)
    seed = 1000 * mech.TABLE1_NAMES.index(name) + 10 * mech.VARIANTS.index(variant) + int(eps * 100)
    x, y = m.sample(N_LAW, generator=_gen(seed))
    assert x.shape == y.shape == (N_LAW,) and x.dtype == torch.float64
    for sample, n, total in ((x, 1, 0.0), (y, 2, 1.0)):
        f = _table1_cdf(name, variant, eps, m.delta, n, total, _T_GRID)
        gap = np.max(np.abs(_ecdf(sample, _T_GRID) - f))
        assert gap <= DKW_EPS, (name, variant, eps, n, gap, DKW_EPS)


@pytest.mark.parametrize("name", ["DPGaussian", "NonDPGaussian2", "DPLaplace", "NonDPLaplace2"])
@pytest.mark.parametrize("eps", [0.01, 0.1])
def test_dp_auditorium_atom_frequency(name: str, eps: float) -> None:
    """n~ = n + Lap(2 / eps) < 0 w.p. (1/2) exp(-eps n / 2): then the output is noiseless.

    Under S (n = 1) that is an atom at 0 (both rows); under S' (n = 2) the noiseless value is
    1/2 for the NonDP2 rows (an atom) and 1 / n~ < 0 for the DP rows (no atom).
    """
    n = 100_000
    m = mech.get(name, epsilon=eps, variant="dp_auditorium")
    x, y = m.sample(n, generator=_gen(7))
    p_x = 0.5 * math.exp(-eps * 1 / 2)
    freq_x = float((x.abs() < 1e-9).double().mean())
    assert abs(freq_x - p_x) <= 5 * math.sqrt(p_x * (1 - p_x) / n), (freq_x, p_x)
    if name.startswith("NonDP"):
        p_y = 0.5 * math.exp(-eps * 2 / 2)
        freq_y = float(((y - 0.5).abs() < 1e-9).double().mean())
        assert abs(freq_y - p_y) <= 5 * math.sqrt(p_y * (1 - p_y) / n), (freq_y, p_y)
        # the noiseless values are exact to the 1e-12 scale floor
        atoms = y[(y - 0.5).abs() < 1e-9]
        assert float((atoms - 0.5).abs().max()) < 1e-10
    else:
        # S' is never noiselessly at 0: noiseless S' outputs are 1 / n~ < 0, far from 0
        neg = y[y < 0]
        assert float((y.abs() < 1e-9).double().sum()) == 0
        assert neg.numel() > 0
    # S never yields the S'-atom and vice versa: this is the leak (delta ~ 1/2)
    assert float((y.abs() < 1e-9).double().sum()) == 0


@pytest.mark.parametrize("name", ["DPGaussian", "NonDPGaussian2", "DPLaplace", "NonDPLaplace2"])
def test_clipped_variant_never_noiseless(name: str) -> None:
    """Clipping n~ at 1e-12 makes the noise scale huge instead of zero: no atom anywhere.

    The noise scale is nf / (b eps n~) >= 1e-3 for every n~ this sample can produce, so a
    |x| < 1e-9 hit has probability < 1e-6 per draw; the noiseless atom would give ~40% hits.
    """
    n = 100_000
    m = mech.get(name, epsilon=0.01, variant="clipped")
    x, y = m.sample(n, generator=_gen(8))
    assert int((x.abs() < 1e-9).sum()) == 0
    assert int(((y - 0.5).abs() < 1e-9).sum()) == 0
    assert int((y.abs() < 1e-9).sum()) == 0


def test_nondp1_moments() -> None:
    """NonDP*1: x ~ noise(nf / eps), y ~ 1/2 + noise(nf / (2 eps)) (true counts 1 and 2)."""
    n = 200_000
    for name, kurt_term in (("NonDPGaussian1", 2.0), ("NonDPLaplace1", 5.0)):
        for variant in mech.VARIANTS:
            m = mech.get(name, epsilon=0.1, variant=variant)
            x, y = m.sample(n, generator=_gen(11))
            for sample, mu, scale in ((x, 0.0, m.noise_factor / 0.1),
                                      (y, 0.5, m.noise_factor / 0.2)):
                var = scale**2 if name.endswith("Gaussian1") else 2 * scale**2
                sd = math.sqrt(var)
                assert abs(float(sample.mean()) - mu) <= 5 * sd / math.sqrt(n)
                assert abs(float(sample.var()) - var) <= 5 * var * math.sqrt(kurt_term / n)


def test_exact_gaussian_and_laplace() -> None:
    n = 200_000
    g = mech.get("Gaussian", epsilon=1.0, sigma=2.0)
    x, y = g.sample(n, generator=_gen(3))
    for s, mu in ((x, 0.0), (y, 1.0)):
        assert abs(float(s.mean()) - mu) <= 5 * 2.0 / math.sqrt(n)
        assert abs(float(s.var()) - 4.0) <= 5 * 4.0 * math.sqrt(2.0 / n)
    lap = mech.get("Laplace", epsilon=0.5)
    assert lap.scale == pytest.approx(2.0)
    x, y = lap.sample(n, generator=_gen(4))
    for s, mu in ((x, 0.0), (y, 1.0)):
        var = 2 * 2.0**2
        assert abs(float(s.mean()) - mu) <= 5 * math.sqrt(var / n)
        assert abs(float(s.var()) - var) <= 5 * var * math.sqrt(5.0 / n)
        gap = np.max(np.abs(_ecdf(s, _T_GRID) - _laplace_cdf((_T_GRID - mu) / 2.0)))
        assert gap <= math.sqrt(math.log(2.0 / 1e-6) / (2.0 * n))


def test_privacy_metadata() -> None:
    for variant in mech.VARIANTS:
        for name in mech.TABLE1_NAMES:
            m = mech.get(name, epsilon=0.1, variant=variant)
            assert m.name == name and m.variant == variant
            assert m.epsilon == 0.1
            assert m.delta == (1e-5 if "Gaussian" in name else 0.0)
            truly = variant == "clipped" and name.startswith("DP")
            assert m.is_dp is truly, m
            if truly:
                assert m.true_epsilon == 0.1 and m.true_delta is not None
                assert m.true_delta <= m.delta
            else:
                assert m.true_epsilon is None and m.true_delta is None
            assert name in m.description
    # the clipped DPGaussian's exact composition delta: mean part mu = eps / (2 nf)
    m = mech.get("DPGaussian", epsilon=0.1, variant="clipped")
    nf = math.sqrt(2 * math.log(1.25e5))
    assert m.true_delta == pytest.approx(float(gaussian_delta(0.05, 0.05 / nf)), rel=1e-12)
    g = mech.get("Gaussian", epsilon=1.0, sigma=1.0)
    assert g.is_dp and g.true_delta == pytest.approx(float(gaussian_delta(1.0, 1.0)))
    assert g.delta == g.true_delta and g.variant == "exact"
    assert not mech.get("Gaussian", epsilon=1.0, delta=0.01, sigma=1.0).is_dp
    g2 = mech.get("Gaussian", delta=1e-5, sigma=1.0)
    assert g2.is_dp and float(gaussian_delta(g2.epsilon, 1.0)) == pytest.approx(1e-5, rel=1e-6)
    lap = mech.get("Laplace", epsilon=0.5)
    assert lap.is_dp and lap.true_delta == 0.0
    # Laplace with eps0 = 1 claimed at eps = 0.5: exact profile delta = 1 - exp(-1/4)
    weak = mech.get("Laplace", epsilon=0.5, scale=1.0, delta=0.1)
    assert not weak.is_dp and weak.true_delta == pytest.approx(1 - math.exp(-0.25))
    assert mech.get("Laplace", epsilon=0.5, scale=1.0, delta=0.23).is_dp
    assert mech.names()[:6] == list(mech.TABLE1_NAMES) and "Gaussian" in mech.names()


def test_reproducible_dtype_device() -> None:
    m = mech.get("DPLaplace", epsilon=0.1, variant="clipped")
    a = m.sample(50, generator=_gen(5))
    b = m.sample(50, generator=_gen(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = m.sample(50, generator=_gen(6))
    assert not torch.equal(a[0], c[0])
    x32, y32 = m.sample(50, generator=_gen(5), dtype=torch.float32, device="cpu")
    assert x32.dtype == torch.float32 and torch.allclose(x32.double(), a[0].float().double())
    # x and y are independent draws, not coupled
    x, y = mech.get("Gaussian", epsilon=1.0).sample(20_000, generator=_gen(9))
    corr = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
    assert abs(corr) <= 5 / math.sqrt(20_000)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "DPGauss", "epsilon": 0.1}, "DPGauss"),
        ({"name": "DPGaussian", "epsilon": 0.1, "variant": "foo"}, "foo"),
        ({"name": "DPGaussian", "epsilon": 0.0}, "0.0"),
        ({"name": "DPGaussian", "epsilon": -1.0}, "-1.0"),
        ({"name": "DPGaussian", "epsilon": float("nan")}, "nan"),
        ({"name": "DPGaussian", "epsilon": float("inf")}, "inf"),
        ({"name": "DPGaussian", "epsilon": None}, "None"),
        ({"name": "DPGaussian", "epsilon": 0.1, "delta": 1.0}, "1.0"),
        ({"name": "DPGaussian", "epsilon": 0.1, "delta": -0.1}, "-0.1"),
        ({"name": "DPGaussian", "epsilon": 0.1, "delta": 0.0}, "0.0"),
        ({"name": "DPLaplace", "epsilon": 0.1, "delta": 1.5}, "1.5"),
        ({"name": "Gaussian", "epsilon": 1.0, "sigma": -2.0}, "-2.0"),
        ({"name": "Gaussian"}, "None"),
        ({"name": "Laplace", "epsilon": 1.0, "scale": 0.0}, "0.0"),
        ({"name": "Laplace", "epsilon": 1.0, "sigma": 1.0}, "sigma"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match.replace(".", r"\.")):
        mech.get(**kwargs)


def test_bad_sample_arguments() -> None:
    m = mech.get("NonDPLaplace1", epsilon=0.1)
    with pytest.raises(ValueError, match="0"):
        m.sample(0)
    with pytest.raises(TypeError, match="2.5"):
        m.sample(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int64"):
        m.sample(3, dtype=torch.int64)
    with pytest.raises(TypeError, match="generator"):
        m.sample(3, generator=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mech.get(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "kwargs", "dtype"),
    [
        ("DPGaussian", {"epsilon": 1e-300, "variant": "clipped"}, torch.float64),
        ("Gaussian", {"epsilon": 1.0, "sigma": 1e300}, torch.float32),
    ],
)
def test_overflowing_parameters_raise_instead_of_returning_inf(
    name: str, kwargs: dict, dtype: torch.dtype
) -> None:
    m = mech.get(name, **kwargs)
    with pytest.raises(ValueError, match="non-finite"):
        m.sample(3, generator=torch.Generator().manual_seed(0), dtype=dtype)
