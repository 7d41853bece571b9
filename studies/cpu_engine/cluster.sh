# shellcheck shell=bash
# What the CPU harness's scripts share (sourced by studies/cpu_engine/train.sh and two_nodes.sh): the environment,
# the tiny model's assets, the test-only shim's variables for every process of a run, and a cleanup
# that stops exactly the run's processes (marked by E2E_RUN_ID in their environment), never another
# Ray cluster on the machine. The caller sets ROOT and OUT_DIR before sourcing.

stage() { echo "[e2e] $*" >&2; }
fail() {  # fail STAGE STATUS [LOGFILE]
  stage "FAILED at stage: $1 (exit status $2)"
  if [[ -n "${3:-}" && -s "$3" ]]; then
    echo "[e2e] the log lines that matter ($3):" >&2
    grep -nE 'Error|error:|Exception|Traceback|FAILED|Killed|Assertion|raise |OOM|out of memory' "$3" \
      | grep -vE 'FutureWarning|UserWarning|DeprecationWarning' | tail -n 25 >&2 || true
    echo "[e2e] last lines:" >&2
    tail -n 15 "$3" >&2
  fi
  exit "$2"
}

# .venv-e2e (make e2e-venv) and the tiny model, tokenizer, prompts and reward (assets.py); sets VENV, PY, ASSETS
e2e_environment() {
  stage "environment: .venv-e2e"
  if ! make -s -C "$ROOT" e2e-venv > "$OUT_DIR/setup.log" 2>&1; then
    fail environment 1 "$OUT_DIR/setup.log"
  fi
  VENV="$ROOT/.venv-e2e"
  PY="$VENV/bin/python"
  ASSETS="${E2E_ASSETS:-$VENV/assets}"
  local version
  version="$(sed -n 's/^ASSETS_VERSION = "\(.*\)"$/\1/p' "$ROOT/studies/cpu_engine/assets.py")"
  if [[ "$(cat "$ASSETS/VERSION" 2>/dev/null)" != "$version" ]]; then
    stage "environment: building the tiny model, tokenizer, prompts and reward in $ASSETS"
    rm -rf "$ASSETS"
    if ! "$PY" "$ROOT/studies/cpu_engine/assets.py" "$ASSETS" >> "$OUT_DIR/setup.log" 2>&1; then
      fail environment 1 "$OUT_DIR/setup.log"
    fi
  fi
}

# Every process of a run (cluster daemons, Ray workers, vLLM's engine process) inherits RUN_ID in its
# environment; cleanup stops exactly those. RAY_TMP is short: Ray's socket paths must fit in 107 bytes.
e2e_run_marker() {
  RUN_ID="${E2E_RUN_NAME:-e2e-$$-$RANDOM$RANDOM}"
  RAY_TMP="$(mktemp -d /tmp/e2e-ray-XXXXXX)"
}
# shellcheck disable=SC2329  # called from the EXIT trap
run_pids() {
  grep -lsz "^E2E_RUN_ID=$RUN_ID\$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}
# Tenths of a second of SIGTERM grace before SIGKILL. A run that succeeded sets it to 0 before its exit: by
# then train_ppo_ray has returned, vLLM has shut down, and only Ray's daemons are left, which ignore the
# grace anyway (below); a failed or interrupted run keeps the 2 s.
TERM_GRACE_TENTHS=20
# shellcheck disable=SC2329  # the EXIT trap
cleanup() {
  local pids
  pids="$(run_pids)"
  if [[ -n "$pids" ]]; then
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $pids 2>/dev/null || true
    # Two seconds' grace: Ray's gcs_server and a Python daemon beside it outlived SIGTERM through a grace of
    # 10 s in the runs watched (a run's exit came 10.6 s after its training ended), while the trainer's and
    # vLLM's processes have left by then.
    for _ in $(seq 1 "$TERM_GRACE_TENTHS"); do
      [[ -z "$(run_pids)" ]] && break
      sleep 0.1
    done
    # What is left is killed, and waited for: a process only leaves /proc once it has died, and a
    # loaded machine (seen: two cores, another test suite beside this one) takes a while to get there;
    # a Ray daemon may also have started a worker after the list above was read.
    for _ in $(seq 1 20); do
      pids="$(run_pids)"
      [[ -z "$pids" ]] && break
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      sleep 0.5
    done
  fi
  rm -rf "$RAY_TMP"
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The shim (test-only: studies/cpu_engine/cpu_shim, docs/e2e_cpu.md) and its probes, for every process
e2e_exports() {
  export E2E_CPU_SHIM=1 PYTHONPATH="$ROOT/studies/cpu_engine/cpu_shim${PYTHONPATH:+:$PYTHONPATH}"
  export E2E_SYNC_LOG="$OUT_DIR/sync.jsonl" E2E_LOSS_LOG="$OUT_DIR/loss.jsonl" E2E_FUSED_LOG="$OUT_DIR/fused.jsonl"
  export E2E_CLIP_BINS_LOG="$OUT_DIR/clip_bins.jsonl" E2E_BATCH_LOG="$OUT_DIR/batches.jsonl"
  export E2E_FORWARD_LOG="$OUT_DIR/forwards.jsonl"
  : > "$E2E_FORWARD_LOG"
  : > "$E2E_BATCH_LOG"
  : > "$E2E_CLIP_BINS_LOG"
  : > "$E2E_SYNC_LOG"
  : > "$E2E_LOSS_LOG"
  : > "$E2E_FUSED_LOG"
  export TORCH_EXTENSIONS_DIR="$VENV/torch_extensions"  # DeepSpeed's CPU ops, compiled on first use
  # every process of the run reads it (the shim): the caller's, else bf16 where the CPU has native bf16 and
  # float32 where it would emulate it (studies/cpu_engine/cpu_dtype.py; docs/e2e_cpu.md#dtype)
  if [[ -z "${E2E_PARAM_DTYPE:-}" ]]; then
    E2E_PARAM_DTYPE="$("$PY" "$ROOT/studies/cpu_engine/cpu_dtype.py" 2>> "$OUT_DIR/setup.log")" \
      || fail environment 1 "$OUT_DIR/setup.log"
  fi
  export E2E_PARAM_DTYPE
  stage "dtype: $E2E_PARAM_DTYPE"
  export GLOO_SOCKET_IFNAME=lo VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
  # vLLM's worker inside its EngineCore process, as OpenRLHF's executor "uni" asks at tp=1 (GPU layout); vLLM's
  # CPU platform otherwise turns it into "mp", a third process that imports torch and vLLM again (about 8 s a run)
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  export RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
  export PATH="$VENV/bin:$PATH"
}
