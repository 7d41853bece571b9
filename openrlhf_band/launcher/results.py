"""`openrlhf-band results RUN_DIR... [--out DIR]`: the paper-style results table and training curves
from the TensorBoard logs OpenRLHF 0.11.2 writes.

Tags (OpenRLHF 0.11.2, `openrlhf/utils/logging_utils.py` `TensorboardLogger`: every key of the
training status dict is logged as `train/<key>`, every key of the eval dict as `eval/<key>`, both at
`global_step`; the run's event files live in `<--logger.tensorboard_dir>/<--logger.wandb.run_name>/`):

- eval (`openrlhf/trainer/ppo_trainer.py` `compute_eval_metrics`): `eval/eval_<datasource>_pass1`
  (the mean reward over the n samples of a prompt, averaged over prompts: mean@n when the reward
  is 1/0) and `eval/eval_<datasource>_pass<n>` (the max reward over the n samples, averaged: pass@n),
  n = `--eval.n_samples_per_prompt`; with n = 1 only `pass1` exists.
- reward: `train/rollout/reward_mean` (`_compute_rollout_stats`, all rollout samples), falling back
  to `train/reward` (the mean of `experience.info["reward"]` over the PPO mini-batches).
- entropy: `train/entropy_loss` (`ppo_actor.py` `training_step`: the token entropy, logged whenever
  `--actor.entropy_coef` is set, 0 included).
- clipping: `train/band/clip_frac_upper` and `train/band/clip_frac_lower` (this project's
  `BandPolicyLoss.band_metrics`), and `train/ppo_clip_ratio` (OpenRLHF, every policy loss: the
  fraction of tokens whose clipped branch is active, for the band the sum of the two above).

For the code task's benchmarks (humaneval, mbpp, apps) the table names the columns pass@1 and pass@n: with
the code reward's 0/1 per program, mean@n is the unbiased pass@1 estimate and the max over n is pass@n.

A run's method is the name of its directory unless the directory holds a `run.json` with
{"method": ...}. Runs sharing a method (seeds) are averaged: the table at the eval steps every such
run has, the curves at each step over the runs that logged it (mean line, min-max band).

The best step is the eval step with the highest mean over benchmarks of mean@n (of the
seed-averaged values; the earliest on a tie); the last step is the last eval step. OpenRLHF logs the
mean *reward*, so with a +1/-1 reward pass1 = 2 acc - 1: `--reward-range -1 1` (or "reward_range"
in run.json) maps eval values v to (v - lo) / (hi - lo), which turns mean and max rewards into
mean@n and pass@n accuracies exactly (the map is affine and increasing).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

EVAL_TAG = re.compile(r"^eval/eval_(?P<bench>.+)_pass(?P<k>\d+)$")
REWARD_TAGS = ("train/rollout/reward_mean", "train/reward")
ENTROPY_TAGS = ("train/entropy_loss",)
CLIP_UPPER_TAG = "train/band/clip_frac_upper"
CLIP_LOWER_TAG = "train/band/clip_frac_lower"
CLIP_RATIO_TAG = "train/ppo_clip_ratio"


class ResultsError(Exception):
    """A problem with the inputs, reported as one line and exit status 1."""


# -------------------------------------------------------------------------------------------------
# loading


@dataclass
class Run:
    path: Path
    method: str
    scalars: dict[str, dict[int, float]]  # tag -> step -> value
    reward_range: tuple[float, float] | None = None

    def series(self, tags: Sequence[str]) -> dict[int, float] | None:
        """The first of `tags` this run logged."""
        for tag in tags:
            if self.scalars.get(tag):
                return self.scalars[tag]
        return None

    def eval_points(self) -> tuple[int | None, dict[int, dict[str, tuple[float, float]]]]:
        """(n, {step: {benchmark: (mean@n, pass@n)}}), rescaled by `reward_range`; n is None without eval data."""
        pass1: dict[str, dict[int, float]] = {}
        passk: dict[str, tuple[int, dict[int, float]]] = {}
        for tag, values in self.scalars.items():
            m = EVAL_TAG.match(tag)
            if not m:
                continue
            bench, k = m["bench"], int(m["k"])
            if k == 1:
                pass1[bench] = values
            elif bench not in passk or k > passk[bench][0]:
                passk[bench] = (k, values)
        if not pass1:
            return None, {}
        n = max((k for k, _ in passk.values()), default=1)
        lo, hi = self.reward_range or (0.0, 1.0)

        def scale(v: float) -> float:
            return (v - lo) / (hi - lo)

        points: dict[int, dict[str, tuple[float, float]]] = {}
        for bench, values in pass1.items():
            at_n = passk[bench][1] if bench in passk else (values if n == 1 else {})
            for step, v in values.items():
                points.setdefault(step, {})[bench] = (scale(v), scale(at_n[step]) if step in at_n else math.nan)
        return n, points


def find_event_dirs(root: Path) -> list[Path]:
    dirs = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        if any("tfevents" in name for name in filenames):
            dirs.add(Path(dirpath))
    return sorted(dirs)


def load_scalars(root: Path) -> dict[str, dict[int, float]]:
    """All scalars under `root` (every directory holding event files; a step logged twice, e.g.
    after a resume, keeps its latest value)."""
    return {tag: {step: v for step, (_, v) in steps.items()} for tag, steps in load_scalar_events(root).items()}


def load_scalar_events(root: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """As load_scalars, each value with its wall time (seconds since the epoch): {tag: {step:
    (wall_time, value)}}, steps in order."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    dirs = find_event_dirs(root)
    if not dirs:
        raise ResultsError(f"no TensorBoard event files (events.out.tfevents.*) under {root}")
    guidance = {ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 1, ea.AUDIO: 1, ea.HISTOGRAMS: 1, ea.COMPRESSED_HISTOGRAMS: 1}
    latest: dict[str, dict[int, tuple[float, float]]] = {}

    def put(tag: str, step: int, wall_time: float, value: float) -> None:
        slot = latest.setdefault(tag, {})
        if step not in slot or wall_time >= slot[step][0]:
            slot[step] = (wall_time, value)

    for d in dirs:
        acc = ea.EventAccumulator(str(d), size_guidance=guidance)
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get(ea.SCALARS, []):
            for e in acc.Scalars(tag):
                put(tag, e.step, e.wall_time, e.value)
        for tag in tags.get(ea.TENSORS, []):  # scalars written by tf.summary / tensorboard's own writer
            if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
                continue
            for e in acc.Tensors(tag):
                put(tag, e.step, e.wall_time, float(tensor_util.make_ndarray(e.tensor_proto)))
    return {tag: dict(sorted(steps.items())) for tag, steps in latest.items()}


