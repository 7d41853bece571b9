#!/usr/bin/env bash
# Baseline: GRPO with the fixed clip eps 0.2 / 0.2 (dual-clip 10 as in the band runs).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/grpo_clip.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch grpo-clip --actor.eps_clip_low_high 0.2 0.2 --actor.dual_clip 10
