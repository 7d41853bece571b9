"""The study tables of docs/objectives.md (studies/docs_tables.py renders them): what
studies/objectives/tables.py prints from the committed merged rows, studies/objectives/results/metrics.csv
(the objectives' run with the band family's band-kl and band-kl-floor rows)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = "studies/objectives/results/metrics.csv (studies/objectives/tables.py)"

_spec = importlib.util.spec_from_file_location("objectives_tables_for_docs", HERE / "tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)


def _rows() -> tuple[list[dict], list[str], list[int]]:
    rows = tables.load(HERE / "results" / "metrics.csv")
    return (rows, *tables.band_family.methods_and_final(rows))


def absolute() -> tuple[str, str]:
    rows, methods, final = _rows()
    return "\n".join(tables.band_family.absolute_table(rows, methods, final)), SOURCE


def paired() -> tuple[str, str]:
    rows, methods, final = _rows()
    return "\n".join(tables.paired_table(rows, methods, final)), SOURCE


def head_to_head() -> tuple[str, str]:
    rows, methods, final = _rows()
    return "\n".join(tables.head_to_head_table(rows, methods, final)), SOURCE


TABLES = {"objectives-absolute": absolute, "objectives-paired": paired, "objectives-head-to-head": head_to_head}
