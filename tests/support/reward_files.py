"""Test helpers shared by the reward files' tests: load a reward file the way OpenRLHF 0.11.2 does, call it from a
fresh non-main thread (OpenRLHF's worker threads) with its wall time, and score through OpenRLHF's own executor."""

from __future__ import annotations

import asyncio
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


def rewards_via_openrlhf(path: Path, queries: list, prompts: list, labels: list) -> list[dict]:
    """One reward dict per sample, as OpenRLHF 0.11.2's rollout gets them: its SingleTurnAgentExecutor loads its own
    copy of the reward file at `path` and calls `reward_func` once per sample, each call on a worker thread
    (`asyncio.to_thread`). The timed pools that copy started (tasks/pool.py) are shut down afterwards."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from openrlhf_band.tasks.pool import TimedPool

    executor = SingleTurnAgentExecutor(remote_rm_url=str(path))
    try:
        return asyncio.run(executor._fetch_rewards_via_func(queries, prompts, labels))
    finally:
        for value in list(executor.reward_func.__globals__.values()):
            if isinstance(value, TimedPool):
                value.shutdown()


def one_value_per_sample(info: dict) -> tuple[float, float]:
    """(reward, score) of one sample's reward dict, after checking that what OpenRLHF's samples generator does
    with it (`_process_response_into_experience`: `torch.tensor([value])`) gives one value per entry."""
    import torch

    assert set(info) == {"rewards", "scores", "extra_logs"}
    rewards, scores = torch.tensor([info["rewards"]]), torch.tensor([info["scores"]])
    assert rewards.shape == scores.shape == (1,)
    for value in info["extra_logs"].values():
        assert torch.tensor([value.flatten()[0].item()]).shape == (1,)
    return rewards.item(), scores.item()
