"""The patched OpenRLHF 0.11.2 actor trainer, end to end on CPU: a tiny random Qwen2 in OpenRLHF's
`Actor`, a real DeepSpeed engine (gloo, one process, ZeRO-1) made by OpenRLHF's `DeepspeedStrategy`,
and the patched `ActorPPOTrainer` built through its real `__init__`, taking one `training_step` on a
hand-made GRPO-style `Experience` with the paper's KL-loss recipe (k3, coefficient 0.001).

- band: `actor_loss_fn` is a `BandPolicyLoss` configured from `args.actor.band`, the step logs the
  `band/*` metrics as 0-d tensors next to OpenRLHF's own, and it moves the weights.
- ppo: the patch leaves the default path alone: `actor_loss_fn` is OpenRLHF's `PolicyLoss`, no band
  metrics appear, and the reported loss, gradient norm and weight update equal the ones computed
  independently from OpenRLHF's `PolicyLoss`, `compute_approx_kl`, `aggregate_loss` and a plain
  torch AdamW step on a copy of the same weights.

What is monkeypatched, and why (everything else runs as in a GPU job):
- `torch.cuda.set_device`, in `DeepspeedStrategy.setup_distributed`: it is called whenever
  LOCAL_RANK is set, and a CPU-only torch has no `_cuda_setDevice` (AttributeError). The rest of
  `setup_distributed` (DeepSpeed's init, the device mesh, the gradient-accumulation count) runs.
  The process group itself is created here, with gloo, before that call, so that the backend is
  gloo whatever DeepSpeed's CPU accelerator would pick (it prefers oneCCL when that is installed).
- `ppo_actor.torch_dist_barrier_and_cuda_sync`, in `ActorPPOTrainer.__init__`: the barrier is kept,
  only `torch.cuda.synchronize()` is dropped.
- `torch.cuda.current_device`, while `ActorPPOTrainer.__init__` runs only: `NaiveReplayBuffer`'s
  constructor reads it to build its `target_device` (unused by `training_step`).

Precision: `args.ds.param_dtype` is "fp32", which OpenRLHF's CLI does not offer (bf16 / fp16) but
`DeepspeedStrategy` supports (neither DeepSpeed bf16 nor fp16 enabled); it keeps the comparisons
with the independent computation tight.

Runtime: DeepSpeed builds two C++ ops on first use on CPU (its shared-memory comm op, when the
distributed backend is created, and the CPU FusedAdam, when the optimizer is), cached under
TORCH_EXTENSIONS_DIR (set below to <repo>/.venv/torch_extensions unless already set, as the
Makefile does). On 2 cores the first build takes minutes; afterwards the module runs in seconds.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import socket
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

# the importable parts of the patched OpenRLHF (see openrlhf_band/integration/compat.py)
import openrlhf.trainer.ray.ppo_actor as ppo_actor  # noqa: E402
from openrlhf.models import Actor  # noqa: E402
from openrlhf.models.loss import PolicyLoss, aggregate_loss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.utils.deepspeed import DeepspeedStrategy  # noqa: E402
from openrlhf.utils.loss_utils import get_loss_batch_info  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from openrlhf_band.integration.flags import BAND_DEFAULTS, band_loss_kwargs, validate_band_arguments  # noqa: E402
from openrlhf_band.integration.policy_loss import BandPolicyLoss  # noqa: E402
from openrlhf_band.tools.tiny_model import tiny_qwen2 as build_tiny_qwen2  # noqa: E402

BAND_METRIC_KEYS = {
    "band/clip_frac_upper",
    "band/clip_frac_lower",
    "band/lower_mean",
    "band/upper_mean",
    "band/width_mean",
    *(f"band/{kind}_{b}" for kind in ("tokens", "clipped") for b in ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")),
}

VOCAB, PROMPT_LEN, RESPONSE_LEN, BATCH = 128, 4, 8, 4
LR, MAX_NORM, KL_COEF = 1e-3, 1.0, 0.001


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_world():
    """One process, world size 1, gloo; destroyed after the module's tests."""
    assert not dist.is_initialized(), "another test left a process group behind"
    with pytest.MonkeyPatch.context() as mp:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
        for key, value in {**env, "LOCAL_RANK": "0"}.items():
            mp.setenv(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(minutes=5))
        # CPU-only torch: torch.cuda.set_device raises; setup_distributed calls it for LOCAL_RANK
        mp.setattr(torch.cuda, "set_device", lambda device: None)
        try:
            yield
        finally:
            dist.destroy_process_group()


