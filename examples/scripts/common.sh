#!/usr/bin/env bash
# Shared launcher for the paper's recipe (BandPO and its baselines) on OpenRLHF 0.11.2.
# Each method script sources this file and calls `launch METHOD FLAGS...`; only the method flags
# differ between runs. Settings follow the authors' runs (see docs/recipe.md).
#
# Environment (all optional):
#   MODEL            HF model id or path      (default deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B)
#   TASK             math (default), reasoning-gym, code or mc: picks the data, the reward file and the
#                    eval (openrlhf_band/tasks/__init__.py; docs/tasks.md)
#   DATA_DIR         output of `openrlhf-band prepare-data --source TASK` (train.jsonl, eval.jsonl; default
#                    ./data for math, ./data/TASK otherwise); when DATA_DIR/train.jsonl is missing the
#                    launcher runs prepare-data into it first, with PREPARE_ARGS (word-split) added, e.g.
#                    PREPARE_ARGS="--tasks leg_counting,chain_sum --size 20000" for reasoning-gym
#   EVAL_N           samples per eval prompt (default 32: mean@32 / pass@32, or pass@1 / pass@32 for code)
#   OUTPUT_ROOT      where runs go            (default ./runs; a run is OUTPUT_ROOT/METHOD-seedSEED, holding
#                    train.log, tensorboard/, ckpt/ and model/). DATA_DIR and OUTPUT_ROOT reach OpenRLHF as
#                    absolute paths; on a multi-node cluster both must be on storage every node mounts at
#                    the same path (a checkpoint is written by every rank)
#   SEED             training seed            (default 42; the paper repeats 3 seeds)
#   NNODES           nodes                    (default 1)
#   GPUS_PER_NODE    GPUs per node            (default 8)
#   VLLM_TP          vLLM tensor parallel size (default 1; engines = NNODES * GPUS_PER_NODE / VLLM_TP, with ASYNC=1
#                    NNODES * ROLLOUT_GPUS_PER_NODE / VLLM_TP)
#   RAY_ADDRESS      a Ray dashboard address (http://HEAD:8265): submit with `ray job submit`
#                    (multi-node: `ray start --head` on the head, `ray start --address HEAD:6379`
#                    on the others; docs/recipe.md#multi-node); unset: run train_ppo_ray here (it
#                    starts/joins Ray itself)
#   RAY_WORKING_DIR  what `ray job submit` uploads as the job's working directory (default .: a relative
#                    path in EXTRA_ARGS, e.g. your own reward file, then works on every node); data, runs,
#                    environments and .git are never uploaded (openrlhf_band/launcher/ray_job.py); none:
#                    upload nothing
#   WANDB_API_KEY    log to Weights & Biases (project WANDB_PROJECT, default openrlhf-band)
#   NO_TENSORBOARD=1 do not write TensorBoard logs (default: OUTPUT_DIR/tensorboard)
#   EPISODES         --train.num_episodes     (default 1; set the step count via dataset size)
#   FUSED_LOGPROBS=0 OpenRLHF's released forward (full float32 logits) instead of --ds.fused_logprobs
#   SLEEP_MODE=0     no --vllm.enable_sleep --ds.enable_sleep: engines and training keep their memory
#                    between phases (a GPU with room for both, or a platform without sleep mode)
#   ASYNC=1          asynchronous training (--train.async_enable): vLLM samples the next batch while this one
#                    trains, with ASYNC_QUEUE batches in flight (default 1), the vLLM train/rollout IS correction
#                    per token (mask mode; it also logs band/behaviour_*) and sleep mode off (OpenRLHF refuses
#                    it in async mode); PARTIAL_ROLLOUT=1 adds --train.partial_rollout_enable (vLLM pauses for
#                    the weight sync, so a reply may hold tokens of two weight versions). The band stays
#                    centred on the actor's own log-probs unless BAND_ANCHOR=rollout:
#                    docs/training.md#asynchronous-training-where-the-band-is-centred.
#                    Training and vLLM then run at once on separate GPUs: ROLLOUT_GPUS_PER_NODE of each node's
#                    GPUS_PER_NODE go to vLLM (default half), the rest to the actor and the reference
#   BAND_ANCHOR=rollout  the band centred on the log-probs vLLM returned for the tokens it sampled
#                    (--actor.band.anchor rollout: no recompute pass of pi_old; band scripts only), with ASYNC=1
#                    in place of the IS correction, whose weight pi_old / mu would be exactly 1
#   AGENT=1          the task's multi-turn agent (--train.agent_func_path, in place of --reward.remote_url: the
#                    agent scores the episode): code (the sandbox runs each program against the visible test and
#                    a failure goes back to the model) and reasoning-gym (a wrong answer is answered); up to
#                    OPENRLHF_BAND_AGENT_TURNS replies (default 3; docs/tasks.md#multi-turn-agents)
#   DRY_RUN=1        validate the full argument list with `openrlhf-band check-args` and exit
#   EXTRA_ARGS       appended to the argument list verbatim (word-split)
#   ATTN             flash_attention_2 (with --ds.packing_samples) or sdpa (without); default: the
#                    first where flash-attn is importable, else sdpa (the image's default build)
set -euo pipefail

