"""What every task's reward file shares: OpenRLHF's batch in, its tensors out.

OpenRLHF 0.11.2 calls `reward_func(queries, prompts, labels)` (usually one sample per call, from a worker
thread) and reads `{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {name: Tensor[B]}}`, float32.
A reward file must never raise, so both halves accept anything. A query is the decoded prompt + response
(`decode(..., skip_special_tokens=False)`): `response_text` cuts the prompt off, and `SPECIAL_TOKEN_RE`
matches the special tokens decoding leaves in it.

`score_batch` is the body of every task's `reward_func`: the task supplies its per-sample scorer
`score_one(query, prompt, label, *batch_args) -> (reward, score, *logs)`, the names of its extra_logs, the row
a sample gets if anything fails, and how many samples it scores at once; `align`, `map_samples` and
`as_output` are its parts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SPECIAL_TOKEN_RE", "align", "as_output", "map_samples", "response_text", "score_batch"]

# Special tokens that `decode(..., skip_special_tokens=False)` leaves in the query (Qwen/Llama-3
# `<|...|>`, DeepSeek `<｜...｜>`, Llama-2/Mistral `</s>`, Gemma `<eos>` / `<end_of_turn>`).
SPECIAL_TOKEN_RE = re.compile(r"<\|[^<>|\s]{1,48}\|>|<｜[^<>｜]{1,48}｜>|</?s>|<eos>|<end_of_turn>|<pad>")


def _as_list(values: Any) -> list:
    if values is None or isinstance(values, (str, bytes, dict)):
        return []
    try:
        return list(values)
    except TypeError:
        return []


def align(queries: Any, prompts: Any, labels: Any) -> tuple[list, list, list]:
    """(queries, prompts, labels) as lists of the queries' length B: a str query is a batch of one; prompts and
    labels are padded with None or cut to B; anything that is not a sequence reads as empty. Never raises."""
    if isinstance(queries, str):
        queries, prompts, labels = [queries], [prompts], [labels]
    queries = _as_list(queries)
    n = len(queries)
    prompts = (_as_list(prompts) + [None] * n)[:n]
    labels = (_as_list(labels) + [None] * n)[:n]
    return queries, prompts, labels


def response_text(query: Any, prompt: Any) -> str:
    """The response part of an OpenRLHF query (decoded prompt + response); "" for a query that is not a str."""
    if not isinstance(query, str):
        return ""
    if isinstance(prompt, str) and prompt:
        if query.startswith(prompt):
            return query[len(prompt) :]
        # Decoding may not reproduce the prompt exactly (or it was truncated from the left): find its tail.
        tail = prompt[-64:]
        idx = query.find(tail)
        if idx >= 0:
            return query[idx + len(tail) :]
    return query


def map_samples(score_one, samples: Sequence[tuple], workers: int) -> list:
    """[score_one(*sample)] in order; a batch runs on up to `workers` threads (each sample's work is bounded in
    time by the reward itself)."""
    if len(samples) <= 1 or workers <= 1:
        return [score_one(*sample) for sample in samples]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(samples), workers)) as executor:
        return list(executor.map(lambda sample: score_one(*sample), samples))


def as_output(rewards: Sequence[float], scores: Sequence[float], extra_logs: dict[str, Sequence[float]]) -> dict:
    """OpenRLHF's reward dict, float32 tensors of shape [B] (plain lists if torch cannot be imported)."""
    try:
        import torch

        def as_tensor(values):
            return torch.tensor(list(values), dtype=torch.float32)
    except Exception:

        def as_tensor(values):
            return list(values)

    return {
        "rewards": as_tensor(rewards),
        "scores": as_tensor(scores),
        "extra_logs": {name: as_tensor(values) for name, values in extra_logs.items()},
    }


def _one_worker() -> int:
    return 1


def score_batch(
    queries: Any,
    prompts: Any,
    labels: Any,
    score_one: Callable[..., Sequence[float]],
    *,
    logs: Sequence[str],
    failure: Sequence[float],
    workers: Callable[[], int] = _one_worker,
    batch_args: Callable[[], tuple] = tuple,
) -> dict:
    """OpenRLHF's `reward_func` for a per-sample scorer: the batch aligned (`align`), then for each sample
    `score_one(query, prompt, label, *batch_args())` -> (reward, score, *one value per name in `logs`), on up to
    `workers()` threads (`map_samples`), returned as OpenRLHF's dict (`as_output`): `rewards`, `scores` and
    `extra_logs[name]` for each name in `logs`. `batch_args` and `workers` are read once per batch. Never raises:
    if anything fails (score_one itself should not raise), every sample gets the `failure` row."""
    queries, prompts, labels = align(queries, prompts, labels)
    try:
        extra = batch_args()
        samples = [(query, prompt, label, *extra) for query, prompt, label in zip(queries, prompts, labels)]
        rows = map_samples(score_one, samples, workers())
    except Exception:  # one row per sample whatever happens
        rows = [failure] * len(queries)
    columns = [list(column) for column in zip(*rows)] if rows else [[] for _ in range(2 + len(logs))]
    return as_output(columns[0], columns[1], dict(zip(logs, columns[2:])))
