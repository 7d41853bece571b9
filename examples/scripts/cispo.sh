#!/usr/bin/env bash
# Baseline: CISPO (MiniMax-M1, arXiv 2506.13585; verl's cispo loss): -sg(clip(r, 1 - EPS_LOW, 1 + EPS_HIGH)) A log pi
# per token. Clip values as verl's example (examples/cispo_trainer/run_qwen3_8b_fsdp.sh: clip_ratio_low=10,
# clip_ratio_high=0.2): no lower clip (the paper imposes none, section 3.1), the weight capped at 1.2.
# Token-mean aggregation, as that example (verl's default) and the paper's token-level objective.
# No dual-clip (refused: CISPO's weight is already bounded).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/cispo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch cispo --loss cispo --actor.eps_clip_low_high 10 0.2 --actor.loss_agg_mode token-mean
