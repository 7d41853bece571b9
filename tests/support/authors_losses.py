"""The authors' own loss code for DRPO and IPO, copied verbatim: the ground truth of
tests/objectives/test_sampler_objectives.py (neither is in verl 0.9.1's wheel, and neither project is on PyPI).

- `_drpo_loss`: Tencent-Hunyuan/UniRL, unirl/algorithms/drpo.py lines 97-159 at commit
  1a7b501e8fe8517b432a130220d2ff462f9b5afa (blob f80845b4849cee28ab5adde49f037fa6c760cf3a, unchanged since the
  first release a1f85967). "Tencent is pleased to support the open source community by making UniRL available.
  Copyright (C) 2026 Tencent. All rights reserved. UniRL is licensed under the Apache-2.0."
- `_safe_mean` (lines 94-97), `compute_importance_ratio_and_mismatch_kl` (100-106) and `ipo_loss_fn` (164-196):
  PrimeIntellect-ai/prime-rl, src/prime_rl/trainer/rl/loss.py at commit 559b44772e471d1538537b8805cc77f3824a5e64
  (blob 7d9dcce88b8fc27ca5e3d486ce1bd26fd2e7ff2a), Apache-2.0. `LossInputs` / `LossOutputs` are the same file's
  dataclasses without their jaxtyping annotations, `IPOLossConfig` the defaults of
  packages/prime-rl-configs/src/prime_rl/configs/trainer.py lines 510-519 as a dataclass (theirs is pydantic).

Read with `git show <commit>:<path>` from the snapshots the library's `fetch` brought (github:<owner>/<name>); the
function bodies below are those lines, unedited but for this docstring and the imports.
"""

# ruff: noqa  (the authors' code as they wrote it: not restyled)
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch
from torch import Tensor

