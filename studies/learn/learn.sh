#!/usr/bin/env bash
# Does the real train_ppo_ray learn? GRPO from the warm-up checkpoint that OpenRLHF's own train_sft
# made (studies/learn/warmup.sh) on the fork task (studies/learn/learn_task.py), with its exact-match reward,
# through studies/cpu_engine/train.sh (vLLM CPU build, Ray, DeepSpeed ZeRO-3 over gloo, weight sync).
#
#   bash studies/learn/learn.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]       (later flags win, as in train.sh)
#   e.g. bash studies/learn/learn.sh out/l --loss band --band_divergence kl
#
# The regime is the one where the clip binds (the demo's argument): each rollout of 8 prompts x 8
# samples is trained for LEARN_EPOCHS epochs of 4 mini-batches, so a token's own earlier updates
# move its ratio. Writes OUT_DIR/summary.json: `before` (the checkpoint) and `after` (the trained
# model), each with mean_reward (exact-match rate on the 128 held-out prompts, 16 samples each at
# temperature 1), entropy (the policy's mean token entropy on those samples, nats), p_correct and
# p_fork_hard (exact, no sampling noise); `steps`, `seconds_per_step`, `peak_pss_gib` (the run's
# processes summed) and `metrics` (every per-step scalar of train_ppo_ray's own TensorBoard log, its
# eval/pass1 curve on the held-out prompts included). Also everything train.sh writes.
#
# Environment: LEARN_STEPS (default 20) training steps (rollouts); LEARN_EPOCHS (default 2);
# LEARN_EVAL_STEPS (default 5) for OpenRLHF's own held-out evaluation; LEARN_DIR (default
# .venv-e2e/learn) the checkpoint, made by `make learn-checkpoint` when missing or stale.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:?usage: bash studies/learn/learn.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]}"
shift
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
STEPS="${LEARN_STEPS:-20}"
PROMPTS_PER_STEP=8
TASK="${LEARN_DIR:-$ROOT/.venv-e2e/learn}"
PY="$ROOT/.venv-e2e/bin/python"

echo "[learn] the warm-up checkpoint ($TASK)" >&2
make -s -C "$ROOT" learn-checkpoint LEARN_DIR="$TASK" >&2

RUN_ID="learn-$$-$RANDOM$RANDOM"
"$PY" "$ROOT/studies/learn/learn_eval.py" watch --run-id "$RUN_ID" --out "$OUT_DIR/memory.json" &
WATCH=$!
trap 'kill "$WATCH" 2>/dev/null || true' EXIT

LEARN_ARGS=(
  --actor.model_name_or_path "$TASK/checkpoint"
  --data.prompt_dataset "$TASK/train.jsonl" --data.input_key prompt --data.label_key label
  --data.max_samples "$((STEPS * PROMPTS_PER_STEP))"
  --reward.remote_url "$TASK/reward.py"
  --rollout.batch_size "$PROMPTS_PER_STEP" --rollout.n_samples_per_prompt 8
  --rollout.micro_batch_size 16 --train.batch_size 16 --train.micro_batch_size 16
  --train.max_epochs "${LEARN_EPOCHS:-2}"
  --rollout.max_new_tokens 12 --data.max_len 64
  --actor.adam.lr 5e-4
  --eval.dataset "$TASK/heldout.jsonl" --eval.steps "${LEARN_EVAL_STEPS:-5}"
  --eval.n_samples_per_prompt 4 --eval.temperature 1.0
)
start=$SECONDS
status=0
E2E_RUN_NAME="$RUN_ID" bash "$ROOT/studies/cpu_engine/train.sh" "$OUT_DIR" "${LEARN_ARGS[@]}" "$@" || status=$?
kill "$WATCH" 2>/dev/null || true
wait "$WATCH" 2>/dev/null || true
if [[ $status -ne 0 ]]; then
  echo "[learn] FAILED: train.sh exited $status (see $OUT_DIR/train.log)" >&2
  exit "$status"
fi
printf '%s\n' "${LEARN_ARGS[@]}" "$@" > "$OUT_DIR/args.txt"
echo "[learn] held-out evaluation of the trained model ($OUT_DIR/model)" >&2
"$PY" "$ROOT/studies/learn/learn_eval.py" summary --task "$TASK" --run "$OUT_DIR" --seconds "$((SECONDS - start))" >&2
echo "[learn] done: $OUT_DIR/summary.json" >&2
