#!/usr/bin/env bash
# A real pretrained model through the real train_ppo_ray: SmolLM2-135M-Instruct (prepared from its
# package by `openrlhf-band prepare-model`), GRPO on two easy reasoning-gym tasks shown with two solved
# items (--shots 2), vLLM's CPU build sampling, DeepSpeed ZeRO-3 over gloo and the weight sync, through
# studies/cpu_engine/train.sh in float32 (E2E_PARAM_DTYPE, the shim's float32_on_cpu).
#
#   bash studies/smollm2/run.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]       (later flags win, as in train.sh)
#   e.g. bash studies/smollm2/run.sh out/s --loss band --band_divergence kl
#
# The regime follows the recipe's shape: each rollout of SMOL_PROMPTS prompts x SMOL_SAMPLES samples is
# trained in 4 mini-batches (4 optimizer steps per rollout, one epoch), so a token's own earlier updates
# move its ratio. After the run, studies/smollm2/evaluate.py scores the trained model (OUT_DIR/after.json)
# and the starting model (cached in SMOL_CACHE) on the held-out split, and OUT_DIR/summary.json holds
# both, the per-step TensorBoard scalars, the first step's clip counts per old-probability bin and the
# run's cost. The trained weights are deleted afterwards unless SMOL_KEEP_MODEL=1 (540 MB a run).
#
# Environment: SMOL_STEPS (default 8) rollouts; SMOL_PROMPTS (4) and SMOL_SAMPLES (8: groups of 8, so that at
# a 7% start about half the groups hold a success) per rollout;
# SMOL_LR (3e-5); SMOL_EVAL_SAMPLES (4; 0 = no evaluation after the run) samples per held-out prompt;
# SMOL_MODEL (default .venv-e2e/models/smollm2-135m-instruct) and SMOL_DATA (.venv-e2e/smollm2-data),
# made when missing (SMOL_SIZE training prompts, default 300; SMOL_EVAL_SIZE held-out per task, 32);
# SMOL_CACHE (.venv-e2e/smollm2-eval) the starting model's evaluations.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:?usage: bash studies/smollm2/run.sh OUT_DIR [TRAIN_PPO_RAY_ARGS...]}"
shift
STEPS="${SMOL_STEPS:-8}"
PROMPTS="${SMOL_PROMPTS:-4}"
SAMPLES="${SMOL_SAMPLES:-8}"
EVAL_SAMPLES="${SMOL_EVAL_SAMPLES:-4}"
MODEL="${SMOL_MODEL:-$ROOT/.venv-e2e/models/smollm2-135m-instruct}"
DATA="${SMOL_DATA:-$ROOT/.venv-e2e/smollm2-data}"
CACHE="${SMOL_CACHE:-$ROOT/.venv-e2e/smollm2-eval}"
VENV="$ROOT/.venv-e2e"
PY="$VENV/bin/python"

# What makes two runs comparable, recorded in OUT_DIR/settings.json and so in summary.json: the study's
# driver reuses a finished run (its own or one committed under studies/smollm2/results/runs/) only when
# these equal what it would run now. SMOL_SETTINGS_ONLY=1 prints them and stops (no venv, no model).
settings="$(python3 -c 'import json, sys; k = sys.argv[1:8]; print(json.dumps({
  "steps": int(k[0]), "prompts": int(k[1]), "samples": int(k[2]), "lr": k[3], "eval_samples": int(k[4]),
  "size": int(k[5]), "eval_size": int(k[6]), "flags": sys.argv[8:]}, sort_keys=True))' \
  "$STEPS" "$PROMPTS" "$SAMPLES" "${SMOL_LR:-3e-5}" "$EVAL_SAMPLES" "${SMOL_SIZE:-300}" "${SMOL_EVAL_SIZE:-32}" "$@")"
if [[ "${SMOL_SETTINGS_ONLY:-0}" == 1 ]]; then
  echo "$settings"
  exit 0
fi
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
echo "$settings" > "$OUT_DIR/settings.json"

make -s -C "$ROOT" e2e-venv >&2
echo "[smollm2] the model ($MODEL)" >&2
"$VENV/bin/openrlhf-band" prepare-model smollm2-135m-instruct "$MODEL" >&2
# The tasks: easy enough that the 135M model solves some at the start (two shots, T=1, the held-out split:
# chain_sum 6.6%, spell_backward 8.2% of replies, results/token_bins.json; leg_counting, about 1% in a pilot,
# was dropped), so that GRPO groups have advantages (docs/smollm2_study.md).
PREPARE=(
  --source reasoning-gym --tasks "chain_sum,spell_backward" --size "${SMOL_SIZE:-300}"
  --eval-size "${SMOL_EVAL_SIZE:-32}" --seed 7
  --shots 2 --task-option chain_sum.max_terms=2 --task-option chain_sum.max_digits=1
  --task-option spell_backward.max_word_len=4
)
if [[ "$(cat "$DATA/PREPARE_ARGS" 2>/dev/null)" != "${PREPARE[*]}" ]]; then
  echo "[smollm2] the tasks ($DATA)" >&2
  rm -rf "$DATA"
  "$VENV/bin/openrlhf-band" prepare-data "${PREPARE[@]}" --out "$DATA" >&2
  echo "${PREPARE[*]}" > "$DATA/PREPARE_ARGS"
