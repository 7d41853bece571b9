"""The tables of docs/band_family.md from a demo run's metrics.csv (default studies/band_family/results/metrics.csv).

    .venv/bin/python studies/band_family/tables.py [metrics.csv] [--check docs/demo_metrics.csv]

Prints markdown: final absolute values (mean +- sd over seeds), paired differences to clip and to
band-kl, the share of band-kl's mean@32 gain each method keeps, the entropy test (|paired entropy
difference to clip| <= its sd), floor vs the ablation, and per-bin clip rates. With --check, the
rows of methods also in that file are compared with it on their common columns (the runs are
deterministic: the same method and seed give the same numbers).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

from openrlhf_band.tools import demo

KEYS = ("mean@32", "pass@32", "entropy")


def read(path: Path) -> list[dict]:
    def value(key, text):
        if key == "method":
            return text
        if key in ("seed", "step"):
            return int(text)
        return float(text) if text else math.nan

    return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(path.open())]


def per_seed(rows, method, key, steps, baseline=None):
    """Per seed: the mean over `steps` of method's value, minus the baseline's if given."""
    by = {(r["method"], r["seed"], r["step"]): r[key] for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["method"] == method})
    out = []
    for s in seeds:
        v = statistics.fmean(by[(method, s, t)] for t in steps)
        if baseline is not None:
            v -= statistics.fmean(by[(baseline, s, t)] for t in steps)
        out.append(v)
    return out


def ms(values, signed=False):
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return f"{mean:+.3f} +- {sd:.3f}" if signed else f"{mean:.3f} +- {sd:.3f}"


def absolute_table(rows: list[dict], methods: list[str], final: list[int]) -> list[str]:
    """Final absolute values, mean +- sd over seeds: one markdown row per method."""
    lines = ["| method | mean@32 | pass@32 | entropy (nats) |", "|---|---|---|---|"]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(ms(per_seed(rows, m, k, final)) for k in KEYS) + " |")
    return lines


def band_kl_gain(rows: list[dict], final: list[int]) -> float:
    """band-kl's final mean@32 gain over clip, mean over seeds (the 'share' column's denominator)."""
    return statistics.fmean(per_seed(rows, "band-kl", "mean@32", final, "clip"))


def paired_table(rows: list[dict], methods: list[str], final: list[int]) -> list[str]:
    """Paired to clip and to band-kl, final, with the share of band-kl's gain and the entropy test."""
    gain = band_kl_gain(rows, final)
    lines = ["| method | mean@32 - clip | pass@32 - clip | entropy - clip | share of band-kl gain | entropy kept | "
             "mean@32 - band-kl | pass@32 - band-kl | entropy - band-kl |", "|---" * 9 + "|"]  # fmt: skip
    for m in methods:
        if m == "clip":
            continue
        to_clip = [per_seed(rows, m, k, final, "clip") for k in KEYS]
        ent = to_clip[2]
        kept = abs(statistics.fmean(ent)) <= statistics.stdev(ent)
        share = statistics.fmean(to_clip[0]) / gain
        to_band = (
            [ms(per_seed(rows, m, k, final, "band-kl"), signed=True) for k in KEYS] if m != "band-kl" else ["", "", ""]
        )
        lines.append(f"| {m} | " + " | ".join(ms(v, signed=True) for v in to_clip) + f" | {share:.2f} | "
                     f"{'yes' if kept else 'no'} | " + " | ".join(to_band) + " |")  # fmt: skip
    return lines


def ablation_table(rows: list[dict], methods: list[str], final: list[int]) -> list[str]:
    """The floored settings paired to the ablation band-kl+clip-low, final."""
    lines = ["| method | mean@32 | pass@32 | entropy |", "|---|---|---|---|"]
    for m in methods:
        if m.startswith("band-kl-floor") or m == "band-kl-entropy-floor":
            lines.append(f"| {m} | " + " | ".join(ms(per_seed(rows, m, k, final, "band-kl+clip-low"), True)
                                                  for k in KEYS) + " |")  # fmt: skip
    return lines


