"""The driver's end of one sandbox's PID 1: orders out, reports in (see ``agent.protocol``).

``AgentChannel`` holds the ``SOCK_SEQPACKET`` channel socket, watched with ``loop.add_reader``: the
loop hands it each report in its own callback, and it wakes the waiting call by request id. No
reader task, no thread hop. Per exec it writes the request (argv or source, cwd, environment) into
a memfd and the stdin into another, creates the output pipes (``_calls.ExecCall`` reads them), and
posts one fixed-size order with those descriptors; PID 1 never sees a request's bytes. File
operations go the same way, to a helper PID 1 forks (the file's bytes travel in memfds). Orders are
posted without waiting: one that finds the socket full waits in an outbox flushed when it drains.
Payloads of ``INLINE_BYTES`` or more are written (and a read file's bytes read) in a worker thread.

When the channel closes or the sandbox's first process exits, every pending call fails with
``SandboxNotRunningError`` (``SandboxTerminatedError`` when the backend is stopping the sandbox on
purpose), and so does every later call. Whose failure that is, the way PID 1 ended says (``Link``):
killed by a signal -- which nothing inside can send it -- is infrastructure; anything else (PID 1
exited, or no evidence either way) is the program's (``infrastructure=False``): PID 1 ignores
signals from inside, is not dumpable, cannot be traced, changed or re-limited by a command (seccomp),
lives outside the commands' memory limit, and a full pids limit only fails the execs that need a new
process (``SPAWN_FAILED``), so a PID 1 that still gave up did so because of what a program did.
A report that breaks the protocol is a bug of this library (``AgentProtocolError``), never
infrastructure.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
import os
import select
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..._errors import (
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTransportError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, StreamName
from ..._verdict import late_verdict, others_held_the_machine
from ._calls import Chunk, ExecCall, Report
from ._evidence import Evidence
from ._threads import Blocking
from .agent import protocol as p

__all__ = ["AgentChannel", "AgentProtocolError"]

STDERR_TAIL = 16 * 1024
#: Payloads this large or larger are copied into (or out of) memfds in a worker thread.
INLINE_BYTES = 1 << 20
_MAX_MESSAGE = 4096  # a report is 44 bytes, the hello a few hundred
OnOutput = Callable[[StreamName, bytes], Awaitable[None]]


class AgentProtocolError(RuntimeError):
    """PID 1's message broke the protocol: a bug of this library (see the module docstring)."""


class _Pending:
    """A call waiting for its report: an exec (``ExecCall``) or a file operation."""

    __slots__ = ("call", "done", "others", "posted", "report", "start")

    def __init__(self, call: ExecCall | None) -> None:
        self.call = call
        self.report: Report | None = None
        self.start: tuple[float, float] | None = None  # ``Evidence.reading`` when the order was posted
        self.posted = time.monotonic()
        self.others: float | None = None  # the rest of the machine's CPU until the report (timed out only)
        self.done = anyio.Event() if call is None else call.done


