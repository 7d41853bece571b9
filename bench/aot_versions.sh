#!/usr/bin/env bash
# Ahead-of-time compile check of the fused Band loss kernel under several Triton releases, no GPU needed.
#
# For each Triton version: a throwaway venv OUTSIDE the repository ($AOT_VENV_ROOT/aot-venv-<ver>,
# default /tmp), with torch's CPU build pinned (torch==TORCH_PIN+cpu: from pip's configured sources when
# they hold it, else from TORCH_INDEX, PyTorch's CPU index; never the CUDA build PyPI serves on Linux),
# that triton, numpy and this checkout installed --no-deps -e; then `openrlhf-band aot` for every CUDA
# target, writing aot_triton-<ver>.{json,csv} and .log under AOT_RESULTS. The pinned triton of the
# repository's .venv (if there is one) is run as well. Existing venvs with the right triton are reused.
#
# Usage, from anywhere:  bash bench/aot_versions.sh [VERSION ...]
#   default versions: 3.6.0 (the latest 3.6.x) and the newest triton on the index (looked up by pip).
# Environment: AOT_RESULTS (default out/bench under the repository; bench/results updates the committed
#   tables), TORCH_PIN (default 2.13.0), TORCH_INDEX (default https://download.pytorch.org/whl/cpu),
#   AOT_TARGETS (default "80 89 90 100 120"),
#   AOT_VENV_ROOT (default /tmp), AOT_JOBS (parallel compiles, default 2), AOT_PINNED (0: skip the
#   repository .venv's triton), AOT_EXTRA_ARGS (more `openrlhf-band aot` flags, e.g. --variants kl).
# Exit status: 0 when every version compiled every variant without spills, 1 otherwise (see the table).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TORCH_PIN="${TORCH_PIN:-2.13.0}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
TARGETS="${AOT_TARGETS:-80 89 90 100 120}"
VENV_ROOT="${AOT_VENV_ROOT:-/tmp}"
RESULTS="${AOT_RESULTS:-$REPO/out/bench}"
case "$RESULTS" in /*) ;; *) RESULTS="$REPO/$RESULTS" ;; esac
PY_BASE="${PYTHON:-python3.11}"
mkdir -p "$RESULTS"
unset TRITON_INTERPRET

newest_triton() {
  "$PY_BASE" -m pip index versions triton 2>/dev/null | sed -n 's/^triton (\(.*\))$/\1/p' | head -1
}

if [ "$#" -gt 0 ]; then
  versions=("$@")
else
  newest="$(newest_triton)"
  versions=(3.6.0)
  if [ -n "$newest" ] && [ "$newest" != 3.6.0 ]; then versions+=("$newest"); fi
fi

# shellcheck disable=SC2206  # word splitting of the target list is intended
target_args=($TARGETS)
# shellcheck disable=SC2206
extra_args=(${AOT_EXTRA_ARGS:-})

run_aot() {  # run_aot <venv dir> <label>
  local venv="$1" label="$2" rc
  echo "== triton $label: openrlhf-band aot --targets ${target_args[*]}"
  (cd "$REPO" && "$venv/bin/openrlhf-band" aot --targets "${target_args[@]}" --out "$RESULTS" \
    --jobs "${AOT_JOBS:-2}" "${extra_args[@]}") \
    2>&1 | tee "$RESULTS/aot_triton-$label.log"
  rc="${PIPESTATUS[0]}"
  summary+=("triton $label: exit $rc")
  [ "$rc" -eq 0 ] || status=1
}

status=0
summary=()
for ver in "${versions[@]}"; do
  venv="$VENV_ROOT/aot-venv-$ver"
  if ! "$venv/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$ver')" 2>/dev/null; then
    echo "== creating $venv (torch==$TORCH_PIN CPU, triton==$ver)"
    rm -rf "$venv"
    "$PY_BASE" -m venv "$venv" || { summary+=("triton $ver: venv failed"); status=1; continue; }
    # torch's CPU build first and pinned (triton's own pins must not pull a CUDA torch): from pip's
    # configured sources (a local wheel), else from PyTorch's CPU index
    if ! { "$venv/bin/pip" install -q "torch==$TORCH_PIN+cpu" numpy 2>/dev/null \
           || "$venv/bin/pip" install -q --extra-index-url "$TORCH_INDEX" "torch==$TORCH_PIN+cpu" numpy; } \
      || ! "$venv/bin/pip" install -q --no-deps "triton==$ver" \
      || ! "$venv/bin/pip" install -q --no-deps -e "$REPO"; then
      summary+=("triton $ver: install failed")
      status=1
      continue
    fi
  fi
  run_aot "$venv" "$ver"
done

if [ "${AOT_PINNED:-1}" != 0 ] && [ -x "$REPO/.venv/bin/openrlhf-band" ]; then
  pinned="$("$REPO/.venv/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null)"
  if [ -n "$pinned" ] && [[ " ${versions[*]} " != *" $pinned "* ]]; then run_aot "$REPO/.venv" "$pinned"; fi
fi

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$status"
