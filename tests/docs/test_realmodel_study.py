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


def _fake_run_one(study, ran: list, gain: float):
    """run_one without the model: a ledger entry of the committed entries' shape, band-kl `gain` above clip."""

    def run_one(method: str, seed: int, save_mid: bool = False) -> dict:
        ran.append((method, seed, save_mid))
        reward = 0.3 + 0.01 * seed + (gain if method == "band-kl" else 0.0) + 0.001 * (seed % 3)
        result = {
            "method": method,
            "seed": seed,
            "steps": [{"rollout_reward": 0.25}, {"rollout_reward": 0.35}],
            "exact": [{"mean_p_correct": 0.005, "entropy": 0.99}, {"mean_p_correct": 0.03, "entropy": 0.2}],
            "sampled": {"mean_reward": reward},
            "greedy": {"mean_reward": reward},
            "seconds": 1500.0,
            "settings": study.settings(),
        }
        (study.LEDGER / f"{method}-seed{seed}.json").write_text(json.dumps(result, indent=1) + "\n")
        return result

    return run_one


def test_pairs_resume_from_the_ledger_and_stop_at_a_stop_file_or_the_rule(tmp_path, monkeypatch, capsys):
    """`study.py pairs` as a later sitting resumes it (the model's runs faked): a STOP file stops it at once and stays;
    entries with the study's settings are skipped and one with other settings is run again; clip and band-kl go
    seed by seed until the stopping rule, whose line is printed, and the tables are rewritten after each seed."""
    import study

    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    (results / "start.json").write_text((RESULTS / "start.json").read_text())
    monkeypatch.setattr(study, "RESULTS", results)
    monkeypatch.setattr(study, "LEDGER", results / "runs")
    monkeypatch.setattr(study, "WORK", tmp_path / "work")
    ran: list = []
    monkeypatch.setattr(study, "run_one", _fake_run_one(study, ran, gain=0.2))
    study.run_one("clip", 0, save_mid=True)
    study.run_one("band-kl", 0)
    study.run_one("clip", 1)
    stale = json.loads((results / "runs" / "clip-seed1.json").read_text())
    stale["settings"]["train_size"] += 1  # made with other settings: not this study's run
    (results / "runs" / "clip-seed1.json").write_text(json.dumps(stale, indent=1) + "\n")
    ran.clear()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "STOP").touch()
    capsys.readouterr()
    assert study.pairs_main(12) == 0
    assert ran == [] and (tmp_path / "work" / "STOP").exists()
    assert capsys.readouterr().out == "[realmodel] STOP file: stopping\n"
    (tmp_path / "work" / "STOP").unlink()
    assert study.pairs_main(12) == 0
    assert ran == [(m, s, False) for s in (1, 2, 3) for m in study.PAIRED]
    printed = capsys.readouterr().out.splitlines()
    pairs = study.paired_gains()
    assert pairs["n"] == 4 and pairs["gains"] == pytest.approx([0.2] * 4)
    assert printed[-1] == f"[realmodel] stopping rule met: {study.stopping_rule(pairs)}"
    assert "excludes 0" in printed[-1]
    lines, _, _ = study.pairs_tables()
    assert (results / "pairs.md").read_text().splitlines()[2:] == lines
    assert sum(line.startswith("| clip seed") for line in lines) == 4
