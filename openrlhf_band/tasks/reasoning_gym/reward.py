"""The reasoning-gym reward as an OpenRLHF 0.11.2 reward file: `--reward.remote_url .../tasks/reasoning_gym/reward.py`.

For the rows that openrlhf_band/tasks/reasoning_gym/data.py writes. The contract is reward.py's: OpenRLHF
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
"reward": "accuracy"?}`, metadata tuples and non-string keys tagged by `data.encode_json` and
restored here before scoring.

Bounded time: scorers can be slow or hang (several parse the model's answer with sympy). Scoring
runs on the rewards' timed worker pool (openrlhf_band/tasks/pool.py: spawned worker processes, lazy,
per process), whose workers run this file's worker functions by its importable name `WORKER_MODULE`
(OpenRLHF loads the file under another) and import reasoning-gym at start (about a second; `warmup()`
starts them ahead). A scorer is interrupted in its worker (SIGALRM) after 75% of the deadline
`OPENRLHF_BAND_GYM_REWARD_TIMEOUT` (seconds per sample, default 2; a scorer whose bare `except:`
swallows the interruption still counts as interrupted); a worker that has not answered by the deadline
(stuck in C: a huge integer power) is killed and replaced. Either way the sample scores 0 and counts in
`score_timeout`, as does one that no worker takes within `OPENRLHF_BAND_GYM_REWARD_ACQUIRE_TIMEOUT`
(default 60 s); one whose worker died scores 0.

Not a sandbox: some reasoning-gym 0.1.25 scorers `eval()` the model's answer (string_insertion,
spiral_matrix, binary_matrix, n_queens) or pass it to sympy's `parse_expr` (puzzle24, countdown, the
integration and polynomial tasks). The workers only cap memory and time.

Environment (the pool's, prefix OPENRLHF_BAND_GYM_REWARD): OPENRLHF_BAND_GYM_REWARD_WORKERS (pool size;
default one per usable CPU, at least 2, at most 8), OPENRLHF_BAND_GYM_REWARD_TIMEOUT,
OPENRLHF_BAND_GYM_REWARD_ACQUIRE_TIMEOUT, OPENRLHF_BAND_GYM_REWARD_WORKER_MEM_MB (address-space cap per
worker, default 4096; 0 = none); and OPENRLHF_BAND_GYM_REWARD_IMPORTS (comma-separated modules the
workers import at start, e.g. one that registers your own tasks with `reasoning_gym.register_dataset`).
POSIX only.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from openrlhf_band.tasks.pool import SoftTimeout, TimedPool, prepare_worker
from openrlhf_band.tasks.reasoning_gym.data import ACCURACY_MODE, decode_json
from openrlhf_band.tasks.reward_io import SPECIAL_TOKEN_RE, response_text, score_batch

__all__ = ["extract_answer", "reward_func", "warmup"]

WORKER_MODULE = "openrlhf_band.tasks.reasoning_gym.reward"  # the importable name of this file, for the workers
MAX_ANSWER_CHARS = 20_000  # longer answers count as no answer (reasoning-gym's longest answers: ~5k)
SEARCH_WINDOW = 4 * MAX_ANSWER_CHARS  # only the response's last characters are searched
MAX_LABEL_CHARS = 2_000_000
DEFAULT_TIMEOUT = 2.0  # seconds of scoring per sample

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
        window = SPECIAL_TOKEN_RE.sub("", text[-(SEARCH_WINDOW + 64) :])[-SEARCH_WINDOW:]
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
# These run in the pool's spawned workers, which unpickle them by reference from WORKER_MODULE.


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


# ----------------------------------------------------------------------------- the pool


def _worker_imports() -> tuple[list[str]]:
    """init_worker's `imports`: the modules named in OPENRLHF_BAND_GYM_REWARD_IMPORTS (comma-separated)."""
    return ([m.strip() for m in os.environ.get("OPENRLHF_BAND_GYM_REWARD_IMPORTS", "").split(",") if m.strip()],)


# One pool per loaded copy of this file (tasks/pool.py); its workers run WORKER_MODULE's score, by that name.
POOL = TimedPool(
    "OPENRLHF_BAND_GYM_REWARD",
    WORKER_MODULE,
    failure=0.0,
    default_timeout=DEFAULT_TIMEOUT,
    logger=_logger,
    name="gym-reward",
    create_error="gym_reward: could not create the scoring pool",
    acquire_warning="gym_reward: no worker took a sample in %.0f s; scored 0",
    extra_initargs=_worker_imports,
)
warmup = POOL.warmup  # public: start the workers ahead of the first sample


# ----------------------------------------------------------------------------- OpenRLHF's hook


def _score_one(query: Any, prompt: Any, label: Any, timeout: float) -> tuple[float, float, float, float]:
    """(reward, score, answer_found, score_timeout) for one sample."""
    accuracy_mode = False
    try:
        parsed, accuracy_mode = _parse_label(label)
        answer = extract_answer(response_text(query, prompt))
        value, timed_out = 0.0, False
        if answer is not None and parsed is not None:
            value, timed_out = POOL.run("score", (*parsed, answer), max(0.05, timeout))
        reward = value if accuracy_mode else 2.0 * value - 1.0
        return reward, value, float(answer is not None), float(timed_out)
    except Exception:
        return (0.0 if accuracy_mode else -1.0), 0.0, 0.0, 0.0


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: rewards 2*score-1 (or the score, for accuracy labels), scores in [0, 1],
    each a float32 Tensor[B]; extra_logs answer_found and score_timeout, Tensor[B]. Never raises."""
    return score_batch(
        queries, prompts, labels, _score_one,
        logs=("answer_found", "score_timeout"),
        failure=(0.0, 0.0, 0.0, 0.0),  # no answer, score 0
        workers=POOL.worker_count,  # a batch: scored concurrently on the pool
        batch_args=lambda: (POOL.timeout(),),
    )  # fmt: skip
