#!/usr/bin/env bash
# Baseline: SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347; verl's sapo loss): a soft sigmoid
# gate sigmoid(tau (r - 1)) 4 / tau in place of the clip, tau_pos 1.0 for A > 0 and tau_neg 1.05 for
# A <= 0 (verl's defaults, "the values used in the paper with Qwen3-30B-A3B-Base"; verl's
# examples/sapo_trainer/run_qwen3_8b_fsdp.sh). Seq-mean-token-mean aggregation (common.sh), which verl's
# sapo always uses. No clip values and no dual-clip (both refused: SAPO has no clip).
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/sapo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch sapo --loss sapo --actor.sapo.tau_pos 1.0 --actor.sapo.tau_neg 1.05
