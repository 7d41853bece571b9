"""`ObjectivePolicyLoss`: a registered objective (CISPO, SAPO, GMPO, Clip-Cov, KL-Cov, GPG, DRPO, IPO) behind
OpenRLHF 0.11.2's `PolicyLoss` interface, and `make_policy_loss`, the module the patched actor builds for any
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

from openrlhf_band.integration.metrics import token_mean
from openrlhf_band.integration.openrlhf_loss import OpenRLHFPolicyLoss, TokenLoss, openrlhf_arguments
from openrlhf_band.objectives.registry import get_objective, sampler_is_refusal
from openrlhf_band.ops.token_loss import broadcast_advantages

#: why a sequence-level objective refuses the token-level mask mode of the IS correction
GMPO_MASK_REFUSAL = (
    "a sequence-level objective (GMPO) takes the IS correction per token in clip mode (is_correction_mode clip) or "
    "per sequence (is_correction_level seq): token-level mask mode zeroes a filtered token's weight, and the "
    "per-sequence geometric mean of the weights would then scale its whole sequence by 1e-10^(1/n) (verl drops a "
    "rejected token from the mask instead)"
)


class ObjectivePolicyLoss(OpenRLHFPolicyLoss):
    """Drop-in for OpenRLHF 0.11.2's `PolicyLoss` computing a registered objective: the objective's per-token
    (or per-sequence) loss and metrics behind `OpenRLHFPolicyLoss`, which owns OpenRLHF's contract.

    Same constructor arguments as OpenRLHF's, positional or by name (`policy_loss_type` names the
    objective; the clip eps are its clip values where it has one, verl's clip_ratio_low /
    clip_ratio_high) plus the objective's options
    as keywords (`tau_pos=...`), and the same `forward` signature and 5-tuple `(loss, clip_ratio,
    ppo_kl, vllm_kl, is_filter_ratio)`. After each forward `loss_metrics` holds 0-d float32
    tensors `<objective>/<name>`, each the mean over the unmasked tokens (so that OpenRLHF's
    token-weighted reduction over micro-batches and ranks gives the step's value).

    Masked positions may hold anything (nan, inf): they never reach the loss, its gradient or a
    metric.
    """

    def __init__(self, *openrlhf_args, **options) -> None:
        shared, options = openrlhf_arguments(openrlhf_args, options, policy_loss_type="cispo")
        policy_loss_type, is_correction_level = shared["policy_loss_type"], shared["is_correction_level"]
        objective = get_objective(policy_loss_type)
        resolved = objective.resolve_options(options)
        if objective.name == "cispo" and resolved["bounds"] != "fixed":
            raise ValueError("CISPO with the band's bounds is make_policy_loss('cispo', bounds='band', ...)")
        shared["policy_loss_type"] = objective.name
        super().__init__(**shared, takes_dual_clip=objective.takes_dual_clip, sequence_level=objective.sequence_level,
                         why_no_dual_clip=" (it has no PPO-style clipped min)")  # fmt: skip
        for name in ("clip_eps_low", "clip_eps_high"):
            eps = shared[name]
            if objective.uses_clip_eps and not (isinstance(eps, (int, float)) and eps >= 0.0):
                raise ValueError(f"{name} must be a number >= 0, got {eps!r}")
        if objective.sequence_level and is_correction_level == "token" and shared["is_correction_mode"] == "mask":
            raise ValueError(GMPO_MASK_REFUSAL)
        self.reads_rollout_log_probs = objective.reads_rollout_log_probs(resolved)
        if self.reads_rollout_log_probs and is_correction_level != "off":
            raise ValueError(sampler_is_refusal(objective.name))
        self.objective = objective
        self.options = resolved

    def forward(self, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, action_mask: Tensor | None = None,
                *args, **kwargs):  # fmt: skip
        """OpenRLHF's PolicyLoss.forward; without an action mask every token counts (a mask of ones, as OpenRLHF's
        aggregation needs one)."""
        if action_mask is None:
            action_mask = torch.ones_like(log_probs)
        return super().forward(log_probs, old_log_probs, advantages, action_mask, *args, **kwargs)

    def kl_log_ratio(self, log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
        return log_probs - old_log_probs.to(log_probs.dtype)  # as the objective's own arithmetic

    def token_loss(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) -> TokenLoss:
        """The objective's loss per token (or per sequence) on finite stand-ins at masked positions."""
        live = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask != 0
        # masked positions: finite stand-ins before any arithmetic (no nan through 0 * nan, in the loss or the gradient)
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        new = torch.where(live, log_probs, zero)
        old = torch.where(live, old_log_probs.to(log_probs.dtype), zero)
        adv = torch.where(live, broadcast_advantages(advantages, log_probs.shape).to(log_probs.dtype), zero)
        sampler = {}
        if self.reads_rollout_log_probs:  # mu, the rollout engine's log-probs (DRPO, IPO)
            if rollout_log_probs is None:
                raise ValueError(
                    f"{self.objective.name} needs the rollout engine's log-probs (rollout_log_probs): its ratio is "
                    "against the sampler (train_ppo_ray asks vLLM for them with this loss)"
                )
            if rollout_log_probs.shape != log_probs.shape:
                raise ValueError(f"rollout_log_probs shape {tuple(rollout_log_probs.shape)} != log_probs shape "
                                 f"{tuple(log_probs.shape)}")  # fmt: skip
            mu = torch.where(live, rollout_log_probs.detach().to(log_probs.dtype), zero)
            if not bool(torch.isfinite(mu).all()):  # one host sync per micro-batch, as Clip-Cov's selection
                raise ValueError(
                    f"{self.objective.name}: the rollout engine's log-probs hold a non-finite value inside the action "
                    "mask; the ratio against them is undefined there"
                )
            sampler["rollout_log_probs"] = mu
        out = self.objective.function(
            new, old, adv, live, clip_eps_low=self.clip_eps_low, clip_eps_high=self.clip_eps_high,
            dual_clip=self.dual_clip, **self.options, **sampler,
        )  # fmt: skip
        return TokenLoss(out.loss, out.clipped, _token_shares(self.objective.name, out.metrics, live))


