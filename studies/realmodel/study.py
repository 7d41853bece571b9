"""The real-model question, exactly paired: SmolLM2-135M-Instruct through studies/realmodel/loop.py
(seeded sampling, OpenRLHF's Actor, the methods' real losses) on the calibrated reasoning-gym task.

    .venv-e2e/bin/python studies/realmodel/study.py probe      replay probe   (make realmodel-probe)
    .venv-e2e/bin/python studies/realmodel/study.py pairs      paired study   (make realmodel-pairs)
    .venv-e2e/bin/python studies/realmodel/study.py report     tables from the committed ledger
    .venv-e2e/bin/python studies/realmodel/study.py probe-report   probe.md from the committed probe.json

`pairs` runs clip and band-kl seed by seed (a stopped study holds whole pairs), skips runs whose ledger
entry (results/runs/METHOD-seedS.json, committed) has this study's settings, and stops at the rule
written before its first pair (`stopping_rule`; docs/smollm2_study.md, "The stopping rule"). `touch
out/realmodel/STOP` stops it before its next run. `probe` writes results/probe.json and probe.md.
Nothing here runs in CI; the design, the predictions and the results are in docs/smollm2_study.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402
import loop  # noqa: E402

# the running, the ledger, the paired statistics and the table layout are the studies' one driver's; this file holds
# what is the study's own: its task, settings, run, outcomes and stopping rule, and the replay probe
from paired_runs import Ledger, Stop, interval, markdown_table, paired_by_seed, run_seeds, sign_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "realmodel" / "results"
LEDGER = RESULTS / "runs"
WORK = ROOT / "out" / "realmodel"
#: the calibrated setting (results/calibration.md): its name in calibrate.CANDIDATES
TASK = "spell_backward len<=3, 4 shots"
# spell_backward's words of up to 3 letters are ~1,400 distinct items: training and held-out rows fit beside each
# other at these sizes (96 training prompts a run)
TRAIN_SIZE, EVAL_SIZE = 640, 600
EXACT_ROWS, SAMPLED_ROWS, SAMPLED_N = 256, 256, 2
PAIRED = ("clip", "band-kl")
#: the probe's methods: the three its predictions name first; Clip-Higher and CISPO when time allows
PROBE_METHODS = ("clip", "band-kl", "band-kl-floor", "clip-higher", "cispo")
EVAL_SEED = 0  # the sampled evaluation's uniforms: the same numbers for every run and the start
MID_STEP = 6  # the probe's mid-training checkpoint: clip, seed 0, after this many steps
CONFIG = loop.LoopConfig()


def task() -> tuple[loop.Task, list[dict], list[dict]]:
    """(task, exact rows, sampled rows): the calibrated setting's data, held-out rows round-robin over tasks."""
    data = calibrate.prepare(calibrate.CANDIDATES[TASK], WORK / "data", size=TRAIN_SIZE, eval_size=EVAL_SIZE)
    t = loop.Task.load(data)
    held = calibrate.interleave(t.eval, len(t.eval))
    if len(held) < max(EXACT_ROWS, SAMPLED_ROWS):
        raise SystemExit(
            f"{data}: {len(held)} held-out rows after de-duplication, the study needs "
            f"{max(EXACT_ROWS, SAMPLED_ROWS)}: lower TRAIN_SIZE or choose a task with more items"
        )
    return t, held[:EXACT_ROWS], held[:SAMPLED_ROWS]


def settings() -> dict:
    """What makes two runs comparable (a ledger entry is reused only when its settings equal these)."""
    # through JSON, as the ledger stores it (tuples become lists)
    return json.loads(
        json.dumps(
            {
                "task": TASK,
                "prepare": calibrate.CANDIDATES[TASK],
                "train_size": TRAIN_SIZE,
                "eval_size": EVAL_SIZE,
                "exact_rows": EXACT_ROWS,
                "sampled_rows": SAMPLED_ROWS,
                "sampled_n": SAMPLED_N,
                "config": asdict(CONFIG),
                "model": "smollm2-135m-instruct",
            }
        )
    )