def read_run_json(root: Path) -> dict:
    path = root / "run.json"
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResultsError(f"cannot read {path}: {e}") from e
    if not isinstance(meta, dict):
        raise ResultsError(f"{path} is not a JSON object")
    return meta


def load_run(path: str | Path, reward_range: tuple[float, float] | None = None) -> Run:
    root = Path(path)
    if not root.is_dir():
        raise ResultsError(f"not a directory: {root}")
    meta = read_run_json(root)
    method = meta.get("method") or root.resolve().name
    if reward_range is None and meta.get("reward_range") is not None:
        try:
            lo, hi = (float(x) for x in meta["reward_range"])
        except (TypeError, ValueError) as e:
            raise ResultsError(f"{root / 'run.json'}: reward_range must be [lo, hi]") from e
        reward_range = (lo, hi)
    if reward_range is not None and not reward_range[1] > reward_range[0]:
        raise ResultsError(f"reward range must have hi > lo, got {reward_range}")
    return Run(root, str(method), load_scalars(root), reward_range)


# -------------------------------------------------------------------------------------------------
# the table


@dataclass
class Cell:
    mean_at_n: float
    pass_at_n: float
    mean_at_n_std: float = math.nan
    pass_at_n_std: float = math.nan


@dataclass
class Selection:
    step: int | None
    cells: dict[str, Cell] = field(default_factory=dict)  # benchmark (and "avg") -> cell


@dataclass
class MethodResult:
    method: str
    runs: list[Run]
    n: int | None = None
    eval_runs: int = 0
    best: Selection = field(default_factory=lambda: Selection(None))
    last: Selection = field(default_factory=lambda: Selection(None))
    warnings: list[str] = field(default_factory=list)


