"""Every example script dry-runs through the patched OpenRLHF parser (check-args), and only the
method flags differ between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"
# the scripts call `python3` and `openrlhf-band`: those of this interpreter's environment
BASE_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
# every script's check-args JSON at 4f63a9a (DATA_DIR written <DATA_DIR>), with the same environment as dry_run;
# the TASK= variants and the agent's are in the file too (compared when it was made: identical)
CHECK_ARGS_AT_4F63A9A = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "unchanged" / "check_args_at_4f63a9a.json").read_text()
)
# DPPO's whole resolved block: no delta, relax, floor or adaptive keys
DPPO_KEYS = {"rule", "divergence", "delta_low_high", "dppo_truncation", "mask", "gradient_weight", "upper_cap",
             "backend", "anchor"}  # fmt: skip
# script: (policy loss, dual_clip, the band fields checked; band None: OpenRLHF's own PPO clip, no band)
EXPECTED = {
    "bandpo_kl.sh": ("band", 10.0, {"rule": "trust_region", "divergence": "kl", "delta": 0.05, "upper_cap": 10.0,
                                    "lower_floor": None}),
    "bandpo_tv.sh": ("band", 10.0, {"rule": "trust_region", "divergence": "tv", "delta": 0.05, "upper_cap": 10.0,
                                    "lower_floor": None}),
    "bandpo_chi2.sh": ("band", 10.0, {"rule": "trust_region", "divergence": "chi2", "delta": 0.05, "upper_cap": 10.0,
                                      "lower_floor": None}),
    "bandpo_adaptive.sh": ("band", 10.0, {"rule": "trust_region", "divergence": "kl", "delta": 0.05, "upper_cap": 10.0,
                                          "lower_floor": None}),
    "bandpo_kl_floor.sh": ("band", 10.0, {"rule": "trust_region", "divergence": "kl", "delta": 0.05, "upper_cap": 10.0,
                                          "relax": None, "lower_floor": 0.8}),
    "grpo_clip.sh": ("ppo", 10.0, None),
    "clip_higher.sh": ("ppo", 10.0, None),
    "dcpo.sh": ("band", 10.0, {"rule": "dcpo", "upper_cap": 10.0, "dcpo_eps": [0.16, 0.2], "lower_floor": None}),
    # DPPO: the authors' verl radii and truncation c = 1e4; no dual-clip (refused with DPPO), no cap
    "dppo_tv.sh": ("band", None, {"rule": "dppo", "divergence": "tv", "delta_low_high": [0.15, 0.15],
                                  "dppo_truncation": 10000.0, "gradient_weight": "min(r, dppo_truncation)",
                                  "upper_cap": None, "backend": "auto"}),
    "dppo_kl.sh": ("band", None, {"rule": "dppo", "divergence": "kl", "delta_low_high": [0.05, 0.05],
                                  "dppo_truncation": 10000.0, "gradient_weight": "min(r, dppo_truncation)",
                                  "upper_cap": None, "backend": "auto"}),
    # the field's objectives at their authors' settings (each script cites its source)
    "cispo.sh": ("cispo", None, None),
    "bandpo_kl_cispo.sh": ("cispo", None, {"rule": "trust_region", "divergence": "kl", "delta": 0.05,
                                           "upper_cap": 10.0, "lower_floor": None}),
    "sapo.sh": ("sapo", None, None),
    "gmpo.sh": ("gmpo", None, None),
    "clip_cov.sh": ("clip_cov", None, None),
    "kl_cov.sh": ("kl_cov", None, None),
    "gspo.sh": ("gspo", None, None),
    # issue 60's baselines, after 4f63a9a (not in that fixture): GPG (verl 0.9.1), DRPO (UniRL), IPO (prime-rl)
    "gpg.sh": ("gpg", None, None),
    "drpo.sh": ("drpo", None, None),
    "ipo.sh": ("ipo", None, None),
}  # fmt: skip
# the objective's resolved options and clip values (check-args' "objective" block)
OBJECTIVE = {
    "cispo.sh": ({"bounds": "fixed"}, [10.0, 0.2]),
    "bandpo_kl_cispo.sh": ({"bounds": "band"}, None),
    "sapo.sh": ({"tau_pos": 1.0, "tau_neg": 1.05}, None),
    "gmpo.sh": ({}, [0.4, 0.4]),
    "clip_cov.sh": ({"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}, [1.0, 1.0]),
    "kl_cov.sh": ({"kl_cov_ratio": 0.002, "ppo_kl_coef": 1.0}, None),
    "gpg.sh": ({}, None),
    "drpo.sh": ({"epsilon": 12.5, "old_logp_source": "rollout"}, None),
    "ipo.sh": ({"ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 0.001}, None),
}
# the scripts whose authors aggregate by token mean (the rest keep the recipe's seq-mean-token-mean but DRPO's)
TOKEN_MEAN = {"cispo.sh", "bandpo_kl_cispo.sh", "clip_cov.sh", "kl_cov.sh", "gpg.sh", "ipo.sh"}
AGGREGATION = {"drpo.sh": "seq-mean-token-sum-norm"}  # UniRL's recipe, over --rollout.max_new_tokens
ESTIMATOR = {"drpo.sh": "dr_grpo"}  # UniRL's recipe: group-mean advantages without the std


def without_the_anchor(config: dict) -> dict:
    """The resolved configuration less what the rollout anchor (issue 60) added after 4f63a9a, checked here to hold
    its default: rollout.old_log_probs and band.anchor, both "recomputed" (pi_old recomputed by the actor, as
    before the flag existed)."""
    config = json.loads(json.dumps(config))
    assert config["rollout"].pop("old_log_probs") == "recomputed"
    if "band" in config:
        assert config["band"].pop("anchor") == "recomputed"
    return config


def dry_run(script: str, tmp_path: Path, **extra_env: str) -> dict:
    env = {
        **BASE_ENV,
        "DRY_RUN": "1",
        "MODEL": "/models/some-model",
        "DATA_DIR": str(tmp_path),
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("LOWER_FLOOR", None)  # bandpo_kl_floor.sh reads it: the test checks the script's own value
    env.pop("FUSED_LOGPROBS", None)
    env.update(extra_env)
    done = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout)  # stdout is check-args' JSON alone: status lines go to stderr (| jq works)


def test_every_script_is_covered():
    assert {p.name for p in SCRIPTS.glob("*.sh")} - {"common.sh"} == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_dry_run_validates_with_the_patched_parser(script, tmp_path):
    config = dry_run(script, tmp_path)
    # the whole resolved configuration is the one every script gave before the tasks moved into folders (4f63a9a)
    if script in CHECK_ARGS_AT_4F63A9A:
        at_4f63a9a = CHECK_ARGS_AT_4F63A9A[script]
        assert json.loads(json.dumps(without_the_anchor(config)).replace(str(tmp_path), "<DATA_DIR>")) == at_4f63a9a
    loss, dual_clip, band = EXPECTED[script]
    assert config["policy_loss_type"] == loss
    # the paper's shared settings
    assert config["advantage_estimator"] == ESTIMATOR.get(script, "group_norm")
    assert config["fused_logprobs"] is True  # --ds.fused_logprobs, from common.sh
    assert config["loss_agg_mode"] == AGGREGATION.get(script, "token-mean" if script in TOKEN_MEAN else
                                                      "seq-mean-token-mean")  # fmt: skip
    assert config["kl_loss"] == {"use_loss": True, "estimator": "k3", "init_coef": 0.001}
    assert config["entropy_coef"] == 0.0
    assert config["dual_clip"] == dual_clip
    if band is None:
        assert "band" not in config
    else:
        assert {k: config["band"][k] for k in band} == band
    if script == "bandpo_adaptive.sh":
        assert config["band"]["adaptive"]["rule"] == "entropy" and config["band"]["adaptive"]["entropy_power"] == 1.0
    elif band is not None and band["rule"] == "trust_region":
        assert config["band"]["adaptive"] is None
    if band is not None and band["rule"] == "dppo":
        assert set(config["band"]) == DPPO_KEYS
        assert config["band"]["mask"].startswith(f"no gradient where binary {band['divergence']} > delta_low")
    if script == "clip_higher.sh":
        assert config["eps_clip_low_high"] == [0.2, 0.28]
    if script == "gspo.sh":
        assert config["eps_clip_low_high"] == [0.0003, 0.0004]
    if band is not None or script in OBJECTIVE:  # the band ignores the clip eps; an objective shows its own
        assert "eps_clip_low_high" not in config
    if script in OBJECTIVE:
        options, eps = OBJECTIVE[script]
        assert config["objective"]["name"] == loss and config["objective"]["options"] == options
        assert config["objective"].get("clip_eps_low_high") == eps
    else:
        assert "objective" not in config
    # no flash-attn in this environment: SDPA without packing (common.sh's detection)
    assert config["attention"] == {"implementation": "sdpa", "packing_samples": False}


def test_a_bad_extra_flag_fails_the_dry_run(tmp_path):
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "EXTRA_ARGS": "--band_delta -1"}
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0 and "delta must be a positive finite number" in done.stderr


def test_attn_override_turns_packing_on_with_flash_attention(tmp_path, monkeypatch):
    monkeypatch.setitem(BASE_ENV, "ATTN", "flash_attention_2")
    config = dry_run("bandpo_kl.sh", tmp_path)
    assert config["attention"] == {"implementation": "flash_attention_2", "packing_samples": True}


def test_the_floor_scripts_floor_comes_from_lower_floor_and_names_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(BASE_ENV, "LOWER_FLOOR", "0.5")
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl_floor.sh")], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["band"]["lower_floor"] == 0.5
    assert "[bandpo-kl-floor0.5]" in done.stderr  # the run's name, in the launcher's status lines


def test_the_dppo_scripts_refuse_a_dual_clip(tmp_path):
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "EXTRA_ARGS": "--actor.dual_clip 10"}
    done = subprocess.run(["bash", str(SCRIPTS / "dppo_tv.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0 and "--actor.dual_clip does not apply to --actor.band.rule dppo" in done.stderr


def test_fused_logprobs_can_be_switched_off(tmp_path):
    assert dry_run("grpo_clip.sh", tmp_path, FUSED_LOGPROBS="0")["fused_logprobs"] is False


def launched_arguments(tmp_path: Path, **extra_env: str) -> list[str]:
    """The argument list common.sh hands check-args, seen by a stand-in `openrlhf-band` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    stand_in = bin_dir / "openrlhf-band"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stand_in.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{BASE_ENV['PATH']}"
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path / "data"), "PATH": path}
    env.update(extra_env)
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_sleep_mode_is_on_unless_switched_off_and_paths_are_absolute(tmp_path):
    args = launched_arguments(tmp_path)
    assert args[:2] == ["check-args", "--"] and {"--vllm.enable_sleep", "--ds.enable_sleep"} <= set(args)
    off = launched_arguments(tmp_path / "off", SLEEP_MODE="0", OUTPUT_ROOT="rel/runs")
    assert not {"--vllm.enable_sleep", "--ds.enable_sleep"} & set(off)
    # DATA_DIR and OUTPUT_ROOT reach OpenRLHF as absolute paths (a cluster job runs in Ray's own folder)
    for flag in ("--data.prompt_dataset", "--eval.dataset", "--ckpt.path", "--ckpt.output_dir",
                 "--logger.tensorboard_dir"):
        assert Path(off[off.index(flag) + 1]).is_absolute(), (flag, off)
    assert off[off.index("--ckpt.path") + 1] == str(Path.cwd() / "rel" / "runs" / "bandpo-kl-seed42" / "ckpt")


