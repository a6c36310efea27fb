"""Process: a command whose output streams while it runs (``Sandbox.process``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._errors import SandboxError
from ._types import ExecResult, StreamName

#: Runs the command to its result, streaming output chunks to the callback it is given.
Run = Callable[[Callable[[StreamName, bytes], Awaitable[None]]], Awaitable[ExecResult]]

__all__ = ["Process"]


class Process:
    """A command whose output streams while it runs. Use as ``async with sb.process(...) as p``.

    ``stdout``/``stderr`` yield output chunks as they arrive and end when the
    command ends. Leaving the block before the command ends kills it (its exec
    is cancelled, so the backend kills the process tree). ``wait()`` returns the
    result or raises as ``Sandbox.exec`` would; an exception raised in the block
    reaches the caller as raised, not wrapped in an ``ExceptionGroup``.
    """

    def __init__(self, run: Run) -> None:
        self._exec = run
        send_out, recv_out = anyio.create_memory_object_stream[bytes](math.inf)
        send_err, recv_err = anyio.create_memory_object_stream[bytes](math.inf)
        #: Output chunks as they arrive; ends when the command ends.
        self.stdout: MemoryObjectReceiveStream[bytes] = recv_out
        self.stderr: MemoryObjectReceiveStream[bytes] = recv_err
        self._send: dict[StreamName, MemoryObjectSendStream[bytes]] = {"stdout": send_out, "stderr": send_err}
        self._done = anyio.Event()
        self._result: ExecResult | None = None
        self._error: BaseException | None = None
        self._running: AbstractAsyncContextManager[None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._result.returncode if self._result is not None else None

    async def _on_output(self, stream: StreamName, data: bytes) -> None:
        # Buffer is unbounded in items but bounded in bytes by max_output_bytes.
        self._send[stream].send_nowait(data)

    async def _run(self) -> None:
        try:
            self._result = await self._exec(self._on_output)
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

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The exec's task group, in one function: the body runs while the exec streams."""
        body_exc: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._run)
                try:
                    yield
                except BaseException as exc:
                    # Kept out of the task group, which would wrap it in a group; re-raised as it is.
                    body_exc = exc
                if not self._done.is_set():
                    tg.cancel_scope.cancel()  # leaving early kills the command
        finally:
            self.stdout.close()
            self.stderr.close()
        if body_exc is not None:
            raise body_exc

    async def __aenter__(self) -> Process:
        if self._running is not None:
            raise SandboxError("a Process can be entered once", infrastructure=False)
        self._running = self._lifetime()
        await self._running.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._running is not None
        return await self._running.__aexit__(exc_type, exc, tb)
