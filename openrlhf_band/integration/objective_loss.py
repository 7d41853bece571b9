"""`ObjectivePolicyLoss`: a registered objective (CISPO, SAPO, GMPO, Clip-Cov, KL-Cov) behind OpenRLHF
0.11.2's `PolicyLoss` interface, and `make_policy_loss`, the module the patched actor builds for any
`--actor.policy_loss_type`.

Conventions against verl 0.9.1's functions (the tests hold each mapping):
- sign: both return a loss to minimise (verl's pg_loss; OpenRLHF's first output).
- aggregation: OpenRLHF's `aggregate_loss` with its global token / sample counts: token-mean is
  verl's token-mean, seq-mean-token-mean verl's seq-mean-token-mean. Two objectives fix their own in
  verl: SAPO always seq-mean-token-mean there, here the flag's (the SAPO scripts pass
  seq-mean-token-mean); GMPO (verl's geo_mean) is per sequence, averaged over a micro-batch's
  sequences in verl, here over the step's sequences (OpenRLHF's global sample count, as its gspo),
  which is verl's mean when no sequence is fully masked and the micro-batch is the step.
- IS correction: OpenRLHF's coefficient per token (--algo.advantage.is_correction_*) multiplies each
  token's loss, as verl's rollout_is_weights (GMPO: their per-sequence geometric mean, as verl's
  geo_mean; GMPO refuses token-level mask mode, whose zero weights have no such mean). In mask mode
  a filtered token keeps its place in the counts and in Clip-Cov's / KL-Cov's covariance, as in
  OpenRLHF's PolicyLoss (verl's rejection removes it from the mask).
- metrics: OpenRLHF's ppo_clip_ratio holds the objective's clip / gate / selection share (the
  entry's clip_ratio_means), ppo_kl OpenRLHF's signed mean; `<objective>/<name>` the entry's metrics.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from openrlhf_band.integration.is_correction import ISCorrection
from openrlhf_band.integration.metrics import token_mean
from openrlhf_band.objectives.registry import get_objective
from openrlhf_band.ops.token_loss import broadcast_advantages

#: why a sequence-level objective refuses the token-level mask mode of the IS correction
GMPO_MASK_REFUSAL = (
    "a sequence-level objective (GMPO) takes the IS correction per token in clip mode (is_correction_mode clip) or "
    "per sequence (is_correction_level seq): token-level mask mode zeroes a filtered token's weight, and the "
    "per-sequence geometric mean of the weights would then scale its whole sequence by 1e-10^(1/n) (verl drops a "
    "rejected token from the mask instead)"
)


class ObjectivePolicyLoss(nn.Module):
    """Drop-in for OpenRLHF 0.11.2's `PolicyLoss` computing a registered objective.

    Same constructor arguments (`policy_loss_type` names the objective; the clip eps are its clip
    values where it has one, verl's clip_ratio_low / clip_ratio_high) plus the objective's options
    as keywords (`tau_pos=...`), and the same `forward` signature and 5-tuple `(loss, clip_ratio,
    ppo_kl, vllm_kl, is_filter_ratio)`. After each forward `loss_metrics` holds 0-d float32
    tensors `<objective>/<name>`, each the mean over the unmasked tokens (so that OpenRLHF's
    token-weighted reduction over micro-batches and ranks gives the step's value).

    Masked positions may hold anything (nan, inf): they never reach the loss, its gradient or a
    metric.
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float | None = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "cispo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold=(0.5, 5.0),
        **options,
    ) -> None:
        super().__init__()
        objective = get_objective(policy_loss_type)
        self.options = objective.resolve_options(options)
        if objective.name == "cispo" and self.options["bounds"] != "fixed":
            raise ValueError("CISPO with the band's bounds is make_policy_loss('cispo', bounds='band', ...)")
        if dual_clip is not None:
            if not objective.takes_dual_clip:
                raise ValueError(f"dual_clip does not apply to {objective.name} (it has no PPO-style clipped min)")
            if not dual_clip > 1.0:
                raise ValueError(f"dual_clip must be > 1.0, got {dual_clip}")
        for name, eps in (("clip_eps_low", clip_eps_low), ("clip_eps_high", clip_eps_high)):
            if objective.uses_clip_eps and not (isinstance(eps, (int, float)) and eps >= 0.0):
                raise ValueError(f"{name} must be a number >= 0, got {eps!r}")
        self.objective = objective
        self.policy_loss_type = objective.name
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.dual_clip = dual_clip
        # a sequence-level objective is aggregated over sequences whatever loss_agg_mode (as OpenRLHF's gspo)
        self.token_level_loss = token_level_loss and not objective.sequence_level
        self.is_correction = ISCorrection(is_correction_level, is_correction_mode, is_correction_gating,
                                          tuple(is_correction_threshold))  # fmt: skip
        if objective.sequence_level and is_correction_level == "token" and is_correction_mode == "mask":
            raise ValueError(GMPO_MASK_REFUSAL)
        self.loss_metrics: dict[str, Tensor] = {}

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
    ):
        """OpenRLHF's PolicyLoss.forward: (B, T) log-probs (natural log) of the current and old policy,
        advantages per token (B, T) or per sequence (B, 1) / (B,), the action mask (B, T)."""
        from openrlhf.models.loss import aggregate_loss
        from openrlhf.models.utils import masked_mean

        if old_log_probs.shape != log_probs.shape:
            raise ValueError(
                f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
            )
        if action_mask is None:
            action_mask = torch.ones_like(log_probs)
        live = action_mask != 0
        # masked positions: finite stand-ins before any arithmetic (no nan through 0 * nan, in the loss or the gradient)
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        new = torch.where(live, log_probs, zero)
        old = torch.where(live, old_log_probs.to(log_probs.dtype), zero)
        adv = torch.where(live, broadcast_advantages(advantages, log_probs.shape).to(log_probs.dtype), zero)
        out = self.objective.function(
            new, old, adv, live, clip_eps_low=self.clip_eps_low, clip_eps_high=self.clip_eps_high,
            dual_clip=self.dual_clip, **self.options,
        )  # fmt: skip
        loss = out.loss

        vllm_kl = is_filter_ratio = None
        if self.is_correction.on:
            coef, vllm_kl, is_filter_ratio = self.is_correction.coefficients(old_log_probs, rollout_log_probs,
                                                                             action_mask)  # fmt: skip
            if self.objective.sequence_level:  # the per-token weights' geometric mean per sequence (verl's geo_mean)
                weights = live.to(coef.dtype)
                coef = torch.exp((torch.log(coef + 1e-10) * weights).sum(-1) / (weights.sum(-1) + 1e-8))
            loss = coef * loss

        if self.objective.sequence_level:
            # OpenRLHF's per-sample aggregation of per-sequence losses: a sum over the sequences that have a
            # token, over the global sample count (else their number), times dp_size (its aggregate_loss would
            # first divide each by its count 1 + 1e-8)
            has_tokens = live.any(dim=-1).to(loss.dtype)
            total = (loss * has_tokens).sum()
            loss = total / has_tokens.sum().clamp(min=1) if global_batch_size is None else (
                total / global_batch_size * dp_size
            )
        else:
            loss = aggregate_loss(
                torch.where(live, loss, zero),
                action_mask,
                token_level_loss=self.token_level_loss,
                dp_size=dp_size,
                batch_num_tokens=batch_num_tokens,
                global_batch_size=global_batch_size,
            )
        clip_ratio = masked_mean(out.clipped.float(), action_mask, dim=None)
        ppo_kl = masked_mean(-(new - old).detach(), action_mask, dim=None)
        self.loss_metrics = _token_shares(self.objective.name, out.metrics, live)
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio


