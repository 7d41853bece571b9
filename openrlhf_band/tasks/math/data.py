"""`openrlhf-band prepare-data --out DIR`: the paper's training and evaluation prompts as JSONL for OpenRLHF.

Writes three files in DIR:

- `train.jsonl`: DAPO-Math-17k (deduplicated by problem text) plus MATH (Hendrycks) train, levels 3-5,
  the MATH answer being the content of the solution's last `\\boxed{...}`. Label: the plain answer string.
- `eval.jsonl`: AIME 2024, AIME 2025 and AMC 2023. Label: the JSON string
  `{"answer": ..., "reward": "accuracy"}`, for which the project's reward function returns 0/1, so
  OpenRLHF's eval metrics are accuracies.
- `manifest.json`: where each source came from and how many rows it gave, dropped and wrote.

Every row is `{"prompt": ..., "label": ..., "datasource": ...}`. The prompt is the DAPO prompt
(`PROMPT_TEMPLATE`) as plain text; the chat template is applied by OpenRLHF. Problems are deduplicated
by whitespace-normalised text, across DAPO and MATH together, and a training problem whose text equals
an evaluation problem's is dropped (both counted in the manifest).

OpenRLHF 0.11.2 flags for these files (`openrlhf/cli/train_ppo_ray.py`, `openrlhf/datasets/prompts_dataset.py`)::

    --data.prompt_dataset DIR/train.jsonl --eval.dataset DIR/eval.jsonl
    --data.input_key prompt --data.label_key label --data.apply_chat_template
    --eval.n_samples_per_prompt 32 --eval.temperature 1.0

`--data.prompt_split` and `--eval.split` keep their default `train` (a local JSONL file loads as the
split `train`). Do not pass `--data.input_template`: the prompt is complete. The data-source key is not a
flag: `PromptDataset` always reads the field `datasource` (default "default"), and the trainer reports
`eval_{datasource}_pass1` (mean accuracy over the samples, mean@32) and `eval_{datasource}_pass{n}`
(pass@n) for each of `aime24`, `aime25` and `amc23`. OpenRLHF requires `--reward.remote_url` (a `.py`
file with `reward_func`) or `--train.agent_func_path` whenever `--eval.dataset` is given.

Sources come from the Hugging Face Hub (`SOURCES` below holds every hub id, split and column; edit it
there). Each can be replaced by a local copy, `--source NAME=PATH` (a JSON/JSONL/parquet file or a
directory of them, e.g. a downloaded snapshot of the hub repository), or by another hub repository with
the same columns, `--hub-id NAME=OWNER/REPO`. Without hub access the command stops with one line naming
the source and the `--source` to pass, exit status 1; with `HF_HUB_OFFLINE=1` the hub cache is used.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrlhf_band.tasks.sources import (
    DATASOURCE_KEY,
    INPUT_KEY,
    LABEL_KEY,
    SourceError,
    Unreachable,
    dedup_key,
    how_to_override,
    hub_offline,
    iter_rows,
    local_data_files,
    probe_hub,
    read_hub,
    read_local,
)
from openrlhf_band.tasks.text import last_boxed

PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
PROMPT_TEMPLATE = PROMPT_PREFIX + "{problem}" + PROMPT_SUFFIX

MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


@dataclass(frozen=True)
class Source:
    """One dataset: where it lives on the hub and which columns hold the problem and the answer.

    `problem` and `answer` are column names, or dotted paths into a struct column
    ("reward_model.ground_truth"). A problem given as chat messages uses the first user message, and the
    DAPO instruction around it, if present, is removed. With `answer_in_boxed` the answer is the last
    `\\boxed{}` of that column's text. With `level` the rows are kept only if the number in that column
    is one of --math-levels.
    """

    role: str  # "train" or "eval"
    hub_id: str
    split: str
    problem: str
    answer: str
    configs: tuple[str | None, ...] = (None,)
    answer_in_boxed: bool = False
    level: str | None = None


# name -> source; the name is also the row's datasource, the --source / --hub-id key and the manifest key
SOURCES: dict[str, Source] = {
    "dapo": Source("train", "BytedTsinghua-SIA/DAPO-Math-17k", "train", "prompt", "reward_model.ground_truth"),
    "math": Source(
        "train",
        "EleutherAI/hendrycks_math",
        "train",
        "problem",
        "solution",
        configs=MATH_SUBJECTS,
        answer_in_boxed=True,
        level="level",
    ),
    "aime24": Source("eval", "HuggingFaceH4/aime_2024", "train", "problem", "answer"),
    "aime25": Source("eval", "math-ai/aime25", "test", "problem", "answer"),
    "amc23": Source("eval", "math-ai/amc23", "test", "question", "answer"),
}


# ---------------------------------------------------------------------------------------------
# text helpers
# ---------------------------------------------------------------------------------------------
def problem_text(value: Any) -> str | None:
    """The bare problem: the first user message of a chat, without the DAPO instruction around it."""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role", "user") == "user"]
        value = users[0] if users else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    text = text.removeprefix(PROMPT_PREFIX.strip()).removesuffix(PROMPT_SUFFIX.strip()).strip()
    return text or None


def answer_text(value: Any) -> str | None:
    """An answer as a string: 27.0 -> "27", a one-element list -> its element, blanks -> None."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None or isinstance(value, (list, dict)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


