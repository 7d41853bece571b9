"""The multiple-choice task (`mc`): `mc/data.py`'s build on fixtures and `mc/reward.py` loaded as OpenRLHF loads it.

The fixtures (tests/fixtures/mc/) use the hub datasets' own columns: CommonsenseQA (`id`, `question`,
`question_concept`, `choices` = {"label": [...], "text": [...]}, `answerKey`) in `train.jsonl` and
`validation.jsonl`, and MMLU's `all` config (`question`, `subject`, `choices` = 4 strings, `answer` =
0-3) in `auxiliary_train.jsonl` and `test.jsonl`. Each file has malformed rows (CommonsenseQA: an empty
`answerKey`, 4 labels for 5 texts, a key that is no label; MMLU: answer 7, an empty question) and a
duplicate (CommonsenseQA train's differs only in spacing); CommonsenseQA train repeats a validation
question, MMLU auxiliary_train an MMLU test question and a CommonsenseQA validation question. Expected
values are written out by hand. No network: the hub is replaced by monkeypatched functions.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from reward_files import in_thread, load_reward_file

from openrlhf_band.tasks import sources
from openrlhf_band.tasks.mc import data as choice_data
from openrlhf_band.tasks.mc.data import SourceError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "mc"
OVERRIDES = {"commonsense_qa": str(FIXTURES / "commonsense_qa"), "mmlu": str(FIXTURES / "mmlu")}
BOTH = ["commonsense_qa", "mmlu"]
REWARD_PATH = REPO / "openrlhf_band" / "tasks" / "mc" / "reward.py"


reward = load_reward_file(REWARD_PATH)


def _question(prompt: str) -> str:
    """The question of a prompt: the paragraph between the instruction and the choices."""
    return prompt.split("\n\n")[1]


@pytest.fixture(scope="module")
def built():
    return choice_data.build(OVERRIDES, {}, BOTH, BOTH)


# ============================================================================= data


EXPECTED_EVAL_PROMPT = (
    "Answer the following multiple choice question. The last line of your response should be of the form "
    "Answer: $LETTER (without quotes) where LETTER is one of ABCDE. Think step by step before answering.\n\n"
    "If you are thirsty, what should you do?\n\n"
    "A. drink water\nB. run a mile\nC. sing a song\nD. go to sleep\nE. read a map"
)


def test_rows_are_json_with_exactly_the_three_keys(built):
    train, evals, manifest = built
    for row in train + evals:
        assert set(row) == {"prompt", "label", "datasource"}
        assert all(isinstance(v, str) for v in row.values())
        assert json.loads(json.dumps(row)) == row
    json.dumps(manifest)


def test_prompt_text(built):
    _, evals, _ = built
    assert evals[0]["prompt"] == EXPECTED_EVAL_PROMPT
    mmlu = [r for r in evals if r["datasource"] == "mmlu"][0]
    assert "LETTER is one of ABCD." in mmlu["prompt"]
    assert mmlu["prompt"].endswith("What is the chemical symbol for gold?\n\nA. Ag\nB. Au\nC. Gd\nD. Go")
    assert choice_data.format_prompt("Q?", [("A", "x"), ("B", "y")]).endswith(
        "one of AB. Think step by step before answering.\n\nQ?\n\nA. x\nB. y"
    )


def test_train_rows_deduplicated_without_malformed_or_eval_questions(built):
    train, _, _ = built
    got = [(r["datasource"], _question(r["prompt"]), json.loads(r["label"])["answer"]) for r in train]
    assert got == [
        ("commonsense_qa", "Where would you most likely keep a spare tire?", "A"),  # its spaced copy dropped
        ("commonsense_qa", "What do people usually do when they are very tired?", "B"),
        ("commonsense_qa", "What is a common place to find a cactus growing wild?", "C"),
        ("mmlu", "Which gas do plants absorb from the air for photosynthesis?", "B"),  # answer 1
        ("mmlu", "The sun rises in the", "C"),
        ("mmlu", "How many legs does an insect have?", "B"),
    ]
    assert train[0]["label"] == '{"answer": "A", "choices": ["A", "B", "C", "D", "E"]}'
    assert json.loads(train[3]["label"]) == {"answer": "B", "choices": ["A", "B", "C", "D"]}
    joined = " ".join(r["prompt"] for r in train)
    for dropped in ("thirsty", "books to borrow", "symbol for gold", "baker", "cat sleep", "animals can fly"):
        assert dropped not in joined


def test_eval_rows_and_accuracy_labels(built):
    _, evals, _ = built
    got = [(r["datasource"], _question(r["prompt"]), json.loads(r["label"])["answer"]) for r in evals]
    assert got == [
        ("commonsense_qa", "If you are thirsty, what should you do?", "A"),
        ("commonsense_qa", "Where do you put dirty dishes after a meal?", "D"),
        ("commonsense_qa", "What might a person feel after winning a prize?", "E"),
        ("commonsense_qa", "Where would you find books to borrow for free?", "B"),
        ("mmlu", "What is the chemical symbol for gold?", "B"),
        ("mmlu", "What is 7 multiplied by 8?", "A"),
        ("mmlu", "Which organ pumps blood through the human body?", "C"),
        ("mmlu", "Which of the following is a prime number?", "C"),
        ("mmlu", "Which planet is known as the Red Planet?", "D"),
    ]
    assert evals[0]["label"] == '{"answer": "A", "choices": ["A", "B", "C", "D", "E"], "reward": "accuracy"}'
    assert json.loads(evals[-1]["label"]) == {"answer": "D", "choices": ["A", "B", "C", "D"], "reward": "accuracy"}


def test_manifest_counts(built):
    _, _, manifest = built
    assert manifest["keys"] == {"input_key": "prompt", "label_key": "label", "datasource_key": "datasource"}
    assert manifest["prompt_template"] == choice_data.PROMPT_TEMPLATE
    assert (manifest["max_eval_per_source"], manifest["seed"]) == (None, 0)
    train, evals = manifest["train"], manifest["eval"]
    assert (train["rows"], train["malformed_skipped"], train["duplicates_dropped"], train["eval_overlap_dropped"]) == (
        6,
        3,
        2,
        3,
    )
    assert (evals["rows"], evals["malformed_skipped"], evals["duplicates_dropped"], evals["subsampled_out"]) == (
        9,
        2,
        2,
        0,
    )
    csqa, mmlu = train["sources"]["commonsense_qa"], train["sources"]["mmlu"]
    assert csqa == {
        "origin": OVERRIDES["commonsense_qa"],
        "split": "train",
        "rows_read": 7,
        "malformed_skipped": 2,
        "duplicates_dropped": 1,
        "eval_overlap_dropped": 1,
        "written": 3,
    }
    assert (mmlu["split"], mmlu["rows_read"], mmlu["malformed_skipped"], mmlu["eval_overlap_dropped"]) == (
        "auxiliary_train",
        7,
        1,
        2,  # one MMLU test question and one CommonsenseQA validation question
    )
    assert evals["sources"]["commonsense_qa"]["split"] == "validation"
    assert {n: (s["rows_read"], s["written"]) for n, s in evals["sources"].items()} == {
        "commonsense_qa": (6, 4),
        "mmlu": (7, 5),
    }


def test_subsampling_is_deterministic_and_keeps_order(built):
    full_eval = built[1]
    first = choice_data.build(OVERRIDES, {}, BOTH, BOTH, max_eval_per_source=2, seed=3)
    again = choice_data.build(OVERRIDES, {}, BOTH, BOTH, max_eval_per_source=2, seed=3)
    assert first == again
    train, evals, manifest = first
    assert [r["datasource"] for r in evals] == ["commonsense_qa"] * 2 + ["mmlu"] * 2
    positions = [full_eval.index(r) for r in evals]  # a subset of the full eval rows, in their order
    assert positions == sorted(positions)
    assert train == built[0]  # the overlap check uses every eval question, not the sample
    sources = manifest["eval"]["sources"]
    assert (sources["commonsense_qa"]["subsampled_out"], sources["mmlu"]["subsampled_out"]) == (2, 3)
    assert manifest["eval"]["subsampled_out"] == 5 and manifest["max_eval_per_source"] == 2
    draws = {json.dumps(choice_data.build(OVERRIDES, {}, [], ["mmlu"], 2, seed)[1]) for seed in range(8)}
    assert len(draws) > 1  # the seed matters
    assert choice_data.build(OVERRIDES, {}, [], BOTH, max_eval_per_source=100)[1] == full_eval


def test_one_role_only_and_single_file_override():
    train, evals, manifest = choice_data.build({"mmlu": str(FIXTURES / "mmlu" / "test.jsonl")}, {}, [], ["mmlu"])
    assert train == [] and len(evals) == 5
    assert manifest["train"]["rows"] == 0 and manifest["eval"]["sources"]["mmlu"]["split"] == "test"


@pytest.mark.parametrize(
    "overrides, train_sources, eval_sources, words",
    [
        # one file cannot be both splits
        ({"mmlu": str(FIXTURES / "mmlu" / "test.jsonl")}, ["mmlu"], ["mmlu"], ["tell the splits apart"]),
        ({"commonsense_qa": str(FIXTURES / "commonsense_qa" / "nope")}, [], ["commonsense_qa"], ["no such file"]),
        ({}, ["gsm8k"], [], ["unknown source 'gsm8k'", "commonsense_qa, mmlu"]),
        ({"arc": "/tmp"}, ["mmlu"], [], ["--source", "unknown source 'arc'"]),
        ({}, [], [], ["no sources selected"]),
    ],
)
def test_bad_arguments_are_one_line_errors(overrides, train_sources, eval_sources, words):
    with pytest.raises(SourceError) as info:
        choice_data.build(overrides, {}, train_sources, eval_sources)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    for word in words:
        assert word in message


def test_a_directory_with_only_the_other_split_is_refused(tmp_path):
    (tmp_path / "validation.jsonl").write_text((FIXTURES / "commonsense_qa" / "validation.jsonl").read_text())
    with pytest.raises(SourceError, match="none named for 'train'"):
        choice_data.build({"commonsense_qa": str(tmp_path)}, {}, ["commonsense_qa"], [])


def test_missing_column_names_the_source_and_sources_table(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"query": "Q?", "choices": ["a", "b"], "answer": 0}\n')
    with pytest.raises(SourceError) as info:
        choice_data.build({"mmlu": str(tmp_path)}, {}, [], ["mmlu"])
    assert "source 'mmlu'" in str(info.value) and "'question'" in str(info.value) and "SOURCES" in str(info.value)


def test_mmlu_auxiliary_train_config_layout_is_unwrapped(tmp_path):
    """cais/mmlu's `auxiliary_train` config nests each row in a struct column `train`."""
    rows = [json.loads(line) for line in (FIXTURES / "mmlu" / "auxiliary_train.jsonl").read_text().splitlines()]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"train": r}) + "\n" for r in rows))
    train, _, manifest = choice_data.build({"mmlu": str(tmp_path)}, {}, ["mmlu"], [])
    assert [_question(r["prompt"]) for r in train][:2] == [
        "Which gas do plants absorb from the air for photosynthesis?",
        "The sun rises in the",
    ]
    assert manifest["train"]["sources"]["mmlu"]["rows_read"] == 7


