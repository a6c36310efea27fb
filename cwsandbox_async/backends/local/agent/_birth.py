"""The template's serving stage, which births every local sandbox, and the birth of one sandbox (stdlib only).

Z, the template, runs inside the root view ``_rootfs`` built (PID 1 of its own pid namespace, uid 0
of a user namespace that maps only unprivileged host ids). It imports the agent before anything
else happens, freezes its heap (``gc.freeze``: the collector then never writes to the pages every
sandbox shares) and then does one thing: for each ``F`` message on the control socket it forks,
handing the child the two file descriptors that came with the message (the sandbox's channel socket
and its stderr pipe). **The template never reads a channel**: nothing a request carried, not even a
sandbox's configuration, ever exists in its memory. It reaps its children and exits when the driver
closes the control socket.

The template makes each newborn PID 1 of a pid namespace of its own with its one fork: it
``unshare``s a new pid namespace for its next child, forks, and returns to its own with ``setns``.
That pid namespace is owned by the template's user namespace, so it is the newborn, N, while still
uid 0 there, that mounts the sandbox's ``/proc`` (in a mount namespace of its own) before it enters
the sandbox's user namespace: from then on that ``/proc`` is a locked mount nothing inside can
remove, and no process inside may mount another (the kernel asks for ``CAP_SYS_ADMIN`` over the
pid namespace's owner).

N reads the birth configuration from its channel (one message the driver sent with the fork
request), creates the mount points it needs, enters a new IPC and mount namespace (an image sandbox:
builds its root there, an overlay of the image's layers, and pivots into it, ``_imageroot``; any other
hides the template's layer cache), mounts its ``/proc``, becomes the sandbox's own uid of the
template's namespace (a distinct host uid per sandbox when the driver is root; one for every image
sandbox, ``_host_uids``), enters new user, mount, uts and (unless ``network``) net namespaces and
maps the sandbox's uid/gid inside to itself -- while the driver creates the sandbox's cgroups. Then
it reads the second message (the cgroups' file descriptors as SCM_RIGHTS, and the agent's
configuration), joins the cgroups and enters a cgroup namespace rooted there. N is PID 1 of the
sandbox: when it exits the kernel kills everything else in the sandbox. It sends the driver a pidfd
of itself (the "born" record), mounts the sandbox's ``/tmp``, working directory, ``/dev/shm`` and
``/dev/pts``, sets the hostname, brings up loopback, makes the root read-only, forbids further user
namespaces, bounds the kernel budgets the host charges per user (``harden.bound_user_limits``; pending
signals, ``SIGPENDING``; files, ``MIN_FILES``; ptys, ``PTYS``), drops every capability (``NoNewPrivs``)
and becomes the agent, in process.

Any failure in N is printed to the sandbox's stderr pipe and ends it (status 71); the driver
reports it as a creation error with that text.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import gc
import importlib
import json
import os
import resource
import signal
import socket
import struct
import sys
import time

from . import _imageroot, _rootfs, harden, protocol
from .protocol import MAX_BIRTH_CONFIG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, NoReturn

#: The ``F`` message: fork a sandbox; its SCM_RIGHTS carry (channel socket, stderr pipe).
FORK = b"F"
#: What N sends first on its channel: ``B`` with a pidfd of itself as SCM_RIGHTS.
BORN = b"B"
MAX_BIRTH_FDS = 16
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 1
_IFREQ = struct.Struct("16sH14x")

#: Pending signals (``RLIMIT_SIGPENDING``, hard) of every process of a sandbox. The kernel charges a
#: queued signal (``sigqueue``, a real-time signal) and every POSIX timer (``timer_create`` preallocates
#: its signal) to the sender's user at every level of nested user namespaces, up to the driver's uid on
#: the host, and compares the count at the lowest level with the process's own limit: without a bound of
#: its own one sandbox took all of the driver user's (96,555 on a 24 GiB host: the kernel's default scales
#: with memory), and the trainer's next ``timer_create`` or ``sigqueue`` failed with EAGAIN. An honest
#: program uses a handful (a timer per watchdog, a few queued signals); at 64, 1,000 sandboxes that each
#: hold all of theirs take 64,000. Set after the sandbox's user namespace exists: set before, it would also
#: cap what all sandboxes of a non-root driver (one uid of the template's namespace) hold together, and one
#: sandbox would deny its neighbours.
SIGPENDING = 64
#: The least ``RLIMIT_NOFILE`` a sandbox gets; otherwise half the driver's soft limit (hard: see
#: ``bound_budgets``). The kernel counts the file descriptors in flight in Unix sockets' queues
#: (``SCM_RIGHTS``) per host uid and refuses a send while that count is over the *sender's* file limit;
#: every sandbox of a non-root driver is the driver's uid, so with the driver's own limit one sandbox held
#: 20,240 in flight (in a few hundred KiB) and every send of every other sandbox, and of the driver's uid
#: without ``CAP_SYS_RESOURCE`` (a non-root driver hands each exec's pipes to the sandbox's PID 1 that way;
#: a newborn sends the driver its pidfd), failed with ETOOMANYREFS. Half leaves the driver the other half
#: (a sandbox stops at most one message, 253 descriptors, past its own limit).
MIN_FILES = 256
#: ``fs.mqueue.msgsize_default`` of the sandbox's IPC namespace: the size of a message of a POSIX message
#: queue opened without attributes (the kernel's 8 KiB made that queue, 10 messages, take 81 KiB, more than
#: the 64 KiB ``harden.USER_RLIMITS`` gives the sandbox: every such ``mq_open`` failed with EMFILE). With
#: 4 KiB it takes 41 KiB: one fits.
MQ_MSGSIZE_DEFAULT = 4096
#: Ptys of the sandbox's own ``/dev/pts`` (devpts ``max``). Every devpts instance but the host's first
#: draws from one host-wide pool (``kernel.pty.max`` minus ``kernel.pty.reserve``: 3,072 by default),
#: so without a bound of its own one sandbox could open them all and leave every neighbour (and every
#: container on the host) ENOSPC. A program that drives a terminal uses one or two.
PTYS = 4
#: Options of the sandbox's ``/dev/pts``: its own instance, ``/dev/ptmx`` usable by the sandbox's user.
DEVPTS_OPTIONS = f"newinstance,ptmxmode=0666,mode=620,max={PTYS}"

#: The agent as the template preloaded it (see ``_preload``).
_agent: dict[str, Any] = {}


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


# -- the template ----------------------------------------------------------------------------------
def serve(ctl: socket.socket, config: dict[str, Any]) -> NoReturn:
    """Z's loop: fork a newborn per ``F`` message; exit when the driver closes the control socket."""
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _preload(config)
    trouble = _check_spawner(config.get("spawner"))
    _imageroot.skeleton(_agent.get("spawner"))  # the mount points of every image root
    signal.signal(signal.SIGCHLD, _reap)
    gc.collect()
    gc.freeze()
    ctl.sendall(b"R" + (b"!" + trouble.encode("utf-8", "replace")[:512] if trouble else b""))
    space = socket.CMSG_SPACE(2 * 4)
    while True:
        msg, ancillary, _, _ = ctl.recvmsg(16, space, socket.MSG_CMSG_CLOEXEC)
        fds = protocol.received_fds(ancillary)
        if not msg:
            os._exit(0)
        if msg != FORK or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        pid = _fork_pid1(own_pid_ns, fds[1])  # -1 at a limit: closing the fds below tells the driver (EOF)
        if pid == 0:
            ctl.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _born(fds[0], fds[1])
        for fd in fds:
            os.close(fd)


