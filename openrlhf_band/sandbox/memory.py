"""A bound on each sample's memory, all its program processes together: a memory cgroup per running sample.

Per-process limits (RLIMIT_AS, in the harness) bound one process's address space; a sample may start up to
`Limits.processes` of them and fill tmpfs pages and memfds that no rlimit counts. A memory cgroup counts all of
it (anonymous memory, tmpfs and /dev/shm pages, memfds, pipe buffers, page tables, charged to the writer) and the
kernel's OOM killer acts inside it alone, so a sample past its bound loses one of its own processes and a
neighbour sample is untouched.

Where it comes from, the strongest first:
- cgroup v1's memory controller, where this (root) process may create groups under its own (a host or VM with
  the v1 hierarchy mounted, as on the machine this was written on);
- otherwise none: the per-process limits alone, and `describe()` says why. cgroup v2 (the only hierarchy of
  current Ubuntu, Debian and RHEL hosts) is not used yet: it was not available where this was written and tested,
  so it is not claimed.

One group per concurrently running sample ("slot"), created under this process's own memory cgroup (so it nests
inside whatever bound the operator set) and reused across samples; removed at exit. Only the program processes
join it: the parent opens the slot's `cgroup.procs` and hands the descriptor down; the harness's program
process writes "0" (itself) to it before it runs anything of the program (kernels from 5.16 check the
opener's credentials, older ones the writer's, who is the process it moves: either way it works from nobody
inside a user namespace). Only for a root parent: a group made by another user belongs to that user, whom the
programs run as, and could be lifted. The harness stays outside: the OOM killer can never take it, and it
always writes the verdict. The parent compares the slot's `oom_kill` count before and after the sample.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Slot", "describe", "slot"]

SLOT_PREFIX = "openrlhf-band-sample-"
RETIRE_ABOVE_BYTES = 8 << 20  # a slot still charged with more than this after its sample is not reused


@dataclass
class Slot:
    """One sample's memory group: `procs_fd` opened for writing (a program writes "0" to join), the bound."""

    path: Path
    procs_fd: int
    limit_mb: int
    oom_kills_before: int = 0

    def oom_kills(self) -> int:
        """The kernel's count of OOM kills in this group since it was made (memory.oom_control's oom_kill)."""
        try:
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0


def _own_v1_memory_dir() -> tuple[Path | None, str]:
    """This process's memory cgroup directory in the v1 hierarchy, or (None, why not)."""
    try:
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        )
    except (OSError, StopIteration, IndexError):
        return None, "no cgroup v1 memory controller"
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, "no /proc/self/mountinfo"
    for line in mounts:
        fields = line.split()
        if " - cgroup " not in line or "memory" not in fields[-1].split(","):
            continue
        root, mount_point = fields[3], fields[4]
        relative = os.path.relpath(own, root) if root != "/" else own.lstrip("/")
        if relative.startswith(".."):
            continue
        path = Path(mount_point) / relative
        if path.is_dir():
            if not os.access(path, os.W_OK):
                return None, f"cgroup v1 memory group {path} is not writable by uid {os.geteuid()}"
            return path, ""
    return None, "the cgroup v1 memory controller is not mounted here"


