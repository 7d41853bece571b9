"""Test helpers shared by the reward files' tests: load a reward file the way OpenRLHF 0.11.2 does, and call it
from a fresh non-main thread (OpenRLHF's worker threads) with its wall time."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path


def load_reward_file(path: Path, name: str = "reward_func"):
    """Exactly OpenRLHF 0.11.2's SingleTurnAgentExecutor: a standalone file, not a package import."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_thread(fn, *args, timeout: float = 30.0):
    """fn(*args) in a fresh non-main thread: (result, wall seconds); fails the test if it raises or hangs."""
    box = {}

    def run():
        start = time.monotonic()
        try:
            box["result"] = fn(*args)
        except BaseException as err:  # reported by the caller
            box["error"] = err
        box["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"reward_func did not return within {timeout:.0f} s"
    assert "error" not in box, f"reward_func raised {box.get('error')!r}"
    return box["result"], box["seconds"]
