"""The band's `train_ppo_ray` flags (`--actor.band.*`, aliases `--loss`, `--band_divergence`,
`--band_delta`), their parse-time validation, and what they resolve to: BandPolicyLoss's arguments
and the configuration `check-args` prints. Importing this module does not import OpenRLHF.
"""

from __future__ import annotations

import argparse
import math

from openrlhf_band.band.adaptive import (
    ADAPTIVE_RULES,
    DEFAULT_CONTROLLER_RATE,
    DEFAULT_ENTROPY_POWER,
    DEFAULT_RANGE_FACTOR,
    default_delta_range,
    validate_adaptive,
)
from openrlhf_band.band.dcpo import DCPO_DEFAULT_EPS
from openrlhf_band.band.divergences import DIVERGENCES
from openrlhf_band.band.spec import DPPO_DIVERGENCES, BandSpec
from openrlhf_band.functional import BACKENDS
from openrlhf_band.integration.fused_head import fused_logprobs_config
from openrlhf_band.integration.objective_flags import (
    add_objective_arguments,
    band_drives_loss,
    resolved_objective_config,
    uses_band_bounds,
    validate_objective_arguments,
)

# The authors' runs: kl, delta 0.05, upper cap 10, relax off (an ablation the paper reports as harmful).
BAND_DEFAULTS = {
    "rule": "trust_region",
    "divergence": "kl",
    "delta": 0.05,
    "upper_cap": 10.0,
    "relax": None,
    "backend": "auto",
    # adaptive radii (openrlhf_band/band/adaptive.py); delta_range's default is computed from delta
    "adaptive": "none",
    "entropy_power": DEFAULT_ENTROPY_POWER,
    "delta_range": None,
    "target_entropy": None,
    "controller_rate": DEFAULT_CONTROLLER_RATE,
    "lower_floor": None,  # none: the paper's band
    # DPPO's (--actor.band.rule dppo): asymmetric radii (else --band_delta for both) and its ratio truncation c
    "delta_low_high": None,
    "dppo_truncation": None,
}
BAND_RULES = ("trust_region", "dcpo", "dppo")
#: DPPO's truncation c of the importance ratio in its gradient weight min(r, c). The DPPO authors'
#: scripts (verl-project/verl examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh: radii tv 0.15, kl 0.05)
#: pass clip_ratio_c=10000.0: a large c, as verl's dppo code advises
#: ("a large threshold is recommended to avoid performance degradation due to the truncation bias",
#: the paper's section 5.4). verl's dppo functions fall back to 20 only without a config value, which its
#: trainer never lacks: its ActorConfig sets clip_ratio_c = 3.0, the dual-clip constant of its PPO loss,
#: which a verl user who does not pass clip_ratio_c gets as DPPO's truncation.
DPPO_DEFAULT_TRUNCATION = 1e4
# the flag of each band option, as error messages name it (two have short aliases users type)
_SHORT_FLAGS = {"divergence": "--band_divergence", "delta": "--band_delta"}
_ADAPTIVE_KEYS = ("adaptive", "entropy_power", "delta_range", "target_entropy", "controller_rate")


def _flags(*keys: str) -> dict[str, str]:
    return {key: _SHORT_FLAGS.get(key, f"--actor.band.{key}") for key in keys}


# the trust region's own knobs: they mean nothing to DCPO's rule, so with it they are refused
TRUST_REGION_ONLY = _flags("divergence", "delta", "relax", *_ADAPTIVE_KEYS)
# the flags DPPO's rule cannot take: its mask has no cap, no relax, no floor and no adaptive radius
DPPO_REFUSED = _flags("upper_cap", "relax", "lower_floor", *_ADAPTIVE_KEYS)
DPPO_ONLY = _flags("delta_low_high", "dppo_truncation")


def _lower_floor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number strictly between 0 and 1, got {text!r}") from None
    if not 0.0 < value < 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"expected a number strictly between 0 and 1 (each lower bound becomes max(r_low, F)), got {text!r}"
        )
    return value


