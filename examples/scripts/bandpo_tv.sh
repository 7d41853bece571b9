#!/usr/bin/env bash
# BandPO with the total-variation trust region: delta 0.05, cap 10, dual-clip 10.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_tv.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch bandpo-tv --loss band --band_divergence tv --band_delta 0.05 --actor.band.upper_cap 10 --actor.dual_clip 10
