"""The real-model study's tables for docs/smollm2_study.md (studies/docs_tables.py renders them): the task
calibration, the replay probe and the paired study, each from its committed JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import calibrate  # noqa: E402  (studies/realmodel is not a package)
import study  # noqa: E402


def calibration() -> tuple[str, str]:
    results = json.loads((RESULTS / "calibration.json").read_text())
    return "\n".join(
        calibrate.calibration_table(results, rows=128, samples=4)
    ), "studies/realmodel/results/calibration.json"


def probe() -> tuple[str, str]:
    lines, _ = study.probe_tables(json.loads((RESULTS / "probe.json").read_text()))
    return "\n".join(lines), "studies/realmodel/results/probe.json"


def pairs() -> tuple[str, str]:
    lines, _, _ = study.pairs_tables()
    return "\n".join(lines), "studies/realmodel/results/runs/*.json"


TABLES = {"realmodel-calibration": calibration, "realmodel-probe": probe, "realmodel-pairs": pairs}
