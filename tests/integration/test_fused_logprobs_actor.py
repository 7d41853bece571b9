"""`--ds.fused_logprobs` in the patched OpenRLHF 0.11.2 `Actor`, against the same `Actor` without it.

Ground truth is OpenRLHF's own forward (full logits, float32 cast, temperature, `log_probs_from_logits`,
`compute_entropy`) on the same weights and inputs, with a tied and an untied head, gradient
checkpointing on and off, padded and packed batches, a temperature; then under a real DeepSpeed
ZeRO-3 engine (gloo, one CPU process, OpenRLHF's `DeepspeedStrategy`), gradients read before the step.

Where the flag acts (the head: log-probs, entropy, d hidden, d W) the two paths sum in other orders,
and another CPU's SIMD blocking takes other orders again, so they are compared elementwise against
twice the float32 forward-error bound derived in tests/support/float32_bounds.py, and negative
controls show a defect of a bug's size fails that comparison. Below the head the flag changes
nothing: the fused run's body is fed the plain run's d hidden and must then give the same gradient
bits (same kernels, same inputs, same order, one process).
"""

from __future__ import annotations

import copy
import json
import socket
from dataclasses import dataclass, replace
from datetime import timedelta
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist
from float32_bounds import UNIT_ROUNDOFF, assert_within, excess, lm_head_bounds
from openrlhf.models import Actor
from transformers import Qwen2ForCausalLM

from openrlhf_band.integration.fused_head import FusedHead
from openrlhf_band.tools.tiny_model import tiny_qwen2 as build_tiny_qwen2

VOCAB, BATCH, SEQ, ACTIONS = 96, 3, 14, 8


def tiny_qwen2(tied: bool, dtype=torch.float32) -> Qwen2ForCausalLM:
    model = build_tiny_qwen2(VOCAB, attn_implementation="eager", use_cache=False, tie_word_embeddings=tied)
    return model.to(dtype)


def actor_pair(tied: bool, temperature: float = 1.0, dtype=torch.float32, packing: bool = False):
    """(OpenRLHF's Actor, the same weights with --ds.fused_logprobs)."""
    model = tiny_qwen2(tied, dtype)
    plain = Actor(model, temperature=temperature)
    fused = Actor(copy.deepcopy(model), temperature=temperature, fused_logprobs=True)
    for actor in (plain, fused):
        actor.packing_samples = packing  # OpenRLHF 0.11.2: Actor(<nn.Module>) never sets it
    assert plain.fused_head is None and isinstance(fused.fused_head, FusedHead)
    if tied:
        assert fused.model.lm_head.weight is fused.model.model.embed_tokens.weight
    return plain, fused


def batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    sequences = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, :3] = 0  # left padding (prompt)
    attention_mask[2, -2:] = 0  # right padding (response)
    sequences = sequences * attention_mask
    action_mask = attention_mask[:, -ACTIONS:].bool()
    return sequences, attention_mask, action_mask


@dataclass
class HeadRun:
    """One forward (and backward) of an Actor, with what its head saw."""

    log_probs: torch.Tensor  # (B, ACTIONS)
    entropy: torch.Tensor | None  # (B, SEQ - 1)
    hidden: torch.Tensor  # the head's input (the final norm's output)
    d_hidden: torch.Tensor | None  # its gradient, as the head computed it
    grads: dict[str, torch.Tensor]
    output: object
    grad_log_probs_max: float = 0.0  # upper bounds of the upstream gradients, for the rounding bounds
    grad_entropy_max: float = 0.0


def capture_head_input(norm: torch.nn.Module, seen: dict, d_hidden_for_body: torch.Tensor | None):
    """A forward hook on the final norm (the head's input): records it in seen["hidden"] and its gradient
    in seen["d_hidden"]; d_hidden_for_body, when given, replaces that gradient before it flows into the
    body, so that the body's backward runs on the same bits as in the run that produced it."""

    def on_head_input(_module, _inputs, hidden):
        seen["hidden"] = hidden.detach().clone()
        if hidden.requires_grad:

            def on_grad(grad):
                seen["d_hidden"] = grad.detach().clone()
                return None if d_hidden_for_body is None else d_hidden_for_body.clone()

            hidden.register_hook(on_grad)

    return norm.register_forward_hook(on_head_input)


