"""Process: a command whose output streams while it runs (``Sandbox.process``)."""

from __future__ import annotations

import math
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._types import ExecRequest, ExecResult, StreamName

if TYPE_CHECKING:
    from ._sandbox import Sandbox

__all__ = ["Process"]


class Process:
    """A command whose output streams while it runs. Use as ``async with sb.process(...) as p``."""

    def __init__(self, sandbox: Sandbox, request: ExecRequest) -> None:
        self._sandbox = sandbox
        self._request = request
        send_out, recv_out = anyio.create_memory_object_stream[bytes](math.inf)
        send_err, recv_err = anyio.create_memory_object_stream[bytes](math.inf)
        #: Output chunks as they arrive; ends when the command ends.
        self.stdout: MemoryObjectReceiveStream[bytes] = recv_out
        self.stderr: MemoryObjectReceiveStream[bytes] = recv_err
        self._send: dict[StreamName, MemoryObjectSendStream[bytes]] = {"stdout": send_out, "stderr": send_err}
        self._done = anyio.Event()
        self._result: ExecResult | None = None
        self._error: BaseException | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def returncode(self) -> int | None:
        return self._result.returncode if self._result is not None else None

    async def _on_output(self, stream: StreamName, data: bytes) -> None:
        # Buffer is unbounded in items but bounded in bytes by max_output_bytes.
        self._send[stream].send_nowait(data)

    async def _run(self) -> None:
        try:
            self._result = await self._sandbox._run(self._request, False, self._on_output)
        except Exception as exc:  # an error is delivered by wait(), not raised in the task group
            self._error = exc
        finally:
            for s in self._send.values():
                s.close()
            self._done.set()

    async def wait(self) -> ExecResult:
        """Wait for the command to end; raises as ``Sandbox.exec`` would."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    async def __aenter__(self) -> Process:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        if not self._done.is_set():
            self._tg.cancel_scope.cancel()  # leaving early kills the command
        try:
            # The body's own exception is not handed to the task group, so it reaches the
            # caller as raised, not wrapped in an ExceptionGroup (the runner never raises).
            await self._tg.__aexit__(None, None, None)
        finally:
            self.stdout.close()
            self.stderr.close()
        return False
