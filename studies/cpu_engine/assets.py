"""Build what the end-to-end run trains on, offline: a tiny random Qwen2, its tokenizer, a prompt set
with verifiable labels, and the reward file for `--reward.remote_url`.

    python studies/cpu_engine/assets.py DIR        # writes DIR/model, DIR/prompts.jsonl, DIR/reward.py

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on the prompts' own text and
saved as a `PreTrainedTokenizerFast` with a chat template; the model has random weights.

Why the model is "peaked": with random weights every logit is ~0 and every token has p ~ 1/vocab, so
no band ever binds (r_up is huge for p < 0.01). Scaling the final norm multiplies every logit, which
spreads the sampled tokens' old probabilities over (0.01, 1) like a trained model's, so after a few
optimizer steps ratios cross the band on both sides and the clip metrics are not trivially zero.

Why the reward is right about half the time whatever the model does: a prompt asks for a reply whose
length in characters is even or odd (the label); a sampled reply has either parity about equally
often, so every GRPO group has non-zero advantages and the loss has something to clip.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# Bump when anything below changes: train.sh rebuilds assets whose version differs.
ASSETS_VERSION = "2"

HIDDEN, HEADS, KV_HEADS, LAYERS = 64, 2, 1, 2  # head_dim 32: vLLM's CPU attention has no head_dim 16
NORM_SCALE = 24.0  # logit scale: sampled tokens' p spread over (0.01, 1); see test_train_ppo_ray
NUM_PROMPTS = 12  # 3 training steps at --rollout.batch_size 4
# Room for the other tasks' prompts (reasoning-gym's and code's run 300-800 tokens with this tokenizer); the
# weights do not depend on it (rotary positions), and the parity runs keep --data.max_len 96.
MAX_POSITIONS = 1024

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

REWARD_PY = '''"""Reward for the end-to-end harness: +1 when the reply's length in characters has the parity the
prompt asks for (label "even" or "odd"), else -1; `scores` are 0/1."""
import torch


def _reply(query: str) -> str:
    reply = query.rsplit("<|im_start|>assistant\\n", 1)[-1]
    return reply.split("<|im_end|>", 1)[0].replace("<|endoftext|>", "").strip()


def reward_func(queries, prompts, labels):
    right = [(len(_reply(q)) % 2 == 0) == (str(label) == "even") for q, label in zip(queries, labels)]
    scores = torch.tensor([float(r) for r in right])
    return {"rewards": 2 * scores - 1, "scores": scores, "extra_logs": {"right": scores}}
'''

WORDS = (
    "band clip ratio token trust region policy reward entropy rare sample answer step proof even odd "
    "length reply count letters vowel number parity word short long model learn gradient"
).split()


def prompts(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(NUM_PROMPTS):
        label = "even" if i % 2 == 0 else "odd"
        topic = " ".join(rng.sample(WORDS, 3))
        rows.append({"prompt": f"Reply about {topic} in a number of characters that is {label}.", "label": label})
    return rows


def build_tokenizer(texts: list[str], vocab_size: int = 384):
    """A byte-level BPE trained on `texts`, with the chat template and special tokens above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def build_model(
    vocab_size: int, eos_id: int, pad_id: int, hidden: int = HIDDEN, heads: int = HEADS, kv_heads: int = KV_HEADS,
    layers: int = LAYERS, max_positions: int = MAX_POSITIONS, norm_scale: float | None = NORM_SCALE,
):
    """A random Qwen2 (seed 0, untied head, bf16); its final norm scaled by `norm_scale` unless None."""
    import torch

    from openrlhf_band.tools.tiny_model import tiny_qwen2

    model = tiny_qwen2(
        vocab_size, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, max_positions=max_positions,
        norm_scale=norm_scale, tie_word_embeddings=False, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
        torch_dtype="bfloat16",
    )  # fmt: skip
    return model.to(torch.bfloat16)


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = prompts()
    corpus = [r["prompt"] for r in rows] + [" ".join(WORDS)] * 4
    tokenizer = build_tokenizer(corpus)
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    model.generation_config.save_pretrained(out / "model")
    with (out / "prompts.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (out / "reward.py").write_text(REWARD_PY)
    (out / "VERSION").write_text(ASSETS_VERSION)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python studies/cpu_engine/assets.py DIR")
    build(Path(sys.argv[1]))
