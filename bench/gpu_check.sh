#!/usr/bin/env bash
# One-call GPU check for a CUDA machine (torch + triton preinstalled; nothing is installed).
# Usage, from the repository root:  OUT=/some/dir bash bench/gpu_check.sh   (default OUT: out/bench/gpu)
# Writes under $OUT: gpu_correctness.json, gpu_jit_resources.json (registers / spills of the kernels the
# correctness run compiled, from the driver), aot_triton-<ver>-sm<cap>-device.{json,csv} (the AOT resource
# table for this device's arch), the kernel benchmark's JSON/CSV (524,288 and 4,194,304 tokens), the bounds
# benchmark's JSON (524,288 tokens, its default), the log-prob benchmark JSON, pytest output if pytest exists.
# Budgeted under 10 minutes on an H200 (correctness ~1-2 min, aot < 2 min, benchmarks ~3 min, tests ~1 min); not
# yet measured on any GPU; its steps' timeouts cap it at 15 minutes.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-out/bench/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OPENRLHF_BAND_BENCH_DIR="$OUT" PYTHONWARNINGS=ignore
unset TRITON_INTERPRET
status=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
timeout 240 python3 -m openrlhf_band.bench.gpu_check 2>&1 | tee "$OUT/gpu_check.log" || status=1
# AOT resource table (registers, spills, f64/f32 SASS per token, occupancy) for this device's own arch,
# every user-facing variant, compiled in parallel; budget < 2 min (the per-token kl solver is the slow one)
cap="$(python3 -c "import torch; m, n = torch.cuda.get_device_capability(); print(10 * m + n)")"
timeout 150 python3 -m openrlhf_band.tools.cli aot --targets "${cap:-90}" --out "$OUT" --tag "-sm${cap:-90}-device" \
  --jobs 8 --no-amd 2>&1 | tee "$OUT/aot.log" || status=1
timeout 180 python3 -m openrlhf_band.tools.cli bench kernel --tokens 524288 4194304 --divergences kl chi2 tv reverse_kl hellinger --repeats 20 \
  2>&1 | tee "$OUT/bench_kernel.log" || status=1
timeout 60 python3 -m openrlhf_band.tools.cli bench bounds --device cuda --repeats 20 2>&1 | tee "$OUT/bench_bounds.log" || status=1
# the log-prob step, OpenRLHF's full logits vs the fused chunked lm_head (CUDA peak memory from the allocator);
# the image has no OpenRLHF: its released models/utils.py (unpatched) comes from .venv, carried with the run
OPENRLHF_UTILS_PY="${OPENRLHF_UTILS_PY:-.venv/lib/python3.11/site-packages/openrlhf/models/utils.py}" timeout 150 \
  python3 -m openrlhf_band.tools.cli bench logprobs --device cuda --tokens 4096 16384 65536 --entropy \
  2>&1 | tee "$OUT/bench_logprobs.log" || status=1
if python3 -c "import pytest, hypothesis, mpmath" 2>/dev/null; then
  OPENRLHF_BAND_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_band_loss_kernel.py \
    2>&1 | tail -20 | tee "$OUT/pytest_kernel.log" || status=1
else
  echo "pytest/hypothesis/mpmath not in this image: the pytest suite was not run on GPU" | tee "$OUT/pytest_kernel.log"
fi
exit $status
