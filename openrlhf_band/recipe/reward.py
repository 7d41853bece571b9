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
parse/verify runs in a small persistent pool of worker processes (fresh interpreters running this
file with `--verify-worker`; no pickling, no re-import of the parent's `__main__`). Each worker
interrupts itself (SIGALRM, in its own main thread) after 75% of the deadline; a worker that has not
answered by the deadline (stuck in C, e.g. a big-integer power) is killed and replaced in the
background. Cheap pre-filters: only the response's tail is searched, answers over
`MAX_ANSWER_CHARS` count as no answer, and identical strings or two plain integers are decided
without a worker. The pool starts lazily (its first use waits for the workers to import
math-verify, about a second), is per process (re-created after a fork) and is shut down at exit.
Waiting for a free worker is bounded separately (`OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT`, default
60 s); a sample that gets none is scored as not equivalent and counted in `verify_timeout`.

Environment: OPENRLHF_BAND_REWARD_WORKERS (pool size; default min(4, max(2, CPUs))),
OPENRLHF_BAND_REWARD_TIMEOUT, OPENRLHF_BAND_REWARD_ACQUIRE_TIMEOUT, OPENRLHF_BAND_REWARD_WORKER_MEM_MB
(address-space cap per worker, default 4096; 0 = none). POSIX only.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from openrlhf_band.recipe.text import last_boxed

__all__ = ["extract_answer", "is_equivalent", "make_label", "reward_func", "warmup"]

SEARCH_WINDOW = 2000  # only the response's last characters are searched for the answer
MAX_ANSWER_CHARS = 1000  # longer extracted answers count as no answer
MAX_LABEL_CHARS = 10000
DEFAULT_TIMEOUT = 1.5  # seconds of verification per sample in reward_func
SOFT_TIMEOUT_FRACTION = 0.75  # the worker interrupts itself at this fraction of the deadline
ACCURACY_MODE = "accuracy"

_WORKER_FLAG = "--verify-worker"
_STARTUP_TIMEOUT = 120.0
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


# ----------------------------------------------------------------------------- the worker process


class _SoftTimeout(BaseException):
    """Raised in a worker by its own SIGALRM; a BaseException so math-verify's `except Exception` lets it through."""


def _worker_checker():
    """Build the worker's check function (imports math-verify and sympy)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from sympy import Basic, MatrixBase

    config = [LatexExtractionConfig(), ExprExtractionConfig()]

    def squash(text: str) -> str:
        return re.sub(r"[\s,]", "", text)

    def parse_side(text: str) -> list:
        candidates = parse("$" + text + "$", extraction_config=config, parsing_timeout=None)
        if not any(isinstance(c, (Basic, MatrixBase)) for c in candidates):
            # The raw string, accepted only when the expression parser consumed all of it: a partial
            # match (`3` out of `3x`) would make a wrong answer equal to the label.
            raw = parse(text, extraction_config=config, parsing_timeout=None)
            if len(raw) >= 2 and isinstance(raw[0], (Basic, MatrixBase)) and squash(str(raw[1])) == squash(text):
                candidates = raw
        return candidates

    def check(answer: str, label: str) -> bool:
        gold = parse_side(label)
        if not gold:
            return False
        pred = parse_side(answer)
        if not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=None))

    return check


def _worker_main(argv: Sequence[str]) -> int:
    """Serve checks: one JSON request per line on stdin, one JSON reply per line on the protocol fd."""
    import signal
    import warnings

    parent = int(argv[0]) if argv and argv[0].isdigit() else 0
    if parent and os.getppid() != parent:
        return 0

    def watch_parent():  # exit when the parent is gone, even in the middle of a computation
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    if parent:
        threading.Thread(target=watch_parent, daemon=True).start()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        mem_mb = int(os.environ.get("OPENRLHF_BAND_REWARD_WORKER_MEM_MB", "4096"))
        if mem_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    except Exception:
        pass
    # Replies go to a private copy of stdout; anything a library prints goes to stderr instead.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_alarm(signum, frame):
        raise _SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    check = _worker_checker()
    check("\\frac{1}{2}", "0.5")  # warm the parsers' lazy imports and caches

    def reply(obj: dict) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(reply_fd, data) :]

    reply({"ready": True})
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        response = {"id": None, "ok": False, "timeout": False}
        try:
            try:
                request = json.loads(line)
                response["id"] = request.get("id")
                signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request.get("t", 1.0))))
                response["ok"] = check(str(request["a"]), str(request["l"]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            response["ok"], response["timeout"] = False, True
        except Exception:
            response["ok"] = False
        reply(response)


# ----------------------------------------------------------------------------- the pool (parent side)


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class _Worker:
    def __init__(self, script: str):
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, script, _WORKER_FLAG, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,  # no terminal SIGINT; exits on stdin EOF or when the parent dies
            env=env,
            bufsize=0,
        )
        self._in_fd = self.proc.stdin.fileno()
        self._out_fd = self.proc.stdout.fileno()
        self._buf = bytearray()
        self._seq = 0

    def _readline(self, deadline: float) -> bytes | None:
        poller = select.poll()  # not select.select: Ray processes can have fds above FD_SETSIZE
        poller.register(self._out_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            newline = self._buf.find(b"\n")
            if newline >= 0:
                line = bytes(self._buf[:newline])
                del self._buf[: newline + 1]
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(max(1, int(remaining * 1000))):
                return None
            chunk = os.read(self._out_fd, 65536)
            if not chunk or len(self._buf) > (1 << 20):
                return None
            self._buf += chunk

    def wait_ready(self, timeout: float) -> bool:
        line = self._readline(time.monotonic() + timeout)
        try:
            return line is not None and json.loads(line).get("ready") is True
        except ValueError:
            return False

    def check(self, answer: str, label: str, timeout: float) -> tuple[bool, bool, bool]:
        """(equivalent, timed_out, healthy); an unhealthy worker must be killed."""
        deadline = time.monotonic() + timeout
        self._seq += 1
        request = {"id": self._seq, "a": answer, "l": label, "t": timeout * SOFT_TIMEOUT_FRACTION}
        data = (json.dumps(request) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._in_fd, data) :]
        except OSError:
            return False, False, False
        while True:
            line = self._readline(deadline)
            if line is None:
                return False, True, False
            try:
                response = json.loads(line)
            except ValueError:
                return False, False, False
            if response.get("id") == self._seq:
                return response.get("ok") is True, response.get("timeout") is True, True

    def kill(self) -> None:
        try:
            self.proc.kill()
        except Exception:
            pass

    def reap(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: the worker exits
        except Exception:
            pass
        self.kill()
        self.reap()


class _Pool:
    def __init__(self, size: int, script: str):
        self.pid = os.getpid()
        self.size = size
        self._script = script
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._workers: set[_Worker] = set()
        self._dead_slots = 0
        self._closed = False
        for _ in range(size):
            self._respawn(None)

    @property
    def broken(self) -> bool:
        return self._dead_slots >= self.size

    def _respawn(self, old: _Worker | None) -> None:
        threading.Thread(target=self._spawn, args=(old,), daemon=True, name="reward-verify-spawn").start()

    def _spawn(self, old: _Worker | None) -> None:
        if old is not None:
            old.reap()
            with self._lock:
                self._workers.discard(old)
        for attempt in range(3):
            if self._closed:
                return
            worker = None
            try:
                worker = _Worker(self._script)
                with self._lock:
                    if self._closed:
                        worker.close()
                        return
                    self._workers.add(worker)
                if worker.wait_ready(_STARTUP_TIMEOUT):
                    self._idle.put(worker)
                    return
            except Exception:
                _logger.warning("reward: could not start a math-verify worker", exc_info=True)
            if worker is not None:
                worker.close()
                with self._lock:
                    self._workers.discard(worker)
            time.sleep(0.5 * (attempt + 1))
        with self._lock:
            self._dead_slots += 1
        _logger.error(
            "reward: a math-verify worker failed to start 3 times; %d of %d slots dead", self._dead_slots, self.size
        )

    def ready_count(self) -> int:
        return self._idle.qsize()

    def check(self, answer: str, label: str, timeout: float, acquire_timeout: float) -> tuple[bool, bool]:
        """(equivalent, timed_out)."""
        give_up = time.monotonic() + acquire_timeout
        worker = None
        while worker is None:
            if self._closed or self.broken:
                return False, True
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                _logger.warning("reward: no free math-verify worker within %.0f s; scored as wrong", acquire_timeout)
                return False, True
            try:
                worker = self._idle.get(timeout=min(0.5, remaining))
            except queue.Empty:
                pass
        healthy = False
        try:
            equivalent, timed_out, healthy = worker.check(answer, label, timeout)
            return equivalent, timed_out
        except Exception:
            return False, False
        finally:
            if healthy and not self._closed:
                self._idle.put(worker)
            else:
                worker.kill()
                self._respawn(worker)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.close()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool_size() -> int:
    try:
        return max(1, int(os.environ["OPENRLHF_BAND_REWARD_WORKERS"]))
    except (KeyError, ValueError):
        return min(4, max(2, os.cpu_count() or 2))


def _get_pool() -> _Pool | None:
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # first use, or inherited across a fork
            try:
                _POOL = _Pool(_pool_size(), os.path.abspath(__file__))
            except Exception:
                _logger.error("reward: could not create the math-verify pool", exc_info=True)
                return None
        return _POOL


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
        pool = _get_pool()
        give_up = time.monotonic() + timeout
        while pool is not None and not pool.broken and time.monotonic() < give_up:
            if pool.ready_count() >= pool.size:
                return True
            time.sleep(0.02)
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
    try:
        if isinstance(queries, str):
            queries, prompts, labels = [queries], [prompts], [labels]
        queries = list(queries) if queries is not None else []
        prompts = list(prompts) if prompts is not None else []
        labels = list(labels) if labels is not None else []
        n = len(queries)
        prompts = (prompts + [None] * n)[:n]
        labels = (labels + [None] * n)[:n]
        timeout = _env_float("OPENRLHF_BAND_REWARD_TIMEOUT", DEFAULT_TIMEOUT)
        if n <= 1:
            rows = [_score_one(q, p, lab, timeout) for q, p, lab in zip(queries, prompts, labels)]
        else:  # a batch: check the samples concurrently on the pool
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(n, _pool_size())) as executor:
                rows = list(executor.map(lambda args: _score_one(*args, timeout), zip(queries, prompts, labels)))
    except Exception:
        rows = []
    columns = [list(column) for column in zip(*rows)] if rows else [[], [], [], []]
    try:
        import torch

        def as_tensor(values):
            return torch.tensor(values, dtype=torch.float32)
    except Exception:

        def as_tensor(values):
            return values

    return {
        "rewards": as_tensor(columns[0]),
        "scores": as_tensor(columns[1]),
        "extra_logs": {"answer_found": as_tensor(columns[2]), "verify_timeout": as_tensor(columns[3])},
    }


def _cli(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: reward.py RESPONSE LABEL   (or pass this file to OpenRLHF as --reward.remote_url)")
        return 2
    answer = extract_answer(argv[0])
    result = reward_func([argv[0]], [""], [argv[1]])
    print(json.dumps({"answer": answer, "reward": float(result["rewards"][0]), "score": float(result["scores"][0])}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [_WORKER_FLAG]:
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit(_cli(sys.argv[1:]))
