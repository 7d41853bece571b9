"""The engine study's committed numbers (studies/smollm2/results/) are consistent, and the figures
docs/smollm2_study.md quotes in its prose are the ones in those files (its tables are rendered by
studies/smollm2/doc_tables.py and held by tests/docs/test_docs_tables.py); the driver's per-bin arithmetic and
its ledger are checked on hand-made inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "smollm2" / "results"
PAGE = (ROOT / "docs" / "smollm2_study.md").read_text()
BINS = ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")


def load_study():
    spec = importlib.util.spec_from_file_location("smollm2_study", ROOT / "studies" / "smollm2" / "study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bins() -> dict:
    return json.loads((RESULTS / "token_bins.json").read_text())


def test_the_starting_models_token_bins_are_shares(bins):
    start = bins["starting_model"]
    assert set(start["token_bins"]) == set(BINS)
    assert math.isclose(sum(start["token_bins"].values()), 1.0, abs_tol=1e-12)
    # shares of an integer count of tokens
    assert all(
        math.isclose(v * start["tokens"], round(v * start["tokens"]), abs_tol=1e-6)
        for v in start["token_bins"].values()
    )


def test_each_methods_first_step_bins(bins):
    assert {"clip", "clip-higher", "band-kl"} <= set(bins["first_step"])
    for method, row in bins["first_step"].items():
        # the band's shares are float32 means (a few ulps, 6e-8 relative, each) reduced over the step's 4
        # micro-batches by OpenRLHF: four of them sum to 1 within ~1e-6; 1e-5 leaves a margin, not a rounding
        assert math.isclose(sum(row["tokens"].values()), 1.0, abs_tol=1e-5), method
        assert all(r is None or 0.0 <= r <= 1.0 for r in row["clip_rate"].values()), method


def test_the_page_quotes_the_dtype_cost():
    """The page's tables of the starting model, its token bins and the first-step clip rates are rendered from
    token_bins.json by studies/smollm2/doc_tables.py (tests/docs/test_docs_tables.py holds them); the bf16 cost
    it quotes in prose is dtype_cost.json's."""
    cost = json.loads((RESULTS / "dtype_cost.json").read_text())
    assert f"in bf16 took {cost['bf16_over_fp32']:.2f}x float32's time" in " ".join(PAGE.split())
    assert cost["native_bf16"]  # the page says it was measured on a CPU with native bf16


def test_first_step_bins_from_the_clip_probe(tmp_path):
    study = load_study()
    (tmp_path / "args.txt").write_text("\n".join([
        "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4", "--train.micro_batch_size", "8",
        "--train.micro_batch_size", "4",  # a later flag wins, as in train_ppo_ray
    ]))  # fmt: skip
    assert study.calls_per_step(tmp_path) == 2
    tokens = dict(zip(BINS, (10, 20, 30, 40)))
    clipped = dict(zip(BINS, (5, 0, 3, 4)))
    call = {"eps": [0.2, 0.2], "tokens": tokens, "clipped": clipped}
    later = {"eps": [0.2, 0.2], "tokens": dict.fromkeys(BINS, 1000), "clipped": dict.fromkeys(BINS, 1000)}
    (tmp_path / "clip_bins.jsonl").write_text("\n".join(json.dumps(r) for r in (call, call, later)))
    out = study.first_step_bins(tmp_path, {}, study.calls_per_step(tmp_path))  # the step's two calls only
    assert out["tokens"] == {b: 2 * tokens[b] / 200 for b in BINS}
    # (clipped / total) / (tokens / total): clipped / tokens to a few ulps
    assert out["clip_rate"] == pytest.approx({b: clipped[b] / tokens[b] for b in BINS}, rel=1e-14)


def test_first_step_bins_from_the_bands_metrics(tmp_path):
    study = load_study()
    metrics = {f"train/band/tokens_{b}": {"1": s} for b, s in zip(BINS, (0.1, 0.2, 0.3, 0.4))}
    metrics |= {f"train/band/clipped_{b}": {"1": c} for b, c in zip(BINS, (0.05, 0.0, 0.03, 0.0))}
    out = study.first_step_bins(tmp_path, metrics, 4)
    assert out["clip_rate"] == {"p<0.01": 0.5, "p0.01-0.1": 0.0, "p0.1-0.5": pytest.approx(0.1), "p>=0.5": 0.0}


def test_the_page_says_what_the_harness_runs():
    run_sh = (ROOT / "studies" / "smollm2" / "run.sh").read_text()
    prepare = re.search(r"PREPARE=\((.*?)\)", run_sh, re.S).group(1)
    for option in re.findall(r"--task-option (\S+)", prepare):
        assert option in PAGE, option
    tasks = re.search(r'--tasks "([^"]+)"', prepare).group(1)
    assert f"--tasks {tasks}" in PAGE and "--shots 2" in prepare and "--shots 2" in PAGE