@pytest.mark.parametrize(
    "question, choices, answer, expected",
    [
        ("Q", {"label": ["A", "B"], "text": ["x", "y"]}, "B", ("Q", [("A", "x"), ("B", "y")], "B")),
        ("Q", {"label": ["a", "b"], "text": ["x", "y"]}, "b", ("Q", [("A", "x"), ("B", "y")], "B")),
        # ARC-style numeric labels become letters
        (
            "Q",
            {"label": ["1", "2", "3"], "text": ["x", "y", "z"]},
            "3",
            ("Q", [("A", "x"), ("B", "y"), ("C", "z")], "C"),
        ),
        (" Q ", ["x", "y  \n z"], 1, ("Q", [("A", "x"), ("B", "y z")], "B")),
        ("Q", ["x", "y"], 1.0, ("Q", [("A", "x"), ("B", "y")], "B")),
        ("Q", ["x", "y"], "B", ("Q", [("A", "x"), ("B", "y")], "B")),
        ("Q", [{"label": "A", "text": "x"}, {"label": "B", "text": "y"}], "A", ("Q", [("A", "x"), ("B", "y")], "A")),
        ("Q", ["x", "y"], 2, None),
        ("Q", ["x", "y"], -1, None),
        ("Q", ["x", "y"], True, None),
        ("Q", ["x", "y"], None, None),
        ("Q", ["x"], 0, None),
        ("Q", ["x", ""], 0, None),
        ("Q", ["x", None], 0, None),
        ("Q", {"label": ["A", "B", "C"], "text": ["x", "y"]}, "A", None),
        ("Q", {"label": ["A", "B"], "text": ["x", "y"]}, "", None),
        ("Q", "x, y", 0, None),
        ("", ["x", "y"], 0, None),
        (None, ["x", "y"], 0, None),
        ("Q", [str(i) for i in range(27)], 0, None),
    ],
)
def test_normalise(question, choices, answer, expected):
    assert choice_data.normalise(question, choices, answer) == expected


