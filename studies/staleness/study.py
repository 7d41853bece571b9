"""Where should the band be centred when the sampler lags? The CPU demo (openrlhf_band/tools/demo) with a sampler
that lags by 0, 1, 2 and 4 policy versions, as an asynchronous trainer's (`openrlhf-band demo --lag K`: rollout s
is sampled with the weights after update s - 1 - K, and those weights' log-probs of the sampled tokens are mu, the
rollout engine's), under five arms: clip, band-kl centred on the recomputed pi_old (OpenRLHF's default), band-kl
centred on mu (`--actor.band.anchor rollout`), DPPO-TV and DRPO (its ratio and penalty against mu). Every arm at
every lag runs the demo's settings and seeds, so one seed's warm-up, prompts and sampling noise are shared by all:
differences are paired by seed.

    .venv/bin/python studies/staleness/study.py run [--out out/staleness]      # resumable, a lag at a time
    .venv/bin/python studies/staleness/study.py collect [--out out/staleness]  # -> studies/staleness/results/
    .venv/bin/python studies/docs_tables.py                                    # docs/staleness.md's tables

`collect` writes results/metrics.csv (every evaluation row, with its lag), summary.json (the final values and the
paired differences with their 95% t intervals) and curves.png, and refuses a run whose lag-0 band-kl-rollout rows
differ from band-kl's: with no lag mu is pi_old, so the two arms are one computation, bit for bit.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))
from paired_runs import interval, markdown_table  # noqa: E402  (the studies' statistics)

# a demo run's metrics.csv read, and a method's per-seed mean over steps, as the band family's tables do
_spec = importlib.util.spec_from_file_location("band_family_tables", HERE.parent / "band_family" / "tables.py")
band_family = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(band_family)
read_demo_csv = band_family.read  # method a string, seed and step integers, the rest floats (nan where empty)

ARMS = ["clip", "band-kl", "band-kl-rollout", "dppo-tv", "drpo"]
LAGS = (0, 1, 2, 4)
SEEDS = 3
KEYS = ("mean@32", "entropy")
ANCHOR_PAIR = ("band-kl-rollout", "band-kl")  # (centred on mu, centred on the recomputed pi_old)


def demo_config(lag: int, out: Path, seeds: int = SEEDS):
    """The demo's settings (`make demo`'s rollouts, regime and task) with this study's arms, seeds and lag."""
    from openrlhf_band.tools.demo import DemoConfig

    return DemoConfig(methods=list(ARMS), seeds=seeds, lag=lag, out=str(out / f"lag{lag}"))


def _complete(cfg) -> bool:
    """Whether the lag's metrics.csv holds every arm and seed through the last rollout."""
    path = Path(cfg.out) / "metrics.csv"
    if not path.exists():
        return False
    done = {(r["method"], int(r["seed"])) for r in csv.DictReader(path.open()) if int(r["step"]) == cfg.rollouts}
    return done >= {(m, s) for m in cfg.methods for s in range(cfg.seeds)}


def run(out: Path, lags: list[int], seeds: int) -> None:
    """Each lag's demo run (its arms x seeds), skipping a lag already complete; the warm-ups are shared."""
    from openrlhf_band.tools.demo import run as run_demo

    (out / "cache").mkdir(parents=True, exist_ok=True)
    for lag in lags:
        cfg = demo_config(lag, out, seeds)
        if _complete(cfg):
            print(f"[staleness] lag {lag}: complete in {cfg.out}, skipped")
            continue
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        cache = Path(cfg.out) / "cache"  # the warm-up depends on the task and seed only: one per seed for all lags
        if not cache.exists():
            cache.symlink_to((out / "cache").resolve())
        print(f"[staleness] lag {lag}: {len(cfg.methods)} arms x {cfg.seeds} seeds -> {cfg.out}", flush=True)
        run_demo(cfg)


# ---------------------------------------------------------------------------------------------- reading
def read(path: Path = RESULTS / "metrics.csv") -> list[dict]:
    """The rows: method a string, lag, seed and step integers, the rest floats (nan where empty)."""
    return [{**r, "lag": int(r["lag"])} for r in read_demo_csv(path)]


def final_steps(rows: list[dict]) -> list[int]:
    """The last three evaluations (the demo's 'final': docs/demo.md)."""
    return sorted({r["step"] for r in rows})[-3:]


def final(rows: list[dict], method: str, lag: int, key: str) -> dict[int, float]:
    """seed -> the mean of `key` over the final evaluations of `method` at `lag`."""
    at_lag = [r for r in rows if r["lag"] == lag]
    seeds = sorted({r["seed"] for r in at_lag if r["method"] == method})  # per_seed's order
    return dict(zip(seeds, band_family.per_seed(at_lag, method, key, final_steps(rows))))


