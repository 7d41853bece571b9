"""Figures the docs quote from committed data, or compute from the operator, are those values at the
precision written: the log-prob benchmark's table (bench/results/logprobs_cpu.json), the learning
study's clip fractions and per-seed held-out figures (studies/learn/results/steps.csv), the band family's
floor-only clip shares (studies/band_family/results/metrics.csv), the p below which the kl band's cap binds
(band_bounds), and every "M min S s (T s)" pair is one duration. Each check is shown to fail."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def agrees(written: str, value: float) -> bool:
    """The written decimal is `value` rounded to as many decimals as it has."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    return round(value, decimals) == float(written.replace(",", ""))


def test_agrees_is_the_written_precision():
    assert agrees("0.69", 0.6946) and agrees("0.695", 0.69455) and not agrees("0.70", 0.6946)
    assert agrees("30.1", 30.14) and not agrees("29", 30.14) and agrees("0.020", 0.020456)


# --- docs/fused_logprobs.md against bench/results/logprobs_cpu.json ---


def logprobs_rows() -> tuple[dict, list[dict]]:
    data = json.loads((ROOT / "bench" / "results" / "logprobs_cpu.json").read_text())
    return data["config"], data["rows"]


def logprobs_table_problems(page: str, config: dict, rows: list[dict]) -> list[str]:
    problems = []
    table = {line.split(" | ")[0].strip("| ").replace(",", ""): line for line in page.splitlines()
             if re.match(r"^\| [\d,]+ \|", line)}  # fmt: skip
    for row in rows:
        line = table.get(str(row["tokens"]))
        if line is None:
            problems.append(f"no row for {row['tokens']}")
            continue
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        fused, ours = row["fused"], row["openrlhf"]
        expected = [(cells[1], fused["train_peak_bytes"] / GIB), (cells[4], fused["forward_peak_bytes"] / GIB)]
        if ours is not None:
            expected += [(cells[2], ours["train_peak_bytes"] / GIB), (cells[3], row["memory_ratio_train"]),
                         (cells[5], ours["forward_peak_bytes"] / GIB)]  # fmt: skip
        else:  # the estimate the page gives for the step that was not run: 13 bytes per logit
            expected.append((re.search(r"needs ~([\d.]+) GiB \(13 B x N x V\)", cells[2]).group(1),
                             13 * row["tokens"] * config["vocab"] / GIB))  # fmt: skip
        times = re.findall(r"[\d.]+", cells[6])  # "fused s / OpenRLHF s = ratio" (train)
        expected.append((times[0], fused["train_s"]))
        if ours is not None:
            expected += [(times[1], ours["train_s"]), (times[2], row["time_ratio_train"])]
        for text, value in expected:
            number = re.match(r"[\d.]+", text)
            if number is None or not agrees(number.group(0), value):
                problems.append(f"{row['tokens']} tokens: {text!r} is not {value:.4f}")
    return problems


def test_the_fused_logprobs_table_is_the_committed_benchmark():
    config, rows = logprobs_rows()
    page = (ROOT / "docs" / "fused_logprobs.md").read_text()
    assert logprobs_table_problems(page, config, rows) == []
    assert logprobs_table_problems(page.replace("| 8,192 | 0.69 GiB", "| 8,192 | 0.70 GiB"), config, rows)
    assert logprobs_table_problems(page.replace("~30.1 GiB", "~29 GiB"), config, rows)


# --- docs/learn_study.md against studies/learn/results/steps.csv ---


def learn_means() -> dict[str, dict[str, float]]:
    rows = list(csv.DictReader((ROOT / "studies" / "learn" / "results" / "steps.csv").open()))
    out: dict[str, dict[str, float]] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        out[method] = {key: statistics.fmean(float(r[key]) for r in mine)
                       for key in ("clip_ratio", "clip_frac_lower", "clip_frac_upper", "clip_frac_floor")
                       if all(r[key] != "" for r in mine)}  # fmt: skip
    return out


def learn_problems(page: str, means: dict[str, dict[str, float]]) -> list[str]:
    problems = []
    lower, upper = re.search(r"lower ([\d.]+), upper ([\d.]+) for band-kl", page).groups()
    problems += [f"{name} {text}" for name, text, key in (("lower", lower, "clip_frac_lower"),
                 ("upper", upper, "clip_frac_upper")) if not agrees(text, means["band-kl"][key])]  # fmt: skip
    low, high = re.search(r"`ppo_clip_ratio` averaged ([\d.]+)-([\d.]+) per method and step", page).groups()
    ratios = [m["clip_ratio"] for m in means.values()]
    if not (agrees(low, min(ratios)) and agrees(high, max(ratios))):
        problems.append(f"ppo_clip_ratio {low}-{high}")
    floor = re.search(r"`band/clip_frac_floor` averaged ([\d.]+)", page).group(1)
    if not agrees(floor, means["band-kl-floor"]["clip_frac_floor"]):
        problems.append(f"floor {floor}")
    return problems


def test_the_learning_studys_clip_fractions_are_the_committed_steps():
    page, means = flat(ROOT / "docs" / "learn_study.md"), learn_means()
    assert learn_problems(page, means) == []
    assert learn_problems(page.replace("upper 0.020 for band-kl", "upper 0.021 for band-kl"), means)