# ---------------------------------------------------------------- UniRL 1a7b501e, unirl/algorithms/drpo.py:97-159
def _drpo_loss(
    *,
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    mu_weighted: bool = True,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """DRPO per-token loss (paper §3; gradient = Eq 9, weight = Table 1).

    Operates on packed-varlen ``[total_tokens]`` tensors (the natural setting for
    DRPO, which targets discrete token-level policies). Per token::

        L_t = −A_t · r_t  +  |A_t| · μ · (r_t − 1)² / (2 · ε)

    where ``r_t = π/μ`` is the importance ratio, ``μ = exp(old_logp)`` is the
    rollout-policy token probability, and ``ε`` is the regularization threshold
    (12.5, §4). The first term is the importance-weighted policy gradient; the
    second is SPO's advantage-weighted quadratic regularizer (§2.3, Eq 5) carrying
    the Binary-TV's token-adaptive ``ε_t = ε / μ`` (§3). ``r_t`` is kept
    differentiable (no ``.detach()``, no TIS truncation), so the smooth Table-1
    gradient weight ``1 − sign(Â_t(r_t−1)) · |π−μ| / δ`` arises via autograd.

    Mirrors verl ``compute_policy_loss_spo_adaptive_eps`` exactly.

    Args:
        new_logp: New-policy log-probs at current weights. ``[total_tokens]``.
        old_logp: Rollout-policy (μ) log-probs, frozen. ``[total_tokens]``.
        advantages: Per-token advantages (expanded from per-sample).
        epsilon: Regularization threshold ``ε`` (12.5).

    Returns:
        ``(loss_per_element, metrics_dict)``. Reduction is the caller's job.
    """
    log_diff = torch.clamp(new_logp - old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(log_diff)  # r_t = π/μ (differentiable through new_logp)
    adv = advantages.detach()
    old_prob = torch.exp(old_logp).detach()  # μ = rollout-policy token probability

    # SPO advantage-weighted quadratic (§2.3 Eq 5). mu_weighted=True applies the
    # Binary-TV token-adaptive trust region ε_t = ε / μ (§3, = verl
    # spo_adaptive_eps); False is plain SPO with a fixed ε (= verl `spo`,
    # reference run_qwen3_4b.sh LOSS_MODE=spo, clip_ratio=12.5).
    # r_t stays differentiable in both.
    ratio_delta = ratio - 1.0
    if mu_weighted:
        penalty_weight = old_prob
        # Token-adaptive trust-region boundary r* = 1 ± ε_t (§3) — diagnostics only.
        adaptive_eps = torch.where(old_prob > 0.0, epsilon / old_prob, torch.full_like(old_prob, float("inf")))
    else:
        penalty_weight = torch.ones_like(old_prob)
        adaptive_eps = torch.full_like(old_prob, epsilon)
    quadratic_penalty = adv.abs() * penalty_weight * ratio_delta.square() / (2.0 * epsilon)
    pg_losses = -adv * ratio + quadratic_penalty
    metrics = {
        "ratio_mean": ratio.mean().detach(),
        "ratio_max": ratio.max().detach(),
        "approx_kl": ((ratio - 1.0) - log_diff).mean().detach(),  # k3 estimator
        "drpo_penalty_mean": quadratic_penalty.mean().detach(),
        "clipfrac_upper": (ratio > (1.0 + adaptive_eps)).float().mean().detach(),
        "clipfrac_lower": (ratio < (1.0 - adaptive_eps)).float().mean().detach(),
    }
    return pg_losses, metrics


# ------------------------------------------------- prime-rl 559b4477, src/prime_rl/trainer/rl/loss.py (see above)
@dataclass
class LossInputs:
    trainer_logprobs: Tensor
    inference_logprobs: Tensor
    ref_logprobs: Tensor | None
    advantages: Tensor
    loss_mask: Tensor
    loss_weights: Tensor | None = field(default=None)


@dataclass
class LossOutputs:
    loss: Tensor
    metrics: dict[str, Tensor]


@dataclass
class IPOLossConfig:
    ipo_threshold: float = 0.1
    adv_tau: float = 1.0
    kl_tau: float = 1e-3


def _safe_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of values over a boolean mask; returns 0 when mask is empty."""
    denom = torch.clamp_min(mask.sum(), 1)
    return values[mask].sum() / denom


def compute_importance_ratio_and_mismatch_kl(
    trainer_logprobs: Tensor, inference_logprobs: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    mismatch_kl = importance_ratio - log_importance_ratio - 1
    return log_importance_ratio, importance_ratio, mismatch_kl


def ipo_loss_fn(inputs: LossInputs, loss_config: IPOLossConfig) -> LossOutputs:
    """IPO loss type: a symmetric trust region (mask tokens whose probability
    moved more than ``ipo_threshold`` in absolute terms), policy gradient via
    the importance ratio, and a squared-log-ratio KL regularizer."""
    trainer_logprobs = inputs.trainer_logprobs
    inference_logprobs = inputs.inference_logprobs
    advantages = inputs.advantages
    loss_mask = inputs.loss_mask

    log_importance_ratio, importance_ratio, mismatch_kl = compute_importance_ratio_and_mismatch_kl(
        trainer_logprobs, inference_logprobs
    )

    abs_probs_diff = torch.abs(torch.exp(trainer_logprobs) - torch.exp(inference_logprobs))

    is_masked = abs_probs_diff > loss_config.ipo_threshold
    keep_mask = loss_mask & ~is_masked

    advantages = loss_config.adv_tau * advantages
    pg_loss = keep_mask * advantages * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    per_token_loss = -pg_loss + loss_config.kl_tau * kl_loss
    if inputs.loss_weights is not None:
        per_token_loss = per_token_loss * inputs.loss_weights
    loss = per_token_loss.sum()

    metrics = {
        "masked_mismatch_kl": _safe_mean(mismatch_kl, loss_mask & is_masked),  # all trainable, masked tokens
        "unmasked_mismatch_kl": _safe_mean(mismatch_kl, keep_mask),  # all trainable, unmasked tokens
        "is_masked": _safe_mean(is_masked, loss_mask),
    }

    return LossOutputs(loss=loss, metrics=metrics)
