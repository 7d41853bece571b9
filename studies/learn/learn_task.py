"""The learning study's task, in text: the demo's "fork" task (openrlhf_band/tools/demo/task.py) as prompts
and answers that OpenRLHF's real train_sft and train_ppo_ray read, with a tokenizer and a tiny Qwen2
built here (nothing is downloaded).

    python studies/learn/learn_task.py DIR     # writes DIR/base (model + tokenizer), DIR/sft.jsonl,
                                            # DIR/train.jsonl, DIR/heldout.jsonl, DIR/reward.py

A prompt names a ticket (a random number: what makes held-out prompts new strings), a key and a
difficulty: "Ticket 4821: recall key k17, hard." Its one correct reply is six words drawn once per key
from 32 answer words ("amber cobalt ..."); the reward is exact match (1 if the reply is that, else 0).
The supervised warm-up data (sft.jsonl) is noisy as the demo's: at five of the six positions the word
is the correct one with probability EASY_P, else another answer word; at the fork (the 4th word) it
is correct with probability FORK_P_HARD on hard prompts and FORK_P_MEDIUM on medium ones, else the
key's one distractor. Fitting it leaves the correct fork word rare on hard prompts (p ~ 0.05): the
token whose rise a fixed clip caps, and whose rise the reward pays for.

Train and held-out prompts share the keys and differ in their tickets. Everything is drawn from fixed
seeds; bump TASK_VERSION when anything here changes (the cached checkpoint is rebuilt).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# the e2e model's builders (studies/cpu_engine/assets.py), reused
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu_engine"))
from assets import build_model, build_tokenizer  # noqa: E402

TASK_VERSION = "1"

KEYS = 32
ANSWER_WORDS = (
    "amber azure birch cedar coral delta ember fern flint frost grove hazel iris ivory jade kelp lilac maple "
    "moss nova oak onyx pearl pine quartz reed rose sage slate tide umber willow"
).split()
RESPONSE_LEN = 6
FORK_POSITION = 3  # the 4th word
EASY_P = 0.88
FORK_P_HARD = 0.05
FORK_P_MEDIUM = 0.30

SFT_ROWS = 40_000
TRAIN_PROMPTS = 1_024  # learn.sh takes the first steps x rollout batch of them
HELDOUT_PROMPTS = 128  # every key x difficulty twice, tickets never used in training

HIDDEN, HEADS, KV_HEADS, LAYERS = 128, 4, 2, 2  # head_dim 32: vLLM's CPU attention has no head_dim 16
VOCAB = 512

REWARD_PY = '''"""Reward for the learning study: 1 when the reply is exactly the key's answer (the label), else 0.
`rewards` equal `scores`, so OpenRLHF's eval pass1 (a mean of rewards) is the exact-match rate."""
import torch


def reply_text(query: str) -> str:
    reply = query.rsplit("<|im_start|>assistant\\n", 1)[-1]
    return " ".join(reply.split("<|im_end|>", 1)[0].replace("<|endoftext|>", "").split())


def reward_func(queries, prompts, labels):
    scores = torch.tensor([float(reply_text(q) == str(label)) for q, label in zip(queries, labels)])
    return {"rewards": scores, "scores": scores, "extra_logs": {"exact_match": scores}}
'''


def answer_table() -> tuple[list[list[str]], list[str]]:
    """(the correct six words of each key, the fork distractor of each key): a lookup table without
    structure, so that what is learned for one key does not carry over to another."""
    rng = random.Random(12_345)
    correct = [[rng.choice(ANSWER_WORDS) for _ in range(RESPONSE_LEN)] for _ in range(KEYS)]
    distractor = [rng.choice([w for w in ANSWER_WORDS if w != c[FORK_POSITION]]) for c in correct]
    return correct, distractor


def prompt_text(ticket: int, key: int, hard: bool) -> str:
    return f"Ticket {ticket}: recall key k{key:02d}, {'hard' if hard else 'medium'}."


def _tickets(rng: random.Random, n: int, exclude: set[int]) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        t = rng.randrange(1000, 10000)
        if t not in exclude:
            exclude.add(t)
            out.append(t)
    return out


def prompt_sets() -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows {"prompt", "label", "key", "hard"}: keys and difficulties balanced in the
    held-out set; tickets disjoint between the two."""
    correct, _ = answer_table()
    rng = random.Random(777)
    used: set[int] = set()
    heldout_tickets = _tickets(rng, HELDOUT_PROMPTS, used)
    train_tickets = _tickets(rng, TRAIN_PROMPTS, used)

    def row(ticket: int, key: int, hard: bool) -> dict:
        return {"prompt": prompt_text(ticket, key, hard), "label": " ".join(correct[key]), "key": key, "hard": hard}

    heldout = [row(t, i % KEYS, (i // KEYS) % 2 == 1) for i, t in enumerate(heldout_tickets)]
    train = [row(t, rng.randrange(KEYS), rng.random() < 0.5) for t in train_tickets]
    return train, heldout


def sft_rows() -> list[dict]:
    """The noisy warm-up data: {"prompt", "response"}; tickets drawn anew (not the held-out ones')."""
    correct, distractor = answer_table()
    _, heldout = prompt_sets()
    heldout_tickets = {int(r["prompt"].split()[1].rstrip(":")) for r in heldout}
    rng = random.Random(4_242)
    rows = []
    for _ in range(SFT_ROWS):
        key, hard = rng.randrange(KEYS), rng.random() < 0.5
        ticket = rng.randrange(1000, 10000)
        while ticket in heldout_tickets:
            ticket = rng.randrange(1000, 10000)
        words = []
        for pos, word in enumerate(correct[key]):
            if pos == FORK_POSITION:
                keep = rng.random() < (FORK_P_HARD if hard else FORK_P_MEDIUM)
                words.append(word if keep else distractor[key])
            elif rng.random() < EASY_P:
                words.append(word)
            else:
                words.append(rng.choice([w for w in ANSWER_WORDS if w != word]))
        rows.append({"prompt": prompt_text(ticket, key, hard), "response": " ".join(words)})
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = prompt_sets()
    sft = sft_rows()
    # the tokenizer learns the prompts' and the answers' words, so each answer word is one token
    # (a reply's first word has no leading space: the bare words are in the corpus too)
    corpus = [f"{r['prompt']} {r['response']}" for r in sft[:4000]]
    corpus += ([" ".join(ANSWER_WORDS)] + ANSWER_WORDS + ["user", "assistant"]) * 50
    tokenizer = build_tokenizer(corpus, vocab_size=VOCAB)
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, hidden=HIDDEN, heads=HEADS,
                        kv_heads=KV_HEADS, layers=LAYERS, max_positions=256, norm_scale=None)  # fmt: skip
    model.save_pretrained(out / "base")
    tokenizer.save_pretrained(out / "base")
    model.generation_config.save_pretrained(out / "base")
    _write_jsonl(out / "sft.jsonl", sft)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "heldout.jsonl", heldout)
    (out / "reward.py").write_text(REWARD_PY)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python studies/learn/learn_task.py DIR")
    build(Path(sys.argv[1]))
