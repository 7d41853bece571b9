"""DCPO's dynamic, probability-dependent clip (a baseline in the BandPO paper), served through the
same Band loss path and kernel as precomputed bounds.

With q = pi_old(a): lower = 0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0)),
                    upper = 0.5 + 0.5 sqrt(1 + 4 eps_high / q)   (then capped).
At q = 1 this is about [0.8, 1.17] for eps 0.16 / 0.20; as q -> 0 it widens to [0.5, upper_cap].
"""

from __future__ import annotations

import torch
from torch import Tensor

from openrlhf_band.band.spec import BandSpec, validate_dcpo

#: DCPO's published clip eps (eps_low, eps_high), used when --actor.eps_clip_low_high is not given.
DCPO_DEFAULT_EPS = (0.16, 0.20)


@torch.no_grad()
def dcpo_bounds(
    old_log_probs: Tensor,
    eps_low: float = DCPO_DEFAULT_EPS[0],
    eps_high: float = DCPO_DEFAULT_EPS[1],
    upper_cap: float | None = 10.0,
) -> tuple[Tensor, Tensor]:
    """(lower, upper) DCPO ratio bounds, float32, same shape as `old_log_probs` (log pi_old)."""
    validate_dcpo(eps_low, eps_high, upper_cap)
    return _dcpo_bounds(old_log_probs, eps_low, eps_high, upper_cap)


def dcpo_rule_bounds(spec: BandSpec, old_log_probs: Tensor, apply_floor: bool = True) -> tuple[Tensor, Tensor]:
    """The bounds of a dcpo-rule spec (validated when built): DCPO's, then the spec's lower floor
    (unless `apply_floor` is False: the loss applies it itself, to flag the tokens it alone clips)."""
    lower, upper = _dcpo_bounds(old_log_probs, *spec.dcpo_eps, spec.upper_cap)
    if apply_floor and spec.lower_floor is not None:
        lower = lower.clamp(min=spec.lower_floor)
    return lower, upper


@torch.no_grad()
def _dcpo_bounds(old_log_probs: Tensor, eps_low: float, eps_high: float, upper_cap: float | None):
    inv_q = torch.exp(-old_log_probs.detach().to(torch.float64).clamp(max=0.0))
    lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low * inv_q, min=0.0))
    upper = 0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high * inv_q)
    if upper_cap is not None:
        upper = upper.clamp(max=upper_cap)
    return lower.float(), upper.float()
