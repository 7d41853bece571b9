#!/usr/bin/env bash
# Baseline: Clip-Higher (DAPO), eps 0.2 / 0.28, dual-clip 10.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/clip_higher.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch clip-higher --actor.eps_clip_low_high 0.2 0.28 --actor.dual_clip 10
