"""The reasoning-gym reward as an OpenRLHF 0.11.2 reward file: pass `--reward.remote_url /path/to/gym_reward.py`.

For the rows that openrlhf_band/tasks/gym/data.py writes. The contract is reward.py's: OpenRLHF
loads this file with `importlib.util.spec_from_file_location` (only absolute imports work here) and
calls `reward_func([query], [prompt], [label])` from a worker thread, one sample per call; `query` is
the decoded prompt + response (special tokens included), `prompt` the chat-templated prompt, `label`
the row's `label`. It returns `{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {name:
Tensor[B]}}`, float32, and never raises.

Reward: the response is the query without its prompt prefix, chat special tokens removed; the answer
is the content of its LAST `<answer>...</answer>` (stripped; empty, over `MAX_ANSWER_CHARS` characters
or the prompt's placeholder "answer here": no answer). The score is reasoning-gym's own scorer,
`score_answer(answer, entry)` of the task named in the label (`reasoning_gym.get_score_answer_fn(task)`,
or the dataset built with the label's `config` when the data had options, since some scorers read
their config), a float in [0, 1] (anything else is clamped, NaN is 0); 0 when there is no answer (the
scorer is not asked: puzzle24's gives 0.01 even to None), the label is unusable, the scorer raises or
times out. Partial credit is the library's: its default scorer gives len(oracle) / len(answer) whenever
the oracle is a substring of the answer (oracle "4", answer "14": 0.5), gsm_symbolic 0.01 to any wrong
number, puzzle24 and countdown 0.01 to any attempt. `rewards` = 2 * score - 1 for training labels and
= score for labels with `"reward": "accuracy"` (OpenRLHF's `eval_<task>_pass1` is then the mean
score); `scores` = score (for dynamic filtering); `extra_logs`: `answer_found` (0/1) and
`score_timeout` (0/1).

Label: the JSON string `{"task": name, "entry": {"question", "answer", "metadata"}, "config": {...}?,
"reward": "accuracy"?}`, metadata tuples and non-string keys tagged by `gym_data.encode_json` and
restored here before scoring.

Bounded time: scorers can be slow or hang (several parse the model's answer with sympy). Scoring
runs in a pool of worker processes, pebble's `ProcessPool` of spawned interpreters (as in reward.py;
the parent is a threaded Ray / vLLM process). A worker interrupts itself (SIGALRM in its own main
thread) after 75% of the deadline `OPENRLHF_BAND_GYM_REWARD_TIMEOUT` (seconds per sample, default 2);
one that has not answered by the deadline (stuck in C: a huge integer power) is killed by pebble (at
once: the workers take SIGTERM's default action, not pebble's handler) and replaced. Either way the
sample scores 0 and counts in `score_timeout`. Waiting for a free worker is bounded separately
(`OPENRLHF_BAND_GYM_REWARD_ACQUIRE_TIMEOUT`, default 60 s); after it the pool is replaced. The pool
starts lazily (a worker needs about a second to import reasoning-gym; `warmup()` starts it ahead), is
per process (re-created after a fork) and is shut down at exit.

Not a sandbox: some reasoning-gym 0.1.25 scorers `eval()` the model's answer (string_insertion,
spiral_matrix, binary_matrix, n_queens) or pass it to sympy's `parse_expr` (puzzle24, countdown, the
integration and polynomial tasks). The workers only cap memory and time.

Environment: OPENRLHF_BAND_GYM_REWARD_WORKERS (pool size; default one per usable CPU, at least 2, at
most 8), OPENRLHF_BAND_GYM_REWARD_TIMEOUT, OPENRLHF_BAND_GYM_REWARD_ACQUIRE_TIMEOUT,
OPENRLHF_BAND_GYM_REWARD_WORKER_MEM_MB (address-space cap per worker, default 4096; 0 = none),
OPENRLHF_BAND_GYM_REWARD_IMPORTS (comma-separated modules the workers import at start, e.g. one that
registers your own tasks with `reasoning_gym.register_dataset`). POSIX only.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import math
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from openrlhf_band.tasks.gym.data import ACCURACY_MODE, decode_json
from openrlhf_band.tasks.math.reward import _SPECIAL_TOKEN_RE, _response_text
from openrlhf_band.tasks.reward_io import align, as_output, map_samples
from openrlhf_band.tasks.workers import prepare_worker

__all__ = ["extract_answer", "reward_func", "warmup"]

WORKER_MODULE = "openrlhf_band.tasks.gym.reward"  # the importable name of this file, for the workers
MAX_ANSWER_CHARS = 20_000  # longer answers count as no answer (reasoning-gym's longest answers: ~5k)
SEARCH_WINDOW = 4 * MAX_ANSWER_CHARS  # only the response's last characters are searched
MAX_LABEL_CHARS = 2_000_000
DEFAULT_TIMEOUT = 2.0  # seconds of scoring per sample
SOFT_TIMEOUT_FRACTION = 0.75  # the worker interrupts itself at this fraction of the deadline
DEFAULT_MAX_WORKERS = 8

_logger = logging.getLogger(__name__)
_OPEN, _CLOSE = "<answer>", "</answer>"
_PLACEHOLDER = "answer here"  # PROMPT_TEMPLATE's example: <answer>answer here</answer>


# ----------------------------------------------------------------------------- answers and labels


def extract_answer(text: Any) -> str | None:
    """The stripped content of the last `<answer>...</answer>` in `text`; None if there is none, it is
    empty or longer than `MAX_ANSWER_CHARS`. Chat special tokens are removed first."""
    try:
        if not isinstance(text, str):
            return None
        window = _SPECIAL_TOKEN_RE.sub("", text[-(SEARCH_WINDOW + 64) :])[-SEARCH_WINDOW:]
        end = window.rfind(_CLOSE)
        if end < 0:
            return None
        start = window.rfind(_OPEN, 0, end)
        if start < 0:
            return None
        answer = window[start + len(_OPEN) : end].strip()
        # the instruction's own placeholder (seen when the prompt could not be cut off the query) is no answer
        if not answer or len(answer) > MAX_ANSWER_CHARS or answer == _PLACEHOLDER:
            return None
        return answer
    except Exception:
        return None


def _parse_label(label: Any) -> tuple[tuple[str, dict, dict] | None, bool]:
    """((task, encoded entry, config) or None when unusable, accuracy_mode)."""
    if isinstance(label, str):
        if len(label) > MAX_LABEL_CHARS:
            return None, False
        try:
            label = json.loads(label)
        except (ValueError, RecursionError):
            return None, False
    if not isinstance(label, dict):
        return None, False
    accuracy = str(label.get("reward", "")).strip().lower() == ACCURACY_MODE
    task, entry, config = label.get("task"), label.get("entry"), label.get("config") or {}
    if not isinstance(task, str) or not isinstance(entry, dict) or not isinstance(config, dict):
        return None, accuracy
    return (task, entry, config), accuracy


# ----------------------------------------------------------------------------- the worker side
# These run in pebble's spawned workers, which unpickle them by reference from WORKER_MODULE.


class SoftTimeout(BaseException):
    """Raised in a worker by its own SIGALRM; a BaseException so that scorers' `except Exception` let it through."""


