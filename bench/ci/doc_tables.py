"""The CI timings and memory tables (studies/docs_tables.py renders them): one row per committed record of a
whole `bash .ci/run` or `make ci-no-bf16`, bench/ci/records/*.json, each written by bench/ci/record.py on a
fresh clone (which says how it was made: the commit, the machine, whether HOME was empty and no venv existed)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "records"
SOURCE = "bench/ci/records/*.json"
PHASE_COLUMNS = ("setup_and_lint", "unit", "e2e_setup", "e2e")


def records() -> list[dict]:
    """Every record, oldest first (by date, then file name: DATE[THHMM]-COMMIT-LABEL.json, the start in UTC)."""
    found = [{**json.loads(p.read_text()), "file": p.name} for p in sorted(RECORDS.glob("*.json"))]
    return sorted(found, key=lambda r: (r["date"], r["file"]))


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def machine(record: dict) -> str:
    m = record["machine"]
    bf16 = ", ".join(m["bf16_instructions"]) or "no native bf16"
    return f"{m['cpu']}, {m['cores']} cores ({bf16})"


def counts(phase: dict) -> str:
    c = phase.get("counts") or {}
    parts = [f"{c[k]:,} {k}" for k in ("passed", "failed", "skipped", "error") if c.get(k)]
    return ", ".join(parts)


def phase(record: dict, name: str) -> dict | None:
    return next((p for p in record["phases"] if p["name"] == name), None)


# the end-to-end suite's session fixtures that start no run: its temp folders, and the shim's probes (`findings`)
NOT_RUNS = ("e2e_root", "tmp_path_factory", "findings")


def runs_s(record: dict) -> dict[str, float]:
    """Each end-to-end run's seconds in a record (its session fixture's set-up; objective_runs holds three)."""
    return {name: s for name, s in phase(record, "e2e")["runs_s"].items() if name not in NOT_RUNS}


def cold(record: dict) -> str:
    c = record["cold"]
    said = ["empty HOME" if c["home_empty"] else "HOME not empty", "no venv" if c["venvs_absent"] else "venvs there"]
    return ", ".join(said) + ("" if record["worktree_clean"] else ", uncommitted changes")


def cold_runs() -> tuple[str, str]:
    lines = [
        "| machine | command, commit | at the start | `.venv` + lint | unit suite | `.venv-e2e` | end-to-end suite "
        "| total | peak memory above idle | result |",
        "|---|---|---|---:|---|---:|---|---:|---:|---|",
    ]
    for r in records():
        cells = []
        for name in PHASE_COLUMNS:
            p = phase(r, name)
            text = "" if p is None else minutes(p["seconds"])
            if p is not None and p.get("counts"):
                text += f" ({counts(p)})"
            cells.append(text)
        result = "green" if r["exit_status"] == 0 else f"**red** (exit {r['exit_status']})"
        lines.append(
            f"| {machine(r)} | `{r['command']}` ({r['label']}) at {r['commit'][:7]}, {r['date']} | {cold(r)} | "
            + " | ".join(cells)
            + f" | **{minutes(r['total_s'])}** | {r['peak_memory_above_idle_gib']:.1f} GiB | {result} |"
        )
    return "\n".join(lines), SOURCE


def e2e_runs() -> tuple[str, str]:
    """Each end-to-end run's seconds (its session fixture's set-up, the suite's own clock), a column a record."""
    recs = [r for r in records() if phase(r, "e2e")]
    names: list[str] = []
    for r in recs:
        names += [name for name in runs_s(r) if name not in names]
    first = runs_s(recs[-1]) if recs else {}
    names.sort(key=lambda n: -first.get(n, 0.0))  # the latest record's slowest first
    header = "| run (session fixture) | " + " | ".join(f"{r['label']} at {r['commit'][:7]}" for r in recs) + " |"
    lines = [header, "|---|" + "---:|" * len(recs)]
    for name in names:
        row = [runs_s(r).get(name) for r in recs]
        lines.append(f"| `{name}` | " + " | ".join("" if s is None else f"{s:.0f}" for s in row) + " |")
    totals = " | ".join(f"**{minutes(phase(r, 'e2e')['seconds'])}**" for r in recs)
    lines.append(f"| **the end-to-end suite** | {totals} |")
    return "\n".join(lines), SOURCE


def cost() -> tuple[str, str]:
    """docs/e2e_cpu.md#cost: what a run and the suite cost, per record."""
    lines = ["| machine, command, commit | an end-to-end run (median, range) | the end-to-end suite | its peak "
             "memory above idle | the whole CI's |", "|---|---|---:|---:|---:|"]  # fmt: skip
    for r in records():
        e2e = phase(r, "e2e")
        if e2e is None:
            continue
        runs = list(runs_s(r).values())
        lines.append(
            f"| {machine(r)}, `{r['command']}` at {r['commit'][:7]} | {statistics.median(runs):.0f} s "
            f"({min(runs):.0f}-{max(runs):.0f} s over {len(runs)} runs) | {minutes(e2e['seconds'])} | "
            f"{e2e['peak_memory_above_idle_gib']:.1f} GiB | {r['peak_memory_above_idle_gib']:.1f} GiB |"
        )
    return "\n".join(lines), SOURCE


def readme() -> tuple[str, str]:
    """README's short form: the total and the memory of each recorded cold CI."""
    lines = ["| machine | command, commit | at the start | total | peak memory above idle | result |",
             "|---|---|---|---:|---:|---|"]  # fmt: skip
    for r in records():
        result = "green" if r["exit_status"] == 0 else f"red (exit {r['exit_status']})"
        peak = r["peak_memory_above_idle_gib"]
        lines.append(f"| {machine(r)} | `{r['command']}` ({r['label']}) at {r['commit'][:7]} | {cold(r)} | "
                     f"**{minutes(r['total_s'])}** | {peak:.1f} GiB | {result} |")  # fmt: skip
    return "\n".join(lines), SOURCE


TABLES = {"ci-cold-runs": cold_runs, "ci-e2e-runs": e2e_runs, "ci-cost": cost, "ci-readme": readme}
