"""Reference mechanisms with a known privacy status, for auditing benchmarks and tests.

Two families (docs/design.md section 7):

* The six mean mechanisms of Table 1 of Gonzalez, Dulce-Rubio, Ramdas & Ribero, "Sequentially
  auditing differential privacy" (NeurIPS 2025, arXiv 2509.07055), which come from DP-Auditorium
  (Kong, Munoz Medina, Ribero, Syed: "DP-Auditorium: a large scale library for auditing
  differential privacy", IEEE S&P 2024; google/differential-privacy, ``dp_auditorium/mechanisms/
  mean.py``).  Data lie in [0, 1]; the neighbouring datasets are S = (0) and S' = (0, 1) (one
  record added).  With budget scale b = 1/2 when a noisy count is used anywhere (else 1) and the
  noisy count n~ = n + Lap(1 / (b eps)), the output is

      sum(S) / count_for_mean + noise(scale),  scale = nf / (b eps count_for_scale),

  nf = 1 with Laplace noise (delta = 0 in DP-Auditorium), nf = sqrt(2 ln(1.25 / delta)) with
  Gaussian noise (classical Gaussian mechanism, Dwork & Roth 2014, Thm A.1).

  ============================  ==============  ===============
  name                          count_for_mean  count_for_scale
  ============================  ==============  ===============
  DPGaussian / DPLaplace        n~              n~
  NonDPGaussian1 / ...Laplace1  n               n
  NonDPGaussian2 / ...Laplace2  n               n~
  ============================  ==============  ===============

  Each comes in two variants:

  - ``"dp_auditorium"`` -- exactly what DP-Auditorium (and hence the paper's experiments) runs:
    n~ is not clipped and the scale is floored at 1e-12.  When n~ < 0 (probability
    (1/2) exp(-b eps n), about one half at small eps) the noise is negligible and the output is
    the noiseless value sum / count_for_mean.  Under S this is an atom at 0 that S' (whose
    noiseless value is 1 / n~ < 0, or 1/2) never produces, so even the "DP" rows are **not**
    differentially private (delta ~ 0.5).  ``is_dp`` is False for every mechanism of this variant.
  - ``"clipped"`` -- the paper's printed definition: n~ = max(1e-12, n + Lap(1 / (b eps))).
    The DP rows are then truly DP by basic composition: an (eps/2)-DP count (its clipping is
    post-processing) and a mean whose noise is calibrated to the sensitivity 1 / c of sum / c
    given the count c.  With Laplace noise the mean is (eps/2)-DP: eps-DP in all.  With Gaussian
    noise the mean is mu-GDP with mu = eps / (2 nf) whatever c is, hence
    (eps/2, delta_mu(eps/2))-DP, and the mechanism is (eps, delta_mu(eps/2))-DP; this delta is
    below the claimed one whenever the classical calibration applies (eps/2 < 1), which
    ``true_delta`` and ``is_dp`` check exactly.  The NonDP rows are not DP in either variant.

* Exact mechanisms on a pair of neighbouring scalars (0 and 1, sensitivity 1):

  - ``"Gaussian"``: x ~ N(0, sigma^2), y ~ N(1, sigma^2).  It is mu-GDP with mu = 1 / sigma and
    satisfies (eps, delta_sigma(eps)) for every eps (Balle & Wang, ICML 2018), with
    delta_sigma(eps) = Phi(-eps sigma + 1/(2 sigma)) - e^eps Phi(-eps sigma - 1/(2 sigma)).
  - ``"Laplace"``: x ~ Lap(0, scale), y ~ Lap(1, scale), scale = 1 / eps by default: eps-DP.

Usage::

    m = mechanisms.get("NonDPGaussian1", epsilon=0.01, delta=1e-5, variant="dp_auditorium")
    x, y = m.sample(1000, generator=torch.Generator().manual_seed(0))   # x ~ A(S), y ~ A(S')
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from ._validation import check_delta, check_epsilon, check_positive_int
from .stats.thresholds import gaussian_delta, gaussian_epsilon

logger = logging.getLogger(__name__)

__all__ = [
    "Mechanism",
    "MeanMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "TABLE1_NAMES",
    "VARIANTS",
    "ZERO_TOLERANCE",
    "get",
    "names",
]

#: DP-Auditorium's floor on the noise scale (``_ZERO_TOLERANCE`` in mechanisms/mean.py); the
#: ``clipped`` variant also uses it as the lower clip of the noisy count.
ZERO_TOLERANCE: float = 1e-12

#: the two variants of the Table-1 mechanisms
VARIANTS: tuple[str, ...] = ("dp_auditorium", "clipped")

#: default delta of the Gaussian-noise Table-1 mechanisms (the paper's setting)
DEFAULT_GAUSSIAN_DELTA: float = 1e-5

# name -> (noise, noisy count used for the mean, noisy count used for the scale)
_TABLE1: dict[str, tuple[str, bool, bool]] = {
    "DPGaussian": ("gaussian", True, True),
    "NonDPGaussian1": ("gaussian", False, False),
    "NonDPGaussian2": ("gaussian", False, True),
    "DPLaplace": ("laplace", True, True),
    "NonDPLaplace1": ("laplace", False, False),
    "NonDPLaplace2": ("laplace", False, True),
}

#: the six mechanisms of the paper's Table 1, in the paper's row order
TABLE1_NAMES: tuple[str, ...] = tuple(_TABLE1)

_EXACT_NAMES: tuple[str, ...] = ("Gaussian", "Laplace")


def names() -> list[str]:
    """Names accepted by :func:`get`: the six Table-1 mechanisms, then the exact ones."""
    return list(TABLE1_NAMES) + list(_EXACT_NAMES)


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float64, torch.float32):
        raise TypeError(f"dtype must be torch.float64 or torch.float32, got {dtype!r}")
    return dtype


def _laplace(n: int, scale: float | torch.Tensor, generator: torch.Generator | None,
             device: torch.device) -> torch.Tensor:
    """Lap(0, scale) draws in float64: scale * (E1 - E2) with E1, E2 ~ Exp(1) independent."""
    e = torch.empty(2, n, dtype=torch.float64, device=device).exponential_(generator=generator)
    return (e[0] - e[1]) * scale


def _normal(n: int, scale: float | torch.Tensor, generator: torch.Generator | None,
            device: torch.device) -> torch.Tensor:
    return torch.randn(n, dtype=torch.float64, device=device, generator=generator) * scale


@dataclass(frozen=True)
class Mechanism:
    """A randomised mechanism A evaluated on two neighbouring datasets S and S'.

    Attributes:
        name: registry name (see :func:`names`).
        variant: ``"dp_auditorium"`` or ``"clipped"`` for the Table-1 mechanisms, ``"exact"``
            for the exact Gaussian and Laplace mechanisms.
        epsilon, delta: the *claimed* guarantee, i.e. the null (eps, delta) an audit tests.
        is_dp: whether the mechanism truly satisfies the claimed (epsilon, delta).
        true_epsilon, true_delta: a guarantee (true_epsilon = epsilon, true_delta) it provably
            satisfies: the exact profile point delta(epsilon) for the exact Gaussian and Laplace
            mechanisms, the composition bound for the clipped DP rows; None for mechanisms that
            are not DP (no guarantee is stated). ``is_dp`` is ``true_delta <= delta``.
        description: one line for tables and reports.
    """

    name: str
    variant: str
    epsilon: float
    delta: float
    is_dp: bool
    true_epsilon: float | None
    true_delta: float | None
    description: str = field(default="", compare=False)

    def _sample_pair(self, n: int, generator: torch.Generator | None,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw n independent pairs: x[i] ~ A(S), y[i] ~ A(S'), tensors of shape [n].

        The draws are made in float64 on the generator's device (CPU without a generator) and
        then cast to ``dtype`` and moved to ``device``; a given generator state therefore
        yields the same numbers wherever the result is sent.
        """
        n = check_positive_int(n, "n")
        dtype = _check_dtype(dtype)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {generator!r}")
        gen_dev = generator.device if generator is not None else torch.device("cpu")
        x, y = self._sample_pair(n, generator, gen_dev)
        out_dev = torch.device(device) if device is not None else gen_dev
        x, y = x.to(device=out_dev, dtype=dtype), y.to(device=out_dev, dtype=dtype)
        if not bool(torch.isfinite(x).all() & torch.isfinite(y).all()):
            raise ValueError(
                f"{self.name}: parameters {self!r} produce non-finite outputs in {dtype} (the "
                "noise scale overflows); use a larger epsilon / smaller noise or float64"
            )
        return x, y

    def __str__(self) -> str:
        return self.description or self.name


