#!/usr/bin/env bash
# The GPU check: one command on a bare CUDA machine, one answer.
#
#   OUT=/some/dir bash bench/gpu_check.sh            # on a CUDA machine (default OUT: out/bench/gpu)
#   OUT=/some/dir bash bench/gpu_check.sh --dry-run  # on any CPU: every step at tiny sizes, the interpreter
#
# Needs: python3 with torch and Triton >= 3.6 (whatever versions the machine has; numpy for the interpreter),
# pytest for the contract step; nothing is installed, no .venv, no image. PYTHON picks the interpreter.
# A step whose package is missing says so and is skipped; the others still run.
#
# Steps and their time limits (`run_step NAME LIMIT`; they add up to 540 s, 9 minutes, by construction):
#   preflight    20 s  nvidia-smi and the versions
#   correctness 170 s  the kernel against the torch reference on the device, every divergence and option,
#                      bf16, masked garbage, and scalar kl on 2^31 + 2^20 tokens (int64 offsets)
#   speed       130 s  do_bench: the kernel and its entry point against eager PPO clip, 4M and 16M tokens,
#                      forward and backward, judged (<= 1.3x clip, <= 1.5x per-token, >= 60% of copy bandwidth)
#   contract    120 s  pytest tests/ops/test_band_loss_kernel.py and test_differential.py on CUDA
#                      (OPENRLHF_BAND_TEST_DEVICE=cuda; --noconftest: the kernels correctness compiled stay
#                      in Triton's cache, not the unit suite's per-run one)
#   logprobs     60 s  the fused chunked lm_head log-probs against OpenRLHF's full logits (fused only when
#                      OpenRLHF is absent and OPENRLHF_UTILS_PY does not name its models/utils.py)
#   bounds       25 s  the band bounds on the device against the authors' formula
#   summary      15 s  $OUT/gpu_check_summary.json and $OUT/gpu_check_details.tar.gz (every step's log and JSON)
# Exactly those two files are written under OUT. Exit status: 0 when every step that ran passed, 1 when a check
# failed, timed out or errored, 3 when a real run could not check correctness (torch or Triton missing).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO="$PWD"
PY="${PYTHON:-python3}"
OUT="${OUT:-out/bench/gpu}"
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; elif [ -n "${1:-}" ]; then
  echo "usage: OUT=DIR bash bench/gpu_check.sh [--dry-run]" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
if [ "$DRY_RUN" = 1 ]; then
  export TRITON_INTERPRET=1
  DEVICE=cpu
else
  unset TRITON_INTERPRET
  DEVICE=cuda
fi
START=$SECONDS

missing_modules() {  # the modules of "$@" this python cannot find
  "$PY" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@" 2>/dev/null || echo "python"
}

# run_step NAME LIMIT "MODULES" COMMAND...: runs COMMAND under `timeout LIMIT`, output to $WORK/NAME.log,
# its status to $WORK/NAME.status (rc, seconds, limit, or what was missing); its JSON, if any, it writes itself
run_step() {
  local name="$1" limit="$2" modules="$3" missing t0 rc
  shift 3
  # shellcheck disable=SC2086 # the module list is meant to split
  missing="$(missing_modules $modules)"
  if [ -n "$missing" ]; then
    echo "[$name] SKIPPED: missing $missing" | tee "$WORK/$name.log"
    printf '{"skipped": "missing %s", "limit_s": %s}\n' "$missing" "$limit" > "$WORK/$name.status"
    return
  fi
  echo "[$name] up to $limit s: $*"
  t0=$SECONDS
  # SIGTERM 5 s before the limit, SIGKILL at it: a step never outlives its limit
  timeout --kill-after=5 "$((limit - 5))" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  tail -n 15 "$WORK/$name.log"
  printf '{"rc": %s, "seconds": %s, "limit_s": %s}\n' "$rc" "$((SECONDS - t0))" "$limit" > "$WORK/$name.status"
}

# shellcheck disable=SC2016 # $PY's program text, not the shell's
run_step preflight 20 "" bash -c '
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>&1 || echo "no nvidia-smi"
  "$0" -c "import platform, sys; print(\"python\", platform.python_version())
for m in (\"torch\", \"triton\", \"numpy\", \"pytest\"):
    try:
        mod = __import__(m); print(m, mod.__version__)
    except Exception as err:
        print(m, \"missing:\", type(err).__name__, err)
try:
    import torch; print(\"cuda\", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else \"no device\")
except Exception as err:
    print(\"cuda unknown:\", err)"' "$PY"

mkdir -p "$WORK/correctness" "$WORK/speed" "$WORK/logprobs" "$WORK/bounds"
if [ "$DRY_RUN" = 1 ]; then
  size_flag=(--dry-run)
  contract_tests=(-k "test_expanded_upstream_gradient or test_non_contiguous_1d_input")
  logprobs_sizes=(--tokens 256 --vocab 2048 --hidden 64)
  bounds_sizes=(--tokens 4096 --repeats 3)
else
  size_flag=()
  contract_tests=()
  logprobs_sizes=(--tokens 4096 16384 --entropy)
  bounds_sizes=(--repeats 20)
fi
# OpenRLHF's log-prob step is the baseline where OpenRLHF imports or OPENRLHF_UTILS_PY names its models/utils.py
if [ -z "$(missing_modules openrlhf)" ] || [ -n "${OPENRLHF_UTILS_PY:-}" ]; then
  logprobs_baseline=(--openrlhf-max-tokens 65536)
else
  logprobs_baseline=(--openrlhf-max-tokens 0)
fi
run_step correctness 170 "torch triton" "$PY" -m openrlhf_band.bench.gpu_check --out "$WORK/correctness" \
  --device "$DEVICE" ${size_flag[@]+"${size_flag[@]}"}
run_step speed 130 "torch triton" "$PY" -m openrlhf_band.bench.gpu_speed --out "$WORK/speed" \
  --device "$DEVICE" ${size_flag[@]+"${size_flag[@]}"}
run_step contract 120 "torch triton numpy pytest" env OPENRLHF_BAND_TEST_DEVICE="$DEVICE" \
  "$PY" -m pytest -p no:cacheprovider --noconftest -o addopts= --import-mode=importlib -v -rfE \
  tests/ops/test_band_loss_kernel.py tests/ops/test_differential.py ${contract_tests[@]+"${contract_tests[@]}"}
run_step logprobs 60 "torch" env OPENRLHF_BAND_BENCH_DIR="$WORK/logprobs" "$PY" -m openrlhf_band.tools.cli \
  bench logprobs --device "$DEVICE" "${logprobs_sizes[@]}" "${logprobs_baseline[@]}"
run_step bounds 25 "torch" env OPENRLHF_BAND_BENCH_DIR="$WORK/bounds" "$PY" -m openrlhf_band.tools.cli \
  bench bounds --device "$DEVICE" "${bounds_sizes[@]}"

run_step summary 15 "" "$PY" "$REPO/bench/gpu_summary.py" --work "$WORK" --out "$OUT" --dry-run "$DRY_RUN" \
  --seconds "$((SECONDS - START))"
status=$?
if [ ! -s "$OUT/gpu_check_summary.json" ]; then
  echo "the summary was not written: $WORK/summary.log" >&2
  cat "$WORK/summary.log" >&2
  exit 1
fi
"$PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); print("gpu_check:", s["verdict"], "in", s["seconds"], "s"); sys.exit(s["exit_status"])' \
  "$OUT/gpu_check_summary.json"
status=$?
echo "wrote $OUT/gpu_check_summary.json and $OUT/gpu_check_details.tar.gz"
exit $status
