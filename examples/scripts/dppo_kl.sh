#!/usr/bin/env bash
# Baseline: DPPO (arXiv 2602.04879) with the binary KL divergence, as verl's dppo_kl loss and the
# DPPO authors' verl example (examples/dppo_trainer): radii 0.05 / 0.05, ratio truncation c = 1e4
# (clip_ratio_c=10000.0), no dual-clip, no upper cap. The radii are --actor.band.delta_low_high LOW HIGH,
# so an asymmetric pair is one edit.
# Aggregation: verl's example scripts use loss_agg_mode seq-mean-token-sum-norm (here --actor.loss_agg_mode
# seq-mean-token-sum-norm, divided by --rollout.max_new_tokens); this script keeps the recipe's
# seq-mean-token-mean (common.sh), like every other script.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/dppo_kl.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch dppo-kl --loss band --actor.band.rule dppo --band_divergence kl --actor.band.delta_low_high 0.05 0.05 \
  --actor.band.dppo_truncation 1e4
