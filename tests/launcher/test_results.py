"""`openrlhf-band results`: the table and curves from synthetic TensorBoard logs written with the tags
OpenRLHF 0.11.2 writes.

Where the tags come from (OpenRLHF 0.11.2 as installed, plus this project's patch):
- openrlhf/utils/logging_utils.py:119  log_dir = os.path.join(tensorboard_dir, wandb.run_name)
- openrlhf/utils/logging_utils.py:128  add_text("train/generated_samples", ...)
- openrlhf/utils/logging_utils.py:130  add_scalar(f"train/{k}", v, global_step)   (training status dict)
- openrlhf/utils/logging_utils.py:135  add_scalar(f"eval/{k}", v, global_step)    (eval dict)
- openrlhf/trainer/ppo_trainer.py:130-136  eval_{ds}_pass{n}, eval_{ds}_pass1, eval_{ds}_response_length_mean,
  eval_{ds}_truncated_rate; :140-143 eval_response_length_mean, eval_truncated_rate, eval_num_samples
- openrlhf/trainer/ppo_trainer.py:425  rollout/reward_mean (also rollout/reward_std, ...)
- openrlhf/trainer/ray/ppo_actor.py  experience.info["ppo_clip_ratio"], ["reward"] (experience info),
  metrics["entropy_loss"] (when --actor.entropy_coef is set), band/* from BandPolicyLoss.band_metrics
- openrlhf_band/integration/metrics.py band_metrics: "band/clip_frac_upper", "band/clip_frac_lower", ...
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
from pathlib import Path

import pytest

from openrlhf_band.launcher import results

N = 4  # eval samples per prompt -> eval_<ds>_pass4
BENCHES = ("aime24", "amc_2023")  # an underscore in a datasource name must survive the tag parsing
EVAL_STEPS = (2, 4, 6)
TRAIN_STEPS = range(1, 7)

# pass1 / pass4 per run, benchmark, eval step (as logged: mean and max reward with a 1/0 reward)
EVAL = {
    "band-s1": {"aime24": ([0.20, 0.40, 0.30], [0.5, 0.7, 0.6]), "amc_2023": ([0.50, 0.60, 0.55], [0.8, 0.9, 0.9])},
    "band-s2": {"aime24": ([0.30, 0.35, 0.45], [0.6, 0.6, 0.7]), "amc_2023": ([0.40, 0.50, 0.70], [0.7, 0.8, 1.0])},
    "grpo_clip": {
        "aime24": ([0.25, 0.125, 0.125], [0.5, 0.5, 0.25]),
        "amc_2023": ([0.25, 0.375, 0.125], [0.75, 0.75, 0.5]),
    },
}
# band seeds averaged per step: step 2 -> (0.25 + 0.45) / 2 = 0.35, step 4 -> (0.375 + 0.55) / 2 = 0.4625,
# step 6 -> (0.375 + 0.625) / 2 = 0.5: best = last = 6 on the mean. (Seed 1 alone would pick step 4.)
# grpo_clip (exact in float32): 0.25, 0.25, 0.125 -> best = 2 (the earliest of a tie), last = 6.


def _write_run(root: Path, run_name: str, *, band: bool, eval_values: dict | None, method: str | None = None) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    run_dir = root / run_name
    writer = SummaryWriter(log_dir=str(run_dir / "tensorboard" / run_name))  # <tensorboard_dir>/<run_name>
    for step in TRAIN_STEPS:
        status = {
            "policy_loss": 0.01 * step,
            "reward": 0.1 * step,
            "rollout/reward_mean": 0.1 * step + (0.05 if band else 0.0),
            "rollout/reward_std": 0.3,
            "entropy_loss": 1.0 - 0.05 * step * (1 if band else 2),
            "ppo_clip_ratio": 0.02 + 0.001 * step,
            "ppo_kl": 1e-4,
            "actor_lr": 1e-6,
            "timing/step_total": 10.0,
        }
        if band:
            status |= {"band/clip_frac_upper": 0.01 * step, "band/clip_frac_lower": 0.005 * step}
        for k, v in status.items():
            writer.add_scalar(f"train/{k}", v, step)
        writer.add_text("train/generated_samples", "Sample:\\nq a\\n\\nReward: 1.0000", step)
        if eval_values and step in EVAL_STEPS:
            i = EVAL_STEPS.index(step)
            for ds, (pass1, passn) in eval_values.items():
                writer.add_scalar(f"eval/eval_{ds}_pass{N}", passn[i], step)
                writer.add_scalar(f"eval/eval_{ds}_pass1", pass1[i], step)
                writer.add_scalar(f"eval/eval_{ds}_response_length_mean", 900.0, step)
                writer.add_scalar(f"eval/eval_{ds}_truncated_rate", 0.01, step)
            writer.add_scalar("eval/eval_response_length_mean", 900.0, step)
            writer.add_scalar("eval/eval_num_samples", 64.0, step)
    writer.close()
    if method is not None:
        (run_dir / "run.json").write_text(json.dumps({"method": method, "seed": 1}))
    return run_dir


def _run_main(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    results.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = results.main(parser.parse_args(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = [
        _write_run(root, "band-s1", band=True, eval_values=EVAL["band-s1"], method="bandpo_kl"),
        _write_run(root, "band-s2", band=True, eval_values=EVAL["band-s2"], method="bandpo_kl"),
        _write_run(root, "grpo_clip", band=False, eval_values=EVAL["grpo_clip"]),  # no run.json: dir name
        _write_run(root, "clip_higher", band=False, eval_values=None, method="clip_higher"),  # no eval at all
    ]
    out = root / "report"
    rc, stdout, stderr = _run_main([*map(str, dirs), "--out", str(out)])
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "out": out, "rows": rows, "dirs": dirs}


def _row(rows, method, selection, bench):
    (row,) = [r for r in rows if (r["method"], r["selection"], r["benchmark"]) == (method, selection, bench)]
    return row


def _mean(*xs):
    return sum(xs) / len(xs)


def test_best_and_last_steps_average_the_seeds(report):
    assert report["rc"] == 0
    rows = report["rows"]
    # bandpo_kl: seeds averaged per step first, then the best step on the average (6, = last)
    for sel in ("best", "last"):
        for b in BENCHES:
            r = _row(rows, "bandpo_kl", sel, b)
            assert (r["runs"], r["eval_runs"], r["step"], r["n"]) == ("2", "2", "6", str(N))
            s1, s2 = EVAL["band-s1"][b], EVAL["band-s2"][b]
            assert float(r["mean_at_n"]) == pytest.approx(_mean(s1[0][2], s2[0][2]))
            assert float(r["pass_at_n"]) == pytest.approx(_mean(s1[1][2], s2[1][2]))
            assert float(r["mean_at_n_std"]) == pytest.approx(abs(s1[0][2] - s2[0][2]) / math.sqrt(2))
    avg = _row(rows, "bandpo_kl", "best", "avg")
    assert float(avg["mean_at_n"]) == pytest.approx(0.5)
    assert float(avg["pass_at_n"]) == pytest.approx(_mean(0.6, 0.9, 0.7, 1.0))

    # grpo_clip (method from the directory name): best = step 2 (tied with 4; the earliest), last = 6
    g = EVAL["grpo_clip"]
    for sel, step, i in (("best", "2", 0), ("last", "6", 2)):
        for b in BENCHES:
            r = _row(rows, "grpo_clip", sel, b)
            assert (r["runs"], r["step"]) == ("1", step)
            assert float(r["mean_at_n"]) == pytest.approx(g[b][0][i])
            assert float(r["pass_at_n"]) == pytest.approx(g[b][1][i])
            assert r["mean_at_n_std"] == ""  # one run: no spread
        assert float(_row(rows, "grpo_clip", sel, "avg")["mean_at_n"]) == pytest.approx(
            _mean(g["aime24"][0][i], g["amc_2023"][0][i])
        )


def test_markdown_table_and_missing_eval(report):
    md = (report["out"] / "results.md").read_text()
    assert md.strip() in report["stdout"]
    header = "| method | runs | step | aime24 mean@4 | aime24 pass@4 | amc_2023 mean@4 | amc_2023 pass@4 | avg mean@4 |"
    assert md.count(header) == 2  # best and last; benchmarks discovered from the eval tags only
    best, last = md.split("### Results at the last step")
    assert "| bandpo_kl | 2 | 6 | 37.5 | 65.0 | 62.5 | 95.0 | 50.0 | 80.0 |" in best
    assert "| grpo_clip | 1 | 2 | 25.0 | 50.0 | 25.0 | 75.0 | 25.0 | 62.5 |" in best
    assert "| grpo_clip | 1 | 6 | 12.5 | 25.0 | 12.5 | 50.0 | 12.5 | 37.5 |" in last
    # a method without eval data: dashes, a warning, and the run still counted
    for part in (best, last):
        assert "| clip_higher | 0/1 | - | - | - | - | - | - | - |" in part
    assert "clip_higher: no eval data" in report["stderr"]
    rows = [r for r in report["rows"] if r["method"] == "clip_higher"]
    assert len(rows) == 6 and all(r["mean_at_n"] == "" and r["step"] == "" for r in rows)
    assert [r["method"] for r in report["rows"]][::6] == ["bandpo_kl", "grpo_clip", "clip_higher"]


def test_curves_png(report):
    png = report["out"] / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_loaded_tags_and_curve_aggregation(report):
    band = results.load_run(report["dirs"][0])
    assert band.method == "bandpo_kl"
    assert band.series(results.REWARD_TAGS) == pytest.approx({s: 0.1 * s + 0.05 for s in TRAIN_STEPS})
    assert band.scalars[results.CLIP_UPPER_TAG] == pytest.approx({s: 0.01 * s for s in TRAIN_STEPS})
    clip = results.load_run(report["dirs"][2])
    assert clip.method == "grpo_clip" and results.CLIP_UPPER_TAG not in clip.scalars
    assert clip.series([results.CLIP_RATIO_TAG]) == pytest.approx({s: 0.02 + 0.001 * s for s in TRAIN_STEPS})
    steps, mean, lo, hi = results.aggregate([{1: 1.0, 2: 2.0}, {1: 3.0, 2: 6.0, 3: 5.0}])
    assert (steps, mean, lo, hi) == ([1, 2, 3], [2.0, 4.0, 5.0], [1.0, 2.0, 5.0], [3.0, 6.0, 5.0])


def test_reward_range_maps_plus_minus_one_rewards_to_accuracies(tmp_path):
    # a +1/-1 reward: OpenRLHF logs mean reward = 2 acc - 1 and max reward = 2 pass - 1
    acc = {"aime24": ([0.2, 0.4, 0.3], [0.5, 0.75, 0.5]), "amc_2023": ([0.5, 0.6, 0.55], [1.0, 1.0, 0.75])}
    logged = {b: tuple([2 * v - 1 for v in vals] for vals in pair) for b, pair in acc.items()}
    run = _write_run(tmp_path, "grpo-pm1", band=False, eval_values=logged)
    rc, _, _ = _run_main([str(run), "--out", str(tmp_path / "out"), "--reward-range", "-1", "1"])
    assert rc == 0
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    best = [r for r in rows if r["selection"] == "best" and r["benchmark"] in BENCHES]
    assert {r["step"] for r in best} == {"4"}
    for r in best:
        assert float(r["mean_at_n"]) == pytest.approx(acc[r["benchmark"]][0][1])
        assert float(r["pass_at_n"]) == pytest.approx(acc[r["benchmark"]][1][1])


def test_directory_without_event_files_is_a_one_line_error(tmp_path, report):
    empty = tmp_path / "empty_run"
    (empty / "ckpt").mkdir(parents=True)
    rc, stdout, stderr = _run_main([str(report["dirs"][2]), str(empty), "--out", str(tmp_path / "out")])
    assert rc == 1 and stdout == ""
    assert stderr.count("\n") == 1 and "no TensorBoard event files" in stderr and str(empty) in stderr
    assert not (tmp_path / "out").exists()
    rc, _, stderr = _run_main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert rc == 1 and stderr.count("\n") == 1 and "not a directory" in stderr


def test_resumed_run_keeps_the_latest_value_and_n1_has_pass_equal_mean(tmp_path):
    # a resume that writes a second event directory re-logs step 2; with n = 1 only eval_<ds>_pass1 exists
    from torch.utils.tensorboard import SummaryWriter

    for sub, steps, value in (("first", (1, 2), 0.25), ("resumed", (2, 3), 0.5)):
        w = SummaryWriter(log_dir=str(tmp_path / "run" / sub))
        for step in steps:
            w.add_scalar("train/rollout/reward_mean", value, step)
            w.add_scalar("eval/eval_aime24_pass1", value + step / 8, step)
        w.close()
    run = results.load_run(tmp_path / "run")
    assert run.series(results.REWARD_TAGS) == {1: 0.25, 2: 0.5, 3: 0.5}
    n, points = run.eval_points()
    assert n == 1 and points == {
        1: {"aime24": (0.375, 0.375)},
        2: {"aime24": (0.75, 0.75)},
        3: {"aime24": (0.875, 0.875)},
    }


def test_code_benchmarks_are_reported_as_pass_at_1_and_pass_at_n(tmp_path):
    """The code reward is 0/1 per program: the mean over the n samples is the pass@1 estimate, the max pass@n."""
    values = {"humaneval": ([0.25] * len(EVAL_STEPS), [0.5] * len(EVAL_STEPS))}
    values["aime24"] = ([0.5] * len(EVAL_STEPS), [1.0] * len(EVAL_STEPS))
    run = results.load_run(_write_run(tmp_path, "code", band=True, eval_values=values))
    benchmarks, summaries = results.summarize([run])
    md = results.format_markdown(benchmarks, summaries)
    assert "| aime24 mean@4 | aime24 pass@4 | humaneval pass@1 | humaneval pass@4 |" in md
    assert results.column_labels("mbpp", "32") == ("pass@1", "pass@32")
    assert results.column_labels("gsm_symbolic", "32") == ("mean@32", "pass@32")
