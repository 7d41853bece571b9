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
    """The candidate's data directory (made once; PREPARE_ARGS records what made it)."""
    full = ["--source", "reasoning-gym", "--seed", "7", "--size", str(size), "--eval-size", str(eval_size), *args]
    stamp = out / "PREPARE_ARGS"
    if not stamp.exists() or stamp.read_text() != json.dumps(full):
        cli = ROOT / ".venv-e2e" / "bin" / "openrlhf-band"
        subprocess.run([str(cli), "prepare-data", *full, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(json.dumps(full))
    return out


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
    args = parser.parse_args()
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
