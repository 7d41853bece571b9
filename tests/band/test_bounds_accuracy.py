"""Accuracy and edge semantics of ``openrlhf_band.band_bounds`` against a 60+-digit oracle.

Ground truth is ``band_exact`` (tests/support), written from the math page only; every expected
number below comes from it (never from the implementation). The oracle is evaluated at the
exact binary value of each input log-probability, so input rounding is not part of the error.
"""

from __future__ import annotations

import math
from fractions import Fraction

import band_exact as X
import mpmath
import numpy as np
import pytest
import torch
from mpmath import mpf

from openrlhf_band import DIVERGENCES, band_bounds

# every registered divergence (the registry is the list: a new entry is tested here without editing this file); the
# oracle, written from the paper's definitions, must know each (test_the_oracle_covers_every_divergence)
EXPECTED_DIVERGENCES = DIVERGENCES
DELTAS = [1e-3, 0.01, 0.05, 0.2, 1.0]

# fp32 output: 2e-6 relative (~17 ulp of fp32) with an absolute floor of 2e-9 below 1e-3.
RTOL32 = 2e-6
# fp64 output: 1e-12 relative (~4500 ulp of fp64), same 1e-3 floor. The inputs are exact and the
# bounds are smooth functions of p with moderate condition numbers on this grid, so a backward
# stable fp64 solve (residual ~1e-16 relative) lands within ~1e-14; 1e-12 leaves room for
# iteration stopping criteria while still catching any fp32 intermediate (~1e-7) or a
# loosely converged solver.
RTOL64 = 1e-12
# "ours equals 1/p" for the saturation flag: within 8 ulp of the exact 1/p (allows exp(-log p)
# or 1/exp(log p) evaluated in the output dtype).
FLAG32 = 8 * torch.finfo(torch.float32).eps
FLAG64 = 8 * torch.finfo(torch.float64).eps
TINY32 = torch.finfo(torch.float32).tiny
TINY64 = torch.finfo(torch.float64).tiny


def _grid64(n_low: int = 100, n_high: int = 50) -> list[float]:
    """log p for p log-spaced on [1e-20, 1 - 1e-6].

    Plain log spacing in p would put almost no points where 1 - p is small (upper saturation,
    tv above 1 - delta, ...), so the grid is log-spaced in p on [1e-20, 1/2] and log-spaced in
    1 - p on [1/2, 1 - 1e-6]. Extra points: p = 1 exactly (log p = 0), p = 1 - 1e-7, p = 1e-30.
    """
    half = math.log10(2)
    lo = [math.log(10.0 ** (-20 + (20 - half) * i / (n_low - 1))) for i in range(n_low)]
    hi = [math.log1p(-(10.0 ** (-half - (6 - half) * i / (n_high - 1)))) for i in range(n_high)]
    return sorted(set(lo + hi[1:] + [0.0, math.log1p(-1e-7), math.log(1e-30)]))


GRID32 = sorted(set(torch.tensor(_grid64(), dtype=torch.float32).tolist()))
# fp64: every third fp32 grid point (exact in fp64, so the oracle cache is shared) plus points
# only fp64 resolves: p = 1 - 1e-12 and p = exp(-200).
GRID64 = sorted(set(GRID32[::3] + [0.0, math.log1p(-1e-7), math.log1p(-1e-12), math.log(1e-30), -200.0]))


def _run(log_ps: list[float], dtype: torch.dtype, div: str, delta: float, **kw):
    x = torch.tensor(log_ps, dtype=dtype)
    lo, up = band_bounds(x, div, delta, **kw)
    return lo.tolist(), up.tolist()


def _report(fails: list[str]) -> None:
    if fails:
        shown = "\n".join(fails[:25])
        pytest.fail(f"{len(fails)} mismatches vs the 60-digit oracle:\n{shown}", pytrace=False)


