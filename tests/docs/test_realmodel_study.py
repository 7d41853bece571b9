"""The exactly paired real-model study's tables (studies/realmodel/results/*.md, written by its drivers from the
committed JSON) are the ones docs/smollm2_study.md shows, and each table agrees with the JSON it came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "realmodel" / "results"
PAGE = (ROOT / "docs" / "smollm2_study.md").read_text()
sys.path.insert(0, str(ROOT / "studies" / "realmodel"))


def table_rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("|")]


@pytest.mark.parametrize("name", ["calibration.md", "probe.md", "pairs.md"])
def test_the_page_shows_each_generated_table(name):
    path = RESULTS / name
    if name != "calibration.md" and not path.exists():
        pytest.skip(f"{name} not committed yet")
    missing = [row for row in table_rows(path) if row not in PAGE]
    assert not missing, f"docs/smollm2_study.md lacks {len(missing)} row(s) of {name}, e.g. {missing[0]}"


def test_the_calibration_table_is_rendered_from_its_json(tmp_path, monkeypatch):
    import calibrate

    monkeypatch.setattr(calibrate, "RESULTS", tmp_path)
    results = json.loads((RESULTS / "calibration.json").read_text())
    calibrate.write_table(results, rows=128, samples=4)
    assert (tmp_path / "calibration.md").read_text() == (RESULTS / "calibration.md").read_text()


def test_the_probe_table_is_rendered_from_its_json(tmp_path, monkeypatch):
    import study

    if not (RESULTS / "probe.json").exists():
        pytest.skip("probe.json not committed yet")
    monkeypatch.setattr(study, "RESULTS", tmp_path)
    study.probe_report(json.loads((RESULTS / "probe.json").read_text()))
    assert (tmp_path / "probe.md").read_text() == (RESULTS / "probe.md").read_text()
