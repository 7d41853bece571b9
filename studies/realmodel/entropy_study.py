"""The entropy study: does the band keep a real model's entropy higher than clip, and does the floor fix it if
not? SmolLM2-135M-Instruct through studies/realmodel/loop.py (exactly paired: seeded sampling, OpenRLHF's
Actor, the methods' real losses) on a binary-reward task that passes the shortcut audit.

    .venv-e2e/bin/python studies/realmodel/entropy_study.py profile   one short run timed (results/entropy/profile.json)
    .venv-e2e/bin/python studies/realmodel/entropy_study.py pilot     clip alone, 24 steps (results/entropy/pilot/)
    .venv-e2e/bin/python studies/realmodel/entropy_study.py probe     the replay probe (results/entropy/probe.json)
    .venv-e2e/bin/python studies/realmodel/entropy_study.py run       the study, block by block (make realmodel-entropy)
    .venv-e2e/bin/python studies/realmodel/entropy_study.py report    tables from the committed ledger

The design, the outcomes, the stopping rule and the halts are pre-registered in results/entropy/protocol.md
(registered 2026-12-06 after four pilots chose lr 1e-6): `run` and `probe` refuse to start while that file is
not committed or has changes git has not committed, and stamp each ledger entry with the protocol's last commit.
A block is one seed, every arm; `touch out/realmodel/STOP` stops it before its next
run (the run in progress finishes; the ledger keeps every finished run: run it again to go on). One run at a
time, never beside a test suite. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import audit  # noqa: E402
import calibrate  # noqa: E402
import loop  # noqa: E402
from paired_runs import Ledger, Stop, interval, markdown_table, run_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "realmodel" / "results" / "entropy"
LEDGER = RESULTS / "runs"
PROTOCOL = RESULTS / "protocol.md"
WORK = ROOT / "out" / "realmodel"

#: the calibrated task (results/entropy/calibration.md), a name in calibrate.BINARY
TASK = "word_sequence_reversal 2 words, 8 shots, exact"
ARMS = ("clip", "band-kl", "band-kl-floor")
#: the probe's candidates for a fourth arm (protocol.md: one joins only if the probe separates it from band-kl)
PROBE_EXTRA = ("clip-higher", "band-chi2")
EXACT_ROWS = 128  # held-out rows of the exact (teacher-forced) evaluations
SAMPLED_ROWS, SAMPLED_N = 128, 2  # the final held-out sampled evaluation (the validity halt reads it)
EVAL_EVERY = 6  # exact evaluations at steps 0, 6, 12, 18, 24
MIN_BLOCKS, MAX_BLOCKS = 4, 8
HALF_WIDTH = 0.02  # nats: the primary's precision stop (protocol.md: about a quarter of clip's level in the window)
PILOT_SEED, PROBE_SEEDS = 100, (1000, 1001, 1002, 1003)  # outside the study's seeds 0..7
CONFIG = loop.LoopConfig(steps=24, prompts=8, samples=8, minibatches=8, lr=1e-6, max_new_tokens=24)


def probe_summary() -> dict:
    """results/entropy/probe_summary.json ({} before the probe): its verdicts, joins and whether it is complete."""
    path = RESULTS / "probe_summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def study_arms() -> tuple[str, ...]:
    """ARMS and the probe's candidates that joined by the protocol's rule (none while the probe is incomplete)."""
    done = probe_summary()
    joins = done["joins"] if done.get("complete") else []
    return (*ARMS, *[a for a in PROBE_EXTRA if a in joins])


@functools.cache
def task() -> tuple[loop.Task, list[dict]]:
    """(task, held-out rows): the calibrated candidate's data; exits in one line when it fails the shortcut audit.
    Once a process: `run` audits before its first run and every run reuses the loaded task."""
    candidate = calibrate.BINARY[TASK]
    t, held = calibrate.study_split(candidate, WORK / "entropy-data")
    line = audit.refusal(TASK, audit.audit(held, t.train, t.reward_fn))
    if line is not None:
        raise SystemExit(line)
    if len(held) < max(EXACT_ROWS, SAMPLED_ROWS):
        raise SystemExit(f"{TASK}: {len(held)} held-out rows, the study needs {max(EXACT_ROWS, SAMPLED_ROWS)}")
    return t, held


def settings(cfg: loop.LoopConfig = CONFIG) -> dict:
    """What makes two runs comparable (a ledger entry is reused only when its settings equal these)."""
    return json.loads(
        json.dumps(
            {
                "task": TASK,
                "candidate": calibrate.BINARY[TASK].describe(),
                "exact_rows": EXACT_ROWS,
                "sampled_rows": SAMPLED_ROWS,
                "sampled_n": SAMPLED_N,
                "eval_every": EVAL_EVERY,
                "shared_prefix": True,
                "config": asdict(cfg),
                "model": "smollm2-135m-instruct",
            }
        )
    )


def run_one(method: str, seed: int, cfg: loop.LoopConfig | None = None, save_mid: Path | None = None) -> dict:
    """One run of `method` at `seed` (the study's config unless `cfg`); `save_mid`: write the step-6 weights there."""
    cfg = cfg or CONFIG
    t, held = task()

    def on_step(step: int, policy: loop.Policy) -> None:
        if save_mid is not None and step == EVAL_EVERY:
            policy.model.save_pretrained(save_mid)
            policy.tokenizer.save_pretrained(save_mid)

    result = loop.run(
        calibrate.MODEL,
        t,
        method,
        seed,
        cfg,
        eval_rows=held[:EXACT_ROWS],
        sampled_rows=held[:SAMPLED_ROWS],
        sampled_n=SAMPLED_N,
        eval_every=EVAL_EVERY,
        greedy=False,
        shared_prefix=True,
        on_step=on_step,
    )
    result["settings"] = settings(cfg)
    return result


# ---------------------------------------------------------------------------------------------- outcomes
def mean_entropy(run: dict) -> float:
    """The primary's per-run value: mean exact entropy (nats) over the evaluations at steps 6..24."""
    return statistics.fmean(e["entropy"] for e in run["exact"] if e["step"] >= EVAL_EVERY)


def late_informative(run: dict) -> float | None:
    """The mean share of groups carrying a gradient over steps 10-12 (the validity halt's measure); None if absent."""
    late = [s["informative_groups"] for s in run["steps"] if 10 <= s["step"] <= 12]
    return statistics.fmean(late) if late else None


def final_p_correct(run: dict) -> float:
    return run["exact"][-1]["mean_p_correct"]


#: name -> (arm, baseline, per-run value); the primary first; Holm across all four (protocol.md)
OUTCOMES = {
    "primary: band-kl - clip, mean exact entropy steps 6-24 (nats)": ("band-kl", "clip", mean_entropy),
    "secondary: band-kl-floor - clip, mean exact entropy steps 6-24 (nats)": ("band-kl-floor", "clip", mean_entropy),
    "band-kl - clip, final exact p(correct)": ("band-kl", "clip", final_p_correct),
    "band-kl-floor - clip, final exact p(correct)": ("band-kl-floor", "clip", final_p_correct),
}


def t_test_p(values: list[float]) -> float | None:
    """Two-sided p-value of the paired t test (mean 0), from Student's t CDF as a regularised incomplete beta."""
    n = len(values)
    if n < 2:
        return None
    sd = statistics.stdev(values)
    if sd == 0:
        return 0.0 if statistics.fmean(values) != 0 else 1.0
    t = statistics.fmean(values) / (sd / math.sqrt(n))
    df = n - 1
    import mpmath

    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-adjusted p-values (step-down, monotone), over the outcomes that have one."""
    have = sorted((p, k) for k, p in pvalues.items() if p is not None and p == p)  # NaN: no p-value
    out: dict[str, float | None] = dict.fromkeys(pvalues)
    running = 0.0
    for i, (p, k) in enumerate(have):
        running = max(running, min(1.0, (len(have) - i) * p))
        out[k] = running
    return out


def blocks() -> dict[int, dict[str, dict]]:
    """seed -> arm -> run, for the ledger's entries with the study's settings."""
    out: dict[int, dict[str, dict]] = {}
    for arm, by_seed in Ledger(LEDGER).runs(study_arms(), settings()).items():
        for seed, run in by_seed.items():
            out.setdefault(seed, {})[arm] = run
    return out


def outcomes() -> dict:
    """Each outcome over the complete blocks: per-seed differences, mean, sd, 95% interval, t-test and Holm p."""
    mispaired = {int(line.split(":")[0].split()[1]) for line in pairing_check()}
    complete = {s: b for s, b in blocks().items() if all(a in b for a in ARMS) and s not in mispaired}
    seeds = sorted(complete)
    out = {}
    for name, (arm, base, value) in OUTCOMES.items():
        diffs = [value(complete[s][arm]) - value(complete[s][base]) for s in seeds]
        out[name] = {"seeds": seeds, "diffs": diffs, **interval(diffs), "p": t_test_p(diffs)}
    adjusted = holm({k: v["p"] for k, v in out.items()})
    for k in out:
        out[k]["p_holm"] = adjusted[k]
    # an arm that joined by the probe's rule: its difference from band-kl in the primary's measure, outside Holm
    for arm in study_arms()[len(ARMS) :]:
        have = sorted(s for s in seeds if arm in complete[s])
        diffs = [mean_entropy(complete[s][arm]) - mean_entropy(complete[s]["band-kl"]) for s in have]
        name = f"joined: {arm} - band-kl, mean exact entropy steps 6-24 (nats; outside Holm)"
        out[name] = {"seeds": have, "diffs": diffs, **interval(diffs), "p": t_test_p(diffs), "p_holm": None}
    return out


def primary(result: dict) -> dict:
    return next(iter(result.values()))


def stopping_rule(result: dict) -> str | None:
    """protocol.md's rule: at most MAX_BLOCKS blocks; from MIN_BLOCKS on, stop when the primary's 95% interval
    excludes 0 or its half-width is under HALF_WIDTH nats. Returns why it stops, or None."""
    p = primary(result)
    if p["n"] >= MAX_BLOCKS:
        return f"{MAX_BLOCKS} blocks"
    if p["n"] < MIN_BLOCKS or p["ci95"] is None:
        return None
    lo, hi = p["ci95"]
    if lo > 0 or hi < 0:
        return f"the primary's 95% interval [{lo:+.4f}, {hi:+.4f}] excludes 0"
    if (hi - lo) / 2 < HALF_WIDTH:
        return f"the primary's half-width {(hi - lo) / 2:.4f} < {HALF_WIDTH} nats"
    return None


def validity_halt() -> str | None:
    """protocol.md's halts, on clip's runs: its final held-out sampled reward within 10% of an audited trivial
    policy's nonzero score, or fewer than 25% of its groups carrying a gradient over steps 10-12; and, on every
    run, an outcome that is not a finite number or step-1 rollouts that differ across a block's arms (the design
    makes them identical: such a block is left out of the outcomes and the study stops to find out why)."""
    for seed, b in sorted(blocks().items()):
        for arm, run in b.items():
            values = [mean_entropy(run), final_p_correct(run)]
            if not all(math.isfinite(v) for v in values):
                return f"{arm} seed {seed}: an outcome is not finite ({values})"
    bad = pairing_check()
    if bad:
        return f"step-1 rollouts differ across arms: {'; '.join(bad)}"
    check = json.loads((audit.RESULTS / f"{audit.slug(TASK)}.json").read_text())  # make realmodel-audit's
    shortcuts = {k: v["mean_reward"] for k, v in check["policies"].items() if v["mean_reward"] > 0}
    for seed, b in sorted(blocks().items()):
        clip = b.get("clip")
        if clip is None:
            continue
        final = clip["sampled"]["mean_reward"]
        for name, score in shortcuts.items():
            if abs(final - score) <= 0.1 * score:
                return f"clip seed {seed} ends at {final:.3f}, within 10% of the trivial policy {name!r} ({score:.3f})"
        share = late_informative(clip)
        if share is not None and share < 0.25:
            return f"clip seed {seed}: {share:.2f} of groups carry a gradient over steps 10-12 (< 0.25)"
    return None


def pairing_check() -> list[str]:
    """Seeds whose step-1 rollouts differ across arms (the design makes them identical): empty when exact."""
    bad = []
    for seed, b in sorted(blocks().items()):
        shas = {arm: run["steps"][0]["replies_sha"] for arm, run in b.items()}
        if len(set(shas.values())) > 1:
            bad.append(f"seed {seed}: {shas}")
    return bad


# ---------------------------------------------------------------------------------------------- protocol
def protocol_commit() -> str:
    """The last commit of protocol.md; exits when the file has uncommitted changes or was never committed."""
    rel = PROTOCOL.relative_to(ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", str(rel)], cwd=ROOT, capture_output=True, text=True)
    commit = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", str(rel)], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if dirty.stdout.strip() or not commit:
        raise SystemExit(f"{rel}: commit the protocol (and any dated amendment) before the study runs")
    return commit


def commit_run(method: str, seed: int) -> None:
    """git commit of one finished run: its ledger entry and the rewritten report (`run --commit`)."""
    files = [
        str(p.relative_to(ROOT))
        for p in (Ledger(LEDGER).path(method, seed), RESULTS / "study.md", RESULTS / "outcomes.json")
    ]
    subprocess.run(["git", "add", "--", *files], cwd=ROOT, check=True)
    message = f"Entropy study ledger: {method} seed {seed} (studies/realmodel/entropy_study.py run --commit)"
    subprocess.run(["git", "commit", "-q", "-m", message, "--", *files], cwd=ROOT, check=True)


def run_main(max_blocks: int, commit_each: bool = False) -> int:
    commit = protocol_commit()
    if not probe_summary().get("complete"):  # an arm the probe joins runs in every block from the first
        raise SystemExit("the replay probe is not complete: run `entropy_study.py probe` before `run` (protocol.md)")
    arms = study_arms()
    task()  # the audit, before any run

    def run(method: str, seed: int) -> bool:
        print(f"[entropy] {method} seed {seed}", flush=True)
        r = run_one(method, seed)
        r["protocol_commit"] = commit
        Ledger(LEDGER).write(method, seed, r)
        if commit_each:
            report()
            commit_run(method, seed)
        print(
            f"[entropy] {method} seed {seed}: entropy {r['exact'][0]['entropy']:.3f} -> {r['exact'][-1]['entropy']:.3f}"
            f" nats, {r['seconds']:.0f} s",
            flush=True,
        )
        return True

    def rule() -> str | None:
        return validity_halt() or stopping_rule(outcomes())

    stop = Stop(WORK / "STOP", said="STOP file: stopping", status=0, consumed=False, at_once=True)
    return run_seeds(
        range(min(max_blocks, MAX_BLOCKS)),
        arms,
        finished=lambda method, seed: Ledger(LEDGER).entry(method, seed, settings()) is not None,
        run=run,
        stop=stop,
        log="[entropy]",
        stopping_rule=rule,
        after_seed=lambda seed: report(),
    )


# ---------------------------------------------------------------------------------------------- profile, pilot
#: per design: (steps of a full run, exact evaluations in a full run); the profile's short run has 2 evaluations
FULL_RUN = {"first": (12, 2), "entropy": (CONFIG.steps, CONFIG.steps // EVAL_EVERY + 1)}
PER_STEP = ("generation and reward", "old log-probs", "reference log-probs", "update", "log-probs after")


def profile_main(design: str, steps: int) -> int:
    """A short clip run (the pilot seed) timed by phase: `first` = the first paired study as it ran (spell_backward,
    whole sequences through the Actor, the log-probs after every update, 256 exact rows, 256 x 2 sampled and 256
    greedy at the end), `entropy` = this study's design. Written to results/entropy/profile.json with the full
    run it projects (each per-step phase x the run's steps; the first design computed the log-probs after the
    update at every step, this one at step 1 only)."""
    if design == "first":
        import study

        t, exact_rows, sampled_rows = study.task()
        cfg = replace(study.CONFIG, steps=steps)
        r = loop.run(calibrate.MODEL, t, "clip", PILOT_SEED, cfg, eval_rows=exact_rows, sampled_rows=sampled_rows,
                     sampled_n=study.SAMPLED_N, greedy=True)  # fmt: skip
    else:
        r = run_one("clip", PILOT_SEED, replace(CONFIG, steps=steps))
    full_steps, evals = FULL_RUN[design]
    timings = r["timings"]
    per_step = {k: timings.get(k, 0.0) / steps for k in PER_STEP if k in timings}
    if design == "entropy":  # the log-probs after the update: step 1 only
        per_step["log-probs after"] = timings.get("log-probs after", 0.0) / full_steps
    else:
        per_step["log-probs after"] = timings.get("log-probs after", 0.0)  # step 1's, as every step ran it
    once = {k: v for k, v in timings.items() if k not in PER_STEP}
    once["exact evaluation"] = timings.get("exact evaluation", 0.0) / len(r["exact"]) * evals
    projected = {
        **{k: round(v * full_steps, 1) for k, v in per_step.items()},
        **{k: round(v, 1) for k, v in once.items()},
    }
    entry = {
        "design": design,
        "profiled_steps": steps,
        "timings": timings,
        "seconds": r["seconds"],
        "full_run": {
            "steps": full_steps,
            "exact_evaluations": evals,
            "phases": projected,
            "minutes": round(sum(projected.values()) / 60, 1),
        },  # fmt: skip
        "settings": r.get("settings", {"first study": True}),
    }
    path = RESULTS / "profile.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    done[design] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(done, indent=1) + "\n")
    print(json.dumps(entry["full_run"], indent=1), flush=True)
    return 0


def mid_weights(cfg: loop.LoopConfig = CONFIG) -> Path:
    """Where the pilot with `cfg` saves clip's step-6 weights (the probe's mid-training batches read CONFIG's)."""
    return WORK / f"entropy-mid-clip-lr{cfg.lr:g}-mb{cfg.minibatches}"


