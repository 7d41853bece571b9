"""The DAPO math reward as an OpenRLHF 0.11.2 reward file: pass `--reward.remote_url /path/to/reward.py`.

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
parse/verify runs in a pool of worker processes, pebble's `ProcessPool` (spawned interpreters running
`openrlhf_band.tasks.math.verify`). Each worker interrupts itself (SIGALRM, in its own main thread) after
75% of the deadline; a worker that has not answered by the deadline (stuck in C, e.g. a big-integer
power) is killed by pebble and replaced, and so is one that dies. Cheap pre-filters: only the
response's tail is searched, answers over `MAX_ANSWER_CHARS` count as no answer, and identical
strings or two plain integers are decided without a worker. The pool starts lazily (its first use
waits for the workers to import math-verify, a few seconds), is per process (re-created after a fork)
and is shut down at exit. Waiting for a free worker is bounded separately
(`OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT`, default 60 s): a sample that no worker takes in that time is
scored as not equivalent and counted in `verify_timeout`, and the pool, evidently not taking tasks,
is replaced.

Environment: OPENRLHF_BAND_REWARD_WORKERS (pool size; default one per usable CPU, at least 2 and at
most `DEFAULT_MAX_WORKERS` = 8 per scoring process), OPENRLHF_BAND_REWARD_TIMEOUT,
OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT, OPENRLHF_BAND_REWARD_WORKER_MEM_MB (address-space cap per
worker, default 4096; 0 = none). POSIX only.
"""

from __future__ import annotations

import atexit
import json
import logging
import multiprocessing.util
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from openrlhf_band.tasks.reward_io import align, as_output, map_samples
from openrlhf_band.tasks.text import last_boxed

__all__ = ["extract_answer", "is_equivalent", "make_label", "reward_func", "warmup"]

SEARCH_WINDOW = 2000  # only the response's last characters are searched for the answer
MAX_ANSWER_CHARS = 1000  # longer extracted answers count as no answer
MAX_LABEL_CHARS = 10000
DEFAULT_TIMEOUT = 1.5  # seconds of verification per sample in reward_func
SOFT_TIMEOUT_FRACTION = 0.75  # the worker interrupts itself at this fraction of the deadline
ACCURACY_MODE = "accuracy"

DEFAULT_MAX_WORKERS = 8  # per scoring process; see docs/recipe.md (reward) for the measured rate
_logger = logging.getLogger(__name__)

# Special tokens that `decode(..., skip_special_tokens=False)` leaves in the query (Qwen/Llama-3
# `<|...|>`, DeepSeek `<｜...｜>`, Llama-2/Mistral `</s>`, Gemma `<eos>` / `<end_of_turn>`).
_SPECIAL_TOKEN_RE = re.compile(r"<\|[^<>|\s]{1,48}\|>|<｜[^<>｜]{1,48}｜>|</?s>|<eos>|<end_of_turn>|<pad>")
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
        window = _SPECIAL_TOKEN_RE.sub("", text[-(SEARCH_WINDOW + 64) :])[-SEARCH_WINDOW:]
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


