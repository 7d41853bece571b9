"""The field's objectives, each a registered entry: CISPO, SAPO, GMPO, Clip-Cov, KL-Cov and GPG, as verl
0.9.1 computes them (`verl/trainer/ppo/core_algos.py`: cispo, sapo, geo_mean, clip_cov, kl_cov, gpg), in
OpenRLHF's conventions (a loss to minimise; the caller aggregates). The tests hold each to verl's own
function, run from the installed wheel (tests/support/verl_objectives.py).

One convention differs from verl's, everywhere: every objective with a ratio clamps log r = log pi - log pi_old to
[-20, 20] before exp, as OpenRLHF's ppo loss and verl's cispo and sapo do (verl's clip_cov, kl_cov
and geo_mean do not). The two differ only for a ratio beyond e^20, where verl's loss overflows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from openrlhf_band.objectives.registry import (
    ObjectiveLoss,
    ObjectiveOption,
    finite,
    non_negative,
    one_of,
    positive,
    register_objective,
    share,
)
from openrlhf_band.ops.token_loss import LOG_RATIO_CLAMP

CISPO_BOUNDS = ("fixed", "band")
#: SAPO's gate f(r) = sigmoid(tau (r - 1)) 4 / tau has the gradient weight 4 s (1 - s) r relative to the
#: plain policy gradient's r (s the sigmoid). A token is counted as gated when that factor 4 s (1 - s)
#: is below one half: |tau (r - 1)| > 2 acosh(sqrt(2)) = 1.7627 (the SAPO analogue of a clip fraction).
SAPO_GATED_BELOW = 0.5


def _log_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    return (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """OpenRLHF's masked_mean over all elements, sum(values * mask) / sum(mask) (verl's adds 1e-8 to the
    count: nothing in float32, ~1e-13 relative in float64)."""
    return (values * mask).sum() / mask.sum()


def cispo_token_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, lower: Tensor | float, upper: Tensor | float
) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO's per-token loss -sg(clip(r, lower, upper)) A log pi (arXiv 2506.13585), with the bounds
    fixed numbers (CISPO's 1 - eps_low, 1 + eps_high) or per-token tensors (the band's). Returns
    (loss, clipped above: r > upper, clipped below: r < lower); the clip acts on the weight for
    either sign of A, and no token loses its gradient (its weight is bounded instead)."""
    ratio = _log_ratio(log_probs.detach(), old_log_probs).exp()
    weight = torch.clamp(ratio, lower, upper)
    loss = -weight * advantages * log_probs
    return loss, ratio > upper, ratio < lower


@register_objective(
    "cispo",
    options=(
        ObjectiveOption(
            "bounds",
            "fixed",
            "none: ours (verl's cispo clips to [1 - clip_ratio_low, 1 + clip_ratio_high])",
            "the interval the importance weight is clipped to: fixed, [1 - EPS_LOW, 1 + EPS_HIGH] from "
            "--actor.eps_clip_low_high (verl's clip_ratio_low / clip_ratio_high); band, the band's per-token "
            "[r_low(p), r_up(p)] from the --actor.band.* flags (--band_divergence, --band_delta, the cap, the "
            "floor, the adaptive radius)",
            one_of(CISPO_BOUNDS),
            choices=CISPO_BOUNDS,
        ),
    ),
    verl_name="cispo",
    source="MiniMax-M1, arXiv 2506.13585",
    sequence_level=False,
    uses_clip_eps=True,
    takes_dual_clip=False,
    clip_ratio_means="share of tokens whose weight was clipped (r outside the bounds, either sign of A)",
    metric_docs={
        "clip_frac": "share of tokens with r outside the bounds (verl's actor/pg_clipfrac)",
        "clip_frac_upper": "share with r > the upper bound",
        "clip_frac_lower": "share with r < the lower bound",
    },
)
def cispo(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, bounds):
    if bounds != "fixed":
        raise ValueError("CISPO with the band's bounds is BandPolicyLoss(policy_loss_type='cispo')")
    loss, above, below = cispo_token_loss(log_probs, old_log_probs, advantages, 1 - clip_eps_low, 1 + clip_eps_high)
    clipped = above | below
    return ObjectiveLoss(loss, clipped, {"clip_frac": clipped, "clip_frac_upper": above, "clip_frac_lower": below})