# ----------------------------------------------------------------------------------------------
# the oracle itself (cheap; guards the ground truth the rest relies on)
# ----------------------------------------------------------------------------------------------
# band-math.md "Exact values" table, delta = 0.05, 7 significant digits; None = saturated edge
# whose value is then 0 or 1/p. Used only to sanity-check the oracle.
PAPER_TABLE = {
    "0.001": {"kl": (7.099024e-23, 53.54809), "tv": (0, 51), "chi2": (0, 8.067531)},
    "0.01": {"kl": (0.002497386, 7.809846), "tv": (0, 6), "chi2": (0, 3.224860)},
    "0.1": {"kl": (0.3127840, 2.200786), "tv": (0.5, 1.5), "chi2": (0.3291796, 1.670820)},
    "0.5": {"kl": (0.6915157, 1.308484), "tv": (0.9, 1.1), "chi2": (0.7763932, 1.223607)},
    "0.9": {"kl": (0.8665793, 1.076357), "tv": (0.9444444, 1.055556), "chi2": (0.9254644, 1.074536)},
    "0.99": {"kl": (0.9312137, 1.010076), "tv": (0.9494949, 1.010101), "chi2": (0.9775267, 1.010101)},
}


def test_oracle_matches_design_table():
    for p, row in PAPER_TABLE.items():
        for div, (want_lo, want_up) in row.items():
            lo, up, sat_lo, sat_up = X.exact_bounds_at_p(div, p, 0.05)
            for got, want in ((lo, want_lo), (up, want_up)):
                if want == 0:
                    assert got == 0, (p, div)
                else:  # 7 significant digits => relative half-unit 5e-7
                    assert abs(got - want) <= 5.1e-7 * want, (p, div, mpmath.nstr(got, 10), want)
    # saturation annotations of the table (and Prop. 3 examples): tv/chi2 upper at p = 0.99
    assert X.exact_bounds_at_p("tv", "0.99", 0.05)[3] and X.exact_bounds_at_p("chi2", "0.99", 0.05)[3]
    assert X.exact_bounds_at_p("tv", "0.01", 0.05)[2] and not X.exact_bounds_at_p("kl", "0.001", 0.05)[2]


@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_oracle_roots_solve_g(div):
    """Oracle roots satisfy g = delta (bracketed at 1e-40 relative in r), lie on the right side of
    1, and the tv / chi2 ones equal the closed forms r = 1 -+ delta/p, 1 -+ sqrt(delta(1-p)/p)."""
    for delta in (1e-3, 0.05, 1.0):
        for log_p in (-40.0, -6.9, -2.3, -0.7, -0.05, -1e-5):
            lo, up, sat_lo, sat_up = X.exact_bounds(div, log_p, delta)
            with mpmath.workdps(120):
                p, pbar = mpmath.exp(mpf(log_p)), -mpmath.expm1(mpf(log_p))
                eps = mpf(10) ** -40
                for r, sat, side in ((lo, sat_lo, -1), (up, sat_up, 1)):
                    if sat:
                        edge = X.g(div, p, 0, pbar=pbar) if side < 0 else X.edge_g(div, log_p)[1]
                        assert edge <= delta
                        continue
                    assert (r < 1) if side < 0 else (r > 1)
                    a = X.g(div, p, r * (1 - eps), pbar=pbar, dps=120) - delta
                    b = X.g(div, p, r * (1 + eps), pbar=pbar, dps=120) - delta
                    assert a * b <= 0, (div, delta, log_p, side)
                if div in ("tv", "chi2"):
                    w = delta / p if div == "tv" else mpmath.sqrt(delta * pbar / p)
                    want_lo = max(1 - w, mpf(0))
                    want_up = min(1 + (delta / p if div == "tv" else w), 1 / p)
                    assert abs(lo - want_lo) <= mpf(10) ** -50
                    assert abs(up - want_up) <= mpf(10) ** -50 * want_up


