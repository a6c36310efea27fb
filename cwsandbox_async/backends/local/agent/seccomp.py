"""The sandbox's seccomp filter: a classic-BPF program assembled here, in pure Python (stdlib only).

Modelled on Docker's default profile, as a deny list (every call not listed is
allowed). Installed by the agent before it reads any request, so it binds the
agent, its template, its workers and every command (filters are inherited across
fork and execve, and cannot be removed). What it does, in order:

1. **Architecture check.** A call made with any other ABI than the native one
   (x86_64 or aarch64) kills the process (``SECCOMP_RET_KILL_PROCESS``): on x86_64
   that is the i386 ``int 0x80`` entry and the x32 ABI (numbers with bit 30 set),
   whose different numbering would otherwise step around the list below.
2. **Denied outright, failing with EPERM** (the program sees an ordinary error):

   =====================  =====================================================================
   group                  calls
   =====================  =====================================================================
   kernel keyrings        ``keyctl``, ``add_key``, ``request_key``
   other processes        ``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``kcmp``,
                          ``pidfd_getfd``, ``process_madvise``, ``move_pages``, ``migrate_pages``
   kernel attack surface  ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_setup``,
                          ``io_uring_enter``, ``io_uring_register``
   mounts                 ``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``fsopen``,
                          ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``,
                          ``mount_setattr``
   namespaces             ``setns``
   file handles           ``open_by_handle_at``, ``name_to_handle_at``
   kernel and machine     ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
                          ``delete_module``, ``reboot``, ``swapon``, ``swapoff``, ``acct``,
                          ``syslog``, ``quotactl``, ``quotactl_fd``, ``settimeofday``,
                          ``clock_settime``, ``sethostname``, ``setdomainname``, ``vhangup``,
                          ``lookup_dcookie``, ``nfsservctl``, ``fanotify_init``
   x86_64 legacy          ``iopl``, ``ioperm``, ``uselib``, ``ustat``, ``sysfs``, ``_sysctl``,
                          ``create_module``, ``get_kernel_syms``, ``query_module``, ``modify_ldt``
   =====================  =====================================================================

3. **Denied by argument:** ``clone`` and ``unshare`` with any namespace flag
   (``CLONE_NEWNS``, ``CLONE_NEWCGROUP``, ``CLONE_NEWUTS``, ``CLONE_NEWIPC``,
   ``CLONE_NEWUSER``, ``CLONE_NEWPID``, ``CLONE_NEWNET``, and for ``unshare``
   ``CLONE_NEWTIME``) fail with EPERM; plain ``fork``/threads are allowed. ``clone``
   with ``CLONE_PARENT`` and ``prctl(PR_SET_CHILD_SUBREAPER, 0)`` fail with EPERM too: every
   command is a child subreaper of PID 1, and with either a process could leave its exec's
   tree (and its CPU budget and timeout kill) while the exec runs.
   ``personality`` is allowed only for the values Docker allows (0, ``PER_LINUX32``,
   ``UNAME26``, both, and the query ``0xffffffff``), else EPERM.
4. **Every process keeps to itself** (all commands of a sandbox run as one user, PID 1's too, so
   the kernel's same-owner checks would let any of them change PID 1: its limits, priority, CPUs):
   ``prlimit64`` with another pid may read that process's limits but not set them;
   ``setpriority`` and ``ioprio_set`` only for the caller itself (``PRIO_PROCESS``/
   ``IOPRIO_WHO_PROCESS`` with who 0: never a group, a user or another pid);
   ``sched_setaffinity``, ``sched_setscheduler``, ``sched_setparam`` and ``sched_setattr`` only
   with pid 0. Otherwise EPERM. (``setrlimit`` and ``nice`` act on the caller only.) The cost: a
   thread cannot be pinned or rescheduled by its tid (``pthread_setaffinity_np``), nor a process
   by its pid (``renice``, ``taskset -p``); pid 0 works.
5. **Socket families allow-listed:** ``socket`` and ``socketpair`` for ``AF_UNIX``, ``AF_INET``,
   ``AF_INET6`` and ``AF_NETLINK`` only; any other family fails with EAFNOSUPPORT (``AF_VSOCK``
   is not isolated by a network namespace: on a VM it reaches the host's services).
6. **No process stops another:** ``kill``, ``tkill``, ``tgkill``, ``rt_sigqueueinfo``,
   ``rt_tgsigqueueinfo`` and ``pidfd_send_signal`` with a stop signal (``SIGSTOP``, ``SIGTSTP``,
   ``SIGTTIN``, ``SIGTTOU``) fail with EPERM, whatever the target (the caller itself too: a filter
   cannot tell). PID 1 starts a command with ``posix_spawn``, a ``vfork``: PID 1 waits, inside the
   kernel, until its child has ``execve``d, and that child, for those few microseconds a process of
   the sandbox's user, could be stopped by any command (``kill -STOP -1`` in a loop): PID 1 would then
   wait forever and report nothing, not even the stopper's own timeout. Every other signal is
   allowed (``SIGKILL`` and ``SIGCONT`` included); the cost is job control (``kill -STOP``, ``^Z``).
7. ``clone3`` fails with **ENOSYS** (its flags are in memory a filter cannot read),
   so the C library falls back to ``clone``, which step 3 checks -- Docker does the same.
   ``io_setup`` fails with **ENOSYS** too, as on a kernel built without AIO (libaio's users fall back
   to threads; glibc's POSIX ``aio_*`` never used it): every AIO context reserves events out of one
   host-wide pool (``fs.aio-max-nr``, 65,536 by default) that no user, namespace or cgroup bounds, and
   one ``io_setup(65536)`` took it all, leaving every other process on the host EAGAIN. Without a
   context the other ``io_*`` calls have nothing to act on (contexts are not inherited across fork).

Not denied (Docker allows them too): ``kill`` with any other signal (signals
stay inside the sandbox's PID namespace), SysV IPC (bounded by sysctls, see
``harden``), ``seccomp`` itself (a program may only add stricter filters).
Machines other than x86_64 and aarch64 get no filter; ``install`` says why.
"""

