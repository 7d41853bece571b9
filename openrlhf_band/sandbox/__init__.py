"""Running a model-written program against its tests, isolated: the code reward's sandbox.

`run_tests(program, tests)` starts one sandbox per sample and returns a `Verdict` (passed or not, why, how
long). Two isolation modes, chosen by `OPENRLHF_BAND_CODE_SANDBOX`:

- `namespaces` (the default): fresh user, pid, network, mount, IPC and UTS namespaces per sample, made by a warm
  zygote (openrlhf_band/sandbox/zygote.py: the harness's interpreter started once per worker slot, as nobody
  when the parent is root) that forks the sample's pid 1, the harness (openrlhf_band/sandbox/harness.py).
  Inside: a new read-only root holding the system's directories and the interpreter's prefix, fresh
  size-limited tmpfs for /tmp and /dev/shm (the program's working directory is on /tmp), no network interface
  up (loopback included), no process of the host visible (the program's /proc is the namespace's), no
  capability for the program, an empty environment (PATH, HOME, LANG only), per program process resource
  limits (CPU seconds, address space, processes, open files, file size, no core) and the system-call filter.
  When the sample ends (or its wall time runs out and the parent kills pid 1 through its pidfd), the kernel
  kills every process left in its pid namespace.
- `rlimits` (a weaker mode the user must name): the harness runs directly (as nobody when the parent is
  root), with the same resource limits, an empty environment and its own temporary directory as working
  directory; it kills each program's session when the sample ends. No filesystem, network or process
  isolation: a program can read and write what its user can, connect anywhere, and outlive the sample
  if it leaves its session (a double fork and setsid). For machines without
  user namespaces whose operators accept that risk.

`require()` checks once per process that the chosen mode works here (a known-good program must pass and
the root mount must be read-only inside) and raises `SandboxUnavailable` with what to do when it does not.
Linux only. docs/tasks.md explains the choice (our own calls over bubblewrap, which was run against this
sandbox's battery and benchmark; nsjail and PyPI's binary wheels were not evaluated) and the limits:
the system-call filter (openrlhf_band/sandbox/seccomp.py) is a deny list of the dangerous families, so the
program can make any other call the kernel allows an unprivileged user; Unix sockets on read-only mounts the
user may connect to stay reachable; the kernel is shared.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# relative: the package also runs copied on its own (tests/sandbox/test_non_root.py)
from . import memory, seccomp, zygote

__all__ = ["Limits", "SandboxUnavailable", "Verdict", "MODES", "mode_from_env", "preflight", "require", "run_tests"]

MODES = ("namespaces", "rlimits")
MODE_ENV = "OPENRLHF_BAND_CODE_SANDBOX"
NOBODY = 65534  # the host uid/gid the sandbox runs as when the parent is root
GRACE_S = 2.0  # the parent's wait past the harness's own wall time (start-up, mounts, teardown)
HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text()


class SandboxUnavailable(RuntimeError):
    """The chosen isolation does not work on this machine; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """Per sample: `wall_s` for all its tests together; the rest per program process (the candidate)."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024  # address space
    processes: int = 16  # processes and threads of the namespace's uid (the harness counts too)
    open_files: int = 64
    file_mb: int = 16  # largest file a program may write
    output_mb: int = 4  # stdout read per stdin/stdout case; more fails the case
    scratch_mb: int = 64  # each tmpfs (namespaces mode)
    # all the sample's program processes together, in a memory cgroup where one can be made (openrlhf_band/sandbox/
    # memory.py); None: per process only. On by default: with the zygote it costs ~0.08x of bare execution's
    # throughput here (bench code-sandbox --sample-memory-mb), where it cost 0.30x -> 0.24x before
    sample_memory_mb: int | None = 1024

    @classmethod
    def from_env(cls) -> Limits:
        """OPENRLHF_BAND_CODE_TIMEOUT (wall_s), OPENRLHF_BAND_CODE_MEMORY_MB, OPENRLHF_BAND_CODE_CPU_S,
        OPENRLHF_BAND_CODE_SAMPLE_MEMORY_MB (0: no bound per sample, per process only)."""
        values = {}
        variables = (
            ("TIMEOUT", "wall_s", float), ("MEMORY_MB", "memory_mb", int), ("CPU_S", "cpu_s", int),
            ("SAMPLE_MEMORY_MB", "sample_memory_mb", int),
        )  # fmt: skip
        for name, key, kind in variables:
            raw = os.environ.get(f"OPENRLHF_BAND_CODE_{name}")
            if raw:
                try:
                    values[key] = kind(raw)
                except ValueError:
                    raise ValueError(f"OPENRLHF_BAND_CODE_{name}={raw!r}: expected a number") from None
                if key == "sample_memory_mb" and values[key] == 0:
                    values[key] = None
                elif values[key] <= 0:
                    raise ValueError(f"OPENRLHF_BAND_CODE_{name}={raw!r}: expected a positive number")
        return cls(**values)

    def for_harness(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_mb << 20,
            "processes": self.processes,
            "open_files": self.open_files,
            "file_bytes": self.file_mb << 20,
            "output_bytes": self.output_mb << 20,
            "scratch_bytes": self.scratch_mb << 20,
        }


@dataclass
class Verdict:
    passed: bool
    error: str | None = None  # why it did not pass: "timeout", "failed: ...", "sandbox: ..."
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        return self.error == "timeout"

    @property
    def sandbox_error(self) -> bool:
        return bool(self.error) and self.error.startswith("sandbox:")


def mode_from_env() -> str:
    mode = os.environ.get(MODE_ENV, "namespaces").strip() or "namespaces"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _others_may_run(path: str) -> bool:
    """Whether a user without any of the file's owners or groups may execute `path` (every directory on the way
    searchable by others, the file executable by others): what nobody needs."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & 0o001:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in real.parents)
    except OSError:
        return False


