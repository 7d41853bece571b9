"""The recipe's multiple-choice task: CommonsenseQA / MMLU questions as OpenRLHF prompt JSONL rows.

`build(...)` returns the rows and a manifest; `openrlhf-band prepare-data` writes them, like the math
task of `openrlhf_band/tasks/math/data.py`, as `train.jsonl`, `eval.jsonl` and `manifest.json`.

- train rows: the training splits of `train_sources`. Label: the JSON string
  `{"answer": "B", "choices": ["A", "B", "C", "D"]}`, for which `reward.py` returns +1 / -1.
- eval rows: the evaluation splits of `eval_sources`, optionally subsampled. Label:
  `{"answer": "B", "choices": [...], "reward": "accuracy"}`, for which the reward is the 0/1 accuracy,
  so OpenRLHF's eval metrics are accuracies.

Every row is `{"prompt": ..., "label": ..., "datasource": <source name>}`. The prompt
(`PROMPT_TEMPLATE`, `format_prompt`) is plain text: an instruction to end the response with the line
`Answer: $LETTER`, the question, then one line per choice, `A. text`; OpenRLHF applies the chat template.
Pass the reward file with `--reward.remote_url openrlhf_band/tasks/mc/reward.py`; the other
OpenRLHF flags are those of data.py (`--data.input_key prompt --data.label_key label
--data.apply_chat_template`), and the eval metrics come out as `eval_{datasource}_pass1`, e.g.
`eval_mmlu_pass1`.

Sources (`SOURCES`; the name is the row's datasource, the `--source` / `--hub-id` key and the manifest
key). The column facts are those of the hub dataset cards:

- `commonsense_qa`: `tau/commonsense_qa` (no config). Train: split `train` (9,741 rows); eval: split
  `validation` (1,221), because the `test` split's `answerKey` is empty. Columns: `question` (str),
  `choices` = `{"label": ["A", ..., "E"], "text": [5 str]}` (a sequence of (label, text) structs, which
  `datasets` returns as a dict of two lists), `answerKey` (str, "A".."E"); also `id`, `question_concept`.
- `mmlu`: `cais/mmlu`, config `all`. Eval: split `test` (14,042 rows, 57 subjects); train: split
  `auxiliary_train` (99,842 rows from ARC, MCTest, OBQA and RACE, with an empty `subject`). Columns:
  `question` (str), `subject` (str), `choices` (a list of 4 str), `answer` (a ClassLabel: int 0-3 for
  A-D). The repository's separate `auxiliary_train` config holds the same rows nested in one struct
  column `train`; a local copy of that layout is unwrapped.

Both schemas are normalised to (question, [(letter, text), ...], answer letter) (`normalise`):
`choices` may be a `{"label": [...], "text": [...]}` dict (or a list of such dicts) or a list of
strings (lettered A, B, ... in order); labels that are not distinct single letters (ARC's "1".."4") are
replaced by A, B, ... in order. The answer is a label (a letter, case-insensitive) or a 0-based index.
A row without a question, with fewer than 2 or more than 26 choices, an empty choice, mismatched
label/text lists or an answer that is not one of its choices is skipped and counted as
`malformed_skipped` (the `test` split of CommonsenseQA would be skipped whole). Choice texts are put
on one line each (runs of whitespace become one space).

Deduplication: by whitespace-normalised, case-folded question plus choice texts (in order), across
the training sources together and across the evaluation sources together (the trainer keys eval
samples by prompt, so eval prompts must be unique). A training row whose normalised question alone
equals an evaluation question (from any evaluation source, before subsampling, so that the training
set does not depend on `max_eval_per_source`) is dropped as `eval_overlap_dropped`. With
`max_eval_per_source`, each evaluation source keeps that many rows, drawn with `random.Random` seeded
by `seed` and the source name (deterministic across runs and platforms), in their original order.

Local copies and other repositories, as for every task (tasks/sources.py): `overrides` maps a source to
a local JSON/JSONL/parquet file or directory, `hub_ids` to another hub repository with the same config,
splits and columns. The split's files in a directory are found by `sources.local_data_files(path, split)`: files
whose names, or a folder above them, name the split (`train.jsonl`, `validation-00000-of-00001.parquet`,
`test/...`, `mmlu_auxiliary_train.jsonl`); when none does, every file is read. Because one source can
feed both sides, a local copy used for training and evaluation must be a directory whose file names
tell the two splits apart (a single file, or unnamed files, would put the same questions on both
sides), and a directory that names only the other split is refused rather than read as this one. For
a snapshot of `cais/mmlu` pass its `all/` folder (the top folder also holds the 57 per-subject copies of
`test`). Without hub access and without an override the build stops with a `SourceError` whose one
line names the source and the `--source NAME=PATH` to pass; with `HF_HUB_OFFLINE=1` the hub cache is used.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrlhf_band.tasks.sources import (
    DATASOURCE_KEY,
    INPUT_KEY,
    LABEL_KEY,
    SourceError,
    Unreachable,
    flag_names,
    how_to_override,
    hub_offline,
    iter_rows,
    local_data_files,
    probe_hub,
    read_hub,
    read_local,
)

__all__ = [
    "PROMPT_TEMPLATE",
    "SOURCES",
    "ChoiceSource",
    "SourceError",
    "build",
    "eval_label",
    "format_prompt",
    "normalise",
    "train_label",
]

PROMPT_TEMPLATE = (
    "Answer the following multiple choice question. The last line of your response should be of the form "
    "Answer: $LETTER (without quotes) where LETTER is one of {letters}. Think step by step before answering.\n\n"
    "{question}\n\n"
    "{choices}"
)
ACCURACY_MODE = "accuracy"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MIN_CHOICES = 2
ROLES = ("train", "eval")


@dataclass(frozen=True)
class ChoiceSource:
    """One multiple-choice dataset: its hub repository, config, the split for each role and its columns."""

    hub_id: str
    config: str | None
    train_split: str
    eval_split: str
    question: str = "question"
    choices: str = "choices"
    answer: str = "answer"

    def split(self, role: str) -> str:
        return self.train_split if role == "train" else self.eval_split


# name -> source; the name is also the row's datasource, the --source / --hub-id key and the manifest key
SOURCES: dict[str, ChoiceSource] = {
    # test has no answers (answerKey ""): validation is the evaluation split
    "commonsense_qa": ChoiceSource("tau/commonsense_qa", None, "train", "validation", answer="answerKey"),
    # the `all` config: 57 subjects' test questions, and the auxiliary training questions as a split
    "mmlu": ChoiceSource("cais/mmlu", "all", "auxiliary_train", "test"),
}


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(text.split())


def _raw_choices(value: Any) -> tuple[list[Any], list[Any]] | None:
    """(labels or [], texts) of a `choices` value: {"label": [...], "text": [...]}, a list of such dicts,
    or a list of strings."""
    if isinstance(value, dict):
        labels, texts = value.get("label"), value.get("text")
        if not isinstance(texts, list):
            return None
        if labels is None:
            labels = []
        if not isinstance(labels, list) or (labels and len(labels) != len(texts)):
            return None
        return labels, texts
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return [v.get("label") for v in value], [v.get("text") for v in value]
        return [], value
    return None


def normalise(question: Any, choices: Any, answer: Any) -> tuple[str, list[tuple[str, str]], str] | None:
    """(question, [(letter, text), ...], answer letter) of one row, or None when it is malformed.

    `choices` is a `{"label": [...], "text": [...]}` dict (CommonsenseQA), a list of such dicts, or a
    list of strings (MMLU, lettered A, B, ... in order); `answer` a label (case-insensitive) or a
    0-based index (MMLU's ClassLabel int).
    """
    if not isinstance(question, str) or not question.strip():
        return None
    raw = _raw_choices(choices)
    if raw is None:
        return None
    labels, texts = raw
    if not MIN_CHOICES <= len(texts) <= len(LETTERS):
        return None
    if not all(isinstance(t, str) and t.strip() for t in texts):
        return None
    texts = [_one_line(t) for t in texts]
    originals = [str(label).strip() if label is not None else "" for label in labels]
    upper = [label.upper() for label in originals]
    if upper and all(len(u) == 1 and u in LETTERS for u in upper) and len(set(upper)) == len(upper):
        letters = upper
    else:  # no labels, or labels that are not distinct letters ("1".."4"): A, B, ... by position
        letters = list(LETTERS[: len(texts)])

    index = None
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, int) and not isinstance(answer, bool):
        index = answer if 0 <= answer < len(texts) else None
    elif isinstance(answer, str) and answer.strip():
        key = answer.strip()
        if key in originals:
            index = originals.index(key)
        elif key.upper() in upper:
            index = upper.index(key.upper())
        elif not labels and len(key) == 1 and key.upper() in letters:
            index = letters.index(key.upper())
    if index is None:
        return None
    return question.strip(), list(zip(letters, texts)), letters[index]


def format_prompt(question: str, choices: list[tuple[str, str]]) -> str:
    """The prompt text: the instruction, the question, and one `A. text` line per choice."""
    letters = "".join(letter for letter, _ in choices)
    lines = "\n".join(f"{letter}. {text}" for letter, text in choices)
    return PROMPT_TEMPLATE.format(letters=letters, question=question, choices=lines)


def train_label(answer: str, choices: list[tuple[str, str]]) -> str:
    """`{"answer": "B", "choices": ["A", ...]}`: the training reward, +1 / -1."""
    return json.dumps({"answer": answer, "choices": [letter for letter, _ in choices]})


def eval_label(answer: str, choices: list[tuple[str, str]]) -> str:
    """`{"answer": "B", "choices": [...], "reward": "accuracy"}`: the reward is the 0/1 accuracy."""
    return json.dumps({"answer": answer, "choices": [letter for letter, _ in choices], "reward": ACCURACY_MODE})


def _question_key(question: str) -> str:
    return _one_line(question).casefold()


def _dedup_key(question: str, choices: list[tuple[str, str]]) -> tuple[str, ...]:
    return (_question_key(question), *(text.casefold() for _, text in choices))


# ---------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------
@dataclass
class _Resolved:
    name: str
    role: str
    source: ChoiceSource
    split: str
    origin: str  # "hub:ID" or the local path
    local: tuple[str, list[str]] | None = None


def _check_names(values: list[str] | dict[str, str], what: str) -> None:
    unknown = [n for n in values if n not in SOURCES]
    if unknown:
        raise SourceError(f"{what}: unknown source {unknown[0]!r}; valid names: {', '.join(SOURCES)}")


def _names_split(path: Path, file: str, split: str) -> bool:
    """Whether a file of the directory `path` is named for `split` (the rule of `local_data_files`)."""
    file_path = Path(file)
    token = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
    return bool(token.search(file_path.name)) or split in file_path.relative_to(path).parts[:-1]


def _local_files(name: str, role: str, source: ChoiceSource, path: Path, roles: set[str]) -> tuple[str, list[str]]:
    split = source.split(role)
    try:
        loader, files = local_data_files(path, split)
    except SourceError as err:
        raise SourceError(f"source '{name}': {err}") from None
    if path.is_dir() and not any(_names_split(path, f, split) for f in files):
        other = source.split("eval" if role == "train" else "train")
        if any(_names_split(path, f, other) for f in files):
            raise SourceError(
                f"source '{name}': {path} has files for the split '{other}' but none named for '{split}'"
                f" (the {role} split); add them, or pass a path for this split only"
            )
    if len(roles) == 2:  # both sides from one path: the two splits' files must differ
        other_files = local_data_files(path, source.split("eval" if role == "train" else "train"))[1]
        if set(files) & set(other_files):
            raise SourceError(
                f"source '{name}': {path} is used for training ('{source.train_split}') and evaluation"
                f" ('{source.eval_split}') but its file names do not tell the splits apart; pass a directory"
                f" with e.g. {source.train_split}.jsonl and {source.eval_split}.jsonl"
            )
    return loader, files


def _unreachable_message(name: str, hub_id: str, reason: str, needed: list[str], overrides: dict[str, str]) -> str:
    missing = [n for n in needed if n not in overrides]
    return (
        f"source '{name}' ({hub_id}): the Hugging Face Hub is unreachable ({reason}); {how_to_override(name)}"
        f" (sources without --source: {', '.join(missing)})"
    )


def _resolve(
    overrides: dict[str, str], hub_ids: dict[str, str], train_sources: list[str], eval_sources: list[str]
) -> list[_Resolved]:
    """Check every (source, role) before anything is downloaded: local paths exist, hub repositories answer."""
    needed = list(dict.fromkeys([*train_sources, *eval_sources]))
    roles = {n: {r for r, names in (("train", train_sources), ("eval", eval_sources)) if n in names} for n in needed}
    resolved: list[_Resolved] = []
    offline, probed = None, set()
    for role, names in (("eval", eval_sources), ("train", train_sources)):
        for name in dict.fromkeys(names):
            source = SOURCES[name]
            split = source.split(role)
            if name in overrides:
                path = Path(overrides[name]).expanduser()
                local = _local_files(name, role, source, path, roles[name])
                resolved.append(_Resolved(name, role, source, split, str(path), local))
                continue
            hub_id = hub_ids.get(name, source.hub_id)
            if offline is None:
                offline = hub_offline()
            if not offline and hub_id not in probed:
                try:
                    probe_hub(hub_id)
                except Unreachable as err:
                    reason = f"{err}; HF_HUB_OFFLINE=1 would use a cached copy, if there is one"
                    raise SourceError(_unreachable_message(name, hub_id, reason, needed, overrides)) from None
                except SourceError as err:
                    raise SourceError(f"source '{name}' ({hub_id}): {err}; {how_to_override(name)}") from None
                probed.add(hub_id)
            resolved.append(_Resolved(name, role, source, split, f"hub:{hub_id}"))
    return resolved


def _load(entry: _Resolved, needed: list[str], overrides: dict[str, str]):
    """The split's rows as a `datasets.Dataset`."""
    if entry.local is not None:
        return read_local(entry.name, entry.origin, entry.local)
    hub_id = entry.origin.removeprefix("hub:")
    def unreachable(reason: str) -> str:
        return _unreachable_message(entry.name, hub_id, reason, needed, overrides)

    return read_hub(entry.name, hub_id, entry.source.config, entry.split, unreachable, where=f", split {entry.split}")


def _rows(entry: _Resolved, dataset, stats: dict) -> Iterator[tuple[str, list[tuple[str, str]], str]]:
    """The normalised rows of one split; counts the malformed ones in `stats`."""
    source = entry.source
    columns = [source.question, source.choices, source.answer]
    names = dataset.column_names
    if any(c not in names for c in columns) and "train" in names:
        # cais/mmlu's `auxiliary_train` config nests every row in one struct column `train`
        try:
            dataset = dataset.select_columns(["train"]).flatten()
            dataset = dataset.rename_columns({c: c.removeprefix("train.") for c in dataset.column_names})
            names = dataset.column_names
        except Exception:
            pass
    absent = [c for c in columns if c not in names]
    if absent:
        raise SourceError(
            f"source '{entry.name}' ({entry.origin}, split {entry.split}): no column"
            f" {', '.join(map(repr, absent))} (columns: {', '.join(names)});"
            " the column names are in SOURCES in openrlhf_band/tasks/mc/data.py"
        )
    for row in iter_rows(dataset, columns):
        stats["rows_read"] += 1
        item = normalise(row[source.question], row[source.choices], row[source.answer])
        if item is None:
            stats["malformed_skipped"] += 1
            continue
        yield item


def _new_stats(entry: _Resolved) -> dict:
    stats: dict[str, Any] = {"origin": entry.origin, "split": entry.split}
    if entry.local is None and entry.source.config:
        stats["config"] = entry.source.config
    stats.update(rows_read=0, malformed_skipped=0, duplicates_dropped=0)
    if entry.role == "train":
        stats["eval_overlap_dropped"] = 0
    else:
        stats["subsampled_out"] = 0
    stats["written"] = 0
    return stats


def _subsample(rows: list[dict], limit: int | None, seed: int, name: str) -> list[dict]:
    if limit is None or len(rows) <= limit:
        return rows
    # a string seed is hashed with SHA-512 by `random`: the same draw on every run and platform
    keep = sorted(random.Random(f"{seed}:{name}").sample(range(len(rows)), limit))
    return [rows[i] for i in keep]


def build(
    overrides: dict[str, str],
    hub_ids: dict[str, str],
    train_sources: list[str],
    eval_sources: list[str],
    max_eval_per_source: int | None = None,
    seed: int = 0,
) -> tuple[list[dict], list[dict], dict]:
    """(train rows, eval rows, manifest) of the multiple-choice task; `SourceError` (one line) on any
    source that cannot be read. See the module docstring for the rules."""
    _check_names(train_sources, "train sources")
    _check_names(eval_sources, "eval sources")
    _check_names(overrides, "--source")
    _check_names(hub_ids, "--hub-id")
    if not train_sources and not eval_sources:
        raise SourceError(f"no sources selected; valid names: {', '.join(SOURCES)}")
    if max_eval_per_source is not None and max_eval_per_source < 1:
        raise SourceError(f"max_eval_per_source must be at least 1 (got {max_eval_per_source})")
    needed = list(dict.fromkeys([*train_sources, *eval_sources]))
    resolved = _resolve(overrides, hub_ids, train_sources, eval_sources)
    datasets_by_key = {(e.name, e.role): _load(e, needed, overrides) for e in resolved}
    stats = {(e.name, e.role): _new_stats(e) for e in resolved}

    # eval first: training rows are checked against every eval question
    eval_rows: list[dict] = []
    eval_seen: set[tuple[str, ...]] = set()
    eval_questions: set[str] = set()
    for entry in (e for e in resolved if e.role == "eval"):
        s = stats[(entry.name, "eval")]
        rows = []
        for question, choices, answer in _rows(entry, datasets_by_key[(entry.name, "eval")], s):
            key = _dedup_key(question, choices)
            if key in eval_seen:  # the trainer maps prompt -> datasource: keep prompts unique
                s["duplicates_dropped"] += 1
                continue
            eval_seen.add(key)
            eval_questions.add(key[0])
            rows.append(
                {
                    INPUT_KEY: format_prompt(question, choices),
                    LABEL_KEY: eval_label(answer, choices),
                    DATASOURCE_KEY: entry.name,
                }
            )
        kept = _subsample(rows, max_eval_per_source, seed, entry.name)
        s["subsampled_out"] = len(rows) - len(kept)
        s["written"] = len(kept)
        eval_rows.extend(kept)

    train_rows: list[dict] = []
    train_seen: set[tuple[str, ...]] = set()
    for entry in (e for e in resolved if e.role == "train"):
        s = stats[(entry.name, "train")]
        for question, choices, answer in _rows(entry, datasets_by_key[(entry.name, "train")], s):
            key = _dedup_key(question, choices)
            if key in train_seen:
                s["duplicates_dropped"] += 1
                continue
            train_seen.add(key)
            if key[0] in eval_questions:
                s["eval_overlap_dropped"] += 1
                continue
            train_rows.append(
                {
                    INPUT_KEY: format_prompt(question, choices),
                    LABEL_KEY: train_label(answer, choices),
                    DATASOURCE_KEY: entry.name,
                }
            )
            s["written"] += 1

    def section(role: str, rows: list[dict], names: list[str]) -> dict:
        per_source = {n: stats[(n, role)] for n in dict.fromkeys(names)}
        out: dict[str, Any] = {"rows": len(rows)}
        for counter in ("malformed_skipped", "duplicates_dropped", "eval_overlap_dropped", "subsampled_out"):
            if any(counter in s for s in per_source.values()):
                out[counter] = sum(s.get(counter, 0) for s in per_source.values())
        out["sources"] = per_source
        return out

    manifest = {
        "task": "multiple_choice",
        "keys": {"input_key": INPUT_KEY, "label_key": LABEL_KEY, "datasource_key": DATASOURCE_KEY},
        "prompt_template": PROMPT_TEMPLATE,
        "max_eval_per_source": max_eval_per_source,
        "seed": seed,
        "train": section("train", train_rows, train_sources),
        "eval": section("eval", eval_rows, eval_sources),
    }
    return train_rows, eval_rows, manifest


# prepare-data (openrlhf_band/tasks/prepare.py): the options only mc reads (--train / --eval shared with code)
FLAGS = ("train", "eval", "max_eval")


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """This task's own prepare-data options (--train / --eval are every hub task's)."""
    group.add_argument("--max-eval", type=int, default=None, help="at most this many eval rows per source")


def prepare(
    args: argparse.Namespace, local: list[str], overrides: dict[str, str], hub_ids: dict[str, str]
) -> tuple[list[dict], list[dict], dict]:
    """`openrlhf-band prepare-data --source mc`: (train rows, eval rows, manifest)."""
    return build(
        overrides,
        hub_ids,
        flag_names(args.train, ("commonsense_qa",)),
        flag_names(args.eval, ("commonsense_qa", "mmlu")),
        args.max_eval,
        args.seed,
    )
