"""The code reward as an OpenRLHF 0.11.2 reward file: `--reward.remote_url .../tasks/code/reward.py`.

The contract is the math reward's (openrlhf_band/tasks/math/reward.py: OpenRLHF loads this file with
`importlib.util.spec_from_file_location` and calls `reward_func(queries, prompts, labels)` from worker
threads; it returns float32 `rewards`, `scores` and `extra_logs` tensors of shape [B] and never raises).

Reward: 1 when the program passes every test of its label, else 0 (a failed or crashed test, a timeout,
no code, an unreadable label, a sandbox failure). `scores` are the same 0/1 (OpenRLHF's dynamic filtering
reads them); the eval metrics `eval_<datasource>_pass1` and `eval_<datasource>_pass<n>` are then pass@1
(mean over samples) and pass@n. extra_logs: `code_found`, `code_timeout`, `sandbox_error` (0/1 each).

The program (rule): the response is the query without its prompt, chat tokens such as `<|im_end|>` removed,
and end tokens that could be text (`</s>`, `<pad>`, `<eos>`) removed from its end only. The program is the
content of its LAST non-empty fenced code block labelled Python (```python, ```py, ```python3, ```py3), else
of its last non-empty unlabelled block (```), less the indentation of its opening fence (as inside a
markdown list); a block left open at the end of the response runs to the end (a closing fence glued to its
last line is dropped). A response without any fence is the program as it stands (leading blank lines
removed, indentation kept). A HumanEval label carries the problem's prompt: a program that defines the entry
point at top level follows the prompt (the prompt's imports and helpers, such as HumanEval/10's
`is_palindrome`, stay available; its def replaces the stub); any other program continues the prompt (prompt
+ program, the HumanEval convention).

Labels (JSON strings, `prepare-data --source code` writes them):
- HumanEval: `{"test": "<code defining check(candidate)>", "entry_point": "f", "prompt": "<the problem>"}`;
  MBPP's top-level asserts go in `test` the same way (they call the entry point by its name);
- APPS / CodeContests stdin-stdout: `{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}`;
- APPS call-based: `{"inputs": [[arg, ...], ...], "outputs": [result, ...], "fn_name": "f"}`.

Every sample runs in its own sandbox (openrlhf_band/sandbox/__init__.py: the isolation, the limits and what
they do not cover; docs/tasks.md). Loading this file checks that the sandbox works here and raises
`SandboxUnavailable` naming the fix when it does not, so a run without isolation never starts unless the
user chose the weaker mode (OPENRLHF_BAND_CODE_SANDBOX=rlimits).

Time: each sample gets OPENRLHF_BAND_CODE_TIMEOUT seconds (default 10) for all its tests, and its
sandbox is killed 2 s after that; at most OPENRLHF_BAND_CODE_WORKERS sandboxes run at once in this
process (default: one per usable CPU), and a sample that waits longer than
OPENRLHF_BAND_CODE_ACQUIRE_TIMEOUT seconds (default 120) for a slot scores 0 as a timeout. So
`reward_func` returns within (timeout + 2 s) per sample once it has a slot, on any input.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any

from openrlhf_band import sandbox
from openrlhf_band.tasks.reward_io import SPECIAL_TOKEN_RE, response_text, score_batch

__all__ = ["check", "extract_program", "parse_label", "reward_func", "score"]

MAX_PROGRAM_CHARS = 100_000
MAX_LABEL_CHARS = 50_000_000  # APPS labels can hold megabytes of test input
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


_CHAT_TOKEN_RE = re.compile(r"<\|[^<>|\s]{1,48}\|>|<｜[^<>｜]{1,48}｜>")  # never Python: removed anywhere


def _strip_trailing_special_tokens(text: str) -> str:
    """Remove the special tokens decoding leaves in a response: chat tokens (`<|im_end|>`) anywhere, and the
    ones that could be text (`</s>`, `<pad>`, `<eos>`) only at its end, where an HTML literal "</s>" is not."""
    text = _CHAT_TOKEN_RE.sub("", text)
    while True:
        stripped = text.rstrip()
        tail = [m for m in SPECIAL_TOKEN_RE.finditer(stripped, max(0, len(stripped) - 64)) if m.end() == len(stripped)]
        if not tail:
            return stripped
        text = stripped[: tail[0].start()]


def extract_program(response: Any) -> str | None:
    """The program in `response` (the rule in the module docstring); None when there is none."""
    if not isinstance(response, str):
        return None
    text = _strip_trailing_special_tokens(response)
    fences = list(_FENCE_RE.finditer(text))
    if not fences:
        # as it stands, leading blank lines aside: a raw HumanEval continuation starts indented
        program = re.sub(r"\A(?:[ \t]*\n)+", "", text).rstrip()
    else:
        blocks, i = [], 0  # pair fences in order: opening (with its tag), closing
        while i < len(fences):
            opening = fences[i]
            closing = fences[i + 1] if i + 1 < len(fences) else None
            end = closing.start() if closing else len(text)
            # a fence inside a markdown list is indented: its lines lose that much indentation, no more (a
            # fenced function body keeps the indentation that places it under the prompt's def)
            indent = len(opening.group(0)) - len(opening.group(0).lstrip(" \t"))
            lines = text[opening.end() + 1 : end].split("\n")
            body = "\n".join(line[min(indent, len(line) - len(line.lstrip(" \t"))) :] for line in lines)
            if body.strip():
                blocks.append((opening.group(1).lower(), body.strip("\n")))
            i += 2
        labelled = [body for tag, body in blocks if tag in _PYTHON_TAGS and tag]
        unlabelled = [body for tag, body in blocks if not tag]
        program = labelled[-1] if labelled else unlabelled[-1] if unlabelled else ""
        program = program.rstrip().removesuffix("```").rstrip()  # a closing fence glued to the last line
    if not program.strip() or len(program) > MAX_PROGRAM_CHARS:
        return None
    return program + "\n"


def parse_label(label: Any) -> tuple[dict | None, bool]:
    """(tests, accuracy) of a label; tests None when the label is not one of the three forms."""
    try:
        if isinstance(label, str):
            if len(label) > MAX_LABEL_CHARS:
                return None, False
            label = json.loads(label)
        if not isinstance(label, dict):
            return None, False
        accuracy = str(label.get("reward", "")).lower() == "accuracy"
        if isinstance(label.get("test"), str) and isinstance(label.get("entry_point"), str):
            tests = {"test": label["test"], "entry_point": label["entry_point"]}
            if isinstance(label.get("prompt"), str):
                tests["prompt"] = label["prompt"]
            return tests, accuracy
        inputs, outputs = label.get("inputs"), label.get("outputs")
        if isinstance(inputs, list) and isinstance(outputs, list) and inputs and len(inputs) == len(outputs):
            tests = {"inputs": inputs, "outputs": outputs}
            if isinstance(label.get("fn_name"), str) and label["fn_name"]:
                tests["fn_name"] = label["fn_name"]
            return tests, accuracy
    except Exception:  # bad JSON, a label nested past the recursion limit, ...
        pass
    return None, False


def _program_for(program: str, tests: dict) -> tuple[str, dict]:
    """(program to run, tests for the sandbox): HumanEval's prompt completed or its imports prepended."""
    prompt = tests.pop("prompt", None)
    entry = tests.get("entry_point")
    if prompt and entry:
        tests["setup"] = prompt  # trusted helpers the checks call (HumanEval/32's poly, /38's encode_cyclic)
        if re.search(rf"^def\s+{re.escape(entry)}\s*\(", program, re.MULTILINE):
            # a whole function: after the prompt, whose imports and helpers it may use; its def replaces the stub
            program = f"{prompt.rstrip()}\n\n\n{program}"
        else:  # a continuation of the prompt's function body
            program = prompt + program
    return program, tests


