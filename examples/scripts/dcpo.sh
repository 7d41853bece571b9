#!/usr/bin/env bash
# Baseline: DCPO's probability-dependent clip (eps 0.16 / 0.20, cap 10) through the same fused loss.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/dcpo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch dcpo --loss band --actor.band.rule dcpo --actor.eps_clip_low_high 0.16 0.20 --actor.band.upper_cap 10 --actor.dual_clip 10
