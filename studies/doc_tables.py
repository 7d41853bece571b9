"""The README's findings table (studies/docs_tables.py renders it): one row per study, the paper's two claims
(1: the band learns better than clip; 2: it keeps entropy higher), band-kl minus clip paired by seed, each
figure computed here from the study's committed data, and whether its 95% interval excludes 0.

The demo and its band family are 5 seeds of one deterministic run; the learning study's paired figures are
those its report committed (studies/learn/results/summary.txt: the per-seed values were not kept); the SmolLM2
rows read their ledgers. "resolved" means the two-sided 95% Student t interval of the paired mean excludes 0."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

import docs_tables  # noqa: E402  (studies/ is not a package: the generator's one loader of renderer modules)
from paired_runs import half_width95, mean_sd, paired_by_seed  # noqa: E402  (the studies' one driver)

from openrlhf_band.tools.demo import DemoConfig, paired_differences  # noqa: E402


def _renderer(study: str):
    """A study's doc_tables module, the same loaded copy the generator renders from."""
    return docs_tables.load_module(f"studies/{study}/doc_tables.py")


def verdict(mean: float, sd: float, n: int, higher: str, lower: str) -> str:
    if n < 2 or math.isnan(sd):
        return "not resolved"
    half = half_width95(sd, n)
    if mean - half > 0:
        return higher
    return lower if mean + half < 0 else "not resolved"


def pm(mean: float, sd: float) -> str:
    return f"{mean:+.3f} +- {sd:.3f}"


def _demo_rows(path: Path) -> list[dict]:
    rows = []
    for r in csv.DictReader(path.open()):
        rows.append({k: (v if k == "method" else int(v) if k in ("seed", "step") else float(v) if v else math.nan)
                     for k, v in r.items()})  # fmt: skip
    return rows


def demo_row(path: Path, method: str, label: str, link: str) -> str:
    rows = _demo_rows(path)
    final = DemoConfig(rollouts=max(r["step"] for r in rows)).early_middle_final()[2]
    m1, s1, n = paired_differences(rows, method, "mean@32", final)
    p1, ps1, _ = paired_differences(rows, method, "pass@32", final)
    m2, s2, _ = paired_differences(rows, method, "entropy", final)
    claim1 = f"mean@32 {pm(m1, s1)}: {verdict(m1, s1, n, 'held', 'the opposite')} (pass@32 {pm(p1, ps1)})"
    claim2 = f"{pm(m2, s2)} nats: {verdict(m2, s2, n, 'held', 'the opposite')}"
    return f"| [{label}]({link}) | {claim1} | {claim2} | {n} seeds |"


def learn_row() -> str:
    to_clip, n = _renderer("learn").paired_to_clip("band-kl")
    (m1, s1), (m2, s2) = to_clip["mean_reward"], to_clip["entropy"]
    claim1 = f"held-out exact match {pm(m1, s1)}: {verdict(m1, s1, n, 'held', 'the opposite')}"
    claim2 = f"{pm(m2, s2)} nats: {verdict(m2, s2, n, 'held', 'the opposite')}"
    return (f"| [real `train_ppo_ray`, tiny model from an SFT checkpoint, 20 steps](docs/learn_study.md) "
            f"| {claim1} | {claim2} | {n} seeds |")  # fmt: skip


