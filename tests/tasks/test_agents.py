"""The multi-turn agents (openrlhf_band/tasks/{agent_turns.py, code/agent.py, reasoning_gym/agent.py}), run through
OpenRLHF 0.11.2's own `MultiTurnAgentExecutor.execute` with a scripted engine in place of vLLM.

Ground truth from outside the agents: the token sequence an episode builds (prompt, replies, the
environment's turns) equals the tokenizer's chat template applied to the same conversation, token for
token; the action ranges OpenRLHF masks in cover the replies' tokens and nothing of the environment's; the
final reward is the task's reward file's on the last reply.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from openrlhf.utils.agent import AgentExecutorBase

from openrlhf_band import tasks
from openrlhf_band.tasks.agent_turns import ChatTurns

ROOT = Path(__file__).resolve().parents[2]


def _assets():
    spec = importlib.util.spec_from_file_location("e2e_assets", ROOT / "studies" / "cpu_engine" / "assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ASSETS = _assets()
TOKENIZER = ASSETS.build_tokenizer(
    ["def add(a, b): return a + b", "assert add(1, 2) == 3", "Your program failed this test", "<answer>7</answer>"]
)


def load_agent_executor(path: str) -> AgentExecutorBase:
    """As OpenRLHF 0.11.2's vllm_engine._load_agent_executor loads --train.agent_func_path."""
    spec = importlib.util.spec_from_file_location("agent_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    return module.AgentExecutor()


class ScriptedEngine:
    """vLLM's generate, replaying `replies` (text; `eos` appends the end-of-turn token as vLLM keeps it when it
    stops on it), each token with log-prob -0.5; records every prompt it was given."""

    def __init__(self, replies: list[str], eos: bool = True):
        self.replies, self.eos, self.prompts, self.budgets = list(replies), eos, [], []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        self.budgets.append(sampling_params.max_tokens)
        text = self.replies.pop(0)
        ids = TOKENIZER(text, add_special_tokens=False)["input_ids"] + ([TOKENIZER.eos_token_id] if self.eos else [])
        if sampling_params.max_tokens is not None and len(ids) > sampling_params.max_tokens:  # cut, as vLLM cuts
            ids = ids[: sampling_params.max_tokens]
            text = TOKENIZER.decode(ids, skip_special_tokens=False)
        logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
        out = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop" if self.eos else "length",
                              logprobs=logprobs)  # fmt: skip
        return SimpleNamespace(outputs=[out])


PROMPT = TOKENIZER.apply_chat_template([{"role": "user", "content": "Solve it."}], tokenize=False,
                                       add_generation_prompt=True)  # fmt: skip


def run_episode(
    agent_file: str, label: str, replies: list[str], eos: bool = True, max_length: int = 4096
) -> tuple[dict, ScriptedEngine]:
    executor = load_agent_executor(agent_file)
    engine = ScriptedEngine(replies, eos)
    params = SimpleNamespace(max_tokens=None, logprobs=1)  # as OpenRLHF sends it: the executor sets each budget
    result = asyncio.run(executor.execute(PROMPT, label, params, max_length, TOKENIZER, engine))
    return result, engine


def tokens(text: str) -> int:
    return len(TOKENIZER(text=text, add_special_tokens=False)["input_ids"])


def the_conversation(replies: list[str], feedback: list[str]) -> list[int]:
    messages = [{"role": "user", "content": "Solve it."}]
    for i, reply in enumerate(replies):
        messages.append({"role": "assistant", "content": reply})
        if i < len(feedback):
            messages.append({"role": "user", "content": feedback[i]})
    text = TOKENIZER.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    text = text[: text.rindex(TOKENIZER.eos_token) + len(TOKENIZER.eos_token)]  # generation stops at the last eos
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------------------------- chat turns
def test_the_turns_come_from_the_tokenizers_template():
    turns = ChatTurns.from_tokenizer(TOKENIZER)
    assert turns.end_of_reply == "<|im_end|>\n" and turns.eos == "<|im_end|>"
    assert turns.between == "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    assert turns.user_turn("m", reply_ended=True) == "\n<|im_start|>user\nm<|im_end|>\n<|im_start|>assistant\n"
    assert turns.user_turn("m", reply_ended=False).startswith("<|im_end|>\n<|im_start|>user\nm")  # a cut reply closed


