"""studies/paired_runs.py, the one study driver (the learning study, the engine study and the exactly paired
real-model study call it): a run counts as finished only when it wrote summary.json, a failed run does not stop
the others, a failed run's leftovers are removed before it is run again; a STOP file stops a study as the study
says (taken away or left, before the next run or at once); the stopping rule is asked before each seed; the ledger
keeps and gives back runs by their settings; the statistics and the tables against figures worked by hand."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))
import paired_runs  # noqa: E402  (by name, as the studies import it: its dataclasses look their module up)

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


def test_a_run_without_a_summary_or_with_an_error_is_failed_and_the_others_run(tmp_path):
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


# ------------------------------------------------------------------ run_seeds: the order, STOP, the rule


def _study(done: set[tuple[str, int]]):
    """finished / run callables over a set of done (method, seed), and the list of runs made."""
    ran: list[tuple[str, int]] = []

    def run(method: str, seed: int) -> bool:
        ran.append((method, seed))
        done.add((method, seed))
        return method != "bad"

    return (lambda m, s: (m, s) in done), run, ran


def test_runs_go_seed_by_seed_and_a_failed_run_fails_the_study_not_the_others(tmp_path):
    finished, run, ran = _study({("a", 0)})
    after = []
    status = paired_runs.run_seeds(range(2), ["a", "bad", "c"], finished, run, paired_runs.Stop(tmp_path / "STOP"),
                                   after_seed=after.append)  # fmt: skip
    assert status == 1
    assert ran == [("bad", 0), ("c", 0), ("a", 1), ("bad", 1), ("c", 1)]  # whole seeds first; a finished run skipped
    assert after == [0, 1]


def test_a_consumed_stop_file_stops_before_the_next_run_and_is_taken_away(tmp_path, capsys):
    """The script-run studies: finished runs are still skipped past, the study stops before the first run that would
    start (status 3), and the file is gone so that the next call continues."""
    stop = paired_runs.Stop(tmp_path / "STOP")
    stop.file.touch()
    finished, run, ran = _study({("a", 0), ("b", 0)})
    assert paired_runs.run_seeds(range(2), ["a", "b"], finished, run, stop) == 3
    assert ran == [] and not stop.file.exists()
    assert capsys.readouterr().out == f"[study] stopped by {stop.file} before a seed 1; run it again to continue\n"
    assert paired_runs.run_seeds(range(2), ["a", "b"], finished, run, stop) == 0
    assert ran == [("a", 1), ("b", 1)]


def test_a_kept_stop_file_stops_at_once_and_stays(tmp_path, capsys):
    """The exactly paired study: the file is looked for before any (seed, method), finished or not, so a resumed study
    stops before it reports again; it stays, and every call stops until it is removed."""
    stop = paired_runs.Stop(tmp_path / "STOP", said="STOP file: stopping", status=0, consumed=False, at_once=True)
    stop.file.touch()
    finished, run, ran = _study({("a", 0), ("b", 0)})
    after = []
    for _ in range(2):
        assert paired_runs.run_seeds(range(2), ["a", "b"], finished, run, stop, "[x]", after_seed=after.append) == 0
    assert ran == [] and after == [] and stop.file.exists()
    assert capsys.readouterr().out == "[x] STOP file: stopping\n" * 2


def test_the_stopping_rule_is_asked_before_each_seed(tmp_path, capsys):
    finished, run, ran = _study(set())
    rule = lambda: "2 pairs" if len(ran) >= 4 else None  # noqa: E731
    status = paired_runs.run_seeds(range(12), ["a", "b"], finished, run, paired_runs.Stop(tmp_path / "STOP"), "[x]",
                                   stopping_rule=rule)  # fmt: skip
    assert status == 0 and ran == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert capsys.readouterr().out == "[x] stopping rule met: 2 pairs\n"


# ------------------------------------------------------------------ the ledger


def test_the_ledger_keeps_runs_and_gives_back_those_with_the_studys_settings(tmp_path):
    ledger = paired_runs.Ledger(tmp_path / "runs")
    ours, other = {"steps": 12}, {"steps": 8}
    for method, seed, settings in (("clip", 0, ours), ("clip", 10, ours), ("clip-higher", 0, ours),
                                   ("band-kl", 0, other)):  # fmt: skip
        ledger.write(method, seed, {"method": method, "seed": seed, "settings": settings})
    assert ledger.entry("clip", 0, ours) == {"method": "clip", "seed": 0, "settings": ours}
    assert ledger.entry("band-kl", 0, ours) is None and ledger.read("band-kl", 0)["settings"] == other
    assert ledger.entry("clip", 1, ours) is None and ledger.read("clip", 1) is None
    # clip's runs are not clip-higher's
    assert {m: sorted(s) for m, s in ledger.runs(["clip", "band-kl"], ours).items()} == {"clip": [0, 10]}
    assert {m: sorted(s) for m, s in ledger.runs(["clip", "band-kl"]).items()} == {"clip": [0, 10], "band-kl": [0]}
    # every record with the settings, in file-name order ("clip-h" before "clip-s")
    assert [(r["method"], r["seed"]) for r in ledger.entries(ours)] == [("clip-higher", 0), ("clip", 0), ("clip", 10)]
    summary = tmp_path / "summary.json"
    summary.write_text('{"steps":  3}')
    ledger.copy("cispo", 2, summary)
    assert (tmp_path / "runs" / "cispo-seed2.json").read_text() == '{"steps":  3}'  # kept as it is


def test_the_ledger_writes_the_committed_files_format():
    """A record written again is byte for byte the committed file (the running real-model study resumes from them)."""
    committed = sorted((ROOT / "studies" / "realmodel" / "results" / "runs").glob("*.json"))
    assert committed
    for path in committed:
        record = json.loads(path.read_text())
        assert json.dumps(record, indent=1) + "\n" == path.read_text(), path.name


# ------------------------------------------------------------------ statistics and tables


def test_the_paired_interval_and_the_sign_test():
    iv = paired_runs.interval([0.1, 0.3])  # sd 0.1 x sqrt 2, 1 degree of freedom: t 12.706
    assert iv["ci95"] == pytest.approx([0.2 - 12.706 * 0.1, 0.2 + 12.706 * 0.1])
    values = [0.01 * i for i in range(17)]  # 16 degrees of freedom: past the table, the normal 1.96
    sd = math.sqrt(sum((v - 0.08) ** 2 for v in values) / 16)
    assert paired_runs.interval(values)["ci95"][1] == pytest.approx(0.08 + 1.96 * sd / math.sqrt(17))
    assert paired_runs.interval([0.5]) == {"n": 1, "mean": 0.5, "sd": None, "ci95": None}
    assert paired_runs.interval([]) == {"n": 0, "mean": None, "sd": None, "ci95": None}
    assert paired_runs.sign_test([1.0, 2.0, -1.0, 0.0]) == {"positive": 2, "n": 3, "p_two_sided": 1.0}


def _run(before: float, after: float) -> dict:
    return {"before": {"r": before}, "after": {"r": after}, "steps": 4}


def test_summary_sections_pair_by_seed():
    """Hand-made runs whose seeds come in different orders: the difference to clip is taken seed by seed."""
    runs = {"clip": {0: _run(0.1, 0.2), 1: _run(0.1, 0.4)},
            "band-kl": {1: _run(0.1, 0.5), 0: _run(0.1, 0.3)},
            "alone": {7: _run(0.0, 1.0)}}  # fmt: skip
    assert paired_runs.paired_by_seed(runs["band-kl"], runs["clip"], lambda s: s["after"]["r"]) == (
        [0, 1], [pytest.approx(0.1), pytest.approx(0.1)])  # fmt: skip
    paired = paired_runs.paired_section(runs, ["r"])
    assert paired == ["paired difference to clip (same seed), mean +- sd over the paired seeds:",
                      "band-kl" + " " * 8 + f"{'+0.100 +- 0.000':>20}   (2 pairs)"]  # fmt: skip
    final = paired_runs.final_section("final:", runs, ["r"], "  extra", lambda by_seed: f"  {len(by_seed)}")
    assert final[1] == f"{'method':<15}{'r':>20}  extra"
    assert final[2] == f"{'clip':<15}{'0.300 +- 0.141':>20}  2"
    assert final[4] == f"{'alone':<15}{'1.000 +- nan':>20}  1"
    assert paired_runs.rise_section("rise:", runs, ["r"])[2] == f"{'band-kl':<15}{'+0.300 +- 0.141':>20}"
    assert paired_runs.steps_and_seeds(runs) == "steps per run: 4; seeds per method: clip 2, band-kl 2, alone 1"


def test_markdown_table():
    assert paired_runs.markdown_table(["a", "b c"], [["1", ""], ["x", "y"]]) == [
        "| a | b c |", "|---|---|", "| 1 |  |", "| x | y |"]  # fmt: skip
