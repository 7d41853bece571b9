#!/usr/bin/env bash
# BandPO with the KL trust region (delta 0.05, cap 10, dual-clip 10, as bandpo_kl.sh) and a floor on
# the lower ratio bound: max(r_low, LOWER_FLOOR).
# Why: the band's lower bound r_low goes to 0 for rare tokens, which switches clip-low off for them and
# costs entropy; the floor keeps every lower bound at least LOWER_FLOOR.
# LOWER_FLOOR (0 < F < 1) is set below (0.8, the working value) or from the environment; the run is
# named after it (OUTPUT_ROOT/bandpo-kl-floorF-seedSEED), so runs at different floors do not collide.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_kl_floor.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
LOWER_FLOOR="${LOWER_FLOOR:-0.8}"
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch "bandpo-kl-floor${LOWER_FLOOR}" --loss band --band_divergence kl --band_delta 0.05 --actor.band.upper_cap 10 \
  --actor.band.lower_floor "$LOWER_FLOOR" --actor.dual_clip 10
