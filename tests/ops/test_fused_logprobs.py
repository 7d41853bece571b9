"""`fused_linear_logprobs` against OpenRLHF 0.11.2's own functions on the full logits.

Ground truth is OpenRLHF's recipe, built exactly as `Actor.forward` builds it: the lm_head as
`F.linear` in the model's dtype, `.to(torch.float32)`, `.div_(temperature)`, then
`openrlhf.models.utils.log_probs_from_logits` and `compute_entropy`; gradients are autograd's
through that graph. `compute_entropy` is wrapped in `torch.compile` at import; OpenRLHF's own CPU
test (tests/test_actor_entropy_temperature.py in the wheel) runs it eagerly by stubbing
`torch.compile`; here the eager function is `compute_entropy.__wrapped__`, the same function.

Tolerances. Forward: the fused op evaluates the same float32 expressions on the same logits, so it
is bitwise OpenRLHF's whenever the chunked lm_head GEMM returns the full GEMM's logits. That holds
by construction with one chunk, on every CPU (the same GEMM and ops on the same tensors in one
process; asserted bitwise); with smaller chunks the BLAS may block a GEMM of fewer rows differently
(on one x86-64 CPU float32 logits then moved by ~1e-7 relative; bf16 / fp16 ones stayed bitwise, which
another CPU need not repeat), so those are held to the float32 bound of `forward_bounds`.
Gradients: the fused backward writes the softmax gradient in closed form and sums d weight over
chunks (one model-dtype GEMM per chunk into a model-dtype running sum), autograd does neither, so
model-dtype gradients can differ by a rounding of the model dtype: atol is a few model-dtype ulps
of the largest gradient (bf16: 1 eps; fp16: 2 eps; for d weight times sqrt(chunks), one rounding
per chunk; fp32: 2e-5, i.e. ~sqrt(V) fp32 roundings of a length-V dot product).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from float32_bounds import UNIT_ROUNDOFF as U
from float32_bounds import gamma
from openrlhf.models.utils import compute_entropy, log_probs_from_logits
from torch.profiler import ProfilerActivity, profile

import openrlhf_band.ops.fused_logprobs as fused_logprobs_module
from openrlhf_band.ops.fused_logprobs import auto_chunk_tokens, fused_linear_logprobs

compute_entropy_eager = getattr(compute_entropy, "__wrapped__", compute_entropy)

N, H, V = 37, 16, 211  # odd sizes: no chunk below divides N = 37 except 1 and N itself

GRAD_TOLERANCE = {torch.bfloat16: torch.finfo(torch.bfloat16).eps, torch.float16: 2 * torch.finfo(torch.float16).eps}
GRAD_TOLERANCE[torch.float32] = 2e-5


def forward_bounds(hidden, weight, bias, labels, temperature, logits_dtype):
    """Per token (float64): how far two evaluations of OpenRLHF's recipe, log p(label) and the entropy,
    may lie apart when their lm_head GEMMs sum in different orders (another chunking or CPU).

    Logits: an H-term dot product plus the bias, rounded to the logits' dtype (unit roundoff u_m),
    divided by T: within gamma_(H+1) (sum |h w| + |b|) / T + (u_m + u) |z| of exact on each path, so
    the two rows lie within dz (twice the row's largest such bound) of each other. log p = z_y - lse(z)
    then moves by <= 2 dz, the entropy H = lse - s, s = sum p z (gradient -p (z - s)), by <= dz e^(2 dz)
    (sum p |z - s| + 2 dz). On top, each path rounds its own logsumexp (z - max z, exp, a V-term sum,
    log, + max z: gamma_V + u width(z) + a few u (1 + log V + |lse|)), the subtraction (u |log p|) and
    s (softmax as lse, a product, a V-term sum: (2 gamma_V + u width(z) + a few u) sum p |z|);
    exp / log within 1 ulp (2u) in torch's vectorised and scalar paths. Twice that between paths."""
    h = hidden.detach().double().reshape(-1, hidden.shape[-1])
    w = weight.detach().double()
    b = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else bias.detach().double()
    u_m = max(U, torch.finfo(logits_dtype).eps / 2)
    n_vocab = w.shape[0]
    z = (h @ w.T + b) / temperature
    per_path = gamma(h.shape[1] + 1) * (h.abs() @ w.abs().T + b.abs()) / temperature + (u_m + U) * z.abs()
    dz = 2 * per_path.amax(-1)
    lse = torch.logsumexp(z, -1)
    p = torch.softmax(z, -1)
    s = (p * z).sum(-1)
    log_p = z.gather(1, labels.reshape(-1, 1)).squeeze(1) - lse
    width = z.amax(-1) - z.amin(-1)
    g, few = gamma(n_vocab), 4 * U
    lse_err = g + U * width + few * (1 + math.log(n_vocab) + lse.abs())
    log_probs = 2 * dz + 2 * (lse_err + U * log_p.abs())
    s_err = (2 * g + U * width + few) * (p * z.abs()).sum(-1)
    spread = (p * (z - s[:, None]).abs()).sum(-1)
    entropy = dz * torch.exp(2 * dz) * (spread + 2 * dz) + 2 * (lse_err + s_err + U * (lse - s).abs())
    return log_probs.reshape(labels.shape), entropy.reshape(labels.shape)


def assert_forward_close(actual, expected, bound, what):
    diff = (actual.detach().double() - expected.detach().double()).abs()
    worst = float((diff / bound).max()) if diff.numel() else 0.0
    assert worst <= 1.0, f"{what}: |difference| reaches {worst:.3g} x its float32 bound"


@pytest.fixture(autouse=True)
def _one_thread():
    # Small GEMMs; one thread keeps timings and BLAS blocking stable on a shared machine.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def openrlhf_logprobs_and_entropy(hidden, weight, labels, bias, temperature):
    """Actor.forward's path (openrlhf/models/actor.py), on full logits."""
    logits = F.linear(hidden, weight, bias)  # the lm_head, in the model's dtype
    logits = logits.to(torch.float32)
    if temperature != 1.0:
        logits.div_(temperature)
    entropy = compute_entropy_eager(logits)
    log_probs = log_probs_from_logits(logits, labels)
    return log_probs, entropy


def make_inputs(dtype, with_bias, seed=0, shape=(N,)):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, H, generator=generator)
    weight = torch.randn(V, H, generator=generator) * 0.5
    bias = torch.randn(V, generator=generator) if with_bias else None
    labels = torch.randint(0, V, shape, generator=generator)
    upstream = torch.randn(2, *shape, generator=generator)
    return hidden.to(dtype), weight.to(dtype), bias.to(dtype) if with_bias else None, labels, upstream


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def loss_of(log_probs, entropy, upstream, used):
    terms = {"log_probs": (log_probs * upstream[0]).sum(), "entropy": (entropy * upstream[1]).sum()}
    return sum(terms[name] for name in used)


