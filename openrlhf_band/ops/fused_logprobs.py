"""Fused lm_head + log-probabilities (and entropy), computed in chunks of tokens so that the full
(N, V) logits are never materialised.

OpenRLHF 0.11.2's `Actor.forward` builds every logit: the model's lm_head (`F.linear` in the model's
dtype), then `.to(torch.float32)` and `.div_(temperature)`, then `log_probs_from_logits` and, for the
entropy bonus, `compute_entropy`. At a 150k vocabulary and 16k tokens per micro-batch those float32
logits alone are ~10 GB, plus what autograd keeps for them. This op computes the same numbers
chunk by chunk of `chunk_tokens` rows and recomputes each chunk's logits in backward, so only one
chunk of logits (and its softmax) is alive at any time.

Per chunk, exactly OpenRLHF's recipe, with z the float32 (float64 for float64 inputs) logits:
    z        = F.linear(hidden, weight, bias).to(compute dtype), then z.div_(T) if T != 1
    lse      = logsumexp(z)
    log p(y) = z[y] - lse
    entropy  = lse - sum(softmax(z) * z)
Per row these are OpenRLHF's ops in OpenRLHF's order, so on one machine the values are its bits
whenever the chunk's lm_head GEMM returns the full GEMM's logits. Across CPUs (SIMD widths, GEMM
blockings) either path may round differently: the tests hold the two to twice the float32
forward-error bound (tests/support/float32_bounds.py), not to bit equality.

Backward, with p = softmax(z), s = sum(p z), and upstream gradients g (log p) and e (entropy):
    dz = -p (g + e (z - s)) + g onehot(y)      (compute dtype; a None upstream drops its term)
    da = (dz / T).to(logits dtype)             (one cast, like autograd through `.to(float32)`)
    d hidden = da @ W                          (in the logits dtype, like the lm_head backward)
    d W     += da^T @ hidden,  d b += sum(da)  (accumulated over chunks in the compute dtype)
Only hidden, weight, bias, labels and the per-token lse are saved; nothing of size V per token.

ZeRO-3: backward gathers a partitioned weight / bias and partitions it again in a `finally`, as
DeepSpeed's own `LinearFunctionForZeroStage3` does; `fused_linear_logprobs` does the same around
forward, so forward works outside lm_head's forward too. For training, call it inside lm_head's
forward: there DeepSpeed's module hooks gather the weight for forward and backward and keep it
gathered until its gradient is accumulated, which autograd cannot do into an empty shard (for
DeepSpeed's own linear alike).

Layout follows Liger-Kernel: one `torch.autograd.Function` (`FusedLinearLogprobsFunction`) and a
thin functional entry point (`fused_linear_logprobs`) that validates and reshapes.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Memory the automatic chunk size allows for the per-chunk temporaries, in bytes.
LOGITS_CHUNK_MEMORY_BUDGET_BYTES = 640 * 1024**2
# Bytes per logit a chunk keeps alive at its peak, rounded up for headroom: forward holds the
# model-dtype GEMM output (2 B for bf16) briefly, then float32 z, softmax(z) and p * z (4 B each);
# backward holds z, p and the model-dtype da (4 + 4 + 2 B).
_BYTES_PER_LOGIT = 16
# Automatic chunks are a multiple of this many rows (GEMM tiles divide it) and at least this many:
# every chunk re-reads the whole weight, and a chunk of M rows does only M FLOP per weight byte, so
# far fewer rows would leave the lm_head GEMM bound by that re-read (an H100's bf16 ridge point is
# ~300 FLOP/B; 128 is a floor). The 640 MiB budget gives 256 rows at V = 152k: the goal is a log-prob
# step at most 1/8 of OpenRLHF's peak at 4,096 tokens (OpenRLHF's ~13 B per logit over all N rows
# against ~15 B per logit of one chunk, plus the weight's gradient both paths hold); 768 rows would
# double the peak for ~1.5x the weight re-reads' arithmetic intensity (bench/results/logprobs_*.json).
_CHUNK_ROW_MULTIPLE = 128


def auto_chunk_tokens(vocab_size: int, budget_bytes: int | None = None) -> int:
    """Rows per chunk such that one chunk's temporaries fit in `budget_bytes` (default
    `LOGITS_CHUNK_MEMORY_BUDGET_BYTES`, read at call time).

    About budget / (16 V) rows (see `_BYTES_PER_LOGIT`), rounded down to a multiple of 128 and at
    least 128. E.g. V = 151,936 with the default 640 MiB budget gives 256 rows.
    """
    if budget_bytes is None:
        budget_bytes = LOGITS_CHUNK_MEMORY_BUDGET_BYTES
    rows = budget_bytes // (_BYTES_PER_LOGIT * max(1, vocab_size))
    return max(_CHUNK_ROW_MULTIPLE, rows // _CHUNK_ROW_MULTIPLE * _CHUNK_ROW_MULTIPLE)


@dataclass(frozen=True)
class _Options:
    """Non-tensor arguments, passed as one so backward returns one `None` for them."""

    temperature: float
    return_entropy: bool
    chunk_tokens: int


def _is_partitioned(param: torch.Tensor | None) -> bool:
    # Compared by name, as DeepSpeed's LinearFunctionForZeroStage3 does, so DeepSpeed is not imported.
    return getattr(getattr(param, "ds_status", None), "name", None) == "NOT_AVAILABLE"


@contextlib.contextmanager
def _gathered(*params: torch.Tensor | None) -> Iterator[None]:
    """Gather ZeRO-3-partitioned parameters for the block and partition them again afterwards,
    also when the block raises (a parameter left gathered would hold a full copy on every rank)."""
    gathered = []
    try:
        for param in params:
            if _is_partitioned(param):
                param.all_gather()
                gathered.append(param)
        yield
    finally:
        for param in gathered:
            param.partition()


def _chunk_logits(
    hidden_chunk: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    compute_dtype: torch.dtype,
) -> torch.Tensor:
    """The (rows, V) logits of one chunk exactly as Actor.forward builds them, in `compute_dtype`."""
    logits = F.linear(hidden_chunk, weight, bias).to(compute_dtype)
    if temperature != 1.0:
        logits.div_(temperature)  # a division, as OpenRLHF does: x * (1 / T) rounds differently
    return logits


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    """Whether autocast is on for `device_type`, and its dtype: what backward needs to recompute
    forward's logits in forward's dtype."""
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class FusedLinearLogprobsFunction(torch.autograd.Function):
    """Autograd glue for `fused_linear_logprobs` on flattened inputs: hidden (N, H), weight (V, H),
    bias (V,) or None, labels (N,) int64 in [0, V). Returns log p(label) (N,) and, when
    `options.return_entropy`, the entropy (N,), both in the compute dtype (float32, or float64 for
    float64 logits)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        options: _Options,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # An output whose gradient is unused arrives in backward as None, so its term is skipped
        # instead of being multiplied by a materialised zero tensor.
        ctx.set_materialize_grads(False)
        num_tokens, chunk, temperature = hidden.shape[0], options.chunk_tokens, options.temperature
        # The logits' dtype is the model's, or autocast's when forward runs under autocast;
        # an empty GEMM tells it for free.
        logits_dtype = F.linear(hidden[:0], weight, bias).dtype
        compute_dtype = torch.promote_types(logits_dtype, torch.float32)
        log_probs = hidden.new_empty(num_tokens, dtype=compute_dtype)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if options.return_entropy else None
        for start in range(0, num_tokens, chunk):
            end = min(start + chunk, num_tokens)
            logits = _chunk_logits(hidden[start:end], weight, bias, temperature, compute_dtype)
            chunk_lse = torch.logsumexp(logits, dim=-1)
            lse[start:end] = chunk_lse
            label_logits = torch.gather(logits, dim=-1, index=labels[start:end].unsqueeze(-1)).squeeze(-1)
            log_probs[start:end] = label_logits - chunk_lse
            if entropy is not None:
                # compute_entropy's expression, term for term, so the values are OpenRLHF's (on one machine its bits)
                # (its logsumexp is chunk_lse: the same op on the same logits).
                probs = F.softmax(logits, dim=-1)
                entropy[start:end] = chunk_lse - torch.sum(probs * logits, dim=-1)
                del probs
            del logits

        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.options = options
        ctx.logits_dtype = logits_dtype
        ctx.autocast = _autocast_state(hidden.device.type)
        if entropy is None:
            return log_probs
        return log_probs, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx,
        grad_log_probs: torch.Tensor | None,
        grad_entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        options: _Options = ctx.options
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_bias = bias is not None and ctx.needs_input_grad[2]
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None

        device_type = hidden.device.type
        autocast_enabled, autocast_dtype = ctx.autocast
        compute_dtype, logits_dtype = lse.dtype, ctx.logits_dtype
        num_tokens, chunk, temperature = hidden.shape[0], options.chunk_tokens, options.temperature
        grad_hidden = torch.empty_like(hidden) if need_hidden else None

        # Only the logits are recomputed under forward's autocast state (so they are forward's
        # logits); the gradient arithmetic below has explicit dtypes and must not be autocast by
        # an autocast region that encloses `.backward()` on CPU.
        with _gathered(weight, bias), torch.autocast(device_type, enabled=False):
            # Allocated once gathered: a partitioned ZeRO-3 parameter's own shape is (0,).
            # d W is summed in the weight's own dtype, as Liger-Kernel's fused linear cross-entropy does: a
            # float32 accumulator (4 V H bytes: 544 MB at V = 152k, H = 896) would cost more than the chunk
            # (under autocast, fp32 weights: summed in fp32, their own dtype)
            # (one chunk: the GEMM below writes it whole, no buffer to zero)
            single_chunk = 0 < num_tokens <= chunk
            grad_weight = (
                torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
                if need_weight and not single_chunk else None
            )  # fmt: skip
            grad_bias = torch.zeros(bias.shape, dtype=compute_dtype, device=bias.device) if need_bias else None
            # d hidden = da @ W runs in the logits dtype, as the lm_head GEMM's own backward does
            # (under autocast that is a copy of an fp32 weight, made once, not per chunk).
            weight_for_grad_hidden = weight.to(logits_dtype) if need_hidden else None
            for start in range(0, num_tokens, chunk):
                end = min(start + chunk, num_tokens)
                with torch.autocast(device_type, enabled=autocast_enabled, dtype=autocast_dtype):
                    logits = _chunk_logits(hidden[start:end], weight, bias, temperature, compute_dtype)
                probs = logits.sub(lse[start:end, None]).exp_()
                # In-place below: the chunk's live temporaries stay at logits, probs and da.
                if grad_entropy is not None:
                    expected_logit = torch.linalg.vecdot(probs, logits).unsqueeze(-1)  # s = sum p z
                    coef = logits.sub_(expected_logit).mul_(grad_entropy[start:end, None].to(compute_dtype))
                    if grad_log_probs is not None:
                        coef.add_(grad_log_probs[start:end, None].to(compute_dtype))
                    grad_logits = coef.mul_(probs).neg_()  # -p (g + e (z - s))
                    del probs
                else:
                    grad_logits = probs.mul_(grad_log_probs[start:end, None].to(compute_dtype).neg())
                    del logits
                if grad_log_probs is not None:
                    grad_logits.scatter_add_(
                        1, labels[start:end, None], grad_log_probs[start:end, None].to(compute_dtype)
                    )
                if temperature != 1.0:
                    grad_logits.div_(temperature)  # through z = logits / T
                # The gradient of the model-dtype logits, rounded once to that dtype as autograd rounds
                # it at `.to(float32)`'s backward: the lm_head's gradients are computed from it.
                grad_model_logits = grad_logits.to(logits_dtype)
                if need_hidden:
                    grad_hidden[start:end] = grad_model_logits @ weight_for_grad_hidden
                if need_weight:
                    # d W sums over all N tokens: one GEMM per chunk in the logits dtype (as the lm_head
                    # GEMM's own backward: tensor cores on a GPU; on CPU a float32 GEMM costs ~2.4x a bf16
                    # one) adding into the running sum, which each chunk rounds once to that dtype (k
                    # roundings for k chunks where autograd rounds once; with one chunk, autograd's GEMM).
                    # The hidden rows are those the lm_head GEMM saw (autocast may have rounded them).
                    hidden_seen = hidden[start:end].to(logits_dtype)
                    if single_chunk:
                        grad_weight = grad_model_logits.t() @ hidden_seen
                    elif grad_weight.dtype == logits_dtype:
                        grad_weight.addmm_(grad_model_logits.t(), hidden_seen)
                    else:
                        grad_weight += (grad_model_logits.t() @ hidden_seen).to(grad_weight.dtype)
                if need_bias:
                    grad_bias += grad_model_logits.sum(0, dtype=compute_dtype)
                del grad_logits, grad_model_logits

        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None