class _Slots:
    """This process's slots: made on demand, reused while clean, removed at exit (re-made after a fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.free: list[Path] = []
        self.made: list[Path] = []
        self.count = 0
        self.lock = threading.Lock()
        self.base, self.why_not = None, ""
        if os.geteuid() != 0:  # the groups would belong to the programs' own user, who could lift the bound
            self.why_not = f"memory cgroups only for a root parent; uid {os.geteuid()} would own them"
            return
        try:
            self.base, self.why_not = _own_v1_memory_dir()
            if self.base is not None:
                self._remove_stale()
                probe = self._make()  # the controller must take a group, its limit and a join, not only look writable
                _set_limit(probe, 64 << 20)
                os.close(os.open(probe / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
                self.free.append(probe)
        except OSError as err:
            self.base, self.why_not = None, f"cannot make a memory cgroup here ({err.strerror or err})"

    def _remove_stale(self) -> None:
        """Slots of processes that died without removing them (killed): emptied and removed."""
        for path in self.base.glob(f"{SLOT_PREFIX}*"):
            owner = path.name[len(SLOT_PREFIX) :].split("-")[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                _empty(path)
                with contextlib.suppress(OSError):
                    path.rmdir()

    def _make(self) -> Path:
        self.count += 1
        path = self.base / f"{SLOT_PREFIX}{self.pid}-{self.count}"
        path.mkdir()
        self.made.append(path)
        with contextlib.suppress(OSError):  # without swap accounting, swap would stretch the bound: none at all
            (path / "memory.swappiness").write_text("0")
        return path

    def acquire(self) -> Path:
        with self.lock:
            return self.free.pop() if self.free else self._make()

    def release(self, path: Path, clean: bool) -> None:
        """Back to the free list when it emptied and holds (almost) nothing; else retired: a slot still charged
        with a sample's pages (left in a shared /dev/shm, say) would shrink the next sample's bound."""
        if clean and _empty(path) and _usage(path) < RETIRE_ABOVE_BYTES:
            with self.lock:
                self.free.append(path)
            return
        _empty(path)
        with contextlib.suppress(OSError):
            path.rmdir()

    def remove_all(self) -> None:
        if os.getpid() != self.pid:
            return
        for path in self.made:
            _empty(path)
            with contextlib.suppress(OSError):
                path.rmdir()


def _empty(path: Path, within_s: float = 2.0) -> bool:
    """Kill whatever is left in a group (the harness and the pid namespace normally leave nothing) and wait;
    whether it is empty."""
    give_up = time.monotonic() + within_s
    while True:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return False
        if not pids:
            return True
        if time.monotonic() > give_up:
            return False
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _usage(path: Path) -> int:
    try:
        return int((path / "memory.usage_in_bytes").read_text())
    except (OSError, ValueError):
        return 1 << 62


_SLOTS: _Slots | None = None
_SLOTS_LOCK = threading.Lock()


def _reset_after_fork() -> None:  # a fork while another thread held a lock would leave it held in the child
    global _SLOTS_LOCK
    _SLOTS_LOCK = threading.Lock()
    if _SLOTS is not None:
        _SLOTS.lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _slots() -> _Slots:
    global _SLOTS
    with _SLOTS_LOCK:
        if _SLOTS is None or _SLOTS.pid != os.getpid():
            _SLOTS = _Slots()
            atexit.register(_SLOTS.remove_all)
        return _SLOTS


def describe(limit_mb: int | None) -> str:
    """How each sample's memory is bound here, in words for the preflight line (`limit_mb` None: not asked for)."""
    slots = _slots()
    if slots.base is None:
        return f"memory bound per process only ({slots.why_not})"
    if limit_mb is None:
        return ("memory bound per process only (OPENRLHF_BAND_CODE_SAMPLE_MEMORY_MB=0; a positive N would bound each "
                "sample with a memory cgroup here)")  # fmt: skip
    return f"memory {limit_mb} MiB per sample (cgroup v1)"


def _set_limit(path: Path, limit: int) -> None:
    """memory.limit_in_bytes, and memory + swap to the same where swap is accounted (memsw may never be below
    memory: lower memory first, raise memsw first)."""
    memory, swap = path / "memory.limit_in_bytes", path / "memory.memsw.limit_in_bytes"
    if swap.exists() and limit > int(memory.read_text()):
        swap.write_text(str(limit))
        memory.write_text(str(limit))
    else:
        memory.write_text(str(limit))
        if swap.exists():
            swap.write_text(str(limit))


@contextlib.contextmanager
def slot(limit_mb: int) -> Iterator[Slot | None]:
    """A memory group bound to `limit_mb` MiB for one sample (None where no group can be made), emptied and
    reused afterwards. OSError (the group vanished, the controller refused the limit) when it cannot be set up:
    the sample then fails as a sandbox error, and the slot is not reused."""
    if limit_mb <= 0:
        raise ValueError(f"a sample's memory bound must be positive, not {limit_mb} MiB")
    slots = _slots()
    if slots.base is None:
        yield None
        return
    path = slots.acquire()
    fd, clean = -1, False
    try:
        _set_limit(path, limit_mb << 20)
        fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        group = Slot(path, fd, limit_mb)
        group.oom_kills_before = group.oom_kills()
        clean = True
        yield group
    finally:
        if fd != -1:
            os.close(fd)
        slots.release(path, clean)