@register_objective(
    "sapo",
    options=(
        ObjectiveOption(
            "tau_pos", 1.0, "actor_rollout_ref.actor.tau_pos", "SAPO's gate temperature for tokens with A > 0", positive
        ),  # fmt: skip
        ObjectiveOption(
            "tau_neg",
            1.05,
            "actor_rollout_ref.actor.tau_neg",
            "SAPO's gate temperature for tokens with A <= 0",
            positive,
        ),  # fmt: skip
    ),
    verl_name="sapo",
    source="Soft Adaptive Policy Optimization, arXiv 2511.20347",
    sequence_level=False,
    uses_clip_eps=False,
    takes_dual_clip=False,
    clip_ratio_means=f"share of tokens gated: gradient factor 4 s (1 - s) < {SAPO_GATED_BELOW}",
    metric_docs={
        "gate_weight_mean": "mean of the gate's gradient factor 4 s (1 - s), s = sigmoid(tau (r - 1)): 1 at r = 1 "
        "(verl logs none: its pg_clipfrac is 0 for SAPO)",
        "gated_frac": f"share of tokens whose factor is below {SAPO_GATED_BELOW}",
    },
)
def sapo(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, tau_pos, tau_neg):
    ratio = _log_ratio(log_probs, old_log_probs).exp()
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = -gate * advantages
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio.detach() - 1.0))
        factor = 4.0 * s * (1.0 - s)
        gated = factor < SAPO_GATED_BELOW
    return ObjectiveLoss(loss, gated, {"gate_weight_mean": factor, "gated_frac": gated})


@register_objective(
    "gmpo",
    options=(),
    verl_name="geo_mean",
    source="Geometric-Mean Policy Optimization, arXiv 2507.20673",
    sequence_level=True,
    uses_clip_eps=True,
    takes_dual_clip=False,
    clip_ratio_means="share of tokens with A != 0 whose log-ratio the clip moved (clip_frac_upper + clip_frac_lower)",
    metric_docs={
        "clip_frac_upper": "share of tokens with A > 0 whose log r is outside [-eps_low, eps_high] (verl's "
        "actor/pg_clipfrac)",
        "clip_frac_lower": "share with A < 0 and log r outside it (verl's actor/pg_clipfrac_lower)",
    },
)
def gmpo(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip):
    """Per sequence: -A_seq exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -eps_low, eps_high))),
    A_seq the mean advantage of its tokens. The clip values act on log r (GMPO clips in log space)."""
    log_ratio = _log_ratio(log_probs, old_log_probs)
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-clip_eps_low, clip_eps_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clamped)
    tokens = mask.to(log_ratio.dtype).sum(dim=-1)  # a float count, as verl's float mask gives
    seq_ratio = torch.exp((kept * mask).sum(dim=-1) / (tokens + 1e-8))
    seq_advantage = (advantages * mask).sum(dim=-1) / (tokens + 1e-8)
    loss = -seq_advantage * seq_ratio
    with torch.no_grad():
        moved = log_ratio.detach() != clamped.detach()
        upper, lower = moved & (advantages > 0), moved & (advantages < 0)
    return ObjectiveLoss(loss, upper | lower, {"clip_frac_upper": upper, "clip_frac_lower": lower})


@register_objective(
    "gpg",
    options=(),
    verl_name="gpg",
    source="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv 2504.02546",
    sequence_level=False,
    uses_clip_eps=False,
    takes_dual_clip=False,
    clip_ratio_means="0: GPG clips nothing (no ratio; verl's gpg logs no clip fraction)",
    metric_docs={},
)
def gpg(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip):
    """-A log pi per token: the plain policy gradient, no ratio and no clip (verl's compute_policy_loss_gpg).
    The old log-probs are not read: the update is on-policy by construction, whatever the mini-batches."""
    loss = -advantages * log_probs
    return ObjectiveLoss(loss, torch.zeros_like(mask, dtype=torch.bool), {})


def _ppo_clip_losses(ratio: Tensor, advantages: Tensor, clip_eps_low: float, clip_eps_high: float):
    return -advantages * ratio, -advantages * ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high)


