"""The band's `train_ppo_ray` flags (`--actor.band.*`, aliases `--loss`, `--band_divergence`,
`--band_delta`), their parse-time validation, and what they resolve to: BandPolicyLoss's arguments
and the configuration `check-args` prints. Importing this module does not import OpenRLHF.
"""

from __future__ import annotations

import argparse
import functools
import math

from openrlhf_band.band.bounds import _validate
from openrlhf_band.band.dcpo import dcpo_bounds, validate_dcpo
from openrlhf_band.band.divergences import DIVERGENCES
from openrlhf_band.functional import BACKENDS

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
