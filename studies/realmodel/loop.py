"""An exactly paired GRPO loop for a real Hugging Face model, outside the engine: seeded sampling in
torch, OpenRLHF 0.11.2's `Actor` for the log-probs, and the methods' real losses (OpenRLHF's
`PolicyLoss` for the clips, this project's `BandPolicyLoss` / objectives for the rest, built as the
CPU demo builds them from the methods' `train_ppo_ray` flags: `openrlhf_band.tools.demo.make_loss`).

Why outside the engine: vLLM 0.29's CPU build cannot repeat a per-request seed when a prefill is
split (its model runner rewinds the request's generator with `Generator.set_offset`, a CUDA Philox
call: "CPU Generator does not use offset"), and its engine-level seed does not make two runs draw
the same numbers (docs/smollm2_study.md#pairing). Here every random number is a function of the
seed and the (step, prompt, sample, position) it is drawn for:

- the prompts of step s: a permutation of the training rows drawn once from the seed;
- the reply of sample j of prompt i at step s: inverse-CDF sampling of each position t with the
  uniform u[s][i * G + j, t], drawn from a generator seeded by (seed, s) (`step_uniforms`);
- the mini-batch order of step s: a permutation from a generator seeded by (seed, s).

So two methods at one seed sample token-identical step-1 rollouts (same weights, same numbers), and
at later steps draw the same uniforms for the same (step, prompt, sample, position): where their
policies are close they sample the same tokens (common random numbers). A rerun of one method at one
seed repeats itself on one machine (same torch build and thread count).

Inverse-CDF sampling at temperature 1 is an exact draw from the policy: token = the first index whose
cumulative probability (float64, vocabulary order) exceeds u * total. It runs inside Hugging Face's
`generate` as a logits processor that leaves only the drawn token finite, so greedy decoding picks it
(the KV cache, the padding and the end token stay the library's).

Units: log-probabilities and entropies in nats; rewards in [0, 1] (the task's scorer; the training
advantage is group-normalised, as OpenRLHF's group_norm estimator).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from openrlhf_band.tools.demo import BINS  # (lo, hi, name) old-probability bins, as the band's metrics


class Timer:
    """Seconds spent per phase of a run (generation, old log-probs, the update...), summed over its calls:
    `with timer("phase"): ...`. The profile of docs/smollm2_study.md#the-entropy-study is these sums."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in self.seconds.items()}


@dataclass
class LoopConfig:
    """One run's settings. Defaults: the paired study's design (docs/smollm2_study.md#design)."""

    steps: int = 12
    prompts: int = 8  # prompts per rollout
    samples: int = 8  # samples per prompt (the group)
    minibatches: int = 8  # optimizer steps per rollout (one epoch)
    epochs: int = 1
    lr: float = 3e-5
    betas: tuple[float, float] = (0.9, 0.95)  # OpenRLHF's Adam betas
    # the k3 KL loss to the starting model (studies/cpu_engine/train.sh has 0.001): off by default, as in
    # DAPO; at 0.001 it is second-order over 12 steps and costs a reference forward (11% of a step)
    kl_coef: float = 0.0
    max_new_tokens: int = 24
    threads: int = 2
    extra_flags: list[str] = field(default_factory=list)  # after the method's flags (radius, cap...)


def derived_seed(*parts: int | str) -> int:
    """A 63-bit seed from (seed, purpose, step...): stable across processes and Python versions."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def step_uniforms(seed: int, step: int, rows: int, positions: int, purpose: str = "rollout") -> Tensor:
    """(rows, positions) float64 uniforms in [0, 1) for one step's replies: row i * G + j is sample j of
    prompt i, column t its t-th reply token."""
    gen = torch.Generator().manual_seed(derived_seed(seed, purpose, step))
    return torch.rand(rows, positions, generator=gen, dtype=torch.float64)


class InverseCDF:
    """A logits processor for `generate(do_sample=False)`: draws each row's next token from
    softmax(scores) with the row's uniform for this position, and leaves only that token finite."""

    def __init__(self, uniforms: Tensor, prompt_width: int) -> None:
        self.uniforms = uniforms  # (rows, positions) float64
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        position = input_ids.shape[1] - self.prompt_width
        probs = torch.softmax(scores.double(), dim=-1)
        cdf = probs.cumsum(-1)
        target = self.uniforms[:, position : position + 1] * cdf[:, -1:]
        token = torch.searchsorted(cdf, target, right=True).clamp_(max=scores.shape[-1] - 1)
        out = torch.full_like(scores, -math.inf)
        return out.scatter_(1, token, 0.0)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask), (N, max_len) long, padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
    return ids, mask


