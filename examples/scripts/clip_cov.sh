#!/usr/bin/env bash
# Baseline: Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617; verl's clip_cov loss):
# PPO's clipped loss with a random 0.0002 share of the tokens whose centred covariance (A - mean A)(log pi -
# mean log pi) lies in (1, 5) taken out of the gradient. Settings of the authors' verl recipe
# (recipe/entropy/7b_clip_cov.sh, also 32b_clip_cov.sh): clip_ratio_low = clip_ratio_high = 1,
# clip_cov_ratio 0.0002, clip_cov_lb 1, clip_cov_ub 5, token-mean. That recipe's clip_ratio_c=10 is not read
# by verl's clip_cov, so no dual-clip here either (--actor.dual_clip C would apply: Clip-Cov is a PPO clip).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/clip_cov.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch clip-cov --loss clip_cov --actor.eps_clip_low_high 1 1 --actor.clip_cov.clip_cov_ratio 0.0002 \
  --actor.clip_cov.clip_cov_lb 1 --actor.clip_cov.clip_cov_ub 5 --actor.loss_agg_mode token-mean
