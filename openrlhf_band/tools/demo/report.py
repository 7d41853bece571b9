"""The demo's report from its rows (one per method, seed and evaluation): paired differences to a
baseline over seeds, clip rates per old-probability bin pooled over seeds, the summary text, the curves
and metrics.csv. Rows: {"method", "seed", "step", the REPORTED metrics, "p_fork_hard", and from step 1
"clip_frac", the per-bin clip rates and counts (loop.ClipStats), "floor_frac" / "truncated_frac" where
the method's loss reports them}.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from openrlhf_band.tools.demo.config import DemoConfig
from openrlhf_band.tools.demo.loop import BINS
from openrlhf_band.tools.demo.mechanism import format_mechanism
from openrlhf_band.tools.demo.methods import METHODS

REPORTED = ("mean@32", "mean@32_hard", "pass@32", "pass@32_hard", "entropy")


def paired_differences(rows: list[dict], method: str, key: str, steps: list[int], baseline: str = "clip"):
    """mean and sd over seeds of (method - baseline) at the given steps (averaged over them)."""
    by = {(r["method"], r["seed"], r["step"]): r[key] for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["method"] == method})
    diffs = [statistics.fmean(by[(method, s, t)] - by[(baseline, s, t)] for t in steps) for s in seeds]
    return statistics.fmean(diffs), (statistics.stdev(diffs) if len(diffs) > 1 else math.nan), len(diffs)


def pooled_clip_rates(rows: list[dict], method: str) -> dict[str, float]:
    """Clip rates per bin over the whole training, pooled over seeds (the last row holds the totals)."""
    last = {}
    for r in rows:
        if r["method"] == method and r["step"] > 0:
            if r["seed"] not in last or r["step"] > last[r["seed"]]["step"]:
                last[r["seed"]] = r
    out = {}
    for *_, name in BINS:
        pos = sum(r[f"n_pos_{name}"] for r in last.values())
        neg = sum(r[f"n_neg_{name}"] for r in last.values())
        up = sum(r[f"clip_up_{name}"] * r[f"n_pos_{name}"] for r in last.values() if r[f"n_pos_{name}"])
        low = sum(r[f"clip_low_{name}"] * r[f"n_neg_{name}"] for r in last.values() if r[f"n_neg_{name}"])
        out[name] = (up / pos if pos else math.nan, low / neg if neg else math.nan)
    return out


def _paired_block(rows: list[dict], methods: list[str], baseline: str, steps: list[tuple[str, list[int]]]):
    """Lines of paired differences (method - baseline), mean +- sd over seeds, one row per method and step."""
    lines = [f"{'method':<{W}}{'step':>7}" + "".join(f"{k:>18}" for k in REPORTED)]
    for method in methods:
        for label, at in steps:
            cells = []
            for key in REPORTED:
                mean, sd, _ = paired_differences(rows, method, key, at, baseline=baseline)
                cells.append(f"{mean:+.3f} +- {sd:.3f}" if not math.isnan(sd) else f"{mean:+.3f}")
            lines.append(f"{method:<{W}}{label:>7}" + "".join(f"{c:>18}" for c in cells))
    return lines


W = 23  # the method column: the longest name, band-kl-entropy-floor, and two spaces


def format_summary(rows: list[dict], cfg: DemoConfig, start: dict, mechanism: dict | None) -> str:
    early, middle, final = cfg.early_middle_final()
    steps = [(str(early), [early]), (str(middle), [middle]), ("final", final)]
    seeds = len({r["seed"] for r in rows})
    lines = [
        f"CPU GRPO demo: {seeds} seeds x {cfg.rollouts} rollouts, methods {', '.join(cfg.methods)}",
        f"after warm-up: mean@32 {start['mean@32']:.3f} (hard {start['mean@32_hard']:.3f}), pass@32 "
        f"{start['pass@32']:.3f}, token entropy {start['entropy']:.3f} nats, correct fork token on hard prompts "
        f"p = {start['p_fork_hard']:.3f}",
        "",
        "absolute values (mean over seeds), final = mean of the last three evaluations:",
        f"{'method':<{W}}" + "".join(f"{k:>14}" for k in REPORTED) + f"{'clip frac':>11}",
    ]
    for method in cfg.methods:
        finals = [r for r in rows if r["method"] == method and r["step"] in final]
        values = [statistics.fmean(r[k] for r in finals) for k in REPORTED]
        clip = statistics.fmean(r["clip_frac"] for r in rows if r["method"] == method and r["step"] > 0)
        lines.append(f"{method:<{W}}" + "".join(f"{v:>14.3f}" for v in values) + f"{clip:>11.3f}")
    if "clip" in cfg.methods:
        lines += ["", f"paired differences to clip, mean +- sd over {seeds} seeds (same seed, checkpoint, prompts):"]
        lines += _paired_block(rows, [m for m in cfg.methods if m != "clip"], "clip", steps)
    others = [m for m in cfg.methods if m not in ("clip", "band-kl")]
    if "band-kl" in cfg.methods and others:
        lines += ["", "paired differences to the constant kl band (method - band-kl), mean +- sd over seeds:"]
        lines += _paired_block(rows, others, "band-kl", steps)
    lines += ["", "clip rates per old-probability bin over all of training (upper among A > 0 | lower among A < 0):"]
    lines.append(f"{'method':<{W}}" + "".join(f"{name:>18}" for *_, name in BINS))
    for method in cfg.methods:
        rates = pooled_clip_rates(rows, method)
        lines.append(f"{method:<{W}}" + "".join(f"{f'{u:.2f} | {lo:.2f}':>18}" for u, lo in rates.values()))
    extra = [m for m in cfg.methods if METHODS[m].get("lower_floor") or METHODS[m]["kind"] == "dppo"]
    if extra:
        lines += ["", "share of all tokens over training clipped below by the floor alone (r_low <= r < F), and, "
                  "under DPPO, inside the band with the weight min(r, c) truncated to c:"]  # fmt: skip
        for method in extra:
            cells = []
            for key in ("floor_frac", "truncated_frac"):
                values = [r[key] for r in rows if r["method"] == method and r["step"] > 0 and key in r]
                values = [v for v in values if not math.isnan(v)]
                if values:
                    cells.append(f"{key} {statistics.fmean(values):.4f}")
            lines.append(f"{method:<{W}}" + "   ".join(cells))
    if mechanism:
        lines += ["", format_mechanism(mechanism)]
    return "\n".join(lines)


def plot(rows: list[dict], cfg: DemoConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("mean@32", "mean@32"), ("mean@32_hard", "mean@32, hard prompts"), ("pass@32", "pass@32"),
              ("entropy", "token entropy (nats)")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    palette = plt.get_cmap("tab10").colors  # past ten methods the colours repeat, dashed
    for i, method in enumerate(cfg.methods):
        steps = sorted({r["step"] for r in rows if r["method"] == method})
        for ax, (key, label) in zip(axes, panels):
            per_step = [[r[key] for r in rows if r["method"] == method and r["step"] == s] for s in steps]
            mean = [statistics.fmean(v) for v in per_step]
            style = {"color": palette[i % 10], "linestyle": "-" if i < 10 else "--"}
            line = ax.plot(steps, mean, label=method, **style)[0]
            if len(per_step[0]) > 1:
                sd = [statistics.stdev(v) for v in per_step]
                ax.fill_between(steps, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                                color=line.get_color(), alpha=0.15)  # fmt: skip
            ax.set_xlabel("rollout")
            ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    seeds = len({r["seed"] for r in rows})
    fig.suptitle(f"GRPO on CPU, clip binding (4 epochs x 8 minibatches): mean +- sd over {seeds} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_csv(rows: list[dict], path: Path) -> None:
    fieldnames = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("method", "seed", "step"), k))
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)