def interpreter() -> str:
    """The Python that runs the harness and the programs (standard library only, `-I -S`).

    OPENRLHF_BAND_CODE_PYTHON when set; else this process's interpreter, unless the sandbox runs as nobody
    (the parent is root) and nobody cannot execute it (e.g. a pyenv build under /root): then the first of
    /usr/bin/python3, /usr/local/bin/python3 that nobody can execute.
    """
    chosen = os.environ.get("OPENRLHF_BAND_CODE_PYTHON")
    if chosen:
        return os.path.realpath(chosen)
    if os.geteuid() != 0 or _others_may_run(sys.executable):
        return os.path.realpath(sys.executable)  # a venv's python is its base's: the venv's packages stay out
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if _others_may_run(path):
            return os.path.realpath(path)
    raise SandboxUnavailable(
        f"the sandbox runs as nobody, who cannot execute {sys.executable} nor /usr/bin/python3; "
        "set OPENRLHF_BAND_CODE_PYTHON to a Python 3 that every user may execute"
    )


_PREFIXES: dict[str, list[str]] = {}


def interpreter_prefixes(python: str) -> list[str]:
    """The directories `python` needs (its prefix and base prefix, real paths): bound into the sandbox's root."""
    if python not in _PREFIXES:
        done = subprocess.run(
            [python, "-I", "-S", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if done.returncode != 0:
            raise SandboxUnavailable(f"{python} does not run: {done.stderr.strip()[-200:]}")
        prefixes = {os.path.realpath(line) for line in done.stdout.split()}
        _PREFIXES[python] = sorted(prefixes | {os.path.dirname(os.path.dirname(python))})
    return _PREFIXES[python]


_SAMPLES = itertools.count()


def sample_tag() -> str:
    """A new sample's tag, on the command line of its harness and programs: `openrlhf-band-sandbox-PID-N`, PID
    this process (so a test can find the processes of its own sandboxes). Not a secret (the nonce is)."""
    return f"{TAG_PREFIX}{os.getpid()}-{next(_SAMPLES)}"


TAG_PREFIX = "openrlhf-band-sandbox-"


def _rlimits_command(tag: str) -> list[str]:
    """rlimits mode: the harness's interpreter for one sample, as nobody when the parent is root."""
    return [*_drop_root(), interpreter(), "-I", "-S", "-c", HARNESS_SOURCE, tag]


def _drop_root() -> list[str]:
    """`setpriv` to nobody when this process is root (never root: in namespaces mode the namespaces' root is nobody
    on the host), else nothing."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable(
            "the code sandbox needs util-linux's `setpriv` to drop root (apt install util-linux); "
            "or run as a user other than root (docs/tasks.md)"
        )
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


def _zygote_command() -> list[str]:
    """namespaces mode: the warm zygote (openrlhf_band/sandbox/zygote.py), the harness's interpreter started once per
    worker slot, as nobody when the parent is root; it makes each sample's namespaces itself."""
    tag = f"{TAG_PREFIX}{os.getpid()}-zygote"
    return [*_drop_root(), interpreter(), "-I", "-S", "-c", HARNESS_SOURCE, "--zygote", tag]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def run_tests(
    program: str,
    tests: dict,
    entry_point: str | None = None,
    limits: Limits | None = None,
    mode: str | None = None,
) -> Verdict:
    """Run `program` against `tests` in a fresh sandbox; never raises.

    tests: `{"test": code, "setup"?: trusted code}` (HumanEval: `test` defines `check(candidate)`, or holds
    top-level asserts that call `entry_point`), `{"inputs": [...], "outputs": [...], "fn_name": name}`
    (APPS call-based) or `{"inputs": [...], "outputs": [...]}` (stdin/stdout).
    """
    start = time.monotonic()
    limits = limits or Limits()
    workdir = None
    try:
        mode = mode or mode_from_env()
        kind = "call" if ("test" in tests or tests.get("fn_name")) else "io"
        setup = {  # read first: the harness sets up the isolation and forks the candidate before it reads `request`
            "kind": kind,
            "limits": limits.for_harness(),
            "isolate": mode == "namespaces",
            "prefixes": interpreter_prefixes(interpreter()) if mode == "namespaces" else [],
            "seccomp": _filter_hex(),  # every program process loads it
        }
        request = {
            "program": program,
            "tests": tests,
            "entry_point": entry_point or tests.get("fn_name") or tests.get("entry_point"),
            "nonce": secrets.token_hex(16),  # the verdict must echo it: the program never sees it
        }
        if kind == "call" and not request["entry_point"]:
            return Verdict(False, "failed: no entry point", time.monotonic() - start)
        if mode == "rlimits":
            workdir = tempfile.mkdtemp(prefix="openrlhf-band-code-")
            if os.geteuid() == 0:
                os.chown(workdir, NOBODY, NOBODY)
            setup["workdir"] = workdir
        bound = memory.slot(limits.sample_memory_mb) if limits.sample_memory_mb else contextlib.nullcontext()
        with bound as group:
            return RUNNERS[mode](setup, request, limits, group, start)
    except SandboxUnavailable as err:
        return Verdict(False, f"sandbox: {err}", time.monotonic() - start)
    except Exception as err:  # never raise: an infrastructure failure scores as a failure, and says so
        return Verdict(False, f"sandbox: {type(err).__name__}: {err}", time.monotonic() - start)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _payload(setup: dict, request: dict) -> bytes:
    """The harness's stdin: each part as 8 bytes of length (little-endian) and JSON (harness.read_request_part)."""
    parts = [json.dumps(part).encode() for part in (setup, request)]
    return b"".join(len(part).to_bytes(8, "little") + part for part in parts)


def _run_as_process(
    setup: dict,
    request: dict,
    limits: Limits,
    group: memory.Slot | None,
    start: float,
    command: list[str] | None = None,
) -> Verdict:
    """rlimits mode: the harness's own interpreter for this sample (no namespaces to make, no zygote). `command`:
    another launcher of the same harness (the benchmark's bubblewrap), else `_rlimits_command`'s."""
    setup["cgroup_fd"] = group.procs_fd if group is not None else None  # each program joins it
    proc = subprocess.Popen(
        command or _rlimits_command(sample_tag()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},  # nothing of the parent's environment
        cwd="/",
        start_new_session=True,  # one process group: killed whole on a timeout
        pass_fds=(group.procs_fd,) if group is not None else (),
    )
    try:
        out, err = proc.communicate(_payload(setup, request), timeout=limits.wall_s + GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return Verdict(False, "timeout", time.monotonic() - start)
    finally:
        _kill_group(proc)  # whatever stayed in the group
    return _verdict(request, limits, proc.returncode, out, err, group, time.monotonic() - start)


def _run_in_zygote(setup: dict, request: dict, limits: Limits, group: memory.Slot | None, start: float) -> Verdict:
    """Namespaces mode: the sample's pid 1 forked by a warm zygote (fresh namespaces, the harness's main())."""
    extra_fds = (group.procs_fd,) if group is not None else ()
    setup["cgroup_fd"] = 3 if group is not None else None  # pid 1's fd 3 (fds 0-2: request, verdict, errors)
    payload = _payload(setup, request)
    for attempt in (1, 2):  # once more only when the zygote had died before the sample reached it
        try:
            with zygote.POOL.take(_zygote_command()) as warm:
                # from now: a zygote's first start (an interpreter and the harness's imports) is not the sample's
                outcome = warm.run(sample_tag(), payload, extra_fds, limits.wall_s + GRACE_S)
            break
        except zygote.ZygoteGone as err:
            if attempt == 2:
                return Verdict(False, f"sandbox: {err}", time.monotonic() - start)
        except zygote.ZygoteError as err:
            return Verdict(False, f"sandbox: {err}", time.monotonic() - start)
    if outcome.returncode is None:
        return Verdict(False, "timeout", time.monotonic() - start)
    return _verdict(request, limits, outcome.returncode, outcome.out, outcome.err, group, time.monotonic() - start)


# how each mode runs one sample: (setup, request, limits, memory group or None, start) -> Verdict. A comparison may
# add its own (openrlhf_band/bench/sandbox_bench.py adds bubblewrap's); the modes a user may choose are MODES.
RUNNERS = {"namespaces": _run_in_zygote, "rlimits": _run_as_process}


def _verdict(
    request: dict, limits: Limits, returncode: int, out: bytes, err: bytes, group: memory.Slot | None, seconds: float
) -> Verdict:
    """The harness's verdict line, believed only with the sample's nonce; an exit without one says why. `group`:
    the sample's memory group, whose OOM kills since the sample began say why it failed."""
    oom_kills = group.oom_kills() - group.oom_kills_before if group is not None else 0
    lines = out.decode(errors="replace").strip().splitlines()
    if returncode != 0 or not lines:
        reason = err.decode(errors="replace").strip().splitlines()
        return Verdict(False, f"sandbox: exit {returncode}: {reason[-1] if reason else 'no verdict'}", seconds)
    verdict = json.loads(lines[0]) if len(lines) == 1 else {}
    if verdict.get("nonce") != request["nonce"]:
        return Verdict(False, "sandbox: the verdict is not the harness's", seconds)
    details = {k: v for k, v in verdict.items() if k not in ("passed", "error", "nonce")}
    error = verdict.get("error")
    if oom_kills:  # the sample's memory bound was hit: that is why it failed, whatever the harness saw
        details["oom_kills"] = oom_kills
        if not verdict.get("passed"):
            error = f"failed: out of memory ({limits.sample_memory_mb} MiB per sample)"
    return Verdict(bool(verdict.get("passed")), error, seconds, details)


def _filter_hex() -> str:
    """The system-call filter's BPF program (openrlhf_band/sandbox/seccomp.py), hex for the request."""
    try:
        return seccomp.compile_filter().hex()
    except seccomp.SeccompUnavailable as err:
        raise SandboxUnavailable(str(err)) from None


# a program that must pass; it checks that it runs under the system-call filter, and in namespaces mode that the
# root is read-only (it only tries to create a file there inside the sandbox; the harness itself fails the sample
# if any mount is writable)
_PROBE_PROGRAM = """
import os
def probe(readonly_root):
    with open("/proc/self/status") as status:
        if "Seccomp:\t2" not in status.read():
            return "no system-call filter on the program"
    if readonly_root:
        try:
            fd = os.open("/.openrlhf-band-sandbox-probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return "ok"
        os.close(fd)
        os.unlink("/.openrlhf-band-sandbox-probe")
        return "root filesystem writable"
    return "ok"
"""
_PROBE_TESTS = {
    mode: {"test": f"def check(candidate):\n    assert candidate({mode == 'namespaces'}) == 'ok'\n"} for mode in MODES
}
_PROBED: dict[str, str | None] = {}
_PROBE_LOCK = threading.Lock()

_FIXES = (
    "the code reward runs model-written programs in Linux user namespaces (unshare(2)). Fixes: "
    "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 on Debian/Ubuntu kernels, "
    "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04, user.max_user_namespaces > 0); in Docker, "
    "run with --security-opt seccomp=unconfined (the default profile blocks unshare) and --security-opt "
    "systempaths=unconfined (masked /proc paths make mounting a new /proc fail), or --privileged; "
    f"or accept the weaker mode with {MODE_ENV}=rlimits (no filesystem, network or process isolation; "
    "docs/tasks.md)"
)


def require(mode: str | None = None, limits: Limits | None = None) -> str:
    """The mode, after checking once per process that it works here; raises SandboxUnavailable otherwise."""
    mode = mode or mode_from_env()
    with _PROBE_LOCK:
        if mode not in _PROBED:
            verdict = run_tests(_PROBE_PROGRAM, _PROBE_TESTS[mode], "probe", limits or Limits(), mode)
            problem = None
            if not verdict.passed:
                problem = verdict.error or "the probe program did not pass"
            _PROBED[mode] = problem
        problem = _PROBED[mode]
    if problem is not None:
        raise SandboxUnavailable(f"the '{mode}' code sandbox does not work here ({problem}); {_FIXES}")
    return mode


def preflight() -> str:
    """One line for a launcher's log once the configured mode works here ("namespaces, programs on /usr/bin/python3
    as nobody"); SandboxUnavailable, with what to do, when it does not."""
    try:
        mode = require()
    except ValueError as err:  # an unknown OPENRLHF_BAND_CODE_SANDBOX
        raise SandboxUnavailable(str(err)) from None
    info = describe(mode=mode)
    user = " as nobody" if info["runs_as_nobody"] else ""
    return f"{mode}, programs on {info['python']}{user}; {memory.describe(Limits.from_env().sample_memory_mb)}"


def describe(limits: Limits | None = None, mode: str | None = None) -> dict:
    """What a run will use: the mode, the limits and the command (for logs and `openrlhf-band`)."""
    mode = mode or mode_from_env()
    return {
        "mode": mode,
        "limits": asdict(limits or Limits()),
        "python": interpreter(),
        "runs_as_nobody": os.geteuid() == 0,
    }
