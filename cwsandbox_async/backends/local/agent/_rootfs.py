"""Stage one of the local backend's template: namespaces and the read-only root view, once.

Runs as a script, ``python3 -I -S .../agent/_rootfs.py cwsandbox-template <control fd>``, before the
agent package is importable (stdlib only, no relative imports). The driver sends its configuration as
the first message on the control socket. Then:

1. **P, the outer process** (the driver's child) enters a new user namespace. As host root it maps a
   range of unprivileged host uids into it (``0 -> base``, ``count`` ids), written by a helper fork
   that stays in the host's namespace (only a process with ``CAP_SETUID`` there may map a range);
   otherwise it maps its own uid to 0 (one id: every sandbox then runs as the driver's uid). It becomes
   uid 0 of that namespace, enters a new mount and pid namespace, forks Z and waits for it. Z exits as
   soon as the driver's end of the control socket closes (the driver exited or was SIGKILLed: only the
   driver holds it), and every sandbox dies with Z (Z is PID 1 of the pid namespace that contains them
   all), so a SIGKILLed driver leaves no process behind; Z also dies with P (``PR_SET_PDEATHSIG``).
   P itself deliberately has no parent-death signal: the kernel sends it when the *thread* that forked
   P exits, and the driver starts templates from a worker thread that may come and go.
2. **Z, the template proper** builds the sandboxes' root file system once, from the driver's plan (see
   ``_bwrap.template_plan``): a tmpfs holding read-only binds of the exposed host directories, a
   minimal ``/dev``, ``/sys`` read-only, the masks, the agent package at ``AGENT_ROOT`` and a ``/proc``
   of Z's own pid namespace; it then ``pivot_root``s into it and detaches the host's mounts, so no
   sandbox's mount namespace ever contains a host mount other than the read-only binds. Per-sandbox
   mounts (``/proc``, ``/tmp``, the working directory, ``/dev/shm``, ``/dev/pts``) are left to each
   newborn (see ``_birth``). Z then imports the agent package from its bound, read-only path and
   serves births (``_birth.serve``).

The image cache's unpacked layers are in Z's root too (``layers`` in the plan, at
``_imageroot.LAYERS``): every image sandbox's lowers. A root driver's P, still host root, makes them an
idmapped, read-only tree first (``idmapped_layers``: the driver's files shown as the host uid image
sandboxes run as), since only host root may; a driver that is not root binds them as they are (its
files are its sandboxes' already).

Errors before Z serves are printed to stderr and end the process with status 71 (the driver reports
them as the backend being unavailable here).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
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
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: The new mount API's syscalls (the same numbers on x86_64 and aarch64).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
MOUNT_ATTR_NODEV = 4
MOUNT_ATTR_IDMAP = 0x00100000
#: Where the agent package is visible inside every sandbox (imported as ``cwsandbox_agent``).
AGENT_ROOT = "/run/cwsandbox"
AGENT_PACKAGE = "cwsandbox_agent"
#: Where Z builds the new root before moving into it (inside its private mount namespace).
STAGE = "/tmp"
EXIT_SETUP_FAILED = 71

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def check(rc: int, what: str) -> None:
    """Raise ``OSError`` (with errno) when a libc call returned non-zero."""
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    check(libc.unshare(flags), f"unshare({flags:#x})")


def prctl(option: int, value: int) -> None:
    check(libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def _b(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def tmpfs(path: str, size: int | None, mode: int, extra: str = "") -> None:
    """Mount a fresh tmpfs (nosuid, nodev) of ``size`` bytes (None: no limit) on an existing ``path``."""
    options = f"mode={mode:o}" + (f",size={size}" if size else "") + extra
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)


def write_text(path: str, text: str) -> None:
    """One ``write(2)`` (the kernel's id-map and sysctl files want the whole value at once)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def remount_ro(path: str, recursive: bool) -> None:
    """Make a mount (and, recursively, its submounts) read-only, keeping the flags the kernel locked.

    A submount that refuses is detached instead, so nothing stays writable.
    """
    points = [path]
    if recursive:
        with open("/proc/self/mountinfo") as f:
            found = [line.split()[4] for line in f]
        points = [p for p in found if p == path or p.startswith(path.rstrip("/") + "/")]
    for point in points:
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
            libc.umount2(point.encode(), MNT_DETACH)


def _touch(path: str) -> None:
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _dev(path: str) -> None:
    """A minimal ``/dev``: device nodes bound from the host, the usual symlinks, mount points for shm/pts."""
    os.makedirs(path, exist_ok=True)
    tmpfs(path, 1 << 16, 0o755)
    for name in DEVICES:
        _touch(f"{path}/{name}")
        mount(f"/dev/{name}", f"{path}/{name}", None, MS_BIND | MS_NOSUID)
    links = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"))
    for name, target in (*links, ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{path}/{name}")
    os.mkdir(f"{path}/shm")
    os.mkdir(f"{path}/pts")


def open_sources(plan: list[list[Any]]) -> dict[str, int]:
    """O_PATH fds of the plan's bind sources, opened before the stage hides anything (it is a tmpfs on
    ``STAGE``, and a source may live under it: a checkout or a virtualenv in /tmp) and before the
    template drops to its own uid. Missing ones are left out."""
    out: dict[str, int] = {}
    for step in plan:
        if step[0] in ("ro", "layers") and step[1] not in out:
            try:
                out[step[1]] = os.open(step[1], os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
    return out


def build_root(plan: list[list[Any]], root: str, sources: dict[str, int]) -> None:
    """Build the template's root file system under ``root`` from ``plan`` (see ``_bwrap.template_plan``).

    Steps: ``["ro", host path, path]`` (read-only recursive bind, from ``sources``, see ``open_sources``),
    ``["symlink", target, path]``, ``["dev", path]``, ``["proc", path]``, ``["tmpfs", path, size, mode,
    read_only]``, ``["null", path]`` (a file masked by /dev/null), ``["dir", path]`` (a mount point for
    a newborn's own mount) and ``["layers", host path, path]`` (the image cache's unpacked layers,
    read-only: the idmapped tree ``idmapped_layers`` made, else a bind from ``sources``).
    """
    dev_path = None
    for step in plan:
        kind = step[0]
        dst = root + (step[2] if kind in ("ro", "symlink", "layers") else step[1])
        if kind == "layers":
            _layers(step[1], dst, sources)
        elif kind == "ro":
            fd = sources.get(step[1])
            if fd is None:
                continue  # gone since the driver made the plan
            src = f"/proc/self/fd/{fd}"
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)
            else:
                _touch(dst)
            mount(src, dst, None, MS_BIND | MS_REC)
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
        elif kind == "null":
            mount("/dev/null", dst, None, MS_BIND)
            remount_ro(dst, recursive=False)
        elif kind == "tmpfs":
            _, _, size, mode, read_only = step
            os.makedirs(dst, exist_ok=True)
            tmpfs(dst, size, mode)
            if read_only:
                remount_ro(dst, recursive=False)
        elif kind == "dir":
            os.makedirs(dst, exist_ok=True)
        else:
            raise ValueError(f"unknown mount step {kind!r}")
    if dev_path is not None:
        remount_ro(dev_path, recursive=False)


def _layers(host: str, dst: str, sources: dict[str, int]) -> None:
    tree = sources.get(LAYERS_TREE)
    os.makedirs(dst, exist_ok=True)
    if tree is not None:
        check(libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, dst.encode(), MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
        return
    fd = sources.get(host)
    if fd is not None:
        mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
        remount_ro(dst, recursive=True)


#: ``open_sources``'s key of the idmapped layer tree (not a path: a path never starts with a space).
LAYERS_TREE = " layers"


def idmapped_layers(path: str, owner: int) -> int:
    """As host root: a detached, read-only, recursive clone of ``path`` whose files owned by uid/gid 0
    (the driver's: single-uid layers) appear owned by host uid/gid ``owner``, the uid image sandboxes
    run as (see ``_host_uids``). The idmap is a user namespace mapping ``0 owner 1``, made by a short-lived
    child (``unshare``), which P maps from the host's namespace. Returns the tree's fd (``OSError`` if
    this kernel or file system refuses idmapped mounts)."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(ready_r)
            unshare(CLONE_NEWUSER)
            os.write(ready_w, b"u")
            signal.pause()
        finally:
            os._exit(0)
    os.close(ready_w)
    userns = -1
    try:
        if os.read(ready_r, 1) != b"u":
            raise OSError(0, "the idmap's user namespace was not made")
        write_text(f"/proc/{child}/setgroups", "deny")
        map_ids(child, {"uid": [f"0 {owner} 1"], "gid": [f"0 {owner} 1"]})
        userns = os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    try:
        flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
        tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), flags)
        if tree < 0:
            check(-1, "open_tree")
        attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, userns)
        rc = libc.syscall(
            SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        if rc != 0:
            err = ctypes.get_errno()
            os.close(tree)
            raise OSError(err, f"mount_setattr(idmap): {os.strerror(err)}")
        return int(tree)
    finally:
        os.close(userns)


def pivot_into(root: str) -> None:
    """Make ``root`` the root directory and detach everything else (the host's mounts leave this namespace)."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: unsupported architecture {os.uname().machine}")
    os.chdir(root)
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def map_ids(pid: int, id_map: dict[str, list[str]]) -> None:
    """Write a user namespace's uid and gid maps, e.g. ``{"uid": ["0 2046820352 16777216"], "gid": [...]}``."""
    for kind in ("uid", "gid"):
        write_text(f"/proc/{pid}/{kind}_map", "".join(f"{line}\n" for line in id_map[kind]))


def enter_userns(config: dict[str, Any]) -> None:
    """Enter a new user namespace as its uid 0; mapped as ``config["id_map"]`` says (see the module docstring)."""
    lines = {kind: [str(line) for line in config["id_map"][kind]] for kind in ("uid", "gid")}
    if not config.get("map_range"):
        unshare(CLONE_NEWUSER)
        write_text("/proc/self/setgroups", "deny")
        map_ids(os.getpid(), lines)
        return
    me = os.getpid()
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:  # still in the host's user namespace, where mapping a range is allowed
        code = EXIT_SETUP_FAILED
        try:
            os.close(ready_w)
            if os.read(ready_r, 1) == b"u":
                map_ids(me, lines)
                code = 0
        finally:
            os._exit(code)
    os.close(ready_r)
    try:
        unshare(CLONE_NEWUSER)
    finally:
        os.write(ready_w, b"u")
        os.close(ready_w)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        raise OSError(0, "could not map the uid range into the template's user namespace")
    os.setgroups([])


def main(argv: list[str]) -> None:
    ctl = socket.socket(fileno=int(argv[-1]))
    config = json.loads(ctl.recv(1 << 20))
    tree = None
    layers = config.get("layers")
    if layers and layers.get("owner") is not None:  # still host root: idmapped mounts are ours to make
        try:
            tree = idmapped_layers(layers["path"], int(layers["owner"]))
        except OSError as exc:  # image sandboxes then see their files as nobody's (read-only)
            sys.stderr.write(f"cwsandbox template: no idmapped image layers: {exc}\n")
    try:
        enter_userns(config)
        unshare(CLONE_NEWNS)
        # Opened in the template's mount namespace (a bind source must be a mount of the caller's own)
        # but still with the driver's file system uid: the template's own uid (unprivileged when the
        # driver is root) may not reach a package or interpreter under, say, a 0700 home directory.
        sources = open_sources(config["plan"])
        if tree is not None:
            sources[LAYERS_TREE] = tree
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        unshare(CLONE_NEWPID)
        server = os.fork()
    except BaseException:
        _fatal()
    if server != 0:
        ctl.close()
        _, status = os.waitpid(server, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # getppid() is 0 here (P is outside our pid namespace)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        tmpfs(STAGE, 1 << 20, 0o755)
        root = STAGE + "/root"
        os.mkdir(root)
        tmpfs(root, int(config.get("root_bytes") or 8 << 20), 0o755)
        build_root(config["plan"], root, sources)
        pivot_into(root)
        for fd in sources.values():
            os.close(fd)
        sys.path[:0] = [AGENT_ROOT]
        import importlib

        births = importlib.import_module(AGENT_PACKAGE + "._birth")
    except BaseException:
        _fatal()
    births.serve(ctl, config)


def _fatal() -> None:
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(EXIT_SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv)
