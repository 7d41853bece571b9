"""The reward files' shared input and output (openrlhf_band/tasks/reward_io.py): any input gives lists of the
queries' length, and the output is float32 tensors of shape [B]."""

from __future__ import annotations

import pytest
import torch

from openrlhf_band.tasks.reward_io import align, as_output, map_samples


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
