"""The reasoning-gym task as a multi-turn agent that answers a wrong answer: pass `--train.agent_func_path
openrlhf_band/tasks/reasoning_gym/agent.py` (`python -m openrlhf_band.tasks agent-file reasoning-gym` prints the
path) in place of `--reward.remote_url`.

An episode: the model answers; a full-score answer ends it; otherwise the environment says, as the next
user turn, that the answer is not correct (or that no `<answer>...</answer>` was found), without
revealing the right one, and the model tries again, up to OPENRLHF_BAND_AGENT_TURNS replies (default 3) or
as many as the context has room for.
The reward is the reasoning-gym reward's on the last reply (`tasks/reasoning_gym/reward.py`: 2 * score - 1 for training
labels, the score for accuracy labels; partial credit as reasoning-gym gives it), given at the last turn
(the earlier turns get 0: OpenRLHF sums them). extra_logs (of the last turn): `answer_found`,
`score_timeout` (as the reward's) and `agent_turns`.

OpenRLHF masks the feedback tokens out of the action mask: the loss, the band's bounds and its metrics see
the model's replies only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from openrlhf_band.tasks.agent_turns import Episode, TurnAgentExecutor, max_turns, user_turn
from openrlhf_band.tasks.reasoning_gym import reward as gym_reward

NO_ANSWER = "I found no final answer in your reply. Give your final answer inside <answer></answer> tags."
WRONG = "That answer is not correct. Think again, then give your final answer inside <answer></answer> tags."


def _scored(reply: str, label: Any) -> tuple[float, float, dict]:
    """(reward, score, extra_logs) of one reply, from the reward file's own hook (its pool and timeouts)."""
    out = gym_reward.reward_func([reply], [""], [label])
    logs = {name: float(values[0]) for name, values in out["extra_logs"].items()}
    return float(out["rewards"][0]), float(out["scores"][0]), logs


class GymAgent(Episode):
    """The reasoning-gym episode: a wrong answer is answered."""

    async def step(self, states: dict, **kwargs) -> dict:
        self.replies += 1
        reward, score, logs = await asyncio.to_thread(_scored, states["action_text"], self.label)
        done = score >= 1.0 or self.replies >= max_turns()
        text = "" if done else user_turn(WRONG if logs["answer_found"] else NO_ANSWER)
        if text is None:  # no room for another reply: this one is the last
            done, text = True, ""
        return {
            "rewards": torch.tensor(reward if done else 0.0),
            "scores": torch.tensor(score if done else 0.0),
            "environment_feedback": text,
            "done": done,
            "extra_logs": {**logs, "agent_turns": float(self.replies)},
        }


class AgentExecutor(TurnAgentExecutor):
    instance_cls = GymAgent
