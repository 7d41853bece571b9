"""The DAPO math reward as an OpenRLHF 0.11.2 reward file: `--reward.remote_url .../tasks/math/reward.py`.

OpenRLHF loads this file with `importlib.util.spec_from_file_location` (so only absolute imports work
here) and, for every sample, calls `reward_func([query], [prompt], [label])` from a worker thread
(`SingleTurnAgentExecutor._fetch_rewards_via_func` uses `asyncio.to_thread`, one sample per call):

- `query` is `tokenizer.decode(prompt_tokens + response_tokens, skip_special_tokens=False)`: the
  (chat-templated) prompt followed by the response, special tokens such as `<|im_end|>` included;
- `prompt` is the prompt string the dataset produced (after the chat template);
- `label` is the row's `--data.label_key` value.

It returns `{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {name: Tensor[B]}}` (float32).
OpenRLHF wraps each per-sample value as `torch.tensor([value])`, which for a one-element tensor is
again shape [1]; a list of floats would become shape [1, 1]. `rewards` drive the advantages and the
eval metrics (`compute_eval_metrics` averages them for `eval_<ds>_pass1` and takes their max for
`eval_<ds>_pass<n>`); `scores` feed dynamic filtering (`--algo.dynamic_filtering_range`, default
(0, 1)) and are logged as `score`; every `extra_logs` entry is logged under its own name.

Reward (DAPO): the response is the query without its prompt prefix; the answer is what follows the
LAST "Answer:" in the response's last `SEARCH_WINDOW` characters (rest of that line, `$`, `**`,
`\\(...\\)`, a wrapping `\\boxed{}` and a trailing period removed), falling back to the content of
the last `\\boxed{...}` (balanced braces). It is compared with the label by math-verify (`parse`
with LaTeX and expression extraction on the `$`-wrapped strings, then `verify(gold, prediction)`).
Equivalent: reward +1, score 1. Otherwise (no answer, not equivalent, timed out, any error):
reward -1, score 0.

Label format (decided by this project; `make_label` writes both):

- a plain answer string, e.g. `"42"` or `"\\frac{1}{2}"` (ints and floats are accepted too): the
  training reward, +1 / -1;
- a JSON object string `{"answer": "...", "reward": "accuracy"}` (or such a dict): the same check,
  but `rewards` are the 0/1 accuracy, so that OpenRLHF's eval metrics come out as mean@n and pass@n
  accuracies. `"reward": "pm1"` (or no "reward" key) means +1 / -1.

Robustness: `reward_func` never raises and returns within `OPENRLHF_BAND_REWARD_TIMEOUT` seconds
(default 1.5) of verification time per sample on any output, from any thread. math-verify's own
timeouts use `signal.alarm`, which only works in the main thread, so they are disabled; the
parse/verify runs on the rewards' timed worker pool (openrlhf_band/tasks/pool.py: spawned worker
processes, a check interrupted in its worker at 75% of the deadline and its worker killed at the
deadline, the waiting for a free worker bounded, lazy, per process), whose workers run
`openrlhf_band.tasks.math.verify` (the first check waits for them to import math-verify, a few
seconds; `warmup()` starts them ahead). Cheap pre-filters: only the response's tail is searched,
answers over `MAX_ANSWER_CHARS` count as no answer, and identical strings or two plain integers are
decided without a worker. A check that runs out of time (the deadline, or no worker free within
`OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT`, default 60 s) scores as not equivalent and counts in
`verify_timeout`; one whose worker died scores as not equivalent.

Environment (the pool's, prefix OPENRLHF_BAND_REWARD): OPENRLHF_BAND_REWARD_WORKERS (pool size;
default one per usable CPU, at least 2 and at most 8 per scoring process), OPENRLHF_BAND_REWARD_TIMEOUT,
OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT, OPENRLHF_BAND_REWARD_WORKER_MEM_MB (address-space cap per
worker, default 4096; 0 = none). POSIX only.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from openrlhf_band.tasks.pool import TimedPool
from openrlhf_band.tasks.reward_io import SPECIAL_TOKEN_RE, response_text, score_batch
from openrlhf_band.tasks.text import last_boxed

__all__ = ["extract_answer", "is_equivalent", "make_label", "reward_func", "warmup"]

SEARCH_WINDOW = 2000  # only the response's last characters are searched for the answer
MAX_ANSWER_CHARS = 1000  # longer extracted answers count as no answer
MAX_LABEL_CHARS = 10000
DEFAULT_TIMEOUT = 1.5  # seconds of verification per sample in reward_func
ACCURACY_MODE = "accuracy"

_logger = logging.getLogger(__name__)
_ANSWER_RE = re.compile(r"answer[ \t]*\**[ \t]*:[\s*]*([^\n]*)", re.IGNORECASE)
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_INT_RE = re.compile(r"[+-]?\d{1,200}")


# ----------------------------------------------------------------------------- answer extraction


def _clean(answer: str) -> str:
    """Strip the wrapping a model (or a dataset) puts around an answer: $, **, \\( \\), \\boxed{}, a final period."""
    if "\\boxed" in answer or "\\fbox" in answer:
        boxed = last_boxed(answer)
        if boxed is not None:
            answer = boxed
    answer = _UNESCAPED_DOLLAR_RE.sub("", answer)
    for _ in range(4):
        before = answer
        answer = answer.strip().strip("*").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if answer.startswith(left) and answer.endswith(right) and len(answer) >= 4:
                answer = answer[2:-2]
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1]
        if answer == before:
            break
    return answer


def extract_answer(text: Any) -> str | None:
    """The answer in a response: after the last "Answer:" (rest of that line), else the last \\boxed{}.

    Only the last `SEARCH_WINDOW` characters are searched; answers longer than `MAX_ANSWER_CHARS`
    (or empty after cleaning) give None.
    """
    try:
        if not isinstance(text, str):
            return None
        window = SPECIAL_TOKEN_RE.sub("", text[-(SEARCH_WINDOW + 64) :])[-SEARCH_WINDOW:]
        answer = None
        matches = _ANSWER_RE.findall(window)
        if matches:
            answer = _clean(matches[-1])
        if not answer:
            boxed = last_boxed(window)
            answer = _clean(boxed) if boxed is not None else None
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return None
        return answer
    except Exception:
        return None


# ----------------------------------------------------------------------------- labels


def make_label(answer: Any, accuracy: bool) -> str:
    """A label string: the plain answer (reward +1/-1) or, with `accuracy`, `{"answer": ..., "reward": "accuracy"}`."""
    answer = str(answer)
    if accuracy:
        return json.dumps({"answer": answer, "reward": ACCURACY_MODE})
    if _parse_label(answer) != (answer, False):  # a plain answer that would read as a JSON label
        return json.dumps({"answer": answer})
    return answer


def _parse_label(label: Any) -> tuple[str | None, bool]:
    """(answer, accuracy_mode) of a label; answer None when there is none."""
    if isinstance(label, str):
        text = label.strip()
        if text.startswith("{") and text.endswith("}"):
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and "answer" in obj:
                label = obj
    if isinstance(label, dict):
        accuracy = str(label.get("reward", "")).strip().lower() == ACCURACY_MODE
        answer = label.get("answer")
        return (None if answer is None else str(answer)), accuracy
    if label is None or isinstance(label, bool):
        return None, False
    if isinstance(label, (str, int, float)):
        return str(label), False
    return None, False


# ----------------------------------------------------------------------------- the pool

# One pool per loaded copy of this file (tasks/pool.py); its workers run openrlhf_band.tasks.math.verify's check.
POOL = TimedPool(
    "OPENRLHF_BAND_REWARD",
    "openrlhf_band.tasks.math.verify",
    failure=False,
    default_timeout=DEFAULT_TIMEOUT,
    logger=_logger,
    name="reward",
    create_error="reward: could not create the math-verify pool",
    acquire_warning="reward: no math-verify worker took a check in %.0f s; scored as wrong",
)
warmup = POOL.warmup  # public: start the workers ahead of the first check


# ----------------------------------------------------------------------------- public checks


def _equivalent(answer: Any, label: Any, timeout: float) -> tuple[bool, bool]:
    """(equivalent, timed_out) for an extracted answer and a label answer."""
    try:
        if answer is None or label is None:
            return False, False
        answer, label = str(answer), str(label)
        if len(answer) > 64 * MAX_ANSWER_CHARS or len(label) > MAX_LABEL_CHARS:
            return False, False
        answer, label = _clean(answer), _clean(label)
        if not answer or not label or len(answer) > MAX_ANSWER_CHARS:
            return False, False
        if answer == label:
            return True, False
        if _INT_RE.fullmatch(answer) and _INT_RE.fullmatch(label):
            return int(answer) == int(label), False
        return POOL.run("check", (answer, label), max(0.05, float(timeout)))  # verify.check, in a worker
    except Exception:
        return False, False


def is_equivalent(answer: Any, label: Any, timeout: float = 2.0) -> bool:
    """Whether `answer` is mathematically equivalent to `label` (math-verify), deciding within `timeout` s.

    Both are cleaned like extracted answers ($, \\boxed{}, a final period); a timeout or error is False.
    """
    return _equivalent(answer, label, timeout)[0]


def _score_one(query: Any, prompt: Any, label: Any, timeout: float) -> tuple[float, float, float, float]:
    """(reward, accuracy, answer_found, verify_timeout) for one sample."""
    accuracy_mode = False
    try:
        gold, accuracy_mode = _parse_label(label)
        answer = extract_answer(response_text(query, prompt))
        equivalent, timed_out = _equivalent(answer, gold, timeout) if answer is not None else (False, False)
        accuracy = 1.0 if equivalent else 0.0
        reward = accuracy if accuracy_mode else 2.0 * accuracy - 1.0
        return reward, accuracy, float(answer is not None), float(timed_out)
    except Exception:
        return (0.0 if accuracy_mode else -1.0), 0.0, 0.0, 0.0


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: +1/-1 (or 0/1 for accuracy labels) rewards, 0/1 scores. Never raises."""
    return score_batch(
        queries, prompts, labels, _score_one,
        logs=("answer_found", "verify_timeout"),
        failure=(-1.0, 0.0, 0.0, 0.0),  # no answer
        workers=POOL.worker_count,  # a batch: checked concurrently on the pool
        batch_args=lambda: (POOL.timeout(),),
    )  # fmt: skip


def _cli(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: reward.py RESPONSE LABEL   (or pass this file to OpenRLHF as --reward.remote_url)")
        return 2
    answer = extract_answer(argv[0])
    result = reward_func([argv[0]], [""], [argv[1]])
    print(json.dumps({"answer": answer, "reward": float(result["rewards"][0]), "score": float(result["scores"][0])}))
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