def make_args(policy_loss_type: str, band: dict | None = None) -> NS:
    """The parts of the hierarchized `train_ppo_ray` namespace that the strategy, `prepare` and
    `ActorPPOTrainer` read; CLI defaults except where noted."""
    band = band or {}
    args = NS(
        local_rank=-1,
        seed=42,
        actor=NS(
            policy_loss_type=policy_loss_type,
            eps_clip=0.2,
            eps_clip_low_high=(0.2, 0.2),  # what the CLI derives from --actor.eps_clip
            dual_clip=None,
            loss_agg_mode="token-mean",
            entropy_coef=None,
            aux_loss_coef=0.0,
            optim="adam",
            adam=NS(lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0),  # lr: CLI 1e-6
            muon=NS(lr=0.02, momentum=0.95),
            lr_scheduler="cosine_with_min_lr",
            lr_warmup_ratio=0.0,  # CLI 0.03: a warmup step would start at lr 0 and not move the weights
            min_lr_ratio=0.1,
            max_norm=MAX_NORM,
            gradient_checkpointing_enable=False,
            band=NS(**{key: band.get(key) for key in BAND_DEFAULTS}),
        ),
        algo=NS(
            advantage=NS(
                estimator="group_norm",
                is_correction_level="off",
                is_correction_mode="mask",
                is_correction_gating="ratio",
                is_correction_threshold=[0.5, 5.0],
            ),
            kl=NS(use_loss=True, estimator="k3", init_coef=KL_COEF, unbiased_gradient=False),
        ),
        ds=NS(
            zero_stage=1,
            param_dtype="fp32",  # see the module docstring
            adam_offload=False,
            zpg=1,
            packing_samples=False,
            tensor_parallel_size=1,
            ring_attn_size=1,
            enable_sleep=False,
            deepcompile=False,
        ),
        train=NS(
            max_epochs=1,
            micro_batch_size=BATCH,
            batch_size=BATCH,  # one micro-batch per optimizer step (gradient accumulation 1)
            dynamic_batch_enable=False,
            colocate_all=False,
            async_enable=False,
            enable_ema=False,
            ema_beta=0.992,
        ),
        vllm=NS(num_engines=0, tensor_parallel_size=1, sync_backend="nccl"),
    )
    validate_band_arguments(argparse.ArgumentParser(), args)  # what train_ppo_ray does after parsing
    return args


def tiny_qwen2() -> Qwen2ForCausalLM:
    return build_tiny_qwen2(VOCAB, attn_implementation="eager", use_cache=False)


def build_trainer(args: NS):
    strategy = DeepspeedStrategy(
        seed=args.seed,
        max_norm=args.actor.max_norm,
        micro_train_batch_size=args.train.micro_batch_size,
        train_batch_size=args.train.batch_size,
        zero_stage=args.ds.zero_stage,
        args=args,
    )
    strategy.setup_distributed()
    assert dist.get_backend() == "gloo" and strategy.accumulated_gradient == 1

    actor = Actor(tiny_qwen2())
    actor.packing_samples = False  # OpenRLHF 0.11.2 bug: Actor(<nn.Module>) never sets it
    actor_cfg = dict(
        optim=args.actor.optim,
        muon=vars(args.actor.muon),
        adam=vars(args.actor.adam),
        lr_scheduler=args.actor.lr_scheduler,
        lr_warmup_ratio=args.actor.lr_warmup_ratio,
        min_lr_ratio=args.actor.min_lr_ratio,
        max_norm=args.actor.max_norm,
        scheduler_steps=10,
    )
    actor, optim, scheduler = strategy.prepare((actor, actor_cfg))

    with pytest.MonkeyPatch.context() as mp:
        # CPU: keep the barrier, drop torch.cuda.synchronize(); NaiveReplayBuffer reads the CUDA device
        mp.setattr(ppo_actor, "torch_dist_barrier_and_cuda_sync", lambda: dist.barrier())
        mp.setattr(torch.cuda, "current_device", lambda: 0)
        trainer = ppo_actor.ActorPPOTrainer(
            strategy,
            actor,
            ema_model=None,
            actor_optim=optim,
            actor_scheduler=scheduler,
            micro_train_batch_size=args.train.micro_batch_size,
            tokenizer=None,
            eps_clip=args.actor.eps_clip,
            ema_beta=args.train.ema_beta,
            vllm_engines=None,
        )
    return strategy, trainer


