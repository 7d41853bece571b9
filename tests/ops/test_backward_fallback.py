"""The backward kernel fails as the forward does (openrlhf_band/ops/fallback.py): backend="auto" warns once
and computes the gradient in torch by the kernel's own rule, backend="triton" raises with what to do.

The forward kernel runs for real (Triton's interpreter, forced as in tests/ops/test_band_loss_kernel.py);
the backward kernel is replaced by one that fails to compile, as tests/ops/test_backend_contract.py does
for the forward.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings

os.environ["TRITON_INTERPRET"] = "1"  # before openrlhf_band.ops.band_loss is imported

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import openrlhf_band.functional as functional  # noqa: E402
import openrlhf_band.ops.band_loss as band_loss_module  # noqa: E402
from openrlhf_band import BandKernelFallbackWarning  # noqa: E402
from openrlhf_band.functional import band_token_loss  # noqa: E402
from openrlhf_band.ops import fallback  # noqa: E402

if not isinstance(band_loss_module._band_loss_fwd_kernel, InterpretedFunction):
    band_loss_module = importlib.reload(band_loss_module)
assert isinstance(band_loss_module._band_loss_fwd_kernel, InterpretedFunction)
assert isinstance(band_loss_module._band_loss_bwd_kernel, InterpretedFunction)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@triton.jit
def _uncompilable_kernel(*args, **kwargs):
    # takes whatever the launcher passes, then fails at compile time (as in test_backend_contract.py)
    tl.static_assert(False, "this kernel deliberately fails to compile")


class _NotAgain:
    """Stands in for the backward kernel once its variant failed: auto must not launch it again."""

    def __getitem__(self, grid):
        raise AssertionError("the failed backward kernel variant was retried")


@pytest.fixture
def broken_backward(monkeypatch):
    """The backward kernel fails to compile (the forward one is the real kernel); auto takes CPU tensors
    to the kernel; the record of failed variants starts empty (restored afterwards)."""
    monkeypatch.setattr(band_loss_module, "_band_loss_bwd_kernel", _uncompilable_kernel)
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)
    monkeypatch.setattr(fallback, "_FAILED_VARIANTS", {})


def _inputs(dtype=torch.float32):
    """(3, 17) tokens, a mask with a masked run, and an upstream gradient that is NaN at masked tokens."""
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(3, 17, generator=g) * 3
    log_probs = (old + 0.3 * torch.randn(3, 17, generator=g)).to(dtype)
    adv = torch.randn(3, 17, generator=g)
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[1, 5:12] = False
    upstream = torch.randn(3, 17, generator=g)
    upstream[~mask] = math.nan
    return log_probs, old, adv, mask, upstream


def _grad(backend, log_probs, old, adv, mask, upstream, **options):
    lp = log_probs.clone().requires_grad_()
    out = band_token_loss(lp, old, adv, mask, divergence="kl", delta=0.05, upper_cap=10.0, dual_clip=3.0,
                          backend=backend, **options)  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, lp, grad_outputs=upstream)
    return grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_auto_computes_the_gradient_in_torch_and_warns_once(broken_backward, monkeypatch, dtype):
    log_probs, old, adv, mask, upstream = _inputs(dtype)
    want = _grad("torch", log_probs, old, adv, mask, upstream)
    with pytest.warns(BandKernelFallbackWarning) as record:
        got = _grad("auto", log_probs, old, adv, mask, upstream)
    ours = [w for w in record if issubclass(w.category, BandKernelFallbackWarning)]  # not numpy's, of the interpreter
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "backward kernel" in message and "failed to compile or launch" in message
    assert "InterpreterError" in message and "deliberately fails to compile" in message
    assert "torch path computed the gradient" in message
    assert "--actor.band.backend torch" in message and "backend='torch'" in message
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-6)
    assert torch.equal(got[~mask], torch.zeros(int((~mask).sum()), dtype=dtype))  # nan upstream stays out
    # the backward variant is recorded: the next backward goes straight to torch, without a retry or a warning
    assert [v[0] for v in fallback._FAILED_VARIANTS] == ["backward"]
    monkeypatch.setattr(band_loss_module, "_band_loss_bwd_kernel", _NotAgain())
    with warnings.catch_warnings():
        warnings.simplefilter("error", BandKernelFallbackWarning)
        again = _grad("auto", log_probs, old, adv, mask, upstream)
    assert torch.equal(again, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_torch_gradient_is_the_kernels_bit_for_bit(monkeypatch, dtype):
    """grad = where(coef != 0, upstream * coef, 0) in float32, rounded once to the input's dtype, as the kernel
    computes it; a NaN upstream at masked tokens gives exactly 0 there on both paths. The kernel's float32
    product is taken from a float32 run on the same values (the coefficient is the same: the kernel upcasts
    every load) and rounded to nearest, as a GPU's cast and torch's are: the interpreter's bfloat16 cast
    truncates (one bfloat16 ulp apart)."""
    monkeypatch.setattr(fallback, "_FAILED_VARIANTS", {})
    monkeypatch.setattr(functional, "_auto_uses_kernel", lambda device: True)
    log_probs, old, adv, mask, upstream = _inputs(dtype)
    kernel = _grad("triton", log_probs.float(), old, adv, mask, upstream).to(dtype)
    monkeypatch.setattr(band_loss_module, "_band_loss_bwd_kernel", _uncompilable_kernel)
    with pytest.warns(BandKernelFallbackWarning):
        fell_back = _grad("auto", log_probs, old, adv, mask, upstream)
    assert torch.equal(fell_back, kernel)
    assert torch.equal(kernel[~mask], torch.zeros(int((~mask).sum()), dtype=dtype))


def test_triton_raises_with_what_to_do(broken_backward):
    log_probs, old, adv, mask, upstream = _inputs()
    what = r"backward kernel .*failed to compile or launch.*--actor\.band\.backend torch"
    with pytest.raises(RuntimeError, match=what) as info:
        _grad("triton", log_probs, old, adv, mask, upstream)
    assert isinstance(info.value.__cause__, triton.runtime.errors.InterpreterError)
    assert not fallback._FAILED_VARIANTS  # only "auto" records failures


def test_auto_does_not_swallow_other_backward_errors(broken_backward, monkeypatch):
    """An error that is not a kernel failure (here raised by our code, outside Triton) propagates."""

    class _Buggy:
        def __getitem__(self, grid):
            raise RuntimeError("a bug of ours")

    monkeypatch.setattr(band_loss_module, "_band_loss_bwd_kernel", _Buggy())
    log_probs, old, adv, mask, upstream = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", BandKernelFallbackWarning)
        with pytest.raises(RuntimeError, match="a bug of ours"):
            _grad("auto", log_probs, old, adv, mask, upstream)
    assert not fallback._FAILED_VARIANTS