def pilot_main(lr: float, minibatches: int) -> int:
    """Clip alone at the pilot seed, 24 steps: does its exact entropy fall by at least half? Saves the step-6
    weights for the probe's mid-training batches."""
    cfg = replace(CONFIG, lr=lr, minibatches=minibatches)
    r = run_one("clip", PILOT_SEED, cfg, save_mid=mid_weights(cfg))
    Ledger(RESULTS / "pilot").write(f"clip-lr{lr:g}-mb{minibatches}", PILOT_SEED, r)
    e = [x["entropy"] for x in r["exact"]]
    print(f"[pilot] lr {lr:g} minibatches {minibatches}: entropy {e}, {r['seconds']:.0f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- probe
#: the probe's predictions (protocol.md, committed before it ran): (candidate arm, advantage sign, predicted sign of
#: candidate - band-kl in the rare tokens' mean change of log-probability)
PROBE_PREDICTIONS = (
    ("clip-higher", "pos", -1),
    ("clip-higher", "neg", +1),
    ("band-chi2", "pos", -1),
    ("band-chi2", "neg", 0),
)
SEPARATION_NATS = 0.1  # a candidate separates from band-kl: a sign test p < 0.05 and a mean difference above this


def probe_main(start_batches: int, mid_batches: int, eval_rows: int) -> int:
    """The replay probe: each batch (a step-1 rollout of the source weights) updated once (8 mini-batches, one
    epoch) from identical weights, in the same mini-batch order, by band-kl, the candidates and clip; per-token
    change of log-probability by old-probability bin and advantage sign, and the held-out exact numbers after."""
    t, held = task()
    rows = held[:eval_rows]
    protocol_commit()  # the predictions are the protocol's: committed before the probe runs
    mid = mid_weights()
    sources = {"start": calibrate.MODEL}
    if mid_batches:
        if not (mid / "config.json").exists():
            print(f"[probe] no {mid}: run `entropy_study.py pilot` (it saves clip's step-6 weights) first", flush=True)
            return 2
        sources["mid-clip"] = mid
    methods = ("band-kl", *PROBE_EXTRA, "clip")
    path = RESULTS / "probe.json"
    probe_settings = {**settings(), "mid_weights": mid.name, "methods": list(methods)}
    done = json.loads(path.read_text()) if path.exists() else {"settings": probe_settings, "batches": []}
    if done.get("settings") != probe_settings:
        done = {"settings": probe_settings, "batches": []}
    have = {(b["source"], b["seed"]) for b in done["batches"]}
    for source, model_dir in sources.items():
        n = start_batches if source == "start" else mid_batches
        seeds = [s for s in PROBE_SEEDS[:n] if (source, s) not in have]
        if not seeds:
            continue
        policy = loop.Policy(model_dir, CONFIG.threads, shared_prefix=True)
        weights = policy.state()
        before = loop.exact_eval(policy, rows)
        for seed in seeds:
            start = time.time()
            prompts = loop.step_prompts(t, seed, 1, CONFIG.prompts)
            uniforms = loop.step_uniforms(seed, 1, CONFIG.prompts * CONFIG.samples, CONFIG.max_new_tokens)
            rollout = loop.make_rollout(policy, t, prompts, CONFIG.samples, uniforms, CONFIG.max_new_tokens)
            order = loop.derived_seed(seed, "order", 1)
            entry = {
                "source": source,
                "seed": seed,
                "reward": rollout.rewards.mean().item(),
                "informative_groups": loop.informative_share(rollout.rewards, CONFIG.samples),
                "before": before,
                "methods": loop.replay(policy, weights, rollout, methods, CONFIG, order, rows),
            }
            entry["seconds"] = round(time.time() - start, 1)
            done["batches"].append(entry)
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(done, indent=1) + "\n")
            print(f"[probe] {source} batch {seed}: reward {entry['reward']:.3f}, {entry['seconds']:.0f} s", flush=True)
    probe_report(done)
    return 0


