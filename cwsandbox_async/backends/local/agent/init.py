"""PID 1 of a sandbox: the one process a sandbox holds at rest (stdlib only).

PID 1 reads nothing but fixed-size orders and the file descriptors that come with them (see
``protocol``): it never reads a request's bytes, so its memory holds none, and every fork of it
starts clean -- ``run_python`` programs run in such forks, with no separate template. Per order it
forks once (``execs``, ``child``); the driver reads the exec's output straight from the pipes it
created, so no output passes through PID 1 either.

It waits in ``poll`` on its channel and on a wake-up pipe written by its ``SIGCHLD`` handler; its
timers are the execs' deadlines, their next samples, and the sandbox's max lifetime. As PID 1 of the
sandbox's pid namespace it is the reaper of everything in it, and no process inside can stop or kill
it (the kernel drops signals from inside that PID 1 has no handler for; it handles only
``SIGCHLD``), read its memory or trace it (it is not dumpable; seccomp denies ``ptrace``). With
``O_LISTEN`` (see ``protocol``) it also serves channels attached later, each with its own request
ids. It exits when its last channel closes (then the kernel kills everything else in the sandbox),
or at the max lifetime. Outside a namespace (``isolation="none"``) it is a child subreaper of its
own, and kills every descendant before it exits.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

from . import oom, proctree, protocol, sysapi
from .execs import Exec, Execs
from .protocol import MAX_ORDER_FDS, O_KILL, O_LISTEN, O_RUN, ORDER, R_HELLO

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, NoReturn

    from .settings import Settings

_ANCILLARY = socket.CMSG_SPACE(MAX_ORDER_FDS * 4)
#: ``struct ucred``: the peer's pid, uid, gid (as this pid and user namespace see them).
_PEERCRED = struct.Struct("=iII")


class Init:
    """PID 1's loop (see the module docstring). ``info``: hardening report, cpus, cgroup fds."""

    def __init__(self, config: dict[str, Any], settings: Settings, fd: int, info: dict[str, Any]) -> None:
        first = socket.socket(fileno=fd)
        first.setblocking(True)
        #: Its channels by number: 0 is the one it was born with, the others attached (``O_LISTEN``).
        self.channels: dict[int, socket.socket] = {0: first}
        self.by_fd: dict[int, int] = {first.fileno(): 0}
        self.next_channel = 1
        self.listener: socket.socket | None = None
        self.poller = select.poll()
        self.hello = b""
        self.config, self.info = config, info
        ttl = config.get("ttl")
        self.ttl_deadline = time.monotonic() + float(ttl) if ttl else None
        cgroup = info.get("cgroup") or {}
        events, usage = cgroup.get("cmd_events"), cgroup.get("sandbox_cpu")
        self.execs = Execs(
            config,
            settings,
            float(info.get("cpus") or 1.0),
            [int(fd) for fd in cgroup.get("cmd_procs") or ()],
            oom.Counter(config.get("oom_files"), None if events is None else int(events)),
            proctree.SandboxCpu(None if usage is None else int(usage)),
            self.report,
        )
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def setup(self) -> None:
        # Every signal at its default but SIGCHLD: the kernel drops a signal from inside the namespace
        # that PID 1 does not handle (so Python's SIGINT handler goes: it would let ``kill -INT 1``
        # in), and an ignored one would stay ignored across a command's execve (so Python's SIG_IGN
        # for SIGPIPE and SIGXFSZ goes; the channel never raises SIGPIPE: MSG_NOSIGNAL).
        for sig in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, _noop)  # SIGCHLD (also for a stop) only writes the wake-up pipe
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        # The highest OOM score, inherited by every fork: a host out of memory kills sandboxes first.
        # (PID 1 is outside the commands' memory cgroup, so their own limit never picks it.) Written
        # while PID 1 is still dumpable: after that its /proc/self is not its own to write, nor is
        # a fork's before it execs.
        _raise_oom_score()
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)  # inherited by forks until they exec or run Python
        if os.getpid() != 1:
            sysapi.prctl(sysapi.PR_SET_CHILD_SUBREAPER, 1)
        if self.config.get("die_with_parent"):
            sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:  # queued orders hold their fds here
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass
        hello = {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "hardening": self.info.get("hardening") or {},
            "cpus": self.execs.cpus,
            "spawner": bool(self.execs.spawner),  # commands start through the native spawner
        }
        stamps = self.config.get("stamps")
        if isinstance(stamps, dict):  # a born sandbox: when each step of its birth ended (monotonic)
            hello["stamps"] = {**stamps, "hello": time.monotonic()}
        self.hello = bytes([R_HELLO]) + json.dumps(hello, separators=(",", ":")).encode()
        self.report(0, self.hello)

    def report(self, rid: int, data: bytes) -> None:
        """One message to the channel whose number is ``rid``'s bits above 32 (a full channel waits for
        its driver). A channel that is gone drops it; one that fails is closed (``drop``)."""
        number = rid >> 32
        sock = self.channels.get(number)
        if sock is None:
            return
        try:
            sock.send(data, socket.MSG_NOSIGNAL)
        except OSError:  # that driver is gone
            self.drop(number)

    def drop(self, number: int) -> None:
        """A channel closed: kill the execs it ordered; with no channel left, exit (``shutdown``)."""
        sock = self.channels.pop(number, None)
        if sock is None:
            return
        self.by_fd.pop(sock.fileno(), None)
        self.poller.unregister(sock)
        sock.close()
        for rid in [r for r in self.execs.execs if r >> 32 == number]:
            self.execs.kill(rid)
        if not self.channels:
            self.shutdown()

    def serve(self) -> NoReturn:
        self.setup()
        poller = self.poller
        for sock in self.channels.values():
            poller.register(sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            wake = self.execs.next_deadline()
            if self.ttl_deadline is not None:
                wake = self.ttl_deadline if wake is None else min(wake, self.ttl_deadline)
            wait_ms = None if wake is None else max(0, int((wake - time.monotonic()) * 1000) + 1)
            for fd, _ in poller.poll(wait_ms):
                number = self.by_fd.get(fd)
                if number is not None:
                    if not self.on_orders(number):
                        self.drop(number)
                elif self.listener is not None and fd == self.listener.fileno():
                    self.accept()
                elif fd == self.wake_r:
                    _drain(self.wake_r)
                    self.execs.reap()
            now = time.monotonic()
            if self.ttl_deadline is not None and now >= self.ttl_deadline:
                sys.stderr.write("cwsandbox agent: the sandbox reached its max lifetime\n")
                self.shutdown()
            self.execs.tick(now)

    def listen(self, fds: list[int]) -> None:
        """``O_LISTEN``: accept channels on the one socket it carries (once; see ``protocol``)."""
        if self.listener is not None or len(fds) != 1:
            _close(fds)
            return
        try:
            listener = socket.socket(fileno=fds[0])
        except OSError:
            _close(fds)
            return
        listener.setblocking(False)
        self.listener = listener
        self.poller.register(listener, select.POLLIN)

    def accept(self) -> None:
        """A new channel (an attach): refused when its peer is a process of this pid namespace."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:  # gone before it was accepted, or out of descriptors: that attach fails
            return
        if os.getpid() == 1:
            peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            if _PEERCRED.unpack(peer)[0] != 0:  # the peer's pid is visible here: it is inside the sandbox
                conn.close()
                return
        conn.setblocking(True)
        number, self.next_channel = self.next_channel, self.next_channel + 1
        self.channels[number] = conn
        self.by_fd[conn.fileno()] = number
        self.poller.register(conn, select.POLLIN)
        self.report(number << 32, self.hello)

    def on_orders(self, number: int) -> bool:
        """Read every waiting order of channel ``number``; False when its driver closed it."""
        sock = self.channels[number]
        while True:
            try:
                data, ancillary, mflags, _ = sock.recvmsg(
                    ORDER.size, _ANCILLARY, socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                return True
            except OSError:
                return False
            fds = protocol.received_fds(ancillary)
            if not data:
                _close(fds)
                return False
            if len(data) != ORDER.size or mflags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                _close(fds)  # not an order of ours: nothing to answer
                continue
            kind, mode, flags, rid, timeout, budget = ORDER.unpack(data)
            if kind == O_RUN:
                self.execs.submit(Exec((number << 32) | rid, mode, flags, timeout, budget, fds))
                continue
            if kind == O_LISTEN and number == 0:
                self.listen(fds)
                continue
            _close(fds)
            if kind == O_KILL:
                self.execs.kill((number << 32) | rid)

    def shutdown(self) -> NoReturn:
        """Exit: as PID 1 the kernel then kills the rest; otherwise kill every descendant first."""
        if os.getpid() != 1:
            self.execs.kill_all()
            try:
                for pid in proctree.descendants(os.getpid()):
                    proctree.kill_quietly(pid, signal.SIGKILL)
            except proctree.Unreadable:  # nothing more it can find (an agent on the host)
                pass
        os._exit(0)


def _noop(signum: int, frame: FrameType | None) -> None:
    pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _raise_oom_score() -> None:
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except OSError:  # a /proc without it: the kernel's own choice stands
        pass