def test_oracle_p1_limit_and_infinite_logp():
    for div in EXPECTED_DIVERGENCES:
        for delta in DELTAS:
            lim = X.exact_bounds(div, 0.0, delta)
            near = X.exact_bounds(div, -1e-200, delta)
            assert lim[1] == 1 and lim[3]
            # reverse_kl tends to 1 only like 1 - delta / log(1/(1-p)); the others are O(1-p).
            tol = 1e-2 if div == "reverse_kl" else 1e-80
            assert abs(lim[0] - near[0]) <= tol, (div, delta)
        assert X.exact_bounds(div, -math.inf, 0.05) == (0, mpmath.inf, True, True)
    # the kl lower root at p = 1e-20 is exp(-~5e18): check g(r) = delta through log r directly
    lo = X.exact_bounds("kl", math.log(1e-20), 0.05)[0]
    assert 0 < lo and mpmath.log(lo) < -4.9e18


# ----------------------------------------------------------------------------------------------
# API surface
# ----------------------------------------------------------------------------------------------
def test_divergence_names():
    assert isinstance(DIVERGENCES, tuple)
    assert {"kl", "tv", "chi2", "reverse_kl", "hellinger"} <= set(DIVERGENCES)  # the paper's five stay


def test_the_oracle_covers_every_divergence():
    """A divergence added to the registry is held to the mpmath oracle: add its f, g and edges to
    tests/support/band_exact.py (from the paper's definitions, not from our code)."""
    missing = sorted(set(DIVERGENCES) - set(X.DIVERGENCES))
    assert missing == [], f"{missing}: add them to tests/support/band_exact.py (docs/architecture.md)"


