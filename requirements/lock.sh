#!/usr/bin/env bash
# Regenerates requirements/gpu-lock.txt, the GPU image's complete Python package set (the Dockerfile installs it
# with `pip install --no-deps --require-hashes`): requirements/gpu.txt resolved by uv for the image's platform,
# Linux x86_64 with glibc 2.39 (Ubuntu 24.04) and CPython 3.12, from package metadata alone, nothing installed,
# with the sha256 of every file of each pinned version (pip picks the one the platform takes).
# (glibc 2.39, not manylinux_2_28: llguidance 1.7.6, which vLLM needs, has no x86_64 wheel older than
# manylinux_2_31, so a 2_28 resolution reads it as an sdist; the pins come out the same either way.)
#
#   bash requirements/lock.sh            # `make locks`
#   bash requirements/lock.sh --check    # resolve into a temp file; exit 1 (with the diff) if the lock is stale
#   bash requirements/lock.sh --upgrade  # any other arguments go to `uv pip compile`
#
# Without --upgrade the committed lock is uv's preference, so an unchanged input reproduces it.
# The CPU locks are constraints: a package the image shares with requirements/cpu-lock.txt or
# requirements/e2e-lock.txt gets the version the CPU tests run, except the packages in NOT_CONSTRAINED,
# which the CUDA stack requires at another version (the reasons: tests/launcher/test_locks.py). The CPU locks
# themselves are not regenerated here: neither records a command that made them, so they are the fixed side.
# flash-attn, which openrlhf requires, is left out (an override with a marker that never holds): the Dockerfile
# installs it apart, opt-in.
# The index is pip's own: index-url, extra-index-url and find-links as `pip config list` reports them (PyPI when
# none is set), with pip's rule that every index is searched alike (uv --index-strategy unsafe-best-match).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
UV_VERSION=0.13.9
PLATFORM=x86_64-manylinux_2_39
PYTHON_VERSION=3.12
NOT_CONSTRAINED="protobuf apache-tvm-ffi"
LOCK=requirements/gpu-lock.txt

check=0
args=()
for arg in "$@"; do
    if [ "$arg" = --check ]; then check=1; else args+=("$arg"); fi
done

# uv, pinned, from pip's index into a throwaway venv (reused while it lasts); UV=/path/to/uv uses another
uv="${UV:-}"
if [ -z "$uv" ]; then
    uv_venv="${TMPDIR:-/tmp}/openrlhf-band-uv-$UV_VERSION"
    if ! "$uv_venv/bin/uv" --version 2>/dev/null | grep -qx "uv $UV_VERSION.*"; then
        rm -rf "$uv_venv"
        "$PYTHON" -m venv "$uv_venv"
        "$uv_venv/bin/python" -m pip install --quiet "uv==$UV_VERSION"
    fi
    uv="$uv_venv/bin/uv"
fi

# the value pip uses for one option: the environment over the [install] section over [global]
pip_option() {
    "$PYTHON" -m pip config list 2>/dev/null | "$PYTHON" -c '
import sys
rank = {"global": 0, "install": 1, ":env:": 2}
best = (-1, "")
for line in sys.stdin:
    name, _, value = line.strip().partition("=")
    section, _, option = name.rpartition(".")
    if option == sys.argv[1] and section in rank and rank[section] >= best[0]:
        best = (rank[section], value.strip("\"'"'"'"))
print(best[1])' "$1"
}
# pip's index-url searched first: with uv's own order (an extra index before the index-url), a partial extra index
# that holds a version with fewer files hides the index-url's files of it when the old lock is the preference
index_url="$(pip_option index-url)"
index_url="${index_url:-https://pypi.org/simple}"
index=(--index "$index_url" --default-index "$index_url" --index-strategy unsafe-best-match)
for url in $(pip_option extra-index-url); do index+=(--index "$url"); done
for links in $(pip_option find-links); do index+=(--find-links "$links"); done

# uv runs in a scratch copy of requirements/ so that the lock's "# via" lines name the real files; the CPU locks
# there lack the NOT_CONSTRAINED packages
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/requirements"
cp requirements/gpu.txt "$tmp/requirements/gpu.txt"
exclude="$(for name in $NOT_CONSTRAINED; do printf '%s|' "${name//-/[-_.]}"; done)"
for lock in cpu-lock e2e-lock; do
    grep -v -i -E "^(${exclude%|})==" "requirements/$lock.txt" > "$tmp/requirements/$lock.txt"
done
echo 'flash-attn ; sys_platform == "never"' > "$tmp/requirements/gpu-overrides.txt"
if [ -f "$LOCK" ]; then cp "$LOCK" "$tmp/$LOCK"; fi

echo "uv pip compile requirements/gpu.txt for $PLATFORM / CPython $PYTHON_VERSION (${index[*]})" >&2
(
    cd "$tmp"
    # no managed-Python download: sdists without wheels (deepspeed, ...) yield their metadata under any local Python
    UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}" "$uv" pip compile --quiet requirements/gpu.txt \
        -c requirements/cpu-lock.txt -c requirements/e2e-lock.txt --override requirements/gpu-overrides.txt \
        --python-platform "$PLATFORM" --python-version "$PYTHON_VERSION" "${index[@]}" \
        --generate-hashes --custom-compile-command "make locks" -o "$LOCK" "${args[@]}"
)
{
    echo "# The GPU image's Python packages, every one pinned with the sha256 of its files: the Dockerfile installs"
    echo "# this file whole with pip install --no-deps --require-hashes. Generated by requirements/lock.sh (make locks)"
    echo "# from requirements/gpu.txt for $PLATFORM / CPython $PYTHON_VERSION, constrained by requirements/cpu-lock.txt"
    echo "# and requirements/e2e-lock.txt except $NOT_CONSTRAINED; flash-attn is left out. Do not edit by hand."
    cat "$tmp/$LOCK"
} > "$tmp/$LOCK.new"

if [ "$check" = 1 ]; then
    if diff -u "$LOCK" "$tmp/$LOCK.new"; then echo "$LOCK is up to date" >&2; else echo "$LOCK is stale: make locks" >&2; exit 1; fi
else
    mv "$tmp/$LOCK.new" "$LOCK"
    echo "wrote $LOCK ($(grep -c -E '^[A-Za-z0-9]' "$LOCK") packages); requirements/cpu-lock.txt and e2e-lock.txt are not regenerated (see the head of $0)" >&2
fi
