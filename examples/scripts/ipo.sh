#!/usr/bin/env bash
# Baseline: IPO (INTELLECT Policy Optimization; prime-rl's ipo_loss_fn, src/prime_rl/trainer/rl/loss.py at
# 559b4477): -keep A r + kl_tau (log pi - log mu)^2 per token, r = pi / mu against the rollout engine's log-probs
# (vLLM's: train_ppo_ray asks for them with this loss), keep = |pi - mu| <= ipo_threshold. prime-rl's defaults:
# ipo_threshold 0.1, adv_tau 1, kl_tau 1e-3, the token sum over the step's loss tokens (token-mean). The recipe's
# group_norm advantages and k3 KL loss stay. No clip values, no dual-clip, no IS correction (its ratio is against
# mu already: with ASYNC=1 the script leaves it off).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/ipo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SAMPLER_RATIO=1 launch ipo --loss ipo --actor.ipo.ipo_threshold 0.1 --actor.ipo.adv_tau 1 --actor.ipo.kl_tau 0.001 \
  --actor.loss_agg_mode token-mean
