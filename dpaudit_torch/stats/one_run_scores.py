"""Scores of the one-run canaries: how a canary's per-step observations become one number.

In the one-run game (docs/design.md section 6) each canary ends training with a score, higher
meaning "looks IN", and the auditor guesses IN for the highest scores.  For a white-box DP-SGD
audit the observation of a canary's coordinate at step t is, for a correct implementation
(docs/design.md section 5; units of the clipping norm C),

    Z_t = c * 1{canary present at step t} + N(0, sigma^2),

where c is the canary's norm, sigma the noise multiplier and an IN canary is present at each step
with the sampling probability q (Poisson sampling); an OUT canary is never present.  Two scores:

* ``"sum"`` -- the plain sum of the Z_t over steps;
* ``"llr"`` -- the sum over steps of :func:`llr_step_score`, the log-likelihood ratio of one step
  of the claimed mechanism: IN gives the mixture (1 - q) N(0, sigma^2) + q N(c, sigma^2), OUT gives
  N(0, sigma^2), so

      log LR(z) = log(1 - q + q exp(c (z - c/2) / sigma^2)).

**Why every such score is valid.**  The Steinke, Nasr & Jagielski bound ("Privacy Auditing with
One (1) Training Run", NeurIPS 2023, Theorem 3.1) holds for any guesses that are a
post-processing of the training run's output: the guesser may use anything except the secret
coins.  A score computed from the observations with public constants (the *claimed* sigma and q,
the canary norm c) is such a post-processing, whatever the true mechanism is.  A wrong constant
(an implementation that does not add the noise it claims) can only make the score less
informative, never make the bound invalid.

**Why the LLR is the right score.**  In the idealized game the steps are independent given the
canary's membership, so the likelihood ratio of a canary's whole trace (IN against OUT) is the
product of the per-step ratios, and its log is the sum of :func:`llr_step_score`.  By the
Neyman-Pearson lemma, thresholding that sum is the most powerful test of IN against OUT for one
canary at every false-positive rate: no other per-canary score separates IN from OUT canaries
better.  The plain sum is the LLR's first-order version (log LR is nearly affine in z when
c / sigma^2 is small), which is why the two agree at large noise and differ at small noise and
small q, where the LLR discounts the many steps at which an IN canary was absent.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
import torch

from .._validation import as_real
from .._vecmath import exp_, log1p_

__all__ = ["SCORES", "DEFAULT_SCORE", "check_score", "check_step_model", "llr_step_score",
           "step_score"]

#: the per-canary scores the one-run audit knows
SCORES = ("llr", "sum")
#: the score used unless asked otherwise; chosen by benchmarks/one_run_scores.py
#: (docs/one_run.md, "Scores")
DEFAULT_SCORE = "llr"


def check_score(score: object) -> str:
    """``score`` if it is one of :data:`SCORES` (ValueError naming it otherwise)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    return str(score)


def check_step_model(q: object, sigma: object, c: object = 1.0) -> tuple[float, float, float]:
    """(q, sigma, c) of the per-step model: q in (0, 1], sigma > 0 finite, c > 0 finite."""
    q_ = as_real("q", q)
    if not (0.0 < q_ <= 1.0):
        raise ValueError(f"q (sampling probability) must lie in (0, 1], got {q!r}")
    s_ = as_real("sigma", sigma)
    if not (s_ > 0.0 and math.isfinite(s_)):
        raise ValueError(f"sigma (noise multiplier) must be a finite number > 0, got {sigma!r}")
    c_ = as_real("c", c)
    if not (c_ > 0.0 and math.isfinite(c_)):
        raise ValueError(f"c (canary norm) must be a finite number > 0, got {c!r}")
    return q_, s_, c_


def llr_constants(q: float, sigma: float, c: float = 1.0) -> tuple[float, float, float]:
    """(scale, shift, log_absent) of :func:`llr_step_score`: the per-step score is
    logaddexp(log_absent, z * scale + shift), with scale = c / sigma^2, shift = log q -
    c^2 / (2 sigma^2) and log_absent = log(1 - q) (-inf at q = 1). Validates the model."""
    q_, s_, c_ = check_step_model(q, sigma, c)
    scale = c_ / (s_ * s_)
    shift = math.log(q_) - scale * c_ / 2.0
    log_absent = math.log1p(-q_) if q_ < 1.0 else -math.inf
    return scale, shift, log_absent


