"""The named methods (openrlhf_band.integration.methods) resolve exactly as the patched OpenRLHF
train_ppo_ray resolves the same flags: the one table the demo and the studies take their methods
from cannot drift from what a training run with those flags would use."""

from __future__ import annotations

import pytest

from openrlhf_band.integration.flags import band_loss_kwargs, band_spec
from openrlhf_band.integration.methods import (
    METHOD_FLAGS,
    method_clip_eps,
    method_loss_kwargs,
    method_loss_type,
    method_objective_options,
    method_spec,
)
from openrlhf_band.integration.objective_flags import objective_loss_kwargs, uses_band_bounds
from openrlhf_band.objectives import OBJECTIVES
from openrlhf_band.patching.check_args import validate_train_args

BASE = [
    "--actor.model_name_or_path", "some/model", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "reward.py",
]  # fmt: skip
EXTRA = {"": (), "radius and cap": ("--band_delta", "0.07", "--actor.band.upper_cap", "5")}


@pytest.mark.parametrize("name", list(METHOD_FLAGS))
def test_each_method_is_what_train_ppo_ray_makes_of_its_flags(name):
    args = validate_train_args([*BASE, *METHOD_FLAGS[name]])  # OpenRLHF's own parser and checks
    assert method_loss_type(name) == args.actor.policy_loss_type
    if args.actor.policy_loss_type != "band" and not uses_band_bounds(args):
        assert method_spec(name) is None and method_loss_kwargs(name) is None
        assert method_clip_eps(name) == tuple(args.actor.eps_clip_low_high)
        if args.actor.policy_loss_type in OBJECTIVES:
            assert method_objective_options(name) == objective_loss_kwargs(args)
        else:
            assert method_objective_options(name) is None
        return
    assert method_objective_options(name) is None  # the band's bounds: its options are the spec's
    assert method_spec(name) == band_spec(args.actor.band)
    assert method_loss_kwargs(name) == band_loss_kwargs(args)
    assert method_clip_eps(name) is None


@pytest.mark.parametrize("name", ["band-kl", "band-kl-floor", "band-kl-entropy"])
def test_extra_flags_come_last_and_win_as_on_the_command_line(name):
    extra = EXTRA["radius and cap"]
    args = validate_train_args([*BASE, *METHOD_FLAGS[name], *extra])
    spec = method_spec(name, *extra)
    assert spec == band_spec(args.actor.band) and (spec.delta, spec.upper_cap) == (0.07, 5.0)
    assert spec != method_spec(name)  # the control: the extra flags changed the spec


def test_refusals_are_the_flags_own_and_unknown_names_are_named():
    with pytest.raises(ValueError, match="does not apply to --actor.band.rule dppo"):
        method_spec("dppo-tv", "--actor.band.upper_cap", "5")
    with pytest.raises(ValueError, match="delta must be a positive finite number"):
        method_spec("band-kl", "--band_delta", "0")
    with pytest.raises(ValueError, match="unknown method 'band-js'"):
        method_spec("band-js")