# ----------------------------------------------------------------------------------------------
# grid accuracy
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_fp32_grid(div, delta):
    lo, up = _run(GRID32, torch.float32, div, delta)
    # Saturation flags are compared everywhere except at genuine ties, i.e. points whose
    # g(p, edge) lies within 1e-9 relative of delta (there the edge and the root coincide and
    # either answer is right up to rounding); check_against_oracle implements that exclusion.
    _report(
        X.check_against_oracle(div, delta, GRID32, lo, up, rtol=RTOL32, flag_rtol=FLAG32, tiny=TINY32, tie_rtol=1e-9)
    )


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_fp64_grid(div, delta):
    lo, up = _run(GRID64, torch.float64, div, delta)
    _report(
        X.check_against_oracle(div, delta, GRID64, lo, up, rtol=RTOL64, flag_rtol=FLAG64, tiny=TINY64, tie_rtol=1e-9)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_half_inputs_fp32_accuracy(div, dtype):
    """fp16/bf16 inputs give fp32 bounds as accurate as fp32 inputs (at the exact half value)."""
    x = torch.tensor(GRID32[::4] + [0.0], dtype=dtype)
    lo, up = band_bounds(x, div, 0.05)
    assert lo.dtype == torch.float32 and up.dtype == torch.float32
    log_ps = x.float().tolist()  # exact: half -> fp32 is lossless
    _report(
        X.check_against_oracle(div, 0.05, log_ps, lo.tolist(), up.tolist(), rtol=RTOL32, flag_rtol=FLAG32, tiny=TINY32)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_design_table_delta_005(dtype):
    """The band-math.md table points (delta = 0.05) to 6 significant digits (quick look); the
    expected values come from the oracle at the exact input value. fp64 input: 6 digits even for
    the 7e-23 kl lower bound; fp32 input: 6 digits above 1e-3, 1e-9 absolute below."""
    divs = EXPECTED_DIVERGENCES
    ps = [0.001, 0.01, 0.1, 0.5, 0.9, 0.99]
    x = torch.tensor([math.log(p) for p in ps], dtype=dtype)
    floor = 1e-300 if dtype == torch.float64 else 1e-3
    fails = []
    for div in divs:
        lo, up = band_bounds(x, div, 0.05)
        for log_p, a, b in zip(x.tolist(), lo.tolist(), up.tolist(), strict=True):
            ex_lo, ex_up, _, _ = X.exact_bounds(div, log_p, 0.05)
            for name, ours, ex in (("lower", a, ex_lo), ("upper", b, ex_up)):
                if not abs(mpf(ours) - ex) <= 1e-6 * max(ex, mpf(floor)):
                    exact = mpmath.nstr(ex, 10)
                    fails.append(f"{div} p={math.exp(log_p):.6g} {name}: ours={ours!r} exact={exact}")
    _report(fails)


# ----------------------------------------------------------------------------------------------
# edge semantics
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_minus_inf_logp(div, dtype):
    x = torch.tensor([-math.inf, -1.0, -math.inf], dtype=dtype)
    lo, up = band_bounds(x, div, 0.05)
    assert lo[0].item() == 0 and lo[2].item() == 0
    assert up[0].item() == math.inf and up[2].item() == math.inf
    lo_c, up_c = band_bounds(x, div, 0.05, upper_cap=10.0)
    assert lo_c[0].item() == 0 and up_c[0].item() == 10.0
    ex = X.exact_bounds(div, -1.0, 0.05)
    rtol = RTOL32 if dtype == torch.float32 else RTOL64
    assert abs(mpf(lo[1].item()) - ex[0]) <= rtol * max(ex[0], mpf(1e-3))
    assert abs(mpf(up[1].item()) - ex[1]) <= rtol * ex[1]
    assert abs(mpf(up_c[1].item()) - min(ex[1], 10)) <= rtol * 10


@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_slightly_positive_logp_is_p_equal_1(div):
    """log p a hair above 0 (rounding in log_softmax) behaves exactly like log p = 0."""
    for dtype, vals, rtol in (
        (torch.float32, [1e-7, 1.1920929e-07, 0.0], RTOL32),
        (torch.float64, [1e-12, 2.220446049250313e-16, 1e-300, 0.0], RTOL64),
    ):
        for delta in (0.05, 1.0):
            lo, up = band_bounds(torch.tensor(vals, dtype=dtype), div, delta)
            ex_lo, ex_up, _, _ = X.exact_bounds(div, 0.0, delta)
            for a, b in zip(lo.tolist(), up.tolist(), strict=True):
                assert abs(mpf(a) - ex_lo) <= rtol * max(ex_lo, mpf(1e-3)), (dtype, delta, a, ex_lo)
                assert abs(b - 1.0) <= rtol, (dtype, delta, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_nan_isolated(div, dtype):
    vals = [math.nan, -2.0, math.nan, -0.5, -math.inf, 0.0, -30.0]
    x = torch.tensor(vals, dtype=dtype)
    for kw in ({}, {"upper_cap": 10.0}, {"relax": (0.2, 0.28)}, {"relax": (0.2, 0.28), "upper_cap": 10.0}):
        lo, up = band_bounds(x, div, 0.05, **kw)
        nan_lo, nan_up = torch.isnan(lo).tolist(), torch.isnan(up).tolist()
        want = [math.isnan(v) for v in vals]
        assert nan_lo == want and nan_up == want, (kw, lo, up)
    lo, up = band_bounds(x, div, 0.05)
    keep = [i for i, v in enumerate(vals) if not math.isnan(v) and v != -math.inf]
    rtol, flag, tiny = (RTOL32, FLAG32, TINY32) if dtype == torch.float32 else (RTOL64, FLAG64, TINY64)
    _report(
        X.check_against_oracle(
            div,
            0.05,
            [vals[i] for i in keep],
            [lo[i].item() for i in keep],
            [up[i].item() for i in keep],
            rtol=rtol,
            flag_rtol=flag,
            tiny=tiny,
        )
    )
    assert lo[4].item() == 0 and up[4].item() == math.inf


@pytest.mark.parametrize(
    "dtype,out",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_dtypes(dtype, out):
    x = torch.tensor([-3.0, -0.25, 0.0, -math.inf], dtype=dtype)
    for div in EXPECTED_DIVERGENCES:
        lo, up = band_bounds(x, div, 0.05)
        assert lo.dtype == out and up.dtype == out, (div, dtype, lo.dtype, up.dtype)
        assert lo.device == x.device and up.device == x.device
        log_ps = x.double().tolist()
        for log_p, a, b in zip(log_ps[:3], lo.tolist()[:3], up.tolist()[:3], strict=True):
            ex_lo, ex_up, _, _ = X.exact_bounds(div, log_p, 0.05)
            rtol = RTOL64 if out == torch.float64 else RTOL32
            assert abs(mpf(a) - ex_lo) <= rtol * max(ex_lo, mpf(1e-3)), (div, dtype, log_p)
            assert abs(mpf(b) - ex_up) <= rtol * ex_up, (div, dtype, log_p)


@pytest.mark.parametrize("shape", [(3, 47), (), (0,), (2, 0, 5)])
def test_shape_preserved(shape):
    gen = torch.Generator().manual_seed(0)
    x = -torch.rand(shape, generator=gen, dtype=torch.float64) * 25.0
    for div in EXPECTED_DIVERGENCES:
        lo, up = band_bounds(x, div, 0.05)
        assert tuple(lo.shape) == shape and tuple(up.shape) == shape, (div, lo.shape)
        flat_x, flat_lo, flat_up = x.reshape(-1), lo.reshape(-1), up.reshape(-1)
        idx = list(range(0, flat_x.numel(), 17))  # a spread of elements, checked against the oracle
        _report(
            X.check_against_oracle(
                div,
                0.05,
                [flat_x[i].item() for i in idx],
                [flat_lo[i].item() for i in idx],
                [flat_up[i].item() for i in idx],
                rtol=RTOL64,
                flag_rtol=FLAG64,
                tiny=TINY64,
            )
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_grad(dtype):
    x = torch.tensor([-0.1, -2.0, -9.0], dtype=dtype, requires_grad=True)
    y = x * 1.0  # non-leaf with a grad_fn, as old log-probs would be if not detached
    for inp in (x, y):
        for div in EXPECTED_DIVERGENCES:
            for kw in ({}, {"upper_cap": 10.0, "relax": (0.2, 0.28)}):
                lo, up = band_bounds(inp, div, 0.05, **kw)
                assert not lo.requires_grad and not up.requires_grad
                assert lo.grad_fn is None and up.grad_fn is None


@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_upper_cap(div):
    log_ps = [math.log(p) for p in (1e-6, 1e-3, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999)] + [0.0]
    x = torch.tensor(log_ps, dtype=torch.float64)
    for cap in (10.0, 3.0, 1.5, 1.0):
        lo, up = band_bounds(x, div, 0.05, upper_cap=cap)
        for log_p, a, b in zip(log_ps, lo.tolist(), up.tolist(), strict=True):
            ex_lo, ex_up, _, _ = X.exact_bounds(div, log_p, 0.05)
            want_up = min(ex_up, mpf(cap))
            assert abs(mpf(b) - want_up) <= RTOL64 * want_up, (div, cap, log_p, b, mpmath.nstr(want_up, 12))
            assert abs(mpf(a) - ex_lo) <= RTOL64 * max(ex_lo, mpf(1e-3)), (div, cap, log_p, a)
            assert b <= cap


@pytest.mark.parametrize("div", EXPECTED_DIVERGENCES)
def test_relax_union_then_cap(div):
    """relax=(eps_low, eps_high): [min(r_low, 1 - eps_low), max(r_up, 1 + eps_high)], then the cap."""
    log_ps = [math.log(p) for p in (1e-4, 0.01, 0.1, 0.5, 0.9, 0.99, 0.9999)] + [0.0, -math.inf]
    x = torch.tensor(log_ps, dtype=torch.float64)
    for relax, cap in (((0.2, 0.28), None), ((0.2, 0.28), 10.0), ((0.2, 0.28), 1.1), ((0.0, 0.0), None)):
        eps_low, eps_high = relax
        lo, up = band_bounds(x, div, 0.05, relax=relax, upper_cap=cap)
        for log_p, a, b in zip(log_ps, lo.tolist(), up.tolist(), strict=True):
            ex_lo, ex_up, _, _ = X.exact_bounds(div, log_p, 0.05)
            want_lo = min(ex_lo, mpf(1) - mpf(eps_low))
            want_up = max(ex_up, mpf(1) + mpf(eps_high))
            if cap is not None:
                want_up = min(want_up, mpf(cap))
            where = (div, relax, cap, log_p, a, b)
            assert abs(mpf(a) - want_lo) <= RTOL64 * max(want_lo, mpf(1e-3)), where
            if want_up == mpmath.inf:
                assert b == math.inf, where
            else:
                assert abs(mpf(b) - want_up) <= RTOL64 * want_up, where


def test_unknown_divergence_lists_valid_names():
    x = torch.tensor([-1.0])
    with pytest.raises(ValueError) as info:
        band_bounds(x, "jensen_shannon", 0.05)
    msg = str(info.value)
    for name in EXPECTED_DIVERGENCES:
        assert name in msg, msg


@pytest.mark.parametrize("delta", [0.0, -0.1, -math.inf, math.inf, math.nan])
def test_bad_delta(delta):
    for div in EXPECTED_DIVERGENCES:
        with pytest.raises(ValueError):
            band_bounds(torch.tensor([-1.0]), div, delta)


@pytest.mark.parametrize("cap", [0.5, 0.999, 0.0, -3.0])
def test_bad_upper_cap(cap):
    with pytest.raises(ValueError):
        band_bounds(torch.tensor([-1.0]), "kl", 0.05, upper_cap=cap)


@pytest.mark.parametrize(
    "relax",
    [(0.1,), (0.1, 0.2, 0.3), (), (-0.1, 0.2), (0.1, -0.2), ("a", 0.2), (0.1, None), ("0.1", "0.2")],
)
def test_bad_relax(relax):
    with pytest.raises(ValueError):
        band_bounds(torch.tensor([-1.0]), "kl", 0.05, relax=relax)


@pytest.mark.parametrize(
    "delta, cap", [(np.float32(0.05), np.float64(10.0)), (np.float64(0.05), np.int64(10)), (Fraction(1, 20), 10)]
)
def test_any_real_number_type_is_accepted(delta, cap):
    x = torch.tensor([-1.0])
    lower, upper = band_bounds(x, "kl", delta, upper_cap=cap, relax=(np.float32(0.2), 0.2))
    want_lower, want_upper = band_bounds(x, "kl", float(delta), upper_cap=float(cap), relax=(0.2, 0.2))
    # exact: the same values reach the same code (float(np.float32(0.2)) is 0.2 + 3e-9, but 1 -+ it
    # rounds to the same float32 as 1 -+ 0.2: IEEE-rounded arithmetic, the same on every CPU)
    assert torch.equal(lower, want_lower) and torch.equal(upper, want_upper)


@pytest.mark.parametrize("bad", [True, False, np.True_, "0.05", None])
def test_bools_and_strings_are_refused_with_value_error(bad):
    with pytest.raises(ValueError):
        band_bounds(torch.tensor([-1.0]), "kl", bad)
    if bad is not None:
        with pytest.raises(ValueError):
            band_bounds(torch.tensor([-1.0]), "kl", 0.05, upper_cap=bad)
    with pytest.raises(ValueError):  # a tensor is a per-token delta, but never a cap
        band_bounds(torch.tensor([-1.0]), "kl", 0.05, upper_cap=torch.tensor(10.0))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_both_loss_backends_validate_delta_even_with_given_bounds(backend, monkeypatch):
    from openrlhf_band import functional

    monkeypatch.setattr(functional, "_triton_usable", lambda device: True)  # validation comes first
    x = torch.zeros(2, 3)
    for bad in (-1.0, True, "0.05"):
        with pytest.raises(ValueError, match="delta"):
            functional.band_token_loss(x, x, x, delta=bad, backend=backend, bounds=(0.8, 1.2))
    with pytest.raises(ValueError, match="dual_clip"):
        functional.band_token_loss(x, x, x, dual_clip=True, backend=backend)


def test_dcpo_takes_real_numbers_and_refuses_bools_and_strings():
    from openrlhf_band.band.dcpo import dcpo_bounds

    x = torch.tensor([-1.0, -3.0])
    numpy_typed = dcpo_bounds(x, np.float32(0.16), np.float64(0.2), np.int64(10))
    assert torch.equal(numpy_typed[1], dcpo_bounds(x, 0.16, 0.2, 10)[1])
    for kwargs in ({"eps_low": True}, {"eps_high": "0.2"}, {"upper_cap": "10"}, {"upper_cap": True}):
        with pytest.raises(ValueError):
            dcpo_bounds(x, **kwargs)
