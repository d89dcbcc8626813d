"""Layered one-run canaries under per-layer clipping (dpaudit_torch.canary_layers): the layout's
choice, the drawn design, the combination into units of C and the coverage of the white-box
bound on the combined release (docs/design.md section 5, "Per-layer clipping")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit_torch.canaries import CanaryDesign, derive_seeds
from dpaudit_torch.canary_layers import (
    MIN_GROUPS,
    LayerLayout,
    choose_layout,
    draw_layered_canaries,
    layout_of,
    planning_steps,
)
from dpaudit_torch.opacus_tap._step_kernels import plan_step
from dpaudit_torch.stats.whitebox import ReleaseLaw, release_moments, rho_lower_bound


def test_layout_contribution_and_weights_are_the_unit_projection():
    lay = LayerLayout((0, 2), (0.6, 0.8), 2.0, 10)
    assert lay.width == 2 and lay.span_clip == pytest.approx(1.0, rel=1e-15)
    assert lay.contribution == pytest.approx(0.5, rel=1e-15)
    w = lay.weights()
    # signal: a present canary is 1 in each member's units (C_l) -> c in units of C
    assert float(w.sum()) == pytest.approx(lay.contribution, rel=1e-14)
    # noise: member l's noise is sigma C / C_l in its units -> sigma in units of C
    assert float(np.sum(w ** 2 * (2.0 / np.array([0.6, 0.8])) ** 2)) == pytest.approx(
        1.0, rel=1e-14)


def test_combine_numpy_and_torch_agree():
    lay = LayerLayout((1, 3, 4), (0.5, 1.0, 2.0), 3.0, 4)
    z = np.arange(12, dtype=np.float64)
    want = np.array([sum(lay.weights()[g] * z[g * 4 + j] for g in range(3)) for j in range(4)])
    got_np = lay.combine(z)
    got_t = lay.combine(torch.from_numpy(z)).numpy()
    # float64 sums of 3 products: a few ulps of the largest term
    assert np.allclose(got_np, want, rtol=1e-14, atol=0.0)
    assert np.allclose(got_t, want, rtol=1e-14, atol=0.0)
    mask = torch.tensor([True, False, True, True] * 3)
    assert lay.group_mask(mask).tolist() == [True, False, True, True]


@pytest.mark.parametrize("bad", [dict(clips=(0.0, 1.0)), dict(clips=(1.0,)),
                                 dict(total_clip=math.nan), dict(groups=0)])
def test_layout_bad_input(bad):
    kw = dict(tensors=(0, 1), clips=(1.0, 1.0), total_clip=2.0, groups=4)
    kw.update(bad)
    with pytest.raises(ValueError):
        LayerLayout(**kw)


def test_choose_layout_spans_the_tensors_that_pay():
    # equal bounds on four tensors, one tiny: spanning it leaves 6 canaries, fewer than needed
    free = [5000, 3000, 2000, 6]
    lay = choose_layout(free, [0.5] * 4, budget=20000, sigma=1.0, q=0.05, steps=300)
    assert lay is not None and 3 not in lay.tensors
    # every tensor with at least as many free coordinates as the smallest of S is in S
    low = min(free[i] for i in lay.tensors)
    assert set(lay.tensors) == {i for i in range(4) if free[i] >= low}
    assert lay.groups == min(low, 20000 // lay.width)
    # at small noise the widest layout with enough canaries wins (a larger contribution)
    lay0 = choose_layout(free, [0.5] * 4, budget=20000, sigma=0.05, q=0.05, steps=300)
    assert lay0 is not None and lay0.tensors == (0, 1, 2)
    assert lay0.contribution == pytest.approx(math.sqrt(0.75), rel=1e-12)
    # a bound of 0 on a tensor: never spanned
    lay1 = choose_layout(free, [0.0, 1.0, 1.0, 1.0], budget=20000, sigma=1.0, q=0.05)
    assert lay1 is not None and 0 not in lay1.tensors
    assert choose_layout([MIN_GROUPS - 1] * 3, [1.0] * 3, 100, 1.0, 0.1) is None


def test_choose_layout_bad_input():
    with pytest.raises(ValueError, match="per-layer bounds"):
        choose_layout([10, 10], [1.0], 10, 1.0, 0.1)
    with pytest.raises(ValueError, match="nan"):
        choose_layout([10, 10], [1.0, math.nan], 10, 1.0, 0.1)
    with pytest.raises(ValueError, match="q must be"):
        planning_steps(0.0)
    assert planning_steps(0.5) == 100 and planning_steps(0.01) == 500


def test_drawn_design_is_tensor_major_disjoint_and_round_trips():
    shapes = [(32, 16), (32,), (2, 32), (2,)]
    seeds, _ = derive_seeds(7)
    drawn = draw_layered_canaries(shapes, 8, 289, [0.5] * 4, 0.5, 0.125, seeds, 64, None)
    assert drawn is not None
    design, (np_, nf), coins, lay = drawn
    assert design.layer_width == lay.width and design.m_canaries == lay.width * lay.groups
    one = design.one_param.view(lay.width, lay.groups)
    assert all(bool((one[g] == t).all()) for g, t in enumerate(lay.tensors))
    # no coordinate used twice (pairs, one-run members, noise audit)
    cp, cf = design.coordinates()
    pairs = set(zip(torch.cat([cp, np_]).tolist(), torch.cat([cf, nf]).tolist()))
    assert len(pairs) == cp.numel() + np_.numel()
    # a canary's members share its coin
    mask = coins.sampling_mask().view(lay.width, lay.groups)
    assert bool((mask == mask[0]).all()) and 0 < int(mask[0].sum()) < lay.groups
    # checkpoints: the layout travels with the design
    back = CanaryDesign.from_state(design.to_state())
    assert layout_of(back) == lay and back.summary()["m_one_run"] == lay.groups
    assert layout_of(CanaryDesign.from_state({**design.to_state(), "extra": {}})) is None


def test_plan_step_includes_a_canary_with_all_its_members():
    k, g, m_g = 2, 3, 5
    m = g * m_g
    consts = np.concatenate([[0, 1], [0, 0], [1, 1], np.repeat([0, 1, 2], m_g),
                             np.arange(m)]).astype(np.int64)
    in_groups = np.array([0, 2, 3], dtype=np.int64)
    draws = np.random.default_rng(0).random(4096)
    empty = np.zeros((0, 2, 0), dtype=np.int64)
    at, seen = 0, 0
    for _ in range(50):
        out = plan_step(draws, at, in_groups, math.log1p(-0.5), consts, k, m, 3,
                        np.zeros(0, dtype=np.int64), empty, empty, 1.0,
                        np.empty(3, dtype=np.int64), g)
        at, included = out[0], out[2]
        assert at > 0
        # ascending, whole canaries only: member l of canary j is l m_g + j
        assert np.all(np.diff(included) > 0)
        groups = included[:included.size // g]
        assert set(groups.tolist()) <= {0, 2, 3}
        assert included.tolist() == [int(j) + l * m_g for l in range(g) for j in groups]
        seen += groups.size
    assert seen > 0


def _layered_sums(rng: np.random.Generator, lay: LayerLayout, sigma: float, q: float,
                  steps: int, is_in: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-canary sums of Z, Z^2, Z^4 of the combined release: members in units of their C_l
    (a present canary adds 1, the noise is sigma C / C_l), one Poisson draw per canary."""
    clips = np.asarray(lay.clips)
    G = lay.groups
    s1 = np.zeros(G)
    s2 = np.zeros(G)
    s4 = np.zeros(G)
    for _ in range(steps):
        b = (rng.random(G) < q) & is_in
        z = b[None, :] + rng.standard_normal((lay.width, G)) * (
            sigma * lay.total_clip / clips)[:, None]
        v = lay.combine(z.reshape(-1))
        s1 += v
        s2 += v * v
        s4 += v ** 4
    return s1, s2, s4


