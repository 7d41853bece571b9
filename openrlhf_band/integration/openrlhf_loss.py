"""`OpenRLHFPolicyLoss`: OpenRLHF 0.11.2's `PolicyLoss` contract, owned once, for the band and every objective.

OpenRLHF's actor builds its loss as `PolicyLoss(clip_eps_low, clip_eps_high, dual_clip, token_level_loss,
policy_loss_type, is_correction_level, is_correction_mode, is_correction_gating, is_correction_threshold)` and calls

    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = loss_fn(log_probs, old_log_probs, advantages,
        action_mask, rollout_log_probs, dp_size, batch_num_tokens, global_batch_size)

This base class is that contract: the constructor's arguments and their checks (dual clip, the clip eps), the
train/rollout IS correction, OpenRLHF's `aggregate_loss` with the global token / sample counts (or, for a
sequence-level loss, OpenRLHF's per-sample aggregation), the clip ratio, ppo_kl and the metrics dict. A loss
supplies only `token_loss`, its per-token (or per-sequence) loss, the tokens its clip ratio counts and its metrics
(`BandPolicyLoss`, `ObjectivePolicyLoss`; Liger-Kernel's fused_linear_ppo base has the same shape). Which module
a `--actor.policy_loss_type` gets is `openrlhf_band.integration.loss_registry`.

Aggregation (`loss_agg_mode`): OpenRLHF's two modes through its own `aggregate_loss` (token-mean,
seq-mean-token-mean), and verl 0.9.1's `agg_loss` modes OpenRLHF lacks: seq-mean-token-sum (each sequence's token
sum, averaged over the sequences: OpenRLHF's global sample count, else those with a token) and
seq-mean-token-sum-norm (that over a constant, `loss_scale_factor`: Dr. GRPO's normaliser; the patched actor passes
the rollout's max new tokens, never a micro-batch's padded width). Entropy and the KL loss stay OpenRLHF's
token-mean (verl aggregates them with the same mode).

Importing this module does not import OpenRLHF; `forward` imports its `aggregate_loss` and `masked_mean`, so that
aggregation keeps OpenRLHF's exact semantics.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from openrlhf_band.integration.is_correction import ISCorrection

#: OpenRLHF 0.11.2's PolicyLoss constructor arguments, in its order, with its defaults
OPENRLHF_ARGUMENTS = {
    "clip_eps_low": 0.2,
    "clip_eps_high": 0.2,
    "dual_clip": None,
    "token_level_loss": True,
    "policy_loss_type": "ppo",
    "is_correction_level": "off",
    "is_correction_mode": "mask",
    "is_correction_gating": "ratio",
    "is_correction_threshold": (0.5, 5.0),
}

#: --actor.loss_agg_mode: OpenRLHF 0.11.2's two, then verl 0.9.1's that OpenRLHF lacks (module docstring)
OPENRLHF_AGG_MODES = ("token-mean", "seq-mean-token-mean")
LOSS_AGG_MODES = (*OPENRLHF_AGG_MODES, "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: the aggregation's keywords, beside OpenRLHF's arguments (None: from token_level_loss, as OpenRLHF's actor sets it)
AGGREGATION_ARGUMENTS = {"loss_agg_mode": None, "loss_scale_factor": None}


def openrlhf_arguments(positional: tuple, keywords: dict, **defaults) -> tuple[dict, dict]:
    """(OpenRLHF's constructor arguments and the aggregation's, the other keywords): `positional` in OpenRLHF's
    order and `keywords` by name, as `PolicyLoss(...)` binds them, with OpenRLHF's defaults except those in
    `defaults` (a subclass's own default `policy_loss_type`). TypeError as Python's for too many or repeated
    arguments."""
    names = list(OPENRLHF_ARGUMENTS)
    if len(positional) > len(names):
        raise TypeError(f"takes at most {len(names)} positional arguments (OpenRLHF's), got {len(positional)}")
    given = dict(zip(names, positional))
    rest = dict(keywords)
    for name in [*names[len(positional) :], *AGGREGATION_ARGUMENTS]:
        if name in rest:
            given[name] = rest.pop(name)
    repeated = sorted(set(given) & set(rest))
    if repeated:
        raise TypeError(f"got multiple values for argument {repeated[0]!r}")
    return {**OPENRLHF_ARGUMENTS, **AGGREGATION_ARGUMENTS, **defaults, **given}, rest


def mean_over_sequences(per_sequence: Tensor, live: Tensor, dp_size: int, global_batch_size) -> Tensor:
    """(B,) per-sequence losses summed over the sequences that have a token (`live` (B, T)), over
    `global_batch_size` (OpenRLHF's global sample count) times dp_size, else over their number (at least 1): the
    aggregation of a sequence-level loss (OpenRLHF's per-sample mode) and of verl 0.9.1's seq-mean-token-sum, whose
    per-sequence loss is the token sum."""
    has_tokens = live.any(dim=-1).to(per_sequence.dtype)
    total = (per_sequence * has_tokens).sum()
    if global_batch_size is None:
        return total / has_tokens.sum().clamp(min=1)
    return total / global_batch_size * dp_size


class TokenLoss(NamedTuple):
    """What a loss's `token_loss` returns.

    loss: (B, T) per token, 0 at masked positions (or (B,) per sequence for a sequence-level loss), before the IS
        correction and the aggregation; differentiable w.r.t. log_probs.
    clipped: (B, T) bool, the tokens OpenRLHF's `ppo_clip_ratio` counts.
    metrics: name -> 0-d tensor, the loss's metrics of this call (`loss_metrics`).
    """

    loss: Tensor
    clipped: Tensor
    metrics: dict[str, Tensor]


class OpenRLHFPolicyLoss(nn.Module):
    """OpenRLHF 0.11.2's `PolicyLoss` interface; subclasses implement `token_loss`.

    `takes_dual_clip`: whether `dual_clip` applies (else a ValueError names the loss); `sequence_level`: the loss
    is per sequence, aggregated over sequences whatever `token_level_loss` (as OpenRLHF's gspo), and the IS
    correction's per-token weights enter as their geometric mean per sequence (verl's geo_mean). After each
    forward `loss_metrics` holds the call's metrics (0-d tensors) for `experience.info`.
    """

    def __init__(
        self,
        clip_eps_low: float,
        clip_eps_high: float,
        dual_clip: float | None,
        token_level_loss: bool,
        policy_loss_type: str,
        is_correction_level: str,
        is_correction_mode: str,
        is_correction_gating: str,
        is_correction_threshold,
        *,
        takes_dual_clip: bool,
        why_no_dual_clip: str = "",
        sequence_level: bool = False,
        loss_agg_mode: str | None = None,
        loss_scale_factor: float | None = None,
    ) -> None:
        super().__init__()
        self.sequence_level = sequence_level
        if loss_agg_mode is None:  # OpenRLHF's actor: token-mean or not
            loss_agg_mode = "token-mean" if token_level_loss else "seq-mean-token-mean"
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if not (isinstance(loss_scale_factor, (int, float)) and loss_scale_factor > 0):
                raise ValueError(
                    "seq-mean-token-sum-norm needs loss_scale_factor > 0, a constant (the rollout's max new tokens: "
                    f"--rollout.max_new_tokens), got {loss_scale_factor!r}"
                )
        elif loss_scale_factor is not None:
            raise ValueError(f"loss_scale_factor applies to seq-mean-token-sum-norm only, not {loss_agg_mode}")
        self.loss_agg_mode, self.loss_scale_factor = loss_agg_mode, loss_scale_factor
        token_level_loss = loss_agg_mode == "token-mean"  # the mode decides (the actor passes the same)
        if dual_clip is not None:
            if not takes_dual_clip:
                raise ValueError(f"dual_clip does not apply to {policy_loss_type}{why_no_dual_clip}")
            if not dual_clip > 1.0:
                raise ValueError(f"dual_clip must be > 1.0, got {dual_clip}")
        self.is_correction = ISCorrection(is_correction_level, is_correction_mode, is_correction_gating,
                                          tuple(is_correction_threshold))  # fmt: skip
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.dual_clip = dual_clip
        self.policy_loss_type = policy_loss_type
        # a sequence-level loss is aggregated over sequences whatever loss_agg_mode (as OpenRLHF's gspo)
        self.token_level_loss = token_level_loss and not self.sequence_level
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = is_correction_threshold
        self.loss_metrics: dict[str, Tensor] = {}

    def token_loss(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor | None,
        rollout_log_probs: Tensor | None,
        **call,
    ) -> TokenLoss:
        """The loss per token (or per sequence), the tokens the clip ratio counts, and the metrics."""
        raise NotImplementedError

    def kl_log_ratio(self, log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
        """log r for ppo_kl: in the promoted dtype (the band's; an objective casts old_log_probs to log_probs')."""
        return log_probs - old_log_probs

    def forward(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor | None = None,
        rollout_log_probs: Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
        **call,
    ):
        """OpenRLHF's PolicyLoss.forward: (B, T) log-probs (natural log) of the current and old policy,
        advantages per token (B, T) or per sequence (B, 1) / (B,), the action mask (B, T), the rollout engine's
        log-probs (B, T) for the IS correction, and the global counts of OpenRLHF's aggregation. `call`: the
        loss's own per-call inputs (the band's `delta`, `entropy`). Returns OpenRLHF's 5-tuple."""
        from openrlhf.models.loss import aggregate_loss
        from openrlhf.models.utils import masked_mean

        if old_log_probs.shape != log_probs.shape:
            raise ValueError(
                f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
            )
        out = self.token_loss(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **call)
        loss = out.loss
        live = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask != 0

        # train/rollout IS correction, as OpenRLHF 0.11.2's PolicyLoss ("ppo" branch)
        vllm_kl = is_filter_ratio = None
        if self.is_correction.on:
            coef, vllm_kl, is_filter_ratio = self.is_correction.coefficients(old_log_probs, rollout_log_probs,
                                                                             action_mask)  # fmt: skip
            if self.sequence_level:  # the per-token weights' geometric mean per sequence (verl's geo_mean)
                weights = live.to(coef.dtype)
                coef = torch.exp((torch.log(coef + 1e-10) * weights).sum(-1) / (weights.sum(-1) + 1e-8))
            loss = coef * loss

        if self.sequence_level:
            # OpenRLHF's per-sample aggregation of per-sequence losses: a sum over the sequences that have a
            # token, over the global sample count (else their number), times dp_size (its aggregate_loss would
            # first divide each by its count 1 + 1e-8)
            loss = mean_over_sequences(loss, live, dp_size, global_batch_size)
        else:
            loss = torch.where(live, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
            if self.loss_agg_mode in OPENRLHF_AGG_MODES:
                loss = aggregate_loss(
                    loss,
                    action_mask,
                    token_level_loss=self.token_level_loss,
                    dp_size=dp_size,
                    batch_num_tokens=batch_num_tokens,
                    global_batch_size=global_batch_size,
                )
            else:
                loss = mean_over_sequences(loss.sum(dim=-1), live, dp_size, global_batch_size)
                if self.loss_agg_mode == "seq-mean-token-sum-norm":
                    loss = loss / self.loss_scale_factor
        clip_ratio = masked_mean(out.clipped.float(), action_mask, dim=None)
        # masked positions may hold anything (nan, inf): nothing of them reaches the mean
        log_ratio = torch.where(live, self.kl_log_ratio(log_probs, old_log_probs).detach(), 0.0)
        ppo_kl = masked_mean(-log_ratio, action_mask, dim=None)
        self.loss_metrics = out.metrics
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio
