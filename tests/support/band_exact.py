"""High-precision ground truth for the Band operator bounds.

Written from the band's definition below (the BandPO paper's trust region, as docs/operator.md
states it) alone; it does not import ``openrlhf_band``.

For old probability p of the sampled token and a convex generator f with f(1) = 0 the band is
the set of ratios r in [0, 1/p] with

    g_f(p, r) = p f(r) + (1 - p) f(c) <= delta,    c = (1 - r p) / (1 - p).

Everything here runs under a local ``mpmath.workdps`` context (at least 60 digits, more when p
or 1 - p is tiny), so the global mpmath precision is never changed.

How the roots are found
-----------------------
Only one solver exists: the *lower* root, in the variable t = log r in (-inf, 0), for a pair
(p, pbar = 1 - p) passed separately (pbar = -expm1(log p) is exact even when p ~ 1). With
x = c - 1 = p (1 - e^t) / pbar, every term is written without cancellation (expm1, log1p):

    G(t)  = p f(e^t) + pbar f(1 + x)
    G'(t) = p (r f'(r) - r f'(c))          (r = e^t; dc/dr = -p / pbar)

G decreases strictly from G(-inf) = p f(0) + pbar f(1/pbar) to G(0) = 0. If G(-inf) <= delta
the lower bound saturates to exactly 0 (Proposition 3); otherwise a bracket [a, b] with
G(a) > delta >= G(b) is grown geometrically and the root is polished by a bracketed Newton
iteration (bisection whenever Newton leaves the bracket) down to ~10^-(dps-10) relative in t.
Working in t keeps roots like exp(-5e18) (kl, p = 1e-20) exact to all digits.

The upper root uses the mirror identity: (p, r) and (1 - p, c) give the same g, so the upper
root's c is the lower root of the mirrored pair (pbar, p); then
r_up = (1 - pbar c) / p = 1 + pbar (1 - c) / p, again without cancellation (roots within
1e-1000 of 1/p are resolved). Saturation of the mirrored lower edge is exactly
g(p, 1/p) <= delta.
"""

from __future__ import annotations

import functools
import math

import mpmath
from mpmath import mpf

DIVERGENCES = ("kl", "tv", "chi2", "reverse_kl", "hellinger")
BASE_DPS = 60
# The oracle refuses p below exp(-2000): the working precision grows like log10(1/p).
MIN_LOG_P = -2000.0


# --------------------------------------------------------------------------------------------
# generators on the plain variable u (used by g and the edge values)
# --------------------------------------------------------------------------------------------
def f(div: str, u) -> mpf:
    """Generator f(u) for u >= 0, with u = 0 as the limit (kl: +inf; reverse_kl: 0 log 0 = 0).

    Uses the caller's mpmath precision.
    """
    u = mpf(u)
    if u < 0:
        raise ValueError(f"f is defined for u >= 0, got {u}")
    if div == "kl":
        return mpmath.inf if u == 0 else -mpmath.log(u) + u - 1
    if div == "tv":
        return abs(u - 1) / 2
    if div == "chi2":
        return (u - 1) ** 2
    if div == "reverse_kl":
        return mpf(1) if u == 0 else u * mpmath.log(u) - u + 1
    if div == "hellinger":
        return (mpmath.sqrt(u) - 1) ** 2
    raise ValueError(f"unknown divergence {div!r}")


def _f_at_zero(div: str) -> mpf:
    return f(div, 0)


def g(div: str, p, r, *, pbar=None, dps: int = BASE_DPS + 40) -> mpf:
    """g_f(p, r) = p f(r) + (1 - p) f((1 - r p) / (1 - p)) at >= ``dps`` digits.

    r = 0 and c = 0 (r = 1/p) use the limits f(0). A point outside the simplex (r < 0 or
    r > 1/p, i.e. c < 0) returns +inf: no Q exists there. Pass ``pbar`` = 1 - p when p is close
    to 1 (computed as -expm1(log p)) to avoid the cancellation in 1 - p. For evaluating g exactly
    at r = 1/p use :func:`edge_g`, since a rounded 1/p may fall just outside the simplex.
    """
    with mpmath.workdps(max(dps, BASE_DPS)):
        p = mpf(p)
        r = mpf(r)
        pbar = 1 - p if pbar is None else mpf(pbar)
        if not (0 < p and 0 < pbar):
            raise ValueError("g needs 0 < p < 1")
        if r < 0:
            return mpmath.inf
        c = (1 - r * p) / pbar
        if c < 0:
            return mpmath.inf
        return p * f(div, r) + pbar * f(div, c)


