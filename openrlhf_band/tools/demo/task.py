"""The demo's task, a "fork" (docs/demo.md): one rare token decides the reward. A prompt is [BOS, key,
difficulty]; its one correct response is `response_len` answer tokens determined by the key, and the
token at `fork_position` is the fork: after the supervised warm-up on noisy data it is rare on hard
prompts (p ~ 0.1), the rest easy. The reward is exact match (1.0 correct, else 0.0).

Here: the vocabulary and the answer table, prompts, the tiny model (a random Qwen2, Hugging Face's, so
the GRPO loop runs it as it would any causal LM), the warm-up, the exact evaluation, and what the loop
takes of the task: its sampling function (`sample_group`) and its reward (`exact_match_reward`).
Shapes: prompts (N, 3) token ids; responses (N, response_len); probabilities exact, entropies in nats.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from openrlhf_band.tools.demo.config import DemoConfig
from openrlhf_band.tools.demo.loop import Samples, as_actor


def _vocab(cfg: DemoConfig) -> tuple[int, int, int, int]:
    """(first key token, hard token, medium token, first answer token); 0 is BOS."""
    key0 = 1
    hard = key0 + cfg.keys
    return key0, hard, hard + 1, hard + 2


def vocab_size(cfg: DemoConfig) -> int:
    return _vocab(cfg)[3] + cfg.answer_tokens


@functools.lru_cache(maxsize=8)
def _answer_table(keys: int, answer_tokens: int, response_len: int, fork_position: int) -> tuple[Tensor, Tensor]:
    """(correct (keys, T), fork distractor (keys,)) answer-token offsets, drawn once at random (a fixed
    task seed): a lookup table without structure, so that what is learned for one key does not
    carry over to another and every key's rare fork token has to be found on its own."""
    gen = torch.Generator().manual_seed(12_345)
    correct = torch.randint(0, answer_tokens, (keys, response_len), generator=gen)
    shift = torch.randint(1, answer_tokens, (keys,), generator=gen)
    return correct, (correct[:, fork_position] + shift) % answer_tokens


def correct_response(keys: Tensor, cfg: DemoConfig) -> Tensor:
    """(N, response_len) the one correct response of each key."""
    *_, answer0 = _vocab(cfg)
    correct, _ = _answer_table(cfg.keys, cfg.answer_tokens, cfg.response_len, cfg.fork_position)
    return answer0 + correct[keys]


def fork_distractor(keys: Tensor, cfg: DemoConfig) -> Tensor:
    *_, answer0 = _vocab(cfg)
    _, distractor = _answer_table(cfg.keys, cfg.answer_tokens, cfg.response_len, cfg.fork_position)
    return answer0 + distractor[keys]


