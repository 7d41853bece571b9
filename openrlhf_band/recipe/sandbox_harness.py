"""The test harness that runs inside the code sandbox (standard library only; run as `python -I -S -c SOURCE`).

It reads one JSON request from stdin, writes one JSON verdict line to stdout and exits. With
`"isolate": true` it is the first process (pid 1) of fresh user, pid, network, mount, IPC and UTS
namespaces made by util-linux `unshare` (openrlhf_band/recipe/sandbox.py builds the command), and
before any test it:

1. makes every mount private (nothing propagates back to the host) and remounts each one read-only
   (bind remount, keeping the flags the kernel locks);
2. mounts fresh size-limited tmpfs over /tmp, /var/tmp, /dev/shm, /run and the parent's home
   directory, so the only writable places are empty and vanish with the sample;
3. marks itself non-dumpable (the program, same uid, cannot ptrace it or read its memory) and drops
   every capability from the bounding set with no_new_privs, so the programs it starts have no
   capability even as uid 0 of the namespace.

Being pid 1 of the pid namespace, it cannot be killed by a signal from inside the namespace that it
does not handle (SIGKILL included), and when it exits the kernel kills every process left in the
namespace: each sample's descendants die with it.

The model's program never runs in this process. Two kinds of test:

- call-based (HumanEval `{"test", "entry_point"}`, APPS `{"fn_name", "inputs", "outputs"}`): the
  program runs in a child interpreter (the candidate), which executes it and then answers calls to
  the entry point over a pipe. The checks run here, with a proxy in place of the function: the
  arguments and the result cross the pipe as plain data (ints, floats, strings, bytes, bools, None,
  lists, tuples, dicts, sets), so an object that equals everything, a patched builtin, a `check`
  the program defines or a printed "passed" cannot reach the checks, and a candidate that exits or
  dies fails the call.
- stdin/stdout (APPS / CodeContests `{"inputs", "outputs"}`): the program runs once per case with
  the input on stdin; its stdout (capped) is compared here with the expected output.

The verdict is written on this process's stdout, which no candidate inherits.
"""

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time

# --------------------------------------------------------------------------------------------- codec
# Values cross the candidate pipe as tagged JSON: only these types exist on the checking side. The codec is
# source text because the candidate runs without our package (`-I -S`) and this file itself may run as `-c`.
CODEC_SOURCE = r"""
import json, os, struct

MAX_MESSAGE_BYTES = 16 << 20
MAX_DEPTH = 64


class CodecError(Exception):
    pass

def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}
    if kind is float:
        return {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "fs": [encode(v, depth + 1) for v in value]}
    raise CodecError("unsupported type " + kind.__name__)


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
            raise EOFError("the candidate closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


"""
_codec: dict = {}
exec(CODEC_SOURCE, _codec)
CodecError, encode, decode, send, receive = (_codec[n] for n in ("CodecError", "encode", "decode", "send", "receive"))

# --------------------------------------------------------------------------------------------- candidate
# The child interpreter that runs the model's program: `python -I -S -c CANDIDATE_SOURCE REQ_FD RESP_FD`.
# It imports nothing of ours: the codec above is sent to it as source in its first message.
CANDIDATE_SOURCE = r"""
import os, sys
_req, _resp = int(sys.argv[1]), int(sys.argv[2])
_boot = {"__name__": "__codec__"}
import json as _json, struct as _struct
_size = _struct.unpack("<I", os.read(_req, 4))[0]
_data = b""
while len(_data) < _size:
    _chunk = os.read(_req, _size - len(_data))
    if not _chunk:
        os._exit(3)
    _data += _chunk
_first = _json.loads(_data)
exec(_first["codec"], _boot)
_send, _receive, _encode, _decode = _boot["send"], _boot["receive"], _boot["encode"], _boot["decode"]
_ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
try:
    exec(compile(_first["program"], "<program>", "exec"), _ns)
    _fn = _ns[_first["entry_point"]]
    if not callable(_fn):
        raise TypeError("the entry point is not callable")
except BaseException as _err:
    _send(_resp, {"error": "program: " + type(_err).__name__})
    os._exit(4)
_send(_resp, {"ready": True})
while True:
    try:
        _call = _receive(_req)
    except EOFError:
        os._exit(0)
    try:
        _args = _decode(_call["args"])
        _result = _encode(_fn(*_args))
        _send(_resp, {"result": _result})
    except BaseException as _err:
        _send(_resp, {"error": type(_err).__name__})
"""

