"""Wiring a newborn sandbox to the driver's event loop: its channel socket, stderr pipe and pidfd.

``Link.open`` hands the channel socket to an ``AgentChannel`` (``loop.create_unix_connection``),
reads the stderr pipe into the channel's error tail, and watches the pidfd of the sandbox's first
process: when it becomes readable the sandbox is gone (the kernel killed everything in its pid
namespace first), and the channel fails its pending calls. No task, no thread: loop callbacks only.
``Link.close`` releases all three (idempotent). Signals go through the pidfd, so a recycled pid is
never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import anyio

from ._channel import AgentChannel
from ._template import Newborn

__all__ = ["Link"]


class _SocketSide(asyncio.Protocol):
    def __init__(self, channel: AgentChannel) -> None:
        self.channel = channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.channel._stdin = transport  # the channel writes its frames here

    def data_received(self, data: bytes) -> None:
        self.channel.pipe_data_received(1, data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel.pipe_connection_lost(1, exc)

    def pause_writing(self) -> None:
        self.channel.pause_writing()

    def resume_writing(self) -> None:
        self.channel.resume_writing()


class _StderrSide(asyncio.Protocol):
    def __init__(self, channel: AgentChannel) -> None:
        self.channel = channel

    def data_received(self, data: bytes) -> None:
        self.channel.pipe_data_received(2, data)


class Link:
    """The driver's handles on one live sandbox (see the module docstring)."""

    def __init__(self, sandbox_id: str, newborn: Newborn) -> None:
        self.channel = AgentChannel(sandbox_id)
        self.newborn = newborn
        self.exited = anyio.Event()
        self._transports: list[asyncio.BaseTransport] = []
        self._watching = False

    async def open(self) -> None:
        """Connect the channel and start watching; ``OSError`` if the loop refuses a descriptor."""
        nb = self.newborn
        assert nb.sock is not None and nb.pidfd >= 0
        loop = asyncio.get_running_loop()
        sock, nb.sock = nb.sock, None  # the transport owns it now
        transport, _ = await loop.create_unix_connection(lambda: _SocketSide(self.channel), sock=sock)
        self._transports.append(transport)
        err = os.fdopen(nb.stderr, "rb", buffering=0)
        nb.stderr = -1
        pipe, _ = await loop.connect_read_pipe(lambda: _StderrSide(self.channel), err)
        self._transports.append(pipe)
        loop.add_reader(nb.pidfd, self._on_exit)
        self._watching = True

    def _on_exit(self) -> None:
        self._unwatch()
        if not self.exited.is_set():
            self.exited.set()
            self.channel.process_exited()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            asyncio.get_running_loop().remove_reader(self.newborn.pidfd)

    def kill(self) -> None:
        """SIGKILL the sandbox's first process (the kernel then kills the rest of its pid namespace)."""
        if self.newborn.pidfd >= 0 and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.newborn.pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Close the channel, the stderr pipe and the pidfd (the sandbox keeps running if it was)."""
        self._unwatch()
        for transport in self._transports:
            transport.close()
        self._transports = []
        self.newborn.close()
