#!/usr/bin/env bash
# The band as CISPO's bounds: CISPO's objective -sg(clip(r, r_low(p), r_up(p))) A log pi with the kl band's
# per-token bounds (delta 0.05, cap 10: the paper's band) in place of CISPO's fixed interval. Everything else
# as cispo.sh (token-mean), so that the pair differs in the bounds alone. Every band flag applies
# (--actor.band.lower_floor, --actor.band.adaptive, ...); dual-clip and DPPO's rule do not.
# Usage: MODEL=... DATA_DIR=... bash examples/scripts/bandpo_kl_cispo.sh   (DRY_RUN=1 to validate only; see common.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
launch bandpo-kl-cispo --loss cispo --actor.cispo.bounds band --band_divergence kl --band_delta 0.05 \
  --actor.band.upper_cap 10 --actor.loss_agg_mode token-mean
