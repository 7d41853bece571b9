"""What the studies' drivers share (studies/learn/learn_study.py, studies/smollm2/study.py): paired runs
of named methods over seeds, one script call each, resumable; their summaries loaded back; mean +- sd;
the per-step CSV. Each driver keeps its own script, columns, tables and plots."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path


def run_pairs(
    script: Path,
    out: Path,
    seeds: int,
    methods: dict[str, list[str]],
    env: dict[str, str],
    seed0: int,
    restore: Callable[[str, int, Path], bool] | None = None,
    on_finished: Callable[[str, int, Path], None] | None = None,
) -> int:
    """`bash script OUT/METHOD/seedI FLAGS --train.seed seed0+I` for every (seed, method), seed by seed so
    that a stopped study still holds whole pairs; a run whose summary.json exists is skipped, one without is
    started afresh (its folder removed first); a run that exits non-zero is failed even if it wrote a summary
    (moved to summary.json.failed, so neither a resumed study nor load_runs takes it).
    `restore(method, seed, run_dir)` may put a finished run's summary.json in place from elsewhere (True:
    done); `on_finished` is called after each run that finished. A file OUT/STOP stops the study before its
    next run (it is removed; the run in progress finishes and cleans up its cluster). 0 when every run
    finished, 1 if any failed (the others still run), 3 if stopped."""
    failed = []
    for seed in range(seeds):
        for method, flags in methods.items():
            run_dir = out / method / f"seed{seed}"
            if (run_dir / "summary.json").exists() or (restore is not None and restore(method, seed, run_dir)):
                continue
            stop = out / "STOP"
            if stop.exists():
                stop.unlink()
                print(f"[study] stopped by {stop} before {method} seed {seed}; run it again to continue", flush=True)
                return 3
            if run_dir.exists():  # a failed or stopped run's leftovers: its TensorBoard events would mix in
                shutil.rmtree(run_dir)
            args = ["bash", str(script), str(run_dir), *flags, "--train.seed", str(seed0 + seed)]
            print(f"[study] {method} seed {seed}: {' '.join(args[3:])}", flush=True)
            proc = subprocess.run(args, env={**os.environ, **env})
            if proc.returncode != 0 or not (run_dir / "summary.json").exists():
                if (run_dir / "summary.json").exists():  # written before the error: kept aside, never loaded
                    (run_dir / "summary.json").replace(run_dir / "summary.json.failed")
                failed.append((method, seed))
                print(f"[study] FAILED: {method} seed {seed} (exit {proc.returncode}); see {run_dir}", flush=True)
            elif on_finished is not None:
                on_finished(method, seed, run_dir)
    return 1 if failed else 0


def load_runs(out: Path, methods: list[str]) -> dict[str, dict[int, dict]]:
    """{method: {seed: its summary.json}} for the runs under `out` that finished."""
    runs: dict[str, dict[int, dict]] = {}
    for method in methods:
        for summary in sorted((out / method).glob("seed*/summary.json")):
            runs.setdefault(method, {})[int(summary.parent.name[4:])] = json.loads(summary.read_text())
    return runs


def mean_sd(values: list[float], signed: bool = True) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):{'+' if signed else ''}.3f} +- {sd:.3f}"


def write_steps(runs: dict[str, dict[int, dict]], path: Path, columns: list[tuple[str, str]]) -> None:
    """One row per (method, seed, step): each (csv name, TensorBoard tag) column from the run's metrics."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "seed", "step", *(name for name, _ in columns)])
        for method, by_seed in runs.items():
            for seed, s in sorted(by_seed.items()):
                for step in range(1, s["steps"] + 1):
                    row = [s["metrics"].get(tag, {}).get(str(step)) for _, tag in columns]
                    writer.writerow([method, seed, step, *("" if v is None else f"{v:.6g}" for v in row)])
