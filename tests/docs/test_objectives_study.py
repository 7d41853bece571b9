"""docs/objectives.md's study tables are rendered from the committed data (by studies/objectives/tables.py's
functions, through studies/docs_tables.py), and the merged data pairs only runs that agree: its clip rows are
the band family's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "objectives" / "results" / "metrics.csv"
FAMILY = ROOT / "studies" / "band_family" / "results" / "metrics.csv"


TABLES = ("objectives-absolute", "objectives-paired", "objectives-head-to-head")


def test_the_study_tables_are_rendered_blocks_of_the_page():
    """The page's study tables are studies/objectives/doc_tables.py's blocks: tests/docs/test_docs_tables.py
    holds each to what studies/objectives/tables.py prints from the committed rows."""
    page = (ROOT / "docs" / "objectives.md").read_text()
    study = page.split("## The study on the CPU demo", 1)[1]
    for name in TABLES:
        assert f"<!-- table {name}: " in study and f"<!-- /table {name} -->" in study, name
    rest = re.sub(r"^<!-- table ([\w.-]+): .*?^<!-- /table \1 -->$", "", study, flags=re.M | re.S)
    assert [line for line in rest.splitlines() if line.startswith("|")] == []  # no hand-typed table beside them


def test_the_merged_rows_pair_only_runs_that_agree():
    family = {(r[0], r[1], r[2]): r for r in (line.split(",") for line in FAMILY.read_text().splitlines()[1:])}
    header = RESULTS.read_text().splitlines()[0].split(",")
    fam_header = FAMILY.read_text().splitlines()[0].split(",")
    ours = [dict(zip(header, line.split(","))) for line in RESULTS.read_text().splitlines()[1:]]
    clip = [r for r in ours if r["method"] == "clip"]
    assert len(clip) == 5 * 17  # 5 seeds x (step 0 and 16 evaluations)
    for r in clip:
        theirs = dict(zip(fam_header, family[("clip", r["seed"], r["step"])]))
        assert all(_same(r[k], theirs[k]) for k in header if k in theirs), (r["seed"], r["step"])


def _same(a: str, b: str) -> bool:
    """The same value (the same float, counts read back as floats), or both not a number ("nan", or an
    empty cell: a column the run did not have)."""
    if a == b or {a, b} <= {"", "nan"}:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False
