"""The patched train_ppo_ray parser: both spellings of the band flags, defaults, rejections,
and `openrlhf-band check-args`. Also OpenRLHF's own test-suite against the patched tree."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from openrlhf_band.integration.flags import add_band_arguments, band_loss_kwargs, resolved_loss_config
from openrlhf_band.integration.fused_head import add_fused_logprobs_argument
from openrlhf_band.patching.check_args import validate_train_args
from openrlhf_band.patching.patcher import find_site_packages

BASE = [
    "--actor.model_name_or_path", "some/model", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "reward.py",
]  # fmt: skip


def config(*extra: str) -> dict:
    return resolved_loss_config(validate_train_args([*BASE, *extra]))


def test_short_and_dotted_spellings_resolve_identically():
    short = config("--loss", "band", "--band_divergence", "chi2", "--band_delta", "0.1")
    dotted = config("--actor.policy_loss_type", "band", "--actor.band.divergence", "chi2", "--actor.band.delta", "0.1")
    assert short == dotted
    assert short["band"] == {
        "rule": "trust_region", "divergence": "chi2", "delta": 0.1, "upper_cap": 10.0, "relax": None, "backend": "auto",
        "lower_floor": None, "adaptive": None, "controller": None, "anchor": "recomputed",
    }  # fmt: skip


def test_band_defaults_are_the_authors_runs():
    band = config("--loss", "band")["band"]
    assert band["divergence"] == "kl" and band["delta"] == 0.05 and band["upper_cap"] == 10.0
    assert band["relax"] is None


def test_cap_relax_and_recipe_flags_pass_through():
    cfg = config(
        "--loss", "band", "--actor.band.upper_cap", "none", "--actor.band.relax", "0.2", "0.28",
        "--actor.dual_clip", "10", "--actor.loss_agg_mode", "seq-mean-token-mean",
        "--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--algo.kl.init_coef", "0.001",
    )  # fmt: skip
    assert cfg["band"]["upper_cap"] is None and cfg["band"]["relax"] == [0.2, 0.28]
    assert cfg["dual_clip"] == 10.0 and cfg["loss_agg_mode"] == "seq-mean-token-mean"
    assert cfg["kl_loss"] == {"use_loss": True, "estimator": "k3", "init_coef": 0.001}


def test_check_args_stdout_is_one_json_document_and_the_same_every_time():
    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "check-args", "--", *BASE, "--loss", "band"]
    runs = [subprocess.run(cmd, capture_output=True, timeout=300) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
    assert json.loads(runs[0].stdout.decode())["band"]["rule"] == "trust_region"


def test_dcpo_refuses_the_trust_region_flags(capsys):
    for flag in (["--band_divergence", "chi2"], ["--band_delta", "0.1"], ["--actor.band.relax", "0.2", "0.2"]):
        with pytest.raises(SystemExit) as exit_:
            validate_train_args([*BASE, "--loss", "band", "--actor.band.rule", "dcpo", *flag])
        assert exit_.value.code == 2
        assert f"{flag[0]} does not apply to --actor.band.rule dcpo" in capsys.readouterr().err


def test_dcpo_eps_default_to_dcpos_published_values_and_the_json_says_so():
    cfg = config("--loss", "band", "--actor.band.rule", "dcpo", "--actor.band.upper_cap", "5")
    assert cfg["band"] == {
        "rule": "dcpo", "dcpo_eps": [0.16, 0.2], "dcpo_eps_source": "DCPO's published values",
        "upper_cap": 5.0, "lower_floor": None, "backend": "auto", "anchor": "recomputed",
    }  # fmt: skip
    assert "eps_clip_low_high" not in cfg  # the band does not use the clip eps: not shown as if in effect
    cfg = config("--loss", "band", "--actor.band.rule", "dcpo", "--actor.eps_clip_low_high", "0.1", "0.3")
    assert cfg["band"]["dcpo_eps"] == [0.1, 0.3] and cfg["band"]["dcpo_eps_source"] == "--actor.eps_clip_low_high"
    args = validate_train_args([*BASE, "--loss", "band", "--actor.band.rule", "dcpo"])
    band = band_loss_kwargs(args)["band"]
    assert band.rule == "dcpo" and band.dcpo_eps == (0.16, 0.2)


def test_default_loss_is_untouched():
    cfg = config()
    assert cfg["policy_loss_type"] == "ppo" and "band" not in cfg
    assert cfg["eps_clip_low_high"] == [0.2, 0.2]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--loss", "band", "--band_delta", "0"], "delta must be a positive finite number"),
        (["--loss", "band", "--band_delta", "nan"], "delta must be a positive finite number"),
        (["--loss", "band", "--actor.band.upper_cap", "0.5"], "upper_cap must be >= 1"),
        (["--loss", "band", "--actor.band.relax", "-0.1", "0.2"], "relax must be a pair"),
        (["--loss", "band", "--band_divergence", "js"], "invalid choice: 'js'"),
        (["--band_divergence", "chi2"], "needs the band loss"),
        (["--loss", "clip"], "invalid choice: 'clip'"),
        (["--loss", "band", "--actor.dual_clip", "0.5"], "dual_clip must be > 1"),
    ],
)
def test_bad_values_fail_at_parse_time(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_check_args_command_prints_json_and_fails_cleanly():
    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "check-args", "--", *BASE, "--loss", "band"]
    done = subprocess.run([*cmd, "--band_divergence", "chi2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["band"]["divergence"] == "chi2"  # stdout is one JSON document
    done = subprocess.run([*cmd, "--band_delta", "-1"], capture_output=True, text=True)
    assert done.returncode == 2 and "delta must be a positive finite number" in done.stderr
    # OpenRLHF's own bare error (PPO with a critic but neither a reward model nor
    # --reward.remote_url) comes with the line of OpenRLHF that raised it, which names the option
    no_reward = [*cmd[: cmd.index("--")], "--", "--actor.model_name_or_path", "some/model", "--loss", "band"]
    done = subprocess.run(no_reward, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert "OpenRLHF rejected the arguments: AttributeError" in done.stderr
    assert "(at openrlhf/cli/train_ppo_ray.py:" in done.stderr and "args.reward.model_name_or_path" in done.stderr


def test_openrlhf_own_test_suite_passes_on_the_patched_tree(tmp_path):
    site = find_site_packages(None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(site / "tests"), "-q", "-p", "no:cacheprovider",
         "--rootdir", str(site), "-c", "/dev/null"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_adaptive_flags_resolve_and_turn_on_the_entropy():
    cfg = config(
        "--loss", "band", "--actor.band.adaptive", "entropy", "--actor.band.entropy_power", "0.5",
        "--actor.band.delta_range", "0.02", "0.1", "--actor.band.target_entropy", "1.5",
    )  # fmt: skip
    adaptive, controller = cfg["band"]["adaptive"], cfg["band"]["controller"]
    assert adaptive["rule"] == "entropy" and adaptive["entropy_power"] == 0.5 and adaptive["delta_range"] == [0.02, 0.1]
    assert controller == {"target_entropy": 1.5, "rate": 0.1, "delta_range": [0.02, 0.1]}
    assert cfg["entropy_coef"] == 0.0  # unset, so turned on for the log only (no bonus)
    plain = config("--loss", "band")
    assert plain["band"]["adaptive"] is None and plain["band"]["controller"] is None
    args = validate_train_args([*BASE, "--loss", "band", "--actor.band.adaptive", "entropy"])
    kwargs = band_loss_kwargs(args)
    assert kwargs["adaptive"] == "entropy" and kwargs["delta_range"] == (0.0125, 0.2)  # defaults: delta / 4 .. 4 delta


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--actor.band.adaptive", "entropy"], "needs the band loss"),
        (["--loss", "band", "--actor.band.adaptive", "entropy", "--actor.band.entropy_power", "-1"], "entropy_power"),
        (["--loss", "band", "--actor.band.adaptive", "entropy", "--actor.band.delta_range", "0.2", "0.1"],
         "delta_range"),
        (["--loss", "band", "--actor.band.adaptive", "entropy", "--actor.band.delta_range", "0.1", "0.2"],
         "must lie in delta_range"),
        (["--loss", "band", "--actor.band.entropy_power", "2"], "has no effect without --actor.band.adaptive"),
        (["--loss", "band", "--actor.band.controller_rate", "0.2"], "has no effect without --actor.band.target"),
        (["--loss", "band", "--actor.band.delta_range", "0.01", "0.1"], "has no effect without"),
        (["--loss", "band", "--actor.band.target_entropy", "-1"], "target_entropy"),
        (["--loss", "band", "--actor.band.rule", "dcpo", "--actor.band.adaptive", "entropy"],
         "does not apply to --actor.band.rule dcpo"),
    ],
)  # fmt: skip
def test_bad_adaptive_flags_fail_at_parse_time(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------- lower floor and DPPO


def test_lower_floor_resolves_for_the_band_and_dcpo_and_reaches_the_loss():
    cfg = config("--loss", "band", "--actor.band.lower_floor", "0.8")
    assert cfg["band"]["lower_floor"] == 0.8 and cfg["band"]["rule"] == "trust_region"
    args = validate_train_args([*BASE, "--loss", "band", "--actor.band.lower_floor", "0.8"])
    assert band_loss_kwargs(args)["band"].lower_floor == 0.8
    assert config("--loss", "band")["band"]["lower_floor"] is None  # default: the paper's band
    dcpo = validate_train_args([*BASE, "--loss", "band", "--actor.band.rule", "dcpo",
                                "--actor.band.lower_floor", "0.6"])  # fmt: skip
    band = band_loss_kwargs(dcpo)["band"]
    assert band.lower_floor == 0.6 and band.rule == "dcpo"


@pytest.mark.parametrize("rule", ["trust_region", "dcpo", "dppo"])
def test_the_rollout_anchor_resolves_for_every_rule_and_reaches_the_loss(rule):
    flags = ["--loss", "band", "--actor.band.rule", rule, "--actor.band.anchor", "rollout"]
    cfg = config(*flags, "--train.async_enable", "--train.partial_rollout_enable")
    assert cfg["band"]["anchor"] == "rollout" and cfg["rollout"]["old_log_probs"] == "rollout"
    assert cfg["rollout"]["partial_rollout"] is True and cfg["rollout"]["is_correction_level"] == "off"
    assert band_loss_kwargs(validate_train_args([*BASE, *flags]))["anchor"] == "rollout"
    default = validate_train_args([*BASE, "--loss", "band", "--actor.band.rule", rule])
    assert band_loss_kwargs(default)["anchor"] == "recomputed"
    assert resolved_loss_config(default)["rollout"]["old_log_probs"] == "recomputed"
    # CISPO with the band's bounds is the band driving another objective: the anchor applies to it too
    cispo = config("--loss", "cispo", "--actor.cispo.bounds", "band", "--actor.band.anchor", "rollout")
    assert cispo["band"]["anchor"] == "rollout" and cispo["rollout"]["old_log_probs"] == "rollout"


def test_what_asks_vllm_for_its_log_probs():
    """vLLM returns each sampled token's log-prob for OpenRLHF's IS correction and for the rollout anchor, and
    only then (the engine's logprobs_mode and each request's logprobs=1 read the same hook)."""
    from openrlhf_band.integration.hooks import anchored_on_rollout, requests_rollout_log_probs, rollout_logprobs_mode

    cases = {
        (): (False, False),
        ("--loss", "band"): (False, False),
        ("--loss", "band", "--actor.band.anchor", "rollout"): (True, True),
        ("--loss", "band", "--algo.advantage.is_correction_level", "token"): (False, True),
        ("--algo.advantage.is_correction_level", "seq"): (False, True),
    }
    for flags, (anchored, requested) in cases.items():
        args = validate_train_args([*BASE, *flags])
        assert anchored_on_rollout(args) is anchored and requests_rollout_log_probs(args) is requested, flags
        assert rollout_logprobs_mode(args) == ("processed_logprobs" if requested else None), flags


def test_dppo_resolves_to_the_band_with_its_radii_no_cap_and_the_truncation():
    cfg = config("--loss", "band", "--actor.band.rule", "dppo", "--band_divergence", "tv", "--band_delta", "0.15")
    assert cfg["band"]["rule"] == "dppo" and cfg["band"]["divergence"] == "tv"
    assert cfg["band"]["delta_low_high"] == [0.15, 0.15] and cfg["band"]["upper_cap"] is None
    assert cfg["band"]["dppo_truncation"] == 1e4 and cfg["dual_clip"] is None
    dppo = ["--actor.band.rule", "dppo", "--actor.band.delta_low_high", "0.1", "0.2"]
    dppo += ["--actor.band.dppo_truncation", "3"]
    args = validate_train_args([*BASE, "--loss", "band", *dppo])
    band = band_loss_kwargs(args)["band"]
    assert (band.divergence, band.delta, band.lower_delta) == ("kl", 0.2, 0.1)
    assert band.upper_cap is None and band.ratio_truncation == 3.0 and band.lower_floor is None
    off = config("--loss", "band", "--actor.band.rule", "dppo", "--actor.band.dppo_truncation", "none")
    assert off["band"]["dppo_truncation"] is None and off["band"]["gradient_weight"] == "r"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--loss", "band", "--actor.band.lower_floor", "0"], "strictly between 0 and 1"),
        (["--loss", "band", "--actor.band.lower_floor", "1"], "strictly between 0 and 1"),
        (["--loss", "band", "--actor.band.lower_floor", "-0.2"], "strictly between 0 and 1"),
        (["--loss", "band", "--actor.band.lower_floor", "nan"], "strictly between 0 and 1"),
        (["--loss", "band", "--actor.band.lower_floor", "high"], "strictly between 0 and 1, got 'high'"),
        (["--actor.band.lower_floor", "0.8"], "needs the band loss"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--band_divergence", "chi2"], "takes --band_divergence tv"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.upper_cap", "10"],
         "--actor.band.upper_cap does not apply to --actor.band.rule dppo"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.lower_floor", "0.8"],
         "--actor.band.lower_floor does not apply to --actor.band.rule dppo"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.relax", "0.2", "0.2"], "does not apply"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.adaptive", "entropy"], "does not apply"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.dual_clip", "10"],
         "--actor.dual_clip does not apply to --actor.band.rule dppo"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--band_delta", "0.1", "--actor.band.delta_low_high", "0.1",
          "0.2"], "give DPPO's radii once"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.delta_low_high", "0", "0.2"],
         "lower_delta must be a positive finite number"),
        (["--loss", "band", "--actor.band.rule", "dppo", "--actor.band.dppo_truncation", "0"],
         "dppo_truncation must be > 0"),
        (["--loss", "band", "--actor.band.dppo_truncation", "3"], "--actor.band.dppo_truncation is DPPO's"),
        (["--loss", "band", "--actor.band.delta_low_high", "0.1", "0.2"], "--actor.band.delta_low_high is DPPO's"),
        (["--actor.band.anchor", "rollout"], "--actor.band.anchor needs the band loss"),
        (["--loss", "sapo", "--actor.band.anchor", "rollout"], "--actor.band.anchor needs the band loss"),
        (["--loss", "band", "--actor.band.anchor", "sampler"], "invalid choice: 'sampler'"),
        (["--loss", "band", "--actor.band.anchor", "rollout", "--algo.advantage.is_correction_level", "token"],
         "--algo.advantage.is_correction_level token does not apply to --actor.band.anchor rollout"),
        (["--loss", "band", "--actor.band.anchor", "rollout", "--rollout.top_p", "0.95"],
         "--actor.band.anchor rollout needs --rollout.top_p 1 (got 0.95)"),
    ],
)  # fmt: skip
def test_bad_floor_and_dppo_flags_fail_at_parse_time(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_memory_flag_is_registered_beside_the_band_flags_not_through_them():
    """--ds.fused_logprobs is the patched parser's own registration (fused_head), not the band's."""
    parser = argparse.ArgumentParser()
    add_band_arguments(parser)
    assert "--actor.band.delta" in parser._option_string_actions
    assert "--ds.fused_logprobs" not in parser._option_string_actions
    add_fused_logprobs_argument(parser)
    assert "--ds.fused_logprobs" in parser._option_string_actions


def test_fused_logprobs_flag_resolves_for_any_loss_and_refuses_what_it_cannot_honour(capsys):
    assert config("--ds.fused_logprobs")["fused_logprobs"] is True
    assert config("--loss", "band", "--ds.fused_logprobs")["fused_logprobs"] is True
    assert config()["fused_logprobs"] is False
    for extra, message in (
        (["--ds.tensor_parallel_size", "2"], "--ds.tensor_parallel_size > 1"),
        (["--data.max_images_per_prompt", "1"], "a vision-language model"),
        (["--ds.deepcompile"], "--ds.deepcompile"),
    ):
        with pytest.raises(SystemExit) as exit_:
            validate_train_args([*BASE, "--ds.fused_logprobs", *extra])
        assert exit_.value.code == 2
        assert f"--ds.fused_logprobs does not support {message}" in capsys.readouterr().err


def test_check_args_says_which_attention_it_resolved_and_why(monkeypatch):
    """A hand-written line gets train_ppo_ray's default, flash_attention_2, where the example scripts pass
    sdpa when flash_attn does not import: the stderr note says which, why, and what the scripts pass."""
    from openrlhf_band.patching import check_args

    def note(*extra: str, flash_attn: bool) -> str:
        monkeypatch.setattr(check_args, "flash_attn_installed", lambda: flash_attn)
        argv = [*BASE, "--loss", "band", *extra]
        return check_args.attention_note(argv, validate_train_args(argv))

    default = note(flash_attn=False)
    assert default.startswith("openrlhf-band check-args: attention flash_attention_2, packing off (train_ppo_ray's")
    assert "flash_attn is not installed here" in default and "--ds.attn_implementation sdpa" in default
    assert "not installed" not in note(flash_attn=True)
    given = note("--ds.attn_implementation", "sdpa", flash_attn=False)
    assert given == "openrlhf-band check-args: attention sdpa, packing off (--ds.attn_implementation)"
    packed = note("--ds.attn_implementation=sdpa", "--ds.packing_samples", "--vllm.num_engines", "1", flash_attn=True)
    assert "attention flash_attention_2, packing on (--ds.attn_implementation sdpa replaced by OpenRLHF" in packed


def test_check_args_writes_the_attention_note_on_stderr_only():
    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "check-args", "--", *BASE, "--loss", "band"]
    done = subprocess.run([*cmd, "--ds.attn_implementation", "sdpa"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["attention"] == {"implementation": "sdpa", "packing_samples": False}
    assert "openrlhf-band check-args: attention sdpa, packing off (--ds.attn_implementation)" in done.stderr


# OpenRLHF 0.11.2's advantage estimators: the parser's own choices (the next test reads them from its message)
ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_advantage_estimator_takes_the_band(estimator):
    """The band is a loss: every estimator's advantages reach it (gae through a critic, made from the actor's
    model when the reward is a function, as train_ppo_ray does)."""
    args = validate_train_args([*BASE, "--loss", "band", "--algo.advantage.estimator", estimator])
    cfg = resolved_loss_config(args)
    assert cfg["advantage_estimator"] == estimator and cfg["band"]["rule"] == "trust_region"
    assert args.critic.model_name_or_path == ("some/model" if estimator == "gae" else None)


def test_the_estimators_tested_are_openrlhfs(capsys):
    import re

    with pytest.raises(SystemExit):
        validate_train_args([*BASE, "--loss", "band", "--algo.advantage.estimator", "none-such"])
    choices = re.search(r"invalid choice: 'none-such' \(choose from (.*)\)", capsys.readouterr().err)
    assert choices, "the parser's message changed"
    assert tuple(re.findall(r"'?([a-z_]+)'?", choices.group(1))) == ESTIMATORS


@pytest.mark.parametrize(
    "flags, bound",
    [
        (["--band_divergence", "hellinger", "--band_delta", "5"], "hellinger's range (0, 2)"),
        (["--band_divergence", "tv", "--band_delta", "1"], "tv's range (0, 1)"),
        (["--actor.band.rule", "dppo", "--band_divergence", "tv", "--actor.band.delta_low_high", "1.2", "0.1"],
         "--actor.band.delta_low_high LOW 1.2 is outside tv's range (0, 1)"),
        (["--actor.band.rule", "dppo", "--band_divergence", "tv", "--actor.band.delta_low_high", "0.1", "1.5"],
         "--actor.band.delta_low_high HIGH 1.5 is outside tv's range (0, 1)"),
    ],
)  # fmt: skip
def test_a_radius_past_a_bounded_divergences_range_is_refused(flags, bound, capsys):
    """At delta >= sup g (tv 1, hellinger 2) every token's band is [0, 1/p]: no trust region, refused with the range."""
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, "--loss", "band", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and bound in err and ("no trust region" in err or "lower bound is 0" in err), err


