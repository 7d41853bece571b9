#!/usr/bin/env bash
# Baseline: GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673; verl's geo_mean loss): per sequence,
# the geometric mean of the token ratios with each log r clipped to [-0.4, 0.4] (the paper's (e^-0.4, e^0.4),
# section 4; verl's examples/gmpo_trainer/run_qwen3_8b_fsdp.sh: clip_ratio_low = clip_ratio_high = 0.4).
# GMPO is sequence-level: its loss is averaged over sequences whatever --actor.loss_agg_mode. No dual-clip.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/gmpo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch gmpo --loss gmpo --actor.eps_clip_low_high 0.4 0.4
