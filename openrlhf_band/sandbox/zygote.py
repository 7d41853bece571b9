"""Warm zygotes for namespaces mode: one harness interpreter per worker slot, forking a fresh sandbox per sample.

Starting the harness's interpreter (and `setpriv`, and `unshare`) for every sample cost more than half of a
sample's time (docs/tasks.md, "Throughput"). A zygote is that interpreter started once, as nobody when the
parent is root, with the harness's code loaded (openrlhf_band/sandbox/harness.py, `serve`). It never runs a
program and never sees a request: per sample it forks a child that unshares fresh user, mount, pid, network,
IPC and UTS namespaces and forks their pid 1, which runs the harness's `main()` on the sample's own pipes, as
the exec'd harness did. So each sample still gets a fresh process tree in fresh namespaces; only the
interpreter's start-up is shared.

A zygote serves one sample at a time; the pool starts one more whenever every idle one is taken, so there are
as many as samples ever ran at once in this process (the code reward bounds that by OPENRLHF_BAND_CODE_WORKERS).
A zygote exits when its control socket closes: when this process exits, dies, or discards it after a protocol
error. Standard library only (the package also runs copied on its own: tests/sandbox/test_non_root.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

START_TIMEOUT_S = 30.0  # the zygote's interpreter start and the harness's imports, on a loaded machine
TEARDOWN_S = 5.0  # after the kill at the wall time: the kernel's teardown of the sample's namespaces


class ZygoteError(RuntimeError):
    """The zygote failed (did not start, died, broke the protocol): the sample is a sandbox error."""


class ZygoteGone(ZygoteError):
    """The zygote had died before this sample reached it (nothing of the sample ran): another may take it."""


class Outcome:
    """What one sample's pid 1 left: its exit code (None when killed at the wall time), stdout and stderr."""

    def __init__(self, returncode: int | None, out: bytes, err: bytes) -> None:
        self.returncode, self.out, self.err = returncode, out, err


class Zygote:
    """One warm harness interpreter and its control socket (SOCK_SEQPACKET: one message a send)."""

    def __init__(self, command: list[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,  # read only when it fails to start or dies: a traceback, nothing else
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},  # nothing of the parent's environment
                cwd="/",
                start_new_session=True,  # the zygote, its children and pid 1s: killed whole by close()
            )
        finally:
            theirs.close()
        self.control = ours
        self.healthy = True
        reply = self._receive(time.monotonic() + START_TIMEOUT_S)[0]
        if reply != b"ready":
            self.close()
            raise ZygoteError(f"the zygote did not start: {self._why()}")

    def _why(self) -> str:
        try:
            self.proc.wait(timeout=1.0)
            lines = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
        except (subprocess.TimeoutExpired, OSError, ValueError):
            lines = []
        return f"exit {self.proc.returncode}: {lines[-1] if lines else 'no message'}"

    def _receive(self, deadline: float) -> tuple[bytes, list[int]]:
        self.control.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            message, fds, _, _ = socket.recv_fds(self.control, 4096, 1)
        except OSError as err:  # a timeout included
            self.healthy = False
            raise ZygoteError(f"the zygote did not answer ({type(err).__name__})") from None
        if not message:
            self.healthy = False
            raise ZygoteError(f"the zygote exited ({self._why()})")
        return message, fds

    def run(self, tag: str, payload: bytes, extra_fds: tuple[int, ...], seconds: float) -> Outcome:
        """One sample: its pid 1 reads `payload` on stdin; killed `seconds` from now if still running. Any failure
        but a clean verdict's marks the zygote unhealthy (the pool then discards it): a later sample never meets
        this one's messages."""
        deadline = time.monotonic() + seconds
        pipes = [os.pipe() for _ in range(3)]  # request, verdict, errors
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        _IN_FLIGHT.update(ours + theirs)
        try:
            try:
                socket.send_fds(self.control, [json.dumps({"tag": tag}).encode()], [*theirs, *extra_fds])
            except OSError as err:
                self.healthy = False
                raise ZygoteGone(f"the zygote is gone ({type(err).__name__})") from None
            finally:
                _close(theirs)
            reply, fds = self._receive(deadline)
            _IN_FLIGHT.update(fds)
            if not reply.startswith(b"started") or len(fds) != 1:
                _close(fds)
                self.healthy = False
                raise ZygoteError(reply.decode(errors="replace").removeprefix("error ")[:300])
            try:
                out, err, killed = _exchange(ours, payload, fds[0], deadline)
            finally:
                _close(fds)
            done = self._receive(time.monotonic() + TEARDOWN_S)[0]
            if not done.startswith(b"done "):
                self.healthy = False
                raise ZygoteError(f"unexpected message from the zygote: {done[:80]!r}")
            return Outcome(None if killed else int(done[5:]), out, err)
        except BaseException:
            self.healthy = False
            raise
        finally:
            _close(ours)

    def close(self) -> None:
        self.healthy = False
        with contextlib.suppress(OSError):
            self.control.close()
        if self.proc.returncode is None:  # not reaped yet, so its pid (the group's id) cannot have been reused
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.proc.wait(timeout=TEARDOWN_S)
        with contextlib.suppress(OSError, ValueError):
            self.proc.stderr.close()


