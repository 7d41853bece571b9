"""The reasoning-gym task: its data.py's build() (rows, splits, manifest) and reward.py (loaded as OpenRLHF loads it).

Ground truth comes from reasoning-gym itself: the items are regenerated with `create_dataset` at the
seeds the manifest records, and every expected score is the library's scorer called directly on the
library's own item. The hang tests use a task registered only in the reward's worker processes (a
module written here and named in OPENRLHF_BAND_GYM_REWARD_IMPORTS).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import reasoning_gym
import torch
from reasoning_gym.factory import DATASETS
from reward_files import in_thread, load_reward_file, one_value_per_sample, rewards_via_openrlhf

from openrlhf_band.tasks.reasoning_gym import data as gym_data
from openrlhf_band.tasks.reasoning_gym.data import GymDataError

REWARD_PATH = Path(__file__).resolve().parents[2] / "openrlhf_band" / "tasks" / "reasoning_gym" / "reward.py"
TIMEOUT_S = 1.0  # OPENRLHF_BAND_GYM_REWARD_TIMEOUT in the hang tests
DEADLINE_S = 2.0  # wall-clock bound asserted for a hanging sample (2 CPUs, a loaded machine)

# leg_counting / basic_arithmetic / chain_sum: the default scorer (exact, else len(oracle)/len(answer)
# when the oracle is a substring); gsm_symbolic: numeric with a 0.01 format credit; arc_agi: tuple grids
# in its metadata; prime_factorization: a scorer that raises on malformed answers.
TASKS = {
    "leg_counting": 2.0,
    "basic_arithmetic": 1.0,
    "chain_sum": 1.0,
    "gsm_symbolic": 1.0,
    "arc_agi": 0.5,
    "prime_factorization": 0.5,
}
SIZE, EVAL_SIZE, SEED = 36, 4, 11

HANG_PLUGIN = """
import signal
import time
from dataclasses import dataclass
from typing import Optional

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset


@dataclass
class HangConfig:
    seed: Optional[int] = None
    size: int = 10


class HangDataset(ProceduralDataset):
    def __init__(self, config):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx):
        return {"question": f"q{idx}", "answer": "1", "metadata": {}}

    def score_answer(self, answer, entry):
        if answer == "spin":  # a Python loop: the worker's own SIGALRM ends it
            while True:
                pass
        if answer == "swallow":  # swallows the interruption (a bare except), then answers
            try:
                while True:
                    pass
            except BaseException:
                return 1.0
        if answer == "stuck":  # deaf to SIGALRM, as code stuck in C: only the pool's kill ends it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(120)
        return 1.0 if answer == entry["answer"] else 0.0


