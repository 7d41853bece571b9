"""The timed worker pool of the rewards whose scorer can hang (the math reward's math-verify, reasoning-gym's scorers).

OpenRLHF calls a reward file's `reward_func` from worker threads, where signal timeouts do not work, and a scorer
can be stuck in C (a big-integer power) where no Python-level timeout reaches it. So each sample is scored in a
worker process with a deadline. A reward module makes one `TimedPool` at import (one per loaded copy of the file:
OpenRLHF loads it under a name of its own) and calls `run(task, args, timeout)` from any thread:

- the workers are pebble's `ProcessPool` of spawned interpreters (spawn, not fork: the parent is a threaded Ray /
  vLLM process, which fork would copy mid-flight) running the functions of one importable worker module, looked up
  by name there (they are pickled by reference: a reward file loaded under another name still sends the package
  module's functions);
- a task gets `timeout * SOFT_TIMEOUT_FRACTION` (75%) as its last argument and interrupts itself then (SIGALRM, in
  the worker's own main thread); a worker that has not answered at `timeout` is killed by pebble at once (the
  workers take SIGTERM's default action: `prepare_worker`) and replaced, and so is one that dies;
- waiting for a free worker is bounded separately (PREFIX_ACQUIRE_TIMEOUT, default 60 s): a task that no worker
  starts in that time means the workers take no tasks at all (stopped, wedged between tasks), and the whole pool is
  replaced (its workers SIGKILLed, pebble's threads wound down in the background);
- the pool starts lazily (its first task waits for the workers to import their libraries; `warmup` starts it
  ahead), is per process (re-created after a fork) and is shut down at exit.

`run` never raises. It returns `(value, timed_out)`: the task's own value, or the pool's failure value with
timed_out True when the deadline or the acquire timeout passed or no pool could be had, and with timed_out False
when the worker died or the pool was stopped under the task.

Environment of a pool made with env prefix PREFIX (e.g. OPENRLHF_BAND_REWARD): PREFIX_WORKERS (pool size; default
one per usable CPU, at least 2 and at most `DEFAULT_MAX_WORKERS` = 8 per scoring process), PREFIX_TIMEOUT (seconds
per task; the reward's default), PREFIX_ACQUIRE_TIMEOUT (seconds, default 60), PREFIX_WORKER_MEM_MB (address-space
cap per worker in MiB, default 4096; 0 = none). POSIX only.

A worker module defines `init_worker(parent_pid, mem_mb, *extra_initargs)`, which calls `prepare_worker` first, and
the task functions, each taking its soft timeout (seconds) last. The workers import this module too, so it imports
only the standard library at import time (pebble when a pool starts).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import multiprocessing.util
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "SOFT_TIMEOUT_FRACTION",
    "SoftTimeout",
    "TimedPool",
    "Workers",
    "env_float",
    "ping",
    "prepare_worker",
]

DEFAULT_MAX_WORKERS = 8  # per scoring process; see docs/recipe.md (reward) for the measured rate
SOFT_TIMEOUT_FRACTION = 0.75  # a task interrupts itself at this fraction of its deadline
DEFAULT_ACQUIRE_TIMEOUT = 60.0  # seconds a task may wait for a free worker
DEFAULT_WORKER_MEM_MB = 4096


def env_float(name: str, default: float) -> float:
    """The environment variable `name` as a float; `default` when it is unset or not a number."""
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- the worker side
# These run in the spawned workers, in a fresh interpreter (standard library only).


class SoftTimeout(BaseException):
    """Raised in a worker by its own SIGALRM; a BaseException so that a library's `except Exception` lets it through."""


def prepare_worker(parent_pid: int, mem_mb: int, name: str) -> None:
    """What every worker's initializer does first: exit with the parent, no core files, cap the address space at
    `mem_mb` MiB (0: none), silence libraries, ignore Ctrl-C (the parent handles it), one BLAS / OpenMP thread.

    SIGTERM goes back to its default action: pebble installs a Python handler, which a worker stuck in C never
    runs, so pebble would wait its term_timeout (3 s) before SIGKILL, with its manager thread (every other
    sample's deadline) blocked meanwhile.
    """

    def watch_parent() -> None:  # exit when the parent is gone, even in the middle of a computation
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True, name=f"{name}-watch-parent").start()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if mem_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    except Exception:
        pass
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"


