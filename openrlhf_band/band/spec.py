"""`BandSpec`: one frozen, validated description of a band rule, built once and taken by every
layer below (the bounds, the torch reference, the fused kernel's launcher, `BandPolicyLoss`).

A spec says which ratio bounds a token gets from its old probability p:

* rule "trust_region" (the paper's): the two roots of g_f(p, r) = delta for the f-divergence
  `divergence`, the lower one at `lower_delta` when given; then relax's union with
  [1 - eps_low, 1 + eps_high], the lower floor max(r_low, F), the upper cap min(r_up, cap);
* rule "dppo" (DPPO, arXiv 2602.04879; verl's dppo_tv / dppo_kl): the same roots for the binary
  tv or kl divergence at radii (lower_delta, delta), with no cap, relax or floor, and the ratio
  truncation c of its gradient weight min(r, c);
* rule "dcpo" (DCPO's probability-dependent clip): bounds from `dcpo_eps` alone
  (`openrlhf_band.band.dcpo`), then the floor; `divergence` and `delta` are not used.

`ratio_truncation` (an unclipped token's gradient weight min(r, c)) is part of the spec because
it is DPPO's; the objective's own options (PPO's dual clip, the aggregation) are not.

Validation happens in `__post_init__`, once: the keyword APIs (`band_bounds`, `band_token_loss`)
build a spec from their arguments, the flags build one at parse time, `BandPolicyLoss` one in its
constructor; nothing below re-checks it. A per-call radius tensor (per token (B, T), per sequence
(B, 1) or (B,)) is call data, not part of the spec: it replaces `delta` for that call
(`radius_view` shapes it).

The validators every option check uses (`is_real_number`, `validate_band`, ...) live here too, so
that each message is written once.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from openrlhf_band.band.divergences import Divergence, get_divergence
from openrlhf_band.band.rules import DPPO, RULES, get_rule

DPPO_DIVERGENCES = DPPO.divergences


def is_real_number(value) -> bool:
    """A real number of any type (int, float, numpy scalars, Fraction, ...), but not a bool or a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)  # np.bool_ is no numbers.Real


def is_positive_finite_number(value) -> bool:
    """A real number (`is_real_number`) that is finite and > 0: a radius, an eps, a rate."""
    return is_real_number(value) and math.isfinite(value) and value > 0


def validate_lower_floor(lower_floor) -> float:
    """lower_floor as a float, or a ValueError unless it is a real number with 0 < F < 1 (a floor of
    0 is no floor, one of 1 or more would forbid every fall of a token's probability)."""
    if not is_real_number(lower_floor) or math.isnan(lower_floor) or not 0.0 < lower_floor < 1.0:
        raise ValueError(
            f"lower_floor must be a number strictly between 0 and 1 (each token's lower ratio bound becomes "
            f"max(r_low, lower_floor)), got {lower_floor!r}"
        )
    return float(lower_floor)


def validate_band(
    divergence: str,
    delta: float,
    upper_cap: float | None,
    relax,
    *,
    lower_floor: float | None = None,
    lower_delta: float | None = None,
) -> tuple[Divergence, float]:
    """The band's options checked: (the divergence, delta as a float), or a ValueError that says
    what is wrong (unknown divergence, delta or lower_delta not a positive finite number, a cap
    below 1, a relax that is not a pair of finite numbers >= 0 with eps_low <= 1, a lower floor that
    is not a number strictly between 0 and 1). `BandSpec` is its one caller."""
    div = get_divergence(divergence)
    if lower_floor is not None:
        validate_lower_floor(lower_floor)
    if lower_delta is not None and not is_positive_finite_number(lower_delta):
        raise ValueError(f"lower_delta must be a positive finite number (the lower root's radius), got {lower_delta!r}")
    if not is_real_number(delta):
        raise ValueError(f"delta must be a positive finite number, got {delta!r}")
    delta = float(delta)
    if not math.isfinite(delta) or delta <= 0.0:
        raise ValueError(f"delta must be a positive finite number (the trust-region radius), got {delta!r}")
    if upper_cap is not None:
        if not is_real_number(upper_cap) or math.isnan(upper_cap):
            raise ValueError(f"upper_cap must be a number >= 1 or None, got {upper_cap!r}")
        if upper_cap < 1.0:
            raise ValueError(f"upper_cap must be >= 1 (a cap below 1 forbids any rise), got {upper_cap!r}")
    if relax is not None:
        ok = isinstance(relax, Sequence) and not isinstance(relax, (str, bytes)) and len(relax) == 2
        ok = ok and all(is_real_number(e) and math.isfinite(e) and e >= 0.0 for e in relax)
        if not ok or relax[0] > 1.0:
            raise ValueError(
                f"relax must be a pair (eps_low, eps_high) of finite numbers >= 0 with eps_low <= 1, got {relax!r}"
            )
    return div, delta


def validate_dcpo(eps_low: float, eps_high: float, upper_cap: float | None) -> None:
    """ValueError unless both eps are positive finite real numbers and the cap (if any) is one >= 1."""
    for name, eps in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not is_positive_finite_number(eps):
            raise ValueError(f"DCPO {name} must be a positive finite number, got {eps!r}")
    if upper_cap is not None and not (is_real_number(upper_cap) and upper_cap >= 1.0):
        raise ValueError(f"upper_cap must be a number >= 1 or None, got {upper_cap!r}")


