"""Named loss methods, from one source: each name is the `train_ppo_ray` flags that select it, and
what a method is (its `BandSpec`, BandPolicyLoss's arguments, or OpenRLHF's clip eps) is what those
flags resolve to through the band's own flag functions (`flags.py`), as in the patched
`train_ppo_ray`. The CPU demo, the learning study and anyone comparing methods in Python take their
methods from here; extra flags (a radius, a cap, the backend) come after the method's and win.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from openrlhf_band.band.spec import BandSpec
from openrlhf_band.integration.flags import add_loss_arguments, band_loss_kwargs, band_spec, validate_loss_arguments
from openrlhf_band.integration.objective_flags import LOSS_TYPES, band_drives_loss, objective_loss_kwargs
from openrlhf_band.objectives import OBJECTIVES

#: name -> the train_ppo_ray flags of the method (beside the run's other flags)
METHOD_FLAGS: dict[str, tuple[str, ...]] = {
    "clip": ("--actor.eps_clip_low_high", "0.2", "0.2"),
    "clip-higher": ("--actor.eps_clip_low_high", "0.2", "0.28"),
    "band-kl": ("--loss", "band", "--band_divergence", "kl"),
    "band-tv": ("--loss", "band", "--band_divergence", "tv"),
    "band-chi2": ("--loss", "band", "--band_divergence", "chi2"),
    # DCPO's probability-dependent clip at its published eps (0.16, 0.20)
    "dcpo": ("--loss", "band", "--actor.band.rule", "dcpo"),
    # the adaptive radius: delta_t from each token's entropy
    "band-kl-entropy": ("--loss", "band", "--band_divergence", "kl", "--actor.band.adaptive", "entropy"),
    # the lower floor: each token's lower bound max(r_low(p), F)
    "band-kl-floor-0.5": ("--loss", "band", "--band_divergence", "kl", "--actor.band.lower_floor", "0.5"),
    "band-kl-floor-0.7": ("--loss", "band", "--band_divergence", "kl", "--actor.band.lower_floor", "0.7"),
    "band-kl-floor": ("--loss", "band", "--band_divergence", "kl", "--actor.band.lower_floor", "0.8"),
    "band-kl-floor-0.9": ("--loss", "band", "--band_divergence", "kl", "--actor.band.lower_floor", "0.9"),
    "band-kl-entropy-floor": ("--loss", "band", "--band_divergence", "kl", "--actor.band.adaptive", "entropy",
                              "--actor.band.lower_floor", "0.8"),  # fmt: skip
    # DPPO with the DPPO authors' radii (delta_low = delta_high) and their truncation c = 1e4 (the default)
    "dppo-tv": ("--loss", "band", "--actor.band.rule", "dppo", "--band_divergence", "tv", "--band_delta", "0.15"),
    "dppo-kl": ("--loss", "band", "--actor.band.rule", "dppo", "--band_divergence", "kl", "--band_delta", "0.05"),
    # the field's objectives (openrlhf_band/objectives), each at its authors' settings (examples/scripts cites them)
    "cispo": ("--loss", "cispo", "--actor.eps_clip_low_high", "10", "0.2"),
    "sapo": ("--loss", "sapo", "--actor.sapo.tau_pos", "1.0", "--actor.sapo.tau_neg", "1.05"),
    "gmpo": ("--loss", "gmpo", "--actor.eps_clip_low_high", "0.4", "0.4"),
    "clip-cov": ("--loss", "clip_cov", "--actor.eps_clip_low_high", "1", "1",
                 "--actor.clip_cov.clip_cov_ratio", "0.0002", "--actor.clip_cov.clip_cov_lb", "1",
                 "--actor.clip_cov.clip_cov_ub", "5"),  # fmt: skip
    "kl-cov": ("--loss", "kl_cov", "--actor.kl_cov.kl_cov_ratio", "0.002", "--actor.kl_cov.ppo_kl_coef", "1"),
    # the band as CISPO's bounds: the kl band's [r_low(p), r_up(p)] in place of CISPO's fixed interval
    "band-kl-cispo": ("--loss", "cispo", "--actor.cispo.bounds", "band", "--band_divergence", "kl"),
    # the kl band centred on the sampler: pi_old is the rollout engine's log-probs, no recompute pass
    "band-kl-rollout": ("--loss", "band", "--band_divergence", "kl", "--actor.band.anchor", "rollout"),
    # the newest baselines at their authors' loss options (examples/scripts/gpg.sh, drpo.sh, ipo.sh; the scripts'
    # aggregation modes are not part of a method: the demo and the studies set their own): GPG's -A log pi, and
    # DRPO's and IPO's ratios against the sampler's log-probs
    "gpg": ("--loss", "gpg"),
    "drpo": ("--loss", "drpo", "--actor.drpo.epsilon", "12.5"),
    "ipo": ("--loss", "ipo", "--actor.ipo.ipo_threshold", "0.1", "--actor.ipo.adv_tau", "1", "--actor.ipo.kl_tau",
            "0.001"),  # fmt: skip
}


class _RefusingParser(argparse.ArgumentParser):
    """The flags' parse-time refusals (parser.error) as a ValueError for Python callers."""

    def error(self, message: str):
        raise ValueError(message)


