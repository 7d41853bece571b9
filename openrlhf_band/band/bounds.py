"""The Band operator: per-token ratio bounds [r_low(p), r_up(p)] from pi_old alone.

Everything is computed in float64 whatever the input dtype (the inputs are exact numbers; float64
intermediates make float32 outputs correctly rounded to within a few ulps even where the formulas
cancel, e.g. 1 - sqrt(...) near the lower saturation edge) and runs as a fixed sequence of
vectorised tensor ops: no `.item()`, no data-dependent loop exit, no host synchronisation.

Numeric roots (divergences without a closed form) are found in the variable l = log q, where
q = r p is the new probability of the token, by Newton (or Halley) steps kept inside a bracket.
The strategies:

* tabulated (kl): both roots are smooth, bounded functions of w = log(-log p) once written as
  A(w) = log q_up and B(w) = p log(1 / r_low). Per (divergence, delta, device) we solve them once
  on a fine grid of w to float64 precision and store a cubic Hermite interpolant; a float32 input
  then costs one table lookup and a cubic (no iterations), and a float64 input adds three Newton
  polishing steps.
* edge tables (reverse_kl, which saturates, so its roots are not smooth in p at the edges): the
  same cubic tables over u = log(g_edge(p) - delta), the log-distance to each saturation edge.
* per-token radius (kl, reverse_kl with a tensor delta): no 1-D table covers a continuum of
  radii, so a 2-D float32 table of *starting points* over (the table coordinate, log delta), read
  bilinearly, gives each root to ~4e-2 in log of the log-ratio, and two Halley steps in float64
  (cubic convergence: 4e-2 -> ~1e-5 -> float64 rounding) finish it. The Triton kernel runs the same
  table and the same steps (`ops/band_loss.py`). Radii outside `PER_TOKEN_DELTA_RANGE` give nan
  bounds for their token, as a radius <= 0 does.
* the bracketed solver (bisection then safeguarded Newton): what builds every table, and the
  per-token path of a registered divergence that has no table.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from openrlhf_band.band.divergences import Divergence, get_divergence
from openrlhf_band.band.rules import RULES
from openrlhf_band.band.spec import BandSpec, spec_from_keywords

# log of the smallest positive float64 (subnormal): a lower bracket for log q that is below every
# representable root, so the lower bound is exact or underflows to 0 as the true value does.
_LOG_Q_FLOOR = -745.0

# Table grid in w = log(-log p), which spreads both ends of p in (0, 1) over a short interval:
# p -> 1 (where the kl roots change on the scale 1 - p ~ delta) maps to w ~ log(1 - p), p -> 0 to
# w ~ log(-log p). Below W_MIN (1 - p < 2.8e-10) the stored A and B equal their p -> 1 values to
# within O((1-p) log(1-p)) ~ 6e-9; above W_MAX (p < 1e-39) their p -> 0 limits to within O(p).
# Spacing 1/128 keeps the cubic's relative error in A and B below ~5e-9, so float32 outputs are
# good to ~1e-7 even where r_low = exp(-B/p) amplifies B's error by B/p (up to ~7 for r_low >= 1e-3).
# The table is 3,392 cells x 8 float64 coefficients (212 KiB).
_TABLE_W_MIN = -22.0
_TABLE_W_MAX = 4.5
_TABLE_CELLS_PER_UNIT = 128

_BISECT_STEPS = 64  # bracket width shrinks by 2^-64: below float64 resolution of log q
_NEWTON_STEPS = 3  # after bisection (or a table guess): quadratic convergence, float64-exact
# Divergences solved at run time (no table): a short bisection to get near the root, then
# safeguarded Newton steps, which also shrink the bracket and fall back to bisection.
_RUNTIME_BISECT_STEPS = 20
_RUNTIME_NEWTON_STEPS = 8


def _log_one_minus(q: Tensor, one_minus_q: Tensor) -> Tensor:
    """log(1 - q) to float64 precision for every q in [0, 1]: log1p(-q) where q is small (log of a number
    near 1 would leave an absolute error of 1e-16, a relative one of 1e-16 / q, which at p ~ delta ~ 1e-8
    decides the root's 8th digit), log(1 - q) from an accurate 1 - q where q is near 1."""
    return torch.where(q < 0.5, torch.log1p(-q), torch.log(one_minus_q))


def _bernoulli_terms(log_q: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.exp(log_q)
    one_minus_q = -torch.expm1(log_q)
    return q, one_minus_q, _log_one_minus(q, one_minus_q)


def _solve_root(
    div: Divergence,
    delta: float,
    x: Tensor,
    p: Tensor,
    one_minus_p: Tensor,
    log_one_minus_p: Tensor,
    offset: Tensor,
    scale: Tensor,
    lo: Tensor,
    hi: Tensor,
    increasing: bool,
    bisect_steps: int,
    newton_steps: int,
    start: Tensor | None = None,
) -> Tensor:
    """Root of g(p, q) = delta in v, where log q = offset + scale * v and v lies in [lo, hi].

    `increasing` says whether g grows with v on this branch. A fixed number of bisection steps
    (midpoint of the bracket) is followed by Newton steps kept strictly inside the bracket (a step
    that would leave it is replaced by the midpoint). `start`, when given, replaces bisection as the
    first Newton iterate. Shapes: all tensors broadcast to x's shape; returns v.
    """
    g, dg_dlogq = div.bernoulli_g, div.bernoulli_dg_dlogq

    def residual(v: Tensor) -> Tensor:
        log_q = offset + scale * v
        q, one_minus_q, log_one_minus_q = _bernoulli_terms(log_q)
        return g(x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q) - delta

    for _ in range(bisect_steps):
        mid = 0.5 * (lo + hi)
        above = residual(mid) > 0
        if increasing:
            lo, hi = torch.where(above, lo, mid), torch.where(above, mid, hi)
        else:
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)

    v = 0.5 * (lo + hi) if start is None else start
    for _ in range(newton_steps):
        log_q = offset + scale * v
        q, one_minus_q, log_one_minus_q = _bernoulli_terms(log_q)
        args = (x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q)
        residual_v = g(*args) - delta
        # keep the bracket tight around the root (rtsafe): v replaces the end on its side
        above = residual_v > 0 if increasing else residual_v < 0
        lo, hi = torch.where(above, lo, v), torch.where(above, v, hi)
        candidate = v - residual_v / (dg_dlogq(*args) * scale)
        # a step that leaves the bracket (or is nan) becomes a bisection step of the tightened bracket
        inside = (candidate >= lo) & (candidate <= hi)
        v = torch.where(inside, candidate, 0.5 * (lo + hi))
    return v


def _table_lower_scale(p: Tensor) -> Tensor:
    # log q_low = x - B / p: B is the solver variable of the tabulated lower root
    return -1.0 / p


@functools.lru_cache(maxsize=64)
def _root_table(name: str, delta: float, device: torch.device) -> Tensor:
    """Cubic Hermite table of A(w) = log q_up and B(w) = p log(1/r_low) over w = log(-log p).

    Returns float64 coefficients of shape [8, cells]: rows 0-3 are c0..c3 of A, rows 4-7 of B, with
    A or B = c0 + c1 t + c2 t^2 + c3 t^3 for t in [0, 1) inside a cell. Built once per
    (divergence, delta, device) on the CPU in float64 (~60 ms on one idle core), then moved.
    """
    div = get_divergence(name)
    h = 1.0 / _TABLE_CELLS_PER_UNIT
    cells = int(round((_TABLE_W_MAX - _TABLE_W_MIN) * _TABLE_CELLS_PER_UNIT))
    # two ghost nodes on each side for the fourth-order central differences
    w = _TABLE_W_MIN + h * torch.arange(-2, cells + 3, dtype=torch.float64)
    x = -torch.exp(w)
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    log_one_minus_p = _log_one_minus(p, one_minus_p)
    zeros, ones = torch.zeros_like(x), torch.ones_like(x)

    upper_log_q = _solve_root(
        div, delta, x, p, one_minus_p, log_one_minus_p, offset=zeros, scale=ones, lo=x, hi=zeros,
        increasing=True, bisect_steps=2 * _BISECT_STEPS, newton_steps=_NEWTON_STEPS,
    )  # fmt: skip
    lower_b = _solve_root(
        div, delta, x, p, one_minus_p, log_one_minus_p, offset=x, scale=_table_lower_scale(p),
        lo=zeros, hi=torch.full_like(x, div.lower_table_bracket(delta)),
        increasing=True, bisect_steps=2 * _BISECT_STEPS, newton_steps=_NEWTON_STEPS,
    )  # fmt: skip

    return torch.stack(_hermite_rows(upper_log_q) + _hermite_rows(lower_b)).contiguous().to(device)


def _hermite_rows(values: Tensor) -> list[Tensor]:
    """Cubic Hermite coefficients c0..c3 per cell (t in [0, 1) within a cell) from node values with
    two ghost nodes on each side, slopes from fourth-order central differences."""
    slopes = (values[:-4] - 8 * values[1:-3] + 8 * values[3:-1] - values[4:]) / 12  # d/dt, inner nodes
    y = values[2:-2]  # the cells + 1 real nodes
    y0, y1, d0, d1 = y[:-1], y[1:], slopes[:-1], slopes[1:]
    return [y0, d0, 3 * (y1 - y0) - 2 * d0 - d1, 2 * (y0 - y1) + d0 + d1]


def _table_position(x: Tensor, cells: int) -> tuple[Tensor, Tensor]:
    """(t, cell): the table cell of each 1-D float64 x <= 0 and the position t in [0, 1] within it."""
    t = torch.neg(x).log_().sub_(_TABLE_W_MIN).mul_(_TABLE_CELLS_PER_UNIT)  # position, in cells
    # nan (from nan input) would make an undefined integer index; its output is nan anyway
    t = t.nan_to_num_(nan=0.0).clamp_(0.0, float(cells))
    cell = t.to(torch.int32).clamp_(max=cells - 1)  # truncation is floor here: t >= 0
    return t.sub_(cell), cell


def _horner(table: Tensor, first_row: int, cell: Tensor, t: Tensor, value: Tensor, scratch: Tensor) -> Tensor:
    """value = ((c3 t + c2) t + c1) t + c0 from rows first_row..first_row + 3, in place.

    One 1-D gather per coefficient into preallocated buffers: on CPU, gathering rows of a
    [cells, 8] table is several times slower, and a fresh multi-MB buffer per op (its pages
    faulted in on first touch) costs more than the arithmetic.
    """
    torch.index_select(table[first_row + 3], 0, cell, out=value)
    for row in (first_row + 2, first_row + 1, first_row):
        torch.index_select(table[row], 0, cell, out=scratch)
        value.mul_(t).add_(scratch)
    return value


def _tabulated_roots(div: Divergence, delta: float, x: Tensor) -> tuple[Tensor, Tensor]:
    """(A, B) = (log q_up, p log(1/r_low)) from the table, float64, for 1-D float64 x <= 0."""
    table = _root_table(div.name, delta, x.device)
    t, cell = _table_position(x, table.shape[1])
    scratch = torch.empty_like(x)
    return (
        _horner(table, 0, cell, t, torch.empty_like(x), scratch),
        _horner(table, 4, cell, t, torch.empty_like(x), scratch),
    )


# Elements per chunk of the float32 fast path: its float64 work buffers (4 x 512 KiB) are allocated
# once per call and reused across chunks, instead of faulting in fresh multi-MB buffers per op
# (measured on one CPU thread: 16K-128K elements all within 15% of each other, 64K best).
_CHUNK = 65536


def _tabulated_bounds_float32(div: Divergence, delta: float, old_log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The float32-output fast path of a tabulated divergence: lookup and cubic, no iterations.

    Takes the 1-D input as given (any float dtype); works in float64 chunk by chunk. p = 1 (x = 0)
    and p = 0 (x = -inf) come out of the table's end cells as their limits to within float32
    rounding, so no special cases are needed; nan stays nan. Returns (lower, upper, upper at the edge).
    """
    table = _root_table(div.name, delta, old_log_probs.device)
    cells = table.shape[1]
    n = old_log_probs.numel()
    lower = torch.empty(n, dtype=torch.float32, device=old_log_probs.device)
    upper = torch.empty_like(lower)
    at_edge = torch.empty(n, dtype=torch.bool, device=old_log_probs.device)
    work = torch.empty((4, min(n, _CHUNK)), dtype=torch.float64, device=old_log_probs.device)
    cell_buffer = torch.empty(min(n, _CHUNK), dtype=torch.int32, device=old_log_probs.device)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        x, t, value, scratch = (buffer[: stop - start] for buffer in work)
        cell = cell_buffer[: stop - start]
        x.copy_(old_log_probs[start:stop]).clamp_(max=0.0)
        torch.neg(x, out=t).log_().sub_(_TABLE_W_MIN).mul_(_TABLE_CELLS_PER_UNIT)  # position, in cells
        t.nan_to_num_(nan=0.0).clamp_(0.0, float(cells))  # nan input: any cell, output nan anyway
        cell.copy_(t).clamp_(max=cells - 1)  # float -> int truncates: floor, as t >= 0
        t.sub_(cell)
        upper[start:stop] = _horner(table, 0, cell, t, value, scratch).sub_(x).exp_()  # q_up / p
        lower_b = _horner(table, 4, cell, t, value, scratch)
        inv_p = torch.neg(x, out=scratch).exp_()
        # the edge rule (`_rounds_to_edge`), here where the chunk's 1/p is at hand in float64
        torch.ge(upper[start:stop], inv_p.to(torch.float32), out=at_edge[start:stop])
        lower[start:stop] = lower_b.mul_(inv_p).neg_().exp_()  # exp(-B / p)
    return lower, upper, at_edge | (old_log_probs >= 0)


def _lower_log_root(div: Divergence, delta, x: Tensor, p: Tensor, one_minus_p: Tensor, log_one_minus_p: Tensor,
                    bisect_steps: int, newton_steps: int, start: Tensor | None = None) -> Tensor:
    """log q of the lower root (q < p), float64, from the bracket [log of the smallest float64, x]."""
    zeros, ones = torch.zeros_like(x), torch.ones_like(x)
    return _solve_root(
        div, delta, x, p, one_minus_p, log_one_minus_p, offset=zeros, scale=ones,
        lo=torch.full_like(x, _LOG_Q_FLOOR), hi=x, increasing=False,
        bisect_steps=bisect_steps, newton_steps=newton_steps, start=start,
    )  # fmt: skip


def _solved_roots(div: Divergence, delta, x: Tensor, bisect_steps: int = _RUNTIME_BISECT_STEPS,
                  newton_steps: int = _RUNTIME_NEWTON_STEPS) -> tuple[Tensor, Tensor]:
    """Unsaturated (lower, upper) ratio roots solved at run time, float64, for any delta (a float or
    a tensor of x's shape). Both are lower roots: the upper root's complement 1 - q_up is the lower
    root of the mirrored pair (1 - p, 1 - q), since g(p, q) = g(1 - p, 1 - q) (Bernoulli symmetry).
    So both are solved in log q and log(1 - q) respectively, the variables in which g is close to
    linear as q -> 0 and q -> 1, where the roots of kl and reverse_kl crowd the edges."""
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    log_one_minus_p = _log_one_minus(p, one_minus_p)
    lower_log_q = _lower_log_root(div, delta, x, p, one_minus_p, log_one_minus_p, bisect_steps, newton_steps)
    upper_log_1mq = _lower_log_root(div, delta, log_one_minus_p, one_minus_p, p, x, bisect_steps, newton_steps)
    lower = torch.exp(lower_log_q - x)
    upper = torch.neg(torch.expm1(upper_log_1mq)).div_(p)
    at_zero = p == 0.0  # the brackets are empty at p = 0: [0, inf] as in Proposition 3's limit
    return lower.masked_fill_(at_zero, 0.0), upper.masked_fill_(at_zero, math.inf)


def _tabulated_numeric_roots(div: Divergence, delta: float, x: Tensor) -> tuple[Tensor, Tensor]:
    """kl with a float delta and float64 output: the table's guess, then Newton to float64 precision."""
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    log_one_minus_p = _log_one_minus(p, one_minus_p)
    zeros, ones = torch.zeros_like(x), torch.ones_like(x)
    upper_guess, lower_guess = _tabulated_roots(div, delta, x)
    upper_log_q = _solve_root(
        div, delta, x, p, one_minus_p, log_one_minus_p, offset=zeros, scale=ones, lo=x, hi=zeros,
        increasing=True, bisect_steps=0, newton_steps=_NEWTON_STEPS, start=upper_guess,
    )  # fmt: skip
    lower_b = _solve_root(
        div, delta, x, p, one_minus_p, log_one_minus_p, offset=x, scale=_table_lower_scale(p),
        lo=zeros, hi=torch.full_like(x, div.lower_table_bracket(delta)), increasing=True,
        bisect_steps=0, newton_steps=_NEWTON_STEPS, start=lower_guess,
    )  # fmt: skip
    return torch.exp(-lower_b / p), torch.exp(upper_log_q - x)


# ---------------------------------------------------------------------------------------------- edge tables
# A divergence that saturates (reverse_kl) has roots whose derivative in p blows up at the saturation
# edges, so a table in p cannot be accurate there. In u = log(g_edge(p) - delta), the log-distance to
# the edge, they are smooth: near the upper edge 1 - q_up ~ s / (c - log s) with s = e^u, so
# log q_up -> 0 smoothly as u -> -inf, and far from it log q_up is close to linear in u. One cubic
# Hermite table per root and delta over u in [_EDGE_U_MIN, _EDGE_U_MAX], 32 cells per unit (measured
# against the mpmath oracle: <= 1.4e-7 relative in float32 for delta in [1e-3, 0.5]). Below
# _EDGE_U_MIN (s < 9e-14) the root is the edge itself to float32 precision (the table's end value).
_EDGE_U_MIN = -30.0
_EDGE_U_MAX = 6.5  # g_edge - delta up to 665 (float32 inputs stop at 104); nodes beyond ~740 would underflow p
_EDGE_CELLS_PER_UNIT = 32


@functools.lru_cache(maxsize=64)
def _edge_tables(name: str, delta: float, device: torch.device) -> Tensor:
    """float64 coefficients [8, cells]: rows 0-3 cubic of log q_up over u = log(g_up_edge - delta),
    rows 4-7 of log q_low over u = log(g_low_edge - delta)."""
    div = get_divergence(name)
    h = 1.0 / _EDGE_CELLS_PER_UNIT
    cells = int(round((_EDGE_U_MAX - _EDGE_U_MIN) * _EDGE_CELLS_PER_UNIT))
    u = _EDGE_U_MIN + h * torch.arange(-2, cells + 3, dtype=torch.float64)
    coefficients = []
    for which, inverse in zip(("upper", "lower"), div.edge_inverse):
        x = inverse(delta + torch.exp(u))
        lower, upper = _solved_roots(div, delta, x, bisect_steps=2 * _BISECT_STEPS, newton_steps=_NEWTON_STEPS)
        coefficients += _hermite_rows(torch.log(upper if which == "upper" else lower) + x)  # log q
    table = torch.stack(coefficients)
    if not torch.isfinite(table).all():
        raise RuntimeError(f"the {name} edge table for delta={delta} has non-finite entries")  # a bug, not input
    return table.contiguous().to(device)


def _edge_table_bounds_float32(div: Divergence, delta: float, old_log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """float32 (lower, upper, upper saturated) for a divergence with edge tables: one lookup per
    root, saturation by Proposition 3 (g at the edge <= delta), chunked like the kl fast path."""
    table = _edge_tables(div.name, delta, old_log_probs.device)
    cells = table.shape[1]
    n = old_log_probs.numel()
    device = old_log_probs.device
    lower = torch.empty(n, dtype=torch.float32, device=device)
    upper = torch.empty_like(lower)
    saturated_up = torch.empty(n, dtype=torch.bool, device=device)
    work = torch.empty((5, min(n, _CHUNK)), dtype=torch.float64, device=device)
    cell_buffer = torch.empty(min(n, _CHUNK), dtype=torch.int32, device=device)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        x, one_minus_p, t, value, scratch = (buffer[: stop - start] for buffer in work)
        cell = cell_buffer[: stop - start]
        x.copy_(old_log_probs[start:stop]).clamp_(max=0.0)
        torch.expm1(x, out=one_minus_p).neg_()
        for first_row, edge_value in ((0, div.g_at_upper_edge), (4, div.g_at_lower_edge)):
            # edge-table divergences give their edge values from x and 1 - p alone (p is not computed)
            distance = edge_value(x, None, one_minus_p).sub_(delta)  # <= 0 where saturated
            torch.log(distance, out=t).sub_(_EDGE_U_MIN).mul_(_EDGE_CELLS_PER_UNIT)
            t.nan_to_num_(nan=0.0, neginf=0.0).clamp_(0.0, float(cells))
            cell.copy_(t).clamp_(max=cells - 1)  # float -> int truncates: floor, as t >= 0
            t.sub_(cell)
            log_ratio = _horner(table, first_row, cell, t, value, scratch).sub_(x)
            saturated = torch.le(distance, 0.0, out=saturated_up[start:stop] if first_row == 0 else None)
            if first_row == 0:  # saturated: exactly the edge, log(1/p) = -x
                upper[start:stop] = torch.where(saturated, torch.neg(x, out=scratch), log_ratio, out=t).exp_()
            else:
                lower[start:stop] = log_ratio.exp_().masked_fill_(saturated, 0.0)
    # p = 1 (log p >= 0) is the p -> 1 limit, which the table's end cell only approaches; nan stays nan
    at_one, is_nan = old_log_probs >= 0, torch.isnan(old_log_probs)
    lower = lower.masked_fill_(at_one, div.lower_at_p_one(delta)).masked_fill_(is_nan, math.nan)
    return lower, upper.masked_fill_(at_one, 1.0).masked_fill_(is_nan, math.nan), saturated_up | at_one


# ------------------------------------------------------------------------------------- per-token radius
# A radius per token: the roots depend on (p, delta) jointly. A 2-D table of starting points, read
# bilinearly, followed by a fixed number of Halley steps, is exact to float64 rounding and costs a
# fraction of a bracketed solve (measured against that solve over 2e5 random (p, delta) with p down
# to e^-740 and 1 - p down to 1e-300: the start is within 4e-2 in log b, b = log(p / q) the lower
# root's log-ratio; one Halley step leaves <= 7e-7 relative in the ratio, two leave float64 rounding).
# Both roots are lower roots (the upper one of the mirrored pair), so one table per divergence serves
# both, for every radius in PER_TOKEN_DELTA_RANGE (outside it: nan bounds for that token).
#
# Coordinates: (c, s = log delta) with c = log(-log p) for kl (as its 1-D table) and c = log(-log(1 - p)
# - delta), the log-distance to the lower saturation edge, for a divergence that saturates
# (reverse_kl), where the root is not smooth in p. Stored: log(p b) for kl (bounded as p -> 0, where
# b ~ delta / p) and log b for reverse_kl (b is bounded below by the saturation edge p > 1 - e^-delta).
#: Per-token radii the kl and reverse_kl solvers are exact for (the 2-D start table's delta range).
PER_TOKEN_DELTA_RANGE = (9.99999993922529e-09, 10.0)  # 1e-8 as float32 has it: the kernel gets its limits as float32
_START_C_RANGE = {"kl": (-22.0, 6.55), "edge": (-30.0, 6.5)}  # kl: p in [e^-700, 1 - 2.8e-10]
_START_C_CELLS_PER_UNIT = 16
_START_S_CELLS_PER_UNIT = 8
_START_BRACKET = 2.0  # Halley steps stay in [b0 / 2, 2 b0] (the start is within e^0.04 of the root)
HALLEY_STEPS = 2


@dataclass(frozen=True)
class KernelTable:
    """A root table as the Triton kernel reads it (and the torch path, from the same tensor).

    values: the table on `device`: float64 [8, cells] cubic Hermite coefficients (rows 0-3 the upper
        root's, rows 4-7 the lower root's) for a scalar radius, or float32 [rows, cols] starting
        points over (coordinate, log delta) for a per-token radius.
    coordinate_min, coordinate_cells_per_unit: the first axis, cell i covering
        [min + i / cells_per_unit, min + (i + 1) / cells_per_unit).
    log_delta_min, log_delta_cells_per_unit: the second axis of a start table (0 for a 1-D table).
    """

    values: Tensor
    coordinate_min: float
    coordinate_cells_per_unit: float
    log_delta_min: float = 0.0
    log_delta_cells_per_unit: float = 0.0


def scalar_delta_table(
    divergence: str, delta: float, device: torch.device, lower_delta: float | None = None
) -> KernelTable | None:
    """The 1-D cubic table of a tabulated divergence (kl: over w = log(-log p)) or an edge-table one
    (reverse_kl: over u = log(g_edge(p) - delta)) for one scalar radius, or None (closed forms,
    divergences without a table). Cached per (divergence, delta, device). With `lower_delta`, the
    lower root's rows (4-7) come from that radius' table: the coordinates of both are the same
    (reverse_kl's lower coordinate is then read at lower_delta, as the kernel does)."""
    div, delta = get_divergence(divergence), float(delta)  # a validated BandSpec's
    if div.tabulate:
        coordinate = (_TABLE_W_MIN, float(_TABLE_CELLS_PER_UNIT))
    elif div.edge_inverse is not None:
        coordinate = (_EDGE_U_MIN, float(_EDGE_CELLS_PER_UNIT))
    else:
        return None
    lower_delta = delta if lower_delta is None else float(lower_delta)
    return KernelTable(_spliced_table(div.name, delta, lower_delta, device), *coordinate)


@functools.lru_cache(maxsize=64)
def _spliced_table(name: str, delta: float, lower_delta: float, device: torch.device) -> Tensor:
    build = _root_table if get_divergence(name).tabulate else _edge_tables
    if lower_delta == delta:
        return build(name, delta, device)
    return torch.cat([build(name, delta, device)[:4], build(name, lower_delta, device)[4:]]).contiguous()


def per_token_start_table(divergence: str, device: torch.device) -> KernelTable | None:
    """The 2-D start table of kl / reverse_kl for a per-token radius (float32 [rows, cols]), or None
    for divergences solved otherwise. Built once per (divergence, device) (~0.3 s on one core)."""
    div = get_divergence(divergence)
    if _start_kind(div) is None:
        return None
    c_min = _START_C_RANGE[_start_kind(div)][0]
    s_min = math.log(PER_TOKEN_DELTA_RANGE[0])
    return KernelTable(
        _start_table(div.name, device), c_min, float(_START_C_CELLS_PER_UNIT), s_min, float(_START_S_CELLS_PER_UNIT)
    )


def _start_kind(div: Divergence) -> str | None:
    if div.bernoulli_g is None:
        return None
    if div.tabulate:
        return "kl"
    if div.edge_inverse is not None:
        return "edge"
    return None


@functools.lru_cache(maxsize=16)
def _start_table(name: str, device: torch.device) -> Tensor:
    div = get_divergence(name)
    kind = _start_kind(div)
    c_min, c_max = _START_C_RANGE[kind]
    s_min, s_max = (math.log(v) for v in PER_TOKEN_DELTA_RANGE)
    rows = int(round((c_max - c_min) * _START_C_CELLS_PER_UNIT)) + 1
    cols = int(math.ceil((s_max - s_min) * _START_S_CELLS_PER_UNIT)) + 1
    c = c_min + torch.arange(rows, dtype=torch.float64) / _START_C_CELLS_PER_UNIT
    s = s_min + torch.arange(cols, dtype=torch.float64) / _START_S_CELLS_PER_UNIT
    c, s = (t.reshape(-1) for t in torch.meshgrid(c, s, indexing="ij"))
    delta = torch.exp(s)
    if kind == "kl":
        x = -torch.exp(c)
    else:  # the p whose lower edge value g(p, 0) is delta + e^c
        x = div.edge_inverse[1](delta + torch.exp(c))
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    log_one_minus_p = _log_one_minus(p, one_minus_p)
    if kind == "kl":  # solved in B = p b, as the 1-D table: log q = x - B / p is below float64's range for small p
        stored = _solve_root(
            div, delta, x, p, one_minus_p, log_one_minus_p, offset=x, scale=_table_lower_scale(p),
            lo=torch.zeros_like(x), hi=div.lower_table_bracket(delta), increasing=True,
            bisect_steps=2 * _BISECT_STEPS, newton_steps=_NEWTON_STEPS,
        ).log_()  # fmt: skip
    else:
        log_q = _lower_log_root(div, delta, x, p, one_minus_p, log_one_minus_p, 2 * _BISECT_STEPS, _NEWTON_STEPS)
        stored = torch.log(x - log_q)
    if not torch.isfinite(stored).all():
        raise RuntimeError(f"the {name} start table has non-finite entries")  # a bug, not input
    return stored.reshape(rows, cols).to(torch.float32).to(device)


@functools.lru_cache(maxsize=16)
def _as_float64(values: Tensor) -> Tensor:
    return values.reshape(-1).to(torch.float64)


def _start_log_root(div: Divergence, table: KernelTable, x, p, one_minus_p, log_one_minus_p, delta, log_delta):
    """log q of the lower root from the start table, float64, and its bracket (lo, hi) in log q."""
    values = table.values
    rows, cols = values.shape
    if div.tabulate:
        c = torch.neg(x).log_()
    else:
        c = div.g_at_lower_edge(x, p, one_minus_p).sub_(delta).log_()  # nan where saturated
    pc = c.sub_(table.coordinate_min).mul_(table.coordinate_cells_per_unit).nan_to_num_(nan=0.0)
    pc = pc.clamp_(0.0, rows - 1.0)
    ps = (log_delta - table.log_delta_min).mul_(table.log_delta_cells_per_unit).nan_to_num_(nan=0.0)
    ps = ps.clamp_(0.0, cols - 1.0)
    i = pc.to(torch.int64).clamp_(max=rows - 2)
    j = ps.to(torch.int64).clamp_(max=cols - 2)
    tc, ts = pc.sub_(i), ps.sub_(j)
    flat = _as_float64(values)  # the float32 table, widened once (cached): float64 gathers need no copies
    corner = i.mul_(cols).add_(j)
    v00 = torch.index_select(flat, 0, corner)
    v01 = torch.index_select(flat, 0, corner.add_(1))
    v11 = torch.index_select(flat, 0, corner.add_(cols))
    v10 = torch.index_select(flat, 0, corner.sub_(1))
    v = torch.lerp(v00.lerp_(v01, ts), v10.lerp_(v11, ts), tc)
    b = v.exp_()
    if div.tabulate:
        b = b.div_(p)
    b = b.clamp_(max=1e300)  # b ~ delta / p overflows for p < ~1e-300; any b that large gives q = 0
    return x - b, x - _START_BRACKET * b, x - b / _START_BRACKET


def _halley_lower_log_root(div: Divergence, table: KernelTable, x, p, one_minus_p, log_one_minus_p, delta, log_delta,
                           steps: int = HALLEY_STEPS) -> Tensor:  # fmt: skip
    """log q of the lower root: the start table, then `steps` Halley steps kept inside the bracket."""
    log_q, lo, hi = _start_log_root(div, table, x, p, one_minus_p, log_one_minus_p, delta, log_delta)
    second = div.bernoulli_d2g_dlogq2
    for _ in range(steps):
        q, one_minus_q, log_one_minus_q = _bernoulli_terms(log_q)
        args = (x, p, one_minus_p, log_one_minus_p, log_q, q, one_minus_q, log_one_minus_q)
        d1 = div.bernoulli_dg_dlogq(*args)
        step = div.bernoulli_g(*args).sub_(delta).div_(d1)
        if second is not None:  # Halley: the Newton step over 1 - f f'' / (2 f'^2), kept >= 1/2 far from the root
            # (and where it is nan: an infinite Newton step, p below ~1e-308, times f'' = 0 at q = 0)
            divisor = second(*args).div_(d1).mul_(step).mul_(-0.5).add_(1.0)
            step = step.div_(torch.where(divisor >= 0.5, divisor, 0.5))
        log_q = torch.minimum(torch.maximum(log_q.sub_(step), lo, out=step), hi, out=log_q)
    return log_q


def _per_token_roots(div: Divergence, delta: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """Unsaturated (lower, upper) ratio roots for a per-token radius (flat float64 tensors), from the
    start table where the divergence has one, else the bracketed solver. Both are lower roots: the
    upper root's 1 - q_up is the lower root of the mirrored pair (1 - p, 1 - q)."""
    table = per_token_start_table(div.name, x.device)
    if table is None:
        return _solved_roots(div, delta, x)
    if x.numel() <= _CHUNK:
        return _per_token_roots_chunk(div, table, delta, x)
    # chunk by chunk: the ~30 float64 temporaries of a chunk stay in cache and their memory is reused
    lower, upper = torch.empty_like(x), torch.empty_like(x)
    for start in range(0, x.numel(), _CHUNK):
        stop = min(start + _CHUNK, x.numel())
        lower[start:stop], upper[start:stop] = _per_token_roots_chunk(div, table, delta[start:stop], x[start:stop])
    return lower, upper


def _per_token_roots_chunk(div: Divergence, table: KernelTable, delta: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    log_one_minus_p = _log_one_minus(p, one_minus_p)
    log_delta = torch.log(delta)
    lower_log_q = _halley_lower_log_root(div, table, x, p, one_minus_p, log_one_minus_p, delta, log_delta)
    upper_log_1mq = _halley_lower_log_root(div, table, log_one_minus_p, one_minus_p, p, x, delta, log_delta)
    lower = torch.exp(lower_log_q - x)
    upper = torch.neg(torch.expm1(upper_log_1mq)).div_(p)
    at_zero = p == 0.0  # p = 0: [0, inf] as in Proposition 3's limit
    return lower.masked_fill_(at_zero, 0.0), upper.masked_fill_(at_zero, math.inf)


def _per_token_delta(delta: Tensor, shape: torch.Size, div: Divergence) -> tuple[Tensor, Tensor]:
    """(delta, valid) as flat float64 tensors of the input's size; invalid entries (<= 0, nan, inf,
    or outside PER_TOKEN_DELTA_RANGE for a divergence solved from the start table) are replaced by
    0.05 for the arithmetic and their bounds become nan afterwards. A 1-D radius of length B against a
    2-D (B, T) input is one radius per sequence, also when B == T (as advantages are)."""
    if not delta.is_floating_point():
        raise ValueError(f"a per-token delta must be a floating-point tensor, got {delta.dtype}")
    if len(shape) == 2 and delta.shape == (shape[0],):
        delta = delta.unsqueeze(-1)
    try:
        flat = torch.broadcast_to(delta, shape).reshape(-1).to(torch.float64)
    except RuntimeError:
        raise ValueError(
            f"delta of shape {tuple(delta.shape)} does not broadcast to old_log_probs of shape {tuple(shape)}"
        ) from None
    valid = torch.isfinite(flat) & (flat > 0)
    if _start_kind(div) is not None:
        valid &= (flat >= PER_TOKEN_DELTA_RANGE[0]) & (flat <= PER_TOKEN_DELTA_RANGE[1])
    return torch.where(valid, flat, 0.05), valid


@torch.no_grad()
def band_bounds(
    old_log_probs: Tensor,
    divergence: str = "kl",
    delta: float | Tensor = 0.05,
    *,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    lower_floor: float | None = None,
    lower_delta: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Band ratio bounds [r_low(p), r_up(p)] for each token.

    Args:
        old_log_probs: log pi_old(a_t) of the sampled tokens, natural log, any shape, dtype
            float16 / bfloat16 / float32 / float64. Values slightly above 0 (rounding) count as 0;
            -inf means p = 0; NaN propagates to that element only.
        divergence: a name from `DIVERGENCES` ("kl", "tv", "chi2", "reverse_kl", "hellinger").
        delta: trust-region radius: a number > 0 (the paper uses 0.05), or a floating-point tensor
            broadcastable to `old_log_probs` (per token, or per sequence as (B, 1); for a 2-D
            (B, T) input a 1-D tensor of length B is per sequence, also when B == T). A tensor is
            not inspected on the host: an entry <= 0, nan or inf gives nan bounds for its token, and
            so does one outside `PER_TOKEN_DELTA_RANGE` ([1e-8, 10]) for kl and reverse_kl, whose
            per-token roots are exact there (a start table and two Halley steps).
        upper_cap: optional cap on the upper bound (>= 1; the authors' runs use 10).
        relax: optional (eps_low, eps_high): take the union with [1 - eps_low, 1 + eps_high].
        lower_floor: optional F in (0, 1): the lower bound becomes max(r_low, F) (after relax), so a
            rare token's probability can fall at most to F times its old value in one update.
        lower_delta: optional radius of the lower root when it differs from the upper one's
            (asymmetric radii, as DPPO's delta_low / delta_high); a number, with a number `delta`.

    The order, once: roots of g(p, r) = delta (lower root at lower_delta if given), then relax's
    union, then the lower floor, then the upper cap. The floor moves only the lower bound and the cap
    only the upper one, so the two commute; the floor after relax means no token's lower bound is
    below F, whatever relax asks.

    Returns:
        (lower, upper): ratio bounds pi_theta / pi_old, same shape as the input, float32 (float64
        for float64 input), no gradient. Saturation follows Proposition 3: upper == 1/p exactly iff
        g(p, 1/p) <= delta, lower == 0 iff g(p, 0) <= delta. p = 1 gives the p -> 1 limits and
        p = 0 gives [0, upper_cap or inf] (or [F, ...] with a floor).
    """
    lower, upper, _ = band_bounds_with_edge(
        old_log_probs, divergence, delta, upper_cap=upper_cap, relax=relax, lower_floor=lower_floor,
        lower_delta=lower_delta,
    )  # fmt: skip
    return lower, upper


@torch.no_grad()
def band_bounds_with_edge(
    old_log_probs: Tensor,
    divergence: str = "kl",
    delta: float | Tensor = 0.05,
    *,
    upper_cap: float | None = None,
    relax: tuple[float, float] | None = None,
    lower_floor: float | None = None,
    lower_delta: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`band_bounds` plus `upper_at_edge` (see `spec_bounds_with_edge`)."""
    spec, radius = spec_from_keywords(divergence, delta, upper_cap=upper_cap, relax=relax, lower_floor=lower_floor,
                                      lower_delta=lower_delta)  # fmt: skip
    return spec_bounds_with_edge(spec, old_log_probs, radius)


@torch.no_grad()
def spec_bounds(spec: BandSpec, old_log_probs: Tensor, radius: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(lower, upper) ratio bounds of any rule (trust_region, dppo, dcpo), floor and cap included:
    what an objective other than PPO's clipped min takes from a spec. `radius`: a per-call radius
    tensor in place of spec.delta (per token, or per sequence (B, 1) / (B,)). Shapes and dtypes as
    `band_bounds`."""
    spec.check_radius(radius)
    lower, upper, _ = RULES[spec.rule].bounds(spec, old_log_probs, radius, True)
    return lower, upper


@torch.no_grad()
def spec_bounds_with_edge(
    spec: BandSpec,
    old_log_probs: Tensor,
    radius: Tensor | None = None,
    *,
    apply_floor: bool = True,
    roots_only: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The roots of a trust_region or dppo spec (validated when built: nothing is re-checked) with
    relax, the floor (unless `apply_floor` is False: the loss applies it itself, to flag the
    tokens it alone clips) and the cap, plus `upper_at_edge` (bool, same shape): the upper bound
    is the simplex edge 1/p itself (saturated, p = 1, or a bound that rounds to 1/p in the output
    dtype, as kl's upper bound does as p -> 1) and neither the cap nor relax moved it. No ratio a
    probability can reach exceeds that bound, so the loss never clips there: compared as ratios,
    float32 rounding of exp(log q - log p) against float32(1/p) could say otherwise at q = 1. The
    kernel applies the same rule to the same float32 bound. The lower floor and lower_delta move
    only the lower bound, so the flag is the same with or without them. `roots_only`: the roots
    (the lower one at lower_delta) before relax, floor and cap, for a kernel that applies those."""
    div = get_divergence(spec.divergence)
    delta = spec.delta if radius is None else radius
    lower, upper, at_edge, shape = _unmoved_bounds(old_log_probs, div, delta)
    if spec.lower_delta is not None and spec.lower_delta != spec.delta:
        lower, _, _, _ = _unmoved_bounds(old_log_probs, div, spec.lower_delta)
    if roots_only:
        return lower.reshape(shape), upper.reshape(shape), at_edge.reshape(shape)
    relax, upper_cap = spec.relax, spec.upper_cap
    if relax is not None:
        lower = lower.clamp_(max=1.0 - relax[0])
        at_edge = at_edge & (upper >= 1.0 + relax[1])
        upper = upper.clamp_(min=1.0 + relax[1])
    if apply_floor and spec.lower_floor is not None:  # clamp keeps a nan bound nan
        lower = lower.clamp_(min=spec.lower_floor)
    if upper_cap is not None:
        at_edge = at_edge & (upper <= upper_cap)
        upper = upper.clamp_(max=upper_cap)
    return lower.reshape(shape), upper.reshape(shape), at_edge.reshape(shape)


def _unmoved_bounds(old_log_probs: Tensor, div: Divergence, delta: float | Tensor):
    """The roots (lower, upper, upper at the edge) of g = delta, flat, before relax, floor and cap;
    and the input's shape."""
    per_token = isinstance(delta, Tensor)
    if not isinstance(old_log_probs, Tensor) or not old_log_probs.is_floating_point():
        raise ValueError("old_log_probs must be a floating-point torch.Tensor of log-probabilities")
    out_dtype = torch.float64 if old_log_probs.dtype == torch.float64 else torch.float32
    shape = old_log_probs.shape
    flat = old_log_probs.detach().reshape(-1)

    if not per_token and out_dtype == torch.float32 and div.tabulate:
        lower, upper, at_edge = _tabulated_bounds_float32(div, delta, flat)
        return lower, upper, at_edge, shape
    if not per_token and out_dtype == torch.float32 and div.edge_inverse is not None:
        lower, upper, at_edge = _edge_table_bounds_float32(div, delta, flat)
        return lower, upper, at_edge | _rounds_to_edge(upper, flat), shape

    valid = None
    if per_token:
        delta, valid = _per_token_delta(delta, shape, div)
    x = flat.to(torch.float64, copy=True).clamp_(max=0.0)
    p, one_minus_p = torch.exp(x), -torch.expm1(x)
    if div.closed_form is not None:
        lower, upper = div.closed_form(x, p, one_minus_p, delta)
    elif div.tabulate and not per_token:
        lower, upper = _tabulated_numeric_roots(div, delta, x)
    elif per_token:
        lower, upper = _per_token_roots(div, delta, x)
    else:
        lower, upper = _solved_roots(div, delta, x)

    at_one = x == 0.0
    at_edge = at_one
    if div.g_at_upper_edge is not None:  # saturation (Proposition 3); kl never saturates
        saturated_up = div.g_at_upper_edge(x, p, one_minus_p) <= delta
        upper = torch.where(saturated_up, torch.neg(x).exp_(), upper, out=upper)
        lower = lower.masked_fill_(div.g_at_lower_edge(x, p, one_minus_p) <= delta, 0.0)
        at_edge = at_edge | saturated_up
    # p = 1 (log p = 0) is the p -> 1 limit, where the formulas meet 0 * inf; p = 0 comes out of
    # every formula above as [0, inf] (or its saturated equivalent) already
    lower = torch.where(at_one, div.lower_at_p_one(delta), lower)
    upper = upper.masked_fill_(at_one, 1.0)
    if valid is not None:
        lower, upper = lower.masked_fill_(~valid, math.nan), upper.masked_fill_(~valid, math.nan)
        at_edge = at_edge & valid
    lower, upper = lower.to(out_dtype), upper.to(out_dtype)
    return lower, upper, at_edge | _rounds_to_edge(upper, flat), shape


def _rounds_to_edge(upper: Tensor, x: Tensor) -> Tensor:
    """Where the upper bound, as the output dtype holds it, has reached the simplex edge 1/p rounded to
    that dtype. kl never saturates, but as p -> 1 its upper root is within (1 - p) exp(-delta / (1 - p))
    of 1/p, far below float32 resolution: such a bound is the edge, and the loss decides it in log
    space as it does a saturated one (clipped only if q > 1), on both backends alike."""
    edge = torch.neg(x.to(torch.float64)).clamp_(min=0.0).exp_().to(upper.dtype)
    return upper >= edge
