"""The multiple-choice reward as an OpenRLHF 0.11.2 reward file: `--reward.remote_url .../tasks/mc/reward.py`.

The contract is that of `openrlhf_band/tasks/math/reward.py` (see its docstring): OpenRLHF loads this file
with `importlib.util.spec_from_file_location` (so only absolute imports work here) and calls
`reward_func([query], [prompt], [label])` from a worker thread (`asyncio.to_thread`), `query` being the
decoded chat-templated prompt plus the response, special tokens included. It returns
`{"rewards": Tensor[B], "scores": Tensor[B], "extra_logs": {"answer_found": Tensor[B]}}` (float32).

Letter extraction (`extract_choice`): the response is the query without its prompt prefix; special
tokens (`<|im_end|>`, `</s>`, ...) are removed from its last `RAW_WINDOW` characters, and the last
`SEARCH_WINDOW` (2000) characters of what remains are searched.

1. The LAST "Answer:" (case-insensitive, `\\banswer`, spaces and `*` allowed before the colon, so
   `**Answer:**`, `**Answer**:` and "Final answer:" count; the answer may start on the next line):
   after it, any run of spaces, `*`, `_`, `$`, backquotes, quotes, `(`, `[`, `{`, `\\(`, `\\[`,
   `\\boxed{`, `\\fbox{`, `\\text{`, `\\textbf{`, `\\mathrm{`, `\\mathbf{` and the words "option" /
   "choice" (each with an optional `:`, `#` or `.`) is skipped, and the next character is the letter
   if it is an ASCII letter not followed by another letter or digit, within `MAX_LINE_CHARS` of the
   colon: `Answer: C`, `Answer: (C)`, `Answer: **C**`, `Answer: $\\boxed{C}$`, `Answer: C. some text`
   and `Answer: option c` all give C; `Answer: The answer is C` gives none.
2. Only if the last "Answer:" gives no letter (or there is none): the content of the last `\\boxed{}`
   if, once `\\text{`-style commands, brackets, `*`, `$`, periods and spaces are removed, it is a single
   ASCII letter (`\\boxed{C}`, `\\boxed{\\text{(C)}}`).
3. The letter, upper-cased, must be one of the label's choices; otherwise there is no answer (a letter
   after the last "Answer:" that is not a choice is no answer: earlier lines and boxes are not consulted).

Reward: exact match of that letter with the label's answer. Match: reward +1, score 1. Otherwise (no
answer, another letter, a malformed label): reward -1, score 0. For accuracy labels the reward is 1 / 0.
`extra_logs["answer_found"]` is 1 when a letter among the choices was extracted.

Label format (written by `openrlhf_band/tasks/mc/data.py`):

- `{"answer": "B", "choices": ["A", "B", "C", "D"]}` (a JSON string, or such a dict): +1 / -1;
- the same with `"reward": "accuracy"`: 1 / 0, so OpenRLHF's eval metrics are accuracies;
- a bare letter, e.g. `"C"`: +1 / -1, any letter A-Z being a valid answer.

Robustness: `reward_func` never raises, from any thread, on any input (None, non-strings, huge
strings, malformed labels); each sample costs a few regular-expression passes over a bounded window,
with no worker processes and no timeouts to manage.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from openrlhf_band.tasks.reward_io import SPECIAL_TOKEN_RE, response_text, score_batch
from openrlhf_band.tasks.text import last_boxed

__all__ = ["SEARCH_WINDOW", "extract_choice", "parse_label", "reward_func"]

SEARCH_WINDOW = 2000  # only the response's last characters are searched for the answer
RAW_WINDOW = 4 * SEARCH_WINDOW  # how far back special tokens are removed before the window is taken
MAX_LABEL_CHARS = 10000
ACCURACY_MODE = "accuracy"
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")

_ANSWER_RE = re.compile(r"\banswer[ \t*]*:", re.IGNORECASE)
# one wrapper token before the letter; matched repeatedly at one position (no nested quantifiers)
_WRAPPER_RE = re.compile(
    r"\s+|\\(?:boxed|fbox|textbf|text|mathrm|mathbf)\s*\{|\\[(\[]|[*_$`'\"(\[{]"
    r"|(?:option|choice)(?![^\W_])[ \t]*[:#.]?",
    re.IGNORECASE,
)
_LETTER_RE = re.compile(r"[A-Za-z](?![^\W_])")
_BOX_NOISE_RE = re.compile(r"\\(?:textbf|text|mathrm|mathbf)\s*\{|[\s()\[\]{}*$.]")
MAX_LINE_CHARS = 200  # the letter must come within this many characters of "Answer:"


# ----------------------------------------------------------------------------- extraction


def _letter_after(text: str) -> str | None:
    """The letter at the start of `text`, after the wrappers of rule 1."""
    text = text[:MAX_LINE_CHARS]
    i = 0
    while True:
        match = _WRAPPER_RE.match(text, i)
        if match is None or match.end() == i:
            break
        i = match.end()
    match = _LETTER_RE.match(text, i)
    return match.group(0).upper() if match else None


def _boxed_letter(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is None:
        return None
    inner = _BOX_NOISE_RE.sub("", boxed[:MAX_LINE_CHARS])
    return inner.upper() if len(inner) == 1 and inner.upper() in LETTERS else None


def extract_choice(text: Any, choices: Any = None) -> str | None:
    """The answer letter of a response (upper case), or None; `choices` (letters) restricts it.

    The rule is in the module docstring: the letter after the last "Answer:", else a single-letter
    last `\\boxed{}`, and it must be one of `choices` (any letter A-Z when `choices` is None).
    """
    try:
        if not isinstance(text, str):
            return None
        allowed = _allowed(choices)
        window = SPECIAL_TOKEN_RE.sub("", text[-RAW_WINDOW:])[-SEARCH_WINDOW:]
        letter = None
        matches = list(_ANSWER_RE.finditer(window))  # bounded: the window is SEARCH_WINDOW characters
        if matches:
            letter = _letter_after(window[matches[-1].end() :])
        if letter is None:
            letter = _boxed_letter(window)
        if letter is None or letter not in allowed:
            return None
        return letter
    except Exception:
        return None


def _allowed(choices: Any) -> frozenset[str]:
    """The valid answer letters: the single letters in `choices`, or all of A-Z when there are none."""
    if isinstance(choices, (list, tuple, set, frozenset)):
        letters = frozenset(c.strip().upper() for c in choices if isinstance(c, str) and len(c.strip()) == 1)
        letters &= LETTERS
        if letters:
            return letters
    return LETTERS


# ----------------------------------------------------------------------------- labels


def parse_label(label: Any) -> tuple[str | None, frozenset[str], bool]:
    """(answer letter or None, valid letters, accuracy mode) of a label: a JSON object string or dict
    `{"answer": "B", "choices": [...], "reward": "accuracy"}`, or a bare letter."""
    try:
        if isinstance(label, str):
            if len(label) > MAX_LABEL_CHARS:
                return None, LETTERS, False
            text = label.strip()
            if text.startswith("{"):
                try:
                    label = json.loads(text)
                except ValueError:
                    return None, LETTERS, False
            else:
                letter = text.upper()
                return (letter if len(letter) == 1 and letter in LETTERS else None), LETTERS, False
        if not isinstance(label, dict):
            return None, LETTERS, False
        accuracy = str(label.get("reward", "")).strip().lower() == ACCURACY_MODE
        allowed = _allowed(label.get("choices"))
        answer = label.get("answer")
        letter = answer.strip().upper() if isinstance(answer, str) else None
        if letter is None or letter not in allowed:
            return None, allowed, accuracy
        return letter, allowed, accuracy
    except Exception:
        return None, LETTERS, False


# ----------------------------------------------------------------------------- the hook


def _score_one(query: Any, prompt: Any, label: Any) -> tuple[float, float, float]:
    """(reward, score, answer_found) of one sample."""
    accuracy_mode = False
    try:
        gold, allowed, accuracy_mode = parse_label(label)
        letter = extract_choice(response_text(query, prompt), allowed)
        correct = 1.0 if letter is not None and letter == gold else 0.0
        reward = correct if accuracy_mode else 2.0 * correct - 1.0
        return reward, correct, float(letter is not None)
    except Exception:
        return (0.0 if accuracy_mode else -1.0), 0.0, 0.0


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict:
    """OpenRLHF's reward hook: +1/-1 (or 0/1 for accuracy labels) rewards, 0/1 scores. Never raises."""
    # one sample at a time, in this thread: a few regular-expression passes each
    return score_batch(queries, prompts, labels, _score_one, logs=("answer_found",), failure=(0.0, 0.0, 0.0))


def _cli(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: reward.py RESPONSE LABEL   (or pass this file to OpenRLHF as --reward.remote_url)")
        return 2
    gold, allowed, _ = parse_label(argv[1])
    result = reward_func([argv[0]], [""], [argv[1]])
    print(
        json.dumps(
            {
                "answer": extract_choice(argv[0], allowed),
                "label_answer": gold,
                "reward": float(result["rewards"][0]),
                "score": float(result["scores"][0]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
