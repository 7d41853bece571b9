#!/usr/bin/env bash
# BandPO (KL, delta 0.05, cap 10, dual-clip 10) with the entropy-adaptive radius: each token's
# delta_t = clamp(0.05 (H_t / H_mean)^1, 0.0125, 0.2) from the policy's entropy (not in the paper).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_adaptive.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch bandpo-kl-entropy --loss band --band_divergence kl --band_delta 0.05 --actor.band.upper_cap 10 \
  --actor.dual_clip 10 --actor.band.adaptive entropy
