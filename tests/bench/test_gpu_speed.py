"""The GPU speed step (`python3 -m openrlhf_band.bench.gpu_speed`): its judging at the bars' edges, the bytes
per token it divides by, and its dry run end to end on CPU in Triton's interpreter (in a subprocess: the
interpreter is chosen when `openrlhf_band.ops.band_loss` is first imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openrlhf_band.bench.gpu_speed import (
    BANDWIDTH_FRACTION_LIMIT,
    FULL_RATIO_LIMIT,
    PER_TOKEN_RATIO_LIMIT,
    judge,
    kernel_bytes_per_token,
)

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 4_194_304
COPY_BYTES_MOVED = 2 * 256 * 2**20
COPY_MS = 0.25  # ~2.1 TB/s
BYTES = {"forward-kl": 21, "forward-chi2": 21, "forward-kl-pt": 25, "backward": 12}


def _raw_ms(name: str, fraction: float) -> float:
    """The kernel time at which `name` moves `fraction` of the copy's bytes per second."""
    copy_bytes_per_s = COPY_BYTES_MOVED / (COPY_MS / 1e3)
    return BYTES[name] * TOKENS / (fraction * copy_bytes_per_s) * 1e3


def figures(kl=1.0, chi2=1.0, per_token=1.0, clip=(1.0, 1.0), forward_fraction=0.8, backward_fraction=0.8):
    """Synthetic figures at one token count: full entry-point times in units of the clip's, raw kernels at the
    given fractions of the copy's bandwidth."""
    raw = {name: _raw_ms(name, forward_fraction) for name in ("forward-kl", "forward-chi2", "forward-kl-pt")}
    raw["backward"] = _raw_ms("backward", backward_fraction)
    full = {"fused-kl": kl, "fused-chi2": chi2, "fused-kl-pt": per_token, "ppo-clip-before": clip[0],
            "ppo-clip-after": clip[1]}  # fmt: skip
    return {
        "tokens": [TOKENS],
        "bandwidth_tokens": TOKENS,
        "raw_timer": "cudagraph",
        "entry_ms": {str(TOKENS): {"forward": dict(full), "full": full}},
        "raw_ms": {str(TOKENS): {"do_bench": {k: 2 * v for k, v in raw.items()}, "cudagraph": raw}},
        "bytes_per_token": BYTES,
        "copy_ms": {"do_bench": 2 * COPY_MS, "cudagraph": COPY_MS},
        "copy_bytes_moved": COPY_BYTES_MOVED,
    }


def verdicts(figs) -> dict[str, str]:
    return {c["name"].split(" @ ")[0]: c["verdict"] for c in judge(figs)}


def test_the_bars_are_the_issues():
    assert (FULL_RATIO_LIMIT, PER_TOKEN_RATIO_LIMIT, BANDWIDTH_FRACTION_LIMIT) == (1.3, 1.5, 0.60)


def test_scalar_radius_ratio_passes_at_1_29_and_fails_at_1_31():
    assert verdicts(figures(kl=1.29, chi2=1.29))["full fused-kl / ppo-clip"] == "PASS"
    assert verdicts(figures(kl=1.29, chi2=1.29))["full fused-chi2 / ppo-clip"] == "PASS"
    assert verdicts(figures(kl=1.31))["full fused-kl / ppo-clip"] == "FAIL"
    assert verdicts(figures(chi2=1.31))["full fused-chi2 / ppo-clip"] == "FAIL"
    assert set(verdicts(figures(kl=1.31)).values()) == {"PASS", "FAIL"}  # only that check fails


def test_per_token_ratio_passes_at_1_49_and_fails_at_1_51():
    assert verdicts(figures(per_token=1.49))["full fused-kl-pt / ppo-clip"] == "PASS"
    assert verdicts(figures(per_token=1.51))["full fused-kl-pt / ppo-clip"] == "FAIL"


def test_bandwidth_fails_at_0_59_and_passes_at_0_61_of_the_copy():
    low = verdicts(figures(forward_fraction=0.59, backward_fraction=0.59))
    high = verdicts(figures(forward_fraction=0.61, backward_fraction=0.61))
    for name in ("raw forward-kl bandwidth / copy", "raw backward bandwidth / copy"):
        assert low[name] == "FAIL" and high[name] == "PASS"
    (backward,) = [c for c in judge(figures(backward_fraction=0.61)) if c["name"].startswith("raw backward")]
    assert backward["value"] == pytest.approx(0.61)  # with the raw timer's copy (cudagraph), not do_bench's