reasoning_gym.register_dataset("band_test_hang", HangDataset, HangConfig)
"""


def _load(name="reward_func"):
    return load_reward_file(REWARD_PATH, name)


gym_reward = _load()


@pytest.fixture(scope="module", autouse=True)
def _pool(tmp_path_factory):
    plugin_dir = tmp_path_factory.mktemp("gym_plugin")
    (plugin_dir / "band_gym_hang_plugin.py").write_text(HANG_PLUGIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(plugin_dir))  # spawned workers start with the parent's sys.path
        mp.setenv("OPENRLHF_BAND_GYM_REWARD_IMPORTS", "band_gym_hang_plugin")
        assert gym_reward.warmup(120), "reasoning-gym scoring workers did not start"
        yield
        gym_reward.POOL.shutdown()


@pytest.fixture(scope="module")
def built():
    return gym_data.build(TASKS, SIZE, EVAL_SIZE, SEED, {})


def _library_items(manifest, split, task):
    """The items reasoning-gym itself generates at the seed the manifest records (first round)."""
    stats = manifest[split]["tasks"][task]
    dataset = reasoning_gym.create_dataset(task, size=stats["requested"], seed=stats["seeds"][0])
    return [dataset[i] for i in range(stats["requested"])]


@functools.cache
def _library_scorer(task):
    return reasoning_gym.get_score_answer_fn(task)  # arc_agi's takes ~0.5 s to build: once


def _library_score(task, answer, item):
    try:
        return float(_library_scorer(task)(answer, item))
    except Exception:  # some scorers raise on malformed answers; the reward scores those 0
        return 0.0


def _run(responses, labels, prompts=None):
    """(rewards, scores, extra_logs) lists of a batch, each query being prompt + response."""
    prompts = prompts or [""] * len(responses)
    out = gym_reward.reward_func([p + r for p, r in zip(prompts, responses)], prompts, labels)
    return out["rewards"].tolist(), out["scores"].tolist(), {k: v.tolist() for k, v in out["extra_logs"].items()}


def _hang_label(accuracy=False):
    label = {"task": "band_test_hang", "entry": {"question": "q0", "answer": "1", "metadata": {}}}
    if accuracy:
        label["reward"] = "accuracy"
    return json.dumps(label)


# ----------------------------------------------------------------------------- prompt and rows


def test_prompt_is_reasoning_gyms_default_system_prompt_then_the_question():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert gym_data.DEFAULT_SYSTEM_PROMPT == SYSTEM_PROMPTS["default"]
    assert "<answer>answer here</answer>" in gym_data.PROMPT_TEMPLATE
    prompt = gym_data.PROMPT_TEMPLATE.format(question="What is {x}?")
    assert prompt.startswith(SYSTEM_PROMPTS["default"]) and prompt.endswith("What is {x}?")


def test_rows_have_the_three_keys_and_serialise(built):
    train, evals, manifest = built
    for rows, accuracy in ((train, False), (evals, True)):
        for row in rows:
            assert set(row) == {"prompt", "label", "datasource"}
            assert row["datasource"] in TASKS
            assert json.loads(json.dumps(row, ensure_ascii=False)) == row
            label = json.loads(row["label"])
            assert label["task"] == row["datasource"]
            assert set(label["entry"]) == {"question", "answer", "metadata"}
            assert (label.get("reward") == "accuracy") is accuracy
            assert row["prompt"] == gym_data.PROMPT_TEMPLATE.format(question=label["entry"]["question"].strip())
    json.dumps(manifest)
    assert manifest["reasoning_gym_version"] == "0.1.25"
    assert manifest["keys"] == {"input_key": "prompt", "label_key": "label", "datasource_key": "datasource"}
    assert manifest["tasks"] == TASKS and manifest["seed"] == SEED and manifest["options"] == {}


def test_counts_follow_the_weights(built):
    train, evals, manifest = built
    expected = {"leg_counting": 12, "basic_arithmetic": 6, "chain_sum": 6, "gsm_symbolic": 6, "arc_agi": 3}
    expected["prime_factorization"] = 3
    counts = {task: sum(row["datasource"] == task for row in train) for task in TASKS}
    assert counts == expected and len(train) == SIZE
    assert {t: s["written"] for t, s in manifest["train"]["tasks"].items()} == expected
    assert all(sum(row["datasource"] == task for row in evals) == EVAL_SIZE for task in TASKS)
    assert manifest["train"]["rows"] == SIZE and manifest["eval"]["rows"] == EVAL_SIZE * len(TASKS)
    assert len({row["datasource"] for row in train[:12]}) > 1  # shuffled across tasks


@pytest.mark.parametrize(
    ("weights", "size", "expected"),
    [
        ({"a": 3, "b": 1, "c": 1}, 10, [6, 2, 2]),
        ({"a": 1, "b": 1, "c": 1}, 10, [4, 3, 3]),  # tie on the remainder: the order given
        ({"a": 1, "b": 2}, 10, [3, 7]),  # 3.33 / 6.67: the larger remainder gets the extra item
        ({"a": 100, "b": 1, "c": 1}, 3, [1, 1, 1]),  # every task at least 1
        ({"a": 100, "b": 1, "c": 1}, 2, [2, 0, 0]),  # fewer items than tasks
        ({"a": 1}, 0, [0]),
    ],
)
def test_largest_remainder_allocation(weights, size, expected):
    assert list(gym_data.allocate(weights, size).values()) == expected


def test_rows_are_reasoning_gyms_own_items(built):
    train, evals, manifest = built
    for split, rows in (("train", train), ("eval", evals)):
        for task in TASKS:
            entries = [gym_data.decode_json(json.loads(r["label"])["entry"]) for r in rows if r["datasource"] == task]
            library = _library_items(manifest, split, task)
            # the same items, tuples and all (training rows are shuffled across tasks: compare in order of question)
            assert sorted(entries, key=lambda e: e["question"]) == sorted(library, key=lambda e: e["question"])
            if split == "eval":
                assert entries == library


def test_deterministic_for_a_seed_different_for_another():
    small = {"leg_counting": 1, "basic_arithmetic": 1}
    first = gym_data.build(small, 8, 3, SEED, {})
    assert first == gym_data.build(small, 8, 3, SEED, {})
    other = gym_data.build(small, 8, 3, SEED + 1, {})
    assert {r["prompt"] for r in first[0]}.isdisjoint({r["prompt"] for r in other[0]})
    assert {r["prompt"] for r in first[1]}.isdisjoint({r["prompt"] for r in other[1]})


def test_no_question_is_shared_between_train_and_eval(built):
    train, evals, manifest = built

    def keys(rows):
        return [gym_data.question_key(json.loads(r["label"])["entry"]["question"]) for r in rows]

    train_keys, eval_keys = keys(train), keys(evals)
    assert len(set(train_keys)) == len(train_keys) and len(set(eval_keys)) == len(eval_keys)
    assert not set(train_keys) & set(eval_keys)
    assert manifest["eval"]["train_overlap_dropped"] == 0


def test_the_overlap_check_catches_an_overlap(monkeypatch):
    # negative control: eval drawn from the training seeds, as a seed mix-up would do
    real = gym_data.derive_seed
    monkeypatch.setattr(gym_data, "derive_seed", lambda seed, task, split, round_: real(seed, task, "train", round_))
    train, evals, manifest = gym_data.build({"leg_counting": 1}, 6, 6, SEED, {})
    stats = manifest["eval"]["tasks"]["leg_counting"]
    assert stats["train_overlap_dropped"] == 6  # round 0 repeats the 6 training items exactly
    assert stats["written"] == 6 and len(stats["seeds"]) == 2  # topped up from the next round
    train_q = {gym_data.question_key(json.loads(r["label"])["entry"]["question"]) for r in train}
    assert not train_q & {gym_data.question_key(json.loads(r["label"])["entry"]["question"]) for r in evals}


def test_duplicates_are_dropped_and_a_shortfall_is_counted():
    # one animal, one of it: about 40 distinct questions in all
    options = {"leg_counting": {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 1}}
    train, evals, manifest = gym_data.build({"leg_counting": 1}, 20, 60, SEED, options)
    for split, rows in (("train", train), ("eval", evals)):
        questions = [gym_data.question_key(json.loads(r["label"])["entry"]["question"]) for r in rows]
        assert len(set(questions)) == len(questions)
        stats = manifest[split]["tasks"]["leg_counting"]
        assert stats["written"] == len(rows) and stats["written"] + stats["shortfall"] == stats["requested"]
        assert stats["duplicates_dropped"] > 0 and len(stats["seeds"]) <= gym_data.MAX_ROUNDS
    assert manifest["eval"]["shortfall"] > 0 and manifest["eval"]["train_overlap_dropped"] > 0
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    assert len(train) == 20 and len(train) + len(evals) <= len(ANIMALS)


def test_options_reach_the_generator_and_the_scorer():
    options = gym_data.parse_options(["basic_arithmetic.min_terms=2", "basic_arithmetic.max_terms=2"])
    assert options == {"basic_arithmetic": {"min_terms": 2, "max_terms": 2}}
    train, _, manifest = gym_data.build({"basic_arithmetic": 1}, 12, 0, SEED, options)
    default, _, _ = gym_data.build({"basic_arithmetic": 1}, 12, 0, SEED, {})
    labels = [json.loads(r["label"]) for r in train]
    assert {lab["entry"]["metadata"]["num_terms"] for lab in labels} == {2}
    assert max(json.loads(r["label"])["entry"]["metadata"]["num_terms"] for r in default) > 2
    assert all(lab["config"] == {"min_terms": 2, "max_terms": 2} for lab in labels)
    assert manifest["options"] == options
    stats = manifest["train"]["tasks"]["basic_arithmetic"]
    library = reasoning_gym.create_dataset(
        "basic_arithmetic", size=12, seed=stats["seeds"][0], min_terms=2, max_terms=2
    )
    assert sorted(lab["entry"]["question"] for lab in labels) == sorted(library[i]["question"] for i in range(12))


def test_the_scorer_is_built_with_the_tasks_options():
    # puzzle24's scorer checks the numbers against its config's range: the default config would accept 8
    options = {"puzzle24": {"min_value": 1, "max_value": 6}}
    train, _, _ = gym_data.build({"puzzle24": 1}, 1, 0, SEED, options, allow_executing_scorers=True)
    label = json.loads(train[0]["label"])
    item = gym_data.decode_json(label["entry"])
    configured = reasoning_gym.create_dataset("puzzle24", size=1, seed=0, min_value=1, max_value=6).score_answer
    assert configured("8*3*1*1", item) < 1.0 == _library_scorer("puzzle24")("8*3*1*1", item)
    _, scores, _ = _run(["<answer>8*3*1*1</answer>", f"<answer>{item['answer']}</answer>"], [train[0]["label"]] * 2)
    assert scores == pytest.approx([configured("8*3*1*1", item), 1.0])


# ----------------------------------------------------------------------------- errors


def test_unknown_task_names_close_matches():
    with pytest.raises(GymDataError) as err:
        gym_data.parse_tasks("leg_counting,basic_arithmetc")
    message = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in message
    assert "basic_arithmetc" in message and "basic_arithmetic" in message and "DATASETS" in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("leg_counting,leg_counting:2", "twice"),
        ("leg_counting:0", "positive"),
        ("leg_counting:-1", "positive"),
        ("leg_counting:nan", "positive"),
        ("leg_counting:inf", "positive"),
        ("leg_counting:two", "positive"),
        ("", "expected"),
        ("leg_counting,", "empty"),
    ],
)
def test_bad_task_specs(spec, fragment):
    with pytest.raises(GymDataError, match=fragment):
        gym_data.parse_tasks(spec)


def test_task_spec_weights():
    assert gym_data.parse_tasks(" leg_counting:2.5, chain_sum ") == {"leg_counting": 2.5, "chain_sum": 1.0}


def test_option_values_parse_as_json_else_string():
    options = gym_data.parse_options(
        [
            "basic_arithmetic.max_terms=3",
            'basic_arithmetic.operators=["+", "-"]',
            "basic_arithmetic.format_style=natural",
        ]
    )
    assert options == {"basic_arithmetic": {"max_terms": 3, "operators": ["+", "-"], "format_style": "natural"}}
    assert gym_data.parse_options([]) == {} and gym_data.parse_options(None) == {}


def test_unknown_option_names_the_accepted_keys():
    import dataclasses

    with pytest.raises(GymDataError) as err:
        gym_data.parse_options(["basic_arithmetic.max_term=3"])
    message = str(err.value)
    assert "\n" not in message and "max_term" in message
    accepted = [f.name for f in dataclasses.fields(DATASETS["basic_arithmetic"][1]) if f.name not in ("seed", "size")]
    assert all(key in message for key in accepted)
    with pytest.raises(GymDataError, match="accepted"):  # build() checks a dict passed directly, too
        gym_data.build({"chain_sum": 1}, 2, 0, 0, {"chain_sum": {"nope": 1}})


@pytest.mark.parametrize(
    "values",
    [["basic_arithmetic.seed=3"], ["max_terms=3"], ["basic_arithmetic=3"], ["basic_arith.max_terms=3"]],
)
def test_bad_options(values):
    with pytest.raises(GymDataError):
        gym_data.parse_options(values)


@pytest.mark.parametrize(
    ("tasks", "size", "eval_size", "options", "fragment"),
    [
        ({"basic_arithmetic": 1}, 4, 0, {"basic_arithmetic": {"min_terms": 5, "max_terms": 2}}, "max_terms"),
        ({"basic_arithmetic": 1}, 4, 0, {"chain_sum": {"max_terms": 2}}, "not among the tasks"),
        ({"basic_arithmetic": 1}, -1, 0, {}, "non-negative"),
        ({"basic_arithmetic": 1}, 4, 1.5, {}, "non-negative"),
        ({}, 4, 0, {}, "no reasoning-gym task"),
        ({"nope": 1}, 4, 0, {}, "unknown"),
    ],
)
def test_build_rejects_bad_arguments_before_generating(tasks, size, eval_size, options, fragment):
    with pytest.raises(GymDataError, match=fragment) as err:
        gym_data.build(tasks, size, eval_size, 0, options)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- labels keep the metadata


@pytest.mark.parametrize("task", ["arc_agi", "graph_color", "knights_knaves", "codeio", "advanced_geometry"])
def test_labels_restore_tuples_and_int_keys(task):
    item = reasoning_gym.create_dataset(task, size=1, seed=3)[0]
    label = gym_data._label(task, item, {}, accuracy=False)
    assert label is not None
    assert gym_data.decode_json(json.loads(label)["entry"]) == item


def test_plain_json_would_break_arc_scoring():
    # negative control for the tagged encoding: arc_agi compares the answer grid with a tuple of tuples
    item = reasoning_gym.create_dataset("arc_agi", size=1, seed=3)[0]
    plain = json.loads(json.dumps(item))
    scorer = _library_scorer("arc_agi")
    assert plain != item and scorer(item["answer"], plain) < 1.0 == scorer(item["answer"], item)
    _, scores, _ = _run([f"<answer>{item['answer']}</answer>"], [gym_data._label("arc_agi", item, {}, False)])
    assert scores == [1.0]


def test_encode_json_round_trips_odd_shapes():
    value = {"t": (1, (2, 3)), "m": {1: "a", (0, 1): [()]}, "__tuple__": 1, "l": [{"__map__": 2}]}
    assert gym_data.decode_json(json.loads(json.dumps(gym_data.encode_json(value)))) == value
    with pytest.raises(TypeError):
        gym_data.encode_json({"x": {1, 2}})


# ----------------------------------------------------------------------------- the reward


def test_library_scores_for_correct_wrong_and_missing_answers(built):
    train, evals, manifest = built
    responses, labels, expected = [], [], []
    for split, rows in (("train", train), ("eval", evals)):
        for task in TASKS:
            library = {item["question"]: item for item in _library_items(manifest, split, task)}
            for row in [r for r in rows if r["datasource"] == task][:2]:
                item = library[json.loads(row["label"])["entry"]["question"]]
                oracle = item["answer"]
                candidates = [oracle, f"{oracle} legs", f"The answer is {oracle}", oracle + "1", "wrong", "-7"]
                for answer in candidates:
                    responses.append(f"Let me think.\n<answer>{answer}</answer>")
                    labels.append(row["label"])
                    expected.append((split, _library_score(task, answer, item), 1.0))
                responses.append(f"It is {oracle}.")  # no tags: no answer
                labels.append(row["label"])
                expected.append((split, 0.0, 0.0))
    rewards, scores, logs = _run(responses, labels)
    for (split, score, found), reward_value, score_value, found_value, timeout in zip(
        expected, rewards, scores, logs["answer_found"], logs["score_timeout"]
    ):
        assert score_value == pytest.approx(score, abs=1e-6)
        assert reward_value == pytest.approx(score if split == "eval" else 2 * score - 1, abs=1e-6)
        assert (found_value, timeout) == (found, 0.0)
    # the oracle answer scores 1 on every task (reward +1 in training, accuracy 1 in eval)
    correct = [i for i, r in enumerate(responses) if expected[i][1] == 1.0]
    assert len(correct) >= 2 * 2 * len(TASKS)
    assert 0.0 < min(s for s in scores if s > 0) < 1.0  # partial credit exists and passes through


def test_chat_template_and_prompt_prefix_in_the_query(built):
    row = next(r for r in built[0] if r["datasource"] == "leg_counting")
    answer = json.loads(row["label"])["entry"]["answer"]
    prompt = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    rewards, _, logs = _run(
        [
            f"<think>count</think>\n<answer>{answer}</answer><|im_end|>",
            "<answer>1</answer> no, wait: <answer> " + answer + " </answer><|im_end|>",  # the last one, stripped
            "I cannot tell.<|im_end|>",  # the prompt's own <answer>answer here</answer> is not the response's
            f"<answer>{answer}<|im_end|>",  # unclosed
            "<answer></answer><|im_end|>",  # empty
        ],
        [row["label"]] * 5,
        [prompt] * 5,
    )
    assert rewards == [1.0, 1.0, -1.0, -1.0, -1.0]
    assert logs["answer_found"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    # a decode that does not reproduce the prompt's beginning (BOS, left truncation): its tail still matches
    out = gym_reward.reward_func(["<s>" + prompt[40:] + "No idea."], [prompt], [row["label"]])
    assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["answer_found"].tolist() == [0.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>5</answer>", "5"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("<answer>a <answer>b</answer>", "b"),  # the innermost opening before the last closing tag
        ("<answer>\n  x y \n</answer>\n", "x y"),
        ("<answer>7</answer><｜end▁of▁sentence｜>", "7"),
        ("<answer>8<|im_end|></answer>", "8"),
        ("<answer>" + "1" * gym_reward.MAX_ANSWER_CHARS + "</answer>", "1" * gym_reward.MAX_ANSWER_CHARS),
    ],
)
def test_extract_answer(text, expected):
    assert gym_reward.extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "5",
        "<answer>5",
        "5</answer>",
        "<answer> </answer>",
        gym_data.PROMPT_TEMPLATE.format(question="1+1?"),
        "<answer>" + "1" * 20_001 + "</answer>",
        None,
        3,
    ],
)
def test_no_answer(text):
    assert gym_reward.extract_answer(text) is None


def test_an_overlong_answer_scores_as_no_answer(built):
    row = next(r for r in built[0] if r["datasource"] == "chain_sum")
    answer = json.loads(row["label"])["entry"]["answer"]
    rewards, _, logs = _run([f"<answer>{answer}{' ' * gym_reward.MAX_ANSWER_CHARS}x</answer>"], [row["label"]])
    assert rewards == [-1.0] and logs["answer_found"] == [0.0]


def test_batch_output_types_and_shapes(built):
    row = built[1][0]
    answer = gym_data.decode_json(json.loads(row["label"])["entry"])["answer"]
    out = gym_reward.reward_func(
        [f"<answer>{answer}</answer>", "nothing", "<answer>zzz</answer>"], [""] * 3, [row["label"]] * 3
    )
    assert set(out) == {"rewards", "scores", "extra_logs"}
    assert set(out["extra_logs"]) == {"answer_found", "score_timeout"}
    for tensor in (out["rewards"], out["scores"], *out["extra_logs"].values()):
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and tensor.shape == (3,)
    assert out["rewards"][:2].tolist() == [1.0, 0.0]  # an eval (accuracy) label: 0/1, not -1


def test_openrlhf_loads_the_file_and_gets_a_one_element_tensor_per_sample(built, monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_GYM_REWARD_WORKERS", "1")  # this copy of the file starts its own pool
    row = next(r for r in built[0] if r["datasource"] == "gsm_symbolic")
    answer = json.loads(row["label"])["entry"]["answer"]
    prompt = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + f"Step by step.\n<answer>{answer}</answer><|im_end|>"
    (info,) = rewards_via_openrlhf(REWARD_PATH, [query], [prompt], [row["label"]])
    assert one_value_per_sample(info) == (1.0, 1.0)


@pytest.mark.parametrize(
    "label",
    [
        None,
        42,
        "",
        "5",
        "not json",
        "{}",
        "[]",
        '{"task": "no_such_task", "entry": {"question": "q", "answer": "1", "metadata": {}}}',
        '{"task": "chain_sum", "entry": "x"}',
        '{"task": "chain_sum", "entry": {}}',  # the scorer raises KeyError
        '{"task": 3, "entry": {}, "reward": "accuracy"}',
        '{"task": "chain_sum", "config": {"bogus": 1}, "entry": {"answer": "1"}}',
        "[" * 100_000 + "]" * 100_000,
        "x" * (gym_reward.MAX_LABEL_CHARS + 1),
        {"task": "chain_sum", "entry": {"question": "q", "answer": "2", "metadata": {}}},  # a dict column
    ],
)
def test_garbage_labels_never_raise(label):
    (reward_value,), (score,), _ = _run(["<answer>1</answer>"], [label])
    accuracy = isinstance(label, str) and '"accuracy"' in label
    assert score == 0.0 and reward_value == (0.0 if accuracy else -1.0)


def test_non_string_queries_and_short_lists_never_raise(built):
    label = built[0][0]["label"]
    out = gym_reward.reward_func([None, 7, b"<answer>1</answer>", "<answer>1</answer>"], [None, 3], [label])
    assert out["rewards"].shape == (4,) and out["rewards"][:3].tolist() == [-1.0, -1.0, -1.0]
    assert gym_reward.reward_func([], [], [])["rewards"].shape == (0,)
    assert gym_reward.reward_func(None, None, None)["rewards"].shape == (0,)


# ----------------------------------------------------------------------------- bounded time


def test_the_hang_task_scores_normally():
    # registered only in the workers (OPENRLHF_BAND_GYM_REWARD_IMPORTS), never in this process
    assert "band_test_hang" not in DATASETS
    rewards, scores, logs = _run(["<answer>1</answer>", "<answer>2</answer>"], [_hang_label()] * 2)
    assert (rewards, scores, logs["score_timeout"]) == ([1.0, -1.0], [1.0, 0.0], [0.0, 0.0])


@pytest.mark.parametrize("answer", ["spin", "swallow"])
def test_a_python_hang_is_interrupted_in_the_worker(answer, monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_GYM_REWARD_TIMEOUT", str(TIMEOUT_S))
    assert gym_reward.warmup(120)
    before = gym_reward.POOL.current.worker_pids()
    out, seconds = in_thread(gym_reward.reward_func, [f"<answer>{answer}</answer>"], [""], [_hang_label()])
    assert seconds < DEADLINE_S, f"{seconds:.2f} s"
    assert out["rewards"].tolist() == [-1.0] and out["scores"].tolist() == [0.0]
    assert out["extra_logs"]["score_timeout"].tolist() == [1.0]
    assert gym_reward.POOL.current.worker_pids() == before  # the worker interrupted itself: nobody was killed


def test_a_scorer_deaf_to_signals_is_killed_at_the_deadline(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_GYM_REWARD_TIMEOUT", str(TIMEOUT_S))
    assert gym_reward.warmup(120)
    before = gym_reward.POOL.current.worker_pids()
    out, seconds = in_thread(gym_reward.reward_func, ["<answer>stuck</answer>"], [""], [_hang_label(accuracy=True)])
    assert seconds < DEADLINE_S, f"{seconds:.2f} s"
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["score_timeout"].tolist() == [1.0]
    assert gym_reward.warmup(120)  # pebble replaced the killed worker
    assert len(before - gym_reward.POOL.current.worker_pids()) == 1
    assert _run(["<answer>1</answer>"], [_hang_label()])[0] == [1.0]


def test_a_real_scorer_on_a_huge_expression_returns_in_time(monkeypatch):
    # puzzle24 hands the answer to sympy's parse_expr, which evaluates 9**9**9**9 (in C): a hard kill
    monkeypatch.setenv("OPENRLHF_BAND_GYM_REWARD_TIMEOUT", str(TIMEOUT_S))
    assert gym_reward.warmup(120)
    item = reasoning_gym.create_dataset("puzzle24", size=1, seed=1)[0]
    label = gym_data._label("puzzle24", item, {}, accuracy=False)
    out, seconds = in_thread(gym_reward.reward_func, ["<answer>9**9**9**9</answer>"], [""], [label])
    assert seconds < DEADLINE_S, f"{seconds:.2f} s"
    assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["score_timeout"].tolist() == [1.0]
    assert gym_reward.warmup(120)


def test_workers_are_pickled_by_their_importable_name():
    # OpenRLHF loads the file as "reward_func"; the workers must run the package module's functions
    assert gym_reward.__name__ == "reward_func" and gym_reward.WORKER_MODULE in sys.modules
    assert gym_reward.warmup(120)
    assert gym_reward.POOL.current.worker.__name__ == gym_reward.WORKER_MODULE
    assert gym_reward.POOL.current.worker.score.__module__ == gym_reward.WORKER_MODULE


def test_scorers_that_run_the_answer_as_code_are_refused_unless_allowed():
    """Their scorer evals the model's answer (or parses it with sympy's parse_expr, which evals): refused by
    default, named in the manifest when allowed."""
    assert set(gym_data.EXECUTING_SCORERS) <= set(reasoning_gym.factory.DATASETS)
    with pytest.raises(gym_data.GymDataError, match="allow-executing-scorers") as err:
        gym_data.build({"puzzle24": 1, "chain_sum": 1}, 2, 0, SEED)
    assert "puzzle24" in str(err.value) and "chain_sum" not in str(err.value)
    _, _, manifest = gym_data.build({"puzzle24": 1, "chain_sum": 1}, 2, 0, SEED, allow_executing_scorers=True)
    assert manifest["executing_scorers"] == ["puzzle24"]
    _, _, manifest = gym_data.build({"chain_sum": 1}, 1, 0, SEED)
    assert "executing_scorers" not in manifest


@pytest.mark.parametrize("task", ["string_insertion", "puzzle24"])
def test_an_executing_scorer_does_run_the_answer(task, tmp_path):
    """Why the refusal: the library's own scorer executes what the model wrote."""
    marker = tmp_path / "ran"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    item = reasoning_gym.create_dataset(task, size=1, seed=0)[0]
    try:
        _library_scorer(task)(payload, item)
    except Exception:
        pass
    assert marker.exists()
