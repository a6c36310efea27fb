"""The client end of one sandbox agent: frames over the sandbox process's stdin/stdout.

``AgentChannel`` is an ``asyncio.SubprocessProtocol``: the event loop hands it the
agent's output as it arrives and it demultiplexes frames to the waiting calls by
request id, synchronously, in the loop's own callback. No reader task, no thread
hop: an exec costs one frame write and one event wait. Writes are whole frames on
the pipe transport, so frames of concurrent calls never interleave; a writer
waits only when the pipe's buffer is over its high-water mark.

When the agent's output closes or its process exits, every pending call fails
with ``SandboxNotRunningError`` (``SandboxTerminatedError`` when the backend is
stopping the sandbox on purpose), and so does every later call. That is
infrastructure: a program cannot end its agent -- PID 1 ignores signals from
inside its namespace, is not dumpable, seccomp denies ``ptrace`` and
``process_vm_*``, the agent lives outside the commands' memory limit, and a full
pids limit only fails the execs that need a new process (``SPAWN_FAILED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from ..._errors import (
    SandboxError,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTransportError,
)
from ..._types import ExecExit, ExecRequest, StreamName
from ._protocol import (
    HEADER,
    MAX_PAYLOAD,
    R_DONE,
    R_ERR,
    R_FAIL,
    R_HELLO,
    R_OUT,
    T_EXIT,
    T_KILL,
    T_PY,
    T_READ,
    T_WRITE,
    pack_frame,
    pack_meta,
    unpack_meta,
)

__all__ = ["AgentChannel", "AgentProtocolError"]

STDERR_TAIL = 16 * 1024
#: ``ExecExit`` has ``sandbox_cpu_seconds`` once the verdict branch's contract is merged.
_SANDBOX_CPU = "sandbox_cpu_seconds" in {f.name for f in dataclasses.fields(ExecExit)}


class AgentProtocolError(RuntimeError):
    """The agent's reply broke the protocol: a bug of this library (see the module docstring)."""


_Chunk = tuple[StreamName, bytes]
OnOutput = Callable[[StreamName, bytes], Awaitable[None]]


class _Call:
    __slots__ = ("done", "err", "kind", "out", "payload", "stream")

    def __init__(self, stream: MemoryObjectSendStream[_Chunk] | None) -> None:
        self.done = anyio.Event()
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.kind = 0  # the final frame's type; 0 while pending or when the channel broke
        self.payload = b""
        self.stream = stream

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.done.set()


