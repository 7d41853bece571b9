#!/usr/bin/env bash
# Baseline: GSPO (Group Sequence Policy Optimization, arXiv 2507.18071), OpenRLHF 0.11.2's own
# --actor.policy_loss_type gspo: the sequence-level ratio (geometric mean of the token ratios) clipped to
# [1 - 3e-4, 1 + 4e-4] (the paper's section 5.1; verl's examples/gspo_trainer/run_qwen3_8b_fsdp.sh:
# clip_ratio_low 3e-4, clip_ratio_high 4e-4). OpenRLHF aggregates GSPO per sequence whatever
# --actor.loss_agg_mode; no dual-clip, as those examples.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/gspo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch gspo --loss gspo --actor.eps_clip_low_high 3e-4 4e-4
