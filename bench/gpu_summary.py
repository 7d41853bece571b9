"""The GPU check's last step: every step's status, verdict and figures in one JSON, the details in one archive.

Run by bench/gpu_check.sh as `python3 bench/gpu_summary.py --work WORK --out OUT --dry-run 0|1 --seconds S`,
with the standard library only (a machine without torch still gets its summary). Reads, per step NAME in
STEPS: WORK/NAME.status (rc, seconds, limit, or the module that was missing), WORK/NAME.log, and the JSON the
step wrote under WORK/NAME/. Writes exactly two files:

- OUT/gpu_check_summary.json: the machine (from the preflight log), each step's status (PASS, FAIL,
  MEASURED, SKIPPED, TIMEOUT, ERROR), its verdict and figures, the overall verdict and the exit status;
- OUT/gpu_check_details.tar.gz: WORK as it is (every log and JSON).

A step's status: SKIPPED when a package it needs is missing; TIMEOUT when `timeout` ended it (rc 124, or
137 after the kill); else its own JSON's "verdict" if it wrote one (correctness, speed), the pytest counts
for contract (PASS when none failed), MEASURED for a benchmark that exited 0 (logprobs, bounds: figures, no
bar), ERROR for any other non-zero exit. Exit status: 1 when any step is FAIL, TIMEOUT or ERROR; 3 when a
real (not dry) run skipped correctness; else 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

STEPS = ("preflight", "correctness", "speed", "contract", "logprobs", "bounds")
BAD = ("FAIL", "TIMEOUT", "ERROR")
PYTEST_OUTCOME = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pytest_counts(log: str) -> dict:
    """Outcomes from pytest -v's per-test lines (complete up to the moment a timeout stopped it)."""
    counts: dict[str, int] = {}
    failed = []
    for line in log.splitlines():
        match = PYTEST_OUTCOME.match(line.strip())
        if match:
            counts[match.group(2)] = counts.get(match.group(2), 0) + 1
            if match.group(2) in ("FAILED", "ERROR"):
                failed.append(match.group(1))
    return {"counts": counts, "failed": failed[:50]}


def machine(preflight_log: str) -> dict:
    """name, driver, memory from nvidia-smi's CSV line; each `package version` line of the preflight."""
    info: dict = {"versions": {}}
    lines = preflight_log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("name, driver_version") and i + 1 < len(lines):
            fields = [f.strip() for f in lines[i + 1].split(",")]
            info.update(zip(("gpu", "driver", "memory_total", "max_memory_clock"), fields))
        words = line.split(maxsplit=1)
        if len(words) == 2 and words[0] in ("python", "torch", "triton", "numpy", "pytest", "cuda"):
            info["versions"][words[0]] = words[1]
    return info


def step_summary(work: Path, name: str) -> dict:
    status = read_json(work / f"{name}.status") or {"error": "no status: the step did not run"}
    log = (work / f"{name}.log").read_text(errors="replace") if (work / f"{name}.log").exists() else ""
    out = {"name": name, **status}
    figures = {p.name: read_json(p) for p in sorted((work / name).glob("*.json"))}  # none where no folder
    own = figures.get(f"{name}.json")
    if "skipped" in status:
        out["status"] = "SKIPPED"
    elif "error" in status:
        out["status"] = "ERROR"
    elif status["rc"] in (124, 137):
        out["status"] = "TIMEOUT"
    elif name == "contract":
        out.update(pytest_counts(log))
        failed = out["counts"].get("FAILED", 0) + out["counts"].get("ERROR", 0)
        ran = sum(out["counts"].values())
        out["status"] = "PASS" if status["rc"] == 0 and ran and not failed else ("FAIL" if failed else "ERROR")
    elif own is not None and "verdict" in own:
        out["status"] = own["verdict"] if status["rc"] in (0, 1) else "ERROR"
        out["verdict"] = own["verdict"]
    elif status["rc"] == 0:
        out["status"] = "MEASURED" if name != "preflight" else "PASS"
    else:
        out["status"] = "ERROR"
    if figures:
        out["figures"] = figures
    if out["status"] in BAD or out["status"] == "SKIPPED":
        out["log_tail"] = log.splitlines()[-20:]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", type=int, choices=(0, 1), default=0)
    parser.add_argument("--seconds", type=int, default=None, help="the check's wall time before this step")
    args = parser.parse_args(argv)
    steps = [step_summary(args.work, name) for name in STEPS]
    preflight = (
        (args.work / "preflight.log").read_text(errors="replace") if (args.work / "preflight.log").exists() else ""
    )
    bad = [s["name"] for s in steps if s["status"] in BAD]
    correctness = next(s for s in steps if s["name"] == "correctness")
    if bad:
        verdict, exit_status = "FAIL: " + ", ".join(bad), 1
    elif correctness["status"] == "SKIPPED" and not args.dry_run:
        verdict, exit_status = "NOT CHECKED: correctness was skipped (" + correctness["skipped"] + ")", 3
    else:
        skipped = [s["name"] for s in steps if s["status"] == "SKIPPED"]
        verdict, exit_status = "PASS" + (f" (skipped: {', '.join(skipped)})" if skipped else ""), 0
    summary = {
        "check": "bench/gpu_check.sh",
        "dry_run": bool(args.dry_run),
        "seconds": args.seconds,
        "machine": machine(preflight),
        "verdict": verdict,
        "exit_status": exit_status,
        "steps": steps,
        "details": "gpu_check_details.tar.gz: every step's log and JSON",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with tarfile.open(args.out / "gpu_check_details.tar.gz", "w:gz") as archive:
        archive.add(args.work, arcname="gpu_check_details")
    for s in steps:
        print(f"{s['name']:<12}{s['status']:<12}{s.get('seconds', '')}")
    print(f"verdict: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
