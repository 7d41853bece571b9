"""The learning study through the real train_ppo_ray: clip, Clip-Higher, band-kl, band-kl with the
lower floor 0.8 and DPPO-TV, paired seeds from one warm-up checkpoint (studies/learn/learn.sh each).

    python studies/learn/learn_study.py run --seeds 3 --out out/learn-study      (make learn-study)
    python studies/learn/learn_study.py report --out out/learn-study --docs docs/learn_study

`run` calls learn.sh once per (seed, method), seed by seed so that a stopped study still holds whole
pairs, and skips runs whose summary.json exists. Pairing: every method of a seed starts from the
same checkpoint with the same --train.seed, so the same prompt order and, until the policies
differ, the same vLLM sampling noise. `report` writes summary.txt (final held-out reward and entropy,
paired differences to clip, mean +- sd over seeds), summary.json (the same numbers, which the
learning test in tests/e2e reads), steps.csv (every run's per-step train_ppo_ray
metrics and its held-out eval curve) and curves.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from openrlhf_band.integration.methods import METHOD_FLAGS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paired_runs import load_runs, mean_sd, run_pairs, write_steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LEARN_SH = ROOT / "studies" / "learn" / "learn.sh"

# method -> train_ppo_ray flags (on top of learn.sh's), from the one table of named methods
# (openrlhf_band.integration.methods): the band family's chosen floor is 0.8 (docs/band_family.md),
# DPPO-TV takes the DPPO authors' radius 0.15 and truncation 1e4 (the default)
METHODS = {name: list(METHOD_FLAGS[name]) for name in ("clip", "clip-higher", "band-kl", "band-kl-floor", "dppo-tv")}
SEED0 = 42  # train.sh's --train.seed; seed i of the study is SEED0 + i
# per-step columns of steps.csv: (csv name, TensorBoard tag)
STEP_COLUMNS = [
    ("rollout_reward", "train/rollout/reward_mean"),
    ("heldout_pass1", "eval/eval_default_pass1"),
    ("clip_ratio", "train/ppo_clip_ratio"),
    ("clip_frac_lower", "train/band/clip_frac_lower"),
    ("clip_frac_upper", "train/band/clip_frac_upper"),
    ("clip_frac_floor", "train/band/clip_frac_floor"),
    ("policy_kl", "train/ppo_kl"),
    ("ref_kl", "train/kl"),
    ("step_seconds", "train/timing/step_total"),
]
FINAL_KEYS = ("mean_reward", "p_correct", "p_fork_hard", "entropy")


def run(out: Path, seeds: int, methods: list[str], steps: int) -> int:
    chosen = {method: METHODS[method] for method in methods}
    # bf16 on every CPU, as the committed study ran (the harness would take float32 on a CPU without native bf16:
    # docs/e2e_cpu.md#dtype); E2E_PARAM_DTYPE set by the caller wins
    env = {"LEARN_STEPS": str(steps), "E2E_PARAM_DTYPE": os.environ.get("E2E_PARAM_DTYPE") or "bf16"}
    return run_pairs(LEARN_SH, out, seeds, chosen, env, SEED0)


def load(out: Path) -> dict[str, dict[int, dict]]:
    return load_runs(out, list(METHODS))


def report(out: Path, docs: Path, command: str) -> str:
    runs = load(out)
    if "clip" not in runs:
        sys.exit(f"no clip runs under {out}: run the study first")
    docs.mkdir(parents=True, exist_ok=True)
    some = next(iter(runs["clip"].values()))
    before = some["before"]
    lines = [
        f"command: {command}",
        f"checkpoint (held-out, 128 prompts x {before['samples_per_prompt']} samples at T=1): mean_reward "
        f"{before['mean_reward']:.3f}, p_correct {before['p_correct']:.3f}, p_fork_hard {before['p_fork_hard']:.3f}, "
        f"entropy {before['entropy']:.3f} nats",
        f"steps per run: {some['steps']}; seeds per method: "
        + ", ".join(f"{m} {len(s)}" for m, s in runs.items()),
        "",
        "final (after the last step), mean +- sd over seeds:",
        f"{'method':<15}" + "".join(f"{k:>20}" for k in FINAL_KEYS) + f"{'s/step':>9}{'peak GiB':>10}",
    ]
    for method, by_seed in runs.items():
        cells = [mean_sd([s["after"][k] for s in by_seed.values()], signed=False) for k in FINAL_KEYS]
        sps = statistics.fmean(s["seconds_per_step"] for s in by_seed.values())
        peak = max(s["peak_pss_gib"] or 0 for s in by_seed.values())
        lines.append(f"{method:<15}" + "".join(f"{c:>20}" for c in cells) + f"{sps:>9.2f}{peak:>10.1f}")
    lines += ["", "rise over the checkpoint (after - before), mean +- sd over seeds:"]
    for method, by_seed in runs.items():
        cells = [mean_sd([s["after"][k] - s["before"][k] for s in by_seed.values()]) for k in FINAL_KEYS]
        lines.append(f"{method:<15}" + "".join(f"{c:>20}" for c in cells))
    lines += ["", "paired difference to clip (same seed), mean +- sd over the paired seeds:"]
    for method, by_seed in runs.items():
        if method == "clip":
            continue
        seeds = sorted(set(by_seed) & set(runs["clip"]))
        if not seeds:
            continue
        cells = [mean_sd([by_seed[i]["after"][k] - runs["clip"][i]["after"][k] for i in seeds]) for k in FINAL_KEYS]
        lines.append(f"{method:<15}" + "".join(f"{c:>20}" for c in cells) + f"   ({len(seeds)} pairs)")
    text = "\n".join(lines) + "\n"
    (docs / "summary.txt").write_text(text)
    (docs / "summary.json").write_text(json.dumps(_stats(runs, command), indent=1) + "\n")
    write_steps(runs, docs / "steps.csv", STEP_COLUMNS)
    _plot(runs, docs / "curves.png")
    return text


def _stats(runs: dict[str, dict[int, dict]], command: str) -> dict:
    """The numbers the learning test reads: per method, mean and sd over seeds of each final held-out
    number and of its rise over the checkpoint; `seed_spread` is the largest sd of a final
    mean_reward over the methods."""
    out: dict = {"command": command, "methods": {}}
    for method, by_seed in runs.items():
        entry = {"seeds": sorted(by_seed), "steps": next(iter(by_seed.values()))["steps"]}
        for k in FINAL_KEYS:
            after = [s["after"][k] for s in by_seed.values()]
            rise = [s["after"][k] - s["before"][k] for s in by_seed.values()]
            entry[k] = {"after_mean": statistics.fmean(after), "after_sd": statistics.stdev(after) if len(after) > 1
                        else None, "rise_mean": statistics.fmean(rise)}  # fmt: skip
        out["methods"][method] = entry
    sds = [m["mean_reward"]["after_sd"] for m in out["methods"].values() if m["mean_reward"]["after_sd"] is not None]
    out["seed_spread"] = max(sds) if sds else None
    return out


def _plot(runs: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = [("eval/eval_default_pass1", "held-out exact match (OpenRLHF eval, 4 samples, T=1)"),
              ("train/rollout/reward_mean", "rollout reward (exact match)"),
              ("train/ppo_clip_ratio", "clipped token fraction")]  # fmt: skip
    for ax, (tag, title) in zip(axes, panels):
        for i, (method, by_seed) in enumerate(runs.items()):
            steps = sorted({int(k) for s in by_seed.values() for k in s["metrics"].get(tag, {})})
            if tag.startswith("eval/"):
                steps = [0, *steps]
            ys = []
            for step in steps:
                vals = [s["before"]["mean_reward"] if step == 0 else s["metrics"][tag].get(str(step))
                        for s in by_seed.values()]  # fmt: skip
                vals = [v for v in vals if v is not None]
                ys.append(statistics.fmean(vals) if vals else float("nan"))
            ax.plot(steps, ys, label=method, color=f"C{i}", marker="o" if tag.startswith("eval/") else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("train_ppo_ray step")
    axes[0].legend(fontsize=8)
    fig.suptitle("GRPO through train_ppo_ray from the train_sft warm-up checkpoint (mean over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    r.add_argument("--out", type=Path, default=Path("out/learn-study"))
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path, default=Path("out/learn-study"))
    p.add_argument("--docs", type=Path, default=Path("docs/learn_study"))
    p.add_argument("--command-line", default="make learn-study", help="the command recorded in summary.txt")
    args = parser.parse_args()
    if args.command == "run":
        return run(args.out, args.seeds, args.methods, args.steps)
    print(report(args.out, args.docs, args.command_line), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
