"""The lower floor (max(r_low, F)) and asymmetric radii (`lower_delta`) of ``band_bounds``, against
the 60-digit oracle (``band_exact``, tests/support), never against the implementation itself.

The floor: the lower bound is the oracle's root or F, whichever is larger (F as float32 holds it),
the upper bound and its saturation flag are what they are without the floor, and the order with
relax (union first, then the floor) and the cap (which only moves the upper bound) is the stated
one. lower_delta: the lower bound is the oracle's lower root at lower_delta, the upper bound the
oracle's upper root at delta.
"""

from __future__ import annotations

import math

import band_exact as X
import pytest
import torch
from mpmath import mpf

from openrlhf_band import DIVERGENCES, band_bounds
from openrlhf_band.band.bounds import band_bounds_with_edge

RTOL32 = 2e-6  # as tests/band/test_bounds_accuracy.py: ~17 float32 ulps, absolute floor 1e-3 * rtol
# log p from 1e-12 to 1 - 1e-6 (log-spaced in p, then in 1 - p) and p = 1 exactly
GRID = sorted(
    {math.log(10.0 ** (-12 + 11.7 * i / 59)) for i in range(60)}
    | {math.log1p(-(10.0 ** (-0.31 - 5.69 * i / 29))) for i in range(30)}
    | {0.0}
)
LOG_P32 = torch.tensor(GRID, dtype=torch.float32)
EXACT_LOG_P = [float(v) for v in LOG_P32.tolist()]  # the oracle reads the float32 inputs exactly


def _close(ours: float, exact, rtol: float = RTOL32, floor: float = 1e-3) -> bool:
    return abs(mpf(ours) - exact) <= rtol * max(exact, mpf(floor))


@pytest.mark.parametrize("div", DIVERGENCES)
@pytest.mark.parametrize("delta", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("floor", [0.5, 0.8, 0.95])
def test_floored_lower_bound_is_the_larger_of_the_oracle_root_and_the_floor(div, delta, floor):
    lower, upper, at_edge = band_bounds_with_edge(LOG_P32, div, delta, lower_floor=floor)
    plain_lower, plain_upper, plain_edge = band_bounds_with_edge(LOG_P32, div, delta)
    floor32 = float(torch.tensor(floor, dtype=torch.float32))
    # the floor moves only the lower bound: upper and the edge flag are untouched, bit for bit (the
    # same code on the same inputs; the floor is a max, which does not round)
    assert torch.equal(upper, plain_upper) and torch.equal(at_edge, plain_edge)
    fails, floored = [], 0
    for log_p, lo in zip(EXACT_LOG_P, lower.tolist(), strict=True):
        ex_lo, _, sat_lo, _ = X.exact_bounds(div, log_p, delta)
        expected = max(ex_lo, mpf(floor32))
        if ex_lo < floor32:
            floored += 1
            ok = lo == floor32  # exactly the floor, also where the root saturated to 0
        else:
            ok = _close(lo, expected)
        if not ok:
            fails.append(f"log_p={log_p!r}: lower={lo!r}, exact root {float(ex_lo)!r} (saturated: {sat_lo}), F={floor}")
    assert not fails, "\n".join(fails[:10])
    assert floored > 0  # the floor binds somewhere on the grid (for tv at delta 0.2, F 0.8 everywhere)
    assert torch.equal(lower, torch.maximum(plain_lower, torch.tensor(floor32)))


def test_floor_comes_after_relax_and_commutes_with_the_cap():
    # relax's union would put the lower bound at 1 - 0.5 = 0.5 for every token: the floor wins
    lower, upper = band_bounds(LOG_P32, "kl", 0.05, relax=(0.5, 0.28), upper_cap=3.0, lower_floor=0.8)
    relaxed_lower, relaxed_upper = band_bounds(LOG_P32, "kl", 0.05, relax=(0.5, 0.28), upper_cap=3.0)
    assert (relaxed_lower <= 0.5).all() and (lower == float(torch.tensor(0.8, dtype=torch.float32))).all()
    assert torch.equal(upper, relaxed_upper) and upper.max() == 3.0  # the same code for upper; the cap exactly


def test_floor_with_a_per_token_radius_against_the_oracle():
    deltas = torch.tensor([0.003, 0.05, 0.4], dtype=torch.float32)
    old = LOG_P32[::4]
    delta = deltas.repeat(len(old) // 3 + 1)[: len(old)]
    lower, _ = band_bounds(old, "kl", delta, lower_floor=0.7)
    for log_p, d, lo in zip(old.tolist(), delta.tolist(), lower.tolist(), strict=True):
        ex_lo = X.exact_bounds("kl", log_p, d)[0]
        assert _close(lo, max(ex_lo, mpf(float(torch.tensor(0.7, dtype=torch.float32))))), (log_p, d, lo)


def test_floor_keeps_nan_and_float64():
    old = torch.tensor([math.nan, -1.0, -30.0], dtype=torch.float64)
    lower, upper = band_bounds(old, "tv", 0.05, lower_floor=0.8)
    assert lower.dtype == torch.float64 and math.isnan(lower[0]) and math.isnan(upper[0])
    assert lower[1] == pytest.approx(1 - 0.05 * math.e, rel=1e-14) and lower[2] == 0.8


@pytest.mark.parametrize("div", DIVERGENCES)
def test_lower_delta_takes_the_lower_root_at_its_own_radius(div):
    delta, lower_delta = 0.08, 0.02
    lower, upper, at_edge = band_bounds_with_edge(LOG_P32, div, delta, lower_delta=lower_delta)
    _, plain_upper, plain_edge = band_bounds_with_edge(LOG_P32, div, delta)
    assert torch.equal(upper, plain_upper) and torch.equal(at_edge, plain_edge)
    fails = []
    for log_p, lo, up in zip(EXACT_LOG_P, lower.tolist(), upper.tolist(), strict=True):
        ex_lo, _, sat_lo, _ = X.exact_bounds(div, log_p, lower_delta)
        ex_up = X.exact_bounds(div, log_p, delta)[1]
        if sat_lo:
            ok = lo == 0.0
        else:
            ok = _close(lo, ex_lo) or ex_lo < torch.finfo(torch.float32).tiny
        if not (ok and _close(up, ex_up)):
            fails.append(f"log_p={log_p!r}: [{lo!r}, {up!r}] vs exact [{float(ex_lo)!r}, {float(ex_up)!r}]")
    assert not fails, "\n".join(fails[:10])
    # the symmetric case is the plain band, bit for bit (lower_delta == delta takes the plain path)
    assert torch.equal(band_bounds(LOG_P32, div, delta, lower_delta=delta)[0], band_bounds(LOG_P32, div, delta)[0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lower_floor=0.0), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_floor=1.0), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_floor=-0.5), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_floor=math.nan), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_floor="0.8"), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_floor=True), "lower_floor must be a number strictly between 0 and 1"),
        (dict(lower_delta=0.0), "lower_delta must be a positive finite number"),
        (dict(lower_delta=math.inf), "lower_delta must be a positive finite number"),
        (dict(delta=torch.full((5,), 0.05), lower_delta=0.02), "lower_delta takes a number delta"),
    ],
)
def test_bad_floor_and_lower_delta_are_refused(kwargs, message):
    kwargs = {"delta": 0.05, **kwargs}
    with pytest.raises(ValueError, match=message):
        band_bounds(LOG_P32[:5], "kl", **kwargs)
