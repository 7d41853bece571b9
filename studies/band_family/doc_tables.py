"""The tables of docs/band_family.md and docs/demo.md (studies/docs_tables.py renders them).

The band family's four tables are what studies/band_family/tables.py prints from
studies/band_family/results/metrics.csv. The demo's two are computed from the committed full run,
docs/demo_metrics.csv, with the demo's own report functions (openrlhf_band.tools.demo:
paired_differences at the steps DemoConfig.early_middle_final picks, pooled_clip_rates): the numbers
of docs/demo_summary.txt, as markdown.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from openrlhf_band.tools import demo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAMILY_CSV = HERE / "results" / "metrics.csv"
DEMO_CSV = ROOT / "docs" / "demo_metrics.csv"
FAMILY_SOURCE = "studies/band_family/results/metrics.csv (studies/band_family/tables.py)"
DEMO_SOURCE = "docs/demo_metrics.csv (the numbers of docs/demo_summary.txt)"

_spec = importlib.util.spec_from_file_location("band_family_tables_for_docs", HERE / "tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)


def _family() -> tuple[list[dict], list[str], list[int]]:
    rows = tables.read(FAMILY_CSV)
    return (rows, *tables.methods_and_final(rows))


def family_absolute() -> tuple[str, str]:
    rows, methods, final = _family()
    return "\n".join(tables.absolute_table(rows, methods, final)), FAMILY_SOURCE


def family_paired() -> tuple[str, str]:
    rows, methods, final = _family()
    return "\n".join(tables.paired_table(rows, methods, final)), FAMILY_SOURCE


def family_ablation() -> tuple[str, str]:
    rows, methods, final = _family()
    return "\n".join(tables.ablation_table(rows, methods, final)), FAMILY_SOURCE


def family_clip_rates() -> tuple[str, str]:
    rows, methods, _ = _family()
    return "\n".join(tables.clip_rates_table(rows, methods)), FAMILY_SOURCE


# ------------------------------------------------------------------------- the demo's committed full run
def _demo() -> tuple[list[dict], list[str], demo.DemoConfig]:
    rows = tables.read(DEMO_CSV)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    steps = sorted({r["step"] for r in rows if r["step"] > 0})
    cfg = demo.DemoConfig(rollouts=steps[-1], eval_every=steps[0], methods=methods)
    return rows, methods, cfg


def _cell(rows: list[dict], method: str, key: str, at: list[int]) -> str:
    mean, sd, _ = demo.paired_differences(rows, method, key, at)
    return f"{mean:+.3f} +- {sd:.3f}" if not math.isnan(sd) else f"{mean:+.3f}"


def demo_paired() -> tuple[str, str]:
    """Paired differences to clip, mean +- sd over seeds, at the early, middle and final steps."""
    rows, methods, cfg = _demo()
    early, middle, final = cfg.early_middle_final()
    at = ([early], [middle], final)
    keys = (("mean@32", "mean@32"), ("pass@32", "pass@32"), ("entropy", "entropy, nats"))
    lines = ["| method | " + " | ".join(f"{label} ({early} / {middle} / final)" for _, label in keys) + " |",
             "|---|" + "---|" * len(keys)]  # fmt: skip
    for method in methods:
        if method == "clip":
            continue
        cells = [" / ".join(_cell(rows, method, key, steps) for steps in at) for key, _ in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines), DEMO_SOURCE


def demo_clip_rates() -> tuple[str, str]:
    rows, methods, _ = _demo()
    return "\n".join(tables.clip_rates_table(rows, methods)), DEMO_SOURCE


TABLES = {
    "band-family-absolute": family_absolute,
    "band-family-paired": family_paired,
    "band-family-ablation": family_ablation,
    "band-family-clip-rates": family_clip_rates,
    "demo-paired": demo_paired,
    "demo-clip-rates": demo_clip_rates,
}
