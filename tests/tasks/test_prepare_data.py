"""`openrlhf-band prepare-data` on small fixtures in the hub datasets' own formats, and without hub access.

The fixtures (tests/fixtures/data/) hold a few rows each with the hub datasets' column names:
DAPO-Math-17k (chat `prompt` with the DAPO instruction, `reward_model.ground_truth`), MATH
(`problem`, `level`, `type`, `solution`), AIME 2024 / AIME 2025 (`problem`, `answer`) and AMC 2023
(`question`, float `answer`). Expected values below are written out by hand, not computed with the module.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from openrlhf_band.tasks.math import data

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"
FIXTURE_SOURCES = {
    "dapo": FIXTURES / "dapo_math_17k.jsonl",
    "math": FIXTURES / "hendrycks_math_train.jsonl",
    "aime24": FIXTURES / "aime_2024.jsonl",
    "aime25": FIXTURES / "aime25.jsonl",
    "amc23": FIXTURES / "amc23.jsonl",
}

EXPECTED_PROMPT_A = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "Let $x$ be a positive integer such that $x^2 - 2x = 1088$. Find $x$.\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _prepare(out: Path, sources: dict[str, Path], *extra: str) -> int:
    """`openrlhf-band prepare-data` (math, the default task) through the real CLI entry; its exit status."""
    from openrlhf_band.tools import cli

    argv = ["prepare-data", "--out", str(out)]
    for name, path in sources.items():
        argv += ["--source", f"{name}={path}"]
    return cli.main(argv + list(extra))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _problem(prompt: str) -> str:
    head, tail = "the answer to the problem.\n\n", '\n\nRemember to put your answer on its own line after "Answer:".'
    assert head in prompt and prompt.endswith(tail)
    return prompt.split(head, 1)[1][: -len(tail)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    assert _prepare(out, FIXTURE_SOURCES) == 0
    return {
        "train": _read_jsonl(out / "train.jsonl"),
        "eval": _read_jsonl(out / "eval.jsonl"),
        "manifest": json.loads((out / "manifest.json").read_text()),
    }


def test_rows_have_exactly_the_keys_openrlhf_reads(prepared):
    for row in prepared["train"] + prepared["eval"]:
        assert set(row) == {"prompt", "label", "datasource"}
        assert all(isinstance(v, str) for v in row.values())


def test_prompt_text_is_the_dapo_prompt_exactly(prepared):
    assert prepared["train"][0]["prompt"] == EXPECTED_PROMPT_A
    assert prepared["train"][0]["label"] == "34"
    for row in prepared["train"] + prepared["eval"]:
        _problem(row["prompt"])  # every prompt has the instruction and the reminder around the problem


def test_train_is_dapo_deduplicated_then_math_levels_3_to_5(prepared):
    problems = [(r["datasource"], _problem(r["prompt"]), r["label"]) for r in prepared["train"]]
    assert problems == [
        ("dapo", "Let $x$ be a positive integer such that $x^2 - 2x = 1088$. Find $x$.", "34"),
        ("dapo", "How many positive divisors does $2^{3} \\cdot 3^{2}$ have?", "12"),
        ("dapo", "A bag holds $3$ red and $4$ blue marbles. How many marbles are blue?", "4"),
        # "Find the remainder when $7^{2024}$ ..." is an AIME 2024 fixture problem: dropped from train
        ("dapo", "What is the value of $1 + 2 + 3 + \\cdots + 10$?", "55"),  # MATH's copy is dropped
        ("math", "Solve $2x + 3 = 13$ for $x$.", "5"),  # Level 3
        ("math", "Compute $\\sin 60^\\circ$.", "\\frac{\\sqrt{3}}{2}"),  # Level 4: last box, nested braces
        (
            "math",
            "Find all integers $n$ with $n^2 = n + 2$ and $n > 0$, or $n^2 = 1$ and $n > 0$.",
            "\\{1, 2\\}",  # Level 5: escaped braces inside the box
        ),
    ]
    # levels 1, 2 and "?" and the level-5 solution without a box are gone
    joined = " ".join(p for _, p, _ in problems)
    for dropped in ("$1+1$", "$3 \\cdot 4$", "$x^3 = 27$", "graph of $y = x$"):
        assert dropped not in joined


def test_eval_labels_are_json_accuracy_labels_with_a_datasource_per_benchmark(prepared):
    rows = prepared["eval"]
    assert Counter(r["datasource"] for r in rows) == {"aime24": 3, "aime25": 2, "amc23": 2}
    assert [r["datasource"] for r in rows] == ["aime24"] * 3 + ["aime25"] * 2 + ["amc23"] * 2
    labels = [json.loads(r["label"]) for r in rows]
    assert [label["answer"] for label in labels] == ["225", "401", "10", "70", "40", "27", "2.5"]
    assert all(label == {"answer": label["answer"], "reward": "accuracy"} for label in labels)
    assert rows[0]["label"] == '{"answer": "225", "reward": "accuracy"}'
    assert _problem(rows[-1]["prompt"]) == "A rectangle has area $10$ and width $4$. What is its length?"


def test_manifest_counts(prepared):
    manifest = prepared["manifest"]
    assert manifest["keys"] == {"input_key": "prompt", "label_key": "label", "datasource_key": "datasource"}
    assert manifest["math_levels"] == [3, 4, 5]
    train, evals = manifest["train"], manifest["eval"]
    assert (train["rows"], train["duplicates_dropped"], evals["rows"]) == (7, 3, 7)
    dapo, math = train["sources"]["dapo"], train["sources"]["math"]
    assert dapo["origin"] == str(FIXTURE_SOURCES["dapo"])
    assert (dapo["rows_read"], dapo["duplicates_dropped"], dapo["eval_overlap_dropped"], dapo["written"]) == (
        7,
        2,
        1,
        4,
    )
    assert (math["rows_read"], math["level_filtered"], math["missing_problem_or_answer"]) == (8, 3, 1)
    assert (math["duplicates_dropped"], math["written"]) == (1, 3)
    assert {n: s["written"] for n, s in evals["sources"].items()} == {"aime24": 3, "aime25": 2, "amc23": 2}
    assert evals["sources"]["aime25"]["split"] == "test"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $x = \\boxed{5}$.", "5"),
        ("$\\boxed{1}$ then $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
        ("$\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),
        ("$\\boxed{f(x) = \\left\\{ x \\right\\}}$ and more", "f(x) = \\left\\{ x \\right\\}"),
        ("$\\boxed{\\text{(C)}}$", "\\text{(C)}"),
        ("the answer is $\\boxed 7$.", "7"),
        ("$\\fbox{12}$", "12"),
        ("$\\boxed {3}$", "3"),
        ("no box here", None),
        ("$\\boxed{}$ empty", None),
        ("$\\boxed{unclosed", None),
    ],
)
def test_last_boxed(text, expected):
    assert data.last_boxed(text) == expected


def test_openrlhf_prompt_dataset_reads_prompt_label_and_datasource(prepared, tmp_path):
    """OpenRLHF's own loader and PromptDataset, with the flags the module docstring documents."""
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    out = tmp_path / "out"
    assert _prepare(out, FIXTURE_SOURCES) == 0

    class Strategy:
        args = argparse.Namespace(
            data=argparse.Namespace(input_key="prompt", label_key="label", apply_chat_template=False),
            use_ms=False,
        )

        def print(self, *a, **k):
            pass

        def is_rank_0(self):
            return False

    strategy = Strategy()
    eval_data = blending_datasets(str(out / "eval.jsonl"), None, strategy, dataset_split="train")
    dataset = PromptDataset(eval_data, None, strategy)
    datasources, prompts, labels, _ = dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    assert datasources == ["aime24"] * 3 + ["aime25"] * 2 + ["amc23"] * 2
    assert json.loads(labels[3]) == {"answer": "70", "reward": "accuracy"}
    train_data = blending_datasets(str(out / "train.jsonl"), None, strategy, dataset_split="train")
    train = PromptDataset(train_data, None, strategy)
    assert (len(train), train[0][1], train[0][2]) == (7, EXPECTED_PROMPT_A, "34")

    import openrlhf

    source = (Path(openrlhf.__file__).parent / "cli" / "train_ppo_ray.py").read_text()
    for flag in ("--data.input_key", "--data.label_key", "--data.apply_chat_template", "--eval.dataset"):
        assert f'"{flag}"' in source and flag in data.__doc__


