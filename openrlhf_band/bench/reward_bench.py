"""Reward scoring throughput against the number of math-verify workers, side by side in one run.

Responses are scored the way OpenRLHF 0.11.2 scores them: one `reward_func([query], [prompt],
[label])` call per sample from many threads at once (its rollout runs one `asyncio.to_thread` per
sample). Two sets: "hard", where every answer needs math-verify (equivalent forms such as
\\frac{6}{8} against 3/4, none decided by the fast paths, each pair fresh since math-verify caches
its parses), and "mix", closer to a rollout (40% plain integers, 15% the label's exact string, 30%
equivalent forms, 15% no answer).

    openrlhf-band bench reward --workers 1 2 4     # out/bench/reward_cpu.json
"""

from __future__ import annotations

import argparse
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

from openrlhf_band.bench.common import require_modules, write_json


def equivalent_pair(rng: random.Random) -> tuple[str, str]:
    """A fresh (answer as written, label) pair that only math-verify can decide (no repeats: no cache)."""
    a, b, m = rng.randint(1, 97), rng.randint(2, 97), rng.randint(2, 9)
    kind = rng.randrange(4)
    if kind == 0:
        return f"\\frac{{{a * m}}}{{{b * m}}}", f"{a}/{b}"
    if kind == 1:
        return f"{m}\\sqrt{{{a}}}", f"\\sqrt{{{m * m * a}}}"
    if kind == 2:
        return f"x^2 + {2 * a}x + {a * a}", f"(x+{a})^2"
    return f"\\dfrac{{{a}}}{{{4 if a % 2 else 8}}}", f"{a / (4 if a % 2 else 8)}"


def responses(kind: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(query, label) pairs."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        pick = rng.random() if kind == "mix" else 0.5
        if kind == "hard" or 0.4 + 0.15 <= pick < 0.85:
            answer, label = equivalent_pair(rng)
        elif pick < 0.4:
            label = str(rng.randint(0, 999))
            answer = label if rng.random() < 0.5 else str(rng.randint(0, 999))
        elif pick < 0.55:
            answer = label = equivalent_pair(rng)[1]
        else:
            answer, label = None, "7"
        text = "Let me think step by step. " * 20 + (f"\nAnswer: {answer}" if answer is not None else "\nno idea")
        rows.append((text, label))
    return rows


def score_rate(reward, rows: list[tuple[str, str]], threads: int) -> float:
    """Responses per second, one reward_func call per response from `threads` threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda row: reward.reward_func([row[0]], [""], [row[1]]), rows))
    return len(rows) / (time.perf_counter() - start)


def run(workers: list[int], n: int, threads: int) -> dict:
    from openrlhf_band.tasks.math import reward

    require_modules("math_verify", "pebble")
    sets = {kind: responses(kind, n) for kind in ("hard", "mix")}
    rows = []
    for count in workers:
        os.environ["OPENRLHF_BAND_REWARD_WORKERS"] = str(count)
        reward.POOL.shutdown()
        if not reward.warmup(180):
            raise RuntimeError(f"{count} math-verify workers did not start")
        for kind, data in sets.items():
            score_rate(reward, data[: max(1, n // 10)], threads)  # warm caches
            rate = score_rate(reward, data, threads)
            rows.append({"workers": count, "set": kind, "responses_per_s": rate, "per_worker": rate / count})
    reward.POOL.shutdown()
    return {"benchmark": "reward", "responses": n, "threads": threads, "cpus": os.cpu_count(), "rows": rows}


def format_report(result: dict) -> str:
    lines = [f"{result['responses']} responses per set, {result['threads']} calling threads, {result['cpus']} CPUs"]
    lines.append(f"{'workers':>8}{'set':>6}{'responses/s':>13}{'per worker':>12}")
    for row in result["rows"]:
        lines.append(f"{row['workers']:>8}{row['set']:>6}{row['responses_per_s']:>13.0f}{row['per_worker']:>12.0f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--responses", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=64, help="concurrent reward_func calls")


def main(args: argparse.Namespace) -> int:
    result = run(args.workers, args.responses, args.threads)
    print(format_report(result))
    print(f"wrote {write_json('reward_cpu.json', result)}")
    return 0