_SCORERS: dict[str, Any] = {}
_MAX_SCORERS = 64
_ALARM = {"fired": False}


def init_worker(parent_pid: int, mem_mb: int, imports: Sequence[str]) -> None:
    """Once per worker: exit with the parent, cap memory, silence libraries, import reasoning-gym."""
    prepare_worker(parent_pid, mem_mb, "gym-reward")
    sys.stdout = open(os.devnull, "w")  # some generators and scorers print

    def on_alarm(signum, frame):
        _ALARM["fired"] = True
        raise SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    import reasoning_gym  # noqa: F401

    for module in imports:
        try:
            importlib.import_module(module)
        except Exception:
            print(f"gym_reward: worker could not import {module!r}", file=sys.stderr)


def _scorer(task: str, config: dict):
    key = task + "\0" + json.dumps(config, sort_keys=True)
    fn = _SCORERS.get(key)
    if fn is None:
        import reasoning_gym

        if config:  # the scorer of the dataset the rows came from (some scorers read their config)
            fn = reasoning_gym.create_dataset(task, **config).score_answer
        else:
            fn = reasoning_gym.get_score_answer_fn(task)
        if len(_SCORERS) >= _MAX_SCORERS:
            _SCORERS.clear()
        _SCORERS[key] = fn
    return fn


def score(task: str, entry: dict, config: dict, answer: str, soft_timeout: float) -> tuple[float, bool]:
    """(score in [0, 1], timed_out): the task's scorer on one answer, interrupted after `soft_timeout` s."""
    _ALARM["fired"] = False
    try:
        # building a task's scorer (once per worker; arc_agi loads its data, ~0.5 s) is not the answer's time
        scorer, entry = _scorer(task, decode_json(config)), decode_json(entry)
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, soft_timeout))
            value = scorer(answer, entry)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if _ALARM["fired"]:  # a scorer with a bare `except:` swallowed the interruption
            return 0.0, True
        value = float(value)
        return (min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0), False
    except BaseException:  # SoftTimeout, the scorer's errors (some raise on malformed answers), a bad label
        return 0.0, _ALARM["fired"]


def ping(hold: float = 0.0) -> int:
    """This worker's pid, after `hold` seconds (pebble runs the initializer before any task)."""
    time.sleep(hold)
    return os.getpid()


# ----------------------------------------------------------------------------- the pool


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _pool_size() -> int:
    try:
        return max(1, int(os.environ["OPENRLHF_BAND_GYM_REWARD_WORKERS"]))
    except (KeyError, ValueError):
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        return max(2, min(DEFAULT_MAX_WORKERS, cpus))