def ledger_entry(method: str, seed: int) -> dict | None:
    """The run's ledger entry when it has this study's settings (a run with others is run again, over it)."""
    return Ledger(LEDGER).entry(method, seed, settings())


def run_one(method: str, seed: int, save_mid: bool = False) -> dict:
    t, exact_rows, sampled_rows = task()

    def on_step(step: int, policy: loop.Policy) -> None:
        if save_mid and step == MID_STEP:
            policy.model.save_pretrained(WORK / "mid-clip")
            policy.tokenizer.save_pretrained(WORK / "mid-clip")

    start_eval()
    result = loop.run(
        calibrate.MODEL,
        t,
        method,
        seed,
        CONFIG,
        eval_rows=exact_rows,
        sampled_rows=sampled_rows,
        sampled_n=SAMPLED_N,
        eval_seed=EVAL_SEED,
        eval_every=0,
        on_step=on_step,
    )
    result["settings"] = settings()
    Ledger(LEDGER).write(method, seed, result)
    return result


# ---------------------------------------------------------------------------------------------- the pairs
def start_eval() -> dict:
    """The starting model's sampled, greedy and exact evaluations (results/start.json, made once)."""
    path = RESULTS / "start.json"
    if path.exists():
        entry = json.loads(path.read_text())
        if entry.get("settings") == settings():
            return entry
    t, exact_rows, sampled_rows = task()
    policy = loop.Policy(calibrate.MODEL, CONFIG.threads)
    entry = {
        "settings": settings(),
        "sampled": loop.sampled_eval(policy, t, sampled_rows, SAMPLED_N, EVAL_SEED, CONFIG.max_new_tokens),
        "greedy": loop.sampled_eval(policy, t, sampled_rows, 1, EVAL_SEED, CONFIG.max_new_tokens, greedy=True),
        "exact": loop.exact_eval(policy, exact_rows),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return entry


#: outcome -> (its value in a ledger entry, its value in start.json); the primary first (docs/smollm2_study.md)
OUTCOMES = {
    "sampled_reward": (lambda r: r["sampled"]["mean_reward"], lambda s: s["sampled"]["mean_reward"]),
    "exact_entropy": (lambda r: r["exact"][-1]["entropy"], lambda s: s["exact"]["entropy"]),
    "exact_p_canonical": (lambda r: r["exact"][-1]["mean_p_correct"], lambda s: s["exact"]["mean_p_correct"]),
    "greedy_reward": (lambda r: r["greedy"]["mean_reward"], lambda s: s["greedy"]["mean_reward"]),
}


def paired_gains(outcome: str = "sampled_reward") -> dict:
    """Per seed with both methods: band-kl's final `outcome` minus clip's, and clip's change over the start."""
    read, read_start = OUTCOMES[outcome]
    start = json.loads((RESULTS / "start.json").read_text()) if (RESULTS / "start.json").exists() else None
    runs = Ledger(LEDGER).runs(PAIRED, settings())
    clip = runs.get("clip", {})
    seeds, gains = paired_by_seed(runs.get("band-kl", {}), clip, read)
    rises = [read(clip[seed]) - read_start(start) for seed in seeds] if start is not None else []
    return {"outcome": outcome, "seeds": seeds, "gains": gains, "clip_rises": rises, **interval(gains)}


def stopping_rule(pairs: dict) -> str | None:
    """The rule written before the first pair (docs/smollm2_study.md, "The stopping rule"): stop at 12 pairs,
    or from 4 pairs on once the 95% interval of the paired gain excludes 0 or its half-width is under 0.3 x
    clip's mean rise. Returns why it stops, or None."""
    n = pairs["n"]
    if n >= 12:
        return "12 pairs"
    if n < 4 or pairs["ci95"] is None:
        return None
    lo, hi = pairs["ci95"]
    if lo > 0 or hi < 0:
        return f"the 95% interval [{lo:+.4f}, {hi:+.4f}] excludes 0"
    rise = statistics.fmean(pairs["clip_rises"])
    if (hi - lo) / 2 < 0.3 * abs(rise):
        return f"the interval's half-width {(hi - lo) / 2:.4f} < 0.3 x clip's rise {rise:.4f}"
    return None


def pairs_main(max_seeds: int) -> int:
    """The pairs through the driver: the rule checked before each seed, the tables rewritten after it. A STOP file
    stops the study at once, before any (seed, method), and stays (every call stops until it is removed)."""

    def run(method: str, seed: int) -> bool:
        print(f"[realmodel] {method} seed {seed}", flush=True)
        r = run_one(method, seed, save_mid=(method == "clip" and seed == 0))
        print(
            f"[realmodel] {method} seed {seed}: exact p_correct {r['exact'][0]['mean_p_correct']:.4f} -> "
            f"{r['exact'][-1]['mean_p_correct']:.4f}, {r['seconds']:.0f} s",
            flush=True,
        )
        return True  # a failed run raises: the study stops there, its ledger holds every run before it

    stop = Stop(WORK / "STOP", said="STOP file: stopping", status=0, consumed=False, at_once=True)
    return run_seeds(
        range(max_seeds),
        PAIRED,
        finished=lambda method, seed: ledger_entry(method, seed) is not None,
        run=run,
        stop=stop,
        log="[realmodel]",
        stopping_rule=lambda: stopping_rule(paired_gains()),
        after_seed=lambda seed: report(),
    )


# ---------------------------------------------------------------------------------------------- the probe
def probe_batches(policy: loop.Policy, t: loop.Task, source: str, seeds: range) -> list[tuple[str, int, loop.Rollout]]:
    out = []
    for s in seeds:
        rows = loop.step_prompts(t, s, 1, CONFIG.prompts)
        uniforms = loop.step_uniforms(s, 1, CONFIG.prompts * CONFIG.samples, CONFIG.max_new_tokens)
        out.append((source, s, loop.make_rollout(policy, t, rows, CONFIG.samples, uniforms, CONFIG.max_new_tokens)))
    return out


def probe_main(start_batches: int, mid_batches: int, eval_rows: int, methods: list[str]) -> int:
    """Each batch updated once (one rollout: 8 mini-batches, one epoch) from identical weights, in the
    same mini-batch order, by every PROBE_METHODS method; per-token change of log-probability by
    old-probability bin and advantage sign, and the change of the held-out exact numbers."""
    t, exact_rows, _ = task()
    rows = exact_rows[:eval_rows]
    sources = {"start": calibrate.MODEL}
    if mid_batches:
        if not (WORK / "mid-clip" / "config.json").exists():
            print(f"[probe] no {WORK / 'mid-clip'}: run `study.py pairs` (clip seed 0 saves it) first", flush=True)
            return 2
        sources["mid-clip"] = WORK / "mid-clip"
    out_path = RESULTS / "probe.json"
    done = json.loads(out_path.read_text()) if out_path.exists() else {"settings": settings(), "batches": []}
    if done.get("settings") != settings():
        done = {"settings": settings(), "batches": []}
    have = {(b["source"], b["seed"]) for b in done["batches"]}
    for source, model_dir in sources.items():
        n = start_batches if source == "start" else mid_batches
        seeds = range(1000, 1000 + n) if source == "start" else range(2000, 2000 + n)
        if all((source, s) in have for s in seeds):
            continue
        policy = loop.Policy(model_dir, CONFIG.threads)
        weights = policy.state()
        before = loop.exact_eval(policy, rows)
        for _, seed, rollout in probe_batches(policy, t, source, seeds):
            if (source, seed) in have:
                continue
            start = time.time()
            entry = {
                "source": source,
                "seed": seed,
                "reward": rollout.rewards.mean().item(),
                "informative_groups": loop.informative_share(rollout.rewards, CONFIG.samples),
                "before": before,
                "methods": loop.replay(
                    policy, weights, rollout, methods, CONFIG, loop.derived_seed(seed, "order", 1), rows
                ),
            }
            entry["seconds"] = round(time.time() - start, 1)
            done["batches"].append(entry)
            out_path.write_text(json.dumps(done, indent=1) + "\n")
            print(f"[probe] {source} batch {seed}: reward {entry['reward']:.3f}, {entry['seconds']:.0f} s", flush=True)
    probe_report(done)
    return 0


def _pooled(tokens: dict, names: tuple[str, ...], sign: str) -> float:
    """Token-weighted mean change of log-probability over the named bins for one advantage sign."""
    n = sum(tokens[f"{b}/{sign}"]["tokens"] for b in names)
    if not n:
        return math.nan
    return (
        sum(
            tokens[f"{b}/{sign}"]["tokens"] * tokens[f"{b}/{sign}"]["mean_dlogp"]
            for b in names
            if tokens[f"{b}/{sign}"]["tokens"]
        )
        / n
    )


RARE = ("p<0.01", "p0.01-0.1")


#: the predictions, written in docs/smollm2_study.md before the probe ran: (name, method a, method b,
#: bins, advantage sign or outcome, the predicted sign of a - b)
PREDICTIONS = (
    ("P1 the band raises rare positive-advantage tokens more than clip", "band-kl", "clip", RARE, "pos", +1),
    ("P2 the band pushes rare negative-advantage tokens further down than clip", "band-kl", "clip", RARE, "neg", -1),
    (
        "P3 the floor undoes P2 (band-kl-floor above band-kl on rare negatives)",
        "band-kl-floor",
        "band-kl",
        RARE,
        "neg",
        +1,
    ),
)


def probe_tables(done: dict) -> tuple[list[str], dict]:
    """The probe's tables (markdown lines) and its summary, from probe.json's content."""
    batches = done["batches"]
    methods = [m for m in PROBE_METHODS if all(m in b["methods"] for b in batches)]
    lines = [
        "Per batch: mean change of log-probability (nats) of the rare sampled tokens (old p < 0.1), by "
        "advantage sign, after one rollout's update from identical weights.",
        "",
    ]
    head = "| batch | reward | " + " | ".join(f"{m} +A | {m} -A" for m in methods) + " |"
    lines += [head, "|" + "---|" * (2 + 2 * len(methods))]
    for b in batches:
        cells = [f"{_pooled(b['methods'][m]['tokens'], RARE, s):+.3f}" for m in methods for s in ("pos", "neg")]
        lines.append(f"| {b['source']} {b['seed']} | {b['reward']:.3f} | " + " | ".join(cells) + " |")
    summary = {"predictions": []}
    lines += [
        "",
        "| prediction | batches agreeing | p (sign test, two-sided) | mean of first method - second (nats) |",
        "|---|---|---|---|",
    ]
    for name, a, b, bins, sign, predicted in PREDICTIONS:
        diffs = [
            predicted
            * (_pooled(x["methods"][a]["tokens"], bins, sign) - _pooled(x["methods"][b]["tokens"], bins, sign))
            for x in batches
        ]
        test = sign_test(diffs)
        valid = [d for d in diffs if d == d]
        mean = statistics.fmean(valid) * predicted if valid else math.nan
        summary["predictions"].append({"name": name, **test, "mean_difference": mean})
        lines.append(f"| {name} | {test['positive']} of {test['n']} | {test['p_two_sided']:.3f} | {mean:+.3f} |")
    lines += [
        "",
        "One rollout's change of the held-out exact numbers, paired against clip per batch (method minus clip):",
        "",
        "| method | d p(correct) mean | batches above clip | p | d entropy mean (nats) | batches above clip | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in methods[1:]:
        dp = [
            x["methods"][m]["after"]["mean_p_correct"] - x["methods"]["clip"]["after"]["mean_p_correct"]
            for x in batches
        ]
        de = [x["methods"][m]["after"]["entropy"] - x["methods"]["clip"]["after"]["entropy"] for x in batches]
        tp, te = sign_test(dp), sign_test(de)
        summary.setdefault("outcomes", {})[m] = {"dp_correct": dp, "dentropy": de, "sign_p": tp, "sign_entropy": te}
        lines.append(
            f"| {m} | {statistics.fmean(dp):+.4f} | {tp['positive']} of {tp['n']} | {tp['p_two_sided']:.3f} | "
            f"{statistics.fmean(de):+.4f} | {te['positive']} of {te['n']} | {te['p_two_sided']:.3f} |"
        )
    clip_dp = [x["methods"]["clip"]["after"]["mean_p_correct"] - x["before"]["mean_p_correct"] for x in batches]
    clip_de = [x["methods"]["clip"]["after"]["entropy"] - x["before"]["entropy"] for x in batches]
    lines += [
        "",
        f"Clip's own one-rollout change: p(correct) {statistics.fmean(clip_dp):+.4f}, entropy "
        f"{statistics.fmean(clip_de):+.4f} nats (mean over {len(batches)} batches).",
    ]
    return lines, summary


def probe_report(done: dict) -> None:
    lines, summary = probe_tables(done)
    lines = ["<!-- written by studies/realmodel/study.py probe from probe.json; do not edit -->", "", *lines]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probe.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "probe_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines), flush=True)


# ---------------------------------------------------------------------------------------------- report
def pairs_tables() -> tuple[list[str], dict, dict]:
    """The ledger's runs and the paired outcomes as markdown lines, every outcome's gains, and the primary's."""
    pairs = paired_gains()
    rows = []
    for r in Ledger(LEDGER).entries(settings()):
        e0, e1 = r["exact"][0], r["exact"][-1]
        mean_roll = statistics.fmean(s["rollout_reward"] for s in r["steps"])
        rows.append([
            f"{r['method']} seed {r['seed']}", f"{e0['mean_p_correct']:.4f} -> {e1['mean_p_correct']:.4f}",
            f"{e0['entropy']:.3f} -> {e1['entropy']:.3f}", f"{r['sampled']['mean_reward']:.3f}",
            f"{r['greedy']['mean_reward']:.3f}", f"{mean_roll:.3f}", f"{r['seconds']:.0f}",
        ])  # fmt: skip
    head = ["run", "exact p(correct) start -> end", "entropy start -> end (nats)", "sampled reward", "greedy reward",
            "mean rollout reward", "s"]  # fmt: skip
    lines = markdown_table(head, rows)

    every = {name: paired_gains(name) for name in OUTCOMES}
    gains = []
    for name, g in every.items():
        ci = f"[{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]" if g["ci95"] else "-"
        mean = f"{g['mean']:+.4f}" if g["mean"] is not None else "-"
        rise = f"{statistics.fmean(g['clip_rises']):+.4f}" if g["clip_rises"] else "-"
        gains.append([name, str(g["n"]), mean, ci, rise])
    head = ["outcome (final, band-kl - clip, paired by seed)", "pairs", "mean", "95% interval", "clip's change"]
    lines += ["", *markdown_table(head, gains)]
    lines += ["", f"Stopping rule (on sampled_reward): {stopping_rule(pairs) or 'not met'}."]
    return lines, every, pairs


def report() -> dict:
    lines, every, pairs = pairs_tables()
    lines = ["<!-- written by studies/realmodel/study.py report from results/runs; do not edit -->", "", *lines]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pairs.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "pairs.json").write_text(json.dumps(every, indent=1) + "\n")
    print("\n".join(lines), flush=True)
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pairs")
    p.add_argument("--max-seeds", type=int, default=12)
    p = sub.add_parser("probe")
    p.add_argument("--start-batches", type=int, default=4)
    p.add_argument("--mid-batches", type=int, default=4)
    p.add_argument("--eval-rows", type=int, default=64)
    p.add_argument("--methods", nargs="+", default=list(PROBE_METHODS[:3]), choices=PROBE_METHODS)
    sub.add_parser("report")
    sub.add_parser("probe-report", help="probe.md from the committed probe.json")
    p = sub.add_parser("one")
    p.add_argument("method")
    p.add_argument("seed", type=int)
    args = parser.parse_args()
    torch.set_num_threads(CONFIG.threads)
    if args.command == "pairs":
        return pairs_main(args.max_seeds)
    if args.command == "probe":
        return probe_main(args.start_batches, args.mid_batches, args.eval_rows, args.methods)
    if args.command == "probe-report":
        probe_report(json.loads((RESULTS / "probe.json").read_text()))
        return 0
    if args.command == "one":
        run_one(args.method, args.seed, save_mid=(args.method == "clip" and args.seed == 0))
        return 0
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