def clip_rates_table(rows: list[dict], methods: list[str]) -> list[str]:
    """Clip rates per old-probability bin over all of training, pooled over seeds (upper | lower)."""
    lines = ["| method | " + " | ".join(name for *_, name in demo.BINS) + " |", "|---|" + "---|" * len(demo.BINS)]
    for m in methods:
        rates = demo.pooled_clip_rates(rows, m)
        lines.append(f"| {m} | " + " | ".join(f"{u:.2f} \\| {lo:.2f}" for u, lo in rates.values()) + " |")
    return lines


def token_shares(rows: list[dict], methods: list[str]) -> list[str]:
    """Floor-only clips and DPPO truncations, share of all tokens over training (mean over seeds and steps)."""
    lines = []
    for m in methods:
        for key in ("floor_frac", "truncated_frac"):
            values = [r.get(key, math.nan) for r in rows if r["method"] == m and r["step"] > 0]
            values = [v for v in values if not math.isnan(v)]
            if values:
                lines.append(f"- {m}: {key} {statistics.fmean(values):.4f}")
    return lines


def check_line(rows: list[dict], ref: list[dict], reference: str) -> str:
    """How many of the rows that `ref` also holds (same method, seed, step) equal it on their common columns."""
    ref_by = {(r["method"], r["seed"], r["step"]): r for r in ref}
    common = sorted(set(ref[0]) & set(rows[0]))
    shared = [r for r in rows if (r["method"], r["seed"], r["step"]) in ref_by]
    same = [
        all(
            (r[k] == ref_by[(r["method"], r["seed"], r["step"])][k])
            or (isinstance(r[k], float) and math.isnan(r[k]) and math.isnan(ref_by[(r["method"], r["seed"],
                                                                                    r["step"])][k]))
            for k in common
        )
        for r in shared
    ]  # fmt: skip
    names = sorted({r["method"] for r in shared})
    return (f"check against {reference}: {sum(same)} of {len(shared)} shared rows ({', '.join(names)}) "
            f"equal on the {len(common)} common columns")  # fmt: skip


def methods_and_final(rows: list[dict]) -> tuple[list[str], list[int]]:
    """The run's methods in order and its final steps (the last three evaluations)."""
    return list(dict.fromkeys(r["method"] for r in rows)), sorted({r["step"] for r in rows})[-3:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv", nargs="?", default="studies/band_family/results/metrics.csv")
    parser.add_argument("--check", default=None)
    args = parser.parse_args()
    rows = read(Path(args.csv))
    methods, final = methods_and_final(rows)
    seeds = len({r["seed"] for r in rows})
    print(f"{seeds} seeds, final = mean of rollouts {final}\n")

    print("\n".join(absolute_table(rows, methods, final)))

    gain = band_kl_gain(rows, final)
    print("\npaired to clip (method - clip) and to band-kl (method - band-kl), final, mean +- sd over seeds;")
    print(f"'share' = the method's mean@32 gain over clip / band-kl's ({gain:+.3f}); 'entropy kept' = "
          "|entropy - clip| <= its sd\n")  # fmt: skip
    print("\n".join(paired_table(rows, methods, final)))

    if "band-kl+clip-low" in methods:
        print("\npaired to the ablation band-kl+clip-low (method - ablation), final:\n")
        print("\n".join(ablation_table(rows, methods, final)))

    print("\nclip rates per old-probability bin over all of training, pooled over seeds "
          "(upper among A > 0 | lower among A < 0):\n")  # fmt: skip
    print("\n".join(clip_rates_table(rows, methods)))

    print("\nfloor-only clips and DPPO truncations, share of all tokens over training (mean over seeds and steps):\n")
    for line in token_shares(rows, methods):
        print(line)

    if args.check:
        print("\n" + check_line(rows, read(Path(args.check)), args.check))


if __name__ == "__main__":
    main()