def level_number(value: Any) -> int | None:
    """3 from "Level 3" or 3; None from "Level ?"."""
    match = re.search(r"\d+", str(value))
    return int(match.group(0)) if match else None


def format_prompt(problem: str) -> str:
    return PROMPT_TEMPLATE.format(problem=problem)


def eval_label(answer: str) -> str:
    return json.dumps({"answer": answer, "reward": "accuracy"})


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
@dataclass
class Resolved:
    name: str
    source: Source
    origin: str  # "hub:ID" or the local path
    local: tuple[str, list[str]] | None = None


def resolve_sources(overrides: dict[str, str], hub_ids: dict[str, str]) -> list[Resolved]:
    """Check every source before anything is downloaded: local paths exist, hub repositories answer."""
    resolved = []
    offline = None
    for name, source in SOURCES.items():
        if name in overrides:
            path = Path(overrides[name]).expanduser()
            try:
                local = local_data_files(path, source.split)
            except SourceError as err:
                raise SourceError(f"source '{name}': {err}") from None
            resolved.append(Resolved(name, source, str(path), local))
            continue
        hub_id = hub_ids.get(name, source.hub_id)
        if offline is None:
            offline = hub_offline()
        if not offline:
            try:
                probe_hub(hub_id)
            except Unreachable as err:
                reason = f"{err}; HF_HUB_OFFLINE=1 would use a cached copy, if there is one"
                raise SourceError(_unreachable_message(name, hub_id, reason, overrides)) from None
            except SourceError as err:
                raise SourceError(f"source '{name}' ({hub_id}): {err}; {how_to_override(name)}") from None
        resolved.append(Resolved(name, source, f"hub:{hub_id}"))
    return resolved


def _unreachable_message(name: str, hub_id: str, reason: str, overrides: dict[str, str]) -> str:
    missing = [n for n in SOURCES if n not in overrides]
    return (
        f"source '{name}' ({hub_id}): the Hugging Face Hub is unreachable ({reason}); {how_to_override(name)}"
        f" (sources without --source: {', '.join(missing)})"
    )


def load_source(entry: Resolved, overrides: dict[str, str]):
    """The source's rows as a `datasets.Dataset`."""
    from datasets import concatenate_datasets

    if entry.local is not None:
        return read_local(entry.name, entry.origin, entry.local)
    hub_id = entry.origin.removeprefix("hub:")
    parts = [
        read_hub(
            entry.name, hub_id, config, entry.source.split,
            lambda reason: _unreachable_message(entry.name, hub_id, reason, overrides),
        )  # fmt: skip
        for config in entry.source.configs
    ]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------