def _response_text(query: Any, prompt: Any) -> str:
    """The response part of an OpenRLHF query (decoded prompt + response)."""
    if not isinstance(query, str):
        return ""
    if isinstance(prompt, str) and prompt:
        if query.startswith(prompt):
            return query[len(prompt) :]
        # Decoding may not reproduce the prompt exactly (or it was truncated from the left): find its tail.
        tail = prompt[-64:]
        idx = query.find(tail)
        if idx >= 0:
            return query[idx + len(tail) :]
    return query


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


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class _Pool:
    """This process's math-verify workers: a pebble `ProcessPool` of spawned interpreters.

    pebble kills a worker whose task outlives its timeout and starts a replacement; a worker that
    dies is replaced the same way. A task that no worker starts within the acquire timeout means the
    workers are not taking tasks at all (stopped, wedged between tasks): the whole pool is replaced.
    """

    def __init__(self, size: int):
        import multiprocessing

        import pebble

        from openrlhf_band.tasks.math import verify

        self.pid = os.getpid()
        self.size = size
        self._verify = verify
        mem_mb = int(_env_float("OPENRLHF_BAND_REWARD_WORKER_MEM_MB", 4096))
        # spawn, not fork: the parent is a threaded Ray / vLLM process, which fork would copy mid-flight
        self._pool = pebble.ProcessPool(
            max_workers=size,
            initializer=verify.init_worker,
            initargs=(self.pid, mem_mb),
            context=multiprocessing.get_context("spawn"),
        )

    def worker_pids(self) -> set[int]:
        """The live workers' pids (pebble keeps them in its worker manager)."""
        try:
            return {pid for pid, proc in self._pool._pool_manager.worker_manager.workers.items() if proc.is_alive()}
        except Exception:
            return set()

    def check(self, answer: str, label: str, timeout: float, acquire_timeout: float) -> tuple[bool, bool]:
        """(equivalent, timed_out)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        try:
            future = self._pool.schedule(
                self._verify.check, args=(answer, label, timeout * SOFT_TIMEOUT_FRACTION), timeout=timeout
            )
        except Exception:  # pebble's pool is broken or stopped: a new one for the next check
            _replace_pool(self)
            return False, True
        try:  # pebble ends a started check at `timeout`; the rest of the wait is for a free worker
            return future.result(timeout=acquire_timeout + timeout)
        except FutureTimeout:
            if future.running() or future.done():  # pebble's deadline: the worker is killed and replaced
                return False, True
            future.cancel()  # no worker took it: the pool is not taking tasks at all
            _logger.warning("reward: no math-verify worker took a check in %.0f s; scored as wrong", acquire_timeout)
            _replace_pool(self)
            return False, True
        except Exception:  # the worker died (pebble.ProcessExpired), the pool was stopped, ...
            return False, False

    def ping_all(self) -> set[int]:
        """The pids of the workers that answer one round of pings (each holds its ping briefly, so
        that one ready worker cannot take them all; a worker answers only after its start-up)."""
        from concurrent.futures import wait

        pings = [self._pool.schedule(self._verify.ping, args=(0.05,), timeout=10.0) for _ in range(self.size)]
        done, _ = wait(pings, timeout=2.0)
        return {ping.result() for ping in done if ping.exception() is None}

    def close(self) -> None:
        try:
            self._pool.stop()
            self._pool.join(timeout=10)
        except Exception:
            pass


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _pool_size() -> int:
    """OPENRLHF_BAND_REWARD_WORKERS, else one worker per usable CPU up to DEFAULT_MAX_WORKERS (at least 2)."""
    try:
        return max(1, int(os.environ["OPENRLHF_BAND_REWARD_WORKERS"]))
    except (KeyError, ValueError):
        return max(2, min(DEFAULT_MAX_WORKERS, _usable_cpus()))


def _get_pool() -> _Pool | None:
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # first use, or inherited across a fork
            try:
                _POOL = _Pool(_pool_size())
                # also at the end of a multiprocessing child, which joins its non-daemon children
                # (pebble's workers) before atexit handlers would run: stop them first
                multiprocessing.util.Finalize(_POOL, _shutdown, exitpriority=100)
            except Exception:
                _logger.error("reward: could not create the math-verify pool", exc_info=True)
                return None
        return _POOL


def _replace_pool(broken: _Pool) -> None:
    """Drop a pool that takes no tasks: its workers are killed now (they may be stopped, so SIGTERM
    would wait), pebble's threads wound down in the background; the next check starts a new pool."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not broken:
            return
        _POOL = None
    for pid in broken.worker_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    threading.Thread(target=broken.close, daemon=True, name="reward-pool-close").start()


def _shutdown() -> None:
    """Stop this process's workers (at exit; a later check starts a new pool)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


atexit.register(_shutdown)


def warmup(timeout: float = 60.0) -> bool:
    """Start the worker pool now and wait until all its workers are ready (True) or `timeout` passes."""
    try:
        give_up, answered = time.monotonic() + timeout, set()
        while time.monotonic() < give_up:
            pool = _get_pool()
            if pool is None:
                return False
            answered |= pool.ping_all()
            alive = pool.worker_pids()
            if len(alive) >= pool.size and alive <= answered:
                return True
        return False
    except Exception:
        return False


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
        pool = _get_pool()
        if pool is None:
            return False, True
        acquire_timeout = _env_float("OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT", 60.0)
        return pool.check(answer, label, max(0.05, float(timeout)), acquire_timeout)
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
        answer = extract_answer(_response_text(query, prompt))
        equivalent, timed_out = _equivalent(answer, gold, timeout) if answer is not None else (False, False)
        accuracy = 1.0 if equivalent else 0.0
        reward = accuracy if accuracy_mode else 2.0 * accuracy - 1.0
        return reward, accuracy, float(answer is not None), float(timed_out)
    except Exception:
        return (0.0 if accuracy_mode else -1.0), 0.0, 0.0, 0.0


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: +1/-1 (or 0/1 for accuracy labels) rewards, 0/1 scores. Never raises."""
    queries, prompts, labels = align(queries, prompts, labels)
    try:
        timeout = _env_float("OPENRLHF_BAND_REWARD_TIMEOUT", DEFAULT_TIMEOUT)
        samples = [(q, p, lab, timeout) for q, p, lab in zip(queries, prompts, labels)]
        rows = map_samples(_score_one, samples, _pool_size())  # a batch: checked concurrently on the pool
    except Exception:  # one row per sample whatever happens: no answer
        rows = [(-1.0, 0.0, 0.0, 0.0)] * len(queries)
    columns = [list(column) for column in zip(*rows)] if rows else [[], [], [], []]
    return as_output(columns[0], columns[1], {"answer_found": columns[2], "verify_timeout": columns[3]})


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