def smollm2_row() -> str:
    study = _renderer("smollm2")._study()
    runs = study.ledger_runs(study.LEDGER)
    clip, band = runs["clip"], runs["band-kl"]
    seeds, reward = paired_by_seed(band, clip, lambda s: s["after"]["mean_reward"])
    entropy = paired_by_seed(band, clip, lambda s: s["after"]["entropy"])[1]
    rise = statistics.fmean(clip[i]["after"]["mean_reward"] - clip[i]["before"]["mean_reward"] for i in clip)
    spread = statistics.stdev(clip[i]["after"]["mean_reward"] for i in clip)
    pilot = study.ledger_runs(ROOT / "studies" / "smollm2" / "results" / "clip-24-steps" / "runs")["clip"]
    pilot_rise = statistics.fmean(pilot[i]["after"]["mean_reward"] - pilot[i]["before"]["mean_reward"] for i in pilot)
    pilot_spread = statistics.stdev(pilot[i]["after"]["mean_reward"] for i in pilot)
    m1, s1, m2, s2 = (
        statistics.fmean(reward),
        statistics.stdev(reward),
        statistics.fmean(entropy),
        statistics.stdev(entropy),
    )
    claim1 = (f"band-kl ended {mean_sd(reward)} over clip in held-out reward: "
              f"{verdict(m1, s1, len(seeds), 'held', 'the opposite')}; clip itself moved only "
              f"{rise / spread:.1f}x its seed spread "
              f"({pilot_rise / pilot_spread:.1f}x in a 24-step pilot)")  # fmt: skip
    claim2 = f"{pm(m2, s2)} nats: {verdict(m2, s2, len(seeds), 'held', 'the opposite')} (one degenerate run)"
    return (f"| [SmolLM2-135M-Instruct through the real engine, reasoning-gym, 8 steps, seed-matched, not paired]"
            f"(docs/smollm2_study.md#the-study) | {claim1} | {claim2} | {len(seeds)} seeds |")  # fmt: skip


def probe_row() -> str:
    summary = json.loads((ROOT / "studies" / "realmodel" / "results" / "probe_summary.json").read_text())
    by = {p["name"].split()[0]: p for p in summary["predictions"]}

    def said(p: dict) -> str:
        resolved = (
            "not resolved" if p["p_two_sided"] >= 0.05 else "held" if 2 * p["positive"] > p["n"] else "the opposite"
        )
        return f"{p['positive']} of {p['n']} batches, sign test p = {p['p_two_sided']:.3f}: {resolved}"

    entropy = summary["outcomes"]["band-kl"]
    above = sum(d > 0 for d in entropy["dentropy"])
    claim1 = f"mechanism, rare positive-advantage tokens lifted more than by clip: {said(by['P1'])}"
    claim2 = (f"held-out entropy after one rollout's update {statistics.fmean(entropy['dentropy']):+.3f} nats "
              f"({above} of {len(entropy['dentropy'])} above clip); mechanism, rare negative-advantage tokens pushed "
              f"further down: {said(by['P2'])}; the floor undoes that: {said(by['P3'])}")  # fmt: skip
    return (f"| [SmolLM2, replay probe: one rollout's update (8 mini-batches) from identical weights, exactly paired]"
            f"(docs/smollm2_study.md#results) | {claim1} | {claim2} | {by['P1']['n']} batches |")  # fmt: skip


def pairs_row() -> str:
    study = _renderer("realmodel").study
    reward, entropy = study.paired_gains("sampled_reward"), study.paired_gains("exact_entropy")

    def cell(g: dict, unit: str) -> str:
        if g["n"] == 0:
            return "no pair yet"
        if g["n"] == 1:
            return f"{g['mean']:+.3f}{unit} (one pair, no interval): not resolved"
        return f"{pm(g['mean'], g['sd'])}{unit}: {verdict(g['mean'], g['sd'], g['n'], 'held', 'the opposite')}"

    rule = study.stopping_rule(reward)
    state = f"stopping rule met: {rule}" if rule else "running to its stopping rule (4 to 12 pairs)"
    # the reward outcome is confounded: the shortcut audit's best trivial policy (the word copied forward) scores
    # at the level the runs rose to, so the row reports the number and says it does not test claim 1
    audit_file = ROOT / "studies" / "realmodel" / "results" / "audit" / "spell-backward-len-3-4-shots.json"
    audit = json.loads(audit_file.read_text())
    lo, hi = reward["ci95"] if reward["ci95"] else (math.nan, math.nan)
    claim1 = (f"not tested: sampled reward {pm(reward['mean'], reward['sd'])} [{lo:+.4f}, {hi:+.4f}] is confounded, "
              f"the trivial policy '{audit['worst']}' (the word copied forward) scores {audit['worst_reward']:.3f} "
              f"([the copy shortcut](docs/smollm2_study.md#the-copy-shortcut))")  # fmt: skip
    return (f"| [SmolLM2, exactly paired GRPO loop, 12 steps, spell_backward](docs/smollm2_study.md#results) "
            f"| {claim1} | exact entropy {cell(entropy, ' nats')} "
            f"| {reward['n']} pair{'' if reward['n'] == 1 else 's'}; {state} |")  # fmt: skip


