"""The few system calls the agent needs that ``os`` lacks on Python 3.11, through ctypes (stdlib only).

Every wrapper returns normally or raises ``OSError`` with the kernel's errno,
except ``prctl``, which reports failure as ``False`` (its callers treat each
``prctl`` as best effort and say so). When ctypes itself is missing from the
sandbox's Python, ``AVAILABLE`` is False and every call fails with ``ENOSYS``.
"""

from __future__ import annotations

import errno
import os
import platform

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAPBSET_DROP = 24

#: Native syscall numbers of the calls made here, per machine (``platform.machine()``).
_NR = {
    "x86_64": {"keyctl": 250, "seccomp": 317},
    "aarch64": {"keyctl": 219, "seccomp": 277},
}
MACHINE = platform.machine()
NR = _NR.get(MACHINE, {})

_libc: Any = None
try:
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    # A prctl with fixed argument types: each call builds no ctypes objects (it runs in every
    # exec's child, between fork and execve, where every page touched is a copy).
    _prctl = _libc["prctl"]
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
except (ImportError, OSError, AttributeError):  # no ctypes (or no libc symbols) in this Python
    _libc = None
AVAILABLE = _libc is not None


def _raise(what: str) -> None:
    err = ctypes.get_errno() if AVAILABLE else errno.ENOSYS
    raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> bool:
    """prctl(2); False when it failed or ctypes is unavailable."""
    if not AVAILABLE:
        return False
    return bool(_prctl(option, a, b, c, d) == 0)


def syscall(name: str, *args: Any) -> int:
    """A raw system call by name (``NR``); ``OSError`` on failure, ``ENOSYS`` on an unknown machine."""
    nr = NR.get(name)
    if not AVAILABLE or nr is None:
        raise OSError(errno.ENOSYS, f"{name}: not available on {MACHINE}")
    rc = int(_libc.syscall(ctypes.c_long(nr), *args))
    if rc < 0:
        _raise(name)
    return rc


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); ``OSError`` naming the target on failure."""
    if not AVAILABLE:
        raise OSError(errno.ENOSYS, "mount: no ctypes")

    def b(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    if _libc.mount(b(source), b(target), b(fstype), ctypes.c_ulong(flags), b(data)) != 0:
        _raise(f"mount {target}")


def libc() -> Any:
    """The libc handle (``None`` without ctypes), for the rare call not wrapped here."""
    return _libc
