"""What the recipe's multi-turn agents share (`--train.agent_func_path`, OpenRLHF 0.11.2's
`openrlhf.utils.agent`): the environment's reply as a chat turn of the model's own template, and an
executor that tells the agent how the model's last reply ended.

OpenRLHF's `MultiTurnAgentExecutor` appends the environment's feedback text, tokenized, after the model's
reply tokens and masks it out of the action mask (only the replies are trained on). The text must
therefore close the model's turn exactly as its chat template does and open the next assistant turn,
or the model trains on contexts it never sees at inference. `ChatTurns` reads those strings from the
tokenizer's own template (no hand-written ChatML), and `TurnAgentExecutor` records whether the reply
already ended with the end-of-turn token (it did when vLLM stopped on it; a reply cut at the token
budget did not), so that the turn is closed once, never twice.

It also records how many tokens the context still holds after the reply (`max_length` less what is in it).
OpenRLHF's executor ends an episode when a user turn leaves no room for another reply, after that turn's
`step` returned, so the reply before it would never be scored and the episode would keep the turn's reward
(0 where a wrong final answer gets -1). `user_turn` returns None there instead: the agent scores the reply
and ends the episode.

An agent file (what `--train.agent_func_path` names) defines an `AgentInstanceBase` subclass and
`class AgentExecutor(TurnAgentExecutor)` with `instance_cls` set to it; its `step` calls
`user_turn(message)` for the text to return as `environment_feedback`.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass
from typing import Any

from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

DEFAULT_MAX_TURNS = 3
_PROBE_USER, _PROBE_REPLY = "openrlhf-band-probe-user", "openrlhf-band-probe-reply"


def max_turns() -> int:
    """Replies a sample may make (OPENRLHF_BAND_AGENT_TURNS, default 3): the last one is scored whatever it holds."""
    try:
        return max(1, int(os.environ["OPENRLHF_BAND_AGENT_TURNS"]))
    except (KeyError, ValueError):
        return DEFAULT_MAX_TURNS


@dataclass(frozen=True)
class ChatTurns:
    """The template's text around a user turn that follows an assistant reply.

    end_of_reply: what the template writes after a reply's content (ChatML: "<|im_end|>\\n");
    between: from there to the next assistant reply's content, with `{message}` where the user's turn goes
    (ChatML: "<|im_start|>user\\n{message}<|im_end|>\\n<|im_start|>assistant\\n");
    eos: the tokenizer's end-of-sequence text, which vLLM stops on and keeps in the reply's tokens.
    """

    end_of_reply: str
    between: str
    eos: str | None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTurns:
        """Read from `tokenizer.apply_chat_template`; ValueError when the template does not render a user turn
        after an assistant reply as a plain continuation of the conversation."""
        first = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
        before = tokenizer.apply_chat_template(first, tokenize=False)
        after = tokenizer.apply_chat_template(
            [*first, {"role": "user", "content": "{message}"}], tokenize=False, add_generation_prompt=True
        )
        if not after.startswith(before) or before.count(_PROBE_REPLY) != 1:
            raise ValueError("the chat template does not continue a conversation by appending to it")
        end_of_reply = before[before.index(_PROBE_REPLY) + len(_PROBE_REPLY) :]
        between = after[len(before) :]
        if between.count("{message}") != 1:
            raise ValueError("the chat template's user turn does not hold its content once")
        return cls(end_of_reply, between, getattr(tokenizer, "eos_token", None))

    def user_turn(self, message: str, reply_ended: bool) -> str:
        """The text after a reply: the rest of its turn's end, then `message` as a user turn and the start of
        the next reply. `reply_ended`: the reply's tokens already end with the eos token, which the template's
        end of turn starts with (ChatML's "<|im_end|>"), so only what follows it is added."""
        end = self.end_of_reply
        if reply_ended and self.eos and end.startswith(self.eos):
            end = end[len(self.eos) :]
        return end + self.between.replace("{message}", message)


@dataclass
class _Episode:
    turns: ChatTurns
    eos_ids: frozenset[int]
    tokenizer: Any
    reply_ended: bool = False
    room: int | None = None  # tokens the context holds after the last reply; None: not known


_EPISODE: contextvars.ContextVar[_Episode] = contextvars.ContextVar("openrlhf_band_agent_episode")


class _RecordingEngine:
    """The engine `MultiTurnAgentExecutor` generates with, noting how each reply ended and how much room the
    context has left after it."""

    def __init__(self, engine: Any, episode: _Episode):
        self._engine, self._episode = engine, episode

    async def generate(self, prompt_token_ids, sampling_params, *args, **kwargs):
        output = await self._engine.generate(prompt_token_ids, sampling_params, *args, **kwargs)
        tokens = output.outputs[0].token_ids
        self._episode.reply_ended = bool(tokens) and tokens[-1] in self._episode.eos_ids
        # the executor sets max_tokens to max_length less the context before each reply
        budget = getattr(sampling_params, "max_tokens", None)
        self._episode.room = None if budget is None else budget - len(tokens)
        return output

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


class Episode(AgentInstanceBase):
    """One sample's episode (OpenRLHF makes one instance per prompt and sample): its label, kept from
    `reset`, and the replies made so far (the agent's `step` counts them)."""

    def __init__(self, *args, **kwargs) -> None:
        self.replies = 0
        self.label: Any = None

    async def reset(self, states: dict, **kwargs) -> dict:
        self.label = states["label"]
        return {"observation": states["observation"]}


class TurnAgentExecutor(MultiTurnAgentExecutor):
    """`MultiTurnAgentExecutor` with the episode's chat turns and the last reply's ending available to the
    agent instance's `step` (through `user_turn`). Subclasses set `instance_cls`."""

    instance_cls: type

    def __init__(self) -> None:
        super().__init__(self.instance_cls)
        self._turns: tuple[Any, ChatTurns] | None = None  # (the tokenizer, its turns): read once, not per episode

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        if self._turns is None or self._turns[0] is not hf_tokenizer:
            self._turns = (hf_tokenizer, ChatTurns.from_tokenizer(hf_tokenizer))
        turns = self._turns[1]
        eos = hf_tokenizer.eos_token_id
        episode = _Episode(turns, frozenset(eos if isinstance(eos, list) else [eos]) - {None}, hf_tokenizer)
        token = _EPISODE.set(episode)  # the instance's step runs in this task: it reads this episode
        try:
            return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer,
                                         _RecordingEngine(llm_engine, episode), images)  # fmt: skip
        finally:
            _EPISODE.reset(token)


def user_turn(message: str) -> str | None:
    """The environment's reply `message` as the next user turn of the running episode (call it from `step`), or
    None when the context has no room for that turn and at least one token of another reply: then the episode
    ends with this reply, which the agent scores (OpenRLHF's executor would stop after the turn instead)."""
    episode = _EPISODE.get()
    text = episode.turns.user_turn(message, episode.reply_ended)
    if episode.room is not None:
        # tokenized as OpenRLHF's executor tokenizes environment feedback
        needed = len(episode.tokenizer(text=text, add_special_tokens=False)["input_ids"])
        if needed >= episode.room:
            return None
    return text