launch() {
  local METHOD="${1:?usage: launch METHOD FLAGS...}"
  shift
  local method_args=("$@")
  local model="${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B}"
  local task="${TASK:-math}"
  local data_dir="${DATA_DIR:-}"
  if [[ -z "$data_dir" ]]; then
    if [[ "$task" == math ]]; then data_dir=./data; else data_dir="./data/$task"; fi
  fi
  local seed="${SEED:-42}"
  local nnodes="${NNODES:-1}"
  local gpus="${GPUS_PER_NODE:-8}"
  local vllm_tp="${VLLM_TP:-1}"
  # synchronous (the hybrid engine): training and vLLM take turns on every GPU. Asynchronous: they run at once, so
  # the GPUs are split, ROLLOUT_GPUS_PER_NODE of each node to vLLM and the rest to training (as OpenRLHF's own
  # async examples: half and half)
  local train_gpus="$gpus" rollout_gpus="$gpus"
  if [[ "${ASYNC:-0}" == 1 ]]; then
    rollout_gpus="${ROLLOUT_GPUS_PER_NODE:-$(( gpus / 2 ))}"
    train_gpus=$(( gpus - rollout_gpus ))
    if (( rollout_gpus < 1 || train_gpus < 1 )); then
      echo "[$METHOD] ASYNC=1 splits each node's GPUS_PER_NODE=$gpus between vLLM (ROLLOUT_GPUS_PER_NODE=$rollout_gpus) and training: both need at least one" >&2
      return 2
    fi
  fi
  local engines=$(( nnodes * rollout_gpus / vllm_tp ))
  # Absolute paths: a job submitted to a cluster runs in Ray's copy of the working directory, where a
  # relative path would read and write somewhere the user never looks (and not on every node).
  # (-s: a symbolic link keeps its own name, which the upload's excludes need; the image's runs is one)
  data_dir="$(realpath -m -s -- "$data_dir")"
  local output_root
  output_root="$(realpath -m -s -- "${OUTPUT_ROOT:-./runs}")"
  local output_dir="$output_root/${METHOD}-seed${seed}"
  if [[ "$task" != math ]]; then output_dir="$output_root/$task/${METHOD}-seed${seed}"; fi
  local reward_py attn="${ATTN:-auto}"
  # Packing (--ds.packing_samples) is OpenRLHF's flash-attn path (variable-length kernels); without
  # flash-attn every micro-batch is padded to its longest sample instead. (transformers can mask
  # packed rows for SDPA, but that combination is not verified here.)
  if [[ "$attn" == auto ]]; then
    if python3 -c 'import flash_attn' 2> /dev/null; then attn=flash_attention_2; else attn=sdpa; fi
  fi
  local attn_args=(--ds.attn_implementation "$attn")
  if [[ "$attn" == flash_attention_2 ]]; then
    attn_args+=(--ds.packing_samples)
  fi
  echo "[$METHOD] attention: ${attn_args[*]}" >&2
  # the task's reward file (an unknown TASK stops here, naming the valid ones); for code, the sandbox is
  # checked here too: a machine without the isolation it needs stops now, with the fix, not mid-run
  reward_py="$(python3 -m openrlhf_band.tasks reward-file "$task")"
  python3 -m openrlhf_band.tasks preflight "$task"
  local reward_args=(--reward.remote_url "$reward_py")
  if [[ "${AGENT:-0}" == 1 ]]; then
    local agent_py
    agent_py="$(python3 -m openrlhf_band.tasks agent-file "$task")" || return 2
    reward_args=(--train.agent_func_path "$agent_py")
  fi
  if [[ -z "${DRY_RUN:-}" && ! -s "$data_dir/train.jsonl" ]]; then
    echo "[$METHOD] no $data_dir/train.jsonl: openrlhf-band prepare-data --source $task ${PREPARE_ARGS:-}" >&2
    # shellcheck disable=SC2086  # word splitting of PREPARE_ARGS is the documented behaviour
    openrlhf-band prepare-data --source "$task" --out "$data_dir" ${PREPARE_ARGS:-}
  fi

  local fused_args=(--ds.fused_logprobs)
  if [[ "${FUSED_LOGPROBS:-1}" == 0 ]]; then
    fused_args=()
  fi
  local sleep_args=(--vllm.enable_sleep --ds.enable_sleep)
  if [[ "${SLEEP_MODE:-1}" == 0 ]]; then
    sleep_args=()
  fi
  local async_args=() anchor_args=() is_args=(--algo.advantage.is_correction_level token
                                                  --algo.advantage.is_correction_mode mask)
  case "${BAND_ANCHOR:-recomputed}" in
    recomputed) ;;
    rollout) anchor_args=(--actor.band.anchor rollout) is_args=() ;;
    *) echo "[$METHOD] BAND_ANCHOR must be recomputed or rollout, got ${BAND_ANCHOR}" >&2; return 2 ;;
  esac
  if [[ "${SAMPLER_RATIO:-0}" == 1 ]]; then
    is_args=()  # (drpo.sh, ipo.sh) a loss whose ratio is against vLLM's log-probs takes no IS correction
  fi
  if [[ "${ASYNC:-0}" == 1 ]]; then
    sleep_args=()  # train_ppo_ray asserts that async training runs without sleep mode
    async_args=(--train.async_enable --train.async_queue_size "${ASYNC_QUEUE:-1}" "${is_args[@]}")
    if [[ "${PARTIAL_ROLLOUT:-0}" == 1 ]]; then
      async_args+=(--train.partial_rollout_enable)
    fi
  elif [[ "${PARTIAL_ROLLOUT:-0}" == 1 ]]; then
    echo "[$METHOD] PARTIAL_ROLLOUT=1 needs ASYNC=1: partial rollouts are a mode of OpenRLHF's asynchronous trainer" >&2
    return 2
  fi

  local args=(
    --actor.model_name_or_path "$model"
    --actor.num_nodes "$nnodes" --actor.num_gpus_per_node "$train_gpus"
    --ref.num_nodes "$nnodes" --ref.num_gpus_per_node "$train_gpus"
    --vllm.num_engines "$engines" --vllm.tensor_parallel_size "$vllm_tp"
    --vllm.gpu_memory_utilization 0.6 "${sleep_args[@]}"
    --train.colocate_all --ds.zero_stage 3 --ds.param_dtype bf16
    --actor.gradient_checkpointing_enable "${attn_args[@]}"
    # log-probs (and entropy) from the hidden states inside lm_head, one chunk of logits at a time
    # (openrlhf_band.ops.fused_linear_logprobs): no [batch, seq, vocab] float32 logits. Not yet measured
    # on a GPU; FUSED_LOGPROBS=0 runs OpenRLHF's released forward instead.
    "${fused_args[@]}"
    "${async_args[@]}" "${anchor_args[@]}"
    # GRPO with the paper's batch shape: 256 prompts x 16 samples, 4 optimizer steps per rollout
    --algo.advantage.estimator group_norm
    --rollout.batch_size 256 --rollout.n_samples_per_prompt 16
    --train.batch_size 1024 --train.micro_batch_size 8 --rollout.micro_batch_size 16
    --rollout.max_new_tokens 4096 --data.max_len 5120
    --rollout.temperature 1.0 --rollout.top_p 1.0
    --actor.adam.lr 1e-6 --actor.lr_warmup_ratio 0 --actor.lr_scheduler constant
    --actor.loss_agg_mode seq-mean-token-mean
    --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 0.001
    --actor.entropy_coef 0
    --train.num_episodes "${EPISODES:-1}" --train.seed "$seed"
    # data, reward and evaluation (the task's; for math AIME 2024 / 2025, AMC 2023), 32 samples at temperature 1.0
    --data.prompt_dataset "$data_dir/train.jsonl" --data.input_key prompt --data.label_key label
    --data.apply_chat_template
    "${reward_args[@]}"
    --eval.dataset "$data_dir/eval.jsonl" --eval.n_samples_per_prompt "${EVAL_N:-32}" --eval.temperature 1.0
    --eval.steps 20
    --ckpt.path "$output_dir/ckpt" --ckpt.output_dir "$output_dir/model" --ckpt.save_steps 100
    --logger.logging_steps 1
  )
  if [[ -z "${NO_TENSORBOARD:-}" ]]; then
    args+=(--logger.tensorboard_dir "$output_dir/tensorboard")
  fi
  if [[ -n "${WANDB_API_KEY:-}" ]]; then
    args+=(--logger.wandb.key "$WANDB_API_KEY" --logger.wandb.project "${WANDB_PROJECT:-openrlhf-band}"
           --logger.wandb.run_name "${METHOD}-seed${seed}")
  fi
  args+=("${method_args[@]}")
  if [[ -n "${EXTRA_ARGS:-}" ]]; then
    # shellcheck disable=SC2206  # word splitting of EXTRA_ARGS is the documented behaviour
    args+=(${EXTRA_ARGS})
  fi

  # status lines go to stderr: a dry run's stdout is check-args' JSON alone (| jq works)
  echo "[$METHOD] data: $data_dir; outputs: $output_dir (train.log, tensorboard, ckpt, model)" >&2
  if [[ -n "${DRY_RUN:-}" ]]; then
    echo "[$METHOD] dry run: validating ${#args[@]} arguments with the patched OpenRLHF parser" >&2
    openrlhf-band check-args -- "${args[@]}"
    return
  fi

  mkdir -p "$output_dir"
  printf '{"method": "%s", "seed": %s, "model": "%s", "task": "%s"}\n' "$METHOD" "$seed" "$model" "$task" \
    > "$output_dir/run.json"
  # the run's log goes to the terminal and to OUTPUT_DIR/train.log (pipefail: the run's status is kept; tee -i:
  # a Ctrl-C stops the run, not the copy of its shutdown messages)
  if [[ -n "${RAY_ADDRESS:-}" ]]; then
    local runtime_env
    runtime_env="$(python3 -m openrlhf_band.launcher.ray_job runtime-env --working-dir "${RAY_WORKING_DIR:-.}" \
      --exclude-path "$data_dir" --exclude-path "$output_root")"
    echo "[$METHOD] ray job submit to $RAY_ADDRESS, runtime env $runtime_env" >&2
    ray job submit --address="$RAY_ADDRESS" --runtime-env-json="$runtime_env" \
      -- python3 -m openrlhf.cli.train_ppo_ray "${args[@]}" 2>&1 | tee -i "$output_dir/train.log"
  else
    python3 -m openrlhf.cli.train_ppo_ray "${args[@]}" 2>&1 | tee -i "$output_dir/train.log"
  fi
}