def test_a_radius_inside_the_range_or_unbounded_is_accepted_and_an_adaptive_range_is_held_to_it(capsys):
    config("--loss", "band", "--band_divergence", "hellinger", "--band_delta", "1.99")
    config("--loss", "band", "--band_divergence", "chi2", "--band_delta", "5")
    adaptive = ["--loss", "band", "--band_divergence", "tv", "--band_delta", "0.5", "--actor.band.adaptive", "entropy"]
    with pytest.raises(SystemExit):  # the default range's top, min(4 delta, 1) = 1, is tv's bound
        validate_train_args([*BASE, *adaptive])
    assert "--actor.band.delta_range HIGH 1 is outside tv's range" in capsys.readouterr().err
    config(*adaptive, "--actor.band.delta_range", "0.2", "0.9")


def test_band_loss_refuses_a_radius_past_the_range_but_the_bounds_stay_defined():
    from openrlhf_band import BandPolicyLoss, band_bounds

    with pytest.raises(ValueError, match="outside tv's range"):
        BandPolicyLoss(divergence="tv", delta=1.0)
    with pytest.raises(ValueError, match="lower_delta 2.5 is outside hellinger's range"):
        BandPolicyLoss(divergence="hellinger", delta=0.1, lower_delta=2.5)
    lower, upper = band_bounds(torch.log(torch.tensor([0.1, 0.5])), "tv", 1.0)  # the math: [0, 1/p] for every p
    assert torch.equal(lower, torch.zeros(2)) and torch.allclose(upper, torch.tensor([10.0, 2.0]))