def test_a_template_that_rewrites_the_conversation_is_refused():
    class Rewriting:
        eos_token = "</s>"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "".join(m["content"] for m in reversed(messages))  # the last message first

    with pytest.raises(ValueError, match="does not continue a conversation"):
        ChatTurns.from_tokenizer(Rewriting())


# --------------------------------------------------------------------------------------------- code agent
MBPP_LABEL = json.dumps({"test": "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(-1, 1) == 0\n",
                         "entry_point": "add"})  # fmt: skip
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
VISIBLE_ONLY = "```python\ndef add(a, b):\n    return 3\n```"  # passes the visible assert, not the hidden ones
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"


def test_code_agent_answers_a_failed_visible_test_and_scores_the_last_program_on_every_test():
    result, engine = run_episode(tasks.agent_file("code"), MBPP_LABEL, [WRONG, RIGHT])
    assert result["reward"] == 1.0 and result["scores"] == 1.0
    assert result["extra_logs"]["agent_turns"] == 2.0 and result["extra_logs"]["visible_passed"] == 1.0
    # the tokens are the chat template's for the same conversation, the environment's turn included
    feedback = TOKENIZER.decode(engine.prompts[1][len(engine.prompts[0]) :], skip_special_tokens=False)
    assert "Your program failed this test: assert add(1, 2) == 3" in feedback
    assert "add(2, 2)" not in feedback and "add(-1, 1)" not in feedback  # never a hidden test
    message = feedback.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    expected = the_conversation([WRONG, RIGHT], [message])
    assert result["observation_tokens"] == expected
    # OpenRLHF trains on the action ranges only: exactly the two replies (with their end-of-turn token)
    replies = [result["observation_tokens"][a:b] for a, b in result["action_ranges"]]
    assert [TOKENIZER.decode(r, skip_special_tokens=False) for r in replies] == [WRONG + "<|im_end|>",
                                                                                RIGHT + "<|im_end|>"]  # fmt: skip
    in_action = {i for a, b in result["action_ranges"] for i in range(a, b)}
    for i, logprob in enumerate(result["rollout_log_probs"]):
        assert logprob == (-0.5 if i in in_action else 0.0), i  # the environment's tokens: OpenRLHF's dummy 0


def test_code_agent_gives_no_reward_for_passing_the_visible_test_alone():
    result, engine = run_episode(tasks.agent_file("code"), MBPP_LABEL, [VISIBLE_ONLY])
    assert result["reward"] == 0.0 and len(engine.prompts) == 1  # the episode ended: the hidden tests decided
    assert result["extra_logs"]["visible_passed"] == 1.0 and result["extra_logs"]["code_found"] == 1.0