@torch.no_grad()
def _token_shares(prefix: str, metrics: dict[str, Tensor], live: Tensor) -> dict[str, Tensor]:
    count = live.sum().clamp(min=1)
    return {f"{prefix}/{name}": token_mean(values, live, count) for name, values in metrics.items()}


def make_policy_loss(name: str, **options) -> nn.Module:
    """The module OpenRLHF's actor builds for `--actor.policy_loss_type name` (OpenRLHF 0.11.2's
    `PolicyLoss.forward` contract), from the one registry the patched actor reads too
    (`openrlhf_band.integration.loss_registry`): OpenRLHF's `PolicyLoss` for ppo and gspo, `BandPolicyLoss`
    for band and for cispo with `bounds="band"`, `ObjectivePolicyLoss` for the registered objectives.

    Options are named as the flags' last component: OpenRLHF's constructor arguments
    (`clip_eps_low`, `clip_eps_high`, `dual_clip`, `token_level_loss`, `is_correction_*`), an
    objective's (`tau_pos`, `clip_cov_ratio`, `bounds`, ...), the band's (`divergence`, `delta`,
    `upper_cap`, `lower_floor`, ..., or `band=BandSpec(...)`, `backend`, the adaptive radius').

        make_policy_loss("sapo", tau_pos=1.0, tau_neg=1.05, token_level_loss=False)
        make_policy_loss("cispo", bounds="band", divergence="kl", delta=0.05, lower_floor=0.8)
    """
    from openrlhf_band.integration.loss_registry import loss_entry

    entry = loss_entry(name, options.get("bounds"))
    if entry.band_bounds:
        options.pop("bounds", None)
    return entry.module()(policy_loss_type=name, **options)
