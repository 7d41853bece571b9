#!/usr/bin/env bash
# The real OpenRLHF 0.11.2 train_ppo_ray, end to end on a CPU: vLLM's CPU build generates the
# rollouts, Ray places the actor, the reference and the engine on a private local cluster (fake
# GPUs), DeepSpeed trains over gloo, and the weights go back to vLLM after every step.
#
#   bash studies/cpu_engine/train.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]      (later flags win over the base ones)
#
# Sets up what is missing (.venv-e2e via `make e2e-venv`; the tiny model, tokenizer, prompts and
# reward via studies/cpu_engine/assets.py), starts the cluster on its own ports and temp dir, runs
# `python -m openrlhf.cli.train_ppo_ray` with the base arguments below, writes OUT_DIR/train.log,
# OUT_DIR/tensorboard, OUT_DIR/sync.jsonl (weight-sync digests), stops the cluster and every process
# of the run on any exit, and exits with train_ppo_ray's status. On failure it names the stage that
# broke (environment, cluster, engine start, training, sync) and prints the log lines that matter.
#
# Environment: E2E_TIMEOUT_S (default 900) bounds the training run; E2E_ASSETS (default
# .venv-e2e/assets) holds the generated model and data; E2E_SYNC_NEGATIVE_CONTROL=1 makes vLLM
# receive but not load the weights (the sync check's negative control); E2E_PARAM_DTYPE (bf16 or float32)
# is the dtype the run trains and samples in, by default bf16 where the CPU has native bf16 and float32 where it
# would emulate it (studies/cpu_engine/cpu_dtype.py; float32 through the shim's float32_on_cpu: OpenRLHF allows
# bf16 / fp16 only; the real-model runs always set float32); E2E_GRAD_CKPT=0 turns gradient checkpointing off.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:?usage: bash studies/cpu_engine/train.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]}"
shift
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOG="$OUT_DIR/train.log"
: > "$LOG"

# shellcheck source=studies/cpu_engine/cluster.sh
source "$ROOT/studies/cpu_engine/cluster.sh"  # stage, fail, the environment, the run's marker, cleanup, the shim

# --- environment ------------------------------------------------------------------------------
e2e_environment
# Every process of this run (cluster daemons, Ray workers, vLLM's engine process) inherits RUN_ID
# in its environment; cleanup stops exactly those, never another Ray cluster on the machine.
# A caller may name the run (learn.sh does, to watch its memory) in E2E_RUN_NAME: a variable of another
# name, so that this script and its own subshells never carry the marker they look for.
e2e_run_marker
trap cleanup EXIT
trap 'stage "interrupted: stopping the cluster and every process of the run"; exit 130' INT TERM
e2e_exports

# --- cluster ----------------------------------------------------------------------------------
# Fake GPUs: OpenRLHF asks Ray for {"GPU": 1} bundles and num_gpus on its actors.
stage "cluster: ray start (temp dir $RAY_TMP)"
RAY_PORT="$(free_port)"
if ! E2E_RUN_ID="$RUN_ID" timeout 120 ray start --head --node-ip-address 127.0.0.1 --port "$RAY_PORT" \
    --num-cpus 8 --num-gpus 4 --temp-dir "$RAY_TMP" --include-dashboard false \
    --disable-usage-stats > "$OUT_DIR/ray.log" 2>&1; then
  fail cluster 1 "$OUT_DIR/ray.log"
fi

# --- training ---------------------------------------------------------------------------------
# As close to examples/scripts/common.sh as a CPU allows; docs/e2e_cpu.md lists what
# differs and why. Everything after OUT_DIR on the command line comes last and wins.
BASE_ARGS=(
  --actor.model_name_or_path "$ASSETS/model"
  --actor.num_nodes 1 --actor.num_gpus_per_node 1 --ref.num_nodes 1 --ref.num_gpus_per_node 1
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.sync_backend gloo --vllm.enforce_eager
  --train.colocate_all --ds.zero_stage 3 --ds.param_dtype bf16
  --ds.attn_implementation sdpa
  --algo.advantage.estimator group_norm
  --rollout.batch_size 4 --rollout.n_samples_per_prompt 4
  --train.batch_size 4 --train.micro_batch_size 2 --rollout.micro_batch_size 4
  --rollout.max_new_tokens 24 --data.max_len 96
  --rollout.temperature 1.0 --rollout.top_p 1.0
  --actor.adam.lr 1e-4 --actor.lr_warmup_ratio 0 --actor.lr_scheduler constant
  --actor.loss_agg_mode seq-mean-token-mean
  --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 0.001
  --actor.entropy_coef 0
  --train.num_episodes 1 --train.seed 42
  --data.prompt_dataset "$ASSETS/prompts.jsonl" --data.input_key prompt --data.label_key label
  --data.apply_chat_template
  --reward.remote_url "$ASSETS/reward.py"
  --ckpt.path "$OUT_DIR/ckpt" --ckpt.output_dir "$OUT_DIR/model"
  --logger.logging_steps 1 --logger.tensorboard_dir "$OUT_DIR/tensorboard"
)
# Gradient checkpointing as in common.sh; E2E_GRAD_CKPT=0 leaves it off (a real model's runs: it recomputes
# every forward, about a quarter of a CPU step, to save memory a CPU run has plenty of)
if [[ "${E2E_GRAD_CKPT:-1}" == 1 ]]; then
  BASE_ARGS+=(--actor.gradient_checkpointing_enable)
fi
stage "training: python -m openrlhf.cli.train_ppo_ray ${*:-(base arguments only)}"
# In the background and waited for, so that a signal to this script runs its traps at once.
set +e
E2E_RUN_ID="$RUN_ID" RAY_ADDRESS="127.0.0.1:$RAY_PORT" timeout --kill-after=30 "${E2E_TIMEOUT_S:-900}" \
  "$PY" -m openrlhf.cli.train_ppo_ray "${BASE_ARGS[@]}" "$@" > "$LOG" 2>&1 &
wait $!
status=$?
set -e

if [[ $status -eq 0 ]]; then
  stage "done: $LOG"
  # shellcheck disable=SC2034  # read by cleanup (cluster.sh): nothing of the run is left to shut down gracefully
  TERM_GRACE_TENTHS=0
  exit 0
fi
# Which stage broke, from the milestones the log reached.
if [[ $status -eq 2 ]] && grep -q 'usage: train_ppo_ray' "$LOG"; then
  cat "$LOG" >&2  # the parser's own message
  stage "FAILED: train_ppo_ray rejected the arguments"
  exit 2
elif [[ $status -eq 124 || $status -eq 137 ]]; then
  stage "timed out after ${E2E_TIMEOUT_S:-900} s"
fi
if grep -q '"side": "engine"' "$E2E_SYNC_LOG"; then
  fail "training (after a weight sync reached vLLM)" "$status" "$LOG"
elif grep -qE 'update weight|init_process_group' "$LOG"; then
  fail "sync (DeepSpeed -> vLLM weight broadcast)" "$status" "$LOG"
elif grep -q 'Train epoch' "$LOG"; then
  fail "training (before the first weight sync)" "$status" "$LOG"
elif ! grep -q 'init engine (profile' "$LOG"; then
  fail "engine start (vLLM)" "$status" "$LOG"
else
  fail "training start (DeepSpeed actors, reference, first rollout)" "$status" "$LOG"
fi
