"""The code reward file (openrlhf_band/tasks/code/reward.py), loaded the way OpenRLHF loads it: its contract.

Covers program extraction from a response, the three label forms, what `reward_func` returns (float32 [B]
tensors, 0/1 rewards equal to the scores, per-sample extra_logs), scoring on tiny hand-written problems of
each form (HumanEval completion, stdin/stdout, APPS call-based), the prompt being stripped from the query,
garbage inputs, calls from worker threads, the per-sample timeout, the bound on concurrent sandboxes, the
sandbox's refusal to start without isolation, the weaker `rlimits` mode and the command line.

The hostile-program battery and HumanEval's 164 problems are tested elsewhere; every sandbox run here is a
tiny program (~0.1 s each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from reward_files import in_thread, load_reward_file, rewards_via_openrlhf

ROOT = Path(__file__).resolve().parents[2]
CODE_REWARD_PATH = ROOT / "openrlhf_band" / "tasks" / "code" / "reward.py"
LOG_NAMES = {"code_found", "code_timeout", "sandbox_error"}


def _load(name="reward_func"):
    return load_reward_file(CODE_REWARD_PATH, name)


code_reward = _load()
sandbox = code_reward.sandbox  # the package's module: the one the reward file imports


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No OPENRLHF_BAND_CODE_* setting of the outer environment leaks into a test."""
    for key in list(os.environ):
        if key.startswith("OPENRLHF_BAND_CODE_"):
            monkeypatch.delenv(key)


def _one(response, label, prompt=""):
    """(reward, score, extra_logs) of one sample, its query being prompt + response."""
    out = code_reward.reward_func([prompt + response], [prompt], [label])
    return out["rewards"].item(), out["scores"].item(), {k: v.item() for k, v in out["extra_logs"].items()}


def _assert_contract(out, batch):
    assert set(out) == {"rewards", "scores", "extra_logs"}
    assert set(out["extra_logs"]) == LOG_NAMES
    for tensor in (out["rewards"], out["scores"], *out["extra_logs"].values()):
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and tensor.shape == (batch,)
    assert torch.equal(out["rewards"], out["scores"])
    assert set(out["rewards"].tolist()) <= {0.0, 1.0}
    for tensor in out["extra_logs"].values():
        assert set(tensor.tolist()) <= {0.0, 1.0}


# ----------------------------------------------------------------------------- tiny problems

HE_PROMPT = '''from typing import List


def running_max(numbers: List[int]) -> List[int]:
    """The running maximum of `numbers`: [1, 3, 2] -> [1, 3, 3]."""
'''
HE_TEST = """

METADATA = {}


def check(candidate):
    assert candidate([]) == []
    assert candidate([1, 3, 2]) == [1, 3, 3]
    assert candidate([-1, -5, 4, 2]) == [-1, -1, 4, 4]
"""
HE_LABEL = json.dumps({"test": HE_TEST, "entry_point": "running_max", "prompt": HE_PROMPT})
HE_LABEL_NO_PROMPT = json.dumps({"test": HE_TEST, "entry_point": "running_max"})
HE_BODY = (
    "    out, best = [], None\n"
    "    for x in numbers:\n"
    "        best = x if best is None else max(best, x)\n"
    "        out.append(best)\n"
    "    return out\n"
)
HE_WRONG_BODY = "    return list(numbers)\n"
HE_FULL_NO_IMPORT = "def running_max(numbers: List[int]) -> List[int]:\n" + HE_BODY  # `List` comes from the prompt

MBPP_LABEL = json.dumps({"test": "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n", "entry_point": "add"})
ADD = "def add(a, b):\n    return a + b\n"
ADD_WRONG = "def add(a, b):\n    return a - b\n"

SUM_LABEL = json.dumps({"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]})  # stdin: a b, stdout: a + b
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
COUNT_LABEL = json.dumps({"inputs": ["3\n"], "outputs": ["1\n2\n3\n"]})  # stdin: n, stdout: 1..n one a line

SWAP_LABEL = json.dumps({"inputs": [[1, 2], [5, 7]], "outputs": [[2, 1], [7, 5]], "fn_name": "swap"})
SWAP = "def swap(a, b):\n    return (b, a)\n"  # a tuple, compared as a list
PLUS_LABEL = json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [3, [7]], "fn_name": "add"})  # result or [result]
PLUS_WRONG_LABEL = json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [3, [8]], "fn_name": "add"})
UPPER_LABEL = json.dumps({"inputs": ["abc"], "outputs": ["ABC"], "fn_name": "up"})  # a bare argument, not a list
UPPER = "def up(s):\n    return s.upper()\n"