# --------------------------------------------------------------------------------------------
# cancellation-free pieces in t = log r and x = c - 1
# --------------------------------------------------------------------------------------------
def _exp_pair(t: mpf) -> tuple[mpf, mpf]:
    """(e^t, e^t - 1); plain subtraction is used once |t| > 1/64 (it then costs < 2 of the
    >= 25 spare digits), mpmath.expm1 (slower) near t = 0."""
    e = mpmath.exp(t)
    return e, (e - 1 if abs(t) > mpf(1) / 64 else mpmath.expm1(t))


def _fc(div: str, x: mpf) -> mpf:
    """f(1 + x) without cancellation (x > -1)."""
    if div == "kl":
        return x - mpmath.log1p(x)
    if div == "tv":
        return abs(x) / 2
    if div == "chi2":
        return x * x
    if div == "reverse_kl":
        return (1 + x) * mpmath.log1p(x) - x
    if div == "hellinger":
        return (x / (mpmath.sqrt(1 + x) + 1)) ** 2
    raise ValueError(f"unknown divergence {div!r}")


def _G_and_slope(div: str, t: mpf, p: mpf, pbar: mpf) -> tuple[mpf, mpf]:
    """G(t) = p f(r) + pbar f(1 + x) and G'(t) = p (r f'(r) - r f'(1 + x)), r = e^t,
    x = p (1 - r) / pbar, every term free of cancellation for t < 0."""
    if div == "hellinger":
        h, hm1 = _exp_pair(t / 2)  # sqrt(r), sqrt(r) - 1
        r, em1 = h * h, hm1 * (h + 1)
    else:
        r, em1 = _exp_pair(t)
    x = p * (-em1) / pbar
    if div == "kl":  # f(r) = r - 1 - log r; r f'(r) = r - 1; f'(1 + x) = x / (1 + x)
        fr, rdfr, dfc = em1 - t, em1, x / (1 + x)
    elif div == "tv":  # f(r) = |r - 1| / 2; r f'(r) = -r / 2 (r < 1); f'(1 + x) = 1/2 (x > 0)
        fr, rdfr, dfc = -em1 / 2, -r / 2, mpf(1) / 2
    elif div == "chi2":  # f(r) = (r - 1)^2; r f'(r) = 2 r (r - 1); f'(1 + x) = 2 x
        fr, rdfr, dfc = em1 * em1, 2 * r * em1, 2 * x
    elif div == "reverse_kl":  # f(r) = r log r - r + 1; r f'(r) = r log r; f'(1 + x) = log1p(x)
        fr, rdfr, dfc = t * r - em1, t * r, mpmath.log1p(x)
    elif div == "hellinger":  # f(r) = (sqrt r - 1)^2; r f'(r) = r - sqrt r; f'(1+x) = 1 - 1/sqrt(1+x)
        sq = mpmath.sqrt(1 + x)
        fr, rdfr, dfc = hm1 * hm1, h * hm1, x / ((sq + 1) * sq)
    else:
        raise ValueError(f"unknown divergence {div!r}")
    return p * fr + pbar * _fc(div, x), p * (rdfr - r * dfc)


# f''(1): kl 1, chi2 2, reverse_kl 1, hellinger 1/2 (tv has a kink at 1: no quadratic model).
_F2_AT_1 = {"kl": mpf(1), "chi2": mpf(2), "reverse_kl": mpf(1), "hellinger": mpf(1) / 2}


def _lower_edge_value(div: str, p: mpf, pbar: mpf) -> mpf:
    """G(-inf) = g(p, 0) = p f(0) + pbar f(1/pbar), with f(1/pbar) = f(1 + p/pbar)."""
    f0 = _f_at_zero(div)
    if f0 == mpmath.inf:
        return mpmath.inf
    return p * f0 + pbar * _fc(div, p / pbar)