@torch.no_grad()
def generate_replies(
    model,
    prompt_ids: Sequence[Sequence[int]],
    uniforms: Tensor | None,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    batch_rows: int = 128,
) -> list[list[int]]:
    """Each prompt's reply (token ids up to and including the first end token): drawn with `uniforms`
    (rows aligned with prompt_ids) or greedy when None."""
    from transformers import GenerationConfig, LogitsProcessorList

    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids), pad_token_id=pad_id
    )
    model.eval()
    replies: list[list[int]] = []
    for start in range(0, len(prompt_ids), batch_rows):
        chunk = prompt_ids[start : start + batch_rows]
        ids, mask = left_pad(chunk, pad_id)
        processors = LogitsProcessorList()
        if uniforms is not None:
            processors.append(InverseCDF(uniforms[start : start + len(chunk)], ids.shape[1]))
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, logits_processor=processors)
        for row in out[:, ids.shape[1] :].tolist():
            reply = []
            for token in row:
                reply.append(token)
                if token in eos_ids:
                    break
            replies.append(reply)
    return replies


def pack(
    prompt_ids: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad_id: int, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """OpenRLHF's layout: sequences (N, P + width) = left-padded prompt | reply right-padded to `width`,
    attention_mask over real tokens, action_mask (N, width) over reply tokens (the end token included)."""
    ids, mask = left_pad(prompt_ids, pad_id)
    reply_ids = torch.full((len(replies), width), pad_id, dtype=torch.long)
    action_mask = torch.zeros((len(replies), width))
    for i, r in enumerate(replies):
        reply_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        action_mask[i, : len(r)] = 1
    return torch.cat([ids, reply_ids], 1), torch.cat([mask, action_mask.long()], 1), action_mask


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """The length of the token prefix every row starts with, leaving each row at least one token of its own (the
    last prompt token, whose logits predict the first reply token, must be in the rows' own part)."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows) - 1
    for row in rows[1:]:
        k = 0
        while k < n and row[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


@dataclass
class Packed:
    """A batch in OpenRLHF's layout (`pack`), its prompts cut after a shared prefix: sequences (N, S + width) =
    the rest of each prompt, left-padded | the reply, right-padded; attention_mask over real tokens; action_mask
    (N, width). `prefix`: the token ids every prompt started with ([] when not shared), run once per forward."""

    sequences: Tensor
    attention: Tensor
    action: Tensor
    prefix: list[int]

    def select(self, idx: Tensor) -> Packed:
        return Packed(self.sequences[idx], self.attention[idx], self.action[idx], self.prefix)


def prefix_cache(model, prefix: Sequence[int], rows: int, room: int = 0):
    """A DynamicCache holding the prefix's keys and values for `rows` rows: one forward pass of one row, expanded
    (a view: the rows share the tensors, and under autograd their gradients sum into the one pass). `room` > 0:
    layers that preallocate that many more positions (for decoding: Hugging Face's layers concatenate the whole
    cache at every token, 1.7 GB a step for 64 rows after a 540-token prefix)."""
    from transformers import DynamicCache

    # logits_to_keep=1: the prefix's keys and values are what is kept, not its ~500 positions' vocabulary logits
    out = model(torch.tensor([list(prefix)], dtype=torch.long), use_cache=True, logits_to_keep=1)
    cache = DynamicCache()
    for i, layer in enumerate(out.past_key_values.layers):
        keys, values = layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)
        if room:
            cache.layers.append(_preallocated_layer(keys, values, room))
        else:
            cache.update(keys, values, i)
    return cache


def _preallocated_layer(keys: Tensor, values: Tensor, room: int):
    """A cache layer holding `keys`/`values` in buffers with `room` free positions, written in place (views of the
    filled part are returned, as DynamicLayer returns its tensors)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            start, end = self.length, self.length + key_states.shape[-2]
            if end > self.key_buffer.shape[-2]:
                raise RuntimeError(f"cache full: {end} positions, room for {self.key_buffer.shape[-2]}")
            self.key_buffer[:, :, start:end] = key_states
            self.value_buffer[:, :, start:end] = value_states
            self.length = end
            self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
            return self.keys, self.values

    layer = PreallocatedLayer()
    layer.lazy_initialization(keys, values)
    b, h, length, d = keys.shape
    layer.key_buffer = keys.new_empty(b, h, length + room, d)
    layer.value_buffer = values.new_empty(b, h, length + room, d)
    layer.key_buffer[:, :, :length] = keys
    layer.value_buffer[:, :, :length] = values
    layer.length = length
    layer.keys, layer.values = layer.key_buffer[:, :, :length], layer.value_buffer[:, :, :length]
    return layer


def prefixed_logits(model, prefix: Sequence[int], ids: Tensor, mask: Tensor) -> Tensor:
    """(N, W, V) float32 logits of `ids` (N, W) after the shared `prefix`: positions and the attention mask over
    prefix + ids as OpenRLHF's Actor computes them for the whole sequence (cumsum of the mask - 1), so each row
    sees exactly the keys it would see unshared. Exact up to float32 rounding (a causal model's keys and values
    over a prefix do not depend on what follows it)."""
    n, length = ids.shape[0], len(prefix)
    full = torch.cat([torch.ones(n, length, dtype=mask.dtype), mask], 1)
    position_ids = full.long().cumsum(-1) - 1
    position_ids.masked_fill_(full == 0, 1)
    cache = prefix_cache(model, prefix, n)
    out = model(ids, attention_mask=full, position_ids=position_ids[:, length:], past_key_values=cache)
    return out.logits.float()


def draw(scores: Tensor, uniforms: Tensor | None) -> Tensor:
    """(N,) next tokens: the inverse-CDF draw of each row's softmax(scores) with its uniform (InverseCDF's
    arithmetic), or the argmax when `uniforms` is None."""
    if uniforms is None:
        return scores.argmax(-1)
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)
    target = uniforms[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp_(max=scores.shape[-1] - 1)[:, 0]


@torch.no_grad()
def decode_replies(
    model,
    prefix: Sequence[int],
    rest_ids: Sequence[Sequence[int]],
    uniforms: Tensor | None,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    batch_rows: int = 128,
) -> list[list[int]]:
    """generate_replies after a shared prefix: each prompt's reply (up to and including the first end token),
    drawn with `uniforms` (rows aligned with rest_ids) or greedy when None. A KV-cached decoding loop of its own
    (Hugging Face's `generate` cannot start from a cache that is shared by all rows); the prefix is run once a
    chunk. Rows are decoded in groups of equal prompt length, so no row is padded and no attention mask is
    needed: with one, transformers' sdpa path repeats the grouped keys and values for every query head (a copy of
    the whole cache at every token), without one it hands the grouping to torch (measured on 64 rows of up to 24
    tokens after a 532-token prefix, SmolLM2-135M on 2 cores: 26 s with the mask, 9.6 s without)."""
    model.eval()
    replies: list[list[int] | None] = [None] * len(rest_ids)
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(rest_ids):
        by_length.setdefault(len(ids), []).append(i)
    length, eos = len(prefix), torch.tensor(list(eos_ids))
    for width, members in sorted(by_length.items()):
        for start in range(0, len(members), batch_rows):
            chunk = members[start : start + batch_rows]
            n = len(chunk)
            ids = torch.tensor([list(rest_ids[i]) for i in chunk], dtype=torch.long)
            position_ids = torch.arange(length, length + width).expand(n, -1)
            cache = prefix_cache(model, prefix, n, room=width + max_new_tokens)
            out = model(ids, position_ids=position_ids, past_key_values=cache, use_cache=True)
            u = uniforms[chunk] if uniforms is not None else None
            rows: list[list[int]] = [[] for _ in range(n)]
            done = torch.zeros(n, dtype=torch.bool)
            for t in range(max_new_tokens):
                token = draw(out.logits[:, -1].float(), u[:, t] if u is not None else None)
                token = torch.where(done, torch.full_like(token, pad_id), token)
                for k in range(n):
                    if not done[k]:
                        rows[k].append(int(token[k]))
                done |= torch.isin(token, eos)
                if bool(done.all()) or t + 1 == max_new_tokens:
                    break
                out = model(
                    token[:, None],
                    position_ids=torch.full((n, 1), length + width + t, dtype=torch.long),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
            for k, i in enumerate(chunk):
                replies[i] = rows[k]
    return replies  # type: ignore[return-value]


def informative_share(rewards: Tensor, samples: int) -> float:
    """The share of groups (consecutive `samples` rewards) whose rewards are not all equal: the groups whose
    group-normalised advantages are not all 0, the ones that carry a gradient."""
    return (rewards.reshape(-1, samples).std(-1) > 0).float().mean().item()


def group_advantages(rewards: Tensor, samples: int) -> Tensor:
    """(N,) group-normalised advantages, as OpenRLHF 0.11.2's group_norm: (r - mean) / (std + 1e-9)."""
    r = rewards.reshape(-1, samples)
    return ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1)


def bin_of(p: Tensor) -> Tensor:
    """The BINS index of each probability."""
    edges = torch.tensor([hi for _, hi, _ in BINS[:-1]], dtype=p.dtype)
    return torch.bucketize(p, edges, right=True)


@dataclass
class Task:
    """A prepared reasoning-gym data directory (openrlhf-band prepare-data): chat prompts, labels, the
    canonical correct reply of each held-out row, and the scorer."""

    train: list[dict]
    eval: list[dict]
    reward_fn: Callable[[list[str], list[str], list[str]], list[float]]  # (queries, prompts, labels)

    @staticmethod
    def load(data_dir: Path, reward: str = "partial") -> Task:
        """reward: "partial" = the gym reward file's score; "exact" = 1 where that score is 1 (the scorer's
        exact match), else 0."""
        rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines() if line.strip()]
        held = [json.loads(line) for line in (data_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
        if reward not in ("partial", "exact"):
            raise ValueError(f"reward must be 'partial' or 'exact', not {reward!r}")
        score = gym_reward_fn()
        if reward == "exact":
            partial = score

            def score(queries: list[str], prompts: list[str], labels: list[str]) -> list[float]:
                return [1.0 if v >= 1.0 else 0.0 for v in partial(queries, prompts, labels)]

        return Task(rows, held, score)


def gym_reward_fn() -> Callable[[list[str], list[str], list[str]], list[float]]:
    """The reasoning-gym reward file that trains the engine runs (tasks/reasoning_gym/reward.py): scores in [0, 1]."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "openrlhf_band" / "tasks" / "reasoning_gym" / "reward.py"
    spec = importlib.util.spec_from_file_location("realmodel_gym_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def score(queries: list[str], prompts: list[str], labels: list[str]) -> list[float]:
        return [float(v) for v in module.reward_func(queries, prompts, labels)["scores"]]

    return score


def canonical_reply(row: dict) -> str:
    """The reply the shots teach: `<answer>ANSWER</answer>` with the held-out entry's answer."""
    return f"<answer>{json.loads(row['label'])['entry']['answer']}</answer>"


class Policy:
    """A causal LM with its tokenizer, wrapped in OpenRLHF's Actor (log-probs as the trainer takes them).

    shared_prefix: run the token prefix all prompts of a batch start with (a task's few-shot turns) once per
    forward pass and share its keys and values (`prefixed_logits`, `decode_replies`): the same numbers up to
    float32 rounding, at the cost of the prompts' own tokens only. The log-probs and entropies then follow the
    Actor's arithmetic (OpenRLHF's log_probs_from_logits and compute_entropy on the float32 logits) outside its
    forward, which takes no cache. Off: every pass is the Actor's (and Hugging Face's `generate`)."""

    def __init__(self, model_dir: Path, threads: int = 2, shared_prefix: bool = False) -> None:
        from openrlhf.models import Actor
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        self.actor = Actor(self.model)
        self.actor.packing_samples = False  # OpenRLHF 0.11.2: Actor(model_object) never sets it
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.shared_prefix = shared_prefix

    def pack(self, prompt_ids: Sequence[Sequence[int]], replies: Sequence[Sequence[int]]) -> Packed:
        """The batch in OpenRLHF's layout (`pack`, replies right-padded to the longest), the shared prefix cut off
        the prompts when this policy shares it."""
        width = max(len(r) for r in replies)
        length = shared_prefix_length(prompt_ids) if self.shared_prefix else 0
        sequences, attention, action = pack([p[length:] for p in prompt_ids], replies, self.pad_id, width)
        return Packed(sequences, attention, action, list(prompt_ids[0][:length]) if length else [])

    def forward(self, batch: Packed, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """(N, width) action log-probs, zero off the action mask (and the entropies of those positions' next-token
        distributions), as the Actor returns them; gradients as the caller's context allows."""
        width = batch.action.shape[1]
        if not batch.prefix:
            if entropy:
                lp, output = self.actor(
                    batch.sequences,
                    batch.action,
                    attention_mask=batch.attention,
                    return_output=True,
                    return_entropy=True,
                )
                return lp, output.entropy[:, -width:]
            return self.actor(batch.sequences, batch.action, attention_mask=batch.attention), None
        from openrlhf.models.utils import compute_entropy, log_probs_from_logits

        logits = prefixed_logits(self.model, batch.prefix, batch.sequences, batch.attention)
        rolled = torch.roll(batch.sequences, shifts=-1, dims=1)  # the Actor's: logits at t score token t + 1
        lp = log_probs_from_logits(logits, rolled)[:, :-1][:, -width:] * batch.action.float()
        ent = compute_entropy(logits)[:, :-1][:, -width:] if entropy else None
        return lp, ent

    @torch.no_grad()
    def packed_log_probs(
        self, batch: Packed, batch_rows: int | None = None, entropy: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """`forward` without gradients, `batch_rows` rows at a time (default 16 on whole sequences, as before; 64
        after a shared prefix, which each chunk runs once)."""
        batch_rows = batch_rows or (64 if batch.prefix else 16)
        self.model.eval()
        out, ent = [], []
        for s in range(0, len(batch.sequences), batch_rows):
            lp, e = self.forward(batch.select(slice(s, s + batch_rows)), entropy=entropy)
            out.append(lp)
            ent.append(e)
        return (torch.cat(out), torch.cat(ent)) if entropy else torch.cat(out)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], uniforms: Tensor | None, max_new_tokens: int
    ) -> list[list[int]]:
        """Each prompt's reply: `decode_replies` after the shared prefix, or `generate_replies` on whole sequences
        when this policy does not share one or the prompts have none."""
        length = shared_prefix_length(prompt_ids) if self.shared_prefix else 0
        if not length:
            return generate_replies(self.model, prompt_ids, uniforms, max_new_tokens, self.eos_ids, self.pad_id)
        rest = [p[length:] for p in prompt_ids]
        return decode_replies(
            self.model, prompt_ids[0][:length], rest, uniforms, max_new_tokens, self.eos_ids, self.pad_id
        )

    def prompt_text(self, row: dict) -> str:
        chat = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def state(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.model.load_state_dict(state)

    @torch.no_grad()
    def log_probs(
        self,
        sequences: Tensor,
        attention_mask: Tensor,
        action_mask: Tensor,
        batch_rows: int = 16,
        entropy: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """(N, width) log-probabilities of the action tokens (and their positions' entropies) of a batch in
        `pack`'s layout, whole sequences through the Actor: `packed_log_probs` without a shared prefix."""
        return self.packed_log_probs(Packed(sequences, attention_mask, action_mask, []), batch_rows, entropy)


def exact_eval(policy: Policy, rows: Sequence[dict]) -> dict[str, float]:
    """Teacher-forced on each row's canonical reply (+ the end token): mean_p_correct = mean over rows
    of P(the whole canonical reply), the exact expected exact-match rate of that reply at temperature 1
    (a lower bound on the task's success rate, which also accepts other wordings); entropy = mean over
    rows of the mean next-token entropy (nats) along the canonical reply's contexts (fixed contexts:
    the same positions for every policy); log_p_correct = mean log-probability of the reply."""
    prompts = [policy.encode(policy.prompt_text(r)) for r in rows]
    replies = [policy.encode(canonical_reply(r)) + policy.eos_ids[:1] for r in rows]
    batch = policy.pack(prompts, replies)
    lp, ent = policy.packed_log_probs(batch, entropy=True)
    action = batch.action
    seq_lp = (lp * action).sum(-1)
    seq_ent = (ent * action).sum(-1) / action.sum(-1)
    return {
        "mean_p_correct": seq_lp.exp().mean().item(),
        "log_p_correct": seq_lp.mean().item(),
        "entropy": seq_ent.mean().item(),
        "rows": len(rows),
    }


def sampled_eval(
    policy: Policy, task: Task, rows: Sequence[dict], samples: int, seed: int, max_new_tokens: int, greedy: bool = False
) -> dict[str, float]:
    """The task's scorer on replies sampled with seeded uniforms (the same numbers for every policy at
    one seed: paired), or greedy; mean_reward over rows x samples, answer_found, reply_tokens, truncated."""
    n = 1 if greedy else samples
    uniforms = None if greedy else step_uniforms(seed, 0, len(rows) * n, max_new_tokens, purpose="eval")
    _, replies, scores = sample_and_score(policy, task, rows, n, uniforms, max_new_tokens)
    # the canonical reply drawn verbatim: its rate estimates exact_eval's mean_p_correct (a check on both)
    canonical = [policy.encode(canonical_reply(r)) + policy.eos_ids[:1] for r in rows for _ in range(n)]
    return {
        "canonical_rate": sum(r == c for r, c in zip(replies, canonical)) / len(replies),
        "mean_reward": sum(scores) / len(scores),
        "answer_found": sum("<answer>" in policy.decode(r) for r in replies) / len(replies),
        "reply_tokens": sum(map(len, replies)) / len(replies),
        "truncated": sum(r[-1] not in policy.eos_ids for r in replies) / len(replies),
        "rows": len(rows),
        "samples": n,
    }


@dataclass
class Rollout:
    """One step's batch: what every method of one seed shares at step 1."""

    prompt_ids: list[list[int]]  # (N * G) rows, each prompt repeated G times
    replies: list[list[int]]
    rewards: Tensor  # (N * G,)
    advantages: Tensor  # (N * G,)


def sample_and_score(
    policy: Policy, task: Task, rows: Sequence[dict], samples: int, uniforms: Tensor | None, max_new_tokens: int
) -> tuple[list[list[int]], list[list[int]], list[float]]:
    """(prompt ids, replies, scores), `samples` rows per prompt (row i * samples + j: sample j of prompt i),
    drawn with `uniforms` (greedy when None) and scored by the task."""
    texts = [policy.prompt_text(r) for r in rows]
    ids = [policy.encode(t) for t in texts]
    prompt_ids = [p for p in ids for _ in range(samples)]
    replies = policy.generate(prompt_ids, uniforms, max_new_tokens)
    prompts_x = [t for t in texts for _ in range(samples)]
    labels = [r["label"] for r in rows for _ in range(samples)]
    scores = task.reward_fn([p + policy.decode(r) for p, r in zip(prompts_x, replies)], prompts_x, labels)
    return prompt_ids, replies, scores


def make_rollout(
    policy: Policy, task: Task, rows: Sequence[dict], samples: int, uniforms: Tensor, max_new_tokens: int
) -> Rollout:
    prompt_ids, replies, scores = sample_and_score(policy, task, rows, samples, uniforms, max_new_tokens)
    rewards = torch.tensor(scores, dtype=torch.float32)
    return Rollout(prompt_ids, replies, rewards, group_advantages(rewards, samples))


class Trainer:
    """One method's updates on one policy: the method's loss, Adam, the k3 KL to the reference."""

    def __init__(self, policy: Policy, reference: Policy | None, method: str, cfg: LoopConfig) -> None:
        from openrlhf_band.tools.demo import DemoConfig, make_loss, method_bounds

        # the demo's radius and cap (0.05, 10) are train_ppo_ray's defaults (flags.BAND_DEFAULTS)
        demo_cfg = DemoConfig()
        self.policy, self.reference, self.method, self.cfg = policy, reference, method, cfg
        self.loss_fn = make_loss(method, demo_cfg)
        self.bounds_of = method_bounds(method, demo_cfg)
        self.optim = torch.optim.Adam(policy.model.parameters(), lr=cfg.lr, betas=cfg.betas)

    def update(
        self,
        rollout: Rollout,
        order_seed: int,
        old: Tensor | None = None,
        after: bool = True,
        timer: Timer | None = None,
    ) -> dict:
        """One rollout's updates (epochs x minibatches, the order from `order_seed`). Returns the batch's
        tensors before and after: old / new log-probs of every action token (new: None unless `after`, a
        forward pass over the batch that only the per-token statistics read), advantages, the mask, the
        bounds, and the mean clip fraction of the optimizer steps. `old`: the batch's log-probs under the
        current weights when the caller has them (the replay probe shares them across methods)."""
        timer = timer or Timer()
        from openrlhf.models.loss import aggregate_loss
        from openrlhf.models.utils import compute_approx_kl

        cfg = self.cfg
        batch = self.policy.pack(rollout.prompt_ids, rollout.replies)
        action = batch.action
        with timer("old log-probs"):
            old = self.policy.packed_log_probs(batch) if old is None else old
        with timer("reference log-probs"):
            ref = self.reference.packed_log_probs(batch) if self.reference is not None else None
        adv = rollout.advantages[:, None].expand_as(old).contiguous()
        needs_entropy = getattr(self.loss_fn, "needs_entropy", False)
        gen = torch.Generator().manual_seed(order_seed)
        clip_fracs = []
        with timer("update"):
            for _epoch in range(cfg.epochs):
                for idx in torch.randperm(len(batch.sequences), generator=gen).chunk(cfg.minibatches):
                    self.policy.model.train()
                    log_probs, entropy = self.policy.forward(batch.select(idx), entropy=needs_entropy)
                    extra = {"entropy": entropy.detach()} if needs_entropy else {}
                    policy_loss, clip_ratio, *_ = self.loss_fn(
                        log_probs, old[idx], adv[idx], action_mask=action[idx], **extra
                    )
                    loss = policy_loss
                    if ref is not None and cfg.kl_coef:
                        kl = compute_approx_kl(log_probs, ref[idx], kl_estimator="k3")
                        loss = loss + cfg.kl_coef * aggregate_loss(kl, action[idx], token_level_loss=False)
                    self.optim.zero_grad()
                    loss.backward()
                    self.optim.step()
                    if needs_entropy:
                        self.loss_fn.after_optimizer_step()
                    clip_fracs.append(float(clip_ratio))
        new = None
        if after:
            with timer("log-probs after"):
                new = self.policy.packed_log_probs(batch)
        lower, upper = self.bounds_of(old) if self.bounds_of is not None else (None, None)
        return {
            "old": old,
            "new": new,
            "adv": adv,
            "mask": action,
            "lower": lower,
            "upper": upper,
            "clip_frac": sum(clip_fracs) / len(clip_fracs),
        }


def replay(
    policy: Policy,
    weights: dict[str, Tensor],
    rollout: Rollout,
    methods: Sequence[str],
    cfg: LoopConfig,
    order_seed: int,
    eval_rows: Sequence[dict],
) -> dict[str, dict]:
    """The replay probe's measurement of one batch: each method updates `rollout` once from `weights` (a fresh
    Adam, the same mini-batch order, the same old log-probs), then: its per-token statistics (`token_stats`), the
    exact evaluation of `eval_rows` after the update and its clip fraction. The policy holds `weights` again after."""
    old = policy.packed_log_probs(policy.pack(rollout.prompt_ids, rollout.replies))
    out = {}
    for method in methods:
        policy.load_state(weights)
        batch = Trainer(policy, None, method, cfg).update(rollout, order_seed, old=old)
        out[method] = {
            "tokens": token_stats(batch),
            "after": exact_eval(policy, eval_rows),
            "clip_frac": batch["clip_frac"],
        }
    policy.load_state(weights)
    return out


def step_prompts(task: Task, seed: int, step: int, prompts: int) -> list[dict]:
    """Step `step`'s (1-based) prompts: consecutive slices of one seeded permutation of the training rows."""
    gen = torch.Generator().manual_seed(derived_seed(seed, "prompts"))
    order = torch.randperm(len(task.train), generator=gen).tolist()
    start = ((step - 1) * prompts) % len(order)
    return [task.train[order[(start + k) % len(order)]] for k in range(prompts)]


def token_stats(batch: dict) -> dict[str, dict[str, float]]:
    """Per old-probability bin and advantage sign: tokens, the mean change of log-probability after the
    update (nats), and the share of tokens whose ratio left the method's bounds."""
    old, new, adv, mask = batch["old"], batch["new"], batch["adv"], batch["mask"] != 0
    bins = bin_of(old.exp())
    out: dict[str, dict[str, float]] = {}
    for b, (*_, name) in enumerate(BINS):
        for sign, sel in (("pos", adv > 0), ("neg", adv < 0)):
            live = mask & sel & (bins == b)
            n = int(live.sum())
            d = (new - old)[live]
            entry = {"tokens": n, "mean_dlogp": d.mean().item() if n else math.nan}
            if batch["lower"] is not None and n:
                ratio = (new - old).exp()[live]
                outside = (ratio > batch["upper"][live]) if sign == "pos" else (ratio < batch["lower"][live])
                entry["outside"] = outside.float().mean().item()
            out[f"{name}/{sign}"] = entry
    return out


def run(
    model_dir: Path,
    task: Task,
    method: str,
    seed: int,
    cfg: LoopConfig,
    *,
    eval_rows: Sequence[dict] = (),
    sampled_rows: Sequence[dict] = (),
    sampled_n: int = 2,
    eval_seed: int = 0,
    eval_every: int = 0,
    greedy: bool = True,
    shared_prefix: bool = False,
    on_step: Callable[[int, Policy], None] | None = None,
) -> dict:
    """One method at one seed: `cfg.steps` rollouts from `model_dir`. Returns per-step rows (rollout
    reward, clip fraction, per-bin token stats of step 1), exact evaluations of `eval_rows` at step 0,
    every `eval_every` steps and the end, the sampled (and, with `greedy`, greedy) evaluation of
    `sampled_rows` at the end (`sampled_n` samples each, with the uniforms of `eval_seed`: the same numbers
    for every run), and `timings`: the seconds of each phase. `shared_prefix`: Policy's (the few-shot turns
    run once a forward pass)."""
    start = time.time()
    timer = Timer()
    with timer("model load"):
        policy = Policy(model_dir, cfg.threads, shared_prefix)
        reference = Policy(model_dir, cfg.threads, shared_prefix) if cfg.kl_coef else None
        trainer = Trainer(policy, reference, method, cfg)
    steps: list[dict] = []
    with timer("exact evaluation"):
        evals = [{"step": 0, **exact_eval(policy, eval_rows)}] if eval_rows else []
    for step in range(1, cfg.steps + 1):
        rows = step_prompts(task, seed, step, cfg.prompts)
        uniforms = step_uniforms(seed, step, cfg.prompts * cfg.samples, cfg.max_new_tokens)
        with timer("generation and reward"):
            rollout = make_rollout(policy, task, rows, cfg.samples, uniforms, cfg.max_new_tokens)
        # the log-probs after the update are read only by step 1's per-token statistics
        batch = trainer.update(rollout, derived_seed(seed, "order", step), after=step == 1, timer=timer)
        informative = informative_share(rollout.rewards, cfg.samples)
        row = {
            "step": step,
            "rollout_reward": rollout.rewards.mean().item(),
            "informative_groups": informative,
            "reply_tokens": sum(map(len, rollout.replies)) / len(rollout.replies),
            "clip_frac": batch["clip_frac"],
            "replies_sha": hashlib.sha256(json.dumps(rollout.replies).encode()).hexdigest()[:16],
        }
        if step == 1:
            row["token_stats"] = token_stats(batch)
        steps.append(row)
        print(
            f"[loop] {method} seed {seed} step {step}: rollout reward {row['rollout_reward']:.3f}, clip "
            f"{row['clip_frac']:.3f}, {time.time() - start:.0f} s",
            flush=True,
        )
        if eval_rows and eval_every and step % eval_every == 0 and step != cfg.steps:
            with timer("exact evaluation"):
                evals.append({"step": step, **exact_eval(policy, eval_rows)})
        if on_step is not None:
            on_step(step, policy)
    if eval_rows:
        with timer("exact evaluation"):
            evals.append({"step": cfg.steps, **exact_eval(policy, eval_rows)})
    result = {"method": method, "seed": seed, "config": asdict(cfg), "steps": steps, "exact": evals}
    if sampled_rows:
        with timer("sampled evaluation"):
            result["sampled"] = sampled_eval(policy, task, sampled_rows, sampled_n, eval_seed, cfg.max_new_tokens)
        if greedy:
            with timer("greedy evaluation"):
                result["greedy"] = sampled_eval(
                    policy, task, sampled_rows, 1, eval_seed, cfg.max_new_tokens, greedy=True
                )
    result["seconds"] = round(time.time() - start, 1)
    result["timings"] = timer.rounded()
    return result
