"""Few-shot chat prompts of the reasoning-gym task: `gym_data.build(..., shots=K)` and `prepare-data --shots K`.

With K > 0 a row's prompt is K solved items of its task (user: question, assistant: `<answer>ANSWER</answer>`)
then the row's question as the last user turn. Ground truth is reasoning-gym itself: the shown items are
regenerated with `create_dataset` at the shots' derived seed. Also: the shown questions are in neither split,
the CLI wiring (and its refusal with the other sources), the gym reward on a query built from a chat prompt,
and OpenRLHF's own `preprocess_data` on a shots row (with the tiny offline tokenizer of
studies/cpu_engine/assets.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import reasoning_gym
from openrlhf.datasets.prompts_dataset import preprocess_data
from reward_files import load_reward_file

from openrlhf_band.tasks.reasoning_gym import data as gym_data
from openrlhf_band.tasks.reasoning_gym.data import GymDataError

REPO = Path(__file__).resolve().parents[2]
REWARD_PATH = REPO / "openrlhf_band" / "tasks" / "reasoning_gym" / "reward.py"
ASSETS_PATH = REPO / "studies" / "cpu_engine" / "assets.py"

TASKS = {"chain_sum": 1.0, "basic_arithmetic": 1.0}
SIZE, EVAL_SIZE, SEED, SHOTS = 8, 3, 11, 2
# leg_counting with one animal, one of it: 37 distinct questions in all (overlaps and shortages happen)
NARROW = {"leg_counting": {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 1}}


@pytest.fixture(scope="module")
def built():
    return gym_data.build(TASKS, SIZE, EVAL_SIZE, SEED, {}, shots=SHOTS)


def _question(row: dict) -> str:
    return json.loads(row["label"])["entry"]["question"]


def _keys(rows: list[dict]) -> set[str]:
    return {gym_data.question_key(_question(row)) for row in rows}


def _shot_keys(manifest: dict, task: str) -> set[str]:
    return {gym_data.question_key(content) for content in manifest["shots"][task][0::2]}


def _library_shots(task: str, shots: int, seed: int, options: dict | None = None) -> list[dict]:
    """The first `shots` distinct items reasoning-gym generates at the shots' derived seed."""
    dataset = reasoning_gym.create_dataset(
        task, size=4 * shots + 8, seed=gym_data.derive_seed(seed, task, "shots", 0), **(options or {})
    )
    items, seen = [], set()
    for item in dataset:
        key = gym_data.question_key(item["question"])
        if key not in seen and len(items) < shots:
            seen.add(key)
            items.append(item)
    return items


# ----------------------------------------------------------------------------- the prompt


def test_every_prompt_is_the_tasks_solved_turns_then_its_question(built):
    train, evals, manifest = built
    for rows in (train, evals):
        assert {row["datasource"] for row in rows} == set(TASKS)
        for row in rows:
            prompt = row["prompt"]
            assert isinstance(prompt, list) and len(prompt) == 2 * SHOTS + 1
            assert [m["role"] for m in prompt] == ["user", "assistant"] * SHOTS + ["user"]
            assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in prompt)
            assert prompt[-1]["content"] == _question(row).strip()
            # the same turns for every row of the task: the manifest's
            assert [m["content"] for m in prompt[:-1]] == manifest["shots"][row["datasource"]]
            assert json.loads(json.dumps(row)) == row
    assert manifest["prompt_template"] != gym_data.PROMPT_TEMPLATE
    assert set(manifest["shots"]) == set(TASKS)
    json.dumps(manifest)


def test_the_shown_items_are_reasoning_gyms_own_at_their_own_seed(built):
    _, _, manifest = built
    for task in TASKS:
        items = _library_shots(task, SHOTS, SEED)
        expected = []
        for item in items:
            expected += [item["question"].strip(), f"<answer>{item['answer']}</answer>"]
        assert manifest["shots"][task] == expected
        # what the reward reads back from an assistant turn is the oracle answer, which scores 1
        scorer = reasoning_gym.get_score_answer_fn(task)
        for item, reply in zip(items, expected[1::2]):
            assert scorer(reply.removeprefix("<answer>").removesuffix("</answer>"), item) == 1.0
        shots_seed = gym_data.derive_seed(SEED, task, "shots", 0)
        assert shots_seed not in manifest["train"]["tasks"][task]["seeds"] + manifest["eval"]["tasks"][task]["seeds"]
    assert manifest["shots"]["chain_sum"] != manifest["shots"]["basic_arithmetic"]


