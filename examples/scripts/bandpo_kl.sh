#!/usr/bin/env bash
# BandPO with the KL trust region (the paper's default): delta 0.05, cap 10, dual-clip 10.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_kl.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch bandpo-kl --loss band --band_divergence kl --band_delta 0.05 --actor.band.upper_cap 10 --actor.dual_clip 10