def paired(rows: list[dict], a: tuple[str, int], b: tuple[str, int], key: str) -> dict:
    """a - b (each (method, lag)), final, paired by seed: mean, sd, 95% t interval and the per-seed values."""
    va, vb = final(rows, *a, key), final(rows, *b, key)
    seeds = sorted(set(va) & set(vb))
    diffs = [va[s] - vb[s] for s in seeds]
    return {**interval(diffs), "seeds": seeds, "per_seed": diffs}


def sampler_kl(rows: list[dict], method: str, lag: int) -> float | None:
    """The mean KL(mu || pi_old) per token the arm measured over its run (a recomputed arm at a lag > 0)."""
    values = [r["sampler_kl"] for r in rows if r["method"] == method and r["lag"] == lag and r["step"] > 0
              and not math.isnan(r.get("sampler_kl", math.nan))]  # fmt: skip
    return statistics.fmean(values) if values else None


def lags_of(rows: list[dict]) -> list[int]:
    return sorted({r["lag"] for r in rows})


def summary(rows: list[dict]) -> dict:
    """Final values per arm and lag, and the paired differences: the anchor (band-kl on mu - on pi_old), each
    arm - clip, and each arm at a lag - itself at lag 0."""
    lags = lags_of(rows)
    out: dict = {"final_steps": final_steps(rows), "lags": lags, "arms": ARMS, "final": {}, "anchor": {},
                 "to_clip": {}, "to_lag0": {}}  # fmt: skip
    for m in ARMS:
        for lag in lags:
            out["final"][f"{m}@{lag}"] = {k: interval(list(final(rows, m, lag, k).values())) for k in KEYS}
            out["final"][f"{m}@{lag}"]["sampler_kl"] = sampler_kl(rows, m, lag)
            if m != "clip":
                out["to_clip"][f"{m}@{lag}"] = {k: paired(rows, (m, lag), ("clip", lag), k) for k in KEYS}
            if lag:
                out["to_lag0"][f"{m}@{lag}"] = {k: paired(rows, (m, lag), (m, 0), k) for k in KEYS}
    for lag in lags:
        out["anchor"][str(lag)] = {k: paired(rows, (ANCHOR_PAIR[0], lag), (ANCHOR_PAIR[1], lag), k) for k in KEYS}
    return out


# ---------------------------------------------------------------------------------------------- tables
def _ci(d: dict) -> str:
    """'+0.012 [-0.003, +0.027]': a paired mean and its 95% t interval."""
    if d["ci95"] is None:
        return f"{d['mean']:+.3f}" if d["mean"] is not None else ""
    lo, hi = d["ci95"]
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"


def _ms(d: dict) -> str:
    return f"{d['mean']:.3f} +- {d['sd']:.3f}" if d["sd"] is not None else f"{d['mean']:.3f}"


def final_table(rows: list[dict], key: str) -> list[str]:
    """Each arm's final `key` at each lag, mean +- sd over seeds."""
    s = summary(rows)
    head = ["arm", *(f"lag {lag}" for lag in s["lags"])]
    return markdown_table(head, [[m, *(_ms(s["final"][f"{m}@{lag}"][key]) for lag in s["lags"])] for m in ARMS])


def anchor_table(rows: list[dict]) -> list[str]:
    """Per lag: band-kl on mu - band-kl on the recomputed pi_old (mean@32, entropy), and the lag the recomputed
    arm measured (KL(mu || pi_old) per token)."""
    s = summary(rows)
    head = ["lag", "mean@32: on mu - on pi_old", "entropy: on mu - on pi_old", "KL(mu || pi_old), nats/token"]
    body = []
    for lag in s["lags"]:
        d = s["anchor"][str(lag)]
        kl = s["final"][f"{ANCHOR_PAIR[1]}@{lag}"]["sampler_kl"]
        body.append([str(lag), _ci(d["mean@32"]), _ci(d["entropy"]), "0 (mu is pi_old)" if kl is None else f"{kl:.4f}"])
    return markdown_table(head, body)


def to_clip_table(rows: list[dict]) -> list[str]:
    """Each arm - clip at each lag, paired by seed, with its 95% t interval (mean@32; entropy)."""
    s = summary(rows)
    body = []
    for m in ARMS[1:]:
        for lag in s["lags"]:
            d = s["to_clip"][f"{m}@{lag}"]
            body.append([m, str(lag), _ci(d["mean@32"]), _ci(d["entropy"])])
    return markdown_table(["arm", "lag", "mean@32 - clip", "entropy - clip"], body)


def lag_cost_table(rows: list[dict]) -> list[str]:
    """Each arm at a lag - itself at lag 0 (mean@32), paired by seed: what the lag costs it."""
    s = summary(rows)
    lags = [lag for lag in s["lags"] if lag]
    body = [[m, *(_ci(s["to_lag0"][f"{m}@{lag}"]["mean@32"]) for lag in lags)] for m in ARMS]
    return markdown_table(["arm", *(f"lag {lag} - lag 0" for lag in lags)], body)


