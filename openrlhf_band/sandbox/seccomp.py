"""The system-call filter every sample's program runs under: a deny list, compiled here, loaded in the sandbox.

The parent compiles it once per process with libseccomp (through ctypes: libseccomp2 is on every apt-based
system, and no Python binding is needed) and exports it as a raw BPF program, whose bytes travel in the
harness's request; the harness loads them with one `prctl(PR_SET_SECCOMP)` in each program process just before
it execs the interpreter (openrlhf_band/sandbox/harness.py, `apply_limits`). The filter survives fork and exec
and cannot be removed; the harness itself stays unfiltered.

Default ALLOW, and EPERM for the families below: an allow list for CPython is brittle (each glibc and CPython
release adds calls: rseq, clone3, close_range, epoll_pwait2, futex_waitv, ...), and a miss would make correct
programs score 0, a silent bias of the reward. EPERM, not a kill: it is what an unprivileged call gets anyway,
so a program that probes and falls back keeps working, and the kernel code behind the call is never reached.
`clone3` gets ENOSYS instead: its flags sit behind a pointer the filter cannot read, and glibc falls back to
`clone` (whose flags it can read) only on ENOSYS. A call made through another architecture's table (i386 through
`int 0x80`, x32) kills the whole process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

__all__ = ["DENIED", "SeccompUnavailable", "compile_filter"]

# the families denied, and why: each is kernel surface a program that only computes an answer never needs
DENIED: dict[str, tuple[str, ...]] = {
    # a nested user namespace gives the program capabilities over new mount / net / ... namespaces: the way
    # in to most unprivileged kernel exploits (clone with CLONE_NEW* flags: below)
    "namespaces": ("unshare", "setns"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "keys": ("keyctl", "add_key", "request_key"),
    "bpf and perf": ("bpf", "perf_event_open", "userfaultfd"),
    "other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    "mounts": (
        "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
        "fspick", "mount_setattr",
    ),
    "kernel and system": (
        "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module", "personality",
    ),
    # what Docker's default profile also denies: mostly capability-gated already; the NUMA placement calls and
    # modify_ldt are not, and a program that only computes an answer needs none of them
    "privileged leftovers": (
        "modify_ldt", "uselib", "acct", "swapon", "swapoff", "syslog", "quotactl", "quotactl_fd",
        "lookup_dcookie", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "move_pages",
        "migrate_pages", "mbind", "set_mempolicy", "iopl", "ioperm", "vhangup",
    ),
}  # fmt: skip
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)  # NS..NET

_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ
_ATTR_ACT_BADARCH = 2  # SCMP_FLTATR_ACT_BADARCH
_UNKNOWN = -1  # __NR_SCMP_ERROR: a name libseccomp does not know (calls of other architectures are <= -10000)


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing or refused the filter; the message says what to install."""


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp: argument number, comparison, two operands."""

    _fields_ = [
        ("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64),
    ]  # fmt: skip


_COMPILED: bytes | None = None
_LOCK = threading.Lock()


def _reset_lock_after_fork() -> None:  # a fork while another thread compiled would leave the lock held
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        raise SeccompUnavailable(
            "libseccomp.so.2 is not installed: the sandbox filters every program's system calls with it "
            "(apt install libseccomp2; dnf install libseccomp)"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    ]  # fmt: skip
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _build(lib: ctypes.CDLL) -> bytes:
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise SeccompUnavailable("libseccomp could not start a filter (seccomp_init)")
    try:

        def add(action: int, name: str, *conditions: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number == _UNKNOWN:  # a libseccomp older than the call: the filter would miss it, so none at all
                raise SeccompUnavailable(f"libseccomp does not know the system call {name}: install libseccomp >= 2.5")
            if number < 0:  # a pseudo number: not a call of this architecture (iopl on aarch64, ...)
                return
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            rc = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
            if rc != 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {name} ({os.strerror(-rc)})")

        for names in DENIED.values():
            for name in names:
                add(_ERRNO | errno.EPERM, name)
        for flag in CLONE_NEW_FLAGS:  # clone's first argument holds its flags on x86_64 and aarch64
            add(_ERRNO | errno.EPERM, "clone", _ArgCmp(0, _MASKED_EQ, flag, flag))
        add(_ERRNO | errno.ENOSYS, "clone3")
        if lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, _KILL_PROCESS) != 0:
            raise SeccompUnavailable("libseccomp refused the bad-architecture action")
        read, write = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, write)
            os.close(write)
            write = -1
            program = b""
            while chunk := os.read(read, 1 << 16):
                program += chunk
        finally:
            os.close(read)
            if write != -1:
                os.close(write)
        if rc != 0 or not program or len(program) % 8:
            raise SeccompUnavailable(f"libseccomp could not export the filter (rc {rc})")
        return program
    finally:
        lib.seccomp_release(ctx)


def compile_filter() -> bytes:
    """The filter as a raw BPF program (8 bytes an instruction), compiled once per process."""
    global _COMPILED
    with _LOCK:
        if _COMPILED is None:
            _COMPILED = _build(_library())
        return _COMPILED