def _lower_log_root(div: str, p: mpf, pbar: mpf, delta: mpf, tol: mpf):
    """log of the lower root of g(p, r) = delta for the pair (p, pbar); None when saturated."""
    if _lower_edge_value(div, p, pbar) <= delta:
        return None

    def h(t):
        return _G_and_slope(div, t, p, pbar)[0] - delta

    # Bracket: h(b) <= 0 (h(0) = -delta), h(a) > 0. For kl, t = -(1 + delta/p) always
    # brackets: G(t) >= p (e^t - 1 - t) = p e^t + delta > delta there.
    b = mpf(0)
    a = -(1 + delta / p) if div == "kl" else mpf(-1)
    for _ in range(100000):
        if h(a) > 0:
            break
        b = a
        a = 2 * a
    else:  # pragma: no cover - G(-inf) > delta guarantees termination
        raise RuntimeError("could not bracket the lower root")

    # Start from the quadratic model g ~ (f''(1)/2) (p/pbar) t^2 near r = 1 when it falls in the
    # bracket (saves the ~log2(1/|t|) damped Newton steps when the root hugs t = 0); the
    # bracketed iteration below does not depend on the guess for correctness.
    x = (a + b) / 2
    curv = _F2_AT_1.get(div)
    if curv is not None:
        t0 = -mpmath.sqrt(2 * delta * pbar / (curv * p))
        if a < t0 < b:
            x = t0
    for _ in range(5000):
        gx, d = _G_and_slope(div, x, p, pbar)
        hx = gx - delta
        if hx == 0:
            return x
        if hx > 0:
            a = x
        else:
            b = x
        xn = x - hx / d if d != 0 else None
        # Converged: the Newton correction is below tolerance (it may land on, or a rounding
        # hair outside, the bracket end just moved to x; then x itself is the answer).
        if xn is not None and abs(xn - x) <= tol * max(1, abs(x)):
            return xn if a <= xn <= b else x
        if xn is None or not (a < xn < b):
            xn = (a + b) / 2
        scale = max(1, abs(xn))
        if (b - a) <= tol * scale:
            return xn
        x = xn
    raise RuntimeError(f"lower root did not converge ({div}, p={mpmath.nstr(p, 10)})")


# --------------------------------------------------------------------------------------------
# public oracle
# --------------------------------------------------------------------------------------------
def _check_delta(delta) -> None:
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a finite positive number, got {delta!r}")


def p1_lower_limit(div: str, delta: mpf) -> mpf:
    """lim_{p -> 1} r_low(p). The upper bound there is 1 (= 1/p).

    With c ~ (1 - r)/(1 - p) -> inf for fixed r < 1: (1 - p) f(c) -> (1 - r) * lim f(c)/c.
      kl:        f(c)/c -> 1        => g -> -log r + r - 1 + 1 - r = -log r      => r = e^-delta
      tv:        f(c)/c -> 1/2      => g -> (1 - r)/2 + (1 - r)/2 = 1 - r        => r = 1 - delta
      chi2, reverse_kl: f(c)/c -> inf => any r < 1 leaves the region              => r = 1
      hellinger: f(c)/c -> 1        => g -> (sqrt r - 1)^2 + 1 - r = 2 - 2 sqrt r => (1 - delta/2)^2
    tv and hellinger saturate at 0 once delta >= 1 resp. 2 (g(1, 0) = 1 resp. 2).
    """
    if div == "kl":
        return mpmath.exp(-delta)
    if div == "tv":
        return 1 - delta if delta < 1 else mpf(0)
    if div in ("chi2", "reverse_kl"):
        return mpf(1)
    if div == "hellinger":
        return (1 - delta / 2) ** 2 if delta < 2 else mpf(0)
    raise ValueError(f"unknown divergence {div!r}")


def _dps_for(min_p_log10: float, delta: float) -> int:
    """Digits so that t = log r (|t| up to ~ (1 + delta) / min(p, 1 - p)) keeps >= 60 digits
    after the cancellations of size ~1/delta inside f near r = 1."""
    t_digits = max(0.0, min_p_log10 + math.log10(1 + delta))
    loss = max(0.0, -math.log10(delta))
    return BASE_DPS + 25 + math.ceil(t_digits) + math.ceil(loss)


def _p_pair(log_p: float):
    """(p, pbar) from an exact float log p < 0, at the current precision."""
    lp = mpf(log_p)
    return mpmath.exp(lp), -mpmath.expm1(lp)


def _min_p_log10(log_p: float) -> float:
    if log_p < -math.log(2):
        return -log_p / math.log(10)
    return -math.log10(-math.expm1(log_p))


