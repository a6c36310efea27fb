"""Hardening applied while a sandbox is born (stdlib only).

Two kinds of steps, in this order:

- **Privileged steps**, run by the birth path (``_birth``): ``bound_sysv_ipc`` by the
  newborn after it entered a new IPC namespace and mounted the sandbox's ``/proc``
  (written through that one: see ``_birth._enter``), while still uid 0 of the
  template's user namespace (which then owns the IPC namespace, so the sandbox user
  cannot change the bounds: SysV IPC memory lives outside every process -- a
  detached shared memory segment stays charged to the sandbox's memory cgroup after
  its creator died -- so removal on exit is forced and the sizes are small); then,
  as root of the sandbox's own user namespace after its mounts, ``bound_user_limits``
  and ``readonly_proc_sys``. Each raises ``OSError`` when the kernel refuses; the birth
  path then fails the sandbox.
- **Unprivileged steps**, run by the agent itself first thing (``main.run``):
  ``fresh_session_keyring`` (keyrings are inherited across fork, exec and
  namespaces: without it a sandbox could read or clear its creator's session
  keyring), then the seccomp filter (``seccomp.install``), last.

The file system part -- a read-only, empty ``HOME`` -- is an empty directory of the
template's read-only root (a read-only tmpfs on the plain path), and ``SANDBOX_ENV``
is merged into every sandbox's environment
(``PYTHONNOUSERSITE=1``): together they stop one exec from dropping a ``.pth``
into ``~/.local/lib/pythonX.Y/site-packages`` that would run in every later
``python3`` (for example to make it exit 0).
"""

from __future__ import annotations

import errno
import os

from . import sysapi

#: The sandbox's HOME: a read-only, empty directory (mode 0555).
HOME = "/home/sandbox"
#: Merged into every sandbox's environment (the caller's own ``env`` still wins).
SANDBOX_ENV = {"HOME": HOME, "PYTHONNOUSERSITE": "1"}
#: ``/proc/sys/kernel/<name>`` values written in the sandbox's IPC namespace.
IPC_LIMITS = {
    "shm_rmid_forced": "1",  # a segment is destroyed when its last user detaches or exits
    "shmmax": str(16 << 20),  # largest segment: 16 MiB
    "shmall": str((64 << 20) // 4096),  # all segments together: 64 MiB (in pages)
    "shmmni": "64",  # segments
    "msgmnb": str(8 << 10),  # bytes in one message queue (the kernel's default: 16 KiB)
    "msgmax": str(4 << 10),  # one message
    "msgmni": "16",  # queues
    "sem": "250 8000 32 64",  # semmsl semmns semopm semmni
}
#: ``/proc/sys/user/<name>`` of the sandbox's own user namespace. The kernel counts these per user at
#: every level of nested user namespaces, and every sandbox's namespace is nested in the template's,
#: whose creator is the driver's uid: without a bound of its own, one sandbox could take all of the
#: driver's inotify instances (128 by default) and leave the driver and every neighbour EMFILE.
USER_LIMITS = {"max_inotify_instances": "16", "max_inotify_watches": "8192"}
#: Per-user rlimits counted the same way (hard limits: no process of the sandbox can raise them):
#: POSIX message queue bytes, and locked memory (``mlock``, SysV ``SHM_LOCK``).
USER_RLIMITS = {"RLIMIT_MSGQUEUE": 64 << 10, "RLIMIT_MEMLOCK": 1 << 20}
KEYCTL_JOIN_SESSION_KEYRING = 1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
_ST_FLAGS = ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC))  # statvfs flag -> mount flag (locked flags)


def fresh_session_keyring() -> int:
    """Join a new anonymous session keyring (``KEYCTL_JOIN_SESSION_KEYRING`` with NULL); its serial.

    Every process started afterwards inherits it instead of the creator's. Raises
    ``OSError`` when the kernel refuses (or has no keyrings: ``ENOSYS``).
    """
    import ctypes

    return sysapi.syscall("keyctl", ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None))


def bound_sysv_ipc(limits: dict[str, str] | None = None, proc: str = "/proc") -> None:
    """Write ``IPC_LIMITS`` (or ``limits``) into this IPC namespace's sysctls; ``OSError`` if refused."""
    for name, value in (limits if limits is not None else IPC_LIMITS).items():
        fd = os.open(f"{proc}/sys/kernel/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


def bound_user_limits(proc: str = "/proc") -> None:
    """``USER_LIMITS`` into this user namespace's sysctls and ``USER_RLIMITS`` on this process (never
    raising a limit that is lower already); ``OSError`` if refused."""
    import resource

    for name, value in USER_LIMITS.items():
        fd = os.open(f"{proc}/sys/user/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    for name, bound in USER_RLIMITS.items():
        key = getattr(resource, name)
        soft, hard = resource.getrlimit(key)
        top = bound if hard == resource.RLIM_INFINITY else min(bound, hard)
        resource.setrlimit(key, (min(top, soft) if soft != resource.RLIM_INFINITY else top, top))


def readonly_proc_sys(proc: str = "/proc") -> None:
    """Bind ``<proc>/sys`` read-only over itself (the flags the kernel locked are kept); ``OSError`` if refused."""
    path = f"{proc}/sys"
    sysapi.mount(path, path, None, MS_BIND | MS_REC)
    have = os.statvfs(path).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for st, ms in _ST_FLAGS:
        if have & st:
            flags |= ms
    sysapi.mount(None, path, None, flags)


def apply_unprivileged(seccomp: bool = True) -> dict[str, str]:
    """The agent's own steps: a fresh session keyring, then the seccomp filter (last).

    Never raises: returns what each step did (``"ok"``/``"installed"``, or why not),
    which the agent reports in its hello so ``doctor`` and the tests can check it.
    """
    from . import seccomp as filt

    report: dict[str, str] = {}
    try:
        fresh_session_keyring()
        report["keyring"] = "fresh"
    except OSError as exc:
        report["keyring"] = f"unchanged: {exc.strerror or exc}"
    if not seccomp:
        report["seccomp"] = "off (by configuration)"
        return report
    try:
        report["seccomp"] = filt.install()
    except ValueError as exc:
        report["seccomp"] = f"none: {exc}"
    except OSError as exc:
        report["seccomp"] = f"none: {exc.strerror or errno.errorcode.get(exc.errno or 0, exc)}"
    return report
