"""The task registry (openrlhf_band/tasks/__init__.py), `openrlhf-band prepare-data --source TASK` and the
launcher's `TASK=...` (examples/scripts/common.sh).

- `TASKS`, `reward_file` (a path, found without importing the reward: the code reward probes its sandbox on
  import), `python -m openrlhf_band.tasks reward-file | preflight | list` and their exit statuses;
- prepare-data through the real CLI entry (`openrlhf_band.tools.cli.main`) for code, reasoning-gym and mc on
  fixtures / offline generation, and its one-line errors (exit status 1);
- the launcher: one dry run validated end to end by the patched OpenRLHF parser (TASK=code; it costs ~13 s,
  it imports OpenRLHF), the others with `openrlhf-band` replaced by a shim on PATH that records the argument
  list (the reward file, the data paths, EVAL_N, the output directory, the prepare-data call) without
  importing OpenRLHF.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reward_files import load_reward_file

from openrlhf_band import tasks

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO / "openrlhf_band" / "tasks"
SCRIPTS = REPO / "examples" / "scripts"
FIXTURES = REPO / "tests" / "fixtures"
BIN = Path(sys.executable).parent
TASK_NAMES = ["math", "reasoning-gym", "code", "mc"]
REWARD_FILES = {"math": "math/reward.py", "reasoning-gym": "reasoning_gym/reward.py", "code": "code/reward.py",
                "mc": "mc/reward.py"}  # fmt: skip


# ============================================================================= the registry


def test_the_tasks():
    assert list(tasks.TASKS) == TASK_NAMES
    assert tasks.DEFAULT_TASK == "math"
    assert all(task.name == name for name, task in tasks.TASKS.items())
    assert tasks.TASKS["code"].metric == "pass@k"


@pytest.mark.parametrize("task", TASK_NAMES)
def test_reward_file_is_the_tasks_file_and_is_not_imported(task, monkeypatch):
    module = tasks.TASKS[task].reward_module
    monkeypatch.delitem(sys.modules, module, raising=False)
    path = Path(tasks.reward_file(task))
    assert path == TASKS_DIR / REWARD_FILES[task] and path.is_file() and path.is_absolute()
    assert module not in sys.modules


def test_reward_file_for_code_leaves_the_sandbox_alone():
    code = (
        "import sys; from openrlhf_band import tasks; print(tasks.reward_file('code')); "
        "print(sorted(m for m in sys.modules if m.startswith(('openrlhf_band.tasks', 'openrlhf_band.sandbox'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path, modules = done.stdout.splitlines()
    assert path == str(TASKS_DIR / "code" / "reward.py")
    assert modules == "['openrlhf_band.tasks', 'openrlhf_band.tasks.code']"  # the folder: no reward, no sandbox


# ----------------------------------------------------------------------------- every task, one contract
def _prepare_data_options() -> set[str]:
    from openrlhf_band.tasks import prepare

    parser = argparse.ArgumentParser()
    prepare.add_arguments(parser)
    return {action.dest for action in parser._actions}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_task_is_one_folder_with_the_same_contract(task):
    """A task is its folder (data.py, reward.py, agent.py when it has one) and its registry line: prepare-data
    reaches it through `prepare` and `FLAGS`, OpenRLHF through the reward file loaded by path, whose
    `reward_func` answers any sample, a nonsense one included, with one float32 value per sample and no error."""
    entry = tasks.TASKS[task]
    folder = TASKS_DIR / entry.folder
    files = {p.name for p in folder.glob("*.py")}
    assert {"__init__.py", "data.py", "reward.py"} <= files and ("agent.py" in files) == entry.has_agent
    data = importlib.import_module(entry.data_module)
    assert list(inspect.signature(data.prepare).parameters) == ["args", "local", "overrides", "hub_ids"]
    assert isinstance(data.FLAGS, tuple) and set(data.FLAGS) <= _prepare_data_options()
    reward = load_reward_file(Path(tasks.reward_file(task)), f"contract_{entry.folder}_reward")
    out = reward.reward_func(["<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n??"] * 2,
                 ["<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"] * 2, ["not a label", None])
    assert set(out) == {"rewards", "scores", "extra_logs"}
    for values in [out["rewards"], out["scores"], *out["extra_logs"].values()]:
        assert values.dtype == torch.float32 and values.shape == (2,) and torch.isfinite(values).all()
    if entry.has_agent:
        agent = load_reward_file(Path(tasks.agent_file(task)), f"contract_{entry.folder}_agent")
        assert inspect.isclass(agent.AgentExecutor)  # what --train.agent_func_path looks up


def test_a_new_flag_is_refused_by_the_other_tasks(prepare):
    """FLAGS is the only place a task's own options are declared: prepare-data refuses them elsewhere."""
    status, _, err = prepare("--out", "/nonexistent", "--source", "mc", "--shots", "2")
    assert status == 1
    assert err.strip() == "openrlhf-band prepare-data: error: --shots is for --source reasoning-gym, not mc"


