"""`openrlhf-band prepare-data`: one task's train / eval JSONL and manifest, through the task's own data module.

Which task (`--source TASK`, default math) and the flags each task reads; the registry (openrlhf_band/tasks/
__init__.py) names the reward file written into the manifest.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from openrlhf_band.tasks import DEFAULT_TASK, TASKS, reward_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every task reads, then each task's own (its data module's `add_arguments`, in a group named
    after the task)."""
    parser.add_argument("--out", required=True, help="directory for train.jsonl, eval.jsonl and manifest.json")
    parser.add_argument(
        "--source",
        action="append",
        metavar="TASK|NAME=PATH",
        help=f"the task ({', '.join(TASKS)}; default {DEFAULT_TASK}), and/or NAME=PATH to read hub source NAME "
        "from a local JSON/JSONL/parquet file or directory (repeatable)",
    )
    parser.add_argument(
        "--hub-id", action="append", metavar="NAME=OWNER/REPO", help="read source NAME from another hub dataset"
    )
    parser.add_argument("--seed", type=int, default=0, help="generation / subsampling seed (default 0)")
    hub = parser.add_argument_group("which hub sources (the tasks that read several)")
    hub.add_argument("--train", help="training sources, comma-separated (default: the task's own; docs/tasks.md)")
    hub.add_argument("--eval", help="eval sources, comma-separated (default: the task's own; docs/tasks.md)")
    for name, task in TASKS.items():
        module = importlib.import_module(task.data_module)  # light: each imports its libraries when it builds
        if hasattr(module, "add_arguments"):
            module.add_arguments(parser.add_argument_group(name))


def _split_sources(values: list[str] | None) -> tuple[str, list[str]]:
    """(task, NAME=PATH values) from the --source values."""
    tasks = [v for v in values or [] if "=" not in v]
    if len(tasks) > 1:
        raise ValueError(f"--source names more than one task ({', '.join(tasks)}); run prepare-data once per task")
    task = tasks[0] if tasks else DEFAULT_TASK
    if task not in TASKS:
        raise ValueError(f"--source {task!r}: unknown task; valid tasks: {', '.join(TASKS)} (or NAME=PATH)")
    return task, [v for v in values or [] if "=" in v]


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or []:
        name, sep, target = value.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise ValueError(f"{flag} {value!r}: expected NAME=VALUE")
        pairs[name.strip()] = target.strip()
    return pairs


def _refuse_foreign(args: argparse.Namespace, task: str, data_modules: dict[str, ModuleType]) -> None:
    """A flag of another task is a mistake worth one line, not silence: each task's data module names the
    flags it alone reads (`FLAGS`)."""
    owners: dict[str, list[str]] = {}
    for name, module in data_modules.items():
        for attr in module.FLAGS:
            owners.setdefault(attr, []).append(name)
    for attr, owner in owners.items():
        if getattr(args, attr) not in (None, [], False) and task not in owner:
            flag = "--" + attr.replace("_", "-")
            raise ValueError(f"{flag} is for --source {' / '.join(owner)}, not {task}")


def build(args: argparse.Namespace) -> tuple[str, list[dict], list[dict], dict]:
    """(task, train rows, eval rows, manifest) as the arguments ask, from the task's own data module."""
    task, local = _split_sources(args.source)
    data_modules = {name: importlib.import_module(t.data_module) for name, t in TASKS.items()}
    _refuse_foreign(args, task, data_modules)
    overrides, hub_ids = _pairs(local, "--source"), _pairs(args.hub_id, "--hub-id")
    train, evals, manifest = data_modules[task].prepare(args, local, overrides, hub_ids)
    manifest = {**manifest, "task": task, "reward_file": TASKS[task].reward_module}  # the registry's name wins
    return task, train, evals, manifest


def main(args: argparse.Namespace) -> int:
    from openrlhf_band.tasks.sources import SourceError, write_outputs

    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
        task, train, evals, manifest = build(args)
    except (SourceError, ValueError) as err:
        print(f"openrlhf-band prepare-data: error: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    write_outputs(out, train, evals, manifest)
    per_source: dict[str, int] = {}
    for row in train + evals:
        per_source[row["datasource"]] = per_source.get(row["datasource"], 0) + 1
    summary = ", ".join(f"{name} {count}" for name, count in per_source.items())
    print(
        f"[{task}] wrote {out / 'train.jsonl'} ({len(train)} rows), {out / 'eval.jsonl'} ({len(evals)} rows) and "
        f"{out / 'manifest.json'} [{summary}]; reward: --reward.remote_url {reward_file(task)}"
    )
    return 0


