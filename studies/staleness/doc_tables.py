"""The tables of docs/staleness.md (studies/docs_tables.py renders them) from the committed rows,
studies/staleness/results/metrics.csv (`python studies/staleness/study.py collect`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = "studies/staleness/results/metrics.csv (studies/staleness/study.py)"

_spec = importlib.util.spec_from_file_location("staleness_study_for_docs", HERE / "study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def _table(make) -> tuple[str, str]:
    return "\n".join(make(study.read())), SOURCE


TABLES = {
    "staleness-mean32": lambda: _table(lambda rows: study.final_table(rows, "mean@32")),
    "staleness-entropy": lambda: _table(lambda rows: study.final_table(rows, "entropy")),
    "staleness-anchor": lambda: _table(study.anchor_table),
    "staleness-to-clip": lambda: _table(study.to_clip_table),
    "staleness-lag-cost": lambda: _table(study.lag_cost_table),
}