def _fork_pid1(own_pid_ns: int, err_fd: int) -> int:
    """Fork a child that is PID 1 of a new pid namespace; its pid, 0 in it, -1 when refused (a limit,
    said on ``err_fd``, the newborn's stderr pipe, for the driver's error).

    ``unshare(CLONE_NEWPID)`` moves only the caller's *next* child into the new namespace, and may not
    be repeated until the caller is back in its own (``setns``). A template that cannot return exits:
    its next children would be born into a dead namespace, and the driver starts a new template."""
    try:
        _rootfs.unshare(_rootfs.CLONE_NEWPID)
    except OSError as exc:
        _say(err_fd, f"the template could not make a pid namespace: {exc.strerror or exc}")
        return -1
    try:
        pid = os.fork()
    except OSError as exc:
        _say(err_fd, f"the template could not fork: {exc.strerror or exc}")
        pid = -1
    if pid != 0 and _rootfs.libc.setns(own_pid_ns, _rootfs.CLONE_NEWPID) != 0:
        os._exit(_rootfs.EXIT_SETUP_FAILED)
    return pid


def _say(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode() + b"\n")
    except OSError:
        pass


def _preload(config: dict[str, Any]) -> None:
    for name in config.get("preload") or ():
        try:
            importlib.import_module(name)
        except ImportError:  # a module missing from this image is simply not preloaded
            continue
    # The whole agent package, imported once here (every newborn shares these pages and imports
    # nothing from disk on its way to serving): each module next to this one.
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name != "__init__.py":
            importlib.import_module(f"{__package__}.{name[:-3]}")
    from . import main

    _agent.update(main=main)


