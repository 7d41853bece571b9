"""Functional API: `band_token_loss`, dispatching between the fused Triton kernel and the torch
reference.

One contract for both backends (each rule is enforced here, before either backend runs, or is
followed by both and held by tests/ops/test_differential.py and tests/ops/test_backend_contract.py):

* a 1-D radius of length B against (B, T) inputs is one radius per sequence, also when B == T;
* the gradient is OpenRLHF's PolicyLoss gradient, ties included (torch.min / torch.max split it
  in half where both branches are equal in float32);
* user-supplied `bounds` with lower > upper at an unmasked position are refused (ValueError);
* float64 log_probs are computed by the torch reference (the kernel computes in float32);
* an unmasked NaN advantage gives a NaN loss and gradient at its token; masked tokens are 0;
* with backend="auto", a kernel that fails to compile or launch falls back to the torch reference
  with one warning per process and kernel variant (`BandKernelFallbackWarning`; the policy lives
  beside the kernel, in `openrlhf_band.ops.fallback`).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from openrlhf_band.band.rules import RULES
from openrlhf_band.band.spec import BandSpec, is_real_number, radius_view, spec_from_keywords
from openrlhf_band.ops.fallback import BandKernelFallbackWarning, run_kernel
from openrlhf_band.ops.reference import band_token_loss_reference
from openrlhf_band.ops.token_loss import BandTokenLoss

BACKENDS = ("auto", "triton", "torch")
__all__ = ["BACKENDS", "BandKernelFallbackWarning", "band_token_loss", "band_token_loss_from_spec"]

def _triton_usable(device: torch.device) -> bool:
    """Whether the kernel can run on `device` at all: CUDA, or CPU under Triton's interpreter
    (TRITON_INTERPRET=1, read at call time)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _auto_uses_kernel(device: torch.device) -> bool:
    """The device rule of backend="auto": the fused kernel for CUDA tensors, the torch reference
    elsewhere (float64 goes to the reference whatever this says). A separate function so that
    tests can make a CPU tensor kernel-eligible under the interpreter (to test the fallback)."""
    return device.type == "cuda"


