#!/usr/bin/env bash
# Baseline: GPG (GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, arXiv 2504.02546;
# verl 0.9.1's gpg policy loss, compute_policy_loss_gpg): -A log pi per token, no ratio, no clip, the old
# log-probs unread. Token-mean, verl's default loss_agg_mode. verl pairs it with its own gpg advantage estimator
# (alpha (r - group mean), no std division), which OpenRLHF does not have: the recipe's group_norm stays, so
# the comparison is of the loss. No clip values and no dual-clip (both refused: GPG has no clip).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/gpg.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch gpg --loss gpg --actor.loss_agg_mode token-mean