_SLOTS: threading.BoundedSemaphore | None = None
_SLOTS_LOCK = threading.Lock()


def _workers() -> int:
    try:
        return max(1, int(os.environ["OPENRLHF_BAND_CODE_WORKERS"]))
    except (KeyError, ValueError):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)


def _slots() -> threading.BoundedSemaphore:
    global _SLOTS
    with _SLOTS_LOCK:
        if _SLOTS is None:
            _SLOTS = threading.BoundedSemaphore(_workers())
        return _SLOTS


def score(response: Any, label: Any) -> tuple[float, dict]:
    """(0/1, {"code_found", "code_timeout", "sandbox_error"}) for one response; never raises."""
    value, logs, _ = check(response, parse_label(label)[0])
    return value, logs


def check(response: Any, tests: dict | None) -> tuple[float, dict, str | None]:
    """`score` against `tests` (`parse_label`'s form) instead of a label, and why it failed: None when it
    passed, else "no code", "no tests" or the sandbox's verdict (a failed check, a timeout). Never raises."""
    logs = {"code_found": 0.0, "code_timeout": 0.0, "sandbox_error": 0.0}
    try:
        program = extract_program(response)
        if program is None or tests is None:
            logs["code_found"] = float(program is not None)
            return 0.0, logs, "no code" if program is None else "no tests"
        logs["code_found"] = 1.0
        program, tests = _program_for(program, dict(tests))
        acquire_timeout = float(os.environ.get("OPENRLHF_BAND_CODE_ACQUIRE_TIMEOUT", 120))
        slots = _slots()
        if not slots.acquire(timeout=acquire_timeout):
            logs["code_timeout"] = 1.0
            return 0.0, logs, "timeout"
        try:
            verdict = sandbox.run_tests(program, tests, tests.get("entry_point"), sandbox.Limits.from_env())
        finally:
            slots.release()
        logs["code_timeout"] = float(verdict.timed_out)
        logs["sandbox_error"] = float(verdict.sandbox_error)
        return float(verdict.passed), logs, None if verdict.passed else str(verdict.error or "failed")
    except Exception as err:
        logs["sandbox_error"] = 1.0
        return 0.0, logs, f"sandbox: {type(err).__name__}"


_LOGS = ("code_found", "code_timeout", "sandbox_error")


def _score_one(query: Any, prompt: Any, label: Any) -> tuple[float, ...]:
    """(reward, score, code_found, code_timeout, sandbox_error) of one sample: reward and score are both 0/1."""
    value, logs = score(response_text(query, prompt), label)
    return (value, value, *(logs[name] for name in _LOGS))


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: 1 when every test passes, else 0; scores the same. Never raises."""
    return score_batch(
        queries, prompts, labels, _score_one,
        logs=_LOGS,
        failure=(0.0, 0.0, 0.0, 0.0, 1.0),  # whatever failed: 0, counted as a sandbox error
        workers=_workers,  # as many sandboxes at once as slots
    )  # fmt: skip


# Refuse to start without the isolation this file promises (OpenRLHF loads it when the run starts).
sandbox.require()


def _cli(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: code_reward.py RESPONSE LABEL_JSON   (or pass this file to OpenRLHF as --reward.remote_url)")
        return 2
    value, logs = score(argv[0], argv[1])
    print(json.dumps({"reward": value, **logs}))
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