def test_local_directory_uses_the_split_files_of_a_hub_snapshot(tmp_path):
    """A snapshot directory (subject/train-*.parquet next to subject/test-*.parquet) reads only the split."""
    from datasets import Dataset

    snapshot = tmp_path / "hendrycks_math"
    (snapshot / "algebra").mkdir(parents=True)
    (snapshot / ".cache").mkdir()
    rows = _read_jsonl(FIXTURE_SOURCES["math"])
    Dataset.from_list(rows).to_parquet(str(snapshot / "algebra" / "train-00000-of-00001.parquet"))
    Dataset.from_list(rows[:2]).to_parquet(str(snapshot / "algebra" / "test-00000-of-00001.parquet"))
    out = tmp_path / "out"
    assert _prepare(out, {**FIXTURE_SOURCES, "math": snapshot}) == 0
    math = json.loads((out / "manifest.json").read_text())["train"]["sources"]["math"]
    assert (math["rows_read"], math["written"]) == (8, 3)


def test_missing_column_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    # AIME 2025's file has `problem`, but the AMC 2023 source reads `question`
    assert _prepare(out, {**FIXTURE_SOURCES, "amc23": FIXTURE_SOURCES["aime25"]}) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "source 'amc23'" in err and "'question'" in err and "SOURCES" in err
    assert not out.exists()