def ping(hold: float = 0.0) -> int:
    """This worker's pid, after `hold` seconds (pebble runs the initializer before any task)."""
    time.sleep(hold)
    return os.getpid()


# ----------------------------------------------------------------------------- the parent side


class Workers:
    """One process's workers: a pebble `ProcessPool` of `size` spawned interpreters running `worker`'s functions.

    pebble kills a worker whose task outlives its timeout, or that dies, and starts a replacement.
    """

    def __init__(self, size: int, worker_module: str, mem_mb: int, extra_initargs: tuple):
        import multiprocessing

        import pebble

        # the functions the workers run, by their importable name (a reward file may be loaded under another)
        self.worker = importlib.import_module(worker_module)
        self.pid = os.getpid()
        self.size = size
        self._pool = pebble.ProcessPool(
            max_workers=size,
            initializer=self.worker.init_worker,
            initargs=(self.pid, mem_mb, *extra_initargs),
            context=multiprocessing.get_context("spawn"),
        )

    def schedule(self, task: str, args: tuple, timeout: float):
        """pebble's future of `worker.task(*args)`, ended (its worker killed) `timeout` s after a worker starts it."""
        return self._pool.schedule(getattr(self.worker, task), args=args, timeout=timeout)

    def worker_pids(self) -> set[int]:
        """The live workers' pids (pebble keeps them in its worker manager)."""
        try:
            return {pid for pid, proc in self._pool._pool_manager.worker_manager.workers.items() if proc.is_alive()}
        except Exception:
            return set()

    def ping_all(self) -> set[int]:
        """The pids of the workers that answer one round of pings (each holds its ping briefly, so
        that one ready worker cannot take them all; a worker answers only after its start-up)."""
        from concurrent.futures import wait

        pings = [self._pool.schedule(ping, args=(0.05,), timeout=10.0) for _ in range(self.size)]
        done, _ = wait(pings, timeout=2.0)
        return {answer.result() for answer in done if answer.exception() is None}

    def close(self) -> None:
        try:
            self._pool.stop()
            self._pool.join(timeout=10)
        except Exception:
            pass