@torch.no_grad()
def _token_shares(prefix: str, metrics: dict[str, Tensor], live: Tensor) -> dict[str, Tensor]:
    count = live.sum().clamp(min=1)
    return {f"{prefix}/{name}": token_mean(values, live, count) for name, values in metrics.items()}


def make_policy_loss(name: str, **options) -> nn.Module:
    """The module OpenRLHF's actor builds for `--actor.policy_loss_type name` (OpenRLHF 0.11.2's
    `PolicyLoss.forward` contract): OpenRLHF's `PolicyLoss` for ppo and gspo, `BandPolicyLoss` for
    band and for cispo with `bounds="band"`, `ObjectivePolicyLoss` for the registered objectives.

    Options are named as the flags' last component: OpenRLHF's constructor arguments
    (`clip_eps_low`, `clip_eps_high`, `dual_clip`, `token_level_loss`, `is_correction_*`), an
    objective's (`tau_pos`, `clip_cov_ratio`, `bounds`, ...), the band's (`divergence`, `delta`,
    `upper_cap`, `lower_floor`, ..., or `band=BandSpec(...)`, `backend`, the adaptive radius').

        make_policy_loss("sapo", tau_pos=1.0, tau_neg=1.05, token_level_loss=False)
        make_policy_loss("cispo", bounds="band", divergence="kl", delta=0.05, lower_floor=0.8)
    """
    if name in ("ppo", "gspo"):
        from openrlhf.models.loss import PolicyLoss

        return PolicyLoss(policy_loss_type=name, **options)
    if name == "band" or (name == "cispo" and options.get("bounds") == "band"):
        from openrlhf_band.integration.policy_loss import BandPolicyLoss

        options.pop("bounds", None)
        return BandPolicyLoss(policy_loss_type=name, **options)
    return ObjectivePolicyLoss(policy_loss_type=name, **options)
