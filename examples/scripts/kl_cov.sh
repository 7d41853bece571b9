#!/usr/bin/env bash
# Baseline: KL-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617; verl's kl_cov loss): the
# unclipped policy gradient, plus ppo_kl_coef |log r| on the top kl_cov_ratio share of the tokens by centred
# covariance. Settings of the authors' verl recipe for 7B models (recipe/entropy/7b_kl_cov.sh): kl_cov_ratio
# 0.002 (their 32B recipe: 0.0002), ppo_kl_coef 1, token-mean. KL-Cov has no clip: no clip values, no dual-clip.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/kl_cov.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch kl-cov --loss kl_cov --actor.kl_cov.kl_cov_ratio 0.002 --actor.kl_cov.ppo_kl_coef 1 \
  --actor.loss_agg_mode token-mean
