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
from openrlhf_band.band.divergences import DIVERGENCES, check_radius_in_range
from openrlhf_band.band.rules import DPPO_DEFAULT_TRUNCATION, OWNED, RULES, flag_name
from openrlhf_band.band.spec import BandSpec
from openrlhf_band.functional import BACKENDS
from openrlhf_band.integration.fused_head import fused_logprobs_config
from openrlhf_band.integration.hooks import anchored_on_rollout
from openrlhf_band.integration.loss_registry import args_entry
from openrlhf_band.integration.objective_flags import (
    add_objective_arguments,
    band_drives_loss,
    resolved_objective_config,
    sampler_ratio_problem,
    uses_band_bounds,
    validate_objective_arguments,
)
from openrlhf_band.integration.openrlhf_loss import OPENRLHF_AGG_MODES
from openrlhf_band.integration.parser_errors import OneLineErrors
from openrlhf_band.integration.policy_loss import ANCHORS

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
    # where pi_old, the band's centre, comes from (policy_loss.ANCHORS): recomputed by the actor, or the sampler's
    "anchor": "recomputed",
}
#: --actor.band.rule's choices: openrlhf_band.band.rules.RULES, where each rule declares what it takes
BAND_RULES = tuple(RULES)


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
        "--actor.band.anchor", default=None, choices=ANCHORS,
        help="where pi_old, the band's centre, comes from: recomputed (default, OpenRLHF's way: the actor's "
        "log-probs, recomputed when the experience is made) or rollout (the log-probs vLLM returned for the tokens "
        "it sampled, verl's bypass mode: no recompute pass; the centre is the policy that sampled each token, also "
        "asynchronously and with partial rollouts). rollout refuses --algo.advantage.is_correction_level (its "
        "weight pi_old / mu would be exactly 1) and --rollout.top_p < 1 (vLLM's log-probs would be of the nucleus)",
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

    `args` is the hierarchized namespace (`args.actor.band.delta`); a refusal is one line on stderr
    and exit status 2 at parse time (`parser_errors.refuse`: no usage dump). What each rule takes and
    refuses is declared in openrlhf_band.band.rules; this function only reads it.
    """
    parser = OneLineErrors(parser)
    band = args.actor.band
    given = [k for k in BAND_DEFAULTS if getattr(band, k, None) is not None]
    if not band_drives_loss(args):
        if given:
            parser.error(
                f"--actor.band.{given[0]} needs the band loss: add --actor.policy_loss_type band (or --loss band), "
                "or the band's bounds in CISPO: --loss cispo --actor.cispo.bounds band"
            )
        return
    rule = RULES[band.rule or BAND_DEFAULTS["rule"]]
    if uses_band_bounds(args) and band.backend == "triton":
        parser.error(
            "--actor.band.backend triton does not apply to --actor.cispo.bounds band (the fused kernel is the band's "
            "PPO loss; CISPO's runs in torch)"
        )
    if uses_band_bounds(args) and not rule.takes_cispo:
        parser.error(
            f"--actor.band.rule {rule.name} does not apply to --actor.cispo.bounds band ({rule.label} is an objective "
            "of its own): use --actor.band.rule " + " or ".join(r.name for r in RULES.values() if r.takes_cispo)
        )
    refused = [flag_name(key) for key in rule.refuses if key in given]
    if refused:
        parser.error(
            f"{refused[0]} does not apply to --actor.band.rule {rule.name} ({rule.refusal}): drop it, or use "
            "--actor.band.rule trust_region"
        )
    if not rule.takes_dual_clip and args.actor.dual_clip is not None:
        parser.error(f"--actor.dual_clip does not apply to --actor.band.rule {rule.name} ({rule.dual_clip_refusal})")
    if "delta_low_high" in rule.own and "delta_low_high" in given and "delta" in given:
        parser.error("give DPPO's radii once: --band_delta D (both) or --actor.band.delta_low_high LOW HIGH")
    if rule.divergences is not None and band.divergence is not None and band.divergence not in rule.divergences:
        parser.error(
            f"--actor.band.rule {rule.name} takes --band_divergence {' or '.join(rule.divergences)} ({rule.label}'s "
            f"binary {' / '.join(d.upper() for d in rule.divergences)}), got {band.divergence}"
        )
    for key in given:
        owner = OWNED.get(key)
        if owner is not None and owner is not rule:
            parser.error(f"{flag_name(key)} is {owner.label}'s: it needs --actor.band.rule {owner.name}")
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
    if band.anchor == "rollout":
        problem = sampler_ratio_problem(
            args, "--actor.band.anchor rollout", "its weight pi_old / mu is exactly 1 when pi_old is the sampler's mu",
            instead="; use --actor.band.anchor recomputed",
        )  # fmt: skip
        if problem is not None:
            parser.error(problem)
    band.dcpo_eps = None
    problem = rule.prepare_flags(band, args)
    if problem is not None:
        parser.error(problem)
    try:
        spec = band_spec(band)  # the band's options checked at parse time (the actor builds the same spec from them)
        if rule.has_radius:  # a radius at or past a bounded divergence's range: no trust region at all
            pair = "delta_low_high" in given
            check_radius_in_range(spec.divergence, spec.delta,
                                  "--actor.band.delta_low_high HIGH" if pair else flag_name("delta"))  # fmt: skip
            check_radius_in_range(spec.divergence, spec.lower_delta, "--actor.band.delta_low_high LOW",
                                  lower_only=True)  # fmt: skip
        if rule.adaptive_radius:
            band.delta_range = tuple(band.delta_range) if band.delta_range else default_delta_range(band.delta)
            validate_adaptive(band.delta, band.adaptive, band.entropy_power, band.delta_range,
                              band.target_entropy, band.controller_rate, band.divergence)  # fmt: skip
            if band.adaptive != "none" or band.target_entropy is not None:  # the radius moves up to the range's top
                try:
                    check_radius_in_range(spec.divergence, band.delta_range[1], "--actor.band.delta_range HIGH")
                except ValueError as err:
                    default = "" if "delta_range" in given else " (by default min(4 delta, 1)): give it below the bound"
                    raise ValueError(f"{err}{default}") from None
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
    whether the band's flags apply), then the band's, then the aggregation."""
    validate_objective_arguments(parser, args)
    validate_band_arguments(parser, args)
    mode = getattr(args.actor, "loss_agg_mode", "token-mean")  # (the named methods' parser has no such flag)
    if mode not in OPENRLHF_AGG_MODES and args_entry(args).openrlhf:
        OneLineErrors(parser).error(
            f"--actor.loss_agg_mode {mode} needs a loss of openrlhf-band (--loss band or an objective such as "
            f"--loss gpg): OpenRLHF's own {args.actor.policy_loss_type} aggregates {' or '.join(OPENRLHF_AGG_MODES)} "
            "only"
        )