def test_the_band_validators_refuse_in_one_line_not_after_the_usage(capsys):
    """train_ppo_ray's own parser errors keep argparse's usage; the band's refusals do not print it."""
    import argparse

    from openrlhf_band.integration.flags import validate_loss_arguments

    args = validate_train_args([*BASE, "--loss", "band"])  # the band's options filled in: all of them "given"
    capsys.readouterr()
    parser = argparse.ArgumentParser(prog="train_ppo_ray")
    parser.add_argument("--a-flag-only-usage-would-show")
    args.actor.band.rule = "dcpo"
    with pytest.raises(SystemExit) as exit_:
        validate_loss_arguments(parser, args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "usage" not in err and "a-flag-only-usage-would-show" not in err
    assert err.splitlines() == [
        "train_ppo_ray: error: --band_divergence does not apply to --actor.band.rule dcpo (DCPO's bounds depend only "
        "on its eps): drop it, or use --actor.band.rule trust_region",
        "train_ppo_ray: the flags and their values: train_ppo_ray --help",
    ]


def test_the_named_methods_still_refuse_with_a_value_error():
    """The methods' parser (integration/methods.py) keeps its own error: Python callers get a ValueError."""
    from openrlhf_band.integration.methods import method_spec

    with pytest.raises(ValueError, match="delta must be a positive finite number"):
        method_spec("band-kl", "--band_delta", "0")
    with pytest.raises(ValueError, match="--band_delta"):  # the range check names the flag
        method_spec("band-tv", "--band_delta", "1")


def test_check_args_prints_the_error_not_the_usage():
    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "check-args", "--", *BASE, "--loss", "band",
           "--band_divergence", "nope"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "usage:" not in run.stderr and "invalid choice: 'nope'" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "train_ppo_ray: the flags and their values: train_ppo_ray --help"