class TimedPool:
    """A reward's scoring pool: this process's `Workers`, started on first use, replaced when they take no tasks.

    `env_prefix` names its environment (module docstring); `worker_module` is the importable module whose
    `init_worker` and task functions the workers run; `failure` is the value a task that gives none scores;
    `default_timeout` is the per-task deadline (s) when PREFIX_TIMEOUT is unset; `extra_initargs()` gives the
    arguments `init_worker` takes after (parent_pid, mem_mb), read when a pool starts. `logger`, `create_error`
    (the error logged when no pool can be started) and `acquire_warning` (logged, with the acquire timeout in s
    for its `%.0f`, when no worker takes a task) are the reward's own; `name` names the pool's threads.
    """

    def __init__(
        self,
        env_prefix: str,
        worker_module: str,
        failure: Any,
        default_timeout: float,
        *,
        logger: logging.Logger,
        name: str,
        create_error: str,
        acquire_warning: str,
        extra_initargs: Callable[[], tuple] = tuple,
    ):
        self.env_prefix = env_prefix
        self.worker_module = worker_module
        self.failure = failure
        self.default_timeout = default_timeout
        self.name = name
        self._logger = logger
        self._create_error = create_error
        self._acquire_warning = acquire_warning
        self._extra_initargs = extra_initargs
        self._workers: Workers | None = None
        self._finalizer_pid: int | None = None  # the process whose exit stops the workers (after a fork: none yet)
        self._lock = threading.Lock()
        atexit.register(self.shutdown)

    @property
    def current(self) -> Workers | None:
        """The workers last started (in this process, or in a parent before a fork); None before the first task,
        after `shutdown` or after a replacement until the next task."""
        return self._workers

    def worker_count(self) -> int:
        """PREFIX_WORKERS, else one worker per usable CPU up to DEFAULT_MAX_WORKERS (at least 2)."""
        try:
            return max(1, int(os.environ[f"{self.env_prefix}_WORKERS"]))
        except (KeyError, ValueError):
            return max(2, min(DEFAULT_MAX_WORKERS, _usable_cpus()))

    def timeout(self) -> float:
        """Seconds per task: PREFIX_TIMEOUT, else `default_timeout`."""
        return env_float(f"{self.env_prefix}_TIMEOUT", self.default_timeout)

    def run(self, task: str, args: tuple, timeout: float) -> tuple[Any, bool]:
        """(value, timed_out) of `worker_module.task(*args, timeout * SOFT_TIMEOUT_FRACTION)` in a worker, which
        is killed `timeout` s after it starts the task; the wait for a free worker is bounded by
        PREFIX_ACQUIRE_TIMEOUT. (failure, True) when time ran out or there is no pool, (failure, False) when the
        worker died. Never raises."""
        from concurrent.futures import TimeoutError as FutureTimeout

        workers = self._get()
        if workers is None:
            return self.failure, True
        acquire_timeout = env_float(f"{self.env_prefix}_ACQUIRE_TIMEOUT", DEFAULT_ACQUIRE_TIMEOUT)
        try:
            future = workers.schedule(task, (*args, timeout * SOFT_TIMEOUT_FRACTION), timeout)
        except Exception:  # pebble's pool is broken or stopped: a new one for the next task
            self._replace(workers)
            return self.failure, True
        try:  # pebble ends a started task at `timeout`; the rest of the wait is for a free worker
            return future.result(timeout=acquire_timeout + timeout)
        except FutureTimeout:
            if future.running() or future.done():  # pebble's deadline: the worker is killed and replaced
                return self.failure, True
            future.cancel()  # no worker took it: the pool is not taking tasks at all
            self._logger.warning(self._acquire_warning, acquire_timeout)
            self._replace(workers)
            return self.failure, True
        except Exception:  # the worker died (pebble.ProcessExpired), the pool was stopped, ...
            return self.failure, False

    def warmup(self, timeout: float = 60.0) -> bool:
        """Start the worker pool now and wait until all its workers are ready (True) or `timeout` passes."""
        try:
            give_up, answered = time.monotonic() + timeout, set()
            while time.monotonic() < give_up:
                workers = self._get()
                if workers is None:
                    return False
                answered |= workers.ping_all()
                alive = workers.worker_pids()
                if len(alive) >= workers.size and alive <= answered:
                    return True
            return False
        except Exception:
            return False

    def shutdown(self) -> None:
        """Stop this process's workers (at exit; a later task starts a new pool)."""
        with self._lock:
            workers, self._workers = self._workers, None
        if workers is not None and workers.pid == os.getpid():
            workers.close()

    def _get(self) -> Workers | None:
        workers = self._workers
        if workers is not None and workers.pid == os.getpid():
            return workers
        with self._lock:
            if self._workers is None or self._workers.pid != os.getpid():  # first use, or inherited across a fork
                try:
                    mem_mb = int(env_float(f"{self.env_prefix}_WORKER_MEM_MB", DEFAULT_WORKER_MEM_MB))
                    self._workers = Workers(self.worker_count(), self.worker_module, mem_mb, self._extra_initargs())
                    if self._finalizer_pid != os.getpid():
                        # also at the end of a multiprocessing child, which joins its non-daemon children
                        # (pebble's workers) before atexit handlers would run: stop them first. Once per process
                        # and tied to no Workers object: a replaced pool, once collected, would otherwise run
                        # shutdown and take its successor down with it
                        multiprocessing.util.Finalize(None, self.shutdown, exitpriority=100)
                        self._finalizer_pid = os.getpid()
                except Exception:
                    self._logger.error(self._create_error, exc_info=True)
                    return None
            return self._workers

    def _replace(self, broken: Workers) -> None:
        """Drop workers that take no tasks: killed now (they may be stopped, so SIGTERM would wait), pebble's
        threads wound down in the background; the next task starts a new pool."""
        with self._lock:
            if self._workers is not broken:
                return
            self._workers = None
        for pid in broken.worker_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        threading.Thread(target=broken.close, daemon=True, name=f"{self.name}-pool-close").start()