def test_code_agent_stops_at_the_turn_limit_and_closes_a_cut_reply(monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_AGENT_TURNS", "2")
    # a reply without any code (blank: a reply without a fence is otherwise taken as the program itself)
    result, engine = run_episode(tasks.agent_file("code"), MBPP_LABEL, ["\n\n", WRONG], eos=False)
    assert len(engine.prompts) == 2 and result["reward"] == 0.0 and result["extra_logs"]["agent_turns"] == 2.0
    turn = TOKENIZER.decode(engine.prompts[1][len(engine.prompts[0]) :], skip_special_tokens=False)
    assert turn.startswith("\n\n<|im_end|>\n<|im_start|>user\nI found no Python code block")


def test_a_reply_the_context_has_no_room_to_answer_is_scored_as_the_last():
    """OpenRLHF's executor gives the next reply max_length less the context, and stops when that is <= 0, after
    the user turn: the reply before it would go unscored. The agent ends the episode at that reply instead."""
    first = tokens(PROMPT) + tokens(WRONG) + 1  # the prompt and the first reply with its end-of-turn token
    _, probe = run_episode(tasks.agent_file("code"), MBPP_LABEL, [WRONG, RIGHT])
    turn = len(probe.prompts[1]) - first  # the user turn after the first reply, in tokens
    # room for the turn and one token of a reply: the episode goes on, the second reply gets that one token
    result, engine = run_episode(tasks.agent_file("code"), MBPP_LABEL, [WRONG, RIGHT], max_length=first + turn + 1)
    assert engine.budgets[1] == 1 and len(engine.prompts) == 2 and result["action_ranges"][1][1] == first + turn + 1
    # room for the turn only: the first reply is the last, scored on every test (no code_found of 0 from a turn)
    result, engine = run_episode(tasks.agent_file("code"), MBPP_LABEL, [WRONG, RIGHT], max_length=first + turn)
    assert len(engine.prompts) == 1 and result["reward"] == 0.0 and result["action_ranges"] == [(tokens(PROMPT), first)]
    assert result["extra_logs"]["code_found"] == 1.0 and result["extra_logs"]["agent_turns"] == 1.0


def test_visible_tests_of_each_label_form():
    from openrlhf_band.tasks.code.agent import visible_tests

    humaneval = {"test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f", "prompt": "p"}
    assert visible_tests(humaneval) == ({**humaneval, "test": ""}, "")  # the program runs and defines f
    mbpp = {"test": "import math\nassert f(1) == 2\nassert f(2) == 3\n", "entry_point": "f"}
    assert visible_tests(mbpp) == ({**mbpp, "test": "import math\nassert f(1) == 2\n"}, "assert f(1) == 2")
    io = {"inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]}
    assert visible_tests(io) == ({"inputs": ["1\n"], "outputs": ["2\n"]}, "input '1\\n', expected '2\\n'")


# --------------------------------------------------------------------------------------------- gym agent
def test_gym_agent_says_a_wrong_answer_is_wrong_and_scores_the_last_reply():
    from openrlhf_band.tasks.reasoning_gym import data as gym_data

    train, _, _ = gym_data.build({"basic_arithmetic": 1}, 1, 0, 0, {})
    label = train[0]["label"]
    answer = json.loads(label)["entry"]["answer"]
    replies = ["<answer>not a number</answer>", f"<answer>{answer}</answer>"]
    result, engine = run_episode(tasks.agent_file("reasoning-gym"), label, replies)
    assert result["reward"] == 1.0 and result["scores"] == 1.0  # 2 * 1 - 1 on a training label
    assert result["extra_logs"] == {"answer_found": 1.0, "score_timeout": 0.0, "agent_turns": 2.0}
    turn = TOKENIZER.decode(engine.prompts[1][len(engine.prompts[0]) :], skip_special_tokens=False)
    assert "That answer is not correct" in turn and answer not in turn
    result, engine = run_episode(tasks.agent_file("reasoning-gym"), label, [f"<answer>{answer}</answer>"])
    assert result["reward"] == 1.0 and len(engine.prompts) == 1  # right at once: one turn
    # a wrong answer the context has no room to answer is the last: -1, not the 0 of an unscored turn
    first = tokens(PROMPT) + tokens(replies[0]) + 1
    result, engine = run_episode(tasks.agent_file("reasoning-gym"), label, replies, max_length=first + 5)
    assert len(engine.prompts) == 1 and result["reward"] == -1.0 and result["extra_logs"]["agent_turns"] == 1.0


# --------------------------------------------------------------------------------------------- the registry
def test_agent_files_resolve_for_the_tasks_that_have_one():
    for task in ("code", "reasoning-gym"):
        done = subprocess.run([sys.executable, "-m", "openrlhf_band.tasks", "agent-file", task],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and Path(done.stdout.strip()).is_file(), done.stderr
    done = subprocess.run([sys.executable, "-m", "openrlhf_band.tasks", "agent-file", "math"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "has no multi-turn agent; tasks with one: reasoning-gym, code" in done.stderr