def test_async_splits_the_gpus_turns_sleep_off_and_the_is_correction_on(tmp_path):
    def value(args: list[str], flag: str) -> str:
        return args[args.index(flag) + 1]

    sync = launched_arguments(tmp_path / "sync")
    assert "--train.async_enable" not in sync and "--algo.advantage.is_correction_level" not in sync
    assert value(sync, "--actor.num_gpus_per_node") == "8" and value(sync, "--vllm.num_engines") == "8"
    run = launched_arguments(tmp_path / "async", ASYNC="1", NNODES="2", VLLM_TP="2")
    assert "--train.async_enable" in run and "--train.partial_rollout_enable" not in run
    assert not {"--vllm.enable_sleep", "--ds.enable_sleep"} & set(run)  # train_ppo_ray refuses sleep mode in async
    assert value(run, "--train.async_queue_size") == "1"
    assert value(run, "--algo.advantage.is_correction_level") == "token"
    assert value(run, "--algo.advantage.is_correction_mode") == "mask"
    # half of each node's 8 GPUs train, the other half hold 2 nodes x 4 / TP 2 engines
    assert value(run, "--actor.num_gpus_per_node") == value(run, "--ref.num_gpus_per_node") == "4"
    assert value(run, "--vllm.num_engines") == "4"
    run = launched_arguments(tmp_path / "partial", ASYNC="1", PARTIAL_ROLLOUT="1", ASYNC_QUEUE="2",
                             ROLLOUT_GPUS_PER_NODE="6")  # fmt: skip
    assert "--train.partial_rollout_enable" in run and value(run, "--train.async_queue_size") == "2"
    assert value(run, "--actor.num_gpus_per_node") == "2" and value(run, "--vllm.num_engines") == "6"


