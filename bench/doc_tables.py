"""The benchmark, kernel and operator tables of README.md and docs/ (studies/docs_tables.py renders them):
each from the committed results under bench/results/, or, for the band against fixed clips, from the
operator itself (what `openrlhf-band bounds` prints, as markdown)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A markdown table; `align` holds one character per column, "r" for right-aligned (default left)."""
    rules = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


# --- the band against fixed clips (README.md, docs/operator.md) ---

BOUNDS_PROBS = (0.001, 0.01, 0.1, 0.5, 0.9)
CLIP_TITLES = {"clip 0.2": "clip 0.2", "clip-higher 0.2/0.28": "Clip-Higher 0.2/0.28"}


def bounds_vs_clips() -> tuple[str, str]:
    from openrlhf_band.tools.inspect_bounds import FIXED_CLIPS, bounds_rows

    header = ["p", "band r_low", "band r_up", "band max q"] + [f"{CLIP_TITLES[n]} max q" for n in FIXED_CLIPS]
    rows = [
        [f"{p:g}", *(f"{v:#.3g}" for v in (low, up, band_q)), *(f"{q:.6g}" for q in clips)]
        for p, low, up, band_q, *clips in bounds_rows(BOUNDS_PROBS, "kl", 0.05)
    ]
    command = "openrlhf-band bounds --divergence kl --delta 0.05 --p " + " ".join(f"{p:g}" for p in BOUNDS_PROBS)
    return md_table(header, rows), f"band_bounds (`{command}`)"


# --- the bounds benchmark (docs/benchmarks.md) ---

PROVIDER_NOTES = {
    "clip": "clip (`ratio.clamp(0.8, 1.2)`)",
    "authors-kl": "authors-kl (their bisection, host sync per step)",
    "authors-chi2": "authors-chi2 (their float32 closed form)",
}
# (numerator, denominator, the goal the docs set: the first three are the benchmark's own targets)
BOUNDS_RATIOS = (
    ("authors-kl", "band-kl", "speedup_vs_authors_kl_at_least"),
    ("band-kl", "band-chi2", "kl_over_chi2_at_most"),
    ("band-reverse_kl", "band-kl", "reverse_kl_over_kl_at_most"),
    ("band-chi2-pt", "band-chi2", None),
    ("band-kl-pt", "band-kl", "<= 10"),
    ("band-reverse_kl-pt", "band-reverse_kl", "<= 10"),
)


def provider_title(name: str) -> str:
    if name in PROVIDER_NOTES:
        return PROVIDER_NOTES[name]
    return f"{name} (ours, per-token delta)" if name.endswith("-pt") else f"{name} (ours)"


def bounds_speed() -> tuple[str, str]:
    result = load("bounds_cpu.json")
    rows = [
        [provider_title(name), f"{t['median_ms']:.2f}", f"{t['min_ms']:.2f}"] for name, t in result["timings"].items()
    ]
    return md_table(["provider", "median ms", "min ms"], rows, "lrr"), "bench/results/bounds_cpu.json"


def bounds_ratios() -> tuple[str, str]:
    result = load("bounds_cpu.json")
    median = {name: t["median_ms"] for name, t in result["timings"].items()}
    targets = result["targets"]
    rows = []
    for top, bottom, goal in BOUNDS_RATIOS:
        if goal in targets:
            goal = (">= " if goal.endswith("at_least") else "<= ") + f"{targets[goal]:g}"
        rows.append([f"{top} / {bottom}", f"{median[top] / median[bottom]:.3g}", goal or ""])
    errors = result["max_rel_error_vs_float64"]
    ours = [name for name in errors if name.startswith("band-")]
    rows.append([f"max relative error vs float64: {', '.join(ours)}", ", ".join(f"{errors[n]:.1e}" for n in ours), ""])
    rows += [
        [f"max relative error vs float64: {name}", f"{errors[name]:.2g}", ""] for name in errors if name not in ours
    ]
    return md_table(["medians, same run", "ratio", "goal"], rows, "lrr"), "bench/results/bounds_cpu.json"


# --- the kernel benchmark (docs/benchmarks.md) ---


def kernel_provider_title(name: str) -> str:
    if name == "ppo-clip":
        return "OpenRLHF PPO clip"
    kind, rest = name.split("-", 1)
    divergence = rest.removesuffix("-pt")
    label = {"torch": "torch reference", "fused": "fused kernel"}[kind] + f", {divergence}"
    return label + (", per-token delta" if rest.endswith("-pt") else "")


