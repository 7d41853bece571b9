"""Roofline estimate of the fused Band loss per variant, from the ahead-of-time resource table.

    python -m openrlhf_band.bench.roofline [bench/results/aot_triton-3.7.1.json] [--target 90] [--variants scripts]

For each forward variant: bytes moved per token (forward + backward, from the variant's inputs and
outputs), float64 SASS instructions per token (the table's static count), and the estimated time per
million tokens on an H200, an A100 and an L40S as max(bytes / HBM bandwidth, f64 instructions /
float64 issue rate). An estimate, not a measurement: no GPU has run this kernel for the project.
Peaks (vendor datasheets; non-tensor float64):
    H200 SXM: 4.8 TB/s HBM3e, 132 SMs x 1.98 GHz x 64 FP64 lanes = 16.7e12 f64 instructions/s (33.5 TFLOP/s)
    A100 SXM 80GB: 2.04 TB/s, 108 x 1.41 GHz x 32 = 4.9e12 (9.7 TFLOP/s)
    L40S: 0.864 TB/s, FP64 at 1/64 of FP32 (91.6 TFLOP/s): 0.72e12 (1.43 TFLOP/s)
"""

from __future__ import annotations

import argparse
import json

PEAKS = {"H200": (4.8e12, 16.7e12), "A100": (2.04e12, 4.9e12), "L40S": (0.864e12, 0.72e12)}
# the four flags, one bool plane each (openrlhf_band.ops.band_loss.FORWARD_FLAG_BYTES_PER_TOKEN; this module
# stays free of torch and triton, tests/bench/test_roofline.py holds the two equal)
FLAG_BYTES_PER_TOKEN = 4


def bytes_per_token(variant: str) -> int:
    """Forward loads + stores and backward traffic of one token, as the launcher passes them."""
    logp = 2 if variant.endswith(("bf16", "fp16")) else 4
    bare = "-bare-" in variant  # no mask, no bounds returned
    loads = logp + 4 + 4 + (0 if bare else 1)  # log_probs, old_log_probs and advantages (float32), mask (1 byte)
    loads += 4 if "per-token" in variant else 0  # the radius, float32 per token (per sequence: ~0)
    loads += 8 if "bounds" in variant else 0  # given lower / upper
    stores = 4 + 4 + FLAG_BYTES_PER_TOKEN + (0 if bare else 8)  # loss, coefficient, flags, returned bounds
    backward = 4 + 4 + logp  # coefficient, upstream, gradient
    return loads + stores + backward


def roofline_lines(rows: list[dict], target: str = "90", variants: list[str] | None = None) -> list[str]:
    """The markdown table (lines) of every forward variant of `rows` (an AOT table's) compiled for
    `target`, optionally only those whose name contains one of `variants`."""
    rows = [r for r in rows if r["target"] == target and r["ok"]]
    rows = [r for r in rows if not variants or any(p in r["variant"] for p in variants)]
    lines = ["| variant | B/token | f64/token |" + "".join(f" {g} us/M tok (bound) |" for g in PEAKS)]
    lines.append("|" + "---|" * (3 + len(PEAKS)))
    for r in rows:
        if not r["variant"].startswith("fwd"):
            continue
        nbytes, f64 = bytes_per_token(r["variant"]), r["f64_per_token"]
        cells = []
        for bandwidth, rate in PEAKS.values():
            memory_us, compute_us = nbytes * 1e6 / bandwidth * 1e6, f64 * 1e6 / rate * 1e6
            bound = "memory" if memory_us >= compute_us else f"f64 x{compute_us / memory_us:.1f}"
            cells.append(f" {max(memory_us, compute_us):.1f} ({bound}) |")
        lines.append(f"| {r['variant']} | {nbytes} | {f64:g} |" + "".join(cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table", nargs="?", default="bench/results/aot_triton-3.7.1.json")
    parser.add_argument("--target", default="90")
    parser.add_argument("--variants", nargs="+", default=None, help="only variants whose name contains one of these")
    args = parser.parse_args()
    print("\n".join(roofline_lines(json.load(open(args.table))["rows"], args.target, args.variants)))


if __name__ == "__main__":
    main()
