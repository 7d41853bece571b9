"""The unit suite runs as on a machine that has never run it, and stays off the network.

Before any test module is imported, each pytest process (each xdist worker) gets a HOME of its own, empty, under
the system's temp dir, and the HOME-derived caches a test could fall back on are unset (OPENRLHF_BAND_CACHE,
XDG_*, HF_HOME, ...), so no test can pass because an earlier run filled ~/.cache (a CI machine's HOME is empty;
the bare-install test once passed only where a 93 MB wheel was already cached there). The third-party caches
that the suite fills as it should (Triton's compiled kernels, matplotlib's font list, the datasets library's
Arrow copies, rustup's settings) are pointed at a folder of the run, beside that HOME, not in it. Child
processes inherit all of it; pip there looks at no index (PIP_NO_INDEX: its local find-links still serve).

Two checks, per unit test, fail the test that broke them (the end-to-end suite, tests/e2e, is exempt: it runs
Ray, vLLM and DeepSpeed on the host's addresses and fetches its model once into .venv-e2e, docs/tests.md):
- **HOME stays empty.** Anything a test (or a process it started) leaves in HOME is a write outside its tmp
  dirs: the test fails naming the paths, and they are removed so the next test starts clean.
- **No connection leaves the machine.** This process's sockets may connect to loopback and Unix sockets only;
  an attempt elsewhere raises ConnectionRefusedError in the code that tried and fails the test even where that
  code caught the error (a download with a fallback would otherwise pass silently).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent / "e2e"
# the unit suite's start, end and counts, for bench/ci/record.py (the end-to-end suite writes its own)
UNIT_TIMINGS = Path(__file__).resolve().parents[1] / "out" / "tests" / "unit-timings.json"
_started_at = time.time()
# env vars that move a cache out of HOME; unset, so every cache a library falls back on is under the empty HOME
HOME_CACHE_VARIABLES = (
    "OPENRLHF_BAND_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "HF_HOME",
    "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "PIP_CACHE_DIR",
)  # fmt: skip
# pip in a child process looks at no index (its local find-links still serve): a download fails loudly there. The
# Hugging Face libraries are not switched offline (HF_HUB_OFFLINE changes which path the tasks' tests take); a
# child's hub download would land in HOME's ~/.cache/huggingface, which the HOME check fails
OFFLINE = {"PIP_NO_INDEX": "1"}

_blocked_connections: list[str] = []


def _only_unit_tests(config: pytest.Config) -> bool:
    """False when every path the run was given is under tests/e2e (`make e2e`)."""
    paths = [Path(a.split("::", 1)[0]).resolve() for a in config.args]
    return not paths or not all(p == E2E or E2E in p.parents for p in paths)


def _fresh_home() -> Path:
    """An empty HOME for this process, its library caches beside it; the environment every child inherits."""
    run = Path(tempfile.mkdtemp(prefix=f"openrlhf-band-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"))
    home = run / "home"
    home.mkdir()
    for name in HOME_CACHE_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(OFFLINE)
    os.environ["HOME"] = str(home)
    # what the suite fills as it should, each in the run's folder: the ahead-of-time compile checks' kernels,
    # matplotlib's font list, the datasets library's Arrow copies of the local JSON files prepare-data reads, and
    # rustup's settings (pip runs `rustc --version` for its user agent; where rustc is rustup's proxy, it writes
    # $RUSTUP_HOME/settings.toml)
    for variable, folder in (("TRITON_CACHE_DIR", "triton"), ("MPLCONFIGDIR", "matplotlib"),
                             ("HF_DATASETS_CACHE", "hf-datasets"), ("RUSTUP_HOME", "rustup")):  # fmt: skip
        os.environ[variable] = str(run / folder)
    return home


def _loopback(address) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX paths (Ray, the sandbox's sockets), abstract names
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:  # a host name: connecting to it means a lookup and a connection elsewhere
        return False


def _guard(method):
    def connect(sock, address, *args):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
            _blocked_connections.append(f"{method.__name__}{address!r}")
            raise ConnectionRefusedError(f"the unit suite stays off the network (tests/conftest.py): {address!r}")
        return method(sock, address, *args)

    connect.__name__ = method.__name__
    return connect


def pytest_configure(config: pytest.Config) -> None:
    if not _only_unit_tests(config):
        return
    config._openrlhf_band_home = _fresh_home()  # type: ignore[attr-defined]
    socket.socket.connect = _guard(socket.socket.connect)
    socket.socket.connect_ex = _guard(socket.socket.connect_ex)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if getattr(config, "_openrlhf_band_home", None) is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.collectonly or any(a != "tests" and not Path(a).is_dir() for a in config.args):
        return  # only a whole suite's run is a record (not one file's)
    counts = {k: len(terminalreporter.stats.get(k, ())) for k in ("passed", "failed", "skipped", "error")}
    UNIT_TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    record = {"started_at": _started_at, "ended_at": time.time(), "exit_status": int(exitstatus), "counts": counts}
    UNIT_TIMINGS.write_text(json.dumps(record, indent=1) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    home: Path | None = getattr(config, "_openrlhf_band_home", None)
    if home is not None:
        shutil.rmtree(home.parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def _home_and_network_untouched(request: pytest.FixtureRequest):
    home: Path | None = getattr(request.config, "_openrlhf_band_home", None)
    if home is None or E2E in request.node.path.parents:
        yield
        return
    del _blocked_connections[:]
    yield
    left = sorted(str(p.relative_to(home)) for p in home.iterdir())
    for path in home.iterdir():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    blocked = list(_blocked_connections)
    problems = []
    if left:
        problems.append(f"wrote into HOME (a unit test writes only under its tmp dirs): {left}")
    if blocked:
        problems.append(f"tried to reach the network: {blocked}")
    if problems:
        pytest.fail("; ".join(problems) + " -- tests/conftest.py", pytrace=False)