def _check_spawner(path: str | None) -> str | None:
    """Run the native spawner once (``--check``); what went wrong, or None. Every newborn's PID 1 is
    told to use it only if it ran here (else each exec forks PID 1, see ``execs``)."""
    if not path:
        return None
    try:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            acts = [(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
            pid = os.posix_spawn(path, [path, "--check"], {}, file_actions=acts)
        finally:
            os.close(null)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return f"{path} --check exited with {os.waitstatus_to_exitcode(status)}"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    _agent["spawner"] = path
    return None


def _reap(signum: int, frame: FrameType | None) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# -- one birth ---------------------------------------------------------------------------------------
def _born(chan_fd: int, err_fd: int) -> NoReturn:
    """N, the newborn (see the module docstring), PID 1 of its pid namespace. Never returns."""
    stamps = {"c_forked": time.monotonic()}
    try:
        os.dup2(err_fd, 2)
        os.close(err_fd)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        chan = socket.socket(fileno=chan_fd)
        birth, _ = _receive(chan)  # sent with the fork request: no wait for the driver's cgroups
        stamps["c_configured"] = time.monotonic()
        _enter(birth)
        stamps["c_entered"] = time.monotonic()
        config, fds = _receive(chan)  # the cgroups' fds and the agent's configuration
        config["birth"] = birth
        _join(config, fds)
        stamps["c_joined"] = time.monotonic()
        pidfd = os.pidfd_open(os.getpid())
        chan.sendmsg([BORN], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]).tobytes())])
        os.close(pidfd)
        _settle(config["birth"])
        stamps["g_mounted"] = time.monotonic()
        config["cgroup"] = _named_fds(config.get("fds") or {}, fds)
        drop_privileges()
        config["agent"]["stamps"] = stamps  # how long each step took (``hello["stamps"]``)
        config["agent"]["spawner"] = _agent.get("spawner")  # None: every exec forks PID 1
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(_rootfs.EXIT_SETUP_FAILED)
    _start_agent(chan, config)


