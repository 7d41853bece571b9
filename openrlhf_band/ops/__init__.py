"""The operations: the fused Band loss kernel (`band_loss`, needs Triton), its torch reference
(`reference`) and the chunked lm_head log-probs (`fused_logprobs`, plain torch). Names are imported
on first use, so that importing one never imports Triton for another."""

from __future__ import annotations

from openrlhf_band._lazy import lazy_names

_PUBLIC = {"fused_linear_logprobs": "openrlhf_band.ops.fused_logprobs"}
__all__ = ["fused_linear_logprobs"]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