def validate_ratio_truncation(ratio_truncation) -> None:
    if ratio_truncation is not None and not is_positive_finite_number(ratio_truncation):
        raise ValueError(f"ratio_truncation must be a positive finite number (DPPO's c), got {ratio_truncation!r}")


@dataclass(frozen=True)
class BandSpec:
    """A band rule, validated when built (ValueError naming the option); immutable and hashable.

    Attributes:
        divergence: a name from `DIVERGENCES` (trust_region, dppo: "tv" or "kl").
        delta: the radius, a positive finite number (the paper's 0.05); a per-call radius tensor
            replaces it for that call.
        upper_cap: cap >= 1 on the upper ratio bound, or None (dppo: None).
        relax: (eps_low, eps_high): union with [1 - eps_low, 1 + eps_high], or None.
        lower_floor: F in (0, 1): every lower bound becomes max(lower, F), after relax; or None.
        lower_delta: the lower root's radius when it differs from delta (asymmetric radii, as
            DPPO's delta_low); a scalar radius only.
        ratio_truncation: c > 0: an unclipped token's gradient weight is min(r, c) (DPPO's).
        rule: a name in `openrlhf_band.band.rules.RULES` ("trust_region", "dcpo", "dppo"; module docstring).
        dcpo_eps: (eps_low, eps_high) of the dcpo rule, which needs them; None for the others.
    """

    divergence: str = "kl"
    delta: float = 0.05
    upper_cap: float | None = None
    relax: tuple[float, float] | None = None
    lower_floor: float | None = None
    lower_delta: float | None = None
    ratio_truncation: float | None = None
    rule: str = "trust_region"
    dcpo_eps: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        rule = get_rule(self.rule)
        div, delta = validate_band(self.divergence, self.delta, self.upper_cap, self.relax,
                                   lower_floor=self.lower_floor, lower_delta=self.lower_delta)  # fmt: skip
        validate_ratio_truncation(self.ratio_truncation)
        rule.check_spec(self, div)
        # one canonical value per option: plain floats and tuples (hashable, the same spec from an
        # int, a numpy scalar or a list)
        object.__setattr__(self, "divergence", div.name)
        object.__setattr__(self, "delta", delta)
        for name in ("upper_cap", "lower_floor", "lower_delta", "ratio_truncation"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.relax is not None:
            object.__setattr__(self, "relax", (float(self.relax[0]), float(self.relax[1])))

    def check_radius(self, radius: Tensor | None) -> None:
        """A per-call radius tensor fits this spec: asymmetric radii (lower_delta) are scalar, and
        the dcpo rule has no radius."""
        if radius is None:
            return
        if self.lower_delta is not None:
            raise ValueError("lower_delta takes a number delta (asymmetric radii are scalar), got a delta tensor")
        if not RULES[self.rule].has_radius:
            raise ValueError(f"the {self.rule} rule's bounds depend on its eps alone: it takes no radius")


def radius_view(radius: Tensor, reference: Tensor) -> Tensor:
    """A per-token or per-sequence radius as a tensor that broadcasts to `reference` (the log-probs
    or old log-probs it goes with).

    For a 2-D (B, T) reference a 1-D radius of length B is one radius per sequence and becomes
    (B, 1), also when B == T (as for advantages: a square batch must not silently switch to a
    per-column reading); anything else must broadcast as it is (per token (B, T), (B, 1), ...).
    """
    if not radius.is_floating_point():
        raise ValueError(f"a per-token delta must be a floating-point tensor, got {radius.dtype}")
    if radius.device != reference.device:
        raise ValueError(f"delta is on {radius.device}, log_probs on {reference.device}")
    if reference.dim() == 2 and radius.shape == (reference.shape[0],):
        radius = radius.unsqueeze(-1)
    try:
        torch.broadcast_shapes(radius.shape, reference.shape)
    except RuntimeError:
        raise ValueError(
            f"delta of shape {tuple(radius.shape)} does not fit log_probs of shape {tuple(reference.shape)}: "
            "expected a number, per token (same shape), or per sequence (B, 1) / (B,)"
        ) from None
    return radius


def spec_from_keywords(
    divergence: str = "kl",
    delta: float | Tensor = 0.05,
    *,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    lower_floor: float | None = None,
    lower_delta: float | None = None,
    ratio_truncation: float | None = None,
) -> tuple[BandSpec, Tensor | None]:
    """The keyword APIs' (`band_bounds`, `band_token_loss`) arguments as (a trust_region spec, the
    per-call radius tensor or None): a tensor `delta` is the per-call radius, and the spec keeps the
    default radius, which it then never uses."""
    radius = delta if isinstance(delta, Tensor) else None
    spec = BandSpec(
        divergence, BandSpec.delta if radius is not None else delta, upper_cap, relax, lower_floor, lower_delta,
        ratio_truncation,
    )  # fmt: skip
    spec.check_radius(radius)
    return spec, radius