def _fenced(program, tag="python"):
    return f"Here is my solution.\n```{tag}\n{program}```\nIt runs in O(n).<|im_end|>"


# ----------------------------------------------------------------------------- extract_program


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            "First:\n```python\ndef a():\n    return 1\n```\nBetter:\n```python\ndef a():\n    return 2\n```\nDone.",
            "def a():\n    return 2\n",
        ),
        ("```python\nx = 1\n```\n```\ny = 2\n```", "x = 1\n"),  # a labelled block wins over a later output block
        ("```\ny = 2\n```\ntext", "y = 2\n"),  # an unlabelled block counts when no block is labelled
        ("```python\nx = 1\n```\ntext\n```", "x = 1\n"),  # a stray fence opens an empty block: skipped
        ("- step\n  ```python\n  def f():\n      return 1\n  ```", "def f():\n    return 1\n"),  # in a list
        ("```python\n    return 1\n```", "    return 1\n"),  # a fenced body keeps its indentation
        ("```python\nx = '</s>'\n```</s>", "x = '</s>'\n"),  # text-like end tokens only at the end
        ("```python\nx = 1\n```\nRun it with:\n```bash\npython x.py\n```", "x = 1\n"),
        ("```python\nx = 1\n```\nOutput:\n```text\n1\n```\n", "x = 1\n"),
        ("```py\nx = 2\n```", "x = 2\n"),
        ("```python3\nx = 3\n```", "x = 3\n"),
        ("```\nx = 4\n```", "x = 4\n"),
        ("```Python\nx = 5\n```", "x = 5\n"),
        ("``` python\nx = 6\n```", "x = 6\n"),
        ("```python title=main.py\nx = 7\n```", "x = 7\n"),  # the info string's first word is the tag
        ("Text\n```python\ndef f():\n    return 1", "def f():\n    return 1\n"),  # unclosed: runs to the end
        ("```python\na = 1\n```\nAgain:\n```python\nb = 2\n", "b = 2\n"),
        ("\n\ndef f():\n    return 1\n\n", "def f():\n    return 1\n"),  # no fence: the whole text
        ("print(2)<|endoftext|>", "print(2)\n"),
        ("```python\nprint(1)\n```<|im_end|>", "print(1)\n"),
        ("```python\nx = 1<|im_end|>\n```<|endoftext|>", "x = 1\n"),
        ("```python\n    return x + 1\n```", "    return x + 1\n"),  # a body-only completion keeps its indent
        (
            "```python\n\nclass A:\n    def f(self):\n        if True:\n            return 1\n\n```",
            "class A:\n    def f(self):\n        if True:\n            return 1\n",
        ),
    ],
)
def test_extract_program(response, expected):
    assert code_reward.extract_program(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "",
        "   \n\t\n",
        "```python\n```",
        "```python\n   \n\n```",
        "```\n\n",
        "```bash\nls -la\n```",  # no Python block
        "```text\n3\n```",
        "<|im_end|>",
        "x" * (code_reward.MAX_PROGRAM_CHARS + 1),
        "```python\n" + "x" * (code_reward.MAX_PROGRAM_CHARS + 1) + "\n```",
        None,
        5,
        b"print(1)",
        ["print(1)"],
    ],
    ids=lambda value: repr(value)[:30],
)
def test_extract_program_none(response):
    assert code_reward.extract_program(response) is None


def test_extract_program_at_the_size_cap():
    assert (
        code_reward.extract_program("x" * code_reward.MAX_PROGRAM_CHARS) == "x" * code_reward.MAX_PROGRAM_CHARS + "\n"
    )


# ----------------------------------------------------------------------------- parse_label

