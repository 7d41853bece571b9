"""What the OpenRLHF 0.11.2 patch set calls: the band CLI flags, their validation, and
`BandPolicyLoss`, a drop-in for `openrlhf.models.PolicyLoss`.

Importing this module does not import OpenRLHF; `BandPolicyLoss.forward` imports OpenRLHF's
`aggregate_loss` and `masked_mean` so that aggregation keeps OpenRLHF's exact semantics.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from openrlhf_band.bounds import _validate
from openrlhf_band.dcpo import dcpo_bounds, validate_dcpo
from openrlhf_band.divergences import DIVERGENCES
from openrlhf_band.functional import BACKENDS, band_token_loss

# The authors' runs: kl, delta 0.05, upper cap 10, relax off (an ablation the paper reports as harmful).
BAND_DEFAULTS = {
    "rule": "trust_region",
    "divergence": "kl",
    "delta": 0.05,
    "upper_cap": 10.0,
    "relax": None,
    "backend": "auto",
}
BAND_RULES = ("trust_region", "dcpo")

#: Old-probability bins of the per-bin clip-fraction metrics: [0, 0.01), [0.01, 0.1), [0.1, 0.5), [0.5, 1].
METRIC_PROB_BINS = (0.0, 0.01, 0.1, 0.5, 1.0)
_BIN_NAMES = ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")


def _upper_cap(text: str) -> float:
    # "none" parses to inf (no cap), not None: None means "flag not given, use the default"
    return math.inf if text.lower() in ("none", "off") else float(text)


def add_band_arguments(parser: argparse.ArgumentParser) -> None:
    """The band's flags for `train_ppo_ray` (dotted names, as OpenRLHF's, plus short aliases).

    Defaults are None here and filled in by `validate_band_arguments`, so that a band flag given
    without `--actor.policy_loss_type band` is an error rather than silently ignored.
    """
    group = parser.add_argument_group("BandPO (openrlhf-band)")
    group.add_argument(
        "--actor.band.rule", default=None, choices=BAND_RULES,
        help="trust_region: the f-divergence band (default); dcpo: DCPO's probability-dependent clip with "
        "eps from --actor.eps_clip_low_high, through the same loss path",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.divergence", "--band_divergence", default=None, choices=DIVERGENCES,
        help=f"f-divergence of the band's trust region (default {BAND_DEFAULTS['divergence']})",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.delta", "--band_delta", type=float, default=None,
        help=f"trust-region radius delta > 0 (default {BAND_DEFAULTS['delta']})",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.upper_cap", type=_upper_cap, default=None,
        help=f"cap on the upper ratio bound, >= 1, or 'none' (default {BAND_DEFAULTS['upper_cap']:g})",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.relax", type=float, nargs=2, default=None, metavar=("EPS_LOW", "EPS_HIGH"),
        help="union the band with [1 - EPS_LOW, 1 + EPS_HIGH] (off by default)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.backend", default=None, choices=BACKENDS,
        help="auto: fused Triton kernel on CUDA, torch elsewhere (default auto)",
    )  # fmt: skip


def validate_band_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Fill band defaults when the band loss is selected; reject bad or orphaned band flags.

    `args` is the hierarchized namespace (`args.actor.band.delta`); errors go through
    `parser.error`, i.e. a usage message and exit status 2 at parse time.
    """
    band = args.actor.band
    given = [k for k in BAND_DEFAULTS if getattr(band, k, None) is not None]
    if args.actor.policy_loss_type != "band":
        if given:
            parser.error(
                f"--actor.band.{given[0]} needs the band loss: add --actor.policy_loss_type band (or --loss band)"
            )
        return
    for key, default in BAND_DEFAULTS.items():
        if getattr(band, key, None) is None:
            setattr(band, key, default)
    if band.upper_cap == math.inf:
        band.upper_cap = None
    try:
        _validate(band.divergence, band.delta, band.upper_cap, band.relax)
        if band.rule == "dcpo":  # eps come from --actor.eps_clip_low_high (OpenRLHF fills it later)
            eps = args.actor.eps_clip_low_high or (args.actor.eps_clip, args.actor.eps_clip)
            validate_dcpo(*eps, upper_cap=band.upper_cap)
    except ValueError as err:
        parser.error(f"--actor.band: {err}")
    if args.actor.dual_clip is not None and not args.actor.dual_clip > 1.0:
        parser.error(f"--actor.dual_clip must be > 1, got {args.actor.dual_clip}")


