"""Fused Triton kernel for the Band surrogate: log-ratio, band bounds and clipped loss in one pass.

Layout follows Liger-Kernel: the Triton kernels and their launchers, one autograd.Function, and
`band_token_loss_triton` as the thin entry point (the public, backend-dispatching API is
`openrlhf_band.band_token_loss`).

Forward, per token, from one load of (log_probs, old_log_probs, advantage, mask):
    log-ratio clamped to [-20, 20] (as OpenRLHF), ratio, the band [lo, hi] from old_log_probs in
    registers (closed forms for tv / chi2 / hellinger, the cubic table for kl, or bounds that
    `band_bounds` precomputed for any other divergence), the clipped surrogate with optional
    dual-clip, the clip flags, and the gradient coefficient d loss / d log_probs.

Backward stores nothing but that coefficient (float32): grad = upstream * coef. We chose storing
it over both recomputing the forward and storing a 1-byte "unclipped" flag, by bytes moved per token:
    store coef:  forward writes 4 B more; backward reads coef + upstream, writes grad  = 12 B
    1-byte flag: forward writes 1 B more; backward re-reads log_probs, old, adv, mask = 21 B
    recompute:   backward re-reads the same 17 B and solves the band again            = 21 B+
so the coefficient moves the fewest bytes in total (16 vs 22 vs 21+) and leaves a backward that
is a pure streaming multiply. The coefficient is 0 at masked, clipped and dual-clipped tokens and
where the log-ratio clamp is active, so masked positions get exactly 0 whatever upstream holds.

All loads are upcast to float32; offsets are int64 (more than 2^31 tokens are safe); (B, T)
inputs are read through their strides (no copies for non-contiguous views); per-sequence
advantages are read with a zero column stride.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from openrlhf_band.band.bounds import (
    _TABLE_CELLS_PER_UNIT,
    _TABLE_W_MIN,
    _root_table,
    _validate,
    band_bounds,
)
from openrlhf_band.band.divergences import get_divergence, hellinger_angle
from openrlhf_band.ops.reference import LOG_RATIO_CLAMP, BandTokenLoss, broadcast_advantages

# how the kernel gets the band: string options map to integer constexprs
BOUNDS_PRECOMPUTED, BOUNDS_TV, BOUNDS_CHI2, BOUNDS_HELLINGER, BOUNDS_TABLE = 0, 1, 2, 3, 4
_IN_KERNEL_CLOSED_FORMS = {"tv": BOUNDS_TV, "chi2": BOUNDS_CHI2, "hellinger": BOUNDS_HELLINGER}

# 1024 elements per program: enough independent loads in flight to saturate HBM on a GPU, and few
# launches' worth of Python overhead for the CPU interpreter (~20 ms per program there).
_BLOCK = 1024


@triton.jit
def _one_minus_exp(x):
    """1 - exp(x) for x <= 0 without cancellation near 0 (Kahan's expm1 trick; tl.math has no
    expm1 in the CPU interpreter)."""
    u = tl.exp(x)
    um1 = u - 1.0
    safe_log = tl.where((u == 1.0) | (um1 == -1.0), 1.0, tl.log(u))
    expm1 = tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / safe_log))
    return -expm1


@triton.jit
def _band(
    x, lo_ptr, hi_ptr, offs, valid, table_ptr, cells, delta, cos_theta, sin_theta,
    KIND: tl.constexpr, CELLS_PER_UNIT: tl.constexpr, W_MIN: tl.constexpr,
):  # fmt: skip
    """Unclamped band [lo, hi] for x = log p <= 0 (float32), same rules as `band_bounds`."""
    if KIND == 0:
        lo = tl.load(lo_ptr + offs, mask=valid, other=1.0).to(tl.float32)
        hi = tl.load(hi_ptr + offs, mask=valid, other=1.0).to(tl.float32)
    elif KIND == 4:
        # cubic table over w = log(-x): rows c0..c3 of A = log q_up, then of B = p log(1/r_low)
        pos = (tl.log(-x) - W_MIN) * CELLS_PER_UNIT
        pos = tl.where(pos == pos, pos, 0.0)  # nan -> any cell; its output is nan anyway
        pos = tl.minimum(tl.maximum(pos, 0.0), cells * 1.0)
        cell = tl.minimum(tl.floor(pos), cells - 1.0)
        t = pos - cell
        idx = cell.to(tl.int64)
        a = tl.load(table_ptr + 3 * cells + idx, mask=valid, other=0.0)
        a = a * t + tl.load(table_ptr + 2 * cells + idx, mask=valid, other=0.0)
        a = a * t + tl.load(table_ptr + 1 * cells + idx, mask=valid, other=0.0)
        a = a * t + tl.load(table_ptr + idx, mask=valid, other=0.0)
        b = tl.load(table_ptr + 7 * cells + idx, mask=valid, other=0.0)
        b = b * t + tl.load(table_ptr + 6 * cells + idx, mask=valid, other=0.0)
        b = b * t + tl.load(table_ptr + 5 * cells + idx, mask=valid, other=0.0)
        b = b * t + tl.load(table_ptr + 4 * cells + idx, mask=valid, other=0.0)
        # products with 1/sqrt(p), squared: finite wherever the bound is (1/p alone overflows
        # float32 below log p = -88.7 while q_up / p does not until about -91)
        inv_sqrt_p = tl.exp(-0.5 * x)
        hi = tl.exp(0.5 * a) * inv_sqrt_p
        hi = hi * hi
        lo = tl.exp(-b * (inv_sqrt_p * inv_sqrt_p))
    else:
        p = tl.exp(x)
        q1 = _one_minus_exp(x)
        inv_sqrt_p = tl.exp(-0.5 * x)
        inv_p = inv_sqrt_p * inv_sqrt_p
        if KIND == 1:  # tv: 1 -+ delta / p; saturates when 1 - p <= delta / p <= delta
            half = tl.sqrt(delta) * inv_sqrt_p
            half = half * half
            hi = tl.where(q1 <= delta, inv_p, 1.0 + half)
            lo = tl.where(p <= delta, 0.0, 1.0 - half)
        elif KIND == 2:  # chi2: 1 -+ sqrt(delta (1 - p) / p)
            half = tl.sqrt(delta * q1) * inv_sqrt_p
            hi = tl.where(q1 * inv_p <= delta, inv_p, 1.0 + half)
            lo = tl.where(p / q1 <= delta, 0.0, 1.0 - half)
        else:  # hellinger: (sqrt p cos -+ sqrt(1 - p) sin)^2 / p
            along = tl.sqrt(p) * cos_theta
            across = tl.sqrt(q1) * sin_theta
            up = (along + across) * inv_sqrt_p
            down = (along - across) * inv_sqrt_p
            hi = tl.where(2.0 * q1 / (1.0 + tl.sqrt(p)) <= delta, inv_p, up * up)
            lo = tl.where(2.0 * p / (1.0 + tl.sqrt(q1)) <= delta, 0.0, down * down)
        # p = 1 exactly (x = 0) falls out of these formulas as the p -> 1 limits, as in band_bounds
    return lo, hi


@triton.jit
def _band_loss_fwd_kernel(
    logp_ptr, old_ptr, adv_ptr, mask_ptr, lo_ptr, hi_ptr, table_ptr,
    loss_ptr, coef_ptr, flags_ptr, out_lo_ptr, out_hi_ptr,
    n_elements, n_cols,
    logp_s0, logp_s1, old_s0, old_s1, adv_s0, adv_s1, mask_s0, mask_s1,
    cells, delta, cos_theta, sin_theta, upper_cap, relax_lo, relax_hi, dual_clip,
    KIND: tl.constexpr, HAS_MASK: tl.constexpr, HAS_CAP: tl.constexpr, HAS_RELAX: tl.constexpr,
    HAS_DUAL: tl.constexpr, STORE_BOUNDS: tl.constexpr,
    CELLS_PER_UNIT: tl.constexpr, W_MIN: tl.constexpr, LR_CLAMP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_range = offs < n_elements
    row = offs // n_cols
    col = offs - row * n_cols
    valid = in_range
    if HAS_MASK:
        m = tl.load(mask_ptr + row * mask_s0 + col * mask_s1, mask=in_range, other=0)
        valid = in_range & (m != 0)
    # masked lanes load harmless constants, so nothing below can turn garbage into nan
    logp = tl.load(logp_ptr + row * logp_s0 + col * logp_s1, mask=valid, other=0.0).to(tl.float32)
    old = tl.load(old_ptr + row * old_s0 + col * old_s1, mask=valid, other=0.0).to(tl.float32)
    adv = tl.load(adv_ptr + row * adv_s0 + col * adv_s1, mask=valid, other=0.0).to(tl.float32)

    raw = logp - old
    log_ratio = tl.minimum(tl.maximum(raw, -LR_CLAMP), LR_CLAMP)
    ratio = tl.exp(log_ratio)

    x = tl.minimum(old, 0.0)  # log p slightly above 0 from rounding counts as p = 1
    x = tl.where(old == old, x, old)  # keep nan as nan (min(nan, 0) may drop it)
    lo, hi = _band(
        x, lo_ptr, hi_ptr, offs, valid, table_ptr, cells, delta, cos_theta, sin_theta,
        KIND, CELLS_PER_UNIT, W_MIN,
    )  # fmt: skip
    if HAS_RELAX:
        lo = tl.minimum(lo, relax_lo)
        hi = tl.maximum(hi, relax_hi)
    if HAS_CAP:
        hi = tl.minimum(hi, upper_cap)

    surr1 = ratio * adv
    surr2 = tl.minimum(tl.maximum(ratio, lo), hi) * adv
    objective = tl.minimum(surr1, surr2)
    clipped_upper = valid & (adv > 0) & (ratio > hi)
    clipped_lower = valid & (adv < 0) & (ratio < lo)
    # d objective / d log pi = r A on the active unclipped branch; at an exact tie between that
    # branch and the dual-clip floor torch.max (so OpenRLHF) splits the gradient in half
    grad_share = 1.0
    if HAS_DUAL:
        floor = dual_clip * adv
        dual = valid & (adv < 0) & (floor > objective)
        grad_share = tl.where(valid & (adv < 0) & (floor == objective), 0.5, 1.0)
        objective = tl.where(dual, floor, objective)
    else:
        dual = valid & (adv != adv)  # all false, same shape
    loss = tl.where(valid, -objective, 0.0)
    active = valid & ~clipped_upper & ~clipped_lower & ~dual & (raw >= -LR_CLAMP) & (raw <= LR_CLAMP)
    coef = tl.where(active, -ratio * adv * grad_share, 0.0)

    tl.store(loss_ptr + offs, loss, mask=in_range)
    tl.store(coef_ptr + offs, coef, mask=in_range)
    flags = clipped_upper.to(tl.int8) + 2 * clipped_lower.to(tl.int8) + 4 * dual.to(tl.int8)
    tl.store(flags_ptr + offs, flags, mask=in_range)
    if STORE_BOUNDS:
        tl.store(out_lo_ptr + offs, tl.where(valid, lo, 1.0), mask=in_range)
        tl.store(out_hi_ptr + offs, tl.where(valid, hi, 1.0), mask=in_range)


@triton.jit
def _band_loss_bwd_kernel(grad_out_ptr, coef_ptr, grad_in_ptr, n_elements, s0, s1, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_range = offs < n_elements
    coef = tl.load(coef_ptr + offs, mask=in_range, other=0.0)
    row = offs // n_cols
    col = offs - row * n_cols
    # upstream is only read where the coefficient is non-zero: 0 * nan must not leak into masked tokens
    grad_out = tl.load(grad_out_ptr + row * s0 + col * s1, mask=in_range & (coef != 0.0), other=0.0)
    grad = tl.where(coef != 0.0, grad_out.to(tl.float32) * coef, 0.0)
    tl.store(grad_in_ptr + offs, grad.to(grad_in_ptr.dtype.element_ty), mask=in_range)


def _as_2d(t: Tensor, shape: torch.Size) -> Tensor:
    """A (B, T) view of t (1-D tensors become (1, T)); strides are passed to the kernel."""
    return t.reshape(shape) if t.dim() != 2 else t


class BandLossFunction(torch.autograd.Function):
    """Autograd glue: forward runs the fused kernel, backward multiplies by the stored coefficient."""

    @staticmethod
    def forward(ctx, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, action_mask, config):
        loss, coef, flags, lower, upper = _launch_forward(log_probs, old_log_probs, advantages, action_mask, config)
        ctx.save_for_backward(coef)
        ctx.log_probs_dtype, ctx.log_probs_shape = log_probs.dtype, log_probs.shape
        ctx.mark_non_differentiable(flags)
        if lower is not None:
            ctx.mark_non_differentiable(lower, upper)
        return loss, flags, lower, upper

    @staticmethod
    def backward(ctx, grad_loss, _grad_flags, _grad_lower, _grad_upper):
        (coef,) = ctx.saved_tensors
        grad = torch.empty(coef.shape, dtype=ctx.log_probs_dtype, device=coef.device)
        grad_loss = grad_loss.reshape(coef.shape) if grad_loss.dim() != 2 else grad_loss
        n = coef.numel()
        if n:
            _band_loss_bwd_kernel[(triton.cdiv(n, _BLOCK),)](
                grad_loss,
                coef,
                grad,
                n,
                grad_loss.stride(0),
                grad_loss.stride(1),
                coef.shape[1],
                BLOCK=_BLOCK,
            )
        return grad.reshape(ctx.log_probs_shape), None, None, None, None


def _launch_forward(log_probs, old_log_probs, advantages, action_mask, config):
    divergence, delta, upper_cap, relax, dual_clip, return_bounds, given_bounds = config
    shape2d = log_probs.shape if log_probs.dim() == 2 else torch.Size((1, log_probs.numel()))
    logp = _as_2d(log_probs, shape2d)
    old = _as_2d(old_log_probs, shape2d)
    if advantages.shape == log_probs.shape:
        adv = advantages.reshape(shape2d)
    else:  # per sequence: (B,) or (B, 1) against (B, T), validated by the dispatcher
        adv = broadcast_advantages(advantages, shape2d)
    n = logp.numel()
    device = logp.device
    loss = torch.empty(shape2d, dtype=torch.float32, device=device)
    coef = torch.empty(shape2d, dtype=torch.float32, device=device)
    flags = torch.empty(shape2d, dtype=torch.int8, device=device)
    out_lo = torch.empty(shape2d, dtype=torch.float32, device=device) if return_bounds else loss
    out_hi = torch.empty(shape2d, dtype=torch.float32, device=device) if return_bounds else loss

    kind = _IN_KERNEL_CLOSED_FORMS.get(divergence)
    table, cells = loss, 1
    lo_pre = hi_pre = loss
    if given_bounds is not None:
        kind = BOUNDS_PRECOMPUTED
        lo_pre, hi_pre = given_bounds
    elif kind is None and get_divergence(divergence).tabulate:
        kind = BOUNDS_TABLE
        table = _float32_table(divergence, delta, device)
        cells = table.shape[1]
    elif kind is None:  # any other divergence: bounds from the torch operator, read by the kernel
        kind = BOUNDS_PRECOMPUTED
        lo_pre, hi_pre = (b.contiguous() for b in band_bounds(old, divergence, delta))
    cos_theta, sin_theta = hellinger_angle(delta)

    if action_mask is not None:
        mask = action_mask.reshape(shape2d) if action_mask.dim() != 2 else action_mask
        mask = mask.expand(shape2d)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8) if mask.is_contiguous() else mask.to(torch.uint8)
        mask_strides = mask.stride()
    else:
        mask, mask_strides = loss, (0, 0)

    if n:
        _band_loss_fwd_kernel[(triton.cdiv(n, _BLOCK),)](
            logp, old, adv, mask, lo_pre, hi_pre, table,
            loss, coef, flags, out_lo, out_hi,
            n, shape2d[1],
            logp.stride(0), logp.stride(1), old.stride(0), old.stride(1),
            adv.stride(0), adv.stride(1), mask_strides[0], mask_strides[1],
            cells, float(delta), cos_theta, sin_theta,
            float(upper_cap) if upper_cap is not None else math.inf,
            1.0 - float(relax[0]) if relax is not None else 1.0,
            1.0 + float(relax[1]) if relax is not None else 1.0,
            float(dual_clip) if dual_clip is not None else 0.0,
            KIND=kind, HAS_MASK=action_mask is not None, HAS_CAP=upper_cap is not None,
            HAS_RELAX=relax is not None, HAS_DUAL=dual_clip is not None, STORE_BOUNDS=return_bounds,
            CELLS_PER_UNIT=_TABLE_CELLS_PER_UNIT, W_MIN=_TABLE_W_MIN, LR_CLAMP=LOG_RATIO_CLAMP, BLOCK=_BLOCK,
        )  # fmt: skip
    shape = log_probs.shape
    bounds = (out_lo.reshape(shape), out_hi.reshape(shape)) if return_bounds else (None, None)
    return loss.reshape(shape), coef, flags.reshape(shape), *bounds


@functools.lru_cache(maxsize=64)
def _float32_table(divergence: str, delta: float, device: torch.device) -> Tensor:
    """The float64 band table (built once on the CPU) as float32 on `device`, for the kernel."""
    return _root_table(divergence, delta, torch.device("cpu")).float().to(device).contiguous()


def band_token_loss_triton(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    *,
    divergence: str = "kl",
    delta: float = 0.05,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    dual_clip: float | None = None,
    return_bounds: bool = False,
    bounds: tuple[Tensor | float, Tensor | float] | None = None,
) -> BandTokenLoss:
    """The fused kernel path of `openrlhf_band.band_token_loss` (same arguments and outputs)."""
    _validate(divergence, delta, upper_cap, relax)
    if bounds is not None:  # used as given: the kernel reads them, no cap or relax on top
        shape2d = log_probs.shape if log_probs.dim() == 2 else torch.Size((1, log_probs.numel()))
        bounds = tuple(
            torch.as_tensor(b, dtype=torch.float32, device=log_probs.device).expand(log_probs.shape)
            .reshape(shape2d).contiguous()
            for b in bounds
        )  # fmt: skip
        upper_cap = relax = None
    config = (divergence, float(delta), upper_cap, relax, dual_clip, return_bounds, bounds)
    loss, flags, lower, upper = BandLossFunction.apply(log_probs, old_log_probs, advantages, action_mask, config)
    return BandTokenLoss(loss, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0, lower, upper)
