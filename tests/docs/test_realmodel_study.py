"""The exactly paired real-model study's result files (studies/realmodel/results/*.md, written by its drivers)
agree with the JSON they came from. The page's copies are held by tests/docs/test_docs_tables.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "realmodel" / "results"
sys.path.insert(0, str(ROOT / "studies" / "realmodel"))


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
