#!/usr/bin/env bash
# Regenerate the patch set from real edits of the released openrlhf files (never hand-type a diff).
#
#   patches/regenerate.sh extract WORKDIR   # WORKDIR/a: released files, WORKDIR/b: a copy with the
#                                           # current patches applied -- edit the files under WORKDIR/b
#   patches/regenerate.sh diff WORKDIR      # writes one `diff -u a b` per file and manifest.json
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python}"
files=(
  openrlhf/models/ring_attn_utils.py
  openrlhf/trainer/ray/vllm_engine.py
  openrlhf/trainer/ppo_utils/samples_generator.py
  openrlhf/cli/train_ppo_ray.py
  openrlhf/trainer/ray/ppo_actor.py
  openrlhf/models/actor.py
  openrlhf/trainer/ppo_utils/experience_maker.py
  openrlhf/trainer/ray/launcher.py
)
action="${1:?usage: regenerate.sh extract|diff WORKDIR}"
work="${2:?usage: regenerate.sh extract|diff WORKDIR}"
case "$action" in
  extract)
    mkdir -p "$work/wheel" "$work/a" "$work/b"
    "$python" -m pip download --no-deps openrlhf==0.11.2 -d "$work/wheel" >/dev/null
    unzip -q -o "$work"/wheel/openrlhf-0.11.2-*.whl -d "$work/wheel/unpacked"
    purelib="$work/wheel/unpacked/openrlhf-0.11.2.data/purelib"
    for root in a b; do
      rm -rf "${work:?}/$root/openrlhf" && cp -r "$purelib/openrlhf" "$work/$root/"
      cp -r "$work/wheel/unpacked/openrlhf-0.11.2.dist-info" "$work/$root/"
    done
    "$python" -m openrlhf_band.tools.cli patch apply --site-packages "$work/b"
    echo "released files in $work/a, patched copies to edit in $work/b"
    ;;
  diff)
    "$python" -m openrlhf_band.patching.patcher regenerate "$work/a" "$work/b" "${files[@]}"
    echo "wrote $here/openrlhf-0.11.2/"
    ;;
  *) echo "usage: regenerate.sh extract|diff WORKDIR" >&2; exit 2 ;;
esac
