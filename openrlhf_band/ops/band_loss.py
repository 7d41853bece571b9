"""Fused Triton kernel for the Band surrogate: log-ratio, band bounds and clipped loss in one pass.

Layout follows Liger-Kernel: the Triton kernels and their launchers, one autograd.Function, and
`band_token_loss_triton` as the thin entry point (the public, backend-dispatching API is
`openrlhf_band.band_token_loss`).

Forward, per token, from one load of (log_probs, old_log_probs, advantage, mask, delta):
    log-ratio clamped to [-20, 20] (as OpenRLHF), ratio, the band [lo, hi] from old_log_probs in
    registers for every built-in divergence, the clipped surrogate with optional dual-clip, the
    clip flags (four bool planes, `FORWARD_FLAG_BYTES_PER_TOKEN`, returned as they are), and the gradient
    coefficient d loss / d log_probs.

How the band is computed, chosen by bytes and flops per token on a GPU (an H200 moves ~4.8 TB/s
and does ~34 fp64 / ~67 fp32 TFLOP/s; plain PPO clipping is memory-bound at ~34 B/token, forward
plus backward, i.e. ~7 ns per 1,000 tokens):
* The band is evaluated in float64 and rounded once to float32. The cost is a few dozen fp64
  instructions per token, well under the time its bytes take to arrive; float32 would not be exact
  enough: the kl table stores log q up to |40| for p = 1e-20, where one float32 ulp of it is 4e-6 in
  the ratio, and 1 - delta / p cancels just above tv's saturation edge. The returned bounds agree
  with 60-digit roots to float32 rounding (~6e-8 relative, tests/ops: <= 1e-6 max(exact, 1)).
* tv, chi2, hellinger: closed forms (hellinger's half-angle without trigonometry, cos = 1 - d/2,
  sin = sqrt(d (4 - d)) / 2), scalar or per-token delta alike: ~10 fp64 ops, no extra bytes
  beyond a per-token delta's 4.
* kl and reverse_kl with a scalar delta: one cubic Hermite table per (divergence, delta) shared by
  all tokens (kl over w = log(-log p); reverse_kl over the log-distance to each saturation edge,
  see `band_bounds`), 8 fp64 coefficients of 2 x ~1,200-3,400 cells (< 220 KiB, L2-resident):
  two 32-byte gathers from L2 and two Horner evaluations per token, no iterations. Memory-bound
  like clipping.
* kl and reverse_kl with a per-token delta: no 1-D table covers a continuum of deltas, so each root
  starts from a 2-D float32 table over (the table coordinate, log delta) shared by all radii in
  `PER_TOKEN_DELTA_RANGE` (~300-400 KiB, L2-resident; four 4-byte gathers per root), then two Halley
  steps in float64 (both roots as lower roots: the upper root's 1 - q is the lower root of the
  mirrored pair), the same table and steps as `band_bounds`. Measured from the compiled code (sm_90):
  ~910-980 float64 SASS instructions per token (the bisection + Newton solver it replaced: ~6,300),
  118-124 registers at 2 tokens per thread, no spills, 0.75-1.75 CPU s to compile (it was 255 registers,
  ~600 B of spills and 40-110 s). Compute-bound on a GPU (docs/kernel.md has the roofline
  estimate; not measured: no GPU was lent).
* Any other registered divergence: bounds precomputed by `band_bounds` and read (8 B/token more).

Options beyond the band, all in registers (no extra bytes per token): relax's union, the lower floor
max(lo, F) after it (a float32 scalar; the fourth flag marks a token clipped below only because of the
floor), the upper cap, asymmetric radii (the lower root's radius as one float64 scalar for the closed
forms, or the lower rows of its own table for kl / reverse_kl, whose coordinates are the same), and
DPPO's ratio truncation (gradient weight min(r, c), which also passes beyond the log-ratio clamp, as
verl's DPPO does).

Exact clip decisions at the simplex edge: where hi is the edge 1/p itself (a saturated bound, or
p = 1), the upper clip is decided in log space, log r > -log p (q > 1), which is exact; comparing
float32 r = exp(log q - log p) at q = 1 against float32(1/p) can land one ulp above it.

Backward stores nothing but the gradient coefficient (float32): grad = upstream * coef. We chose
storing it over both recomputing the forward and storing a 1-byte "unclipped" flag, by bytes moved
per token:
    store coef:  forward writes 4 B more; backward reads coef + upstream, writes grad  = 12 B
    1-byte flag: forward writes 1 B more; backward re-reads log_probs, old, adv, mask = 21 B
    recompute:   backward re-reads the same 17 B and solves the band again            = 21 B+
so the coefficient moves the fewest bytes in total (16 vs 22 vs 21+) and leaves a backward that
is a pure streaming multiply. The coefficient is 0 at masked, clipped and dual-clipped tokens and
where the log-ratio clamp is active, so masked positions get exactly 0 whatever upstream holds. A backward
kernel that fails to compile or launch is handled as the forward's (`fallback.run_backward_kernel`): with
backend "auto" torch applies the same rule (warned once), with "triton" it raises.

All loads are upcast (float32, float64 for the radius); offsets are int64 (more than 2^31 tokens
are safe); (B, T) inputs are read through their strides (no copies for non-contiguous views);
per-sequence advantages and radii are read with a zero column stride, a scalar radius with zero
strides. A per-token radius that is <= 0, nan or inf, or for kl / reverse_kl outside
PER_TOKEN_DELTA_RANGE, gives nan bounds for its token (masked tokens load 0.05 and stay exactly 0).
NaN is handled as the torch reference handles it on every device: tl.minimum / tl.maximum on a value
derived from the inputs pass propagate_nan=ALL (or sit behind an explicit v == v guard), because on a GPU
they default to PTX min / max, which drop NaN, while Triton's interpreter keeps it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from openrlhf_band.band.bounds import (
    HALLEY_STEPS,
    PER_TOKEN_DELTA_RANGE,
    per_token_start_table,
    scalar_delta_table,
    spec_bounds_with_edge,
)
from openrlhf_band.band.spec import BandSpec, radius_view
from openrlhf_band.ops.fallback import backward_kernel_variant, run_backward_kernel
from openrlhf_band.ops.token_loss import LOG_RATIO_CLAMP, BandTokenLoss, broadcast_advantages

# how the kernel gets the band: string options map to integer constexprs
BOUNDS_PRECOMPUTED, BOUNDS_TV, BOUNDS_CHI2, BOUNDS_HELLINGER = 0, 1, 2, 3
BOUNDS_KL_TABLE, BOUNDS_EDGE_TABLE, BOUNDS_KL_SOLVE, BOUNDS_REVERSE_KL_SOLVE = 4, 5, 6, 7
BOUNDS_KINDS = (
    BOUNDS_PRECOMPUTED, BOUNDS_TV, BOUNDS_CHI2, BOUNDS_HELLINGER,
    BOUNDS_KL_TABLE, BOUNDS_EDGE_TABLE, BOUNDS_KL_SOLVE, BOUNDS_REVERSE_KL_SOLVE,
)  # fmt: skip
_IN_KERNEL_CLOSED_FORMS = {"tv": BOUNDS_TV, "chi2": BOUNDS_CHI2, "hellinger": BOUNDS_HELLINGER}
_IN_KERNEL_SOLVERS = {"kl": BOUNDS_KL_SOLVE, "reverse_kl": BOUNDS_REVERSE_KL_SOLVE}
_IN_KERNEL_TABLES = {"kl": BOUNDS_KL_TABLE, "reverse_kl": BOUNDS_EDGE_TABLE}

# Bytes the forward kernel stores per token for the four flags (clipped_upper, clipped_lower, dual_clipped,
# floor_clipped): one bool byte each, in planes [4, n] that are returned as they are, with no kernels after it.
# bench/ imports it to count the kernel's real bytes per token.
FORWARD_FLAG_BYTES_PER_TOKEN = 4

# 1024 elements per program: enough independent loads in flight to saturate HBM on a GPU, and few
# launches' worth of Python overhead for the CPU interpreter (~20 ms per program there).
_BLOCK = 1024
# Warps per program, from the ahead-of-time resource table (`openrlhf-band aot`, sm_80-sm_120, triton
# 3.6.0 / 3.7.1 / 3.9.0; bench/results/aot_triton-*.csv and docs/kernel.md). An H200 SM must keep ~25 KB
# of loads in flight to stream at its share of 4.8 TB/s (~18 B per cycle x ~1,400 cycles of latency);
# a forward token loads 13-17 B, so ~1,500-2,000 tokens per SM.
# * memory-bound forwards: 16 warps (2 tokens per thread, 32-64 registers at sm_90, 2-4 blocks of 512
#   threads per SM: 2,048-4,096 tokens, ~30-60 KB in flight; hellinger 66-76 registers, one block)
#   or 8 warps (4 tokens per thread, 64-128 registers, 2-4 blocks of 256 threads: as many tokens in
#   flight). Either streams; what decides is
#   where ptxas spills a register or two: at 8 warps 4 B at sm_120 for hellinger (triton 3.7.1) and kl
#   with bf16 inputs (3.9.0), at 16 warps 8 B at sm_100 for tv with every option and reverse_kl's
#   table with bf16 inputs (3.6.0). So tv and reverse_kl's table take 8 warps, the rest 16: no spill
#   on any target under any of the three. (At 4 warps, 8 tokens per thread: 166-255 registers.)
# * the per-token kl / reverse_kl solves (~900-1,000 float64 instructions per token, compute-bound:
#   6-7x their memory time on an H200 by docs/kernel.md's roofline) at 16 warps: 118-124 registers,
#   no spills, one block of 512 threads per SM. At 8 warps they took 218-234 registers (one block
#   of 256 threads: half the warps to hide float64 latency), at 32 warps the 64-register cap spilled.
# * backward (a streaming multiply, 12 B per token): 4 warps, 8 tokens per thread, 54-56 registers,
#   9 blocks per SM.
# The CPU interpreter ignores warps; its cost is per program, hence one BLOCK for all.
_FORWARD_WARPS = 16
_EIGHT_WARP_KINDS = (BOUNDS_TV, BOUNDS_EDGE_TABLE)
_BACKWARD_WARPS = 4
# hellinger's register ceiling for ptxas (Triton's `maxnreg`, a CUDA option): what one program may use and still
# fit on an SM, 65,536 registers / 512 threads = 128. Left to itself ptxas sets a lower budget from a guess at
# occupancy: with every option and a tensor radius, hellinger needs about 64-66 registers, and ptxas squeezed it
# into 64 (two programs per SM) at sm_80 and sm_89, where the per-token radius spilled 8 B a thread (triton 3.7.1).
# Told the real ceiling it takes 66 there and spills nothing, at one program per SM (as every hellinger variant
# without those options has: 66-77 registers). The cost: the per-sequence twin, which had fit 64 registers
# without a spill at sm_80, sm_89 and sm_90, also goes to 66 and one program (9 (variant, target) pairs); kept,
# because 64 is the edge where its per-token twin spilled. Only hellinger: for the other kinds the same ceiling
# (128 at 16 warps, 255 at 8) removes no spill and costs occupancy in 82 pairs (bench/results/
# aot_register_ceiling_triton-3.7.1.*, docs/kernel.md#warps-and-tokens-per-thread). AMD's backend has no
# `maxnreg` (Triton refuses the keyword), so a ROCm build of torch launches without it. Since the flag planes
# and NaN rules of issue 61, ptxas left to itself gives that variant 70 registers and no spill at sm_80 and sm_89
# (triton 3.7.1): the ceiling stays, as the guard against the squeeze, measured before that change.
_CEILING_KINDS = (BOUNDS_HELLINGER,)
_MAX_REGISTERS_PER_SM = 65536
_CUDA_ONLY_LAUNCH_OPTIONS = ("maxnreg",)


def _forward_launch_options(kind: int, cuda: bool = True) -> dict[str, int]:
    """num_warps (and, on CUDA for the kinds in _CEILING_KINDS, maxnreg) of the forward kernel for a bounds kind."""
    warps = 8 if kind in _EIGHT_WARP_KINDS else _FORWARD_WARPS
    if kind not in _CEILING_KINDS or not cuda:
        return {"num_warps": warps}
    return {"num_warps": warps, "maxnreg": min(255, _MAX_REGISTERS_PER_SM // (warps * 32))}


@triton.jit
def _one_minus_exp(x):
    """1 - exp(x) for x <= 0 without cancellation near 0 (Kahan's expm1 trick; tl.math has no
    expm1 in the CPU interpreter). Works in the dtype of x."""
    u = tl.exp(x)
    um1 = u - 1.0
    safe_log = tl.where((u == 1.0) | (um1 == -1.0), 1.0, tl.log(u))
    expm1 = tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / safe_log))
    return -expm1


@triton.jit
def _horner(table_ptr, first_row, cells, idx, t, valid):
    """((c3 t + c2) t + c1) t + c0 from rows first_row..first_row + 3 of a float64 [8, cells] table."""
    v = tl.load(table_ptr + (first_row + 3) * cells + idx, mask=valid, other=0.0)
    v = v * t + tl.load(table_ptr + (first_row + 2) * cells + idx, mask=valid, other=0.0)
    v = v * t + tl.load(table_ptr + (first_row + 1) * cells + idx, mask=valid, other=0.0)
    return v * t + tl.load(table_ptr + first_row * cells + idx, mask=valid, other=0.0)


@triton.jit
def _table_position(u, u_min, cells_per_unit, cells):
    """(cell index, t in [0, 1]) of a float64 coordinate u; nan lands anywhere (its output is masked)."""
    pos = (u - u_min) * cells_per_unit
    pos = tl.minimum(tl.maximum(tl.where(pos == pos, pos, 0.0), 0.0), cells * 1.0)
    cell = tl.minimum(tl.floor(pos), cells - 1.0)
    return cell.to(tl.int64), pos - cell


@triton.jit
def _log_one_minus(q):
    """(1 - q, log(1 - q)) for q in [0, 1), float64: log(1 - q) by Kahan's log1p trick (no log1p in
    the CPU interpreter), accurate for small q where log(1 - q) ~ -q; 1 - q is exact for q >= 1/2."""
    w = 1.0 - q
    safe = tl.where(w == 1.0, 0.5, w)
    return w, tl.where(w == 1.0, -q, tl.log(safe) * (-q / (safe - 1.0)))


@triton.jit
def _started_lower_log_root(
    x, p, one_minus_p, log_one_minus_p, delta, log_delta, start_ptr, rows, cols,
    c_min, c_per_unit, s_min, s_per_unit, valid, REVERSE: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """log q of the lower root (q < p) of g(p, q) = delta, float64: a bilinear read of the float32
    start table over (c, log delta), then STEPS Halley steps kept in [x - 2 b0, x - b0 / 2]; the
    same table and steps as `band.bounds._halley_lower_log_root` (kl: REVERSE=False)."""
    if REVERSE:  # log-distance to the lower saturation edge g(p, 0) = -log(1 - p); nan where saturated
        c = tl.log(-log_one_minus_p - delta)
    else:
        c = tl.log(-x)
    pc = (c - c_min) * c_per_unit
    pc = tl.minimum(tl.maximum(tl.where(pc == pc, pc, 0.0), 0.0), rows - 1.0)
    ps = (log_delta - s_min) * s_per_unit
    ps = tl.minimum(tl.maximum(tl.where(ps == ps, ps, 0.0), 0.0), cols - 1.0)
    i = tl.minimum(tl.floor(pc), rows - 2.0)
    j = tl.minimum(tl.floor(ps), cols - 2.0)
    tc = pc - i
    ts = ps - j
    corner = i.to(tl.int64) * cols + j.to(tl.int64)
    v00 = tl.load(start_ptr + corner, mask=valid, other=0.0).to(tl.float64)
    v01 = tl.load(start_ptr + corner + 1, mask=valid, other=0.0).to(tl.float64)
    v10 = tl.load(start_ptr + corner + cols, mask=valid, other=0.0).to(tl.float64)
    v11 = tl.load(start_ptr + corner + cols + 1, mask=valid, other=0.0).to(tl.float64)
    v0 = v00 + (v01 - v00) * ts
    v1 = v10 + (v11 - v10) * ts
    b = tl.exp(v0 + (v1 - v0) * tc)
    if not REVERSE:  # kl stores log(p b)
        b = b / p
    # b ~ delta / p overflows for p < ~1e-300; any b that large gives q = 0 (nan stays nan, as torch.clamp)
    b = tl.minimum(b, 1e300, propagate_nan=tl.PropagateNan.ALL)
    log_q = x - b
    lo = x - 2.0 * b  # the bracket [b0 / 2, 2 b0] of band.bounds._START_BRACKET
    hi = x - 0.5 * b
    for _ in tl.static_range(STEPS):
        q = tl.exp(log_q)
        one_minus_q, log_one_minus_q = _log_one_minus(q)
        if REVERSE:
            xlogx = tl.where(one_minus_q > 0.0, one_minus_q * log_one_minus_q, 0.0)
            f = q * (log_q - x) + xlogx - one_minus_q * log_one_minus_p - delta
            d1 = q * ((log_q - x) - (log_one_minus_q - log_one_minus_p))
            d2 = d1 + q / one_minus_q
        else:
            f = p * (x - log_q) + one_minus_p * (log_one_minus_p - log_one_minus_q) - delta
            d1 = (q - p) / one_minus_q
            d2 = q * one_minus_p / (one_minus_q * one_minus_q)
        step = f / d1
        # Halley: the Newton step over 1 - f f'' / (2 f'^2), the divisor kept >= 1/2 far from the root and
        # where it is nan (an infinite Newton step, p below ~1e-308, times f'' = 0 at q = 0), as band_bounds
        divisor = 1.0 - 0.5 * step * d2 / d1
        step = step / tl.where(divisor >= 0.5, divisor, 0.5)
        # torch.minimum / torch.maximum's rule: a nan step or bracket gives a nan log q (PTX min / max would drop it)
        log_q = tl.minimum(tl.maximum(log_q - step, lo, propagate_nan=tl.PropagateNan.ALL), hi,
                           propagate_nan=tl.PropagateNan.ALL)  # fmt: skip
    return log_q


@triton.jit
def _band(
    x, delta, delta_lo, lo_ptr, hi_ptr, offs, valid, table_ptr, cells, u_min, cells_per_unit,
    rows, cols, s_min, s_per_unit, KIND: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """Unclamped band [lo, hi] and `at_edge` (hi is the simplex edge 1/p itself) for x = log p <= 0,
    with the rules of `band_bounds`; the lower root at radius delta_lo (asymmetric radii: a scalar;
    else delta itself; the tables carry it in their lower rows). x and delta are float64 (delta per
    token, or the scalar); the
    band is computed in float64 (cancellation in 1 - delta / p, in log q - log p for p ~ 1e-20,
    in the solver's residual) and returned as float32."""
    inv_p = tl.exp(-x)  # float64: finite down to log p = -709 (float32 inputs stop at -104)
    if KIND == 0:
        lo = tl.load(lo_ptr + offs, mask=valid, other=1.0).to(tl.float64)
        hi = tl.load(hi_ptr + offs, mask=valid, other=1.0).to(tl.float64)
        at_edge = x != x  # bounds used as given: nothing known about the edge (all false)
    elif KIND == 4:  # kl, scalar delta: cubic table over w = log(-log p) of A = log q_up, B = p log(1/r_low)
        idx, t = _table_position(tl.log(-x), u_min, cells_per_unit, cells)
        hi = tl.exp(_horner(table_ptr, 0, cells, idx, t, valid) - x)
        lo = tl.exp(-_horner(table_ptr, 4, cells, idx, t, valid) * inv_p)
        at_edge = x == 0.0  # p = 1: the table's end value is the limit 1 = 1/p
    elif KIND == 5:  # reverse_kl, scalar delta: tables over the log-distance to each saturation edge
        distance_up = -x - delta
        idx, t = _table_position(tl.log(distance_up), u_min, cells_per_unit, cells)
        at_edge = distance_up <= 0.0
        hi = tl.where(at_edge, inv_p, tl.exp(_horner(table_ptr, 0, cells, idx, t, valid) - x))
        distance_low = -tl.log(_one_minus_exp(x)) - delta_lo
        idx, t = _table_position(tl.log(distance_low), u_min, cells_per_unit, cells)
        lo = tl.where(distance_low <= 0.0, 0.0, tl.exp(_horner(table_ptr, 4, cells, idx, t, valid) - x))
    elif KIND >= 6:  # kl / reverse_kl, per-token delta: start table + Halley steps, both roots as lower roots
        p = tl.exp(x)
        one_minus_p = _one_minus_exp(x)
        # log(1 - p) accurate for small p too (Kahan), as band_bounds: at p ~ delta ~ 1e-8 it decides the root
        _w, small_p_log = _log_one_minus(p)
        log_one_minus_p = tl.where(p < 0.5, small_p_log, tl.log(one_minus_p))
        log_delta = tl.log(delta)
        lower_log_q = _started_lower_log_root(
            x, p, one_minus_p, log_one_minus_p, delta, log_delta, table_ptr, rows, cols,
            u_min, cells_per_unit, s_min, s_per_unit, valid, KIND == 7, STEPS,
        )  # fmt: skip
        # the upper root's 1 - q_up is the lower root of the mirrored pair (1 - p, 1 - q)
        upper_log_1mq = _started_lower_log_root(
            log_one_minus_p, one_minus_p, p, x, delta, log_delta, table_ptr, rows, cols,
            u_min, cells_per_unit, s_min, s_per_unit, valid, KIND == 7, STEPS,
        )  # fmt: skip
        lo = tl.where(p == 0.0, 0.0, tl.exp(lower_log_q - x))  # p = 0: [0, inf]
        hi = tl.where(p == 0.0, float("inf"), _one_minus_exp(upper_log_1mq) * inv_p)
        at_edge = x == 0.0
        if KIND == 7:  # reverse_kl saturates (Proposition 3)
            at_edge = -x <= delta
            hi = tl.where(at_edge, inv_p, hi)
            lo = tl.where(-log_one_minus_p <= delta, 0.0, lo)
    else:
        p = tl.exp(x)
        q1 = _one_minus_exp(x)
        if KIND == 1:  # tv: 1 -+ delta / p
            upper = 1.0 + delta * inv_p
            lower = 1.0 - delta_lo * inv_p
            at_edge = q1 <= delta
            lo = tl.where(p <= delta_lo, 0.0, lower)
        elif KIND == 2:  # chi2: 1 -+ sqrt(delta (1 - p) / p)
            upper = 1.0 + tl.sqrt(delta * q1 * inv_p)
            at_edge = q1 * inv_p <= delta
            lo = tl.where(p / q1 <= delta_lo, 0.0, 1.0 - tl.sqrt(delta_lo * q1 * inv_p))
        else:  # hellinger: (sqrt p cos -+ sqrt(1 - p) sin)^2 / p, cos = 1 - d / 2, sin = sqrt(d (4 - d)) / 2
            d = tl.minimum(delta, 4.0, propagate_nan=tl.PropagateNan.ALL)  # a nan radius stays nan (torch.clamp)
            along = tl.sqrt(p) * (1.0 - 0.5 * d)
            across = tl.sqrt(q1) * (0.5 * tl.sqrt(d * (4.0 - d)))
            upper = (along + across) * (along + across) * inv_p
            at_edge = 2.0 * q1 / (1.0 + tl.sqrt(p)) <= delta
            d_lo = tl.minimum(delta_lo, 4.0, propagate_nan=tl.PropagateNan.ALL)
            along_lo = tl.sqrt(p) * (1.0 - 0.5 * d_lo)
            across_lo = tl.sqrt(q1) * (0.5 * tl.sqrt(d_lo * (4.0 - d_lo)))
            lo = tl.where(2.0 * p / (1.0 + tl.sqrt(q1)) <= delta_lo, 0.0,
                          (along_lo - across_lo) * (along_lo - across_lo) * inv_p)  # fmt: skip
        hi = tl.where(at_edge, inv_p, upper)
        # p = 1 exactly (x = 0) falls out of these formulas as the p -> 1 limits, as in band_bounds
        at_edge = at_edge | (x == 0.0)
    if KIND >= 4:
        # p = 1 exactly: the p -> 1 limits (solved roots meet 0 / 0 there)
        lo = tl.where(x == 0.0, _lower_at_p_one(delta_lo, KIND), lo)
        hi = tl.where(x == 0.0, 1.0, hi)
    lo32 = lo.to(tl.float32)
    hi32 = hi.to(tl.float32)
    if KIND != 0:
        # a bound that rounds to the edge is the edge (kl's upper root is within (1 - p) e^(-delta / (1 - p))
        # of 1/p as p -> 1, below float32 resolution): decided in log space like a saturated one
        at_edge = at_edge | (hi32 >= inv_p.to(tl.float32))
    return lo32, hi32, at_edge


@triton.jit
def _lower_at_p_one(delta, KIND: tl.constexpr):
    if KIND == 4 or KIND == 6:  # kl: exp(-delta)
        return tl.exp(-delta)
    else:  # reverse_kl: 1
        return delta * 0.0 + 1.0


@triton.jit
def _band_loss_fwd_kernel(
    logp_ptr, old_ptr, adv_ptr, mask_ptr, delta_ptr, lower_delta_ptr, lo_ptr, hi_ptr, table_ptr,
    loss_ptr, coef_ptr, flags_ptr, out_lo_ptr, out_hi_ptr,
    n_elements, n_cols,
    logp_s0, logp_s1, old_s0, old_s1, adv_s0, adv_s1, mask_s0, mask_s1, delta_s0, delta_s1,
    cells, u_min, cells_per_unit, rows, s_min, s_per_unit, delta_min, delta_max,
    upper_cap, relax_lo, relax_hi, dual_clip, lower_floor, ratio_truncation,
    KIND: tl.constexpr, HAS_MASK: tl.constexpr, HAS_CAP: tl.constexpr, HAS_RELAX: tl.constexpr,
    HAS_DUAL: tl.constexpr, HAS_FLOOR: tl.constexpr, HAS_LOWER_DELTA: tl.constexpr, HAS_TRUNC: tl.constexpr,
    STORE_BOUNDS: tl.constexpr, STEPS: tl.constexpr,
    LR_CLAMP: tl.constexpr, BLOCK: tl.constexpr,
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
    # the radius: per token, per sequence (zero column stride) or the scalar (both strides zero)
    delta = tl.load(delta_ptr + row * delta_s0 + col * delta_s1, mask=valid, other=0.05).to(tl.float64)
    if HAS_LOWER_DELTA:  # asymmetric radii: one float64 scalar for the lower root (a scalar delta only)
        delta_lo = tl.load(lower_delta_ptr).to(tl.float64)
    else:
        delta_lo = delta

    raw = logp - old
    # OpenRLHF's torch.clamp keeps nan (PTX min / max would drop it)
    log_ratio = tl.where(raw == raw, tl.minimum(tl.maximum(raw, -LR_CLAMP), LR_CLAMP), raw)
    ratio = tl.exp(log_ratio)

    # log p slightly above 0 from rounding counts as p = 1; nan stays nan (PTX min would drop it)
    x = tl.where(old == old, tl.minimum(old, 0.0), old)
    lo, hi, at_edge = _band(
        x.to(tl.float64), delta, delta_lo, lo_ptr, hi_ptr, offs, valid, table_ptr, cells, u_min, cells_per_unit,
        rows, cells, s_min, s_per_unit, KIND, STEPS,
    )  # fmt: skip
    # a per-token radius <= 0, nan, inf, or outside the per-token solver's range: a nan band
    bad_delta = ~(delta > 0.0) | ~(delta >= delta_min) | ~(delta <= delta_max) | (delta == float("inf"))
    lo = tl.where(bad_delta, float("nan"), lo)
    hi = tl.where(bad_delta, float("nan"), hi)
    at_edge = at_edge & ~bad_delta
    # relax, floor and cap keep a nan bound nan, as torch.clamp does in band_bounds: on a GPU tl.minimum /
    # tl.maximum default to PropagateNan.NONE (PTX min / max: min(nan, 10) = 10), in the interpreter to numpy's
    # nan-keeping ones, so every min / max on an input-derived value says ALL (tests/ops/test_kernel_nan_semantics.py)
    if HAS_RELAX:
        lo = tl.minimum(lo, relax_lo, propagate_nan=tl.PropagateNan.ALL)
        at_edge = at_edge & (hi >= relax_hi)
        hi = tl.maximum(hi, relax_hi, propagate_nan=tl.PropagateNan.ALL)
    band_lo = lo
    if HAS_FLOOR:  # after relax, as band_bounds; a nan bound stays nan (torch.clamp's rule)
        lo = tl.maximum(lo, lower_floor, propagate_nan=tl.PropagateNan.ALL)
    if HAS_CAP:
        at_edge = at_edge & (hi <= upper_cap)
        hi = tl.minimum(hi, upper_cap, propagate_nan=tl.PropagateNan.ALL)
    # at the simplex edge hi = 1/p the clip decision is made where it is exact, in log space:
    # log r > -log p, i.e. q > 1 (float32 exp(log q - log p) at q = 1 can round above float32(1/p))
    hi_loss = tl.where(at_edge & (log_ratio <= -x), float("inf"), hi)

    # OpenRLHF's PolicyLoss, term by term: surr1 = r A, surr2 = clamp(r, lo, hi) A, -min(surr1, surr2),
    # with torch's nan propagation and its gradient rule at ties (torch.min / torch.max give each
    # side half where the two are equal; torch.clamp passes the gradient where lo <= r <= hi)
    in_band = (ratio >= lo) & (ratio <= hi_loss)
    clamped = tl.minimum(tl.maximum(ratio, lo, propagate_nan=tl.PropagateNan.ALL), hi_loss,
                         propagate_nan=tl.PropagateNan.ALL)  # fmt: skip
    surr1 = ratio * adv
    surr2 = clamped * adv
    objective = tl.minimum(surr1, surr2, propagate_nan=tl.PropagateNan.ALL)
    # torch.minimum's backward: surr1 gets the gradient unless surr1 > surr2, surr2 unless surr1 < surr2, each
    # half where they are equal; a nan side compares false both ways, so both get all of it (surr2's then stops at
    # the clamp outside the band, which a nan bound always is: a nan band gives -r A, as on the torch path)
    share = tl.where(surr1 == surr2, 0.5, 1.0)
    weight = tl.where(surr1 > surr2, 0.0, share) + tl.where(surr1 < surr2, 0.0, share) * in_band.to(tl.float32)
    clipped_upper = valid & (adv > 0) & (ratio > hi_loss)
    clipped_lower = valid & (adv < 0) & (ratio < lo)
    floor_clipped = clipped_lower & (ratio >= band_lo)  # band_lo is lo without a floor: never true then
    # the flags as bool planes [4, n_elements] of 0 / 1 bytes, returned as they are (no kernels after this one),
    # each stored as soon as it is known. Stored together at the end, the four stores cost 47 (variant, target)
    # pairs of the full ahead-of-time set (triton 3.7.1) their second block per SM and 9 of them a 4 B spill;
    # stored here, 14 lose it (chi2 at sm_120, hellinger with every option at sm_100) and none spills.
    # A pointer step per plane: k * n_elements could overflow an int32 n_elements.
    flag_ptrs = flags_ptr + offs
    tl.store(flag_ptrs, clipped_upper.to(tl.int8), mask=in_range)
    flag_ptrs += n_elements
    tl.store(flag_ptrs, clipped_lower.to(tl.int8), mask=in_range)
    flag_ptrs += n_elements  # dual_clipped's plane, stored below
    tl.store(flag_ptrs + n_elements, floor_clipped.to(tl.int8), mask=in_range)
    if HAS_DUAL:
        floor = dual_clip * adv
        dual = valid & (adv < 0) & (floor > objective)
        weight = tl.where(adv < 0, weight * tl.where(floor == objective, 0.5, tl.where(dual, 0.0, 1.0)), weight)
        objective = tl.where(dual, floor, objective)
    else:
        dual = offs < 0  # all false, same shape (adv != adv would be true at a nan advantage)
    tl.store(flag_ptrs, dual.to(tl.int8), mask=in_range)
    loss = tl.where(valid, -objective, 0.0)
    # the log-ratio clamp passes the gradient only inside [-20, 20] (a nan log-ratio: none); with the
    # truncation (DPPO's weight min(r, c), as verl's) everywhere: beyond it the weight is min(e^+-20, c)
    if HAS_TRUNC:
        weight = tl.where(valid & (raw == raw), weight, 0.0)
    else:
        weight = tl.where(valid & (raw >= -LR_CLAMP) & (raw <= LR_CLAMP), weight, 0.0)
    # d loss / d log pi; nan where A is nan and the gradient passes, as on the torch path
    if HAS_TRUNC:  # DPPO's truncated importance weight min(r, c) in place of r (nan stays nan)
        coef = tl.where(valid, -tl.minimum(ratio, ratio_truncation, propagate_nan=tl.PropagateNan.ALL) * adv * weight,
                        0.0)  # fmt: skip
    else:  # a zero weight (the clamp, a clip) gives 0 as torch's does, not a nan ratio or advantage times 0
        coef = tl.where(valid & (weight != 0.0), -ratio * adv * weight, 0.0)

    tl.store(loss_ptr + offs, loss, mask=in_range)
    tl.store(coef_ptr + offs, coef, mask=in_range)
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


class _Config(NamedTuple):
    """What the autograd Function passes from the entry point to the launchers (one non-tensor argument)."""

    spec: BandSpec
    radius: Tensor | None
    dual_clip: float | None
    return_bounds: bool
    bounds: tuple[Tensor, Tensor] | None  # given bounds, float32 and (B, T)-shaped, or None
    backend: str  # "triton" or "auto": what a backward kernel failure does (`fallback.run_backward_kernel`)


class BandLossFunction(torch.autograd.Function):
    """Autograd glue: forward runs the fused kernel, backward multiplies by the stored coefficient."""

    @staticmethod
    def forward(ctx, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, action_mask, config: _Config):
        loss, coef, flags, lower, upper = _launch_forward(log_probs, old_log_probs, advantages, action_mask, config)
        ctx.save_for_backward(coef)
        ctx.log_probs_dtype, ctx.log_probs_shape = log_probs.dtype, log_probs.shape
        ctx.backend = config.backend
        ctx.mark_non_differentiable(flags)
        if lower is not None:
            ctx.mark_non_differentiable(lower, upper)
        return loss, flags, lower, upper

    @staticmethod
    def backward(ctx, grad_loss, _grad_flags, _grad_lower, _grad_upper):
        (coef,) = ctx.saved_tensors
        grad_loss = grad_loss.reshape(coef.shape) if grad_loss.dim() != 2 else grad_loss
        dtype = ctx.log_probs_dtype
        variant = backward_kernel_variant(coef.device, dtype, grad_loss.dtype)
        grad = run_backward_kernel(
            lambda: _launch_backward(grad_loss, coef, dtype),
            lambda: _backward_reference(grad_loss, coef, dtype),
            variant,
            ctx.backend,
        )
        return grad.reshape(ctx.log_probs_shape), None, None, None, None


def _launch_backward(grad_loss: Tensor, coef: Tensor, dtype: torch.dtype) -> Tensor:
    """grad = upstream * coef by `_band_loss_bwd_kernel` ((B, T) upstream read through its strides)."""
    grad = torch.empty(coef.shape, dtype=dtype, device=coef.device)
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
            num_warps=_BACKWARD_WARPS,
        )
    return grad


def _backward_reference(grad_loss: Tensor, coef: Tensor, dtype: torch.dtype) -> Tensor:
    """The backward kernel's rule in torch, for when that kernel fails: upstream (as float32) times the
    coefficient, and exactly 0 where the coefficient is 0 whatever upstream holds there (0 * nan must not
    leak into masked tokens); rounded once to log_probs' dtype."""
    return torch.where(coef != 0.0, grad_loss.float() * coef, 0.0).to(dtype)


def _launch_forward(log_probs, old_log_probs, advantages, action_mask, config: _Config):
    spec, radius, dual_clip, return_bounds, given_bounds = (
        config.spec, config.radius, config.dual_clip, config.return_bounds, config.bounds,
    )  # fmt: skip
    divergence, upper_cap, relax = spec.divergence, spec.upper_cap, spec.relax
    lower_floor, ratio_truncation = spec.lower_floor, spec.ratio_truncation
    # no second radius to read: given bounds, or the symmetric band
    lower_delta = None if given_bounds is not None or spec.lower_delta == spec.delta else spec.lower_delta
    if given_bounds is not None:  # used as given: the kernel reads them, no cap or relax on top
        upper_cap = relax = None
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
    flags = torch.empty((4,) + tuple(shape2d), dtype=torch.bool, device=device)  # one plane per flag
    out_lo = torch.empty(shape2d, dtype=torch.float32, device=device) if return_bounds else loss
    out_hi = torch.empty(shape2d, dtype=torch.float32, device=device) if return_bounds else loss

    per_token = radius is not None
    delta = spec.delta if radius is None else radius
    if per_token:  # per token, or per sequence as (B, 1) (radius_view makes (B,) so): read through its strides
        delta_full = torch.broadcast_to(radius_view(radius, log_probs), log_probs.shape)
        delta_2d = delta_full if log_probs.dim() == 2 else delta_full.reshape(shape2d)
    else:  # the scalar, as a float64 value read with zero strides (float32 would round it)
        delta_2d = torch.full((1, 1), delta, dtype=torch.float64, device=device).expand(shape2d)
    table, cells, rows, u_min, cells_per_unit, s_min, s_per_unit = loss, 1, 1, 0.0, 1.0, 0.0, 1.0
    delta_min, delta_max = 0.0, math.inf  # a per-token radius must be > 0 and finite (also checked in-kernel)
    lo_pre = hi_pre = loss
    kernel_table = None
    if given_bounds is not None:
        kind = BOUNDS_PRECOMPUTED
        lo_pre, hi_pre = given_bounds
    elif divergence in _IN_KERNEL_CLOSED_FORMS:
        kind = _IN_KERNEL_CLOSED_FORMS[divergence]
    elif per_token and divergence in _IN_KERNEL_SOLVERS:
        kind, kernel_table = _IN_KERNEL_SOLVERS[divergence], per_token_start_table(divergence, device)
        delta_min, delta_max = PER_TOKEN_DELTA_RANGE
    elif divergence in _IN_KERNEL_TABLES:  # with lower_delta: its table's lower rows (same coordinates)
        kind = _IN_KERNEL_TABLES[divergence]
        kernel_table = scalar_delta_table(divergence, delta, device, lower_delta=lower_delta)
    else:  # a divergence registered by the user: bounds from the torch operator, read by the kernel
        kind = BOUNDS_PRECOMPUTED
        lo_pre, hi_pre, _ = spec_bounds_with_edge(spec, old, radius, roots_only=True)  # the kernel moves them
        lo_pre, hi_pre = lo_pre.reshape(shape2d).contiguous(), hi_pre.reshape(shape2d).contiguous()
    if kernel_table is not None:
        table = kernel_table.values
        rows, cells = table.shape  # [8, cells] cubic coefficients, or [rows, cols] start points
        u_min, cells_per_unit = kernel_table.coordinate_min, kernel_table.coordinate_cells_per_unit
        s_min, s_per_unit = kernel_table.log_delta_min, kernel_table.log_delta_cells_per_unit

    if lower_delta is not None:
        lower_delta_t = torch.full((1,), float(lower_delta), dtype=torch.float64, device=device)
    else:
        lower_delta_t = loss
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
            logp, old, adv, mask, delta_2d, lower_delta_t, lo_pre, hi_pre, table,
            loss, coef, flags.view(torch.int8), out_lo, out_hi,
            n, shape2d[1],
            logp.stride(0), logp.stride(1), old.stride(0), old.stride(1),
            adv.stride(0), adv.stride(1), mask_strides[0], mask_strides[1], delta_2d.stride(0), delta_2d.stride(1),
            cells, u_min, cells_per_unit, rows, s_min, s_per_unit, delta_min, delta_max,
            float(upper_cap) if upper_cap is not None else math.inf,
            1.0 - float(relax[0]) if relax is not None else 1.0,
            1.0 + float(relax[1]) if relax is not None else 1.0,
            float(dual_clip) if dual_clip is not None else 0.0,
            float(lower_floor) if lower_floor is not None else 0.0,
            float(ratio_truncation) if ratio_truncation is not None else 0.0,
            KIND=kind, HAS_MASK=action_mask is not None, HAS_CAP=upper_cap is not None,
            HAS_RELAX=relax is not None, HAS_DUAL=dual_clip is not None, HAS_FLOOR=lower_floor is not None,
            HAS_LOWER_DELTA=lower_delta is not None, HAS_TRUNC=ratio_truncation is not None,
            STORE_BOUNDS=return_bounds,
            STEPS=HALLEY_STEPS, LR_CLAMP=LOG_RATIO_CLAMP, BLOCK=_BLOCK,
            **_forward_launch_options(kind, cuda=torch.version.hip is None),
        )  # fmt: skip
    shape = log_probs.shape
    bounds = (out_lo.reshape(shape), out_hi.reshape(shape)) if return_bounds else (None, None)
    return loss.reshape(shape), coef, flags, *bounds