def test_the_shown_items_depend_on_the_seed_not_on_the_sizes(built):
    _, _, manifest = built
    _, _, other_sizes = gym_data.build(TASKS, 3, 1, SEED, {}, shots=SHOTS)
    assert other_sizes["shots"] == manifest["shots"]
    _, _, more = gym_data.build(TASKS, 3, 1, SEED, {}, shots=SHOTS + 1)
    for task in TASKS:  # one more shot: the same first ones, then the next distinct item
        assert more["shots"][task][: 2 * SHOTS] == manifest["shots"][task]
    _, _, other_seed = gym_data.build(TASKS, 3, 1, SEED + 1, {}, shots=SHOTS)
    assert all(other_seed["shots"][task] != manifest["shots"][task] for task in TASKS)


def test_deterministic(built):
    assert gym_data.build(TASKS, SIZE, EVAL_SIZE, SEED, {}, shots=SHOTS) == built


def test_shots_change_the_prompt_and_nothing_else(built):
    train, evals, manifest = built
    plain_train, plain_evals, plain_manifest = gym_data.build(TASKS, SIZE, EVAL_SIZE, SEED, {})
    for split in ("train", "eval"):  # nothing was dropped for the shots here: the same items at the same seeds
        assert all(s["shots_overlap_dropped"] == 0 for s in manifest[split]["tasks"].values())
        assert manifest[split] == plain_manifest[split]
    for rows, plain in ((train, plain_train), (evals, plain_evals)):
        assert [(r["label"], r["datasource"]) for r in rows] == [(r["label"], r["datasource"]) for r in plain]
        for row, plain_row in zip(rows, plain):
            assert plain_row["prompt"] == gym_data.PROMPT_TEMPLATE.format(question=row["prompt"][-1]["content"])


def test_zero_shots_keeps_the_plain_prompt():
    train, evals, manifest = gym_data.build({"chain_sum": 1}, 3, 2, SEED, {}, shots=0)
    for row in train + evals:
        assert row["prompt"] == gym_data.PROMPT_TEMPLATE.format(question=_question(row).strip())
    assert manifest["shots"] == {} and manifest["prompt_template"] == gym_data.PROMPT_TEMPLATE
    assert gym_data.build({"chain_sum": 1}, 3, 2, SEED, {}) == (train, evals, manifest)  # the default


@pytest.mark.parametrize("shots", [-1, -5])
def test_negative_shots_are_refused(shots):
    with pytest.raises(GymDataError, match="--shots") as err:
        gym_data.build({"chain_sum": 1}, 2, 1, SEED, {}, shots=shots)
    assert "\n" not in str(err.value)


def test_a_task_with_too_few_distinct_items_for_the_shots_is_refused():
    with pytest.raises(GymDataError, match="fewer than 45 distinct items") as err:
        gym_data.build({"leg_counting": 1}, 2, 1, SEED, NARROW, shots=45)
    assert "leg_counting" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- held out from both splits


def test_the_shown_questions_are_in_neither_split(built):
    train, evals, manifest = built
    for task in TASKS:
        shown = _shot_keys(manifest, task)
        assert len(shown) == SHOTS
        assert not shown & _keys(train) and not shown & _keys(evals)


def test_the_shown_questions_are_dropped_from_a_small_item_space():
    # 37 questions in all: the splits draw some of the shown ones, which must be dropped (and counted)
    train, evals, manifest = gym_data.build({"leg_counting": 1}, 10, 10, SEED, NARROW, shots=5)
    shown = _shot_keys(manifest, "leg_counting")
    assert len(shown) == 5
    assert not shown & _keys(train) and not shown & _keys(evals)
    assert not _keys(train) & _keys(evals)
    assert manifest["train"]["tasks"]["leg_counting"]["shots_overlap_dropped"] > 0
    assert len(train) == 10 and len(evals) == 10  # topped up from further rounds


