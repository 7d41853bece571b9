"""`--ds.fused_logprobs` in the patched OpenRLHF 0.11.2 `Actor`, against the same `Actor` without it.

Ground truth is OpenRLHF's own forward (full logits, float32 cast, temperature, `log_probs_from_logits`,
`compute_entropy`) on the same weights and inputs: log-probs, entropy and every parameter's gradient
must agree, with a tied and an untied head, gradient checkpointing on and off, padded and packed
batches, a temperature. Then a real DeepSpeed ZeRO-3 engine (gloo, one CPU process, OpenRLHF's
`DeepspeedStrategy`): one training step with the flag moves the weights exactly as one without it.
"""

from __future__ import annotations

import copy
import socket
from datetime import timedelta
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist
from openrlhf.models import Actor
from transformers import Qwen2Config, Qwen2ForCausalLM

from openrlhf_band.integration.fused_head import FusedHead

VOCAB, BATCH, SEQ, ACTIONS = 96, 3, 14, 8


def tiny_qwen2(tied: bool, dtype=torch.float32) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager", use_cache=False,
        tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(dtype)


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


def forward_and_grads(actor: Actor, with_entropy: bool):
    sequences, attention_mask, action_mask = batch()
    log_probs, output = actor(sequences, action_mask, attention_mask=attention_mask, return_output=True,
                              return_entropy=with_entropy)  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    loss = (log_probs * torch.randn(log_probs.shape, generator=gen)).sum()
    entropy = output.entropy if with_entropy else None
    if with_entropy:
        loss = loss + (entropy[:, -ACTIONS:] * torch.randn(entropy[:, -ACTIONS:].shape, generator=gen)).sum()
    actor.zero_grad(set_to_none=True)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in actor.named_parameters() if p.grad is not None}
    return log_probs.detach(), None if entropy is None else entropy.detach(), grads, output


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_actor_equals_openrlhfs_forward_and_gradients(tied, checkpointing, temperature):
    plain, fused = actor_pair(tied, temperature)
    for actor in (plain, fused):
        actor.train()
        if checkpointing:
            actor.gradient_checkpointing_enable()
    lp_a, ent_a, grads_a, _ = forward_and_grads(plain, with_entropy=True)
    lp_b, ent_b, grads_b, output_b = forward_and_grads(fused, with_entropy=True)
    assert output_b["logits"].numel() == 0  # no vocabulary-sized tensor kept by the output
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-6, atol=1e-6)
    assert set(grads_a) == set(grads_b) and len(grads_a) == len(list(plain.parameters()))
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5, atol=1e-6, msg=name)


def test_without_entropy_bf16_and_no_grad_as_the_experience_maker_calls_it():
    plain, fused = actor_pair(tied=True, dtype=torch.bfloat16)
    sequences, attention_mask, action_mask = batch(1)
    with torch.no_grad():
        plain.eval(), fused.eval()
        a = plain(sequences, action_mask, attention_mask=attention_mask)
        b = fused(sequences, action_mask, attention_mask=attention_mask)
    assert b.dtype == torch.float32 and a.shape == b.shape == action_mask.shape
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    lp_a, _, grads_a, _ = forward_and_grads(plain, with_entropy=False)
    lp_b, _, grads_b, _ = forward_and_grads(fused, with_entropy=False)
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-6, atol=1e-6)
    for name in grads_a:  # bf16 weights: one bf16 rounding of the same float32 gradient apart
        torch.testing.assert_close(grads_b[name].float(), grads_a[name].float(), rtol=2e-2, atol=1e-4, msg=name)


def test_packed_batches_take_the_same_path():
    plain, fused = actor_pair(tied=False, packing=True)
    sequences, attention_mask, action_mask = batch(2)
    with torch.no_grad():
        a = plain(sequences, action_mask, attention_mask=attention_mask)
        b = fused(sequences, action_mask, attention_mask=attention_mask)
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


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


def zero3_step(model: Qwen2ForCausalLM, fused: bool):
    """One optimizer step of an Actor under OpenRLHF's ZeRO-3 DeepSpeed engine; the full weights after."""
    import deepspeed
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
    actor = Actor(model, temperature=0.7, fused_logprobs=fused)
    actor.packing_samples = False
    cfg = dict(optim="adam", muon={}, adam=dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0),
               lr_scheduler="constant", lr_warmup_ratio=0.0, min_lr_ratio=0.1, max_norm=1.0, scheduler_steps=10)
    actor, optim, scheduler = strategy.prepare((actor, cfg))
    assert hasattr(actor.model.module.lm_head.weight, "ds_id")  # partitioned by ZeRO-3
    actor.train()
    sequences, attention_mask, action_mask = batch(3)
    log_probs, output = actor(sequences, action_mask, attention_mask=attention_mask, return_output=True,
                              return_entropy=True)  # fmt: skip
    assert (output["logits"].numel() == 0) == fused  # the fused head ran under the engine
    gen = torch.Generator().manual_seed(9)
    advantages = torch.randn(log_probs.shape, generator=gen)
    loss = -(log_probs * advantages).sum() / action_mask.sum() - 0.01 * output.entropy[:, -ACTIONS:].mean()
    strategy.backward(loss, actor, optim)
    strategy.optimizer_step(optim, actor, scheduler)
    params = dict(actor.model.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return log_probs.detach(), {n: p.detach().clone() for n, p in params.items()}


def zero3_comparison(tied: bool) -> None:
    """The check, run in the child: a step with the flag equals one without, every weight moved."""
    _gloo_world()
    before = tiny_qwen2(tied)
    lp_a, after_a = zero3_step(copy.deepcopy(before), fused=False)
    lp_b, after_b = zero3_step(copy.deepcopy(before), fused=True)
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-6, atol=1e-6)
    moved = 0
    for name, value in after_a.items():
        torch.testing.assert_close(after_b[name], value, rtol=1e-5, atol=1e-6, msg=name)
        moved += int(not torch.equal(value, dict(before.named_parameters())[name].detach()))
    assert moved == len(after_a), (moved, len(after_a))  # the step moved every weight, the head included
    print(f"ZERO3-OK tied={tied} params={len(after_a)}")


@pytest.mark.parametrize("tied", [False, True])
def test_a_zero3_training_step_with_the_flag_equals_one_without(tied):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, __file__, str(tied)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and f"ZERO3-OK tied={tied}" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


if __name__ == "__main__":
    import sys

    zero3_comparison(sys.argv[1] == "True")
