"""The one study driver: what every study of named methods over seeds shares. The learning study
(studies/learn/learn_study.py) and the engine study (studies/smollm2/study.py) run one script a run; the
exactly paired real-model study (studies/realmodel/study.py) runs in-process. Each study keeps only what
is its own: its script or run function, its settings, its columns and its stopping rule.

- running: `run_seeds` runs seeds x methods seed by seed (a stopped study holds whole pairs), skips
  finished runs, stops before its next run when a STOP file appears (`Stop`), at a study's stopping
  rule, and goes on past a failed run; `run_pairs` is that for a study that runs one script a run.
- carrying: `Ledger`, the committed record of finished runs (FOLDER/METHOD-seedS.json, each with the
  settings it ran with), so that a study resumes in a later sitting or on another machine.
- loading and statistics: `load_runs`; `mean_sd`, `mean_and_sd`, `paired_by_seed`, the paired mean's
  95% Student t `interval`, the `sign_test`.
- writing: the summary.txt sections (`final_section`, `rise_section`, `paired_section`), summary.json's
  `stats_by_method`, `write_report` (summary.txt, summary.json, the per-step steps.csv, curves.png),
  `markdown_table` for the pages; `study_cli`, the `run` and `report` subcommands of a script-run study.

A run's summary, as the script-run studies write it: {"before": {name: value}, "after": {name: value},
"steps": int, "seconds_per_step": float, "metrics": {TensorBoard tag: {"STEP": value}}, ...}.
studies/ is not a package: the studies put it on sys.path and import this module by its name (its dataclasses
look their module up in sys.modules, so a copy loaded from its path alone would not define them).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: method -> seed -> that run's summary (or ledger record)
Runs = dict[str, dict[int, dict]]


# ---------------------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Stop:
    """How a study is stopped by hand: `touch FILE` stops it before its next run (the run in progress finishes).

    `said` is the line printed ({file}, {method} and {seed} filled in) and `status` what the driver returns.
    `consumed`: the file is removed as the study stops, so that the next call continues (the script-run
    studies); otherwise it stays and every call stops until it is removed by hand. `at_once`: looked for
    before every (seed, method), finished or not, so that a resumed study stops before it reports again
    (the exactly paired study); otherwise only before a run that starts."""

    file: Path
    said: str = "stopped by {file} before {method} seed {seed}; run it again to continue"
    status: int = 3
    consumed: bool = True
    at_once: bool = False

    def stops(self, log: str, method: str, seed: int) -> bool:
        """Whether the file is there, before `method` at `seed`: if so, says so (and takes it away if consumed)."""
        if not self.file.exists():
            return False
        if self.consumed:
            self.file.unlink()
        print(f"{log} " + self.said.format(file=self.file, method=method, seed=seed), flush=True)
        return True


def run_seeds(
    seeds: Iterable[int],
    methods: Sequence[str],
    finished: Callable[[str, int], bool],
    run: Callable[[str, int], bool],
    stop: Stop,
    log: str = "[study]",
    stopping_rule: Callable[[], str | None] | None = None,
    after_seed: Callable[[int], None] | None = None,
) -> int:
    """Every (seed, method), seed by seed so that a stopped study still holds whole pairs: `finished(method, seed)`
    says a run is done (it is skipped), `run(method, seed)` runs one and says whether it finished (a failed run
    does not stop the others). Before each seed `stopping_rule()` may say why the study is done (printed, and no
    further seed starts); `after_seed(seed)` follows each seed that was not stopped. Returns 0 when every run
    finished, 1 if any failed, `stop.status` if stopped by hand."""
    failed = []
    for seed in seeds:
        why = stopping_rule() if stopping_rule is not None else None
        if why:
            print(f"{log} stopping rule met: {why}", flush=True)
            break
        for method in methods:
            if stop.at_once and stop.stops(log, method, seed):
                return stop.status
            if finished(method, seed):
                continue
            if not stop.at_once and stop.stops(log, method, seed):
                return stop.status
            if not run(method, seed):
                failed.append((method, seed))
        if after_seed is not None:
            after_seed(seed)
    return 1 if failed else 0


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
    """`bash script OUT/METHOD/seedI FLAGS --train.seed seed0+I` for every (seed, method) through `run_seeds`: a run
    whose summary.json exists is skipped, one without is started afresh (its folder removed first); a run that exits
    non-zero is failed even if it wrote a summary (moved to summary.json.failed, so neither a resumed study nor
    load_runs takes it). `restore(method, seed, run_dir)` may put a finished run's summary.json in place from
    elsewhere (True: done); `on_finished` is called after each run that finished. A file OUT/STOP stops the study
    before its next run (it is removed; the run in progress finishes and cleans up its cluster). 0 when every run
    finished, 1 if any failed (the others still run), 3 if stopped."""

    def finished(method: str, seed: int) -> bool:
        run_dir = out / method / f"seed{seed}"
        return (run_dir / "summary.json").exists() or (restore is not None and restore(method, seed, run_dir))

    def run(method: str, seed: int) -> bool:
        run_dir = out / method / f"seed{seed}"
        if run_dir.exists():  # a failed or stopped run's leftovers: its TensorBoard events would mix in
            shutil.rmtree(run_dir)
        args = ["bash", str(script), str(run_dir), *methods[method], "--train.seed", str(seed0 + seed)]
        print(f"[study] {method} seed {seed}: {' '.join(args[3:])}", flush=True)
        proc = subprocess.run(args, env={**os.environ, **env})
        if proc.returncode != 0 or not (run_dir / "summary.json").exists():
            if (run_dir / "summary.json").exists():  # written before the error: kept aside, never loaded
                (run_dir / "summary.json").replace(run_dir / "summary.json.failed")
            print(f"[study] FAILED: {method} seed {seed} (exit {proc.returncode}); see {run_dir}", flush=True)
            return False
        if on_finished is not None:
            on_finished(method, seed, run_dir)
        return True

    return run_seeds(range(seeds), list(methods), finished, run, Stop(out / "STOP"))


# ---------------------------------------------------------------------------------------------- carrying
@dataclass(frozen=True)
class Ledger:
    """A study's committed record of its finished runs, one JSON file a run, FOLDER/METHOD-seedS.json, each with
    the settings it ran with (its "settings"): a run is taken from here only when those equal the study's."""

    folder: Path

    def path(self, method: str, seed: int) -> Path:
        return self.folder / f"{method}-seed{seed}.json"

    def read(self, method: str, seed: int) -> dict | None:
        """The run's record, whatever its settings; None when there is none."""
        path = self.path(method, seed)
        return json.loads(path.read_text()) if path.exists() else None

    def entry(self, method: str, seed: int, settings: dict) -> dict | None:
        """The run's record when it ran with `settings`; None when there is none or it ran with others."""
        entry = self.read(method, seed)
        return entry if entry is not None and entry.get("settings") == settings else None

    def write(self, method: str, seed: int, record: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path(method, seed).write_text(json.dumps(record, indent=1) + "\n")

    def copy(self, method: str, seed: int, summary: Path) -> None:
        """A finished run's summary file, kept as it is."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path(method, seed).write_text(summary.read_text())

    def runs(self, methods: Iterable[str], settings: dict | None = None) -> Runs:
        """The records of `methods` (with `settings`, when given), as load_runs gives an out/ tree's summaries."""
        runs: Runs = {}
        for method in methods:
            for path in self.folder.glob(f"{method}-seed*.json"):
                record = json.loads(path.read_text())
                if settings is None or record.get("settings") == settings:
                    runs.setdefault(method, {})[int(path.stem.rsplit("seed", 1)[1])] = record
        return runs

    def entries(self, settings: dict) -> list[dict]:
        """Every record that ran with `settings`, in file-name order (method, then seed as text)."""
        records = (json.loads(path.read_text()) for path in sorted(self.folder.glob("*.json")))
        return [record for record in records if record.get("settings") == settings]


# ---------------------------------------------------------------------------------------------- loading
def load_runs(out: Path, methods: list[str]) -> Runs:
    """{method: {seed: its summary.json}} for the runs under `out` that finished."""
    runs: Runs = {}
    for method in methods:
        for summary in sorted((out / method).glob("seed*/summary.json")):
            runs.setdefault(method, {})[int(summary.parent.name[4:])] = json.loads(summary.read_text())
    return runs


def load_paired_runs(out: Path, methods: list[str], baseline: str = "clip") -> Runs:
    """load_runs, or exit naming `out` when the baseline has no finished run (a report pairs every method with it)."""
    runs = load_runs(out, methods)
    if baseline not in runs:
        sys.exit(f"no {baseline} runs under {out}: run the study first")
    return runs


# ---------------------------------------------------------------------------------------------- statistics
def mean_sd(values: list[float], signed: bool = True) -> str:
    """The mean +- the sample sd to 3 decimals (sd nan for one value); `signed`: the mean with its sign."""
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):{'+' if signed else ''}.3f} +- {sd:.3f}"


