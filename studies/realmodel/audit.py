"""The shortcut audit: before a study trains on a task, score policies that know nothing about the task
on the study's own held-out rows with the study's own reward, and refuse the task when any of them
scores above `LIMIT` mean reward.

    .venv/bin/python studies/realmodel/audit.py [--only NAME ...]      (make realmodel-audit)
        writes studies/realmodel/results/audit/<slug>.json per candidate, prints one line each

Why: the first paired study's reward (spell_backward, words of at most 3 letters, partial credit per
matching letter) was solved at 0.367 by copying the word forward: the middle letter of a 3-letter word
always matches its own reversal (docs/smollm2_study.md#the-copy-shortcut). A rise to that level says
nothing about learning the task.

The trivial policies, each an answer per held-out row, sent as `<answer>ANSWER</answer>` through the
task's reward (reasoning-gym's scorer through openrlhf_band/tasks/reasoning_gym/reward.py, with the study's
exact-match mapping when the candidate is scored 0/1):

- `empty`: an empty answer;
- `last word`: the question's last whitespace-separated word, trailing punctuation removed;
- `after the last colon`: the question's last line after its last colon (the list to reverse or sort);
- `number k` / `last number`: the k-th (k = 1, 2, 3) or the last number written in the question;
- `field KEY`: each input field of the item (a reasoning-gym metadata value, string or number, of at most
  64 characters, that occurs verbatim in the question: the word to reverse, an operand), copied;
- `shot k's answer`: the answer of the prompt's k-th solved turn (a few-shot prompt's shots), copied;
- `most common held-out answer`: the held-out rows' own most frequent answer for every row (an upper bound on
  any constant answer);
- `most common training answer`: the training split's most frequent answer, for every row;
- `random training answer`: a training answer drawn per row (seeded).

Everything here runs without a model (seconds): the study runs it before its first run and refuses the
task in one line (`refusal`).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

LIMIT = 0.05  # the highest mean reward a trivial policy may reach on a study's task
MAX_FIELD_CHARS = 64
RESULTS = Path(__file__).resolve().parent / "results" / "audit"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TRAILING = ".,;:!?\"'`)]}"

#: (queries, prompts, labels) -> scores in [0, 1], as loop.Task.reward_fn
RewardFn = Callable[[list[str], list[str], list[str]], list[float]]


def entry_of(row: dict) -> dict:
    """The reasoning-gym item {"question", "answer", "metadata"} of a prepared row."""
    return json.loads(row["label"])["entry"]


def input_fields(entry: dict) -> dict[str, str]:
    """The item's metadata values that are inputs: a string or number of at most MAX_FIELD_CHARS characters
    that occurs verbatim in the question (a field holding the solution is not an input unless the question
    shows it)."""
    out = {}
    for key, value in (entry.get("metadata") or {}).items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            continue
        text = str(value)
        if text and len(text) <= MAX_FIELD_CHARS and text in entry["question"]:
            out[key] = text
    return out


def _shot_answers(row: dict) -> list[str]:
    """The answers of the solved turns a chat prompt shows (the assistant turns' `<answer>` contents)."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list):
        return []
    out = []
    for message in prompt[:-1]:
        if isinstance(message, dict) and message.get("role") == "assistant":
            text = str(message.get("content", ""))
            start, end = text.find("<answer>"), text.rfind("</answer>")
            out.append(text[start + len("<answer>") : end].strip() if 0 <= start < end else text.strip())
    return out


def trivial_answers(held: Sequence[dict], train: Sequence[dict], seed: int = 0) -> dict[str, list[str | None]]:
    """Policy name -> its answer for each held-out row (None: no answer for that row, scored 0)."""
    entries = [entry_of(r) for r in held]
    train_answers = [str(entry_of(r)["answer"]) for r in train]
    policies: dict[str, list[str | None]] = {"empty": ["" for _ in entries]}
    words = [e["question"].split() for e in entries]
    policies["last word"] = [w[-1].rstrip(_TRAILING) if w else None for w in words]
    # the question's last line after its last colon: the list to reverse or sort, the expression to compute
    tails = [e["question"].strip().splitlines()[-1].rpartition(":")[2].strip().rstrip(_TRAILING) for e in entries]
    policies["after the last colon"] = [t or None for t in tails]
    numbers = [_NUMBER.findall(e["question"]) for e in entries]
    if any(numbers):
        for k in range(3):
            policies[f"number {k + 1}"] = [n[k] if len(n) > k else None for n in numbers]
        policies["last number"] = [n[-1] if n else None for n in numbers]
    fields = [input_fields(e) for e in entries]
    for key in sorted({k for f in fields for k in f}):
        policies[f"field {key}"] = [f.get(key) for f in fields]
    # the prompt's solved turns (a few-shot prompt's shots): each shot's answer, copied
    shots = [_shot_answers(r) for r in held]
    for k in range(max((len(a) for a in shots), default=0)):
        policies[f"shot {k + 1}'s answer"] = [a[k] if len(a) > k else None for a in shots]
    # the held-out rows' own most common answer: an upper bound on any constant answer
    held_answers = [str(e["answer"]) for e in entries]
    held_common = Counter(held_answers).most_common(1)[0][0]
    policies["most common held-out answer (bound on constants)"] = [held_common for _ in entries]
    if train_answers:
        common = Counter(train_answers).most_common(1)[0][0]
        policies["most common training answer"] = [common for _ in entries]
        rng = random.Random(seed)
        policies["random training answer"] = [rng.choice(train_answers) for _ in entries]
    return policies


def audit(held: Sequence[dict], train: Sequence[dict], reward_fn: RewardFn, seed: int = 0) -> dict:
    """Each trivial policy's mean reward over the held-out rows (a row it has no answer for scores 0), the
    worst (highest) of them and whether the task passes (worst <= LIMIT)."""
    labels = [r["label"] for r in held]
    scores: dict[str, dict] = {}
    for name, answers in trivial_answers(held, train, seed).items():
        replies = [f"<answer>{a}</answer>" if a is not None else "" for a in answers]
        values = reward_fn(replies, ["" for _ in replies], labels)
        answered = sum(a is not None for a in answers)
        scores[name] = {
            "mean_reward": sum(values) / len(values),
            "rows_answered": answered,
            "rows_scoring": sum(v > 0 for v in values),
            "example": next((a for a in answers if a is not None), None),
        }
    worst = max(scores, key=lambda k: scores[k]["mean_reward"])
    return {
        "rows": len(held),
        "train_rows": len(train),
        "limit": LIMIT,
        "policies": scores,
        "worst": worst,
        "worst_reward": scores[worst]["mean_reward"],
        "passes": scores[worst]["mean_reward"] <= LIMIT,
    }


def refusal(name: str, result: dict) -> str | None:
    """The one line a study stops with when the task fails its audit; None when it passes."""
    if result["passes"]:
        return None
    return (
        f"shortcut audit: task {name!r} refused: the trivial policy {result['worst']!r} scores "
        f"{result['worst_reward']:.3f} mean reward on the study's {result['rows']} held-out rows (limit {LIMIT}); "
        f"choose a task no trivial policy solves (studies/realmodel/audit.py)"
    )


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import calibrate  # noqa: PLC0415  (studies/realmodel is not a package)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="candidate names (default: every candidate)")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, candidate in calibrate.ALL.items():
        if args.only and name not in args.only:
            continue
        task, held = calibrate.study_split(candidate)
        result = {"candidate": name, **candidate.describe(), **audit(held, task.train, task.reward_fn)}
        (RESULTS / f"{slug(name)}.json").write_text(json.dumps(result, indent=1) + "\n")
        line = refusal(name, result) or (
            f"shortcut audit: task {name!r} passes: the best trivial policy {result['worst']!r} scores "
            f"{result['worst_reward']:.3f} (limit {LIMIT})"
        )
        failed += not result["passes"]
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
