"""Benchmarks write under out/bench/ unless asked for another folder: the committed tables in
bench/results/ change only with `--results-dir bench/results` (or OPENRLHF_BAND_BENCH_DIR; `aot --out`)."""

from __future__ import annotations

import argparse
import json

from openrlhf_band.bench import aot
from openrlhf_band.bench.common import DEFAULT_RESULTS_DIR, results_dir
from openrlhf_band.tools.cli import BENCHMARKS, build_parser, main

SMALL_BOUNDS = ["bench", "bounds", "--tokens", "4096", "--repeats", "1", "--device", "cpu"]


def test_the_default_is_out_bench_not_the_committed_tables(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENRLHF_BAND_BENCH_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_RESULTS_DIR == "out/bench"
    assert results_dir().resolve() == (tmp_path / "out" / "bench").resolve()
    assert main(SMALL_BOUNDS) == 0
    assert json.loads((tmp_path / "out" / "bench" / "bounds_cpu.json").read_text())["timings"]
    assert not (tmp_path / "bench").exists()
    parser = argparse.ArgumentParser()
    aot.add_arguments(parser)
    assert parser.parse_args([]).out == DEFAULT_RESULTS_DIR


def test_results_dir_sends_a_benchmark_elsewhere(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENRLHF_BAND_BENCH_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL_BOUNDS, "--results-dir", "elsewhere"]) == 0
    assert (tmp_path / "elsewhere" / "bounds_cpu.json").exists() and not (tmp_path / "out").exists()


def test_every_benchmark_takes_results_dir():
    parser = build_parser()
    for what in BENCHMARKS:
        args = parser.parse_args(["bench", what, "--results-dir", "bench/results"])
        assert args.results_dir == "bench/results", what