def band_loss_kwargs(args) -> dict:
    """BandPolicyLoss's band arguments from the hierarchized training arguments."""
    band = args.actor.band
    relax = tuple(band.relax) if band.relax is not None else None
    kwargs = {
        "divergence": band.divergence,
        "delta": band.delta,
        "upper_cap": band.upper_cap,
        "relax": relax,
        "backend": band.backend,
    }
    if band.rule == "dcpo":
        eps_low, eps_high = args.actor.eps_clip_low_high
        kwargs["bounds_fn"] = functools.partial(
            dcpo_bounds, eps_low=eps_low, eps_high=eps_high, upper_cap=band.upper_cap
        )
    return kwargs


def resolved_loss_config(args) -> dict:
    """The loss configuration a training run will use, as plain JSON-able values."""
    config = {
        "policy_loss_type": args.actor.policy_loss_type,
        "eps_clip_low_high": list(args.actor.eps_clip_low_high),
        "dual_clip": args.actor.dual_clip,
        "loss_agg_mode": args.actor.loss_agg_mode,
        "advantage_estimator": args.algo.advantage.estimator,
        "kl_loss": {
            "use_loss": args.algo.kl.use_loss,
            "estimator": args.algo.kl.estimator,
            "init_coef": args.algo.kl.init_coef,
        },
        "entropy_coef": args.actor.entropy_coef,
    }
    if args.actor.policy_loss_type == "band":
        kwargs = band_loss_kwargs(args)
        kwargs.pop("bounds_fn", None)
        config["band"] = {
            **kwargs,
            "rule": args.actor.band.rule,
            "relax": list(kwargs["relax"]) if kwargs["relax"] else None,
        }
        if args.actor.band.rule == "dcpo":  # DCPO ignores divergence / delta; its eps are the clip eps
            config["band"]["dcpo_eps"] = list(args.actor.eps_clip_low_high)
    return config