def band_spec(band) -> BandSpec:
    """The `BandSpec` of the filled-in `args.actor.band` namespace (ValueError if invalid)."""
    return RULES[band.rule].spec_from_flags(band)


def band_loss_kwargs(args) -> dict:
    """BandPolicyLoss's band arguments from the hierarchized training arguments: the spec built
    (and validated) at parse time, the backend and, for a rule with the adaptive radius, its options."""
    band = args.actor.band
    kwargs = {"band": band_spec(band), "backend": band.backend, "anchor": band.anchor}
    if RULES[band.rule].adaptive_radius:
        kwargs.update(
            adaptive=band.adaptive, entropy_power=band.entropy_power, delta_range=tuple(band.delta_range),
            target_entropy=band.target_entropy, controller_rate=band.controller_rate,
        )  # fmt: skip
    return kwargs


def rollout_config(args) -> dict:
    """How the samples the loss sees were made: synchronous or asynchronous (queue size, partial
    rollouts), the train/rollout IS correction, and where the loss's pi_old comes from (`old_log_probs`):
    the actor's log-probs recomputed when the experience is made (asynchronously the sampler lags them by up
    to queue-size rollouts), or with the band's rollout anchor the sampler's own
    (docs/training.md#asynchronous-training-where-the-band-is-centred)."""
    train, advantage = args.train, args.algo.advantage
    config = {
        "old_log_probs": "rollout" if anchored_on_rollout(args) else "recomputed",
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
        **({"loss_scale_factor": args.rollout.max_new_tokens} if args.actor.loss_agg_mode == "seq-mean-token-sum-norm"
           else {}),  # fmt: skip
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
    config["band"] = {**RULES[args.actor.band.rule].resolved_config(args.actor.band), "anchor": args.actor.band.anchor}
    return config