def head_weight_bound(bounds, tied: bool, grad_a: torch.Tensor, grad_b: torch.Tensor, unit_roundoff: float):
    """The head weight's bound: d W's, plus, for a tied embedding (the head's d W added to the same
    lookup gradient in both runs), one rounding of that sum."""
    if not tied:
        return bounds.d_weight
    return bounds.d_weight + unit_roundoff * (grad_a.abs() + grad_b.abs())


def run_head(actor: Actor, with_entropy: bool, seed: int = 0, backward: bool = True,
             d_hidden_for_body: torch.Tensor | None = None) -> HeadRun:  # fmt: skip
    """Forward (and backward) of `actor` on `batch(seed)`, the head's input and its gradient captured
    (d_hidden_for_body: see `capture_head_input`)."""
    sequences, attention_mask, action_mask = batch(seed)
    seen = {}
    handle = capture_head_input(actor.model.model.norm, seen, d_hidden_for_body)
    try:
        with torch.set_grad_enabled(backward):
            log_probs, output = actor(sequences, action_mask, attention_mask=attention_mask, return_output=True,
                                      return_entropy=with_entropy)  # fmt: skip
    finally:
        handle.remove()
    entropy = output.entropy if with_entropy else None
    grads, g_max, e_max = {}, 0.0, 0.0
    if backward:
        gen = torch.Generator().manual_seed(5)
        weights = torch.randn(log_probs.shape, generator=gen)
        loss = (log_probs * weights).sum()
        g_max = float(weights.abs().max())
        if with_entropy:
            entropy_weights = torch.randn(entropy[:, -ACTIONS:].shape, generator=gen)
            loss = loss + (entropy[:, -ACTIONS:] * entropy_weights).sum()
            e_max = float(entropy_weights.abs().max())
        actor.zero_grad(set_to_none=True)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in actor.named_parameters() if p.grad is not None}
    return HeadRun(log_probs.detach(), None if entropy is None else entropy.detach(), seen["hidden"],
                   seen.get("d_hidden"), grads, output, g_max, e_max)  # fmt: skip


def per_token(bound: torch.Tensor) -> torch.Tensor:
    """A (N,) per-row bound as Actor.forward lays its (B, SEQ - 1) per-token outputs out."""
    return bound.reshape(BATCH, SEQ)[:, :-1]


def assert_same_head_and_body(plain_actor: Actor, plain: HeadRun, fused: HeadRun, temperature: float,
                              seed: int = 0) -> None:  # fmt: skip
    """The fused run computed OpenRLHF's numbers: head outputs and gradients within twice the float32
    forward-error bound (tests/support/float32_bounds.py: the two paths sum in other orders, and another
    CPU's SIMD blocking takes others again), every body gradient the same bits (the fused run's body got
    the plain run's d hidden: same kernels on the same inputs in one process)."""
    torch.testing.assert_close(fused.hidden, plain.hidden, rtol=0, atol=0)  # the body's forward, same code
    model = plain_actor.model
    dtype = model.lm_head.weight.dtype
    sequences, _, _ = batch(seed)
    bounds = lm_head_bounds(plain.hidden, model.lm_head.weight, sequences.roll(-1, dims=1), temperature,
                            plain.grad_log_probs_max, plain.grad_entropy_max,
                            model_unit_roundoff=torch.finfo(dtype).eps / 2)  # fmt: skip
    assert_within(fused.log_probs, plain.log_probs, per_token(bounds.log_probs)[:, -ACTIONS:], "log-probs")
    if plain.entropy is not None:
        assert_within(fused.entropy, plain.entropy, per_token(bounds.entropy), "entropy")
    if not plain.grads:
        return
    assert set(plain.grads) == set(fused.grads) and len(plain.grads) == len(list(plain_actor.parameters()))
    assert_within(fused.d_hidden, plain.d_hidden, bounds.d_hidden, "d hidden")
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    head = "model.model.embed_tokens.weight" if tied else "model.lm_head.weight"
    head_bound = head_weight_bound(bounds, tied, plain.grads[head], fused.grads[head], torch.finfo(dtype).eps / 2)
    assert_within(fused.grads[head], plain.grads[head], head_bound, head)
    for name in plain.grads:
        if name != head:
            assert torch.equal(fused.grads[name], plain.grads[name]), name


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_actor_equals_openrlhfs_forward_and_gradients(tied, checkpointing, temperature):
    plain_actor, fused_actor = actor_pair(tied, temperature)
    for actor in (plain_actor, fused_actor):
        actor.train()
        if checkpointing:
            actor.gradient_checkpointing_enable()
    plain = run_head(plain_actor, with_entropy=True)
    fused = run_head(fused_actor, with_entropy=True, d_hidden_for_body=plain.d_hidden)
    assert fused.output["logits"].numel() == 0  # no vocabulary-sized tensor kept by the output
    assert_same_head_and_body(plain_actor, plain, fused, temperature)