def probe_tables(done: dict) -> tuple[list[str], dict]:
    """The probe's table (markdown lines) and its verdicts: per candidate and advantage sign, the rare tokens'
    (old p < 0.1) mean change of log-probability minus band-kl's, per batch; the sign test; separated or not."""
    import study  # the first study's module: its pooling of bins and its rare bins

    batches = done["batches"]
    lines = [
        "Rare sampled tokens (old p < 0.1): mean change of log-probability (nats) after one rollout's update from "
        "identical weights, per batch (-: the batch has no rare token of that advantage sign).",
        "",
    ]
    methods = ("band-kl", *PROBE_EXTRA, "clip")
    head = ["batch", "reward", *[f"{m} {s}" for m in methods for s in ("+A", "-A")]]
    rows = []
    for b in batches:
        pooled = [study._pooled(b["methods"][m]["tokens"], study.RARE, s) for m in methods for s in ("pos", "neg")]
        cells = [f"{x:+.3f}" if x == x else "-" for x in pooled]  # NaN: no rare token of that sign in the batch
        rows.append([f"{b['source']} {b['seed']}", f"{b['reward']:.3f}", *cells])
    lines += markdown_table(head, rows)
    verdicts = {}
    table = []
    for arm, sign, predicted in PROBE_PREDICTIONS:
        diffs = [
            study._pooled(b["methods"][arm]["tokens"], study.RARE, sign)
            - study._pooled(b["methods"]["band-kl"]["tokens"], study.RARE, sign)
            for b in batches
        ]
        diffs = [d for d in diffs if d == d]  # a batch without rare tokens of this sign has no difference (NaN)
        test = study.sign_test(diffs)
        mean = statistics.fmean(diffs) if diffs else math.nan
        # the protocol's 8 of 8: every batch agreeing, none without rare tokens or tied
        agreeing = max(test["positive"], test["n"] - test["positive"])
        separated = agreeing == len(batches) and test["p_two_sided"] < 0.05 and abs(mean) > SEPARATION_NATS
        observed = 0 if not separated else (1 if mean > 0 else -1)
        verdicts[f"{arm}/{sign}"] = {"diffs": diffs, **test, "mean": mean, "separated": separated,
                                     "predicted": predicted, "held": observed == predicted}  # fmt: skip
        table.append([f"{arm} - band-kl, {'+A' if sign == 'pos' else '-A'}", f"{predicted:+d}", f"{mean:+.3f}",
                      f"{test['positive']} of {test['n']}", f"{test['p_two_sided']:.3f}",
                      "yes" if separated else "no", "held" if observed == predicted else "not held"])  # fmt: skip
    head = ["candidate - band-kl (rare tokens)", "predicted sign", "mean (nats)", "batches above", "p (sign test)",
            f"separated (p < 0.05, |mean| > {SEPARATION_NATS})", "prediction"]  # fmt: skip
    lines += ["", *markdown_table(head, table)]
    expected = {(source, seed) for source in ("start", "mid-clip") for seed in PROBE_SEEDS}
    complete = expected <= {(b["source"], b["seed"]) for b in batches}
    joins = sorted({v.split("/")[0] for v, x in verdicts.items() if x["separated"]}) if complete else []
    if complete:
        joined = ", ".join(joins) or "none"
        lines += ["", f"Arms that join the study (protocol.md: separated on either sign): {joined}."]
    else:
        lines += ["", f"Pending: {len(batches)} of {2 * len(PROBE_SEEDS)} batches; no arm joins before all have run."]
    return lines, {"verdicts": verdicts, "joins": joins, "complete": complete}


