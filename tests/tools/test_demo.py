"""The CPU demo: a quick run end to end, and the mechanism it is built to show."""

from __future__ import annotations

import csv
import math

import pytest

from openrlhf_band import band_bounds
from openrlhf_band.tools.cli import main
from openrlhf_band.tools.demo import DemoConfig, mechanism_check


def test_quick_demo_writes_finite_metrics_and_both_files(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    methods = {r["method"] for r in rows}
    assert methods == {"clip", "clip-higher", "band-kl", "band-tv", "band-chi2"}
    assert len(rows) == 5 * 25  # one seed, 25 rollouts per method
    for r in rows:
        for key in ("sampled_reward", "expected_reward", "entropy", "p_rare_correct", "clip_frac"):
            assert math.isfinite(float(r[key])), (key, r)
        assert 0.0 <= float(r["expected_reward"]) <= 1.0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "final reward" in printed and "under the kl band" in printed


def test_rare_token_rises_to_its_bound_under_clip_and_band():
    m = mechanism_check(DemoConfig(), seed=1)
    assert m["p_old"] < 0.1  # the warm-up left the correct answer rare
    # each rise saturates just past its own bound (steps are small, and the bound stops the gradient)
    assert 1.2 <= m["ratio_clip"] <= 1.2 * 1.06
    assert m["bound_band-kl"] <= m["ratio_band-kl"] <= m["bound_band-kl"] * 1.06
    # so the band lets the rare good token rise more, by about the ratio of the upper bounds
    assert m["ratio_band-kl"] / m["ratio_clip"] == pytest.approx(m["bound_band-kl"] / 1.2, rel=0.08)
    # and that bound is the kl band's r_up at this p (ground truth: band_bounds is tested against mpmath)
    import torch

    assert m["bound_band-kl"] == pytest.approx(
        band_bounds(torch.tensor([math.log(m["p_old"])]), "kl", 0.05)[1].item(), rel=0.02
    )
