"""Registry of the f-divergences that define a Band trust region.

For one state, Lemma 1 of the paper reduces the trust region D_f(pi_old || pi_theta) <= delta to a
condition on the sampled token alone: with p = pi_old(a), q = pi_theta(a) = r * p,

    g_f(p, r) = p f(r) + (1 - p) f((1 - r p) / (1 - p)) <= delta.

Written in (p, q) this is a divergence between two Bernoulli distributions, which is the form every
entry below implements. All functions work elementwise on float64 tensors and take the quantities
that are expensive or delicate to recompute, already computed without cancellation:

    x = log p,  p,  one_minus_p = 1 - p (as -expm1(x)),  log_one_minus_p = log(1 - p)

An entry gives its generator f (for documentation, plots and tests), the value of g at the two
edges of the simplex interval r in [0, 1/p] (which decides saturation, Proposition 3), and either
closed-form roots or g and dg/d(log q) for the numeric solver. Adding a divergence is adding one
`register_divergence(Divergence(...))` call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# (x, p, one_minus_p, delta) -> (lower, upper) ratio roots, unsaturated formulas; delta is a float
# or a tensor of x's shape (per token)
ClosedForm = Callable[[Tensor, Tensor, Tensor, "float | Tensor"], tuple[Tensor, Tensor]]
# (x, p, one_minus_p) -> g at an edge of the simplex interval
EdgeValue = Callable[[Tensor, Tensor, Tensor], Tensor]
# (x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q) -> tensor
BernoulliFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Divergence:
    """One f-divergence usable as a Band trust region.

    Attributes:
        name: registry key (the value of ``--actor.band.divergence``).
        description: one line for help texts.
        generator: f(u) on Python floats, convex with f(1) = 0 (documentation, plots, tests).
        g_at_upper_edge: g(p, r = 1/p), i.e. q = 1; the upper bound saturates at 1/p iff <= delta.
        g_at_lower_edge: g(p, r = 0), i.e. q = 0; the lower bound saturates at 0 iff <= delta.
            Both None for a divergence that is infinite at both edges for every p in (0, 1).
        lower_at_p_one: the p -> 1 limit of the lower bound, as a function of delta (the upper
            bound's limit is always 1 = 1/p).
        closed_form: unsaturated roots in closed form, or None for the numeric solver.
        bernoulli_g: g(p, q) for the numeric solver (None with a closed form).
        bernoulli_dg_dlogq: d g / d log q for Newton steps (None with a closed form).
        bernoulli_d2g_dlogq2: d^2 g / d log q^2: with it the per-token solver takes Halley steps
            (cubic convergence) instead of Newton steps, at no extra transcendental per step.
        tabulate: the roots are smooth in logit(p) over the whole range (no saturation), so a
            cubic table reproduces them to float32 precision and float32 inputs skip Newton.
        lower_table_bracket: for tabulated divergences, an upper bracket on B = p * log(1/r_low)
            as a function of delta (B is the bounded quantity the table stores for the lower root).
        edge_inverse: for a numeric divergence that saturates, the inverses x = log p of its two
            edge values, (g_at_upper_edge^-1, g_at_lower_edge^-1): with them each root is tabulated
            over u = log(g_edge(p) - delta), the log-distance to its saturation edge, in which the
            roots are smooth up to the edge (their derivative in p blows up there). Such a
            divergence's edge functions must not use p (the table path passes p=None).
        radius_bound: the supremum of g over every p in (0, 1) and r in [0, 1/p], for a divergence bounded on
            the simplex (tv: 1, hellinger: 2), else None: at a radius at or past it every token's band is the
            whole simplex [0, 1/p], no trust region at all, so the training entry points refuse it
            (`check_radius_in_range`); the bounds themselves stay defined there.
        lower_at_p_one and the edge functions take delta as a float or a tensor (per token).
    """

    name: str
    description: str
    generator: Callable[[float], float]
    g_at_upper_edge: EdgeValue | None
    g_at_lower_edge: EdgeValue | None
    lower_at_p_one: Callable[[float], float]
    closed_form: ClosedForm | None = None
    bernoulli_g: BernoulliFn | None = None
    bernoulli_dg_dlogq: BernoulliFn | None = None
    bernoulli_d2g_dlogq2: BernoulliFn | None = None
    tabulate: bool = False
    lower_table_bracket: Callable[[float], float] | None = None
    edge_inverse: tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]] | None = None
    radius_bound: float | None = None


_REGISTRY: dict[str, Divergence] = {}


def _exp(v):
    return torch.exp(v) if isinstance(v, Tensor) else math.exp(v)


def _at_least_zero(v):
    return v.clamp(min=0.0) if isinstance(v, Tensor) else max(v, 0.0)


def register_divergence(divergence: Divergence) -> Divergence:
    """Add a divergence to the registry (name must be new)."""
    if divergence.name in _REGISTRY:
        raise ValueError(f"divergence {divergence.name!r} is already registered")
    if divergence.closed_form is None and (divergence.bernoulli_g is None or divergence.bernoulli_dg_dlogq is None):
        raise ValueError(f"divergence {divergence.name!r} needs a closed form or g and dg/dlog q")
    _REGISTRY[divergence.name] = divergence
    return divergence


def check_radius_in_range(name: str, radius: float | None, what: str = "delta", *, lower_only: bool = False) -> None:
    """ValueError when a radius is at or past the divergence's `radius_bound` (its band would be [0, 1/p] for
    every token: no trust region), naming the range; nothing for an unbounded divergence or a radius of None.
    `lower_only`: the radius of the lower root alone (every token's lower bound would be 0)."""
    bound = get_divergence(name).radius_bound
    if radius is not None and bound is not None and not radius < bound:
        lost = "every token's lower bound is 0" if lower_only else "every token's band is [0, 1/p]: no trust region"
        raise ValueError(
            f"{what} {radius:g} is outside {name}'s range (0, {bound:g}): {name} is at most {bound:g} on the simplex, "
            f"so at {what} >= {bound:g} {lost}: take {what} < {bound:g}"
        )


def get_divergence(name: str) -> Divergence:
    """Look a divergence up by name; a clear ValueError lists the valid names."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown divergence {name!r}; valid names: {valid}") from None


# ---------------------------------------------------------------------------------------------
# kl: KL(pi_old || pi_theta), f(u) = -log u + u - 1.  In q it is the Bernoulli KL(p || q), whose
# upper root is the KL-UCB index. g -> inf at both edges for p < 1: it never saturates.
# ---------------------------------------------------------------------------------------------
def _kl_g(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    return p * (x - log_q) + one_minus_p * (log_one_minus_p - log_one_minus_q)


def _kl_dg(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    return (q - p) / one_minus_q


def _kl_d2g(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    return q * one_minus_p / (one_minus_q * one_minus_q)


register_divergence(
    Divergence(
        name="kl",
        description="KL(pi_old || pi_theta), the paper's default; numeric roots, never saturates",
        generator=lambda u: -math.log(u) + u - 1.0,
        g_at_upper_edge=None,  # +inf for p < 1: never saturates inside (0, 1)
        g_at_lower_edge=None,
        lower_at_p_one=lambda delta: _exp(-delta),
        bernoulli_g=_kl_g,
        bernoulli_dg_dlogq=_kl_dg,
        bernoulli_d2g_dlogq2=_kl_d2g,
        tabulate=True,
        # g >= B + (1 - p) log(1 - p) >= B - 1/e, so B = delta + 1 already overshoots the root.
        lower_table_bracket=lambda delta: delta + 1.0,
    )
)


# ---------------------------------------------------------------------------------------------
# tv: total variation, f(u) = |u - 1| / 2, g = p |r - 1|.
# ---------------------------------------------------------------------------------------------
def _tv_closed_form(x, p, one_minus_p, delta):
    half_width = torch.reciprocal(p).mul_(delta)
    upper = half_width + 1.0
    return half_width.neg_().add_(1.0), upper


register_divergence(
    Divergence(
        name="tv",
        description="total variation; closed form r = 1 -+ delta / p",
        generator=lambda u: abs(u - 1.0) / 2.0,
        g_at_upper_edge=lambda x, p, one_minus_p: one_minus_p,
        g_at_lower_edge=lambda x, p, one_minus_p: p,
        lower_at_p_one=lambda delta: _at_least_zero(1.0 - delta),
        closed_form=_tv_closed_form,
        radius_bound=1.0,  # g = p |r - 1| <= max(p, 1 - p) < 1
    )
)


# ---------------------------------------------------------------------------------------------
# chi2: Pearson chi^2, f(u) = (u - 1)^2, g = p (r - 1)^2 / (1 - p).
# ---------------------------------------------------------------------------------------------
def _chi2_closed_form(x, p, one_minus_p, delta):
    half_width = torch.div(one_minus_p, p).mul_(delta).sqrt_()
    upper = half_width + 1.0
    return half_width.neg_().add_(1.0), upper


register_divergence(
    Divergence(
        name="chi2",
        description="Pearson chi^2; closed form r = 1 -+ sqrt(delta (1 - p) / p)",
        generator=lambda u: (u - 1.0) ** 2,
        g_at_upper_edge=lambda x, p, one_minus_p: one_minus_p / p,
        g_at_lower_edge=lambda x, p, one_minus_p: p / one_minus_p,
        lower_at_p_one=lambda delta: 1.0,
        closed_form=_chi2_closed_form,
    )
)


# ---------------------------------------------------------------------------------------------
# reverse_kl: KL(pi_theta || pi_old), f(u) = u log u - u + 1; Bernoulli KL(q || p).
# Saturates at both edges (upper when p >= exp(-delta), lower when p <= 1 - exp(-delta)), where the
# root's derivative blows up in p: its tables are over the log-distance to each edge instead.
# ---------------------------------------------------------------------------------------------
def _reverse_kl_g(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    # (1 - q) log(1 - q) from the accurate log(1 - q) (xlogy's own log of a number near 1 loses the
    # digits of -q for small q), and 0 at q = 1 instead of 0 * -inf = nan
    xlogx = torch.where(one_minus_q > 0, one_minus_q * log_one_minus_q, 0.0)
    return q * (log_q - x) + xlogx - one_minus_q * log_one_minus_p


def _reverse_kl_dg(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    return q * ((log_q - x) - (log_one_minus_q - log_one_minus_p))


def _reverse_kl_d2g(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q):
    # d/dlog q of q h with h = log q - x - log(1 - q) + log(1 - p), dh/dlog q = 1 / (1 - q)
    return _reverse_kl_dg(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q) + q / one_minus_q


register_divergence(
    Divergence(
        name="reverse_kl",
        description="KL(pi_theta || pi_old); numeric roots, saturates at both edges",
        generator=lambda u: (u * math.log(u) if u > 0 else 0.0) - u + 1.0,
        g_at_upper_edge=lambda x, p, one_minus_p: -x,
        g_at_lower_edge=lambda x, p, one_minus_p: -torch.log(one_minus_p),  # relative to delta: see band_bounds
        lower_at_p_one=lambda delta: 1.0,
        bernoulli_g=_reverse_kl_g,
        bernoulli_dg_dlogq=_reverse_kl_dg,
        bernoulli_d2g_dlogq2=_reverse_kl_d2g,
        # -log p = g and -log(1 - p) = g, solved for log p
        edge_inverse=(torch.neg, lambda g: torch.log1p(-torch.exp(-g))),
    )
)


# ---------------------------------------------------------------------------------------------
# hellinger: f(u) = (sqrt u - 1)^2, i.e. twice the squared Hellinger distance. With p = sin^2 a and
# q = sin^2 b, g = 2 - 2 cos(b - a), so the roots are b = a -+ theta with theta = 2 asin(sqrt(delta)/2):
# sqrt(q) = sin(a -+ theta) = sqrt(p) cos(theta) -+ sqrt(1 - p) sin(theta), no trigonometry per token.
# ---------------------------------------------------------------------------------------------
def hellinger_angle(delta):
    """(cos theta, sin theta) of the Hellinger band's half-angle theta = 2 asin(min(sqrt(delta) / 2, 1)),
    without trigonometry: cos theta = 1 - delta / 2, sin theta = sqrt(delta (4 - delta)) / 2 (delta
    capped at 4, where theta = pi). Floats in, floats out; a tensor in, tensors out (per token)."""
    if isinstance(delta, Tensor):
        d = delta.clamp(max=4.0)
        return 1.0 - 0.5 * d, torch.sqrt(d * (4.0 - d)) * 0.5
    d = min(delta, 4.0)
    return 1.0 - 0.5 * d, 0.5 * math.sqrt(d * (4.0 - d))


def _hellinger_closed_form(x, p, one_minus_p, delta):
    cos_theta, sin_theta = hellinger_angle(delta)
    along, across = torch.sqrt(p).mul_(cos_theta), torch.sqrt(one_minus_p).mul_(sin_theta)
    upper = (along + across).square_().div_(p)
    return along.sub_(across).square_().div_(p), upper


register_divergence(
    Divergence(
        name="hellinger",
        description="squared Hellinger (x2); closed form r = sin^2(asin(sqrt p) -+ theta) / p",
        generator=lambda u: (math.sqrt(u) - 1.0) ** 2,
        # 2 - 2 sqrt(p) written without cancellation near p = 1 (and symmetrically)
        g_at_upper_edge=lambda x, p, one_minus_p: 2.0 * one_minus_p / (1.0 + torch.sqrt(p)),
        g_at_lower_edge=lambda x, p, one_minus_p: 2.0 * p / (1.0 + torch.sqrt(one_minus_p)),
        lower_at_p_one=lambda delta: _at_least_zero(1.0 - delta / 2.0) ** 2,
        closed_form=_hellinger_closed_form,
        radius_bound=2.0,  # g = 2 - 2 cos(b - a) at the edges: 2 (1 - sqrt(p)) or 2 (1 - sqrt(1 - p)), < 2
    )
)

#: Names of every registered divergence, the paper's default first.
DIVERGENCES: tuple[str, ...] = tuple(_REGISTRY)
