"""Wiring a sandbox's first process to the driver's event loop: its channel, stderr pipe and pidfd.

``Link.open`` hands the channel socket to an ``AgentChannel`` (``loop.add_reader``), reads the
stderr pipe into the channel's error tail, and watches the pidfd of the sandbox's first process:
when it becomes readable the sandbox is gone (for a template-born sandbox the kernel killed
everything in its pid namespace first), and the channel fails its pending calls. No task, no
thread: loop callbacks only. A first process that is the driver's own child (``isolation="none"``)
is reaped then. ``Link.close`` releases all three (idempotent). Signals go through the pidfd, so a
recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import anyio

from ._channel import AgentChannel
from ._template import Newborn
from ._threads import Blocking

__all__ = ["Link"]


class _StderrSide(asyncio.Protocol):
    def __init__(self, channel: AgentChannel) -> None:
        self.channel = channel

    def data_received(self, data: bytes) -> None:
        self.channel.stderr_data(data)


class Link:
    """The driver's handles on one live sandbox (see the module docstring). ``reap``: the first
    process is this process's child (waited for when it exits)."""

    def __init__(
        self, sandbox_id: str, newborn: Newborn, blocking: Blocking, eof_grace: float, reap: bool = False
    ) -> None:
        assert newborn.sock is not None
        sock, newborn.sock = newborn.sock, None  # the channel owns it now
        self.channel = AgentChannel(sandbox_id, sock, blocking, eof_grace)
        self.newborn = newborn
        self.reap = reap
        self.exited = anyio.Event()
        self._transport: asyncio.BaseTransport | None = None
        self._watching = False

    async def open(self) -> None:
        """Start watching; ``OSError`` if the loop refuses a descriptor."""
        nb = self.newborn
        assert nb.pidfd >= 0
        loop = asyncio.get_running_loop()
        loop.add_reader(nb.pidfd, self._on_exit)
        self._watching = True
        err = os.fdopen(nb.stderr, "rb", buffering=0)
        nb.stderr = -1
        self._transport, _ = await loop.connect_read_pipe(lambda: _StderrSide(self.channel), err)

    def _on_exit(self) -> None:
        self._unwatch()
        if self.reap:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self.newborn.pidfd, os.WEXITED | os.WNOHANG)
        if not self.exited.is_set():
            self.exited.set()
            self.channel.process_exited()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            asyncio.get_running_loop().remove_reader(self.newborn.pidfd)

    def kill(self) -> None:
        """SIGKILL the sandbox's first process (for a born one the kernel then kills the rest of its pid namespace)."""
        if self.newborn.pidfd >= 0 and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.newborn.pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Close the channel, the stderr pipe and the pidfd (the sandbox keeps running if it was)."""
        self._unwatch()
        self.channel.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self.newborn.close()