def mean_and_sd(values: list[float]) -> tuple[float, float | None]:
    """The mean and the sample sd (None for one value), as the summary JSON holds them."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def paired_seeds(runs: Iterable[int], baseline: Iterable[int]) -> list[int]:
    """The seeds both a method and its baseline have, ascending (a method's runs by seed iterate as its seeds)."""
    return sorted(set(runs) & set(baseline))


def paired_by_seed(
    runs: dict[int, dict], baseline: dict[int, dict], value: Callable[[dict], float]
) -> tuple[list[int], list[float]]:
    """(paired_seeds; per seed, value(run) - value(baseline's run)): a difference paired by seed."""
    seeds = paired_seeds(runs, baseline)
    return seeds, [value(runs[i]) - value(baseline[i]) for i in seeds]


#: two-sided 95% Student t quantiles by degrees of freedom
T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
}


def half_width95(sd: float, n: int) -> float:
    """Half the two-sided 95% t interval of a mean of n values with sample sd `sd` (the normal 1.96 past 16 values)."""
    return T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def interval(values: list[float]) -> dict:
    """Mean, sd and the 95% t interval of the mean (None below 2 values)."""
    n = len(values)
    if n < 2:
        return {"n": n, "mean": values[0] if values else None, "sd": None, "ci95": None}
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = half_width95(sd, n)
    return {"n": n, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}


