"""The contract both backends of `band_token_loss` follow (openrlhf_band/functional.py's module
docstring), one rule per section:

1. a 1-D radius of length B against (B, T) is per sequence, also when B == T;
2. the gradient is OpenRLHF 0.11.2's PolicyLoss gradient, ties included (torch.min / torch.max
   split it in half), checked against the installed PolicyLoss itself;
3. user-supplied bounds with lower > upper at an unmasked token are refused (ValueError);
4. float64: backend="triton" refuses it, "auto" sends it to the torch reference;
5. an unmasked NaN advantage gives NaN loss and gradient at its token, a masked one exactly 0;
6. backend="auto" falls back to the torch reference, with one warning per process and kernel
   variant, when the kernel fails to compile; backend="triton" raises RuntimeError.

The kernel runs on CPU in Triton's interpreter (TRITON_INTERPRET=1 set before openrlhf_band is
imported; the kernel module is reloaded if it was imported without it, as in
test_band_loss_kernel.py). Runtime: a few seconds.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import warnings

os.environ["TRITON_INTERPRET"] = "1"  # before openrlhf_band.ops.band_loss is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from openrlhf.models.loss import PolicyLoss  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import openrlhf_band.functional as functional  # noqa: E402
import openrlhf_band.ops.band_loss as band_loss_module  # noqa: E402
import openrlhf_band.ops.fallback as fallback  # noqa: E402
from openrlhf_band import band_bounds  # noqa: E402
from openrlhf_band.band.spec import BandSpec  # noqa: E402
from openrlhf_band.functional import BandKernelFallbackWarning, band_token_loss  # noqa: E402
from openrlhf_band.integration.metrics import band_metrics  # noqa: E402
from openrlhf_band.ops.band_loss import band_token_loss_triton  # noqa: E402

if not isinstance(band_loss_module._band_loss_fwd_kernel, InterpretedFunction):
    band_loss_module = importlib.reload(band_loss_module)
    from openrlhf_band.ops.band_loss import band_token_loss_triton  # noqa: E402, F811

BOTH = ["triton", "torch"]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _loss_and_grad(log_probs, *args, upstream=None, **kwargs):
    """(outputs, d sum(loss * upstream) / d log_probs)."""
    lp = log_probs.detach().clone().requires_grad_()
    out = band_token_loss(lp, *args, **kwargs)
    (grad,) = torch.autograd.grad(
        out.loss, lp, grad_outputs=upstream if upstream is not None else torch.ones_like(out.loss)
    )
    return out, grad


def _square_case(b: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -(10 ** torch.empty(b, b).uniform_(-3, 1, generator=g))
    lp = old + 0.5 * torch.randn(b, b, generator=g)
    adv = torch.randn(b, b, generator=g)
    delta = 10 ** torch.empty(b).uniform_(-3, -0.5, generator=g)  # distinct per row
    return lp, old, adv, delta


# ----------------------------------------------------------------------------------------------
# 1. a (B,) radius against (B, T) is per sequence, also when B == T
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_per_sequence_radius_when_b_equals_t(backend, divergence):
    lp, old, adv, delta = _square_case()
    out_1d, grad_1d = _loss_and_grad(
        lp, old, adv, divergence=divergence, delta=delta, backend=backend, return_bounds=True
    )
    out_2d, grad_2d = _loss_and_grad(
        lp, old, adv, divergence=divergence, delta=delta[:, None], backend=backend, return_bounds=True
    )
    for a, b in zip(out_1d, out_2d):  # the dispatcher makes (B,) the (B, 1) radius: the same inputs
        assert torch.equal(a, b)
    assert torch.equal(grad_1d, grad_2d)
    # and it is not the per-column reading (the old behaviour for B == T)
    by_column = band_token_loss(
        lp, old, adv, divergence=divergence, delta=delta[None, :], backend=backend, return_bounds=True
    )
    assert not torch.equal(by_column.upper, out_1d.upper)


def test_per_sequence_radius_when_b_equals_t_kernel_launcher():
    """The launcher called directly (no dispatcher) reads (B,) per sequence too."""
    lp, old, adv, delta = _square_case()
    tv = BandSpec("tv")
    direct = band_token_loss_triton(lp, old, adv, spec=tv, radius=delta, return_bounds=True)
    rows = band_token_loss_triton(lp, old, adv, spec=tv, radius=delta[:, None], return_bounds=True)
    assert torch.equal(direct.upper, rows.upper) and torch.equal(direct.loss, rows.loss)


def test_per_sequence_radius_when_b_equals_t_band_bounds():
    """band_bounds (the operator) follows the same rule."""
    _, old, _, delta = _square_case()
    for a, b in zip(band_bounds(old, "tv", delta), band_bounds(old, "tv", delta[:, None])):
        assert torch.equal(a, b)


def test_metrics_per_sequence_radius_when_b_equals_t():
    lp, old, adv, delta = _square_case(b=6)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[:, :2] = True
    mask[0] = True  # row 0 counts 6 tokens, the others 2
    out = band_token_loss(lp, old, adv, mask, divergence="tv", delta=delta, backend="torch", return_bounds=True)
    metrics = band_metrics(out, old, mask, delta=delta)
    counts = mask.sum(-1).double()
    # float32 metrics against float64: a sum of n = 16 positive terms (n - 1 roundings, any order), the
    # division and d * d: within gamma_(n+1) = (n + 1) u / (1 - (n + 1) u) < (n + 2) u relative, u = 2^-24
    rel = (int(counts.sum()) + 2) * 2.0**-24
    expected = (delta.double() * counts).sum() / counts.sum()
    assert metrics["band/delta_mean"].item() == pytest.approx(expected.item(), rel=rel)
    expected_sq = (delta.double() ** 2 * counts).sum() / counts.sum()
    assert metrics["band/delta_sq_mean"].item() == pytest.approx(expected_sq.item(), rel=rel)


# ----------------------------------------------------------------------------------------------
# 2. ties: OpenRLHF's PolicyLoss gradient, compared with the installed PolicyLoss itself
# ----------------------------------------------------------------------------------------------
_TINY = 2.0**-149  # the smallest float32 denormal: r A rounds to the same float32 for many r


def _ulps(x: torch.Tensor, k: int) -> torch.Tensor:
    """x moved k float32 ulps (k may be negative)."""
    toward = torch.full_like(x, math.inf if k > 0 else -math.inf)
    for _ in range(abs(k)):
        x = torch.nextafter(x, toward)
    return x


def _tie_inputs(lo: float, hi: float, dual_clip: float | None):
    """log_probs (old = 0, so that the float32 ratio is exp(log_probs) and every float32 ratio
    near 1 is reachable), old, advantages with: random ratios; ratios exactly on and 1-2 ulps
    around each bound; A = 0 and -0; tiny A (r A and clamp(r) A round together: min-ties far from
    the bounds); dual-clip ties (r A == c A, A < 0) with and without a min-tie."""
    g = torch.Generator().manual_seed(7)
    lo32, hi32 = torch.tensor(lo), torch.tensor(hi)
    ratios = [torch.exp(0.4 * torch.randn(400, generator=g))]
    for b in (lo32, hi32):
        ratios += [_ulps(b, k).reshape(1) for k in (-2, -1, 0, 1, 2)] * 8
    ratios += [torch.linspace(0.3, 3.0, 200)] * 3
    ratio = torch.cat(ratios)
    # log_probs whose float32 exp is exactly the ratio wanted (searched among float32 neighbours)
    lp = torch.log(ratio)
    best = lp.clone()
    for k in range(-3, 4):
        cand = _ulps(lp, k) if k else lp
        best = torch.where(torch.exp(cand) == ratio, cand, best)
    n = ratio.numel()
    adv = torch.randn(n, generator=g)
    adv[400:480] = torch.where(torch.rand(80, generator=g) < 0.5, 1.0, -1.0) * torch.rand(80, generator=g)
    pos = torch.arange(n)
    adv = torch.where((pos >= 480) & (pos < 680), _TINY * torch.randint(1, 4, (n,), generator=g), adv)
    adv = torch.where(pos >= 680, -_TINY * torch.randint(1, 4, (n,), generator=g), adv)
    adv[::37] = 0.0
    adv[5::37] = -0.0
    if dual_clip is not None:  # r on and next to c with A < 0 and normal A: r A vs c A ties
        c32 = torch.tensor(dual_clip)
        extra = torch.cat([_ulps(c32, k).reshape(1) for k in (-1, 0, 1)] * 20)
        best = torch.cat([best, torch.log(extra)])
        adv = torch.cat([adv, -torch.rand(extra.numel(), generator=g) - 0.5])
    return best[None, :], torch.zeros_like(best)[None, :], adv[None, :]


def _policy_loss_reference(lp, old, adv, eps_low: float, eps_high: float, dual_clip: float | None):
    """Per-token loss and gradient of OpenRLHF's PolicyLoss (token sum, so upstream 1 per token)."""
    lp = lp.detach().clone().requires_grad_()
    loss_fn = PolicyLoss(clip_eps_low=eps_low, clip_eps_high=eps_high, dual_clip=dual_clip)
    mask = torch.ones_like(lp)
    # batch_num_tokens=1: the aggregate is the plain token sum, so d/d log_probs is per token
    total = loss_fn(lp, old, adv, action_mask=mask, batch_num_tokens=1.0)[0]
    (grad,) = torch.autograd.grad(total, lp)
    ratio = (lp.detach() - old).clamp(-20, 20).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    loss = -torch.min(surr1, surr2)
    if dual_clip is not None:
        loss = -torch.where(adv < 0, torch.max(-loss, dual_clip * adv), -loss)
    return loss, grad, ratio, surr1, surr2