def _run_cli(tmp_path: Path, *argv: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    environ.update(
        PYTHONWARNINGS="ignore",  # third-party import-time deprecation warnings are not our output
        HF_HOME=str(tmp_path / "hf_home"),  # an empty cache: nothing to fall back on
        HF_HUB_ETAG_TIMEOUT="5",
        HF_HUB_DOWNLOAD_TIMEOUT="5",
        **env,
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "openrlhf_band.tools.cli", "prepare-data", "--out", str(tmp_path / "out"), *argv],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - start


def _assert_one_clear_line(proc: subprocess.CompletedProcess, name: str) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("openrlhf-band prepare-data: error: ")
    assert f"source '{name}'" in line and f"--source {name}=PATH" in line
    return line


def test_offline_without_a_local_copy_fails_with_one_line(tmp_path):
    proc, seconds = _run_cli(tmp_path, HF_HUB_OFFLINE="1")
    line = _assert_one_clear_line(proc, "dapo")
    assert "BytedTsinghua-SIA/DAPO-Math-17k" in line and "Hub is unreachable" in line and "HF_HUB_OFFLINE" in line
    assert not (tmp_path / "out").exists()
    assert seconds < 60


def test_unknown_hub_dataset_fails_with_one_line_and_no_retries(tmp_path):
    """A repository that does not exist: 'no such dataset' with network, 'unreachable' without; no hang."""
    local = [f"--source={n}={p}" for n, p in FIXTURE_SOURCES.items() if n != "amc23"]
    bogus = "openrlhf-band-tests/no-such-dataset-3f9c1d"
    proc, seconds = _run_cli(tmp_path, *local, f"--hub-id=amc23={bogus}", HF_HUB_OFFLINE="0")
    line = _assert_one_clear_line(proc, "amc23")
    assert bogus in line
    assert "unreachable" in line or "no such dataset" in line
    assert not (tmp_path / "out").exists()
    assert seconds < 60
