"""The real-model study: SmolLM2-135M-Instruct through the real train_ppo_ray (studies/smollm2/run.sh),
clip, Clip-Higher, band-kl, band-kl with the floor 0.8 and CISPO, paired seeds from the same model.

    python studies/smollm2/study.py run --seeds 3 --out out/smollm2-study          (make smollm2-study)
    python studies/smollm2/study.py report --out out/smollm2-study --docs studies/smollm2/results
    python studies/smollm2/study.py summarize --run RUN --before FILE --seconds S   (run.sh, after a run)

`run` calls run.sh once per (seed, method), seed by seed so that a stopped study still holds whole
pairs, and skips runs whose summary.json exists: the study resumes where it stopped. Each finished run's
summary.json is also copied to the ledger, studies/smollm2/results/runs/METHOD-seedI.json (committed),
and taken from there when out/ lacks it and its settings (run.sh's settings.json) equal this study's:
the study can be stopped and resumed on another machine, without the first one's out/. `touch OUT/STOP`
stops it before its next run. Seed-matched, not paired: every method of a seed starts from the same model
with the same --train.seed (prompt order, vLLM's engine seed); vLLM's CPU engine does not repeat its
sampling noise, so even the first rollouts differ (docs/e2e_cpu.md): compare over seeds. `report` writes summary.txt
(held-out reward and entropy after training, paired differences to clip with sd over seeds, the
starting model's token bins and each method's first-step clip rate per bin), summary.json, steps.csv
and curves.png.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from openrlhf_band.integration.methods import METHOD_FLAGS
from openrlhf_band.integration.metrics import _BIN_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paired_runs import (  # noqa: E402
    Curves,
    Ledger,
    final_section,
    load_paired_runs,
    markdown_table,
    mean_and_sd,
    mean_sd,
    paired_by_seed,
    paired_section,
    rise_section,
    run_pairs,
    stats_by_method,
    steps_and_seeds,
    study_cli,
    write_report,
)

ROOT = Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "studies" / "smollm2" / "run.sh"
LEDGER = ROOT / "studies" / "smollm2" / "results" / "runs"  # finished runs' summary.json, committed as they finish
#: the compared methods, from the one table of named methods; CISPO is one of the field's objectives
#: (docs/objectives.md): it bounds the importance weight and keeps every token's gradient
METHODS = {name: list(METHOD_FLAGS[name]) for name in ("clip", "clip-higher", "band-kl", "band-kl-floor", "cispo")}
SEED0 = 42
BIN_NAMES = _BIN_NAMES  # the band's metric bins (band/tokens_<bin>, band/clipped_<bin>)
STEP_COLUMNS = [
    ("rollout_reward", "train/rollout/reward_mean"),
    ("reply_tokens", "train/rollout/response_length_mean"),
    ("clip_ratio", "train/ppo_clip_ratio"),
    ("policy_kl", "train/ppo_kl"),
    ("ref_kl", "train/kl"),
    ("vllm_kl", "train/vllm_kl"),
    ("step_seconds", "train/timing/step_total"),
]
FINAL_KEYS = ("mean_reward", "entropy", "answer_found", "reply_tokens")
CURVES = Curves(
    panels=(
        ("train/rollout/reward_mean", "rollout reward (2 score - 1)"),
        ("train/ppo_clip_ratio", "clipped token fraction"),
        ("train/kl", "KL to the starting model (k3)"),
    ),
    title="SmolLM2-135M-Instruct, GRPO through train_ppo_ray on reasoning-gym (mean over seeds)",
)


def first_step_bins(run: Path, metrics: dict[str, dict[str, float]], calls_per_step: int) -> dict:
    """The first training step's token shares and clip rates per old-probability bin: the band's own
    metrics (band/tokens_*, band/clipped_*) or, for OpenRLHF's clip, the shim's clip_bins probe (its
    first `calls_per_step` loss calls). The same definition either way (the active clipped branch)."""
    if f"train/band/tokens_{BIN_NAMES[0]}" in metrics:
        tokens = {b: metrics[f"train/band/tokens_{b}"].get("1") for b in BIN_NAMES}
        clipped = {b: metrics[f"train/band/clipped_{b}"].get("1") for b in BIN_NAMES}
    else:
        path = run / "clip_bins.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()][:calls_per_step] if path.exists() else []
        if not records:
            return {}
        total = sum(sum(r["tokens"].values()) for r in records)
        tokens = {b: sum(r["tokens"][b] for r in records) / total for b in BIN_NAMES}
        clipped = {b: sum(r["clipped"][b] for r in records) / total for b in BIN_NAMES}
    return {
        "tokens": tokens,
        "clip_rate": {b: (clipped[b] / tokens[b] if tokens[b] else None) for b in BIN_NAMES},
    }


def calls_per_step(run: Path) -> int:
    """Loss calls (micro-batches) of one training step of `run`, from its args.txt (run.sh's flags)."""
    args = (run / "args.txt").read_text().split("\n")

    def value(flag: str) -> int:
        return int(args[len(args) - 1 - args[::-1].index(flag) + 1])  # the last occurrence wins, as in argparse

    return -(
        -value("--rollout.batch_size") * value("--rollout.n_samples_per_prompt") // value("--train.micro_batch_size")
    )


def summarize(run: Path, before: Path, seconds: float) -> dict:
    from openrlhf_band.launcher.results import load_scalars

    scalars = load_scalars(run / "tensorboard")
    metrics = {tag: {str(step): v for step, v in series.items()} for tag, series in scalars.items()}
    calls = calls_per_step(run)
    steps = max((int(s) for s in metrics.get("train/rollout/reward_mean", {})), default=0)
    settings = run / "settings.json"
    summary = {
        "settings": json.loads(settings.read_text()) if settings.exists() else None,
        "before": json.loads(before.read_text()),
        "after": json.loads((run / "after.json").read_text()),
        "steps": steps,
        "seconds": seconds,
        "seconds_per_step": statistics.fmean(metrics["train/timing/step_total"].values()),
        "first_step_bins": first_step_bins(run, metrics, calls),
        "metrics": metrics,
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


BIN_METHODS = ("clip", "clip-higher", "band-kl")  # the paper's argument: the fixed clips against the kl band


def first_step(out: Path, methods: list[str]) -> int:
    """One step of each method from the same model and seed, for the per-bin clip rates (vLLM's CPU
    sampling does not repeat its noise, so the rollouts differ: docs/e2e_cpu.md); then the starting
    model's token bins (evaluate.py) and token_bins.txt / .json."""
    status = 0
    for method in methods:
        run_dir = out / method
        if (run_dir / "tensorboard").is_dir() and (run_dir / "args.txt").exists():
            continue
        args = ["bash", str(RUN_SH), str(run_dir), *METHODS[method], "--train.seed", str(SEED0)]
        print(f"[study] first step of {method}", flush=True)
        env = {**os.environ, "SMOL_STEPS": "1", "SMOL_EVAL_SAMPLES": "0"}
        status |= subprocess.run(args, env=env).returncode
    return status


def token_bins(out: Path, before: Path, docs: Path, command: str) -> str:
    from openrlhf_band.launcher.results import load_scalars

    start = json.loads(before.read_text())
    rows = {}
    for method in METHODS:
        run_dir = out / method
        if not (run_dir / "args.txt").exists():
            continue
        metrics = {t: {str(k): v for k, v in s.items()} for t, s in load_scalars(run_dir / "tensorboard").items()}
        rows[method] = first_step_bins(run_dir, metrics, calls_per_step(run_dir)) | {
            "ppo_clip_ratio": metrics.get("train/ppo_clip_ratio", {}).get("1"),
            "ppo_kl": metrics.get("train/ppo_kl", {}).get("1"),
            "step_seconds": metrics.get("train/timing/step_total", {}).get("1"),
            "tokens_per_sample": metrics.get("train/total_length", {}).get("1"),  # prompt + reply
            "reply_tokens": metrics.get("train/rollout/response_length_mean", {}).get("1"),
        }
    lines = [
        f"command: {command}",
        f"starting model, its own sampled reply tokens ({start['tokens']} tokens: {start['prompts']} held-out "
        f"prompts x {start['samples_per_prompt']} samples, T=1), share per probability bin:",
        "  " + "  ".join(f"{b} {start['token_bins'][b]:.3f}" for b in BIN_NAMES),
        "",
        "first training step (same model, same seed; vLLM's CPU sampling does not repeat, so each method's "
        "rollout differs), share of tokens per old-probability bin and the clip rate within it (clipped / tokens):",
        f"{'method':<13}" + "".join(f"{'share ' + b:>17}{'clip ' + b:>17}" for b in BIN_NAMES)
        + f"{'clip all':>10}{'ppo_kl':>9}",
    ]  # fmt: skip
    for method, row in rows.items():
        if not row.get("tokens"):
            continue
        rates = [row["clip_rate"][b] for b in BIN_NAMES]
        cells = "".join(
            f"{row['tokens'][b]:>17.4f}" + (f"{rate:>17.4f}" if rate is not None else f"{'-':>17}")
            for b, rate in zip(BIN_NAMES, rates)
        )
        lines.append(f"{method:<13}{cells}{row['ppo_clip_ratio']:>10.4f}{row['ppo_kl']:>9.4f}")
    text = "\n".join(lines) + "\n"
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "token_bins.txt").write_text(text)
    record = {
        "command": command,
        "starting_model": {k: v for k, v in start.items() if k != "model"},
        "first_step": rows,
    }
    (docs / "token_bins.json").write_text(json.dumps(record, indent=1) + "\n")
    return text


def expected_settings(method: str, seed: int, steps: int) -> dict:
    """What run.sh would record as this run's settings.json now (SMOL_SETTINGS_ONLY=1: no venv, no model)."""
    args = ["bash", str(RUN_SH), os.devnull, *METHODS[method], "--train.seed", str(SEED0 + seed)]
    env = {**os.environ, "SMOL_STEPS": str(steps), "SMOL_SETTINGS_ONLY": "1"}
    return json.loads(subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout)


def run(out: Path, seeds: int, methods: list[str], steps: int, ledger: Path | None) -> int:
    """The study's runs under `out`. With a ledger (default studies/smollm2/results/runs/, committed), a run
    finished earlier (on this machine or another) is taken from it when its settings equal this study's, and
    each run that finishes here is copied into it: the study resumes on a machine without the earlier out/."""
    chosen = {method: METHODS[method] for method in methods}
    kept = Ledger(ledger) if ledger else None

    def restore(method: str, seed: int, run_dir: Path) -> bool:
        summary = kept.read(method, seed) if kept else None
        if summary is None:
            return False
        record = kept.path(method, seed)
        expected = expected_settings(method, seed, steps)
        if summary.get("settings") != expected:
            sys.exit(
                f"{record} was run with other settings than this study's:\n  recorded {summary.get('settings')}\n"
                f"  this study {expected}\nrun with the recorded settings, or move {ledger} aside to start anew"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(record.read_text())
        print(f"[study] {method} seed {seed}: finished earlier ({record})", flush=True)
        return True

    def keep(method: str, seed: int, run_dir: Path) -> None:
        if kept:
            kept.copy(method, seed, run_dir / "summary.json")

    return run_pairs(RUN_SH, out, seeds, chosen, {"SMOL_STEPS": str(steps)}, SEED0, restore, keep)


def ledger_runs(ledger: Path) -> dict[str, dict[int, dict]]:
    """The ledger's runs as load_runs gives out/'s: method -> seed -> summary."""
    return Ledger(ledger).runs(METHODS)


def ledger_table(ledger: Path) -> str:
    """The finished runs of the ledger as a Markdown table (docs/smollm2_study.md shows it while the study runs):
    held-out reward, entropy and answer_found before -> after, and the run's seconds; method order, then seed."""
    rows = []
    for method, by_seed in ledger_runs(ledger).items():
        for seed, s in sorted(by_seed.items()):
            moved = [f"{s['before'][k]:.3f} -> {s['after'][k]:.3f}" for k in ("mean_reward", "entropy", "answer_found")]
            rows.append([method, str(seed), *moved, f"{s['seconds']:.0f}"])
    head = ["method", "seed", "reward", "entropy (nats)", "answer found", "run s"]
    return "\n".join(markdown_table(head, rows)) + "\n"


def paired_table(runs: dict[str, dict[int, dict]]) -> str:
    """docs/smollm2_study.md's results table: held-out reward and entropy (nats) after training, mean +- sd over
    seeds, the rise over the starting model, the paired difference to clip (same seed), and the share of replies
    that ran into the token budget (a degenerate run's sign)."""
    head = ["method", "reward after", "rise over the start", "reward - clip", "entropy after", "entropy - clip",
            "replies at the budget"]  # fmt: skip
    rows, clip = [], runs["clip"]
    for method, by_seed in runs.items():
        seeds = sorted(by_seed)
        after = {k: mean_sd([by_seed[i]["after"][k] for i in seeds], signed=False) for k in ("mean_reward", "entropy")}
        to_clip = {k: mean_sd(paired_by_seed(by_seed, clip, lambda s, k=k: s["after"][k])[1])
                   for k in ("mean_reward", "entropy")} if method != "clip" else dict.fromkeys(after, "-")  # fmt: skip
        rise = mean_sd([by_seed[i]["after"]["mean_reward"] - by_seed[i]["before"]["mean_reward"] for i in seeds])
        budget = mean_sd([by_seed[i]["after"]["truncated"] for i in seeds], signed=False)
        rows.append([method, after["mean_reward"], rise, to_clip["mean_reward"], after["entropy"], to_clip["entropy"],
                     budget])  # fmt: skip
    return "\n".join(markdown_table(head, rows)) + "\n"


def report(out: Path, docs: Path, command: str) -> str:
    runs = load_paired_runs(out, list(METHODS))
    docs.mkdir(parents=True, exist_ok=True)
    before = next(iter(runs["clip"].values()))["before"]

    def cost(by_seed: dict[int, dict]) -> str:
        return f"{statistics.fmean(s['seconds_per_step'] for s in by_seed.values()):>9.1f}"

    lines = [
        f"command: {command}",
        f"model: SmolLM2-135M-Instruct (openrlhf-band prepare-model), float32; held-out: {before['prompts']} prompts x "
        f"{before['samples_per_prompt']} samples at T=1 (vLLM CPU build)",
        f"starting model: mean_reward {before['mean_reward']:.3f}, entropy {before['entropy']:.3f} +- "
        f"{before['entropy_se']:.3f} nats (sampled-token NLL), answer_found {before['answer_found']:.3f}, "
        f"reply_tokens {before['reply_tokens']:.1f}",
        steps_and_seeds(runs),
        "",
        *final_section("held-out after training, mean +- sd over seeds:", runs, FINAL_KEYS, f"{'s/step':>9}", cost),
        "",
        *rise_section("rise over the starting model (after - before), mean +- sd over seeds:", runs, FINAL_KEYS),
    ]
    clip_rise = [s["after"]["mean_reward"] - s["before"]["mean_reward"] for s in runs["clip"].values()]
    _, clip_sd = mean_and_sd([s["after"]["mean_reward"] for s in runs["clip"].values()])
    if clip_sd is not None:
        ratio = statistics.fmean(clip_rise) / clip_sd if clip_sd else float("inf")
        lines.append(f"clip's held-out reward moved {statistics.fmean(clip_rise):+.3f}, {ratio:.1f}x its seed spread "
                     f"({clip_sd:.3f}); the study asks for >= 3x")  # fmt: skip
    lines += ["", *paired_section(runs, FINAL_KEYS)]
    lines += ["", "where the sampled tokens are: share of the starting model's sampled reply tokens per p bin",
              "  " + "  ".join(f"{b} {before['token_bins'][b]:.3f}" for b in BIN_NAMES)]  # fmt: skip
    lines += ["", "first training step: share of tokens per old-probability bin and the clip rate within the bin "
              "(clipped / tokens), mean over seeds:",
              f"{'method':<15}" + "".join(f"{'share ' + b:>18}{'clip ' + b:>18}" for b in BIN_NAMES)]  # fmt: skip
    for method, by_seed in runs.items():
        cells = []
        for b in BIN_NAMES:
            shares = [s["first_step_bins"]["tokens"][b] for s in by_seed.values() if s["first_step_bins"]]
            rates = [s["first_step_bins"]["clip_rate"][b] for s in by_seed.values() if s["first_step_bins"]]
            rates = [r for r in rates if r is not None]
            cells.append(f"{statistics.fmean(shares):>18.4f}" if shares else f"{'-':>18}")
            cells.append(f"{statistics.fmean(rates):>18.4f}" if rates else f"{'-':>18}")
        lines.append(f"{method:<15}" + "".join(cells))
    lines += ["", "the page's table (docs/smollm2_study.md):", paired_table(runs)]
    text = "\n".join(lines)
    write_report(docs, text, _stats(runs, command), runs, STEP_COLUMNS, CURVES)
    return text


def _stats(runs: dict[str, dict[int, dict]], command: str) -> dict:
    some = next(iter(runs["clip"].values()))

    def final(by_seed: dict[int, dict], k: str) -> dict:
        after = [s["after"][k] for s in by_seed.values()]
        after_mean, after_sd = mean_and_sd(after)
        return {"after": after, "after_mean": after_mean, "after_sd": after_sd}

    methods = stats_by_method(runs, FINAL_KEYS, final)
    for method, by_seed in runs.items():
        methods[method]["first_step_bins"] = {str(seed): s["first_step_bins"] for seed, s in sorted(by_seed.items())}
        methods[method]["seconds_per_step"] = statistics.fmean(s["seconds_per_step"] for s in by_seed.values())
    return {"command": command, "before": {k: v for k, v in some["before"].items() if k != "model"}, "methods": methods}


def main() -> int:
    parser, sub, r = study_cli(__doc__.split("\n\n")[0], list(METHODS), 8, "out/smollm2-study",
                               "studies/smollm2/results", "make smollm2-study")  # fmt: skip
    r.add_argument("--ledger", default=str(LEDGER),
                   help="finished runs' summaries kept across machines (committed); 'none': out/ only")  # fmt: skip
    f = sub.add_parser("first-step", help="one step of clip, Clip-Higher and band-kl, then token_bins.txt")
    f.add_argument("--out", type=Path, default=Path("out/smollm2-first-step"))
    f.add_argument("--methods", nargs="+", default=list(BIN_METHODS), choices=list(METHODS))
    f.add_argument("--before", type=Path, required=True, help="evaluate.py's JSON of the starting model")
    f.add_argument("--docs", type=Path, default=Path("studies/smollm2/results"))
    led = sub.add_parser("ledger", help="the ledger's finished runs as a Markdown table")
    led.add_argument("--ledger", type=Path, default=LEDGER)
    s = sub.add_parser("summarize")
    s.add_argument("--run", type=Path, required=True)
    s.add_argument("--before", type=Path, required=True)
    s.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    if args.command == "run":
        ledger = None if args.ledger == "none" else Path(args.ledger)
        return run(args.out, args.seeds, args.methods, args.steps, ledger)
    if args.command == "first-step":
        status = first_step(args.out, args.methods)
        command = f"python studies/smollm2/study.py first-step --before {args.before}"
        print(token_bins(args.out, args.before, args.docs, command), end="")
        return status
    if args.command == "ledger":
        print(ledger_table(args.ledger), end="")
        return 0
    if args.command == "summarize":
        summarize(args.run, args.before, args.seconds)
        return 0
    print(report(args.out, args.docs, args.command_line), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
