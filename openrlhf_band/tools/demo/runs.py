"""One run of the demo: a method at a seed, GRPO from that seed's warm-up checkpoint through the loop
(openrlhf_band/tools/demo/loop.py) with the task's prompts, sampling, reward and evaluation; the
warm-up checkpoints, built once per task and seed under OUT/cache; and the jobs `run` hands its spawned
worker processes (one torch thread each).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from openrlhf_band.tools.demo.config import DemoConfig
from openrlhf_band.tools.demo.loop import train_grpo
from openrlhf_band.tools.demo.methods import make_loss, method_anchor, method_bounds
from openrlhf_band.tools.demo.task import (
    build_model,
    evaluate,
    exact_match_reward,
    sample_group,
    sample_prompts,
    warm_up,
)


def train_method(method: str, seed: int, warm_state: dict, cfg: DemoConfig) -> list[dict]:
    """GRPO from the warm-up checkpoint; one row of metrics per evaluation."""
    torch.set_num_threads(1)
    model = build_model(cfg, seed)
    model.load_state_dict(warm_state)
    reference = build_model(cfg, seed)  # the KL's anchor: the warm-up model, frozen
    reference.load_state_dict(warm_state)
    loss_fn = make_loss(method, cfg)
    bounds_of = method_bounds(method, cfg)
    gen = torch.Generator().manual_seed(20_000 + seed)  # same prompts and sampling noise for every method
    eval_prompts, eval_hard = sample_prompts(cfg.eval_prompts, cfg, torch.Generator().manual_seed(30_000 + seed))
    return train_grpo(
        model,
        loss_fn,
        cfg.loop_settings(),
        next_prompts=lambda n, generator: sample_prompts(n, cfg, generator)[0],
        sample=functools.partial(sample_group, cfg=cfg),
        reward=functools.partial(exact_match_reward, cfg=cfg),
        gen=gen,
        evaluate=lambda policy: evaluate(policy, eval_prompts, eval_hard, cfg),
        reference=reference,
        bounds_of=bounds_of,
        labels={"method": method, "seed": seed},
        anchor=method_anchor(method),
    )


def _task_key(cfg: DemoConfig) -> str:
    """Hash of what the warm-up depends on: a cached checkpoint is reused only for the same task."""
    task = (
        "keys",
        "answer_tokens",
        "response_len",
        "fork_position",
        "easy_p",
        "fork_p_hard",
        "fork_p_medium",
        "warmup_steps",
        "_answer_table v1",
    )
    fields = {k: v for k, v in asdict(cfg).items() if k in task}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def warm_checkpoint(cfg: DemoConfig, seed: int) -> Path:
    """The seed's warm-up checkpoint under OUT/cache, built once (same task, same seed: same file)."""
    path = Path(cfg.out) / "cache" / f"warm-{_task_key(cfg)}-seed{seed}.pt"
    if not path.exists():
        torch.set_num_threads(1)
        model = build_model(cfg, seed)
        warm_up(model, cfg, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(model.state_dict(), tmp)
        tmp.replace(path)
    return path


def _job(args) -> list[dict]:
    method, seed, cfg = args
    from openrlhf_band.tools.quiet import quiet_third_party_startup

    quiet_third_party_startup()
    state = torch.load(warm_checkpoint(cfg, seed), weights_only=True)
    return train_method(method, seed, state, cfg)


def _warm_job(args) -> Path:
    cfg, seed = args
    from openrlhf_band.tools.quiet import quiet_third_party_startup

    quiet_third_party_startup()
    return warm_checkpoint(cfg, seed)