def test_unknown_task_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown task 'bogus'; valid tasks: math, reasoning-gym, code, mc"):
        tasks.reward_file("bogus")


def _tasks_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENRLHF_BAND_CODE_")}
    return subprocess.run([sys.executable, "-m", "openrlhf_band.tasks", *argv], capture_output=True,
                          text=True, env={**full_env, **env}, timeout=120)  # fmt: skip


def test_cli_reward_file_and_list():
    done = _tasks_cli("reward-file", "code")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{TASKS_DIR / 'code' / 'reward.py'}\n", "")
    done = _tasks_cli("list")
    assert done.returncode == 0
    assert [line.split("\t")[:2] for line in done.stdout.splitlines()] == [
        ["math", "accuracy"], ["reasoning-gym", "accuracy"], ["code", "pass@k"], ["mc", "accuracy"],
    ]  # fmt: skip


@pytest.mark.parametrize("argv", [(), ("reward-file",), ("list", "x"), ("run", "code"), ("reward-file", "bogus")])
def test_cli_bad_usage_exits_2(argv):
    done = _tasks_cli(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    if argv == ("reward-file", "bogus"):
        assert "valid tasks: math, reasoning-gym, code, mc" in done.stderr
    else:
        assert done.stderr.startswith("usage: python -m openrlhf_band.tasks reward-file TASK")


def test_cli_preflight():
    done = _tasks_cli("preflight", "code")  # the sandbox works on this machine
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("[code] sandbox: namespaces, programs on ")
    done = _tasks_cli("preflight", "code", OPENRLHF_BAND_CODE_SANDBOX="bogus")
    assert done.returncode == 1
    assert done.stderr.strip() == "error: OPENRLHF_BAND_CODE_SANDBOX='bogus': expected one of namespaces, rlimits"
    done = _tasks_cli("preflight", "math")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


# ============================================================================= prepare-data through the CLI


# `prepare`: tests/tasks/conftest.py


def _read(out: Path) -> tuple[list[dict], list[dict], dict]:
    def rows(name: str) -> list[dict]:
        return [json.loads(line) for line in (out / name).read_text().splitlines()]

    return rows("train.jsonl"), rows("eval.jsonl"), json.loads((out / "manifest.json").read_text())


def test_prepare_data_code(prepare, tmp_path):
    from openrlhf_band.tasks.code import data as code_data

    mbpp, apps = FIXTURES / "code" / "mbpp", FIXTURES / "code" / "apps"
    out = tmp_path / "code"
    status, stdout, stderr = prepare("--source", "code", "--source", f"mbpp={mbpp}", "--source", f"apps={apps}",
                                     "--train", "mbpp,apps", "--eval", "mbpp,apps", "--out", str(out))  # fmt: skip
    assert status == 0, stderr
    train, evals, manifest = _read(out)
    expected = code_data.build(["mbpp", "apps"], ["mbpp", "apps"], {"mbpp": str(mbpp), "apps": str(apps)}, {})
    assert (train, evals) == (expected[0], expected[1])
    assert [len(train), len(evals)] == [6, 4]
    assert manifest["task"] == "code" and manifest["reward_file"] == "openrlhf_band.tasks.code.reward"
    assert manifest["train"] == expected[2]["train"] and manifest["eval"] == expected[2]["eval"]
    assert stdout.startswith(f"[code] wrote {out / 'train.jsonl'} (6 rows), {out / 'eval.jsonl'} (4 rows)")
    assert stdout.rstrip().endswith(f"--reward.remote_url {TASKS_DIR / 'code' / 'reward.py'}")


def test_prepare_data_reasoning_gym_offline(prepare, tmp_path):
    out = tmp_path / "gym"
    status, stdout, stderr = prepare("--source", "reasoning-gym", "--tasks", "basic_arithmetic:1,chain_sum:1",
                                     "--size", "4", "--eval-size", "1", "--seed", "3", "--out", str(out))  # fmt: skip
    assert status == 0, stderr
    train, evals, manifest = _read(out)
    assert len(train) == 4 and len(evals) == 2
    assert {r["datasource"] for r in train} == {r["datasource"] for r in evals} == {"basic_arithmetic", "chain_sum"}
    assert all(set(r) == {"prompt", "label", "datasource"} for r in train + evals)
    assert manifest["task"] == "reasoning-gym" and manifest["reward_file"] == "openrlhf_band.tasks.reasoning_gym.reward"
    assert stdout.rstrip().endswith(f"--reward.remote_url {TASKS_DIR / 'reasoning_gym' / 'reward.py'}")


MC_SOURCES = ("--source", f"commonsense_qa={FIXTURES / 'mc' / 'commonsense_qa'}",
              "--source", f"mmlu={FIXTURES / 'mc' / 'mmlu'}")  # fmt: skip


def test_prepare_data_mc(prepare, tmp_path):
    out = tmp_path / "mc"
    status, stdout, stderr = prepare("--source", "mc", *MC_SOURCES, "--out", str(out))
    assert status == 0, stderr
    train, evals, manifest = _read(out)
    assert train and evals
    assert {r["datasource"] for r in evals} == {"commonsense_qa", "mmlu"}
    assert manifest["reward_file"] == "openrlhf_band.tasks.mc.reward"
    assert stdout.rstrip().endswith(f"--reward.remote_url {TASKS_DIR / 'mc' / 'reward.py'}")


def test_prepare_data_mc_manifest_names_the_task(prepare, tmp_path):
    status, _, stderr = prepare("--source", "mc", *MC_SOURCES, "--out", str(tmp_path))
    assert status == 0, stderr
    assert json.loads((tmp_path / "manifest.json").read_text())["task"] == "mc"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--source", "code", "--source", "mc"], "--source names more than one task (code, mc)"),
        (["--source", "bogus"], "--source 'bogus': unknown task; valid tasks: math, reasoning-gym, code, mc"),
        (["--source", "code", "--tasks", "chain_sum"], "--tasks is for --source reasoning-gym, not code"),
        (["--source", "code", "--max-eval", "3"], "--max-eval is for --source mc, not code"),
        (["--source", "reasoning-gym"], "--source reasoning-gym needs --tasks"),
        (["--source", "reasoning-gym", "--tasks", "chain_sum", "--source", "x=/tmp"],
         "reasoning-gym generates its items: --source NAME=PATH and --hub-id do not apply"),
        (["--source", "code", "--train", "humaneval"], "code source 'humaneval' is an eval set only"),
    ],
)  # fmt: skip
def test_prepare_data_errors_are_one_line_and_status_1(prepare, tmp_path, argv, message):
    out = tmp_path / "out"
    status, stdout, stderr = prepare(*argv, "--out", str(out))
    assert status == 1 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("openrlhf-band prepare-data: error: ")
    assert message in stderr
    assert not out.exists()