def test_a_defect_in_the_head_fails_the_same_comparison():
    """Negative controls: the bounds are tight enough to see a defect of the size a bug makes."""
    plain_actor, fused_actor = actor_pair(tied=False, temperature=0.7)
    plain = run_head(plain_actor, with_entropy=True)
    fused = run_head(fused_actor, with_entropy=True, d_hidden_for_body=plain.d_hidden)
    assert_same_head_and_body(plain_actor, plain, fused, 0.7)
    defects = {
        "d W scaled by 1 + 1e-3": lambda run: run.grads["model.lm_head.weight"].mul_(1 + 1e-3),
        "one token's d hidden dropped": lambda run: run.d_hidden.reshape(BATCH * SEQ, -1)[SEQ - 2].zero_(),
        "entropy at temperature 1": lambda run: run.entropy.copy_(run_head(
            actor_pair(tied=False)[1], with_entropy=True, backward=False).entropy),
    }  # fmt: skip
    for what, defect in defects.items():
        broken = replace(fused, entropy=fused.entropy.clone(), d_hidden=fused.d_hidden.clone(),
                         grads={name: grad.clone() for name, grad in fused.grads.items()})  # fmt: skip
        defect(broken)
        with pytest.raises(AssertionError, match="rounding bound"):
            assert_same_head_and_body(plain_actor, plain, broken, 0.7)
        print("caught:", what)


def test_without_entropy_bf16_and_no_grad_as_the_experience_maker_calls_it():
    plain_actor, fused_actor = actor_pair(tied=True, dtype=torch.bfloat16)
    plain_actor.eval(), fused_actor.eval()
    plain = run_head(plain_actor, with_entropy=False, seed=1, backward=False)
    fused = run_head(fused_actor, with_entropy=False, seed=1, backward=False)
    assert fused.log_probs.dtype == torch.float32 and plain.log_probs.shape == fused.log_probs.shape
    assert_same_head_and_body(plain_actor, plain, fused, 1.0, seed=1)
    plain = run_head(plain_actor, with_entropy=False)
    fused = run_head(fused_actor, with_entropy=False, d_hidden_for_body=plain.d_hidden)
    assert_same_head_and_body(plain_actor, plain, fused, 1.0)


def test_packed_batches_take_the_same_path():
    plain_actor, fused_actor = actor_pair(tied=False, packing=True)
    plain = run_head(plain_actor, with_entropy=False, seed=2, backward=False)
    fused = run_head(fused_actor, with_entropy=False, seed=2, backward=False)
    assert plain.hidden.shape[0] == 1  # packed: one row of the batch's real tokens
    sequences, attention_mask, _ = batch(2)
    labels = sequences.roll(-1, dims=1)[attention_mask.bool()]  # packed as OpenRLHF packs them
    bounds = lm_head_bounds(plain.hidden, plain_actor.model.lm_head.weight, labels, 1.0, 0.0, 0.0)
    # the real tokens' log-probs, laid back into (B, SEQ) by Actor.forward: compare where they landed
    padded = torch.zeros(BATCH, SEQ, dtype=torch.float64)
    padded[attention_mask.bool()] = bounds.log_probs
    assert_within(fused.log_probs, plain.log_probs, padded[:, 1:][:, -ACTIONS:].clamp_min(1e-30), "log-probs")


def test_callers_that_want_the_logits_get_them_and_the_head_is_plain_outside_forward():
    plain, fused = actor_pair(tied=False)
    sequences, attention_mask, _ = batch()
    with torch.no_grad():
        a = plain(sequences, attention_mask=attention_mask, return_output=True)
        b = fused(sequences, attention_mask=attention_mask, return_output=True)
        torch.testing.assert_close(b["logits"], a["logits"])  # no action mask: OpenRLHF's logits
        hidden = torch.randn(2, 32)
        torch.testing.assert_close(fused.model.lm_head(hidden), plain.model.lm_head(hidden))


def test_unsupported_heads_are_refused_with_a_reason():
    model = tiny_qwen2(tied=False)
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ValueError, match="not a plain torch.nn.Linear"):
        Actor(model, fused_logprobs=True)
    capped = tiny_qwen2(tied=False)
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="changes its logits after lm_head"):
        Actor(capped, fused_logprobs=True)


