"""The tables of docs/objectives.md's study from a demo run of the objectives, merged with the band
family's committed rows of band-kl and band-kl-floor (the same demo, seeds and warm-ups).

    .venv/bin/python studies/objectives/tables.py RUN/metrics.csv [--write studies/objectives/results/metrics.csv]

The run must include `clip`: its rows must equal the band family's clip rows on every common column
(the demo is deterministic on one machine), else the merge is refused, since pairing across runs is
only sound if the same seed gives the same numbers. Prints markdown: final absolute values (mean +- sd
over seeds), paired differences to clip, to band-kl and between CISPO's two bounds, and per-bin clip
rates.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAND_FAMILY = ROOT / "studies" / "band_family"
_spec = importlib.util.spec_from_file_location("band_family_tables", BAND_FAMILY / "tables.py")
band_family = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(band_family)
read, per_seed, ms, KEYS = band_family.read, band_family.per_seed, band_family.ms, band_family.KEYS

FROM_BAND_FAMILY = ("band-kl", "band-kl-floor")
ORDER = ("clip", "band-kl", "band-kl-floor", "band-kl-cispo", "cispo", "sapo", "gmpo", "clip-cov", "kl-cov")


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def merged(run_csv: Path) -> list[dict]:
    rows = read(run_csv)
    family = read(BAND_FAMILY / "results" / "metrics.csv")
    ours = {(r["seed"], r["step"]): r for r in rows if r["method"] == "clip"}
    theirs = {(r["seed"], r["step"]): r for r in family if r["method"] == "clip"}
    if not ours or set(ours) != set(theirs):
        raise SystemExit(f"the run's clip rows {sorted(ours)[:3]}... do not cover the band family's: cannot pair")
    common = sorted(set(rows[0]) & set(family[0]) - {"method", "seed", "step"})
    differ = [(key, k) for key in ours for k in common if not _same(ours[key][k], theirs[key][k])]
    if differ:
        raise SystemExit(f"clip differs from the band family's run at {differ[:3]}: not the same demo, no pairing")
    rows += [r for r in family if r["method"] in FROM_BAND_FAMILY]
    rank = {m: i for i, m in enumerate(ORDER)}
    return sorted(rows, key=lambda r: (rank.get(r["method"], len(ORDER)), r["method"], r["seed"], r["step"]))


PAIRS = [("band-kl-cispo", "cispo"), ("band-kl-floor", "cispo"), ("band-kl-floor", "clip-cov"),
         ("band-kl-floor", "kl-cov"), ("band-kl-floor", "sapo"), ("band-kl-floor", "gmpo")]  # fmt: skip


def load(path: Path) -> list[dict]:
    """A run's rows, merged with the band family's (a run without band-kl), or a merged file as it is."""
    return merged(path) if "band-kl" not in {r["method"] for r in read(path)} else read(path)


def paired_table(rows: list[dict], methods: list[str], final: list[int]) -> list[str]:
    """Paired differences to clip and to band-kl, final, mean +- sd over seeds: one markdown row per method."""
    lines = ["| method | mean@32 - clip | pass@32 - clip | entropy - clip | mean@32 - band-kl | pass@32 - band-kl | "
             "entropy - band-kl |", "|---" * 7 + "|"]  # fmt: skip
    for m in methods:
        if m == "clip":
            continue
        to_clip = [ms(per_seed(rows, m, k, final, "clip"), signed=True) for k in KEYS]
        to_band = [""] * 3
        if m != "band-kl":
            to_band = [ms(per_seed(rows, m, k, final, "band-kl"), signed=True) for k in KEYS]
        lines.append(f"| {m} | " + " | ".join(to_clip + to_band) + " |")
    return lines


def head_to_head_table(rows: list[dict], methods: list[str], final: list[int]) -> list[str]:
    """The pairs of PAIRS present in the run, final (first - second)."""
    lines = ["| pair | mean@32 | pass@32 | entropy |", "|---|---|---|---|"]
    for a, b in PAIRS:
        if a in methods and b in methods:
            lines.append(f"| {a} - {b} | " + " | ".join(ms(per_seed(rows, a, k, final, b), True) for k in KEYS) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv", nargs="?", default=str(ROOT / "studies" / "objectives" / "results" / "metrics.csv"))
    parser.add_argument("--write", default=None, help="write the merged rows here (metrics.csv)")
    args = parser.parse_args()
    rows = load(Path(args.csv))
    if args.write:
        fieldnames = list(dict.fromkeys(k for r in rows for k in r))
        with open(args.write, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fieldnames, restval="")
            writer.writeheader()
            writer.writerows(rows)  # a missing column is empty, a nan "nan", as the demo writes them
    methods, final = band_family.methods_and_final(rows)
    seeds = len({r["seed"] for r in rows})
    print(f"{seeds} seeds, final = mean of rollouts {final}\n")
    print("\n".join(band_family.absolute_table(rows, methods, final)))

    print("\npaired differences, final, mean +- sd over seeds (same seed, warm-up, prompts and sampling noise):\n")
    print("\n".join(paired_table(rows, methods, final)))

    print("\nhead to head, final (first - second):\n")
    print("\n".join(head_to_head_table(rows, methods, final)))

    print("\nclip rates per old-probability bin over all of training, pooled over seeds (upper among A > 0 | lower "
          "among A < 0; SAPO and KL-Cov have no interval):\n")  # fmt: skip
    print("\n".join(band_family.clip_rates_table(rows, methods)))


if __name__ == "__main__":
    main()