@pytest.mark.parametrize("dual_clip", [None, 3.0, 1.3])
def test_torch_matches_policy_loss_at_ties(dual_clip):
    """Bit for bit, ties included (bounds as numbers: PolicyLoss's fixed clip)."""
    eps_low, eps_high = 0.2, 0.28
    lo, hi = 1 - eps_low, 1 + eps_high
    lp, old, adv = _tie_inputs(lo, hi, dual_clip)
    ploss, pgrad, ratio, surr1, surr2 = _policy_loss_reference(lp, old, adv, eps_low, eps_high, dual_clip)
    out, grad = _loss_and_grad(lp, old, adv, bounds=(lo, hi), dual_clip=dual_clip, backend="torch")
    # exact on every CPU: the same torch ops (exp of the same same-shaped tensor, then correctly rounded
    # products, clamp, min / max, where) on the same float32 values, in the same order
    assert torch.equal(out.loss, ploss)
    assert torch.equal(grad, pgrad)
    # the case is meaningful: min-ties with r outside the band, which get half of -r A
    outside = (ratio > torch.tensor(hi)) | (ratio < torch.tensor(lo))
    ties = (surr1 == surr2) & outside & (adv != 0)
    assert ties.sum() > 50
    # with a normal A the half is exact (scaling by 0.5 is): (-0.5 A) r == -0.5 (A r)
    half = ties & (adv.abs() > 1e-30)
    if dual_clip is not None:
        half &= ~((adv < 0) & (dual_clip * adv >= torch.min(surr1, surr2)))
        # dual ties with a normal A (torch.max splits too)
        assert ((dual_clip * adv == torch.min(surr1, surr2)) & (adv < 0) & (adv.abs() > 1e-30)).sum() >= 10
    assert half.any()
    assert torch.equal(grad[half], -0.5 * (adv[half] * ratio[half]))