def sample_prompts(n: int, cfg: DemoConfig, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(prompts (N, 3), hard (N,) bool): keys uniform, half the prompts hard."""
    key0, hard_token, medium_token, _ = _vocab(cfg)
    keys = torch.randint(0, cfg.keys, (n,), generator=gen)
    hard = torch.rand(n, generator=gen) < 0.5
    difficulty = torch.where(hard, hard_token, medium_token)
    return torch.stack([torch.zeros(n, dtype=torch.long), key0 + keys, difficulty], dim=1), hard


def _keys(prompts: Tensor, cfg: DemoConfig) -> Tensor:
    return prompts[:, 1] - _vocab(cfg)[0]


def build_model(cfg: DemoConfig, seed: int) -> torch.nn.Module:
    """A tiny random Qwen2ForCausalLM (CPU, float32, eager attention; no downloads), its weights drawn
    after torch.manual_seed(seed)."""
    from openrlhf_band.tools.tiny_model import tiny_qwen2

    return tiny_qwen2(vocab_size(cfg), hidden=64, max_positions=32, seed=seed, tie_word_embeddings=True,
                      attn_implementation="eager")  # fmt: skip


def build_actor(cfg: DemoConfig, seed: int) -> torch.nn.Module:
    """The tiny random Qwen2 (build_model) in OpenRLHF's Actor: log-probs of action tokens, as the trainer's."""
    return as_actor(build_model(cfg, seed))


def _logits(model: torch.nn.Module, sequences: Tensor) -> Tensor:
    """(N, L, V) float32 next-token logits of a causal LM (its forward's `.logits`), no padding."""
    return model(input_ids=sequences, attention_mask=torch.ones_like(sequences)).logits.float()


def warm_up(model: torch.nn.Module, cfg: DemoConfig, seed: int) -> None:
    """Supervised warm-up on noisy data: at easy positions the target is correct with probability
    easy_p (else a uniformly drawn other answer token); at the fork, correct with fork_p_hard /
    fork_p_medium, else the distractor. Fitting it leaves the model near those probabilities."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    *_, answer0 = _vocab(cfg)
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(cfg.warmup_steps):
        prompts, hard = sample_prompts(128, cfg, gen)
        keys = _keys(prompts, cfg)
        correct = correct_response(keys, cfg)
        other = answer0 + (correct - answer0 + torch.randint(1, cfg.answer_tokens, correct.shape, generator=gen)) % (
            cfg.answer_tokens
        )
        keep = torch.rand(correct.shape, generator=gen) < cfg.easy_p
        fork_p = torch.where(hard, cfg.fork_p_hard, cfg.fork_p_medium)
        keep[:, cfg.fork_position] = torch.rand(len(keys), generator=gen) < fork_p
        other[:, cfg.fork_position] = fork_distractor(keys, cfg)
        targets = torch.where(keep, correct, other)
        sequences = torch.cat([prompts, targets], dim=1)
        logits = _logits(model, sequences[:, :-1])[:, -cfg.response_len :]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()


@torch.no_grad()
def evaluate(model: torch.nn.Module, prompts: Tensor, hard: Tensor, cfg: DemoConfig) -> dict[str, float]:
    """Exact mean@32 / pass@32 (overall and hard), token entropy along the correct response, and the
    mean probability of the correct fork token on hard prompts."""
    model.eval()
    correct = correct_response(_keys(prompts, cfg), cfg)
    logits = _logits(model, torch.cat([prompts, correct], dim=1)[:, :-1])[:, -cfg.response_len :]
    log_probs = torch.log_softmax(logits, dim=-1)
    token_log_p = log_probs.gather(-1, correct[..., None])[..., 0]  # (N, T)
    p_correct = token_log_p.sum(-1).exp()
    pass_at_32 = 1.0 - (1.0 - p_correct) ** 32
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # (N, T), nats
    return {
        "mean@32": p_correct.mean().item(),
        "mean@32_hard": p_correct[hard].mean().item(),
        "pass@32": pass_at_32.mean().item(),
        "pass@32_hard": pass_at_32[hard].mean().item(),
        "entropy": entropy.mean().item(),
        "p_fork_hard": token_log_p[hard, cfg.fork_position].exp().mean().item(),
    }


@torch.no_grad()
def sample_responses(model: torch.nn.Module, prompts: Tensor, g: int, cfg: DemoConfig, gen: torch.Generator) -> Tensor:
    """(N * g, 3 + T) sequences: g responses per prompt sampled token by token at temperature 1."""
    model.eval()
    sequences = prompts.repeat_interleave(g, 0)
    for _ in range(cfg.response_len):
        probs = torch.softmax(_logits(model, sequences)[:, -1], dim=-1)
        sequences = torch.cat([sequences, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return sequences


def sample_group(model: torch.nn.Module, prompts: Tensor, g: int, gen: torch.Generator, cfg: DemoConfig) -> Samples:
    """The loop's sampling function: sample_responses, every token real (no padding, no end token) and
    every response token an action."""
    sequences = sample_responses(model, prompts, g, cfg, gen)
    return Samples(sequences, torch.ones_like(sequences), torch.ones(len(sequences), cfg.response_len))


def exact_match_reward(prompts: Tensor, samples: Samples, cfg: DemoConfig) -> Tensor:
    """The loop's reward: (N * g,) 1.0 where the response is the prompt's correct one, else 0.0."""
    g = len(samples.sequences) // len(prompts)
    correct = correct_response(_keys(prompts, cfg), cfg).repeat_interleave(g, 0)
    return (samples.sequences[:, -cfg.response_len :] == correct).all(-1).float()
