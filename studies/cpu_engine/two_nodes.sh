#!/usr/bin/env bash
# A multi-node submission as a user makes it, on one CPU machine: a Ray cluster of two nodes (a head and
# a worker raylet, each with its own CPUs and one fake GPU), and an example script submitted to it with
# `ray job submit` through RAY_ADDRESS, NNODES=2, GPUS_PER_NODE=1 and the tiny model, run from a user's
# project folder that holds their own reward file (named by a relative path: it reaches the nodes only
# through the job's uploaded working directory) next to data and an environment that must not be uploaded.
#
#   bash studies/cpu_engine/two_nodes.sh OUT_DIR [SCRIPT [ARGS...]]   (SCRIPT: examples/scripts/NAME, default
#                                                                     bandpo_kl.sh; ARGS join its EXTRA_ARGS)
#
# Writes OUT_DIR/submit.log (what the user's terminal shows), OUT_DIR/shared/runs/METHOD-seed42/ (the
# run's outputs, where OUTPUT_ROOT asked), OUT_DIR/nodes.json and OUT_DIR/actors.json (Ray's state API
# after the job: which node each actor ran on), OUT_DIR/uploaded.txt (the files Ray unpacked as the job's
# working directory, with sizes), and exits with the submission's status. The CPU differences from a GPU
# node are those of train.sh (docs/e2e_cpu.md), passed as the user would: SLEEP_MODE=0 and EXTRA_ARGS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:?usage: bash studies/cpu_engine/two_nodes.sh OUT_DIR [SCRIPT [ARGS...]]}"
SCRIPT="${2:-bandpo_kl.sh}"
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# shellcheck source=studies/cpu_engine/cluster.sh
source "$ROOT/studies/cpu_engine/cluster.sh"

e2e_environment
e2e_run_marker
# after the job's state has been read; then every process of the run goes
trap cleanup EXIT
trap 'stage "interrupted: stopping the cluster and every process of the run"; exit 130' INT TERM
e2e_exports
# The raylets, and through them every worker and the job's driver, carry the marker E2E_RUN_ID; this
# script never exports it, so that its own grep in run_pids never finds itself (as train.sh).

# --- the cluster: two raylets on this machine, each with its own ports --------------------------
RAY_PORT="$(free_port)"
DASHBOARD_PORT="$(free_port)"
node_ports() {  # the per-raylet ports that default to fixed numbers or ranges (two raylets on one host
  # would clash); worker ports 0: each worker picks a free one, as Ray's own cluster_utils does for this
  echo --dashboard-agent-listen-port "$(free_port)" --dashboard-agent-grpc-port "$(free_port)" \
    --metrics-export-port "$(free_port)" --runtime-env-agent-port "$(free_port)" --min-worker-port 0 --max-worker-port 0
}
stage "cluster: head (dashboard on 127.0.0.1:$DASHBOARD_PORT) and a worker node, one fake GPU each"
# shellcheck disable=SC2046  # node_ports prints whole flags
if ! E2E_RUN_ID="$RUN_ID" timeout 180 ray start --head --node-ip-address 127.0.0.1 --port "$RAY_PORT" \
    --num-cpus 4 --num-gpus 1 --temp-dir "$RAY_TMP" --include-dashboard true --dashboard-host 127.0.0.1 \
    --dashboard-port "$DASHBOARD_PORT" --ray-client-server-port "$(free_port)" \
    $(node_ports) --disable-usage-stats > "$OUT_DIR/ray.log" 2>&1; then
  fail cluster 1 "$OUT_DIR/ray.log"
fi
# shellcheck disable=SC2046
if ! E2E_RUN_ID="$RUN_ID" timeout 180 ray start --address "127.0.0.1:$RAY_PORT" --node-ip-address 127.0.0.1 \
    --num-cpus 4 --num-gpus 1 $(node_ports) --disable-usage-stats >> "$OUT_DIR/ray.log" 2>&1; then
  fail cluster 1 "$OUT_DIR/ray.log"
fi

# --- the user's project: their reward file, their data, an environment ---------------------------
PROJECT="$OUT_DIR/project"
mkdir -p "$PROJECT/data" "$PROJECT/.venv/lib"
cp "$ASSETS/reward.py" "$PROJECT/my_reward.py"
cp "$ASSETS/prompts.jsonl" "$PROJECT/data/train.jsonl"
cp "$ASSETS/prompts.jsonl" "$PROJECT/data/eval.jsonl"
head -c 8000000 /dev/zero > "$PROJECT/.venv/lib/big.so"  # 8 MB that must not be uploaded
head -c 8000000 /dev/zero > "$PROJECT/data/big.bin"

# --- the submission, as docs/recipe.md#multi-node writes it --------------------------------------
stage "submit: $SCRIPT with ray job submit (NNODES=2, GPUS_PER_NODE=1)"
EXTRA=(
  # the CPU differences of train.sh (docs/e2e_cpu.md)
  --vllm.sync_backend gloo --vllm.enforce_eager
  # the tiny model's sizes: one rollout of 4 prompts x 4 samples, 2 optimizer steps over 2 ranks, then
  # the held-out evaluation, a checkpoint and the final model
  --rollout.batch_size 4 --rollout.n_samples_per_prompt 4 --train.batch_size 8 --train.micro_batch_size 2
  --rollout.micro_batch_size 4 --rollout.max_new_tokens 24 --data.max_len 96 --data.max_samples 4
  --actor.adam.lr 1e-4 --eval.steps 1 --eval.n_samples_per_prompt 2 --ckpt.save_steps 1
  # the user's own reward file, by a path relative to the submitting folder
  --reward.remote_url my_reward.py
  "$@"
)
# In the background and waited for, so that a signal to this script runs its traps at once.
set +e
(
  cd "$PROJECT"
  E2E_RUN_ID="$RUN_ID" RAY_ADDRESS="http://127.0.0.1:$DASHBOARD_PORT" NNODES=2 GPUS_PER_NODE=1 MODEL="$ASSETS/model" \
    OUTPUT_ROOT="$OUT_DIR/shared/runs" SLEEP_MODE=0 EXTRA_ARGS="${EXTRA[*]}" \
    timeout --kill-after=30 "${E2E_TIMEOUT_S:-900}" bash "$ROOT/examples/scripts/$SCRIPT"
) > "$OUT_DIR/submit.log" 2>&1 &
wait $!
status=$?
set -e

# --- what the cluster saw: nodes, where each actor ran, what was uploaded -----------------------
ray list nodes --address "http://127.0.0.1:$DASHBOARD_PORT" --format json --limit 100 > "$OUT_DIR/nodes.json" \
  2>> "$OUT_DIR/ray.log" || true
ray list actors --address "http://127.0.0.1:$DASHBOARD_PORT" --detail --format json --limit 10000 \
  > "$OUT_DIR/actors.json" 2>> "$OUT_DIR/ray.log" || true
: > "$OUT_DIR/uploaded.txt"
for pkg in "$RAY_TMP"/session_*/runtime_resources/working_dir_files/_ray_pkg_*/; do
  [[ -d "$pkg" ]] || continue
  (cd "$pkg" && find . -type f -printf '%s %P\n' | sort -k2) >> "$OUT_DIR/uploaded.txt"
done

if [[ $status -eq 0 ]]; then
  stage "done: $OUT_DIR/submit.log"
  exit 0
fi
fail "ray job submit" "$status" "$OUT_DIR/submit.log"