_HE = {"test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "f", "prompt": "def f():\n"}


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        (_HE, (_HE, False)),
        (json.dumps(_HE), (_HE, False)),
        (
            json.dumps({"test": "assert f() == 1", "entry_point": "f", "reward": "accuracy", "task_id": "HumanEval/0"}),
            ({"test": "assert f() == 1", "entry_point": "f"}, True),
        ),
        (
            {"test": "assert f() == 1", "entry_point": "f", "prompt": None},
            ({"test": "assert f() == 1", "entry_point": "f"}, False),
        ),
        ({"inputs": ["1 2\n"], "outputs": ["3\n"]}, ({"inputs": ["1 2\n"], "outputs": ["3\n"]}, False)),
        (
            json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"], "reward": "Accuracy"}),
            ({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]}, True),
        ),
        (
            {"inputs": [[1, 2]], "outputs": [3], "fn_name": "add", "reward": "accuracy"},
            ({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}, True),
        ),
        (json.dumps({"inputs": [[1]], "outputs": [1], "fn_name": ""}), ({"inputs": [[1]], "outputs": [1]}, False)),
        ({"inputs": ["1"], "outputs": ["1"], "reward": "pm1"}, ({"inputs": ["1"], "outputs": ["1"]}, False)),
    ],
)
def test_parse_label(label, expected):
    assert code_reward.parse_label(label) == expected