def _truncation(text: str) -> float:
    # "none" parses to inf (no truncation), not None: None means "flag not given, use the default"
    return math.inf if text.lower() in ("none", "off") else float(text)


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
        help="trust_region: the f-divergence band (default); dcpo: DCPO's probability-dependent clip, through "
        "the same loss path, with eps from --actor.eps_clip_low_high or else DCPO's published "
        f"{DCPO_DEFAULT_EPS[0]:g} {DCPO_DEFAULT_EPS[1]:g} (not --actor.eps_clip); --actor.band.upper_cap and "
        "--actor.band.lower_floor apply to it, --band_divergence, --band_delta and --actor.band.relax do not and "
        "are refused; dppo: DPPO's binary-divergence mask (arXiv 2602.04879, verl's dppo_tv / dppo_kl) with "
        "--band_divergence tv or kl, radii --band_delta or --actor.band.delta_low_high, no cap, and the ratio "
        "truncation --actor.band.dppo_truncation",
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
        "--actor.band.lower_floor", type=_lower_floor, default=None, metavar="F",
        help="floor the lower ratio bound: max(r_low, F), 0 < F < 1, after relax (default: none, the paper's band, "
        "whose r_low goes to 0 for rare tokens)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.delta_low_high", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
        help="DPPO's asymmetric radii (verl's clip_ratio_low / clip_ratio_high): the lower root at LOW, the upper at "
        "HIGH (--actor.band.rule dppo only; instead of --band_delta)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.dppo_truncation", type=_truncation, default=None, metavar="C",
        help=f"DPPO's ratio truncation: an unmasked token's gradient weight is min(r, C), C > 0, or 'none' "
        f"(default {DPPO_DEFAULT_TRUNCATION:g}, the DPPO authors' scripts; --actor.band.rule dppo only)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.backend", default=None, choices=BACKENDS,
        help="auto: fused Triton kernel on CUDA, torch elsewhere (default auto)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.adaptive", default=None, choices=ADAPTIVE_RULES,
        help="none (default): one radius for every token; entropy: delta_t = clamp(delta (H_t / H_mean)^ALPHA, "
        "LOW, HIGH) from the policy's detached entropy at each token (H_mean: the previous optimizer step's mean "
        "over all its tokens and ranks); turns on OpenRLHF's entropy computation (--actor.entropy_coef 0 if unset: "
        "logged, no bonus)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.entropy_power", type=float, default=None, metavar="ALPHA",
        help=f"the entropy rule's power, >= 0; 0 gives the constant radius (default {DEFAULT_ENTROPY_POWER:g})",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.delta_range", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
        help=f"the range adaptive radii stay in, 0 < LOW <= delta <= HIGH (default delta / {DEFAULT_RANGE_FACTOR:g} "
        f"to {DEFAULT_RANGE_FACTOR:g} delta, at most 1)",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.target_entropy", type=float, default=None, metavar="H",
        help="turn on the radius controller: after each optimizer step delta moves multiplicatively toward keeping "
        "the mean token entropy (nats) near H (below H: smaller steps), within --actor.band.delta_range",
    )  # fmt: skip
    group.add_argument(
        "--actor.band.controller_rate", type=float, default=None, metavar="RATE",
        help=f"the controller's rate: delta *= exp(RATE clip(H / target - 1, -0.2, 0.2)) per optimizer step "
        f"(default {DEFAULT_CONTROLLER_RATE:g})",
    )  # fmt: skip