def band_token_loss_triton(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    *,
    spec: BandSpec,
    radius: Tensor | None = None,
    dual_clip: float | None = None,
    return_bounds: bool = False,
    bounds: tuple[Tensor | float, Tensor | float] | None = None,
    backend: str = "triton",
) -> BandTokenLoss:
    """The fused kernel path of `openrlhf_band.functional.band_token_loss_from_spec` (same arguments
    and outputs; the spec is validated when built, the rest by the dispatcher). `backend` says what a
    failure of the backward kernel does (the dispatcher's choice; the forward's is `fallback.run_kernel`'s):
    "triton" raises RuntimeError, "auto" computes the gradient in torch by the same rule, warned once."""
    if bounds is not None:  # used as given: the kernel reads them, no cap or relax on top
        shape2d = log_probs.shape if log_probs.dim() == 2 else torch.Size((1, log_probs.numel()))
        bounds = tuple(
            torch.as_tensor(b, dtype=torch.float32, device=log_probs.device).expand(log_probs.shape)
            .reshape(shape2d).contiguous()
            for b in bounds
        )  # fmt: skip
    config = _Config(spec, radius, dual_clip, return_bounds, bounds, backend)
    loss, flags, lower, upper = BandLossFunction.apply(log_probs, old_log_probs, advantages, action_mask, config)
    clipped_upper, clipped_lower, dual_clipped, floor_clipped = (plane.reshape(log_probs.shape) for plane in flags)
    return BandTokenLoss(loss, clipped_upper, clipped_lower, dual_clipped, lower, upper, floor_clipped)