def _bounds_pair(div: str, p: mpf, pbar: mpf, delta: mpf, dps: int):
    tol = mpf(10) ** (-(dps - 10))
    t = _lower_log_root(div, p, pbar, delta, tol)
    if t is None:
        lower, sat_lower = mpf(0), True
    else:
        lower, sat_lower = mpmath.exp(t), False
    s = _lower_log_root(div, pbar, p, delta, tol)  # log of c at the upper root (mirror)
    if s is None:
        upper, sat_upper = 1 / p, True
    else:
        upper, sat_upper = 1 + pbar * (-mpmath.expm1(s)) / p, False
    return lower, upper, sat_lower, sat_upper


@functools.cache
def exact_bounds(div: str, log_p: float, delta: float):
    """(lower, upper, sat_lower, sat_upper) for p = exp(log_p) with the exact binary value of the
    float ``log_p`` (and of ``delta``).

    lower/upper are mpf (correct to > 50 digits); sat_lower means lower == 0 exactly
    (g(p, 0) <= delta), sat_upper means upper == 1/p exactly (g(p, 1/p) <= delta).
    log_p = 0 is the p -> 1 limit; log_p = -inf gives [0, +inf] (both saturated).
    """
    if div not in DIVERGENCES:
        raise ValueError(f"unknown divergence {div!r}")
    _check_delta(delta)
    log_p = float(log_p)
    if math.isnan(log_p) or log_p > 0:
        raise ValueError(f"oracle needs log_p <= 0, got {log_p!r}")
    if log_p == -math.inf:
        return mpf(0), mpmath.inf, True, True
    if log_p < MIN_LOG_P:
        raise ValueError(f"oracle supports log_p >= {MIN_LOG_P}, got {log_p!r}")
    if log_p == 0:
        with mpmath.workdps(BASE_DPS + 25):
            lower = p1_lower_limit(div, mpf(delta))
            return lower, mpf(1), lower == 0, True
    dps = _dps_for(_min_p_log10(log_p), delta)
    with mpmath.workdps(dps):
        p, pbar = _p_pair(log_p)
        return _bounds_pair(div, p, pbar, mpf(delta), dps)


def exact_bounds_at_p(div: str, p, delta: float):
    """Same as :func:`exact_bounds` for an exactly given p in (0, 1) (e.g. the string '0.001')."""
    _check_delta(delta)
    with mpmath.workdps(BASE_DPS + 40):
        p_m = mpf(p)
        if not (0 < p_m < 1):
            raise ValueError("p must be in (0, 1)")
        min_log10 = float(-mpmath.log10(min(p_m, 1 - p_m)))
    dps = _dps_for(min_log10, delta)
    with mpmath.workdps(dps):
        p_m = mpf(p)
        return _bounds_pair(div, p_m, 1 - p_m, mpf(delta), dps)


def inv_p(log_p: float) -> mpf:
    """1/p = exp(-log_p) for the exact float log_p (the saturated upper bound)."""
    with mpmath.workdps(BASE_DPS + 25):
        return mpmath.exp(-mpf(log_p))


def p_pair(log_p: float, dps: int | None = None):
    """(p, 1 - p) as mpf for the exact float log_p < 0 (1 - p without cancellation)."""
    if dps is None:
        dps = _dps_for(_min_p_log10(log_p), 1.0)
    with mpmath.workdps(dps):
        return _p_pair(log_p)


def p1_edge_g(div: str) -> tuple[mpf, mpf]:
    """lim_{p -> 1} (g(p, 0), g(p, 1/p)): (f(0) + lim (1 - p) f(1/(1 - p)), 0)."""
    lim0 = {"kl": mpmath.inf, "tv": mpf(1), "chi2": mpmath.inf, "reverse_kl": mpmath.inf, "hellinger": mpf(2)}
    return lim0[div], mpf(0)


@functools.cache
def edge_g(div: str, log_p: float):
    """(g(p, 0), g(p, 1/p)) for the exact float log_p <= 0: the saturation tests of Prop. 3
    (log_p = 0 gives the p -> 1 limits)."""
    log_p = float(log_p)
    if log_p == 0:
        return p1_edge_g(div)
    dps = _dps_for(_min_p_log10(log_p), 1.0)
    with mpmath.workdps(dps):
        p, pbar = _p_pair(log_p)
        return _lower_edge_value(div, p, pbar), _lower_edge_value(div, pbar, p)


