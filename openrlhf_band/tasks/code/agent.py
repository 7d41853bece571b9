"""The code task as a multi-turn agent with a sandboxed tool: pass `--train.agent_func_path
openrlhf_band/tasks/code/agent.py` (`python -m openrlhf_band.tasks agent-file code` prints the path) in place of
`--reward.remote_url`.

An episode: the model replies with a program; the environment runs it in the sandbox against the label's
visible test (below) and, if it fails, sends the failure back as the next user turn; the model tries
again, up to OPENRLHF_BAND_AGENT_TURNS replies (default 3). The episode ends when a program passes its
visible test, or at the last reply (the turn limit's, or the last the context has room for), and its
reward is the code reward's on that last reply (`code_reward.score`: 1 when the program passes every test
of the label, the hidden ones included, else 0), given at the last turn (the earlier turns get 0: OpenRLHF
sums them). So an agent run and a single-turn run score a final program alike, and passing the visible test
is not enough.

The visible test is what the prompt shows or what the model could see for itself:
- top-level asserts (MBPP): the setup lines and the first assert (a training prompt shows that one);
- stdin/stdout and call-based cases (APPS): the first case;
- HumanEval's `check(candidate)`: nothing can be split off it, so the visible check is that the program
  runs and defines the entry point.
The feedback says which check failed and how (the sandbox's verdict, at most MAX_FEEDBACK_CHARS), never a
hidden test. extra_logs (of the last turn): `code_found`, `code_timeout`, `sandbox_error` (the final
scoring's, as the code reward's), `visible_passed` and `agent_turns` (replies made).

OpenRLHF masks the feedback tokens out of the action mask: the loss, the band's bounds and its metrics see
the model's replies only. The sandbox is checked when this file loads, as the code reward's is.
"""

from __future__ import annotations

import asyncio
import re

import torch

from openrlhf_band.tasks.agent_turns import Episode, TurnAgentExecutor, max_turns, user_turn
from openrlhf_band.tasks.code import reward as code_reward

MAX_FEEDBACK_CHARS = 600
_CHECK_DEF = re.compile(r"^def\s+check\s*\(", re.MULTILINE)


def visible_tests(tests: dict) -> tuple[dict, str]:
    """(the visible part of `tests`, `parse_label`'s form; the text that shows it to the model, "" if none)."""
    tests = dict(tests)
    if "test" in tests:
        lines = tests["test"].splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith("assert")), None)
        if _CHECK_DEF.search(tests["test"]) or first is None:
            return {**tests, "test": ""}, ""  # the program runs and defines the entry point
        return {**tests, "test": "\n".join(lines[: first + 1]) + "\n"}, lines[first]
    visible = {**tests, "inputs": tests["inputs"][:1], "outputs": tests["outputs"][:1]}
    shown = f"input {tests['inputs'][0]!r}, expected {tests['outputs'][0]!r}"
    return visible, shown


def feedback(why: str, shown: str) -> str:
    """The user turn after a failed program (plain text: the template wraps it)."""
    ask = "Fix it and write the whole solution again in one ```python code block."
    if why == "no code":
        return "I found no Python code block in your reply. Write the whole solution in one ```python code block."
    what = f"Your program failed this test: {shown}" if shown else "Your program did not run"
    text = f"{what}\nResult: {why}\n{ask}"
    return text if len(text) <= MAX_FEEDBACK_CHARS else text[: MAX_FEEDBACK_CHARS - len(ask) - 5] + " ...\n" + ask


class CodeAgent(Episode):
    """The code task's episode: the sandbox is its tool."""

    async def reset(self, states: dict, **kwargs) -> dict:
        observation = await super().reset(states, **kwargs)
        # the label parsed once (an APPS label can hold megabytes of JSON); the last reply is scored on all of
        # it with code_reward.check, which is code_reward.score on the parsed label
        self.tests, _ = code_reward.parse_label(self.label)
        return observation

    async def step(self, states: dict, **kwargs) -> dict:
        self.replies += 1
        reply = states["action_text"]
        visible_passed = 0.0
        if self.tests is not None:
            visible, shown = visible_tests(self.tests)
            passed, _, why = await asyncio.to_thread(code_reward.check, reply, visible)
            visible_passed = passed
            if not passed and self.replies < max_turns() and not why.startswith("sandbox"):
                text = user_turn(feedback(why, shown))
                if text is not None:  # else no room for another reply: this one is the last
                    return self._turn(0.0, text, False, visible_passed, None)
        value, logs, _ = await asyncio.to_thread(code_reward.check, reply, self.tests)
        return self._turn(value, "", True, visible_passed, logs)

    def _turn(self, reward: float, text: str, done: bool, visible_passed: float, logs: dict | None) -> dict:
        logs = logs or {"code_found": 0.0, "code_timeout": 0.0, "sandbox_error": 0.0}
        return {
            "rewards": torch.tensor(reward),
            "scores": torch.tensor(reward),
            "environment_feedback": text,
            "done": done,
            "extra_logs": {**logs, "visible_passed": visible_passed, "agent_turns": float(self.replies)},
        }


class AgentExecutor(TurnAgentExecutor):
    instance_cls = CodeAgent


# Refuse to start without the isolation the code reward promises (OpenRLHF loads this file at start-up).
code_reward.sandbox.require()