class AgentChannel(asyncio.SubprocessProtocol):
    """Talks to one agent. Created by ``loop.subprocess_exec``; see the module docstring."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._buf = bytearray()
        self._calls: dict[int, _Call] = {}
        self._next_id = 1
        self.hello: dict[str, Any] | None = None
        self.ready = anyio.Event()
        self.exited = anyio.Event()
        self.lost = anyio.Event()
        self.closed_reason: str | None = None
        self.terminating = False
        self.stderr_tail = bytearray()
        self._writable = anyio.Event()
        self._writable.set()

    # -- asyncio callbacks -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        self._stdin = stdin

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._feed(data)
        else:
            self.stderr_tail += data
            del self.stderr_tail[:-STDERR_TAIL]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._broken("the sandbox agent closed its output")

    def process_exited(self) -> None:
        rc = self.transport.get_returncode() if self.transport is not None else None
        self._broken(f"the sandbox process exited (status {rc})")
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken("the sandbox process is gone")
        self.lost.set()

    def pause_writing(self) -> None:
        self._writable = anyio.Event()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- frames in -------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        size = HEADER.size
        while len(buf) >= size:
            rid, ftype, n = HEADER.unpack_from(buf)
            if n > MAX_PAYLOAD:
                self._broken(f"the agent sent a frame of {n} bytes")
                self.kill()
                return
            end = size + n
            if len(buf) < end:
                return
            payload = bytes(buf[size:end])
            del buf[:end]
            self._dispatch(rid, ftype, payload)

    def _dispatch(self, rid: int, ftype: int, payload: bytes) -> None:
        if ftype == R_HELLO:
            try:
                self.hello = unpack_meta(payload)[0]
            except ValueError:
                self.hello = {}
            self.ready.set()
            return
        call = self._calls.get(rid)
        if call is None:
            return  # output of a call we abandoned (cancelled)
        if ftype in (R_OUT, R_ERR):
            stream: StreamName = "stdout" if ftype == R_OUT else "stderr"
            (call.out if ftype == R_OUT else call.err).append(payload)
            if call.stream is not None:
                call.stream.send_nowait((stream, payload))
            return
        del self._calls[rid]
        call.kind = ftype
        call.payload = payload
        call.finish()

    def _broken(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.finish()
        self.ready.set()
        self._writable.set()

    # -- frames out ------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.closed_reason is None

    def dead_error(self) -> SandboxNotRunningError:
        if self.terminating:
            return SandboxTerminatedError(f"sandbox {self.sandbox_id} was stopped", sandbox_id=self.sandbox_id)
        tail = bytes(self.stderr_tail).decode("utf-8", "replace").strip()
        detail = f"; its last error output: {tail[-2000:]}" if tail else ""
        return SandboxNotRunningError(
            f"sandbox {self.sandbox_id} is not running: {self.closed_reason}{detail}", sandbox_id=self.sandbox_id
        )

    def write_raw(self, data: bytes) -> None:
        """Write bytes that are not a frame (the agent's bootstrap payload)."""
        self._write(data)

    def _write(self, frame: bytes) -> None:
        if self._stdin is None or self._stdin.is_closing():
            raise self.dead_error()
        self._stdin.write(frame)

    def _start(
        self, ftype: int, payload: bytes, stream: MemoryObjectSendStream[_Chunk] | None = None
    ) -> tuple[int, _Call]:
        if self.closed_reason is not None:
            raise self.dead_error()
        rid = self._next_id
        self._next_id = rid + 1 if rid < 0xFFFFFFF0 else 1
        call = _Call(stream)
        self._calls[rid] = call
        try:
            self._write(pack_frame(rid, ftype, payload))
        except BaseException:
            del self._calls[rid]
            raise
        return rid, call

    def _abandon(self, rid: int, kill: bool) -> None:
        call = self._calls.pop(rid, None)
        if call is None:
            return
        call.finish()
        if kill and self.closed_reason is None:
            with contextlib.suppress(SandboxError):
                self._write(pack_frame(rid, T_KILL))

    async def _wait(self, rid: int, call: _Call, kill_on_cancel: bool) -> _Call:
        try:
            if not self._writable.is_set():
                await self._writable.wait()
            await call.done.wait()
        except BaseException:
            self._abandon(rid, kill_on_cancel)
            raise
        if call.kind == 0:
            raise self.dead_error()
        if call.kind == R_FAIL:
            self._raise_fail(call.payload, None)
        return call

    def _raise_fail(self, payload: bytes, path: str | None) -> None:
        try:
            meta, _ = unpack_meta(payload)
        except ValueError:
            meta = {}
        message = str(meta.get("m", "the agent reported an error"))
        kind = meta.get("k")
        if kind == "file":
            raise SandboxFileError(message, sandbox_id=self.sandbox_id, path=path)
        if kind == "internal":
            raise SandboxTransportError(f"sandbox agent error: {message}", sandbox_id=self.sandbox_id)
        raise AgentProtocolError(f"sandbox {self.sandbox_id}: the agent refused a request ({kind}): {message}")

    # -- operations --------------------------------------------------------------
    @staticmethod
    def exec_meta(request: ExecRequest) -> dict[str, Any]:
        """The ``EXEC``/``PY`` metadata for ``request`` (see ``agent.protocol``)."""
        return {
            "a": list(request.argv),
            "c": request.cwd,
            "e": dict(request.env),
            "t": request.timeout_seconds,
            "m": request.max_output_bytes,
            "b": request.cpu_seconds,
            "x": request.exclusive,
        }

    async def exec(self, ftype: int, request: ExecRequest, source: str | None, on_output: OnOutput | None) -> ExecExit:
        """Run one command (``T_EXEC``) or Python ``source`` (``T_PY``); cancelling kills it."""
        meta = self.exec_meta(request)
        raw = request.stdin or b""
        if ftype == T_PY:
            meta["n"] = len(raw)
            raw += (source or "").encode("utf-8", "surrogateescape")
        payload = pack_meta(meta, raw)
        if on_output is None:
            rid, call = self._start(ftype, payload)
            await self._wait(rid, call, True)
        else:
            send, receive = anyio.create_memory_object_stream[_Chunk](math.inf)
            with send, receive:
                rid, call = self._start(ftype, payload, send)
                try:
                    async for stream, data in receive:
                        await on_output(stream, data)
                except BaseException:
                    self._abandon(rid, True)
                    raise
                await self._wait(rid, call, True)
        if call.kind != R_DONE:
            raise AgentProtocolError(f"sandbox {self.sandbox_id}: unexpected reply {call.kind} to an exec")
        try:
            done, _ = unpack_meta(call.payload)
            wait = done.get("cw")
            extra: dict[str, Any] = {}
            if _SANDBOX_CPU and done.get("sc") is not None:
                extra["sandbox_cpu_seconds"] = float(done["sc"])
            return ExecExit(
                returncode=int(done["rc"]),
                stdout=b"".join(call.out),
                stderr=b"".join(call.err),
                wall_seconds=float(done["w"]),
                cpu_seconds=float(done["u"]),
                timed_out=bool(done["to"]),
                truncated=bool(done["tr"]),
                oom_killed=bool(done.get("oom")),
                cpu_exceeded=bool(done.get("cx")),
                cpu_wait_seconds=None if wait is None else float(wait),
                **extra,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentProtocolError(f"sandbox {self.sandbox_id}: malformed exit report: {exc}") from exc

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        rid, call = self._start(T_READ, pack_meta({"p": path, "m": max_bytes}))
        try:
            await self._wait(rid, call, False)
        except SandboxFileError as exc:
            exc.path = path
            raise
        return call.payload

    async def write_file(self, path: str, data: bytes) -> None:
        rid, call = self._start(T_WRITE, pack_meta({"p": path}, data))
        try:
            await self._wait(rid, call, False)
        except SandboxFileError as exc:
            exc.path = path
            raise

    def send_exit(self) -> None:
        """Ask the agent to kill everything and exit (no reply)."""
        if self.closed_reason is None:
            with contextlib.suppress(SandboxError):
                self._write(pack_frame(0, T_EXIT))

    def kill(self) -> None:
        if self.transport is not None and self.transport.get_returncode() is None:
            with contextlib.suppress(ProcessLookupError):
                self.transport.kill()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
