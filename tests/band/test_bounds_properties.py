"""Property tests of ``openrlhf_band.band_bounds`` (hypothesis), judged by the mpmath oracle.

Every property is checked against mathematics evaluated by ``band_exact`` (tests/support) or
against a theorem of band-math.md (monotonicity in p), never against other outputs of the
implementation taken as truth.
"""

from __future__ import annotations

import band_exact as X
import mpmath
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpmath import mpf

from openrlhf_band import DIVERGENCES, band_bounds

DIVS = DIVERGENCES  # every registered divergence
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

divergences = st.sampled_from(DIVS)
deltas = st.one_of(st.sampled_from([1e-3, 0.01, 0.05, 0.2, 1.0]), st.floats(1e-3, 3.0))
# log p < 0 (p < 1), from p ~ 1e-26 up to 1 - 1e-12; hypothesis also probes the interval ends.
log_p64 = st.one_of(
    st.floats(-60.0, -1e-3),
    st.floats(-1e-3, -1e-12),
)
batches64 = st.lists(log_p64, min_size=1, max_size=8)


def _fp32_values(vals: list[float]) -> list[float]:
    """Round to fp32 and keep p < 1 (drop values that round to log p = 0)."""
    out = [v for v in torch.tensor(vals, dtype=torch.float32).tolist() if v < 0]
    return out or [-1.0]


# ----------------------------------------------------------------------------------------------
# g_f(p, bound) = delta at unsaturated bounds (fp64)
# ----------------------------------------------------------------------------------------------
# Mixed forward/backward criterion: some r* within EPS_R relative of our bound solves
# g(p, r*) = delta to within EPS_G relative. EPS_R = 1e-15 (~4.5 ulp) absorbs the rounding of
# the output itself, which matters where g is steep (kl upper bound a hair below 1/p);
# EPS_G = 1e-12 is the residual a converged fp64 solve must reach (each term of g is >= 0 and
# they sum to delta, so fp64 evaluation error is ~1e-16 delta). Clamping r to [0, 1/p] uses
# the exact edge values. As r -> 0 only the representable range is judged: an exact lower
# bound below the smallest normal fp64 may come out as 0 or subnormal.
EPS_R = 1e-15
EPS_G = 1e-12


def _g_interval(div: str, log_p: float, r: float) -> tuple[mpf, mpf]:
    """(g at r (1 - EPS_R), g at r (1 + EPS_R)), r clamped to the simplex [0, 1/p]."""
    with mpmath.workdps(40):
        r_m = mpf(r)
        lo_r, hi_r = r_m * (1 - mpf(EPS_R)), r_m * (1 + mpf(EPS_R))
    return X.g_at_log_p(div, log_p, lo_r), X.g_at_log_p(div, log_p, hi_r)


@SETTINGS
@given(div=divergences, delta=deltas, log_ps=batches64)
def test_g_equals_delta_at_unsaturated_bounds(div, delta, log_ps):
    lo, up = band_bounds(torch.tensor(log_ps, dtype=torch.float64), div, delta)
    tiny = torch.finfo(torch.float64).tiny
    for log_p, r_lo, r_up in zip(log_ps, lo.tolist(), up.tolist(), strict=True):
        ex_lo, ex_up, sat_lo, sat_up = X.exact_bounds(div, log_p, delta)
        band = (delta * (1 - EPS_G), delta * (1 + EPS_G))
        if not sat_lo and ex_lo >= tiny:
            # g decreases on (0, 1): g(r(1 + e)) <= g(r(1 - e)); the interval must meet the band
            g_hi_side, g_lo_side = _g_interval(div, log_p, r_lo)[::-1]
            assert g_hi_side <= band[1] and g_lo_side >= band[0], (
                f"{div} delta={delta!r} log_p={log_p!r}: lower={r_lo!r} gives g in "
                f"[{mpmath.nstr(g_hi_side, 15)}, {mpmath.nstr(g_lo_side, 15)}], exact lower="
                f"{mpmath.nstr(ex_lo, 17)}"
            )
        if not sat_up:
            g_a, g_b = _g_interval(div, log_p, r_up)  # increasing on (1, 1/p)
            assert g_a <= band[1] and g_b >= band[0], (
                f"{div} delta={delta!r} log_p={log_p!r}: upper={r_up!r} gives g in "
                f"[{mpmath.nstr(g_a, 15)}, {mpmath.nstr(g_b, 15)}], exact upper={mpmath.nstr(ex_up, 17)}"
            )