def validate_band_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Fill band defaults when the band loss is selected; reject bad or orphaned band flags.

    `args` is the hierarchized namespace (`args.actor.band.delta`); errors go through
    `parser.error`, i.e. a usage message and exit status 2 at parse time.
    """
    band = args.actor.band
    given = [k for k in BAND_DEFAULTS if getattr(band, k, None) is not None]
    if not band_drives_loss(args):
        if given:
            parser.error(
                f"--actor.band.{given[0]} needs the band loss: add --actor.policy_loss_type band (or --loss band), "
                "or the band's bounds in CISPO: --loss cispo --actor.cispo.bounds band"
            )
        return
    if uses_band_bounds(args) and band.backend == "triton":
        parser.error(
            "--actor.band.backend triton does not apply to --actor.cispo.bounds band (the fused kernel is the band's "
            "PPO loss; CISPO's runs in torch)"
        )
    if uses_band_bounds(args) and band.rule == "dppo":
        parser.error(
            "--actor.band.rule dppo does not apply to --actor.cispo.bounds band (DPPO is an objective of its own): "
            "use --actor.band.rule trust_region or dcpo"
        )
    if band.rule == "dcpo":
        refused = [flag for key, flag in TRUST_REGION_ONLY.items() if key in given]
        if refused:
            parser.error(
                f"{refused[0]} does not apply to --actor.band.rule dcpo (DCPO's bounds depend only on its eps): "
                "drop it, or use --actor.band.rule trust_region"
            )
    if band.rule == "dppo":
        refused = [flag for key, flag in DPPO_REFUSED.items() if key in given]
        if refused:
            parser.error(
                f"{refused[0]} does not apply to --actor.band.rule dppo (DPPO masks tokens outside a binary tv / kl "
                "trust region, with no cap, relax, floor or adaptive radius): drop it, or use --actor.band.rule "
                "trust_region"
            )
        if args.actor.dual_clip is not None:
            parser.error(
                "--actor.dual_clip does not apply to --actor.band.rule dppo (DPPO bounds a token's gradient weight "
                "by its ratio truncation instead, --actor.band.dppo_truncation)"
            )
        if "delta_low_high" in given and "delta" in given:
            parser.error("give DPPO's radii once: --band_delta D (both) or --actor.band.delta_low_high LOW HIGH")
        if band.divergence is not None and band.divergence not in DPPO_DIVERGENCES:
            parser.error(
                "--actor.band.rule dppo takes --band_divergence tv or kl (DPPO's binary TV / KL), "
                f"got {band.divergence}"
            )
    else:
        for key, flag in DPPO_ONLY.items():
            if key in given:
                parser.error(f"{flag} is DPPO's: it needs --actor.band.rule dppo")
    # knobs of a rule that is not on would be silently ignored: refused instead
    for key, needs, flag in (
        ("entropy_power", band.adaptive == "entropy", "--actor.band.adaptive entropy"),
        ("controller_rate", band.target_entropy is not None, "--actor.band.target_entropy H"),
        ("delta_range", band.adaptive == "entropy" or band.target_entropy is not None,
         "--actor.band.adaptive entropy or --actor.band.target_entropy H"),
    ):  # fmt: skip
        if key in given and not needs:
            parser.error(f"--actor.band.{key} has no effect without {flag}")
    for key, default in BAND_DEFAULTS.items():
        if getattr(band, key, None) is None:
            setattr(band, key, default)
    if band.upper_cap == math.inf:
        band.upper_cap = None
    if band.rule == "dppo":
        band.upper_cap = None  # DPPO's mask has no cap
        if band.delta_low_high is None:
            band.delta_low_high = (band.delta, band.delta)
        band.delta_low_high = tuple(band.delta_low_high)
        band.delta = band.delta_low_high[1]  # the upper root's; the lower one's is lower_delta
        if band.dppo_truncation is None:
            band.dppo_truncation = DPPO_DEFAULT_TRUNCATION
        elif band.dppo_truncation == math.inf:
            band.dppo_truncation = None
        elif not band.dppo_truncation > 0.0:  # also nan
            parser.error(f"--actor.band.dppo_truncation must be > 0 or 'none', got {band.dppo_truncation}")
    band.dcpo_eps = None
    if band.rule == "dcpo":  # OpenRLHF fills eps_clip_low_high from --actor.eps_clip later: read it now
        given_eps = args.actor.eps_clip_low_high
        band.dcpo_eps = tuple(given_eps) if given_eps is not None else DCPO_DEFAULT_EPS
        band.dcpo_eps_source = "--actor.eps_clip_low_high" if given_eps is not None else "DCPO's published values"
    try:
        band_spec(band)  # the band's options checked at parse time (the actor builds the same spec from them)
        if band.rule == "trust_region":
            band.delta_range = tuple(band.delta_range) if band.delta_range else default_delta_range(band.delta)
            validate_adaptive(band.delta, band.adaptive, band.entropy_power, band.delta_range,
                              band.target_entropy, band.controller_rate, band.divergence)  # fmt: skip
    except ValueError as err:
        parser.error(f"--actor.band: {err}")
    if args.actor.dual_clip is not None and not args.actor.dual_clip > 1.0:
        parser.error(f"--actor.dual_clip must be > 1, got {args.actor.dual_clip}")
    if (band.adaptive == "entropy" or band.target_entropy is not None) and args.actor.entropy_coef is None:
        args.actor.entropy_coef = 0.0  # the adaptive radius reads the entropy OpenRLHF computes for its log


def add_loss_arguments(parser: argparse.ArgumentParser) -> None:
    """Every loss flag this package adds to train_ppo_ray: the band's and the registered objectives'."""
    add_band_arguments(parser)
    add_objective_arguments(parser)


def validate_loss_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Check and fill the loss flags after parsing: the objectives' first (CISPO's bounds decide
    whether the band's flags apply), then the band's."""
    validate_objective_arguments(parser, args)
    validate_band_arguments(parser, args)


def band_spec(band) -> BandSpec:
    """The `BandSpec` of the filled-in `args.actor.band` namespace (ValueError if invalid)."""
    if band.rule == "dcpo":  # DCPO's bounds depend on its eps alone: the trust region's knobs are not its
        return BandSpec(upper_cap=band.upper_cap, lower_floor=band.lower_floor, rule="dcpo", dcpo_eps=band.dcpo_eps)
    if band.rule == "dppo":
        return BandSpec(band.divergence, band.delta, lower_delta=band.delta_low_high[0],
                        ratio_truncation=band.dppo_truncation, rule="dppo")  # fmt: skip
    relax = tuple(band.relax) if band.relax is not None else None
    return BandSpec(band.divergence, band.delta, band.upper_cap, relax, band.lower_floor)