def test_async_reaches_check_args_resolved_configuration(tmp_path):
    assert dry_run("bandpo_kl.sh", tmp_path / "sync")["rollout"] == {
        "old_log_probs": "recomputed", "async": False, "async_queue_size": None, "partial_rollout": False,
        "is_correction_level": "off",
    }  # fmt: skip
    assert dry_run("bandpo_kl.sh", tmp_path / "async", ASYNC="1", PARTIAL_ROLLOUT="1")["rollout"] == {
        "old_log_probs": "recomputed", "async": True, "async_queue_size": 1, "partial_rollout": True,
        "is_correction_level": "token", "is_correction_mode": "mask",
    }  # fmt: skip


def test_the_fixture_covers_every_script_but_issue_60s():
    assert set(EXPECTED) - set(CHECK_ARGS_AT_4F63A9A) == {"gpg.sh", "drpo.sh", "ipo.sh"}


@pytest.mark.parametrize("script", ["drpo.sh", "ipo.sh"])
def test_the_sampler_ratio_scripts_run_async_without_the_is_correction(tmp_path, script):
    config = dry_run(script, tmp_path, ASYNC="1", PARTIAL_ROLLOUT="1")
    assert config["rollout"]["async"] is True and config["rollout"]["is_correction_level"] == "off"
    assert config["objective"]["ratio_against"].startswith("mu: the rollout engine's log-probs")