def _draw_from_the_shots_seed(monkeypatch, drawn: str) -> None:
    """Split `drawn` generated from the shots' seeds (its round 0 starts with the shown items)."""
    real = gym_data.derive_seed

    def mixed_up(seed, task, split, round_):
        return real(seed, task, "shots" if split == drawn else split, round_)

    monkeypatch.setattr(gym_data, "derive_seed", mixed_up)


def test_training_items_that_are_shown_are_dropped_and_topped_up(monkeypatch):
    # negative control: training drawn from the shots' seed, as a seed mix-up would do
    _draw_from_the_shots_seed(monkeypatch, "train")
    train, _, manifest = gym_data.build({"chain_sum": 1}, 6, 0, SEED, {}, shots=SHOTS)
    stats = manifest["train"]["tasks"]["chain_sum"]
    assert stats["shots_overlap_dropped"] == SHOTS  # round 0 starts with the shown items
    assert stats["written"] == 6 and stats["shortfall"] == 0 and len(stats["seeds"]) == 2
    assert not _shot_keys(manifest, "chain_sum") & _keys(train)


def _eval_from_the_shots_seed(monkeypatch):
    _draw_from_the_shots_seed(monkeypatch, "eval")
    return gym_data.build({"chain_sum": 1}, 4, 5, SEED, {}, shots=SHOTS)


def test_eval_items_that_are_shown_are_dropped_and_topped_up(monkeypatch):
    _, evals, manifest = _eval_from_the_shots_seed(monkeypatch)
    stats = manifest["eval"]["tasks"]["chain_sum"]
    assert stats["shots_overlap_dropped"] == SHOTS
    assert stats["written"] == 5 and stats["shortfall"] == 0
    assert not _shot_keys(manifest, "chain_sum") & _keys(evals)


def test_eval_items_that_are_shown_are_counted_as_shots_overlap(monkeypatch):
    _, _, manifest = _eval_from_the_shots_seed(monkeypatch)
    stats = manifest["eval"]["tasks"]["chain_sum"]
    assert (stats["shots_overlap_dropped"], stats["train_overlap_dropped"]) == (SHOTS, 0)


# ----------------------------------------------------------------------------- prepare-data --shots


# `prepare`: tests/tasks/conftest.py


def test_prepare_data_shots_writes_the_chat_rows(prepare, tmp_path):
    out = tmp_path / "gym"
    status, _, stderr = prepare(
        "--source", "reasoning-gym", "--tasks", "chain_sum,basic_arithmetic", "--size", str(SIZE),
        "--eval-size", str(EVAL_SIZE), "--seed", str(SEED), "--shots", str(SHOTS), "--out", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    manifest = json.loads((out / "manifest.json").read_text())
    expected_train, expected_evals, expected_manifest = gym_data.build(TASKS, SIZE, EVAL_SIZE, SEED, {}, shots=SHOTS)
    assert train == expected_train and evals == expected_evals
    assert manifest["shots"] == expected_manifest["shots"] and manifest["task"] == "reasoning-gym"
    assert all(isinstance(row["prompt"], list) and len(row["prompt"]) == 2 * SHOTS + 1 for row in train + evals)


@pytest.mark.parametrize(
    ("argv", "task"),
    [([], "math"), (["--source", "math"], "math"), (["--source", "code"], "code"), (["--source", "mc"], "mc")],
)
def test_prepare_data_refuses_shots_for_another_source(prepare, tmp_path, argv, task):
    out = tmp_path / "out"
    status, stdout, stderr = prepare(*argv, "--shots", "2", "--out", str(out))
    assert status == 1 and stdout == ""
    assert stderr == f"openrlhf-band prepare-data: error: --shots is for --source reasoning-gym, not {task}\n"
    assert not out.exists()


def test_prepare_data_refuses_negative_shots(prepare, tmp_path):
    out = tmp_path / "out"
    status, stdout, stderr = prepare(
        "--source", "reasoning-gym", "--tasks", "chain_sum", "--size", "2", "--shots", "-1", "--out", str(out)
    )
    assert status == 1 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("openrlhf-band prepare-data: error: --shots -1")
    assert not out.exists()


# ----------------------------------------------------------------------------- OpenRLHF's chat template and the reward


@pytest.fixture(scope="module")
def tokenizer(built):
    """studies/cpu_engine/assets.py's byte-level BPE with a ChatML template, trained here (no download)."""
    spec = importlib.util.spec_from_file_location("cpu_engine_assets_for_shots", ASSETS_PATH)
    assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assets)
    texts = [m["content"] for row in built[0] + built[1] for m in row["prompt"]]
    return assets.build_tokenizer(texts)


