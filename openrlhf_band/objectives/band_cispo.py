"""The band as the bounds of another objective: CISPO's importance weight clipped to the band's
per-token [r_low(p), r_up(p)] instead of the fixed [1 - eps_low, 1 + eps_high].

    loss_t = -sg(clip(r_t, r_low(p_t), r_up(p_t))) A_t log pi(y_t)

`BandPolicyLoss(policy_loss_type="cispo", band=...)` computes it (`--loss cispo --actor.cispo.bounds
band` and the band's flags), so every option of the band's bounds holds here: the divergence and
radius, the cap, relax, the lower floor, a per-call radius tensor (per token or per sequence), the
adaptive radius, DCPO's rule. The torch reference of the formula is in the tests.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from openrlhf_band.band.rules import RULES
from openrlhf_band.band.spec import BandSpec, radius_view
from openrlhf_band.objectives.losses import cispo_token_loss
from openrlhf_band.ops.token_loss import (
    LOG_RATIO_CLAMP,
    BandTokenLoss,
    as_float32,
    broadcast_advantages,
    unclippable_at_edge,
)


def band_cispo_token_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    spec: BandSpec,
    *,
    radius: Tensor | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
) -> BandTokenLoss:
    """CISPO's per-token loss with the band's bounds, as a `BandTokenLoss` (so that the band's
    metrics read it): loss (B, T) in log_probs' dtype, 0 at masked positions; clipped_upper r > r_up
    and clipped_lower r < r_low for either sign of A (CISPO clips the weight, never the gradient);
    dual_clipped all false; lower / upper the bounds (1 at masked positions); floor_clipped: r < F
    but r >= the band's own lower bound.

    `spec`: a trust_region or dcpo rule (DPPO is an objective of its own). `radius`: a per-call
    radius tensor in place of spec.delta. `bounds`: (lower, upper) given by the caller (a
    `bounds_fn`), used as given except for the floor.
    """
    rule = RULES[spec.rule]
    if not rule.takes_cispo:
        raise ValueError(f"CISPO takes the band's trust_region or dcpo bounds; {rule.label} is an objective of its own")
    spec.check_radius(radius)
    compute_dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    shape = log_probs.shape
    live = torch.ones(shape, dtype=torch.bool, device=log_probs.device)
    if action_mask is not None:
        live = action_mask.expand(shape) != 0
    # masked positions may hold anything: replaced before any arithmetic, so that neither the loss
    # nor the gradient picks up a nan through 0 * nan
    zero = torch.zeros((), dtype=compute_dtype, device=log_probs.device)
    new = torch.where(live, log_probs.to(compute_dtype), zero)
    old = torch.where(live, old_log_probs.to(compute_dtype), zero)
    adv = torch.where(live, broadcast_advantages(advantages, shape).to(compute_dtype), zero)
    at_edge = torch.zeros_like(live)
    if bounds is not None:
        lower, upper = bounds
    else:
        radius = None if radius is None else radius_view(radius, log_probs)
        lower, upper, at_edge = rule.bounds(spec, old, radius, False)
    band_lower = torch.where(live, torch.as_tensor(lower, dtype=compute_dtype, device=new.device).expand(shape), 1.0)
    upper = torch.where(live, torch.as_tensor(upper, dtype=compute_dtype, device=new.device).expand(shape), 1.0)
    lower = band_lower
    if spec.lower_floor is not None:  # the floor as float32 holds it, as the band's loss applies it
        lower = band_lower.clamp(min=as_float32(spec.lower_floor))
    log_ratio = (new.detach() - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # at the simplex edge 1/p no reachable ratio exceeds the bound: decided in log space (q <= 1), as the
    # band's loss does, since exp(log q - log p) at q = 1 can round one ulp above the bound
    upper_used = torch.where(unclippable_at_edge(at_edge, live, log_ratio, old), math.inf, upper)
    loss, above, below = cispo_token_loss(new, old, adv, lower, upper_used)
    with torch.no_grad():
        above, below = above & live, below & live
        floor_clipped = (
            below & (log_ratio.exp() >= band_lower) if spec.lower_floor is not None else torch.zeros_like(live)
        )
    return BandTokenLoss(
        loss=torch.where(live, loss, zero),
        clipped_upper=above,
        clipped_lower=below,
        dual_clipped=torch.zeros_like(live),
        lower=lower.float(),
        upper=upper.float(),
        floor_clipped=floor_clipped,
    )