def group_by_method(runs: Iterable[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method, []).append(run)
    return groups


def _mean_std(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) != len(values) or not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def summarize_method(method: str, runs: list[Run], benchmarks: Sequence[str]) -> MethodResult:
    res = MethodResult(method, runs)
    evals = []
    for run in runs:
        n, points = run.eval_points()
        if n is None:
            res.warnings.append(f"{run.path}: no eval data (eval/eval_<benchmark>_pass1)")
        else:
            evals.append((n, points))
    if not evals:
        return res
    ns = {n for n, _ in evals}
    if len(ns) > 1:
        res.warnings.append(f"method {method}: runs use different n ({sorted(ns)}); reporting the largest")
    res.n, res.eval_runs = max(ns), len(evals)
    steps = sorted(set.intersection(*(set(points) for _, points in evals)))
    if not steps:
        res.warnings.append(f"method {method}: its {len(evals)} runs share no eval step")
        return res

    per_step: dict[int, dict[str, Cell]] = {}
    for step in steps:
        cells = {}
        for bench in benchmarks:
            if all(bench in points[step] for _, points in evals):
                m, ms = _mean_std([points[step][bench][0] for _, points in evals])
                p, ps = _mean_std([points[step][bench][1] for _, points in evals])
                cells[bench] = Cell(m, p, ms, ps)
        if cells and all(b in cells for b in benchmarks):
            # avg over benchmarks, per run, then over runs (so its std is the seed spread of the average)
            m, ms = _mean_std([statistics.fmean(points[step][b][0] for b in benchmarks) for _, points in evals])
            p, ps = _mean_std([statistics.fmean(points[step][b][1] for b in benchmarks) for _, points in evals])
            cells["avg"] = Cell(m, p, ms, ps)
        per_step[step] = cells

    def score(step: int) -> tuple[int, float]:
        cells = [c for b, c in per_step[step].items() if b != "avg"]
        return len(cells), statistics.fmean(c.mean_at_n for c in cells) if cells else -math.inf

    most = max(score(s)[0] for s in steps)
    candidates = [s for s in steps if score(s)[0] == most]
    best = max(candidates, key=lambda s: (score(s)[1], -s))  # highest score, earliest on a tie
    res.best = Selection(best, per_step[best])
    res.last = Selection(steps[-1], per_step[steps[-1]])
    return res


def discover_benchmarks(runs: Iterable[Run]) -> list[str]:
    return sorted({m["bench"] for run in runs for tag in run.scalars if (m := EVAL_TAG.match(tag))})


def summarize(runs: Sequence[Run]) -> tuple[list[str], list[MethodResult]]:
    benchmarks = discover_benchmarks(runs)
    return benchmarks, [summarize_method(m, rs, benchmarks) for m, rs in group_by_method(runs).items()]


def _fmt(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{100 * v:.1f}"


def column_labels(benchmark: str, n: str) -> tuple[str, str]:
    """The two eval columns' names: mean@n and pass@n; for a code benchmark, whose reward is 0/1 per program,
    the mean over the n samples is the unbiased pass@1 estimate (Chen et al. 2021, k = 1) and the max pass@n."""
    from openrlhf_band.tasks.code.data import SOURCES as CODE_SOURCES

    return ("pass@1", f"pass@{n}") if benchmark in CODE_SOURCES else (f"mean@{n}", f"pass@{n}")


def format_markdown(benchmarks: Sequence[str], results: Sequence[MethodResult]) -> str:
    ns = {r.n for r in results if r.n is not None}
    n = str(ns.pop()) if len(ns) == 1 else "n"
    cols = [*benchmarks, "avg"]
    header = ["method", "runs", "step"] + [f"{b} {label}" for b in cols for label in column_labels(b, n)]
    out = []
    for name, title in (("best", "best step (highest mean over benchmarks of mean@n)"), ("last", "last step")):
        out += [f"### Results at the {title}, x100", ""]
        out += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        for r in results:
            sel: Selection = getattr(r, name)
            runs = f"{r.eval_runs}/{len(r.runs)}" if r.eval_runs != len(r.runs) else str(len(r.runs))
            row = [r.method, runs, "-" if sel.step is None else str(sel.step)]
            for b in cols:
                c = sel.cells.get(b)
                row += [_fmt(c.mean_at_n if c else None), _fmt(c.pass_at_n if c else None)]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


CSV_FIELDS = [
    "method",
    "runs",
    "eval_runs",
    "selection",
    "step",
    "benchmark",
    "n",
    "mean_at_n",
    "pass_at_n",
    "mean_at_n_std",
    "pass_at_n_std",
]


def write_csv(path: Path, benchmarks: Sequence[str], results: Sequence[MethodResult]) -> None:
    def num(v: float) -> str:
        return "" if math.isnan(v) else f"{v:.7g}"  # TensorBoard stores float32

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in results:
            for name in ("best", "last"):
                sel: Selection = getattr(r, name)
                for b in [*benchmarks, "avg"]:
                    c = sel.cells.get(b, Cell(math.nan, math.nan))
                    w.writerow(
                        [
                            r.method,
                            len(r.runs),
                            r.eval_runs,
                            name,
                            "" if sel.step is None else sel.step,
                            b,
                            "" if r.n is None else r.n,
                            num(c.mean_at_n),
                            num(c.pass_at_n),
                            num(c.mean_at_n_std),
                            num(c.pass_at_n_std),
                        ]
                    )


# -------------------------------------------------------------------------------------------------
# the curves


def aggregate(series: Sequence[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """steps, mean, min, max over the series that have each step."""
    steps = sorted(set().union(*series)) if series else []
    mean, lo, hi = [], [], []
    for s in steps:
        vals = [d[s] for d in series if s in d]
        mean.append(statistics.fmean(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return steps, mean, lo, hi


def _eval_avg_series(run: Run) -> dict[int, float]:
    _, points = run.eval_points()
    return {s: statistics.fmean(v[0] for v in cells.values()) for s, cells in sorted(points.items()) if cells}


def plot_curves(path: Path, runs: Sequence[Run]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_by_method(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {m: colors[i % len(colors)] for i, m in enumerate(groups)}
    panels = [
        ("reward (train/rollout/reward_mean)", lambda r: r.series(REWARD_TAGS)),
        ("entropy (train/entropy_loss)", lambda r: r.series(ENTROPY_TAGS)),
        ("eval mean@n, mean over benchmarks", lambda r: _eval_avg_series(r) or None),
        ("band clip fraction, upper (train/band/clip_frac_upper)", lambda r: r.series([CLIP_UPPER_TAG])),
        ("band clip fraction, lower (train/band/clip_frac_lower)", lambda r: r.series([CLIP_LOWER_TAG])),
        ("clipped-token fraction, all methods (train/ppo_clip_ratio)", lambda r: r.series([CLIP_RATIO_TAG])),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, (title, get) in zip(axes.flat, panels):
        drawn = False
        for method, members in groups.items():
            series = [s for s in (get(r) for r in members) if s]
            if not series:
                continue
            steps, mean, lo, hi = aggregate(series)
            label = method if len(series) == 1 else f"{method} (mean of {len(series)}, min-max)"
            ax.plot(steps, mean, color=color[method], label=label, marker="." if len(steps) < 30 else None)
            if len(series) > 1:
                ax.fill_between(steps, lo, hi, color=color[method], alpha=0.2, linewidth=0)
            drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------------------------
# the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run's TensorBoard directory (or any directory above its event files); runs whose "
        "method (directory name, or run.json's 'method') is the same are averaged as seeds",
    )
    parser.add_argument(
        "--out", default="results", metavar="DIR", help="writes DIR/results.md, results.csv and curves.png"
    )
    parser.add_argument(
        "--reward-range",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        default=None,
        help="the reward's range (e.g. -1 1): eval values v become (v - LO) / (HI - LO), i.e. "
        "accuracies; default: as logged, or run.json's 'reward_range'",
    )


def main(args: argparse.Namespace) -> int:
    try:
        rr = tuple(args.reward_range) if getattr(args, "reward_range", None) else None
        runs = [load_run(d, rr) for d in args.run_dirs]
    except ResultsError as e:
        print(f"openrlhf-band results: error: {e}", file=sys.stderr)
        return 1
    benchmarks, results = summarize(runs)
    for r in results:
        for w in r.warnings:
            print(f"openrlhf-band results: warning: {w}", file=sys.stderr)
    if not benchmarks:
        print("openrlhf-band results: warning: no eval data in any run (eval/eval_<benchmark>_pass1)", file=sys.stderr)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = format_markdown(benchmarks, results)
    print(table)
    (out / "results.md").write_text(table)
    write_csv(out / "results.csv", benchmarks, results)
    plot_curves(out / "curves.png", runs)
    print(f"wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="openrlhf-band results", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