# ------------------------------------------------------------------------------- DeepSpeed ZeRO-3
# In a child process: DeepSpeed's comm layer keeps the first process group it saw, so a second gloo
# world in this pytest process (tests/integration/test_openrlhf_integration.py makes one) would break.
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gloo_world() -> None:
    import os

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}  # fmt: skip
    os.environ.update(env)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(minutes=5))
    torch.cuda.set_device = lambda device: None  # CPU torch: see test_openrlhf_integration


# The chunk the ZeRO-3 check forces: 42 tokens in chunks of 16, 16 and 10, so that d W is accumulated
# over chunks (the automatic chunk is at least 128 rows, one chunk here).
ZERO3_CHUNK_TOKENS = 16
# The negative controls' defects: the head's gradient scaled by this, and one chunk's rows of d hidden dropped.
HEAD_GRADIENT_SCALE = 1 + 1e-3


@dataclass
class Zero3Backward:
    """One backward of an Actor under OpenRLHF's ZeRO-3 engine, read before the optimizer step."""

    log_probs: torch.Tensor  # (B, ACTIONS)
    entropy: torch.Tensor  # (B, SEQ - 1)
    hidden: torch.Tensor  # (B, SEQ, H): the head's input (the final norm's output)
    d_hidden: torch.Tensor  # its gradient, as the head computed it
    grads: dict[str, torch.Tensor]  # every parameter's full gradient (gathered from ZeRO-3's partitions)
    moved: int  # parameters the optimizer step then moved
    grad_log_probs_max: float  # upper bounds of the upstream gradients, for the rounding bounds
    grad_entropy_max: float