def interpreter_exp_agrees(log_ratio: torch.Tensor) -> torch.Tensor:
    """Where the interpreter's float32 exp (numpy's, which tl.exp runs on CPU) gives torch's
    float32 exp bit for bit: there the kernel sees the same ratio, so every decision, tie
    included, is deterministic. Elsewhere the two may differ by up to 3 ulps (numpy's SIMD exp is
    documented to ~2.5 ulps, torch's to 1; where they agree depends on the CPU)."""
    x = log_ratio.detach().float().clamp(-20, 20)
    return torch.from_numpy(np.exp(x.numpy())) == torch.exp(x)


@pytest.mark.parametrize("dual_clip", [None, 3.0, 1.3])
def test_kernel_matches_policy_loss_at_ties(dual_clip):
    """The kernel follows the same rule, at every token whose ratio lies more than 3 float32 ulps
    from the bounds and c (the most the two exps can differ), or whose float32 ratio the interpreter
    computes exactly as torch does
    (there a tie near a bound is decided identically). With a denormal A the order of the float32
    products may round differently (a few 2^-149): the atol."""
    eps_low, eps_high = 0.2, 0.28
    lo, hi = 1 - eps_low, 1 + eps_high
    lp, old, adv = _tie_inputs(lo, hi, dual_clip)
    ploss, pgrad, ratio, surr1, surr2 = _policy_loss_reference(lp, old, adv, eps_low, eps_high, dual_clip)
    out, grad = _loss_and_grad(lp, old, adv, bounds=(lo, hi), dual_clip=dual_clip, backend="triton")
    far = torch.ones_like(ratio, dtype=torch.bool)
    for b in [lo, hi] + ([dual_clip] if dual_clip is not None else []):
        b32 = torch.tensor(b)
        far &= (ratio - b32).abs() > 3 * (torch.nextafter(b32, torch.tensor(math.inf)) - b32)
    same = far | interpreter_exp_agrees(lp - old)
    normal_ties = same & ~far & (surr1 == surr2) & (adv.abs() > 1e-30)
    assert normal_ties.sum() >= 5  # the near-bound ties the kernel must split are in the comparison
    # r to <= 3 ulps, then one or two correctly rounded products: <= 5 * 2^-23 ~ 6e-7 relative
    torch.testing.assert_close(out.loss[same], ploss[same], rtol=1e-6, atol=0)
    torch.testing.assert_close(grad[same], pgrad[same], rtol=1e-6, atol=3 * _TINY)


