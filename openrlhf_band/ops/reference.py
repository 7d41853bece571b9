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
from typing import NamedTuple

import torch
from torch import Tensor

from openrlhf_band.band.bounds import band_bounds_with_edge

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


def band_token_loss_reference(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    *,
    divergence: str = "kl",
    delta: float | Tensor = 0.05,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    dual_clip: float | None = None,
    return_bounds: bool = False,
    bounds: tuple[Tensor, Tensor] | None = None,
    lower_floor: float | None = None,
    lower_delta: float | None = None,
    ratio_truncation: float | None = None,
) -> BandTokenLoss:
    """The Band surrogate per token in plain torch (see `BandTokenLoss` for the outputs).

    Args:
        log_probs: log pi_theta of the sampled tokens, (B, T), requires grad; float32, bfloat16
            or float64 (float64 computes in float64, for gradcheck).
        old_log_probs: log pi_old, (B, T), no gradient.
        advantages: (B, T), (B, 1) or (B,) (1-D of length B is per sequence, also when B == T).
        action_mask: (B, T) bool or 0/1 of any dtype; None means every token counts.
        delta: the radius, a number or a tensor broadcastable to log_probs (per token or (B, 1);
            the dispatcher turns a per-sequence (B,) into (B, 1)).
        bounds: precomputed (lower, upper) to use instead of `band_bounds` (e.g. a constant clip
            interval, for equivalence tests against PPO clipping).
        lower_floor, lower_delta: as in `band_bounds`; the floor also applies to given `bounds`.
        ratio_truncation: c > 0: the gradient weight of an unclipped token is min(r, c) instead of
            r (DPPO's truncated importance ratio), also beyond the log-ratio clamp (where it is
            min(e^+-20, c): verl's DPPO gradient); the loss value is unchanged.

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
        lower, upper, at_edge = band_bounds_with_edge(
            old, divergence, delta, upper_cap=upper_cap, relax=relax, lower_delta=lower_delta
        )
    else:
        lower, upper = bounds
    lower, upper = lower.to(compute_dtype).expand(shape), upper.to(compute_dtype).expand(shape)
    band_lower = lower
    if lower_floor is not None:  # after relax (band_bounds' order); also on given bounds. clamp keeps nan
        lower = lower.clamp(min=float(torch.tensor(lower_floor, dtype=torch.float32)))

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
        upper_loss = torch.where(at_edge & mask & (log_ratio <= -old.clamp(max=0.0)), math.inf, upper)

    ratio = torch.exp(log_ratio)
    if ratio_truncation is not None:
        # same value; d ratio / d log r = min(r, c) instead of r (DPPO's truncated weight). DPPO's gradient
        # -min(r, c) A does not stop at the log-ratio clamp: beyond it, -min(e^+-20, c) A (verl's), not 0
        weight = torch.clamp(ratio.detach(), max=float(torch.tensor(ratio_truncation, dtype=torch.float32)))
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