def test_the_pages_no_shots_and_cost_figures():
    no_shots = json.loads((RESULTS / "no_shots.json").read_text())
    replies = no_shots["prompts"] * no_shots["samples_per_prompt"]
    found = round(no_shots["answer_found"] * replies)
    assert f"{found} of {replies} held-out replies carry" in PAGE
    assert f"{no_shots['truncated']:.0%} run into the 24-token budget" in PAGE
    bins = json.loads((RESULTS / "token_bins.json").read_text())
    start = bins["starting_model"]
    assert f"{start['answer_found']:.0%} of its replies carry the tag and {1 - start['truncated']:.0%} end" in PAGE
    tasks = " ".join((ROOT / "docs" / "tasks.md").read_text().split())
    assert f"its held-out reward at the start is {start['mean_reward']:.3f}" in tasks
    seconds = [row["step_seconds"] for row in bins["first_step"].values()]
    assert f"a step cost {min(seconds):.0f}-{max(seconds):.0f} s" in PAGE
    lengths = [row["tokens_per_sample"] for row in bins["first_step"].values()]
    assert f"32 samples of about {statistics.fmean(lengths):.0f} tokens" in PAGE


# ------------------------------------------------------------------ the study across machines: the ledger

FAKE_RUN = """#!/usr/bin/env bash
# run.sh's settings as they are; a "run" that only writes the summary run.sh's summarize would
if [[ "${SMOL_SETTINGS_ONLY:-0}" == 1 ]]; then exec bash REAL_RUN_SH "$@"; fi
echo "$*" >> RAN
out="$1"; shift
mkdir -p "$out"
settings="$(SMOL_SETTINGS_ONLY=1 bash REAL_RUN_SH "$out" "$@")"
echo "{\\"settings\\": $settings, \\"steps\\": 0}" > "$out/summary.json"
"""


