#!/usr/bin/env bash
# Baseline: DRPO (Rethinking the Divergence Regularization in LLM Reinforcement Learning, arXiv 2606.09821;
# UniRL's unirl/algorithms/drpo.py at 1a7b501e): -A r + |A| mu (r - 1)^2 / (2 eps) per token, r = pi / mu
# against the rollout engine's log-probs (vLLM's: train_ppo_ray asks for them with this loss), DPPO's binary-TV
# region as a smooth penalty. From the authors' recipe (examples/ar/qwen3_drpo_4b_base_dapo_sglang.yaml): eps 12.5,
# seq-mean-token-sum-norm over the rollout's max new tokens (their horizon), group-mean advantages without the std
# (OpenRLHF's dr_grpo); the rest is common.sh's recipe (its k3 KL loss, top_p 1: theirs samples with top_p 0.9,
# top_k 20, which the ratio against vLLM's log-probs refuses here). No clip values, no dual-clip, no IS correction
# (its ratio is against mu already: with ASYNC=1 the script leaves it off).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/drpo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SAMPLER_RATIO=1 launch drpo --loss drpo --actor.drpo.epsilon 12.5 --actor.loss_agg_mode seq-mean-token-sum-norm \
  --algo.advantage.estimator dr_grpo