def _coverage(games: int, alpha: float, seed: int) -> tuple[int, list[float]]:
    """Games of a layered release at the boundary rho = c / sigma (unequal bounds, half the
    canaries IN at random): how often the lower bound on rho exceeds c / sigma, and the
    statistic's percentile in its exact law."""
    lay = LayerLayout((0, 1, 2), (0.3, 0.4, 1.2), 1.5, 200)
    sigma, q, steps = 0.6, 0.2, 20
    rho = lay.contribution / sigma
    rng = np.random.default_rng(seed)
    law = ReleaseLaw(100, 100, steps, q)
    over, pct = 0, []
    for _ in range(games):
        is_in = np.zeros(lay.groups, dtype=bool)
        is_in[rng.permutation(lay.groups)[:100]] = True
        s1, s2, s4 = _layered_sums(rng, lay, sigma, q, steps, is_in)
        mom = release_moments(s1, is_in, steps, s2, s4)
        # rho_lb > rho exactly when the test rejects rho (its tail is increasing in rho)
        over += law.tail(mom.statistic, rho) < alpha
        if len(pct) < 60:
            pct.append(1.0 - law.tail(mom.statistic, rho, conservative=False))
    return over, pct


def test_combined_release_is_the_family_at_the_reached_contribution():
    """The combined values are c B + N(0, sigma^2): the white-box statistic falls in the exact
    law at rho = c / sigma (mean percentile 1/2 within 3 SE of a uniform's mean), and the lower
    bound on rho stays at or below c / sigma in all but about alpha of the games (coverage at
    the boundary; 150 games at alpha 0.05, within 3 binomial SE)."""
    games, alpha = 150, 0.05
    over, pct = _coverage(games, alpha, 2026)
    assert over / games <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / games)
    assert abs(float(np.mean(pct)) - 0.5) <= 3 * math.sqrt(1 / 12 / len(pct))


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_combined_release_coverage_large(alpha):
    """The same coverage with 3000 games per level (within 3 binomial SE of alpha), and the
    bound itself on a few games (the same decision as the test's tail)."""
    games = 3000
    over, _ = _coverage(games, alpha, 7)
    assert over / games <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / games)
    lay = LayerLayout((0, 1, 2), (0.3, 0.4, 1.2), 1.5, 200)
    rng = np.random.default_rng(11)
    law = ReleaseLaw(100, 100, 20, 0.2)
    for _ in range(5):
        is_in = np.zeros(200, dtype=bool)
        is_in[rng.permutation(200)[:100]] = True
        mom = release_moments(*_layered_sums(rng, lay, 0.6, 0.2, 20, is_in)[:1], is_in, 20)
        rho = lay.contribution / 0.6
        assert (rho_lower_bound(mom, 0.2, alpha) > rho) == (law.tail(mom.statistic, rho) < alpha)


def test_too_little_noise_is_refuted_through_layered_canaries():
    """Power: noise sigma_true = c sigma / 3 (a release three times more revealing than the
    claim's worst case) gives a lower bound on rho above the claim's 1 / sigma in at least 9 of
    10 games (the exact law's median is far above it)."""
    lay = LayerLayout((0, 1, 2), (0.3, 0.4, 1.2), 1.5, 200)
    sigma_claim, q, steps = 0.6, 0.2, 20
    sigma_true = lay.contribution * sigma_claim / 3.0
    rng = np.random.default_rng(5)
    law = ReleaseLaw(100, 100, steps, q)
    refuted = 0
    for _ in range(10):
        is_in = np.zeros(lay.groups, dtype=bool)
        is_in[rng.permutation(lay.groups)[:100]] = True
        s1, s2, s4 = _layered_sums(rng, lay, sigma_true, q, steps, is_in)
        mom = release_moments(s1, is_in, steps, s2, s4)
        refuted += law.tail(mom.statistic, 1.0 / sigma_claim) < 1e-3
    assert refuted >= 9
