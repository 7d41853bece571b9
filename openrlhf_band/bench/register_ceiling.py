"""The forward kernel with a register ceiling for ptxas (Triton's `maxnreg` = 65,536 / threads per program: 128 at
16 warps, 255 at 8) on every bounds kind, against no ceiling on any (ptxas' own register budget), side by side
on the same variants and targets: registers, spills and blocks per SM of each (columns *_ceiling and *_ptxas).
The evidence for which kinds the launcher gives the ceiling (band_loss._CEILING_KINDS).

    python -m openrlhf_band.bench.register_ceiling [--targets 80 89 90 100 120] [--out out/bench] [--jobs 2]

Writes aot_register_ceiling_triton-<version>.json / .csv under --out (bench/results: the committed table) and
prints the variants whose registers, spills or occupancy differ. No GPU needed (openrlhf-band aot's compile).
The committed 3.7.1 table was written by this command's first revision, which set the same two launches by
replacing the launcher's option function instead of its kind list (the same maxnreg either way).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from openrlhf_band.bench import aot
from openrlhf_band.ops import band_loss

FIELDS = ("registers", "spill_stores_B", "spill_loads_B", "blocks_per_sm", "num_warps")


SHIPPED_KINDS = band_loss._CEILING_KINDS
ALL_KINDS = band_loss.BOUNDS_KINDS


def launch_with(ceiling: bool) -> None:
    """The launcher's own rule with the ceiling on every kind (True) or on none (False); checked on a launch."""
    band_loss._CEILING_KINDS = ALL_KINDS if ceiling else ()
    launch = aot.launch_variant(aot.Variant("check", "fwd", "kl", "scalar", "scripts", "fp32"))
    if ("maxnreg" in launch.kwargs) != ceiling:
        raise RuntimeError(f"the launcher did not take the ceiling setting {ceiling}: {launch.kwargs}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=[str(t) for t in aot.DEFAULT_TARGETS])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if refusal := aot.interpreter_refusal("register_ceiling"):
        print(refusal)
        return 2
    import triton

    start = time.perf_counter()
    forwards = [v.name for v in aot.variants() if v.kernel == "fwd"]
    # the workers fork from here, so they see the launcher as set just before
    launch_with(ceiling=True)
    with_rows = aot.run_check(args.targets, forwards, args.jobs)
    launch_with(ceiling=False)
    without_rows = aot.run_check(args.targets, forwards, args.jobs)
    band_loss._CEILING_KINDS = SHIPPED_KINDS
    rows = []
    for w, wo in zip(with_rows, without_rows):
        assert (w.variant, w.target) == (wo.variant, wo.target)
        row = {"variant": w.variant, "target": w.target, "ok": w.ok and wo.ok}
        row |= {f"{f}_ceiling": getattr(w, f) for f in FIELDS} | {f"{f}_ptxas": getattr(wo, f) for f in FIELDS}
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"aot_register_ceiling_triton-{triton.__version__}"
    differ = [r for r in rows if any(r[f"{f}_ceiling"] != r[f"{f}_ptxas"] for f in FIELDS)]
    spills = {
        k: sum(1 for r in rows if r[f"spill_stores_B_{k}"] or r[f"spill_loads_B_{k}"]) for k in ("ceiling", "ptxas")
    }
    report = {"triton": triton.__version__, "targets": args.targets, "compiles": 2 * len(rows),
              "ceiling_rule": "maxnreg = min(255, 65536 // (32 x num_warps)) on every kind; *_ptxas: no maxnreg",
              "seconds": round(time.perf_counter() - start, 1), "spilling_variants": spills,
              "differ": len(differ), "rows": rows}  # fmt: skip
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} (variant, target) pairs; spilling: {spills['ptxas']} with ptxas' own ceiling, "
          f"{spills['ceiling']} with the ceiling on every kind; {len(differ)} differ:")  # fmt: skip
    for r in differ:
        changed = [f for f in FIELDS if r[f"{f}_ceiling"] != r[f"{f}_ptxas"]]
        cells = ", ".join(f"{f} {r[f + '_ptxas']} -> {r[f + '_ceiling']}" for f in changed)
        print(f"  {r['variant']}@{r['target']}: {cells}")
    print(f"wrote {stem}.json and .csv ({report['seconds']} s)")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