# ----------------------------------------------------------------------------------------------
# r_low < 1 < r_up for p < 1
# ----------------------------------------------------------------------------------------------
def _rounds_to_one(x: mpf, dtype: torch.dtype) -> bool:
    return torch.tensor(float(x), dtype=torch.float64).to(dtype).item() == 1.0


@SETTINGS
@given(div=divergences, delta=deltas, log_ps=batches64, dtype=st.sampled_from([torch.float32, torch.float64]))
def test_band_strictly_contains_one(div, delta, log_ps, dtype):
    """Equality with 1 is allowed only where the exact bound itself rounds to 1 in the output
    dtype (e.g. chi2 at p = 1 - 1e-12 in fp32: 1 - sqrt(delta (1 - p) / p) = 1 - 3e-8)."""
    if dtype == torch.float32:
        log_ps = _fp32_values(log_ps)
    lo, up = band_bounds(torch.tensor(log_ps, dtype=dtype), div, delta)
    for log_p, r_lo, r_up in zip(log_ps, lo.tolist(), up.tolist(), strict=True):
        ex_lo, ex_up, _, _ = X.exact_bounds(div, log_p, delta)
        where = f"{div} delta={delta!r} log_p={log_p!r} {dtype}: [{r_lo!r}, {r_up!r}]"
        assert r_lo <= 1 <= r_up, where
        assert r_lo < 1 or _rounds_to_one(ex_lo, dtype), where + f" exact lower={mpmath.nstr(ex_lo, 17)}"
        assert r_up > 1 or _rounds_to_one(ex_up, dtype), where + f" exact upper={mpmath.nstr(ex_up, 17)}"


# ----------------------------------------------------------------------------------------------
# Proposition 2: r_up non-increasing, r_low non-decreasing in p
# ----------------------------------------------------------------------------------------------
@SETTINGS
@given(
    div=divergences,
    delta=deltas,
    log_ps=st.lists(log_p64, min_size=2, max_size=24),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_monotone_in_p(div, delta, log_ps, dtype):
    """Along increasing p: upper[i+1] <= upper[i] (1 + s), lower[i+1] >= lower[i] (1 - s), with
    s = 1e-6 for fp32 outputs and 1e-12 for fp64 (rounding slack only)."""
    x = torch.tensor(log_ps, dtype=dtype).sort().values
    slack = 1e-6 if dtype == torch.float32 else 1e-12
    lo, up = band_bounds(x, div, delta)
    xs, los, ups = x.tolist(), lo.tolist(), up.tolist()
    for i in range(len(xs) - 1):
        where = f"{div} delta={delta!r} {dtype} log_p {xs[i]!r} -> {xs[i + 1]!r}"
        assert ups[i + 1] <= ups[i] * (1 + slack), f"{where}: upper {ups[i]!r} -> {ups[i + 1]!r}"
        assert los[i + 1] >= los[i] * (1 - slack), f"{where}: lower {los[i]!r} -> {los[i + 1]!r}"


# ----------------------------------------------------------------------------------------------
# fp64 agrees with the exact roots (same criterion as the fp64 grid in test_bounds_accuracy)
# ----------------------------------------------------------------------------------------------
@SETTINGS
@given(div=divergences, delta=deltas, log_ps=batches64)
def test_fp64_matches_exact(div, delta, log_ps):
    lo, up = band_bounds(torch.tensor(log_ps, dtype=torch.float64), div, delta)
    fails = X.check_against_oracle(
        div,
        delta,
        log_ps,
        lo.tolist(),
        up.tolist(),
        rtol=1e-12,
        flag_rtol=8 * torch.finfo(torch.float64).eps,
        tiny=torch.finfo(torch.float64).tiny,
    )
    assert not fails, "\n".join(fails)


@SETTINGS
@given(div=divergences, delta=deltas, log_ps=batches64)
def test_fp32_matches_exact(div, delta, log_ps):
    log_ps = _fp32_values(log_ps)
    lo, up = band_bounds(torch.tensor(log_ps, dtype=torch.float32), div, delta)
    fails = X.check_against_oracle(
        div,
        delta,
        log_ps,
        lo.tolist(),
        up.tolist(),
        rtol=2e-6,
        flag_rtol=8 * torch.finfo(torch.float32).eps,
        tiny=torch.finfo(torch.float32).tiny,
    )
    assert not fails, "\n".join(fails)
