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

import os
import statistics
import sys
from pathlib import Path

from openrlhf_band.integration.methods import METHOD_FLAGS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paired_runs import (  # noqa: E402
    Curves,
    final_section,
    load_paired_runs,
    mean_and_sd,
    paired_section,
    rise_section,
    run_pairs,
    stats_by_method,
    steps_and_seeds,
    study_cli,
    write_report,
)

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
CURVES = Curves(
    panels=(
        ("eval/eval_default_pass1", "held-out exact match (OpenRLHF eval, 4 samples, T=1)"),
        ("train/rollout/reward_mean", "rollout reward (exact match)"),
        ("train/ppo_clip_ratio", "clipped token fraction"),
    ),
    title="GRPO through train_ppo_ray from the train_sft warm-up checkpoint (mean over seeds)",
    start_key="mean_reward",  # the held-out curve starts at the checkpoint's evaluation
)


def run(out: Path, seeds: int, methods: list[str], steps: int) -> int:
    chosen = {method: METHODS[method] for method in methods}
    # bf16 on every CPU, as the committed study ran (the harness would take float32 on a CPU without native bf16:
    # docs/e2e_cpu.md#dtype); E2E_PARAM_DTYPE set by the caller wins
    env = {"LEARN_STEPS": str(steps), "E2E_PARAM_DTYPE": os.environ.get("E2E_PARAM_DTYPE") or "bf16"}
    return run_pairs(LEARN_SH, out, seeds, chosen, env, SEED0)


def report(out: Path, docs: Path, command: str) -> str:
    runs = load_paired_runs(out, list(METHODS))
    docs.mkdir(parents=True, exist_ok=True)
    before = next(iter(runs["clip"].values()))["before"]

    def cost(by_seed: dict[int, dict]) -> str:
        sps = statistics.fmean(s["seconds_per_step"] for s in by_seed.values())
        peak = max(s["peak_pss_gib"] or 0 for s in by_seed.values())
        return f"{sps:>9.2f}{peak:>10.1f}"

    lines = [
        f"command: {command}",
        f"checkpoint (held-out, 128 prompts x {before['samples_per_prompt']} samples at T=1): mean_reward "
        f"{before['mean_reward']:.3f}, p_correct {before['p_correct']:.3f}, p_fork_hard {before['p_fork_hard']:.3f}, "
        f"entropy {before['entropy']:.3f} nats",
        steps_and_seeds(runs),
        "",
        *final_section(
            "final (after the last step), mean +- sd over seeds:",
            runs,
            FINAL_KEYS,
            f"{'s/step':>9}{'peak GiB':>10}",
            cost,
        ),
        "",
        *rise_section("rise over the checkpoint (after - before), mean +- sd over seeds:", runs, FINAL_KEYS),
        "",
        *paired_section(runs, FINAL_KEYS),
    ]
    text = "\n".join(lines) + "\n"
    write_report(docs, text, _stats(runs, command), runs, STEP_COLUMNS, CURVES)
    return text


def _stats(runs: dict[str, dict[int, dict]], command: str) -> dict:
    """The numbers the learning test reads: per method, mean and sd over seeds of each final held-out
    number and of its rise over the checkpoint; `seed_spread` is the largest sd of a final
    mean_reward over the methods."""

    def final(by_seed: dict[int, dict], k: str) -> dict:
        after_mean, after_sd = mean_and_sd([s["after"][k] for s in by_seed.values()])
        rise = [s["after"][k] - s["before"][k] for s in by_seed.values()]
        return {"after_mean": after_mean, "after_sd": after_sd, "rise_mean": statistics.fmean(rise)}

    out: dict = {"command": command, "methods": stats_by_method(runs, FINAL_KEYS, final)}
    sds = [m["mean_reward"]["after_sd"] for m in out["methods"].values() if m["mean_reward"]["after_sd"] is not None]
    out["seed_spread"] = max(sds) if sds else None
    return out


def main() -> int:
    parser, _, _ = study_cli(__doc__.split("\n\n")[0], list(METHODS), 20, "out/learn-study", "docs/learn_study",
                             "make learn-study")  # fmt: skip
    args = parser.parse_args()
    if args.command == "run":
        return run(args.out, args.seeds, args.methods, args.steps)
    print(report(args.out, args.docs, args.command_line), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