def _given_bounds(
    bounds: tuple[Tensor | float, Tensor | float], log_probs: Tensor, action_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """User-supplied (lower, upper) as float32 tensors on log_probs' device, checked: they must
    broadcast to log_probs and satisfy lower <= upper at every unmasked position (masked ones may
    hold anything). One host sync per call (the `.any()`), only on this path."""
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError("bounds must be a pair (lower, upper) of tensors or numbers")
    lower, upper = (torch.as_tensor(b, dtype=torch.float32, device=log_probs.device) for b in bounds)
    for name, b in (("lower", lower), ("upper", upper)):
        try:
            torch.broadcast_shapes(b.shape, log_probs.shape)
        except RuntimeError:
            raise ValueError(
                f"bounds: {name} of shape {tuple(b.shape)} does not broadcast to log_probs of shape "
                f"{tuple(log_probs.shape)}"
            ) from None
    # float32 rounding is monotone: lower <= upper before the cast stays true after it
    inverted = (lower > upper).expand(log_probs.shape)
    if action_mask is not None:
        inverted = inverted & (action_mask != 0)
    if bool(inverted.any()):
        n = int(inverted.sum())
        first = tuple(int(i) for i in inverted.nonzero()[0])
        lo_first = float(lower.expand(log_probs.shape)[first])
        hi_first = float(upper.expand(log_probs.shape)[first])
        raise ValueError(
            f"bounds=(lower, upper) has lower > upper at {n} unmasked position(s), first at index {first} "
            f"(lower={lo_first!r}, upper={hi_first!r}): every unmasked token needs lower <= upper. "
            "Check the order of the pair (lower first) and the rule that computed it, or mask those "
            "tokens with action_mask"
        )
    return lower, upper


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
    lower_floor: float | None = None,
    lower_delta: float | None = None,
    ratio_truncation: float | None = None,
) -> BandTokenLoss:
    """Per-token Band surrogate -min(r A, clip(r, r_low(p), r_up(p)) A), dual-clipped when asked.

    r = exp(clamp(log_probs - old_log_probs, -20, 20)) is the ratio pi_theta / pi_old (as in
    OpenRLHF 0.11.2), A the advantage, p = exp(old_log_probs) the old probability.

    Args:
        log_probs: log pi_theta of the sampled tokens (natural log), (B, T) (or any shape; 1-D is
            one row), float32 or bfloat16 (float64: see `backend`), requires grad.
        old_log_probs: log pi_old, same shape, any float dtype; defines p and the band.
        advantages: per token (B, T) or per sequence (B, 1) / (B,). An unmasked NaN advantage gives
            a NaN loss and a NaN gradient at its token (as OpenRLHF's PolicyLoss, on both backends);
            a masked one is ignored (0).
        action_mask: (B, T), bool or 0/1 of any int/float dtype; None = all tokens count.
        divergence, delta, upper_cap, relax: the band, as in `band_bounds`; delta is a number or a
            tensor with no gradient: per token (B, T), or per sequence (B, 1) / (B,). For 2-D
            inputs a 1-D delta of length B is always per sequence, also when B == T.
        dual_clip: c > 1: for A < 0 the objective is floored at c * A (no gradient there).
        backend: "auto": the fused kernel for CUDA tensors of float32 / bfloat16 / float16
            log_probs, the torch reference otherwise (CPU tensors; float64 log_probs, which the
            kernel would compute in float32). If the kernel fails to compile or launch (a Triton
            CompilationError, ptxas error, OutOfResources, no usable driver...), "auto" warns once
            per process and kernel variant (`BandKernelFallbackWarning`) and uses the torch
            reference for that variant from then on. "triton": the kernel (CUDA, or CPU under
            TRITON_INTERPRET=1); float64 log_probs raise ValueError, a kernel failure raises
            RuntimeError chained from Triton's error. "torch": the reference (any device and
            float dtype; float64 computes in float64, e.g. for gradcheck).
        return_bounds: also return the (lower, upper) ratio bounds used (float32).
        bounds: (lower, upper) ratio bounds (tensors broadcastable to the input, or numbers) to use
            instead of the band, as given (no cap or relax): e.g. a fixed clip interval, or a
            probability-dependent rule computed by the caller. lower > upper at an unmasked token
            raises ValueError (masked tokens may hold anything); this check syncs with the device.
        lower_floor: F in (0, 1): every lower bound becomes max(lower, F), after relax (the order of
            `band_bounds`), also for given `bounds` (the one option that applies to them: it is how
            DCPO's rule takes the floor). Tokens clipped only because of it are flagged in
            `floor_clipped`.
        lower_delta: the lower root's radius when it differs from `delta` (asymmetric radii, as
            DPPO's); a number, with a number `delta`.
        ratio_truncation: c > 0: an unclipped token's gradient is -min(r, c) A instead of -r A
            (DPPO's truncated importance weight; verl's clip_ratio_c), also beyond |log r| = 20,
            where OpenRLHF's clamp would stop the gradient (as verl's DPPO: -min(e^+-20, c) A
            there); the loss value is unchanged.

    Returns:
        `BandTokenLoss(loss, clipped_upper, clipped_lower, dual_clipped, lower, upper)`: per-token
        loss (float32, float64 for float64 log_probs on the torch backend; exactly 0 at masked
        positions, never nan/inf there whatever they hold) and boolean flags, each of the input's
        shape. The gradient w.r.t. log_probs is OpenRLHF's PolicyLoss gradient with these bounds,
        including its tie-breaking (half the gradient where r A and clip(r) A, or the dual-clip
        floor, are equal in float32). Aggregation (token-mean etc.) stays with the caller.

    Raises:
        ValueError: invalid arguments or shapes, inverted `bounds`, backend="triton" with float64
            log_probs or on CPU without the interpreter.
        RuntimeError: backend="triton" and the kernel failed to compile or launch.
    """
    spec, radius = spec_from_keywords(divergence, delta, upper_cap=upper_cap, relax=relax, lower_floor=lower_floor,
                                      lower_delta=lower_delta, ratio_truncation=ratio_truncation)  # fmt: skip
    return band_token_loss_from_spec(
        log_probs, old_log_probs, advantages, action_mask, spec, radius=radius, dual_clip=dual_clip, backend=backend,
        return_bounds=return_bounds, bounds=bounds,
    )  # fmt: skip


def band_token_loss_from_spec(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    spec: BandSpec,
    *,
    radius: Tensor | None = None,
    dual_clip: float | None = None,
    backend: str = "auto",
    return_bounds: bool = False,
    bounds: tuple[Tensor | float, Tensor | float] | None = None,
) -> BandTokenLoss:
    """`band_token_loss` with the band as a `BandSpec` (validated when it was built: not again here)
    and `radius`, an optional per-call radius tensor in place of spec.delta (per token (B, T), or
    per sequence (B, 1) / (B,)). A dcpo-rule spec's bounds are DCPO's (then its floor). The other
    arguments, the outputs and the errors are `band_token_loss`'s."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    spec.check_radius(radius)
    if radius is not None:
        radius = radius_view(radius, log_probs)
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
    if bounds is None and not RULES[spec.rule].roots_in_kernel:  # e.g. DCPO's: computed here, handed to the kernel
        bounds = RULES[spec.rule].bounds(spec, old_log_probs, None, False)[:2]  # the loss applies the floor
    if bounds is not None:
        bounds = _given_bounds(bounds, log_probs, action_mask)
    if backend == "triton" and log_probs.dtype == torch.float64:
        raise ValueError("the fused kernel computes in float32; use backend='torch' for float64, e.g. for gradcheck")
    use_triton = backend == "triton" or (
        backend == "auto" and log_probs.dtype != torch.float64 and _auto_uses_kernel(log_probs.device)
    )
    args = (log_probs, old_log_probs, advantages, action_mask)
    options = dict(spec=spec, radius=radius, dual_clip=dual_clip, return_bounds=return_bounds, bounds=bounds)
    if use_triton:
        if not _triton_usable(log_probs.device):
            raise ValueError(
                "backend='triton' needs a CUDA tensor, or TRITON_INTERPRET=1 set before openrlhf_band "
                "is imported to run the kernel on CPU in Triton's interpreter"
            )
        out = run_kernel(args, options, backend)
        if out is not None:
            return out
    return band_token_loss_reference(*args, **options)
