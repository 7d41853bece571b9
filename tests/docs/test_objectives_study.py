"""docs/objectives.md's study tables are what studies/objectives/tables.py prints from the committed
data, and the merged data pairs only runs that agree: its clip rows are the band family's."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "objectives" / "results" / "metrics.csv"
FAMILY = ROOT / "studies" / "band_family" / "results" / "metrics.csv"


def _tables() -> str:
    out, argv = io.StringIO(), sys.argv
    try:
        sys.argv = ["tables.py", str(RESULTS)]
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / "studies" / "objectives" / "tables.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return out.getvalue()


def test_every_table_row_in_the_docs_is_the_scripts_output():
    printed = [line for line in _tables().splitlines() if line.startswith("| ") and "---" not in line]
    page = (ROOT / "docs" / "objectives.md").read_text()
    study = page.split("## The study on the CPU demo", 1)[1]
    rows = [line for line in study.splitlines() if line.startswith("| ") and "---" not in line]
    data_rows = [r for r in rows if not r.startswith(("| method", "| pair"))]
    assert len(data_rows) == 9 + 8 + 6
    missing = [r for r in data_rows if r not in printed]
    assert missing == []


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
