"""The shortcut audit (studies/realmodel/audit.py): it flags the first paired study's task, spell_backward with
words of at most 3 letters under partial credit, at the copy's 0.367, from freshly prepared data and the task's
own reward file; the committed audit files are what it computes; and it can fail either way."""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies" / "realmodel"))
import audit  # noqa: E402
import calibrate  # noqa: E402

OLD_TASK = "spell_backward len<=3, 4 shots"


def _copy_score(word: str, exact: bool) -> Fraction:
    """spell_backward's scorer (reasoning-gym 0.1.25, SpellBackwardDataset.score_answer) on the word copied
    forward, written out here from its source's rule: case-insensitive equality with the reversal scores 1;
    else 1/len for each position where the two agree (a full sum, which equality already caught, would be
    cut to 0.8). Exact: 1 only on equality, as the study's 0/1 mapping."""
    oracle, answer = word[::-1].lower(), word.lower()
    if oracle == answer:
        return Fraction(1)
    if exact:
        return Fraction(0)
    return Fraction(sum(a == b for a, b in zip(oracle, answer)), len(oracle))


def test_the_audit_refuses_the_first_study_task_at_the_copys_score(tmp_path):
    candidate = calibrate.ALL[OLD_TASK]
    task, held = calibrate.study_split(candidate, work=tmp_path)
    assert len(held) == 256
    result = audit.audit(held, task.train, task.reward_fn)
    copy = result["policies"]["field word"]
    # the copied word is the question's last word too: three policies, one answer
    assert result["policies"]["last word"]["mean_reward"] == copy["mean_reward"]
    words = [json.loads(r["label"])["entry"]["metadata"]["word"] for r in held]
    # the reward file returns float32 scores: each within half a float32 ulp (<= 2**-25 below 1) of its exact value,
    # so the mean is within 2**-25 (+ the float64 sum's ~1e-14); one row more or less moves it by >= 1/768
    expected = sum(_copy_score(w, exact=False) for w in words) / len(words)
    assert abs(copy["mean_reward"] - float(expected)) <= 2**-25 + 1e-12, (copy, float(expected))
    assert abs(copy["mean_reward"] - 0.367) < 5e-4, copy  # the figure docs/smollm2_study.md quotes
    assert copy["rows_scoring"] == 256  # the middle letter always matches (and 1-letter words entirely)
    assert not result["passes"] and result["worst_reward"] >= copy["mean_reward"]
    line = audit.refusal(OLD_TASK, result)
    assert line is not None and "\n" not in line
    assert "refused" in line and "0.367" in line and "limit 0.05" in line
    # the same task scored 0/1: only the words that read the same backwards survive the copy
    exact_task, exact_held = calibrate.study_split(calibrate.BINARY["spell_backward len<=3, 4 shots, exact"], tmp_path)
    exact = audit.audit(exact_held, exact_task.train, exact_task.reward_fn)
    words = [json.loads(r["label"])["entry"]["metadata"]["word"] for r in exact_held]
    expected = sum(_copy_score(w, exact=True) for w in words) / len(words)
    assert exact["policies"]["field word"]["mean_reward"] == float(expected)  # 0s and 1s: exact in float32 and 64
    # the committed file is this computation's
    committed = json.loads((audit.RESULTS / f"{audit.slug(OLD_TASK)}.json").read_text())
    assert committed["policies"]["field word"]["mean_reward"] == copy["mean_reward"]
    assert committed["passes"] is False


def _row(question: str, answer: str, metadata: dict) -> dict:
    entry = {"question": question, "answer": answer, "metadata": metadata}
    return {"label": json.dumps({"task": "t", "entry": entry}), "prompt": question}


def test_the_trivial_policies_read_the_question_and_the_training_answers():
    held = [_row("Reverse this list of words: a, b", "b, a", {"words": ["a", "b"], "solution": "b, a", "n": 2})]
    train = [_row("q1", "x", {}), _row("q2", "x", {}), _row("q3", "y", {})]
    policies = audit.trivial_answers(held, train)
    assert policies["empty"] == [""]
    assert policies["last word"] == ["b"]
    assert policies["after the last colon"] == ["a, b"]
    assert policies["most common training answer"] == ["x"]
    assert policies["random training answer"][0] in {"x", "y"}
    # a field is an input only when the question shows it: the solution is not one, the count 2 is not shown
    assert "field solution" not in policies and "field n" not in policies and "field words" not in policies


def test_the_audit_fails_a_reward_any_answer_gets_and_passes_one_none_gets():
    held = [_row(f"What is {i} + 1?", str(i + 1), {"a": i}) for i in range(20)]
    always = audit.audit(held, held, lambda queries, prompts, labels: [1.0 for _ in queries])
    never = audit.audit(held, held, lambda queries, prompts, labels: [0.0 for _ in queries])
    assert not always["passes"] and audit.refusal("t", always) is not None
    assert never["passes"] and never["worst_reward"] == 0.0 and audit.refusal("t", never) is None
    # just above and at the limit
    share = lambda k: lambda q, p, labels: [1.0 if i < k else 0.0 for i in range(len(q))]  # noqa: E731
    assert audit.audit(held, held, share(1))["passes"]  # 1 of 20 = 0.05: at the limit, passes
    assert not audit.audit(held, held, share(2))["passes"]
