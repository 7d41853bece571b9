"""Objectives whose ratio is against the sampler: DRPO (UniRL) and IPO (prime-rl), as their authors' code
computes them, in OpenRLHF's conventions (a loss to minimise per token; the caller aggregates).

Both take r = pi / mu with mu the rollout engine's probability of the sampled token (vLLM's log-probs,
which OpenRLHF passes as `rollout_log_probs`), not the recomputed pi_old: in their code there is no
separate old policy (UniRL's DRPO can take a train-side pi_old in mu's place, `old_logp_source
replay`). The tests hold each to its source, copied verbatim into tests/support/authors_losses.py.

- DRPO, Tencent-Hunyuan/UniRL `unirl/algorithms/drpo.py` `_drpo_loss` (lines 97-159) at
  1a7b501e8fe8517b432a130220d2ff462f9b5afa; arXiv 2606.09821, "Rethinking the Divergence Regularization in
  LLM Reinforcement Learning", §3: L = -A r + |A| mu (r - 1)^2 / (2 eps), r = exp(clamp(log pi - log mu,
  +-20)), A and mu without gradient: DPPO's binary-TV region |pi - mu| <= eps as a smooth penalty, whose
  gradient weight is 1 - sign(A (r - 1)) |pi - mu| / eps. Nothing is clipped or masked; with the authors'
  eps = 12.5 the weight stays in [0.92, 1.08] (|pi - mu| <= 1).
- IPO, PrimeIntellect-ai/prime-rl `src/prime_rl/trainer/rl/loss.py` `ipo_loss_fn` (lines 164-196) at
  559b44772e471d1538537b8805cc77f3824a5e64 (an opt-in loss there, `type = "ipo"`; prime-rl's default from
  02bdca2e to ff4b125e, with thresholds 0.2): L = -keep adv_tau A r + kl_tau (log pi - log mu)^2, keep =
  |pi - mu| <= ipo_threshold; a masked token keeps the KL term. prime-rl sums over the loss tokens and
  divides by their number: OpenRLHF's token-mean.
"""

from __future__ import annotations

import torch

from openrlhf_band.objectives.registry import (
    ObjectiveLoss,
    ObjectiveOption,
    non_negative,
    one_of,
    positive,
    register_objective,
)
from openrlhf_band.ops.token_loss import LOG_RATIO_CLAMP

#: DRPO's mu: the sampler's log-probs (UniRL's default), or the loss's old log-probs, OpenRLHF's recomputed pi_old
#: (UniRL's "replay": a train-side pi_old at the pre-update weights)
DRPO_MU_SOURCES = ("rollout", "replay")


