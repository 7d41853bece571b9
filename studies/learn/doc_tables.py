"""The tables of docs/learn_study.md (studies/docs_tables.py renders them).

The final and paired tables are studies/learn/results/summary.txt's (what `learn_study.py report` wrote
from the runs; the runs themselves are not committed), as markdown. The held-out curve tables are
computed from studies/learn/results/steps.csv's `heldout_pass1` (OpenRLHF's own evaluation,
`eval/eval_default_pass1`, every 5 steps): its mean over seeds, its paired difference to clip, and each
seed's value at the last step.
"""

from __future__ import annotations

import csv
import importlib.util
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

_spec = importlib.util.spec_from_file_location("learn_study_for_docs", HERE / "learn_study.py")
learn_study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learn_study)

sys.path.insert(0, str(HERE.parent))
from paired_runs import markdown_table, mean_sd, paired_seeds  # noqa: E402  (the studies' one driver)

CELL = re.compile(r"[+-]?\d+\.\d+ \+- \d+\.\d+")
SUMMARY = "studies/learn/results/summary.txt"
STEPS = "studies/learn/results/steps.csv"


def _section(text: str, title: str) -> list[str]:
    """The lines of summary.txt after the line starting with `title`, up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _rows(section: list[str]) -> list[tuple[str, list[str]]]:
    """(method, its four "mean +- sd" cells) for each row of a summary.txt section."""
    out = []
    for line in section:
        cells = CELL.findall(line)
        if cells:
            out.append((line.split()[0], cells[: len(learn_study.FINAL_KEYS)]))
    return out


def _table(rows: list[list[str]]) -> str:
    """A table of FINAL_KEYS columns, one row a method (its name first)."""
    names = {"entropy": "entropy (nats)"}
    return "\n".join(markdown_table(["method", *(names.get(k, k) for k in learn_study.FINAL_KEYS)], rows))


def final() -> tuple[str, str]:
    """The checkpoint's held-out numbers, then each method's after the last step, mean +- sd over seeds."""
    text = (RESULTS / "summary.txt").read_text()
    checkpoint = next(line for line in text.splitlines() if line.startswith("checkpoint"))
    start = [re.search(rf"{key} ([\d.]+)", checkpoint).group(1) for key in learn_study.FINAL_KEYS]
    rows = [["checkpoint", *start], *([m, *cells] for m, cells in _rows(_section(text, "final (after")))]
    return _table(rows), SUMMARY


def paired_to_clip(method: str) -> tuple[dict[str, tuple[float, float]], int]:
    """`method`'s paired difference to clip from summary.txt: FINAL_KEYS key -> (mean, sd), and the pairs."""
    text = (RESULTS / "summary.txt").read_text()
    line = next(x for x in _section(text, "paired difference") if x.split()[0] == method)
    cells = [tuple(float(v) for v in c.split(" +- ")) for c in CELL.findall(line)[: len(learn_study.FINAL_KEYS)]]
    return dict(zip(learn_study.FINAL_KEYS, cells)), int(re.search(r"\((\d+) pairs\)", line).group(1))


def paired() -> tuple[str, str]:
    text = (RESULTS / "summary.txt").read_text()
    return _table([[m, *cells] for m, cells in _rows(_section(text, "paired difference"))]), SUMMARY


def _heldout() -> tuple[list[str], list[int], dict[tuple[str, int, int], float]]:
    """Methods in order, eval steps, and (method, seed, step) -> heldout_pass1."""
    values, methods = {}, []
    for r in csv.DictReader((RESULTS / "steps.csv").open()):
        methods.append(r["method"])
        if r["heldout_pass1"]:
            values[(r["method"], int(r["seed"]), int(r["step"]))] = float(r["heldout_pass1"])
    return list(dict.fromkeys(methods)), sorted({step for _, _, step in values}), values


def _seeds(values: dict, method: str, step: int) -> list[int]:
    return sorted(seed for m, seed, s in values if m == method and s == step)


def curve() -> tuple[str, str]:
    """Mean held-out pass1 over seeds at each eval step."""
    methods, steps, values = _heldout()
    rows = []
    for step in steps:
        cells = [statistics.fmean(values[(m, s, step)] for s in _seeds(values, m, step)) for m in methods]
        rows.append([str(step), *(f"{c:.3f}" for c in cells)])
    return "\n".join(markdown_table(["step", *methods], rows)), STEPS


def curve_paired() -> tuple[str, str]:
    """Held-out pass1 minus clip's at the same seed and step, mean +- sd over the pairs."""
    methods, steps, values = _heldout()
    others = [m for m in methods if m != "clip"]
    rows = []
    for step in steps:
        cells = []
        for m in others:
            pairs = paired_seeds(_seeds(values, m, step), _seeds(values, "clip", step))
            cells.append(mean_sd([values[(m, s, step)] - values[("clip", s, step)] for s in pairs]))
        rows.append([str(step), *cells])
    return "\n".join(markdown_table(["step", *(f"{m} - clip" for m in others)], rows)), STEPS


def last_step_seeds() -> tuple[str, str]:
    """Each seed's held-out pass1 at the last eval step (seed i ran with --train.seed SEED0 + i)."""
    methods, steps, values = _heldout()
    last = steps[-1]
    seeds = sorted({s for m, s, step in values if step == last})
    rows = []
    for seed in seeds:
        cells = [f"{values[(m, seed, last)]:.3f}" if (m, seed, last) in values else "" for m in methods]
        rows.append([f"{seed} ({learn_study.SEED0 + seed})", *cells])
    return "\n".join(markdown_table(["seed (`--train.seed`)", *methods], rows)), STEPS


TABLES = {
    "learn-final": final,
    "learn-paired": paired,
    "learn-curve": curve,
    "learn-curve-paired": curve_paired,
    "learn-last-step-seeds": last_step_seeds,
}
