#!/usr/bin/env bash
# BandPO with the Pearson chi^2 trust region: delta 0.05, cap 10, dual-clip 10.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_chi2.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch bandpo-chi2 --loss band --band_divergence chi2 --band_delta 0.05 --actor.band.upper_cap 10 --actor.dual_clip 10
