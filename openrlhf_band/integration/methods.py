"""Named loss methods, from one source: each name is the `train_ppo_ray` flags that select it, and
what a method is (its `BandSpec`, BandPolicyLoss's arguments, or OpenRLHF's clip eps) is what those
flags resolve to through the band's own flag functions (`flags.py`), as in the patched
`train_ppo_ray`. The CPU demo, the learning study and anyone comparing methods in Python take their
methods from here; extra flags (a radius, a cap, the backend) come after the method's and win.
"""

from __future__ import annotations

import argparse

from openrlhf_band.band.spec import BandSpec
from openrlhf_band.integration.flags import add_band_arguments, band_loss_kwargs, band_spec, validate_band_arguments

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
    parser.add_argument("--actor.policy_loss_type", "--loss", default="ppo", choices=["ppo", "gspo", "band"])
    parser.add_argument("--actor.eps_clip_low_high", type=float, nargs=2, default=None)
    parser.add_argument("--actor.dual_clip", type=float, default=None)
    parser.add_argument("--actor.entropy_coef", type=float, default=None)
    add_band_arguments(parser)
    args = _nested(parser.parse_args(list(flags)))
    validate_band_arguments(parser, args)
    return args


def method_flags(name: str, *extra: str) -> tuple[str, ...]:
    if name not in METHOD_FLAGS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHOD_FLAGS)}")
    return (*METHOD_FLAGS[name], *extra)


def method_spec(name: str, *extra: str) -> BandSpec | None:
    """The method's BandSpec (validated), or None for OpenRLHF's own clip."""
    args = resolve_flags(method_flags(name, *extra))
    return band_spec(args.actor.band) if args.actor.policy_loss_type == "band" else None


def method_clip_eps(name: str, *extra: str) -> tuple[float, float] | None:
    """(eps_low, eps_high) of a clip method (None for a band method)."""
    args = resolve_flags(method_flags(name, *extra))
    if args.actor.policy_loss_type == "band":
        return None
    eps = args.actor.eps_clip_low_high
    return (0.2, 0.2) if eps is None else (eps[0], eps[1])  # OpenRLHF's default --actor.eps_clip 0.2


def method_loss_kwargs(name: str, *extra: str) -> dict | None:
    """BandPolicyLoss's band arguments for the method (`flags.band_loss_kwargs`), None for the clip."""
    args = resolve_flags(method_flags(name, *extra))
    return band_loss_kwargs(args) if args.actor.policy_loss_type == "band" else None
