"""The fused Triton Band loss (``backend="triton"``) against the pure-torch reference, and both
against the loss and gradient rule written out by hand (band-math.md, "The loss").

The kernel runs on CPU in Triton's interpreter. Whether ``triton.jit`` builds an interpreted
kernel is decided when ``openrlhf_band.ops.band_loss`` is first imported, so TRITON_INTERPRET=1
is set below before any ``openrlhf_band`` import (other modules importing ``openrlhf_band.band.bounds``
earlier is harmless: it does not import the kernel module). If the kernel module was nevertheless
already imported without the interpreter (e.g. by a GPU test module collected earlier in the same
process), it is reloaded so that its kernels are interpreted; the dispatcher imports it lazily
from ``sys.modules``, so it picks up the reloaded kernels. Each test also pins the variable with
``monkeypatch`` (autouse fixture), because the dispatcher re-reads it at call time for CPU tensors.

With OPENRLHF_BAND_TEST_DEVICE=cuda the same tests run on a GPU instead: the kernel compiled for it,
both backends on CUDA tensors (tests/support/kernel_device.py); the tests of the interpreter's own
rules are skipped there.

Test inputs keep every ratio at least ``MARGIN`` (in log space) away from the bounds, from the
dual-clip threshold and from the +-20 log-ratio clamp: both backends round a float64 band to
float32, but by different routes (kernel tables or solver vs band_bounds), so a ratio within a
few ulps of a bound could legitimately land on different sides of it in the two backends.
Runtime: interpreter launches cost ~15-20 ms per 1024-element program, so inputs stay small
except for two long-row cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kernel_device import ON_CUDA, kernel_module, on_device, pin_interpreter, prepare_environment

prepare_environment()  # before openrlhf_band.ops.band_loss is imported (see above)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from kernel_device import skip_module_without_device  # noqa: E402

skip_module_without_device()

import openrlhf_band.functional as functional  # noqa: E402
from openrlhf_band import DIVERGENCES, band_bounds  # noqa: E402
from openrlhf_band.functional import band_token_loss  # noqa: E402
from openrlhf_band.ops.reference import LOG_RATIO_CLAMP  # noqa: E402

band_loss_module = kernel_module()
band_token_loss = on_device(band_token_loss)  # noqa: F811 - the same function, on the tests' device
cpu_only = pytest.mark.skipif(ON_CUDA, reason="a rule of the CPU interpreter path")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    pin_interpreter(monkeypatch)


# ----------------------------------------------------------------------------------------------
# tolerances
# ----------------------------------------------------------------------------------------------
# Bounds: the kernel evaluates the band in float64 and rounds once to float32, as band_bounds (the
# reference's band) does; the two agree to a few float32 ulps (tables vs solver, rounding order;
# one ulp is 2^-24..2^-23 ~ 6e-8..1.2e-7 relative, so 1e-6 allows ~8-16).
# Tiny lower bounds (kl's r_low is ~1e-23 at p = 1e-3) are compared with the absolute floor 1e-6,
# which is far below anything that can change a clip decision for ratios near 1.
BOUNDS_ATOL, BOUNDS_RTOL = 1e-6, 1e-6
# The loss is float32 for float32 and bfloat16 log_probs alike, computed from the same inputs;
# at clipped tokens it is bound * A, so it inherits the bounds' relative tolerance.
LOSS_ATOL, LOSS_RTOL = 1e-6, 2e-5
# Gradients (dtype of log_probs): float32 -r A agrees to a few ulps; bfloat16 gradients are the
# same float32 value rounded to bfloat16 by each backend, which may differ by one bf16 ulp
# (2^-8 relative) when the float32 values straddle a rounding boundary.
DTYPE_TOLS = [
    pytest.param(torch.float32, 1e-6, 1e-5, id="fp32"),
    pytest.param(torch.bfloat16, 1e-6, 8e-3, id="bf16"),
]
MARGIN = 1e-3  # minimum |log r - log(edge)| in generated inputs (see module docstring)


# ----------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------
@dataclass
class Case:
    log_probs: torch.Tensor  # no grad; run() clones it into a leaf
    old: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor | None
    upstream: torch.Tensor  # float32, shape of log_probs
    opts: dict


def _edges(old: torch.Tensor, opts: dict) -> list[torch.Tensor]:
    """log of every ratio value where the loss changes branch, float64, shape of old."""
    lower, upper = band_bounds(
        old.float(),
        opts.get("divergence", "kl"),
        opts.get("delta", 0.05),
        upper_cap=opts.get("upper_cap"),
        relax=opts.get("relax"),
    )
    edges = [lower.double().log(), upper.double().log()]
    edges += [torch.full_like(edges[0], LOG_RATIO_CLAMP), torch.full_like(edges[0], -LOG_RATIO_CLAMP)]
    if opts.get("dual_clip") is not None:
        edges.append(torch.full_like(edges[0], math.log(opts["dual_clip"])))
    return edges


def make_case(
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    old_dtype: torch.dtype | None = None,
    adv: str = "token",
    seed: int = 0,
    neglogp_range: tuple[float, float] = (1e-3, 12.0),
    **opts,
) -> Case:
    """Random inputs with p = exp(old) log-spread over (6e-6, 0.999), ratios from a mixture of
    scales (mostly inside narrow bands, many clipped, ~3% beyond the +-20 log-ratio clamp), all
    at least MARGIN away from every branch edge after rounding to `dtype`."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    old_dtype = old_dtype or dtype
    lo, hi = math.log(neglogp_range[0]), math.log(neglogp_range[1])
    old = (-torch.empty(n, dtype=torch.float64).uniform_(lo, hi, generator=g).exp()).to(old_dtype)
    edges = _edges(old, opts)
    old64 = old.double()
    log_probs = torch.zeros(n, dtype=dtype)
    todo = torch.ones(n, dtype=torch.bool)
    scales = torch.tensor([0.03, 0.2, 1.0, 3.0], dtype=torch.float64)
    for _ in range(60):
        pick = torch.randint(0, len(scales), (n,), generator=g)
        log_ratio = torch.randn(n, dtype=torch.float64, generator=g) * scales[pick]
        beyond = torch.rand(n, generator=g, dtype=torch.float64) < 0.03
        log_ratio = torch.where(beyond, torch.sign(log_ratio) * 25.0, log_ratio)
        candidate = (old64 + log_ratio).to(dtype)
        actual = candidate.double() - old64
        far = torch.ones(n, dtype=torch.bool)
        for edge in edges:
            far &= ~((actual - edge).abs() < MARGIN)  # nan-safe: an edge of nan never blocks
        accept = todo & far
        log_probs = torch.where(accept, candidate, log_probs)
        todo &= ~accept
        if not todo.any():
            break
    assert not todo.any(), "could not place every ratio away from the branch edges"

    advantages = torch.randn(n, generator=g)
    advantages[torch.rand(n, generator=g) < 0.05] = 0.0
    if adv == "token":
        advantages = advantages.reshape(shape)
    else:
        b = shape[0]
        per_seq = torch.randn(b, generator=g)
        advantages = per_seq[:, None] if adv == "seq2" else per_seq  # (B, 1) or (B,)
    upstream = torch.randn(shape, generator=g)
    if isinstance(opts.get("delta"), torch.Tensor) and opts["delta"].numel() == n:  # per token, made flat
        opts = {**opts, "delta": opts["delta"].reshape(shape)}
    return Case(log_probs.reshape(shape), old.reshape(shape), advantages, None, upstream, opts)


