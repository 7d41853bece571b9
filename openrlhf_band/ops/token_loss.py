"""What both backends of the Band loss return (`BandTokenLoss`) and the conventions they share
with OpenRLHF 0.11.2's PolicyLoss: the log-ratio clamp and the reading of per-sequence advantages."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # OpenRLHF 0.11.2 clamps log(pi_new / pi_old) to [-20, 20] before exp


class BandTokenLoss(NamedTuple):
    """Per-token outputs of the Band surrogate, all of shape (B, T).

    loss: -min(r A, clip(r, lo, hi) A) (dual-clipped when asked), float32 (float64 for float64
        log_probs), exactly 0 at masked positions; differentiable w.r.t. log_probs.
    clipped_upper: bool, A > 0 and r > hi (the clipped branch is the active one, no gradient).
    clipped_lower: bool, A < 0 and r < lo.
    dual_clipped: bool, A < 0 and the dual-clip floor dual_clip * A is the active branch.
    lower, upper: the ratio bounds used (float32; 1 at masked positions), or None unless
        return_bounds=True.
    floor_clipped: bool, the token is clipped below (clipped_lower) only because of the lower
        floor: r < F but r >= the band's own lower bound. None where the caller built the tuple
        without it; all false without a floor.
    """

    loss: Tensor
    clipped_upper: Tensor
    clipped_lower: Tensor
    dual_clipped: Tensor
    lower: Tensor | None = None
    upper: Tensor | None = None
    floor_clipped: Tensor | None = None


def broadcast_advantages(advantages: Tensor, shape: torch.Size) -> Tensor:
    """Per-token (B, T), per-sequence (B, 1) or (B,) advantages as a (B, T) view."""
    if advantages.dim() == 1 and len(shape) == 2 and advantages.shape[0] == shape[0]:
        advantages = advantages.unsqueeze(-1)
    try:
        return advantages.expand(shape)
    except RuntimeError:
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} do not fit log_probs of shape {tuple(shape)}; "
            "expected (B, T), (B, 1) or (B,)"
        ) from None


def as_float32(value: float) -> float:
    """A threshold as the float32 kernel holds it (the floor, DPPO's truncation): both backends compare
    with the same number."""
    return float(torch.tensor(value, dtype=torch.float32))


def unclippable_at_edge(at_edge: Tensor, mask: Tensor, log_ratio: Tensor, old_log_probs: Tensor) -> Tensor:
    """Where an upper bound at the simplex edge 1/p must not clip: log r <= -log p, i.e. q <= 1, decided
    in log space (exp(log q - log p) at q = 1 can round one ulp above float32(1/p)). bool, the inputs' shape."""
    return at_edge & mask & (log_ratio <= -old_log_probs.clamp(max=0.0))
