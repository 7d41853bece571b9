"""The band's training metrics (`band/*`), written into OpenRLHF's `experience.info`."""

from __future__ import annotations

import torch
from torch import Tensor

from openrlhf_band.ops.token_loss import BandTokenLoss

#: Old-probability bins of the per-bin clip-fraction metrics: [0, 0.01), [0.01, 0.1), [0.1, 0.5), [0.5, 1].
METRIC_PROB_BINS = (0.0, 0.01, 0.1, 0.5, 1.0)
_BIN_NAMES = ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")


def token_mean(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    """0-d float32: the mean of `values` (bool: a share) over the `count` tokens where `mask` (bool) is
    true; what any position outside the mask holds never reaches it. A mean over unmasked tokens is
    what OpenRLHF's token-weighted reduction over micro-batches and ranks turns into the step's value."""
    return (torch.where(mask, values.float(), 0.0).sum() / count).float()


@torch.no_grad()
def band_metrics(
    out: BandTokenLoss,
    old_log_probs: Tensor,
    action_mask: Tensor | None,
    delta: float | Tensor | None = None,
    *,
    floor: bool = False,
    truncated: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
) -> dict[str, Tensor]:
    """0-d float32 metrics, each a mean over the unmasked tokens, so that OpenRLHF's token-weighted
    all-reduce over micro-batches and ranks gives the exact value over the whole step:

    band/clip_frac_upper, band/clip_frac_lower: share of tokens whose clipped branch is active
        above (A > 0, r > r_up) and below (A < 0, r < r_low);
    band/lower_mean, band/upper_mean, band/width_mean: mean bounds and r_up - r_low (with no cap,
        upper_mean is dominated by the rarest tokens);
    band/tokens_<bin>, band/clipped_<bin>: share of all tokens whose old probability lies in the
        bin, and share that lies in it and was clipped (either side); bins p < 0.01, 0.01-0.1,
        0.1-0.5, >= 0.5. The clip rate within a bin is clipped_<bin> / tokens_<bin>: the band should
        clip rare tokens far less often than a fixed clip does.
    band/clip_frac_floor (with a lower floor): share of tokens clipped below only because of the
        floor (r < F, but r >= the band's own lower bound); a part of clip_frac_lower;
    band/truncated_frac (with a ratio truncation, DPPO): share of tokens inside the band whose
        gradient weight min(r, c) was truncated to c (verl's actor/pg_clipfrac_lower). Under DPPO
        the band's clip is DPPO's mask (both give the token no gradient): clip_frac_upper +
        clip_frac_lower is verl's actor/pg_clipfrac, not OpenRLHF's is_filter_ratio (that one is the
        train/rollout mismatch filter of --algo.advantage.is_correction_*);
    band/delta_mean, band/delta_sq_mean: mean radius and mean squared radius over the tokens (when a
        radius is given: not for bounds_fn rules such as DCPO); with a per-token radius the spread
        is sqrt(delta_sq_mean - delta_mean^2), both exact after the reduction;
    band/behaviour_outside_frac, band/behaviour_abs_log_ratio (with the sampler's log-probs, which
        OpenRLHF passes when --algo.advantage.is_correction_level is on): the band is centred on
        pi_old, the actor's own log-probs recomputed when the experience was made, not on the
        policy that sampled the tokens (vLLM's, mu: the same weights up to the engine's arithmetic
        in synchronous training, older ones in asynchronous training). Share of tokens whose
        sampler ratio mu / pi_old lies outside [r_low, r_up], and the mean |log mu - log pi_old|
        (nats): how far the sampler already stood from the band's centre. With the rollout
        anchor (--actor.band.anchor rollout) pi_old is mu: both read exactly 0, and
        BandPolicyLoss adds band/anchor_rollout = 1.

    Args:
        out: `band_token_loss(..., return_bounds=True)`'s output for (B, T) (or any shape) tokens.
        old_log_probs: log pi_old, the input's shape (natural log).
        action_mask: the input's shape, bool or 0/1; None = all tokens count.
        delta: the radius used: a number, per token (the input's shape) or per sequence (B, 1) /
            (B,); a 1-D radius of length B is per sequence also when B == T.
        floor: a lower floor was on (report band/clip_frac_floor from out.floor_clipped).
        truncated: bool, the input's shape: where the ratio truncation acted (band/truncated_frac).
        rollout_log_probs: log mu, the sampler's log-probs of the same tokens, the input's shape
            (band/behaviour_*); what a masked position holds (an agent's environment tokens hold
            0.0) never reaches them.
    """
    mask = torch.ones_like(out.loss, dtype=torch.bool) if action_mask is None else action_mask != 0
    count = mask.sum().clamp(min=1)

    def share(values: Tensor) -> Tensor:
        return token_mean(values, mask, count)

    clipped = out.clipped_upper | out.clipped_lower
    metrics = {
        "band/clip_frac_upper": share(out.clipped_upper),
        "band/clip_frac_lower": share(out.clipped_lower),
        "band/lower_mean": share(out.lower),
        "band/upper_mean": share(out.upper),
        "band/width_mean": share(out.upper - out.lower),
    }
    if floor and out.floor_clipped is not None:
        metrics["band/clip_frac_floor"] = share(out.floor_clipped)
    if truncated is not None:
        metrics["band/truncated_frac"] = share(truncated)
    if delta is not None:
        d = torch.as_tensor(delta, dtype=torch.float32, device=out.loss.device)
        # per sequence, (B,) against (B, T): one radius per row, also when B == T (the rule of
        # band_token_loss and band_bounds), never a per-column reading
        if d.dim() == 1 and out.loss.dim() == 2 and d.shape[0] == out.loss.shape[0]:
            d = d.unsqueeze(-1)
        d = d.expand(out.loss.shape)
        metrics["band/delta_mean"] = share(d)
        metrics["band/delta_sq_mean"] = share(d * d)
    if rollout_log_probs is not None:
        # in log space, so that no ratio overflows and a lower bound of 0 (log -inf) or no cap (+inf) compare exactly
        gap = torch.where(mask, rollout_log_probs.detach().float() - old_log_probs.detach().float(), 0.0)
        outside = (gap < torch.log(out.lower.float())) | (gap > torch.log(out.upper.float()))
        metrics["band/behaviour_outside_frac"] = share(outside)
        metrics["band/behaviour_abs_log_ratio"] = share(gap.abs())
    p = old_log_probs.detach().float().exp()
    for name, lo, hi in zip(_BIN_NAMES, METRIC_PROB_BINS[:-1], METRIC_PROB_BINS[1:]):
        in_bin = (p >= lo) & ((p < hi) if hi < 1.0 else (p <= hi))
        metrics[f"band/tokens_{name}"] = share(in_bin)
        metrics[f"band/clipped_{name}"] = share(in_bin & clipped)
    return metrics
