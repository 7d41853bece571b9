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
import entropy_study  # noqa: E402
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


ENTROPY = RESULTS / "entropy"


def entropy_calibration() -> tuple[str, str]:
    results = json.loads((ENTROPY / "calibration.json").read_text())
    return "\n".join(calibrate.binary_table(results)), "studies/realmodel/results/entropy/calibration.json"


def entropy_profile() -> tuple[str, str]:
    done = json.loads((ENTROPY / "profile.json").read_text())
    return "\n".join(entropy_study.profile_table(done)), "studies/realmodel/results/entropy/profile.json"


def entropy_pilot() -> tuple[str, str]:
    return "\n".join(entropy_study.pilot_table()), "studies/realmodel/results/entropy/pilot/*.json"


def entropy_probe() -> tuple[str, str]:
    path = ENTROPY / "probe.json"
    if not path.exists():
        waiting = ["| replay probe | state |", "|---|---|",
                   "| Clip-Higher and band-chi2 against band-kl | not run yet: its predictions and its rule for a "
                   "fourth arm are in the protocol, committed before it runs |"]  # fmt: skip
        return "\n".join(waiting), "studies/realmodel/results/entropy/probe.json"
    lines, _ = entropy_study.probe_tables(json.loads(path.read_text()))
    return "\n".join(lines), "studies/realmodel/results/entropy/probe.json"


def entropy_runs() -> tuple[str, str]:
    return "\n".join(entropy_study.report_lines()), "studies/realmodel/results/entropy/runs/*.json"


TABLES = {
    "realmodel-calibration": calibration,
    "realmodel-probe": probe,
    "realmodel-pairs": pairs,
    "realmodel-entropy-calibration": entropy_calibration,
    "realmodel-entropy-profile": entropy_profile,
    "realmodel-entropy-pilot": entropy_pilot,
    "realmodel-entropy-probe": entropy_probe,
    "realmodel-entropy-runs": entropy_runs,
}