def band_loss_kwargs(args) -> dict:
    """BandPolicyLoss's band arguments from the hierarchized training arguments: the spec built
    (and validated) at parse time, the backend and, for the trust region, the adaptive radius."""
    band = args.actor.band
    kwargs = {"band": band_spec(band), "backend": band.backend}
    if band.rule == "trust_region":
        kwargs.update(
            adaptive=band.adaptive, entropy_power=band.entropy_power, delta_range=tuple(band.delta_range),
            target_entropy=band.target_entropy, controller_rate=band.controller_rate,
        )  # fmt: skip
    return kwargs


def rollout_config(args) -> dict:
    """How the samples the loss sees were made: synchronous or asynchronous (queue size, partial
    rollouts), and the train/rollout IS correction. The loss's pi_old (the band's centre) is always the
    actor's log-probs recomputed when the experience is made; asynchronously the sampler lags it by up
    to queue-size rollouts (docs/training.md#asynchronous-training-where-the-band-is-centred)."""
    train, advantage = args.train, args.algo.advantage
    config = {
        "async": train.async_enable,
        "async_queue_size": train.async_queue_size if train.async_enable else None,
        "partial_rollout": train.partial_rollout_enable,
        "is_correction_level": advantage.is_correction_level,
    }
    if advantage.is_correction_level != "off":
        config["is_correction_mode"] = advantage.is_correction_mode
    return config


def resolved_loss_config(args) -> dict:
    """The loss configuration a training run will use, as plain JSON-able values: only what is in
    effect (the band ignores the clip eps; DCPO ignores the trust region's divergence and delta)."""
    config = {
        "policy_loss_type": args.actor.policy_loss_type,
        "dual_clip": args.actor.dual_clip,
        "loss_agg_mode": args.actor.loss_agg_mode,
        "advantage_estimator": args.algo.advantage.estimator,
        "kl_loss": {
            "use_loss": args.algo.kl.use_loss,
            "estimator": args.algo.kl.estimator,
            "init_coef": args.algo.kl.init_coef,
        },
        "entropy_coef": args.actor.entropy_coef,
        "attention": {
            "implementation": args.ds.attn_implementation,
            "packing_samples": args.ds.packing_samples,
        },
        "fused_logprobs": fused_logprobs_config(args),  # a memory option, reported beside the loss's
        "rollout": rollout_config(args),
    }
    loss = args.actor.policy_loss_type
    if loss not in ("ppo", "gspo", "band"):
        config["objective"] = resolved_objective_config(args)
    if loss in ("ppo", "gspo"):
        config["eps_clip_low_high"] = list(args.actor.eps_clip_low_high)
    if not band_drives_loss(args):
        return config
    band = args.actor.band
    if band.rule == "dcpo":
        config["band"] = {
            "rule": "dcpo",
            "dcpo_eps": list(band.dcpo_eps),
            "dcpo_eps_source": band.dcpo_eps_source,
            "upper_cap": band.upper_cap,
            "lower_floor": band.lower_floor,
            "backend": band.backend,
        }
    elif band.rule == "dppo":
        config["band"] = {
            "rule": "dppo",
            "divergence": band.divergence,
            "delta_low_high": list(band.delta_low_high),
            "dppo_truncation": band.dppo_truncation,
            "mask": f"no gradient where binary {band.divergence} > delta_low (A < 0, r < 1) or > delta_high "
            "(A > 0, r > 1), as the band's clip",
            "gradient_weight": "min(r, dppo_truncation)" if band.dppo_truncation is not None else "r",
            "upper_cap": None,
            "backend": band.backend,
        }
    else:
        config["band"] = {
            "rule": band.rule,
            "divergence": band.divergence,
            "delta": band.delta,
            "upper_cap": band.upper_cap,
            "relax": list(band.relax) if band.relax is not None else None,
            "lower_floor": band.lower_floor,
            "backend": band.backend,
            "adaptive": None,
            "controller": None,
        }
        if band.adaptive == "entropy":
            config["band"]["adaptive"] = {
                "rule": "entropy",
                "formula": "delta_t = clamp(delta * (H_t / H_mean) ** entropy_power, *delta_range)",
                "entropy_power": band.entropy_power,
                "delta_range": list(band.delta_range),
                "entropy": "the current policy's, detached, from OpenRLHF's training forward",
                "mean_entropy": "the previous optimizer step's token mean over all ranks",
            }
        if band.target_entropy is not None:
            config["band"]["controller"] = {
                "target_entropy": band.target_entropy,
                "rate": band.controller_rate,
                "delta_range": list(band.delta_range),
            }
    return config