def _validate(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    chunk_tokens: int | None,
) -> None:
    weight_shape = weight.shape
    if not hidden.is_floating_point() or not weight.is_floating_point():
        raise ValueError(f"hidden and weight must be floating point, got {hidden.dtype} and {weight.dtype}")
    if hidden.dim() < 1 or len(weight_shape) != 2:
        raise ValueError(
            f"expected hidden (..., H) and weight (V, H), got {tuple(hidden.shape)} and {tuple(weight_shape)}"
        )
    if hidden.shape[-1] != weight_shape[1]:
        raise ValueError(
            f"hidden's last dimension ({hidden.shape[-1]}) must equal weight's second ({weight_shape[1]}): "
            f"hidden (..., H), weight (V, H), got {tuple(hidden.shape)} and {tuple(weight_shape)}"
        )
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels must have hidden's leading shape {tuple(hidden.shape[:-1])}, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids, got {labels.dtype}")
    vocab_size = weight_shape[0]
    if bias is not None and bias.shape != (vocab_size,):
        raise ValueError(f"bias must have shape (V,) = ({vocab_size},), got {tuple(bias.shape)}")
    if labels.numel() > 0:
        # One host sync: an out-of-range id would otherwise be a device-side assert in gather on CUDA
        # (which poisons the whole CUDA context) or a bare index error on CPU.
        low, high = torch.stack(torch.aminmax(labels)).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(f"labels must lie in [0, V) = [0, {vocab_size}), got ids in [{low}, {high}]")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature must be a real number, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    if chunk_tokens is not None and (
        isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, numbers.Integral) or chunk_tokens < 1
    ):
        raise ValueError(f"chunk_tokens must be None or an integer >= 1, got {chunk_tokens!r}")


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(label) (and the entropy) of `F.linear(hidden, weight, bias) / temperature`, never
    materialising more than one chunk of logits.

    Numerically OpenRLHF 0.11.2's `Actor.forward` recipe (model-dtype lm_head, `.to(torch.float32)`,
    `.div_(temperature)`, `log_probs_from_logits`, `compute_entropy`); differentiable w.r.t. hidden,
    weight and bias through both outputs.

    Args:
        hidden: (..., H) final hidden states, in the model's dtype.
        weight: (V, H) the lm_head weight.
        labels: (...) integer token ids in [0, V), hidden's leading shape.
        bias: (V,) the lm_head bias, if any.
        temperature: the sampling temperature T > 0; the logits are divided by it.
        return_entropy: also return the entropy of softmax(logits / T), in nats.
        chunk_tokens: rows of logits computed at once; None picks `auto_chunk_tokens(V)`, which
            fits one chunk's temporaries in `LOGITS_CHUNK_MEMORY_BUDGET_BYTES`.

    Returns:
        log p(label) of shape (...), in nats, float32 (float64 for float64 inputs); with
        `return_entropy`, the tuple (log p(label), entropy), both (...).
    """
    # Gathered around apply, not inside forward: autograd records the inputs' shapes when apply is
    # called, and a partitioned parameter's own shape is (0,), which the gradient would not match.
    # Inside lm_head's forward the ZeRO-3 hooks have gathered them already and this does nothing.
    with _gathered(weight, bias):
        _validate(hidden, weight, labels, bias, temperature, chunk_tokens)
        options = _Options(
            temperature=float(temperature),
            return_entropy=bool(return_entropy),
            chunk_tokens=int(chunk_tokens) if chunk_tokens is not None else auto_chunk_tokens(weight.shape[0]),
        )
        outputs = FusedLinearLogprobsFunction.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, bias, labels.reshape(-1).long(), options
        )
    leading_shape = hidden.shape[:-1]
    if return_entropy:
        log_probs, entropy = outputs
        return log_probs.view(leading_shape), entropy.view(leading_shape)
    return outputs.view(leading_shape)