fi

if (( PROMPTS * SAMPLES % 4 != 0 )); then
  echo "[smollm2] SMOL_PROMPTS x SMOL_SAMPLES = $((PROMPTS * SAMPLES)) must be a multiple of 4 (4 mini-batches a rollout)" >&2
  exit 2
fi
TRAIN_BATCH=$((PROMPTS * SAMPLES / 4))
MICRO=8  # the largest divisor of the mini-batch up to 8 (DeepSpeed: batch = micro x accumulation steps)
while (( TRAIN_BATCH % MICRO != 0 )); do MICRO=$((MICRO - 1)); done
SMOL_ARGS=(
  --actor.model_name_or_path "$MODEL"
  --data.prompt_dataset "$DATA/train.jsonl" --data.input_key prompt --data.label_key label
  --data.max_samples "$((STEPS * PROMPTS))" --data.max_len 512
  --reward.remote_url "$ROOT/openrlhf_band/tasks/reasoning_gym/reward.py"
  --rollout.batch_size "$PROMPTS" --rollout.n_samples_per_prompt "$SAMPLES"
  --rollout.micro_batch_size 8 --train.batch_size "$TRAIN_BATCH" --train.micro_batch_size "$MICRO"
  --rollout.max_new_tokens 24
  --actor.adam.lr "${SMOL_LR:-3e-5}"
)
start=$SECONDS
# float32 everywhere (the shim's float32_on_cpu), no gradient checkpointing (a quarter of a step on a CPU,
# for memory a CPU run has); two threads for whichever process computes (the colocated
# actor, reference and engine take turns), as the cores of this machine
# train.sh's bound on the run (its default, 900 s, is a tiny-model run's): 400 s a step (measured 90-140 s
# alone, 2.3 min beside other work) and 10 min for the start
E2E_TIMEOUT_S="${E2E_TIMEOUT_S:-$((STEPS * 400 + 600))}" \
E2E_PARAM_DTYPE=float32 E2E_GRAD_CKPT=0 OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" \
  bash "$ROOT/studies/cpu_engine/train.sh" "$OUT_DIR" "${SMOL_ARGS[@]}" "$@"
seconds=$((SECONDS - start))
printf '%s\n' "${SMOL_ARGS[@]}" "$@" > "$OUT_DIR/args.txt"
if [[ "$EVAL_SAMPLES" -gt 0 ]]; then
  seed="$(grep -A1 -- '--train.seed' "$OUT_DIR/args.txt" | tail -n 1 | grep -E '^[0-9]+$' || echo 42)"
  mkdir -p "$CACHE"
  key="$(cat "$DATA/eval.jsonl" "$MODEL/PREPARED.json" | md5sum | cut -c1-8)"  # the held-out rows and the model
  before="$CACHE/before-n$EVAL_SAMPLES-seed$seed-$key.json"
  if [[ ! -s "$before" ]]; then
    echo "[smollm2] held-out evaluation of the starting model" >&2
    "$PY" "$ROOT/studies/smollm2/evaluate.py" "$MODEL" "$DATA/eval.jsonl" --samples "$EVAL_SAMPLES" --seed "$seed" --out "$before" >&2
  fi
  echo "[smollm2] held-out evaluation of the trained model" >&2
  cp "$MODEL/tokenizer.json" "$MODEL/tokenizer_config.json" "$OUT_DIR/model/" 2>/dev/null || true
  "$PY" "$ROOT/studies/smollm2/evaluate.py" "$OUT_DIR/model" "$DATA/eval.jsonl" --samples "$EVAL_SAMPLES" --seed "$seed" \
    --out "$OUT_DIR/after.json" >&2
  "$PY" "$ROOT/studies/smollm2/study.py" summarize --run "$OUT_DIR" --before "$before" --seconds "$seconds" >&2
fi
[[ "${SMOL_KEEP_MODEL:-0}" == 1 ]] || rm -rf "$OUT_DIR/model" "$OUT_DIR/ckpt"
echo "[smollm2] done: $OUT_DIR" >&2