def learn_pass1(step: int) -> dict[tuple[str, int], float]:
    """(method, seed index) -> OpenRLHF's held-out pass1 at `step`, from steps.csv."""
    rows = csv.DictReader((ROOT / "studies" / "learn" / "results" / "steps.csv").open())
    return {(r["method"], int(r["seed"])): float(r["heldout_pass1"]) for r in rows
            if int(r["step"]) == step and r["heldout_pass1"]}  # fmt: skip


def learn_seed_problems(page: str, pass1: dict[tuple[str, int], float]) -> list[str]:
    """The per-seed step-20 figures the learning study's prose quotes (seed i ran with --train.seed 42 + i)."""
    problems = []
    weak, a, b = re.search(
        r"clip at `--train.seed` 44 reached ([\d.]+), against ([\d.]+) and ([\d.]+) at 42", page
    ).groups()
    for text, seed in ((weak, 2), (a, 0), (b, 1)):
        if not agrees(text, pass1[("clip", seed)]):
            problems.append(f"clip seed {seed}: {text}")
    leads = re.search(r"band-kl led clip on each seed \(([-+\d., ]+)\)", page).group(1).split(", ")
    for seed, text in enumerate(leads):
        if not agrees(text.lstrip("+"), pass1[("band-kl", seed)] - pass1[("clip", seed)]):
            problems.append(f"band-kl - clip seed {seed}: {text}")
    return problems


def test_the_learning_studys_per_seed_figures_are_the_committed_steps():
    page, pass1 = flat(ROOT / "docs" / "learn_study.md"), learn_pass1(20)
    assert learn_seed_problems(page, pass1) == []
    assert learn_seed_problems(page.replace("reached 0.246", "reached 0.245"), pass1)
    assert learn_seed_problems(page.replace("+0.111, +0.211", "+0.113, +0.209"), pass1)


# --- docs/band_family.md: the floor's share of clipped tokens, from the committed run ---


def floor_fracs() -> dict[str, float]:
    rows = list(csv.DictReader((ROOT / "studies" / "band_family" / "results" / "metrics.csv").open()))
    out = {}
    for method in ("band-kl-floor-0.5", "band-kl-floor-0.7", "band-kl-floor", "band-kl-floor-0.9",
                   "band-kl-entropy-floor"):  # fmt: skip
        values = [float(r["floor_frac"]) for r in rows if r["method"] == method and int(r["step"]) > 0]
        out[method] = statistics.fmean(v for v in values if v == v)
    return out


def floor_problems(page: str, fracs: dict[str, float]) -> list[str]:
    m = re.search(r"F = 0.5: ([\d.]+), 0.7: ([\d.]+), 0.8: ([\d.]+), 0.9: ([\d.]+); entropy rule with F = 0.8: "
                  r"([\d.]*\d)", page)  # fmt: skip
    return [f"{method} {text}" for method, text in zip(fracs, m.groups()) if not agrees(text, fracs[method])]


def test_the_floors_share_of_clipped_tokens_is_the_committed_run():
    page, fracs = flat(ROOT / "docs" / "band_family.md"), floor_fracs()
    assert floor_problems(page, fracs) == []
    assert floor_problems(page.replace("0.8: 0.024", "0.8: 0.026"), fracs)


# --- docs/band_family.md: where the kl band's cap binds ---


def cap_binds_below(delta: float = 0.05, cap: float = 10.0) -> float:
    """The p below which the kl band's r_up (delta 0.05) exceeds the cap: r_up falls with p."""
    import torch

    from openrlhf_band import band_bounds

    lo, hi = 1e-4, 0.5
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        upper = band_bounds(torch.tensor([mid], dtype=torch.float64).log(), "kl", delta)[1].item()
        lo, hi = (mid, hi) if upper > cap else (lo, mid)
    return lo


def test_the_cap_binds_where_the_page_says():
    page = flat(ROOT / "docs" / "band_family.md")
    written = re.search(r"the cap of 10, which binds only for p below about ([\d.]+)", page).group(1)
    p = cap_binds_below()
    assert agrees(written, float(f"{p:.2g}")), (written, p)
    assert not agrees("0.006", float(f"{p:.2g}"))  # what the page said before


# --- every "M min S s (T s)" / "T s (M min)" pair is one duration ---

PAGES = [p for p in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]) if p.exists()]


def duration_problems(text: str) -> list[str]:
    problems = []
    for m, s, t in re.findall(r"(\d+) min (\d+) s \(([\d,]+) s\)", text):
        if int(m) * 60 + int(s) != int(t.replace(",", "")):
            problems.append(f"{m} min {s} s ({t} s)")
    for t, m in re.findall(r"([\d,]+) s \((\d+) min\)", text):
        if round(int(t.replace(",", "")) / 60) != int(m):
            problems.append(f"{t} s ({m} min)")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_duration_pair_is_one_duration(page):
    assert duration_problems(flat(page)) == []


def test_the_duration_check_can_fail():
    assert duration_problems("Wall time 45 min 13 s (2707 s) with one worker") == ["45 min 13 s (2707 s)"]
    assert duration_problems("took 2,165 s (36 min); 45 min 13 s (2713 s)") == []
    assert duration_problems("took 2,165 s (38 min)") == ["2,165 s (38 min)"]