def test_a_drifting_clip_baseline_is_marked_and_judged_on_the_mean():
    checks = judge(figures(kl=1.4, clip=(1.0, 1.2)))  # mean 1.1: 1.4 / 1.1 = 1.27
    (kl,) = [c for c in checks if c["name"].startswith("full fused-kl /")]
    assert kl["stability"] == "UNSTABLE" and kl["verdict"] == "PASS"
    assert kl["value"] == pytest.approx(1.4 / 1.1) and kl["clip_drift"] == pytest.approx(0.2)
    steady = judge(figures(clip=(1.0, 1.05)))
    assert {c["stability"] for c in steady if "stability" in c} == {"STABLE"}


def test_every_check_has_the_fields_the_orchestrator_reads():
    for check in judge(figures()):
        assert {"name", "verdict", "value", "limit", "rule"} <= set(check)
        assert check["verdict"] == "PASS"


def test_kernel_bytes_per_token_follows_the_tensors():
    flags = 4  # clipped_upper, clipped_lower, dual_clipped, floor_clipped: a bool byte each
    rows, cols = 3, 47
    log_probs = torch.zeros(rows, cols)
    old = torch.zeros(rows, cols)
    per_sequence = torch.zeros(rows, 1)
    mask = torch.ones(rows, cols, dtype=torch.bool)
    base = 4 + 4 + 0 + 1 + 0 + 4 + 4 + flags
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, None) == 9 + 8 + flags == base
    assert kernel_bytes_per_token(log_probs, old, torch.zeros(rows), mask, None) == base  # (B,) per sequence
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, torch.full((rows, cols), 0.05)) == base + 4
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, torch.full((rows, 1), 0.05)) == base
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, 0.05) == base
    assert kernel_bytes_per_token(log_probs, old, torch.zeros(rows, cols), mask, None) == base + 4
    assert kernel_bytes_per_token(log_probs, old, per_sequence.expand(rows, cols), mask, None) == base  # stride 0
    assert kernel_bytes_per_token(log_probs.bfloat16(), old, per_sequence, mask, None) == base - 2
    assert kernel_bytes_per_token(log_probs, old, per_sequence, None, None) == base - 1
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, None, return_bounds=True) == base + 8
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, None, forward=False) == 12
    assert kernel_bytes_per_token(log_probs.bfloat16(), old, per_sequence, mask, None, forward=False) == 4 + 4 + 2
    stride0 = torch.ones(()).expand(rows, cols)  # the upstream of loss.sum(): nothing per token to read
    assert kernel_bytes_per_token(log_probs, old, per_sequence, mask, None, forward=False, upstream=stride0) == 8


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "openrlhf_band.bench.gpu_speed", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
    )  # fmt: skip


def test_dry_run_on_cpu_end_to_end(tmp_path):
    proc = _run("--dry-run", "--device", "cpu", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "speed.json").read_text())
    assert report["step"] == "speed" and report["verdict"] == "NOT_JUDGED" and report["dry_run"] is True
    assert report["timer"] == "perf_counter" and report["device"] == "cpu"
    assert {"torch", "triton"} <= set(report["versions"])
    names = [c["name"] for c in report["checks"]]
    assert len(names) == 3 * 2 + 2, names  # three ratio checks at two token counts, two bandwidth checks
    for check in report["checks"]:
        assert check["verdict"] == "NOT_JUDGED" and check["would_be"] in ("PASS", "FAIL")
        assert {"value", "limit", "rule"} <= set(check)
    figs = report["figures"]
    assert figs["tokens"] == [2048, 4096] and figs["raw_timer"] == "perf_counter"
    assert figs["bytes_per_token"]["forward-kl"] == 17 + 4
    assert figs["bytes_per_token"]["forward-kl-pt"] == 21 + 4
    assert figs["bytes_per_token"]["backward"] == 12
    assert figs["entry_ms"]["2048"]["full"]["fused-kl"] > 0
    assert [c["verdict"] for c in judge(figs)] == [c["would_be"] for c in report["checks"]]


def test_a_cpu_without_dry_run_is_refused(tmp_path):
    proc = _run("--device", "cpu", "--out", str(tmp_path), timeout=120)
    assert proc.returncode not in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "refusing to time the kernel on a CPU" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "speed.json").exists()
