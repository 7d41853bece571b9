"""The math-verify worker side of the math reward's timed pool (openrlhf_band/tasks/math/reward.py, tasks/pool.py).

Its functions run in the pool's worker processes, which `spawn` fresh interpreters: they are pickled
by reference, so they live here, in an importable module, not in the reward file (which OpenRLHF
loads under a name of its own). `init_worker` prepares a worker once; `check` answers one pair.
"""

from __future__ import annotations

import re
import signal

from openrlhf_band.tasks.pool import SoftTimeout, prepare_worker

_CHECK = None


def _build_checker():
    """The check function (imports math-verify and sympy)."""
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


def init_worker(parent_pid: int, mem_mb: int) -> None:
    """Once per worker: exit with the parent, cap memory, silence libraries, warm the parsers.

    math-verify's own timeouts use signal.alarm, which works only in a main thread, so they are off
    (`parsing_timeout=None`); a worker bounds itself with SIGALRM in its own main thread instead, and
    the pool kills it at the hard deadline if that does not work (a computation stuck in C).
    """
    global _CHECK

    prepare_worker(parent_pid, mem_mb, "reward")

    def on_alarm(signum, frame):
        raise SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    _CHECK = _build_checker()
    _CHECK("\\frac{1}{2}", "0.5")  # warm the parsers' lazy imports and caches


def check(answer: str, label: str, soft_timeout: float) -> tuple[bool, bool]:
    """(equivalent, timed_out): math-verify on one pair, interrupted after `soft_timeout` seconds."""
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, soft_timeout))
            return _CHECK(answer, label), False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except SoftTimeout:  # a BaseException: math-verify's own `except Exception` does not swallow it
        return False, True
    except Exception:
        return False, False