def assert_grads_close(actual, expected, dtype, chunks: int = 1):
    # d weight in bf16 / fp16 is one model-dtype GEMM per chunk into a running sum: k chunks round k times
    tolerance = GRAD_TOLERANCE[dtype] * (chunks**0.5 if dtype in (torch.bfloat16, torch.float16) else 1.0)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(
        actual.float(), expected.float(), rtol=tolerance, atol=tolerance * expected.float().abs().max().item()
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk_tokens", [1, 7, N, 1000])
@pytest.mark.parametrize("used", [("log_probs",), ("entropy",), ("log_probs", "entropy")])
def test_matches_openrlhf_values_and_gradients(dtype, temperature, with_bias, chunk_tokens, used):
    hidden, weight, bias, labels, upstream = make_inputs(dtype, with_bias)

    ref_hidden, ref_weight, ref_bias = leaves(hidden, weight, bias)
    ref_log_probs, ref_entropy = openrlhf_logprobs_and_entropy(ref_hidden, ref_weight, labels, ref_bias, temperature)
    loss_of(ref_log_probs, ref_entropy, upstream, used).backward()

    our_hidden, our_weight, our_bias = leaves(hidden, weight, bias)
    log_probs, entropy = fused_linear_logprobs(
        our_hidden,
        our_weight,
        labels,
        bias=our_bias,
        temperature=temperature,
        return_entropy=True,
        chunk_tokens=chunk_tokens,
    )
    loss_of(log_probs, entropy, upstream, used).backward()

    assert log_probs.dtype == entropy.dtype == torch.float32
    if chunk_tokens >= N:  # one chunk: the very same GEMM and ops on the same tensors: OpenRLHF's bits, any CPU
        assert torch.equal(log_probs, ref_log_probs.detach())
        assert torch.equal(entropy, ref_entropy.detach())
    bound_log_probs, bound_entropy = forward_bounds(hidden, weight, bias, labels, temperature, dtype)
    assert_forward_close(log_probs, ref_log_probs, bound_log_probs, "log_probs")
    assert_forward_close(entropy, ref_entropy, bound_entropy, "entropy")

    assert_grads_close(our_hidden.grad, ref_hidden.grad, dtype)
    assert_grads_close(our_weight.grad, ref_weight.grad, dtype, chunks=-(-N // chunk_tokens))
    if with_bias:
        assert_grads_close(our_bias.grad, ref_bias.grad, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_log_probs_alone_and_leading_shape(dtype):
    # (B, T, H) hidden as the actor produces it; without return_entropy a single tensor comes back.
    hidden, weight, _, labels, upstream = make_inputs(dtype, with_bias=False, seed=1, shape=(3, 11))
    ref_hidden, ref_weight = leaves(hidden, weight)
    ref_log_probs, _ = openrlhf_logprobs_and_entropy(ref_hidden, ref_weight, labels, None, 0.7)
    (ref_log_probs * upstream[0]).sum().backward()

    our_hidden, our_weight = leaves(hidden, weight)
    log_probs = fused_linear_logprobs(our_hidden, our_weight, labels, temperature=0.7, chunk_tokens=5)
    (log_probs * upstream[0]).sum().backward()

    assert isinstance(log_probs, torch.Tensor) and log_probs.shape == (3, 11)
    bound, _ = forward_bounds(hidden, weight, None, labels, 0.7, dtype)
    assert_forward_close(log_probs, ref_log_probs, bound, "log_probs")
    assert_grads_close(our_hidden.grad, ref_hidden.grad, dtype)
    assert_grads_close(our_weight.grad, ref_weight.grad, dtype)


def test_frozen_weight_gets_no_gradient():
    hidden, weight, bias, labels, _ = make_inputs(torch.float32, with_bias=True, seed=2)
    hidden.requires_grad_()
    log_probs, entropy = fused_linear_logprobs(hidden, weight, labels, bias=bias, return_entropy=True, chunk_tokens=8)
    (log_probs.sum() + entropy.sum()).backward()
    assert weight.grad is None and bias.grad is None
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


@pytest.mark.parametrize("return_entropy", [False, True])
def test_float64_gradcheck(return_entropy):
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(9, dtype=torch.float64, generator=generator, requires_grad=True)
    labels = torch.randint(0, 9, (5,), generator=generator)

    def op(hidden, weight, bias):
        return fused_linear_logprobs(
            hidden, weight, labels, bias=bias, temperature=0.7, return_entropy=return_entropy, chunk_tokens=2
        )

    outputs = op(hidden, weight, bias)
    for output in outputs if return_entropy else (outputs,):
        assert output.dtype == torch.float64
    assert torch.autograd.gradcheck(op, (hidden, weight, bias))


@pytest.mark.parametrize("backward_under_autocast", [False, True])
def test_autocast_recomputes_the_forward_logits(backward_under_autocast):
    # fp32 master weights under CPU bf16 autocast: the lm_head runs in bf16 in forward, and backward
    # must recompute those bf16 logits (not fp32 ones), whatever autocast state encloses .backward().
    hidden, weight, bias, labels, upstream = make_inputs(torch.float32, with_bias=True, seed=4)
    results = []
    for fused in (False, True):
        h, w, b = leaves(hidden, weight, bias)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                log_probs, entropy = fused_linear_logprobs(
                    h, w, labels, bias=b, temperature=0.7, return_entropy=True, chunk_tokens=8
                )
            else:
                log_probs, entropy = openrlhf_logprobs_and_entropy(h, w, labels, b, 0.7)
            loss = loss_of(log_probs, entropy, upstream, ("log_probs", "entropy"))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=backward_under_autocast):
            loss.backward()
        results.append((log_probs.detach(), entropy.detach(), h.grad, w.grad, b.grad))
    expected, actual = results
    bound_log_probs, bound_entropy = forward_bounds(
        hidden.bfloat16(), weight.bfloat16(), bias.bfloat16(), labels, 0.7, torch.bfloat16
    )  # autocast runs the lm_head on bf16 copies of the inputs
    assert_forward_close(actual[0], expected[0], bound_log_probs, "log_probs")
    assert_forward_close(actual[1], expected[1], bound_entropy, "entropy")
    for ours, theirs in zip(actual[2:], expected[2:]):
        assert ours.dtype == torch.float32
        assert_grads_close(ours, theirs, torch.bfloat16)  # the gradients went through bf16 GEMMs


def test_empty_input():
    hidden, weight, _, labels, _ = make_inputs(torch.float32, with_bias=False, shape=(0,))
    weight.requires_grad_()
    log_probs, entropy = fused_linear_logprobs(hidden, weight, labels, return_entropy=True)
    assert log_probs.shape == entropy.shape == (0,)
    (log_probs.sum() + entropy.sum()).backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


# ----------------------------------------------------------------------------------------------
# memory: no (N, V) tensor, ever
# ----------------------------------------------------------------------------------------------
def _record_lm_head_rows(monkeypatch):
    rows = []
    linear = F.linear

    def recording_linear(input, weight, bias=None):
        output = linear(input, weight, bias)
        rows.append(output.shape[0])
        return output

    monkeypatch.setattr(fused_logprobs_module.F, "linear", recording_linear)
    return rows


def test_logits_are_computed_one_chunk_at_a_time(monkeypatch):
    hidden, weight, bias, labels, _ = make_inputs(torch.bfloat16, with_bias=True, seed=5, shape=(4, 25))
    hidden.requires_grad_()
    weight.requires_grad_()
    rows = _record_lm_head_rows(monkeypatch)
    log_probs, entropy = fused_linear_logprobs(hidden, weight, labels, bias=bias, return_entropy=True, chunk_tokens=16)
    forward_rows = [r for r in rows if r > 0]  # rows == 0: forward's empty GEMM that reads the logits dtype
    (log_probs.sum() + entropy.sum()).backward()
    backward_rows = rows[len(rows) - len(forward_rows) :]
    # every token's logits went through the lm_head once in forward and once in backward, 16 rows at a time
    assert forward_rows == backward_rows == [16] * 6 + [4]


def test_automatic_chunk_size_follows_the_memory_budget(monkeypatch):
    assert auto_chunk_tokens(151_936) == 256  # 640 MiB / (16 B * V) = 276 rows, down to a multiple of 128
    assert auto_chunk_tokens(10**9) == 128  # never below 128 rows
    assert auto_chunk_tokens(1000, budget_bytes=16 * 1000 * 300) == 256
    # chunk_tokens=None reads the budget when called: a budget of 200 rows of V = 211 gives 128-row chunks
    monkeypatch.setattr(fused_logprobs_module, "LOGITS_CHUNK_MEMORY_BUDGET_BYTES", 16 * V * 200)
    hidden, weight, _, labels, _ = make_inputs(torch.float32, with_bias=False, shape=(300,))
    rows = _record_lm_head_rows(monkeypatch)
    fused_linear_logprobs(hidden, weight, labels)
    assert [r for r in rows if r > 0] == [128, 128, 44]


def _largest_single_allocation(fn) -> int:
    """Bytes of the largest CPU allocation made while `fn` runs (an allocation is charged to the
    innermost op that makes it, so the largest 'self' memory of any op is the largest allocation)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(event.self_cpu_memory_usage for event in prof.events())


def test_no_full_logits_allocation_forward_and_backward():
    num_tokens, hidden_size, vocab_size, chunk = 512, 32, 4096, 64
    generator = torch.Generator().manual_seed(6)
    hidden = torch.randn(num_tokens, hidden_size, generator=generator).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(vocab_size, hidden_size, generator=generator) * 0.1).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab_size, (num_tokens,), generator=generator)
    full_logits_bytes = num_tokens * vocab_size * 4  # float32 (N, V)

    def fused_step():
        log_probs, entropy = fused_linear_logprobs(
            hidden, weight, labels, temperature=0.7, return_entropy=True, chunk_tokens=chunk
        )
        (log_probs.sum() + entropy.sum()).backward()

    def openrlhf_step():
        log_probs, entropy = openrlhf_logprobs_and_entropy(hidden, weight, labels, None, 0.7)
        (log_probs.sum() + entropy.sum()).backward()

    # The measurement sees a full-logits path (the control), so a small number below is not vacuous.
    assert _largest_single_allocation(openrlhf_step) >= full_logits_bytes
    largest = _largest_single_allocation(fused_step)
    assert largest <= chunk * vocab_size * 4 < full_logits_bytes / 4, largest


# ----------------------------------------------------------------------------------------------
# ZeRO-3: a partitioned weight / bias is gathered for the recompute and partitioned again
# ----------------------------------------------------------------------------------------------
def _as_zero3_param(param: torch.Tensor, name: str, log: list, gathered_data: torch.Tensor | None = None):
    """Give `param` the part of DeepSpeed's ZeRO-3 parameter interface the op uses: `ds_status`,
    `ds_shape` and `all_gather()` / `partition()`, which swap `.data` between the full tensor and an
    empty shard, as DeepSpeed does. `gathered_data` replaces what all_gather restores (to make backward fail)."""
    full = param.data

    def all_gather():
        log.append(("all_gather", name))
        param.data = full if gathered_data is None else gathered_data
        param.ds_status = ZeroParamStatus.AVAILABLE

    def partition():
        log.append(("partition", name))
        param.data = torch.empty(0, dtype=full.dtype)
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE

    param.ds_id, param.ds_shape = id(param), full.shape
    param.ds_status = ZeroParamStatus.AVAILABLE
    param.all_gather, param.partition = all_gather, partition
    return param


def _zero3_case(seed=7):
    hidden, weight, bias, labels, upstream = make_inputs(torch.bfloat16, with_bias=True, seed=seed)
    return leaves(hidden, weight, bias) + [labels, upstream]


def _fused_loss(hidden, weight, bias, labels, upstream):
    log_probs, entropy = fused_linear_logprobs(
        hidden, weight, labels, bias=bias, temperature=0.7, return_entropy=True, chunk_tokens=8
    )
    return loss_of(log_probs, entropy, upstream, ("log_probs", "entropy"))


def _grads(loss, *inputs):
    # torch.autograd.grad, not .backward(): accumulating into .grad of a parameter whose .data is the
    # empty shard fails in autograd itself, for DeepSpeed's own LinearFunctionForZeroStage3 too; under
    # DeepSpeed the module's hooks keep the parameter gathered until its gradient has been taken.
    return torch.autograd.grad(loss, inputs)


def test_zero3_stand_in_drives_deepspeeds_own_linear_the_same_way():
    # Control: the stand-in below is enough for DeepSpeed's own ZeRO-3 linear, which gathers and
    # partitions exactly as the fused op is expected to.
    from deepspeed.runtime.zero.linear import LinearFunctionForZeroStage3

    log = []
    hidden, weight, _, _, _ = _zero3_case()
    _as_zero3_param(weight, "weight", log)
    output = LinearFunctionForZeroStage3.apply(hidden, weight, None)
    weight.partition()
    log.clear()
    _grads(output.float().sum(), hidden, weight)
    assert log == [("all_gather", "weight"), ("partition", "weight")]


def test_zero3_parameters_are_gathered_for_backward_and_partitioned_again():
    hidden, weight, bias, labels, upstream = _zero3_case()
    expected = _grads(_fused_loss(hidden, weight, bias, labels, upstream), hidden, weight, bias)

    log = []
    hidden, weight, bias, labels, upstream = _zero3_case()
    _as_zero3_param(weight, "weight", log)
    _as_zero3_param(bias, "bias", log)
    loss = _fused_loss(hidden, weight, bias, labels, upstream)  # weight available, as inside lm_head's hooks
    assert log == []
    weight.partition()
    bias.partition()  # as if released after the module's forward
    log.clear()
    grads = _grads(loss, hidden, weight, bias)

    assert log == [("all_gather", "weight"), ("all_gather", "bias"), ("partition", "weight"), ("partition", "bias")]
    assert weight.ds_status is ZeroParamStatus.NOT_AVAILABLE and weight.numel() == 0
    for ours, theirs in zip(grads, expected):
        assert torch.equal(ours, theirs)


def test_zero3_forward_outside_the_module_hooks_gathers_too():
    hidden, weight, bias, labels, upstream = _zero3_case()
    expected_loss = _fused_loss(hidden, weight, bias, labels, upstream)
    expected = _grads(expected_loss, hidden, weight, bias)

    log = []
    hidden, weight, bias, labels, upstream = _zero3_case()
    _as_zero3_param(weight, "weight", log).partition()  # partitioned already when the op is called
    log.clear()
    loss = _fused_loss(hidden, weight, bias, labels, upstream)
    assert log == [("all_gather", "weight"), ("partition", "weight")]
    assert torch.equal(loss.detach(), expected_loss.detach())
    grads = _grads(loss, hidden, weight, bias)  # autograd recorded the gathered shape: full-shape grads pass
    assert log == [("all_gather", "weight"), ("partition", "weight")] * 2
    for ours, theirs in zip(grads, expected):
        assert torch.equal(ours, theirs)


def test_zero3_parameters_are_partitioned_even_when_backward_raises():
    log = []
    hidden, weight, bias, labels, upstream = _zero3_case()
    loss = _fused_loss(hidden, weight, bias, labels, upstream)
    # all_gather restores a weight of the wrong width, so the recompute's GEMM fails after the gather
    _as_zero3_param(weight, "weight", log, gathered_data=torch.zeros(V, H + 1, dtype=weight.dtype)).partition()
    log.clear()
    with pytest.raises(RuntimeError):
        _grads(loss, hidden, weight, bias)
    assert log == [("all_gather", "weight"), ("partition", "weight")]
    assert weight.ds_status is ZeroParamStatus.NOT_AVAILABLE


# ----------------------------------------------------------------------------------------------
# rejected inputs
# ----------------------------------------------------------------------------------------------
def _good():
    hidden, weight, bias, labels, _ = make_inputs(torch.float32, with_bias=True, shape=(2, 3))
    return {"hidden": hidden, "weight": weight, "labels": labels, "bias": bias}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden": torch.randn(2, 3, H + 1)}, "last dimension"),
        ({"weight": torch.randn(V, H, 1)}, r"weight \(V, H\)"),
        ({"hidden": torch.randint(0, 5, (2, 3, H))}, "floating point"),
        ({"labels": torch.zeros(2, 4, dtype=torch.long)}, "leading shape"),
        ({"labels": torch.zeros(6, dtype=torch.long)}, "leading shape"),
        ({"labels": torch.zeros(2, 3)}, "integer token ids"),
        ({"labels": torch.zeros(2, 3, dtype=torch.bool)}, "integer token ids"),
        ({"labels": torch.full((2, 3), V, dtype=torch.long)}, r"\[0, V\)"),
        ({"labels": torch.full((2, 3), -1, dtype=torch.long)}, r"\[0, V\)"),
        ({"bias": torch.zeros(V + 1)}, r"bias must have shape \(V,\)"),
        ({"temperature": 0.0}, "finite and > 0"),
        ({"temperature": -0.5}, "finite and > 0"),
        ({"temperature": math.inf}, "finite and > 0"),
        ({"temperature": math.nan}, "finite and > 0"),
        ({"temperature": True}, "real number"),
        ({"temperature": "0.7"}, "real number"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"chunk_tokens": 2.5}, "chunk_tokens"),
        ({"chunk_tokens": True}, "chunk_tokens"),
    ],
)
def test_rejects_bad_inputs(change, message):
    kwargs = {**_good(), **change}
    hidden, weight, labels = kwargs.pop("hidden"), kwargs.pop("weight"), kwargs.pop("labels")
    with pytest.raises(ValueError, match=message):
        fused_linear_logprobs(hidden, weight, labels, **kwargs)


def test_int32_labels_are_accepted():
    good = _good()
    expected = fused_linear_logprobs(good["hidden"], good["weight"], good["labels"], bias=good["bias"])
    int32 = fused_linear_logprobs(good["hidden"], good["weight"], good["labels"].int(), bias=good["bias"])
    assert torch.equal(int32, expected)
