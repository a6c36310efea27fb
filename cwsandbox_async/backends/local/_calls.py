"""One exec as the driver runs it against a sandbox's PID 1: its pipes, its output, its report.

The driver creates the exec's stdout and stderr pipes itself, passes the write ends to PID 1 with
the order, and reads the read ends on its own event loop (``loop.add_reader``, one ``read`` per
callback): no output passes through the sandbox. It enforces the output cap here: past
``max_output_bytes`` on a stream the rest is dropped, PID 1 is told to kill the exec
(``truncated``), and that pipe is left unread (its writer blocks) until the tree is gone, then
closed. The exec is over when PID 1's report arrived (sent once the command's whole process tree
is gone) and both pipes reached end of file; a pipe a process of the
sandbox still holds open (passed to another exec's process) is closed ``eof_grace`` seconds after
the report. A channel that breaks ends every call at once (``broken``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from ..._types import ExecExit, StreamName
from .agent.protocol import D_CPU_EXCEEDED, D_OOM, D_TIMED_OUT, NOTES, R_DONE

__all__ = ["Chunk", "ExecCall", "Report"]

#: Bytes read per callback (a pipe holds 64 KiB).
CHUNK = 65536
Chunk = tuple[StreamName, bytes]
_NAMES: tuple[StreamName, StreamName] = ("stdout", "stderr")


@dataclass(frozen=True, slots=True)
class Report:
    """PID 1's ``REPORT`` for one order (see ``agent.protocol``)."""

    kind: int
    note: int
    flags: int
    rc: int
    wall: float
    cpu: float
    wait: float
    sandbox_cpu: float

    @property
    def note_line(self) -> bytes:
        return f"cwsandbox: {NOTES[self.note]}\n".encode() if self.note in NOTES else b""


class ExecCall:
    """The driver's side of one exec (see the module docstring).

    ``kill()`` asks PID 1 to kill the exec's tree; ``done`` is set once the exec is over or the
    channel broke (``report`` is None then)."""

    def __init__(
        self,
        limit: int,
        fds: tuple[int, int],
        kill: Callable[[], None],
        eof_grace: float,
        stream: MemoryObjectSendStream[Chunk] | None = None,
    ) -> None:
        self.limit = limit
        self.fds = list(fds)
        self.kill = kill
        self.eof_grace = eof_grace
        self.stream = stream
        self.chunks: tuple[list[bytes], list[bytes]] = ([], [])
        self.sizes = [0, 0]
        self.truncated = False
        self.report: Report | None = None
        self.done = anyio.Event()
        self._loop = asyncio.get_running_loop()
        self._grace: asyncio.TimerHandle | None = None
        #: Streams past the cap whose pipe stays open, unread, until the report (see ``_readable``).
        self._held: list[int] = []
        for which, fd in enumerate(self.fds):
            self._loop.add_reader(fd, self._readable, which)

    def _readable(self, which: int) -> None:
        fd = self.fds[which]
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(which)
            return
        room = self.limit - self.sizes[which]
        over = len(data) > room
        if over:
            data = data[:room]
        if data:
            self.chunks[which].append(data)
            self.sizes[which] += len(data)
            if self.stream is not None:
                self.stream.send_nowait((_NAMES[which], data))
        if over:
            self.truncated = True
            if self.report is None:
                # Kill first, and close the pipe only once the tree is gone (``on_report``): a writer
                # blocks on the full pipe meanwhile. Closing it now would let the writer die of SIGPIPE
                # and the rest of the command (a shell's next line) run on before the kill arrives.
                self._loop.remove_reader(self.fds[which])
                self._held.append(which)
                self.kill()
            else:
                self._close(which)  # the rest is dropped: nothing reads it any more

    def _close(self, which: int) -> None:
        self._close_fd(which)
        self._check()

    def _close_fd(self, which: int) -> None:
        fd = self.fds[which]
        if fd >= 0:
            self.fds[which] = -1
            self._loop.remove_reader(fd)
            os.close(fd)

    def _check(self) -> None:
        if self.report is not None and self.fds == [-1, -1] and not self.done.is_set():
            self._finish()

    def _finish(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self.stream is not None:
            if self.report is not None and self.report.note_line:
                self.stream.send_nowait(("stderr", self.report.note_line))
            self.stream.close()
        self.done.set()

    def on_report(self, report: Report) -> None:
        """PID 1 reported: the tree is gone; wait for the pipes' end (at most ``eof_grace``)."""
        self.report = report
        for which in self._held:
            self._close_fd(which)
        self._held.clear()
        if self.fds != [-1, -1]:
            self._grace = self._loop.call_later(self.eof_grace, self.close)
        self._check()

    def close(self) -> None:
        """Stop reading (the exec is over, abandoned, or its channel broke); idempotent."""
        for which in (0, 1):
            self._close_fd(which)
        self._held.clear()
        if not self.done.is_set():
            self._finish()

    def result(self, others_cpu: float | None = None) -> ExecExit:
        """The ``ExecExit`` of a reported ``R_DONE`` exec (``others_cpu``: see ``_evidence``)."""
        r = self.report
        assert r is not None and r.kind == R_DONE
        return ExecExit(
            returncode=r.rc,
            stdout=b"".join(self.chunks[0]),
            stderr=b"".join(self.chunks[1]) + r.note_line,
            wall_seconds=r.wall,
            cpu_seconds=r.cpu,
            timed_out=bool(r.flags & D_TIMED_OUT),
            truncated=self.truncated,
            oom_killed=bool(r.flags & D_OOM),
            cpu_exceeded=bool(r.flags & D_CPU_EXCEEDED),
            cpu_wait_seconds=None if r.wait < 0 else r.wait,
            sandbox_cpu_seconds=None if r.sandbox_cpu < 0 else r.sandbox_cpu,
            others_cpu_seconds=others_cpu,
        )