# the fds of the samples running now (their pipes, pid 1's pidfd): a child forked from this process meanwhile closes
# its copies. Between a sample's os.pipe() and the send to the zygote this process holds the verdict pipe's write
# end, which a forked child keeping it would keep open past the sample (a correct program would time out)
_IN_FLIGHT: set[int] = set()


def _close(fds: list[int]) -> None:
    """Close each of `fds` this process still holds as a sample's (each once), and empty the list."""
    for fd in fds:
        if fd in _IN_FLIGHT:
            _IN_FLIGHT.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
    fds.clear()


def _exchange(fds: list[int], payload: bytes, pidfd: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """Write `payload` to fds[0] and read fds[1] and fds[2] to their end, as Popen.communicate does; at `deadline`
    kill pid 1 through `pidfd` (the kernel then kills its whole pid namespace) and read what is left. The caller
    closes the fds. (stdout, stderr, killed)."""
    request, verdict, errors = fds
    chunks: dict[int, list[bytes]] = {verdict: [], errors: []}
    killed = False
    with selectors.DefaultSelector() as selector:
        if payload:
            os.set_blocking(request, False)
            selector.register(request, selectors.EVENT_WRITE)
        for fd in (verdict, errors):
            selector.register(fd, selectors.EVENT_READ)
        view, written = memoryview(payload), 0
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0 and not killed:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed, deadline = True, time.monotonic() + TEARDOWN_S
                continue
            if left <= 0:  # killed, and the pipes are still open past the teardown: give up on them
                break
            for key, _ in selector.select(left):
                if key.fd == request:
                    try:
                        written += os.write(request, view[written : written + 65536])
                    except BrokenPipeError:  # pid 1 died before reading it all: its stderr says why
                        written = len(payload)
                    if written >= len(payload):
                        selector.unregister(request)
                        fds.remove(request)  # closed here, not again by the caller (its number may be reused)
                        _close([request])  # its end: pid 1 reads to the end of the request
                    continue
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    return b"".join(chunks[verdict]), b"".join(chunks[errors]), killed


class Pool:
    """Idle zygotes by command; `take` lends one (starting one when none is idle) and takes it back healthy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: dict[tuple[str, ...], list[Zygote]] = {}
        self.lent: set[Zygote] = set()

    @contextlib.contextmanager
    def take(self, command: list[str]) -> Iterator[Zygote]:
        key = tuple(command)
        with self.lock:
            zygote = self.idle.get(key, []).pop() if self.idle.get(key) else None
            # another command (another interpreter or harness): the idle zygotes of the old one would only hold
            # processes (which count against the user's process limit)
            stale = [z for other, zs in self.idle.items() if other != key for z in zs]
            self.idle = {key: self.idle.get(key, [])}
        for old in stale:
            old.close()
        if zygote is None or zygote.proc.poll() is not None:
            if zygote is not None:
                zygote.close()
            zygote = Zygote(command)
        with self.lock:
            self.lent.add(zygote)
        try:
            yield zygote
        finally:
            with self.lock:
                self.lent.discard(zygote)
                if zygote.healthy:
                    self.idle.setdefault(key, []).append(zygote)
            if not zygote.healthy:
                zygote.close()

    def pids(self) -> set[int]:
        """The zygotes' own pids (not their samples'): for a test that looks for processes left behind."""
        with self.lock:
            return {z.proc.pid for zs in self.idle.values() for z in zs} | {z.proc.pid for z in self.lent}

    def close(self) -> None:
        with self.lock:
            zygotes = [z for zs in self.idle.values() for z in zs]
            self.idle.clear()
        for zygote in zygotes:
            zygote.close()


POOL = Pool()


def _forget_after_fork() -> None:
    """A forked child must not share its parent's zygotes (two users of one control socket): it starts its own.
    Its copies of the sockets and of the running samples' fds are closed, so that the parent's zygotes still exit
    with the parent and its samples' pipes still end."""
    global POOL
    inherited, POOL = POOL, Pool()
    for zygote in [z for zs in inherited.idle.values() for z in zs] + list(inherited.lent):
        with contextlib.suppress(OSError):
            zygote.control.close()
    _close(list(_IN_FLIGHT))


os.register_at_fork(after_in_child=_forget_after_fork)