def _receive(chan: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The birth configuration: one message (JSON) on the channel, with the cgroup fds."""
    data, ancillary, flags, _ = chan.recvmsg(
        MAX_BIRTH_CONFIG, socket.CMSG_SPACE(MAX_BIRTH_FDS * 4), socket.MSG_CMSG_CLOEXEC
    )
    fds = protocol.received_fds(ancillary)
    if not data:
        raise EOFError("the driver closed the channel before the birth configuration arrived")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise ValueError("birth configuration too large")
    return json.loads(data), fds


def _named_fds(names: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """The birth config's fd indexes (``{"cmd_procs": [3], "cmd_events": 4}``) as this process's fds."""
    out: dict[str, Any] = {}
    for name, index in names.items():
        out[name] = [fds[i] for i in index] if isinstance(index, list) else (None if index is None else fds[index])
    return out


def _enter(birth: dict[str, Any]) -> None:
    """N, before the driver's cgroups exist: mount points, ``/proc``, the sandbox's uid, new namespaces, id maps."""
    for path in birth.get("mkdirs") or ():
        os.makedirs(path, exist_ok=True)
    # The IPC namespace first, while N is still uid 0 of the template's namespace: that namespace then
    # owns it, so N may bound its SysV IPC (``harden.bound_sysv_ipc``) and the sandbox user, whose
    # namespace is a child of it, may not change the bounds (the kernel checks the euid against the
    # owning namespace's uid 0).
    _rootfs.unshare(_rootfs.CLONE_NEWIPC)
    # The sandbox's /proc, also while uid 0 there: the template's user namespace owns N's pid namespace
    # (see the module docstring), so only now may N mount it. In a mount namespace of its own, which the
    # sandbox's (made with its user namespace below) copies, with this mount locked in it.
    _rootfs.unshare(_rootfs.CLONE_NEWNS)
    image = birth.get("image")
    if image is not None:  # its root: an overlay of the image's layers (``_imageroot``), pivoted into
        _imageroot.build(image, int(birth["uid"]), _agent.get("spawner"))
    else:
        _imageroot.hide_layers()
    for step in birth["mounts"]:
        if step[0] == "proc" and image is None:  # an image root has its own (``_imageroot``)
            _rootfs.mount("proc", step[1], "proc", _rootfs.MS_NOSUID | _rootfs.MS_NODEV | _rootfs.MS_NOEXEC)
    # Through that /proc, not the template's: the kernel keeps a cached entry per IPC namespace for each
    # sysctl looked up through one proc instance and compares a lookup with every one of them, so on the
    # template's /proc this took 0.5 ms with 100 sandboxes alive and 2.6 ms with 500 (RESULTS §1d).
    harden.bound_sysv_ipc()
    _rootfs.write_text("/proc/sys/fs/mqueue/msgsize_default", str(MQ_MSGSIZE_DEFAULT))
    uid, gid = int(birth["uid"]), int(birth["gid"])
    if birth.get("setgroups"):
        os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _rootfs.prctl(_rootfs.PR_SET_DUMPABLE, 1)  # a credential change made /proc/self root's; the maps need it ours
    flags = _rootfs.CLONE_NEWUSER | _rootfs.CLONE_NEWNS | _rootfs.CLONE_NEWUTS
    if not birth.get("network"):
        flags |= _rootfs.CLONE_NEWNET
    _rootfs.unshare(flags)
    _rootfs.write_text("/proc/self/setgroups", "deny")
    _rootfs.write_text("/proc/self/uid_map", f"{int(birth['inside_uid'])} {uid} 1\n")
    _rootfs.write_text("/proc/self/gid_map", f"{int(birth['inside_gid'])} {gid} 1\n")


def _join(config: dict[str, Any], fds: list[int]) -> None:
    """N: join the sandbox's top cgroups (fds the driver opened), enter a cgroup namespace rooted
    there, then join the agent's groups below them (``join_inside``: v1's ``S/agent`` of cpu).

    Before N starts anything, so everything it starts is born inside; rooted at the sandbox's top
    groups, so inside the sandbox the agent's and the commands' groups are ``/`` or under it."""
    for index in config.get("join") or ():
        os.write(fds[index], b"0")  # "0" is this process
        os.close(fds[index])
    _rootfs.unshare(_rootfs.CLONE_NEWCGROUP)
    for index in config.get("join_inside") or ():
        os.write(fds[index], b"0")
        os.close(fds[index])


def _settle(birth: dict[str, Any]) -> None:
    """N, as the sandbox's root: its other mounts, hostname, loopback, read-only root, no nested user namespaces."""
    for step in birth["mounts"]:
        kind, path = step[0], step[1]
        if kind == "proc":
            continue  # mounted by ``_enter``
        if kind == "tmpfs":
            _rootfs.tmpfs(path, step[2], step[3])
        elif kind == "devpts":
            flags = _rootfs.MS_NOSUID | _rootfs.MS_NOEXEC
            _rootfs.mount("devpts", path, "devpts", flags, DEVPTS_OPTIONS)
        else:
            raise ValueError(f"unknown sandbox mount {kind!r}")
    name = str(birth["hostname"]).encode()
    _rootfs.check(_rootfs.libc.sethostname(name, len(name)), "sethostname")
    if not birth.get("network"):
        _loopback_up()
    if birth.get("image") is None:  # an image's root is the sandbox's to write (its upper)
        _rootfs.remount_ro("/", recursive=False)
    _rootfs.write_text("/proc/sys/user/max_user_namespaces", "0")
    harden.bound_user_limits()  # per-user kernel limits of its own, so it cannot exhaust the driver's
    bound_budgets()
    harden.readonly_proc_sys()  # last: no sysctl of the sandbox's namespaces can change from now on


