"""bench/ci/record.py cuts a CI run at the suites' own timestamps, and its tables say what the records hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))

import docs_tables  # noqa: E402  (the generator's one loader of files outside a package)

record = docs_tables.load_module("bench/ci/record.py")
tables = docs_tables.load_module("bench/ci/doc_tables.py")  # the copy the generator renders from


def test_phases_are_cut_at_the_suites_timestamps_and_add_up():
    unit = {"started_at": 100.0, "ended_at": 460.0, "counts": {"passed": 3}}
    e2e = {"started_at": 520.0, "ended_at": 1500.0, "counts": {"passed": 2}, "fixtures_s": {"chi2_run": 97.4}}
    phases = record.phases(10.0, 1502.5, unit, e2e)
    assert [(p["name"], p["start"], p["end"]) for p in phases] == [
        ("setup_and_lint", 10.0, 100.0), ("unit", 100.0, 460.0), ("e2e_setup", 460.0, 520.0),
        ("e2e", 520.0, 1500.0), ("rest", 1500.0, 1502.5),
    ]  # fmt: skip
    assert phases[3]["runs_s"] == {"chi2_run": 97.4} and phases[1]["counts"] == {"passed": 3}


def test_a_run_that_stopped_before_the_end_to_end_suite_has_no_such_phase():
    phases = record.phases(0.0, 700.0, {"started_at": 90.0, "ended_at": 600.0}, None)
    assert [p["name"] for p in phases] == ["setup_and_lint", "unit", "rest"]


def test_the_peak_is_taken_inside_the_window_only():
    sampler = record.MemorySampler()
    sampler.samples = [(1.0, 2.0), (2.0, 9.0), (3.0, 4.0), (4.0, 30.0)]
    assert sampler.peak(1.5, 3.5) == 9.0 and sampler.peak(5.0, 6.0) is None


@pytest.mark.parametrize("seconds, text", [(59.4, "59 s"), (60.0, "1 min 0 s"), (1536.4, "25 min 36 s")])
def test_minutes(seconds, text):
    assert tables.minutes(seconds) == text


def test_the_runs_leave_out_the_fixtures_that_start_none():
    e2e = {"name": "e2e", "runs_s": {"chi2_run": 97.4, "e2e_root": 0.0, "findings": 7.1, "gym_run": 128.1}}
    assert tables.runs_s({"phases": [e2e]}) == {"chi2_run": 97.4, "gym_run": 128.1}


def test_every_committed_record_is_complete_and_its_phases_add_up_to_its_total():
    files = sorted((ROOT / "bench" / "ci" / "records").glob("*.json"))
    assert files, "no committed record"
    for path in files:
        r = json.loads(path.read_text())
        assert r["worktree_clean"] and r["cold"]["home_empty"] and r["cold"]["venvs_absent"], path.name
        assert path.name.split("-", 3)[3].startswith(r["commit"][:7]), path.name  # DATE-COMMIT-LABEL.json
        assert sum(p["seconds"] for p in r["phases"]) == pytest.approx(r["total_s"], abs=0.1 * len(r["phases"]))