def run(case: Case, backend: str, **overrides):
    """(outputs, d(sum(loss * upstream)) / d log_probs) for one backend."""
    lp = case.log_probs.detach().clone().requires_grad_()
    opts = {**case.opts, **overrides}
    out = band_token_loss(lp, case.old, case.adv, case.mask, backend=backend, return_bounds=True, **opts)
    (grad,) = torch.autograd.grad(out.loss, lp, grad_outputs=case.upstream)
    return out, grad


def assert_outputs_match(case: Case, atol: float, rtol: float, **overrides):
    """Triton vs torch: loss, gradient, flags and bounds; returns both (outputs, grad) pairs."""
    (kout, kgrad), (rout, rgrad) = run(case, "triton", **overrides), run(case, "torch", **overrides)
    shape = case.log_probs.shape
    assert kout.loss.dtype == rout.loss.dtype == torch.float32
    assert kout.loss.shape == rout.loss.shape == shape
    assert kgrad.dtype == rgrad.dtype == case.log_probs.dtype
    assert kgrad.shape == shape
    torch.testing.assert_close(kout.loss, rout.loss, atol=LOSS_ATOL, rtol=LOSS_RTOL)
    torch.testing.assert_close(kgrad, rgrad, atol=atol, rtol=rtol)
    for name in ("clipped_upper", "clipped_lower", "dual_clipped"):
        k, r = getattr(kout, name), getattr(rout, name)
        assert k.dtype == torch.bool and k.shape == shape, name
        # exact on every CPU: make_case keeps each log-ratio MARGIN (1e-3) from every edge, ~1e4 times
        # the float32 rounding by which the backends' ratios and bounds differ
        assert torch.equal(k, r), f"{name}: {(k != r).sum().item()} tokens differ"
    torch.testing.assert_close(kout.lower, rout.lower, atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
    torch.testing.assert_close(kout.upper, rout.upper, atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
    return (kout, kgrad), (rout, rgrad)


def by_hand(case: Case, **overrides):
    """The loss, flags and d(sum(loss * upstream))/d log_probs from band-math.md, in float64,
    with the band from band_bounds: loss = -min(r A, clip(r, lo, hi) A) (for A < 0 floored at
    c A when dual-clipping), gradient -r A * upstream where the unclipped branch is active."""
    opts = {**case.opts, **overrides}
    shape = case.log_probs.shape
    mask = torch.ones(shape, dtype=torch.bool) if case.mask is None else case.mask != 0
    adv = case.adv[:, None] if case.adv.dim() == 1 and len(shape) == 2 else case.adv
    adv = torch.where(mask, adv.expand(shape).double(), 0.0)
    old = torch.where(mask, case.old.double(), 0.0)
    raw = torch.where(mask, case.log_probs.double(), 0.0) - old
    r = raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    lo, hi = band_bounds(
        old.float(),
        opts.get("divergence", "kl"),
        opts.get("delta", 0.05),
        upper_cap=opts.get("upper_cap"),
        relax=opts.get("relax"),
    )
    lo, hi = lo.double(), hi.double()
    clip1 = torch.minimum(r * adv, torch.minimum(torch.maximum(r, lo), hi) * adv)
    dual = torch.zeros(shape, dtype=torch.bool)
    if opts.get("dual_clip") is not None:
        dual = (adv < 0) & (opts["dual_clip"] * adv > clip1) & mask
        clip1 = torch.where(dual, opts["dual_clip"] * adv, clip1)
    loss = torch.where(mask, -clip1, 0.0)
    clipped_upper = mask & (adv > 0) & (r > hi)
    clipped_lower = mask & (adv < 0) & (r < lo)
    active = mask & ~clipped_upper & ~clipped_lower & ~dual & (raw.abs() <= LOG_RATIO_CLAMP)
    grad = torch.where(active, -r * adv * case.upstream.double(), 0.0)
    return loss, grad, clipped_upper, clipped_lower, dual, active


# ----------------------------------------------------------------------------------------------
# values and gradients vs the reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, atol, rtol", DTYPE_TOLS)
@pytest.mark.parametrize("shape", [(3, 47), (47,)], ids=["3x47", "1d"])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_matches_reference(divergence, shape, dtype, atol, rtol):
    seed = 10 * DIVERGENCES.index(divergence) + len(shape)
    case = make_case(shape, dtype=dtype, divergence=divergence, seed=seed)
    (kout, kgrad), _ = assert_outputs_match(case, atol, rtol)
    # the inputs exercise both branches and both clip sides (else the comparison is vacuous)
    assert kout.clipped_upper.any() and kout.clipped_lower.any()
    assert (kgrad != 0).any() and (kgrad == 0).any()


@pytest.mark.parametrize(
    "divergence, dtype, atol, rtol, opts",
    [
        pytest.param("kl", torch.float32, 1e-6, 1e-5, {"dual_clip": 3.0, "upper_cap": 10.0}, id="kl-fp32"),
        pytest.param("hellinger", torch.bfloat16, 1e-6, 8e-3, {}, id="hellinger-bf16"),
    ],
)
def test_matches_reference_long_row(divergence, dtype, atol, rtol, opts):
    """One 70,000-token row: 69 programs, the last one partial."""
    case = make_case((1, 70000), dtype=dtype, divergence=divergence, seed=7, **opts)
    (kout, _), _ = assert_outputs_match(case, atol, rtol)
    assert kout.clipped_upper.sum() > 100 and kout.clipped_lower.sum() > 100


def test_bf16_log_probs_with_fp32_old_log_probs():
    case = make_case((3, 47), dtype=torch.bfloat16, old_dtype=torch.float32, divergence="kl", seed=3)
    assert_outputs_match(case, 1e-6, 8e-3)


# ----------------------------------------------------------------------------------------------
# advantages: per token, per sequence (B, 1) and (B,)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adv", ["token", "seq2", "seq1"])
@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_advantage_layouts(divergence, adv):
    case = make_case((4, 33), divergence=divergence, adv=adv, seed=11, dual_clip=3.0)
    (kout, kgrad), _ = assert_outputs_match(case, 1e-6, 1e-5)
    if adv != "token":  # same as the explicitly expanded per-token advantages
        expanded = (case.adv[:, None] if case.adv.dim() == 1 else case.adv).expand(4, 33).contiguous()
        eout, egrad = run(replace(case, adv=expanded), "triton")
        # the same kernel on the same values (only adv's strides differ): the same float32 ops per token
        assert torch.equal(kout.loss, eout.loss) and torch.equal(kgrad, egrad)


# ----------------------------------------------------------------------------------------------
# masks
# ----------------------------------------------------------------------------------------------
def _mask(shape, seed=5, all_masked_row=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < 0.7
    mask[all_masked_row] = False
    mask[0, 0] = True
    return mask


MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_mask_dtypes(mask_dtype):
    case = make_case((4, 40), divergence="kl", seed=2, dual_clip=3.0)
    mask = _mask((4, 40))
    case = replace(case, mask=mask.to(mask_dtype))
    (kout, kgrad), _ = assert_outputs_match(case, 1e-6, 1e-5)
    assert torch.equal(kout.loss[~mask], torch.zeros((~mask).sum().item()))
    assert torch.equal(kgrad[~mask], torch.zeros((~mask).sum().item()))
    assert (kout.loss[1] == 0).all() and (kgrad[1] == 0).all()  # the all-masked row
    # every flag is off and the returned bounds are 1 at masked positions
    for flag in (kout.clipped_upper, kout.clipped_lower, kout.dual_clipped):
        assert not flag[~mask].any()
    assert (kout.lower[~mask] == 1).all() and (kout.upper[~mask] == 1).all()
    # same result as the mask's bool version, and as unmasked-then-zeroed: exact on every CPU, as the
    # kernel's arithmetic is per token (no reduction across tokens) and the mask only selects
    bool_out, bool_grad = run(replace(case, mask=mask), "triton")
    assert torch.equal(kout.loss, bool_out.loss) and torch.equal(kgrad, bool_grad)
    full_out, full_grad = run(replace(case, mask=None), "triton")
    assert torch.equal(kout.loss, torch.where(mask, full_out.loss, 0.0))
    assert torch.equal(kgrad, torch.where(mask, full_grad, 0.0))


GARBAGE = [math.nan, math.inf, -math.inf, 1e30, -1e30]


@pytest.mark.parametrize("adv", ["token", "seq2"])
@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_garbage_at_masked_positions(divergence, dtype, adv):
    """nan / +-inf / +-1e30 in log_probs, old_log_probs and advantages where the mask is 0 (with
    per-sequence advantages: nan as the all-masked row's advantage), and a nan upstream gradient
    there: loss and gradient exactly 0 there, finite and unchanged elsewhere."""
    shape = (4, 40)
    clean = make_case(shape, dtype=dtype, divergence=divergence, adv=adv, seed=4, dual_clip=3.0, upper_cap=10.0)
    mask = _mask(shape)  # row 1 entirely masked
    masked = (~mask).nonzero()
    lp, old, advs, up = (t.clone() for t in (clean.log_probs, clean.old, clean.adv, clean.upstream))
    for i, (b, t) in enumerate(masked.tolist()):
        lp[b, t] = GARBAGE[i % len(GARBAGE)]
        old[b, t] = GARBAGE[(i + 1) % len(GARBAGE)]
        if adv == "token":
            advs[b, t] = GARBAGE[(i + 2) % len(GARBAGE)]
        up[b, t] = math.nan
    if adv != "token":
        advs[1] = math.nan
    dirty = replace(clean, log_probs=lp, old=old, adv=advs, upstream=up, mask=mask)
    (kout, kgrad), _ = assert_outputs_match(dirty, 1e-6, 8e-3 if dtype == torch.bfloat16 else 1e-5)
    n_masked = masked.shape[0]
    assert torch.equal(kout.loss[~mask], torch.zeros(n_masked))  # exactly 0, not nan
    assert torch.equal(kgrad[~mask].float(), torch.zeros(n_masked))
    assert torch.isfinite(kout.loss).all() and torch.isfinite(kgrad).all()
    # unmasked tokens are unaffected by what the masked ones hold (per-token arithmetic: exact)
    cout, cgrad = run(replace(clean, mask=mask), "triton")
    assert torch.equal(kout.loss, cout.loss) and torch.equal(kgrad, cgrad)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_nan_upstream_at_masked_positions_only(backend):
    case = make_case((3, 47), divergence="tv", seed=6)
    mask = _mask((3, 47))
    up = case.upstream.clone()
    up[~mask] = math.nan
    _, grad = run(replace(case, mask=mask, upstream=up), backend)
    assert torch.equal(grad[~mask], torch.zeros((~mask).sum().item()))
    assert torch.isfinite(grad).all()


# ----------------------------------------------------------------------------------------------
# non-contiguous inputs
# ----------------------------------------------------------------------------------------------
def _strided(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A non-contiguous tensor equal to t: a transposed copy, or every second column of a wider one."""
    if kind == "transposed":
        return t.t().contiguous().t() if t.dim() == 2 else t
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


@pytest.mark.parametrize("kind", ["transposed", "step2"])
@pytest.mark.parametrize("adv", ["token", "seq2"])
@pytest.mark.parametrize("divergence", ["kl", "reverse_kl"])
def test_non_contiguous_inputs(divergence, adv, kind):
    case = make_case((5, 24), divergence=divergence, adv=adv, seed=8, dual_clip=3.0)
    case = replace(case, mask=_mask((5, 24)))
    strided = replace(
        case,
        log_probs=_strided(case.log_probs, kind),
        old=_strided(case.old, kind),
        adv=_strided(case.adv, kind if adv == "token" else "step2"),  # (B, 1) with strides (2, 2)
        mask=_strided(case.mask, kind),
        upstream=_strided(case.upstream, kind),
    )
    for t in (strided.log_probs, strided.old, strided.adv, strided.mask, strided.upstream):
        assert not t.is_contiguous()
    (sout, sgrad), _ = assert_outputs_match(strided, 1e-6, 1e-5)
    cout, cgrad = run(case, "triton")  # the same kernel reads the same values through other strides
    assert torch.equal(sout.loss, cout.loss) and torch.equal(sgrad, cgrad)
    assert torch.equal(sout.clipped_upper, cout.clipped_upper)
    assert torch.equal(sout.upper, cout.upper) and torch.equal(sout.lower, cout.lower)


def test_non_contiguous_1d_input():
    case = make_case((60,), divergence="chi2", seed=9)
    strided = replace(
        case,
        log_probs=_strided(case.log_probs, "step2"),
        old=_strided(case.old, "step2"),
        adv=_strided(case.adv, "step2"),
        upstream=_strided(case.upstream, "step2"),
    )
    (sout, sgrad), _ = assert_outputs_match(strided, 1e-6, 1e-5)
    cout, cgrad = run(case, "triton")  # the same kernel reads the same values through other strides
    assert torch.equal(sout.loss, cout.loss) and torch.equal(sgrad, cgrad)


def test_expanded_upstream_gradient():
    """loss.sum().backward() hands the kernel an expanded (stride 0) upstream gradient."""
    case = make_case((3, 47), divergence="kl", seed=10)
    lp = case.log_probs.clone().requires_grad_()
    band_token_loss(lp, case.old, case.adv, backend="triton").loss.sum().backward()
    _, want = run(replace(case, upstream=torch.ones(3, 47)), "torch")
    torch.testing.assert_close(lp.grad, want, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# p = 1 and p = 0 at unmasked positions
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("upper_cap", [None, 10.0])
@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("per_token", [False, True], ids=["scalar", "per-token"])
def test_old_log_prob_zero_and_minus_inf(divergence, upper_cap, per_token):
    old = torch.tensor([[0.0, -0.0, -math.inf, 0.0, -math.inf, 1e-7, -1.0]])
    lp = torch.tensor([[-0.01, 0.02, -3.0, -0.5, -50.0, 0.0, -1.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -2.0, -1.0, 0.5, 1.0]])
    case = Case(lp, old, adv, None, torch.randn(1, 7, generator=torch.Generator().manual_seed(0)), {})
    delta = torch.full_like(old, 0.05) if per_token else 0.05
    opts = {"divergence": divergence, "upper_cap": upper_cap, "delta": delta}
    for backend in ("triton", "torch"):
        out, grad = run(case, backend, **opts)
        assert torch.isfinite(out.loss).all() and torch.isfinite(grad).all(), backend
        want_lo, want_hi = band_bounds(old, divergence, delta, upper_cap=upper_cap)
        torch.testing.assert_close(out.lower, want_lo, atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
        torch.testing.assert_close(out.upper, want_hi, atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
        # p = 0: the band is [0, cap or inf]; the log-ratio is +inf, clamped to 20: no gradient
        assert (out.lower[old == -math.inf] == 0).all()
        assert (out.upper[old == -math.inf] == (upper_cap or math.inf)).all()
        assert (grad[old == -math.inf] == 0).all()
        # p = 1 (also log p slightly above 0 from rounding): upper bound exactly 1
        assert (out.upper[old >= 0] == 1).all()
    assert_outputs_match(case, 1e-6, 1e-5, **opts)


# ----------------------------------------------------------------------------------------------
# dual_clip / relax / upper_cap
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("upper_cap", [None, 1.5], ids=["nocap", "cap"])
@pytest.mark.parametrize("relax", [None, (0.2, 0.28)], ids=["norelax", "relax"])
@pytest.mark.parametrize("dual_clip", [None, 3.0], ids=["nodual", "dual"])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_options(divergence, dual_clip, relax, upper_cap):
    opts = {"divergence": divergence, "dual_clip": dual_clip, "relax": relax, "upper_cap": upper_cap}
    case = make_case((3, 47), seed=12, **opts)
    (kout, kgrad), _ = assert_outputs_match(case, 1e-6, 1e-5)
    # the options take effect (so that ignoring one would be caught)
    assert kout.dual_clipped.any() == (dual_clip is not None)
    if upper_cap is not None:
        assert (kout.upper <= upper_cap).all() and (kout.upper == upper_cap).any()
        assert (kout.clipped_upper & (kout.upper == upper_cap)).any()
    if relax is not None:
        assert (kout.lower <= 1 - relax[0] + 1e-7).all() and (kout.upper >= 1 + relax[1] - 1e-7).all()
    # and both agree with the loss and gradient written out by hand
    loss, grad, cu, cl, dual, _ = by_hand(case)
    torch.testing.assert_close(kout.loss.double(), loss, atol=LOSS_ATOL, rtol=LOSS_RTOL)
    torch.testing.assert_close(kgrad.double(), grad, atol=1e-6, rtol=1e-5)
    assert torch.equal(kout.clipped_upper, cu) and torch.equal(kout.clipped_lower, cl)
    assert torch.equal(kout.dual_clipped, dual)


# ----------------------------------------------------------------------------------------------
# the bounds the kernel used
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "opts",
    [{}, {"upper_cap": 10.0}, {"relax": (0.2, 0.28)}, {"delta": 0.01}, {"delta": 0.2, "upper_cap": 3.0}],
    ids=["plain", "cap", "relax", "delta0.01", "delta0.2-cap"],
)
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_returned_bounds_equal_band_bounds(divergence, opts):
    """Over p from e^-80 to 1 (and p = 0), at unmasked positions; 1 at masked ones."""
    g = torch.Generator().manual_seed(13)
    neglogp = torch.logspace(-8, math.log10(80.0), 1000, dtype=torch.float64)
    old = torch.cat([-neglogp, torch.tensor([0.0, -0.0, -math.inf], dtype=torch.float64)]).float()
    old = old[torch.randperm(old.numel(), generator=g)].reshape(1, -1)
    mask = torch.rand(old.shape, generator=g) < 0.8
    mask[0, (old[0] == 0) | (old[0] == -math.inf)] = True
    lp = old + 0.1 * torch.randn(old.shape, generator=g)
    lp = torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))
    adv = torch.randn(old.shape, generator=g)
    out = band_token_loss(lp, old, adv, mask, divergence=divergence, backend="triton", return_bounds=True, **opts)
    delta = opts.get("delta", 0.05)
    kw = {"upper_cap": opts.get("upper_cap"), "relax": opts.get("relax")}
    want_lo, want_hi = band_bounds(old, divergence, delta, **kw)
    assert out.lower.dtype == out.upper.dtype == torch.float32
    torch.testing.assert_close(out.lower[mask], want_lo[mask], atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
    torch.testing.assert_close(out.upper[mask], want_hi[mask], atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
    assert (out.lower[~mask] == 1).all() and (out.upper[~mask] == 1).all()
    # the reference path returns band_bounds itself (the same function on the same inputs: exact)
    ref = band_token_loss(lp, old, adv, mask, divergence=divergence, backend="torch", return_bounds=True, **opts)
    assert torch.equal(ref.lower[mask], want_lo[mask]) and torch.equal(ref.upper[mask], want_hi[mask])


# ----------------------------------------------------------------------------------------------
# flags and the gradient rule, independently of the reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("divergence", ["kl", "chi2", "reverse_kl"])
def test_flags_are_sign_aware(divergence, backend):
    case = make_case((6, 50), divergence=divergence, seed=14, dual_clip=3.0, upper_cap=10.0)
    out, _ = run(case, backend)
    adv = case.adv.expand(6, 50)
    r = (case.log_probs.double() - case.old.double()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    lo, hi = out.lower.double(), out.upper.double()
    assert out.clipped_upper.any() and out.clipped_lower.any() and out.dual_clipped.any()
    # each flag implies its sign and side ...
    assert ((adv > 0) & (r > hi))[out.clipped_upper].all()
    assert ((adv < 0) & (r < lo))[out.clipped_lower].all()
    assert ((adv < 0) & (r > 3.0))[out.dual_clipped].all()
    # ... and the converse (inputs are MARGIN away from every edge, far beyond float32 rounding)
    assert torch.equal(out.clipped_upper, (adv > 0) & (r > hi))
    assert torch.equal(out.clipped_lower, (adv < 0) & (r < lo))
    assert torch.equal(out.dual_clipped, (adv < 0) & (r > 3.0))
    assert not (out.clipped_upper & out.clipped_lower).any()
    assert not (out.clipped_upper & out.dual_clipped).any()


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_gradient_rule_by_hand(divergence, dual_clip, backend):
    """d loss / d log_probs = -r A where the unclipped branch is active, else exactly 0."""
    case = make_case((3, 47), divergence=divergence, seed=15, dual_clip=dual_clip)
    case = replace(case, mask=_mask((3, 47)))
    out, grad = run(case, backend)
    loss, want_grad, _, _, _, active = by_hand(case)
    assert active.any() and (~active & (case.mask != 0)).any()
    torch.testing.assert_close(out.loss.double(), loss, atol=LOSS_ATOL, rtol=LOSS_RTOL)
    torch.testing.assert_close(grad.double(), want_grad, atol=1e-6, rtol=1e-5)
    assert (grad[~active] == 0).all()


def test_gradcheck_reference_float64():
    """autograd.gradcheck of the reference (float64) with ratios away from every edge, so that
    finite differences (eps 1e-6) never cross a branch."""
    case = make_case((2, 9), seed=16, divergence="kl", dual_clip=3.0, upper_cap=10.0)
    old = case.old.double()
    lp = case.log_probs.double().requires_grad_()
    _, _, _, _, _, active = by_hand(case)
    assert active.any() and (~active).any()

    def loss_fn(x):
        return band_token_loss(x, old, case.adv, divergence="kl", dual_clip=3.0, upper_cap=10.0, backend="torch").loss

    assert loss_fn(lp).dtype == torch.float64
    assert torch.autograd.gradcheck(loss_fn, (lp,), eps=1e-6, atol=1e-7, rtol=1e-6)


def assert_outputs_match_loss_only(case: Case, **overrides):
    """Triton vs torch: loss, float32 gradient and flags (not the returned bounds)."""
    (kout, kgrad), (rout, rgrad) = run(case, "triton", **overrides), run(case, "torch", **overrides)
    torch.testing.assert_close(kout.loss, rout.loss, atol=LOSS_ATOL, rtol=LOSS_RTOL)
    torch.testing.assert_close(kgrad, rgrad, atol=1e-6, rtol=1e-5)
    for name in ("clipped_upper", "clipped_lower", "dual_clipped"):
        assert torch.equal(getattr(kout, name), getattr(rout, name)), name
    return (kout, kgrad), (rout, rgrad)


@pytest.mark.parametrize("upper_cap", [None, 10.0])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_p_below_float32_normal_range(divergence, upper_cap):
    """log p in [-120, -85] (1/p overflows float32 below -88.7): loss, gradient and flags as the
    reference. The returned upper bound may differ there (test below), but every ratio is clamped
    to e^20 ~ 4.9e8, far below the band_bounds value (> 1e18), so no clip decision depends on it."""
    g = torch.Generator().manual_seed(17)
    old = -torch.linspace(85.0, 120.0, 71).reshape(1, -1)
    lp = old + torch.randn(old.shape, generator=g) * 5.0
    lp[0, ::7] = -1.0  # log-ratio beyond the clamp
    adv = torch.randn(old.shape, generator=g)
    case = Case(lp, old, adv, None, torch.randn(old.shape, generator=g), {"divergence": divergence})
    # (its exact flag comparison: the 71 random ratios are not MARGIN-placed, but only the cap of 10
    # can clip here, and the chance that one lies within float32 rounding of it is ~1e-6)
    (kout, kgrad), _ = assert_outputs_match_loss_only(case, upper_cap=upper_cap)
    assert torch.isfinite(kout.loss).all() and torch.isfinite(kgrad).all()
    assert kout.clipped_upper.any() == (upper_cap is not None)


# ----------------------------------------------------------------------------------------------
# former discrepancies, fixed: exact dual-clip ties, and bounds where 1/p overflows float32
# ----------------------------------------------------------------------------------------------
def test_dual_clip_tie_gradient_matches_reference():
    # r == c exactly on both backends needs a log-ratio whose float32 exp the interpreter (numpy's)
    # and torch compute alike: they differ by up to 2-3 ulps on ~40% of inputs, by CPU and SIMD path
    old = torch.tensor([[-1.0]])
    x = 1.5 + torch.arange(64, dtype=torch.float32) * 2.0**-20  # lp - old == x exactly (lp = x - 1)
    numpy_exp = np.exp(x.numpy())  # as the interpreter runs tl.exp: numpy on a contiguous block
    x = next(v for v, e in zip(x, numpy_exp) if torch.exp(v.reshape(1, 1)).item() == e)  # torch on (1, 1)
    lp = (x - 1.0).reshape(1, 1)
    dual_clip = torch.exp(lp - old).item()  # the float32 ratio, exactly (the same on both backends)
    case = Case(lp, old, torch.tensor([[-1.0]]), None, torch.ones(1, 1), {"dual_clip": dual_clip})
    _, kgrad = run(case, "triton")
    _, rgrad = run(case, "torch")
    torch.testing.assert_close(kgrad, rgrad)


@pytest.mark.parametrize("divergence", ["kl", "tv", "chi2", "hellinger"])
def test_upper_bound_when_one_over_p_overflows_float32(divergence):
    old = torch.tensor([[-89.0, -90.0]])  # band_bounds: finite upper bounds, ~1e18 .. 6e37
    out = band_token_loss(
        old.clone(), old, torch.ones(1, 2), divergence=divergence, backend="triton", return_bounds=True
    )
    want_lo, want_hi = band_bounds(old, divergence, 0.05)
    assert torch.isfinite(want_hi).all()
    torch.testing.assert_close(out.upper, want_hi, atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)


# ----------------------------------------------------------------------------------------------
# rejected options
# ----------------------------------------------------------------------------------------------
def _args(shape=(2, 5)):
    lp = torch.zeros(shape, requires_grad=True)
    return lp, torch.full(shape, -0.5), torch.ones(shape)


@pytest.mark.parametrize("backend", ["triton", "torch", "auto"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"divergence": "nope"},
        {"divergence": "KL"},
        {"delta": 0.0},
        {"delta": -0.05},
        {"delta": math.nan},
        {"delta": math.inf},
        {"dual_clip": 1.0},
        {"dual_clip": 0.5},
        {"dual_clip": -3.0},
        {"dual_clip": math.nan},
        {"upper_cap": 0.5},
        {"relax": (0.2,)},
        {"relax": (1.5, 0.2)},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_rejected_options(kwargs, backend):
    lp, old, adv = _args()
    with pytest.raises(ValueError):
        band_token_loss(lp, old, adv, backend=backend, **kwargs)


def test_rejected_backend():
    lp, old, adv = _args()
    with pytest.raises(ValueError, match="backend"):
        band_token_loss(lp, old, adv, backend="nope")


# Advantages other than (B, T), (B, 1), (B,) are shape errors (functional.band_token_loss's
# docstring), rejected by the dispatcher for both backends alike.
SHAPE_MISMATCHES = [
    (what, shape, backend, [])
    for what, shape in [
        ("old", (2, 6)),
        ("old", (5, 2)),
        ("old", (10,)),
        ("mask", (2, 6)),
        ("mask", (1, 5)),
        ("adv", (2, 6)),
        ("adv", (3, 5)),
        ("adv", (3, 1)),
        ("adv", (3,)),  # (B + 1,)
        ("adv", (5,)),  # (T,)
        ("adv", (10,)),  # (B * T,)
    ]
    for backend in ("triton", "torch")
]


@pytest.mark.parametrize(
    "what, shape, backend",
    [pytest.param(w, s, b, marks=m, id=f"{w}{list(s)}-{b}") for w, s, b, m in SHAPE_MISMATCHES],
)
def test_shape_mismatches(what, shape, backend):
    """log_probs is (2, 5); each case gives one argument a shape that does not fit."""
    lp, old, adv = _args()
    mask = None
    if what == "old":
        old = torch.full(shape, -0.5)
    elif what == "mask":
        mask = torch.ones(shape, dtype=torch.bool)
    else:
        adv = torch.ones(shape)
    with pytest.raises(ValueError):
        band_token_loss(lp, old, adv, mask, backend=backend)


@cpu_only
@pytest.mark.parametrize("value", [None, "0"])
def test_triton_on_cpu_needs_interpreter(monkeypatch, value):
    """The dispatcher reads TRITON_INTERPRET at call time: without "1", a CPU tensor is refused."""
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert not functional._triton_usable(torch.device("cpu"))
    lp, old, adv = _args()
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        functional.band_token_loss(lp, old, adv, backend="triton")
    # "auto" on CPU still works (torch path); "1" makes the triton path usable again
    assert torch.isfinite(functional.band_token_loss(lp, old, adv, backend="auto").loss).all()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert torch.isfinite(functional.band_token_loss(lp, old, adv, backend="triton").loss).all()


# ----------------------------------------------------------------------------------------------
# per-token radius, the kernel's own band against the oracle, exact decisions at the simplex edge
# ----------------------------------------------------------------------------------------------
def _random_deltas(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (10 ** torch.empty(n, dtype=torch.float64).uniform_(-4, 0, generator=g)).float()


@pytest.mark.parametrize("dtype, atol, rtol", DTYPE_TOLS)
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_per_token_delta_matches_reference(divergence, dtype, atol, rtol):
    n = 3 * 47
    case = make_case((3, 47), dtype=dtype, seed=40 + DIVERGENCES.index(divergence), divergence=divergence,
                     delta=_random_deltas(n, seed=1), upper_cap=10.0)  # fmt: skip
    assert_outputs_match(case, atol, rtol)


@pytest.mark.parametrize("layout", ["seq2", "seq1"])
def test_per_sequence_delta(layout):
    per_seq = torch.tensor([0.01, 0.05, 0.3])
    delta = per_seq[:, None] if layout == "seq2" else per_seq
    flat = per_seq[:, None].expand(3, 47).reshape(-1)
    case = make_case((3, 47), seed=51, divergence="kl", delta=flat)
    for backend in ("triton", "torch"):
        by_row, _ = run(case, backend, delta=delta)
        by_token, _ = run(case, backend)
        # the same float64 band from the same radii, read through other strides, rounded once to
        # float32 (a float64 exp / log taking another SIMD path for another layout moves it by a
        # float64 ulp, which changes the float32 result with probability ~2^-29 per token)
        assert torch.equal(by_row.loss, by_token.loss) and torch.equal(by_row.upper, by_token.upper), backend


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_a_constant_delta_tensor_gives_the_scalar_result(divergence):
    case = make_case((3, 47), seed=61, divergence=divergence, delta=0.05)
    for backend in ("triton", "torch"):
        scalar, scalar_grad = run(case, backend)
        tensor, tensor_grad = run(case, backend, delta=torch.full((3, 47), 0.05))
        # kl / reverse_kl: a table for the scalar, a solver for the tensor, each rounded once to float32:
        # a float32 ulp or two apart (~1.2e-7 each), and so are the loss and gradient (bound * A)
        torch.testing.assert_close(tensor.loss, scalar.loss, atol=1e-6, rtol=2e-6)
        torch.testing.assert_close(tensor_grad, scalar_grad, atol=1e-6, rtol=2e-6)
        torch.testing.assert_close(tensor.upper, scalar.upper, atol=1e-6, rtol=2e-6)
        for name in ("clipped_upper", "clipped_lower"):  # exact: MARGIN-placed ratios
            assert torch.equal(getattr(tensor, name), getattr(scalar, name)), (backend, name)


def _oracle_pairs(seed: int) -> list[tuple[float, float]]:
    """(log p, delta) exact in float32: p log-uniform down to 1e-20, 1 - p down to 1e-6, p = 1."""
    g = torch.Generator().manual_seed(seed)
    small = -(10 ** torch.empty(60, dtype=torch.float64).uniform_(math.log10(0.7), math.log10(46.0), generator=g))
    near_one = torch.log1p(-(10 ** torch.empty(60, dtype=torch.float64).uniform_(-6, math.log10(0.5), generator=g)))
    log_p = torch.cat([small, near_one, torch.zeros(1)]).float()
    delta = (10 ** torch.empty(len(log_p), dtype=torch.float64).uniform_(-4, 0, generator=g)).float()
    return list(zip(log_p.tolist(), delta.tolist()))


@pytest.mark.parametrize("per_token", [False, True], ids=["scalar", "per-token"])
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_kernel_band_against_the_oracle(divergence, per_token):
    """The kernel's own band (returned bounds) within 1e-6 max(exact, 1) of the exact roots."""
    pytest.importorskip("mpmath")  # the oracle (tests/support/band_exact.py); absent from bare GPU images
    import band_exact as X

    pairs = _oracle_pairs(seed=DIVERGENCES.index(divergence))
    old = torch.tensor([lp for lp, _ in pairs])
    deltas = torch.tensor([d for _, d in pairs])
    delta = deltas if per_token else 0.05
    out = band_token_loss(old.clone().requires_grad_(), old, torch.zeros_like(old), divergence=divergence,
                          delta=delta, backend="triton", return_bounds=True)  # fmt: skip
    worst = 0.0
    for i, (log_p, _) in enumerate(pairs):
        exact = X.exact_bounds(divergence, log_p, float(deltas[i]) if per_token else 0.05)[:2]
        for ours, want in zip((out.lower[i], out.upper[i]), exact):
            worst = max(worst, abs(float(ours) - float(want)) / max(float(want), 1.0))
    assert worst <= 1e-6, worst


SATURATING = [("tv", 0.05, 0.97), ("chi2", 0.05, 0.97), ("hellinger", 0.05, 0.99), ("reverse_kl", 0.05, 0.97)]


@pytest.mark.parametrize("per_token", [False, True], ids=["scalar", "per-token"])
@pytest.mark.parametrize("divergence, delta, p", SATURATING)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_ratio_on_the_saturated_edge_is_inside_the_band(divergence, delta, p, per_token, backend):
    """q = 1 (new log-prob 0) where the upper bound is the edge 1/p, and p = 1 exactly: never
    clipped (float32 exp(-log p) may round above float32(1/p)); q > 1 (invalid) is clipped."""
    ps = torch.linspace(p, 1.0 - 1e-6, 1000, dtype=torch.float64)
    old = torch.cat([torch.log(ps).float(), torch.zeros(24)])  # p in [p, 1 - 1e-6], and p = 1
    lower, upper = band_bounds(old, divergence, delta)
    # all saturated: the edge is float32(exp(-log p)) computed in float64, as here (two float64 exps an
    # ulp apart give another float32 with probability ~2^-29 per value)
    assert torch.equal(upper[:1000].double(), torch.exp(-old[:1000].double()).float().double())
    delta_arg = torch.full_like(old, delta) if per_token else delta
    adv = torch.ones_like(old)
    for new, clipped in ((torch.zeros_like(old), False), (torch.full_like(old, 1e-3), True)):
        out = band_token_loss(new.clone().requires_grad_(), old, adv, divergence=divergence, delta=delta_arg,
                              backend=backend)  # fmt: skip
        assert bool(out.clipped_upper.all()) if clipped else not out.clipped_upper.any(), (backend, clipped)
        if not clipped:  # and the gradient flows: -r A
            lp = new.clone().requires_grad_()
            out = band_token_loss(lp, old, adv, divergence=divergence, delta=delta_arg, backend=backend)
            (grad,) = torch.autograd.grad(out.loss.sum(), lp)
            # -r A with A = 1: float32 exp on each side, a few ulps apart (1e-6 ~ 8-16 ulps)
            torch.testing.assert_close(grad, -torch.exp(-old), rtol=1e-6, atol=1e-6)


def test_masked_tokens_with_invalid_delta_stay_zero():
    case = make_case((3, 47), seed=71, divergence="kl")
    delta = torch.full((3, 47), 0.05)
    mask = torch.ones(3, 47, dtype=torch.bool)
    mask[:, ::3] = False
    delta[~mask] = torch.tensor([math.nan, -1.0, 0.0, math.inf]).repeat(100)[: int((~mask).sum())]
    for backend in ("triton", "torch"):
        lp = case.log_probs.clone().requires_grad_()
        out = band_token_loss(lp, case.old, case.adv, mask, divergence="kl", delta=delta, backend=backend)
        (grad,) = torch.autograd.grad(out.loss, lp, grad_outputs=case.upstream)
        assert torch.isfinite(out.loss).all() and (out.loss[~mask] == 0).all(), backend
        assert torch.isfinite(grad).all() and (grad[~mask] == 0).all(), backend


# kl never saturates, but as p -> 1 its upper root is within (1 - p) exp(-delta / (1 - p)) of 1/p,
# below float32 resolution: on the grid p = 1 - 10^(-k/7), k = 7..59, the 60-digit upper bound of
# most points rounds to float32(1/p). The rule on both backends: such a bound is the edge, so q = 1
# (new log-prob exactly 0) is inside the band, and q > 1 is clipped.
KL_EDGE_GRID = [math.log1p(-(10.0 ** (-k / 7))) for k in range(7, 60)]


@pytest.mark.parametrize("per_token", [False, True], ids=["scalar", "per-token"])
@pytest.mark.parametrize("delta", [0.05, 0.003])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_kl_bound_that_rounds_to_the_edge_is_the_edge(delta, per_token, backend):
    pytest.importorskip("mpmath")  # the oracle (tests/support/band_exact.py); absent from bare GPU images
    import band_exact as X

    old = torch.tensor(KL_EDGE_GRID, dtype=torch.float32)
    edge32 = torch.exp(-old.double()).float()
    exact_up = [X.exact_bounds("kl", float(x), delta)[1] for x in old.tolist()]
    on_edge = torch.tensor([float(torch.tensor(float(up)).float()) == float(e) for up, e in zip(exact_up, edge32)])
    assert on_edge.sum() >= 15 and (~on_edge).sum() >= 5, "the grid must hold both kinds of points"
    delta_arg = torch.full_like(old, delta) if per_token else delta
    adv = torch.ones_like(old)
    out = band_token_loss(torch.zeros_like(old), old, adv, divergence="kl", delta=delta_arg, backend=backend,
                          return_bounds=True)  # fmt: skip
    # the returned bound is the edge exactly where the 60-digit bound rounds to it (float32 of a float64
    # exp(-log p) on both sides: see test_a_ratio_on_the_saturated_edge_is_inside_the_band)
    assert torch.equal(out.upper[on_edge], edge32[on_edge])
    assert not out.clipped_upper[on_edge].any(), old[on_edge & out.clipped_upper]
    # q > 1 (an invalid new log-prob, one float32 step above 0) is clipped there
    above = band_token_loss(torch.full_like(old, 1e-6), old, adv, divergence="kl", delta=delta_arg, backend=backend)
    assert above.clipped_upper[on_edge].all()


@pytest.mark.parametrize("divergence", ["kl", "reverse_kl"])
def test_kernel_per_token_band_over_the_whole_radius_range(divergence):
    """The kernel's start table and Halley steps over PER_TOKEN_DELTA_RANGE ([1e-8, 10]) against the
    60-digit roots, p near reverse_kl's saturation edges included; just outside the range: nan."""
    pytest.importorskip("mpmath")  # the oracle (tests/support/band_exact.py); absent from bare GPU images
    import band_exact as X
    from band_samples import whole_range_pairs

    from openrlhf_band.band.bounds import PER_TOKEN_DELTA_RANGE

    pairs = whole_range_pairs(160, seed=11 + (divergence == "kl"))
    old = torch.tensor([lp for lp, _ in pairs])
    deltas = torch.tensor([d for _, d in pairs]).clamp(*PER_TOKEN_DELTA_RANGE)
    out = band_token_loss(old.clone(), old, torch.zeros_like(old), divergence=divergence, delta=deltas,
                          backend="triton", return_bounds=True)  # fmt: skip
    fails = X.check_against_oracle
    failures = []
    for i, log_p in enumerate(old.tolist()):
        failures += fails(divergence, float(deltas[i]), [log_p], [float(out.lower[i])], [float(out.upper[i])],
                          rtol=2e-6, flag_rtol=8 * torch.finfo(torch.float32).eps,
                          tiny=torch.finfo(torch.float32).tiny, tie_rtol=1e-9)  # fmt: skip
    assert not failures, "\n".join(failures[:10])
    outside = torch.tensor([PER_TOKEN_DELTA_RANGE[0] * 0.99, PER_TOKEN_DELTA_RANGE[1] * 1.01])
    out = band_token_loss(old[:2].clone(), old[:2], torch.ones(2), divergence=divergence, delta=outside,
                          backend="triton", return_bounds=True)  # fmt: skip
    assert torch.isnan(out.lower).all() and torch.isnan(out.upper).all()


@pytest.mark.parametrize("divergence", ["kl", "reverse_kl"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_per_token_band_for_log_probs_below_float64_range(divergence, backend):
    """A float32 log-prob of -720 (p below the smallest normal float64, b = delta / p overflows):
    the lower bound is 0 and the upper bound finite on both backends, not nan (a Halley step of
    inf times f'' = 0 once gave nan on the torch path)."""
    old = torch.tensor([-720.0, -740.0, -80.0, -0.5])
    delta = torch.tensor([0.05, 10.0, 1e-8, 0.05])
    out = band_token_loss(old.clone(), old, torch.ones(4), divergence=divergence, delta=delta, backend=backend,
                          return_bounds=True)  # fmt: skip
    assert torch.isfinite(out.lower).all() and torch.isfinite(out.loss).all(), (out.lower, out.upper)
    assert (out.lower[:2] == 0).all()
    want_lower, want_upper = band_bounds(old.double(), divergence, delta.double())
    assert torch.isfinite(want_lower).all(), want_lower
