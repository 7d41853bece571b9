"""`band_bounds` with a per-token radius: against the mpmath oracle at random (p, delta) pairs for
every divergence (float32 and float64), shapes and broadcasting, the constant tensor against the
scalar, and what an invalid per-token value yields (nan for its token, no host sync)."""

from __future__ import annotations

import math
import random

import band_exact as X
import pytest
import torch
from band_samples import whole_range_pairs

from openrlhf_band import DIVERGENCES, band_bounds
from openrlhf_band.band.bounds import PER_TOKEN_DELTA_RANGE

RTOL32, RTOL64 = 2e-6, 1e-12  # as tests/band/test_bounds_accuracy.py, relative to max(exact, 1e-3)
FLAG32, FLAG64 = 8 * torch.finfo(torch.float32).eps, 8 * torch.finfo(torch.float64).eps
TINY32, TINY64 = torch.finfo(torch.float32).tiny, torch.finfo(torch.float64).tiny


def random_pairs(n: int, seed: int) -> list[tuple[float, float]]:
    """(log p, delta): p log-uniform over [1e-20, 1/2] and 1 - p log-uniform over [1e-6, 1/2] (half
    each), delta log-uniform over [1e-4, 1]; plus p = 1 and p = 1 - 1e-7 with random deltas."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        if i % 2:
            log_p = math.log(10 ** rng.uniform(-20, math.log10(0.5)))
        else:
            log_p = math.log1p(-(10 ** rng.uniform(-6, math.log10(0.5))))
        pairs.append((log_p, 10 ** rng.uniform(-4, 0)))
    return pairs + [(0.0, 10 ** rng.uniform(-4, 0)), (math.log1p(-1e-7), 10 ** rng.uniform(-4, 0))]


def check(div, log_ps, deltas, lowers, uppers, rtol, flag_rtol, tiny) -> list[str]:
    fails = []
    for log_p, delta, lo, up in zip(log_ps, deltas, lowers, uppers):
        fails += X.check_against_oracle(
            div, delta, [log_p], [lo], [up], rtol=rtol, flag_rtol=flag_rtol, tiny=tiny, tie_rtol=1e-9
        )
    return fails


@pytest.mark.parametrize("div", DIVERGENCES)
@pytest.mark.parametrize(
    "dtype, rtol, flag, tiny", [(torch.float32, RTOL32, FLAG32, TINY32), (torch.float64, RTOL64, FLAG64, TINY64)],
    ids=["fp32", "fp64"],
)  # fmt: skip
def test_per_token_delta_against_the_oracle(div, dtype, rtol, flag, tiny):
    pairs = random_pairs(120, seed=DIVERGENCES.index(div))
    x = torch.tensor([lp for lp, _ in pairs], dtype=dtype)
    delta = torch.tensor([d for _, d in pairs], dtype=dtype)
    lower, upper = band_bounds(x, div, delta)
    assert lower.dtype == upper.dtype == dtype
    # the oracle at the exact values the tensors hold
    fails = check(div, x.tolist(), delta.tolist(), lower.tolist(), upper.tolist(), rtol, flag, tiny)
    assert not fails, "\n".join(fails[:20])


@pytest.mark.parametrize("div", DIVERGENCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_constant_delta_tensor_gives_the_scalar_result(div, dtype):
    x = torch.tensor([lp for lp, _ in random_pairs(64, seed=7)], dtype=dtype)
    want = band_bounds(x, div, 0.05, upper_cap=10.0, relax=(0.1, 0.1))
    got = band_bounds(x, div, torch.full_like(x, 0.05, dtype=torch.float64), upper_cap=10.0, relax=(0.1, 0.1))
    for w, g in zip(want, got):
        # the scalar path of kl / reverse_kl is a table, the tensor path a solver: float32 rounding
        torch.testing.assert_close(g, w, rtol=2e-6 if dtype == torch.float32 else 1e-12, atol=1e-12)


def test_per_sequence_delta_broadcasts_over_the_row():
    x = torch.log(torch.tensor([[0.1, 0.5, 0.9], [0.1, 0.5, 0.9]]))
    lower, upper = band_bounds(x, "chi2", torch.tensor([[0.01], [0.2]]))
    for row, delta in ((0, 0.01), (1, 0.2)):
        want = band_bounds(x[row], "chi2", delta)
        torch.testing.assert_close(lower[row], want[0])
        torch.testing.assert_close(upper[row], want[1])


def test_invalid_per_token_values_give_nan_for_their_token_only():
    x = torch.full((6,), math.log(0.3))
    delta = torch.tensor([0.05, 0.0, -1.0, math.nan, math.inf, 0.2])
    for div in DIVERGENCES:
        lower, upper = band_bounds(x, div, delta)
        bad = torch.tensor([False, True, True, True, True, False])
        assert torch.isnan(lower[bad]).all() and torch.isnan(upper[bad]).all(), div
        assert torch.isfinite(lower[~bad]).all() and torch.isfinite(upper[~bad]).all(), div


@pytest.mark.parametrize(
    "delta, message",
    [
        (torch.tensor([1, 2, 3]), "floating-point"),
        (torch.ones(4), "does not broadcast"),
    ],
)
def test_bad_delta_tensors_are_refused(delta, message):
    with pytest.raises(ValueError, match=message):
        band_bounds(torch.full((3,), -1.0), "kl", delta)


@pytest.mark.parametrize("div", ["kl", "reverse_kl"])
@pytest.mark.parametrize(
    "dtype, rtol, flag, tiny", [(torch.float32, RTOL32, FLAG32, TINY32), (torch.float64, RTOL64, FLAG64, TINY64)],
    ids=["fp32", "fp64"],
)  # fmt: skip
def test_per_token_delta_over_the_whole_range_against_the_oracle(div, dtype, rtol, flag, tiny):
    """The start table and two Halley steps are exact over PER_TOKEN_DELTA_RANGE, radii near 1e-8
    and p near reverse_kl's saturation edges included (where the bracketed solver lost 0.3%)."""
    pairs = whole_range_pairs(160, seed=11 + (div == "kl"))
    x = torch.tensor([lp for lp, _ in pairs], dtype=dtype)
    delta = torch.tensor([d for _, d in pairs], dtype=dtype)
    delta = delta.clamp(PER_TOKEN_DELTA_RANGE[0], PER_TOKEN_DELTA_RANGE[1])
    lower, upper = band_bounds(x, div, delta)
    fails = check(div, x.tolist(), delta.tolist(), lower.tolist(), upper.tolist(), rtol, flag, tiny)
    assert not fails, "\n".join(fails[:20])


@pytest.mark.parametrize("div", DIVERGENCES)
def test_radii_outside_the_per_token_range(div):
    """kl / reverse_kl: nan bounds just outside [1e-8, 10] (finite at its ends); closed forms: any radius."""
    low, high = PER_TOKEN_DELTA_RANGE
    delta = torch.tensor([low, high, low * (1 - 1e-6), high * (1 + 1e-6), 1e-12, 100.0], dtype=torch.float64)
    lower, upper = band_bounds(torch.full((6,), math.log(0.3), dtype=torch.float64), div, delta)
    assert torch.isfinite(lower[:2]).all() and torch.isfinite(upper[:2]).all()
    if div in ("kl", "reverse_kl"):
        assert torch.isnan(lower[2:]).all() and torch.isnan(upper[2:]).all()
    else:
        assert torch.isfinite(lower).all() and torch.isfinite(upper).all()