def zero3_backward(model: Qwen2ForCausalLM, fused: bool, d_hidden_for_body: torch.Tensor | None = None):
    """Forward, backward and one Adam step of an Actor under OpenRLHF's ZeRO-3 DeepSpeed engine.

    d_hidden_for_body, when given, replaces the head's input gradient before it flows into the body:
    the body's backward then runs on the same bits as in the run that produced it.
    """
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    args = NS(
        local_rank=-1, seed=42,
        ds=NS(zero_stage=3, param_dtype="fp32", adam_offload=False, zpg=1, packing_samples=False,
              tensor_parallel_size=1, ring_attn_size=1, enable_sleep=False, deepcompile=False),
        train=NS(micro_batch_size=BATCH, batch_size=BATCH),
    )  # fmt: skip
    strategy = DeepspeedStrategy(seed=42, max_norm=1.0, micro_train_batch_size=BATCH, train_batch_size=BATCH,
                                 zero_stage=3, args=args)  # fmt: skip
    strategy.setup_distributed()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    actor = Actor(model, temperature=0.7, fused_logprobs=fused)
    actor.packing_samples = False
    cfg = dict(optim="adam", muon={}, adam=dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0),
               lr_scheduler="constant", lr_warmup_ratio=0.0, min_lr_ratio=0.1, max_norm=1.0, scheduler_steps=10)
    actor, optim, scheduler = strategy.prepare((actor, cfg))
    module = actor.model.module
    assert hasattr(module.lm_head.weight, "ds_id")  # partitioned by ZeRO-3
    seen = {}
    handle = capture_head_input(module.model.norm, seen, d_hidden_for_body)
    actor.train()
    sequences, attention_mask, action_mask = batch(3)
    log_probs, output = actor(sequences, action_mask, attention_mask=attention_mask, return_output=True,
                              return_entropy=True)  # fmt: skip
    handle.remove()
    assert (output["logits"].numel() == 0) == fused  # the fused head ran under the engine
    gen = torch.Generator().manual_seed(9)
    advantages = torch.randn(log_probs.shape, generator=gen)
    count = action_mask.sum()
    loss = -(log_probs * advantages).sum() / count - 0.01 * output.entropy[:, -ACTIONS:].mean()
    strategy.backward(loss, actor, optim)
    grads = {n: safe_get_full_grad(p).detach().clone() for n, p in module.named_parameters()}
    strategy.optimizer_step(optim, actor, scheduler)
    params = dict(module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        moved = sum(int(not torch.equal(p.detach(), before[n])) for n, p in params.items())
    return Zero3Backward(
        log_probs.detach(), output.entropy.detach(), seen["hidden"], seen["d_hidden"], grads, moved,
        grad_log_probs_max=float(advantages.abs().max() / count), grad_entropy_max=0.01 / (BATCH * ACTIONS),
    )  # fmt: skip


def zero3_comparison(tied: bool) -> None:
    """The check, run in the child: with the flag, one ZeRO-3 backward computes the same head outputs and
    gradients as without it, within float32 rounding, and hands the body the same work.

    What the flag changes is the head: log-probs, entropy, the head's input gradient (d hidden) and its
    weight gradient (d W). Those are compared elementwise against `tests/support/float32_bounds.py`:
    each path is within the float32 forward-error bound of the exact values (an H-term dot for the
    logits, V terms for lse, the entropy and d hidden, N = 42 token rows summed into d W over three chunks,
    whatever order or SIMD blocking a CPU takes), so the two are within twice it. The body's backward
    is linear in d hidden and is the same code in both runs; fed the plain run's d hidden bits in the
    fused run, it must give the same bits (same kernels, same inputs, same order, one process): every
    body parameter's gradient is compared with torch.equal. The tied embedding adds the head's d W to its
    lookup gradient: their bound plus one rounding of that sum.

    Not compared: the weights after Adam. Its first update is ~lr * g / |g| per element, so a rounding-level
    difference in a near-zero gradient moves a weight by up to 2 lr: no bound from the arithmetic holds there.
    """
    import openrlhf_band.ops.fused_logprobs as fused_logprobs

    fused_logprobs.auto_chunk_tokens = lambda vocab_size, budget_bytes=None: ZERO3_CHUNK_TOKENS
    _gloo_world()
    before = tiny_qwen2(tied)
    plain = zero3_backward(copy.deepcopy(before), fused=False)
    fused = zero3_backward(copy.deepcopy(before), fused=True, d_hidden_for_body=plain.d_hidden)
    assert torch.equal(fused.hidden, plain.hidden)  # the body's forward: same code on the same bits

    sequences, _, _ = batch(3)
    bounds = lm_head_bounds(plain.hidden, before.lm_head.weight, sequences.roll(-1, dims=1), 0.7,
                            plain.grad_log_probs_max, plain.grad_entropy_max)  # fmt: skip
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    ratios = {
        "log_probs": assert_within(fused.log_probs, plain.log_probs, per_token(bounds.log_probs)[:, -ACTIONS:],
                                   "log-probs"),
        "entropy": assert_within(fused.entropy, plain.entropy, per_token(bounds.entropy), "entropy"),
        "d_hidden": assert_within(fused.d_hidden, plain.d_hidden, bounds.d_hidden, "d hidden"),
    }  # fmt: skip
    head_bound = head_weight_bound(bounds, tied, plain.grads[head], fused.grads[head], UNIT_ROUNDOFF)
    ratios["d_head_weight"] = assert_within(fused.grads[head], plain.grads[head], head_bound, head)
    body = [name for name in plain.grads if name not in (head, "lm_head.weight")]
    for name in body:
        assert torch.equal(fused.grads[name], plain.grads[name]), name
    assert fused.moved == plain.moved == len(plain.grads)  # the step moved every weight, the head included

    # Negative controls: the same comparisons must fail on a defect of the size a bug would make.
    scaled = excess(fused.grads[head] * HEAD_GRADIENT_SCALE, plain.grads[head], head_bound)
    dropped = fused.d_hidden.clone().reshape(BATCH * SEQ, -1)
    dropped[:ZERO3_CHUNK_TOKENS] = 0  # the first chunk's rows
    dropped_chunk = excess(dropped, plain.d_hidden, bounds.d_hidden)
    assert scaled > 1 and dropped_chunk > 1, (scaled, dropped_chunk)
    report = dict(tied=tied, body_params=len(body), ratios=ratios, control_scaled_head=scaled,
                  control_dropped_chunk=dropped_chunk)  # fmt: skip
    print("ZERO3-OK " + json.dumps(report))


@pytest.mark.parametrize("tied", [False, True])
def test_a_zero3_step_with_the_flag_computes_what_one_without_does(tied):
    import os
    import subprocess
    import sys
    from pathlib import Path

    support = str(Path(__file__).resolve().parents[1] / "support")  # float32_bounds, as pytest's pythonpath
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [support, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, __file__, str(tied)], capture_output=True, text=True, timeout=900,
                          env=env)  # fmt: skip
    assert done.returncode == 0 and "ZERO3-OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.split("ZERO3-OK ", 1)[1].splitlines()[0])
    assert report["tied"] == tied and report["body_params"] == len(list(tiny_qwen2(tied).parameters())) - 1
    print(report)


if __name__ == "__main__":
    import sys

    zero3_comparison(sys.argv[1] == "True")