def make_experience(actor: Actor) -> Experience:
    """4 samples of one prompt group: left-padded prompts, right-padded responses."""
    gen = torch.Generator().manual_seed(1)
    prompt_lens, response_lens = [4, 3, 4, 2], [8, 6, 5, 8]
    seq_len = PROMPT_LEN + RESPONSE_LEN
    sequences = torch.zeros(BATCH, seq_len, dtype=torch.long)
    attention_mask = torch.zeros(BATCH, seq_len, dtype=torch.long)
    action_mask = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.bool)
    for i, (lp, lr) in enumerate(zip(prompt_lens, response_lens)):
        span = slice(PROMPT_LEN - lp, PROMPT_LEN + lr)
        sequences[i, span] = torch.randint(1, VOCAB, (lp + lr,), generator=gen)
        attention_mask[i, span] = 1
        action_mask[i, :lr] = True

    actor.eval()
    with torch.no_grad():
        log_probs = actor(sequences, action_mask, attention_mask=attention_mask)
    mask = action_mask.float()
    assert torch.all(log_probs[~action_mask] == 0) and torch.all(log_probs[action_mask] < 0)

    # the rollout policy and the reference differ a little from the current weights
    old = (log_probs + 0.3 * torch.randn(log_probs.shape, generator=gen) * mask).clamp(max=-1e-4) * mask
    base = (log_probs + 0.1 * torch.randn(log_probs.shape, generator=gen) * mask).clamp(max=-1e-4) * mask
    # two tokens far outside the band (the noise alone stays inside it: the tiny model's tokens have
    # p ~ 1 / VOCAB, where the KL band is wide): ratio e^3 ~ 20 > the cap 10 with A > 0 (sample 0),
    # and p_old = 0.4 with ratio ~ 0.02 < r_low(0.4) ~ 0.64 with A < 0 (sample 1)
    old[0, 0] = log_probs[0, 0] - 3.0
    old[1, 1] = math.log(0.4)

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    group = rewards.view(1, BATCH)  # group_norm: (r - mean) / (std + 1e-9) within the prompt's group
    scores = ((group - group.mean(-1, keepdim=True)) / (group.std(-1, keepdim=True) + 1e-9)).view(-1)
    advantages = scores[:, None] * mask
    response_length = action_mask.sum(-1).float()
    return Experience(
        sequences=sequences,
        attention_mask=attention_mask,
        action_mask=action_mask,
        action_log_probs=old,
        base_action_log_probs=base,
        advantages=advantages,
        returns=advantages.clone(),
        rewards=rewards,
        response_length=response_length,
        total_length=attention_mask.sum(-1).float(),
        info={"reward": rewards.tolist()},
    )


def param_snapshot(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.actor.model.module.named_parameters()}


def current_log_probs(trainer, experience: Experience) -> torch.Tensor:
    """log pi_theta as training_step computes it (train mode; Qwen2's dropout is 0)."""
    trainer.actor.train()
    with torch.no_grad():
        return trainer.actor(experience.sequences, experience.action_mask, attention_mask=experience.attention_mask)


def kl_term(log_probs, experience, loss_batch_info):
    kl = compute_approx_kl(log_probs, experience.base_action_log_probs, kl_estimator="k3")
    return aggregate_loss(kl, experience.action_mask, **loss_batch_info)


def check_status(status, experience):
    metrics, weights = status["metrics"], status["weights"]
    assert status["num_samples"] == BATCH
    assert status["num_action_tokens"] == experience.action_mask.sum().item()
    for key in ("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl", "actor_lr", "actor_grad_norm"):
        assert key in metrics, key
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            assert torch.isfinite(value).all(), (key, value)
        else:
            assert math.isfinite(value), (key, value)
    for key in ("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl"):
        assert metrics[key].dim() == 0 and weights[key] == "token", key
    assert 0.0 <= metrics["ppo_clip_ratio"].item() <= 1.0
    assert metrics["actor_grad_norm"] > 0