@pytest.mark.parametrize("backend", BOTH)
def test_at_edge_matches_policy_loss_with_infinite_upper(backend):
    """On the simplex edge (tv, p = 0.97: upper saturates at 1/p) a token with q <= 1 (log r <=
    -log p) is PolicyLoss with clip_eps_high = inf, a token with q > 1 PolicyLoss with hi = 1/p."""
    log_p = torch.tensor(math.log(0.97))
    # log q from a few hundred ulps below 0 to a few above (q > 1 only through rounding)
    steps = torch.arange(-300, 8, dtype=torch.float64)
    log_q = (steps * 2.0**-24).float()
    old = torch.full_like(log_q, float(log_p))[None, :]
    lp = log_q[None, :]
    adv = torch.rand(lp.shape, generator=torch.Generator().manual_seed(3)) + 0.1  # A > 0: the upper side
    lower, upper = band_bounds(old, "tv", 0.05)
    # saturated: 1/p, float32 of a float64 exp on both sides (an ulp of float64 apart at most)
    assert torch.equal(upper, torch.exp(-old.double()).float().expand_as(upper))
    out, grad = _loss_and_grad(lp, old, adv, divergence="tv", delta=0.05, backend=backend, return_bounds=True)
    eps_low = 1.0 - float(lower[0, 0])
    inside = (lp - old) <= -old  # the log-space rule: q <= 1
    assert inside.sum() > 250 and (~inside).sum() > 0
    ratio = (lp - old).exp()
    assert (inside & (ratio > upper)).any(), "no token where float32 r rounds above 1/p at q <= 1"
    ploss_inf, pgrad_inf, *_ = _policy_loss_reference(lp, old, adv, eps_low, math.inf, None)
    ploss_hi, pgrad_hi, *_ = _policy_loss_reference(lp, old, adv, eps_low, float(upper[0, 0]) - 1.0, None)
    assert not out.clipped_upper[inside].any()
    if backend == "torch":  # the same torch ops on the same values as PolicyLoss (see above): exact
        assert torch.equal(out.loss[inside], ploss_inf[inside]) and torch.equal(grad[inside], pgrad_inf[inside])
        assert torch.equal(out.loss[~inside], ploss_hi[~inside]) and torch.equal(grad[~inside], pgrad_hi[~inside])
    else:  # the kernel's exp may differ by up to 3 ulps, then one rounding: <= 4 * 2^-23 ~ 5e-7 relative
        torch.testing.assert_close(out.loss[inside], ploss_inf[inside], rtol=1e-6, atol=0)
        torch.testing.assert_close(grad[inside], pgrad_inf[inside], rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------------------------
# 3. user-supplied bounds with lower > upper
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BOTH)
def test_inverted_bounds_refused(backend):
    lp, old, adv = torch.full((2, 4), -0.4), torch.full((2, 4), -0.5), torch.ones(2, 4)
    lower, upper = torch.full((2, 4), 0.8), torch.full((2, 4), 1.2)
    lower[1, 2] = 1.3
    with pytest.raises(ValueError, match=r"lower > upper at 1 unmasked position.*\(1, 2\).*lower <= upper"):
        band_token_loss(lp, old, adv, bounds=(lower, upper), backend=backend)
    with pytest.raises(ValueError, match="lower > upper"):
        band_token_loss(lp, old, adv, bounds=(1.2, 0.8), backend=backend)  # numbers, swapped
    with pytest.raises(ValueError, match="lower > upper"):  # per sequence (B, 1)
        band_token_loss(lp, old, adv, bounds=(torch.tensor([[0.8], [1.5]]), 1.2), backend=backend)
    with pytest.raises(ValueError, match="does not broadcast"):
        band_token_loss(lp, old, adv, bounds=(torch.full((3,), 0.8), 1.2), backend=backend)