def sign_test(diffs: list[float]) -> dict:
    """Pairs where the difference is > 0 and the two-sided exact binomial p-value of that count (ties dropped)."""
    d = [x for x in diffs if x == x and x != 0]
    k, n = sum(x > 0 for x in d), len(d)
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n if n else 1.0
    return {"positive": k, "n": n, "p_two_sided": min(1.0, 2 * tail)}


# ---------------------------------------------------------------------------------------------- writing
def _row(method: str, cells: list[str]) -> str:
    return f"{method:<15}" + "".join(f"{c:>20}" for c in cells)


def steps_and_seeds(runs: Runs, baseline: str = "clip") -> str:
    """summary.txt's line of the steps per run (the baseline's first run) and the seeds per method."""
    some = next(iter(runs[baseline].values()))
    return f"steps per run: {some['steps']}; seeds per method: " + ", ".join(f"{m} {len(s)}" for m, s in runs.items())


def final_section(
    title: str, runs: Runs, keys: Sequence[str], extra_head: str, extra: Callable[[dict[int, dict]], str]
) -> list[str]:
    """A summary.txt section: each method's `after` numbers, mean +- sd over its seeds, under a header row;
    `extra(by_seed)` ends each row, under `extra_head`."""
    lines = [title, f"{'method':<15}" + "".join(f"{k:>20}" for k in keys) + extra_head]
    for method, by_seed in runs.items():
        cells = [mean_sd([s["after"][k] for s in by_seed.values()], signed=False) for k in keys]
        lines.append(_row(method, cells) + extra(by_seed))
    return lines


def rise_section(title: str, runs: Runs, keys: Sequence[str]) -> list[str]:
    """A summary.txt section: each method's after - before, mean +- sd over its seeds."""
    lines = [title]
    for method, by_seed in runs.items():
        lines.append(_row(method, [mean_sd([s["after"][k] - s["before"][k] for s in by_seed.values()]) for k in keys]))
    return lines