def _nested(flat: argparse.Namespace) -> argparse.Namespace:
    """actor.band.delta=... -> args.actor.band.delta, as OpenRLHF's hierarchize does."""
    root = argparse.Namespace()
    for dotted, value in vars(flat).items():
        node = root
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not hasattr(node, part):
                setattr(node, part, argparse.Namespace())
            node = getattr(node, part)
        setattr(node, leaf, value)
    return root


def resolve_flags(flags: tuple[str, ...] | list[str]) -> argparse.Namespace:
    """The loss flags (OpenRLHF's loss options that the band reads, and the band's own) parsed and
    validated as train_ppo_ray does; ValueError with the flags' own message if refused."""
    parser = _RefusingParser(prog="method", add_help=False)
    parser.add_argument("--actor.policy_loss_type", "--loss", default="ppo", choices=["ppo", "gspo", *LOSS_TYPES])
    parser.add_argument("--actor.eps_clip", type=float, default=0.2)
    parser.add_argument("--actor.eps_clip_low_high", type=float, nargs=2, default=None)
    parser.add_argument("--actor.dual_clip", type=float, default=None)
    parser.add_argument("--actor.entropy_coef", type=float, default=None)
    parser.add_argument("--algo.advantage.is_correction_level", default="off", choices=["off", "token", "seq"])
    parser.add_argument("--algo.advantage.is_correction_mode", default="mask", choices=["mask", "clip"])
    add_loss_arguments(parser)
    args = _nested(parser.parse_args(list(flags)))
    validate_loss_arguments(parser, args)
    return args


def method_flags(name: str, *extra: str) -> tuple[str, ...]:
    if name not in METHOD_FLAGS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHOD_FLAGS)}")
    return (*METHOD_FLAGS[name], *extra)


@dataclass(frozen=True)
class ResolvedMethod:
    """What a method's flags resolve to (one parse, `resolve_method`).

    loss_type: its --actor.policy_loss_type (ppo for OpenRLHF's clip).
    spec: its BandSpec where the band gives the bounds (the band, CISPO with the band's bounds), else None.
    loss_kwargs: BandPolicyLoss's band arguments (`flags.band_loss_kwargs`) in that case, else None.
    clip_eps: (eps_low, eps_high) of a clip method or of an objective's clip values, None where the band
        gives the bounds.
    objective_options: a registered objective's options (`make_policy_loss`'s keywords beside the clip
        eps), None for the clip and where the band gives the bounds.
    """

    loss_type: str
    spec: BandSpec | None
    loss_kwargs: dict | None
    clip_eps: tuple[float, float] | None
    objective_options: dict | None


def resolve_method(name: str, *extra: str) -> ResolvedMethod:
    """The method's flags (and `extra`, after them) parsed and validated once, as train_ppo_ray does."""
    args = resolve_flags(method_flags(name, *extra))
    loss_type = args.actor.policy_loss_type
    if band_drives_loss(args):
        return ResolvedMethod(loss_type, band_spec(args.actor.band), band_loss_kwargs(args), None, None)
    eps = args.actor.eps_clip_low_high  # OpenRLHF fills it from --actor.eps_clip
    clip_eps = (args.actor.eps_clip,) * 2 if eps is None else (eps[0], eps[1])
    options = objective_loss_kwargs(args) if loss_type in OBJECTIVES else None
    return ResolvedMethod(loss_type, None, None, clip_eps, options)


def method_spec(name: str, *extra: str) -> BandSpec | None:
    """The method's BandSpec (validated), or None for OpenRLHF's own clip and the objectives' fixed clips."""
    return resolve_method(name, *extra).spec


def method_clip_eps(name: str, *extra: str) -> tuple[float, float] | None:
    """(eps_low, eps_high) of a clip method or of an objective's clip values (None where the band gives the
    bounds)."""
    return resolve_method(name, *extra).clip_eps


def method_loss_kwargs(name: str, *extra: str) -> dict | None:
    """BandPolicyLoss's band arguments for the method (`flags.band_loss_kwargs`), None for the clip."""
    return resolve_method(name, *extra).loss_kwargs


def method_loss_type(name: str, *extra: str) -> str:
    """The method's --actor.policy_loss_type (ppo for OpenRLHF's clip)."""
    return resolve_method(name, *extra).loss_type


def method_objective_options(name: str, *extra: str) -> dict | None:
    """A registered objective's options for the method (`make_policy_loss`'s keywords beside the clip
    eps), None for the clip and the band."""
    return resolve_method(name, *extra).objective_options