class BandPolicyLoss(nn.Module):
    """Drop-in for OpenRLHF 0.11.2's `PolicyLoss` with the Band in place of the fixed clip.

    Same constructor arguments (the clip eps are accepted and ignored: the band replaces them;
    `relax` is the way to union a fixed interval back in) plus the band's, and the same
    `forward` signature and 5-tuple `(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)`.
    Honours dual-clip, token-level or seq-mean-token-mean aggregation with the global token /
    sample counts, and the train/rollout IS correction. After each forward `band_metrics` holds
    0-d tensors (`band/...`) for `experience.info`.

    `bounds_fn(old_log_probs) -> (lower, upper)` replaces the band with any other rule of the old
    log-probs (a fixed interval, a probability-dependent clip); its bounds are used as given.
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float | None = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "band",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold=(0.5, 5.0),
        *,
        divergence: str = "kl",
        delta: float = 0.05,
        upper_cap: float | None = 10.0,
        relax: tuple[float, float] | None = None,
        backend: str = "auto",
        bounds_fn: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        super().__init__()
        _validate(divergence, delta, upper_cap, relax)
        if policy_loss_type not in ("band", "ppo"):
            raise ValueError(f"BandPolicyLoss implements the band (ppo-style) loss, not {policy_loss_type!r}")
        if dual_clip is not None and not dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1.0, got {dual_clip}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        # the same option checks as OpenRLHF's PolicyLoss, with the same messages
        if is_correction_level not in {"off", "token", "seq"}:
            raise ValueError(f"is_correction_level must be off/token/seq, got {is_correction_level}")
        if is_correction_mode not in {"mask", "clip"}:
            raise ValueError(f"is_correction_mode must be mask/clip, got {is_correction_mode}")
        if is_correction_gating not in {"ratio", "binary_kl", "tv"}:
            raise ValueError(f"is_correction_gating must be ratio/binary_kl/tv, got {is_correction_gating}")
        if is_correction_mode == "clip" and (is_correction_level == "seq" or is_correction_gating != "ratio"):
            raise ValueError(
                "is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio"
            )
        if is_correction_gating != "ratio" and is_correction_level != "off" and is_correction_threshold[0] > 0:
            raise ValueError(f"is_correction_gating={is_correction_gating} takes an upper bound only (a single delta)")
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.dual_clip = dual_clip
        self.token_level_loss = token_level_loss
        self.policy_loss_type = "band"
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = is_correction_threshold
        self.divergence, self.delta, self.upper_cap, self.relax = divergence, float(delta), upper_cap, relax
        self.backend = backend
        self.bounds_fn = bounds_fn
        self.band_metrics: dict[str, Tensor] = {}

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
        from openrlhf.models.loss import aggregate_loss
        from openrlhf.models.utils import masked_mean

        bounds = self.bounds_fn(old_log_probs) if self.bounds_fn is not None else None
        out = band_token_loss(
            log_probs, old_log_probs, advantages, action_mask, divergence=self.divergence, delta=self.delta,
            upper_cap=self.upper_cap, relax=self.relax, dual_clip=self.dual_clip, backend=self.backend,
            return_bounds=True, bounds=bounds,
        )  # fmt: skip
        loss = out.loss

        # train/rollout IS correction, exactly as OpenRLHF 0.11.2's PolicyLoss ("ppo" branch)
        vllm_kl = is_filter_ratio = None
        if self.is_correction_level != "off":
            low, high = self.is_correction_threshold
            seq_level = self.is_correction_level == "seq"
            is_log_ratio = (old_log_probs - rollout_log_probs).detach()
            token_is = is_log_ratio.exp()
            if self.is_correction_gating == "ratio":
                stat = masked_mean(is_log_ratio, action_mask, dim=-1).unsqueeze(-1) if seq_level else is_log_ratio
                stat = stat.exp()
            else:
                p = rollout_log_probs.exp().clamp(1e-6, 1 - 1e-6)
                q = old_log_probs.exp().clamp(1e-6, 1 - 1e-6)
                if self.is_correction_gating == "binary_kl":
                    stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
                else:
                    stat = (p - q).abs()
                if seq_level:
                    stat = masked_mean(stat, action_mask, dim=-1).unsqueeze(-1)
            if self.is_correction_mode == "clip":
                coef = stat.clamp(min=low, max=high)
                filtered = (stat < low) | (stat > high)
            else:
                keep = (stat >= low) & (stat <= high)
                coef = torch.where(keep, token_is, 0.0)
                filtered = ~keep
            loss = coef * loss
            if seq_level:
                is_filter_ratio = filtered.float().mean()
            else:
                is_filter_ratio = masked_mean(filtered.float(), action_mask, dim=None)
            vllm_kl = masked_mean(rollout_log_probs - old_log_probs, action_mask, dim=None)

        loss = aggregate_loss(
            loss,
            action_mask,
            token_level_loss=self.token_level_loss,
            dp_size=dp_size,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )
        clipped = out.clipped_upper | out.clipped_lower
        clip_ratio = masked_mean(clipped.float(), action_mask, dim=None)
        ppo_kl = masked_mean(-(log_probs - old_log_probs).detach(), action_mask, dim=None)
        self.band_metrics = band_metrics(out, old_log_probs, action_mask)
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio


@torch.no_grad()
def band_metrics(out, old_log_probs: Tensor, action_mask: Tensor | None) -> dict[str, Tensor]:
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
    """
    mask = torch.ones_like(out.loss, dtype=torch.bool) if action_mask is None else action_mask != 0
    count = mask.sum().clamp(min=1)

    def share(values: Tensor) -> Tensor:
        return (torch.where(mask, values.float(), 0.0).sum() / count).float()

    clipped = out.clipped_upper | out.clipped_lower
    metrics = {
        "band/clip_frac_upper": share(out.clipped_upper),
        "band/clip_frac_lower": share(out.clipped_lower),
        "band/lower_mean": share(out.lower),
        "band/upper_mean": share(out.upper),
        "band/width_mean": share(out.upper - out.lower),
    }
    p = old_log_probs.detach().float().exp()
    for name, lo, hi in zip(_BIN_NAMES, METRIC_PROB_BINS[:-1], METRIC_PROB_BINS[1:]):
        in_bin = (p >= lo) & ((p < hi) if hi < 1.0 else (p <= hi))
        metrics[f"band/tokens_{name}"] = share(in_bin)
        metrics[f"band/clipped_{name}"] = share(in_bin & clipped)
    return metrics