@dataclass(frozen=True)
class MeanMechanism(Mechanism):
    """One of the six Table-1 mean mechanisms (see the module docstring)."""

    noise: str = "gaussian"
    noisy_count_for_mean: bool = False
    noisy_count_for_scale: bool = False

    @property
    def budget_scale(self) -> float:
        """b = 1/2 if a noisy count is used anywhere, else 1."""
        return 0.5 if (self.noisy_count_for_mean or self.noisy_count_for_scale) else 1.0

    @property
    def noise_factor(self) -> float:
        """nf = 1 (Laplace) or sqrt(2 ln(1.25 / delta)) (Gaussian)."""
        return 1.0 if self.noise == "laplace" else _noise_factor(self.delta)

    def _output(self, data: tuple[float, ...], n: int, generator: torch.Generator | None,
                device: torch.device) -> torch.Tensor:
        count = float(len(data))
        total = float(sum(data))
        b = self.budget_scale
        eps = self.epsilon
        noisy = None
        if self.noisy_count_for_mean or self.noisy_count_for_scale:
            noisy = count + _laplace(n, 1.0 / (b * eps), generator, device)
            if self.variant == "clipped":
                noisy = noisy.clamp_min(ZERO_TOLERANCE)
        c_mean = noisy if self.noisy_count_for_mean else count
        c_scale = noisy if self.noisy_count_for_scale else count
        # data range |max - min| = 1
        scale = self.noise_factor / b / eps / c_scale
        if isinstance(scale, torch.Tensor):
            scale = scale.clamp_min(ZERO_TOLERANCE)
        else:
            scale = max(ZERO_TOLERANCE, scale)
        draw = _laplace if self.noise == "laplace" else _normal
        return total / c_mean + draw(n, scale, generator, device)

    def _sample_pair(self, n: int, generator: torch.Generator | None,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._output((0.0,), n, generator, device)
        y = self._output((0.0, 1.0), n, generator, device)
        if not isinstance(x, torch.Tensor):  # pragma: no cover - scalars only if n == 0
            raise RuntimeError("internal error: expected tensors")
        return x, y


@dataclass(frozen=True)
class GaussianMechanism(Mechanism):
    """x ~ N(0, sigma^2), y ~ N(1, sigma^2): mu-GDP, mu = 1 / sigma (Dong, Roth & Su 2019)."""

    sigma: float = 1.0

    def _sample_pair(self, n: int, generator: torch.Generator | None,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x = _normal(n, self.sigma, generator, device)
        y = 1.0 + _normal(n, self.sigma, generator, device)
        return x, y


@dataclass(frozen=True)
class LaplaceMechanism(Mechanism):
    """x ~ Lap(0, scale), y ~ Lap(1, scale): (1 / scale)-DP (Dwork, McSherry, Nissim & Smith)."""

    scale: float = 1.0

    def _sample_pair(self, n: int, generator: torch.Generator | None,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x = _laplace(n, self.scale, generator, device)
        y = 1.0 + _laplace(n, self.scale, generator, device)
        return x, y


def _noise_factor(delta: float) -> float:
    """Classical Gaussian-mechanism factor sqrt(2 ln(1.25 / delta)) (Dwork & Roth, Thm A.1)."""
    return math.sqrt(2.0 * math.log(1.25 / delta))


def _laplace_delta(epsilon: float, eps0: float) -> float:
    """Exact privacy profile of the Laplace mechanism with eps0 = sensitivity / scale:
    delta(eps) = 1 - exp((eps - eps0) / 2) for eps < eps0, else 0."""
    return -math.expm1((epsilon - eps0) / 2.0) if epsilon < eps0 else 0.0


def _check_positive_finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not (v > 0.0) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def get(
    name: str,
    epsilon: float | None = None,
    delta: float | None = None,
    variant: str = "dp_auditorium",
    *,
    sigma: float | None = None,
    scale: float | None = None,
) -> Mechanism:
    """Build a reference mechanism by name.

    Args:
        name: one of :func:`names`.
        epsilon: the claimed epsilon (the null an audit tests). Required for the Table-1
            mechanisms and for ``"Laplace"`` unless ``scale`` is given; for ``"Gaussian"``,
            if omitted it is the epsilon at which the mechanism's profile reaches ``delta``.
        delta: the claimed delta. Table-1 Gaussian-noise mechanisms: default 1e-5, must be in
            (0, 1) (it calibrates the noise); Laplace-noise ones: default 0 (the noise does not
            depend on it). ``"Gaussian"``: default delta_sigma(epsilon), the point of its own
            privacy profile; a smaller delta makes a claim the mechanism does not satisfy
            (``is_dp`` False), which is how power is measured. ``"Laplace"``: default 0.
        variant: ``"dp_auditorium"`` (default) or ``"clipped"`` for the Table-1 mechanisms
            (ignored by the exact ones, whose variant is reported as ``"exact"``).
        sigma: noise standard deviation of ``"Gaussian"`` (sensitivity 1); default 1.
        scale: Laplace scale of ``"Laplace"``; default 1 / epsilon.

    Raises:
        ValueError: unknown name or variant, eps <= 0, delta outside its range; the message
            names the bad value.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if name not in _TABLE1 and name not in _EXACT_NAMES:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {names()}")
    if name in _TABLE1:
        return _get_table1(name, epsilon, delta, variant)
    if sigma is not None and name != "Gaussian":
        raise ValueError(f"sigma={sigma!r} only applies to the 'Gaussian' mechanism")
    if scale is not None and name != "Laplace":
        raise ValueError(f"scale={scale!r} only applies to the 'Laplace' mechanism")
    if name == "Gaussian":
        return _get_gaussian(epsilon, delta, sigma)
    return _get_laplace(epsilon, delta, scale)


def _get_table1(name: str, epsilon: float | None, delta: float | None,
                variant: str) -> MeanMechanism:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    if epsilon is None:
        raise ValueError(f"{name} needs epsilon (got epsilon=None)")
    eps = check_epsilon(epsilon)
    noise, for_mean, for_scale = _TABLE1[name]
    if noise == "gaussian":
        d = check_delta(DEFAULT_GAUSSIAN_DELTA if delta is None else delta)
        if d == 0.0:
            raise ValueError(
                f"{name} calibrates Gaussian noise with sqrt(2 ln(1.25 / delta)): delta must be "
                f"> 0, got delta={delta!r}"
            )
    else:
        d = check_delta(0.0 if delta is None else delta)
    dp_rows = name.startswith("DP")
    true_d: float | None = None
    if dp_rows and variant == "clipped":
        if noise == "laplace":
            true_d = 0.0
        else:
            # given the count c > 0, the mean is a Gaussian mechanism with sensitivity 1/c and
            # noise 2 nf / (eps c): mu-GDP with mu = eps / (2 nf) whatever c is, hence
            # (eps/2, delta_mu(eps/2))-DP; composed with the (eps/2)-DP count: (eps, that).
            true_d = float(gaussian_delta(eps / 2.0, eps / (2.0 * _noise_factor(d))))
    is_dp = true_d is not None and true_d <= d
    if dp_rows and variant == "dp_auditorium":
        why = "NOT DP: n~ < 0 leaves the output noiseless (atom), delta ~ 1/2"
    elif dp_rows:
        why = "DP" if is_dp else f"DP only at delta={true_d:.3g} > the claimed delta"
    else:
        why = "NOT DP"
    desc = f"{name} ({variant}, eps={eps:g}, delta={d:g}; {why})"
    return MeanMechanism(
        name=name,
        variant=variant,
        epsilon=eps,
        delta=d,
        is_dp=is_dp,
        true_epsilon=eps if true_d is not None else None,
        true_delta=true_d,
        description=desc,
        noise=noise,
        noisy_count_for_mean=for_mean,
        noisy_count_for_scale=for_scale,
    )


def _get_gaussian(epsilon: float | None, delta: float | None,
                  sigma: float | None) -> GaussianMechanism:
    s = 1.0 if sigma is None else _check_positive_finite(sigma, "sigma")
    mu = 1.0 / s
    if epsilon is None:
        if delta is None:
            raise ValueError("Gaussian needs epsilon or delta (got both None)")
        d = check_delta(delta)
        eps = gaussian_epsilon(d, mu)
        if not (eps > 0.0) or not math.isfinite(eps):
            raise ValueError(
                f"the Gaussian mechanism with sigma={s!r} has no finite epsilon > 0 at "
                f"delta={delta!r} (got {eps!r}); give epsilon instead"
            )
        true_d = float(gaussian_delta(eps, mu))
        is_dp = True
    else:
        eps = check_epsilon(epsilon)
        true_d = float(gaussian_delta(eps, mu))
        d = true_d if delta is None else check_delta(delta)
        # tolerance: delta_sigma is computed to ~1e-16 absolute precision
        is_dp = d >= true_d - 1e-15
    desc = (f"Gaussian (sigma={s:g}, sensitivity 1; claim eps={eps:g}, delta={d:.4g}; "
            f"profile delta_sigma(eps)={true_d:.4g}; {'DP' if is_dp else 'NOT DP'})")
    return GaussianMechanism(
        name="Gaussian",
        variant="exact",
        epsilon=eps,
        delta=d,
        is_dp=is_dp,
        true_epsilon=eps,
        true_delta=true_d,
        description=desc,
        sigma=s,
    )


def _get_laplace(epsilon: float | None, delta: float | None,
                 scale: float | None) -> LaplaceMechanism:
    if epsilon is None and scale is None:
        raise ValueError("Laplace needs epsilon or scale (got both None)")
    eps = None if epsilon is None else check_epsilon(epsilon)
    b = 1.0 / eps if scale is None else _check_positive_finite(scale, "scale")  # type: ignore
    if eps is None:
        eps = 1.0 / b
    d = check_delta(0.0 if delta is None else delta)
    true_eps = 1.0 / b
    # exact profile: the claim (eps, d) holds iff d >= delta_L(eps)
    true_d = _laplace_delta(eps, true_eps)
    is_dp = d >= true_d - 1e-15
    desc = (f"Laplace (scale={b:g}, sensitivity 1, truly {true_eps:g}-DP; claim eps={eps:g}, "
            f"delta={d:g}; {'DP' if is_dp else 'NOT DP'})")
    return LaplaceMechanism(
        name="Laplace",
        variant="exact",
        epsilon=eps,
        delta=d,
        is_dp=is_dp,
        true_epsilon=eps,
        true_delta=true_d,
        description=desc,
        scale=b,
    )
