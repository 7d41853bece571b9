"""Calibrate the real-model study's task: SmolLM2-135M-Instruct's starting numbers on candidate
reasoning-gym settings (task options, number of shots), to pick one where the held-out start is
0.2-0.35 (enough groups of 8 carry a gradient; room to rise).

    .venv-e2e/bin/python studies/realmodel/calibrate.py [--rows 128] [--samples 4]
        (make realmodel-calibrate; writes studies/realmodel/results/calibration.json and .md)

For each candidate: `openrlhf-band prepare-data` (reasoning-gym 0.1.25, seed 7), then on `--rows`
held-out prompts: the sampled reward (`--samples` seeded samples each, T = 1, 24 tokens, the task's
scorer), the greedy reward, the exact probability of the canonical reply and the exact entropy along
it (loop.exact_eval), the prompt length and the seconds. The starting model is the same everywhere.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "realmodel" / "results"
MODEL = ROOT / ".venv-e2e" / "models" / "smollm2-135m-instruct"


def _opts(task: str, **options) -> list[str]:
    return [a for k, v in options.items() for a in ("--task-option", f"{task}.{k}={v}")]


# Tasks whose item space is large enough for disjoint training and held-out splits (chain_sum with one-digit
# terms has ~200 distinct items: prepare-data leaves no held-out row after de-duplication).
_CHAIN2 = _opts("chain_sum", max_terms=2, max_digits=2)
_BASIC2 = _opts(
    "basic_arithmetic", max_terms=2, max_digits=2, operators='["+"]', allow_parentheses="false", allow_negation="false"
)
#: name -> prepare-data arguments (beside --source reasoning-gym --seed 7 and the sizes)
CANDIDATES: dict[str, list[str]] = {
    "engine study's (chain_sum 1 digit + spell_backward len<=4, 2 shots)": [
        "--tasks",
        "chain_sum,spell_backward",
        "--shots",
        "2",
        *_opts("chain_sum", max_terms=2, max_digits=1),
        *_opts("spell_backward", max_word_len=4),
    ],
    "chain_sum 2 terms <=2 digits, 4 shots": ["--tasks", "chain_sum", "--shots", "4", *_CHAIN2],
    "basic_arithmetic + 2 terms <=2 digits, 4 shots": ["--tasks", "basic_arithmetic", "--shots", "4", *_BASIC2],
    "spell_backward len<=3, 4 shots": [
        "--tasks",
        "spell_backward",
        "--shots",
        "4",
        *_opts("spell_backward", max_word_len=3),
    ],
    "spell_backward len<=4, 4 shots": [
        "--tasks",
        "spell_backward",
        "--shots",
        "4",
        *_opts("spell_backward", max_word_len=4),
    ],
}


def prepare(args: list[str], out: Path, size: int, eval_size: int) -> Path:
    """The candidate's data directory (made once; PREPARE_ARGS records what made it), by this interpreter's
    `openrlhf-band prepare-data` (either venv's: the audit runs without the model's)."""
    full = ["--source", "reasoning-gym", "--seed", "7", "--size", str(size), "--eval-size", str(eval_size), *args]
    stamp = out / "PREPARE_ARGS"
    if not stamp.exists() or stamp.read_text() != json.dumps(full):
        cli = [sys.executable, "-m", "openrlhf_band.tools.cli", "prepare-data"]
        subprocess.run([*cli, *full, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(json.dumps(full))
    return out


@dataclass(frozen=True)
class Candidate:
    """A task setting as a study uses it: what prepares its data, how its reward is read, and the split sizes.

    reward: "partial" = the reasoning-gym scorer's value through tasks/reasoning_gym/reward.py (partial credit
    included); "exact" = 1 when that value is 1 (the scorer's exact match), else 0. held_rows: the held-out
    rows a study evaluates on (the first ones, tasks round-robin), which the audit scores."""

    prepare: tuple[str, ...]
    reward: str = "partial"
    train_size: int = 512
    eval_size: int = 256
    held_rows: int = 256

    def describe(self) -> dict:
        return {
            "prepare": list(self.prepare),
            "reward": self.reward,
            "train_size": self.train_size,
            "eval_size": self.eval_size,
            "held_rows": self.held_rows,
        }


def _words(task: str, lo: int, hi: int) -> list[str]:
    return _opts(task, min_words=lo, max_words=hi)


#: the binary-reward candidates for the entropy study (studies/realmodel/entropy_study.py), calibrated with
#: `calibrate.py --binary` (results/entropy/calibration.md)
BINARY: dict[str, Candidate] = {
    "word_sequence_reversal 2-3 words, 4 shots, exact": Candidate(
        ("--tasks", "word_sequence_reversal", "--shots", "4", *_words("word_sequence_reversal", 2, 3)), "exact"
    ),
    "word_sequence_reversal 3-4 words, 4 shots, exact": Candidate(
        ("--tasks", "word_sequence_reversal", "--shots", "4", *_words("word_sequence_reversal", 3, 4)), "exact"
    ),
    "word_sequence_reversal 2-3 words, 8 shots, exact": Candidate(
        ("--tasks", "word_sequence_reversal", "--shots", "8", *_words("word_sequence_reversal", 2, 3)), "exact"
    ),
    "word_sequence_reversal 2 words, 8 shots, exact": Candidate(
        ("--tasks", "word_sequence_reversal", "--shots", "8", *_words("word_sequence_reversal", 2, 2)), "exact"
    ),
    "chain_sum 2 terms 1-2 digits, 8 shots, exact": Candidate(
        (
            "--tasks",
            "chain_sum",
            "--shots",
            "8",
            *_opts("chain_sum", min_terms=2, max_terms=2, min_digits=1, max_digits=2),
        ),
        "exact",
    ),
    "word_sorting 3 words, 4 shots, exact": Candidate(
        ("--tasks", "word_sorting", "--shots", "4", *_words("word_sorting", 3, 3)), "exact"
    ),
    "chain_sum 2 terms 1-2 digits, 4 shots, exact": Candidate(
        (
            "--tasks",
            "chain_sum",
            "--shots",
            "4",
            *_opts("chain_sum", min_terms=2, max_terms=2, min_digits=1, max_digits=2),
        ),
        "exact",
    ),
    "spell_backward len<=3, 4 shots, exact": Candidate(
        ("--tasks", "spell_backward", "--shots", "4", *_opts("spell_backward", max_word_len=3)), "exact", 640, 600
    ),
}

#: every audited candidate: the first paired study's task as it ran (partial credit, its sizes) and the binary ones
ALL: dict[str, Candidate] = {
    "spell_backward len<=3, 4 shots": Candidate(
        tuple(CANDIDATES["spell_backward len<=3, 4 shots"]), "partial", 640, 600
    ),
    **BINARY,
}


def study_split(candidate: Candidate, work: Path | None = None) -> tuple[loop.Task, list[dict]]:
    """(the task with the candidate's reward, the held-out rows a study evaluates): prepared once under `work`."""
    work = work or ROOT / "out" / "realmodel" / "candidates"
    data = prepare(list(candidate.prepare), work / _slug(candidate), candidate.train_size, candidate.eval_size)
    task = loop.Task.load(data, reward=candidate.reward)
    return task, interleave(task.eval, candidate.held_rows)


def _slug(candidate: Candidate) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(candidate.describe()).encode()).hexdigest()[:12]


def interleave(rows: list[dict], n: int) -> list[dict]:
    """The first n held-out rows taken round-robin over tasks (eval.jsonl holds them task by task)."""
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r.get("datasource", "default"), []).append(r)
    out, k = [], 0
    while len(out) < n and any(k < len(v) for v in by_task.values()):
        out += [v[k] for v in by_task.values() if k < len(v)]
        k += 1
    return out[:n]


