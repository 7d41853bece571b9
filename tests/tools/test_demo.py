"""The CPU demo: a quick run end to end, the mechanism it is built around, and its bookkeeping (the
paired differences and the per-bin clip rates) against hand computations."""

from __future__ import annotations

import argparse
import csv
import math

import pytest
import torch

from openrlhf_band import band_bounds
from openrlhf_band.tools import demo
from openrlhf_band.tools.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    return out


def test_quick_demo_writes_finite_metrics_and_all_three_files(quick):
    rows = list(csv.DictReader((quick / "metrics.csv").open()))
    assert {r["method"] for r in rows} == {"clip", "band-kl"}
    assert sorted({int(r["step"]) for r in rows}) == [0, 5, 10, 15]  # the warm-up point, then every 5 rollouts
    for r in rows:
        for key in ("mean@32", "mean@32_hard", "pass@32", "pass@32_hard", "entropy"):
            assert math.isfinite(float(r[key])), (key, r)
        assert 0.0 <= float(r["mean@32"]) <= float(r["pass@32"]) <= 1.0
    start = [r for r in rows if r["step"] == "0"]
    assert start[0]["mean@32"] == start[1]["mean@32"]  # both methods start from the same checkpoint
    assert (quick / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (quick / "summary.txt").read_text()
    assert "paired differences to clip" in text and "clip rates per old-probability bin" in text
    assert "under the kl band" in text


def _read_rows(path) -> list[dict]:
    """metrics.csv back into the rows format_summary works on (numbers as numbers)."""

    def value(key: str, text: str):
        if key == "method":
            return text
        if key in ("seed", "step"):
            return int(text)
        return float(text) if text else math.nan  # the warm-up row has no clip counts

    return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(path.open())]


def test_the_clip_binds_and_the_band_clips_rare_positive_tokens_less(quick):
    # The regime the demo is built for (seeded, so the same numbers every run): under clip 0.2 most
    # positive-advantage updates of p in [0.01, 0.1) tokens end clipped (0.81 in this run, 0.79 in
    # the full run); the kl band clips far fewer of them (0.51), and its lower bound, which goes to
    # 0 for rare tokens, clips almost none of their negative-advantage updates (clip: 0.36).
    rows = _read_rows(quick / "metrics.csv")
    clip, band = demo.pooled_clip_rates(rows, "clip"), demo.pooled_clip_rates(rows, "band-kl")
    (clip_up, _), (band_up, _) = clip["p0.01-0.1"], band["p0.01-0.1"]
    assert clip_up > 0.6
    assert band_up < clip_up - 0.15
    assert band["p<0.01"][1] < 0.05 < 0.2 < clip["p<0.01"][1]


def test_the_warm_up_leaves_the_fork_token_rare_and_the_rest_easy(quick):
    cfg = demo.DemoConfig(out=str(quick))
    state = torch.load(demo.warm_checkpoint(cfg, 0), weights_only=True)  # the quick run's cached one
    actor = demo.build_actor(cfg, 0)
    actor.model.load_state_dict(state)
    prompts, hard = demo.sample_prompts(256, cfg, torch.Generator().manual_seed(5))
    m = demo.evaluate(actor, prompts, hard, cfg)
    assert m["p_fork_hard"] < 0.2  # rare: where a fixed clip caps the rise at 1.2 p
    assert m["mean@32_hard"] < m["mean@32"] < 0.2


def test_rare_token_rises_to_its_bound_under_clip_and_band(quick):
    cfg = demo.DemoConfig(out=str(quick))
    m = demo.mechanism_check(cfg, torch.load(demo.warm_checkpoint(cfg, 0), weights_only=True))
    assert m["p_old"] < 0.2
    # each rise saturates just past its own bound (steps are small, and the bound stops the gradient)
    assert 1.2 <= m["ratio_clip"] <= 1.2 * 1.06
    assert m["bound_band-kl"] <= m["ratio_band-kl"] <= m["bound_band-kl"] * 1.06
    # and that bound is the kl band's r_up at this p (ground truth: band_bounds is tested against mpmath)
    assert m["bound_band-kl"] == pytest.approx(
        band_bounds(torch.tensor([math.log(m["p_old"])]), "kl", 0.05)[1].item(), rel=1e-3
    )


def test_paired_differences_by_hand():
    rows = [
        {"method": m, "seed": s, "step": t, "x": v}
        for m, s, t, v in [
            ("clip", 0, 10, 1.0), ("clip", 1, 10, 2.0), ("band", 0, 10, 1.5), ("band", 1, 10, 2.1),
            ("clip", 0, 20, 3.0), ("clip", 1, 20, 3.0), ("band", 0, 20, 3.5), ("band", 1, 20, 2.5),
        ]
    ]  # fmt: skip
    mean, sd, n = demo.paired_differences(rows, "band", "x", [10])
    assert n == 2 and mean == pytest.approx(0.3) and sd == pytest.approx(math.sqrt(0.08))
    mean, sd, _ = demo.paired_differences(rows, "band", "x", [10, 20])  # per seed, averaged over the steps
    assert mean == pytest.approx(((0.5 + 0.5) / 2 + (0.1 - 0.5) / 2) / 2)


def test_clip_stats_count_each_bin_and_side_under_the_given_bounds():
    old = torch.log(torch.tensor([[0.005, 0.05, 0.3, 0.9, 0.05, 0.05]]))
    new = old + torch.log(torch.tensor([[3.0, 1.5, 0.5, 1.0, 0.7, 1.1]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    lower, upper = torch.full_like(old, 0.8), torch.full_like(old, 1.2)
    stats = demo.ClipStats()
    stats.add(old, new, adv, mask, lower, upper)
    rates = stats.rates()
    assert rates["clip_up_p<0.01"] == 1.0 and rates["n_pos_p<0.01"] == 1  # r = 3 > 1.2
    assert rates["clip_up_p0.01-0.1"] == 1.0 and rates["n_pos_p0.01-0.1"] == 1  # the masked one is not counted
    assert rates["clip_low_p0.01-0.1"] == 1.0 and rates["n_neg_p0.01-0.1"] == 1  # r = 0.7 < 0.8
    assert rates["clip_low_p0.1-0.5"] == 1.0  # r = 0.5 < 0.8
    assert rates["clip_up_p>=0.5"] == 0.0 and math.isnan(rates["clip_low_p>=0.5"])


def test_presets():
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    full = demo.config_from_args(parser.parse_args(["--full"]))
    assert (full.seeds, full.rollouts, full.methods) == (5, 80, list(demo.METHODS))
    default = demo.config_from_args(parser.parse_args([]))
    assert default.methods == demo.DEFAULT_METHODS and default.workers == 2
    with pytest.raises(ValueError):
        demo.config_from_args(parser.parse_args(["--full", "--quick"]))
