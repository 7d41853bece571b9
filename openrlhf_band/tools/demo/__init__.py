"""`openrlhf-band demo`: GRPO on a CPU in the regime where the clip binds: clip, Clip-Higher, BandPO
(kl, tv, chi2; with the entropy-adaptive radius; with a lower floor), DCPO, DPPO (tv, kl), and one
diagnostic ablation, paired from one warm-up checkpoint per seed.

`make demo` runs DEFAULT_METHODS (clip, band-kl, band-kl-floor, band-kl+clip-low) over 3 seeds x
80 rollouts, two runs at a time (its measured times: docs/demo.md); `--full` every method of METHODS
over 5 seeds; `--quick` clip and band-kl over 1 seed x 15 rollouts.

The task (a "fork": one rare token decides the reward; docs/demo.md). A prompt is [BOS, key,
difficulty]; its one correct response is 6 answer tokens determined by the key. A supervised
warm-up on noisy data (targets correct with probability 0.88 at the five easy positions; at the fork
position, the 4th token, 0.05 on hard prompts and 0.3 on medium ones, else a distractor) leaves the
model near those probabilities: the correct fork token on hard prompts at p = 0.108 in the committed
full run (docs/demo_summary.txt).
The reward is exact match (+1 correct, 0 else), so a rare correct fork token is what a group's
advantage rewards, and that token is where a fixed clip caps the rise (q <= 1.2 p per rollout).

The regime. Each rollout (16 prompts x 16 samples) is trained for 4 epochs of 8 minibatches with
Adam at lr 1e-4: 32 small steps on the same samples, so a token's own earlier updates move its
ratio and the clip binds (with one epoch, a token's clip is only ever triggered by other tokens'
updates and every method looks alike). Loss settings as the paper's: seq-mean-token-mean, the k3
KL loss at 0.001 to the warm-up model, group-normalised advantages; the losses are OpenRLHF's own
`PolicyLoss` (clip, Clip-Higher) and this project's `BandPolicyLoss` (band, floor, DPPO, DCPO, the
ablation), each band variant through the loss's own options (lower_floor, adaptive, lower_delta,
ratio_truncation, upper_cap=None), DCPO and the ablation through bounds_fn.

Metrics, fixed before the runs: mean@32 and pass@32 overall and on hard prompts, computed exactly
from P(correct response) = prod_t pi(c_t | prompt, c_<t) on 256 fixed evaluation prompts
(mean@32 = P, pass@32 = 1 - (1 - P)^32: the expectations of the 32-sample estimators); token
entropy along the correct response; and clip rates per old-probability bin, each method under its
own bounds: the share of positive-advantage tokens clipped above and of negative-advantage tokens
clipped below. Differences to clip are paired: same seed, same warm-up checkpoint, same prompts
and sampling noise.

The package, one module per concern: config.py (DemoConfig), task.py (the fork task, its tiny model,
warm-up, evaluation, sampling and reward), methods.py (what the demo reads of each method, its bounds
and loss), loop.py (the GRPO loop, task-free: any Hugging Face causal LM runs through it), runs.py (one
method at one seed, the warm-up checkpoints, the workers' jobs), mechanism.py (the one-update check),
report.py (paired differences, clip rates, summary, curves, CSV); here: `run` and the command line.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from openrlhf_band.tools.demo.config import DemoConfig
from openrlhf_band.tools.demo.loop import (
    BINS,
    ClipStats,
    GRPOTrainer,
    LoopSettings,
    Samples,
    as_actor,
    group_advantages,
    train_grpo,
)
from openrlhf_band.tools.demo.mechanism import format_mechanism, mechanism_check
from openrlhf_band.tools.demo.methods import DEFAULT_METHODS, METHODS, make_loss, method_anchor, method_bounds
from openrlhf_band.tools.demo.report import (
    REPORTED,
    _write_csv,
    format_summary,
    paired_differences,
    plot,
    pooled_clip_rates,
)
from openrlhf_band.tools.demo.runs import _job, _warm_job, train_method, warm_checkpoint
from openrlhf_band.tools.demo.task import (
    build_actor,
    build_model,
    correct_response,
    evaluate,
    exact_match_reward,
    fork_distractor,
    sample_group,
    sample_prompts,
    sample_responses,
    vocab_size,
    warm_up,
)

__all__ = [
    "BINS", "DEFAULT_METHODS", "FULL", "METHODS", "QUICK", "REPORTED", "ClipStats", "DemoConfig", "GRPOTrainer",
    "LoopSettings", "Samples", "add_arguments", "as_actor", "build_actor", "build_model", "config_from_args",
    "correct_response", "evaluate", "exact_match_reward", "fork_distractor", "format_mechanism", "format_summary",
    "group_advantages", "main", "make_loss", "mechanism_check", "method_anchor", "method_bounds", "paired_differences",
    "plot", "pooled_clip_rates", "run", "sample_group", "sample_prompts", "sample_responses", "train_grpo",
    "train_method", "vocab_size", "warm_checkpoint", "warm_up",
]  # fmt: skip


def run(cfg: DemoConfig) -> dict:
    """Every method at every seed (warm-up checkpoints first), `cfg.workers` spawned processes at a time;
    writes OUT/metrics.csv (after each run), curves.png and summary.txt, prints the summary. Returns the
    rows, the mean warm-up evaluation and the mechanism check."""
    import multiprocessing

    from tqdm import tqdm

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    jobs = [(method, seed, cfg) for seed in range(cfg.seeds) for method in cfg.methods]
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, cfg.workers)) as pool:
        list(pool.imap_unordered(_warm_job, [(cfg, s) for s in range(cfg.seeds)]))
        rows = []
        with tqdm(total=len(jobs), desc="runs (method x seed)") as bar:
            for result in pool.imap_unordered(_job, jobs):
                rows += result
                rows.sort(key=lambda r: (cfg.methods.index(r["method"]), r["seed"], r["step"]))
                _write_csv(rows, out / "metrics.csv")  # after every run: a late failure loses nothing
                bar.update(1)
    starts = [r for r in rows if r["step"] == 0 and r["method"] == cfg.methods[0]]
    start = {k: statistics.fmean(r[k] for r in starts) for k in ("mean@32", "mean@32_hard", "pass@32", "entropy",
                                                                 "p_fork_hard")}  # fmt: skip
    mechanism = mechanism_check(cfg, torch.load(warm_checkpoint(cfg, 0), weights_only=True))
    plot(rows, cfg, out / "curves.png")
    text = format_summary(rows, cfg, start, mechanism)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'metrics.csv'}, {out / 'curves.png'}, {out / 'summary.txt'} in {time.time() - started:.0f} s")
    return {"rows": rows, "start": start, "mechanism": mechanism}


FULL = {"seeds": 5, "rollouts": 80, "methods": list(METHODS)}
QUICK = {"seeds": 1, "rollouts": 15, "methods": ["clip", "band-kl"], "eval_every": 5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo subcommand's flags."""
    full = f"every method ({len(FULL['methods'])}), {FULL['seeds']} seeds, {FULL['rollouts']} rollouts"
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"{full} (docs/demo.md: the committed summary is an 8-method run, with its command)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: clip and band-kl, 1 seed, 15 rollouts")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--methods", nargs="+", default=None, choices=list(METHODS))
    parser.add_argument("--workers", type=int, default=None, help="parallel runs (default 2)")
    parser.add_argument(
        "--lag", type=int, default=None,
        help="policy versions the sampler lags by, as an asynchronous trainer's (default 0: the current weights); "
        "its log-probs are the rollout engine's mu (studies/staleness)",
    )  # fmt: skip
    parser.add_argument("--out", default="out/demo")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The run's settings from `add_arguments`' flags: DemoConfig's defaults, then a preset, then explicit flags."""
    if args.full and args.quick:
        raise ValueError("--full and --quick exclude each other")
    cfg = DemoConfig(out=args.out)
    for preset, on in ((FULL, args.full), (QUICK, args.quick)):
        if on:
            for key, value in preset.items():
                setattr(cfg, key, copy.copy(value))
    for key in ("seeds", "rollouts", "methods", "workers", "lag"):
        if getattr(args, key) is not None:
            setattr(cfg, key, list(args.methods) if key == "methods" else getattr(args, key))
    if cfg.seeds < 1 or cfg.rollouts < 3 * cfg.eval_every or cfg.workers < 1 or cfg.lag < 0:
        raise ValueError(f"--seeds >= 1, --rollouts >= {3 * cfg.eval_every}, --workers >= 1 and --lag >= 0, please")
    return cfg


def main(args: argparse.Namespace) -> int:
    """`openrlhf-band demo` (dispatched by module name: openrlhf_band.tools.cli)."""
    run(config_from_args(args))
    return 0