@pytest.mark.parametrize("backend", BOTH)
def test_inverted_bounds_at_masked_positions_are_ignored(backend):
    lp, old, adv = torch.full((2, 4), -0.4), torch.full((2, 4), -0.5), torch.ones(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1, 1:] = False
    lower, upper = torch.full((2, 4), 0.8), torch.full((2, 4), 1.2)
    lower[1, 1], upper[1, 1] = 5.0, 0.1  # inverted
    lower[1, 2], upper[1, 3] = math.nan, -math.inf  # garbage
    out, grad = _loss_and_grad(lp, old, adv, mask, bounds=(lower, upper), backend=backend)
    assert torch.equal(out.loss[~mask], torch.zeros(3)) and torch.equal(grad[~mask], torch.zeros(3))
    assert torch.isfinite(out.loss).all()


# ----------------------------------------------------------------------------------------------
# 4. float64
# ----------------------------------------------------------------------------------------------
def test_triton_refuses_float64():
    lp = torch.full((2, 3), -0.4, dtype=torch.float64)
    with pytest.raises(ValueError, match="computes in float32; use backend='torch' for float64"):
        band_token_loss(lp, lp - 0.1, torch.ones(2, 3, dtype=torch.float64), backend="triton")


def test_auto_sends_float64_to_torch(monkeypatch):
    """Even where auto would use the kernel (the device predicate says yes), float64 goes to the
    reference: the kernel is never called and the result is float64."""
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)

    def never(*args, **kwargs):
        raise AssertionError("the kernel must not be called for float64")

    monkeypatch.setattr(band_loss_module, "band_token_loss_triton", never)
    lp = torch.full((2, 3), -0.4, dtype=torch.float64)
    out, grad = _loss_and_grad(lp, lp - 0.1, torch.ones(2, 3, dtype=torch.float64), backend="auto")
    assert out.loss.dtype == torch.float64 and grad.dtype == torch.float64
    # and float32 does go to the kernel under the same predicate
    with pytest.raises(AssertionError, match="must not be called"):
        band_token_loss(lp.float(), lp.float() - 0.1, torch.ones(2, 3), backend="auto")