def kernel_cpu() -> tuple[str, str]:
    results = sorted((load(p.name) for p in RESULTS.glob("kernel_cpu_*.json")), key=lambda r: r["config"]["num_tokens"])
    rows = []
    for result in results:
        timings = result["timings"]
        for name in timings["forward"]:
            backward = timings["backward"][name]["median_ms"]
            saved = result["memory"][name]["saved_for_backward_bytes"] / 2**20
            rows.append([
                f"{result['config']['num_tokens']:,}", kernel_provider_title(name),
                f"{timings['forward'][name]['median_ms']:.1f}", f"{backward:.1f}" if backward >= 0 else "(noise)",
                f"{timings['full'][name]['median_ms']:.1f}", f"{saved:.1f}",
            ])  # fmt: skip
    header = ["tokens", "provider", "forward", "backward", "full", "saved MiB"]
    return md_table(header, rows, "llrrrr"), "bench/results/kernel_cpu_*.json"


# --- the kernel's compiled form (docs/kernel.md) ---

BEFORE_AFTER = (
    ("fwd-kl-per-token", "fwd-kl-per-token-scripts-fp32"),
    ("fwd-reverse_kl-per-token", "fwd-reverse_kl-per-token-scripts-fp32"),
    ("fwd-kl-scalar", "fwd-kl-scalar-scripts-fp32"),
    ("fwd-reverse_kl-scalar", "fwd-reverse_kl-scalar-scripts-fp32"),
    ("fwd-tv-scalar", "fwd-tv-scalar-scripts-fp32"),
    ("fwd-chi2-scalar", "fwd-chi2-scalar-scripts-fp32"),
    ("fwd-hellinger-scalar", "fwd-hellinger-scalar-scripts-fp32"),
    ("fwd-bounds", "fwd-bounds-scripts-fp32"),
    ("bwd", "bwd-fp32"),
)
BEFORE_CSV, AFTER_CSV, BEFORE_AFTER_TARGET = "aot_before_c98439d.csv", "aot_triton-3.7.1.csv", "90"


def csv_rows(name: str, target: str) -> dict[str, dict[str, str]]:
    with (RESULTS / name).open() as f:
        return {r["variant"]: r for r in csv.DictReader(f) if r["target"] == target}


def number(text: str) -> str:
    return f"{float(text):g}"


def kernel_before_after() -> tuple[str, str]:
    before, after = csv_rows(BEFORE_CSV, BEFORE_AFTER_TARGET), csv_rows(AFTER_CSV, BEFORE_AFTER_TARGET)
    rows = []
    for label, variant in BEFORE_AFTER:
        for when, table in (("before", before), ("after", after)):
            r = table[variant]
            rows.append([
                f"{label}, {when}", r["registers"], f"{r['spill_stores_B']} / {r['spill_loads_B']}",
                number(r["f64_per_token"]), r["num_warps"], r["blocks_per_sm"], number(r["compile_s"]),
                number(r["compile_cpu_s"]) if r.get("compile_cpu_s") else "not recorded",
            ])  # fmt: skip
    header = ["variant (`scripts` options, fp32)", "registers", "spill stores / loads (B)", "f64 / token", "warps",
              "blocks / SM", "compile wall s", "compile CPU s"]  # fmt: skip
    return md_table(header, rows), f"bench/results/{BEFORE_CSV} and {AFTER_CSV} (sm_{BEFORE_AFTER_TARGET})"


TRITON_VERSIONS = ("3.6.0", "3.7.1", "3.9.0")


def triton_versions() -> tuple[str, str]:
    rows = []
    for version in TRITON_VERSIONS:
        data = load(f"aot_triton-{version}.json")
        table = data["rows"]
        rows.append([
            version, ", ".join(f"sm_{t}" for t in data["targets"]), f"{sum(r['ok'] for r in table)} / {len(table)}",
            str(sum(bool(r["spill_stores_B"] or r["spill_loads_B"]) for r in table)),
            str(max(r["registers"] for r in table)), f"{max(r['compile_cpu_s'] for r in table):g}",
            f"{max(r['compile_s'] for r in table):g}", data["amd"].split(": ", 1)[1],
        ])  # fmt: skip
    header = ["triton", "targets", "compiled", "spills", "max registers", "max compile CPU s", "max compile wall s",
              "AMD without a device"]  # fmt: skip
    return md_table(header, rows), "bench/results/aot_triton-{3.6.0,3.7.1,3.9.0}.json"