def _get(row: dict, path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def extract(name: str, source: Source, dataset, levels: Iterable[int], stats: dict) -> Iterator[tuple[str, str]]:
    """(problem, answer) pairs of one source; counts what it drops in `stats`."""
    columns = [source.problem.split(".")[0], source.answer.split(".")[0]]
    if source.level:
        columns.append(source.level)
    columns = list(dict.fromkeys(columns))
    absent = [c for c in columns if c not in dataset.column_names]
    if absent:
        raise SourceError(
            f"source '{name}': no column {', '.join(map(repr, absent))} (columns: {', '.join(dataset.column_names)});"
            " the column names are in SOURCES in openrlhf_band/tasks/math/data.py"
        )
    levels = set(levels)
    for row in iter_rows(dataset, columns):
        stats["rows_read"] += 1
        if source.level:
            if level_number(row[source.level]) not in levels:
                stats["level_filtered"] += 1
                continue
        problem = problem_text(_get(row, source.problem))
        answer = _get(row, source.answer)
        if source.answer_in_boxed:
            answer = last_boxed(answer) if isinstance(answer, str) else None
        else:
            answer = answer_text(answer)
        if problem is None or answer is None:
            stats["missing_problem_or_answer"] += 1
            continue
        yield problem, answer


def _new_stats(entry: Resolved) -> dict:
    stats = {"origin": entry.origin, "split": entry.source.split, "rows_read": 0}
    if entry.source.level:
        stats["level_filtered"] = 0
    stats["missing_problem_or_answer"] = 0
    stats["duplicates_dropped"] = 0
    if entry.source.role == "train":
        stats["eval_overlap_dropped"] = 0
    stats["written"] = 0
    return stats


def build(resolved: list[Resolved], overrides: dict[str, str], levels: Iterable[int]):
    """(train rows, eval rows, manifest)."""
    levels = tuple(sorted(set(levels)))
    datasets_by_name = {entry.name: load_source(entry, overrides) for entry in resolved}
    stats = {entry.name: _new_stats(entry) for entry in resolved}

    eval_rows, eval_seen = [], set()
    for entry in (e for e in resolved if e.source.role == "eval"):
        s = stats[entry.name]
        for problem, answer in extract(entry.name, entry.source, datasets_by_name[entry.name], levels, s):
            key = dedup_key(problem)
            if key in eval_seen:  # the trainer maps prompt -> datasource: keep prompts unique
                s["duplicates_dropped"] += 1
                continue
            eval_seen.add(key)
            eval_rows.append(
                {INPUT_KEY: format_prompt(problem), LABEL_KEY: eval_label(answer), DATASOURCE_KEY: entry.name}
            )
            s["written"] += 1

    train_rows, train_seen = [], set()
    for entry in (e for e in resolved if e.source.role == "train"):
        s = stats[entry.name]
        for problem, answer in extract(entry.name, entry.source, datasets_by_name[entry.name], levels, s):
            key = dedup_key(problem)
            if key in train_seen:
                s["duplicates_dropped"] += 1
                continue
            train_seen.add(key)
            if key in eval_seen:
                s["eval_overlap_dropped"] += 1
                continue
            train_rows.append({INPUT_KEY: format_prompt(problem), LABEL_KEY: answer, DATASOURCE_KEY: entry.name})
            s["written"] += 1

    def section(role: str, rows: list) -> dict:
        names = [e.name for e in resolved if e.source.role == role]
        return {
            "rows": len(rows),
            "duplicates_dropped": sum(stats[n]["duplicates_dropped"] for n in names),
            "sources": {n: stats[n] for n in names},
        }

    manifest = {
        "keys": {"input_key": INPUT_KEY, "label_key": LABEL_KEY, "datasource_key": DATASOURCE_KEY},
        "prompt_template": PROMPT_TEMPLATE,
        "math_levels": list(levels),
        "train": section("train", train_rows),
        "eval": section("eval", eval_rows),
    }
    return train_rows, eval_rows, manifest


# ---------------------------------------------------------------------------------------------
# prepare-data (openrlhf_band/tasks/prepare.py)
# ---------------------------------------------------------------------------------------------
def _check_names(values: list[str] | None, flag: str) -> None:
    """Every NAME of the NAME=VALUE flag values (prepare-data has parsed them) is one of the math sources."""
    for value in values or []:
        name = value.partition("=")[0].strip()
        if name not in SOURCES:
            raise SourceError(f"{flag} {value!r}: unknown source {name!r}; valid names: {', '.join(SOURCES)}")


FLAGS: tuple[str, ...] = ()  # the prepare-data options only this task reads (--math-levels has a default)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """This task's own prepare-data options."""
    group.add_argument(
        "--math-levels", type=int, nargs="+", default=[3, 4, 5], help="MATH levels to keep (default: 3 4 5)"
    )


def prepare(
    args: argparse.Namespace, local: list[str], overrides: dict[str, str], hub_ids: dict[str, str]
) -> tuple[list[dict], list[dict], dict]:
    """`openrlhf-band prepare-data` for math: (train rows, eval rows, manifest); `local` the NAME=PATH values."""
    _check_names(local, "--source")
    _check_names(args.hub_id, "--hub-id")
    return build(resolve_sources(overrides, hub_ids), overrides, args.math_levels)