class _Pool:
    """This process's scoring workers: a pebble `ProcessPool` of spawned interpreters.

    pebble kills a worker whose task outlives its timeout, or that dies, and starts a replacement. A
    task that no worker starts within the acquire timeout means the workers take no tasks at all: the
    whole pool is replaced.
    """

    def __init__(self, size: int):
        import multiprocessing

        import pebble

        # the functions the workers run, by their importable name (this file may be loaded under another)
        self._worker = importlib.import_module(WORKER_MODULE)
        self.pid = os.getpid()
        self.size = size
        mem_mb = int(_env_float("OPENRLHF_BAND_GYM_REWARD_WORKER_MEM_MB", 4096))
        imports = [m.strip() for m in os.environ.get("OPENRLHF_BAND_GYM_REWARD_IMPORTS", "").split(",") if m.strip()]
        self._pool = pebble.ProcessPool(
            max_workers=size,
            initializer=self._worker.init_worker,
            initargs=(self.pid, mem_mb, imports),
            context=multiprocessing.get_context("spawn"),
        )

    def worker_pids(self) -> set[int]:
        try:
            return {pid for pid, proc in self._pool._pool_manager.worker_manager.workers.items() if proc.is_alive()}
        except Exception:
            return set()

    def score(self, task: str, entry: dict, config: dict, answer: str, timeout: float) -> tuple[float, bool]:
        """(score, timed_out)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        acquire_timeout = _env_float("OPENRLHF_BAND_GYM_REWARD_ACQUIRE_TIMEOUT", 60.0)
        try:
            future = self._pool.schedule(
                self._worker.score,
                args=(task, entry, config, answer, timeout * SOFT_TIMEOUT_FRACTION),
                timeout=timeout,
            )
        except Exception:  # pebble's pool is broken or stopped: a new one for the next sample
            _replace_pool(self)
            return 0.0, True
        try:  # pebble ends a started task at `timeout`; the rest of the wait is for a free worker
            return future.result(timeout=acquire_timeout + timeout)
        except FutureTimeout:
            if future.running() or future.done():  # pebble's deadline: the worker is killed and replaced
                return 0.0, True
            future.cancel()
            _logger.warning("gym_reward: no worker took a sample in %.0f s; scored 0", acquire_timeout)
            _replace_pool(self)
            return 0.0, True
        except Exception:  # the worker died (pebble.ProcessExpired), the pool was stopped, ...
            return 0.0, False

    def ping_all(self) -> set[int]:
        from concurrent.futures import wait

        pings = [self._pool.schedule(self._worker.ping, args=(0.05,), timeout=10.0) for _ in range(self.size)]
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


def _get_pool() -> _Pool | None:
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # first use, or inherited across a fork
            try:
                _POOL = _Pool(_pool_size())
                # a multiprocessing child joins its non-daemon children before atexit: stop them first
                multiprocessing.util.Finalize(_POOL, _shutdown, exitpriority=100)
            except Exception:
                _logger.error("gym_reward: could not create the scoring pool", exc_info=True)
                return None
        return _POOL


def _replace_pool(broken: _Pool) -> None:
    """Drop a pool that takes no tasks: kill its workers now, wind pebble down in the background."""
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
    threading.Thread(target=broken.close, daemon=True, name="gym-reward-pool-close").start()


def _shutdown() -> None:
    """Stop this process's workers (at exit; a later sample starts a new pool)."""
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


# ----------------------------------------------------------------------------- OpenRLHF's hook


def _score_one(query: Any, prompt: Any, label: Any, timeout: float) -> tuple[float, float, float, float]:
    """(reward, score, answer_found, score_timeout) for one sample."""
    accuracy_mode = False
    try:
        parsed, accuracy_mode = _parse_label(label)
        answer = extract_answer(_response_text(query, prompt))
        value, timed_out = 0.0, False
        if answer is not None and parsed is not None:
            pool = _get_pool()
            if pool is None:
                timed_out = True
            else:
                value, timed_out = pool.score(*parsed, answer, max(0.05, timeout))
        reward = value if accuracy_mode else 2.0 * value - 1.0
        return reward, value, float(answer is not None), float(timed_out)
    except Exception:
        return (0.0 if accuracy_mode else -1.0), 0.0, 0.0, 0.0


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: rewards 2*score-1 (or the score, for accuracy labels), scores in [0, 1],
    each a float32 Tensor[B]; extra_logs answer_found and score_timeout, Tensor[B]. Never raises."""
    queries, prompts, labels = align(queries, prompts, labels)
    try:
        timeout = _env_float("OPENRLHF_BAND_GYM_REWARD_TIMEOUT", DEFAULT_TIMEOUT)
        samples = [(q, p, lab, timeout) for q, p, lab in zip(queries, prompts, labels)]
        rows = map_samples(_score_one, samples, _pool_size())  # a batch: scored concurrently on the pool
    except Exception:  # one row per sample whatever happens: no answer, score 0
        rows = [(0.0, 0.0, 0.0, 0.0)] * len(queries)
    columns = [list(column) for column in zip(*rows)] if rows else [[], [], [], []]
    return as_output(columns[0], columns[1], {"answer_found": columns[2], "score_timeout": columns[3]})