# ============================================================================= the launcher


def _shim(directory: Path) -> Path:
    """An `openrlhf-band` that records each call's arguments (NUL-separated) in directory/SUBCOMMAND.args;
    check-args runs the real one when SHIM_VALIDATE is set, else prints {}; prepare-data fails (status 3)."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "openrlhf-band"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\0" "$@" > "{directory}/$1.args"\n'
        'if [[ "$1" == check-args ]]; then\n'
        f'  if [[ -n "${{SHIM_VALIDATE:-}}" ]]; then exec "{BIN / "openrlhf-band"}" "$@"; fi\n'
        "  echo '{}'; exit 0\n"
        "fi\n"
        "exit 3\n"
    )
    shim.chmod(0o755)
    return directory


def _launch(tmp_path: Path, script: str = "bandpo_chi2.sh", **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    shim = _shim(tmp_path / "shim")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("OPENRLHF_BAND_CODE_") and k not in {
                "TASK", "DATA_DIR", "EVAL_N", "OUTPUT_ROOT", "SEED", "EXTRA_ARGS", "PREPARE_ARGS", "DRY_RUN",
                "RAY_ADDRESS", "WANDB_API_KEY", "NO_TENSORBOARD", "FUSED_LOGPROBS", "LOWER_FLOOR", "ATTN"}}  # fmt: skip
    full_env = {**base, "PATH": f"{shim}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "MODEL": "/models/some-model", "PYTHONWARNINGS": "ignore", **env}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, env=full_env,
                          cwd=tmp_path, timeout=600)  # fmt: skip
    return done, shim


def _recorded(shim: Path, command: str) -> list[str] | None:
    path = shim / f"{command}.args"
    return path.read_text().split("\0")[:-1] if path.exists() else None


def _flags(args: list[str]) -> dict[str, str]:
    """--flag value pairs of an argument list (flags without a value map to '')."""
    flags = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            flags[arg] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
    return flags


def test_launcher_code_task_validates_with_the_code_reward(tmp_path):
    data_dir, runs = tmp_path / "data", tmp_path / "runs"
    done, shim = _launch(tmp_path, TASK="code", DRY_RUN="1", DATA_DIR=str(data_dir), OUTPUT_ROOT=str(runs),
                         EVAL_N="4", SHIM_VALIDATE="1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    config = json.loads(done.stdout[done.stdout.index("{") :])  # the patched parser accepted the whole list
    assert config["policy_loss_type"] == "band" and config["band"]["divergence"] == "chi2"
    assert "[code] sandbox: namespaces" in done.stderr  # the preflight ran
    args = _recorded(shim, "check-args")
    assert args[:2] == ["check-args", "--"]
    flags = _flags(args)
    assert flags["--reward.remote_url"] == str(TASKS_DIR / "code" / "reward.py")
    assert flags["--eval.n_samples_per_prompt"] == "4"
    assert flags["--data.prompt_dataset"] == f"{data_dir}/train.jsonl"
    assert flags["--eval.dataset"] == f"{data_dir}/eval.jsonl"
    assert flags["--ckpt.path"] == f"{runs}/code/bandpo-chi2-seed42/ckpt"
    assert _recorded(shim, "prepare-data") is None and not data_dir.exists()  # a dry run prepares nothing


@pytest.mark.parametrize(
    "task, data_dir, run_dir",
    [
        ("reasoning-gym", "data/reasoning-gym", "runs/reasoning-gym/bandpo-chi2-seed42"),
        ("mc", "data/mc", "runs/mc/bandpo-chi2-seed42"),
        (None, "data", "runs/bandpo-chi2-seed42"),  # TASK unset: math
    ],
)
def test_launcher_picks_the_tasks_reward_file_and_directories(tmp_path, task, data_dir, run_dir):
    done, shim = _launch(tmp_path, DRY_RUN="1", **({"TASK": task} if task else {}))
    assert done.returncode == 0, done.stderr[-3000:]
    flags = _flags(_recorded(shim, "check-args"))
    assert flags["--reward.remote_url"] == str(TASKS_DIR / REWARD_FILES[task or "math"])
    # the defaults ./data[/TASK] and ./runs, under the launching folder, as absolute paths (a cluster job
    # runs in Ray's copy of the working directory)
    assert flags["--data.prompt_dataset"] == f"{tmp_path}/{data_dir}/train.jsonl"
    assert flags["--eval.dataset"] == f"{tmp_path}/{data_dir}/eval.jsonl"
    assert flags["--ckpt.path"] == f"{tmp_path}/{run_dir}/ckpt"
    assert flags["--eval.n_samples_per_prompt"] == "32"


def test_launcher_refuses_an_unknown_task(tmp_path):
    done, shim = _launch(tmp_path, TASK="bogus", DRY_RUN="1", DATA_DIR=str(tmp_path / "data"))
    assert done.returncode != 0
    assert "unknown task 'bogus'; valid tasks: math, reasoning-gym, code, mc" in done.stderr
    assert _recorded(shim, "check-args") is None


def test_launcher_stops_on_a_failed_code_preflight(tmp_path):
    done, shim = _launch(tmp_path, TASK="code", DRY_RUN="1", DATA_DIR=str(tmp_path / "data"),
                         OPENRLHF_BAND_CODE_SANDBOX="bogus")  # fmt: skip
    assert done.returncode == 1
    assert "expected one of namespaces, rlimits" in done.stderr
    assert _recorded(shim, "check-args") is None


def test_launcher_prepares_missing_data_with_prepare_args(tmp_path):
    # not a dry run: the shim's prepare-data fails (status 3), which stops the launcher before any training
    data_dir = tmp_path / "data"
    done, shim = _launch(tmp_path, TASK="code", DATA_DIR=str(data_dir), PREPARE_ARGS="--train mbpp  --eval humaneval")
    assert done.returncode == 3, done.stderr[-3000:]
    assert _recorded(shim, "prepare-data") == [
        "prepare-data", "--source", "code", "--out", str(data_dir), "--train", "mbpp", "--eval", "humaneval",
    ]  # fmt: skip
    assert f"no {data_dir}/train.jsonl: openrlhf-band prepare-data --source code" in done.stderr
    assert _recorded(shim, "check-args") is None