def _chatml(messages: list[dict]) -> str:
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def test_openrlhf_preprocess_data_renders_the_shots_as_chat_turns(built, tokenizer):
    row = built[0][0]
    before = json.loads(json.dumps(row))
    prompt, label = preprocess_data(
        row, input_key="prompt", label_key="label", apply_chat_template=tokenizer.apply_chat_template
    )
    assert prompt == _chatml(row["prompt"]) and label == row["label"]
    assert prompt.count("<|im_start|>user\n") == SHOTS + 1 and prompt.count("<|im_start|>assistant\n") == SHOTS + 1
    assert prompt.endswith(f"{_question(row).strip()}<|im_end|>\n<|im_start|>assistant\n")
    assert row == before  # OpenRLHF copies the messages before touching them
    # a plain prompt (shots 0) is one user turn
    plain = {"prompt": gym_data.PROMPT_TEMPLATE.format(question="Q?")}
    rendered, _ = preprocess_data(plain, input_key="prompt", apply_chat_template=tokenizer.apply_chat_template)
    assert rendered == _chatml([{"role": "user", "content": plain["prompt"]}])
    # the tokenizer round-trips the rendered prompt (what the reward gets back as the query's prefix)
    assert tokenizer.decode(tokenizer(prompt)["input_ids"]) == prompt


@pytest.fixture(scope="module")
def gym_reward():
    """The reward file loaded as OpenRLHF loads it, with one scoring worker (started once: ~4 s)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENRLHF_BAND_GYM_REWARD_WORKERS", "1")
        reward = load_reward_file(REWARD_PATH, "reward_func")
        assert reward.warmup(120), "reasoning-gym scoring workers did not start"
        yield reward
        reward.POOL.shutdown()


def test_the_reward_scores_the_reply_not_the_shown_answers(built, tokenizer, gym_reward):
    train, evals, _ = built
    checked = 0
    for row, accuracy in ((train[0], False), (evals[0], True)):
        prompt, _ = preprocess_data(row, input_key="prompt", apply_chat_template=tokenizer.apply_chat_template)
        entry = gym_data.decode_json(json.loads(row["label"])["entry"])
        answer = entry["answer"]
        shown_answers = [m["content"].removeprefix("<answer>").removesuffix("</answer>") for m in row["prompt"][1::2]]
        shown = next(a for a in reversed(shown_answers) if a != answer)
        assert f"<answer>{shown}</answer>" in prompt
        wrong_score = float(reasoning_gym.get_score_answer_fn(row["datasource"])(shown, entry))
        replies = [
            f"<answer>{answer}</answer><|im_end|>",
            f"Adding up.\n<answer> {answer} </answer><|im_end|>",
            "I do not know.<|im_end|>",  # the prompt's <answer> turns are not the reply's
            f"<answer>{shown}</answer><|im_end|>",  # a shown item's answer, copied: scored as the library does
        ]
        out = gym_reward.reward_func([prompt + reply for reply in replies], [prompt] * 4, [row["label"]] * 4)
        scores = out["scores"].tolist()
        assert scores == pytest.approx([1.0, 1.0, 0.0, wrong_score])
        expected_rewards = scores if accuracy else [2 * s - 1 for s in scores]
        assert out["rewards"].tolist() == pytest.approx(expected_rewards)
        assert out["extra_logs"]["answer_found"].tolist() == [1.0, 1.0, 0.0, 1.0]
        assert out["extra_logs"]["score_timeout"].tolist() == [0.0] * 4
        # a decode that does not reproduce the prompt's beginning (BOS, left truncation): still the reply only
        out = gym_reward.reward_func(["<s>" + prompt[40:] + "No idea.<|im_end|>"], [prompt], [row["label"]])
        assert out["extra_logs"]["answer_found"].tolist() == [0.0]
        assert out["scores"].tolist() == [0.0]
        checked += 1
    assert checked == 2
