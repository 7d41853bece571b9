"""The one builder of the tiny random Qwen2 models the demo, the CPU end-to-end harness and the
integration tests train and compare (no download: a config and seeded random weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM


def tiny_qwen2(
    vocab_size: int,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 64,
    seed: int = 0,
    norm_scale: float | None = None,
    **config,
) -> Qwen2ForCausalLM:
    """A random Qwen2ForCausalLM (float32 weights) with intermediate size 2 * hidden, its weights
    drawn after `torch.manual_seed(seed)`, its final norm's weight multiplied by `norm_scale` unless
    None. `config`: further Qwen2Config fields (tie_word_embeddings, attn_implementation,
    eos_token_id, torch_dtype, ...)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    qwen2 = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions, **config,
    )  # fmt: skip
    model = Qwen2ForCausalLM(qwen2)
    if norm_scale is not None:
        with torch.no_grad():
            model.model.norm.weight.mul_(norm_scale)
    return model
