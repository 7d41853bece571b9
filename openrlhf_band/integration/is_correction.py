"""OpenRLHF 0.11.2's train/rollout importance-sampling correction (`PolicyLoss`, its "ppo" branch),
shared by every loss of this package: the band and the registered objectives."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ISCorrection:
    """`--algo.advantage.is_correction_*`: level off / token / seq, mode mask / clip, gating ratio /
    binary_kl / tv, threshold (low, high). Checked when built, with OpenRLHF's own messages."""

    level: str = "off"
    mode: str = "mask"
    gating: str = "ratio"
    threshold: tuple[float, float] = (0.5, 5.0)

    def __post_init__(self) -> None:
        if self.level not in {"off", "token", "seq"}:
            raise ValueError(f"is_correction_level must be off/token/seq, got {self.level}")
        if self.mode not in {"mask", "clip"}:
            raise ValueError(f"is_correction_mode must be mask/clip, got {self.mode}")
        if self.gating not in {"ratio", "binary_kl", "tv"}:
            raise ValueError(f"is_correction_gating must be ratio/binary_kl/tv, got {self.gating}")
        if self.mode == "clip" and (self.level == "seq" or self.gating != "ratio"):
            raise ValueError(
                "is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio"
            )
        if self.gating != "ratio" and self.level != "off" and self.threshold[0] > 0:
            raise ValueError(f"is_correction_gating={self.gating} takes an upper bound only (a single delta)")

    @property
    def on(self) -> bool:
        return self.level != "off"

    @torch.no_grad()
    def coefficients(
        self, old_log_probs: Tensor, rollout_log_probs: Tensor, action_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(coef (B, T), vllm_kl, is_filter_ratio) as OpenRLHF's PolicyLoss computes them: the loss of
        each token is multiplied by coef. Masked positions are read as pi_rollout = pi_old = 1, so
        that nothing they hold reaches a sum (OpenRLHF's own sums give NaN for a masked inf);
        everywhere OpenRLHF's values are finite they are these."""
        from openrlhf.models.utils import masked_mean

        if action_mask is not None:
            live = action_mask != 0
            old_log_probs = torch.where(live, old_log_probs, 0.0)
            rollout_log_probs = torch.where(live, rollout_log_probs, old_log_probs)
        low, high = self.threshold
        seq_level = self.level == "seq"
        is_log_ratio = (old_log_probs - rollout_log_probs).detach()
        token_is = is_log_ratio.exp()
        if self.gating == "ratio":
            stat = masked_mean(is_log_ratio, action_mask, dim=-1).unsqueeze(-1) if seq_level else is_log_ratio
            stat = stat.exp()
        else:
            p = rollout_log_probs.exp().clamp(1e-6, 1 - 1e-6)
            q = old_log_probs.exp().clamp(1e-6, 1 - 1e-6)
            if self.gating == "binary_kl":
                stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
            else:
                stat = (p - q).abs()
            if seq_level:
                stat = masked_mean(stat, action_mask, dim=-1).unsqueeze(-1)
        if self.mode == "clip":
            coef = stat.clamp(min=low, max=high)
            filtered = (stat < low) | (stat > high)
        else:
            keep = (stat >= low) & (stat <= high)
            coef = torch.where(keep, token_is, 0.0)
            filtered = ~keep
        if seq_level:
            is_filter_ratio = filtered.float().mean()
        else:
            is_filter_ratio = masked_mean(filtered.float(), action_mask, dim=None)
        vllm_kl = masked_mean(rollout_log_probs - old_log_probs, action_mask, dim=None)
        return coef.expand_as(old_log_probs), vllm_kl, is_filter_ratio