def test_band_loss_trains_through_the_patched_trainer(gloo_world):
    args = make_args("band", {"divergence": "kl", "delta": 0.05, "upper_cap": 10.0, "relax": None, "backend": "auto"})
    strategy, trainer = build_trainer(args)

    loss_fn = trainer.actor_loss_fn
    assert isinstance(loss_fn, BandPolicyLoss)
    assert (loss_fn.divergence, loss_fn.delta, loss_fn.upper_cap, loss_fn.relax, loss_fn.backend) == (
        "kl",
        0.05,
        10.0,
        None,
        "auto",
    )
    assert loss_fn.dual_clip is None and loss_fn.token_level_loss and loss_fn.is_correction_level == "off"

    experience = make_experience(trainer.actor)
    loss_batch_info = get_loss_batch_info(strategy, experience.action_mask)
    assert loss_batch_info["batch_num_tokens"].item() == experience.action_mask.sum().item()
    log_probs = current_log_probs(trainer, experience)
    expected_fn = BandPolicyLoss(**band_loss_kwargs(args))
    expected = expected_fn(
        log_probs,
        experience.action_log_probs,
        experience.advantages,
        action_mask=experience.action_mask,
        **loss_batch_info,
    )
    before = param_snapshot(trainer)

    status = trainer.training_step(experience, kl_ctl=KL_COEF, step=0, loss_batch_info=loss_batch_info)

    check_status(status, experience)
    metrics, weights = status["metrics"], status["weights"]
    assert BAND_METRIC_KEYS <= metrics.keys()
    for key in BAND_METRIC_KEYS:
        value = metrics[key]
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and weights[key] == "token", key
        torch.testing.assert_close(value, expected_fn.band_metrics[key], rtol=1e-6, atol=1e-7)
    assert metrics["band/lower_mean"] < 1.0 < metrics["band/upper_mean"] <= 10.0
    assert metrics["band/clip_frac_upper"] + metrics["band/clip_frac_lower"] == pytest.approx(
        metrics["ppo_clip_ratio"].item(), abs=1e-6
    )
    # both sides of the band clip (make_experience puts a token beyond each), and it clips fewer of
    # these rare tokens than the fixed clip [0.8, 1.2] does on the same inputs
    assert metrics["band/clip_frac_upper"] > 0 and metrics["band/clip_frac_lower"] > 0
    assert metrics["band/clipped_p<0.01"] > 0 and metrics["band/clipped_p0.1-0.5"] > 0
    fixed_clip_ratio = PolicyLoss(0.2, 0.2)(
        log_probs, experience.action_log_probs, experience.advantages, action_mask=experience.action_mask
    )[1]
    assert 0.0 < metrics["ppo_clip_ratio"].item() < fixed_clip_ratio.item()
    torch.testing.assert_close(metrics["policy_loss"], expected[0].detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(metrics["ppo_kl"], expected[2], rtol=1e-5, atol=1e-7)

    after = param_snapshot(trainer)
    assert all(torch.isfinite(p).all() for p in after.values())
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) == len(before), sorted(set(before) - set(changed))