# ----------------------------------------------------------------------------------------------
# 5. NaN advantages
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["per-token", "per-sequence"])
def test_nan_advantage(backend, dual_clip, per_sequence):
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 8, generator=g) * 3
    lp = old + 0.3 * torch.randn(3, 8, generator=g)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[2] = False
    if per_sequence:
        adv = torch.tensor([math.nan, 0.7, math.nan])  # row 0 unmasked NaN, row 2 masked NaN
        nan_tokens = torch.zeros(3, 8, dtype=torch.bool)
        nan_tokens[0] = True
    else:
        adv = torch.randn(3, 8, generator=g)
        nan_tokens = torch.zeros(3, 8, dtype=torch.bool)
        nan_tokens[0, 3] = nan_tokens[1, 5] = True
        adv[nan_tokens] = math.nan
        adv[2, 4] = math.nan  # masked
    upstream = torch.randn(3, 8, generator=g)
    out, grad = _loss_and_grad(lp, old, adv, mask, dual_clip=dual_clip, backend=backend, upstream=upstream)
    assert out.loss[nan_tokens].isnan().all()
    assert grad[nan_tokens].isnan().all()
    others = ~nan_tokens & mask
    assert torch.isfinite(out.loss[others]).all() and torch.isfinite(grad[others]).all()
    assert torch.equal(out.loss[~mask], torch.zeros(8)) and torch.equal(grad[~mask], torch.zeros(8))
    for flag in (out.clipped_upper, out.clipped_lower, out.dual_clipped):
        assert not flag[nan_tokens].any()


# ----------------------------------------------------------------------------------------------
# 6. the failure path: a kernel that does not compile
# ----------------------------------------------------------------------------------------------
@triton.jit
def _uncompilable_kernel(*args, **kwargs):
    # takes whatever the launcher passes (the interpreter binds *args / **kwargs), then fails at
    # compile time, as a kernel with an unsupported construct or a failed static check does
    tl.static_assert(False, "this kernel deliberately fails to compile")


def _small_inputs():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(2, 16, generator=g) * 2
    lp = old + 0.2 * torch.randn(2, 16, generator=g)
    return lp, old, torch.randn(2, 16, generator=g)


@pytest.fixture
def broken_kernel(monkeypatch):
    """The fused forward kernel replaced by one that fails to compile; auto considers CPU tensors
    kernel-eligible; the record of failed variants starts empty (and is restored afterwards)."""
    monkeypatch.setattr(band_loss_module, "_band_loss_fwd_kernel", _uncompilable_kernel)
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)
    monkeypatch.setattr(fallback, "_FAILED_VARIANTS", {})


