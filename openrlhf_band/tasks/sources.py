"""What every task's data module shares: the row keys, the one-line SourceError, local copies (JSON / JSONL /
parquet files or folders of them) and the Hugging Face Hub reader with its fast reachability probe, and the
atomic writer of DIR/train.jsonl, eval.jsonl and manifest.json.

A hub failure is always one line that names the source and how to pass a local copy (`--source NAME=PATH`);
with HF_HUB_OFFLINE=1 the hub cache is read and nothing is probed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

# the keys written in every row; pass them as --data.input_key / --data.label_key ("datasource" is fixed
# in OpenRLHF's PromptDataset)
INPUT_KEY = "prompt"
LABEL_KEY = "label"
DATASOURCE_KEY = "datasource"

HUB_PROBE_TIMEOUT_S = 10.0


class SourceError(Exception):
    """A source cannot be read; the message is the one line shown to the user."""


class Unreachable(SourceError):
    """The hub did not answer (DNS, connection, proxy or timeout)."""


def flag_names(value: str | None, default: tuple[str, ...]) -> list[str]:
    """Source names from a comma-separated flag value (`--train mbpp,apps`); `default` when the flag is absent."""
    if value is None:
        return list(default)
    return [name.strip() for name in value.split(",") if name.strip()]


def dedup_key(problem: str) -> str:
    return " ".join(problem.split())


_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _file_format(path: Path) -> str | None:
    return _FORMATS.get(path.suffix.lower())


def local_data_files(path: Path, split: str) -> tuple[str, list[str]]:
    """(loader name, files) for a local file, or a directory of them (only the split's files, when the
    names say which split they hold: `train-0000.parquet`, `train/...`, `..._train.jsonl`)."""
    if path.is_file():
        files = [path]
        if _file_format(path) is None:
            raise SourceError(f"{path}: not a .json, .jsonl or .parquet file")
    elif path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and _file_format(p) and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise SourceError(f"{path}: no .json, .jsonl or .parquet files in this directory")
        token = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
        in_split = [p for p in files if token.search(p.name) or split in p.relative_to(path).parts[:-1]]
        files = in_split or files
    else:
        raise SourceError(f"{path}: no such file or directory")
    formats = {_file_format(p) for p in files}
    if len(formats) > 1:
        raise SourceError(f"{path}: mixes JSON and parquet files; keep one format")
    return formats.pop(), [str(p) for p in files]


def hub_offline() -> bool:
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def probe_hub(hub_id: str) -> None:
    """Fail fast (one request, a short timeout, no retries) when the hub or the repository is not there."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(hub_id, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError as err:
        raise SourceError(f"the hub dataset is gated; accept its terms and log in ({first_line(err)})") from None
    except RepositoryNotFoundError:
        raise SourceError("no such dataset on the Hugging Face Hub (or it is private)") from None
    except HfHubHTTPError as err:
        raise SourceError(f"the Hugging Face Hub answered with an error ({first_line(err)})") from None
    except Exception as err:  # DNS, connect, proxy, timeout: the transport's own exception types
        raise Unreachable(first_line(err)) from None


def how_to_override(name: str) -> str:
    return f"pass a local copy with --source {name}=PATH (a JSON/JSONL/parquet file or a directory of them)"


def read_local(name: str, origin: str, local: tuple[str, list[str]]):
    """A local copy's rows as a `datasets.Dataset` (`local` from local_data_files); one-line SourceError."""
    from datasets import load_dataset

    loader, files = local
    try:
        return load_dataset(loader, data_files=files, split="train")
    except Exception as err:
        raise SourceError(f"source '{name}': cannot read {origin} ({first_line(err)})") from None


def read_hub(
    name: str,
    hub_id: str,
    config: str | None,
    split: str,
    unreachable: Callable[[str], str],
    where: str = "",
    hint: str = "",
):
    """A hub split's rows as a `datasets.Dataset`; one-line SourceError. `unreachable(reason)` words the message
    when the hub cannot be reached; `where` is added after the repository in any other failure (", split x"), and
    `hint` after the message ("pass a local copy with ...")."""
    from datasets import load_dataset

    try:
        return load_dataset(hub_id, config, split=split)
    except ConnectionError as err:  # offline without a cached copy, or the network went away
        reason = first_line(err)
        if hub_offline():
            reason = f"HF_HUB_OFFLINE is set and there is no cached copy; {reason}"
        raise SourceError(unreachable(reason)) from None
    except Exception as err:
        what = f"{hub_id}, config {config}" if config else hub_id
        tail = f"; {hint}" if hint else ""
        raise SourceError(f"source '{name}' ({what}{where}): loading failed ({first_line(err)}){tail}") from None


def iter_rows(dataset, columns: list[str]) -> Iterator[dict]:
    for batch in dataset.select_columns(columns).iter(batch_size=10_000):
        for values in zip(*(batch[c] for c in columns)):
            yield dict(zip(columns, values))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(out: Path, train_rows: list, eval_rows: list, manifest: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for filename, rows in (("train.jsonl", train_rows), ("eval.jsonl", eval_rows)):
        _write_atomic(out / filename, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
