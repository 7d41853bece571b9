"""The DAPO math reward file (openrlhf_band/tasks/math/reward.py), loaded the way OpenRLHF loads it.

Covers answer extraction, math-verify equivalence, the label format (plain answers: +1/-1; JSON
`{"answer": ..., "reward": "accuracy"}`: 0/1), the return types OpenRLHF consumes, and the hard
requirements: reward_func never raises and returns within the deadline on hostile output when called
from a non-main thread, including when a worker process hangs and has to be killed.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_files import in_thread, load_reward_file, one_value_per_sample, rewards_via_openrlhf

REWARD_PATH = Path(__file__).resolve().parents[2] / "openrlhf_band" / "tasks" / "math" / "reward.py"
DEADLINE_S = 2.5  # wall-clock bound asserted per hostile sample (the module's verification deadline is 1.5 s)


def _load(name="reward_func"):
    return load_reward_file(REWARD_PATH, name)


reward = _load()


@pytest.fixture(scope="module", autouse=True)
def _pool():
    assert reward.warmup(120), "math-verify workers did not start"
    yield
    reward.POOL.shutdown()


def _one(response, label, prompt=""):
    """(reward, score, extra_logs) of one sample, its query being prompt + response."""
    out = reward.reward_func([prompt + response], [prompt], [label])
    return out["rewards"].item(), out["scores"].item(), {k: v.item() for k, v in out["extra_logs"].items()}


# ----------------------------------------------------------------------------- OpenRLHF's contract


def test_openrlhf_loads_the_file_and_gets_a_one_element_tensor_per_sample():
    prompt = "<|im_start|>user\nSolve 1+1.<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + "1+1=2.\nAnswer: 2<|im_end|>"
    (info,) = rewards_via_openrlhf(REWARD_PATH, [query], [prompt], ["2"])  # its own copy of the file and pool
    assert one_value_per_sample(info) == (1.0, 1.0)


def test_batch_output_types_and_shapes():
    queries = ["Answer: 4", "Answer: 5", "no answer here", "\\boxed{\\frac{1}{2}}"]
    labels = ["4", "4", "4", reward.make_label("0.5", accuracy=True)]
    out = reward.reward_func(queries, [""] * 4, labels)
    assert set(out) == {"rewards", "scores", "extra_logs"}
    for tensor in (out["rewards"], out["scores"], *out["extra_logs"].values()):
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and tensor.shape == (4,)
    assert out["rewards"].tolist() == [1.0, -1.0, -1.0, 1.0]
    assert out["scores"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert out["extra_logs"]["answer_found"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert out["extra_logs"]["verify_timeout"].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_empty_and_malformed_batches_do_not_raise():
    out = reward.reward_func([], [], [])
    assert out["rewards"].shape == (0,)
    out = reward.reward_func(["Answer: 3", None, 7], ["", None], ["3"])  # short prompts/labels, non-str queries
    assert out["rewards"].tolist() == [1.0, -1.0, -1.0]
    assert reward.reward_func(None, None, None)["rewards"].shape == (0,)


# ----------------------------------------------------------------------------- equivalence

EQUIVALENT = [  # (answer, label)
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "0.5"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac{3}{4}", "0.75"),
    ("\\frac34", "3/4"),
    ("-\\frac{1}{2}", "-0.5"),
    ("1/3", "0.3333333"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("x=3", "3"),
    ("y=2x+1", "2x+1"),
    ("(1,2)", "(1, 2)"),
    ("\\left(1, 2\\right)", "(1,2)"),
    ("10\\%", "0.1"),
    ("0.1", "10\\%"),
    ("1,000", "1000"),
    ("42.0", "42"),
    ("2^{10}", "1024"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("[2,\\infty)", "[2, \\infty)"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("\\binom{5}{2}", "10"),
    ("45^\\circ", "45"),
    ("5\\text{ cm}", "5"),
    ("\\text{(B)}", "B"),
    ("$\\frac{1}{3}$", "1/3"),
    ("\\boxed{7}", "7"),
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("007", "7"),
]

NOT_EQUIVALENT = [
    ("3", "4"),
    ("-5", "5"),
    ("100", "1000"),
    ("1/2", "0.51"),
    ("\\frac{1}{3}", "0.333"),
    ("\\sqrt{2}", "1.41"),
    ("2", "2\\sqrt{2}"),
    ("2^{10}", "2"),
    ("3x", "3"),  # a partial parse of the answer must not match
    ("x^2", "x^3"),
    ("x=3", "4"),
    ("(1,2)", "(2,1)"),
    ("[1,2]", "(1,2)"),
    ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("3, 4", "4"),
    ("1+i", "1"),
    ("-\\infty", "\\infty"),
    ("1,000", "1"),
    ("A", "B"),
    ("", "0"),
    ("0", ""),
]


@pytest.mark.parametrize(("answer", "label"), EQUIVALENT)
def test_equivalent_pairs(answer, label):
    assert reward.is_equivalent(answer, label)
    assert _one(f"Work.\nAnswer: {answer}", label)[:2] == (1.0, 1.0)


@pytest.mark.parametrize(("answer", "label"), NOT_EQUIVALENT)
def test_non_equivalent_pairs(answer, label):
    assert not reward.is_equivalent(answer, label)
    assert _one(f"Work.\nAnswer: {answer}", label)[:2] == (-1.0, 0.0)


def test_is_equivalent_never_raises_on_odd_types():
    assert not reward.is_equivalent(None, "1")
    assert not reward.is_equivalent("1", None)
    assert reward.is_equivalent(3, 3.0)
    assert not reward.is_equivalent("1" * 5000, "1" * 5000 + "0")  # over the answer cap: not equivalent


# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 5", "5"),
        ("Answer: 3\nwait, let me recheck.\nAnswer: 5", "5"),  # the last Answer: wins
        ("So the result follows. Answer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("answer:   -7  \n", "-7"),
        ("**Answer:** 12", "12"),
        ("**Final Answer:** $x = 2$", "x = 2"),
        ("Answer:\n42", "42"),
        ("Answer: \\boxed{12}", "12"),
        ("Answer: \\(3\\sqrt{2}\\)", "3\\sqrt{2}"),
        ("Answer: 42<|im_end|>", "42"),
        ("Answer: 7<｜end▁of▁sentence｜>", "7"),
        ("Answer: 9</s>", "9"),
        ("thus \\boxed{3} or rather \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),  # boxed fallback: the last one
        ("the set is \\boxed{\\{1, \\{2\\}\\}}.", "\\{1, \\{2\\}\\}"),
        ("\\fbox{8}", "8"),
        ("Answer: \n\n\\boxed{6}", "6"),
        ("Answer: 4 \n and later \\boxed{5}", "4"),  # Answer: takes precedence over \boxed
    ],
)
def test_extract_answer(text, expected):
    assert reward.extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I do not know.",
        "Answer:",
        "Answer: **",
        "\\boxed{unbalanced",
        "\\boxed{" + "{" * 100_000,
        "Answer: " + "1" * (reward.MAX_ANSWER_CHARS + 1),  # over the cap
        "Answer: 5\n" + "x" * (reward.SEARCH_WINDOW + 10),  # outside the searched tail
        None,
        12,
    ],
)
def test_no_answer(text):
    assert reward.extract_answer(text) is None


def test_no_answer_is_minus_one_and_counted():
    r, s, logs = _one("I think it is five.", "5")
    assert (r, s, logs["answer_found"]) == (-1.0, 0.0, 0.0)


def test_prompt_is_stripped_from_the_query():
    prompt = "Example: 1+1? Answer: 2\n\nNow solve 2+3. Put it after Answer:\n"
    assert _one("Answer: 5", "5", prompt)[0] == 1.0
    assert _one("I give up.", "2", prompt)[0] == -1.0  # the prompt's own "Answer: 2" is not the response's
    # a decode that does not reproduce the prompt's beginning (BOS, left truncation): its tail still matches
    out = reward.reward_func(["<s>" + prompt[10:] + "I give up."], [prompt], ["2"])
    assert out["rewards"].item() == -1.0


# ----------------------------------------------------------------------------- labels


def test_plain_and_accuracy_labels():
    assert _one("Answer: 5", "5")[:2] == (1.0, 1.0)
    assert _one("Answer: 6", "5")[:2] == (-1.0, 0.0)
    accuracy = reward.make_label("5", accuracy=True)
    assert json.loads(accuracy) == {"answer": "5", "reward": "accuracy"}
    assert _one("Answer: 5", accuracy)[:2] == (1.0, 1.0)
    assert _one("Answer: 6", accuracy)[:2] == (0.0, 0.0)
    assert _one("no answer", accuracy)[:2] == (0.0, 0.0)
    assert _one("Answer: 1/2", {"answer": "0.5", "reward": "accuracy"})[:2] == (1.0, 1.0)  # a dict column
    assert _one("Answer: 6", '{"answer": "5", "reward": "pm1"}')[:2] == (-1.0, 0.0)
    assert _one("Answer: 42", 42)[:2] == (1.0, 1.0)  # an int column
    assert _one("Answer: 42", None)[:2] == (-1.0, 0.0)


def test_accuracy_labels_make_eval_metrics_accuracies():
    # compute_eval_metrics: pass1 = mean of the rewards, pass<n> = their max
    label = reward.make_label("\\frac{1}{2}", accuracy=True)
    responses = ["Answer: 0.5", "Answer: 1/3", "nothing", "Answer: 1/2"]
    rewards = reward.reward_func(responses, [""] * 4, [label] * 4)["rewards"]
    assert rewards.mean().item() == 0.5 and rewards.max().item() == 1.0


@pytest.mark.parametrize("answer", ["5", "\\frac{1}{2}", "{1,2}", '{"answer": "x"}', "{}"])
def test_make_label_plain_round_trips(answer):
    label = reward.make_label(answer, accuracy=False)
    assert label == answer or json.loads(label) == {"answer": answer}
    assert reward._parse_label(label) == (answer, False)
    assert reward._parse_label(reward.make_label(answer, accuracy=True)) == (answer, True)


# ----------------------------------------------------------------------------- hostile output

HOSTILE = [
    "Answer: 9^9^9^9^9",
    "Answer: 9^{9^{9^{9^{9}}}}",
    "Answer: 10^{10^{10}}",
    "Answer: (10^{100})!",
    "Answer: \\binom{10^{9}}{10^{8}}",
    "Answer: " + "{" * 450 + "1" + "}" * 450,
    "Answer: " + "(" * 450 + "1" + ")" * 450,
    "Answer: " + "\\sqrt{" * 140 + "2" + "}" * 140,
    "Answer: " + "x" * 990,
    "x" * 100_000,
    "Answer: 1" + "0" * 100_000,
    "\\boxed{" * 20_000,
    "Answer: \x00\ud800\uffff" + "\u202e" * 100,
]


@pytest.mark.parametrize(
    ("response", "accuracy"),
    [(response, False) for response in HOSTILE] + [(HOSTILE[1], True)],
    ids=[f"hostile{i}" for i in range(len(HOSTILE))] + ["hostile1-accuracy-label"],
)
def test_hostile_output_returns_in_time_from_a_thread(response, accuracy):
    assert reward.warmup(120)  # the deadline is about verification, not about workers still starting
    label = reward.make_label("5", accuracy=accuracy)
    out, seconds = in_thread(reward.reward_func, [response], [""], [label])
    assert seconds < DEADLINE_S, f"{seconds:.2f} s"
    assert out["rewards"].tolist() == [0.0 if accuracy else -1.0]
    assert out["scores"].tolist() == [0.0]


def test_a_hung_worker_is_killed_and_replaced(monkeypatch):
    # frozen between tasks, no worker takes a check: the wait for a free worker is what bounds it
    monkeypatch.setenv("OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT", "0.5")
    assert reward.warmup(120)
    pool = reward.POOL.current
    stopped = sorted(pool.worker_pids())
    for pid in stopped:  # freeze every worker: only the parent's deadline can end these checks
        os.kill(pid, signal.SIGSTOP)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(in_thread(reward.reward_func, ["Answer: 1/2"], [""], ["0.5"])))
        for _ in range(pool.size)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == pool.size
    for out, seconds in results:
        assert seconds < DEADLINE_S
        assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["verify_timeout"].tolist() == [1.0]
    assert reward.warmup(120)
    replacement = reward.POOL.current
    assert not set(stopped) & replacement.worker_pids()
    for pid in stopped:  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # the replaced pool, once closed and collected, leaves its successor alone (its exit hook was once tied to it)
    for thread in threading.enumerate():
        if thread.name.endswith("-pool-close"):
            thread.join(30)
    del pool
    gc.collect()
    assert reward.POOL.current is replacement and replacement.worker_pids()
    assert _one("Answer: 1/2", "0.5")[:2] == (1.0, 1.0)


def _child(conn):
    out = reward.reward_func(["Answer: \\frac{1}{2}"], [""], ["0.5"])
    conn.send((os.getpid(), reward.POOL.current.pid, out["rewards"].tolist()))
    conn.close()


def test_a_forked_child_gets_its_own_pool():
    assert reward.warmup(120)
    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_child, args=(child_conn,))
    child.start()
    assert parent_conn.poll(60)
    child_pid, pool_pid, rewards = parent_conn.recv()
    child.join(30)
    assert child_pid == pool_pid != os.getpid()
    assert rewards == [1.0]
    assert reward.POOL.current.pid == os.getpid()
    assert _one("Answer: 1/2", "0.5")[0] == 1.0  # the parent's pool is untouched


# ----------------------------------------------------------------------------- fuzzing

_LABELS = st.one_of(
    st.text(max_size=30),
    st.integers(-1000, 1000),
    st.sampled_from(["5", "\\frac{1}{2}", "(1, 2)", "x=3", "\\{1,2\\}"]),
    st.text(max_size=20).map(lambda a: reward.make_label(a, accuracy=True)),
    st.none(),
)
_ANSWER_TEXT = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789+-*/^(){}[]\\.,=!x ", max_size=80),
    st.lists(st.sampled_from(["\\frac{", "\\sqrt{", "}", "{", "^", "9", "!", "\\boxed{", "$", "Answer:", "\n"])).map(
        "".join
    ),
)


def _accuracy_mode(label):
    return isinstance(label, str) and label.startswith("{") and '"accuracy"' in label


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.text(max_size=200), answer=_ANSWER_TEXT, label=_LABELS, prompt=st.text(max_size=50))
def test_fuzz_reward_func_never_raises(prefix, answer, label, prompt):
    out, seconds = in_thread(reward.reward_func, [prompt + prefix + "\nAnswer: " + answer], [prompt], [label])
    assert seconds < 30
    r, s = out["rewards"].item(), out["scores"].item()
    assert r in ({0.0, 1.0} if _accuracy_mode(label) else {-1.0, 1.0})
    assert s in {0.0, 1.0}
    assert (r == 1.0) == (s == 1.0)


@settings(max_examples=25, deadline=None)
@given(query=st.text(max_size=300), prompt=st.one_of(st.none(), st.text(max_size=30)), label=_LABELS)
def test_fuzz_arbitrary_queries(query, prompt, label):
    out = reward.reward_func([query], [prompt], [label])
    assert out["rewards"].item() in {-1.0, 0.0, 1.0}
    assert out["scores"].item() in {0.0, 1.0}