@pytest.mark.parametrize(
    "label",
    [
        "not json",
        '{"inputs": ["1"], "outputs": ["1"]',  # truncated
        "",
        "[1, 2]",
        "3",
        "null",
        None,
        7,
        [1, 2],
        b'{"inputs": ["1"], "outputs": ["1"]}',  # bytes are not a label
        {},
        {"inputs": ["1"], "outputs": []},  # mismatched lengths
        {"inputs": ["1", "2"], "outputs": ["1"]},
        {"inputs": [], "outputs": [], "reward": "accuracy"},  # no test case
        {"inputs": "1", "outputs": "1"},
        {"inputs": None, "outputs": None},
        {"test": 5, "entry_point": "f"},
        {"test": "assert f() == 1", "entry_point": None},
        {"test": "assert f() == 1"},
        json.dumps({"entry_point": "f"}),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_parse_label_malformed(label):
    assert code_reward.parse_label(label) == (None, False)


def test_parse_label_over_the_size_cap():
    pad = "x" * code_reward.MAX_LABEL_CHARS
    assert code_reward.parse_label(json.dumps({"inputs": ["1"], "outputs": ["1"], "pad": pad})) == (None, False)


def test_parse_label_deeply_nested_json():
    assert code_reward.parse_label("[" * 100_000) == (None, False)
    assert _one(ADD, "[" * 100_000)[2] == {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 0.0}


# ----------------------------------------------------------------------------- reward_func: scoring

SCORING = [  # (id, response, label, expected reward)
    ("he-body-fenced", _fenced(HE_BODY), HE_LABEL, 1.0),
    ("he-full-no-import", _fenced(HE_FULL_NO_IMPORT), HE_LABEL, 1.0),  # the prompt's imports go before it
    ("he-full-no-import-no-prompt", _fenced(HE_FULL_NO_IMPORT), HE_LABEL_NO_PROMPT, 0.0),  # NameError: List
    ("he-full-with-import", _fenced("from typing import List\n\n" + HE_FULL_NO_IMPORT), HE_LABEL_NO_PROMPT, 1.0),
    ("he-wrong", _fenced(HE_WRONG_BODY), HE_LABEL, 0.0),
    ("he-accuracy-flag", _fenced(HE_BODY), json.dumps({**json.loads(HE_LABEL), "reward": "accuracy"}), 1.0),
    ("mbpp", _fenced(ADD), MBPP_LABEL, 1.0),
    ("mbpp-dict-label", ADD, json.loads(MBPP_LABEL), 1.0),
    ("mbpp-wrong", _fenced(ADD_WRONG), MBPP_LABEL, 0.0),
    ("io", _fenced(SUM), SUM_LABEL, 1.0),
    ("io-wrong", _fenced(SUM.replace("a + b", "a - b")), SUM_LABEL, 0.0),
    ("io-trailing-spaces", _fenced(SUM.replace("print(a + b)", "print(str(a + b) + '   ')")), SUM_LABEL, 1.0),
    (
        "io-trailing-blank-lines",
        _fenced(SUM.replace("print(a + b)", "print(a + b)\nprint()\nprint('  ')")),
        SUM_LABEL,
        1.0,
    ),
    ("io-crlf", _fenced(SUM.replace("print(a + b)", "print(a + b, end='\\r\\n')")), SUM_LABEL, 1.0),
    ("io-tokens", _fenced("n = int(input())\nprint(*range(1, n + 1))\n"), COUNT_LABEL, 1.0),  # "1 2 3" ~ "1\n2\n3"
    ("io-leading-spaces", _fenced("n = int(input())\nfor i in range(n):\n    print('  ', i + 1)\n"), COUNT_LABEL, 1.0),
    ("io-glued-tokens", _fenced("n = int(input())\nprint(''.join(map(str, range(1, n + 1))))\n"), COUNT_LABEL, 0.0),
    ("io-missing-line", _fenced("print(1)\nprint(2)\n"), COUNT_LABEL, 0.0),
    ("io-right-output-bad-exit", _fenced(SUM + "raise SystemExit(3)\n"), SUM_LABEL, 0.0),
    ("io-list-io", _fenced(SUM), json.dumps({"inputs": [["1 2"]], "outputs": [["3"]]}), 1.0),  # lines joined
    ("call-tuple-as-list", _fenced(SWAP), SWAP_LABEL, 1.0),
    ("call-result-or-list", _fenced(ADD), PLUS_LABEL, 1.0),
    ("call-wrong", _fenced(ADD), PLUS_WRONG_LABEL, 0.0),
    ("call-bare-argument", _fenced(UPPER), UPPER_LABEL, 1.0),
    ("call-missing-function", _fenced("def other(s):\n    return s.upper()\n"), UPPER_LABEL, 0.0),
    ("call-raises", _fenced("def up(s):\n    raise ValueError(s)\n"), UPPER_LABEL, 0.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), [case[1:] for case in SCORING], ids=[c[0] for c in SCORING])
def test_scoring(response, label, expected):
    reward, score, logs = _one(response, label)
    assert (reward, score) == (expected, expected)
    assert logs == {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 0.0}


def test_an_unfenced_humaneval_body_completes_the_prompt():
    assert code_reward.extract_program(HE_BODY) == HE_BODY
    assert _one(HE_BODY, HE_LABEL)[:2] == (1.0, 1.0)


def test_no_code_or_no_label():
    assert _one("```bash\nls\n```", MBPP_LABEL) == (
        0.0,
        0.0,
        {"code_found": 0.0, "code_timeout": 0.0, "sandbox_error": 0.0},
    )
    assert _one(ADD, "not a label") == (0.0, 0.0, {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 0.0})
    assert _one(ADD, None)[:2] == (0.0, 0.0)


CHAT_PROMPT = (
    "<|im_start|>system\nYou are a careful programmer.<|im_end|>\n"
    "<|im_start|>user\nWrite add(a, b). A reference solution:\n```python\n" + ADD + "```\n"
    "Rewrite it in your own words, in a ```python block.<|im_end|>\n<|im_start|>assistant\n"
)


def test_the_prompt_is_removed_from_the_query():
    # the prompt's own (correct) program is not the response's: a response without Python scores 0
    assert _one("```bash\necho done\n```<|im_end|>", MBPP_LABEL, CHAT_PROMPT) == (
        0.0,
        0.0,
        {"code_found": 0.0, "code_timeout": 0.0, "sandbox_error": 0.0},
    )
    assert _one(_fenced(ADD), MBPP_LABEL, CHAT_PROMPT)[:2] == (1.0, 1.0)
    assert _one(_fenced(ADD_WRONG), MBPP_LABEL, CHAT_PROMPT)[:2] == (0.0, 0.0)
    # a decode that does not reproduce the prompt's beginning: its tail still marks where the response starts
    query = "<s>" + CHAT_PROMPT[12:] + "```bash\necho done\n```"
    out = code_reward.reward_func([query], [CHAT_PROMPT], [MBPP_LABEL])
    assert out["rewards"].item() == 0.0 and out["extra_logs"]["code_found"].item() == 0.0


# ----------------------------------------------------------------------------- reward_func: the contract


def test_batch_types_shapes_and_order():
    responses = [
        _fenced(HE_BODY),
        _fenced(SUM.replace("a + b", "a * b")),
        _fenced(SWAP),
        "no code?",
        "```bash\nls\n```",
    ]
    labels = [HE_LABEL, SUM_LABEL, SWAP_LABEL, MBPP_LABEL, json.loads(SUM_LABEL)]
    queries = [CHAT_PROMPT + r for r in responses]
    out = code_reward.reward_func(queries, [CHAT_PROMPT] * 5, labels)
    _assert_contract(out, 5)
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out["extra_logs"]["code_found"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert out["extra_logs"]["code_timeout"].tolist() == [0.0] * 5
    assert out["extra_logs"]["sandbox_error"].tolist() == [0.0] * 5
    # the same samples in the other order: per-sample results follow the samples
    out = code_reward.reward_func(queries[::-1], [CHAT_PROMPT] * 5, labels[::-1])
    assert out["rewards"].tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_garbage_inputs_do_not_raise():
    out = code_reward.reward_func([], [], [])
    _assert_contract(out, 0)
    _assert_contract(code_reward.reward_func(None, None, None), 0)
    # non-str queries, short prompts and labels, bytes, ints
    out = code_reward.reward_func([None, 7, b"print(1)", ADD], [None], [b"{}", 7, None])
    _assert_contract(out, 4)
    assert out["rewards"].tolist() == [0.0] * 4
    assert out["extra_logs"]["code_found"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert out["extra_logs"]["sandbox_error"].tolist() == [0.0] * 4
    # more labels than queries: the extra ones are ignored
    out = code_reward.reward_func([ADD], [""], [MBPP_LABEL, "junk", None])
    _assert_contract(out, 1)
    assert out["rewards"].tolist() == [1.0]
    # one sample given as plain strings
    out = code_reward.reward_func(ADD, "", MBPP_LABEL)
    _assert_contract(out, 1)
    assert out["rewards"].tolist() == [1.0]
    for queries, prompts, labels in ((5, 5, 5), ([ADD], 5, [MBPP_LABEL]), (b"x", b"y", b"z"), ({"a": 1}, None, None)):
        out = code_reward.reward_func(queries, prompts, labels)
        assert set(out) == {"rewards", "scores", "extra_logs"}
        assert out["rewards"].shape == out["scores"].shape


def test_openrlhf_calls_it_from_a_worker_thread():
    queries = [CHAT_PROMPT + _fenced(ADD), CHAT_PROMPT + _fenced(ADD_WRONG)]
    infos = rewards_via_openrlhf(CODE_REWARD_PATH, queries, [CHAT_PROMPT] * 2, [MBPP_LABEL] * 2)
    assert [info["rewards"].tolist() for info in infos] == [[1.0], [0.0]]
    for info in infos:
        _assert_contract(info, 1)
        # what samples_generator._process_response_into_experience does with them
        assert torch.tensor([info["rewards"]]).shape == (1,)


def test_called_from_a_non_main_thread():
    responses, labels = [_fenced(SUM), _fenced(HE_BODY)], [SUM_LABEL, HE_LABEL]
    out, _ = in_thread(code_reward.reward_func, responses, ["", ""], labels, timeout=60)
    _assert_contract(out, 2)
    assert out["rewards"].tolist() == [1.0, 1.0]


# The bound: the sandbox's wall time (2 s) plus the parent's grace (sandbox.GRACE_S, 2 s) after which it kills
# the sandbox: 4 s from starting it. Outside that window only in-process work happens (label parsing, a free slot,
# the kill and reaping of an already killed process group, removing a temporary directory): milliseconds. The
# margin, 1 s, is for scheduling on a loaded 2-core machine (pytest, other tests' processes), not for any work.
TIMEOUT_S = 2
TIMEOUT_MARGIN_S = 1.0


@pytest.mark.parametrize(
    ("response", "label"),
    [
        ("while True:\n    pass\n", SUM_LABEL),  # stdin/stdout: the program never ends
        ("def add(a, b):\n    while True:\n        pass\n", MBPP_LABEL),  # call-based: the call never returns
    ],
    ids=["io", "call"],
)
def test_an_infinite_loop_times_out(monkeypatch, response, label):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_TIMEOUT", str(TIMEOUT_S))
    out, seconds = in_thread(code_reward.reward_func, [_fenced(response)], [""], [label], timeout=60)
    assert TIMEOUT_S <= seconds < TIMEOUT_S + sandbox.GRACE_S + TIMEOUT_MARGIN_S, f"{seconds:.2f} s"
    _assert_contract(out, 1)
    assert out["rewards"].tolist() == [0.0]
    assert {k: v.item() for k, v in out["extra_logs"].items()} == {
        "code_found": 1.0,
        "code_timeout": 1.0,
        "sandbox_error": 0.0,
    }


SLEEP_LABEL = json.dumps({"inputs": ["x\n"], "outputs": ["x\n"]})
SLEEP = _fenced("import time\ntime.sleep(1)\nprint(input())\n")


def _concurrently(calls):
    """Run each (args) of `calls` through reward_func in its own thread, all at once: (outs, wall seconds)."""
    outs = [None] * len(calls)

    def run(i, args):
        outs[i] = code_reward.reward_func(*args)

    threads = [threading.Thread(target=run, args=(i, args)) for i, args in enumerate(calls)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outs, time.monotonic() - start


def _sandbox_intervals(monkeypatch) -> list[tuple[float, float]]:
    """Record when each sandbox run starts and ends (the real run in between)."""
    intervals, real = [], sandbox.run_tests

    def recording(*args, **kwargs):
        start = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            intervals.append((start, time.monotonic()))

    monkeypatch.setattr(code_reward.sandbox, "run_tests", recording)
    return intervals


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_bound_the_concurrent_sandboxes(monkeypatch, workers):
    """With one worker the two samples' sandboxes never overlap; with two they run at once (each sleeps 1 s, so
    two that both start at once overlap whatever the machine's load)."""
    monkeypatch.setenv("OPENRLHF_BAND_CODE_WORKERS", str(workers))
    monkeypatch.setattr(code_reward, "_SLOTS", None)  # the slots are made once per process, from the env
    intervals = _sandbox_intervals(monkeypatch)
    calls = [([SLEEP], [""], [SLEEP_LABEL])] * 2  # two OpenRLHF worker threads, one sample each
    outs, _ = _concurrently(calls)
    assert [out["rewards"].tolist() for out in outs] == [[1.0], [1.0]]
    (start_a, end_a), (start_b, end_b) = sorted(intervals)
    assert (start_b < end_a) == (workers == 2), intervals


def test_waiting_too_long_for_a_slot_is_a_timeout(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_ACQUIRE_TIMEOUT", "0.2")
    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(code_reward, "_SLOTS", slots)
    assert slots.acquire(timeout=1)  # another sample holds the only slot
    out, seconds = in_thread(code_reward.reward_func, [_fenced(ADD)], [""], [MBPP_LABEL], timeout=60)
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["code_timeout"].tolist() == [1.0]
    assert seconds >= 0.2
    slots.release()
    assert _one(_fenced(ADD), MBPP_LABEL)[:2] == (1.0, 1.0)  # the slot is free again


# ----------------------------------------------------------------------------- the sandbox's refusal


@pytest.fixture
def no_namespaces(monkeypatch):
    """The kernel refuses to make the sample's namespaces (as with user namespaces disabled: the zygote's unshare
    fails, here asked with an invalid flag); the probe cache is empty."""
    call = "if libc.unshare(SAMPLE_NAMESPACES) != 0:"
    assert call in sandbox.HARNESS_SOURCE
    monkeypatch.setattr(sandbox, "HARNESS_SOURCE", sandbox.HARNESS_SOURCE.replace(call, "if libc.unshare(-1) != 0:"))
    monkeypatch.setattr(sandbox, "_PROBED", {})


def test_without_namespaces_the_sandbox_refuses(no_namespaces, monkeypatch):
    verdict = sandbox.run_tests(ADD, json.loads(MBPP_LABEL), "add", mode="namespaces")
    assert not verdict.passed and verdict.sandbox_error and verdict.error.startswith("sandbox:")
    with pytest.raises(sandbox.SandboxUnavailable, match="OPENRLHF_BAND_CODE_SANDBOX=rlimits"):
        sandbox.require("namespaces")
    with pytest.raises(sandbox.SandboxUnavailable, match="OPENRLHF_BAND_CODE_SANDBOX=rlimits"):
        sandbox.require()  # namespaces is the default
    # a sample scored anyway fails and says why; it does not raise
    assert _one(ADD, MBPP_LABEL) == (0.0, 0.0, {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 1.0})
    # the run refuses to start: OpenRLHF loads the file when the run starts
    monkeypatch.setattr(sandbox, "_PROBED", {})
    with pytest.raises(sandbox.SandboxUnavailable, match="OPENRLHF_BAND_CODE_SANDBOX=rlimits"):
        _load("refused")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root parent needs setpriv")
def test_a_root_parent_without_setpriv_is_refused_in_one_line(monkeypatch):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "setpriv" else which(name, *a, **k))
    monkeypatch.setattr(sandbox, "_PROBED", {})
    for mode in sandbox.MODES:
        with pytest.raises(sandbox.SandboxUnavailable, match="needs util-linux's `setpriv`"):
            sandbox.require(mode)


def test_an_unknown_sandbox_mode_is_refused(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_SANDBOX", "docker")
    monkeypatch.setattr(sandbox, "_PROBED", {})
    with pytest.raises(ValueError, match="namespaces, rlimits"):
        sandbox.require()
    with pytest.raises(ValueError, match="OPENRLHF_BAND_CODE_SANDBOX='docker'"):
        _load("unknown_mode")
    assert _one(ADD, MBPP_LABEL) == (0.0, 0.0, {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 1.0})


def test_rlimits_mode_scores(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_SANDBOX", "rlimits")
    assert _one(_fenced(ADD), MBPP_LABEL) == (1.0, 1.0, {"code_found": 1.0, "code_timeout": 0.0, "sandbox_error": 0.0})
    assert _one(_fenced(ADD_WRONG), MBPP_LABEL)[:2] == (0.0, 0.0)
    assert _one(_fenced(SUM), SUM_LABEL)[:2] == (1.0, 1.0)
    assert _one(_fenced(HE_WRONG_BODY), HE_LABEL)[:2] == (0.0, 0.0)


def test_rlimits_mode_passes_its_probe(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_SANDBOX", "rlimits")
    monkeypatch.setattr(sandbox, "_PROBED", {})
    assert sandbox.require() == "rlimits"
    assert _load("rlimits_mode").reward_func([ADD], [""], [MBPP_LABEL])["rewards"].tolist() == [1.0]


def _process_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.parametrize("label", [SUM_LABEL, MBPP_LABEL], ids=["io", "call"])
def test_rlimits_mode_kills_a_timed_out_program(monkeypatch, label):
    monkeypatch.setenv("OPENRLHF_BAND_CODE_SANDBOX", "rlimits")
    monkeypatch.setenv("OPENRLHF_BAND_CODE_TIMEOUT", "1")
    shared = Path(tempfile.mkdtemp(prefix="openrlhf-band-code-reward-test-"))
    shared.chmod(0o777)  # as root, the rlimits sandbox runs the program as nobody
    pid_file = shared / "pid"
    program = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    try:
        assert _one(_fenced(program), label)[2]["code_timeout"] == 1.0
        pid = int(pid_file.read_text())
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    try:
        deadline = time.monotonic() + 0.5
        while _process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _process_state(pid) in (None, "Z"), f"the program (pid {pid}) outlived its sample"
    finally:
        if _process_state(pid) not in (None, "Z"):
            os.kill(pid, 9)  # the program this test started


# ----------------------------------------------------------------------------- command line


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENRLHF_BAND_CODE_")}
    return subprocess.run(
        [sys.executable, str(CODE_REWARD_PATH), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli():
    done = _cli(_fenced(ADD), MBPP_LABEL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "reward": 1.0,
        "code_found": 1.0,
        "code_timeout": 0.0,
        "sandbox_error": 0.0,
    }
    done = _cli(ADD_WRONG, MBPP_LABEL)
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])["reward"] == 0.0
    done = _cli(ADD)
    assert done.returncode == 2 and "usage" in done.stdout
