"""studies/paired_runs.py, the driver both studies share (studies/learn/learn_study.py, studies/smollm2/study.py):
a run counts as finished only when it wrote summary.json, a failed run does not stop the others, and a failed
run's leftovers are removed before it is run again."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a script standing in for run.sh / learn's run script: what it does depends on the method's flag
SCRIPT = """#!/usr/bin/env bash
out="$1"; kind="$2"
echo "$kind $out" >> "$(dirname "$0")/RAN"
mkdir -p "$out"
case "$kind" in
  ok) echo '{"steps": 1}' > "$out/summary.json" ;;
  no-summary) ;;             # exit 0 without a summary: the run did not finish
  fails) echo '{"steps": 1}' > "$out/summary.json"; exit 1 ;;   # a summary, then an error: not finished
esac
"""


def load_paired_runs():
    spec = importlib.util.spec_from_file_location("paired_runs", ROOT / "studies" / "paired_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_without_a_summary_or_with_an_error_is_failed_and_the_others_run(tmp_path):
    paired_runs = load_paired_runs()
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    finished = []
    methods = {"a": ["no-summary"], "b": ["fails"], "c": ["ok"]}
    status = paired_runs.run_pairs(script, tmp_path / "out", 1, methods, {}, 42,
                                   on_finished=lambda m, s, d: finished.append(m))  # fmt: skip
    assert status == 1
    assert finished == ["c"]  # only a run that exited 0 with a summary is kept (the ledger's hook)
    assert len((tmp_path / "RAN").read_text().splitlines()) == 3
    # b wrote a summary and then failed: kept aside, neither loaded nor taken as finished when resumed
    assert set(paired_runs.load_runs(tmp_path / "out", list(methods))) == {"c"}
    assert (tmp_path / "out" / "b" / "seed0" / "summary.json.failed").exists()
    assert paired_runs.run_pairs(script, tmp_path / "out", 1, {"b": ["fails"]}, {}, 42) == 1
    assert len((tmp_path / "RAN").read_text().splitlines()) == 4


def test_a_failed_runs_leftovers_are_removed_before_it_runs_again(tmp_path):
    paired_runs = load_paired_runs()
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    stale = tmp_path / "out" / "a" / "seed0"
    stale.mkdir(parents=True)
    (stale / "events.out.tfevents.old").write_text("a stopped run's TensorBoard file")
    assert paired_runs.run_pairs(script, tmp_path / "out", 1, {"a": ["ok"]}, {}, 42) == 0
    assert sorted(p.name for p in stale.iterdir()) == ["summary.json"]
    assert json.loads((stale / "summary.json").read_text()) == {"steps": 1}
    # finished now: a second call runs nothing
    assert paired_runs.run_pairs(script, tmp_path / "out", 1, {"a": ["ok"]}, {}, 42) == 0
    assert len((tmp_path / "RAN").read_text().splitlines()) == 1