# ----------------------------------------------------------------------------- the hub, faked


def test_unreachable_hub_is_one_line_naming_the_source_and_the_flag(monkeypatch):
    def unreachable(hub_id):
        raise sources.Unreachable("ConnectError: [Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(choice_data, "probe_hub", unreachable)
    monkeypatch.setattr(choice_data, "hub_offline", lambda: False)
    with pytest.raises(SourceError) as info:
        choice_data.build({}, {}, ["commonsense_qa"], ["mmlu"])
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("source 'mmlu' (cais/mmlu): the Hugging Face Hub is unreachable (ConnectError")
    assert "--source mmlu=PATH" in message and "HF_HUB_OFFLINE=1" in message
    assert "sources without --source: commonsense_qa, mmlu" in message

    with pytest.raises(SourceError) as info:  # mmlu local, commonsense_qa from another repository
        choice_data.build({"mmlu": OVERRIDES["mmlu"]}, {"commonsense_qa": "me/csqa"}, ["commonsense_qa"], ["mmlu"])
    message = str(info.value)
    assert message.startswith("source 'commonsense_qa' (me/csqa): the Hugging Face Hub is unreachable")
    assert "--source commonsense_qa=PATH" in message and "sources without --source: commonsense_qa)" in message


def test_a_missing_hub_repository_is_one_line(monkeypatch):
    def missing(hub_id):
        raise SourceError("no such dataset on the Hugging Face Hub (or it is private)")

    monkeypatch.setattr(choice_data, "probe_hub", missing)
    monkeypatch.setattr(choice_data, "hub_offline", lambda: False)
    with pytest.raises(SourceError) as info:
        choice_data.build({}, {"mmlu": "me/no-such-mmlu"}, [], ["mmlu"])
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("source 'mmlu' (me/no-such-mmlu): no such dataset") and "--source mmlu=PATH" in message


def test_offline_without_a_cached_copy_is_one_line(monkeypatch):
    import datasets

    def no_cache(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'tau/commonsense_qa' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(choice_data, "hub_offline", lambda: True)  # the probe is skipped
    monkeypatch.setattr(sources, "hub_offline", lambda: True)  # read_hub words the missing cache
    monkeypatch.setattr(datasets, "load_dataset", no_cache)
    with pytest.raises(SourceError) as info:
        choice_data.build({}, {}, [], ["commonsense_qa"])
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "source 'commonsense_qa' (tau/commonsense_qa)" in message and "HF_HUB_OFFLINE is set" in message
    assert "--source commonsense_qa=PATH" in message


def test_hub_repositories_configs_and_splits(monkeypatch):
    """With the hub answering, each role loads its own split (and MMLU its `all` config)."""
    import datasets

    files = {
        ("tau/commonsense_qa", "train"): "commonsense_qa/train.jsonl",
        ("tau/commonsense_qa", "validation"): "commonsense_qa/validation.jsonl",
        ("cais/mmlu", "auxiliary_train"): "mmlu/auxiliary_train.jsonl",
        ("cais/mmlu", "test"): "mmlu/test.jsonl",
    }
    real_load, probed, calls = datasets.load_dataset, [], []

    def fake_load(path, name=None, split=None, **kwargs):
        if path == "json":  # not a hub call
            return real_load(path, name, split=split, **kwargs)
        calls.append((path, name, split))
        return real_load("json", data_files=str(FIXTURES / files[(path, split)]), split="train")

    monkeypatch.setattr(choice_data, "probe_hub", probed.append)
    monkeypatch.setattr(choice_data, "hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    train, evals, manifest = choice_data.build({}, {}, BOTH, BOTH)
    assert sorted(probed) == ["cais/mmlu", "tau/commonsense_qa"]  # once per repository
    assert sorted(calls) == [
        ("cais/mmlu", "all", "auxiliary_train"),
        ("cais/mmlu", "all", "test"),
        ("tau/commonsense_qa", None, "train"),
        ("tau/commonsense_qa", None, "validation"),
    ]
    assert (len(train), len(evals)) == (6, 9)
    assert manifest["eval"]["sources"]["mmlu"]["origin"] == "hub:cais/mmlu"
    assert manifest["eval"]["sources"]["mmlu"]["config"] == "all"


# ============================================================================= reward


TRAIN_LABEL = '{"answer": "C", "choices": ["A", "B", "C", "D"]}'
ACCURACY_LABEL = '{"answer": "C", "choices": ["A", "B", "C", "D"], "reward": "accuracy"}'
ABCD = ["A", "B", "C", "D"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: C", "C"),
        ("Answer: (C)", "C"),
        ("Answer: **C**", "C"),
        ("**Answer:** C", "C"),
        ("**Answer**: C", "C"),
        ("Answer: C. Paris is the capital.", "C"),
        ("Answer: C) Paris", "C"),
        ("Answer: $C$", "C"),
        ("Answer: $\\boxed{C}$", "C"),
        ("Answer: \\(\\boxed{\\text{C}}\\)", "C"),
        ("Answer: [C]", "C"),
        ("Answer: 'C'", "C"),
        ("Answer: option C", "C"),
        ("Answer: Choice: (c)", "C"),
        ("Final answer: C", "C"),
        ("ANSWER:C", "C"),
        ("answer: c", "C"),  # lowercase letters count
        ("Answer:\n\nC", "C"),
        ("Thinking...\nAnswer: C<|im_end|>", "C"),  # special tokens after the answer
        ("Answer: C<|im_end|><|endoftext|><|endoftext|>", "C"),
        ("Answer: C</s>", "C"),
        ("Answer: A\nWait, that is wrong.\nAnswer: C", "C"),  # several Answer: lines: the last
        ("Answer: C\nOn reflection:\nAnswer: B", "B"),
        ("A cat is an animal, and a dog is too. I pick the third.\nAnswer: C", "C"),  # "A" in prose
        ("A good choice is obvious: B.", None),  # "A" / "B" in prose, no Answer: line
        ("a", None),
        ("The answer is \\boxed{C}.", "C"),  # no Answer: line: the last box
        ("\\boxed{A} at first, then \\boxed{\\text{(C)}}", "C"),
        ("\\boxed{C. Paris}", None),  # a box must hold a single letter
        ("\\boxed{42}", None),
        ("Answer: The answer is C", None),  # the letter must come first after Answer:
        ("Answer: E", None),  # not one of the choices
        ("Answer: E\n\\boxed{C}", None),  # ... and then no fallback
        ("Answer: Z", None),
        ("Answer: CD", None),
        ("Answer: C4", None),
        ("Answer: 3", None),
        ("Answer:", None),
        ("Answer: \n\\boxed{C}", "C"),  # the answer on the next line, boxed
        ("Answer: see below\n\\boxed{C}", "C"),  # no letter after the last Answer:: the last box
        ("Answer: see below\n\\boxed{E}", None),  # ... which must be a choice too
        ("Answer: $LETTER (without quotes)", None),  # the prompt's own instruction
        ("", None),
        ("<|im_end|>", None),
        ("x" * 5000 + "\nAnswer: C", "C"),  # only the tail is searched
        ("Answer: C\n" + "x" * 5000, None),
    ],
)
def test_extract_choice(text, expected):
    assert reward.extract_choice(text, ABCD) == expected


def test_extract_choice_without_choices_allows_any_letter():
    assert reward.extract_choice("Answer: E") == "E"
    assert reward.extract_choice("Answer: e", ["a", "b", "c", "d", "e"]) == "E"
    assert reward.extract_choice("Answer: I think so") == "I"  # a bare-letter label cannot rule out "I"


def _one(response, label, prompt=""):
    out = reward.reward_func([prompt + response], [prompt], [label])
    return out["rewards"].item(), out["scores"].item(), out["extra_logs"]["answer_found"].item()


@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("Answer: C", TRAIN_LABEL, (1.0, 1.0, 1.0)),
        ("Answer: B", TRAIN_LABEL, (-1.0, 0.0, 1.0)),
        ("no idea", TRAIN_LABEL, (-1.0, 0.0, 0.0)),
        ("Answer: E", TRAIN_LABEL, (-1.0, 0.0, 0.0)),
        ("Answer: C", ACCURACY_LABEL, (1.0, 1.0, 1.0)),
        ("Answer: B", ACCURACY_LABEL, (0.0, 0.0, 1.0)),
        ("no idea", ACCURACY_LABEL, (0.0, 0.0, 0.0)),
        ("Answer: c", "C", (1.0, 1.0, 1.0)),  # a bare-letter label
        ("Answer: E", "C", (-1.0, 0.0, 1.0)),
        ("Answer: C", " c ", (1.0, 1.0, 1.0)),
        ("Answer: C", {"answer": "C", "choices": ABCD, "reward": "accuracy"}, (1.0, 1.0, 1.0)),  # a dict
        ("Answer: C", '{"answer": "C"}', (1.0, 1.0, 1.0)),  # no choices: any letter
        ("Answer: C", '{"answer": "E", "choices": ["A", "B", "C", "D"]}', (-1.0, 0.0, 1.0)),  # answer no choice
        ("Answer: C", "CC", (-1.0, 0.0, 1.0)),
        ("Answer: C", '{"answer": "C", "choices": ["A", "B", "C", "D"]', (-1.0, 0.0, 1.0)),  # bad JSON
        ("Answer: C", None, (-1.0, 0.0, 1.0)),
        ("Answer: C", 3, (-1.0, 0.0, 1.0)),
    ],
)
def test_rewards_for_both_label_kinds(response, label, expected):
    assert _one(response, label) == expected


