"""The adaptive radii's math: the entropy rule against its formula, the controller's direction,
clip and range, and the rejected settings."""

from __future__ import annotations

import math

import pytest
import torch

from openrlhf_band.band.adaptive import (
    AdaptiveRadius,
    RadiusController,
    default_delta_range,
    entropy_adaptive_delta,
    validate_adaptive,
)


def test_entropy_rule_is_its_formula():
    h = torch.tensor([0.0, 0.1, 0.5, 1.0, 2.0, 100.0])
    got = entropy_adaptive_delta(0.05, h, 1.0, 0.5, (0.01, 0.2))
    want = [min(max(0.05 * (v / 1.0) ** 0.5, 0.01), 0.2) for v in h.tolist()]
    torch.testing.assert_close(got, torch.tensor(want))
    assert got[0] == 0.01 and got[-1] == 0.2  # clamped at both ends


def test_power_zero_is_the_constant_radius_and_a_useless_mean_changes_nothing():
    h = torch.rand(3, 7) * 3
    assert torch.equal(entropy_adaptive_delta(0.05, h, 1.3, 0.0, (0.01, 0.2)), torch.full((3, 7), 0.05))
    for mean in (0.0, math.nan, math.inf):
        assert torch.equal(entropy_adaptive_delta(0.05, h, mean, 1.0, (0.01, 0.2)), torch.full((3, 7), 0.05))


def test_controller_moves_the_radius_the_trust_regions_way_within_its_range():
    c = RadiusController(delta=0.05, target_entropy=1.0, rate=0.1, delta_range=(0.04, 0.06))
    assert c.update(0.5) == pytest.approx(0.05 * math.exp(0.1 * -0.2))  # far below: error clipped at -0.2
    assert c.update(1.1) == pytest.approx(0.05 * math.exp(-0.02) * math.exp(0.1 * 0.1))
    for _ in range(200):
        c.update(3.0)  # entropy above target: steps grow, up to the range
    assert c.delta == 0.06 and c.steps == 202
    saved = c.state_dict()
    other = RadiusController(delta=0.05, target_entropy=1.0, rate=0.1, delta_range=(0.04, 0.06))
    other.load_state_dict(saved)
    assert other.delta == c.delta and other.steps == c.steps
    c.update(math.nan)  # no signal: no move
    assert c.delta == 0.06


def test_default_range_is_a_factor_four_inside_the_tested_range():
    assert default_delta_range(0.05) == (0.0125, 0.2)
    assert default_delta_range(0.5) == (0.125, 1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"adaptive": "variance"}, "adaptive must be one of"),
        ({"entropy_power": -1.0}, "entropy_power"),
        ({"entropy_power": True}, "entropy_power"),
        ({"delta_range": (0.2, 0.01)}, "delta_range"),
        ({"delta_range": (0.0, 0.1)}, "delta_range"),
        ({"delta_range": (0.06, 0.1)}, "must lie in delta_range"),
        ({"target_entropy": 0.0}, "target_entropy"),
        ({"controller_rate": -0.1}, "controller_rate"),
    ],
)
def test_rejected_settings(kwargs, message):
    settings = dict(adaptive="entropy", entropy_power=1.0, delta_range=(0.01, 0.2), target_entropy=None,
                    controller_rate=0.1)  # fmt: skip
    settings.update(kwargs)
    with pytest.raises(ValueError, match=message):
        validate_adaptive(0.05, **settings)


def test_an_entropy_rule_beyond_the_per_token_solver_range_is_refused():
    import pytest

    from openrlhf_band.band.adaptive import validate_adaptive

    for divergence in ("kl", "reverse_kl"):
        with pytest.raises(ValueError, match="per-token radii"):
            validate_adaptive(0.05, "entropy", 1.0, (1e-9, 0.2), None, 0.1, divergence)
        with pytest.raises(ValueError, match="per-token radii"):
            validate_adaptive(5.0, "entropy", 1.0, (1.0, 20.0), None, 0.1, divergence)
        validate_adaptive(0.05, "entropy", 1.0, (0.0125, 0.2), None, 0.1, divergence)
    validate_adaptive(5.0, "entropy", 1.0, (1.0, 20.0), None, 0.1, "chi2")  # closed forms: any radius
    validate_adaptive(5.0, "none", 1.0, (1.0, 20.0), None, 0.1, "kl")  # a scalar radius: any


def test_the_adaptive_radius_state_stands_alone():
    """AdaptiveRadius (the state BandPolicyLoss delegates to) without a loss: a step's token-weighted
    mean entropy becomes the next step's normaliser and moves the controller; its state round-trips."""
    state = AdaptiveRadius(0.05, "entropy", 1.0, (0.01, 0.2), target_entropy=1.0, controller_rate=0.1)
    h = torch.tensor([[0.5, 1.5, 9.0], [1.0, 1.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    first, metrics = state.radius(h, mask)  # before any step: the micro-batch's own mean (1.0)
    assert torch.allclose(first[mask], torch.tensor([0.025, 0.075, 0.05, 0.05]))
    assert float(metrics["band/entropy_mean"]) == 1.0
    assert float(metrics["band/controller_delta"]) == float(torch.tensor(0.05))  # float32, as logged
    state.radius(h * 2, mask)  # a second micro-batch of the same step, mean 2.0
    totals = state.take_step_totals()
    assert totals.tolist() == [12.0, 8.0] and state.take_step_totals().tolist() == [0.0, 0.0]
    state.close_step(*totals.tolist())
    assert state.previous_entropy_mean == 1.5 and state.controller.steps == 1
    assert state.controller.delta == pytest.approx(0.05 * math.exp(0.1 * 0.2))  # above target: error clipped to 0.2
    fresh = AdaptiveRadius(0.05, "entropy", 1.0, (0.01, 0.2), target_entropy=1.0, controller_rate=0.1)
    fresh.load_state_dict(state.state_dict())
    assert fresh.previous_entropy_mean == 1.5 and fresh.controller.delta == state.controller.delta
    state.close_step(0.0, 0.0)  # a step without tokens changes nothing
    assert state.controller.steps == 1
    with pytest.raises(ValueError, match="must lie in delta_range"):
        AdaptiveRadius(0.5, "entropy", 1.0, (0.01, 0.2))