# ---------------------------------------------------------------------------------------------- collect
def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def collect(out: Path) -> None:
    """Every lag's rows into results/metrics.csv with a lag column, summary.json and curves.png."""
    rows = []
    for path in sorted(out.glob("lag*/metrics.csv")):
        lag = int(path.parent.name.removeprefix("lag"))
        lag_rows = read_demo_csv(path)
        if not _complete(demo_config(lag, out, len({r["seed"] for r in lag_rows}))):
            sys.exit(f"{path}: not every arm of {ARMS} reached the last rollout at every seed: run the study on")
        rows += [{**r, "lag": lag} for r in lag_rows]
    if not rows:
        sys.exit(f"no lag*/metrics.csv under {out}: run the study first")
    lag0 = {(r["method"], r["seed"], r["step"]): r for r in rows if r["lag"] == 0}
    for (method, seed, step), r in lag0.items():
        if method == ANCHOR_PAIR[0]:
            twin = lag0[(ANCHOR_PAIR[1], seed, step)]
            differ = [k for k in r if k not in ("method",) and not _same(r[k], twin.get(k))]
            if differ:
                sys.exit(f"at lag 0 {ANCHOR_PAIR[0]} differs from {ANCHOR_PAIR[1]} (seed {seed}, step {step}: "
                         f"{differ[:3]}): with no lag they are one computation; not this study's code")  # fmt: skip
    rows.sort(key=lambda r: (r["lag"], ARMS.index(r["method"]), r["seed"], r["step"]))
    RESULTS.mkdir(exist_ok=True)
    labels = ["lag", "method", "seed", "step"]
    columns = [*labels, *sorted({k for r in rows for k in r} - set(labels))]
    with (RESULTS / "metrics.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows)
    rows = read()
    (RESULTS / "summary.json").write_text(json.dumps(summary(rows), indent=1, sort_keys=True) + "\n")
    plot(rows, RESULTS / "curves.png")
    print("\n".join(["mean@32", *final_table(rows, "mean@32"), "", "entropy", *final_table(rows, "entropy"), "",
                     "anchor", *anchor_table(rows), "", *to_clip_table(rows), "", *lag_cost_table(rows)]))  # fmt: skip
    print(f"wrote {RESULTS / 'metrics.csv'}, summary.json, curves.png")


def _means_and_errors(cells: list[dict]) -> tuple[list[float], list[float]]:
    """Interval cells -> their means and the 95% intervals' half-widths (0 where there is no interval)."""
    return [c["mean"] for c in cells], [(c["ci95"][1] - c["mean"]) if c["ci95"] else 0.0 for c in cells]


def plot(rows: list[dict], path: Path) -> None:
    """Final mean@32 and entropy against the lag, each arm's mean with its 95% t interval over seeds, and the
    anchor's paired difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary(rows)
    lags = s["lags"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, m in enumerate(ARMS):
        for ax, key in zip(axes[:2], KEYS):
            mean, err = _means_and_errors([s["final"][f"{m}@{lag}"][key] for lag in lags])
            ax.errorbar([lag + 0.05 * (i - 2) for lag in lags], mean, yerr=err, marker="o", capsize=3, label=m)
    for ax, label in zip(axes[:2], ("final mean@32", "final token entropy (nats)")):
        ax.set_xlabel("sampler lag (policy versions)")
        ax.set_ylabel(label)
        ax.set_xticks(lags)
    axes[0].legend(fontsize=8)
    ax = axes[2]
    for key, marker in zip(KEYS, ("o", "s")):
        mean, err = _means_and_errors([s["anchor"][str(lag)][key] for lag in lags])
        ax.errorbar(lags, mean, yerr=err, marker=marker, capsize=3, label=key)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("sampler lag (policy versions)")
    ax.set_ylabel("band-kl on mu - on recomputed pi_old")
    ax.set_xticks(lags)
    ax.legend(fontsize=8)
    seeds = len({r["seed"] for r in rows})
    fig.suptitle(f"CPU demo, a lagging sampler: final values (last 3 evaluations), 95% t intervals over {seeds} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="every lag's demo run (resumable: a complete lag is skipped)")
    run_parser.add_argument("--out", type=Path, default=Path("out/staleness"))
    run_parser.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    run_parser.add_argument("--seeds", type=int, default=SEEDS)
    collect_parser = sub.add_parser("collect", help="the runs into studies/staleness/results/")
    collect_parser.add_argument("--out", type=Path, default=Path("out/staleness"))
    args = parser.parse_args(argv)
    if args.command == "run":
        if any(lag < 0 for lag in args.lags) or args.seeds < 2:
            parser.error("--lags >= 0 and --seeds >= 2 (a paired interval needs two seeds)")
        run(args.out, args.lags, args.seeds)
    else:
        collect(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