def test_the_prompt_is_stripped_from_the_query():
    prompt = "<|im_start|>user\n" + EXPECTED_EVAL_PROMPT + "\nAnswer: A<|im_end|>\n<|im_start|>assistant\n"
    assert _one("I am not sure.<|im_end|>", ACCURACY_LABEL, prompt) == (0.0, 0.0, 0.0)
    assert _one("Water helps.\nAnswer: C<|im_end|>", ACCURACY_LABEL, prompt) == (1.0, 1.0, 1.0)


def test_batch_shapes_and_types():
    import torch

    out = reward.reward_func(["Answer: C", "Answer: A", "nothing"], ["", "", ""], [TRAIN_LABEL, ACCURACY_LABEL, "C"])
    assert set(out) == {"rewards", "scores", "extra_logs"} and set(out["extra_logs"]) == {"answer_found"}
    for tensor in (out["rewards"], out["scores"], out["extra_logs"]["answer_found"]):
        assert tensor.dtype == torch.float32 and tensor.shape == (3,)
    assert out["rewards"].tolist() == [1.0, 0.0, -1.0]
    assert out["scores"].tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "queries, prompts, labels",
    [
        ([None], [None], [None]),
        ([3], [4.5], [object()]),
        ([b"Answer: C"], [""], [TRAIN_LABEL]),
        (["Answer: C"], None, None),
        (["Answer: C", "Answer: D"], [""], [TRAIN_LABEL]),  # short prompt / label lists
        ([], [], []),
        (None, None, None),
        ("Answer: C", "", TRAIN_LABEL),  # bare strings
        (["Answer: C"], [""], ["{" * 100_000]),
        (["Answer: C"], [""], ['{"answer": ["C"], "choices": "ABCD", "reward": 1}']),
        (["Answer: C"], [""], ['{"answer": "C", "choices": [1, null, "CC", "c"]}']),
        (["\x00\ud800Answer: C\uffff"], ["\ud800"], ["\ud800"]),
        ([("Answer: " + "(" * 50_000 + "\\boxed{" * 10_000) * 3], [""], [TRAIN_LABEL]),
        (["Answer: C" + "<|im_end|>" * 10_000], ["Answer"], [TRAIN_LABEL]),
        ([{"text": "Answer: C"}], [[""]], [[TRAIN_LABEL]]),
    ],
)
def test_garbage_never_raises(queries, prompts, labels):
    start = time.monotonic()
    out = reward.reward_func(queries, prompts, labels)
    assert time.monotonic() - start < 2.0
    assert set(out) == {"rewards", "scores", "extra_logs"}
    n = out["rewards"].shape[0]
    assert out["scores"].shape[0] == n and out["extra_logs"]["answer_found"].shape[0] == n
    assert all(v in (-1.0, 0.0, 1.0) for v in out["rewards"].tolist())


