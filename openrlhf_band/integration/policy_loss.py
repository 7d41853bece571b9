"""`BandPolicyLoss`, a drop-in for OpenRLHF 0.11.2's `openrlhf.models.PolicyLoss` with the Band in
place of the fixed clip: the band's per-token loss (or CISPO's with the band's bounds) and metrics behind
`OpenRLHFPolicyLoss`, which owns OpenRLHF's contract (IS correction, aggregation, the 5-tuple).

Importing this module does not import OpenRLHF.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from openrlhf_band.band.adaptive import DEFAULT_CONTROLLER_RATE, DEFAULT_ENTROPY_POWER, AdaptiveRadius
from openrlhf_band.band.divergences import check_radius_in_range
from openrlhf_band.band.rules import RULES
from openrlhf_band.band.spec import BandSpec
from openrlhf_band.functional import BACKENDS, band_token_loss_from_spec
from openrlhf_band.integration.metrics import band_metrics
from openrlhf_band.integration.openrlhf_loss import OpenRLHFPolicyLoss, TokenLoss, openrlhf_arguments
from openrlhf_band.objectives.band_cispo import band_cispo_token_loss

#: where the caller's old log-probs (pi_old, the band's centre) come from: recomputed by the actor when the experience
#: is made (OpenRLHF's way), or the log-probs the rollout engine returned for the sampled tokens (verl's bypass mode;
#: --actor.band.anchor, integration/hooks.py)
ANCHORS = ("recomputed", "rollout")


class BandPolicyLoss(OpenRLHFPolicyLoss):
    """Drop-in for OpenRLHF 0.11.2's `PolicyLoss` with the Band in place of the fixed clip.

    Same constructor arguments as OpenRLHF's, positional or by name (`OPENRLHF_ARGUMENTS`; the clip eps are
    accepted and ignored: the band replaces them;
    `relax` is the way to union a fixed interval back in) plus the band's, and the same
    `forward` signature and 5-tuple `(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)`.

    The band is `band`, a `BandSpec` (validated when built), or, without it, the spec built from the
    keyword options (`divergence`, `delta`, `upper_cap` (default 10 here, the authors' cap), `relax`,
    `lower_floor`, `lower_delta`, `ratio_truncation`, `rule`, `dcpo_eps`: BandSpec's fields); they
    stay readable as attributes (`loss.delta` is the constructor's radius).
    Honours dual-clip, token-level or seq-mean-token-mean aggregation with the global token /
    sample counts, and the train/rollout IS correction (all from `OpenRLHFPolicyLoss`). After each
    forward `band_metrics` (= `loss_metrics`) holds 0-d tensors (`band/...`) for `experience.info`.

    `bounds_fn(old_log_probs) -> (lower, upper)` replaces the band with any other rule of the old
    log-probs (a fixed interval, a probability-dependent clip); its bounds are used as given, except
    for `lower_floor`, which applies to every rule: each lower bound becomes max(lower, F).

    `policy_loss_type="cispo"`: CISPO (arXiv 2506.13585) with the band's bounds in place of its fixed
    interval, -sg(clip(r, r_low(p), r_up(p))) A log pi per token (`openrlhf_band.objectives.band_cispo`),
    with every option of the band's bounds (not DPPO's rule, not dual-clip); `--loss cispo
    --actor.cispo.bounds band`. Its clip metrics count a clipped weight for either sign of A.

    DPPO (arXiv 2602.04879; verl's dppo_tv / dppo_kl) is this loss with divergence "tv" or "kl",
    `delta` / `lower_delta` its radii delta_high / delta_low, no cap, no dual-clip, and
    `ratio_truncation` c: a token outside the trust region gets no gradient (DPPO's mask is the
    band's clip), one inside gets -min(r, c) A. `flags.band_loss_kwargs` builds it from the flags.

    Adaptive radii (`openrlhf_band.band.adaptive`): `adaptive="entropy"` gives each token
    delta_t = clamp(delta (H_t / H_mean)^entropy_power, *delta_range) from the entropy H_t that
    `forward(..., entropy=...)` receives (the detached entropy of the forward that produced
    `log_probs`: OpenRLHF's training_step computes it for its entropy log). H_mean is the
    token-weighted mean entropy of the previous optimizer step over all its tokens on all ranks
    (all-reduced in `after_optimizer_step`): one normaliser for every token of a step, whichever
    micro-batch or rank it lands in, and no extra pass; before the first step, the micro-batch's own
    mean. `target_entropy` turns on the radius controller, which moves `delta` after each optimizer
    step from that step's mean entropy (`after_optimizer_step`); `band_state` / `load_band_state`
    carry it through checkpoints.

    `anchor` says where the caller's `old_log_probs` come from, for the metrics only: "recomputed" (the
    actor's own, OpenRLHF's way) or "rollout" (the sampler's, `--actor.band.anchor rollout`; the loss then
    also logs band/anchor_rollout = 1). The loss computes the same either way.
    """

    def __init__(
        self,
        *openrlhf_args,
        band: BandSpec | None = None,
        backend: str = "auto",
        bounds_fn: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
        adaptive: str = "none",
        entropy_power: float = DEFAULT_ENTROPY_POWER,
        delta_range: tuple[float, float] | None = None,
        target_entropy: float | None = None,
        controller_rate: float = DEFAULT_CONTROLLER_RATE,
        anchor: str = "recomputed",
        **options,
    ) -> None:
        shared, band_options = openrlhf_arguments(openrlhf_args, options, policy_loss_type="band")
        dual_clip, policy_loss_type = shared["dual_clip"], shared["policy_loss_type"]
        if band is None:
            band = BandSpec(**{"upper_cap": 10.0, **band_options})  # the authors' cap unless given
        elif band_options:
            raise ValueError(f"give the band once, band=BandSpec(...) or its options, not both: {sorted(band_options)}")
        elif not isinstance(band, BandSpec):
            raise ValueError(f"band must be a BandSpec, got {type(band).__name__}")
        rule = RULES[band.rule]
        if rule.has_radius and bounds_fn is None:  # a radius past a bounded divergence's range bounds no token
            check_radius_in_range(band.divergence, band.delta, "delta")
            check_radius_in_range(band.divergence, band.lower_delta, "lower_delta", lower_only=True)
        delta, divergence = band.delta, band.divergence
        if band.lower_delta is not None and (adaptive != "none" or target_entropy is not None):
            raise ValueError("lower_delta (asymmetric radii) takes a constant radius: adaptive radii are symmetric")
        radius_rule = AdaptiveRadius(delta, adaptive, entropy_power, delta_range, target_entropy, controller_rate,
                                     divergence)  # fmt: skip
        if radius_rule.needs_entropy and bounds_fn is None:  # the adaptive radius moves up to its range's top
            check_radius_in_range(divergence, radius_rule.delta_range[1], "delta_range's high end")
        if (bounds_fn is not None or not rule.has_radius) and (adaptive != "none" or target_entropy is not None):
            raise ValueError("adaptive radii act on the band's delta: they do not apply to bounds_fn rules")
        if policy_loss_type not in ("band", "ppo", "cispo"):
            raise ValueError(
                f"BandPolicyLoss implements the band's PPO-style loss (policy_loss_type 'band') and CISPO with the "
                f"band's bounds ('cispo'), not {policy_loss_type!r}"
            )
        if policy_loss_type == "cispo":
            if dual_clip is not None:
                raise ValueError("dual_clip does not apply to CISPO: its importance weight is already bounded")
            if not rule.takes_cispo:
                takers = " or ".join(r.name for r in RULES.values() if r.takes_cispo)
                raise ValueError(f"CISPO takes the band's {takers} bounds; {rule.label} is an objective of its own")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if anchor not in ANCHORS:
            raise ValueError(f"anchor must be {' or '.join(map(repr, ANCHORS))}, got {anchor!r}")
        shared["policy_loss_type"] = "cispo" if policy_loss_type == "cispo" else "band"
        super().__init__(**shared, takes_dual_clip=rule.takes_dual_clip,
                         why_no_dual_clip=f" with the {rule.name} rule ({rule.dual_clip_refusal})")  # fmt: skip
        self.radius_rule = radius_rule
        self.band = band
        self._call_band = band  # the spec at the controller's current radius (`_band_at`)
        self.backend = backend
        self.bounds_fn = bounds_fn
        self.anchor = anchor
        self.last_bounds: tuple[Tensor, Tensor] | None = None

    @property
    def band_metrics(self) -> dict[str, Tensor]:
        """The band's metrics of the last forward (`band/...`): `loss_metrics`."""
        return self.loss_metrics

    def _band_at(self, delta: float) -> BandSpec:
        """The spec with radius `delta` (a forward's own, or the controller's): validated once per
        new radius, not per call."""
        if self._call_band.delta != delta:
            self._call_band = dataclasses.replace(self.band, delta=delta)
        return self._call_band

    @property
    def needs_entropy(self) -> bool:
        """Whether forward needs `entropy`: the entropy rule, or the controller (its signal)."""
        return self.radius_rule.needs_entropy

    @property
    def controller(self):
        """The radius controller (`RadiusController`), or None."""
        return self.radius_rule.controller

    @property
    def previous_entropy_mean(self) -> float | None:
        """The previous optimizer step's mean entropy over all its tokens and ranks (nats), or None."""
        return self.radius_rule.previous_entropy_mean

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Close an optimizer step: its mean entropy over all its tokens on all ranks (one all-reduce
        of two numbers) becomes the next step's normaliser, and the controller moves the radius."""
        if not self.needs_entropy:
            return
        totals = self.radius_rule.take_step_totals()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_backend() == "nccl":
                totals = totals.cuda()
            torch.distributed.all_reduce(totals)
        self.radius_rule.close_step(*totals.tolist())

    def band_state(self) -> dict:
        """What a checkpoint must carry to resume the adaptive radius exactly."""
        return self.radius_rule.state_dict()

    def load_band_state(self, state: dict) -> None:
        self.radius_rule.load_state_dict(state)

    def token_loss(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, *, delta=None,
                   entropy=None) -> TokenLoss:  # fmt: skip
        """The band's per-token loss (or CISPO's with the band's bounds), its clipped tokens and metrics.

        `forward(..., delta=, entropy=)` passes these: `delta` is this call's radius, a number or a tensor per
        token (B, T) / per sequence (B, 1) (no gradient), overriding the constructor's and any adaptive rule;
        `entropy` (B, T) is the policy's entropy per token, which the adaptive rules need."""
        adaptive_metrics = {}
        if delta is None and self.bounds_fn is None and RULES[self.band.rule].has_radius:
            delta, adaptive_metrics = self.radius_rule.radius(entropy, action_mask)
        bounds = self.bounds_fn(old_log_probs) if self.bounds_fn is not None else None
        band, radius = self.band, None
        if isinstance(delta, Tensor):
            radius = delta
        elif delta is not None:
            band = self._band_at(delta)
        if self.policy_loss_type == "cispo":
            out = band_cispo_token_loss(log_probs, old_log_probs, advantages, action_mask, band, radius=radius,
                                        bounds=bounds)  # fmt: skip
        else:
            out = band_token_loss_from_spec(
                log_probs, old_log_probs, advantages, action_mask, band, radius=radius, dual_clip=self.dual_clip,
                backend=self.backend, return_bounds=True, bounds=bounds,
            )  # fmt: skip
        clipped = out.clipped_upper | out.clipped_lower
        self.last_bounds = (out.lower, out.upper)  # per token, for callers' own clip statistics
        declared = RULES[band.rule].metrics  # the rule's own metrics (band/rules.py)
        truncated = None
        if "band/truncated_frac" in declared and band.ratio_truncation is not None:
            # unclipped tokens whose weight min(r, c) is c (verl's pg_clipfrac_lower)
            log_ratio = (log_probs.detach().float() - old_log_probs.float()).clamp(-20.0, 20.0)
            truncated = ~(clipped | out.dual_clipped) & (log_ratio.exp() > band.ratio_truncation)
        floor = "band/clip_frac_floor" in declared and band.lower_floor is not None
        metrics = band_metrics(
            out, old_log_probs, action_mask, delta=delta if "band/delta_mean" in declared else None, floor=floor,
            truncated=truncated, rollout_log_probs=rollout_log_probs,
        )  # fmt: skip
        metrics.update(adaptive_metrics)
        if self.anchor == "rollout":  # the centre is the sampler's: band/behaviour_* then read exactly 0
            metrics["band/anchor_rollout"] = torch.ones((), dtype=torch.float32, device=log_probs.device)
        return TokenLoss(out.loss, clipped, metrics)


def _read_only(owner: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, owner), name), doc=f"`BandPolicyLoss.{owner}.{name}`.")


# the constructor's options stay readable where they now live: the spec and the adaptive radius
for _name in ("divergence", "delta", "upper_cap", "relax", "lower_floor", "lower_delta", "ratio_truncation"):
    setattr(BandPolicyLoss, _name, _read_only("band", _name))
for _name in ("adaptive", "entropy_power", "delta_range"):
    setattr(BandPolicyLoss, _name, _read_only("radius_rule", _name))
del _name
