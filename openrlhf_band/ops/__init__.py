"""The operations: the fused Band loss kernel (`band_loss`, needs Triton), its torch reference
(`reference`) and the chunked lm_head log-probs (`fused_logprobs`, plain torch). Names are imported
on first use, so that importing one never imports Triton for another."""

from __future__ import annotations

import importlib

_PUBLIC = {"fused_linear_logprobs": "openrlhf_band.ops.fused_logprobs"}
__all__ = ["fused_linear_logprobs"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'openrlhf_band.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