def test_huge_responses_are_bounded_in_time():
    huge = "Answer: A " * 1_000_000 + "\nAnswer: C"  # 10 MB
    start = time.monotonic()
    for _ in range(5):
        assert _one(huge, TRAIN_LABEL) == (1.0, 1.0, 1.0)
    assert time.monotonic() - start < 2.0


def _in_thread(fn, *args):
    return in_thread(fn, *args)[0]


def test_called_from_non_main_threads():
    results = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                _in_thread(reward.reward_func, [f"Answer: {'ABCD'[i % 4]}"], [""], [ACCURACY_LABEL])["rewards"].item()
            )
        )
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [0.0] * 6 + [1.0] * 2


def test_openrlhf_loads_the_file_and_scores_in_a_worker_thread():
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=str(REWARD_PATH))
    prompt = "<|im_start|>user\n" + EXPECTED_EVAL_PROMPT + "<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + "Drinking water relieves thirst.\nAnswer: A<|im_end|>"
    label = '{"answer": "A", "choices": ["A", "B", "C", "D", "E"], "reward": "accuracy"}'
    # asyncio.to_thread: the call happens in a worker thread, as in the rollout
    infos = asyncio.run(executor._fetch_rewards_via_func([query], [prompt], [label]))
    info = infos[0]
    assert set(info) == {"rewards", "scores", "extra_logs"}
    import torch

    # what OpenRLHF's samples generator does with them: one value per sample
    rewards, scores = torch.tensor([info["rewards"]]), torch.tensor([info["scores"]])
    assert rewards.shape == scores.shape == (1,)
    assert rewards.item() == 1.0 and scores.item() == 1.0
    assert info["extra_logs"]["answer_found"].item() == 1.0


def test_reward_file_runs_on_labels_from_build(built):
    """End to end: a row's prompt and label, a response, the reward."""
    _, evals, _ = built
    row = evals[-1]  # MMLU "Red Planet", answer D
    assert _one("Mars is red.\nAnswer: D", row["label"], row["prompt"]) == (1.0, 1.0, 1.0)
    assert _one("Answer: B", row["label"], row["prompt"]) == (0.0, 0.0, 1.0)
    assert _one("Answer: E", row["label"], row["prompt"]) == (0.0, 0.0, 0.0)  # MMLU has no E
