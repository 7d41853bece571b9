"""The sandbox with a non-root parent, the path of a user outside a container: it works, or it refuses with one
line naming the fix.

As root (this machine, CI), the sandbox package (standard library only) is copied to a directory others may read
and run as uid 65534 by the interpreter the programs run on (`sandbox.interpreter()`, a system Python others may
execute: the venv's lives under /root). As a non-root user the whole sandbox suite is this path already.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from openrlhf_band import sandbox

PACKAGE = Path(sandbox.__file__).parent
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="as a non-root user the whole sandbox suite is this path")

PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import sandbox
program = "def f(x):\\n    return x + 1\\n"
out = {"euid": os.geteuid()}
for mode in ("namespaces", "rlimits"):
    right = sandbox.run_tests(program, {"test": "def check(c):\\n    assert c(1) == 2\\n"}, "f", mode=mode)
    wrong = sandbox.run_tests(program, {"test": "def check(c):\\n    assert c(1) == 3\\n"}, "f", mode=mode)
    out[mode] = [right.passed, wrong.passed, right.error, wrong.error]
try:
    out["preflight"] = sandbox.preflight()
except sandbox.SandboxUnavailable as err:
    out["refused"] = str(err)
print(json.dumps(out))
"""

# a host without unprivileged user namespaces, as a non-root parent sees it: nobody inside a user namespace
# (made by this root process) whose max_user_namespaces is 0
NO_USER_NAMESPACES = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ready, go = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    assert libc.unshare(0x10000000) == 0  # CLONE_NEWUSER
    os.write(ready[1], b"x")
    os.read(go[0], 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")
    os.execvp("setpriv", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *sys.argv[1:]])
os.read(ready[0], 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as mapping:
        mapping.write("0 0 65536\\n")
os.write(go[1], b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.fixture(scope="module")
def shared_copy():
    """The sandbox package where uid 65534 can read it (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="openrlhf-band-non-root-"))
    try:
        root.chmod(0o755)
        shutil.copytree(PACKAGE, root / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
        for path in root.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as_nobody(shared_copy: Path, *wrapper: str) -> dict:
    argv = [*wrapper, sandbox.interpreter(), "-I", "-c", PROBE, str(shared_copy)]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_non_root_parent_runs_both_modes(shared_copy):
    out = _as_nobody(shared_copy, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all")  # fmt: skip
    assert out["euid"] == 65534
    for mode in ("namespaces", "rlimits"):
        right_passed, wrong_passed, right_error, wrong_error = out[mode]
        assert right_passed and right_error is None, out
        assert not wrong_passed and wrong_error.startswith("failed"), out  # scored, not a sandbox error
    # the system-call filter and the read-only root are checked by the probe behind the preflight
    # no "as nobody": it is nobody already; and nobody may make no memory cgroup here: said, not hidden
    assert out["preflight"].startswith(f"namespaces, programs on {sandbox.interpreter()}; "), out
    assert "memory bound per process only" in out["preflight"], out


def test_a_non_root_parent_without_user_namespaces_is_refused_in_one_line(shared_copy):
    out = _as_nobody(shared_copy, sys.executable, "-I", "-c", NO_USER_NAMESPACES)
    assert out["euid"] == 65534 and "preflight" not in out
    assert not out["namespaces"][0] and out["namespaces"][2].startswith("sandbox: "), out
    refusal = out["refused"]
    assert "\n" not in refusal and refusal.startswith("the 'namespaces' code sandbox does not work here")
    assert "unprivileged user namespaces" in refusal and "OPENRLHF_BAND_CODE_SANDBOX=rlimits" in refusal