def test_auto_falls_back_once_per_variant(broken_kernel, monkeypatch):
    lp, old, adv = _small_inputs()
    upstream = torch.randn(2, 16)
    expected, expected_grad = _loss_and_grad(lp, old, adv, backend="torch", upstream=upstream)
    with pytest.warns(BandKernelFallbackWarning) as record:
        out, grad = _loss_and_grad(lp, old, adv, backend="auto", upstream=upstream)
    assert len(record) == 1
    message = str(record[0].message)
    assert "InterpreterError" in message and "deliberately fails to compile" in message
    assert "--actor.band.backend torch" in message and "backend='torch'" in message
    assert torch.equal(out.loss, expected.loss) and torch.equal(grad, expected_grad)

    # the same variant again: straight to torch, no retry (the kernel is not touched), no warning
    def not_again(*args, **kwargs):
        raise AssertionError("the failed kernel variant was retried")

    monkeypatch.setattr(band_loss_module, "band_token_loss_triton", not_again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = band_token_loss(lp, old, adv, backend="auto")
    assert torch.equal(again.loss, expected.loss)

    # another variant (dual-clip on) is tried, fails, and warns once on its own
    monkeypatch.undo()  # restores band_token_loss_triton, and the fixture's patches: re-apply them
    monkeypatch.setattr(band_loss_module, "_band_loss_fwd_kernel", _uncompilable_kernel)
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)
    monkeypatch.setattr(fallback, "_FAILED_VARIANTS", {("already", "failed"): "x"})
    with pytest.warns(BandKernelFallbackWarning) as record:
        band_token_loss(lp, old, adv, backend="auto", dual_clip=3.0)
        band_token_loss(lp, old, adv, backend="auto", dual_clip=3.0)
    assert len(record) == 1
    assert len(fallback._FAILED_VARIANTS) == 2


def test_triton_raises_on_compile_failure(broken_kernel):
    lp, old, adv = _small_inputs()
    with pytest.raises(RuntimeError, match=r"failed to compile or launch.*--actor\.band\.backend torch") as info:
        band_token_loss(lp, old, adv, backend="triton")
    assert isinstance(info.value.__cause__, triton.runtime.errors.InterpreterError)
    assert not fallback._FAILED_VARIANTS  # only "auto" records failures


def test_auto_does_not_swallow_other_errors(monkeypatch):
    """A torch OOM or a bug outside Triton propagates under auto; validation errors stay ValueErrors."""
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)
    monkeypatch.setattr(fallback, "_FAILED_VARIANTS", {})
    lp, old, adv = _small_inputs()
    for error in (torch.cuda.OutOfMemoryError("CUDA out of memory"), RuntimeError("a bug of ours"), ValueError("x")):

        def fails(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(band_loss_module, "band_token_loss_triton", fails)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(type(error)):
                band_token_loss(lp, old, adv, backend="auto")
    assert not fallback._FAILED_VARIANTS
    with pytest.raises(ValueError, match="dual_clip"):
        band_token_loss(lp, old, adv, backend="auto", dual_clip=0.5)


def test_kernel_failure_classification(monkeypatch):
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    assert fallback._is_kernel_failure(OutOfResources(300000, 232448, "shared memory"))
    assert fallback._is_kernel_failure(PTXASError("ptxas fatal"))
    assert fallback._is_kernel_failure(CompilationError("", None, "bad"))
    assert fallback._is_kernel_failure(subprocess.CalledProcessError(1, ["gcc"]))
    # a RuntimeError raised by Triton itself (here: its driver lookup, as on a machine without a
    # usable backend) counts; the same class raised elsewhere does not
    monkeypatch.setenv("TRITON_DEFAULT_BACKEND", "no-such-backend")
    from triton.runtime.driver import _create_driver

    with pytest.raises(RuntimeError) as info:
        _create_driver()
    assert fallback._is_kernel_failure(info.value)
    # a backend's internal lookup failing (a KeyError raised in triton.language: a type name it lacks)
    # counts too; the same class raised by our code does not
    with pytest.raises(KeyError) as lookup:
        triton.language.str_to_ty("no-such-type", None)
    assert fallback._is_kernel_failure(lookup.value)
    for error in (RuntimeError("ours"), KeyError("ours"), AssertionError("ours")):
        try:
            raise error
        except Exception as err:
            assert not fallback._is_kernel_failure(err)
    assert not fallback._is_kernel_failure(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not fallback._is_kernel_failure(ValueError("bad input"))
