"""The real-model study's committed numbers (studies/smollm2/results/) are consistent, and the figures
docs/smollm2_study.md shows are the ones in those files; the driver's per-bin arithmetic is checked on
hand-made inputs."""

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


def test_the_page_shows_the_committed_numbers(bins):
    start = bins["starting_model"]
    cells = [f"{start[k]:.3f}" for k in ("mean_reward", "reward_chain_sum", "reward_spell_backward", "answer_found")]
    cells += [f"{start['reply_tokens']:.1f}", f"{start['entropy']:.3f} +- {start['entropy_se']:.3f}"]
    row = "| " + " | ".join(cells) + " |"
    assert row in PAGE, row
    shares = " | ".join(f"{start['token_bins'][b]:.3f}" for b in BINS)
    assert f"| starting model, its sampled tokens | {shares} |" in PAGE
    for method, first in bins["first_step"].items():
        rates = " | ".join("-" if first["clip_rate"][b] is None else f"{first['clip_rate'][b]:.4f}" for b in BINS)
        assert f"| {method} | {rates} | {first['ppo_clip_ratio']:.4f} |" in PAGE, method
    cost = json.loads((RESULTS / "dtype_cost.json").read_text())
    assert f"({cost['bf16_over_fp32']:.2f}x:" in PAGE


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
    seconds = [row["step_seconds"] for row in bins["first_step"].values()]
    assert f"A step costs {min(seconds):.0f}-{max(seconds):.0f} s here" in PAGE
    lengths = [row["tokens_per_sample"] for row in bins["first_step"].values()]
    assert f"32 samples of about {statistics.fmean(lengths):.0f} tokens" in PAGE
