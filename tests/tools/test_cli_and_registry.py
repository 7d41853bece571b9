"""The CLI's look-before-you-train commands, the bounds benchmark's output, and the registry."""

from __future__ import annotations

import json
import math

import band_exact
import pytest
import torch

from openrlhf_band import DIVERGENCES, band_bounds, get_divergence
from openrlhf_band.band.divergences import _REGISTRY, Divergence, register_divergence
from openrlhf_band.tools.cli import main


def test_registry_lists_the_five_divergences_with_kl_first():
    assert DIVERGENCES[0] == "kl"
    assert {"kl", "tv", "chi2", "reverse_kl", "hellinger"} <= set(DIVERGENCES)  # the paper's five stay


@pytest.mark.parametrize("name", DIVERGENCES)
def test_registered_generator_is_the_papers_f(name):
    # f(1) = 0 and f matches the oracle's independent definition at a few points
    f = get_divergence(name).generator
    assert f(1.0) == 0.0
    for u in (0.3, 1.7, 4.0):
        assert f(u) == pytest.approx(float(band_exact.f(name, u)), rel=1e-12)


def test_unknown_divergence_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: chi2, hellinger, kl, reverse_kl, tv"):
        get_divergence("js")


def test_adding_a_divergence_is_one_entry():
    # a scaled chi2 (f = 2 (u-1)^2) is a valid f-divergence; its roots are chi2's at delta / 2
    def closed_form(x, p, one_minus_p, delta):
        half = torch.sqrt(delta / 2 * one_minus_p / p)
        return 1 - half, 1 + half

    try:
        register_divergence(
            Divergence(
                name="chi2x2",
                description="test",
                generator=lambda u: 2 * (u - 1) ** 2,
                g_at_upper_edge=lambda x, p, q1: 2 * q1 / p,
                g_at_lower_edge=lambda x, p, q1: 2 * p / q1,
                lower_at_p_one=lambda delta: 1.0,
                closed_form=closed_form,
            )
        )
        log_p = torch.log(torch.tensor([0.01, 0.3, 0.9], dtype=torch.float64))
        ours = band_bounds(log_p, "chi2x2", 0.1)
        chi2 = band_bounds(log_p, "chi2", 0.05)
        torch.testing.assert_close(ours, chi2)  # two float64 closed forms: float64 rounding << rtol 1e-7
        with pytest.raises(ValueError, match="already registered"):
            register_divergence(_REGISTRY["chi2x2"])
    finally:
        _REGISTRY.pop("chi2x2", None)


def test_bounds_command_prints_band_and_clip_columns(capsys):
    assert main(["bounds", "--divergence", "kl", "--delta", "0.05", "--p", "0.001", "0.01", "0.1", "0.5", "0.9"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "max q" in lines[1]
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 5
    for row in rows:
        p, r_low, r_up, band_q, clip_q, clip_higher_q = map(float, row)
        low, up, _, _ = band_exact.exact_bounds("kl", math.log(p), 0.05)
        assert r_up == pytest.approx(float(up), rel=1e-5)
        assert r_low == pytest.approx(float(low), rel=1e-5, abs=1e-12)
        assert band_q == pytest.approx(min(float(up) * p, 1.0), rel=1e-5)
        assert clip_q == pytest.approx(min(1.2 * p, 1.0), rel=1e-5)
        assert clip_higher_q == pytest.approx(min(1.28 * p, 1.0), rel=1e-5)


def test_bounds_command_rejects_bad_input(capsys):
    assert main(["bounds", "--delta", "-1"]) == 2
    assert "delta must be a positive finite number" in capsys.readouterr().err
    assert main(["bounds", "--p", "1.5"]) == 2


def test_plot_bounds_writes_a_png(tmp_path):
    out = tmp_path / "bounds.png"
    assert main(["plot-bounds", "--delta", "0.05", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_bounds_writes_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENRLHF_BAND_BENCH_DIR", str(tmp_path))
    assert main(["bench", "bounds", "--tokens", "4096", "--repeats", "1", "--device", "cpu"]) == 0
    result = json.loads((tmp_path / "bounds_cpu.json").read_text())
    expected = {f"band-{d}" for d in DIVERGENCES} | {f"band-{d}-pt" for d in DIVERGENCES}
    expected |= {"clip", "authors-kl", "authors-chi2"}
    assert set(result["timings"]) == expected
    assert all(t["median_ms"] > 0 for t in result["timings"].values())
    # our float32 kl path is within float32 resolution of the float64 path; the authors' is not
    assert result["max_rel_error_vs_float64"]["band-kl"] < 1e-6
    assert result["max_rel_error_vs_float64"]["authors-kl"] > 1e-3
    assert "targets" in capsys.readouterr().out


NOISE = ("The pynvml package is deprecated", "Failed to load CPU gemm_4bit_forward", "Setting accelerator to CPU")


@pytest.mark.parametrize(
    "argv",
    [
        ["bounds", "--p", "0.1"],
        ["check-args", "--", "--actor.model_name_or_path", "m", "--loss", "band", "--reward.remote_url", "r.py"],
    ],
    ids=["bounds", "check-args"],
)
def test_start_up_prints_no_third_party_noise(argv):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "openrlhf_band.tools.cli", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines() if any(n in line for n in NOISE)], done.stderr


def test_real_errors_still_show():
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "check-args", "--", "--loss", "band", "--band_delta", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "delta must be a positive finite number" in done.stderr
