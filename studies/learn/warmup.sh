#!/usr/bin/env bash
# The learning study's task and its warm-up checkpoint, made by OpenRLHF itself: the real
# `python -m openrlhf.cli.train_sft` (DeepSpeed over gloo, one rank, through the test-only CPU shim)
# fits the noisy fork-task data of studies/learn/learn_task.py into a tiny random Qwen2.
#
#   bash studies/learn/warmup.sh DIR                  (make learn-checkpoint: DIR = .venv-e2e/learn)
#   LEARN_REBUILD=1 bash studies/learn/warmup.sh DIR  (train_sft makes the checkpoint again: 3-17 min on 2 cores)
#
# Writes DIR/base (the random model and the tokenizer), DIR/{sft,train,heldout}.jsonl, DIR/reward.py,
# DIR/checkpoint (the Hugging Face model), DIR/checkpoint_eval.json (the checkpoint's own held-out
# numbers) and, last, DIR/VERSION: a DIR whose VERSION equals learn_task.TASK_VERSION is complete and is
# reused. The checkpoint is the committed one (studies/learn/checkpoint/, with its record MADE.json: what
# made it and its held-out numbers) when it is of the current task version; with LEARN_REBUILD=1, or when
# the task changed, train_sft makes it here (DIR/sft.log). Deterministic: fixed seeds, one rank.
# `python studies/learn/learn_eval.py record --task DIR --to studies/learn/checkpoint` commits a rebuilt one.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:?usage: bash studies/learn/warmup.sh DIR}"
VENV="$ROOT/.venv-e2e"
PY="$VENV/bin/python"
VERSION="$(sed -n 's/^TASK_VERSION = "\(.*\)"$/\1/p' "$ROOT/studies/learn/learn_task.py")"

COMMITTED="$ROOT/studies/learn/checkpoint"
COMMITTED_VERSION=""
if [[ -f "$COMMITTED/MADE.json" ]]; then
  COMMITTED_VERSION="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["task_version"])' "$COMMITTED/MADE.json")"
fi
# a finished DIR is reused when it holds the checkpoint this call would make: the committed one, or (no
# committed one of this task version) train_sft's
if [[ "${LEARN_REBUILD:-0}" != 1 && "$(cat "$DIR/VERSION" 2>/dev/null)" == "$VERSION" ]] \
    && { [[ "$COMMITTED_VERSION" != "$VERSION" ]] || cmp -s "$DIR/checkpoint/model.safetensors" "$COMMITTED/model.safetensors"; }; then
  echo "[warmup] $DIR is current (task version $VERSION)" >&2
  exit 0
fi
rm -rf "$DIR"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
echo "[warmup] task, tokenizer and random model in $DIR" >&2
"$PY" "$ROOT/studies/learn/learn_task.py" "$DIR" > "$DIR/task.log" 2>&1 || { cat "$DIR/task.log" >&2; exit 1; }

if [[ "${LEARN_REBUILD:-0}" != 1 && "$COMMITTED_VERSION" == "$VERSION" ]]; then
  echo "[warmup] the committed checkpoint ($COMMITTED, task version $VERSION; LEARN_REBUILD=1 makes it again)" >&2
  mkdir -p "$DIR/checkpoint"
  find "$COMMITTED" -maxdepth 1 -type f ! -name MADE.json -exec cp -t "$DIR/checkpoint/" {} +
  # The held-out numbers again, on this machine: learn.sh's `before`, which the negative control holds its
  # `after` to at 1e-6 (both computed here; MADE.json's are the machine's that made the checkpoint)
  echo "[warmup] the checkpoint's held-out numbers on this machine" >&2
  "$PY" "$ROOT/studies/learn/learn_eval.py" eval --task "$DIR" --model "$DIR/checkpoint" --out "$DIR/checkpoint_eval.json" >&2
  echo "$VERSION" > "$DIR/VERSION"
  exit 0
fi

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# One rank, the variables DeepSpeed's launcher would set; the shim makes OpenRLHF's CUDA calls CPU ones.
export E2E_CPU_SHIM=1 PYTHONPATH="$ROOT/studies/cpu_engine/cpu_shim${PYTHONPATH:+:$PYTHONPATH}"
MASTER_PORT="$(free_port)"
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT
export TORCH_EXTENSIONS_DIR="$VENV/torch_extensions" GLOO_SOCKET_IFNAME=lo TOKENIZERS_PARALLELISM=false
echo "[warmup] python -m openrlhf.cli.train_sft (log: $DIR/sft.log)" >&2
start=$SECONDS
if ! "$PY" -m openrlhf.cli.train_sft \
    --model.model_name_or_path "$DIR/base" \
    --data.dataset "$DIR/sft.jsonl" --data.input_key prompt --data.output_key response \
    --data.apply_chat_template --data.max_len 64 \
    --train.batch_size 128 --train.micro_batch_size 128 --train.max_epochs 1 --train.seed 42 \
    --adam.lr 3e-3 --lr_warmup_ratio 0.03 --min_lr_ratio 0.1 \
    --ds.zero_stage 2 --ds.param_dtype bf16 --ds.attn_implementation sdpa \
    --ckpt.output_dir "$DIR/checkpoint" --ckpt.path "$DIR/ckpt" --ckpt.disable_ds \
    --logger.logging_steps 20 > "$DIR/sft.log" 2>&1; then
  echo "[warmup] FAILED: train_sft; last lines of $DIR/sft.log:" >&2
  tail -n 30 "$DIR/sft.log" >&2
  exit 1
fi
echo "[warmup] train_sft done in $((SECONDS - start)) s; the checkpoint's held-out numbers" >&2
"$PY" "$ROOT/studies/learn/learn_eval.py" eval --task "$DIR" --model "$DIR/checkpoint" --out "$DIR/checkpoint_eval.json" >&2
echo "$VERSION" > "$DIR/VERSION"
