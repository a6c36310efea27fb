"""The sandbox file system for the ``unshare`` fallback (stdlib only).

Under bubblewrap, bwrap builds the sandbox's view. Under ``unshare --user
--map-root-user --mount --pid --fork ...`` the agent starts as root of a fresh user
namespace and builds the same view itself, from the same plan
(``_bwrap.mount_plan``): a new tmpfs root holding read-only binds of the exposed
host directories, minimal /dev, a private /proc, masks, and size-limited tmpfs
for /tmp and the working directory, a read-only empty HOME. As root of the user
namespace that owns the sandbox's IPC namespace it bounds SysV IPC and makes the
new root's ``/proc/sys`` read-only (``harden``). It then moves that root onto ``/``, chroots
into it, makes it read-only, sets the hostname, enters a nested user namespace
where it is uid/gid 1000 (mapped to the outer root, i.e. to the unprivileged host
uid), sets NoNewPrivs and re-executes the agent, which drops every capability.

What this fallback does not do that bwrap does: block nested user namespaces and
give the sandbox a private ``/dev/pts``.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

from . import harden
from .files import write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
#: statvfs flag -> mount flag, for the flags the kernel locks on mounts inherited from the host
_LOCKED = (
    (2, MS_NOSUID),
    (4, MS_NODEV),
    (8, MS_NOEXEC),
    (1024, MS_NOATIME),
    (2048, MS_NODIRATIME),
    (4096, MS_RELATIME),
)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _b(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]


def remount_ro(path: str, recursive: bool) -> None:
    """Make a mount (and its submounts) read-only, keeping the flags the kernel locked.

    A submount that refuses is detached instead, so nothing stays writable.
    """
    for point in _mount_points_under(path) if recursive else [path]:
        try:
            have = os.statvfs(point).f_flag
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY
            for st, ms in _LOCKED:
                if have & st:
                    flags |= ms
            mount(None, point, None, flags)
        except OSError:
            if point == path:
                raise
            _libc.umount2(_b(point), MNT_DETACH)


def _tmpfs(path: str, size: int | None, mode: int) -> None:
    options = f"mode={mode:o}" + (f",size={size}" if size else "")
    os.makedirs(path, exist_ok=True)
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)


def _touch(path: str) -> None:
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _dev(path: str) -> None:
    _tmpfs(path, 1 << 20, 0o755)
    for name in DEVICES:
        _touch(f"{path}/{name}")
        mount(f"/dev/{name}", f"{path}/{name}", None, MS_BIND | MS_NOSUID)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{path}/{name}")
    os.symlink("/proc/self/fd/2", f"{path}/stderr")
    os.makedirs(f"{path}/shm", exist_ok=True)


def build_root(plan: list[list[Any]], hostname: str) -> None:
    """Build the sandbox's file system from ``plan`` and chroot into it (see the module docstring)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    _tmpfs("/tmp", 1 << 20, 0o755)
    root = "/tmp/root"
    _tmpfs(root, 8 << 20, 0o755)
    dev_path = None
    for step in plan:
        kind, path = step[0], step[-1] if step[0] in ("ro", "rw", "symlink") else step[1]
        dst = root + path
        if kind in ("ro", "rw"):
            src = step[1]
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)
            else:
                _touch(dst)
            mount(src, dst, None, MS_BIND | MS_REC)
            if kind == "ro":
                remount_ro(dst, recursive=True)
        elif kind == "symlink":
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(step[1], dst)
        elif kind == "dev":
            _dev(dst)
            dev_path = dst
        elif kind == "proc":
            os.makedirs(dst, exist_ok=True)
            mount("proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            # As root of the user namespace that owns the sandbox's IPC namespace: bound SysV IPC,
            # then make /proc/sys read-only (the sandbox user maps to this namespace's owner).
            harden.bound_sysv_ipc(proc=dst)
            harden.readonly_proc_sys(proc=dst)
        elif kind == "null":
            mount("/dev/null", dst, None, MS_BIND)
            remount_ro(dst, recursive=False)
        elif kind == "tmpfs":
            _, _, size, mode, read_only = step
            _tmpfs(dst, size, mode)
            if read_only:
                remount_ro(dst, recursive=False)
    if dev_path is not None:
        mount(None, dev_path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    name = hostname.encode()
    _libc.sethostname(name, len(name))
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def become(uid: int, gid: int) -> None:
    """Enter a nested user namespace as ``uid``/``gid`` (mapped to this namespace's root)."""
    if _libc.unshare(CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUSER): {os.strerror(err)}")
    for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{gid} 0 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(value)
    for cap in range(64):  # empty the bounding set too; the re-exec then clears the rest
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def enter_unshared_root(config: dict[str, Any], bundle: bytes | None) -> None:
    """``unshare`` mode: build the file system, become the sandbox user, re-execute (drops capabilities).

    The new interpreter runs the same bootstrap (from ``sys.orig_argv``) on the same
    package ``bundle`` and the configuration without its mount plan, read from a memfd.
    """
    argv0 = list(getattr(sys, "orig_argv", []))
    if bundle is None or "-c" not in argv0:
        raise RuntimeError("the unshare fallback needs the agent started by the bootstrap")
    bootstrap = argv0[argv0.index("-c") + 1]
    build_root(config["mounts"], str(config.get("sandbox_id") or "sandbox"))
    become(int(config["uid"]), int(config["gid"]))
    rest = json.dumps({k: v for k, v in config.items() if k != "mounts"}).encode()
    fd = os.memfd_create("cwsandbox-agent", 0)
    write_all(fd, len(bundle).to_bytes(4, "big") + len(rest).to_bytes(4, "big") + bundle + rest)
    os.lseek(fd, 0, os.SEEK_SET)
    os.chdir(str(config.get("cwd") or "/"))
    argv = [sys.executable, "-I", "-c", bootstrap, "cwsandbox-agent", str(config.get("sandbox_id")), str(fd)]
    os.execv(sys.executable, argv)
