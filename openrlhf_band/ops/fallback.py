"""The fused kernel's fallback policy: which failures mean "the kernel cannot be built or
launched here" (fall back to the torch reference, warned once per process and kernel variant, with
backend="auto"; raised with backend="triton"), and which must propagate (a bad input, a full GPU).
The dispatcher (`openrlhf_band.functional`) asks `run_kernel` for the kernel's result; the autograd
Function's backward asks `run_backward_kernel` for the gradient (the same policy for the backward
kernel, which first compiles there, inside autograd).
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from openrlhf_band.band.spec import BandSpec
from openrlhf_band.ops.token_loss import BandTokenLoss

_SILENCE_HINT = "pass --actor.band.backend torch (or backend='torch')"
# str() of a failure is cut to this many characters in our message: a ptxas or MLIR error carries
# the whole kernel source; the full text stays on the chained exception (backend="triton")
_MAX_ERROR_CHARS = 600


class BandKernelFallbackWarning(RuntimeWarning):
    """backend="auto" fell back to the torch reference because the fused Triton kernel failed to
    compile or launch; warned once per process and kernel variant."""


# kernel variants (see `kernel_variant`) whose compilation or launch failed in this process:
# backend="auto" sends them straight to the torch reference (no retry, no second warning)
_FAILED_VARIANTS: dict[tuple, str] = {}


def kernel_variant(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    spec: BandSpec,
    radius: Tensor | None,
    dual_clip: float | None,
    return_bounds: bool,
    bounds: tuple[Tensor, Tensor] | None,
) -> tuple:
    """What one compilation of the kernel depends on: the device, the dtypes of the tensors it
    reads, how the band is obtained and which optional features are on (its constexprs). A failure
    for one variant (say bfloat16 with a per-token kl radius) says nothing about another."""
    return (
        str(log_probs.device),
        log_probs.dtype,
        old_log_probs.dtype,
        advantages.dtype,
        None if action_mask is None else action_mask.dtype,
        "bounds" if bounds is not None else spec.divergence,
        radius.dtype if radius is not None else "scalar",
        spec.upper_cap is not None,
        spec.relax is not None,
        dual_clip is not None,
        bool(return_bounds),
        spec.lower_floor is not None,
        spec.lower_delta is not None,
        spec.ratio_truncation is not None,
    )


def _triton_error_types() -> tuple[type[BaseException], ...]:
    """Triton's own exception classes: TritonError is the base of CompilationError (and its
    CompileTimeAssertionFailure / UnsupportedLanguageConstruct), OutOfResources (shared memory,
    registers), PTXASError, InterpreterError and AutotunerError in Triton 3.6-3.9; older releases
    without triton.errors still have the first two."""
    try:
        from triton.errors import TritonError

        return (TritonError,)
    except ImportError:  # pragma: no cover - Triton < 3.2
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources

        return (CompilationError, OutOfResources)


def _raised_inside_triton(err: BaseException) -> bool:
    """Whether the innermost Python frame of err's traceback lies in the triton package. Errors
    raised in C and C++ (the CUDA launcher's "Triton Error [CUDA]: ...", MLIR's "PassManager::run
    failed", a failed libcuda load) surface in the Triton frame that called into them."""
    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(root)


def _is_kernel_failure(err: BaseException) -> bool:
    """Whether err means "the fused kernel cannot be built or launched here" (fall back), rather
    than a bad input or a full GPU (re-raise). Falls back on:
    * Triton's own errors (`_triton_error_types`): compilation, ptxas, resources, interpreter;
    * subprocess.CalledProcessError: the C compiler building Triton's launcher stub failed (e.g. no
      Python.h on the machine);
    * any other exception raised inside the triton package: RuntimeError or OSError (no active driver
      / backend, no C compiler, no ptxas or libcuda, MLIR pass failures, CUDA launch errors) and the
      KeyError, AssertionError or AttributeError of a backend that does not take an option or a type
      (a backend's internals are not an API: what they raise is not ours to interpret).
    Never on torch.cuda.OutOfMemoryError (a RuntimeError: the torch path would need the memory too),
    nor on our ValueErrors or errors raised by torch or our launcher code outside Triton."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return False
    if isinstance(err, _triton_error_types()) or isinstance(err, subprocess.CalledProcessError):
        return True
    return _raised_inside_triton(err)


def _failure_message(err: BaseException, variant: tuple, kernel: str = "kernel") -> str:
    text = str(err)
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + " [...]"
    return (
        f"openrlhf_band: the fused Triton {kernel} of band_token_loss failed to compile or launch "
        f"(device, dtypes and options: {variant}): {type(err).__name__}: {text}"
    )


def run_kernel(args: tuple, options: dict, backend: str) -> BandTokenLoss | None:
    """The kernel's result for the loss arguments `args` (log_probs, old_log_probs, advantages,
    action_mask) and the launcher's keyword `options`; None when backend="auto" must use the
    reference instead: this variant failed before in this process, or fails now (warned once)."""
    variant = kernel_variant(*args, **options)
    if backend != "triton" and variant in _FAILED_VARIANTS:
        return None
    return _try_kernel(args, options, variant, backend)


def _try_kernel(args: tuple, options: dict, variant: tuple, backend: str) -> BandTokenLoss | None:
    """The kernel's result, or None after a kernel failure with backend="auto" (warned once for
    this variant); with backend="triton" a failure raises RuntimeError. Anything that is not a
    kernel failure (`_is_kernel_failure`) propagates unchanged. This covers the forward launch
    (where the fused kernel compiles); the backward kernel runs later, inside autograd, under
    `run_backward_kernel` (told the backend through the autograd Function's config)."""
    try:
        from openrlhf_band.ops.band_loss import band_token_loss_triton

        return band_token_loss_triton(*args, **options, backend=backend)
    except Exception as err:
        # an ImportError: no or a broken triton (the kernel module's import, or a backend Triton
        # imports lazily when it compiles)
        if not (isinstance(err, ImportError) or _is_kernel_failure(err)):
            raise
        _raise_or_warn_once(
            err, variant, backend, "kernel",
            "Falling back to the torch reference for this variant from now on (same loss and gradient, slower).",
            stacklevel=4,
        )  # fmt: skip
        return None


def _raise_or_warn_once(
    err: BaseException, variant: tuple, backend: str, kernel: str, fallback: str, stacklevel: int
) -> None:
    """After a kernel failure: with backend="triton" raise RuntimeError (chained to `err`); otherwise
    record the variant in _FAILED_VARIANTS (the caller's torch path from now on) and warn once, saying
    `fallback`. `stacklevel` as warnings.warn's, counted from here."""
    message = _failure_message(err, variant, kernel)
    if backend == "triton":
        raise RuntimeError(f"{message}. To use the torch reference instead, {_SILENCE_HINT}.") from err
    _FAILED_VARIANTS[variant] = message
    warnings.warn(
        f"{message}. {fallback} To silence this warning, {_SILENCE_HINT}.",
        BandKernelFallbackWarning,
        stacklevel=stacklevel,
    )


def backward_kernel_variant(device: torch.device, grad_dtype: torch.dtype, upstream_dtype: torch.dtype) -> tuple:
    """What one compilation of the backward kernel depends on: the device and the dtypes it reads and
    writes (the coefficient is always float32). Tagged "backward": no forward variant equals it."""
    return ("backward", str(device), grad_dtype, upstream_dtype)


def run_backward_kernel(
    launch: Callable[[], Tensor], reference: Callable[[], Tensor], variant: tuple, backend: str
) -> Tensor:
    """The gradient from the backward kernel (`launch`), or, after a kernel failure with backend="auto",
    from `reference`, the same rule in torch (grad = upstream * coef where coef != 0, else 0): warned once
    for this variant, which then goes straight to torch in this process. With backend="triton" a kernel
    failure raises RuntimeError; anything that is not a kernel failure propagates unchanged."""
    if backend != "triton" and variant in _FAILED_VARIANTS:
        return reference()
    try:
        return launch()
    except Exception as err:
        if not _is_kernel_failure(err):
            raise
        _raise_or_warn_once(
            err, variant, backend, "backward kernel",
            "The torch path computed the gradient instead (the kernel's rule: upstream times the coefficient the "
            "forward kernel stored; same gradient, slower), and does for this variant from now on.",
            stacklevel=3,
        )  # fmt: skip
        return reference()