def g_at_log_p(div: str, log_p: float, r, *, extra_dps: int = 40) -> mpf:
    """g(p, r) for p = exp(log_p) (exact float log_p < 0) and r as float/mpf. r is clamped onto
    the simplex [0, 1/p] first (the edges use the exact limits of :func:`edge_g`), so a bound
    that rounds a hair past 1/p is judged by g(p, 1/p)."""
    log_p = float(log_p)
    dps = _dps_for(_min_p_log10(log_p), 1.0) + extra_dps
    with mpmath.workdps(dps):
        p, pbar = _p_pair(log_p)
        r = mpf(r)
        if r <= 0:
            return _lower_edge_value(div, p, pbar)
        if r * p >= 1:
            return _lower_edge_value(div, pbar, p)
        return g(div, p, r, pbar=pbar, dps=dps)


# --------------------------------------------------------------------------------------------
# comparison helper shared by the accuracy and property tests (takes plain floats: it never
# calls the implementation, it judges numbers produced by it)
# --------------------------------------------------------------------------------------------
def _fmt(x) -> str:
    if isinstance(x, mpf):
        return mpmath.nstr(x, 17)
    return repr(x)


def check_against_oracle(
    div: str,
    delta: float,
    log_ps,
    lowers,
    uppers,
    *,
    rtol: float,
    flag_rtol: float,
    tiny: float,
    floor: float = 1e-3,
    tie_rtol: float = 1e-9,
) -> list[str]:
    """Compare implementation outputs (floats) with the oracle; return failure descriptions.

    value:  |ours - exact| <= rtol * max(exact, floor) for both bounds.
    domain: 0 <= lower <= upper <= (1/p)(1 + flag_rtol), no NaN.
    flags (Prop. 3), skipped at genuine ties |g(p, edge) - delta| <= tie_rtol * delta:
      lower: exact saturated -> ours == 0 exactly; exact unsaturated and >= ``tiny`` (the
             smallest normal of the output dtype) -> ours > 0. Below ``tiny`` the exact lower
             bound underflows (kl at p = 1e-20 is exp(-5e18)) and 0 is the right output.
      upper: "ours saturated" means |ours - 1/p| <= flag_rtol / p. Exact saturated -> ours
             saturated; exact unsaturated with 1/p - exact > 2 (rtol + flag_rtol) / p -> ours not
             saturated. In between the root is closer to 1/p than the output precision resolves.
    """
    fails: list[str] = []
    for log_p, lo, up in zip(log_ps, lowers, uppers, strict=True):
        log_p, lo, up = float(log_p), float(lo), float(up)
        ex_lo, ex_up, sat_lo, sat_up = exact_bounds(div, log_p, delta)
        ip = inv_p(log_p)
        where = f"{div} delta={delta!r} log_p={log_p!r}"
        if math.isnan(lo) or math.isnan(up):
            fails.append(f"{where}: NaN output (lower={lo!r}, upper={up!r})")
            continue
        for name, ours, ex in (("lower", lo, ex_lo), ("upper", up, ex_up)):
            err = abs(mpf(ours) - ex)
            if not err <= rtol * max(ex, mpf(floor)):
                fails.append(
                    f"{where}: {name} ours={ours!r} exact={_fmt(ex)} "
                    f"rel_err={mpmath.nstr(err / max(ex, mpf(floor)), 3)} > {rtol}"
                )
        if not (0 <= lo <= up and up <= ip * (1 + flag_rtol)):
            fails.append(f"{where}: outside 0 <= lower <= upper <= 1/p: [{lo!r}, {up!r}], 1/p={_fmt(ip)}")
        g0, g1 = edge_g(div, log_p)
        tie_lo = g0 != mpmath.inf and abs(g0 - delta) <= tie_rtol * delta
        tie_up = g1 != mpmath.inf and abs(g1 - delta) <= tie_rtol * delta
        if not tie_lo:
            if sat_lo and lo != 0:
                fails.append(f"{where}: lower should saturate to exactly 0 (g(p,0)={_fmt(g0)}), ours={lo!r}")
            if not sat_lo and ex_lo >= tiny and not lo > 0:
                fails.append(f"{where}: lower reported saturated (0) but exact={_fmt(ex_lo)} is representable")
        if not tie_up:
            ours_sat = abs(mpf(up) - ip) <= flag_rtol * ip
            if sat_up and not ours_sat:
                fails.append(f"{where}: upper should saturate to 1/p={_fmt(ip)} (g(p,1/p)={_fmt(g1)}), ours={up!r}")
            if not sat_up and (ip - ex_up) > 2 * (rtol + flag_rtol) * ip and ours_sat:
                fails.append(f"{where}: upper reported saturated ({up!r}) but exact={_fmt(ex_up)}")
    return fails