@overload
def llr_step_score(z: torch.Tensor, q: float, sigma: float, c: float = 1.0) -> torch.Tensor: ...
@overload
def llr_step_score(z: Any, q: float, sigma: float, c: float = 1.0) -> np.ndarray: ...


def llr_step_score(z: Any, q: float, sigma: float, c: float = 1.0) -> Any:
    """Per-step log-likelihood ratio of the claimed step mechanism, elementwise.

    log(1 - q + q exp(c (z - c/2) / sigma^2)): IN (present with probability q, then shifted by c)
    against OUT (never present), Gaussian noise of standard deviation sigma; all in units of the
    clipping norm.  Computed as logaddexp(log1p(-q), log q + c (z - c/2) / sigma^2), which neither
    overflows (z = 1e4, sigma = 0.1 gives 1e6 + log q) nor loses the small values near
    log(1 - q).  The running score of a canary is the sum over steps (see the module docstring for
    why it is valid and optimal).

    Args:
        z: observations; a torch tensor (computed in float64 on its own device, returned as a
            float64 tensor there) or anything numpy reads (returned as a float64 array).
        q: probability that an IN canary is present at a step, in (0, 1].
        sigma: noise standard deviation in units of the clipping norm, finite and > 0.
        c: canary norm in units of the clipping norm, finite and > 0.
    """
    scale, shift, log_absent = llr_constants(q, sigma, c)
    q_ = float(q)
    if isinstance(z, torch.Tensor):
        x = z.to(torch.float64)
        present = x * scale + shift
        if q_ == 1.0:
            return present
        return torch.logaddexp(torch.full_like(present, log_absent), present)
    x = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore"):  # |z| near the float range: +-inf is the right limit
        present = x * scale + shift
    if q_ == 1.0:
        return present
    return np.logaddexp(log_absent, present)


def accumulate_llr(z: np.ndarray, llr: np.ndarray, q: float, sigma: float, c: float = 1.0,
                   scratch: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """``llr += llr_step_score(z, q, sigma, c)`` in place, for float64 NumPy arrays, without
    temporaries of z's size when ``scratch`` (two float64 arrays like z) is given: the running
    one-run score's update at every training step. ``z`` may also be ``[n, m]``: n steps of the
    same sigma, added to ``llr`` [m] one step after the other (the same additions, in the same
    order, as n calls). Evaluated as log_absent + max(d, 0) + log1p(exp(-|d|)) with
    d = z * scale + shift - log_absent (the same value as the logaddexp of
    :func:`llr_step_score`, in vectorised passes)."""
    scale, shift, log_absent = llr_constants(q, sigma, c)
    d, e = scratch if scratch is not None else (np.empty_like(z), np.empty_like(z))
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(z, scale, out=d)
        if log_absent == -math.inf:  # q = 1: the score is the Gaussian log-ratio itself
            np.add(d, shift, out=d)
        else:
            np.add(d, shift - log_absent, out=d)
            np.abs(d, out=e)
            np.negative(e, out=e)
            exp_(e)  # the faster library on this CPU (dpaudit_torch._vecmath)
            log1p_(e)
            np.maximum(d, 0.0, out=d)
            np.add(d, e, out=d)
            np.add(d, log_absent, out=d)
        for row in (d,) if d.ndim == 1 else d:
            np.add(llr, row, out=llr)


def step_score(score: str, z: Any, q: float, sigma: float, c: float = 1.0) -> Any:
    """The per-step contribution of ``score`` (``"sum"``: z itself; ``"llr"``:
    :func:`llr_step_score`); the canary's score is its sum over steps."""
    if check_score(score) == "sum":
        if isinstance(z, torch.Tensor):
            return z.to(torch.float64)
        return np.asarray(z, dtype=np.float64)
    return llr_step_score(z, q, sigma, c)
