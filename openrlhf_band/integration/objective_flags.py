"""The registered objectives' `train_ppo_ray` flags (`--actor.<objective>.<option>`, named after verl's
config keys, with verl's defaults), their parse-time checks against the OpenRLHF options each
objective can take, and what they resolve to. Importing this module does not import OpenRLHF.
"""

from __future__ import annotations

import argparse
import math

from openrlhf_band.band.rules import RULES
from openrlhf_band.integration.loss_registry import args_entry
from openrlhf_band.integration.parser_errors import OneLineErrors
from openrlhf_band.objectives import OBJECTIVES, get_objective
from openrlhf_band.objectives.registry import sampler_is_refusal

OPENRLHF_EPS_CLIP = 0.2  # --actor.eps_clip's default in OpenRLHF 0.11.2: another value was given on purpose
#: every value of --actor.policy_loss_type this package adds to OpenRLHF's ppo and gspo
LOSS_TYPES = ("band", *OBJECTIVES)  # (the registry's keys but OpenRLHF's own and band-cispo, a cispo option)


def _flag(objective: str, option: str) -> str:
    return f"--actor.{objective}.{option}"


def _parser_type(option):
    def parse(text: str):
        try:
            value = option.parse(text)
            option.validate(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value

    parse.__name__ = option.name  # argparse names the type in its message
    return parse


def add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option of each registered objective. Defaults are None here and filled in by
    `validate_objective_arguments`, so that an option given for another loss is refused, not ignored."""
    group = parser.add_argument_group("Objectives beside the band (openrlhf-band): --loss " + " | ".join(OBJECTIVES))
    for objective in OBJECTIVES.values():
        for option in objective.options:
            group.add_argument(
                _flag(objective.name, option.name), type=_parser_type(option), default=None,
                choices=option.choices, metavar=option.name.upper() if option.choices is None else None,
                help=f"{objective.name}: {option.help} (default {option.default}; {_keys_of(objective)}: "
                f"{option.verl_key})",
            )  # fmt: skip


def _keys_of(objective) -> str:
    """Whose config keys the objective's options are named after: verl's, or its authors' code's."""
    return "verl" if objective.verl_name else objective.code.split(" ")[0]


def objective_reads_rollout_log_probs(args) -> bool:
    """The selected objective's ratio is against the sampler's log-probs (DRPO by default, IPO): vLLM must
    return them."""
    loss = args.actor.policy_loss_type
    if loss not in OBJECTIVES or uses_band_bounds(args):
        return False
    objective = get_objective(loss)
    return objective.reads_rollout_log_probs(objective.resolve_options(objective_loss_kwargs(args)))


def sampler_ratio_problem(args, who: str, why_no_is: str, instead: str = "") -> str | None:
    """Why a loss whose ratio is against vLLM's log-probs (`who`: the rollout anchor, DRPO, IPO) cannot run with
    these flags, or None: the train/rollout IS correction (`why_no_is`), or top-p sampling, after which vLLM's
    log-probs are of the nucleus and not of the distribution the actor's are of. `instead`: what to use then."""
    # (train_ppo_ray's namespace; the named methods' parser has neither flag)
    level = getattr(getattr(getattr(args, "algo", None), "advantage", None), "is_correction_level", "off")
    top_p = getattr(getattr(args, "rollout", None), "top_p", 1.0)
    if level != "off":
        return f"--algo.advantage.is_correction_level {level} does not apply to {who} ({why_no_is}){instead}"
    if top_p < 1.0:
        return (
            f"{who} needs --rollout.top_p 1 (got {top_p:g}): vLLM's log-probs are then renormalised over the nucleus "
            f"while the actor's are of the whole distribution, so the ratio would not start at 1{instead}"
        )
    return None


def uses_band_bounds(args) -> bool:
    """CISPO with the band's bounds: the band's flags apply to it."""
    return args_entry(args).key == "band-cispo"


def band_drives_loss(args) -> bool:
    """The band gives the loss its bounds: `--loss band`, or CISPO with the band's bounds. Then the
    band's flags apply and BandPolicyLoss is the loss (the registry's `band_bounds`)."""
    return args_entry(args).band_bounds


def validate_objective_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Fill the selected objective's option defaults; refuse an option of an objective that is not
    selected, and an OpenRLHF option the objective cannot take (one line, exit status 2)."""
    parser = OneLineErrors(parser)
    loss = args.actor.policy_loss_type
    for objective in OBJECTIVES.values():
        namespace = getattr(args.actor, objective.name, None)  # none for an objective without options
        for option in objective.options:
            value = getattr(namespace, option.name)
            if objective.name != loss:
                if value is not None:
                    parser.error(f"{_flag(objective.name, option.name)} needs --loss {objective.name}")
            elif value is None:
                setattr(namespace, option.name, option.default)
    if loss not in OBJECTIVES:
        return
    objective = get_objective(loss)
    try:
        options = objective.resolve_options(objective_loss_kwargs(args))
    except ValueError as err:
        parser.error(f"--loss {loss}: {err}")
    if args.actor.dual_clip is not None and (not objective.takes_dual_clip or uses_band_bounds(args)):
        parser.error(f"--actor.dual_clip does not apply to --loss {loss} (it has no PPO-style clipped min)")
    if args.actor.eps_clip_low_high is not None and not objective.uses_clip_eps:
        parser.error(f"--actor.eps_clip_low_high does not apply to --loss {loss} (it has no clip interval)")
    reads_eps = uses_band_bounds(args) and RULES[args.actor.band.rule or "trust_region"].reads_clip_eps
    if args.actor.eps_clip_low_high is not None and uses_band_bounds(args) and not reads_eps:
        parser.error(
            "--actor.eps_clip_low_high does not apply to --actor.cispo.bounds band (the band's bounds replace "
            "CISPO's interval): drop it, or use --actor.cispo.bounds fixed"
        )
    if args.actor.dual_clip is not None and not args.actor.dual_clip > 1.0:
        parser.error(f"--actor.dual_clip must be > 1, got {args.actor.dual_clip}")
    clip_values = args.actor.eps_clip_low_high or (args.actor.eps_clip, args.actor.eps_clip)
    if objective.uses_clip_eps and not uses_band_bounds(args):
        if not all(math.isfinite(eps) and eps >= 0.0 for eps in clip_values):
            parser.error(f"--loss {loss} takes clip values >= 0 (--actor.eps_clip_low_high), got {list(clip_values)}")
    elif args.actor.eps_clip != OPENRLHF_EPS_CLIP and not reads_eps:
        parser.error(f"--actor.eps_clip does not apply to --loss {loss} (it has no clip interval of its own)")
    advantage = args.algo.advantage
    if objective.reads_rollout_log_probs(options) and not uses_band_bounds(args):
        problem = sampler_ratio_problem(args, f"--loss {loss}", sampler_is_refusal(loss))
        if problem is not None:
            parser.error(problem)
    if objective.sequence_level and advantage.is_correction_level == "token" and advantage.is_correction_mode == "mask":
        parser.error(
            f"--loss {loss} takes --algo.advantage.is_correction_mode clip or --algo.advantage.is_correction_level "
            "seq: token-level mask mode's zero weights have no per-sequence geometric mean"
        )


def objective_loss_kwargs(args) -> dict:
    """ObjectivePolicyLoss's objective options from the hierarchized training arguments."""
    objective = get_objective(args.actor.policy_loss_type)
    return {option.name: getattr(getattr(args.actor, objective.name), option.name) for option in objective.options}


def resolved_objective_config(args) -> dict:
    """What check-args prints for a registered objective: its options (with verl's names), the clip
    values it reads, and the aggregation it uses."""
    objective = get_objective(args.actor.policy_loss_type)
    options = objective_loss_kwargs(args)
    keys = {option.name: option.verl_key for option in objective.options}
    config = {"name": objective.name}
    if objective.verl_name:
        config.update(verl_name=objective.verl_name, source=objective.source, options=options, verl_keys=keys)
    else:  # not in verl: the authors' code the options are named after
        config.update(code=objective.code, source=objective.source, options=options, code_keys=keys)
    config["clip_ratio_means"] = objective.clip_ratio_means
    if objective.reads_rollout_log_probs(options):
        config["ratio_against"] = "mu: the rollout engine's log-probs of the sampled tokens (vLLM's)"
    if objective.uses_clip_eps and not uses_band_bounds(args):
        eps = args.actor.eps_clip_low_high or (args.actor.eps_clip, args.actor.eps_clip)
        config["clip_eps_low_high"] = list(eps)
        if objective.name == "gmpo":
            config["clip_applies_to"] = "log r, in [-eps_low, eps_high] (GMPO clips in log space)"
    if objective.sequence_level:
        config["aggregation"] = "per sequence, averaged over sequences (GMPO's; --actor.loss_agg_mode does not apply)"
    return config