def entropy_row() -> str:
    """The entropy study's row: its primary (claim 2) and final exact p(correct) (claim 1), over complete blocks."""
    es = _renderer("realmodel").entropy_study
    result = es.outcomes()
    names = list(result)
    primary, floor, p_correct = result[names[0]], result[names[1]], result[names[2]]

    def cell(o: dict, unit: str) -> str:
        if o["n"] == 0:
            return "no complete block yet"
        if o["n"] == 1:
            return f"{o['mean']:+.3f}{unit} (one block, no interval): not resolved"
        lo, hi = o["ci95"]
        word = "held" if lo > 0 else "the opposite" if hi < 0 else "not resolved"
        # the protocol's family: Holm's correction across its four outcomes decides, not the raw interval alone
        if word != "not resolved" and o.get("p_holm") is not None and o["p_holm"] >= 0.05:
            word = f"not resolved after Holm's correction (p {o['p_holm']:.3f})"
        if o["n"] < es.MIN_BLOCKS:  # the protocol draws no conclusion before its minimum number of blocks
            word = f"interim ({o['n']} of the protocol's minimum {es.MIN_BLOCKS} blocks): no verdict yet"
        return f"{pm(o['mean'], o['sd'])}{unit} [{lo:+.3f}, {hi:+.3f}]: {word}"

    rule = es.stopping_rule(result)
    state = f"stopping rule met: {rule}" if rule else "running to its stopping rule (4 to 8 blocks)"
    if not es.PROTOCOL.exists():
        state = "not started: the pilots are choosing the design before the protocol is registered"
    return (f"| [SmolLM2, entropy study: exactly paired GRPO loop, 24 steps, word_sequence_reversal (0/1, audited)]"
            f"(docs/smollm2_study.md#the-entropy-study) | final exact p(correct) {cell(p_correct, '')} "
            f"| band-kl {cell(primary, ' nats')}; the floor {cell(floor, ' nats')} "
            f"| {primary['n']} block{'' if primary['n'] == 1 else 's'}; {state} |")  # fmt: skip


def findings() -> tuple[str, str]:
    lines = ["| setting | claim 1: the band learns better | claim 2: it keeps entropy higher | evidence |",
             "|---|---|---|---|"]  # fmt: skip
    demo = "CPU demo: tiny Qwen2, GRPO, a rare correct token, 80 rollouts (the committed run; `make demo` runs 3 seeds)"
    lines.append(demo_row(ROOT / "docs" / "demo_metrics.csv", "band-kl", demo, "docs/demo.md"))
    floor = demo_row(ROOT / "studies" / "band_family" / "results" / "metrics.csv", "band-kl-floor",
                     "the same with `--actor.band.lower_floor 0.8` (band-kl-floor)", "docs/band_family.md")  # fmt: skip
    lines += [floor, learn_row(), smollm2_row(), probe_row(), pairs_row(), entropy_row()]
    sources = ("docs/demo_metrics.csv, studies/{band_family/results/metrics.csv, learn/results/summary.txt, "
               "smollm2/results/runs, realmodel/results}")  # fmt: skip
    return "\n".join(lines), sources


def findings_in_docs() -> tuple[str, str]:
    """The same table for a page under docs/ (its links relative to docs/)."""
    markdown, sources = findings()
    return markdown.replace("](docs/", "]("), sources


TABLES = {"findings": findings, "findings-in-docs": findings_in_docs}
