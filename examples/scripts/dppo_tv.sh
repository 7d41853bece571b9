#!/usr/bin/env bash
# Baseline: DPPO (arXiv 2602.04879) with the binary TV divergence, as verl's dppo_tv loss and the
# DPPO authors' verl example (examples/dppo_trainer): radii 0.15 / 0.15, ratio truncation c = 1e4
# (clip_ratio_c=10000.0), no dual-clip, no upper cap. The radii are --actor.band.delta_low_high LOW HIGH,
# so an asymmetric pair is one edit.
# Aggregation: verl's example scripts use loss_agg_mode seq-mean-token-sum-norm, which OpenRLHF 0.11.2
# does not have; this script keeps the recipe's seq-mean-token-mean (common.sh), like every other script.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/dppo_tv.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch dppo-tv --loss band --actor.band.rule dppo --band_divergence tv --actor.band.delta_low_high 0.15 0.15 \
  --actor.band.dppo_truncation 1e4