@pytest.fixture
def study_with_fake_runs(tmp_path, monkeypatch):
    """study.py with run.sh replaced by a script that records each run in tmp_path/RAN and writes a summary
    with run.sh's real settings (its SMOL_SETTINGS_ONLY mode is the real run.sh's)."""
    study = load_study()
    fake = tmp_path / "run.sh"
    real = ROOT / "studies" / "smollm2" / "run.sh"
    fake.write_text(FAKE_RUN.replace("REAL_RUN_SH", str(real)).replace("RAN", str(tmp_path / "RAN")))
    monkeypatch.setattr(study, "RUN_SH", fake)
    for var in ("SMOL_STEPS", "SMOL_PROMPTS", "SMOL_SAMPLES", "SMOL_LR", "SMOL_EVAL_SAMPLES", "SMOL_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return study


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "RAN"
    return path.read_text().splitlines() if path.exists() else []


def test_finished_runs_are_kept_in_the_ledger_and_taken_from_it_on_another_machine(tmp_path, study_with_fake_runs):
    study, ledger = study_with_fake_runs, tmp_path / "ledger"
    methods = ["clip", "band-kl"]
    assert study.run(tmp_path / "session1", 2, methods, 8, ledger) == 0
    assert len(ran(tmp_path)) == 4
    expected = [f"{m}-seed{s}.json" for m in ("band-kl", "clip") for s in (0, 1)]
    assert sorted(p.name for p in ledger.iterdir()) == expected
    record = json.loads((ledger / "band-kl-seed1.json").read_text())
    assert record["settings"]["steps"] == 8 and record["settings"]["flags"][-2:] == ["--train.seed", "43"]
    assert "band" in record["settings"]["flags"]
    # another machine: an empty out/, the same settings, one more seed: only seed 2 runs
    assert study.run(tmp_path / "session2", 3, methods, 8, ledger) == 0
    assert [line.split()[0] for line in ran(tmp_path)[4:]] == [
        str(tmp_path / "session2" / m / "seed2") for m in methods
    ]
    assert (tmp_path / "session2" / "clip" / "seed0" / "summary.json").read_text() == (
        ledger / "clip-seed0.json"
    ).read_text()


def test_a_ledger_run_with_other_settings_is_refused_not_mixed_in(tmp_path, study_with_fake_runs):
    study, ledger = study_with_fake_runs, tmp_path / "ledger"
    assert study.run(tmp_path / "a", 1, ["clip"], 8, ledger) == 0
    with pytest.raises(SystemExit, match="other settings than this study's"):
        study.run(tmp_path / "b", 1, ["clip"], 12, ledger)  # 12 steps against the recorded 8
    assert len(ran(tmp_path)) == 1 and not (tmp_path / "b" / "clip" / "seed0" / "summary.json").exists()


def test_a_stop_file_stops_the_study_before_its_next_run(tmp_path, study_with_fake_runs):
    study, out = study_with_fake_runs, tmp_path / "out"
    out.mkdir()
    (out / "STOP").touch()
    assert study.run(out, 1, ["clip", "band-kl"], 8, None) == 3
    assert ran(tmp_path) == [] and not (out / "STOP").exists()  # consumed: the next call continues
    assert study.run(out, 1, ["clip", "band-kl"], 8, None) == 0
    assert len(ran(tmp_path)) == 2


def test_every_ledger_run_has_the_studys_settings():
    """Every committed run was made with the study's settings (those `make smollm2-study` would run now); the page's
    table of them is `study.py ledger`, rendered by studies/smollm2/doc_tables.py."""
    study = load_study()
    for record in sorted(study.LEDGER.glob("*.json")):
        method, seed = record.stem.rsplit("-seed", 1)
        recorded = json.loads(record.read_text())["settings"]
        assert recorded == study.expected_settings(method, int(seed), 8), record.name


def test_the_ledger_table_can_fail(tmp_path):
    """One run of the ledger alone makes the committed table's first lines; its reward changed, they are not."""
    study = load_study()
    committed = study.ledger_table(study.LEDGER)
    first = next(p for m in study.METHODS if (p := study.LEDGER / f"{m}-seed0.json").exists())
    record = json.loads(first.read_text())
    (tmp_path / first.name).write_text(json.dumps(record))
    assert committed.startswith(study.ledger_table(tmp_path))
    record["after"]["mean_reward"] += 0.5
    (tmp_path / first.name).write_text(json.dumps(record))
    assert not committed.startswith(study.ledger_table(tmp_path))


# ------------------------------------------------------------------ the study's results


def first_step_counts(record: dict, bins: tuple[str, ...]) -> tuple[int, int]:
    """(tokens, clipped) of the run's first step below a p bound: each bin's share x 32 samples x the step's mean
    reply length is the bin's token count, an integer to float rounding."""
    first, step_tokens = record["first_step_bins"], 32 * record["metrics"]["train/response_length"]["1"]
    tokens = clipped = 0.0
    for b in bins:
        in_bin = first["tokens"][b] * step_tokens
        assert math.isclose(in_bin, round(in_bin), abs_tol=1e-3), (b, in_bin)
        tokens += in_bin
        clipped += (first["clip_rate"][b] or 0.0) * in_bin
    assert math.isclose(clipped, round(clipped), abs_tol=1e-3), clipped
    return round(tokens), round(clipped)


def test_the_page_shows_the_studys_results_from_the_ledger():
    """The report's summary.txt holds paired_table of the committed ledger (the page's results table, rendered by
    studies/smollm2/doc_tables.py) and summary.json the same runs, and the figures the page quotes in prose are the
    ledger's."""
    study = load_study()
    runs = study.ledger_runs(study.LEDGER)
    assert {m: sorted(s) for m, s in runs.items()} == {m: [0, 1, 2] for m in study.METHODS}
    table = study.paired_table(runs)
    assert table in (RESULTS / "summary.txt").read_text()
    summary = json.loads((RESULTS / "summary.json").read_text())
    for method, by_seed in runs.items():
        after = [by_seed[i]["after"]["mean_reward"] for i in sorted(by_seed)]
        assert summary["methods"][method]["mean_reward"]["after"] == after, method
    flat = " ".join(PAGE.split())  # the page's prose, its line breaks as spaces
    clip = runs["clip"]
    rises = [clip[i]["after"]["mean_reward"] - clip[i]["before"]["mean_reward"] for i in clip]
    rise, spread = statistics.fmean(rises), statistics.stdev(clip[i]["after"]["mean_reward"] for i in clip)
    assert f"rose {study.mean_sd(rises)} over the starting model" in flat
    assert f"{rise / spread:.1f}x the seed spread of its final reward ({spread:.3f})" in flat
    # the policy's exact entropy on the training rollouts, mean over the steps: band-kl minus clip per seed
    steps_mean = {m: [statistics.fmean(runs[m][i]["metrics"]["train/entropy_loss"].values()) for i in range(3)]
                  for m in ("clip", "band-kl")}  # fmt: skip
    gaps = [f"{b - c:+.2f}" for b, c in zip(steps_mean["band-kl"], steps_mean["clip"])]
    assert f"band-kl minus clip {gaps[0]}, {gaps[1]} and {gaps[2]} nats" in flat, gaps
    # the starting model's evaluations: one per seed, and clip's seed 1 evaluated it again at the same seed
    evaluations = sorted({(s["before"]["seed"], s["before"]["mean_reward"]) for m in runs.values() for s in m.values()})
    assert [seed for seed, _ in evaluations] == [42, 43, 43, 44]
    values = [f"{v:.3f}" for _, v in evaluations]
    sd = statistics.stdev(v for _, v in evaluations)
    assert f"scored {values[0]}, {values[1]} and {values[2]} (both at seed 43" in flat
    assert f"and {values[3]}; sd {sd:.3f}" in flat
    below_001, below_01 = BINS[:1], BINS[:2]
    for method, name in (("clip", "clip"), ("clip-higher", "Clip-Higher"), ("band-kl", "band-kl")):
        counts = [first_step_counts(runs[method][i], below_001) for i in range(3)]
        tokens, clipped = sum(t for t, _ in counts), sum(c for _, c in counts)
        assert f"{name} {clipped} of {tokens}" in flat or f"{name} clipped {clipped} of {tokens}" in flat, method
        counts = [first_step_counts(runs[method][i], below_01) for i in range(3)]
        assert f"{sum(c for _, c in counts)} of {sum(t for t, _ in counts)}" in flat, method
    per_seed = [first_step_counts(runs["clip"][i], below_001)[1] for i in range(3)]
    assert f"clip {per_seed[0]}, {per_seed[1]} and {per_seed[2]}" in flat
    assert all(first_step_counts(runs["band-kl"][i], below_001)[1] == 0 for i in range(3))
    band = [runs["band-kl"][i]["after"]["mean_reward"] - clip[i]["after"]["mean_reward"] for i in range(3)]
    assert f"band-kl {study.mean_sd(band)} over clip" in flat
    # why the runs are not paired: the step-1 training score already differs across the methods of one seed
    step1 = [f"{statistics.stdev(runs[m][i]['metrics']['train/score']['1'] for m in runs):.3f}" for i in range(3)]
    assert f"a seed: {step1[0]}, {step1[1]} and {step1[2]} on seeds 0, 1, 2" in flat, step1


def test_the_paired_table_pairs_by_seed_and_can_fail():
    """Hand-made runs: the difference to clip is taken seed by seed, not between the methods' means."""
    study = load_study()

    def run(before: float, after: float, entropy: float) -> dict:
        return {"before": {"mean_reward": before},
                "after": {"mean_reward": after, "entropy": entropy, "truncated": 0.0}}  # fmt: skip

    runs = {"clip": {0: run(0.1, 0.2, 1.0), 1: run(0.1, 0.4, 1.0)},
            "band-kl": {1: run(0.1, 0.5, 2.0), 0: run(0.1, 0.3, 1.5)}}  # fmt: skip
    rows = study.paired_table(runs).splitlines()
    assert rows[2] == "| clip | 0.300 +- 0.141 | +0.200 +- 0.141 | - | 1.000 +- 0.000 | - | 0.000 +- 0.000 |"
    # seed 0: +0.1, seed 1: +0.1 -> sd 0; unpaired the sd would be 0.2
    assert rows[3] == (
        "| band-kl | 0.400 +- 0.141 | +0.300 +- 0.141 | +0.100 +- 0.000 | 1.750 +- 0.354 | +0.750 +- 0.354 "
        "| 0.000 +- 0.000 |"
    )
    runs["band-kl"][0]["after"]["mean_reward"] = 0.35
    assert study.paired_table(runs).splitlines()[3] != rows[3]


def test_the_24_step_pilot_on_the_page_is_its_committed_runs():
    """The clip-only 24-step pilot: its runs were made with the study's settings but 24 steps, its summary.txt holds
    their table, and the page quotes their rewards, the rise over the seed spread and seed 2's budget share."""
    study = load_study()
    pilot = RESULTS / "clip-24-steps"
    runs = study.ledger_runs(pilot / "runs")
    assert list(runs) == ["clip"] and sorted(runs["clip"]) == [0, 1, 2]
    for seed, record in runs["clip"].items():
        assert record["settings"] == study.expected_settings("clip", seed, 24), seed
    assert study.paired_table(runs) in (pilot / "summary.txt").read_text()
    flat = " ".join(PAGE.split())
    clip = runs["clip"]
    after = [f"{clip[i]['after']['mean_reward']:.3f}" for i in range(3)]
    assert f"Held-out reward after 24 steps: {after[0]}, {after[1]} and {after[2]} on seeds 0, 1, 2" in flat
    rises = [clip[i]["after"]["mean_reward"] - clip[i]["before"]["mean_reward"] for i in range(3)]
    spread = statistics.stdev(clip[i]["after"]["mean_reward"] for i in range(3))
    assert f"the rise {study.mean_sd(rises)}, {statistics.fmean(rises) / spread:.1f}x the seed spread of the final " \
           f"reward ({spread:.3f})" in flat  # fmt: skip
    assert f"ended with {clip[2]['after']['truncated']:.0%} of its held-out replies at the 24-token budget and " \
           f"{clip[2]['after']['entropy']:.3f} nats" in flat  # fmt: skip
    assert f"{statistics.fmean(rises) / spread:.1f}x in the 24-step pilot" in flat