def test_ppo_loss_is_openrlhfs_own_on_the_patched_trainer(gloo_world):
    args = make_args("ppo")
    strategy, trainer = build_trainer(args)

    loss_fn = trainer.actor_loss_fn
    assert type(loss_fn) is PolicyLoss
    assert (loss_fn.clip_eps_low, loss_fn.clip_eps_high, loss_fn.policy_loss_type) == (0.2, 0.2, "ppo")
    assert not hasattr(loss_fn, "band_metrics")

    experience = make_experience(trainer.actor)
    loss_batch_info = get_loss_batch_info(strategy, experience.action_mask)

    # the independent computation: OpenRLHF's loss pieces and a torch AdamW on a copy of the weights
    reference = Actor(copy.deepcopy(trainer.actor.model.module))
    reference.packing_samples = False
    reference.train()
    log_probs = reference(experience.sequences, experience.action_mask, attention_mask=experience.attention_mask)
    # exact on every CPU: the same model code on bitwise-equal weights and inputs, in one process (the
    # same kernels in the same order; recording autograd or not does not change them)
    torch.testing.assert_close(log_probs.detach(), current_log_probs(trainer, experience), rtol=0, atol=0)
    policy_loss, clip_ratio, ppo_kl, _, _ = PolicyLoss(0.2, 0.2)(
        log_probs,
        experience.action_log_probs,
        experience.advantages,
        action_mask=experience.action_mask,
        **loss_batch_info,
    )
    kl = kl_term(log_probs, experience, loss_batch_info)
    (policy_loss + kl * KL_COEF).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    adam = args.actor.adam
    torch.optim.AdamW(
        reference.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay
    ).step()
    before = param_snapshot(trainer)

    status = trainer.training_step(experience, kl_ctl=KL_COEF, step=0, loss_batch_info=loss_batch_info)

    check_status(status, experience)
    metrics = status["metrics"]
    assert not any(key.startswith("band/") for key in metrics)
    assert 0.0 < clip_ratio.item() < 1.0  # the clip is active on some tokens
    torch.testing.assert_close(metrics["policy_loss"], policy_loss.detach(), rtol=1e-6, atol=1e-8)
    # exact: the same PolicyLoss on the same log-probs (bitwise, above); a share of integer counts
    torch.testing.assert_close(metrics["ppo_clip_ratio"], clip_ratio, rtol=0, atol=0)
    torch.testing.assert_close(metrics["ppo_kl"], ppo_kl, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(metrics["kl"], kl.detach(), rtol=1e-6, atol=1e-9)
    assert metrics["actor_grad_norm"] == pytest.approx(grad_norm.item(), rel=1e-4)

    after = param_snapshot(trainer)
    expected = dict(reference.model.named_parameters())
    assert after.keys() == expected.keys()
    for name, value in after.items():
        assert not torch.equal(value, before[name]), name
        # Adam's first step moves each weight by about lr; a wrong gradient direction shows as ~2 lr
        torch.testing.assert_close(value, expected[name].detach(), rtol=0, atol=LR * 1e-2, msg=name)


def test_with_dynamic_batching_the_adaptive_radius_steps_only_at_real_optimizer_steps(gloo_world):
    # --train.dynamic_batch_enable: DeepSpeed runs with gradient accumulation 1 and OpenRLHF calls
    # optimizer_step only where the replay buffer marks the end of an optimizer step. Four
    # micro-batches, two optimizer steps (after micro-batches 1 and 3): the controller must move
    # twice and the entropy normaliser must be the mean of micro-batches 2 and 3. (DeepSpeed's
    # was_step_applied stays true after the first real step, so by itself it would move it 3 times.)
    band = {"divergence": "kl", "delta": 0.05, "upper_cap": 10.0, "relax": None, "backend": "torch",
            "adaptive": "entropy", "target_entropy": 10.0, "controller_rate": 0.5}  # fmt: skip
    args = make_args("band", band)
    args.train.dynamic_batch_enable = True
    strategy, trainer = build_trainer(args)
    loss_fn = trainer.actor_loss_fn
    assert args.actor.entropy_coef == 0.0 and loss_fn.needs_entropy  # the flags turned the entropy on

    experience = make_experience(trainer.actor)
    tokens = experience.action_mask.sum().item()
    buffer = trainer.replay_buffer
    buffer.dynamic_optimizer_step = [0, 1, 0, 1]
    buffer.dynamic_batch_num_tokens = [2.0 * tokens] * 4  # each optimizer step: two micro-batches
    buffer.dynamic_global_batch_size = [2.0 * BATCH] * 4
    buffer.dynamic_sample_loss_scale = [0.5] * 4

    closed = []
    after_step = loss_fn.after_optimizer_step
    loss_fn.after_optimizer_step = lambda: (closed.append(True), after_step())
    entropy_means = []
    for step in range(4):
        status = trainer.training_step(experience, kl_ctl=KL_COEF, step=step)
        entropy_means.append(status["metrics"]["band/entropy_mean"].item())
    assert len(closed) == 2
    # the unreachable target shrinks the radius by exp(0.5 * -0.2) per optimizer step
    assert loss_fn.controller.steps == 2
    assert loss_fn.controller.delta == pytest.approx(0.05 * math.exp(-0.2), rel=1e-12)
    # every micro-batch has the same number of tokens: the step mean is the mean of the two
    assert loss_fn.previous_entropy_mean == pytest.approx((entropy_means[2] + entropy_means[3]) / 2, rel=1e-6)


def test_the_entropy_graph_keeps_only_the_logits_and_per_token_rows():
    # The adaptive radius turns on OpenRLHF's entropy (entropy_coef 0) under grad. What autograd
    # keeps for it must be the logits themselves (the log-probs hold them anyway) plus O(B T), not
    # a (B, T, V) softmax: every saved tensor is the logits' storage or has at most B*T elements.
    from openrlhf.models.utils import compute_entropy

    saved = []

    def pack(t):
        saved.append((t.untyped_storage().data_ptr(), t.numel()))
        return t

    logits = torch.randn(2, 64, 4096, requires_grad=True) * 1.0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compute_entropy(logits)
    assert saved
    for ptr, numel in saved:
        assert ptr == logits.untyped_storage().data_ptr() or numel <= 2 * 64, (ptr, numel)