ROOFLINE_TABLE, ROOFLINE_TARGET = "aot_triton-3.7.1.json", "90"
ROOFLINE_VARIANTS = ["scripts-fp32", "scripts-bf16", "scalar-all-fp32"]


def roofline() -> tuple[str, str]:
    from openrlhf_band.bench.roofline import roofline_lines

    lines = roofline_lines(load(ROOFLINE_TABLE)["rows"], ROOFLINE_TARGET, ROOFLINE_VARIANTS)
    return "\n".join(lines), f"bench/results/{ROOFLINE_TABLE} (openrlhf_band.bench.roofline)"


# --- the fused log-probs (docs/fused_logprobs.md); tests/docs/test_doc_numbers.py reads its rows ---

GIB = 2.0**30


def fused_logprobs() -> tuple[str, str]:
    data = load("logprobs_cpu.json")
    vocab = data["config"]["vocab"]
    rows = []
    for row in data["rows"]:
        fused, base = row["fused"], row["openrlhf"]
        cells = [f"{row['tokens']:,}", f"{fused['train_peak_bytes'] / GIB:.2f} GiB"]
        if base is not None:
            times = f"{fused['train_s']:.1f} s / {base['train_s']:.1f} s = {row['time_ratio_train']:.2f}"
            cells += [f"{base['train_peak_bytes'] / GIB:.2f} GiB", f"{row['memory_ratio_train']:#.2g}",
                      f"{fused['forward_peak_bytes'] / GIB:.2f} GiB", f"{base['forward_peak_bytes'] / GIB:.2f} GiB",
                      times]  # fmt: skip
        else:  # the skip's limit is where ~13 B x N x V fill 80% of the memory: the machine's memory from it
            limit = int(row["openrlhf_skipped"].split(" > ")[1].split()[0])
            memory = limit * 13 * vocab / 0.8 / GIB
            cells += [f"not run: needs ~{13 * row['tokens'] * vocab / GIB:.1f} GiB (13 B x N x V), the machine has "
                      f"{memory:.0f}", "-", f"{fused['forward_peak_bytes'] / GIB:.2f} GiB", "-",
                      f"{fused['train_s']:.1f} s / -"]  # fmt: skip
        rows.append(cells)
    header = ["tokens", "fused train peak", "OpenRLHF train peak", "ratio", "fused no-grad peak",
              "OpenRLHF no-grad peak", "fused / OpenRLHF time (train)"]  # fmt: skip
    return md_table(header, rows), "bench/results/logprobs_cpu.json"


# --- the authors' p > 1 - 1e-6 rule (docs/training.md) ---


def percent(x: float) -> str:
    return f"{100 * x:.2f}%"


def authors_rule() -> tuple[str, str]:
    results = sorted((load(p.name) for p in RESULTS.glob("authors_rule_cpu_sigma*.json")),
                     key=lambda r: r["logit_step_sigma"])  # fmt: skip
    rows = []
    for result in results:
        by = result["divergences"]
        rows.append([
            f"{result['logit_step_sigma']:g}",
            *(f"{percent(by[d]['clip_frac_ours'])} / {percent(by[d]['clip_frac_authors'])}" for d in by),
            " / ".join(percent(by[d]["of_which_p_above_1_minus_1e-6"]) for d in by),
            f"{max(by[d]['max_logit_gradient_weight_of_those'] for d in by):.1e}",
        ])  # fmt: skip
    divergences = list(results[0]["divergences"])
    header = ["sigma", *(f"{d}: ours / authors" for d in divergences),
              f"clipped by the authors only, p > 1 - 1e-6 ({' / '.join(divergences)})",
              "largest 1 - p of those"]  # fmt: skip
    return md_table(header, rows), "bench/results/authors_rule_cpu_sigma*.json"


TABLES: dict[str, Callable[[], tuple[str, str]]] = {
    "bounds-vs-clips": bounds_vs_clips,
    "bench-bounds-speed": bounds_speed,
    "bench-bounds-ratios": bounds_ratios,
    "bench-kernel-cpu": kernel_cpu,
    "bench-aot-before-after": kernel_before_after,
    "bench-aot-versions": triton_versions,
    "bench-roofline": roofline,
    "bench-logprobs": fused_logprobs,
    "bench-authors-rule": authors_rule,
}
