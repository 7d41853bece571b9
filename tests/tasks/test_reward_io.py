"""The reward files' shared input and output (openrlhf_band/tasks/reward_io.py): any input gives lists of the
queries' length, the response is the query without its prompt, the output is float32 tensors of shape [B], and
`score_batch` (every task's reward_func) puts them together around a per-sample scorer without ever raising."""

from __future__ import annotations

import pytest
import torch

from openrlhf_band.tasks.reward_io import SPECIAL_TOKEN_RE, align, as_output, map_samples, response_text, score_batch

PROMPT = "<|im_start|>user\n" + "Solve the problem below. " * 4 + "Put it after Answer:\n<|im_end|>\n"


@pytest.mark.parametrize(
    "queries, prompts, labels, expected",
    [
        ("q", "p", "l", (["q"], ["p"], ["l"])),  # one sample given as strings
        (["a", "b"], ["p"], None, (["a", "b"], ["p", None], [None, None])),  # padded
        (["a"], ["p", "x"], ["l", "y"], (["a"], ["p"], ["l"])),  # cut
        (None, None, None, ([], [], [])),
        (5, "p", 3, ([], [], [])),  # not sequences
        (("a", "b"), 7, {"k": 1}, (["a", "b"], [None, None], [None, None])),
    ],
)
def test_align(queries, prompts, labels, expected):
    assert align(queries, prompts, labels) == expected


def test_as_output_is_float32_of_shape_b():
    out = as_output([1, 0], [1.0, 0.0], {"found": [1, 1]})
    for tensor in (out["rewards"], out["scores"], out["extra_logs"]["found"]):
        assert tensor.dtype == torch.float32 and tensor.shape == (2,)


def test_map_samples_keeps_the_order_on_threads():
    samples = [(i,) for i in range(20)]
    assert map_samples(lambda i: i * i, samples, workers=4) == [i * i for i in range(20)]
    assert map_samples(lambda i: i, [], workers=4) == []


def _as_lists(out):
    return {"rewards": out["rewards"].tolist(), "scores": out["scores"].tolist(),
            **{name: values.tolist() for name, values in out["extra_logs"].items()}}  # fmt: skip


@pytest.mark.parametrize("workers", [1, 3])
def test_score_batch_scores_each_sample_in_order_with_the_batch_arguments(workers):
    def score_one(query, prompt, label, scale):
        return float(len(query)) * scale, float(label), float(prompt is None)

    out = score_batch(["a", "bb", "ccc"], ["p"], [1, 0, 1], score_one, logs=("no_prompt",), failure=(9.0, 9.0, 9.0),
                      workers=lambda: workers, batch_args=lambda: (2.0,))  # fmt: skip
    assert _as_lists(out) == {"rewards": [2.0, 4.0, 6.0], "scores": [1.0, 0.0, 1.0], "no_prompt": [0.0, 1.0, 1.0]}
    assert all(t.dtype == torch.float32 for t in (out["rewards"], out["scores"], *out["extra_logs"].values()))


def test_score_batch_gives_every_sample_the_failure_row_when_anything_fails():
    def broken(*sample):
        raise RuntimeError("scorer")

    def no_workers():
        raise RuntimeError("workers")

    expected = {"rewards": [-1.0, -1.0], "scores": [0.0, 0.0], "found": [0.0, 0.0], "timeout": [1.0, 1.0]}
    for score_one, workers in ((broken, lambda: 1), (lambda *s: (1.0, 1.0, 1.0, 0.0), no_workers)):
        out = score_batch(["a", "b"], None, None, score_one, logs=("found", "timeout"), failure=(-1.0, 0.0, 0.0, 1.0),
                          workers=workers)  # fmt: skip
        assert _as_lists(out) == expected


def test_score_batch_of_nothing_is_empty_tensors_with_every_log():
    out = score_batch(None, None, None, lambda *s: (1.0, 1.0, 1.0), logs=("found",), failure=(0.0, 0.0, 0.0))
    assert _as_lists(out) == {"rewards": [], "scores": [], "found": []}


@pytest.mark.parametrize(
    ("query", "prompt", "expected"),
    [
        (PROMPT + "Answer: 5", PROMPT, "Answer: 5"),  # the query starts with the prompt
        ("<s>" + PROMPT[10:] + "Answer: 5", PROMPT, "Answer: 5"),  # decoded differently at the start: its tail
        ("Answer: 5", PROMPT, "Answer: 5"),  # the prompt is not in the query: all of it
        ("Answer: 5", "", "Answer: 5"),
        ("Answer: 5", None, "Answer: 5"),
        (None, PROMPT, ""),
        (b"Answer: 5", PROMPT, ""),
    ],
)
def test_response_text_cuts_the_prompt_off(query, prompt, expected):
    assert response_text(query, prompt) == expected


def test_special_tokens_of_each_chat_family_are_matched_and_text_is_not():
    tokens = ["<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "</s>", "<s>", "<eos>", "<end_of_turn>", "<pad>"]
    assert SPECIAL_TOKEN_RE.sub("", "x".join(tokens)) == "x" * (len(tokens) - 1)
    for text in ("a < b | c > d", "<| spaced |>", "<b>", "<|" + "x" * 49 + "|>"):
        assert SPECIAL_TOKEN_RE.sub("", text) == text
