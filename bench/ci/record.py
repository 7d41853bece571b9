"""Time a whole CI run and keep it as a record: `python3 bench/ci/record.py --out FILE -- bash .ci/run`.

Run it from the root of a fresh clone, with the system Python (standard library only: there is no venv yet).
It runs the command, copies its output to out/tests/ci.log, samples the machine's memory in use once a second
(MemTotal - MemAvailable, from /proc/meminfo), and writes FILE (JSON): the commit, the machine (CPU model,
cores, its bf16 instructions, memory, kernel), whether HOME was empty and no venv existed at the start, the
command's exit status and wall time, and its phases, split at the timestamps the two suites write
(out/tests/unit-timings.json from tests/conftest.py, out/tests/e2e-timings.json from tests/e2e/conftest.py):

- `setup_and_lint`: from the start to the unit suite's start (`.venv`, ruff, hadolint, shellcheck),
- `unit`: the unit suite, with its counts,
- `e2e_setup`: from the unit suite's end to the end-to-end suite's start (`.venv-e2e`, pytest's start),
- `e2e`: the end-to-end suite, with each run's seconds (its session fixtures),

each with the peak memory in use above the idle level measured just before the command started. The records
under bench/ci/records/ are rendered into docs/tests.md, docs/e2e_cpu.md and README.md by
`python studies/docs_tables.py` (bench/ci/doc_tables.py). Memory is the whole machine's: run nothing beside.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

UNIT_TIMINGS = Path("out/tests/unit-timings.json")
E2E_TIMINGS = Path("out/tests/e2e-timings.json")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def meminfo_kib() -> dict[str, int]:
    return {line.split(":", 1)[0]: int(line.split(":", 1)[1].split()[0]) for line in
            Path("/proc/meminfo").read_text().splitlines()}  # fmt: skip


def memory_in_use_gib() -> float:
    fields = meminfo_kib()
    return (fields["MemTotal"] - fields["MemAvailable"]) / 2**20


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "bf16_instructions": [f for f in BF16_FLAGS if f in flags],
        "memory_gib": round(meminfo_kib()["MemTotal"] / 2**20, 1),
        "kernel": platform.release(),
    }


class MemorySampler(threading.Thread):
    def __init__(self, period_s: float = 1.0):
        super().__init__(daemon=True)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []  # (epoch seconds, GiB in use)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time(), memory_in_use_gib()))
            self.done.wait(self.period_s)

    def peak(self, start: float, end: float) -> float | None:
        inside = [gib for t, gib in self.samples if start <= t <= end]
        return max(inside) if inside else None


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def phases(start: float, end: float, unit: dict | None, e2e: dict | None) -> list[dict]:
    """The run cut at the suites' own start and end times (a phase whose suite did not run is left out)."""
    out, cursor = [], start
    if unit:
        out.append({"name": "setup_and_lint", "start": cursor, "end": unit["started_at"]})
        out.append({"name": "unit", "start": unit["started_at"], "end": unit["ended_at"],
                    "counts": unit.get("counts", {})})  # fmt: skip
        cursor = unit["ended_at"]
    if e2e:
        out.append({"name": "e2e_setup", "start": cursor, "end": e2e["started_at"]})
        out.append({"name": "e2e", "start": e2e["started_at"], "end": e2e["ended_at"], "counts": e2e.get("counts", {}),
                    "runs_s": e2e.get("fixtures_s", {})})  # fmt: skip
        cursor = e2e["ended_at"]
    out.append({"name": "rest", "start": cursor, "end": end})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 bench/ci/record.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the record to write (JSON)")
    parser.add_argument("--label", default="", help="what this run is, in a few words (e.g. 'native bf16')")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command, e.g. bash .ci/run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    out = args.out.resolve()
    for stale in (UNIT_TIMINGS, E2E_TIMINGS):  # a record must come from this run's suites
        stale.unlink(missing_ok=True)
    home = Path(os.environ.get("HOME", "/"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
    record = {
        "label": args.label,
        "command": " ".join(command),
        "commit": commit,
        "worktree_clean": not dirty,
        "machine": machine(),
        "cold": {"home_empty": not any(home.iterdir()) if home.is_dir() else True,
                 "venvs_absent": not Path(".venv").exists() and not Path(".venv-e2e").exists()},  # fmt: skip
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    idle = memory_in_use_gib()
    sampler = MemorySampler()
    sampler.start()
    start = time.time()
    log_path = Path("out/tests/ci.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        status = proc.wait()
    end = time.time()
    sampler.done.set()
    sampler.join()
    record["exit_status"] = status
    record["total_s"] = round(end - start, 1)
    record["idle_memory_gib"] = round(idle, 2)
    record["peak_memory_above_idle_gib"] = round(sampler.peak(start, end) - idle, 2)
    record["phases"] = []
    for phase in phases(start, end, _read(UNIT_TIMINGS), _read(E2E_TIMINGS)):
        peak = sampler.peak(phase["start"], phase["end"])
        record["phases"].append({
            **{k: v for k, v in phase.items() if k not in ("start", "end")},
            "seconds": round(phase["end"] - phase["start"], 1),
            "peak_memory_above_idle_gib": None if peak is None else round(peak - idle, 2),
        })  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"[record] {out}: exit {status}, {record['total_s'] / 60:.1f} min", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
