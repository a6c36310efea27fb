"""Wiring a sandbox's first process to the driver's event loop: its channel, stderr pipe and pidfd.

``Link.open`` hands the channel socket to an ``AgentChannel`` (``loop.add_reader``), reads the
stderr pipe into the channel's error tail, and watches the pidfd of the sandbox's first process:
when it becomes readable the sandbox is gone (for a template-born sandbox the kernel killed
everything in its pid namespace first), and the channel fails its pending calls. No task, no
thread: loop callbacks only (``anyio.wait_readable`` would need a task per live sandbox, for its
whole life, in a task group the backend does not have: its calls are bounded by its callers', and it
holds no block across them; on asyncio anyio waits through ``add_reader`` anyway). A first process
that is the driver's own child (``isolation="none"``) is reaped then. ``Link.close`` releases all
three (idempotent). Signals go through the pidfd, so a recycled pid is never signalled.

How the first process ended is the evidence that says whose failure a dead sandbox is
(``AgentChannel.dead_error``): its wait status, from ``waitid`` for a child of ours, else from the
pidfd once the template reaped it (``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``, Linux 6.15+). The
template reaps it a moment after the pidfd turns readable, and that moment is looked for until it
comes, however late a busy or stalled machine makes it: a verdict never depends on how soon the
template ran. ``LocalOptions.exit_status_wait_seconds`` only ends the wait for a reaper that never
reaps (a template stopped from outside), which is said at WARNING. Nothing inside
a sandbox can send its PID 1 a signal, so a death by a signal came from outside (the host's OOM
killer, an operator, the template's end); an exit with a status is PID 1 giving up on what its
programs did.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass

import anyio

from ..._log import log
from ._channel import AgentChannel
from ._threads import Blocking

__all__ = ["Link", "ProcessHandles", "pidfd_exit_status"]

#: ``ioctl(pidfd, PIDFD_GET_INFO, struct pidfd_info)``: ``_IOWR(0xFF, 11, 64 bytes)``.
PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT = 0x8
_INFO = struct.Struct("=QQ11Ii")  # mask, cgroupid, pid ... fsgid, exit_code (the first 64 bytes)
#: How often the exit status is looked for after the pidfd turned readable: first after
#: ``STATUS_POLL``, then twice as long each time up to ``STATUS_POLL_MAX``.
STATUS_POLL = 0.005
STATUS_POLL_MAX = 0.1


def pidfd_exit_status(pidfd: int) -> int | bool | None:
    """The wait status of the reaped process behind ``pidfd``; True while not reaped yet; None when
    this kernel cannot tell (no ``PIDFD_INFO_EXIT``)."""
    buf = bytearray(_INFO.pack(PIDFD_INFO_EXIT, *([0] * 13)))
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    fields = _INFO.unpack(buf)
    return int(fields[-1]) if fields[0] & PIDFD_INFO_EXIT else True


@dataclass
class ProcessHandles:
    """The driver's descriptors on a sandbox's first process: its channel socket, stderr pipe and pidfd.

    Filled in as the process starts (a birth from the template, or a host agent's spawn), so a start
    that fails or is cancelled can be undone (``close``)."""

    sock: socket.socket | None = None
    stderr: int = -1
    pidfd: int = -1
    pid: int | None = None

    def close(self) -> None:
        """Close every fd the driver holds for this process (idempotent)."""
        if self.sock is not None:
            self.sock.close()
        for fd in (
            self.stderr,
            self.pidfd,
        ):
            if fd >= 0:
                os.close(fd)
        self.stderr = self.pidfd = -1


class _StderrSide(asyncio.Protocol):
    def __init__(self, channel: AgentChannel) -> None:
        self.channel = channel

    def data_received(self, data: bytes) -> None:
        self.channel.stderr_data(data)


class Link:
    """The driver's handles on one live sandbox (see the module docstring). ``reap``: the first
    process is this process's child (waited for when it exits)."""

    def __init__(
        self,
        sandbox_id: str,
        handles: ProcessHandles,
        blocking: Blocking,
        eof_grace: float,
        exit_status_wait: float,
        reap: bool = False,
    ) -> None:
        assert handles.sock is not None
        sock, handles.sock = handles.sock, None  # the channel owns it now
        self.channel = AgentChannel(sandbox_id, sock, blocking, eof_grace, exit_status_wait)
        self.handles = handles
        self.reap = reap
        self.exited = anyio.Event()
        self._transport: asyncio.BaseTransport | None = None
        self._watching = False

    async def open(self) -> None:
        """Start watching; ``OSError`` if the loop refuses a descriptor."""
        nb = self.handles
        assert nb.pidfd >= 0
        loop = asyncio.get_running_loop()
        loop.add_reader(nb.pidfd, self._on_exit)
        self._watching = True
        if nb.stderr < 0:  # an attached process has no stderr pipe of PID 1 (``_attach``)
            return
        err = os.fdopen(nb.stderr, "rb", buffering=0)
        nb.stderr = -1
        self._transport, _ = await loop.connect_read_pipe(lambda: _StderrSide(self.channel), err)

    def _on_exit(self) -> None:
        self._unwatch()
        if self.reap:
            info = None
            with contextlib.suppress(ChildProcessError):
                info = os.waitid(os.P_PIDFD, self.handles.pidfd, os.WEXITED | os.WNOHANG)
            # An agent on the host (``isolation="none"``): its commands can signal it, so a signal is
            # no evidence of anything; only its exit code is recorded.
            exited = info is not None and info.si_code == os.CLD_EXITED
            self.channel.exit_known(info.si_status if info is not None and exited else None, None)
        else:
            self._look_for_status(time.monotonic() + self.channel.death_wait, STATUS_POLL)
        if not self.exited.is_set():
            self.exited.set()
            self.channel.process_exited()

    def _look_for_status(self, until: float, pause: float) -> None:
        status = pidfd_exit_status(self.handles.pidfd) if self.handles.pidfd >= 0 else None
        if status is True and time.monotonic() < until:
            loop = asyncio.get_running_loop()
            loop.call_later(pause, self._look_for_status, until, min(2 * pause, STATUS_POLL_MAX))
        elif isinstance(status, int) and not isinstance(status, bool):
            if os.WIFSIGNALED(status):
                self.channel.exit_known(None, os.WTERMSIG(status))
            else:
                self.channel.exit_known(os.WEXITSTATUS(status), None)
        else:
            if status is True:
                log.warning(
                    "sandbox exit status unknown",
                    sandbox_id=self.channel.sandbox_id,
                    reason=f"its first process was not reaped within {self.channel.death_wait:g} s",
                )
            self.channel.exit_known(None, None)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            asyncio.get_running_loop().remove_reader(self.handles.pidfd)

    def kill(self) -> None:
        """SIGKILL the sandbox's first process (for a born one the kernel then kills the rest of its pid namespace)."""
        if self.handles.pidfd >= 0 and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.handles.pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Close the channel, the stderr pipe and the pidfd (the sandbox keeps running if it was)."""
        self._unwatch()
        self.channel.close()
        if not self.channel.ended.is_set():  # nothing more will be learned: no call waits for it
            self.channel.exit_known(None, None)
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self.handles.close()
