"""Pure-torch reference of the Band token loss: the ground truth for the Triton kernel's tests and
the "torch" provider of the benchmarks.

What it reproduces, exactly: the loss and its autograd gradient come from the expressions of
OpenRLHF 0.11.2's PolicyLoss (log-ratio clamped to [-20, 20], surr1 = r A, surr2 = clamp(r, lo, hi)
A, -min(surr1, surr2); with dual-clip, torch.max(that, c A) where A < 0), evaluated in the same
float32 order. So with bounds given as (1 - eps_low, 1 + eps_high) its per-token loss and gradient
w.r.t. log_probs equal PolicyLoss's bit for bit (tests/ops/test_backend_contract.py), ties
included: where r A and clamp(r) A are equal in float32 (r on a bound, A = 0, or r just outside
the band with both products rounding to the same float32), torch.min gives each side half of the
gradient, so such a token gets half of -r A although r lies outside the band (flagged clipped
where that side clips: A > 0 above the band, A < 0 below); likewise torch.max at a tie with the
dual-clip floor c A, and a quarter where both tie. The fused kernel follows the same rule.
With the band, the per-token bounds play lo and hi. Two deliberate departures from PolicyLoss:
* at the simplex edge (upper == 1/p: saturated, p = 1, or rounded to 1/p; not moved by cap or relax) a token with
  log r <= -log p (q <= 1) is compared against hi = +inf, i.e. PolicyLoss with clip_eps_high = inf
  there, because float32 exp(log q - log p) at q = 1 can round above float32(1/p); above the edge
  the usual float32 comparison against 1/p applies;
* masked positions are replaced by harmless constants before any arithmetic, so they are exactly 0
  in loss and gradient whatever they hold (OpenRLHF multiplies by the mask afterwards, where a NaN
  or inf would still reach the gradient through 0 * nan).
An unmasked NaN advantage (or log-prob) propagates as in PolicyLoss: NaN loss and NaN gradient at
that token.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from openrlhf_band.band.bounds import spec_bounds_with_edge
from openrlhf_band.band.spec import BandSpec
from openrlhf_band.ops.token_loss import (
    LOG_RATIO_CLAMP,
    BandTokenLoss,
    as_float32,
    broadcast_advantages,
    unclippable_at_edge,
)

__all__ = ["LOG_RATIO_CLAMP", "BandTokenLoss", "band_token_loss_reference"]

def band_token_loss_reference(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    *,
    spec: BandSpec,
    radius: Tensor | None = None,
    dual_clip: float | None = None,
    return_bounds: bool = False,
    bounds: tuple[Tensor, Tensor] | None = None,
) -> BandTokenLoss:
    """The Band surrogate per token in plain torch (see `BandTokenLoss` for the outputs).

    Args:
        log_probs: log pi_theta of the sampled tokens, (B, T), requires grad; float32, bfloat16
            or float64 (float64 computes in float64, for gradcheck).
        old_log_probs: log pi_old, (B, T), no gradient.
        advantages: (B, T), (B, 1) or (B,) (1-D of length B is per sequence, also when B == T).
        action_mask: (B, T) bool or 0/1 of any dtype; None means every token counts.
        spec: the band (`BandSpec`, validated when built). Its lower floor also applies to given
            `bounds`; its ratio_truncation c makes the gradient weight of an unclipped token
            min(r, c) instead of r (DPPO's truncated importance ratio), also beyond the log-ratio
            clamp (where it is min(e^+-20, c): verl's DPPO gradient); the loss value is unchanged.
        radius: a per-call radius tensor in place of spec.delta, broadcastable to log_probs (per
            token or (B, 1); the dispatcher turns a per-sequence (B,) into (B, 1)).
        dual_clip: c > 1: for A < 0 the objective is floored at c * A.
        bounds: precomputed (lower, upper) to use instead of the spec's roots (e.g. a constant clip
            interval, for equivalence tests against PPO clipping, or the dcpo rule's bounds).

    Ties and edge: see the module docstring (PolicyLoss's gradient, ties split in half by torch.min
    and torch.max; at an upper bound on the simplex edge 1/p, a token with log r <= -log p, i.e.
    q <= 1, is never clipped above: float32 exp(log q - log p) at q = 1 can round one ulp above
    float32(1/p)). An unmasked NaN advantage gives NaN loss and gradient at its token; masked
    positions are exactly 0 in both, whatever any input holds there.
    """
    compute_dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    shape = log_probs.shape
    mask = torch.ones(shape, dtype=torch.bool, device=log_probs.device)
    if action_mask is not None:
        mask = action_mask.expand(shape) != 0
    adv = broadcast_advantages(advantages, shape).to(compute_dtype)
    old = old_log_probs.to(compute_dtype)
    at_edge = None
    if bounds is None:
        lower, upper, at_edge = spec_bounds_with_edge(spec, old, radius, apply_floor=False)
    else:
        lower, upper = bounds
    lower, upper = lower.to(compute_dtype).expand(shape), upper.to(compute_dtype).expand(shape)
    band_lower = lower
    lower_floor, ratio_truncation = spec.lower_floor, spec.ratio_truncation
    if lower_floor is not None:  # after relax (band_bounds' order); also on given bounds. clamp keeps nan
        lower = lower.clamp(min=as_float32(lower_floor))

    # masked positions may hold anything (nan, inf): replace them before any arithmetic so that
    # neither the loss nor the gradient can pick up a nan through 0 * nan
    zero = torch.zeros((), dtype=compute_dtype, device=log_probs.device)
    new = torch.where(mask, log_probs.to(compute_dtype), zero)
    old = torch.where(mask, old, zero)
    adv = torch.where(mask, adv, zero)
    lower = torch.where(mask, lower, zero + 1)
    band_lower = torch.where(mask, band_lower, zero + 1)
    upper = torch.where(mask, upper, zero + 1)

    raw_log_ratio = new - old
    log_ratio = raw_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    upper_loss = upper
    if at_edge is not None:  # at the edge 1/p, decide in log space: clip only if log r > -log p (q > 1)
        upper_loss = torch.where(unclippable_at_edge(at_edge, mask, log_ratio, old), math.inf, upper)

    ratio = torch.exp(log_ratio)
    if ratio_truncation is not None:
        # same value; d ratio / d log r = min(r, c) instead of r (DPPO's truncated weight). DPPO's gradient
        # -min(r, c) A does not stop at the log-ratio clamp: beyond it, -min(e^+-20, c) A (verl's), not 0
        weight = torch.clamp(ratio.detach(), max=as_float32(ratio_truncation))
        ratio = ratio.detach() + (raw_log_ratio - raw_log_ratio.detach()) * weight
    surr1 = ratio * adv
    # tensor clamp, like OpenRLHF's scalar clamp, passes the full gradient at r == bound
    surr2 = torch.clamp(ratio, lower, upper_loss) * adv
    clip1 = torch.min(surr1, surr2)
    if dual_clip is None:
        objective = clip1
        dual_clipped = torch.zeros_like(mask)
    else:
        floor = dual_clip * adv
        objective = torch.where(adv < 0, torch.max(clip1, floor), clip1)
        dual_clipped = (adv < 0) & (floor > clip1) & mask
    loss = torch.where(mask, -objective, zero)
    with torch.no_grad():
        clipped_upper = (adv > 0) & (ratio > upper_loss) & mask
        clipped_lower = (adv < 0) & (ratio < lower) & mask
        floor_clipped = clipped_lower & (ratio >= band_lower) if lower_floor is not None else torch.zeros_like(mask)
    out_bounds = (lower.detach().float(), upper.detach().float()) if return_bounds else (None, None)
    return BandTokenLoss(loss, clipped_upper, clipped_lower, dual_clipped, *out_bounds, floor_clipped)