class AgentChannel:
    """Talks to one sandbox's PID 1 over ``sock`` (see the module docstring)."""

    def __init__(
        self, sandbox_id: str, sock: socket.socket, blocking: Blocking, eof_grace: float, death_wait: float
    ) -> None:
        self.sandbox_id = sandbox_id
        self.sock = sock
        self.blocking = blocking
        self.eof_grace = eof_grace
        #: How long a call that found the channel broken waits at most to learn how PID 1 ended
        #: (``LocalOptions.exit_status_wait_seconds``; ``_link`` ends the wait as soon as it knows).
        self.death_wait = death_wait
        self.hello: dict[str, Any] | None = None
        self.ready = anyio.Event()
        self.exited = anyio.Event()
        self.closed_reason: str | None = None
        self.terminating = False
        self.stderr_tail = bytearray()
        self._calls: dict[int, _Pending] = {}
        self._next_id = 1
        self._outbox: deque[tuple[bytes, list[int]]] = deque()
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._readable)
        self._reading = True
        self._writing = False
        #: Set when PID 1 broke the protocol: pending and later calls raise ``AgentProtocolError``.
        self.violation: str | None = None
        #: Where the driver reads the host's and the sandbox's CPU (``_evidence``); set by the birth.
        self.evidence: Evidence | None = None
        #: An exec's CPU budget when its request has none: ``Resources.cpu_seconds`` (set by the birth).
        self.default_budget = 0.0
        #: How PID 1 ended (``exit_known``): its exit code, or the signal that killed it.
        self.exit_code: int | None = None
        self.exit_signal: int | None = None
        self.ended = anyio.Event()

    # -- the socket ------------------------------------------------------------------------------
    def _readable(self) -> None:
        try:
            data = self.sock.recv(_MAX_MESSAGE)
        except BlockingIOError:
            return
        except OSError as exc:
            self.broken(f"the sandbox agent's channel failed: {exc}")
            return
        if not data:
            self.broken("the sandbox agent closed its channel")
            return
        self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        if data[0] == p.R_HELLO and self.hello is None:
            try:
                hello = json.loads(data[1:])
            except ValueError:
                hello = None
            self.hello = hello if isinstance(hello, dict) else {}
            self.ready.set()
            return
        if len(data) != p.REPORT.size or data[0] not in (p.R_DONE, p.R_FAIL):
            self.violation = f"sandbox {self.sandbox_id}: PID 1 sent a malformed report ({len(data)} bytes)"
            log.error("local sandbox protocol violation", sandbox_id=self.sandbox_id, size=len(data))
            self.broken("the sandbox agent broke the protocol")
            return
        kind, note, flags, rid, rc, wall, cpu, wait, sandbox_cpu = p.REPORT.unpack(data)
        pending = self._calls.pop(rid, None)
        if pending is None:
            return  # a call that was abandoned (cancelled)
        pending.report = Report(kind, note, flags, rc, wall, cpu, wait, sandbox_cpu)
        if flags & p.D_TIMED_OUT and pending.start is not None and self.evidence is not None:
            pending.others = Evidence.others(pending.start, self.evidence.reading())
        if pending.call is not None:
            pending.call.on_report(pending.report)
        else:
            pending.done.set()

    def post(self, message: bytes, fds: list[int]) -> None:
        """Send one order; it owns ``fds`` and closes them once sent (or when the channel broke)."""
        if self.closed_reason is not None:
            _close(fds)
            return
        self._outbox.append((message, fds))
        if len(self._outbox) == 1:
            self._flush()

    def _flush(self) -> None:
        while self._outbox:
            message, fds = self._outbox[0]
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
            try:
                self.sock.sendmsg([message], ancillary)
            except BlockingIOError:
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError as exc:
                self.broken(f"the sandbox agent's channel failed: {exc}")  # closes the outbox's fds
                return
            self._outbox.popleft()
            _close(fds)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    def broken(self, reason: str) -> None:
        """The channel is gone: fail every pending call, now and later (idempotent)."""
        if self.closed_reason is None:
            self.closed_reason = reason
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())
        while self._outbox:
            _close(self._outbox.popleft()[1])
        calls, self._calls = self._calls, {}
        for pending in calls.values():
            if pending.call is not None:
                pending.call.close()
            pending.done.set()
        self.ready.set()

    def process_exited(self) -> None:
        """The sandbox's first process is gone (seen by ``_link``)."""
        self.broken("the sandbox process exited")
        self.exited.set()

    def exit_known(self, code: int | None, signum: int | None) -> None:
        """How the sandbox's first process ended (both None: not known), from ``Link``."""
        self.exit_code, self.exit_signal = code, signum
        self.ended.set()

    async def _dead(self) -> SandboxNotRunningError:
        """``dead_error`` once it is known how PID 1 ended (its channel closes just before it is gone,
        and the template reaps it after that)."""
        with anyio.move_on_after(self.death_wait):
            await self.ended.wait()
        if not self.ended.is_set():
            log.warning(
                "sandbox exit status unknown",
                sandbox_id=self.sandbox_id,
                reason=f"its first process had not ended {self.death_wait:g} s after its channel closed",
            )
        return self.dead_error()

    def stderr_data(self, data: bytes) -> None:
        self.stderr_tail += data
        del self.stderr_tail[:-STDERR_TAIL]

    def close(self) -> None:
        self.broken("the channel was closed")
        self.sock.close()
        if self.evidence is not None:
            self.evidence.close()

    @property
    def alive(self) -> bool:
        return self.closed_reason is None

    def dead_error(self) -> SandboxNotRunningError:
        if self.terminating:
            return SandboxTerminatedError(f"sandbox {self.sandbox_id} was stopped", sandbox_id=self.sandbox_id)
        tail = bytes(self.stderr_tail).decode("utf-8", "replace").strip()
        detail = f"; its last error output: {tail[-2000:]}" if tail else ""
        if self.exit_signal is not None:
            how = f"; its PID 1 was killed by signal {self.exit_signal} from outside the sandbox"
        elif self.exit_code is not None:
            how = f"; its PID 1 exited with status {self.exit_code} (its programs' doing)"
        else:
            how = ""
        return SandboxNotRunningError(
            f"sandbox {self.sandbox_id} is not running: {self.closed_reason}{how}{detail}",
            sandbox_id=self.sandbox_id,
            infrastructure=self.exit_signal is not None,
        )

    # -- calls -----------------------------------------------------------------------------------
    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < 0xFFFFFFF0 else 1
        return rid

    async def _memfd(self, name: str, chunks: tuple[bytes, ...]) -> int:
        """A memfd holding ``chunks`` (its offset stays 0, as the reader expects)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            if sum(len(c) for c in chunks) >= INLINE_BYTES:
                await self.blocking(_pwrite_all, fd, chunks)
            else:
                _pwrite_all(fd, chunks)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def listen(self, fd: int) -> None:
        """Hand PID 1 the listening socket ``fd`` it accepts attached channels on (``_attach``); owns it."""
        self.post(p.ORDER.pack(p.O_LISTEN, 0, 0, 0, 0.0, 0.0), [fd])

    def _kill(self, rid: int) -> None:
        if self.closed_reason is None:
            self.post(p.ORDER.pack(p.O_KILL, 0, 0, rid, 0.0, 0.0), [])

    async def exec(
        self,
        request: ExecRequest,
        env: Mapping[str, str],
        cwd: str,
        source: str | None,
        on_output: OnOutput | None,
    ) -> ExecExit:
        """Run one command (``source`` None) or Python source; cancelling kills it."""
        if self.closed_reason is not None:
            raise self.dead_error()
        mode = p.M_EXEC if source is None else p.M_PYTHON
        argv = [] if source is not None else [_bytes(a) for a in request.argv]
        raw = b"" if source is None else _bytes(source)
        body = p.pack_request(_bytes(cwd), argv, [(_bytes(k), _bytes(v)) for k, v in env.items()], raw)
        flags = p.F_EXCLUSIVE if request.exclusive else 0
        fds: list[int] = []
        readers: list[int] = []
        try:
            fds.append(await self._memfd("cwsandbox-request", (body,)))
            for _ in (1, 2):
                r, w = os.pipe2(os.O_CLOEXEC)
                readers.append(r)
                fds.append(w)
                os.set_blocking(r, False)  # ours only: the command's end stays blocking
            if request.stdin:
                fds.append(await self._memfd("cwsandbox-stdin", (request.stdin,)))
                flags |= p.F_STDIN
        except OSError as exc:
            _close(fds + readers)
            raise SandboxTransportError(f"cannot pass a request to sandbox {self.sandbox_id}: {exc}") from exc
        except BaseException:
            _close(fds + readers)
            raise
        if self.closed_reason is not None:  # it broke while a memfd was written
            _close(fds + readers)
            raise self.dead_error()
        rid = self._new_id()
        send: MemoryObjectSendStream[Chunk] | None = None
        receive: MemoryObjectReceiveStream[Chunk] | None = None
        if on_output is not None:
            send, receive = anyio.create_memory_object_stream[Chunk](math.inf)
        call = ExecCall(
            request.max_output_bytes, (readers[0], readers[1]), lambda: self._kill(rid), self.eof_grace, send
        )
        self._calls[rid] = pending = _Pending(call)
        budget = request.cpu_seconds or self.default_budget
        if self.evidence is not None:
            pending.start = self.evidence.reading()
        pending.posted = time.monotonic()
        self.post(p.ORDER.pack(p.O_RUN, mode, flags, rid, request.timeout_seconds, budget), fds)
        try:
            if receive is not None and on_output is not None:
                with receive:
                    async for stream, data in receive:
                        await on_output(stream, data)
            await call.done.wait()
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()) and pending.report is None:
                late_verdict(self._late_is_infrastructure(pending))
            if self._calls.pop(rid, None) is not None:
                self._kill(rid)
            call.close()
            raise
        if pending.report is None and self.violation is None:
            raise await self._dead()
        self._check(pending)
        return call.result(pending.others)

    def _late_is_infrastructure(self, pending: _Pending) -> bool:
        """Whether an exec whose report has not come (its caller's deadline is cutting it) has
        evidence from outside the sandbox that the lateness is not the program's: the report is
        already waiting in the socket (the driver was late to read it), the channel broke, or the
        rest of the machine held its CPUs over the exec (``_verdict.others_held_the_machine``, the
        starvation rule's outside evidence). Without it the program made PID 1 late (its commands
        compete with PID 1 only as one CPU group, see ``_cgroup``): the program's timeout."""
        if self.closed_reason is not None:
            return True
        try:
            waiting, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            waiting = []
        if waiting:
            return True
        end = self.evidence.reading() if self.evidence is not None else None
        others = Evidence.others(pending.start, end)
        if others is None or pending.start is None or end is None:
            return False
        wall = time.monotonic() - pending.posted
        used = max(0.0, end[1] - pending.start[1])
        return others_held_the_machine(others, used, wall)

    def _check(self, pending: _Pending) -> Report:
        """The report of a done call; raises for a broken channel or an order PID 1 could not run."""
        r = pending.report
        if r is None:
            if self.violation is not None:
                raise AgentProtocolError(self.violation)
            raise self.dead_error()
        if r.kind == p.R_DONE:
            return r
        if r.note == p.N_NOT_CLEAR:
            raise SandboxTransportError(f"sandbox agent error: {p.NOTES[r.note]}", sandbox_id=self.sandbox_id)
        raise AgentProtocolError(f"sandbox {self.sandbox_id}: PID 1 refused an order ({p.NOTES.get(r.note, r.note)})")

    async def _file_op(self, mode: int, path: str, max_bytes: int, data: bytes, shown: str) -> bytes:
        """Run a file helper; the result memfd's bytes (``SandboxFileError`` with its message on failure)."""
        if self.closed_reason is not None:
            raise self.dead_error()
        result = -1
        fds: list[int] = []
        try:
            result = os.memfd_create("cwsandbox-result", os.MFD_CLOEXEC)
            head = p.pack_file_request(max_bytes, _bytes(path), _bytes(shown))
            fds.append(await self._memfd("cwsandbox-file", (head, data)))
            fds.append(os.dup(result))
        except OSError as exc:
            _close(fds + ([result] if result >= 0 else []))
            raise SandboxTransportError(f"cannot pass a request to sandbox {self.sandbox_id}: {exc}") from exc
        except BaseException:
            _close(fds + ([result] if result >= 0 else []))
            raise
        try:
            rid = self._new_id()
            self._calls[rid] = pending = _Pending(None)
            self.post(p.ORDER.pack(p.O_RUN, mode, 0, rid, 0.0, 0.0), fds)
            try:
                await pending.done.wait()
            except BaseException:
                if self._calls.pop(rid, None) is not None:
                    self._kill(rid)
                raise
            if pending.report is None and self.violation is None:
                raise await self._dead()
            r = self._check(pending)
            size = os.fstat(result).st_size
            out = await self.blocking(_pread_all, result, size) if size >= INLINE_BYTES else _pread_all(result, size)
        finally:
            os.close(result)
        if r.rc == 0 and not r.note:
            return out
        if r.note:
            message = f"{shown}: {p.NOTES[r.note]}"
        elif r.rc == 1 and out:
            message = out.decode("utf-8", "replace")
        else:  # killed by a process of the sandbox (same user), or the helper could not start
            message = f"{shown}: the file operation ended with status {r.rc}"
        raise SandboxFileError(message, sandbox_id=self.sandbox_id, path=shown)

    async def read_file(self, path: str, max_bytes: int, shown: str | None = None) -> bytes:
        return await self._file_op(p.M_READ, path, max_bytes, b"", shown or path)

    async def write_file(self, path: str, data: bytes, shown: str | None = None) -> None:
        await self._file_op(p.M_WRITE, path, 0, data, shown or path)


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _pwrite_all(fd: int, chunks: tuple[bytes, ...]) -> None:
    offset = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            n = os.pwrite(fd, view, offset)
            offset += n
            view = view[n:]


def _pread_all(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 24), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)