class TestFailed(Exception):
    """A check failed: a wrong result, an exception, a dead or silent candidate."""


class Deadline(Exception):
    pass


def _on_alarm(signum, frame):
    raise Deadline()


class Candidate:
    """The model's program in a child interpreter, called through a pipe."""

    def __init__(self, request, limits):
        req_read, self.req_write = os.pipe()
        self.resp_read, resp_write = os.pipe()
        self.proc = start_program(
            [sys.executable, "-I", "-S", "-c", CANDIDATE_SOURCE, str(req_read), str(resp_write)],
            limits,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # what the program prints is not read: it cannot speak for the checks
            stderr=subprocess.DEVNULL,
            pass_fds=(req_read, resp_write),
        )
        os.close(req_read)
        os.close(resp_write)
        send(self.req_write, {"codec": CODEC_SOURCE, "program": request["program"],
                              "entry_point": request["entry_point"]})
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
    proc = subprocess.Popen(
        argv, cwd=limits["workdir"], env=limits["env"], preexec_fn=lambda: apply_limits(limits), **popen
    )
    STARTED.append(proc)
    return proc


def apply_limits(limits):
    """In the candidate, before exec: resource limits (the harness itself is not limited)."""
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


# --------------------------------------------------------------------------------------------- isolation
_libc = None

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 24, 38


def _mount(source, target, fstype, flags, data=None):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), target)


def _mounts():
    """(mount point, per-mount options) from /proc/self/mountinfo, parents before children."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            out.append((point, fields[5].split(",")))
    return out


def isolate(request):
    """Mounts read-only, private tmpfs, no capabilities for the programs; returns what could not be made read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    not_readonly = []
    for point, options in _mounts():
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name in options:
            flags |= _KEPT_FLAGS.get(name, 0)
        try:
            _mount(None, point, None, flags)
        except OSError:
            not_readonly.append(point)
    tmpfs_size = f"size={request['limits']['scratch_bytes']},nr_inodes=4096,mode=1777"
    for point in ["/tmp", "/var/tmp", "/dev/shm", "/run", request.get("home") or "", "/root"]:
        if point and os.path.isdir(point):
            try:
                _mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_size)
            except OSError:
                not_readonly.append(point)
    # what is still writable must be nothing the host sees; the workdir is on the fresh /tmp
    libc = _libc
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("no_new_privs")
    return not_readonly


# --------------------------------------------------------------------------------------------- tests
def run_call_tests(request, limits):
    """HumanEval (`test` defines check(candidate) or holds top-level asserts) and APPS call-based tests."""
    candidate = Candidate(request, limits)
    try:
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
    for given, expected in zip(spec["inputs"], spec["outputs"]):
        given = given if isinstance(given, str) else "\n".join(map(str, given))
        expected = expected if isinstance(expected, str) else "\n".join(map(str, expected))
        proc = start_program(
            [sys.executable, "-I", "-S", path], limits,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        try:
            proc.stdin.write(given.encode())
            proc.stdin.close()
        except OSError:
            pass
        out = proc.stdout.read(limits["output_bytes"] + 1)
        proc.stdout.close()
        status = proc.poll()
        kill_session(proc)  # its input is consumed and its output read: nothing it does later counts
        status = proc.wait() if status is None else status
        if len(out) > limits["output_bytes"]:
            raise TestFailed("output over the limit")
        if status not in (0, -signal.SIGKILL) or not outputs_match(out.decode(errors="replace"), expected):
            raise TestFailed("wrong output")
        if status != 0:
            raise TestFailed("did not exit cleanly")


# --------------------------------------------------------------------------------------------- main
def main():
    started = time.monotonic()
    request = json.loads(sys.stdin.buffer.read())
    limits = request["limits"]
    verdict = {"passed": False, "nonce": request.get("nonce")}
    try:
        # the programs run as this process's uid: non-dumpable, it cannot be ptraced nor its memory or fds read
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        if request.get("isolate"):
            verdict["not_readonly"] = isolate(request)
        workdir = "/tmp/work" if request.get("isolate") else request["workdir"]
        os.makedirs(workdir, exist_ok=True)
        limits["workdir"] = workdir
        limits["env"] = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, limits["wall_s"] - (time.monotonic() - started)))
        if request["kind"] == "io":
            run_io_tests(request, limits)
        else:
            run_call_tests(request, limits)
        signal.setitimer(signal.ITIMER_REAL, 0)
        verdict["passed"] = True
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
    sys.stdout.write(json.dumps(verdict) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