def heldout_tasks(rows: list[dict]) -> dict[str, int]:
    return dict(Counter(r.get("datasource", "default") for r in rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "realmodel" / "calibration")
    parser.add_argument("--only", nargs="*", help="candidate names (default: all)")
    parser.add_argument("--table-only", action="store_true", help="rewrite calibration.md from calibration.json")
    parser.add_argument(
        "--binary",
        action="store_true",
        help="the entropy study's candidates (BINARY, exact-match reward) that pass the shortcut audit: "
        "results/entropy/calibration.json and .md (--rows 64 --samples 8 is its design)",
    )
    args = parser.parse_args()
    if args.binary:
        return calibrate_binary(args.rows, args.samples, args.only)
    if args.table_only:
        write_table(json.loads((RESULTS / "calibration.json").read_text()), args.rows, args.samples)
        return 0
    policy = loop.Policy(MODEL)
    results = json.loads((RESULTS / "calibration.json").read_text()) if (RESULTS / "calibration.json").exists() else {}
    for i, (name, prep) in enumerate(CANDIDATES.items()):
        if args.only and name not in args.only:
            continue
        start = time.time()
        data = prepare(prep, args.work / f"c{i}", size=512, eval_size=args.rows)
        task = loop.Task.load(data)
        rows = interleave(task.eval, args.rows)
        sampled = loop.sampled_eval(policy, task, rows, args.samples, seed=0, max_new_tokens=24)
        greedy = loop.sampled_eval(policy, task, rows, 1, seed=0, max_new_tokens=24, greedy=True)
        exact = loop.exact_eval(policy, rows)
        prompt_tokens = sum(len(policy.encode(policy.prompt_text(r))) for r in rows) / len(rows)
        results[name] = {
            "heldout_tasks": heldout_tasks(rows),
            "prepare": prep,
            "sampled": sampled,
            "greedy": greedy,
            "exact": exact,
            "prompt_tokens": prompt_tokens,
            "seconds": round(time.time() - start, 1),
        }
        print(
            f"{name}: sampled {sampled['mean_reward']:.3f} greedy {greedy['mean_reward']:.3f} "
            f"p_correct {exact['mean_p_correct']:.3f} prompt {prompt_tokens:.0f} tok",
            flush=True,
        )
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "calibration.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(results, args.rows, args.samples)
    return 0


ENTROPY_RESULTS = RESULTS / "entropy"


def calibrate_binary(rows: int, samples: int, only: list[str] | None) -> int:
    """The binary candidates' start: sampled exact-match rate (T = 1, `samples` seeded samples a prompt), the share
    of prompts whose group of `samples` carries a gradient (rewards not all equal), greedy rate, the canonical
    reply's exact probability and entropy. A candidate that fails the shortcut audit is not calibrated."""
    import audit

    policy = loop.Policy(MODEL, shared_prefix=True)  # the few-shot turns run once a batch (loop.Policy)
    path = ENTROPY_RESULTS / "calibration.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for name, candidate in BINARY.items():
        if only and name not in only:
            continue
        task, held = study_split(candidate)
        check = audit.audit(held, task.train, task.reward_fn)
        if not check["passes"]:
            print(audit.refusal(name, check), flush=True)
            continue
        start = time.time()
        picked = held[:rows]
        uniforms = loop.step_uniforms(0, 0, len(picked) * samples, 24, purpose="calibration")
        _, replies, scores = loop.sample_and_score(policy, task, picked, samples, uniforms, 24)
        groups = [scores[i * samples : (i + 1) * samples] for i in range(len(picked))]
        greedy = loop.sampled_eval(policy, task, picked, 1, seed=0, max_new_tokens=24, greedy=True)
        exact = loop.exact_eval(policy, picked)
        results[name] = {
            **candidate.describe(),
            "audit_worst": check["worst"],
            "audit_worst_reward": check["worst_reward"],
            "rows": len(picked),
            "samples": samples,
            "sampled_reward": sum(scores) / len(scores),
            "informative_groups": sum(len(set(g)) > 1 for g in groups) / len(groups),
            "answer_found": sum("<answer>" in policy.decode(r) for r in replies) / len(replies),
            "reply_tokens": sum(map(len, replies)) / len(replies),
            "greedy_reward": greedy["mean_reward"],
            "exact": exact,
            "prompt_tokens": sum(len(policy.encode(policy.prompt_text(r))) for r in picked) / len(picked),
            "seconds": round(time.time() - start, 1),
        }
        r = results[name]
        print(
            f"{name}: sampled {r['sampled_reward']:.3f}, informative groups {r['informative_groups']:.2f}, greedy "
            f"{r['greedy_reward']:.3f}, exact p {exact['mean_p_correct']:.3f}, prompt {r['prompt_tokens']:.0f} tok, "
            f"{r['seconds']:.0f} s",
            flush=True,
        )
        ENTROPY_RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    write_binary_table(results)
    return 0


def binary_table(results: dict) -> list[str]:
    lines = [
        "SmolLM2-135M-Instruct at the start on the binary candidates (exact match: 1 or 0), the first held-out rows "
        "(tasks round-robin), T = 1, 24 new tokens; `informative` = share of prompts whose group of samples has "
        "unequal rewards (carries a gradient); audit = the best trivial policy's mean reward (results/audit/).",
        "",
        "| setting | rows x samples | sampled exact-match | se | informative groups | greedy | exact p(canonical) | "
        "exact entropy (nats) | answer tag | prompt tokens | audit | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        n = r["rows"] * r["samples"]
        p = r["sampled_reward"]
        lines.append(
            f"| {name} | {r['rows']} x {r['samples']} | {p:.3f} | {(p * (1 - p) / n) ** 0.5:.3f} | "
            f"{r['informative_groups']:.2f} | {r['greedy_reward']:.3f} | {r['exact']['mean_p_correct']:.3f} | "
            f"{r['exact']['entropy']:.3f} | {r['answer_found']:.2f} | {r['prompt_tokens']:.0f} | "
            f"{r['audit_worst_reward']:.3f} ({r['audit_worst']}) | {r['seconds']:.0f} |"
        )
    return lines


def write_binary_table(results: dict) -> None:
    header = "<!-- written by studies/realmodel/calibrate.py --binary from calibration.json; do not edit -->"
    (ENTROPY_RESULTS / "calibration.md").write_text("\n".join([header, *binary_table(results)]) + "\n")


def calibration_table(results: dict, rows: int, samples: int) -> list[str]:
    lines = [
        f"SmolLM2-135M-Instruct at the start, {rows} held-out prompts per setting (tasks round-robin), T = 1, "
        f"24 tokens; sampled = {samples} seeded samples a prompt; exact = the canonical reply's probability.",
        "",
        "| setting | held-out rows | sampled reward | se | greedy reward | exact p(correct) | exact entropy (nats) | "
        "answer tag | "
        "prompt tokens | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s, n = r["sampled"], r["sampled"]["rows"] * r["sampled"]["samples"]
        se = (s["mean_reward"] * (1 - s["mean_reward"]) / n) ** 0.5
        held = ", ".join(f"{k} {v}" for k, v in r.get("heldout_tasks", {}).items())
        lines.append(
            f"| {name} | {held} | {s['mean_reward']:.3f} | {se:.3f} | {r['greedy']['mean_reward']:.3f} | "
            f"{r['exact']['mean_p_correct']:.3f} | {r['exact']['entropy']:.3f} | {s['answer_found']:.2f} | "
            f"{r['prompt_tokens']:.0f} | {r['seconds']:.0f} |"
        )
    return lines


def write_table(results: dict, rows: int, samples: int) -> None:
    header = "<!-- written by studies/realmodel/calibrate.py from calibration.json; do not edit -->"
    (RESULTS / "calibration.md").write_text("\n".join([header, *calibration_table(results, rows, samples)]) + "\n")


if __name__ == "__main__":
    sys.exit(main())