def test_band_anchor_rollout_centres_the_band_on_vllm_in_place_of_the_is_correction(tmp_path):
    config = dry_run("bandpo_kl.sh", tmp_path / "anchor", ASYNC="1", PARTIAL_ROLLOUT="1", BAND_ANCHOR="rollout")
    assert config["band"]["anchor"] == "rollout"
    assert config["rollout"] == {
        "old_log_probs": "rollout", "async": True, "async_queue_size": 1, "partial_rollout": True,
        "is_correction_level": "off",
    }  # fmt: skip
    assert dry_run("dppo_tv.sh", tmp_path / "sync", BAND_ANCHOR="rollout")["rollout"]["old_log_probs"] == "rollout"


@pytest.mark.parametrize(
    "script, env, message",
    [("grpo_clip.sh", {"BAND_ANCHOR": "rollout"}, "--actor.band.anchor needs the band loss"),
     ("bandpo_kl.sh", {"BAND_ANCHOR": "sampler"}, "BAND_ANCHOR must be recomputed or rollout"),
     ("bandpo_kl.sh", {"BAND_ANCHOR": "rollout", "EXTRA_ARGS": "--rollout.top_p 0.9"},
      "--actor.band.anchor rollout needs --rollout.top_p 1")],
)  # fmt: skip
def test_band_anchor_that_cannot_run_stops_with_a_reason(tmp_path, script, env, message):
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "MODEL": "/models/some-model", **env}
    done = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    "env, message",
    [({"PARTIAL_ROLLOUT": "1"}, "PARTIAL_ROLLOUT=1 needs ASYNC=1"),
     ({"ASYNC": "1", "GPUS_PER_NODE": "1"}, "both need at least one")],
)  # fmt: skip
def test_async_settings_that_cannot_run_stop_with_a_reason(tmp_path, env, message):
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), **env}
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_agent_replaces_the_reward_file_with_the_tasks_agent(tmp_path):
    def value(args: list[str], flag: str) -> str:
        return args[args.index(flag) + 1]

    args = launched_arguments(tmp_path / "gym", TASK="reasoning-gym", AGENT="1")
    assert value(args, "--train.agent_func_path").endswith("/openrlhf_band/tasks/reasoning_gym/agent.py")
    assert "--reward.remote_url" not in args  # the agent scores the episode
    assert value(launched_arguments(tmp_path / "plain", TASK="reasoning-gym"), "--reward.remote_url").endswith(
        "/openrlhf_band/tasks/reasoning_gym/reward.py"
    )
    env = {**BASE_ENV, "DRY_RUN": "1", "DATA_DIR": str(tmp_path), "AGENT": "1"}  # math has no agent
    done = subprocess.run(["bash", str(SCRIPTS / "bandpo_kl.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2 and "task 'math' has no multi-turn agent" in done.stderr, done.stderr[-2000:]


def test_a_linked_data_dir_keeps_its_name(tmp_path):
    """The launcher makes paths absolute without resolving links: the job's upload excludes a linked DATA_DIR
    by its own name (openrlhf_band/launcher/ray_job.py), which a resolved path would not match."""
    (tmp_path / "store").mkdir()
    (tmp_path / "mydata").symlink_to(tmp_path / "store")
    args = launched_arguments(tmp_path / "run", DATA_DIR=str(tmp_path / "mydata"))
    assert args[args.index("--data.prompt_dataset") + 1] == str(tmp_path / "mydata" / "train.jsonl")