def files_bound(soft: int) -> int:
    """The sandbox's ``RLIMIT_NOFILE`` for a driver whose soft limit is ``soft`` (see ``MIN_FILES``)."""
    return max(soft // 2, MIN_FILES)


def bound_budgets() -> None:
    """Lower this process's ``RLIMIT_SIGPENDING`` to ``SIGPENDING`` and its ``RLIMIT_NOFILE`` to
    ``files_bound`` of the soft limit it inherited (soft and hard, never raising either). Every process
    of the sandbox inherits them and none can raise them (that takes ``CAP_SYS_RESOURCE`` on the host).
    PID 1 is bound too: the one signal it relies on, ``SIGCHLD``, is the kernel's own and never refused
    for a limit, and it raises its own soft file limit to this hard one."""
    _lower(resource.RLIMIT_SIGPENDING, SIGPENDING)
    _lower(resource.RLIMIT_NOFILE, files_bound(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def _lower(key: int, bound: int) -> None:
    soft, hard = resource.getrlimit(key)
    top = bound if hard == resource.RLIM_INFINITY else min(bound, hard)
    resource.setrlimit(key, (top if soft == resource.RLIM_INFINITY else min(top, soft), top))


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = _IFREQ.unpack(fcntl.ioctl(s, SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | IFF_UP))


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


#: The highest capability this kernel knows (read once, by the template).
LAST_CAP = _last_cap()


def drop_privileges() -> None:
    """Empty every capability set (bounding and ambient too) and set ``PR_SET_NO_NEW_PRIVS``."""
    libc = _rootfs.libc
    for cap in range(LAST_CAP + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _rootfs.check(libc.capset(ctypes.byref(header), data), "capset")
    _rootfs.prctl(PR_SET_NO_NEW_PRIVS, 1)


def _start_agent(chan: socket.socket, config: dict[str, Any]) -> NoReturn:
    """Become PID 1 of the sandbox, in process (the template preloaded it): ``main.run`` on the channel.

    Its own first steps are the unprivileged hardening (a fresh session keyring, then the seccomp
    filter), before it reads any order; each exec's child joins the commands' cgroup through
    ``config["cgroup"]["cmd_procs"]`` (see ``agent.main``)."""
    try:
        fd = chan.detach()
        _agent["main"].run(config["agent"], fd, cgroup=config["cgroup"])
    except BaseException:
        import traceback

        traceback.print_exc()
    sys.stderr.flush()
    os._exit(70)
