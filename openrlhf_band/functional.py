"""Functional API: `band_token_loss`, dispatching between the fused Triton kernel and the torch
reference."""

from __future__ import annotations

import os

import torch
from torch import Tensor

from openrlhf_band.band.bounds import _validate, is_real_number
from openrlhf_band.ops.reference import BandTokenLoss, band_token_loss_reference

BACKENDS = ("auto", "triton", "torch")


def _triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _delta_view(delta: Tensor, log_probs: Tensor) -> Tensor:
    """A per-token or per-sequence radius as a tensor that broadcasts to log_probs: (B,) against
    (B, T) is per sequence, as for advantages; anything else must broadcast as it is."""
    if not delta.is_floating_point():
        raise ValueError(f"a per-token delta must be a floating-point tensor, got {delta.dtype}")
    if delta.device != log_probs.device:
        raise ValueError(f"delta is on {delta.device}, log_probs on {log_probs.device}")
    if log_probs.dim() == 2 and delta.shape == (log_probs.shape[0],) != (log_probs.shape[1],):
        delta = delta.unsqueeze(-1)
    try:
        torch.broadcast_shapes(delta.shape, log_probs.shape)
    except RuntimeError:
        raise ValueError(
            f"delta of shape {tuple(delta.shape)} does not fit log_probs of shape {tuple(log_probs.shape)}: "
            "expected a number, per token (same shape), or per sequence (B, 1) / (B,)"
        ) from None
    return delta


def band_token_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    *,
    divergence: str = "kl",
    delta: float | Tensor = 0.05,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    dual_clip: float | None = None,
    backend: str = "auto",
    return_bounds: bool = False,
    bounds: tuple[Tensor | float, Tensor | float] | None = None,
) -> BandTokenLoss:
    """Per-token Band surrogate -min(r A, clip(r, r_low(p), r_up(p)) A), dual-clipped when asked.

    Args:
        log_probs: log pi_theta of the sampled tokens, (B, T) (or any shape; 1-D is one row),
            float32 or bfloat16 (float64 on the torch backend), requires grad.
        old_log_probs: log pi_old, same shape, any float dtype; defines p and the band.
        advantages: per token (B, T) or per sequence (B, 1) / (B,).
        action_mask: (B, T), bool or 0/1 of any int/float dtype; None = all tokens count.
        divergence, delta, upper_cap, relax: the band, as in `band_bounds`; delta is a number or a
            tensor: per token (B, T), or per sequence (B, 1) / (B,), with no gradient.
        dual_clip: c > 1: for A < 0 the objective is floored at c * A (no gradient there).
        backend: "auto" (CUDA -> triton, otherwise torch), "triton" (CUDA, or CPU under
            TRITON_INTERPRET=1), or "torch".
        return_bounds: also return the (lower, upper) ratio bounds used (float32).
        bounds: (lower, upper) ratio bounds (tensors broadcastable to the input, or numbers) to use
            instead of the band, as given (no cap or relax): e.g. a fixed clip interval, or a
            probability-dependent rule computed by the caller.

    Returns:
        `BandTokenLoss(loss, clipped_upper, clipped_lower, dual_clipped, lower, upper)`: per-token
        loss (float32, exactly 0 at masked positions, never nan/inf there whatever they hold) and
        boolean flags, each of the input's shape. Aggregation (token-mean etc.) stays with the caller.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    # on both backends, also when `bounds` replace the band
    if isinstance(delta, Tensor):
        _validate(divergence, 1.0, upper_cap, relax)
        delta = _delta_view(delta, log_probs)
    else:
        _validate(divergence, delta, upper_cap, relax)
    if dual_clip is not None and not (is_real_number(dual_clip) and dual_clip > 1.0):
        raise ValueError(f"dual_clip must be > 1 (OpenRLHF's rule), got {dual_clip!r}")
    if old_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
        )
    if action_mask is not None and action_mask.shape != log_probs.shape:
        raise ValueError(f"action_mask shape {tuple(action_mask.shape)} != log_probs shape {tuple(log_probs.shape)}")
    per_sequence = log_probs.dim() == 2 and advantages.shape in ((log_probs.shape[0],), (log_probs.shape[0], 1))
    if advantages.shape != log_probs.shape and not per_sequence:
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} do not fit log_probs of shape "
            f"{tuple(log_probs.shape)}: expected per token (same shape) or, for (B, T), per sequence (B, 1) / (B,)"
        )
    use_triton = backend == "triton" or (backend == "auto" and log_probs.device.type == "cuda")
    if use_triton:
        if not _triton_usable(log_probs.device):
            raise ValueError(
                "backend='triton' needs a CUDA tensor, or TRITON_INTERPRET=1 set before openrlhf_band "
                "is imported to run the kernel on CPU in Triton's interpreter"
            )
        from openrlhf_band.ops.band_loss import band_token_loss_triton

        return band_token_loss_triton(
            log_probs, old_log_probs, advantages, action_mask, divergence=divergence, delta=delta,
            upper_cap=upper_cap, relax=relax, dual_clip=dual_clip, return_bounds=return_bounds, bounds=bounds,
        )  # fmt: skip
    if bounds is not None:
        bounds = tuple(torch.as_tensor(b, dtype=torch.float32, device=log_probs.device) for b in bounds)
    return band_token_loss_reference(
        log_probs, old_log_probs, advantages, action_mask, divergence=divergence, delta=delta,
        upper_cap=upper_cap, relax=relax, dual_clip=dual_clip, return_bounds=return_bounds, bounds=bounds,
    )  # fmt: skip
