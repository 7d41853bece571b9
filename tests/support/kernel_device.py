"""Where the kernel-vs-reference tests run: Triton's CPU interpreter (the default) or a CUDA device.

`OPENRLHF_BAND_TEST_DEVICE=cuda` runs tests/ops/test_band_loss_kernel.py and test_differential.py on
the GPU with the device's own semantics: the kernel compiled for it (no interpreter), both backends
on CUDA tensors, so PTX's float32 exp, FMA contraction and min / max rules are what is compared with
torch's CUDA ops. Unset or `cpu`: the interpreter, as everywhere in CI.

The tests keep building their inputs on CPU (seeded CPU generators: the same numbers on every
machine); `on_device` moves every tensor argument to the device on the way in (a differentiable
copy, so gradients still reach the CPU leaf) and every output back to CPU on the way out.

Use, at the top of a test module, before anything imports `openrlhf_band.ops.band_loss`:

    from kernel_device import prepare_environment
    prepare_environment()
    ...
    band_loss_module = kernel_module()
    band_token_loss = on_device(band_token_loss)
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

DEVICE = os.environ.get("OPENRLHF_BAND_TEST_DEVICE", "cpu") or "cpu"
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"OPENRLHF_BAND_TEST_DEVICE={DEVICE!r}: use cpu (Triton's interpreter, the default) or cuda")
ON_CUDA = DEVICE == "cuda"


def prepare_environment() -> None:
    """Set TRITON_INTERPRET for the chosen device; call before `openrlhf_band.ops.band_loss` is imported
    (whether `triton.jit` builds an interpreted kernel is decided at that import)."""
    if ON_CUDA:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = "1"


def skip_module_without_device() -> None:
    """On `cuda` without a CUDA device, skip the calling test module (it would test nothing)."""
    import pytest
    import torch

    if ON_CUDA and not torch.cuda.is_available():
        pytest.skip("OPENRLHF_BAND_TEST_DEVICE=cuda but torch sees no CUDA device", allow_module_level=True)


def kernel_module():
    """`openrlhf_band.ops.band_loss`, its kernels interpreted on cpu and compiled on cuda.

    If another test module imported it the other way in this process, it is reloaded in place (the
    dispatcher reads it from sys.modules at call time, so it picks up the reloaded kernels)."""
    from triton.runtime.interpreter import InterpretedFunction

    import openrlhf_band.ops.band_loss as module

    def interpreted() -> bool:
        return isinstance(module._band_loss_fwd_kernel, InterpretedFunction)

    if interpreted() == ON_CUDA:
        prepare_environment()
        module = importlib.reload(module)
    assert interpreted() != ON_CUDA, f"kernel module not set up for {DEVICE}"
    assert isinstance(module._band_loss_bwd_kernel, InterpretedFunction) != ON_CUDA
    return module


def pin_interpreter(monkeypatch) -> None:
    """For an autouse fixture: the dispatcher re-reads TRITON_INTERPRET at call time for CPU tensors."""
    if ON_CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def to_device(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(DEVICE)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v) for v in value)
    return value


def to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple such as BandTokenLoss
        return type(value)(*(to_cpu(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_cpu(v) for v in value)
    return value


def on_device(fn: Callable) -> Callable:
    """`fn` with its tensor arguments on DEVICE and its outputs back on CPU; `fn` itself on cpu."""
    if not ON_CUDA:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return to_cpu(fn(*to_device(args), **{k: to_device(v) for k, v in kwargs.items()}))

    return wrapper
