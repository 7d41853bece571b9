"""Where the recipe's modules went: every old path fails with one line that names the new one.

Until 0.1 this folder held the tasks, the sandbox and the launcher's support side by side. They now live in
`openrlhf_band.tasks` (one folder per task), `openrlhf_band.sandbox` and `openrlhf_band.launcher`. An import
of an old module (`import openrlhf_band.recipe.reward`, `python -m openrlhf_band.recipe.tasks ...`) and an old
reward or agent file passed to OpenRLHF by path (`--reward.remote_url .../openrlhf_band/recipe/reward.py`)
raise ImportError naming the new module and the command that prints a task's file.
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

MOVED = {
    "tasks": "openrlhf_band.tasks",
    "reward_io": "openrlhf_band.tasks.reward_io",
    "text": "openrlhf_band.tasks.text",
    "workers": "openrlhf_band.tasks.pool",
    "agent_turns": "openrlhf_band.tasks.agent_turns",
    "data": "openrlhf_band.tasks.math.data",
    "reward": "openrlhf_band.tasks.math.reward",
    "verify": "openrlhf_band.tasks.math.verify",
    "gym_data": "openrlhf_band.tasks.reasoning_gym.data",
    "gym_reward": "openrlhf_band.tasks.reasoning_gym.reward",
    "gym_agent": "openrlhf_band.tasks.reasoning_gym.agent",
    "code_data": "openrlhf_band.tasks.code.data",
    "code_reward": "openrlhf_band.tasks.code.reward",
    "code_agent": "openrlhf_band.tasks.code.agent",
    "choice_data": "openrlhf_band.tasks.mc.data",
    "choice_reward": "openrlhf_band.tasks.mc.reward",
    "sandbox": "openrlhf_band.sandbox",
    "sandbox_harness": "openrlhf_band.sandbox.harness",
    "results": "openrlhf_band.launcher.results",
    "models": "openrlhf_band.launcher.models",
    "ray_job": "openrlhf_band.launcher.ray_job",
}
_TASK_OF_FILE = {"reward": "math", "gym_reward": "reasoning-gym", "code_reward": "code", "choice_reward": "mc"}
_AGENT_OF_FILE = {"gym_agent": "reasoning-gym", "code_agent": "code"}


def moved_message(old: str) -> str:
    """The one line for old module `old` (its name in this folder)."""
    new = MOVED[old]
    if old in _TASK_OF_FILE:
        how = f"; `python -m openrlhf_band.tasks reward-file {_TASK_OF_FILE[old]}` prints its path"
    elif old in _AGENT_OF_FILE:
        how = f"; `python -m openrlhf_band.tasks agent-file {_AGENT_OF_FILE[old]}` prints its path"
    else:
        how = ""
    return f"openrlhf_band.recipe.{old} has moved to {new}{how}"


def moved_file(path: str, name: str) -> None:
    """The moved line for an old file: raised for a file loaded by path (a reward or agent file OpenRLHF was
    given), printed alone (exit status 1) for one run as a script."""
    message = moved_message(Path(path).stem)
    if name == "__main__":
        raise SystemExit(message)
    raise ImportError(message)


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Answers every import of an old module with the moved line instead of `No module named ...`."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        package, _, old = fullname.rpartition(".")
        if package == __name__ and old in MOVED:
            raise ImportError(moved_message(old), name=fullname)
        return None


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