def probe_report(done: dict) -> None:
    lines, summary = probe_tables(done)
    header = "<!-- written by studies/realmodel/entropy_study.py probe from results/entropy/probe.json; do not edit -->"
    (RESULTS / "probe.md").write_text("\n".join([header, "", *lines]) + "\n")
    (RESULTS / "probe_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines), flush=True)


# ---------------------------------------------------------------------------------------------- tables
DESIGNS = {
    "first": "the first paired study as it ran (spell_backward, 177-token prompts, whole sequences, 12 steps)",
    "entropy": "this study (8-shot prompts of ~540 tokens, the shared prefix, 24 steps)",
}


def profile_table(done: dict) -> list[str]:
    """Seconds a full run spends per phase, each design projected from its profiled short run."""
    designs = [d for d in DESIGNS if d in done]
    phases = []
    for d in designs:
        phases += [k for k in done[d]["full_run"]["phases"] if k not in phases and k != "reference log-probs"]
    head = ["phase (s in a full run)", *[f"{d}: {done[d]['full_run']['steps']} steps" for d in designs]]
    rows = [[k, *[f"{done[d]['full_run']['phases'].get(k, 0.0):.0f}" for d in designs]] for k in phases]
    rows.append(["**total (min)**", *[f"**{done[d]['full_run']['minutes']:.1f}**" for d in designs]])
    lines = markdown_table(head, rows)
    for d in designs:
        e = done[d]
        lines += ["", f"`{d}`: {DESIGNS[d]}; profiled over {e['profiled_steps']} steps ({e['seconds']:.0f} s)."]
    return lines


def pilot_table() -> list[str]:
    rows = []
    for path in sorted((RESULTS / "pilot").glob("*.json")):
        r = json.loads(path.read_text())
        e = r["exact"]
        start, end = e[0]["entropy"], e[-1]["entropy"]
        late = late_informative(r)
        rows.append([
            f"clip, lr {r['config']['lr']:g}, {r['config']['minibatches']} mini-batches",
            " -> ".join(f"{x['entropy']:.3f}" for x in e), f"{1 - end / start:.0%}",
            f"{e[0]['mean_p_correct']:.3f} -> {e[-1]['mean_p_correct']:.3f}", f"{r['sampled']['mean_reward']:.3f}",
            f"{late:.2f}" if late is not None else "-", f"{r['seconds'] / 60:.1f}",
        ])  # fmt: skip
    steps = " / ".join(str(s) for s in range(0, CONFIG.steps + 1, EVAL_EVERY))
    head = ["pilot run (seed 100)", f"exact entropy at steps {steps} (nats)", "fall", "exact p(correct)",
            "held-out sampled reward (end)", "informative groups, steps 10-12", "min"]  # fmt: skip
    return markdown_table(head, rows)


# ---------------------------------------------------------------------------------------------- report
def report_lines() -> list[str]:
    rows = []
    for r in Ledger(LEDGER).entries(settings()):
        e = r["exact"]
        rows.append([
            f"{r['method']} seed {r['seed']}", " -> ".join(f"{x['entropy']:.3f}" for x in e),
            f"{mean_entropy(r):.3f}", f"{e[0]['mean_p_correct']:.3f} -> {e[-1]['mean_p_correct']:.3f}",
            f"{r['sampled']['mean_reward']:.3f}",
            f"{statistics.fmean(s['informative_groups'] for s in r['steps']):.2f}",
            f"{r['seconds'] / 60:.1f}",
        ])  # fmt: skip
    steps = " / ".join(str(s) for s in range(0, CONFIG.steps + 1, EVAL_EVERY))
    head = [
        "run",
        f"exact entropy at steps {steps} (nats)",
        "mean 6-24",
        "exact p(correct) start -> end",
        "held-out sampled reward (end)",
        "informative groups (mean)",
        "min",
    ]
    lines = markdown_table(head, rows)
    result = outcomes()
    table = []
    for name, o in result.items():
        ci = f"[{o['ci95'][0]:+.4f}, {o['ci95'][1]:+.4f}]" if o["ci95"] else "-"
        mean = f"{o['mean']:+.4f}" if o["mean"] is not None else "-"
        p = f"{o['p']:.3f}" if o["p"] is not None else "-"
        ph = f"{o['p_holm']:.3f}" if o["p_holm"] is not None else "-"
        table.append([name, str(o["n"]), mean, ci, p, ph])
    head = ["outcome (paired by seed)", "blocks", "mean", "95% interval", "p (paired t)", "p (Holm, 4 outcomes)"]
    lines += ["", *markdown_table(head, table)]
    bad = pairing_check()
    lines += [
        "",
        f"Stopping rule: {stopping_rule(result) or 'not met'}. Validity halts: {validity_halt() or 'none hit'}. "
        f"Pairing: {'step-1 rollouts identical across arms in every block' if not bad else '; '.join(bad)}.",
    ]
    return lines


def report() -> None:
    lines = ["<!-- written by studies/realmodel/entropy_study.py report from results/entropy/runs; do not edit -->"]
    lines += ["", *report_lines()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "study.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "outcomes.json").write_text(json.dumps(outcomes(), indent=1) + "\n")
    print("\n".join(lines), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--max-blocks", type=int, default=MAX_BLOCKS)
    p.add_argument("--commit", action="store_true", help="git commit each run's ledger entry and the report")
    p = sub.add_parser("profile")
    p.add_argument("design", choices=sorted(FULL_RUN))
    p.add_argument("--steps", type=int, default=2)
    p = sub.add_parser("pilot")
    p.add_argument("--lr", type=float, default=CONFIG.lr)
    p.add_argument("--minibatches", type=int, default=CONFIG.minibatches)
    p = sub.add_parser("probe")
    p.add_argument("--start-batches", type=int, default=4)
    p.add_argument("--mid-batches", type=int, default=4)
    p.add_argument("--eval-rows", type=int, default=64)
    sub.add_parser("report")
    args = parser.parse_args()
    torch.set_num_threads(CONFIG.threads)
    start = time.time()
    if args.command == "run":
        status = run_main(args.max_blocks, args.commit)
    elif args.command == "profile":
        status = profile_main(args.design, args.steps)
    elif args.command == "pilot":
        status = pilot_main(args.lr, args.minibatches)
    elif args.command == "probe":
        status = probe_main(args.start_batches, args.mid_batches, args.eval_rows)
    else:
        report()
        status = 0
    print(f"[entropy] {args.command}: {time.time() - start:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