def paired_section(runs: Runs, keys: Sequence[str], baseline: str = "clip") -> list[str]:
    """A summary.txt section: each method's `after` minus the baseline's at the same seed, mean +- sd over the
    paired seeds (a method without a seed in common is left out)."""
    lines = [f"paired difference to {baseline} (same seed), mean +- sd over the paired seeds:"]
    for method, by_seed in runs.items():
        if method == baseline:
            continue
        seeds = paired_seeds(by_seed, runs[baseline])
        if not seeds:
            continue
        cells = [mean_sd([by_seed[i]["after"][k] - runs[baseline][i]["after"][k] for i in seeds]) for k in keys]
        lines.append(_row(method, cells) + f"   ({len(seeds)} pairs)")
    return lines


def stats_by_method(runs: Runs, keys: Sequence[str], per_key: Callable[[dict[int, dict], str], dict]) -> dict:
    """summary.json's "methods": per method its seeds, its steps (its first run's) and `per_key(by_seed, key)` for
    each key."""
    out = {}
    for method, by_seed in runs.items():
        entry = {"seeds": sorted(by_seed), "steps": next(iter(by_seed.values()))["steps"]}
        out[method] = entry | {k: per_key(by_seed, k) for k in keys}
    return out


def write_steps(runs: Runs, path: Path, columns: list[tuple[str, str]]) -> None:
    """One row per (method, seed, step): each (csv name, TensorBoard tag) column from the run's metrics."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "seed", "step", *(name for name, _ in columns)])
        for method, by_seed in runs.items():
            for seed, s in sorted(by_seed.items()):
                for step in range(1, s["steps"] + 1):
                    row = [s["metrics"].get(tag, {}).get(str(step)) for _, tag in columns]
                    writer.writerow([method, seed, step, *("" if v is None else f"{v:.6g}" for v in row)])


@dataclass(frozen=True)
class Curves:
    """curves.png: one panel per (TensorBoard tag, title), each method's mean over its seeds per step. An `eval/`
    tag (an evaluation every few steps) is drawn with markers, from step 0 at the run's before[start_key] when
    `start_key` is given."""

    panels: tuple[tuple[str, str], ...]
    title: str
    start_key: str | None = None

    def plot(self, runs: Runs, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(self.panels), figsize=(15, 4))
        for ax, (tag, title) in zip(axes, self.panels):
            evaluated = tag.startswith("eval/")
            for i, (method, by_seed) in enumerate(runs.items()):
                steps = sorted({int(k) for s in by_seed.values() for k in s["metrics"].get(tag, {})})
                if evaluated and self.start_key is not None:
                    steps = [0, *steps]
                ys = []
                for step in steps:
                    vals = [s["before"][self.start_key] if step == 0 else s["metrics"].get(tag, {}).get(str(step))
                            for s in by_seed.values()]  # fmt: skip
                    vals = [v for v in vals if v is not None]
                    ys.append(statistics.fmean(vals) if vals else float("nan"))
                ax.plot(steps, ys, label=method, color=f"C{i}", marker="o" if evaluated else None)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("train_ppo_ray step")
        axes[0].legend(fontsize=8)
        fig.suptitle(self.title, fontsize=11)
        fig.tight_layout()
        fig.savefig(path, dpi=110)


def write_report(
    docs: Path, text: str, stats: dict, runs: Runs, step_columns: list[tuple[str, str]], curves: Curves
) -> None:
    """A script-run study's report under `docs`: summary.txt (`text`), summary.json (`stats`), steps.csv and
    curves.png."""
    (docs / "summary.txt").write_text(text)
    (docs / "summary.json").write_text(json.dumps(stats, indent=1) + "\n")
    write_steps(runs, docs / "steps.csv", step_columns)
    curves.plot(runs, docs / "curves.png")


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A page's table: the header row, its rule, one line a row (cells already formatted)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def study_cli(
    description: str, methods: list[str], steps: int, out: str, docs: str, command_line: str
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction, argparse.ArgumentParser]:
    """A script-run study's command line: `run` (--seeds, --steps, --methods, --out) and `report` (--out, --docs,
    --command-line). Returns the parser, its subcommands and `run`'s parser, for the study's own."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=steps)
    r.add_argument("--methods", nargs="+", default=methods, choices=methods)
    r.add_argument("--out", type=Path, default=Path(out))
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--docs", type=Path, default=Path(docs))
    p.add_argument("--command-line", default=command_line, help="the command recorded in summary.txt")
    return parser, sub, r
