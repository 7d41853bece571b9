"""High-precision ground truth for the Band operator bounds.

Written from /work/shared/design/band-math.md alone; it does not import ``openrlhf_band``.

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
def _pieces(div: str):
    """(f(e^t), r f'(r) at r = e^t, f(1 + x), f'(1 + x)) for t < 0, x > 0."""
    exp, expm1, log1p, sqrt = mpmath.exp, mpmath.expm1, mpmath.log1p, mpmath.sqrt
    if div == "kl":
        return (
            lambda t: expm1(t) - t,
            lambda t: expm1(t),
            lambda x: x - log1p(x),
            lambda x: x / (1 + x),
        )
    if div == "tv":
        return (
            lambda t: abs(expm1(t)) / 2,
            lambda t: exp(t) * mpmath.sign(t) / 2,
            lambda x: abs(x) / 2,
            lambda x: mpmath.sign(x) / 2,
        )
    if div == "chi2":
        return (
            lambda t: expm1(t) ** 2,
            lambda t: 2 * exp(t) * expm1(t),
            lambda x: x**2,
            lambda x: 2 * x,
        )
    if div == "reverse_kl":
        return (
            lambda t: t * exp(t) - expm1(t),
            lambda t: t * exp(t),
            lambda x: (1 + x) * log1p(x) - x,
            lambda x: log1p(x),
        )
    if div == "hellinger":
        return (
            lambda t: expm1(t / 2) ** 2,
            lambda t: exp(t / 2) * expm1(t / 2),
            lambda x: (x / (sqrt(1 + x) + 1)) ** 2,
            lambda x: x / ((sqrt(1 + x) + 1) * sqrt(1 + x)),
        )
    raise ValueError(f"unknown divergence {div!r}")


def _lower_edge_value(div: str, p: mpf, pbar: mpf) -> mpf:
    """G(-inf) = g(p, 0) = p f(0) + pbar f(1/pbar), with f(1/pbar) = f(1 + p/pbar)."""
    _, _, fc, _ = _pieces(div)
    f0 = _f_at_zero(div)
    if f0 == mpmath.inf:
        return mpmath.inf
    return p * f0 + pbar * fc(p / pbar)


def _lower_log_root(div: str, p: mpf, pbar: mpf, delta: mpf, tol: mpf):
    """log of the lower root of g(p, r) = delta for the pair (p, pbar); None when saturated."""
    if _lower_edge_value(div, p, pbar) <= delta:
        return None
    fr, rdfr, fc, dfc = _pieces(div)

    def x_of(t):
        return p * (-mpmath.expm1(t)) / pbar

    def h(t):
        return p * fr(t) + pbar * fc(x_of(t)) - delta

    def dh(t):
        return p * (rdfr(t) - mpmath.exp(t) * dfc(x_of(t)))

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

    x = (a + b) / 2
    for _ in range(5000):
        hx = h(x)
        if hx == 0:
            return x
        if hx > 0:
            a = x
        else:
            b = x
        d = dh(x)
        xn = x - hx / d if d != 0 else None
        if xn is None or not (a < xn < b):
            xn = (a + b) / 2
        scale = max(1, abs(xn))
        if abs(xn - x) <= tol * scale or (b - a) <= tol * scale:
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


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
def edge_g(div: str, log_p: float):
    """(g(p, 0), g(p, 1/p)) for the exact float log_p < 0: the saturation tests of Prop. 3."""
    log_p = float(log_p)
    dps = _dps_for(_min_p_log10(log_p), 1.0)
    with mpmath.workdps(dps):
        p, pbar = _p_pair(log_p)
        return _lower_edge_value(div, p, pbar), _lower_edge_value(div, pbar, p)


def g_at_log_p(div: str, log_p: float, r, *, extra_dps: int = 40) -> mpf:
    """g(p, r) for p = exp(log_p) (exact float) and r given as float/mpf; r >= 1/p uses the exact
    edge value g(p, 1/p) when r rounds onto 1/p, +inf beyond it (outside the simplex)."""
    log_p = float(log_p)
    dps = _dps_for(_min_p_log10(log_p), 1.0) + extra_dps
    with mpmath.workdps(dps):
        p, pbar = _p_pair(log_p)
        r = mpf(r)
        if r == 0:
            return _lower_edge_value(div, p, pbar)
        return g(div, p, r, pbar=pbar, dps=dps)
