"""The agent's template: a clean, preloaded interpreter that only ever births workers (stdlib only).

The agent forks the template right after its own start, before it reads its
first request, so nothing a request carried (argv, environment, stdin, file
contents, Python source) has ever been in the template's memory. The template
then receives only one kind of message on its socket: one byte and one file
descriptor (SCM_RIGHTS), meaning "birth a worker that talks on this socket". It
``clone(CLONE_PARENT)``s (``sysapi.clone_parent``) so the worker is the agent's
child, and goes back to waiting; it never reads anything else, and exits when
the socket closes (its parent died or retired it).

Workers are therefore forks of a request-free interpreter too, and a worker that
runs Python forks the program from itself without reading the request
(``worker``, ``child``). Commands run as the same user as the template and can
signal it: a stopped template is continued by the agent, a killed one replaced by
a fresh interpreter (``spawn_fresh``: the agent's own memory is not clean, so it
never forks a template again).
"""

from __future__ import annotations

import os
import signal
import socket
import struct

from . import sysapi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

#: The descriptor a freshly executed template finds its socket on.
FRESH_FD = 3


def serve(sock: socket.socket, birth: Callable[[socket.socket], NoReturn], joins: list[int] | None = None) -> NoReturn:
    """The template's loop; ``birth`` runs in each new worker with its socket.

    ``joins``: ``cgroup.procs`` fds of the commands' cgroup(s); the template moves itself
    there first, so every worker (and command) it births starts inside.
    """
    try:
        for fd in joins or ():
            os.write(fd, b"0")
            os.close(fd)
        _setup(sock, ())
        while True:
            data, anc, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
            if not data:
                break
            fds: list[int] = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
            if not fds:
                continue
            for extra in fds[1:]:
                os.close(extra)
            try:
                pid = sysapi.clone_parent()
            except OSError:  # at the pids limit: the agent sees the socket close without a hello
                os.close(fds[0])
                continue
            if pid == 0:
                sock.close()
                birth(socket.socket(fileno=fds[0]))
            os.close(fds[0])
    except (OSError, KeyboardInterrupt):
        pass
    os._exit(0)


def _setup(sock: socket.socket, keep: tuple[int, ...]) -> None:
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
    sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # never the agent's channel (and never free, so no received fd lands on 0 or 1)
    os.dup2(null, 1)
    mine = {sock.fileno(), 0, 1, 2, *keep}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in mine:
            try:
                os.close(fd)
            except OSError:
                pass
    sock.setblocking(True)


def spawn_fresh(executable: str, bootstrap: str, payload: bytes, sock_fd: int, joins: list[int]) -> int:
    """Start a new template interpreter (``python3 -I -c BOOTSTRAP``) on ``sock_fd``; its pid.

    ``payload`` is what BOOTSTRAP reads (the agent package, if it is not on disk,
    and a configuration with ``role: template``), passed in a memfd at
    ``FRESH_FD + 1``; the ``joins`` fds follow it. Raises ``OSError`` if it cannot
    be started.
    """
    boot = os.memfd_create("cwsandbox-template", 0)
    try:
        from .files import write_all

        write_all(boot, payload)
        os.lseek(boot, 0, os.SEEK_SET)
        argv = [executable, "-I", "-c", bootstrap, "cwsandbox-template", "-", str(FRESH_FD + 1)]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, sock_fd, FRESH_FD),
            (os.POSIX_SPAWN_DUP2, boot, FRESH_FD + 1),
            *((os.POSIX_SPAWN_DUP2, fd, FRESH_FD + 2 + i) for i, fd in enumerate(joins)),
        ]
        return os.posix_spawn(executable, argv, {"LANG": "C.UTF-8"}, file_actions=actions)
    finally:
        os.close(boot)