from __future__ import annotations

import errno
import struct

from . import sysapi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# name: (x86_64, aarch64); None where the machine has no such call
DENIED: dict[str, tuple[int | None, int | None]] = {
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "move_pages": (279, 239),
    "migrate_pages": (256, 238),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "mount_setattr": (442, 442),
    "setns": (308, 268),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "syslog": (103, 116),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "sethostname": (170, 161),
    "setdomainname": (171, 162),
    "vhangup": (153, 58),
    "lookup_dcookie": (212, 18),
    "nfsservctl": (180, 42),
    "fanotify_init": (300, 262),
    "iopl": (172, None),
    "ioperm": (173, None),
    "uselib": (134, None),
    "ustat": (136, None),
    "sysfs": (139, None),
    "_sysctl": (156, None),
    "create_module": (174, None),
    "get_kernel_syms": (177, None),
    "query_module": (178, None),
    "modify_ldt": (154, None),
}
#: Calls checked by argument: (x86_64, aarch64)
CLONE = (56, 220)
UNSHARE = (272, 97)
CLONE3 = (435, 435)
#: Calls that fail with ENOSYS, as if this kernel had none (step 7): (x86_64, aarch64)
NOT_IMPLEMENTED: dict[str, tuple[int, int]] = {"clone3": CLONE3, "io_setup": (206, 0)}
PERSONALITY = (135, 92)
PRCTL = (157, 167)
NS_FLAGS_CLONE = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
NS_FLAGS_UNSHARE = NS_FLAGS_CLONE | 0x80  # and NEWTIME (in clone's flags 0x80 is part of the exit signal)
CLONE_PARENT = 0x00008000
PR_SET_CHILD_SUBREAPER = 36
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
#: Calls that act on the caller only when their first argument (a pid or tid, a 32-bit ``pid_t``)
#: is 0: with any other, EPERM -- so no process can change another's scheduling (PID 1's included).
SELF_ONLY: dict[str, tuple[int, int]] = {
    "sched_setaffinity": (203, 122),
    "sched_setscheduler": (144, 119),
    "sched_setparam": (142, 118),
    "sched_setattr": (314, 274),
}
#: The calls that send a signal, with the index of their signal argument (``STOP_SIGNALS`` are denied).
SIGNAL_SENDERS: dict[str, tuple[tuple[int, int], int]] = {
    "kill": ((62, 129), 1),
    "tkill": ((200, 130), 1),
    "tgkill": ((234, 131), 2),
    "rt_sigqueueinfo": ((129, 138), 1),
    "rt_tgsigqueueinfo": ((297, 240), 2),
    "pidfd_send_signal": ((424, 424), 1),
}
STOP_SIGNALS = (19, 20, 21, 22)  # SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU (the same numbers on both machines)
PRLIMIT64 = (302, 261)
SETPRIORITY = (141, 140)
IOPRIO_SET = (251, 30)
PRIO_PROCESS = 0
IOPRIO_WHO_PROCESS = 1
SOCKET = (41, 198)
SOCKETPAIR = (53, 199)
#: The socket families a sandbox may create: Unix, IPv4, IPv6 (only loopback without ``network``)
#: and netlink (``getaddrinfo`` and ``ip`` ask the kernel through it). Any other (``AF_VSOCK``, which
#: no network namespace isolates, ``AF_PACKET``, ``AF_ALG``, ...) fails with EAFNOSUPPORT.
SOCKET_FAMILIES = (1, 2, 10, 16)