@register_objective(
    "drpo",
    options=(
        ObjectiveOption(
            "epsilon", 12.5, "drpo_epsilon",
            "DRPO's regularization threshold eps (delta in the paper): the penalty |A| mu (r - 1)^2 / (2 eps)",
            positive,
        ),
        ObjectiveOption(
            "old_logp_source", "rollout", "old_logp_source",
            "mu, the probability r and the penalty are against: rollout (vLLM's log-probs of the sampled tokens) or "
            "replay (OpenRLHF's recomputed pi_old)",
            one_of(DRPO_MU_SOURCES),
            choices=DRPO_MU_SOURCES,
        ),
    ),  # fmt: skip
    verl_name=None,
    code="UniRL 1a7b501e (unirl/algorithms/drpo.py)",
    source="DRPO: Rethinking the Divergence Regularization in LLM Reinforcement Learning, arXiv 2606.09821",
    sequence_level=False,
    uses_clip_eps=False,
    takes_dual_clip=False,
    clip_ratio_means="share of tokens beyond DRPO's boundary |r - 1| > eps / mu, where the penalty's gradient "
    "outweighs the policy gradient's (UniRL's clipfrac_upper + clipfrac_lower: diagnostics; DRPO clips nothing)",
    metric_docs={
        "penalty_mean": "mean of the penalty |A| mu (r - 1)^2 / (2 eps) (UniRL's drpo_penalty_mean)",
        "beyond_upper": "share of tokens with r > 1 + eps / mu (UniRL's clipfrac_upper)",
        "beyond_lower": "share of tokens with r < 1 - eps / mu (UniRL's clipfrac_lower)",
    },
    reads_rollout_log_probs=lambda options: options["old_logp_source"] == "rollout",
)
def drpo(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, epsilon,
         old_logp_source, rollout_log_probs=None):  # fmt: skip
    """Per token -A r + |A| mu (r - 1)^2 / (2 epsilon), r = exp(clamp(log pi - log mu, +-20)), mu without
    gradient: the sampler's (`rollout_log_probs`) or, with old_logp_source replay, `old_log_probs`."""
    mu_log = rollout_log_probs if old_logp_source == "rollout" else old_log_probs
    log_ratio = (log_probs - mu_log).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    mu = mu_log.detach().exp()
    penalty = advantages.abs() * mu * (ratio - 1.0).square() / (2.0 * epsilon)
    loss = -advantages * ratio + penalty
    with torch.no_grad():
        boundary = torch.where(mu > 0.0, epsilon / mu, torch.full_like(mu, float("inf")))
        upper, lower = ratio.detach() > 1.0 + boundary, ratio.detach() < 1.0 - boundary
    return ObjectiveLoss(loss, upper | lower, {"penalty_mean": penalty.detach(), "beyond_upper": upper,
                                               "beyond_lower": lower})  # fmt: skip


@register_objective(
    "ipo",
    options=(
        ObjectiveOption(
            "ipo_threshold", 0.1, "trainer.loss.ipo_threshold",
            "IPO's trust region: a token with |pi - mu| above it gets no policy gradient (it keeps the KL term)",
            non_negative,
        ),
        ObjectiveOption("adv_tau", 1.0, "trainer.loss.adv_tau", "the advantages' scale", non_negative),
        ObjectiveOption(
            "kl_tau", 1e-3, "trainer.loss.kl_tau", "the weight of the KL term (log pi - log mu)^2 on every token",
            non_negative,
        ),
    ),  # fmt: skip
    verl_name=None,
    code="prime-rl 559b4477 (src/prime_rl/trainer/rl/loss.py)",
    source="IPO, INTELLECT Policy Optimization (prime-rl's ipo_loss_fn; DPPO's binary-TV mask, arXiv 2602.04879, "
    "independent of the advantage's sign, plus Kimi K2.5's squared log-ratio KL, arXiv 2602.02276)",
    sequence_level=False,
    uses_clip_eps=False,
    takes_dual_clip=False,
    clip_ratio_means="share of tokens masked: |pi - mu| > ipo_threshold (prime-rl's is_masked)",
    metric_docs={
        "masked_frac": "share of tokens with |pi - mu| > ipo_threshold: no policy gradient (prime-rl's is_masked)",
        "mismatch_kl": "mean of r - log r - 1 (the k3 KL of pi to mu; prime-rl logs it over masked and unmasked "
        "tokens apart)",
    },
    reads_rollout_log_probs=lambda options: True,
)
def ipo(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, ipo_threshold,
        adv_tau, kl_tau, rollout_log_probs=None):  # fmt: skip
    """Per token -keep adv_tau A r + kl_tau (log pi - log mu)^2, keep = |pi - mu| <= ipo_threshold, r = pi / mu
    against the sampler's log-probs (r's exponent clamped to +-20, as every ratio here; prime-rl's is not)."""
    log_ratio = log_probs - rollout_log_probs
    ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    masked = (log_probs.detach().exp() - rollout_log_probs.exp()).abs() > ipo_threshold
    keep = mask & ~masked
    loss = -keep.to(ratio.dtype) * (adv_tau * advantages) * ratio + kl_tau * log_ratio.square()
    with torch.no_grad():
        mismatch_kl = ratio.detach() - log_ratio.detach() - 1.0
    return ObjectiveLoss(loss, masked, {"masked_frac": masked, "mismatch_kl": mismatch_kl})