@register_objective(
    "clip_cov",
    options=(
        ObjectiveOption(
            "clip_cov_ratio",
            0.0002,
            "actor_rollout_ref.actor.policy_loss.clip_cov_ratio",
            "share of a micro-batch's tokens whose gradient is detached",
            share,
        ),  # fmt: skip
        ObjectiveOption(
            "clip_cov_lb",
            1.0,
            "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
            "lower bound of the covariance a token needs to be eligible",
            finite,
        ),  # fmt: skip
        ObjectiveOption(
            "clip_cov_ub",
            5.0,
            "actor_rollout_ref.actor.policy_loss.clip_cov_ub",
            "upper bound of the covariance of an eligible token",
            finite,
        ),  # fmt: skip
    ),
    check_together=lambda o: (
        None
        if o["clip_cov_lb"] < o["clip_cov_ub"]
        else (f"clip_cov_lb must be < clip_cov_ub, got {o['clip_cov_lb']} and {o['clip_cov_ub']}")
    ),
    verl_name="clip_cov",
    source="The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617",
    sequence_level=False,
    uses_clip_eps=True,
    takes_dual_clip=True,
    clip_ratio_means="share of tokens clipped by the PPO clip (OpenRLHF's ppo definition)",
    metric_docs={
        "selected_frac": "share of tokens chosen by covariance and detached (verl's actor/pg_clipfrac)",
        "eligible_frac": "share whose covariance lies in (clip_cov_lb, clip_cov_ub) and that the clip (and a dual "
        "clip) left alone",
        "clip_frac": "share clipped by the PPO clip (the ratio outside [1 - eps_low, 1 + eps_high], the clipped "
        "branch active)",
    },
)
def clip_cov(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, clip_cov_ratio,
             clip_cov_lb, clip_cov_ub):  # fmt: skip
    """PPO's clipped loss, with a random `clip_cov_ratio` share of the tokens whose centred covariance
    (A - mean A)(log pi - mean log pi) lies in (lb, ub), among those the clip left alone, taken out
    (loss 0 and no gradient, as verl's).
    The random choice is verl's: `torch.randperm` of the eligible tokens (in row-major order) from
    torch's default CPU generator, so the same generator state selects the same tokens."""
    ratio = _log_ratio(log_probs, old_log_probs).exp()
    unclipped, clipped_loss = _ppo_clip_losses(ratio, advantages, clip_eps_low, clip_eps_high)
    clipped = (clipped_loss > unclipped) & mask
    with torch.no_grad():
        weights = mask.to(advantages.dtype)
        detached = log_probs.detach()
        cov = (advantages - _masked_mean(advantages, weights)) * (detached - _masked_mean(detached, weights))
        eligible = (cov > clip_cov_lb) & (cov < clip_cov_ub) & mask & ~clipped
        if dual_clip is not None:  # a token the dual clip holds at -c A has no gradient already: not a candidate
            eligible &= ~((advantages < 0) & (-dual_clip * advantages < torch.maximum(unclipped, clipped_loss)))
        count = max(int(clip_cov_ratio * weights.sum().item()), 1)
        candidates = torch.nonzero(eligible)
        selected = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
        if len(candidates) > 0:
            chosen = candidates[torch.randperm(len(candidates))[: min(count, len(candidates))]]
            selected[chosen[:, 0], chosen[:, 1]] = True
    loss = torch.maximum(unclipped, clipped_loss)
    if dual_clip is not None:  # OpenRLHF's dual clip (verl's clip_cov has none)
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    loss = torch.where(selected, 0.0, loss)  # verl multiplies by 0: no gradient, and no value
    return ObjectiveLoss(loss, clipped, {"selected_frac": selected, "eligible_frac": eligible, "clip_frac": clipped})


@register_objective(
    "kl_cov",
    options=(
        ObjectiveOption(
            "kl_cov_ratio",
            0.0002,
            "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
            "share of a micro-batch's tokens that get the KL penalty",
            share,
        ),  # fmt: skip
        # verl 0.9.1's config default (actor.yaml) is 0.1; its function falls back to 1.0 only without a config
        # value, which its trainer never lacks; the paper's scripts (verl recipe/entropy) pass 1
        ObjectiveOption(
            "ppo_kl_coef",
            0.1,
            "actor_rollout_ref.actor.policy_loss.ppo_kl_coef",
            "coefficient of the penalty |log r| on the selected tokens",
            non_negative,
        ),  # fmt: skip
    ),
    verl_name="kl_cov",
    source="The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617",
    sequence_level=False,
    uses_clip_eps=False,
    takes_dual_clip=False,
    clip_ratio_means="share of tokens selected for the KL penalty (KL-Cov has no clip)",
    metric_docs={
        "selected_frac": "share of tokens with the largest covariance, penalised by ppo_kl_coef |log r|",
        "abs_kl": "mean |log r| over the tokens (verl's actor/ppo_kl for kl_cov; ppo_kl stays OpenRLHF's signed mean)",
    },
)
def kl_cov(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, kl_cov_ratio,
           ppo_kl_coef):  # fmt: skip
    """The unclipped policy gradient loss -A r, plus ppo_kl_coef |log r| on the top `kl_cov_ratio`
    share of the tokens by centred covariance (A - mean A)(log pi - mean log pi) (at least one)."""
    log_ratio = _log_ratio(log_probs, old_log_probs)
    loss = -advantages * log_ratio.exp()
    selected = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)  # contiguous: written through view
    valid = torch.nonzero(mask.reshape(-1), as_tuple=True)[0]
    if len(valid) > 0:
        with torch.no_grad():
            # on the CPU, as verl computes it: the same sums, so the same top tokens
            valid_advantages = advantages[mask].detach().reshape(-1).cpu()
            valid_log_probs = log_probs[mask].detach().reshape(-1).cpu()
            cov = (valid_advantages - valid_advantages.mean()) * (valid_log_probs - valid_log_probs.mean())
            top = torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices
            selected.view(-1)[valid[top.to(valid.device)]] = True
    loss = torch.where(selected, loss + ppo_kl_coef * log_ratio.abs(), loss)
    return ObjectiveLoss(loss, selected, {"selected_frac": selected, "abs_kl": log_ratio.detach().abs()})