# classic BPF
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1, _OFF_ARG2 = 0, 4, 16, 24, 32  # struct seccomp_data: args' low words
_OFF_ARGS = (_OFF_ARG0, _OFF_ARG1, _OFF_ARG2)
_OFF_ARG2_HI = 36  # (little-endian) and the high word of the third
_INSN = struct.Struct("=HBBI")
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_MODE_FILTER = 2


def _stmt(code: int, k: int) -> tuple[int, int, int, int]:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` as (code, jt, jf, k) instructions; ``ValueError`` for another machine."""
    if machine not in AUDIT_ARCH:
        raise ValueError(f"no seccomp filter for {machine}")
    col = 0 if machine == "x86_64" else 1
    deny = RET_ERRNO | errno.EPERM
    out = [
        _stmt(_LD_W_ABS, _OFF_ARCH),
        _jump(_JEQ, AUDIT_ARCH[machine], 1, 0),
        _stmt(_RET, RET_KILL_PROCESS),
        _stmt(_LD_W_ABS, _OFF_NR),
    ]
    if machine == "x86_64":
        out += [_jump(_JGE, X32_SYSCALL_BIT, 0, 1), _stmt(_RET, RET_KILL_PROCESS)]
    for numbers in DENIED.values():
        nr = numbers[col]
        if nr is not None:
            out += [_jump(_JEQ, nr, 0, 1), _stmt(_RET, deny)]
    for numbers in NOT_IMPLEMENTED.values():
        out += [_jump(_JEQ, numbers[col], 0, 1), _stmt(_RET, RET_ERRNO | errno.ENOSYS)]
    for nr, mask in ((CLONE[col], NS_FLAGS_CLONE | CLONE_PARENT), (UNSHARE[col], NS_FLAGS_UNSHARE)):
        # A is reloaded with the number after the block only on the way out of the filter, so each
        # argument check ends in a return.
        out += [
            _jump(_JEQ, nr, 0, 4),
            _stmt(_LD_W_ABS, _OFF_ARG0),
            _jump(_JSET, mask, 0, 1),
            _stmt(_RET, deny),
            _stmt(_RET, RET_ALLOW),
        ]
    out += [  # prctl(PR_SET_CHILD_SUBREAPER, 0): EPERM; every other prctl: allowed
        _jump(_JEQ, PRCTL[col], 0, 6),
        _stmt(_LD_W_ABS, _OFF_ARG0),
        _jump(_JEQ, PR_SET_CHILD_SUBREAPER, 0, 3),
        _stmt(_LD_W_ABS, _OFF_ARG1),
        _jump(_JEQ, 0, 0, 1),
        _stmt(_RET, deny),
        _stmt(_RET, RET_ALLOW),
    ]
    out += _others(col, deny)
    checks = []
    for value in PERSONALITIES:
        checks += [_jump(_JEQ, value, 0, 1), _stmt(_RET, RET_ALLOW)]
    checks.append(_stmt(_RET, deny))
    out += [_jump(_JEQ, PERSONALITY[col], 0, len(checks) + 1), _stmt(_LD_W_ABS, _OFF_ARG0), *checks]
    out.append(_stmt(_RET, RET_ALLOW))
    return out


def _others(col: int, deny: int) -> list[tuple[int, int, int, int]]:
    """The checks that keep every process to itself: limits, priority, CPUs, I/O priority, stop
    signals; and sockets.

    Each block starts by comparing the call's number (in A) and ends in returns, so A holds the
    number again for the block after it."""
    allow = _stmt(_RET, RET_ALLOW)
    out: list[tuple[int, int, int, int]] = []
    for numbers in SELF_ONLY.values():  # pid 0 (the caller itself) or EPERM
        out += [_jump(_JEQ, numbers[col], 0, 4), _stmt(_LD_W_ABS, _OFF_ARG0), _jump(_JEQ, 0, 1, 0), _stmt(_RET, deny)]
        out.append(allow)
    out += [  # prlimit64(pid, resource, new, old): another process's limits may be read, never set
        _jump(_JEQ, PRLIMIT64[col], 0, 8),
        _stmt(_LD_W_ABS, _OFF_ARG0),
        _jump(_JEQ, 0, 5, 0),
        _stmt(_LD_W_ABS, _OFF_ARG2),
        _jump(_JEQ, 0, 0, 2),
        _stmt(_LD_W_ABS, _OFF_ARG2_HI),
        _jump(_JEQ, 0, 1, 0),
        _stmt(_RET, deny),
        allow,
    ]
    for nr, which in ((SETPRIORITY[col], PRIO_PROCESS), (IOPRIO_SET[col], IOPRIO_WHO_PROCESS)):
        out += [  # (which, who): only the calling process itself (who 0), never a group or a user
            _jump(_JEQ, nr, 0, 6),
            _stmt(_LD_W_ABS, _OFF_ARG0),
            _jump(_JEQ, which, 0, 2),
            _stmt(_LD_W_ABS, _OFF_ARG1),
            _jump(_JEQ, 0, 1, 0),
            _stmt(_RET, deny),
            allow,
        ]
    stops = []  # a signal is an int: its low word is all of it
    for signo in STOP_SIGNALS:
        stops += [_jump(_JEQ, signo, 0, 1), _stmt(_RET, deny)]
    stops.append(allow)
    for numbers, arg in SIGNAL_SENDERS.values():
        out += [_jump(_JEQ, numbers[col], 0, len(stops) + 1), _stmt(_LD_W_ABS, _OFF_ARGS[arg]), *stops]
    families = []
    for family in SOCKET_FAMILIES:
        families += [_jump(_JEQ, family, 0, 1), allow]
    families.append(_stmt(_RET, RET_ERRNO | errno.EAFNOSUPPORT))
    for nr in (SOCKET[col], SOCKETPAIR[col]):
        out += [_jump(_JEQ, nr, 0, len(families) + 1), _stmt(_LD_W_ABS, _OFF_ARG0), *families]
    return out


def assemble(instructions: list[tuple[int, int, int, int]]) -> bytes:
    """The program as ``struct sock_filter[]`` bytes (what ``seccomp(2)`` and bwrap's ``--seccomp`` take)."""
    return b"".join(_INSN.pack(*insn) for insn in instructions)


#: The native machine's filter, assembled once at import (in the template: before any sandbox exists,
#: so the bytes are shared, not rebuilt in every newborn).
NATIVE = assemble(program(sysapi.MACHINE)) if sysapi.MACHINE in AUDIT_ARCH else b""

if sysapi.AVAILABLE:
    import ctypes

    class SockFprog(ctypes.Structure):
        """``struct sock_fprog``: length in instructions, pointer to them."""

        _fields_: ClassVar[Any] = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    # The native program as the kernel takes it, built once (the template imports this before any
    # sandbox exists: each newborn only makes the system call).
    _NATIVE_BUF = ctypes.create_string_buffer(NATIVE, len(NATIVE))
    _NATIVE_PROG = SockFprog(len(NATIVE) // _INSN.size, ctypes.cast(_NATIVE_BUF, ctypes.c_void_p))


def install(machine: str | None = None) -> str:
    """Set NO_NEW_PRIVS and install the filter on this process (and so its future children).

    Returns ``"installed"``; raises ``OSError`` when the kernel refuses (no seccomp
    support) and ``ValueError`` on a machine without a filter. Irrevocable.
    """
    machine = machine or sysapi.MACHINE
    native = machine == sysapi.MACHINE and NATIVE
    code = NATIVE if native else assemble(program(machine))
    if not sysapi.AVAILABLE:
        raise OSError(errno.ENOSYS, "seccomp: no ctypes in this Python")
    if native:
        buf, prog = _NATIVE_BUF, _NATIVE_PROG
    else:
        buf = ctypes.create_string_buffer(code, len(code))
        prog = SockFprog(len(code) // _INSN.size, ctypes.cast(buf, ctypes.c_void_p))
    if not sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1):
        raise OSError(errno.EPERM, "seccomp: cannot set NO_NEW_PRIVS")
    try:
        sysapi.syscall("seccomp", ctypes.c_ulong(SECCOMP_SET_MODE_FILTER), ctypes.c_ulong(0), ctypes.byref(prog))
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        if sysapi.libc().prctl(sysapi.PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "seccomp: the kernel refused the filter") from None
    return "installed"


def status() -> dict[str, int]:
    """This process's ``Seccomp`` mode and number of filters (from ``/proc/self/status``)."""
    out = {"mode": 0, "filters": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    out["mode"] = int(line.split()[1])
                elif line.startswith("Seccomp_filters:"):
                    out["filters"] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return out
